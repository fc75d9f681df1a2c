"""rocm_mla.cases: the builders' invariants (shuffled block tables that are permutations, NaN in
every unused slot, views strided as declared, fp8 caches with their scale, varlen offsets,
independent copies), the comparison rule, the named shape sets, and each op's reference on the
built inputs against an independent dense formula (float64)."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from _util import DEVICE

from rocm_mla.cases import (
    Bound,
    CaseMismatch,
    Guarded,
    _paged,
    cold_copies,
    compare,
    context_gather,
    decode,
    first_problem,
    merge,
    outside_untouched,
    paged_cache,
    poisoned,
    prefill,
    rope_kv_write,
    sparse,
)

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
E4M3 = torch.float8_e4m3fn
PKG = Path(__file__).resolve().parents[2] / "rocm_mla" / "cases"


# ---------------------------------------------------------------- the paged cache
def _covered(pc: _paged.PagedCache, i: int = 0) -> torch.Tensor:
    """[num_pages, block_size] bool: the slots the requests cover, from the table (row by row)."""
    cache, table, bs = pc.caches[i], pc.tables[i].cpu(), pc.block_size
    mask = torch.zeros(cache.shape[:2], dtype=torch.bool)
    for b, n in enumerate(pc.lens):
        for t in range(n):
            mask[int(table[b, t // bs]), t % bs] = True
    return mask


@pytest.mark.parametrize("lens,bs", [((37, 5, 70), 16), ((1, 64, 65), 64), ((3, 1), 1), ((), 16)])
@pytest.mark.parametrize("fp8", [None, E4M3, torch.float8_e4m3fnuz], ids=["f32", "e4m3fn", "e4m3fnuz"])
def test_paged_cache_pages_shuffled_unused_nan(lens, bs, fp8):
    g = _paged.generator(0, "cpu")
    pc = paged_cache(lens, bs, dtype=F32, device="cpu", gen=g, fp8=fp8, k_scale=0.25 if fp8 else None)
    nblk = [-(-n // bs) for n in lens]
    cache, table = pc.cache, pc.table
    assert cache.shape == (sum(nblk) + 3, bs, 576) and table.dtype == torch.int32
    assert table.shape == (len(lens), max(nblk + [1]) + 1)
    used = torch.cat([table[b, :nb] for b, nb in enumerate(nblk)]) if lens else torch.zeros(0, dtype=torch.int32)
    assert used.unique().numel() == used.numel() == sum(nblk), "a page is handed out twice"
    spare = set(range(cache.shape[0])) - set(used.tolist())
    assert len(spare) == 3
    for b, nb in enumerate(nblk):  # the columns past a request's pages point at spare (NaN) pages
        assert set(table[b, nb:].tolist()) <= spare
    vals = cache.float()
    cov = _covered(pc)
    assert torch.isnan(vals[~cov]).all(), "a slot no request covers is not NaN"
    assert torch.isfinite(vals[cov]).all() and (vals[cov] != 0).float().mean() > 0.99 if cov.any() else True
    if fp8 is not None:
        assert cache.dtype == fp8 and pc.stored().dtype == torch.uint8
        assert pc.k_scale == 0.25
    # values: the keys as the cache holds them (x k_scale for fp8), never paged
    scale = pc.k_scale or 1.0
    for b, n in enumerate(lens):
        tok = torch.arange(n)
        rows = vals[table[b, tok // bs].long(), tok % bs] * scale
        torch.testing.assert_close(rows, pc.values[b], rtol=0, atol=0)


def test_paged_cache_order_is_shuffled_and_copies_independent():
    g = _paged.generator(1, "cpu")
    pc = paged_cache([256] * 4, 16, dtype=F16, device="cpu", gen=g, copies=3, spare_pages=0, spare_cols=0)
    assert pc.copies == 3 and pc.values is not None
    flat = pc.table.flatten()
    assert sorted(flat.tolist()) == list(range(64)), "the table is not a permutation of the pages"
    assert not torch.equal(flat, torch.arange(64, dtype=torch.int32)), "pages in order, not shuffled"
    for i in range(1, 3):
        assert not torch.equal(pc.tables[i], pc.table), "copies share a page permutation"
        assert not torch.equal(pc.caches[i], pc.cache), "copies share values"
        assert pc.caches[i].data_ptr() != pc.cache.data_ptr()
        assert _covered(pc, i).all(), "spare_pages=0, lengths a multiple of the block: every slot used"


def test_paged_cache_page_pad_and_fp8_saturation():
    g = _paged.generator(2, "cpu")
    pc = paged_cache([20], 16, dtype=F32, device="cpu", gen=g, fp8=E4M3, k_scale=0.001, page_pad=5)
    assert pc.cache.stride() == (16 * 576 + 5, 576, 1)
    v = pc.cache.float()
    assert torch.isfinite(v[_covered(pc)]).all(), "values past the fp8 range must saturate, not become NaN"
    assert v[_covered(pc)].abs().max() == 448.0


def test_cold_copies():
    assert cold_copies(100, 0) == (1, True)
    assert cold_copies(100, 50) == (2, True)
    assert cold_copies(1, 1000, cap=64) == (64, False)
    assert cold_copies(10**9, 50 * 2**20) == (1, True)


# ---------------------------------------------------------------- decode inputs
def test_decode_views_as_vllm_hands_them():
    s = decode.DecodeShape(3, 40, 8, q_len=2, block=16)
    c = decode.make_inputs(s, dtype=F16, device=DEVICE)
    rows = 6
    assert c.q_nope.shape == (rows, 8, 512) and c.q_nope.stride() == (512, rows * 512, 1)  # bmm output, transposed
    assert c.q_pe.shape == (rows, 8, 64) and c.q_pe.stride() == (8 * 192, 192, 1)  # q[..., 128:]
    assert c.q_pe.storage_offset() == 128
    assert c.out.shape == (rows, 8, 512) and torch.isnan(c.out).all() and torch.isnan(c.lse).all()
    assert c.seq_lens.tolist() == [40] * 3 and c.seq_lens.dtype == torch.int32
    assert c.kv_cache.dtype == F16 and c.kv_cache_dtype == "auto" and c.k_scale is None
    o = decode.make_inputs(s, dtype=F16, q_layout="one_buffer", out_layout="padded", lse_layout="transposed")
    assert o.q_nope.stride() == (8 * 584, 584, 1) and o.q_pe.stride() == (8 * 584, 584, 1)
    assert o.q_pe.storage_offset() - o.q_nope.storage_offset() == 512
    assert o.out.stride() == (8 * 520, 520, 1) and o.lse.stride() == (1, rows)
    sep = decode.make_inputs(s, dtype=F16, q_layout="separate", out_layout="token_pad")
    assert sep.q_nope.is_contiguous() and sep.q_pe.storage_offset() == 8 * 192 + 128
    assert sep.out.stride() == (9 * 512, 512, 1)
    assert outside_untouched(o.out_base, o.out)


def test_decode_fp8_inputs():
    s = decode.DecodeShape(2, 33, 4, block=16, kv="fp8")
    c = decode.make_inputs(s, dtype=F16, fp8=E4M3, k_scale=0.5, copies=2)
    assert c.kv_cache.dtype == E4M3 and c.kv_cache_dtype == "fp8"
    assert c.k_scale.tolist() == [0.5]
    args = c.args(1)
    assert args[2].dtype == torch.uint8 and args[2].data_ptr() == c.paged.caches[1].data_ptr()
    assert args[3] is c.paged.tables[1]
    kw = c.kwargs(num_splits=3)
    plan = kw["plan"]
    assert plan.kv_cache_dtype == "fp8" and plan.kv_dtype == torch.uint8 and plan.kv_kind == E4M3
    assert kw["k_scale"] is c.k_scale and plan.k_scale_on_device and plan.num_splits == 3
    # platform kind by default (the CPU's: configs/platform.json)
    d = decode.make_inputs(s, dtype=F16)
    assert d.kv_cache.dtype == _paged.platform_fp8(torch.device("cpu"))


def test_decode_shape_sets_and_counts():
    sets = decode.SHAPES
    serving = sets["serving"]
    assert {sh.N for sh in serving} == {16, 128} and any(sh.q_len > 1 for sh in serving)
    assert any(sh.fp8 for sh in serving) and any(sh.B == 1 for sh in serving)
    assert serving[0].label() == "bf16 B=128 seq=4096 N=16"
    assert decode.DecodeShape(128, 4096, 16, 2).label() == "bf16 B=128 seq=4096 N=16 q2"
    assert decode.DecodeShape(1, 4096, 128, kv="fp8").label() == "fp8 B=1 seq=4096 N=128"
    assert all(sh.N == 16 for sh in sets["tp8"]) and all(sh.N == 128 for sh in sets["dp"])
    assert all(sh.q_len > 1 for sh in sets["mtp"])
    odd = sets["odd"]
    assert {1, 8, 24, 128} <= {sh.N for sh in odd} and {1, 16, 64} <= {sh.block for sh in odd}
    assert any(sh.B == 0 for sh in odd) and any(1 in sh.seq_lens for sh in odd)
    s = decode.DecodeShape(2, 10, 4, q_len=3)
    assert s.keys_seen() == 2 * (8 + 9 + 10)
    assert s.flops() == 2.0 * 4 * s.keys_seen() * (576 + 512)
    assert s.nbytes(BF16) == 2 * 10 * 576 * 2 + 6 * 4 * 576 * 2 + 6 * 4 * 512 * 2
    assert s.set_bytes(BF16) == 2 * 64 * 576 * 2


# ---------------------------------------------------------------- prefill / merge / rope / gather inputs
def test_prefill_inputs_varlen_and_views():
    s = prefill.PrefillShape((5, 0, 9), 3, lk=(7, 4, 9))
    c = prefill.make_inputs(s, dtype=F16)
    assert c.cu_seqlens_q.tolist() == [0, 5, 5, 14] and c.cu_seqlens_k.tolist() == [0, 7, 11, 20]
    assert c.cu_seqlens_q.dtype == torch.int32
    assert c.k_nope.stride() == (3 * 256, 256, 1) and c.v.stride() == (3 * 256, 256, 1)
    assert c.v.storage_offset() - c.k_nope.storage_offset() == 128
    assert c.k_pe.shape == (20, 1, 64) and c.k_pe.stride()[0] == 576 and c.k_pe.storage_offset() == 512
    assert c.out.shape == (14, 3, 128) and c.out.stride() == (3 * 128, 128, 1) and torch.isnan(c.out).all()
    assert c.lse.shape == (3, 14) and c.lse.is_contiguous()
    p = prefill.make_inputs(s, dtype=F16, kpe_layout="expand", out_layout="pad_v", lse_layout="transposed")
    assert p.k_pe.shape == (20, 3, 64) and p.k_pe.stride()[1] == 0
    assert p.out.stride() == (3 * 192, 192, 1) and p.lse.stride() == (1, 3)
    plan = c.kwargs()["plan"]  # the hints are the plan's: the longest sequences
    assert plan.max_seqlen_q == 9 and plan.max_seqlen_k == 9 and plan.causal and plan.matches(*c.args())
    h = prefill.make_inputs(s, dtype=F16, kpe_layout="per_head_copy")
    assert h.k_pe.shape == (20, 3, 64) and torch.equal(h.k_pe[:, 0], h.k_pe[:, 2])


def test_prefill_shape_sets_and_flops():
    bench = prefill.SHAPES["bench"]
    assert [sh.label for sh in bench][:3] == ["4x4096 N=16", "4x4096 N=128", "16x1024 N=16"]
    assert prefill.VARLEN[-1] == 8192 and len(prefill.VARLEN) == 9
    assert set(prefill.SHAPES["tune"]) <= set(bench)
    for q, k in ((5, 5), (3, 9), (9, 3), (4, 0), (0, 4)):
        s = prefill.PrefillShape((q,), 2, lk=(k,))
        pairs = sum(max(0, min(k, i + k - q + 1)) for i in range(q))
        assert s.flops() == 2.0 * 2 * pairs * 320
    assert prefill.PrefillShape.equal(2, 7, 1).flops() == 2.0 * 320 * 1 * 2 * 7 * 8 / 2


def test_merge_layouts():
    for layout, out_stride, lse_stride in (
        ("contiguous", (4 * 16, 16, 1), (6, 1)),
        ("strided", (4 * 80, 80, 1), (6, 1)),
        ("head_slice", (7 * 16, 16, 1), (1, 4)),
        ("inner_stride2", (4 * 32, 32, 2), (6, 1)),
    ):
        c = merge.make_inputs(merge.MergeShape(6, 4, 16, layout), dtype=F16)
        for t in (c.output, c.prefix_output, c.suffix_output):
            assert t.shape == (6, 4, 16) and t.stride() == out_stride, layout
        for t in (c.prefix_lse, c.suffix_lse, c.output_lse):
            assert t.shape == (4, 6) and t.stride() == lse_stride, layout
        assert torch.isnan(c.output).all() and torch.isnan(c.output_lse).all()
        assert torch.isfinite(c.prefix_output).all() and (c.prefix_output != 0).all()
    t = merge.make_inputs(merge.MergeShape(6, 4, 16, "strided", lse="transposed"), dtype=F16, with_lse=False)
    assert t.prefix_lse.stride() == (1, 4) and t.output_lse is None


def test_rope_inputs():
    s = rope_kv_write.RopeShape(37, 8, block=16, kv="fp8")
    c = rope_kv_write.make_inputs(s, dtype=F16, fp8=E4M3, skip=(1, 5), block_pad=1, max_pos=300)
    assert c.q_pe.shape == (37, 8, 64) and c.q_pe.stride() == (8 * 192, 192, 1) and c.q_pe.storage_offset() == 128
    assert c.k_pe.shape == (37, 1, 64) and c.k_pe.stride()[0] == 576 and c.k_pe.storage_offset() == 512
    assert c.cos_sin.shape == (300, 64) and int(c.positions.max()) < 300 and c.positions.dtype == torch.int64
    assert (c.slots == -1).sum() == 2 and c.slots[1] == -1 and c.slots[5] == -1
    good = c.slots[c.slots >= 0]
    assert good.unique().numel() == good.numel() == 35
    assert c.cache.dtype == E4M3 and c.args()[5].dtype == torch.uint8 and c.kwargs()["kv_cache_dtype"] == "fp8"
    assert c.cache.stride()[0] == 2 * c.cache.stride()[1] * 16 and torch.isnan(c.cache_base.float()).all()
    assert s.num_blocks() == (37 * 5 // 4 + 15) // 16 + 1
    assert rope_kv_write.RopeShape(4096, 16).label() == "T=4096 N=16 bf16"
    assert rope_kv_write.RopeShape(4096, 16, kv="fp8").label() == "T=4096 N=16 fp8"


def test_context_gather_inputs():
    s = context_gather.ChunkShape((50, 1, 23), (17, 0, 0), (33, 1, 23), 16, kv="fp8")
    c = context_gather.make_inputs(s, dtype=F16, fp8=E4M3)
    assert c.cu_seq_lens.tolist() == [0, 33, 34, 57] and c.starts.tolist() == [17, 0, 0]
    assert c.token_to_seq.tolist() == [0] * 33 + [1] + [2] * 23 + [0, 0, 0]
    assert c.dst.shape == (57, 576) and c.dst.stride() == (584, 1) and torch.isnan(c.dst).all()
    assert c.kv_cache.dtype == E4M3 and c.k_scale.tolist() == [0.25]
    with pytest.raises(ValueError, match="past its request"):
        context_gather.ChunkShape((5,), (3,), (3,))


# ---------------------------------------------------------------- references against dense formulas
def _attention_f64(q, k, v, mask, scale):
    """Softmax attention of q [M, D] over k [S, D] / v [S, Dv] where mask [M, S]; rows without a key: 0, -inf."""
    s = (q.double() @ k.double().T) * scale
    s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.where(mask.any(-1, keepdim=True), torch.softmax(s, -1), torch.zeros_like(s)).nan_to_num(0.0)
    return p @ v.double(), lse


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_decode_reference_equals_dense_attention(kv):
    s = decode.DecodeShape(N=3, q_len=2, block=4, lens=(9, 2, 13), kv=kv)
    c = decode.make_inputs(s, dtype=F32, device="cpu", fp8=E4M3, k_scale=0.5, seed=4)
    ro, rl = c.reference()
    q = torch.cat([c.q_nope, c.q_pe], -1)
    for b, L in enumerate(s.lens):
        keys = c.paged.values[b]
        for t in range(2):
            row = b * 2 + t
            mask = (torch.arange(L) <= L - 2 + t)[None].expand(3, L)
            o, lse = _attention_f64(q[row], keys, keys[:, :512], mask, c.sm_scale)
            torch.testing.assert_close(ro[row], o.float(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(rl[row], lse.float(), rtol=1e-5, atol=1e-5)


def test_prefill_reference_equals_dense_attention():
    s = prefill.PrefillShape((5, 0, 9, 6), 2, lk=(5, 4, 12, 2))
    c = prefill.make_inputs(s, dtype=F32, seed=5)
    ro, rl = c.reference()
    k = torch.cat([c.k_nope, c.k_pe.expand(-1, 2, -1)], -1)
    oq = ok = 0
    for lq, lk in zip(s.lq, s.lk):
        mask = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + lk - lq
        for h in range(2):
            o, lse = _attention_f64(c.q[oq : oq + lq, h], k[ok : ok + lk, h], c.v[ok : ok + lk, h], mask, c.sm_scale)
            torch.testing.assert_close(ro[oq : oq + lq, h], o.float(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(rl[h, oq : oq + lq], lse.float(), rtol=1e-5, atol=1e-5)
        oq, ok = oq + lq, ok + lk
    assert torch.isneginf(rl[:, 14:18]).all()  # sequence 3: lq 6 > lk 2, its first 4 rows see no key


def test_merge_reference_equals_weighted_sum():
    c = merge.make_inputs(merge.MergeShape(5, 3, 8, "head_slice"), dtype=F32, seed=6)
    ro, rl = c.reference()
    pl, sl = c.prefix_lse.double().T[..., None], c.suffix_lse.double().T[..., None]  # [T, N, 1]
    m = torch.maximum(pl, sl)
    wp, ws = (pl - m).exp(), (sl - m).exp()
    want = (wp * c.prefix_output.double() + ws * c.suffix_output.double()) / (wp + ws)
    torch.testing.assert_close(ro, want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rl, torch.logaddexp(c.prefix_lse.double(), c.suffix_lse.double()).float())


@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
def test_rope_reference_equals_complex_rotation(is_neox):
    s = rope_kv_write.RopeShape(9, 3, block=16)
    c = rope_kv_write.make_inputs(s, dtype=F32, is_neox=is_neox, mscale=1.3, max_pos=100, seed=7)
    q_ref, k_ref, rows = c.reference()
    cs = c.cos_sin.double()[c.positions]
    rot = torch.complex(cs[:, :32], cs[:, 32:])[:, None, :]  # mscale e^{i theta}, [T, 1, 32]

    def rotate(x):
        x = x.double()
        if is_neox:
            z = torch.complex(x[..., :32], x[..., 32:]) * rot
            return torch.cat((z.real, z.imag), -1)
        return torch.view_as_real(torch.complex(x[..., 0::2], x[..., 1::2]) * rot).flatten(-2)

    torch.testing.assert_close(q_ref, rotate(c.q0[..., 128:]).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_ref, rotate(c.kv_a0[:, 512:].unsqueeze(1)).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rows[:, :512], c.kv_c)


def test_context_gather_reference_equals_definition():
    s = context_gather.ChunkShape((70, 9, 1), (64, 0, 0), (6, 5, 1), 16)
    c = context_gather.make_inputs(s, dtype=F32, seed=8)
    want = torch.cat([c.paged.values[i][st : st + n] for i, (st, n) in enumerate(zip(s.starts, s.rows))])
    torch.testing.assert_close(c.reference(), want, rtol=0, atol=0)


# ---------------------------------------------------------------- the check and the rule
def test_check_passes_the_reference_and_fails_a_broken_result():
    c = decode.make_inputs(decode.SHAPES["selfcheck"][0], dtype=F16)
    ro, rl = c.reference()
    c.out.copy_(ro)
    c.lse.copy_(rl)
    assert c.mismatch() == ""
    c.check()
    c.out[2, 3, 7] += 0.5
    assert c.mismatch().startswith("out: 1 of")
    with pytest.raises(CaseMismatch, match="out"):
        c.check()
    c.out.copy_(ro)
    c.lse[0, 0] = float("nan")
    assert "NaN where the reference is finite" in c.mismatch()
    assert c.mismatch(requests=1) != ""  # the first request's rows include row 0


def test_compare_rule():
    ref = torch.tensor([1.0, -2.0, 0.0, float("-inf"), float("nan")])
    b = Bound(1e-3, 1e-2)
    assert compare("x", ref.clone(), ref, b).ok
    assert compare("x", ref + torch.tensor([0.0105, 0, 0, 0, 0]), ref, b).ok  # <= 1e-3 + 1e-2 * 1
    assert not compare("x", ref + torch.tensor([0.012, 0, 0, 0, 0]), ref, b).ok
    assert "infinities" in compare("x", torch.tensor([1.0, -2.0, 0.0, 5.0, float("nan")]), ref, b).problem
    assert "finite where the reference is NaN" in compare("x", torch.tensor([1.0, -2, 0, -math.inf, 0]), ref, b).problem
    assert "shape" in compare("x", ref[:2], ref, b).problem
    # The norm-wise part: small outputs, element-wise loose, a systematic 2 % error caught.
    r = torch.full((1000,), 0.01)
    assert compare("o", r * 1.02, r, Bound(2e-2, 2e-2)).ok
    assert "relative norm error" in compare("o", r * 1.02, r, Bound(2e-2, 2e-2, norm=1e-2)).problem
    assert compare("z", torch.zeros(3), torch.zeros(3), Bound(0, 0, norm=1e-2)).ok


def test_every_tolerance_table_covers_the_dtypes():
    for mod, keys in (
        (decode, {"out", "lse"}),
        (prefill, {"out", "lse"}),
        (merge, {"output", "output_lse"}),
        (rope_kv_write, {"q_pe", "k_pe", "rows", "rows_fp8", "unfused", "rows_fp8_unfused"}),
        (context_gather, {"dst"}),
        (sparse, {"out", "lse"}),
    ):
        assert set(mod.TOLERANCE) == {F32, F16, BF16}, mod.__name__
        for table in mod.TOLERANCE.values():
            assert set(table) == keys and all(isinstance(v, Bound) for v in table.values())


def test_poisoned_and_guarded_buffers():
    base, view = poisoned((3, 4, 5), F32, pad_last=2, token_pad=1)
    assert view.stride() == (5 * 7, 7, 1) and outside_untouched(base, view)
    view.fill_(1.0)
    assert outside_untouched(base, view)
    base[0, 4, 0] = 0.0
    assert not outside_untouched(base, view)
    g = Guarded((4, 6), F16, pad_last=2, generator=torch.Generator().manual_seed(0))
    g.view.mul_(2)
    g.check()
    g.base[0] = 0
    with pytest.raises(AssertionError, match="guard elements changed"):
        g.check()


def test_shapes_are_frozen_and_replaceable():
    s = decode.SHAPES["verify"][0]
    t = dataclasses.replace(s, N=128)
    assert t.N == 128 and t.lens == s.lens and hash(t) != hash(s)
    with pytest.raises(ValueError, match="kv"):
        decode.DecodeShape(kv="int8")


def test_cases_import_no_test_or_tool_code():
    bad = []
    for path in PKG.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            for n in names:
                if n.split(".")[0] in ("pytest", "perf", "tests") or "tools" in n.split(".") or "testing" in n:
                    bad.append(f"{path.name}: {n}")
    assert not bad, bad


def test_rope_copies_independent_and_untouched_catches_a_stray_write():
    s = rope_kv_write.RopeShape(20, 2, block=16, kv="fp8")
    a, b = rope_kv_write.make_copies(s, 2, dtype=F32, fp8=E4M3)
    assert a.cos_sin is b.cos_sin and not torch.equal(a.slots, b.slots) and not torch.equal(a.q, b.q)
    a.run(backend="reference")
    assert a.mismatch() == ""
    free = sorted(set(range(s.num_blocks() * 16)) - set(a.slots.tolist()))[0]
    a.cache.view(torch.uint8)[free // 16, free % 16, 0] = 0
    assert "without a slot" in a.untouched()
    a.restore()
    a.run(backend="reference")
    codes = a.cache.view(torch.uint8)
    t = int(a.slots[0])
    codes[t // 16, t % 16, 520] ^= 0x06  # two code steps off
    assert a.mismatch().startswith("cache rows (fp8 codes)")


@pytest.mark.parametrize(
    "make",
    [
        lambda: decode.make_inputs(decode.SHAPES["selfcheck"][0], dtype=F32, device=DEVICE),
        lambda: decode.make_inputs(
            dataclasses.replace(decode.SHAPES["tiny"][0], kv="fp8"), dtype=F32, device=DEVICE, copies=2, spare_cols=0
        ),
        lambda: prefill.make_inputs(prefill.SHAPES["selfcheck"][0], dtype=F32, device=DEVICE),
        lambda: merge.make_inputs(merge.SHAPES["selfcheck"][0], dtype=F32, device=DEVICE),
        lambda: rope_kv_write.make_inputs(rope_kv_write.SHAPES["tiny"][0], dtype=F32, device=DEVICE, skip=(2,)),
        lambda: context_gather.make_inputs(context_gather.SHAPES["selfcheck"][0], dtype=F32, device=DEVICE),
    ],
    ids=["decode", "decode_fp8_copies", "prefill", "merge", "rope_kv_write", "context_gather"],
)
def test_run_calls_the_public_op_and_check_passes(make):
    """args()/kwargs() are the op's own call: the reference backend through the public op agrees."""
    case = make()
    case.run(backend="reference")
    case.check()


@pytest.mark.parametrize("fp8", [None, E4M3], ids=["f16", "e4m3fn"])
def test_paged_cache_finite_unused_slots_inside_guards(fp8):
    g = _paged.generator(3, "cpu")
    pc = paged_cache(
        [5, 20], 16, dtype=F16, device="cpu", gen=g, fp8=fp8, k_scale=0.5, unused="randn", guard=100, copies=2
    )
    assert torch.isfinite(pc.cache.float()).all() and (pc.cache.float() != 0).float().mean() > 0.99
    scale = 0.5 if fp8 else 1.0
    for b, n in enumerate(pc.lens):  # values: still the requests' keys as the cache holds them
        tok = torch.arange(n)
        rows = pc.cache[pc.table[b, tok // 16].long(), tok % 16].float() * scale
        torch.testing.assert_close(rows, pc.values[b], rtol=0, atol=0)
    pc.check_guards()
    flat = pc.guards[1][0]
    assert flat[:100].float().eq(flat[:1].float()).all() and torch.isfinite(flat[:100].float()).all()
    flat[-1] = 0
    with pytest.raises(AssertionError, match=r"copy 1: \d guard bytes changed"):
        pc.check_guards()


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_decode_plan_is_the_plan_of_the_call(kv):
    """DecodeInputs.plan: plan_decode on the call's own sizes (the table's width, the cache's
    dtype as stored, k_scale on the device), max_seq_len the longest request by default."""
    from rocm_mla.ops import plan_decode

    shape = decode.DecodeShape(3, 80, 16, 2, block=16, kv=kv)
    case = decode.make_inputs(shape, dtype=torch.float16, device=DEVICE, spare_cols=0)
    got = case.plan(num_splits=2)
    want = plan_decode(
        batch=3,
        num_heads=16,
        q_len=2,
        max_blocks=5,
        block_size=16,
        q_dtype=torch.float16,
        kv_dtype=case.paged.stored(0).dtype,
        kv_cache_dtype=case.kv_cache_dtype,
        device=torch.device(DEVICE),
        max_seq_len=80,
        num_splits=2,
        k_scale_on_device=kv == "fp8",
    )
    assert got == want and case.block_table.shape == (3, 5)
    assert case.plan(max_seq_len=16).num_splits <= got.num_splits


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_rope_compare_unfused_takes_vllms_two_step_path(kv):
    """RopeInputs.compare_unfused: vLLM's unfused path (benchutil.vllm_unfused_rope_kv_write, k_pe
    left unrotated in kv_a) agrees under the "unfused" bound; a wrong rotation or row is caught."""
    from benchutil import vllm_unfused_rope_kv_write

    shape = rope_kv_write.RopeShape(24, 4, block=16, kv=kv)
    case = rope_kv_write.make_inputs(shape, dtype=BF16, cs_dtype=BF16)  # cos/sin in the model dtype, as vLLM
    ref = case.reference()
    vllm_unfused_rope_kv_write(
        case.positions, case.q, case.kv_a, case.kv_c, case.cos_sin, case.cache, case.slots, case.fp8, case.k_scale
    )
    assert first_problem(*case.compare_unfused(ref=ref)) == "" and case.untouched() == ""
    case.q[0, 0, -1] += 1.0
    assert first_problem(*case.compare_unfused(ref=ref)).startswith("q_pe")
