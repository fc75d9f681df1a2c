"""mla_prefill: varlen MLA prefill attention (Dqk = 128 + 64, Dv = 128) reading k_nope, k_pe and v
in place, writing out and lse in place; and mla_prefill_with_context, the chunked-context path.

Kernel: rocm_mla/kernels/mla_prefill.py (Triton; there is no HIP kernel for this op).
Reference: rocm_mla/reference/prefill.py.

Host syncs: none. The grid is sized from Tq and B (tensor shapes), not from cu_seqlens' values,
so the GPU path never reads cu_seqlens on the host; max_seqlen_q / max_seqlen_k are accepted for
FlashAttention-style call sites and not needed (max_seqlen_k only orders the programs). The
reference backend reads cu_seqlens on the host (and so always validates them); ``debug=True`` /
``ROCM_MLA_DEBUG=1`` validates them on a GPU too.

Bad cu_seqlens on a GPU (not validated without debug): the kernel clamps every sequence's bounds
to ``[0, Tq]`` / ``[0, Tk]``, so it never reads or writes outside q, k_nope, k_pe, v, out, lse;
the result of such a call is unspecified (garbage in, garbage out), never a foreign access.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import NamedTuple

import torch
import triton

from .. import _platform
from ..configs import config_for, nvidia_sm, prefill_tma_mode
from ..kernels.mla_prefill import mla_prefill_kernel
from ..reference.prefill import mla_prefill_ref
from ..triton_common import LOG2E, amd_options
from ._checks import FLOAT_DTYPES, Checker, debug_enabled
from ._dispatch import select
from .merge import merge_attn_states

OP = "mla_prefill"
# cu_seqlens_q entries a program reads per vector step when it looks up its sequence (B <= this:
# one step). 256 int32 is one element per lane at 4 waves of 64 or 8 warps of 32.
SEQ_CHUNK = 256


class ContextChunk(NamedTuple):
    """Keys/values of one chunk of cached context, for :func:`mla_prefill_with_context`.

    k_nope ``[Tc, N, P]``, k_pe ``[Tc, 1, R]`` (or ``[Tc, N, R]``), v ``[Tc, N, V]`` (any strides, e.g.
    views of the chunk's up-projected ``[Tc, N, P + V]`` buffer); cu_seqlens_k ``[B + 1]`` int32:
    sequence b's keys of this chunk are rows ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` (may be empty).
    """

    k_nope: torch.Tensor
    k_pe: torch.Tensor
    v: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_k: int | None = None


def mla_prefill(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    sm_scale: float,
    causal: bool = True,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    backend: str | None = None,
    config: dict | None = None,
    debug: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen MLA prefill attention, no concat, no padding, output and LSE in place.

    Args:
        q: ``[Tq, N, P + R]`` (MLA: 192 = 128 nope then 64 rope), float16/bfloat16/float32, any strides.
        k_nope: ``[Tk, N, P]``, q's dtype, any strides (e.g. ``kv[..., :128]`` of the
            ``[Tk, N, 256]`` kv_b_proj output).
        k_pe: ``[Tk, 1, R]``: one rope head broadcast over the N heads (e.g. a slice of the
            ``[Tk, 576]`` latent buffer, unsqueezed); ``[Tk, N, R]`` is also taken (e.g.
            ``k_pe.expand(Tk, N, R)``, head stride 0, or a real per-head tensor). q's dtype, any strides.
        v: ``[Tk, N, V]`` (MLA: 128), q's dtype, any strides (e.g. ``kv[..., 128:]``).
        cu_seqlens_q, cu_seqlens_k: ``[B + 1]`` int32 prefix sums: sequence b owns q rows
            ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and k/v rows ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``.
            Lengths may differ between q and k and may be 0. They must start at 0-or-more, not
            decrease, and end at most at Tq / Tk; q rows outside every sequence are not written
            (by any backend). Checked for CPU tensors, by the reference backend, and with
            ``debug``; on a GPU otherwise (a check would cost a host sync) bad values cannot make
            the kernel touch memory outside the tensors (see the module docstring).
        sm_scale: softmax scale (> 0), e.g. ``1 / sqrt(192)`` times the yarn mscale correction.
        causal: bottom-right aligned causal mask: query i of a sequence with lq queries and lk keys
            sees keys ``j <= i + lk - lq`` (FlashAttention's convention). False: every key.
        out: optional ``[Tq, N, V]`` destination, q's dtype, any strides (e.g. the layer's
            ``[T, N * 128]`` output viewed as ``[T, N, 128]``). Allocated when None. It may not
            overlap lse or any input (q, k_nope, k_pe, v, cu_seqlens_*): ValueError naming both.
        lse: optional ``[N, Tq]`` float32 destination of the natural-log LSE, any strides (e.g. the
            transpose of a ``[Tq, N]`` buffer). Allocated when None. Same no-overlap rule.
        max_seqlen_q, max_seqlen_k: accepted for FlashAttention-style call sites; not needed for
            correctness. max_seqlen_k, when given, is a hint for the order of the programs on the GPU
            (the config's head_group_kv_bytes); a wrong value costs speed, never a result.
        backend: ``"triton"`` or ``"reference"`` to force one (see ``rocm_mla.ops._dispatch``);
            there is no HIP kernel for this op, so ``"hip"`` raises.
        config: override of the Triton launch data, one object with the keys of an arch's
            ``triton`` entry in ``configs/mla_prefill.json`` (its ``_doc`` says what each does:
            tiles, warps, stages, tma, head_group, the gfx9 options); for tuning and tests.
        debug: validate cu_seqlens on a GPU too (a host sync: not capturable), naming the
            argument, the index and the bound. Default: ``ROCM_MLA_DEBUG=1`` in the environment.

    Returns:
        ``(out, lse)``: the destinations (the caller's own tensors when passed). Every element of
        the rows of every sequence is written; a query that sees no key gets 0 and lse -inf, and
        lse -inf means only that: a NaN in q, or in the k_nope/k_pe of a key the query sees, gives
        NaN out and NaN lse (a NaN in v, NaN out), so a merge downstream cannot mistake a poisoned
        partial result for an empty one.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    impl = select(OP, q.device, backend, has_hip=False)
    dims = _check(
        c,
        q,
        k_nope,
        k_pe,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        sm_scale,
        causal,
        out,
        lse,
        max_seqlen_q,
        max_seqlen_k,
        host_offsets=_host_offsets(impl, debug),
    )
    if impl == "triton":
        _check_triton_dims(c, dims)
    if out is None:
        out = torch.empty(q.shape[0], q.shape[1], dims[2], dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    tensors = (q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k)
    _run(impl, *tensors, float(sm_scale), bool(causal), out, lse, config, max_seqlen_k)
    return out, lse


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
        q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, sm_scale, out, lse, max_seqlen_q,
            max_seqlen_k, backend, config, debug: as in :func:`mla_prefill` (``causal`` is always
            True for the new tokens).
        context_chunks: iterable of :class:`ContextChunk` or tuples ``(k_nope, k_pe, v,
            cu_seqlens_k[, max_seqlen_k])``, each with its own number of rows and the same B. A
            chunk's tensors may not overlap ``out`` or ``lse``. ``backend`` is passed on to
            merge_attn_states as well.

    Returns:
        ``(out, lse)``: attention over context + new tokens, lse the natural-log LSE over both. A
        NaN in the keys a row sees, new or cached, reaches that row's out and lse (each partial
        pass writes NaN, not 0 / -inf, and merge_attn_states propagates a NaN lse).
    """
    c = Checker("mla_prefill_with_context")
    impl = select(OP, q.device, backend, has_hip=False)
    host = _host_offsets(impl, debug)
    dims = _check(
        c,
        q,
        k_nope,
        k_pe,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        sm_scale,
        True,
        out,
        lse,
        max_seqlen_q,
        max_seqlen_k,
        host_offsets=host,
    )
    if impl == "triton":
        _check_triton_dims(c, dims)
    sm_scale = float(sm_scale)

    def checked(i: int, chunk) -> ContextChunk:
        return _check_chunk(i, chunk, q, cu_seqlens_q, sm_scale, max_seqlen_q, dims, out, lse, host)

    head = (impl, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k)
    tail = (sm_scale, out, lse, dims, backend, config, max_seqlen_k)
    if hasattr(context_chunks, "__len__"):
        chunks = [checked(i, ch) for i, ch in enumerate(context_chunks)]  # type: ignore[arg-type]
        return _with_context_sized(*head, chunks, *tail)
    return _with_context_lazy(*head, iter(context_chunks), checked, *tail)


def _with_context_sized(
    impl, q, k_nope, k_pe, v, cu_q, cu_k, chunks, sm_scale, out, lse, dims, backend, config, max_k=None
):
    """Validated chunks: causal pass into out, each chunk merged into out in place."""
    Tq, N, V = q.shape[0], q.shape[1], dims[2]
    if out is None:
        out = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(N, Tq, dtype=torch.float32, device=q.device)
    new_lse = lambda: torch.empty(N, Tq, dtype=torch.float32, device=q.device)  # noqa: E731
    # The last merge must land in lse: start on the other buffer when the chunk count is odd.
    cur = len(chunks) % 2
    lse_bufs: list[torch.Tensor | None] = [lse, new_lse() if cur else None]
    _run(impl, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, True, out, lse_bufs[cur], config, max_k)
    chunk_out = chunk_lse = None
    for ck in chunks:
        if chunk_out is None:
            chunk_out = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
            chunk_lse = new_lse()
        _run_chunk(impl, q, ck, cu_q, sm_scale, chunk_out, chunk_lse, config)
        nxt = 1 - cur
        if lse_bufs[nxt] is None:
            lse_bufs[nxt] = new_lse()
        merge_attn_states(out, out, lse_bufs[cur], chunk_out, chunk_lse, lse_bufs[nxt], backend=backend)
        cur = nxt
    return out, lse


def _with_context_lazy(
    impl, q, k_nope, k_pe, v, cu_q, cu_k, it, checked, sm_scale, out, lse, dims, backend, config, max_k=None
):
    """Chunks drawn (and validated) one at a time; out/lse are written by the last step only."""
    Tq, N, V = q.shape[0], q.shape[1], dims[2]
    first = next(it, None)
    ck = checked(0, first) if first is not None else None
    if out is None:
        out = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(N, Tq, dtype=torch.float32, device=q.device)
    if ck is None:  # no context: the causal pass is the result
        _run(impl, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, True, out, lse, config, max_k)
        return out, lse
    new_lse = lambda: torch.empty(N, Tq, dtype=torch.float32, device=q.device)  # noqa: E731
    acc = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
    acc_lse = [new_lse(), None]  # ping-pong: merge must not write the lse it reads
    cur = 0
    _run(impl, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, True, acc, acc_lse[cur], config, max_k)
    chunk_out = torch.empty(Tq, N, V, dtype=q.dtype, device=q.device)
    chunk_lse = new_lse()
    i = 0
    while ck is not None:
        _run_chunk(impl, q, ck, cu_q, sm_scale, chunk_out, chunk_lse, config)
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


def _check_chunk(i: int, chunk, q, cu_q, sm_scale, max_seqlen_q, dims, out, lse, host_offsets) -> ContextChunk:
    cc = Checker(f"mla_prefill_with_context: context_chunks[{i}]")
    if not isinstance(chunk, (tuple, list)) or len(chunk) not in (4, 5):
        got = type(chunk).__name__ + (f" of length {len(chunk)}" if isinstance(chunk, (tuple, list)) else "")
        cc.fail("chunk", "a ContextChunk or a tuple (k_nope, k_pe, v, cu_seqlens_k[, max_seqlen_k])", got, TypeError)
    ck = ContextChunk(*chunk)
    cdims = _check(
        cc,
        q,
        ck.k_nope,
        ck.k_pe,
        ck.v,
        cu_q,
        ck.cu_seqlens_k,
        sm_scale,
        False,
        None,
        None,
        max_seqlen_q,
        ck.max_seqlen_k,
        host_offsets=host_offsets,
    )
    if cdims != dims:
        cc.fail("k_nope/k_pe/v", f"head dims (P, R, V) = {dims} like the new tokens'", cdims)
    # The chunk's K/V are read after out/lse have been written (sized path): no overlap.
    cc.no_overlap(
        {"out": out, "lse": lse}, {"k_nope": ck.k_nope, "k_pe": ck.k_pe, "v": ck.v, "cu_seqlens_k": ck.cu_seqlens_k}
    )
    return ck


# --------------------------------------------------------------------------- validation


def _check(
    c: Checker,
    q,
    k_nope,
    k_pe,
    v,
    cu_q,
    cu_k,
    sm_scale,
    causal,
    out,
    lse,
    max_seqlen_q,
    max_seqlen_k,
    *,
    host_offsets: bool = False,
) -> tuple[int, int, int]:
    """Validate one call; returns the head dims (P, R, V). cu_seqlens' values are checked when
    they are on the CPU, or when ``host_offsets`` (reference backend, debug: a sync on a GPU)."""
    c.tensor("q", q, ndim=3, layout="[Tq, N, P + R]", dtypes=FLOAT_DTYPES)
    Tq, N, Dqk = q.shape
    c.tensor("k_nope", k_nope, ndim=3, layout="[Tk, N, P]")
    Tk, P = k_nope.shape[0], k_nope.shape[2]
    c.tensor("k_nope", k_nope, shape=(None, N, None), layout="[Tk, N, P]", like="q's N")
    c.tensor("k_pe", k_pe, ndim=3, layout="[Tk, 1, R]")
    if k_pe.shape[0] != Tk or k_pe.shape[1] not in (1, N):
        c.fail("k_pe", f"shape [Tk, 1, R] = ({Tk}, 1, *) (k_nope's Tk; [Tk, N, R] also taken)", tuple(k_pe.shape))
    R = k_pe.shape[2]
    c.tensor("v", v, shape=(Tk, N, None), layout="[Tk, N, V]", like="k_nope's Tk, N")
    V = v.shape[2]
    if Dqk != P + R:
        c.fail("q", f"shape [Tq, N, P + R] = (*, {N}, {P + R}) (k_nope's P={P} + k_pe's R={R})", tuple(q.shape))
    c.same_dtype("q", q, k_nope=k_nope, k_pe=k_pe, v=v)
    for name, x in (("P", P), ("R", R), ("V", V)):
        if x == 0:
            c.fail({"P": "k_nope", "R": "k_pe", "V": "v"}[name], f"a non-empty last dim {name}", 0)
    ints = (torch.int32,)
    c.tensor("cu_seqlens_q", cu_q, ndim=1, layout="[B + 1]", dtypes=ints)
    if cu_q.shape[0] < 1:
        c.fail("cu_seqlens_q", "shape [B + 1] with B >= 0 (at least one entry)", tuple(cu_q.shape))
    c.tensor("cu_seqlens_k", cu_k, shape=(cu_q.shape[0],), layout="[B + 1]", dtypes=ints, like="cu_seqlens_q's B + 1")
    if out is not None:
        c.tensor("out", out, shape=(Tq, N, V), layout="[Tq, N, V]", like="q's Tq, N and v's V")
        c.same_dtype("q", q, out=out)
        c.writable("out", out)
    if lse is not None:
        c.tensor("lse", lse, shape=(N, Tq), layout="[N, Tq]", dtypes=(torch.float32,), like="q's N, Tq")
        c.writable("lse", lse)
    c.same_device(q=q, k_nope=k_nope, k_pe=k_pe, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, lse=lse)
    # e.g. out = v with causal=False: other programs still read v while one writes out.
    c.no_overlap(
        {"out": out, "lse": lse},
        {"q": q, "k_nope": k_nope, "k_pe": k_pe, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k},
    )
    c.scale("sm_scale", sm_scale)
    if not isinstance(causal, bool):
        c.fail("causal", "a bool", type(causal).__name__, TypeError)
    for name, val in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if val is None:
            continue
        if isinstance(val, bool) or not isinstance(val, numbers.Integral):
            c.fail(name, "None or an int >= 0", repr(val), TypeError)
        if val < 0:
            c.fail(name, "None or an int >= 0", val)
    if host_offsets or cu_q.device.type == "cpu":  # free on the CPU; on a GPU a host sync
        _check_offsets(c, "cu_seqlens_q", cu_q, Tq, "Tq")
        _check_offsets(c, "cu_seqlens_k", cu_k, Tk, "Tk")
    return P, R, V


def _check_offsets(c: Checker, name: str, cu: torch.Tensor, total: int, total_name: str) -> None:
    vals = cu.tolist()
    bad = vals[0] < 0 or any(b < a for a, b in zip(vals, vals[1:])) or vals[-1] > total
    if bad:
        shown = vals if len(vals) <= 12 else vals[:6] + ["..."] + vals[-5:]
        if vals[0] < 0:
            at = f"{name}[0] = {vals[0]} < 0"
        else:
            i = next((i for i in range(1, len(vals)) if vals[i] < vals[i - 1]), None)
            at = (
                f"{name}[{i}] = {vals[i]} < {name}[{i - 1}] = {vals[i - 1]}"
                if i is not None
                else f"{name}[{len(vals) - 1}] = {vals[-1]} > {total_name}={total}"
            )
        c.fail(name, f"non-decreasing offsets in [0, {total_name}={total}]", f"{shown} ({at})")


def _host_offsets(impl: str, debug: bool | None) -> bool:
    """Check cu_seqlens' values on the host: the reference reads them there anyway; debug asks."""
    if impl == "reference":
        return True
    return debug_enabled(debug)


def _check_triton_dims(c: Checker, dims: tuple[int, int, int]) -> None:
    # tl.arange needs powers of two, tl.dot tiles of at least 16; MLA is (128, 64, 128).
    for arg, name, x in zip(("k_nope", "k_pe", "v"), ("P", "R", "V"), dims):
        if x < 16 or x & (x - 1):
            c.fail(
                arg,
                f"last dim {name} a power of two >= 16 for the Triton kernel (MLA: P=128, R=64, "
                "V=128; the reference backend takes any)",
                x,
            )


# --------------------------------------------------------------------------- launch


def _run_chunk(impl, q, ck: ContextChunk, cu_q, sm_scale, out, lse, config):
    """The new tokens' queries against every key of one context chunk (non-causal)."""
    _run(impl, q, ck.k_nope, ck.k_pe, ck.v, cu_q, ck.cu_seqlens_k, sm_scale, False, out, lse, config, ck.max_seqlen_k)


def _run(impl, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, causal, out, lse, config, max_k=None):
    if impl == "triton":
        launch_triton(
            q,
            k_nope,
            k_pe,
            v,
            cu_q,
            cu_k,
            out,
            lse,
            sm_scale=sm_scale,
            causal=causal,
            config=config,
            max_seqlen_k=max_k,
        )
    else:
        ref_out, ref_lse = mla_prefill_ref(q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, causal)
        # Only the rows of sequences, as the kernel: rows outside every sequence stay untouched.
        cq = cu_q.tolist()
        if cq and cq[0] == 0 and cq[-1] == q.shape[0]:
            out.copy_(ref_out)
            lse.copy_(ref_lse)
        else:
            rows = torch.cat([torch.arange(a, b) for a, b in zip(cq, cq[1:])] + [torch.arange(0)])
            rows = rows.to(out.device)
            out[rows] = ref_out[rows].to(out.dtype)
            lse[:, rows] = ref_lse[:, rows]


def launch_config(arch: str, dtype: torch.dtype) -> dict:
    """The launch data the wrapper uses for ``dtype`` on ``arch`` (see configs/mla_prefill.json)."""
    cfg = config_for(OP, arch)
    return cfg["triton_fp32" if dtype == torch.float32 else "triton"]


def head_group(cfg: dict, num_heads: int, max_seqlen_k: int, kv_head_bytes: int) -> int:
    """Heads whose programs the kernel numbers together (its head_group, see the kernel's Grid), a
    divisor of ``num_heads``: the largest one not above the config's ``head_group`` when it has
    one; else, with ``head_group_kv_bytes``, the most heads whose K/V of one sequence
    (``max_seqlen_k`` keys x ``kv_head_bytes``) fit in that many bytes -- the programs running
    together then re-read K/V from L2, not memory (measured on the H200, docs/notes/prefill-tma-and-head-groups.md);
    else 1 (one head after another)."""
    if "head_group" in cfg:
        want = int(cfg["head_group"])
        if want < 1:
            raise ValueError(f"{OP}: config head_group must be >= 1, got {want}")
    elif "head_group_kv_bytes" in cfg:
        want = int(cfg["head_group_kv_bytes"]) // max(1, max_seqlen_k * kv_head_bytes)
    else:
        want = 1
    want = max(1, min(want, num_heads))
    return max(g for g in range(1, want + 1) if num_heads % g == 0)


def triton_meta(
    cfg: dict,
    arch: str,
    dims: tuple[int, int, int],
    causal: bool,
    fp32: bool,
    tma_aligned: bool = True,
) -> tuple[dict, dict]:
    """``(constexprs, compile options)`` of one launch config on ``arch``: the single place the
    launch and the ISA report's variants (rocm_mla/variants/prefill.py) take them from.
    ``tma_aligned``: the tensors meet the TMA descriptors' alignment (``_tma_ok``; the variants
    describe aligned tensors)."""
    P, R, V = dims
    consts = {
        "D_NOPE": P,
        "D_ROPE": R,
        "D_V": V,
        "BLOCK_M": int(cfg["BLOCK_M"]),
        "BLOCK_N": int(cfg["BLOCK_N"]),
        "SEQ_CHUNK": SEQ_CHUNK,
        "CAUSAL": bool(causal),
        # fp32 inputs: exact products (NVIDIA would use TF32 by default); 16-bit inputs: default.
        "DOT_PREC": "ieee" if fp32 else None,
        # software-pipelining depth of the masked (diagonal / ragged-end) loop; default: num_stages
        "DIAG_STAGES": int(cfg.get("diag_stages", cfg.get("num_stages", 2))),
        # TMA tensor descriptors for K/k_pe/V ("host": q too): NVIDIA sm90+ (and the CPU
        # interpreter, which runs the same code path), 16-bit inputs; launch_triton also checks
        # the alignment.
        "USE_TMA": _tma_mode(cfg) if _tma_arch(arch) and not fp32 and tma_aligned else 0,
    }
    # On AMD also waves_per_eu, matrix_instr_nonkdim, kpack and schedule_hint (the backend's
    # instruction-scheduling hint); 0 / "none" are the backend's defaults.
    options = {
        "num_warps": int(cfg["num_warps"]),
        "num_stages": int(cfg.get("num_stages", 2)),
        **amd_options(cfg, arch),
    }
    return consts, options


def _tma_mode(cfg: dict) -> int:
    """The kernel's USE_TMA for a config's "tma" option (configs.PREFILL_TMA_MODES: false 0, true 1
    per-program descriptors, "host" 2 host descriptors)."""
    tma = cfg.get("tma", False)
    mode = prefill_tma_mode(tma)
    if mode is not None:
        return mode
    raise ValueError(f'{OP}: config tma must be false, true or "host", got {tma!r}')


def _tma_arch(arch: str) -> bool:
    """Archs where the "tma" launch option is honoured: Hopper and later NVIDIA, and the CPU
    interpreter (to test the path). On AMD the descriptors would be lowered back to pointer loads."""
    if arch == "cpu":
        return True
    return (nvidia_sm(arch) or 0) >= 90


def _tma_ok(q, k_nope, k_pe, v, kpe_sh: int) -> bool:
    """TMA descriptors need 16-byte aligned bases and row/head steps, unit inner strides (and the
    data to exist). Otherwise the launch keeps the pointer loads. (q only matters to host
    descriptors, which also load it; requiring it of both keeps one rule.)"""
    if k_nope.shape[0] == 0 or k_nope.element_size() != 2:
        return False
    e = k_nope.element_size()
    for x, head_stride in ((q, q.stride(1)), (k_nope, k_nope.stride(1)), (k_pe, kpe_sh), (v, v.stride(1))):
        if x.stride(2) != 1 or x.data_ptr() % 16 or (x.stride(0) * e) % 16 or (head_stride * e) % 16:
            return False
    return True


def _ensure_allocator(device: torch.device) -> None:
    """Device-side tensor descriptors need Triton's global-scratch allocator (128 bytes per
    descriptor per program). Set one (torch's caching allocator, CUDA-graph safe) unless the
    caller set their own."""
    if device.type != "cuda":
        return
    try:
        from triton.runtime import _allocation

        current = _allocation._allocator.get()
    except Exception:  # another Triton layout: no way to ask, so set ours
        current = None
    if current is not None and type(current).__name__ != "NullAllocator":
        return
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))


def grid_slots(Tq: int, B: int, N: int, block_m: int) -> int:
    """The kernel's slot count, ``Tq // BLOCK_M + B`` (it covers every sequence's q blocks, see the
    kernel's Grid); its one grid axis has ``slots x N`` programs, numbered in int32."""
    slots = Tq // block_m + B
    if slots * N >= 2**31:
        raise ValueError(
            f"{OP}: (Tq // BLOCK_M + B) * N programs must be < 2**31, got {slots * N} "
            f"(Tq={Tq}, B={B}, N={N}, BLOCK_M={block_m})"
        )
    return slots


def launch_triton(
    q,
    k_nope,
    k_pe,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    out,
    lse,
    *,
    sm_scale: float,
    causal: bool,
    config: dict | None = None,
    max_seqlen_k: int | None = None,
) -> None:
    """Launch the Triton kernel on validated arguments (``mla_prefill`` checks them first).
    ``max_seqlen_k`` (a hint: Tk when None) only picks how the programs are ordered.

    Exposed for ``rocm-mla tune`` (it times each candidate config); everything else
    should call :func:`mla_prefill`.
    """
    Tq, N, _ = q.shape
    Tk = k_nope.shape[0]
    B = cu_seqlens_q.shape[0] - 1
    if Tq == 0 or N == 0 or B == 0:
        return  # no row of any sequence: nothing to write
    arch = _platform.device_arch(q.device)
    cfg = config if config is not None else launch_config(arch, q.dtype)
    dims = (k_nope.shape[2], k_pe.shape[2], v.shape[2])
    kpe_sh = 0 if k_pe.shape[1] == 1 else k_pe.stride(1)  # one rope head serves every head
    tma_aligned = bool(_tma_mode(cfg)) and _tma_ok(q, k_nope, k_pe, v, kpe_sh)
    group = head_group(cfg, N, max_seqlen_k or Tk, (dims[0] + dims[2]) * q.element_size())
    consts, options = triton_meta(cfg, arch, dims, causal, q.dtype == torch.float32, tma_aligned)
    num_slots = grid_slots(Tq, B, N, consts["BLOCK_M"])
    grid = (num_slots * N,)
    kn_st, kn_sh, kn_sd = k_nope.stride()
    kpe_st, _, kpe_sd = k_pe.stride()
    v_st, v_sh, v_sd = v.stride()
    kn, kpe, vv = k_nope, k_pe, v
    if Tk == 0:
        # Every sequence has lk == 0, so no key is ever loaded; empty tensors may carry a null
        # pointer, which the launcher rejects: hand it q's (never read).
        kn = kpe = vv = q
        kn_st = kn_sh = kn_sd = kpe_st = kpe_sh = kpe_sd = v_st = v_sh = v_sd = 0
    if consts["USE_TMA"] == 1:
        _ensure_allocator(q.device)
    descs = [None] * 5
    if consts["USE_TMA"] == 2:
        descs = _host_descriptors(q, k_nope, k_pe, v, kpe_sh, consts["BLOCK_M"], consts["BLOCK_N"])
    mla_prefill_kernel[grid](
        q,
        kn,
        kpe,
        vv,
        out,
        lse,
        cu_seqlens_q,
        cu_seqlens_k,
        *descs,
        float(sm_scale) * LOG2E,
        B,
        num_slots,
        group,
        Tq,
        Tk,
        *q.stride(),
        kn_st,
        kn_sh,
        kn_sd,
        kpe_st,
        kpe_sh,
        kpe_sd,
        v_st,
        v_sh,
        v_sd,
        *out.stride(),
        *lse.stride(),
        cu_seqlens_q.stride(0),
        cu_seqlens_k.stride(0),
        **consts,
        **options,
    )


def _host_descriptors(q, k_nope, k_pe, v, kpe_sh: int, block_m: int, block_n: int) -> list:
    """USE_TMA 2: 2-D TMA descriptors built on the host (no per-program descriptor writes; the
    kernel's TMA notes say what the rows past a sequence hold). Each spans all heads of a row:
    ``[T, (N - 1) * head_stride + D]`` with the row stride, so head h's block is at column
    ``h * head_stride`` (k_pe broadcast: head stride 0, one head wide)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(x, head_stride: int, width: int, rows: int) -> TensorDescriptor:
        n = x.shape[1] if head_stride else 1
        cols = (n - 1) * head_stride + x.shape[2]
        return TensorDescriptor(x, [x.shape[0], cols], [x.stride(0), 1], [rows, width])

    P, R, V = k_nope.shape[2], k_pe.shape[2], v.shape[2]
    return [
        desc(q, q.stride(1), P, block_m),
        desc(q, q.stride(1), R, block_m),
        desc(k_nope, k_nope.stride(1), P, block_n),
        desc(k_pe, kpe_sh, R, block_n),
        desc(v, v.stride(1), V, block_n),
    ]
