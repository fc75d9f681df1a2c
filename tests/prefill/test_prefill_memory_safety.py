"""mla_prefill / mla_prefill_with_context memory safety (the contract in tests/_util.py): rows
outside the sequences untouched, bad cu_seqlens clamped or named, every context chunk validated
before a write, zero sizes, overlaps and scales named."""

from __future__ import annotations

import math

import pytest
import torch
from _util import BAD_SCALES, DEVICE, assert_no_sync_and_capturable, backends, raises_naming
from prefill_case import case, cu

import rocm_mla
from rocm_mla.cases import prefill
from rocm_mla.cases.prefill import ContextShape, call_prefill, call_prefill_with_context
from rocm_mla.ops.prefill import launch_triton, plan_prefill_for
from rocm_mla.ops.prefill_context import ContextChunk
from rocm_mla.reference import mla_prefill_ref

F32 = torch.float32
PREFILL_BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP prefill kernel
# Guarded layouts: q, the kv_b_proj buffer (k_nope / v views) and the latent buffer (the k_pe view)
# inside sentinel guards; out as [T, N, 192][..., :128] rows and lse as the transpose of a
# [T, N + 1] buffer's [:, :N], guarded and NaN-poisoned.
GUARDED = dict(guard=1200, out_layout="pad_v", lse_layout="transposed_padded")


def guarded(Tq, Tk, N, *, dtype=F32, seed=0) -> prefill.PrefillInputs:
    """Tq query rows and Tk key rows (the tests pass their own cu_seqlens), every buffer guarded."""
    return case([Tq], [Tk], N, dtype, seed=seed, **GUARDED)


def guarded_context(lq, chunks, N, *, seed=0) -> prefill.ContextInputs:
    """New tokens (lq per sequence, their own keys) guarded as above, and context chunks of
    ``chunks[c][b]`` keys of sequence b."""
    return prefill.make_context_inputs(ContextShape(lq, chunks, N), dtype=F32, device=DEVICE, seed=seed, **GUARDED)


def qkv(c: prefill.PrefillInputs) -> tuple:
    """(q, k_nope, k_pe, v) of ``c``."""
    return c.args()[:4]


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_prefill_writes_only_the_rows_of_sequences(backend, causal):
    """q rows outside every sequence are never written (the reference backend wrote them)."""
    c = guarded(15, 11, 3, seed=1)
    cq, ck = cu([4, 0, 5], start=2), cu([3, 6, 2])  # rows 0-1 and 11-14 belong to no sequence
    call_prefill(*qkv(c), cq, ck, sm_scale=0.1, causal=causal, out=c.out, lse=c.lse, backend=backend)
    ref, ref_lse = mla_prefill_ref(*qkv(c), cq, ck, 0.1, causal)
    own = torch.zeros(15, dtype=torch.bool)
    own[2:11] = True
    c.check(c.out[own], c.lse[:, own], ref=(ref[own], ref_lse[:, own]))
    assert torch.isnan(c.out[~own]).all() and torch.isnan(c.lse[:, ~own]).all(), (
        "rows that belong to no sequence were written"
    )
    c.check_guards()


BAD_OFFSETS = {  # (cu_seqlens_q, cu_seqlens_k) for Tq = 13, Tk = 9, B = 3
    "past_the_end": ([0, 5, 9, 40], [0, 3, 6, 30]),
    "negative_start": ([-7, 4, 9, 13], [-3, 2, 5, 9]),
    "decreasing": ([0, 9, 4, 13], [0, 7, 2, 9]),
    "huge": ([0, (1 << 31) - 1, -(1 << 31), 13], [(1 << 31) - 1, 0, -(1 << 31), 9]),
}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("bad", list(BAD_OFFSETS))
@pytest.mark.parametrize("tma", [False, True, "host"], ids=["pointers", "device_desc", "host_desc"])
def test_prefill_kernel_clamps_bad_offsets(causal, bad, tma):
    """The Triton kernel with offsets nobody validated (a GPU call without debug; here the
    launcher is called directly to bypass the CPU check): whatever they hold, nothing outside
    q, k_nope, k_pe, v, out, lse is read or written -- with pointer loads and with either kind
    of TMA descriptor (16-bit inputs; the interpreter runs the TMA path as sm90 does)."""
    from rocm_mla import _platform
    from rocm_mla.ops.prefill_plan import _tma_arch, _tma_ok

    if "triton" not in backends():
        pytest.skip("Triton unavailable")
    if tma and not _tma_arch(_platform.device_arch(torch.device(DEVICE))):
        pytest.skip("TMA descriptors need an NVIDIA sm90+ GPU or the interpreter")
    c = guarded(13, 9, 2, dtype=torch.float16 if tma else F32, seed=2)
    if tma:
        assert _tma_ok(*qkv(c), 0), "the case must take the TMA path"
    cq, ck = (torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in BAD_OFFSETS[bad])
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "tma": tma}
    plan = plan_prefill_for(*qkv(c), cq, ck, causal=causal, config=cfg, backend="triton")  # reads no offset
    if tma:
        assert plan.launch_constexprs(*qkv(c))["USE_TMA"] == (2 if tma == "host" else 1)
    launch_triton(plan, *qkv(c), cq, ck, c.out, c.lse, sm_scale=0.1)
    c.check_guards()


def test_prefill_offsets_named_by_reference_and_debug():
    """The reference (the spec) names bad offsets, with the index and the bound; so do the op's
    checks (on the CPU always; on a GPU with debug=True or for the reference backend)."""
    c = guarded(13, 9, 2)
    args = qkv(c)
    cq, ck = cu([5, 4, 4]), torch.tensor([0, 7, 2, 9], dtype=torch.int32, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: mla_prefill_ref(*args, cq, ck, 0.1),
        "mla_prefill_ref: cu_seqlens_k",
        "[0, 9]",
        "[0, 7, 2, 9]",
    )
    raises_naming(
        ValueError, lambda: mla_prefill_ref(*args, cu([5, 4, 5]), cu([3, 3, 3]), 0.1), "cu_seqlens_q", "[0, 13]"
    )
    for backend in PREFILL_BACKENDS:
        raises_naming(
            ValueError,
            lambda: call_prefill(*args, cq, ck, sm_scale=0.1, backend=backend, debug=True),
            "mla_prefill: cu_seqlens_k",
            "cu_seqlens_k[2] = 2 < cu_seqlens_k[1] = 7",
        )
        raises_naming(
            ValueError,
            lambda: call_prefill(*args, cu([5, 4, 5]), cu([3, 3, 3]), sm_scale=0.1, backend=backend, debug=True),
            "cu_seqlens_q[3] = 14 > Tq=13",
        )
    c.check_guards()


def test_prefill_overlaps_rejected_naming_both():
    c = guarded(6, 6, 2)
    q, kn, kpe, v = qkv(c)
    cq = cu([6])

    def call(**kw):
        return call_prefill(q, kn, kpe, v, cq, cq, sm_scale=0.1, **kw)

    raises_naming(ValueError, lambda: call(out=v, causal=False), "out", "v", "no memory in common")
    raises_naming(ValueError, lambda: call(out=q[..., :128]), "out", "q")
    raises_naming(ValueError, lambda: call(out=kn), "out", "k_nope")
    lse_in_out = c.out[0, :, :6]  # [N, Tq] = (2, 6) on out's first row
    raises_naming(ValueError, lambda: call(out=c.out, lse=lse_in_out), "out", "lse")
    raises_naming(ValueError, lambda: call(lse=kpe[:, 0, :2].transpose(0, 1)), "lse", "k_pe")
    cu_buf = torch.zeros(16, dtype=torch.int32, device=DEVICE)
    cu_buf[1] = 6
    raises_naming(
        ValueError,
        lambda: rocm_mla.mla_prefill(
            q, kn, kpe, v, cu_buf[:2], cq, sm_scale=0.1, lse=cu_buf[1:13].view(torch.float32).view(2, 6)
        ),
        "lse",
        "cu_seqlens_q",
    )
    # A context chunk read after out was written may not overlap it.
    chunk = ContextChunk(c.out, kpe, c.out, cq)
    raises_naming(
        ValueError,
        lambda: rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, cq, [chunk], sm_scale=0.1, out=c.out),
        "context_chunks[0]",
        "out",
        "k_nope",
    )
    c.check_guards()


@pytest.mark.parametrize("as_generator", [False, True], ids=["list", "generator"])
@pytest.mark.parametrize("bad_at", [0, 1, 2])
@pytest.mark.parametrize("kind", ["shape", "offsets", "overlap", "type"])
def test_prefill_with_context_validates_every_chunk_before_writing(as_generator, bad_at, kind):
    """A bad chunk anywhere -- the last one of a generator included -- raises with out and lse
    bitwise untouched (they were poisoned: nothing was written)."""
    c = guarded_context([3, 4], [[2, 5], [0, 3], [4, 1]], 2, seed=3)
    chunks = list(c.chunks)
    good = chunks[bad_at]
    if kind == "shape":
        chunks[bad_at] = good._replace(v=good.v[..., :64])
    elif kind == "offsets":
        chunks[bad_at] = good._replace(cu_seqlens_k=cu([good.k_nope.shape[0] + 1, 0]))
    elif kind == "overlap":  # a 7-row chunk whose k_nope is out
        chunks[bad_at] = good._replace(k_nope=c.out, k_pe=c.k_pe, v=c.v, cu_seqlens_k=cu([3, 4]))
    else:
        chunks[bad_at] = 3
    drawn = []

    def gen():
        for ch in chunks:
            drawn.append(1)
            yield ch

    arg = gen() if as_generator else chunks
    exc = TypeError if kind == "type" else ValueError
    # Offsets on a GPU are read (a sync) only with debug; on the CPU always.
    raises_naming(exc, lambda: c.run(arg, sm_scale=0.1, debug=True), f"context_chunks[{bad_at}]")
    assert torch.isnan(c.out).all() and torch.isnan(c.lse).all(), "written before validation"
    c.check_guards()
    if as_generator:
        assert len(drawn) == bad_at + 1, "the generator was drawn past the bad chunk"


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
def test_prefill_with_context_generator_matches_list(backend):
    """The lazy path (running result in its own buffer, out/lse written by the last merge only)
    equals the sized path bit for bit (same merges in the same order); 0, 1 and 3 chunks."""
    c = guarded_context([2, 7], [[3, 0], [4, 6], [0, 2]], 3, seed=4)
    for n in (0, 1, 3):
        o1, l1 = c.run(c.chunks[:n], sm_scale=0.1, out=None, lse=None, backend=backend)
        c.run((ch for ch in c.chunks[:n]), sm_scale=0.1, backend=backend)
        assert torch.equal(o1, c.out) and torch.equal(l1, c.lse)
    c.check_guards()


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
def test_prefill_zero_sizes(backend):
    """Tq = 0, Tk = 0, B = 0, with out/lse given or not; empty chunks; an empty generator."""
    for Tq, Tk, lq, lk in ((0, 0, [0, 0], [0, 0]), (5, 0, [2, 3], [0, 0]), (0, 4, [0, 0], [1, 3]), (3, 3, [], [])):
        for given in (True, False):
            c = guarded(Tq, Tk, 2)
            cq, ck = cu(lq), cu(lk)
            kw = {"out": c.out, "lse": c.lse} if given else {}
            out, lse = call_prefill(*qkv(c), cq, ck, sm_scale=0.1, backend=backend, **kw)
            assert out.shape == (Tq, 2, 128) and lse.shape == (2, Tq)
            if lq:  # every row belongs to a sequence and sees no key when Tk = 0
                if Tk == 0 and Tq:
                    assert bool((out == 0).all()) and bool((lse == -math.inf).all())
            # one empty chunk (0 keys for every sequence)
            (empty,) = prefill.make_context_inputs(
                ContextShape(lq, [[0] * len(lq)], 2), dtype=F32, device=DEVICE
            ).chunks
            for chunks in ([empty, empty], (ch for ch in [empty]), iter(())):
                call_prefill_with_context(*qkv(c), cq, ck, chunks, sm_scale=0.1, backend=backend, **kw)
            c.check_guards()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("bad", list(BAD_OFFSETS))
def test_gpu_prefill_bad_offsets_stay_inside(causal, bad):
    """On a GPU, mla_prefill does not read cu_seqlens (no sync): the kernel's clamp keeps every
    access inside the tensors (compute-sanitizer memcheck); debug=True names the error."""
    for dtype in (torch.bfloat16, torch.float16):
        c = guarded(13, 9, 16, dtype=dtype, seed=2)
        cq, ck = (torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in BAD_OFFSETS[bad])
        call_prefill(*qkv(c), cq, ck, sm_scale=0.1, causal=causal, out=c.out, lse=c.lse, backend="triton")
        torch.cuda.synchronize()
        c.check_guards()
        with pytest.raises(ValueError, match="cu_seqlens"):
            call_prefill(*qkv(c), cq, ck, sm_scale=0.1, causal=causal, backend="triton", debug=True)
        with pytest.raises(ValueError, match="cu_seqlens"):
            call_prefill(*qkv(c), cq, ck, sm_scale=0.1, causal=causal, backend="reference")


@pytest.mark.gpu
def test_gpu_prefill_rows_zero_sizes_and_context():
    for backend in ("triton", "reference"):
        test_prefill_writes_only_the_rows_of_sequences(backend, True)
        test_prefill_zero_sizes(backend)
        test_prefill_with_context_generator_matches_list(backend)


@pytest.mark.parametrize("bad,exc,words", BAD_SCALES)
def test_prefill_scale_validated(bad, exc, words):
    """sm_scale: one rule (Checker.scale) for decode and prefill, the same messages
    (tests/decode/test_decode_memory_safety.py: test_decode_scale_validated)."""
    c = case([3], [3], 2, F32)

    def fn():
        return rocm_mla.mla_prefill(*c.args(), sm_scale=bad)

    raises_naming(exc, fn, "mla_prefill: sm_scale", *words)


@pytest.mark.gpu
def test_gpu_prefill_checks_no_sync_and_capturable():
    """mla_prefill with caller-given out / lse (the overlap checks run): no host sync, capturable."""
    pre = guarded(40, 40, 16, dtype=torch.bfloat16)
    cq = cu([10, 30])
    plan = plan_prefill_for(*qkv(pre), cq, cq, backend="triton")

    def run():
        rocm_mla.mla_prefill(*qkv(pre), cq, cq, sm_scale=0.1, plan=plan, out=pre.out, lse=pre.lse)

    assert_no_sync_and_capturable([run], list(pre.guards.values()))
