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

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from _util import DEVICE, DTYPES, HAS_GPU, backends, raises_naming
from prefill_case import KERNEL_BACKENDS, case, cu

import rocm_mla
from rocm_mla.cases import compare, first_problem, generator, outside_untouched, poisoned, prefill, raise_on, randn
from rocm_mla.cases.prefill import SM_SCALE, P, R, V, call_prefill
from rocm_mla.reference import mla_prefill_ref

F32, F16 = torch.float32, torch.float16

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
    lq, lk, N = [5, 0, 9, 6, 3], [5, 4, 12, 2, 0], 3  # equal, lq=0, lq<lk, lq>lk, lk=0
    c = case(lq, lk, N, F32, causal=causal)
    out, lse = mla_prefill_ref(*c.args(), 0.07, causal)
    dout, dlse = _dense_attention_f64(c.q, c.k_nope, c.k_pe, c.v, lq, lk, 0.07, causal)
    # lse: -inf exactly where the dense formula has it (rows that see no key), close elsewhere.
    bound = prefill.REFERENCE_VS_F64
    raise_on(first_problem(compare("out", out, dout, bound), compare("lse", lse, dlse, bound)))
    # Sequence 3 (lq=6 > lk=2, q rows 14..19): causal rows 0..3 see no key.
    assert bool(torch.isneginf(lse[:, 14:18]).all()) == causal and torch.isfinite(lse[:, 18:20]).all()
    assert torch.isneginf(lse[:, 20:]).all()  # sequence 4 has no keys


# ---------------------------------------------------------------- kernel vs reference (CPU and GPU)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", [pytest.param(s, id=s.name) for s in prefill.SHAPES["odd"]])
def test_matches_reference(backend, dtype, causal, shape):
    """The odd sizes (ragged blocks, lq != lk, rows that see no key, empty sequences, N=1 and 128),
    out and lse allocated by the op."""
    c = prefill.make_inputs(dataclasses.replace(shape, causal=causal), dtype=dtype, device=DEVICE, seed=1)
    out, lse = call_prefill(*c.args(), sm_scale=SM_SCALE, causal=causal, backend=backend)
    assert out.shape == (shape.Tq, shape.N, V) and out.dtype == dtype and lse.shape == (shape.N, shape.Tq)
    c.check(out, lse)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_more_sequences_than_one_lookup_step(backend):
    """B > SEQ_CHUNK: a program finds its sequence over several vector steps of cu_seqlens_q."""
    from rocm_mla.ops.prefill_plan import SEQ_CHUNK

    g = torch.Generator().manual_seed(1)
    B = SEQ_CHUNK + 40
    lq = torch.randint(0, 4, (B,), generator=g).tolist()
    lq[SEQ_CHUNK + 7] = 70  # a multi-block sequence in the second step
    lk = [n + int(x) for n, x in zip(lq, torch.randint(0, 3, (B,), generator=g))]
    c = case(lq, lk, 1, F32, out_layout="contiguous")
    c.run(backend=backend)
    c.check()


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("bm,bn", [(16, 16), (16, 64), (64, 16)])
def test_block_shapes(backend, bm, bn):
    """BLOCK_N > BLOCK_M and BLOCK_M > BLOCK_N put the causal diagonal across several key blocks;
    lk - lq not a multiple of either block puts it mid-block."""
    c = case([45, 3, 70], [58, 20, 70], 2, F32)
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4, "num_stages": 1}
    c.run(backend=backend, config=cfg)
    c.check()


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("N,want,got", [(24, 16, 12), (6, 4, 3), (8, 8, 8), (5, 2, 1), (16, 128, 16)])
def test_head_groups_cover_every_head_and_block(backend, N, want, got):
    """Programs numbered by head groups (the config's head_group, cut to a divisor of N): every
    (head, q block) is computed and every row written (NaN-poisoned out and lse) -- varlen, an
    empty sequence, q blocks of every kind."""
    from rocm_mla.ops.prefill_plan import head_group

    assert head_group({"head_group": want}, N, 100, 512) == got
    c = case([45, 0, 70, 1], [58, 20, 70, 1], N, F32, out_layout="contiguous")
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "head_group": want}
    c.run(backend=backend, config=cfg)
    c.check()


def test_grid_stays_within_int32_program_ids():
    from rocm_mla.ops.prefill_plan import grid_slots

    assert grid_slots(4096, 4, 16, 128) == 36
    assert grid_slots(0, 0, 128, 128) == 0
    with pytest.raises(ValueError, match=r"< 2\*\*31 programs, got 2147483648 \(Tq=0, B=16777216, N=128"):
        grid_slots(0, 2**24, 128, 128)


def test_head_group_rules():
    """An explicit head_group wins; head_group_kv_bytes fits the group's K/V of the longest sequence
    in that many bytes (16 MiB: 4096 keys x 512 B per head -> 8 heads); neither: one head."""
    from rocm_mla.ops.prefill_plan import head_group

    budget = {"head_group_kv_bytes": 16 << 20}
    assert head_group(budget, 16, 4096, 512) == 8
    assert head_group(budget, 128, 16384, 512) == 2
    assert head_group(budget, 16, 1024, 512) == 16  # 32 would fit: at most N
    assert head_group(budget, 24, 4096, 512) == 8
    assert head_group(budget, 12, 4096, 512) == 6  # 8 does not divide 12
    assert head_group(budget, 16, 10**6, 512) == 1
    assert head_group({**budget, "head_group": 4}, 16, 4096, 512) == 4
    assert head_group({}, 16, 4096, 512) == 1
    with pytest.raises(ValueError, match="config: expected head_group >= 1, got head_group=0"):
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
    from rocm_mla.ops.prefill_plan import _tma_ok, triton_meta

    lq, lk, N = [37, 5, 70, 0, 9], [50, 5, 70, 3, 21], 2
    c = case(lq, lk, N, F16, causal=causal, kpe_layout=kpe_layout, key_tail=7)  # 7 NaN key rows past the end
    kn, kpe, v = c.k_nope, c.k_pe, c.v
    assert kn.shape[0] == sum(lk) + 7 and torch.isnan(v[sum(lk) :]).all() and torch.isnan(kpe[sum(lk) :]).all()
    kpe_sh = 0 if kpe.shape[1] == 1 else kpe.stride(1)
    cfg = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "tma": tma}
    assert _tma_ok(c.q, kn, kpe, v, kpe_sh), "the case must take the TMA path"
    assert triton_meta(cfg, "cpu", (P, R, V), causal, False)[0]["USE_TMA"] == (2 if tma == "host" else 1)
    ref, ref_lse = c.reference()
    v[55, :, 3] = float("nan")  # sequence 2's first key (keys 55..124)
    out, lse = c.run(backend="triton", config=cfg)
    seq2 = slice(42, 112)
    assert torch.isnan(out[seq2, :, 3]).all()  # every row of sequence 2 sees its first key
    keep = torch.ones(sum(lq), dtype=torch.bool)
    keep[seq2] = False
    c.check(out[keep], lse[:, keep], ref=(ref[keep], ref_lse[:, keep]))


def test_tma_option_is_checked():
    from rocm_mla.ops.prefill_plan import triton_meta

    cfg = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "tma": "yes"}
    with pytest.raises(ValueError, match="config: expected tma false, true or \"host\", got tma='yes'"):
        triton_meta(cfg, "sm90", (P, R, V), True, False)


def test_tma_option_needs_alignment_and_16_bit_inputs():
    from rocm_mla.ops.prefill_plan import _tma_ok, triton_meta

    q, kn, kpe, v = case([4], [4], 2, F16).args()[:4]
    assert _tma_ok(q, kn, kpe, v, 0)
    g = generator(0, DEVICE)
    odd = randn((4, 2, 2 * P), g, DEVICE, F16)[..., 1 : P + 1]  # base 2 bytes off 16
    assert not _tma_ok(q, odd, kpe, v, 0)
    odd_q = randn((4, 2, P + R + 8), g, DEVICE, F16)[..., 1 : P + R + 1]
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
    # causal, seq 0: rows 0..3 see nothing; seq 1: no keys at all
    c = case([6, 3], [2, 0], 2, F32, out_layout="contiguous")
    out, lse = c.run(backend=backend)
    blind = [0, 1, 2, 3, 6, 7, 8]
    assert torch.equal(out[blind], torch.zeros_like(out[blind]))
    assert torch.isneginf(lse[:, blind]).all()
    assert torch.isfinite(lse[:, [4, 5]]).all()
    # row 4 sees key 0 only: its output is v[0] up to rounding (weight 1)
    raise_on(compare("out[4]", out[4], c.v[0], prefill.ONE_KEY).problem)
    c.check()


# ---------------------------------------------------------------- strided inputs, output views


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kpe_layout", ["latent", "expand", "per_head_copy"])
def test_strided_inputs_and_poisoned_output_views(backend, dtype, kpe_layout):
    lq, lk, N = [19, 40, 2], [30, 40, 2], 3
    Tq = sum(lq)
    # q as a head slice of a wider buffer (token stride != N * 192)
    c = case(lq, lk, N, dtype, kpe_layout=kpe_layout, q_layout="head_slice")
    assert c.q.stride()[:2] == ((N + 2) * (P + R + 8), P + R + 8)
    # out: the layer's [T, N*128 (+pad)] buffer viewed as [T, N, 128]; lse: [N, Tq] view of [Tq, N]
    out_base, out_rows = poisoned((Tq, N * V), dtype, DEVICE, pad_last=24)
    out = out_rows.view(Tq, N, V)
    lse_base, lse = poisoned((N, Tq), F32, DEVICE, transpose01=True, token_pad=1)
    got, got_lse = c.run(backend=backend, out=out, lse=lse)
    assert got is out and got_lse is lse, "must return the caller's buffers"
    c.check(out, lse)
    assert outside_untouched(out_base, out), "wrote outside the out view"
    assert outside_untouched(lse_base, lse), "wrote outside the lse view"


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_pad_v_style_output_and_inner_strides(backend):
    """out as the [T, N, 192][..., :128] view, inputs with an inner stride of 2 (Triton's generic
    path), cu_seqlens as strided views."""
    c = case([9, 14], [9, 20], 2, F32, out_layout="pad_v")
    _, q2 = poisoned(c.q.shape, F32, DEVICE, inner_stride=2)  # NaN between the elements
    q2.copy_(c.q)
    _, kn2 = poisoned(c.k_nope.shape, F32, DEVICE, inner_stride=2)
    kn2.copy_(c.k_nope)
    cq, ck = c.cu_seqlens_q, c.cu_seqlens_k
    cq2 = torch.stack([cq, torch.zeros_like(cq)], 1)[:, 0]
    ck2 = torch.stack([ck, torch.zeros_like(ck)], 1)[:, 0]
    call_prefill(q2, kn2, c.k_pe, c.v, cq2, ck2, sm_scale=SM_SCALE, out=c.out, lse=c.lse, backend=backend)
    c.check()
    assert outside_untouched(c.out_base, c.out)


# ---------------------------------------------------------------- edge shapes, dispatch


@pytest.mark.parametrize("backend", backends())
def test_no_tokens_no_sequences(backend):
    if backend == "hip":
        pytest.skip("no HIP kernel for mla_prefill")
    # out and lse allocated by the op
    out, lse = case([0, 0], [3, 0], 2, F32).run(backend=backend, out=None, lse=None)
    assert out.shape == (0, 2, V) and lse.shape == (2, 0)
    c = case([], [], 2, F32)
    assert c.cu_seqlens_q.tolist() == c.cu_seqlens_k.tolist() == [0]
    out, lse = c.run(backend=backend, out=None, lse=None)
    assert out.shape == (0, 2, V)
    # keys empty everywhere (Tk = 0): every row is blind
    out, lse = case([4, 1], [0, 0], 2, F32, causal=False).run(backend=backend, out=None, lse=None)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_forced_hip_raises_clearly():
    c = case([2], [2], 1, F32)
    if "hip" in backends():
        with pytest.raises(RuntimeError, match="mla_prefill.*'hip'.*no HIP kernel"):
            c.run(backend="hip")
    else:
        with pytest.raises(RuntimeError, match="'hip' was requested but cannot run"):
            c.run(backend="hip")


def test_forced_reference_by_environment(monkeypatch):
    c = case([5, 3], [5, 6], 2, F32)
    monkeypatch.setenv("ROCM_MLA_BACKEND_MLA_PREFILL", "reference")
    out, lse = c.run(out=None, lse=None)
    ref, ref_lse = c.reference()
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_default_dispatch():
    from rocm_mla.ops._dispatch import select

    assert select("mla_prefill", DEVICE) == "triton"  # GPU: backend_order; CPU: the interpreter


# ---------------------------------------------------------------- bad input


def _good(lq=(3, 2), lk=(4, 2), N=2):
    c = case(lq, lk, N, F32)
    return dict(zip(("q", "k_nope", "k_pe", "v", "cu_seqlens_q", "cu_seqlens_k"), c.args()))


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
        (dict(k_nope=[1, 2]), TypeError, ["k_nope", "torch.Tensor", "list"]),
    ],
)
@pytest.mark.parametrize("planned", [False, True], ids=["plan_none", "planned"])
@pytest.mark.parametrize("op", ["mla_prefill", "mla_prefill_with_context"])
def test_bad_input_names_argument(change, exc, words, planned, op):
    """The same messages whether the call plans from its tensors or runs a plan made for the good
    tensors (the plan refuses them, then their own rule names them); mla_prefill_with_context
    (no chunk) names them as mla_prefill does."""
    args = _good()
    if planned:
        make = rocm_mla.ops.plan_prefill_for if op == "mla_prefill" else rocm_mla.ops.plan_prefill_with_context_for
        args["plan"] = make(*args.values())
    for k, val in change.items():
        args[k] = val.to(DEVICE) if isinstance(val, torch.Tensor) else val
    args.setdefault("sm_scale", SM_SCALE)
    fn = getattr(rocm_mla.ops, op)
    assert raises_naming(exc, lambda: fn(**args), *words).startswith(f"{op}: ")


@pytest.mark.parametrize(
    "change,exc,words",
    [
        (dict(causal=1), TypeError, ["causal", "bool", "int"]),
        (dict(max_seqlen_q=2.5), TypeError, ["max_seqlen_q", "int", "2.5"]),
        (dict(max_seqlen_k=-1), ValueError, ["max_seqlen_k", "int >= 0", "-1"]),
        (dict(batch_invariant=1), TypeError, ["batch_invariant", "bool", "1"]),
        (dict(config={"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "tma": "yes"}), ValueError, ["tma", "'yes'"]),
    ],
)
def test_bad_plan_knob_names_it_at_plan_time(change, exc, words):
    """The mode and tuning knobs are plan_prefill's and plan_prefill_with_context's (checked once,
    when the plan is made, whether from sizes or from a call's tensors); the calls take none."""
    args = _good()
    sizes = dict(batch=2, num_heads=2, q_rows=5, k_rows=6, q_dtype=F32, device=DEVICE)
    for plan in (
        lambda: rocm_mla.plan_prefill(**sizes, **change),
        lambda: rocm_mla.plan_prefill_for(*args.values(), **change),
    ):
        assert raises_naming(exc, plan, *words).startswith("mla_prefill: ")
    with pytest.raises(TypeError, match="unexpected keyword"):
        rocm_mla.mla_prefill(**args, sm_scale=SM_SCALE, **change)
    # mla_prefill_with_context: the same knobs, plan_prefill_with_context's (the new tokens are
    # always causal: no causal knob there).
    if "causal" in change:
        with pytest.raises(TypeError, match="causal"):
            rocm_mla.ops.plan_prefill_with_context(**sizes, **change)
        return
    for plan in (
        lambda: rocm_mla.ops.plan_prefill_with_context(**sizes, **change),
        lambda: rocm_mla.ops.plan_prefill_with_context_for(*args.values(), **change),
    ):
        assert raises_naming(exc, plan, *words).startswith("mla_prefill_with_context: ")
    with pytest.raises(TypeError, match="unexpected keyword"):
        rocm_mla.ops.mla_prefill_with_context(**args, sm_scale=SM_SCALE, **change)


def test_triton_rejects_dims_wider_than_a_tile():
    """Each head dim is one register tile (powers of two masked past the dim, test_prefill_geometry.py):
    up to 256; the reference takes any dims."""
    lq = [3]
    g = generator(0, DEVICE)
    q, kn, kpe, v = (randn(s, g, DEVICE) for s in ((3, 2, 100 + 64), (3, 2, 100), (3, 1, 64), (3, 2, 512)))
    with pytest.raises(ValueError, match=r"v: expected last dim V <= 256 for the Triton kernel.*got 512"):
        call_prefill(q, kn, kpe, v, cu(lq), cu(lq), sm_scale=SM_SCALE, backend="triton")
    out, _ = call_prefill(q, kn, kpe, v, cu(lq), cu(lq), sm_scale=SM_SCALE, backend="reference")
    assert out.shape == (3, 2, 512)


def test_mixed_devices_message_without_gpu():
    args = _good()
    args["lse"] = torch.empty(2, 5, device="meta")
    with pytest.raises(ValueError, match="lse.*device"):
        rocm_mla.mla_prefill(**args, sm_scale=SM_SCALE)
