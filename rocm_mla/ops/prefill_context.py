"""mla_prefill_with_context: prefill with cached context, vLLM's chunked-context MLA path, in place.

The new tokens attend to themselves causally and to every key of each context chunk (non-causal),
each pass one :func:`rocm_mla.mla_prefill` launch with its own plan: the call's
:class:`~rocm_mla.ops.prefill_plan.PrefillContextPlan` (``plan_prefill_with_context``, made once
per step from the new tokens' sizes and every knob) holds the new tokens' causal ``PrefillPlan``
and plans each chunk's non-causal pass from the chunk's sizes with the same knobs;
:func:`rocm_mla.merge_attn_states` folds the partial results into ``out`` and ``lse``. The plan
is checked against the call, and every argument and chunk is validated (the checks of
rocm_mla/ops/prefill.py) and planned, before any backend runs or anything is written to ``out``
or ``lse``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

from ._checks import Checker
from .merge import merge_attn_states
from .prefill import _check_call, _check_tensors, _explain_mismatch, _run
from .prefill_plan import _TENSOR_DIM_NAMES, CONTEXT_OP, PrefillContextPlan, PrefillPlan, _plan_context


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
            head dims. A chunk's tensors may not overlap ``out`` or ``lse``.
        plan: from :func:`plan_prefill_with_context` (the new tokens' causal pass with every knob:
            max_seqlen_q / max_seqlen_k, config, batch_invariant, backend, debug; each chunk's pass
            is planned from it with the chunk's sizes): make it once per step and pass it to every
            layer. The new-token tensors must be the ones it was made for (B, N, Tq, Tk, head dims,
            dtype, device: ValueError naming the first field that differs). None: planned here
            from the tensors with every default (``plan_prefill_with_context_for``).

    Returns:
        ``(out, lse)``: attention over context + new tokens, lse the natural-log LSE over both. A
        NaN in the keys a row sees, new or cached, reaches that row's out and lse (each partial
        pass writes NaN, not 0 / -inf, and merge_attn_states propagates a NaN lse). With a
        batch-invariant plan a sequence's out and lse depend on its own keys and on how its own
        context is cut into chunks, never on the other sequences or their chunking.

    Raises:
        TypeError / ValueError naming the argument (``context_chunks[i]`` for a chunk's), what was
        expected and what came.
    """
    c = Checker(CONTEXT_OP)
    tensors = (q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k)
    if plan is None:
        plan = plan_prefill_with_context_for(*tensors)
    elif not isinstance(plan, PrefillContextPlan):
        c.fail("plan", "a plan from plan_prefill_with_context (PrefillContextPlan)", type(plan).__name__, TypeError)
    if not plan.matches(*tensors):
        _explain_mismatch(c, plan.new_tokens, *tensors)
    sm_scale = _check_call(c, plan.new_tokens, *tensors, sm_scale, out, lse)

    def checked(i: int, chunk) -> tuple[ContextChunk, PrefillPlan]:
        return _check_chunk(i, chunk, plan, q, cu_seqlens_q, sm_scale, out, lse)

    head = (plan, *tensors)
    tail = (sm_scale, out, lse)
    if hasattr(context_chunks, "__len__"):
        chunks = [checked(i, ch) for i, ch in enumerate(context_chunks)]  # type: ignore[arg-type]
        return _with_context_sized(*head, chunks, *tail)
    return _with_context_lazy(*head, iter(context_chunks), checked, *tail)


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
    return _plan_context(c, _TENSOR_DIM_NAMES, **sizes, **knobs)


def _with_context_sized(ctx_plan, q, k_nope, k_pe, v, cu_q, cu_k, chunks, sm_scale, out, lse):
    """Validated, planned chunks: causal pass into out, each chunk merged into out in place."""
    plan, backend = ctx_plan.new_tokens, ctx_plan.merge_backend
    Tq, N, V = q.shape[0], q.shape[1], plan.head_dims[2]
    if out is None:
        out = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(N, Tq, dtype=torch.float32, device=q.device)
    new_lse = lambda: torch.empty(N, Tq, dtype=torch.float32, device=q.device)  # noqa: E731
    # The last merge must land in lse: start on the other buffer when the chunk count is odd.
    cur = len(chunks) % 2
    lse_bufs: list[torch.Tensor | None] = [lse, new_lse() if cur else None]
    _run(plan, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, out, lse_bufs[cur])
    chunk_out = chunk_lse = None
    for ck, ck_plan in chunks:
        if chunk_out is None:
            chunk_out = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
            chunk_lse = new_lse()
        _run_chunk(ck, ck_plan, q, cu_q, sm_scale, chunk_out, chunk_lse)
        nxt = 1 - cur
        if lse_bufs[nxt] is None:
            lse_bufs[nxt] = new_lse()
        merge_attn_states(out, out, lse_bufs[cur], chunk_out, chunk_lse, lse_bufs[nxt], backend=backend)
        cur = nxt
    return out, lse


def _with_context_lazy(ctx_plan, q, k_nope, k_pe, v, cu_q, cu_k, it, checked, sm_scale, out, lse):
    """Chunks drawn (and validated, planned) one at a time; out/lse are written by the last step only."""
    plan, backend = ctx_plan.new_tokens, ctx_plan.merge_backend
    Tq, N, V = q.shape[0], q.shape[1], plan.head_dims[2]
    first = next(it, None)
    ck = checked(0, first) if first is not None else None
    if out is None:
        out = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(N, Tq, dtype=torch.float32, device=q.device)
    if ck is None:  # no context: the causal pass is the result
        _run(plan, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, out, lse)
        return out, lse
    new_lse = lambda: torch.empty(N, Tq, dtype=torch.float32, device=q.device)  # noqa: E731
    acc = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
    acc_lse = [new_lse(), None]  # ping-pong: merge must not write the lse it reads
    cur = 0
    _run(plan, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, acc, acc_lse[cur])
    chunk_out = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
    chunk_lse = new_lse()
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
            acc_lse[nxt] = new_lse()
        merge_attn_states(acc, acc, acc_lse[cur], chunk_out, chunk_lse, acc_lse[nxt], backend=backend)
        cur = nxt
    # The last chunk is validated: the only writes to out and lse.
    merge_attn_states(out, acc, acc_lse[cur], chunk_out, chunk_lse, lse, backend=backend)
    return out, lse


def _check_chunk(
    i: int, chunk, plan: PrefillContextPlan, q, cu_q, sm_scale, out, lse
) -> tuple[ContextChunk, PrefillPlan]:
    """A chunk, checked (its tensors, its head dims the new tokens', no memory in common with out
    or lse), and the plan of its non-causal pass (``plan.chunk_plan``)."""
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
    # The chunk's K/V are read after out/lse have been written (sized path): no overlap.
    cc.no_overlap(
        {"out": out, "lse": lse}, {"k_nope": ck.k_nope, "k_pe": ck.k_pe, "v": ck.v, "cu_seqlens_k": ck.cu_seqlens_k}
    )
    return ck, ck_plan


def _run_chunk(ck: ContextChunk, plan: PrefillPlan, q, cu_q, sm_scale, out, lse):
    """The new tokens' queries against every key of one context chunk (non-causal)."""
    _run(plan, q, ck.k_nope, ck.k_pe, ck.v, cu_q, ck.cu_seqlens_k, sm_scale, out, lse)
