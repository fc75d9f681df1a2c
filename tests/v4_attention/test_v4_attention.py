"""mla_v4_attention against its float64 reference: the tiny and odd shapes (every layer kind, dense and
ragged lists, -1 holes and repeats, poisoned unused pages, shuffled tables), both fp8_ds_mla kinds in
one call (window e4m3fnuz + compressed e4m3fn), 16-bit caches, sink kinds, RoPE on and off, strided
q / out / lse, one split and several, batch invariance, plans, workspaces, and named errors. CPU:
Triton in the interpreter (float32 and float16 q; bf16 on the GPU, test_v4_attention_gpu.py)."""

from __future__ import annotations

import math

import pytest
import torch
from _util import BAD_SCALES, DEVICE, DTYPES, raises_naming
from v4_case import BACKENDS, FN, FNUZ, make_case, replace

import rocm_mla.ops as v4op
from rocm_mla.cases import outside_untouched
from rocm_mla.cases import v4_attention as v4
from rocm_mla.ops import V4Plan, plan_v4_attention

pytestmark = pytest.mark.skipif("triton" not in BACKENDS, reason="Triton unavailable")
TINY, ODD = v4.SHAPES["tiny"], v4.SHAPES["odd"]


def _label(s) -> str:
    return s.label(torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", TINY, ids=_label)
def test_tiny(shape, dtype):
    """float32: window cache e4m3fnuz and compressed e4m3fn in one call, the plan's splits; float16:
    the default kinds, 2 splits (bf16: the plan's). Unused slots are NaN: a stray read shows."""
    if dtype == torch.float32 and shape.fp8:
        shape = replace(shape, window_fp8="e4m3fnuz", compressed_fp8="e4m3fn")
    case = v4.make_inputs(shape, dtype=dtype, device=DEVICE, seed=1)
    case.run(backend="triton", num_splits=2 if dtype == torch.float16 else None)
    case.check()


@pytest.mark.parametrize("i,shape", list(enumerate(ODD)), ids=lambda x: x if isinstance(x, int) else _label(x))
def test_odd(i, shape):
    """H 1 / 24, blocks 1 / 16, one token, rows at the start of a sequence, HCA rows seeing no
    compressed row, an empty batch: float32 and float16 in turn, 2 splits for the shortest batches
    (else the plan's), a page stride wider than the page in turn; the reference backend alike."""
    dtype = DTYPES[i % 2]
    case = v4.make_inputs(shape, dtype=dtype, device=DEVICE, seed=2, page_pad=24 * (i % 2))
    want = case.reference()
    for backend in BACKENDS:
        case.out.fill_(math.nan)
        case.lse.fill_(math.nan)
        case.run(backend=backend, num_splits=2 if backend == "triton" and shape.T <= 4 else None)
        case.check(ref=want)


def test_16bit_caches():
    """Caches in q's dtype (float32, float16), and bfloat16 / float16 caches under float32 q."""
    for dtype, cache_dt in ((torch.float32, None), (torch.float16, None), (torch.float32, torch.bfloat16),
                            (torch.float32, torch.float16)):  # fmt: skip
        case = make_case((90,), 1, 4, "csa", kv="auto", dtype=dtype, holes=0.1, dups=0.1, seed=5)
        if cache_dt is not None:  # the same rows in another dtype (bf16 values: exact in float16)
            for vc in (case.window, case.compressed):
                vc.caches[0] = vc.caches[0].to(cache_dt)
                vc.kind = cache_dt
        case.run(backend="triton")
        case.check()


def test_layouts_and_outside_untouched():
    """q an [H, T, 512] buffer transposed or a slice of [T, H, 576]; out with a token stride past H x
    512 or padded rows; lse an [H, T] buffer's transpose; nothing outside the views written."""
    for q_layout, out_layout, lse_layout in (("heads_major", "token_pad", "transposed"),
                                             ("padded", "padded", "contiguous")):  # fmt: skip
        case = make_case((150, 40), (1, 1), 4, "hca", ratio=16, dtype=torch.float16, seed=6,
                         build=dict(q_layout=q_layout, out_layout=out_layout, lse_layout=lse_layout))  # fmt: skip
        case.run(backend="triton")
        case.check()
        assert outside_untouched(case.out_base, case.out) and outside_untouched(case.lse_base, case.lse)


def test_sinks():
    """Sinks far above the scores (head 0 at 200: out ~0, the running max must hold it), one split
    and several; a NaN sink: its head's out NaN, lse finite; +inf: out 0. (-inf and no sink: the
    tiny shapes.)"""
    base = make_case((200, 60), (1, 1), 4, "csa", sink="large", dtype=torch.float32, seed=7, build={"sink_pad": 2})
    for splits in (1, 3):
        base.run(backend="triton", num_splits=splits)
        base.check()
    assert float(base.out[:, 0].abs().max()) < 1e-30
    base.attn_sink[1] = math.nan
    base.attn_sink[2] = math.inf
    ro, rl = base.reference()
    base.run(backend="triton", num_splits=2)
    assert bool(torch.isnan(base.out[:, 1]).all()) and not bool(torch.isnan(base.lse).any())
    assert bool((base.out[:, 2] == 0).all())
    keep = [0, 2, 3]
    base.check(base.out[:, keep], base.lse, ref=(ro[:, keep], rl))


def test_rows_naming_nothing():
    """A row whose lists name nothing (dense: all -1; ragged: an empty range) gets out 0 and lse
    -inf whatever its sink (large here), one split and several; the other rows exact."""
    for ragged, splits in ((False, 1), (True, 3)):
        case = make_case((60, 30), (1, 1), 4, "csa", sink="large", ragged=ragged, seed=13)
        for name in ("window", "compressed"):
            idx, ptr = case._list(name, 0)
            if ptr is None:
                idx[1].fill_(-1)
            else:
                ptr[2] = ptr[1]
        o, lse = case.run(backend="triton", num_splits=splits, out=None, lse=None)
        case.check(o, lse)
        assert bool((o[1] == 0).all()) and bool((lse[1] == -math.inf).all())


def test_row_naming_nothing_ignores_a_nan_sink():
    """SPEC: a row naming no entry gets out 0 and lse -inf whatever the sink, a NaN sink included
    (a NaN sink reaches its head's out in the rows that name entries)."""
    case = make_case((60, 30), (1, 1), 4, "csa", seed=13)
    case.window_indices()[1].fill_(-1)
    case.compressed_indices()[1].fill_(-1)
    case.attn_sink[1] = math.nan
    o, lse = case.run(backend="triton", out=None, lse=None)
    assert bool(torch.isnan(o[0, 1]).all())
    assert bool((o[1] == 0).all()) and bool((lse[1] == -math.inf).all())


def test_rope_inputs():
    """int32 positions and a bfloat16 cos_sin_cache; the RoPE part of out alone differs from a call
    without positions."""
    case = make_case((300, 20), (2, 1), 4, "window", seed=8, build={"positions_dtype": torch.int32})
    case.cos_sin_cache = case.cos_sin_cache.to(torch.bfloat16)
    o, lse = case.run(backend="triton", out=None, lse=None)
    case.check(o, lse)
    a = case.args()
    o0, l0 = v4.call_v4(*a[:8], sm_scale=case.sm_scale, window_kv_cache_dtype=case.window.kv_cache_dtype)
    assert torch.equal(o0[..., :448], o[..., :448]) and torch.equal(l0, lse)
    assert not torch.equal(o0[..., 448:], o[..., 448:])


def test_split_counts_agree():
    """1 and 4 splits agree with each other within float32 rounding."""
    case = make_case((260, 100), (1, 1), 4, "csa", topk=40, holes=0.1, dups=0.1, seed=9)
    outs = []
    for splits in (1, 4):
        o, lse = case.run(backend="triton", num_splits=splits, out=None, lse=None)
        case.check(o, lse)
        outs.append((o, lse))
    for o, lse in outs[1:]:
        torch.testing.assert_close(o, outs[0][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse, outs[0][1], rtol=0, atol=1e-5)


def test_batch_invariant_row_alone_equals_row_in_batch():
    """batch_invariant=True: each row alone (a batch of one) gives the bits it gives in the batch
    (several splits of split_tokens entries; rows of two requests, ragged compressed lists)."""
    case = make_case((200, 90), (1, 1), 4, "csa", topk=24, ragged="compressed", seed=10, dtype=torch.float16)
    plan = case.plan(batch_invariant=True, backend="triton")
    assert plan.batch_invariant and plan.num_splits > 1
    o, lse = case.run(plan=plan, out=None, lse=None)
    case.check(o, lse)
    a = case.args()
    cptr = a[6]
    for t in range(case.shape.T):
        lo, hi = int(cptr[t]), int(cptr[t + 1])
        one = (a[0][t : t + 1], a[1], a[2][t : t + 1], None, a[4], a[5][lo:hi],
               torch.tensor([0, hi - lo], dtype=torch.int32, device=DEVICE), a[7], a[8][t : t + 1], a[9])  # fmt: skip
        oa, la = v4.call_v4(*one, sm_scale=case.sm_scale, batch_invariant=True, backend="triton",
                            window_kv_cache_dtype=case.window.kv_cache_dtype,
                            compressed_kv_cache_dtype=case.compressed.kv_cache_dtype,
                            compressed_len=plan.compressed_len)  # fmt: skip
        assert torch.equal(oa, o[t : t + 1]) and torch.equal(la, lse[t : t + 1]), t


def test_plan_reuse_workspace_and_mismatch():
    """A plan serves every call of its sizes; a caller's workspace holds the partials; a plan of other
    sizes or forms is refused naming the field; a plan of the tensors equals the case's plan."""
    case = make_case((120,), 1, 4, "csa", seed=11)
    plan = case.plan(num_splits=2, backend="triton")
    assert isinstance(plan, V4Plan) and plan.num_splits == 2
    ws = torch.empty(plan.workspace_numel, device=DEVICE)
    for _ in range(2):
        case.out.fill_(math.nan)
        case.run(plan=plan, workspace=ws)
        case.check()
    other = make_case((120,), 1, 8, "csa").plan(backend="triton")
    raises_naming(ValueError, lambda: case.run(plan=other), "plan", "num_heads")
    ragged = make_case((120,), 1, 4, "csa", ragged=True).plan(backend="triton")
    raises_naming(ValueError, lambda: case.run(plan=ragged), "plan")
    window = make_case((120,), 1, 4, "window").plan(backend="triton")
    raises_naming(ValueError, lambda: case.run(plan=window), "plan")
    raises_naming(TypeError, lambda: case.run(plan="x"), "plan", "V4Plan")
    raises_naming(ValueError, lambda: case.run(plan=plan, workspace=ws[:-1]), "workspace")
    a = case.args()
    names = dict(window_kv_cache_dtype=case.window.kv_cache_dtype, compressed_kv_cache_dtype="fp8_ds_mla_e4m3fn")
    tensors_plan = v4op.plan_v4_attention_for(*a, backend="triton", **names)
    assert tensors_plan == case.plan(backend="triton") and tensors_plan.matches(*a)


def test_kv_cache_dtype_names():
    """uint8 caches with "auto" / "fp8_ds_mla" are the kinds vLLM's writers use on this arch (the
    compressed cache e4m3fn everywhere); an explicit kind reads those bytes as that kind."""
    from rocm_mla.cases import platform_fp8

    case = make_case((60,), 2, 4, "csa", window_fp8="e4m3fn" if platform_fp8(DEVICE) == FN else "e4m3fnuz")
    a = case.args()
    for name in ("auto", "fp8_ds_mla"):
        p = v4op.plan_v4_attention_for(*a, window_kv_cache_dtype=name, compressed_kv_cache_dtype=name)
        assert p.window_kind == platform_fp8(DEVICE) and p.compressed_kind == FN
    p = v4op.plan_v4_attention_for(*a, window_kv_cache_dtype="fp8_ds_mla_e4m3fnuz")
    assert p.window_kind == FNUZ
    o, lse = v4.call_v4(*a, sm_scale=case.sm_scale, backend="triton")  # "auto": the platform's kinds
    case.check(o, lse)


def test_errors_name_the_argument():
    case = make_case((30, 20), (1, 1), 4, "csa", seed=12)
    a = case.args()
    kw = dict(sm_scale=0.1)
    f = v4op.mla_v4_attention

    def call(*args, **k):
        return f(*args, **{**kw, **k})

    def sub(i, x):
        b = list(a)
        b[i] = x
        return b

    q = a[0]
    raises_naming(ValueError, lambda: call(*sub(0, q[..., :256])), "q", "512")
    raises_naming(TypeError, lambda: call(*sub(0, q.to(torch.int32))), "q")
    raises_naming(ValueError, lambda: call(*sub(1, a[1][..., :576])), "window_cache", "584")
    raises_naming(ValueError, lambda: call(*sub(1, a[1].view(-1)[: a[1].numel() // 2 * 2].view(-1, 2, 584)
                                                   .transpose(0, 1))), "window_cache")  # fmt: skip
    raises_naming(TypeError, lambda: call(*sub(2, a[2].long())), "window_indices", "int32")
    raises_naming(ValueError, lambda: call(*sub(2, a[2][:1])), "window_indices")
    raises_naming(ValueError, lambda: call(*sub(2, a[2].t().contiguous().t())), "window_indices", "stride")
    raises_naming(ValueError, lambda: call(*sub(5, None)), "compressed_indices")
    raises_naming(ValueError, lambda: call(*sub(4, None)), "compressed_indices")
    raises_naming(TypeError, lambda: call(*sub(5, a[5].long())), "compressed_indices", "int32")
    ragged = make_case((30, 20), (1, 1), 4, "csa", ragged=True)
    r = ragged.args()
    raises_naming(ValueError, lambda: f(*r[:3], r[3][:-1], *r[4:], **kw), "window_indptr")
    raises_naming(TypeError, lambda: f(*r[:3], r[3].long(), *r[4:], **kw), "window_indptr", "int32")
    raises_naming(ValueError, lambda: f(*r[:6], r[6][:-1], *r[7:], **kw), "compressed_indptr")
    raises_naming(TypeError, lambda: call(*sub(7, a[7].double())), "attn_sink", "float32")
    raises_naming(ValueError, lambda: call(*sub(7, a[7][:2])), "attn_sink")
    raises_naming(ValueError, lambda: call(*sub(9, None)), "cos_sin_cache")
    raises_naming(ValueError, lambda: call(*sub(8, None)), "positions")
    raises_naming(ValueError, lambda: call(*sub(8, a[8][:1])), "positions")
    raises_naming(TypeError, lambda: call(*sub(8, a[8].float())), "positions")
    raises_naming(ValueError, lambda: call(*sub(9, a[9][:, :32])), "cos_sin_cache", "64")
    raises_naming(ValueError, lambda: call(*a, out=torch.empty(2, 4, 256, device=DEVICE)), "out", "[T, H, 512]")
    raises_naming(TypeError, lambda: call(*a, out=torch.empty(2, 4, 512, dtype=torch.float16, device=DEVICE)), "out")
    raises_naming(TypeError, lambda: call(*a, lse=torch.empty(2, 4, dtype=torch.float16, device=DEVICE)), "lse")
    raises_naming(ValueError, lambda: v4.call_v4(*a, sm_scale=0.1, num_splits=0), "num_splits")
    raises_naming(ValueError, lambda: v4.call_v4(*a, sm_scale=0.1, num_splits=2, batch_invariant=True), "num_splits")
    raises_naming(ValueError, lambda: v4.call_v4(*a, sm_scale=0.1, window_kv_cache_dtype="fp8"), "window_kv_cache")
    raises_naming(ValueError, lambda: v4.call_v4(*a, sm_scale=0.1, window_kv_cache_dtype="bfloat16"),
                  "window_kv_cache_dtype", "uint8")  # fmt: skip
    raises_naming(ValueError, lambda: v4.call_v4(*a, sm_scale=0.1, compressed_kv_cache_dtype="fp8_e4m3"),
                  "compressed_kv_cache_dtype")  # fmt: skip
    f32 = make_case((30, 20), (1, 1), 4, "csa", kv="auto", dtype=torch.float32)
    h = f32.args()
    raises_naming(TypeError, lambda: f(h[0].half(), *h[1:], **kw), "window_cache")  # a float32 cache: float32 q only


def test_plan_arguments_named():
    kw = dict(num_rows=2, num_heads=8, q_dtype=torch.float16, device=DEVICE, window_dtype=torch.uint8,
              window_block_size=16, window_len=128)  # fmt: skip
    p = plan_v4_attention
    raises_naming(ValueError, lambda: p(**{**kw, "num_rows": -1}), "num_rows", "-1")
    raises_naming(ValueError, lambda: p(**{**kw, "num_heads": 0}), "num_heads")
    raises_naming(ValueError, lambda: p(**{**kw, "window_block_size": 0}), "window_block_size")
    raises_naming(TypeError, lambda: p(**{**kw, "q_dtype": torch.int32}), "q_dtype")
    raises_naming(TypeError, lambda: p(**kw, window_ragged=1), "window_ragged", "a bool")
    raises_naming(ValueError, lambda: p(**kw, compressed_dtype=torch.uint8, compressed_block_size=0),
                  "compressed_block_size")  # fmt: skip
    raises_naming(TypeError, lambda: p(**kw, config=[16]), "config")
    raises_naming(ValueError, lambda: p(**kw, window_kv_cache_dtype="int8"), "window_kv_cache_dtype")


@pytest.mark.parametrize("bad,exc,words", BAD_SCALES)
def test_scale_validated(bad, exc, words):
    case = make_case((30,), 1, 2, "window")
    raises_naming(exc, lambda: v4op.mla_v4_attention(*case.args(), sm_scale=bad), "sm_scale", *words)
