"""mla_prefill: varlen MLA prefill attention (Dqk = P + R, Dv = V) reading k_nope, k_pe and v
in place, writing out and lse in place.

Head geometries (P = qk_nope_head_dim, R = qk_rope_head_dim, V = v_head_dim), every one vLLM serves
for MLA: (128, 64, 128) DeepSeek-V2/V3/R1 and Kimi-K2, (192, 64, 256) GLM-4.x-Lite and the
DeepSeek-V3.2 layout, (64, 64, 128), and (256, 0, 256) without a RoPE part (``k_pe=None``). The
Triton kernel takes any P, V in [1, 256] and R in [0, 256]: a dim that is not a power of two is
tiled by the next one and masked inside the kernel (no padding, no copy); the reference any size.

The plan (``plan_prefill``, rocm_mla/ops/prefill_plan.py, or ``plan_prefill_for`` from a call's
tensors) is made once per step and passed to every layer's call; the call checks its tensors
against it and launches the Triton kernel it describes, or runs the float32 reference. The
chunked-context composition, ``mla_prefill_with_context``, is rocm_mla/ops/prefill_context.py.

Kernel: rocm_mla/kernels/prefill.py (Triton; there is no HIP kernel for this op).
Reference: rocm_mla/reference/prefill.py.

Host syncs: none. The grid is sized from Tq and B (tensor shapes), not from cu_seqlens' values,
so the GPU path never reads cu_seqlens on the host (nor needs the max_seqlen hints). The reference
backend, and a debug plan (``plan_prefill``'s ``debug``) on a GPU too, read and validate them.

Bad cu_seqlens on a GPU (not validated without debug): the kernel deals q rows to sequences in
order and clamps every sequence's bounds to ``[0, Tq]`` / ``[0, Tk]``, so it never reads or writes
outside q, k_nope, k_pe, v, out, lse; every row owned by a sequence whose bounds are invalid gets
NaN out and NaN lse, detected in the kernel (no sync, capturable); docs/bad-input.md gives the rule.
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from ..kernels.prefill import mla_prefill_kernel
from ..reference.prefill import mla_prefill_ref
from ..triton_common import LOG2E
from ._checks import FLOAT_DTYPES, Checker
from .prefill_plan import OP, PrefillContextPlan, PrefillPlan, _plan_tensors, kpe_head_stride, plan_prefill


def mla_prefill(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor | None,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    plan: PrefillPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen MLA prefill attention, no concat, no padding, output and LSE in place.

    Args:
        q: ``[Tq, N, P + R]``, nope part then rope part of each head (DeepSeek 192 = 128 + 64, GLM-4.x-Lite
            256 = 192 + 64, no RoPE 256 = 256 + 0), float16/bfloat16/float32, any strides.
        k_nope: ``[Tk, N, P]``, q's dtype, any strides (e.g. ``kv[..., :128]`` of the
            ``[Tk, N, 256]`` kv_b_proj output).
        k_pe: ``[Tk, 1, R]``: one rope head broadcast over the N heads (e.g. a slice of the
            ``[Tk, 576]`` latent buffer, unsqueezed); ``[Tk, N, R]`` is also taken (e.g.
            vLLM's expanded ``k[..., P:]``). None when R = 0 (a geometry without RoPE part). q's
            dtype, any strides.
        v: ``[Tk, N, V]``, q's dtype, any strides (e.g. ``kv[..., 128:]``); V may differ from P + R.
        cu_seqlens_q, cu_seqlens_k: ``[B + 1]`` int32 offsets: sequence b owns q rows
            ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and k/v rows ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``.
            Lengths may differ between q and k and may be 0. They must start at 0-or-more, not
            decrease, and end at most at Tq / Tk; q rows outside every sequence are not written
            (by any backend). Checked for CPU tensors, by the reference backend, and with a debug
            plan; on a GPU otherwise (a check would cost a host sync) bad values cannot make the
            kernel touch memory outside the tensors (see the module docstring).
        sm_scale: softmax scale (> 0), e.g. ``1 / sqrt(P + R)`` times the yarn mscale correction; a
            layer's own value, so one plan serves every layer.
        out: optional ``[Tq, N, V]`` destination, q's dtype, any strides (e.g. the layer's
            ``[T, N * 128]`` output viewed as ``[T, N, 128]``). Allocated when None. It may not
            overlap lse or any input (q, k_nope, k_pe, v, cu_seqlens_*): ValueError naming both.
        lse: optional ``[N, Tq]`` float32 destination of the natural-log LSE, any strides (e.g. the
            transpose of a ``[Tq, N]`` buffer). Allocated when None. Same no-overlap rule.
        plan: what to launch, from ``plan_prefill`` (the launch data, head group, grid, causal,
            backend, batch-invariant mode, the max_seqlen hints, debug): make it once per step and
            pass it to every layer. The tensors must be the ones it was made for (B, N, Tq, Tk,
            head dims, dtype, device: ValueError naming the first field that differs). None:
            planned here from the tensors with every default (``plan_prefill_for``: causal, the
            arch's launch data, the default backend).

    Returns:
        ``(out, lse)``: the destinations (the caller's own tensors when passed). Every element of
        the rows of every sequence is written; a query that sees no key gets 0 and lse -inf, and
        lse -inf means only that: a NaN in q, or in the k_nope/k_pe of a key the query sees, gives
        NaN out and NaN lse (a NaN in v, NaN out), so a merge downstream cannot mistake a poisoned
        partial result for an empty one.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    tensors = (q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k)
    plan, sm_scale = _checked_call(Checker(OP), plan, PrefillPlan, plan_prefill_for, tensors, sm_scale, out, lse)
    out, lse = _destinations(plan, q, out, lse)
    _run(plan, *tensors, sm_scale, out, lse)
    return out, lse


def plan_prefill_for(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor | None,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    **knobs: Any,
) -> PrefillPlan:
    """``plan_prefill`` with the sizes (B, N, Tq, Tk, head dims), dtype and device read from a
    call's tensors (``mla_prefill``'s positional arguments, checked as it checks them; their values
    are not read); ``knobs``: the rest of ``plan_prefill``'s keywords (causal, max_seqlen_q,
    max_seqlen_k, config, batch_invariant, backend, debug)."""
    c = Checker(OP)
    return _plan_tensors(c, plan_prefill, _check_tensors(c, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k), knobs)


# --------------------------------------------------------------------------- validation


def _check_tensors(c: Checker, q, k_nope, k_pe, v, cu_q, cu_k) -> dict[str, Any]:
    """The inputs' own rules (shapes, dtypes, devices agree), with errors naming the argument;
    returns the sizes a plan for them has (``plan_prefill``'s keywords)."""
    c.tensor("q", q, ndim=3, layout="[Tq, N, P + R]", dtypes=FLOAT_DTYPES)
    Tq, N, Dqk = q.shape
    c.tensor("k_nope", k_nope, ndim=3, layout="[Tk, N, P]")
    Tk, P = k_nope.shape[0], k_nope.shape[2]
    c.tensor("k_nope", k_nope, shape=(None, N, None), layout="[Tk, N, P]", like="q's N")
    if k_pe is None:  # no RoPE part: q is [Tq, N, P]
        R = 0
    else:
        c.tensor("k_pe", k_pe, ndim=3, layout="[Tk, 1, R]")
        if k_pe.shape[0] != Tk or k_pe.shape[1] not in (1, N):
            c.fail("k_pe", f"shape [Tk, 1, R] = ({Tk}, 1, *) (k_nope's Tk; [Tk, N, R] also taken)", tuple(k_pe.shape))
        R = k_pe.shape[2]
        if R == 0:
            c.fail("k_pe", "a non-empty last dim R, or None for a geometry without RoPE part", 0)
    c.tensor("v", v, shape=(Tk, N, None), layout="[Tk, N, V]", like="k_nope's Tk, N")
    V = v.shape[2]
    if Dqk != P + R:
        c.fail("q", f"shape [Tq, N, P + R] = (*, {N}, {P + R}) (k_nope's P={P} + k_pe's R={R})", tuple(q.shape))
    c.same_dtype("q", q, k_nope=k_nope, k_pe=k_pe, v=v)
    for name, x in (("P", P), ("V", V)):
        if x == 0:
            c.fail({"P": "k_nope", "V": "v"}[name], f"a non-empty last dim {name}", 0)
    ints = (torch.int32,)
    c.tensor("cu_seqlens_q", cu_q, ndim=1, layout="[B + 1]", dtypes=ints)
    if cu_q.shape[0] < 1:
        c.fail("cu_seqlens_q", "shape [B + 1] with B >= 0 (at least one entry)", tuple(cu_q.shape))
    c.tensor("cu_seqlens_k", cu_k, shape=(cu_q.shape[0],), layout="[B + 1]", dtypes=ints, like="cu_seqlens_q's B + 1")
    c.same_device(q=q, k_nope=k_nope, k_pe=k_pe, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    return dict(
        batch=cu_q.shape[0] - 1,
        num_heads=N,
        q_rows=Tq,
        k_rows=Tk,
        head_dims=(P, R, V),
        q_dtype=q.dtype,
        device=q.device,
    )


def _checked_call(c: Checker, plan, kind: type, plan_for, tensors: tuple, sm_scale, out, lse) -> tuple[Any, float]:
    """``(plan, sm_scale)`` of a call (``mla_prefill``'s, or ``mla_prefill_with_context``'s new
    tokens), checked before any backend runs: ``plan`` a ``kind`` made for ``tensors`` (else
    TypeError, or ValueError after the tensors' own rules naming the plan field that differs), or
    planned from them by ``plan_for`` when None; then the rest of the call (``_check_call``)."""
    if plan is None:
        plan = plan_for(*tensors)
    elif not isinstance(plan, kind):
        maker = plan_for.__name__.removesuffix("_for")
        c.fail("plan", f"a plan from {maker} ({kind.__name__})", type(plan).__name__, TypeError)
    new_tokens = plan.new_tokens if isinstance(plan, PrefillContextPlan) else plan
    if not plan.matches(*tensors):
        c.plan_for(new_tokens, PrefillPlan, "plan_prefill", _check_tensors(c, *tensors))
    return plan, _check_call(c, new_tokens, *tensors, sm_scale, out, lse)


def _check_call(c: Checker, plan: PrefillPlan, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, out, lse) -> float:
    """The rest of a call whose inputs match ``plan``: the destinations (shape, dtype, device, no
    element twice, no memory in common with another argument), sm_scale, and cu_seqlens' values
    when they are on the CPU or the plan reads them on the host (reference backend, debug: a sync
    on a GPU). Returns sm_scale as a float."""
    Tq, N = q.shape[0], q.shape[1]
    if out is not None:
        c.tensor("out", out, shape=(Tq, N, plan.head_dims[2]), layout="[Tq, N, V]", like="q's Tq, N and v's V")
        c.same_dtype("q", q, out=out)
        c.writable("out", out)
    if lse is not None:
        c.tensor("lse", lse, shape=(N, Tq), layout="[N, Tq]", dtypes=(torch.float32,), like="q's N, Tq")
        c.writable("lse", lse)
    c.same_device(q=q, out=out, lse=lse)
    # e.g. out = v with causal=False: other programs still read v while one writes out.
    c.no_overlap(
        {"out": out, "lse": lse},
        {"q": q, "k_nope": k_nope, "k_pe": k_pe, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k},
    )
    sm_scale = c.scale("sm_scale", sm_scale)
    if plan.debug or plan.backend == "reference" or cu_q.device.type == "cpu":  # free on the CPU; on a GPU a sync
        _check_offsets(c, "cu_seqlens_q", cu_q, Tq, "Tq")
        _check_offsets(c, "cu_seqlens_k", cu_k, k_nope.shape[0], "Tk")
    return sm_scale


def _destinations(plan: PrefillPlan, q, out, lse) -> tuple[torch.Tensor, torch.Tensor]:
    """The caller's ``out`` and ``lse``, or, for each that is None, a new ``[Tq, N, V]`` tensor in
    q's dtype / ``[N, Tq]`` float32 one."""
    Tq, N = q.shape[0], q.shape[1]
    if out is None:
        out = torch.empty(Tq, N, plan.head_dims[2], dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(N, Tq, dtype=torch.float32, device=q.device)
    return out, lse


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


# --------------------------------------------------------------------------- launch


def _run(plan: PrefillPlan, q, k_nope, k_pe, v, cu_q, cu_k, sm_scale: float, out, lse) -> None:
    """What ``plan`` says, on checked tensors: the Triton launch, or the float32 reference."""
    if plan.backend == "triton":
        launch_triton(plan, q, k_nope, k_pe, v, cu_q, cu_k, out, lse, sm_scale=sm_scale)
    else:
        ref_out, ref_lse = mla_prefill_ref(q, k_nope, k_pe, v, cu_q, cu_k, sm_scale, plan.causal)
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


def launch_triton(
    plan: PrefillPlan, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, out, lse, *, sm_scale: float
) -> None:
    """Launch the Triton kernel ``plan`` describes on tensors it matches (``mla_prefill`` checks
    them first; nothing is checked here): pointer loads when the tensors do not meet the TMA
    descriptors' alignment (``PrefillPlan.launch_constexprs``).

    Exposed for the memory-safety tests, which launch on cu_seqlens nobody validated; everything
    else should call :func:`mla_prefill`.
    """
    if plan.q_rows == 0 or plan.num_heads == 0 or plan.batch == 0:
        return  # no row of any sequence: nothing to write
    Tq, Tk = q.shape[0], k_nope.shape[0]
    consts = plan.launch_constexprs(q, k_nope, k_pe, v)
    kpe_sh = kpe_head_stride(k_pe)
    # R = 0: the kernel has no k_pe load (D_ROPE == 0); q is any valid pointer.
    kn, kpe, vv = k_nope, q if k_pe is None else k_pe, v
    kpe_strides = (0, 0, 0) if k_pe is None else (k_pe.stride(0), kpe_sh, k_pe.stride(2))
    kv_strides = (*k_nope.stride(), *kpe_strides, *v.stride())
    if Tk == 0:
        # Every sequence has lk == 0, so no key is ever loaded; empty tensors may carry a null
        # pointer, which the launcher rejects: hand it q's (never read).
        kn = kpe = vv = q
        kv_strides = (0,) * 9
    if consts["USE_TMA"] == 1:
        _ensure_allocator(q.device)
    descs = [None] * 5
    if consts["USE_TMA"] == 2:
        descs = _host_descriptors(q, k_nope, k_pe, v, kpe_sh, consts["BLOCK_M"], consts["BLOCK_N"])
    mla_prefill_kernel[plan.grid](
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
        plan.batch,
        plan.num_slots,
        plan.head_group,
        Tq,
        Tk,
        *q.stride(),
        *kv_strides,
        *out.stride(),
        *lse.stride(),
        cu_seqlens_q.stride(0),
        cu_seqlens_k.stride(0),
        **consts,
        **plan.options,
    )


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

    P, V = k_nope.shape[2], v.shape[2]
    R = 0 if k_pe is None else k_pe.shape[2]
    return [
        desc(q, q.stride(1), P, block_m),
        desc(q, q.stride(1), R, block_m) if R else None,  # R = 0: no rope part to load
        desc(k_nope, k_nope.stride(1), P, block_n),
        desc(k_pe, kpe_sh, R, block_n) if R else None,
        desc(v, v.stride(1), V, block_n),
    ]


__all__ = ["mla_prefill", "plan_prefill_for"]
