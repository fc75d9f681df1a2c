"""mla_prefill_with_context: prefill with cached context, vLLM's chunked-context MLA path, in place.

The new tokens attend to themselves causally and to every key of each context chunk (non-causal),
each pass one :func:`rocm_mla.mla_prefill` launch with its own plan (``plan_prefill``: the new
tokens' causal pass, then each chunk's non-causal one, every plan made from its pass's sizes with
the call's knobs); :func:`rocm_mla.merge_attn_states` folds the partial results into ``out`` and
``lse``. Every argument and chunk is validated (the checks of rocm_mla/ops/prefill.py) and planned
before anything is written to ``out`` or ``lse``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch

from ._checks import Checker
from .merge import merge_attn_states
from .prefill import _check_call, _check_tensors, _run
from .prefill_plan import _TENSOR_DIM_NAMES, PrefillPlan, _plan


class ContextChunk(NamedTuple):
    """Keys/values of one chunk of cached context, for :func:`mla_prefill_with_context`.

    k_nope ``[Tc, N, P]``, k_pe ``[Tc, 1, R]`` (or ``[Tc, N, R]``; None when R = 0), v ``[Tc, N, V]`` (any strides, e.g.
    views of the chunk's up-projected ``[Tc, N, P + V]`` buffer); cu_seqlens_k ``[B + 1]`` int32:
    sequence b's keys of this chunk are rows ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` (may be empty).
    """

    k_nope: torch.Tensor
    k_pe: torch.Tensor
    v: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_k: int | None = None


def mla_prefill_with_context(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    context_chunks: Iterable[ContextChunk | tuple] = (),
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    backend: str | None = None,
    config: dict | None = None,
    debug: bool | None = None,
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill with cached context, as vLLM's chunked-context MLA path computes it, in place.

    The new tokens attend to themselves causally (``k_nope, k_pe, v, cu_seqlens_k``: the new
    tokens' keys, usually ``cu_seqlens_k == cu_seqlens_q``) and to every key of each context
    chunk (non-causal); the partial results are folded with :func:`rocm_mla.merge_attn_states`.
    The result equals one causal :func:`mla_prefill` over each sequence's [context, new] keys.

    Validation comes first: every argument, and every chunk, is checked before anything is
    written to ``out`` or ``lse`` -- a bad chunk raises with both untouched.

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
            :func:`mla_prefill`.
        max_seqlen_q, max_seqlen_k, backend, config, debug: as :func:`plan_prefill` takes them,
            for the new tokens' causal pass; each chunk's pass is planned with the same knobs
            (``causal=False``, its own ``max_seqlen_k``).
        context_chunks: iterable of :class:`ContextChunk` or tuples ``(k_nope, k_pe, v,
            cu_seqlens_k[, max_seqlen_k])``, each with its own number of rows and the same B. A
            chunk's tensors may not overlap ``out`` or ``lse``. ``backend`` is passed on to
            merge_attn_states as well.
        batch_invariant: as :func:`plan_prefill` takes it (always so): a sequence's out and lse depend
            on its own keys and on how its own context is cut into chunks (the row's merges run
            in chunk order; a chunk where it has no key merges an empty side, which changes no
            bit), never on the other sequences or their chunking.

    Returns:
        ``(out, lse)``: attention over context + new tokens, lse the natural-log LSE over both. A
        NaN in the keys a row sees, new or cached, reaches that row's out and lse (each partial
        pass writes NaN, not 0 / -inf, and merge_attn_states propagates a NaN lse).
    """
    c = Checker("mla_prefill_with_context")
    sizes = _check_tensors(c, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k)
    knobs = dict(config=config, batch_invariant=batch_invariant, backend=backend, debug=debug)
    plan = _plan(
        c, _TENSOR_DIM_NAMES, **sizes, causal=True, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **knobs
    )
    sm_scale = _check_call(c, plan, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, sm_scale, out, lse)

    def checked(i: int, chunk) -> tuple[ContextChunk, PrefillPlan]:
        return _check_chunk(i, chunk, q, cu_seqlens_q, sm_scale, max_seqlen_q, sizes["head_dims"], out, lse, knobs)

    head = (plan, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k)
    tail = (sm_scale, out, lse, backend)
    if hasattr(context_chunks, "__len__"):
        chunks = [checked(i, ch) for i, ch in enumerate(context_chunks)]  # type: ignore[arg-type]
        return _with_context_sized(*head, chunks, *tail)
    return _with_context_lazy(*head, iter(context_chunks), checked, *tail)


def _with_context_sized(plan, q, k_nope, k_pe, v, cu_q, cu_k, chunks, sm_scale, out, lse, backend):
    """Validated, planned chunks: causal pass into out, each chunk merged into out in place."""
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


def _with_context_lazy(plan, q, k_nope, k_pe, v, cu_q, cu_k, it, checked, sm_scale, out, lse, backend):
    """Chunks drawn (and validated, planned) one at a time; out/lse are written by the last step only."""
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
    i: int, chunk, q, cu_q, sm_scale, max_seqlen_q, dims, out, lse, knobs
) -> tuple[ContextChunk, PrefillPlan]:
    """A chunk, checked (its tensors, its head dims the new tokens', no memory in common with out
    or lse), and the plan of its non-causal pass."""
    cc = Checker(f"mla_prefill_with_context: context_chunks[{i}]")
    if not isinstance(chunk, (tuple, list)) or len(chunk) not in (4, 5):
        got = type(chunk).__name__ + (f" of length {len(chunk)}" if isinstance(chunk, (tuple, list)) else "")
        cc.fail("chunk", "a ContextChunk or a tuple (k_nope, k_pe, v, cu_seqlens_k[, max_seqlen_k])", got, TypeError)
    ck = ContextChunk(*chunk)
    sizes = _check_tensors(cc, q, ck.k_nope, ck.k_pe, ck.v, cu_q, ck.cu_seqlens_k)
    if sizes["head_dims"] != dims:
        cc.fail("k_nope/k_pe/v", f"head dims (P, R, V) = {dims} like the new tokens'", sizes["head_dims"])
    plan = _plan(
        cc,
        _TENSOR_DIM_NAMES,
        **sizes,
        causal=False,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=ck.max_seqlen_k,
        **knobs,
    )
    _check_call(cc, plan, q, ck.k_nope, ck.k_pe, ck.v, cu_q, ck.cu_seqlens_k, sm_scale, None, None)
    # The chunk's K/V are read after out/lse have been written (sized path): no overlap.
    cc.no_overlap(
        {"out": out, "lse": lse}, {"k_nope": ck.k_nope, "k_pe": ck.k_pe, "v": ck.v, "cu_seqlens_k": ck.cu_seqlens_k}
    )
    return ck, plan


def _run_chunk(ck: ContextChunk, plan: PrefillPlan, q, cu_q, sm_scale, out, lse):
    """The new tokens' queries against every key of one context chunk (non-causal)."""
    _run(plan, q, ck.k_nope, ck.k_pe, ck.v, cu_q, ck.cu_seqlens_k, sm_scale, out, lse)
