"""mla_prefill / mla_prefill_with_context: the Triton kernel against the float32 reference, the
reference against dense attention on an explicitly concatenated k, varlen batches (uneven,
lq != lk, empty sequences, rows that see no key), strided inputs and NaN-poisoned output views,
bad input. The chunked-context helper, NaN rows and the GPU-only sizes: the test_prefill_*.py files
beside this one.

CPU: the Triton interpreter (conftest sets TRITON_INTERPRET=1), fp32/fp16, small sizes and the
"default" config (BLOCK_M 32, BLOCK_N 16) so that short sequences cross several blocks.
GPU (@pytest.mark.gpu): bf16/fp16/fp32 at serving sizes with the arch's config, int64 addressing.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _util import DEVICE, DTYPES, HAS_GPU, assert_close, backends, outside_untouched, poisoned_view, raises_naming, rand
from prefill_case import (
    KERNEL_BACKENDS,
    SCALE,
    P,
    R,
    V,
    assert_matches,
    cu,
    make_inputs,
)

import rocm_mla
from rocm_mla.reference import mla_prefill_ref

# ---------------------------------------------------------------- the reference itself


def _dense_attention_f64(q, k_nope, k_pe, v, lq, lk, scale, causal):
    """Independent formula: all sequences at once, explicit cat(k_nope, k_pe) in float64, a
    [Tq, Tk] mask from segment ids (same sequence; bottom-right causal), SDPA with a boolean mask
    for the output and logsumexp for the lse. Rows that see no key: out 0, lse -inf."""
    Tq, N, _ = q.shape
    Tk = k_nope.shape[0]
    k = torch.cat([k_nope.double(), k_pe.double().expand(Tk, N, R)], dim=-1)
    qseg = torch.repeat_interleave(torch.arange(len(lq)), torch.tensor(lq))
    kseg = torch.repeat_interleave(torch.arange(len(lk)), torch.tensor(lk))
    qpos = torch.cat([torch.arange(n) for n in lq]) if Tq else torch.zeros(0, dtype=torch.long)
    kpos = torch.cat([torch.arange(n) for n in lk]) if Tk else torch.zeros(0, dtype=torch.long)
    offset = (torch.tensor(lk) - torch.tensor(lq))[qseg]  # lk - lq of each query's sequence
    mask = qseg[:, None] == kseg[None, :]
    if causal:
        mask &= kpos[None, :] <= (qpos + offset)[:, None]
    mask = mask.to(q.device)
    qh, kh, vh = q.double().transpose(0, 1), k.transpose(0, 1), v.double().transpose(0, 1)  # [N, T, D]
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale).transpose(0, 1)
    s = torch.einsum("nid,njd->nij", qh, kh) * scale
    lse = torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1)  # [N, Tq]
    out = torch.where(mask.any(-1)[:, None, None], out, torch.zeros_like(out))  # SDPA gives NaN there
    return out, lse


@pytest.mark.parametrize("causal", [True, False])
def test_reference_matches_dense_attention(causal):
    g = torch.Generator().manual_seed(0)
    lq, lk, N = [5, 0, 9, 6, 3], [5, 4, 12, 2, 0], 3  # equal, lq=0, lq<lk, lq>lk, lk=0
    Tq, Tk = sum(lq), sum(lk)
    q = torch.randn(Tq, N, P + R, generator=g).to(DEVICE)
    kn = torch.randn(Tk, N, P, generator=g).to(DEVICE)
    kpe = torch.randn(Tk, 1, R, generator=g).to(DEVICE)
    v = torch.randn(Tk, N, V, generator=g).to(DEVICE)
    out, lse = mla_prefill_ref(q, kn, kpe, v, cu(lq), cu(lk), 0.07, causal)
    dout, dlse = _dense_attention_f64(q, kn, kpe, v, lq, lk, 0.07, causal)
    assert_close(out, dout.float(), rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(dlse.float()))
    # Sequence 3 (lq=6 > lk=2, q rows 14..19): causal rows 0..3 see no key.
    assert bool(torch.isneginf(lse[:, 14:18]).all()) == causal and torch.isfinite(lse[:, 18:20]).all()
    assert torch.isneginf(lse[:, 20:]).all()  # sequence 4 has no keys
    fin = torch.isfinite(dlse)
    assert_close(lse[fin], dlse[fin].float(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- kernel vs reference (CPU and GPU)

CASES = {
    # name: (lq, lk, N)
    "uneven": ([37, 5, 70], [37, 5, 70], 16),  # self-attention, lengths cross blocks raggedly
    "lq_lt_lk": ([10, 33, 4], [50, 33, 17], 4),  # new tokens after a prefix
    "lq_gt_lk": ([40, 7, 3], [9, 0, 3], 4),  # causal rows that see nothing; lk = 0
    "empty_seqs": ([0, 12, 0, 1], [5, 12, 0, 1], 2),  # lq = 0 with keys, both 0, single token
    "N128": ([20, 9], [20, 9], 128),
    "N1": ([100, 37], [100, 37], 1),
}


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(backend, dtype, causal, case):
    lq, lk, N = CASES[case]
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, N, dtype)
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, causal=causal, backend=backend)
    assert out.shape == (sum(lq), N, V) and out.dtype == dtype and lse.shape == (N, sum(lq))
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, causal)
    assert_matches(out, lse, ref, ref_lse, dtype)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_more_sequences_than_one_lookup_step(backend):
    """B > SEQ_CHUNK: a program finds its sequence over several vector steps of cu_seqlens_q."""
    from rocm_mla.ops.prefill import SEQ_CHUNK

    g = torch.Generator().manual_seed(1)
    B = SEQ_CHUNK + 40
    lq = torch.randint(0, 4, (B,), generator=g).tolist()
    lq[SEQ_CHUNK + 7] = 70  # a multi-block sequence in the second step
    lk = [n + int(x) for n, x in zip(lq, torch.randint(0, 3, (B,), generator=g))]
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, 1, torch.float32)
    out = torch.full((sum(lq), 1, V), float("nan"), device=DEVICE)
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, out=out, backend=backend)
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, True)
    assert_matches(out, lse, ref, ref_lse, torch.float32)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("bm,bn", [(16, 16), (16, 64), (64, 16)])
def test_block_shapes(backend, bm, bn):
    """BLOCK_N > BLOCK_M and BLOCK_M > BLOCK_N put the causal diagonal across several key blocks;
    lk - lq not a multiple of either block puts it mid-block."""
    lq, lk, N = [45, 3, 70], [58, 20, 70], 2
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, N, torch.float32)
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4, "num_stages": 1}
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, True)
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, backend=backend, config=cfg)
    assert_matches(out, lse, ref, ref_lse, torch.float32)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("N,want,got", [(24, 16, 12), (6, 4, 3), (8, 8, 8), (5, 2, 1), (16, 128, 16)])
def test_head_groups_cover_every_head_and_block(backend, N, want, got):
    """Programs numbered by head groups (the config's head_group, cut to a divisor of N): every
    (head, q block) is computed and every row written (NaN-poisoned out and lse) -- varlen, an
    empty sequence, q blocks of every kind."""
    from rocm_mla.ops.prefill import head_group

    assert head_group({"head_group": want}, N, 100, 512) == got
    lq, lk = [45, 0, 70, 1], [58, 20, 70, 1]
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, N, torch.float32)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "head_group": want}
    out = torch.full((sum(lq), N, V), float("nan"), device=DEVICE)
    lse = torch.full((N, sum(lq)), float("nan"), device=DEVICE)
    rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, out=out, lse=lse, backend=backend, config=cfg)
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, True)
    assert_matches(out, lse, ref, ref_lse, torch.float32)


def test_grid_stays_within_int32_program_ids():
    from rocm_mla.ops.prefill import grid_slots

    assert grid_slots(4096, 4, 16, 128) == 36
    assert grid_slots(0, 0, 128, 128) == 0
    with pytest.raises(ValueError, match=r"programs must be < 2\*\*31, got 2147483648 \(Tq=0, B=16777216, N=128"):
        grid_slots(0, 2**24, 128, 128)


def test_head_group_rules():
    """An explicit head_group wins; head_group_kv_bytes fits the group's K/V of the longest sequence
    in that many bytes (16 MiB: 4096 keys x 512 B per head -> 8 heads); neither: one head."""
    from rocm_mla.ops.prefill import head_group

    budget = {"head_group_kv_bytes": 16 << 20}
    assert head_group(budget, 16, 4096, 512) == 8
    assert head_group(budget, 128, 16384, 512) == 2
    assert head_group(budget, 16, 1024, 512) == 16  # 32 would fit: at most N
    assert head_group(budget, 24, 4096, 512) == 8
    assert head_group(budget, 12, 4096, 512) == 6  # 8 does not divide 12
    assert head_group(budget, 16, 10**6, 512) == 1
    assert head_group({**budget, "head_group": 4}, 16, 4096, 512) == 4
    assert head_group({}, 16, 4096, 512) == 1
    with pytest.raises(ValueError, match="head_group must be >= 1, got 0"):
        head_group({"head_group": 0}, 16, 4096, 512)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("kpe_layout", ["latent", "per_head_copy"])
@pytest.mark.parametrize("tma", [True, "host"], ids=["device_desc", "host_desc"])
def test_tma_path_matches_reference(causal, kpe_layout, tma):
    """The "tma" launch options (tensor descriptors for K, k_pe, V -- per program, or built on the
    host with q too; taken on sm90 GPUs and by the interpreter; on other GPUs the launch uses
    pointer loads and this checks those): same results, and no NaN from
    keys outside a sequence reaches it -- the rows after the last sequence's keys hold NaN (TMA
    zero fill or the masked last block must keep them out), and a NaN in the V of sequence 2's
    first key poisons sequence 2 only, not sequence 1, whose last key block reaches into
    sequence 2's rows."""
    from rocm_mla.ops.prefill import _tma_ok, triton_meta

    lq, lk, N = [37, 5, 70, 0, 9], [50, 5, 70, 3, 21], 2
    q, kn, kpe, v, cq, ck = make_inputs(lq, [*lk[:-1], lk[-1] + 7], N, torch.float16, kpe_layout=kpe_layout)
    ck = cu(lk)  # 7 key rows after the last sequence's end, poisoned:
    for x in (kn, kpe, v):
        x[sum(lk) :] = float("nan")
    kpe_sh = 0 if kpe.shape[1] == 1 else kpe.stride(1)
    cfg = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "tma": tma}
    assert _tma_ok(q, kn, kpe, v, kpe_sh), "the case must take the TMA path"
    assert triton_meta(cfg, "cpu", (P, R, V), causal, False)[0]["USE_TMA"] == (2 if tma == "host" else 1)
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, causal)
    v[55, :, 3] = float("nan")  # sequence 2's first key (keys 55..124)
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, causal=causal, backend="triton", config=cfg)
    seq2 = slice(42, 112)
    assert torch.isnan(out[seq2, :, 3]).all()  # every row of sequence 2 sees its first key
    keep = torch.ones(sum(lq), dtype=torch.bool)
    keep[seq2] = False
    assert_matches(out[keep], lse[:, keep], ref[keep], ref_lse[:, keep], torch.float16)


def test_tma_option_is_checked():
    from rocm_mla.ops.prefill import triton_meta

    cfg = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "tma": "yes"}
    with pytest.raises(ValueError, match="tma must be false, true or \"host\", got 'yes'"):
        triton_meta(cfg, "sm90", (P, R, V), True, False)


def test_tma_option_needs_alignment_and_16_bit_inputs():
    from rocm_mla.ops.prefill import _tma_ok, triton_meta

    q, kn, kpe, v, _, _ = make_inputs([4], [4], 2, torch.float16)
    assert _tma_ok(q, kn, kpe, v, 0)
    odd = rand((4, 2, 2 * P), torch.float16)[..., 1 : P + 1]  # base 2 bytes off 16
    assert not _tma_ok(q, odd, kpe, v, 0)
    odd_q = rand((4, 2, P + R + 8), torch.float16)[..., 1 : P + R + 1]
    assert not _tma_ok(odd_q, kn, kpe, v, 0)  # host descriptors load q too
    assert not _tma_ok(q.float(), kn.float(), kpe.float(), v.float(), 0)  # fp32: no TMA path
    tma = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "tma": True}
    assert triton_meta(tma, "sm90", (P, R, V), True, False)[0]["USE_TMA"]
    assert not triton_meta(tma, "gfx942", (P, R, V), True, False)[0]["USE_TMA"]
    assert not triton_meta(tma, "sm80", (P, R, V), True, False)[0]["USE_TMA"]
    assert not triton_meta(tma, "sm90", (P, R, V), True, True)[0]["USE_TMA"]  # fp32


def test_tma_allocator_is_set_only_when_none_is():
    """Device-side descriptors need Triton's scratch allocator: set one if the caller has none,
    never replace the caller's (run in a copied context: the allocator is a ContextVar)."""
    import contextvars

    import triton
    from triton.runtime import _allocation

    from rocm_mla.ops.prefill import _ensure_allocator

    def body():
        _allocation._allocator.set(_allocation._NULL_ALLOCATOR)
        _ensure_allocator(torch.device("cpu"))
        assert _allocation._allocator.get() is _allocation._NULL_ALLOCATOR  # CPU: nothing to do
        _ensure_allocator(torch.device("cuda"))
        ours = _allocation._allocator.get()
        assert ours is not _allocation._NULL_ALLOCATOR
        mine = lambda size, alignment, stream: None  # noqa: E731
        triton.set_allocator(mine)
        _ensure_allocator(torch.device("cuda"))
        assert _allocation._allocator.get() is mine

    contextvars.copy_context().run(body)


@pytest.mark.parametrize("backend", backends())
def test_rows_that_see_no_key_are_zero_and_minus_inf(backend):
    if backend == "hip":
        pytest.skip("no HIP kernel for mla_prefill")
    lq, lk, N = [6, 3], [2, 0], 2  # causal, seq 0: rows 0..3 see nothing; seq 1: no keys at all
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, N, torch.float32)
    out = torch.full((9, N, V), float("nan"), device=DEVICE)
    lse = torch.full((N, 9), float("nan"), device=DEVICE)
    rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, out=out, lse=lse, backend=backend)
    blind = [0, 1, 2, 3, 6, 7, 8]
    assert torch.equal(out[blind], torch.zeros_like(out[blind]))
    assert torch.isneginf(lse[:, blind]).all()
    assert torch.isfinite(lse[:, [4, 5]]).all()
    # row 4 sees key 0 only: its output is v[0] exactly (weight 1)
    assert_close(out[4], v[0], rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- strided inputs, output views


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kpe_layout", ["latent", "expand", "per_head_copy"])
def test_strided_inputs_and_poisoned_output_views(backend, dtype, kpe_layout):
    lq, lk, N = [19, 40, 2], [30, 40, 2], 3
    Tq = sum(lq)
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, N, dtype, kpe_layout=kpe_layout)
    # q as a head slice of a wider buffer (token stride != N * 192)
    q_buf = rand((Tq, N + 2, P + R + 8), dtype)
    q_view = q_buf[:, 1 : N + 1, : P + R]
    q_view.copy_(q)
    # out: the layer's [T, N*128 (+pad)] buffer viewed as [T, N, 128]; lse: [N, Tq] view of [Tq, N]
    out_base = torch.full((Tq, N * V + 24), float("nan"), dtype=dtype, device=DEVICE)
    out = out_base[:, : N * V].view(Tq, N, V)
    lse_base, lse = poisoned_view((N, Tq), torch.float32, transpose01=True, token_pad=1)
    got, got_lse = rocm_mla.mla_prefill(q_view, kn, kpe, v, cq, ck, sm_scale=SCALE, out=out, lse=lse, backend=backend)
    assert got is out and got_lse is lse, "must return the caller's buffers"
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, True)
    assert_matches(out, lse, ref, ref_lse, dtype)
    assert outside_untouched(out_base, out), "wrote outside the out view"
    assert outside_untouched(lse_base, lse), "wrote outside the lse view"


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_pad_v_style_output_and_inner_strides(backend):
    """out as the [T, N, 192][..., :128] view, inputs with an inner stride of 2 (Triton's generic
    path), cu_seqlens as strided views."""
    lq, lk, N = [9, 14], [9, 20], 2
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, N, torch.float32)
    q2 = torch.zeros(q.shape[0], N, 2 * (P + R), device=DEVICE)[..., ::2]
    q2.copy_(q)
    kn2 = torch.zeros(kn.shape[0], N, 2 * P, device=DEVICE)[..., ::2]
    kn2.copy_(kn)
    cq2 = torch.stack([cq, torch.zeros_like(cq)], 1)[:, 0]
    ck2 = torch.stack([ck, torch.zeros_like(ck)], 1)[:, 0]
    out_base, out = poisoned_view((sum(lq), N, V), torch.float32, pad_last=64)
    rocm_mla.mla_prefill(q2, kn2, kpe, v, cq2, ck2, sm_scale=SCALE, out=out, backend=backend)
    ref, _ = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, True)
    assert_close(out, ref, rtol=2e-5, atol=2e-5)
    assert outside_untouched(out_base, out)


# ---------------------------------------------------------------- edge shapes, dispatch


@pytest.mark.parametrize("backend", backends())
def test_no_tokens_no_sequences(backend):
    if backend == "hip":
        pytest.skip("no HIP kernel for mla_prefill")
    q, kn, kpe, v, cq, ck = make_inputs([0, 0], [3, 0], 2, torch.float32)
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, backend=backend)
    assert out.shape == (0, 2, V) and lse.shape == (2, 0)
    q, kn, kpe, v, _, _ = make_inputs([], [], 2, torch.float32)
    z = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, z, z.clone(), sm_scale=SCALE, backend=backend)
    assert out.shape == (0, 2, V)
    # keys empty everywhere (Tk = 0): every row is blind
    q, kn, kpe, v, cq, ck = make_inputs([4, 1], [0, 0], 2, torch.float32)
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, causal=False, backend=backend)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_forced_hip_raises_clearly():
    q, kn, kpe, v, cq, ck = make_inputs([2], [2], 1, torch.float32)
    if "hip" in backends():
        with pytest.raises(RuntimeError, match="mla_prefill.*'hip'.*no HIP kernel"):
            rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, backend="hip")
    else:
        with pytest.raises(RuntimeError, match="'hip' was requested but cannot run"):
            rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, backend="hip")


def test_forced_reference_by_environment(monkeypatch):
    q, kn, kpe, v, cq, ck = make_inputs([5, 3], [5, 6], 2, torch.float32)
    monkeypatch.setenv("ROCM_MLA_BACKEND_MLA_PREFILL", "reference")
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE)
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_default_dispatch():
    from rocm_mla.ops._dispatch import select

    assert select("mla_prefill", DEVICE) == "triton"  # GPU: backend_order; CPU: the interpreter


# ---------------------------------------------------------------- bad input


def _good(lq=(3, 2), lk=(4, 2), N=2):
    q, kn, kpe, v, cq, ck = make_inputs(list(lq), list(lk), N, torch.float32)
    return dict(q=q, k_nope=kn, k_pe=kpe, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck)


CPU_OFFSETS_ONLY = pytest.mark.skipif(
    HAS_GPU, reason="offsets are checked for CPU cu_seqlens only (reading GPU ones would be a host sync)"
)


def _t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "change,exc,words",
    [
        (dict(q=_t(5, 2, 190)), ValueError, ["q", "(*, 2, 192)", "(5, 2, 190)", "P=128", "R=64"]),
        (dict(q=_t(5, 2, 192, dtype=torch.float64)), TypeError, ["q", "float64"]),
        (dict(q=_t(5, 192)), ValueError, ["q", "3-D", "(5, 192)"]),
        (dict(k_nope=_t(6, 3, 128)), ValueError, ["k_nope", "q's N", "(6, 3, 128)"]),
        (dict(k_nope=_t(6, 2, 128, dtype=torch.float16)), TypeError, ["k_nope", "float32", "float16"]),
        (dict(k_pe=_t(6, 3, 64)), ValueError, ["k_pe", "[Tk, 1, R]", "(6, 3, 64)"]),
        (dict(k_pe=_t(5, 1, 64)), ValueError, ["k_pe", "(6, 1, *)", "(5, 1, 64)"]),
        (dict(v=_t(6, 2, 64, dtype=torch.float16)), TypeError, ["v", "float16"]),
        (dict(v=_t(7, 2, 128)), ValueError, ["v", "[Tk, N, V] = (6, 2,", "k_nope's Tk, N", "(7, 2, 128)"]),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int64)), TypeError, ["cu_seqlens_q", "int32", "int64"]),
        (dict(cu_seqlens_k=torch.tensor([0, 6], dtype=torch.int32)), ValueError, ["cu_seqlens_k", "(3,)", "(2,)"]),
        pytest.param(
            dict(cu_seqlens_q=torch.tensor([0, 3, 9], dtype=torch.int32)),
            ValueError,
            ["cu_seqlens_q", "Tq=5", "[0, 3, 9]"],
            marks=CPU_OFFSETS_ONLY,
        ),
        pytest.param(
            dict(cu_seqlens_k=torch.tensor([0, 4, 2], dtype=torch.int32)),
            ValueError,
            ["cu_seqlens_k", "non-decreasing", "[0, 4, 2]"],
            marks=CPU_OFFSETS_ONLY,
        ),
        (dict(out=_t(5, 2, 192)), ValueError, ["out", "(5, 2, 128)", "(5, 2, 192)"]),
        (dict(out=_t(5, 2, 128, dtype=torch.float16)), TypeError, ["out", "float32", "float16"]),
        (dict(out=_t(5, 2, 1).expand(5, 2, 128)), ValueError, ["out", "overlap", "stride"]),
        (dict(lse=_t(5, 2)), ValueError, ["lse", "[N, Tq]", "(2, 5)", "(5, 2)"]),
        (dict(lse=_t(2, 5, dtype=torch.float16)), TypeError, ["lse", "float32", "float16"]),
        (dict(sm_scale=-1.0), ValueError, ["sm_scale", "> 0", "-1.0"]),
        (dict(sm_scale="0.1"), TypeError, ["sm_scale", "float", "str"]),
        (dict(causal=1), TypeError, ["causal", "bool", "int"]),
        (dict(max_seqlen_q=2.5), TypeError, ["max_seqlen_q", "int", "2.5"]),
        (dict(k_nope=[1, 2]), TypeError, ["k_nope", "torch.Tensor", "list"]),
    ],
)
def test_bad_input_names_argument(change, exc, words):
    args = _good()
    for k, val in change.items():
        args[k] = val.to(DEVICE) if isinstance(val, torch.Tensor) else val
    args.setdefault("sm_scale", SCALE)
    assert raises_naming(exc, lambda: rocm_mla.mla_prefill(**args), *words).startswith("mla_prefill: ")


def test_triton_rejects_non_power_of_two_dims():
    lq = [3]
    q = rand((3, 2, 100 + 64), torch.float32)
    kn, kpe, v = rand((3, 2, 100), torch.float32), rand((3, 1, 64), torch.float32), rand((3, 2, 128), torch.float32)
    with pytest.raises(ValueError, match=r"k_nope: expected last dim P a power of two >= 16.*got 100"):
        rocm_mla.mla_prefill(q, kn, kpe, v, cu(lq), cu(lq), sm_scale=SCALE, backend="triton")
    # the reference takes any dims
    out, _ = rocm_mla.mla_prefill(q, kn, kpe, v, cu(lq), cu(lq), sm_scale=SCALE, backend="reference")
    assert out.shape == (3, 2, 128)


def test_mixed_devices_message_without_gpu():
    args = _good()
    args["lse"] = torch.empty(2, 5, device="meta")
    with pytest.raises(ValueError, match="lse.*device"):
        rocm_mla.mla_prefill(**args, sm_scale=SCALE)
