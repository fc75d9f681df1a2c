"""mla_prefill_with_context: prefill with cached context, vLLM's chunked-context MLA path, in place.

The new tokens attend to themselves causally and to every key of each context chunk (non-causal),
each pass one :func:`rocm_mla.mla_prefill` launch with its own plan: the call's
:class:`~rocm_mla.ops.prefill_plan.PrefillContextPlan` (``plan_prefill_with_context``, made once
per step from the new tokens' sizes and every knob) holds the new tokens' causal ``PrefillPlan``
and plans each chunk's non-causal pass from the chunk's sizes with the same knobs;
:func:`rocm_mla.merge_attn_states` folds the partial results into ``out`` and ``lse``. The checks
are rocm_mla/ops/prefill.py's; the op's docstring says when they run and where each buffer lives.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

from ._checks import Checker
from .merge import merge_attn_states
from .prefill import _check_call, _check_tensors, _checked_call, _destinations, _run
from .prefill_plan import CONTEXT_OP, PrefillContextPlan, PrefillPlan, _plan_tensors, _words, plan_prefill_with_context


class ContextChunk(NamedTuple):
    """Keys/values of one chunk of cached context, for :func:`mla_prefill_with_context`.

    k_nope ``[Tc, N, P]``, k_pe ``[Tc, 1, R]`` (or ``[Tc, N, R]``; None when R = 0), v ``[Tc, N, V]`` (any strides, e.g.
    views of the chunk's up-projected ``[Tc, N, P + V]`` buffer); cu_seqlens_k ``[B + 1]`` int32:
    sequence b's keys of this chunk are rows ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` (may be empty).
    max_seqlen_k: None or an int >= 0, the chunk's longest sequence (vLLM's chunk ``max_seq_len``):
    the hint its pass is planned with (``PrefillContextPlan.chunk_plan``; the program order only,
    never a result).
    """

    k_nope: torch.Tensor
    k_pe: torch.Tensor
    v: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_k: int | None = None


def mla_prefill_with_context(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor | None,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    context_chunks: Iterable[ContextChunk | tuple] = (),
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    plan: PrefillContextPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill with cached context, as vLLM's chunked-context MLA path computes it, in place.

    The new tokens attend to themselves causally (``k_nope, k_pe, v, cu_seqlens_k``: the new
    tokens' keys, usually ``cu_seqlens_k == cu_seqlens_q``) and to every key of each context
    chunk (non-causal); the partial results are folded with :func:`rocm_mla.merge_attn_states`.
    The result equals one causal :func:`mla_prefill` over each sequence's [context, new] keys.

    Validation comes first: the plan is checked against the call, and every argument and every
    chunk is checked and planned, before any backend runs and before anything is written to
    ``out`` or ``lse`` -- a bad chunk raises with both untouched.

    Data path, a sized ``context_chunks`` (list, tuple): all chunks are validated up front, the
    causal pass writes straight into ``out``; each chunk's attention goes to one chunk buffer
    ``[Tq, N, V]`` (+ its ``[N, Tq]`` lse), allocated once and reused, and is merged into ``out``
    in place (``merge_attn_states(out, out, ...)``). The running lse ping-pongs between ``lse``
    and one ``[N, Tq]`` float32 buffer (merge must not write the lse it reads); the start side is
    picked from ``len(context_chunks)`` so that the last merge lands in ``lse``.

    An unsized iterable (a generator) is drawn lazily -- each chunk just before use, so one
    chunk's K/V is alive at a time (gather from the cache and up-project inside the generator) --
    and each chunk is validated as it is drawn. To still write nothing before the last chunk has
    been validated, the running result lives in one more ``[Tq, N, V]`` buffer and the merge of
    the last chunk writes ``out`` and ``lse`` (same kernels, same bytes moved; a generator that
    yields no chunk costs nothing extra).

    Args:
        q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, sm_scale, out, lse: as in
            :func:`mla_prefill` (the new tokens: q ``[Tq, N, P + R]``, k_nope ``[Tk, N, P]``, k_pe
            ``[Tk, 1 or N, R]`` or None, v ``[Tk, N, V]``, cu_seqlens ``[B + 1]`` int32, out
            ``[Tq, N, V]``, lse ``[N, Tq]`` float32).
        context_chunks: iterable of :class:`ContextChunk` or tuples ``(k_nope, k_pe, v,
            cu_seqlens_k[, max_seqlen_k])``, each with its own number of rows and the same B and
            head dims. A chunk's tensors may not overlap ``out``, ``lse`` or ``workspace``.
        workspace: optional contiguous float32 tensor of at least ``plan.workspace_numel``
            elements on q's device: the chunk and running buffers above are carved from it
            (no allocation per call). None: each is one ``torch.empty``. A destination (no
            memory in common with another argument).
        plan: from :func:`plan_prefill_with_context` (its docstring says what it holds): make it
            once per step and pass it to every layer. The new-token tensors must be the ones it
            was made for (as :func:`mla_prefill`'s plan: ValueError naming the first field that
            differs). None: planned here from the tensors with every default
            (``plan_prefill_with_context_for``).

    Returns:
        ``(out, lse)``: attention over context + new tokens, lse the natural-log LSE over both. A
        NaN in the keys a row sees, new or cached, reaches that row's out and lse (each partial
        pass writes NaN, not 0 / -inf, and merge_attn_states propagates a NaN lse). Batch
        invariance: :func:`plan_prefill_with_context`'s ``batch_invariant``.

    Raises:
        TypeError / ValueError naming the argument (``context_chunks[i]`` for a chunk's), what was
        expected and what came.
    """
    c = Checker(CONTEXT_OP)
    tensors = (q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k)
    plan_for = plan_prefill_with_context_for
    plan, sm_scale = _checked_call(c, plan, PrefillContextPlan, plan_for, tensors, sm_scale, out, lse)
    if workspace is not None:
        _check_workspace(c, workspace, plan.workspace_numel, q, out, lse, tensors)

    def checked(i: int, chunk) -> tuple[ContextChunk, PrefillPlan]:
        return _check_chunk(i, chunk, plan, q, cu_seqlens_q, sm_scale, out, lse, workspace)

    tail = (sm_scale, out, lse, _Scratch(workspace, q, plan.new_tokens.head_dims[2]))
    if hasattr(context_chunks, "__len__"):
        chunks = [checked(i, ch) for i, ch in enumerate(context_chunks)]  # type: ignore[arg-type]
        return _with_context_sized(plan, *tensors, chunks, *tail)
    return _with_context_lazy(plan, *tensors, iter(context_chunks), checked, *tail)


def plan_prefill_with_context_for(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor | None,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    **knobs: Any,
) -> PrefillContextPlan:
    """``plan_prefill_with_context`` with the new tokens' sizes (B, N, Tq, Tk, head dims), dtype
    and device read from a call's tensors (``mla_prefill_with_context``'s first six positional
    arguments, checked as it checks them; their values are not read); ``knobs``: the rest of
    ``plan_prefill_with_context``'s keywords (max_seqlen_q, max_seqlen_k, config,
    batch_invariant, backend, debug)."""
    c = Checker(CONTEXT_OP)
    sizes = _check_tensors(c, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k)
    return _plan_tensors(c, plan_prefill_with_context, sizes, knobs)


def _with_context_sized(ctx_plan, q, k_nope, k_pe, v, cu_q, cu_k, chunks, sm_scale, out, lse, scratch):
    """Validated, planned chunks: causal pass into out, each chunk merged into out in place."""
    plan, backend = ctx_plan.new_tokens, ctx_plan.merge_backend
    out, lse = _destinations(plan, q, out, lse)
    # The last merge must land in lse: start on the other buffer when the chunk count is odd.
    cur = len(chunks) % 2
    lse_bufs: list[torch.Tensor | None] = [lse, scratch.new_lse() if cur else None]
    _run(plan, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, out, lse_bufs[cur])
    chunk_out = chunk_lse = None
    for ck, ck_plan in chunks:
        if chunk_out is None:
            chunk_out, chunk_lse = scratch.new_out(), scratch.new_lse()
        _run_chunk(ck, ck_plan, q, cu_q, sm_scale, chunk_out, chunk_lse)
        nxt = 1 - cur
        if lse_bufs[nxt] is None:
            lse_bufs[nxt] = scratch.new_lse()
        merge_attn_states(out, out, lse_bufs[cur], chunk_out, chunk_lse, lse_bufs[nxt], backend=backend)
        cur = nxt
    return out, lse


def _with_context_lazy(ctx_plan, q, k_nope, k_pe, v, cu_q, cu_k, it, checked, sm_scale, out, lse, scratch):
    """Chunks drawn (and validated, planned) one at a time; out/lse are written by the last step only."""
    plan, backend = ctx_plan.new_tokens, ctx_plan.merge_backend
    first = next(it, None)
    ck = checked(0, first) if first is not None else None
    out, lse = _destinations(plan, q, out, lse)
    if ck is None:  # no context: the causal pass is the result
        _run(plan, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, out, lse)
        return out, lse
    acc = scratch.new_out()
    acc_lse = [scratch.new_lse(), None]  # ping-pong: merge must not write the lse it reads
    cur = 0
    _run(plan, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, acc, acc_lse[cur])
    chunk_out, chunk_lse = scratch.new_out(), scratch.new_lse()
    i = 0
    while ck is not None:
        _run_chunk(*ck, q, cu_q, sm_scale, chunk_out, chunk_lse)
        ck = first = None  # drop this chunk's K/V before the generator makes the next one
        i += 1
        nxt_chunk = next(it, None)
        if nxt_chunk is None:
            break
        ck = checked(i, nxt_chunk)  # validated before the pending result is folded
        del nxt_chunk
        nxt = 1 - cur
        if acc_lse[nxt] is None:
            acc_lse[nxt] = scratch.new_lse()
        merge_attn_states(acc, acc, acc_lse[cur], chunk_out, chunk_lse, acc_lse[nxt], backend=backend)
        cur = nxt
    # The last chunk is validated: the only writes to out and lse.
    merge_attn_states(out, acc, acc_lse[cur], chunk_out, chunk_lse, lse, backend=backend)
    return out, lse


def _check_chunk(
    i: int, chunk, plan: PrefillContextPlan, q, cu_q, sm_scale, out, lse, workspace
) -> tuple[ContextChunk, PrefillPlan]:
    """A chunk, checked (its tensors, its head dims the new tokens', no memory in common with out,
    lse or the workspace), and the plan of its non-causal pass (``plan.chunk_plan``)."""
    cc = Checker(f"{CONTEXT_OP}: context_chunks[{i}]")
    if not isinstance(chunk, (tuple, list)) or len(chunk) not in (4, 5):
        got = type(chunk).__name__ + (f" of length {len(chunk)}" if isinstance(chunk, (tuple, list)) else "")
        cc.fail("chunk", "a ContextChunk or a tuple (k_nope, k_pe, v, cu_seqlens_k[, max_seqlen_k])", got, TypeError)
    ck = ContextChunk(*chunk)
    sizes = _check_tensors(cc, q, ck.k_nope, ck.k_pe, ck.v, cu_q, ck.cu_seqlens_k)
    dims = plan.new_tokens.head_dims
    if sizes["head_dims"] != dims:
        cc.fail("k_nope/k_pe/v", f"head dims (P, R, V) = {dims} like the new tokens'", sizes["head_dims"])
    ck_plan = plan.chunk_plan(cc, sizes["k_rows"], ck.max_seqlen_k)
    _check_call(cc, ck_plan, q, ck.k_nope, ck.k_pe, ck.v, cu_q, ck.cu_seqlens_k, sm_scale, None, None)
    # The chunk's K/V are read after out/lse/the workspace have been written: no overlap.
    cc.no_overlap(
        {"out": out, "lse": lse, "workspace": workspace},
        {"k_nope": ck.k_nope, "k_pe": ck.k_pe, "v": ck.v, "cu_seqlens_k": ck.cu_seqlens_k},
    )
    return ck, ck_plan


def _run_chunk(ck: ContextChunk, plan: PrefillPlan, q, cu_q, sm_scale, out, lse):
    """The new tokens' queries against every key of one context chunk (non-causal)."""
    _run(plan, q, ck.k_nope, ck.k_pe, ck.v, cu_q, ck.cu_seqlens_k, sm_scale, out, lse)


def _check_workspace(c: Checker, workspace, numel: int, q, out, lse, tensors) -> None:
    """A caller's workspace: a contiguous float32 tensor of >= ``numel`` elements on q's device,
    sharing no memory with the call's other tensors."""
    c.workspace(workspace, numel, "plan.workspace_numel")
    c.same_device(q=q, workspace=workspace)
    names = ("q", "k_nope", "k_pe", "v", "cu_seqlens_q", "cu_seqlens_k")
    # out and lse were checked against the inputs with the call (_check_call).
    c.no_overlap({"workspace": workspace}, {**dict(zip(names, tensors)), "out": out, "lse": lse})


class _Scratch:
    """The call's buffers: ``[Tq, N, V]`` in q's dtype and ``[N, Tq]`` float32, carved in turn
    from the caller's workspace (``PrefillContextPlan.workspace_numel``'s layout, each piece
    256-byte aligned) or, without one, a ``torch.empty`` each."""

    def __init__(self, workspace: torch.Tensor | None, q: torch.Tensor, v_dim: int):
        self.ws = None if workspace is None else workspace.reshape(-1)
        self.q, self.out_shape, self.lse_shape = q, (q.shape[0], q.shape[1], v_dim), (q.shape[1], q.shape[0])
        self.at = 0

    def _take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.ws is None:
            return torch.empty(shape, dtype=dtype, device=self.q.device)
        numel = math.prod(shape)
        words = _words(numel, dtype)
        piece = self.ws[self.at : self.at + words]
        self.at += words
        return piece.view(dtype)[:numel].view(shape)

    def new_out(self) -> torch.Tensor:
        """A ``[Tq, N, V]`` buffer in q's dtype."""
        return self._take(self.out_shape, self.q.dtype)

    def new_lse(self) -> torch.Tensor:
        """A ``[N, Tq]`` float32 buffer."""
        return self._take(self.lse_shape, torch.float32)
