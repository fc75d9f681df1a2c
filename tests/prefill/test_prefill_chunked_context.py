"""mla_prefill_with_context: the chunked-context helper (new tokens, then cached context in
chunks, merged in place) against one-shot attention over all keys; bad chunks rejected."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, DTYPES, outside_untouched, poisoned_view
from prefill_case import (
    KERNEL_BACKENDS,
    SCALE,
    V,
    assert_matches,
    context_case,
)

import rocm_mla
from rocm_mla.reference import mla_prefill_ref

# ---------------------------------------------------------------- chunked context


CTX = {
    # name: (lq, ctx_splits, N)
    "two_chunks": ([7, 0, 20], [[20, 5, 0], [10, 7, 0]], 4),
    "three_chunks_odd": ([5, 16], [[3, 0], [0, 30], [11, 2]], 2),
    "no_context": ([9, 4], [], 2),
}


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CTX))
@pytest.mark.parametrize("as_generator", [False, True], ids=["list", "generator"])
def test_chunked_context_equals_one_shot(backend, dtype, case, as_generator):
    lq, splits, N = CTX[case]
    (q, kn, kpe, v, cq, ck, chunks), one_shot = context_case(lq, splits, N, dtype)
    Tq = sum(lq)
    out_base, out = poisoned_view((Tq, N, V), dtype, pad_last=64)
    lse_base, lse = poisoned_view((N, Tq), torch.float32, transpose01=True)
    arg = (c for c in chunks) if as_generator else chunks
    got, got_lse = rocm_mla.mla_prefill_with_context(
        q, kn, kpe, v, cq, ck, arg, sm_scale=SCALE, out=out, lse=lse, backend=backend
    )
    assert got is out and got_lse is lse
    ref, ref_lse = mla_prefill_ref(*one_shot, SCALE, True)
    assert_matches(out, lse, ref, ref_lse, dtype)
    assert outside_untouched(out_base, out) and outside_untouched(lse_base, lse)
    # and the kernel's one-shot path agrees with the helper
    one, one_lse = rocm_mla.mla_prefill(*one_shot, sm_scale=SCALE, backend=backend)
    assert_matches(out, lse, one.float(), one_lse, dtype)


@pytest.mark.parametrize("n_chunks", [1, 2, 3])
def test_chunked_context_merges_in_place_into_the_callers_lse(monkeypatch, n_chunks):
    """The data path: every merge writes ``out`` over itself, never writes the lse it reads (the
    HIP merge reads an lse row from several threads), and with a sized chunk list the last merge
    lands in the caller's ``lse`` (no final copy)."""
    import rocm_mla.ops.prefill as prefill_mod

    calls = []
    real = prefill_mod.merge_attn_states

    def spy(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None, **kw):
        calls.append((output, prefix_output, prefix_lse, output_lse))
        return real(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, **kw)

    monkeypatch.setattr(prefill_mod, "merge_attn_states", spy)
    lq = [4, 6]
    splits = [[3, 2], [0, 5], [7, 1]][:n_chunks]
    (q, kn, kpe, v, cq, ck, chunks), one_shot = context_case(lq, splits, 2, torch.float32)
    lse = torch.full((2, 10), float("nan"), device=DEVICE)
    out, _ = rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, ck, chunks, sm_scale=SCALE, lse=lse)
    assert len(calls) == n_chunks
    for output, prefix_output, prefix_lse, output_lse in calls:
        assert output is out and prefix_output is out
        assert output_lse.data_ptr() != prefix_lse.data_ptr()
    assert calls[-1][3] is lse
    ref, ref_lse = mla_prefill_ref(*one_shot, SCALE, True)
    assert_matches(out, lse, ref, ref_lse, torch.float32)


def test_chunked_context_rejects_bad_chunk():
    lq = [3, 2]
    (q, kn, kpe, v, cq, ck, chunks), _ = context_case(lq, [[4, 1]], 2, torch.float32)
    bad = chunks[0]._replace(cu_seqlens_k=torch.tensor([0, 5], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"context_chunks\[1\].*cu_seqlens_k.*\(3,\).*\(2,\)"):
        rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, ck, [chunks[0], bad], sm_scale=SCALE)
    with pytest.raises(TypeError, match=r"context_chunks\[0\].*tuple.*int"):
        rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, ck, [3], sm_scale=SCALE)


@pytest.mark.gpu
def test_gpu_chunked_context_bf16():
    (q, kn, kpe, v, cq, ck, chunks), one_shot = context_case(
        [300, 0, 1024], [[2000, 64, 0], [512, 700, 0], [5, 0, 0]], 16, torch.bfloat16
    )
    out, lse = rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, ck, chunks, sm_scale=SCALE)
    ref, ref_lse = mla_prefill_ref(*one_shot, SCALE, True)
    assert_matches(out, lse, ref, ref_lse, torch.bfloat16)
