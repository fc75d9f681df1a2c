"""mla_prefill / mla_prefill_with_context memory safety (the contract in tests/_util.py): rows
outside the sequences untouched, bad cu_seqlens clamped or named, every context chunk validated
before a write, zero sizes, overlaps and scales named."""

from __future__ import annotations

import math

import pytest
import torch
from _util import (
    BAD_SCALES,
    DEVICE,
    F32,
    Guarded,
    assert_close,
    assert_no_sync_and_capturable,
    backends,
    raises_naming,
    seeded_generator,
    seeded_randn,
)
from prefill_case import cu

import rocm_mla
from rocm_mla.ops.prefill import ContextChunk, launch_triton
from rocm_mla.reference import mla_prefill_ref

PREFILL_BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP prefill kernel


class PrefillCase:
    """q [Tq, N, 192], k_nope/v views of one [Tk, N, 256] buffer, k_pe a [Tk, 576][:, 512:] view:
    all inside sentinel guards; out / lse guarded and NaN-poisoned (lse as the transpose of a
    [Tq, N] buffer)."""

    def __init__(self, Tq, Tk, N, *, dtype=F32, seed=0):
        g = seeded_generator(seed)
        self.Tq, self.Tk, self.N = Tq, Tk, N
        self.q = Guarded((Tq, N, 192), dtype, generator=g)
        self.kv = Guarded((Tk, N, 256), dtype, generator=g)
        self.latent = Guarded((Tk, 576), dtype, generator=g)
        self.out = Guarded((Tq, N, 128), dtype, fill="nan", pad_last=16)
        self.lse_t = Guarded((Tq, N), F32, fill="nan", pad_last=1)

    @property
    def args(self):
        return (self.q.view, self.kv.view[..., :128], self.latent.view[:, 512:].unsqueeze(1), self.kv.view[..., 128:])

    @property
    def lse(self):
        return self.lse_t.view.transpose(0, 1)

    def check_guards(self):
        for name in ("q", "kv", "latent", "out", "lse_t"):
            getattr(self, name).check(name)


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_prefill_writes_only_the_rows_of_sequences(backend, causal):
    """q rows outside every sequence are never written (the reference backend wrote them)."""
    case = PrefillCase(15, 11, 3, seed=1)
    cq, ck = cu([4, 0, 5], start=2), cu([3, 6, 2])  # rows 0-1 and 11-14 belong to no sequence
    rocm_mla.mla_prefill(
        *case.args, cq, ck, sm_scale=0.1, causal=causal, out=case.out.view, lse=case.lse, backend=backend
    )
    ref, ref_lse = mla_prefill_ref(*case.args, cq, ck, 0.1, causal)
    own = torch.zeros(15, dtype=torch.bool)
    own[2:11] = True
    assert_close(case.out.view[own], ref[own], rtol=2e-5, atol=2e-5)
    assert_close(case.lse[:, own], ref_lse[:, own], rtol=2e-5, atol=2e-5)
    assert torch.isnan(case.out.view[~own]).all() and torch.isnan(case.lse[:, ~own]).all(), (
        "rows that belong to no sequence were written"
    )
    case.check_guards()


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
    from rocm_mla.ops.prefill import _tma_arch, _tma_ok

    if "triton" not in backends():
        pytest.skip("Triton unavailable")
    if tma and not _tma_arch(_platform.device_arch(torch.device(DEVICE))):
        pytest.skip("TMA descriptors need an NVIDIA sm90+ GPU or the interpreter")
    case = PrefillCase(13, 9, 2, dtype=torch.float16 if tma else F32, seed=2)
    if tma:
        q, kn, kpe, v = case.args
        assert _tma_ok(q, kn, kpe, v, 0), "the case must take the TMA path"
    cq, ck = (torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in BAD_OFFSETS[bad])
    launch_triton(
        *case.args,
        cq,
        ck,
        case.out.view,
        case.lse,
        sm_scale=0.1,
        causal=causal,
        config={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "tma": tma},
    )
    case.check_guards()


def test_prefill_offsets_named_by_reference_and_debug():
    """The reference (the spec) names bad offsets, with the index and the bound; so do the op's
    checks (on the CPU always; on a GPU with debug=True or for the reference backend)."""
    case = PrefillCase(13, 9, 2)
    cq, ck = cu([5, 4, 4]), torch.tensor([0, 7, 2, 9], dtype=torch.int32, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: mla_prefill_ref(*case.args, cq, ck, 0.1),
        "mla_prefill_ref: cu_seqlens_k",
        "[0, 9]",
        "[0, 7, 2, 9]",
    )
    raises_naming(
        ValueError, lambda: mla_prefill_ref(*case.args, cu([5, 4, 5]), cu([3, 3, 3]), 0.1), "cu_seqlens_q", "[0, 13]"
    )
    for backend in PREFILL_BACKENDS:
        raises_naming(
            ValueError,
            lambda: rocm_mla.mla_prefill(*case.args, cq, ck, sm_scale=0.1, backend=backend, debug=True),
            "mla_prefill: cu_seqlens_k",
            "cu_seqlens_k[2] = 2 < cu_seqlens_k[1] = 7",
        )
        raises_naming(
            ValueError,
            lambda: rocm_mla.mla_prefill(
                *case.args, cu([5, 4, 5]), cu([3, 3, 3]), sm_scale=0.1, backend=backend, debug=True
            ),
            "cu_seqlens_q[3] = 14 > Tq=13",
        )
    case.check_guards()


def test_prefill_overlaps_rejected_naming_both():
    case = PrefillCase(6, 6, 2)
    q, kn, kpe, v = case.args
    cq = cu([6])

    def call(**kw):
        return rocm_mla.mla_prefill(q, kn, kpe, v, cq, cq, sm_scale=0.1, **kw)

    raises_naming(ValueError, lambda: call(out=v, causal=False), "out", "v", "no memory in common")
    raises_naming(ValueError, lambda: call(out=q[..., :128]), "out", "q")
    raises_naming(ValueError, lambda: call(out=kn), "out", "k_nope")
    lse_in_out = case.out.base[case.out.guard : case.out.guard + 12].view(2, 6)
    raises_naming(ValueError, lambda: call(out=case.out.view, lse=lse_in_out), "out", "lse")
    raises_naming(ValueError, lambda: call(lse=case.latent.view[:, 512:514].transpose(0, 1)), "lse", "k_pe")
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
    chunk = ContextChunk(case.out.view, kpe, case.out.view, cq)
    raises_naming(
        ValueError,
        lambda: rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, cq, [chunk], sm_scale=0.1, out=case.out.view),
        "context_chunks[0]",
        "out",
        "k_nope",
    )
    case.check_guards()


@pytest.mark.parametrize("as_generator", [False, True], ids=["list", "generator"])
@pytest.mark.parametrize("bad_at", [0, 1, 2])
@pytest.mark.parametrize("kind", ["shape", "offsets", "overlap", "type"])
def test_prefill_with_context_validates_every_chunk_before_writing(as_generator, bad_at, kind):
    """A bad chunk anywhere -- the last one of a generator included -- raises with out and lse
    bitwise untouched (they were poisoned: nothing was written)."""
    case = PrefillCase(7, 7, 2, seed=3)
    q, kn, kpe, v = case.args
    cq = cu([3, 4])
    g = seeded_generator(9)
    chunks = []
    for lens in ([2, 5], [0, 3], [4, 1]):
        Tc = sum(lens)
        kvc = torch.randn(Tc, 2, 256, generator=g).to(DEVICE)
        chunks.append(
            ContextChunk(kvc[..., :128], torch.randn(Tc, 1, 64, generator=g).to(DEVICE), kvc[..., 128:], cu(lens))
        )
    good = chunks[bad_at]
    if kind == "shape":
        chunks[bad_at] = good._replace(v=good.v[..., :64])
    elif kind == "offsets":
        chunks[bad_at] = good._replace(cu_seqlens_k=cu([good.k_nope.shape[0] + 1, 0]))
    elif kind == "overlap":
        chunks[bad_at] = good._replace(k_nope=case.out.view)._replace(
            k_pe=torch.randn(7, 1, 64, device=DEVICE), v=torch.randn(7, 2, 128, device=DEVICE), cu_seqlens_k=cu([3, 4])
        )
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
    raises_naming(
        exc,
        lambda: rocm_mla.mla_prefill_with_context(
            q, kn, kpe, v, cq, cq, arg, sm_scale=0.1, out=case.out.view, lse=case.lse, debug=True
        ),
        f"context_chunks[{bad_at}]",
    )
    assert torch.isnan(case.out.view).all() and torch.isnan(case.lse).all(), "written before validation"
    case.check_guards()
    if as_generator:
        assert len(drawn) == bad_at + 1, "the generator was drawn past the bad chunk"


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
def test_prefill_with_context_generator_matches_list(backend):
    """The lazy path (running result in its own buffer, out/lse written by the last merge only)
    equals the sized path bit for bit (same merges in the same order); 0, 1 and 3 chunks."""
    case = PrefillCase(9, 9, 3, seed=4)
    q, kn, kpe, v = case.args
    cq = cu([2, 7])
    g = seeded_generator(5)
    chunks = []
    for lens in ([3, 0], [4, 6], [0, 2]):
        Tc = sum(lens)
        chunks.append(
            (
                torch.randn(Tc, 3, 128, generator=g).to(DEVICE),
                torch.randn(Tc, 1, 64, generator=g).to(DEVICE),
                torch.randn(Tc, 3, 128, generator=g).to(DEVICE),
                cu(lens),
            )
        )
    for n in (0, 1, 3):
        o1, l1 = rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, cq, chunks[:n], sm_scale=0.1, backend=backend)
        rocm_mla.mla_prefill_with_context(
            q,
            kn,
            kpe,
            v,
            cq,
            cq,
            (c for c in chunks[:n]),
            sm_scale=0.1,
            out=case.out.view,
            lse=case.lse,
            backend=backend,
        )
        assert torch.equal(o1, case.out.view) and torch.equal(l1, case.lse)
    case.check_guards()


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
def test_prefill_zero_sizes(backend):
    """Tq = 0, Tk = 0, B = 0, with out/lse given or not; empty chunks; an empty generator."""
    for Tq, Tk, lq, lk in ((0, 0, [0, 0], [0, 0]), (5, 0, [2, 3], [0, 0]), (0, 4, [0, 0], [1, 3]), (3, 3, [], [])):
        for given in (True, False):
            case = PrefillCase(Tq, Tk, 2)
            cq, ck = cu(lq), cu(lk)
            kw = {"out": case.out.view, "lse": case.lse} if given else {}
            out, lse = rocm_mla.mla_prefill(*case.args, cq, ck, sm_scale=0.1, backend=backend, **kw)
            assert out.shape == (Tq, 2, 128) and lse.shape == (2, Tq)
            if lq:  # every row belongs to a sequence and sees no key when Tk = 0
                if Tk == 0 and Tq:
                    assert bool((out == 0).all()) and bool((lse == -math.inf).all())
            empty = ContextChunk(
                torch.empty(0, 2, 128, device=DEVICE),
                torch.empty(0, 1, 64, device=DEVICE),
                torch.empty(0, 2, 128, device=DEVICE),
                cu([0] * len(lq)),
            )
            for chunks in ([empty, empty], (c for c in [empty]), iter(())):
                rocm_mla.mla_prefill_with_context(*case.args, cq, ck, chunks, sm_scale=0.1, backend=backend, **kw)
            case.check_guards()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("bad", list(BAD_OFFSETS))
def test_gpu_prefill_bad_offsets_stay_inside(causal, bad):
    """On a GPU, mla_prefill does not read cu_seqlens (no sync): the kernel's clamp keeps every
    access inside the tensors (compute-sanitizer memcheck); debug=True names the error."""
    for dtype in (torch.bfloat16, torch.float16):
        case = PrefillCase(13, 9, 16, dtype=dtype, seed=2)
        cq, ck = (torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in BAD_OFFSETS[bad])
        rocm_mla.mla_prefill(
            *case.args, cq, ck, sm_scale=0.1, causal=causal, out=case.out.view, lse=case.lse, backend="triton"
        )
        torch.cuda.synchronize()
        case.check_guards()
        with pytest.raises(ValueError, match="cu_seqlens"):
            rocm_mla.mla_prefill(*case.args, cq, ck, sm_scale=0.1, causal=causal, backend="triton", debug=True)
        with pytest.raises(ValueError, match="cu_seqlens"):
            rocm_mla.mla_prefill(*case.args, cq, ck, sm_scale=0.1, causal=causal, backend="reference")


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
    q = seeded_randn((3, 2, 192))
    cq = cu([3])

    def fn():
        return rocm_mla.mla_prefill(
            q, seeded_randn((3, 2, 128)), seeded_randn((3, 1, 64)), seeded_randn((3, 2, 128)), cq, cq, sm_scale=bad
        )

    raises_naming(exc, fn, "mla_prefill: sm_scale", *words)


@pytest.mark.gpu
def test_gpu_prefill_checks_no_sync_and_capturable():
    """mla_prefill with caller-given out / lse (the overlap checks run): no host sync, capturable."""
    pre = PrefillCase(40, 40, 16, dtype=torch.bfloat16)
    cq = cu([10, 30])

    def run():
        rocm_mla.mla_prefill(*pre.args, cq, cq, sm_scale=0.1, out=pre.out.view, lse=pre.lse, backend="triton")

    assert_no_sync_and_capturable([run], [pre.out, pre.lse_t])
