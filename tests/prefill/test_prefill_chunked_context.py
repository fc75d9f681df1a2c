"""mla_prefill_with_context: the chunked-context helper (new tokens, then cached context in
chunks, merged in place) against one-shot attention over all keys; bad chunks rejected."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, DTYPES
from prefill_case import KERNEL_BACKENDS

from rocm_mla.cases import outside_untouched, prefill
from rocm_mla.cases.prefill import SM_SCALE, ContextShape, call_prefill

# ---------------------------------------------------------------- chunked context


def context(lq, splits, N, dtype, **layouts) -> prefill.ContextInputs:
    """New tokens (lq per sequence) and context chunks (splits[c][b] = keys of sequence b in chunk c)."""
    return prefill.make_context_inputs(ContextShape(lq, splits, N), dtype=dtype, device=DEVICE, **layouts)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [pytest.param(s, id=s.name) for s in prefill.CONTEXT_SHAPES["odd"]])
@pytest.mark.parametrize("as_generator", [False, True], ids=["list", "generator"])
def test_chunked_context_equals_one_shot(backend, dtype, shape, as_generator):
    c = prefill.make_context_inputs(shape, dtype=dtype, device=DEVICE, out_layout="pad_v", lse_layout="transposed")
    arg = (ch for ch in c.chunks) if as_generator else c.chunks
    got, got_lse = c.run(arg, backend=backend)
    assert got is c.out and got_lse is c.lse
    c.check()
    assert outside_untouched(c.out_base, c.out) and outside_untouched(c.lse_base, c.lse)
    # and the kernel's one-shot path agrees with the helper
    one, one_lse = call_prefill(*c.one_shot(), sm_scale=SM_SCALE, backend=backend)
    c.check(ref=(one.float(), one_lse))


@pytest.mark.parametrize("n_chunks", [1, 2, 3])
def test_chunked_context_merges_in_place_into_the_callers_lse(monkeypatch, n_chunks):
    """The data path: every merge writes ``out`` over itself, never writes the lse it reads (the
    HIP merge reads an lse row from several threads), and with a sized chunk list the last merge
    lands in the caller's ``lse`` (no final copy)."""
    import rocm_mla.ops.prefill_context as prefill_mod

    calls = []
    real = prefill_mod.merge_attn_states

    def spy(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None, **kw):
        calls.append((output, prefix_output, prefix_lse, output_lse))
        return real(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, **kw)

    monkeypatch.setattr(prefill_mod, "merge_attn_states", spy)
    c = context([4, 6], [[3, 2], [0, 5], [7, 1]][:n_chunks], 2, torch.float32)
    out, _ = c.run(out=None)  # lse: the caller's (NaN-poisoned)
    assert len(calls) == n_chunks
    for output, prefix_output, prefix_lse, output_lse in calls:
        assert output is out and prefix_output is out
        assert output_lse.data_ptr() != prefix_lse.data_ptr()
    assert calls[-1][3] is c.lse
    c.check(out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("as_generator", [False, True], ids=["list", "generator"])
def test_chunked_context_buffers_come_from_the_workspace(monkeypatch, dtype, as_generator):
    """With ``workspace=`` every buffer of the call is a view of it (no torch.empty) and the
    result is bitwise the one without; the part past ``plan.workspace_numel`` is never written."""
    import rocm_mla.ops.prefill_context as prefill_mod

    c = context([4, 6, 1], [[3, 2, 0], [0, 5, 2], [7, 1, 1]], 3, dtype)
    want, want_lse = (t.clone() for t in c.run(backend="reference"))
    plan = c.plan(backend="reference")
    ws = torch.randn(plan.workspace_numel + 64, device=DEVICE)
    tail = ws[plan.workspace_numel :].clone()
    empties = []
    real_empty = torch.empty
    monkeypatch.setattr(prefill_mod.torch, "empty", lambda *a, **k: empties.append(a) or real_empty(*a, **k))
    chunks = (ch for ch in c.chunks) if as_generator else c.chunks
    c.out.fill_(float("nan"))
    out, lse = c.run(chunks, plan=plan, workspace=ws)
    assert not empties
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert torch.equal(ws[plan.workspace_numel :], tail)


def test_chunked_context_rejects_a_bad_workspace():
    c = context([3, 2], [[4, 1]], 2, torch.float32)
    plan = c.plan()
    short = torch.empty(plan.workspace_numel - 1, device=DEVICE)
    with pytest.raises(ValueError, match=rf"workspace.*>= {plan.workspace_numel} elements.*{plan.workspace_numel - 1}"):
        c.run(plan=plan, workspace=short)
    with pytest.raises(TypeError, match=r"workspace.*float32.*float16"):
        c.run(plan=plan, workspace=torch.empty(plan.workspace_numel, dtype=torch.float16, device=DEVICE))
    ws = torch.empty(plan.workspace_numel + c.chunks[0].v.numel(), device=DEVICE)
    aliased = c.chunks[0]._replace(v=ws[-c.chunks[0].v.numel() :].view_as(c.chunks[0].v))
    with pytest.raises(ValueError, match=r"context_chunks\[0\].*workspace.*no memory in common with v"):
        c.run([aliased], plan=plan, workspace=ws)


def test_chunked_context_rejects_bad_chunk():
    c = context([3, 2], [[4, 1]], 2, torch.float32)
    bad = c.chunks[0]._replace(cu_seqlens_k=torch.tensor([0, 5], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match=r"context_chunks\[1\].*cu_seqlens_k.*\(3,\).*\(2,\)"):
        c.run([c.chunks[0], bad], out=None, lse=None)
    with pytest.raises(TypeError, match=r"context_chunks\[0\].*tuple.*int"):
        c.run([3], out=None, lse=None)


@pytest.mark.gpu
def test_gpu_chunked_context_bf16():
    for shape in prefill.CONTEXT_SHAPES["gpu"]:
        c = prefill.make_context_inputs(shape, dtype=torch.bfloat16, device=DEVICE)
        out, lse = c.run(out=None, lse=None)
        c.check(out, lse)
