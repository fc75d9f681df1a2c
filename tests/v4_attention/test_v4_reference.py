"""The float64 reference of mla_v4_attention against an independent float64 formula (v4_case.dense_f64:
a dense multiplicity mask over every slot, the cache bytes decoded from their bits, the sink as one
more softmax term, the rotation as a complex product), and its rules: rows naming nothing, bad
entries / indptr / positions (NaN rows), NaN in a named row, a NaN sink, inf scales."""

from __future__ import annotations

import math

import pytest
import torch
from _util import DEVICE
from v4_case import FN, FNUZ, dense_f64, make_case, replace, slot_rows

from rocm_mla.cases import v4_attention as v4
from rocm_mla.reference import fp8_ds_mla_rows, mla_v4_attention_ref

F64 = {"out": v4.DENSE_F64, "lse": v4.DENSE_F64}


def _variants():
    """Every tiny and odd shape twice: the sink kinds in turn, rope flipped in the second, the fp8
    kinds (window e4m3fnuz + compressed e4m3fn, then the defaults) and 16-bit caches."""
    out = []
    for i, s in enumerate(v4.SHAPES["tiny"] + v4.SHAPES["odd"]):
        a = replace(s, sink=v4.SINKS[i % 4], window_fp8="e4m3fnuz")
        b = replace(s, sink=v4.SINKS[(i + 2) % 4], rope=not s.rope, kv="auto" if i % 3 == 0 else s.kv)
        out += [pytest.param(a, id=a.label(torch.float32)), pytest.param(b, id=b.label(torch.float32))]
    return out


@pytest.mark.parametrize("shape", _variants())
def test_reference_against_float64_formula(shape):
    case = v4.make_inputs(shape, dtype=torch.float32, device=DEVICE, seed=3)
    got = case.reference()
    want = dense_f64(case)
    case.check(*got, ref=want, tol=F64)


def test_reference_float16_q_and_caches():
    """q, out and a 16-bit cache in float16: the reference reads the values as given."""
    case = make_case((90, 40), (2, 1), 4, "csa", kv="auto", dtype=torch.float16, holes=0.1, dups=0.1)
    case.check(*case.reference(), ref=dense_f64(case), tol=F64)


def test_rows_naming_nothing_give_zero_and_minus_inf():
    """A row whose lists are all -1 (dense), or empty (ragged): out 0 and lse -inf whatever the
    sink (large, finite); the other rows as the formula says."""
    for ragged in (False, True):
        case = make_case((60, 30), (2, 1), 4, "csa", sink="large", ragged=ragged)
        if ragged:
            for name in ("window", "compressed"):
                idx, ptr = case._list(name, 0)
                n = int(ptr[2] - ptr[1])  # row 1: empty (its entries dropped, the later rows moved up)
                case._lists[(name, 0)] = (torch.cat([idx[: int(ptr[1])], idx[int(ptr[2]) :]]),
                                          torch.cat([ptr[:2], ptr[2:] - n]))  # fmt: skip
        else:
            case.window_indices()[1].fill_(-1)
            case.compressed_indices()[1].fill_(-1)
        o, lse = case.reference()
        assert bool((o[1] == 0).all()) and bool((lse[1] == -math.inf).all())
        case.check(o, lse, ref=dense_f64(case), tol=F64)


def test_empty_batch_and_no_compressed_rows():
    """T = 0; HCA rows that see no compressed row (a [T, 0] list): window attention alone."""
    empty = make_case((), 1, 4, "hca")
    o, lse = empty.reference()
    assert o.shape == (0, 4, 512) and lse.shape == (0, 4)
    short = make_case((9, 5), 1, 4, "hca", sink="none")
    assert short.compressed_indices().shape == (2, 0)
    win = mla_v4_attention_ref(*short.args()[:4], None, None, None, *short.args()[7:], short.sm_scale,
                               window_kind=short.window_kind)  # fmt: skip
    o, lse = short.reference()
    assert torch.equal(o, win[0]) and torch.equal(lse, win[1])


def _bad_values_case(ragged: bool):
    case = make_case((60, 33, 90), (2, 1, 3), 4, "csa", ragged=ragged, build={"unused": "randn"})
    return case, case.reference()


@pytest.mark.parametrize("ragged", [False, True])
def test_bad_entries_make_their_rows_nan(ragged):
    """An entry < -1 or >= num_blocks x block_size of its own cache (window or compressed list), huge
    either way: that row NaN in out and lse (every head); the other rows unchanged."""
    case, (ro, rl) = _bad_values_case(ragged)
    w, c = case.window_indices(), case.compressed_indices()
    w_cap = case.window_cache.shape[0] * case.window_cache.shape[1]
    c_cap = case.compressed_cache.shape[0] * case.compressed_cache.shape[1]
    plant = [(w, 1, -2), (c, 2, c_cap), (w, 4, w_cap), (c, 5, -(1 << 31))]
    for lst, t, v in plant:
        at = (t, 0) if not ragged else int((case.window_indptr() if lst is w else case.compressed_indptr())[t])
        lst[at] = v
    o, lse = case.reference()
    nan = [1, 2, 4, 5]
    for t in range(case.shape.T):
        assert bool(torch.isnan(o[t]).all() and torch.isnan(lse[t]).all()) == (t in nan), t
    keep = [t for t in range(case.shape.T) if t not in nan]
    assert torch.equal(o[keep].isnan(), ro[keep].isnan())
    case.check(o[keep], lse[keep], ref=(ro[keep], rl[keep]), tol=F64)


def test_a_slot_of_the_other_cache_is_bad():
    """A window entry that is a valid slot of the (larger) compressed cache but past the window
    cache: bad (each list is bounded by its own cache)."""
    case = make_case((600,), 2, 4, "csa", cblock=64, build={"unused": "randn"})
    w_cap = case.window_cache.shape[0] * case.window_cache.shape[1]
    assert case.compressed_cache.shape[0] * case.compressed_cache.shape[1] > w_cap
    case.window_indices()[0, 3] = w_cap
    o, lse = case.reference()
    assert bool(torch.isnan(o[0]).all()) and not bool(torch.isnan(o[1]).any())


def test_bad_indptr_and_positions_make_their_rows_nan():
    """Ragged rows whose indptr pair is decreasing, negative or past nnz, and positions < 0 or >= P:
    those rows NaN (out and lse), the others unchanged."""
    case, (ro, rl) = _bad_values_case(True)
    T = case.shape.T
    ptr = case.window_indptr()
    nnz = case.window_indices().shape[0]
    ptr[2] = int(ptr[1]) - 1  # row 1: decreasing; row 2 starts below its predecessor's end (fine on its own)
    cptr = case.compressed_indptr()
    cptr[T] = case.compressed_indices().shape[0] + 1  # the last row ends past nnz
    case.positions[3] = case.cos_sin_cache.shape[0]
    o, lse = case.reference()
    nan = {1, 3, T - 1}
    if int(ptr[2]) < 0:
        nan.add(2)
    for t in range(T):
        assert bool(torch.isnan(o[t]).all() and torch.isnan(lse[t]).all()) == (t in nan), t
    assert nnz > 0
    keep = [t for t in range(T) if t not in nan and t != 2]  # row 2's entries moved: its own result
    case.check(o[keep], lse[keep], ref=(ro[keep], rl[keep]), tol=F64)
    ptr[0] = -1
    case.positions[3] = -1
    o, _ = case.reference()
    assert bool(torch.isnan(o[0]).all() and torch.isnan(o[3]).all())


def test_nan_and_inf_in_named_rows_reach_only_their_rows():
    """A NaN code (e4m3 or the bf16 RoPE part) or an e=255 scale (inf) in a named row: the rows
    naming it NaN in out and lse; rows not naming it unchanged. A NaN sink: its head's out NaN, lse
    finite. (Every unused slot of the cache already holds NaN: never read.)"""
    case = make_case((70, 40), (2, 1), 4, "csa", sink="finite")
    ro, rl = case.reference()
    bs = case.shape.block
    for plant in ("code", "rope", "scale"):
        c = make_case((70, 40), (2, 1), 4, "csa", sink="finite")
        slot = int(c.window_indices()[2, 5])  # row 2 (request 1) alone names it
        data, scales = v4.fp8_ds_mla_views(c.window_cache)
        if plant == "code":
            data[slot // bs, slot % bs, 17] = 0x7F
        elif plant == "rope":
            data[slot // bs, slot % bs, 449] = 0x7F
            data[slot // bs, slot % bs, 448] = 0xC0
        else:
            scales[slot // bs, slot % bs, 3] = 255
        o, lse = c.reference()
        assert bool(torch.isnan(o[2]).all() and torch.isnan(lse[2]).all()), plant
        c.check(o[:2], lse[:2], ref=(ro[:2], rl[:2]), tol=F64)
    case.attn_sink[1] = math.nan
    o, lse = case.reference()
    assert bool(torch.isnan(o[:, 1]).all()) and not bool(torch.isnan(lse).any())
    case.check(o[:, [0, 2, 3]], lse, ref=(ro[:, [0, 2, 3]], rl), tol=F64)


def test_sink_as_a_denominator_term():
    """out with a sink = out without it x sigmoid(lse - sink), per head (-inf: unchanged; +200 and
    +inf: zero); lse never includes the sink."""
    case = make_case((80, 30), (2, 1), 4, "hca", ratio=8, cblock=2, sink="none", rope=False)
    o0, l0 = case.reference()
    a = case.args()
    sink = torch.tensor([-math.inf, 0.5, 6.0, 200.0], device=DEVICE)
    o, lse = mla_v4_attention_ref(*a[:7], sink, None, None, case.sm_scale, window_kind=case.window_kind,
                                  compressed_kind=case.compressed_kind)  # fmt: skip
    assert torch.equal(lse, l0)
    factor = torch.sigmoid(l0.double() - sink.double()[None, :])
    torch.testing.assert_close(o.double(), o0.double() * factor[..., None], rtol=1e-6, atol=1e-9)
    assert bool((o[:, 3] == 0).all()) and torch.equal(o[:, 0], o0[:, 0])
    sink[3] = math.inf
    o, lse = mla_v4_attention_ref(*a[:7], sink, None, None, case.sm_scale, window_kind=case.window_kind,
                                  compressed_kind=case.compressed_kind)  # fmt: skip
    assert bool((o[:, 3] == 0).all()) and torch.equal(lse, l0)


def test_rotation_is_inverse_gptj_rope():
    """positions given: the last 64 values rotated by -angle in interleaved pairs (the inverse of
    GPT-J RoPE at that position): rotating the result forward gives the unrotated out back; the
    first 448 values and lse untouched."""
    case = make_case((200, 40), (2, 1), 2, "window")
    o, lse = case.reference()
    a = case.args()
    o0, l0 = mla_v4_attention_ref(*a[:8], None, None, case.sm_scale, window_kind=case.window_kind)
    assert torch.equal(o[..., :448], o0[..., :448]) and torch.equal(lse, l0)
    cs = case.cos_sin_cache.double()[case.positions.long()]
    c, s = cs[:, None, :32], cs[:, None, 32:]
    x, y = o[..., 448::2].double(), o[..., 449::2].double()
    torch.testing.assert_close(x * c - y * s, o0[..., 448::2].double(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y * c + x * s, o0[..., 449::2].double(), rtol=1e-6, atol=1e-6)


def test_cos_sin_cache_dtypes_and_int32_positions():
    """A bfloat16 / float16 cos_sin_cache and int32 positions read as given."""
    case = make_case((50, 20), (1, 2), 2, "window", build={"positions_dtype": torch.int32})
    assert case.positions.dtype == torch.int32
    for dt in (torch.bfloat16, torch.float16):
        case.cos_sin_cache = case.cos_sin_cache.to(dt)
        case.check(*case.reference(), ref=dense_f64(case), tol=F64)


def test_fp8_ds_mla_rows_decodes_every_slot_through_the_page_stride():
    """fp8_ds_mla_rows over a cache whose pages are wider than their bytes equals the raw-byte
    decoding of the tests, slot for slot (NaN where poisoned), for both kinds."""
    for kind, name in ((FN, "e4m3fn"), (FNUZ, "e4m3fnuz")):
        case = make_case((40, 21), 1, 2, "window", window_fp8=name, build={"page_pad": 40})
        cache = case.window_cache
        assert cache.stride(0) == 16 * 584 + 40
        got = fp8_ds_mla_rows(cache, kind)
        want = slot_rows(cache, kind)
        assert got.dtype == torch.float64 and got.shape == (cache.shape[0] * 16, 512)
        assert torch.equal(got.isnan(), want.isnan()) and bool(got.isnan().any())
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    assert fp8_ds_mla_rows(cache[:0], FN).shape == (0, 512)
    with pytest.raises(TypeError, match="kind"):
        fp8_ds_mla_rows(cache, torch.float16)


def test_reference_arguments_named():
    case = make_case((30,), 1, 2, "csa")
    a = list(case.args())
    with pytest.raises(ValueError, match="q"):
        mla_v4_attention_ref(a[0][..., :256], *a[1:], case.sm_scale, window_kind=FN, compressed_kind=FN)
    with pytest.raises(TypeError, match="window_kind"):
        mla_v4_attention_ref(*a, case.sm_scale, compressed_kind=FN)
    with pytest.raises(ValueError, match="compressed_indices"):
        mla_v4_attention_ref(*a[:5], None, *a[6:], case.sm_scale, window_kind=FN, compressed_kind=FN)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        mla_v4_attention_ref(*a[:9], None, case.sm_scale, window_kind=FN, compressed_kind=FN)
