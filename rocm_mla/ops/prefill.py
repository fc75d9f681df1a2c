"""mla_prefill: varlen MLA prefill attention (Dqk = P + R, Dv = V) reading k_nope, k_pe and v
in place, writing out and lse in place.

Head geometries (P = qk_nope_head_dim, R = qk_rope_head_dim, V = v_head_dim), every one vLLM serves
for MLA: (128, 64, 128) DeepSeek-V2/V3/R1 and Kimi-K2, (192, 64, 256) GLM-4.x-Lite and the
DeepSeek-V3.2 layout, (64, 64, 128), and (256, 0, 256) without a RoPE part (``k_pe=None``). The
Triton kernel takes any P, V in [1, 256] and R in [0, 256]: a dim that is not a power of two is
tiled by the next one and masked inside the kernel (no padding, no copy); the reference any size.

The wrapper validates, then launches the Triton kernel through its plan (``plan_prefill``,
rocm_mla/ops/prefill_plan.py: launch data, head group, grid, TMA mode) or runs the float32 reference.
The chunked-context composition, ``mla_prefill_with_context``, is rocm_mla/ops/prefill_context.py.

Kernel: rocm_mla/kernels/mla_prefill.py (Triton; there is no HIP kernel for this op).
Reference: rocm_mla/reference/prefill.py.

Host syncs: none. The grid is sized from Tq and B (tensor shapes), not from cu_seqlens' values,
so the GPU path never reads cu_seqlens on the host; max_seqlen_q / max_seqlen_k are accepted for
FlashAttention-style call sites and not needed (max_seqlen_k only orders the programs). The
reference backend reads cu_seqlens on the host (and so always validates them); ``debug=True`` /
``ROCM_MLA_DEBUG=1`` validates them on a GPU too.

Bad cu_seqlens on a GPU (not validated without debug): the kernel deals q rows to sequences in
order and clamps every sequence's bounds to ``[0, Tq]`` / ``[0, Tk]``, so it never reads or writes
outside q, k_nope, k_pe, v, out, lse; every row owned by a sequence whose bounds are invalid gets
NaN out and NaN lse, detected in the kernel (no sync, capturable); docs/bad-input.md gives the rule.
"""

from __future__ import annotations

import numbers

import torch
import triton

from ..kernels.mla_prefill import mla_prefill_kernel
from ..reference.prefill import mla_prefill_ref
from ..triton_common import LOG2E
from ._checks import FLOAT_DTYPES, Checker, debug_enabled
from ._dispatch import select
from .prefill_plan import OP, PrefillPlan, plan_prefill

# The widest head dim (P, R or V) the Triton kernel tiles: one power-of-two register tile per dim.
MAX_TRITON_HEAD_DIM = 256


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
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen MLA prefill attention, no concat, no padding, output and LSE in place.

    Args:
        q: ``[Tq, N, P + R]``, nope part then rope part of each head (DeepSeek 192 = 128 + 64, GLM-4.x-Lite
            256 = 192 + 64, no RoPE 256 = 256 + 0), float16/bfloat16/float32, any strides.
        k_nope: ``[Tk, N, P]``, q's dtype, any strides (e.g. ``kv[..., :128]`` of the
            ``[Tk, N, 256]`` kv_b_proj output).
        k_pe: ``[Tk, 1, R]``: one rope head broadcast over the N heads (e.g. a slice of the
            ``[Tk, 576]`` latent buffer, unsqueezed); ``[Tk, N, R]`` is also taken (e.g.
            ``k_pe.expand(Tk, N, R)``, head stride 0, or a real per-head tensor). q's dtype, any strides.
            None for a geometry without RoPE part (R = 0: q is ``[Tq, N, P]``).
        v: ``[Tk, N, V]`` (DeepSeek 128, GLM-4.x-Lite 256), q's dtype, any strides (e.g. ``kv[..., P:]``).
        cu_seqlens_q, cu_seqlens_k: ``[B + 1]`` int32 prefix sums: sequence b owns q rows
            ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and k/v rows ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``.
            Lengths may differ between q and k and may be 0. They must start at 0-or-more, not
            decrease, and end at most at Tq / Tk; q rows outside every sequence are not written
            (by any backend). Checked for CPU tensors, by the reference backend, and with
            ``debug``; on a GPU otherwise (a check would cost a host sync) bad values cannot make
            the kernel touch memory outside the tensors (see the module docstring).
        sm_scale: softmax scale (> 0), e.g. ``1 / sqrt(P + R)`` times the yarn mscale correction.
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
        batch_invariant: a sequence's out and lse bitwise the same whatever the other sequences,
            their lengths, order and its position (docs/batch-invariance.md). Always so here: a
            program's keys, tiles and softmax order start at its own sequence's first row and key,
            and no launch choice that changes arithmetic follows the batch (the head group and
            max_seqlen_k order the programs only; the TMA mode follows the tensors' alignment);
            the keyword states the requirement, and is checked to be a bool.

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
    if not isinstance(batch_invariant, bool):
        c.fail("batch_invariant", "a bool", repr(batch_invariant), TypeError)
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
    # Each dim is one register tile of the next power of two (masked past the dim): up to 256.
    for arg, name, x in zip(("k_nope", "k_pe", "v"), ("P", "R", "V"), dims):
        if x > MAX_TRITON_HEAD_DIM:
            c.fail(
                arg,
                f"last dim {name} <= {MAX_TRITON_HEAD_DIM} for the Triton kernel (MLA geometries (P, R, V): "
                "(128, 64, 128), (192, 64, 256), (64, 64, 128), (256, 0, 256); the reference backend takes any)",
                x,
            )


# --------------------------------------------------------------------------- launch


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
    """Plan and launch the Triton kernel on validated arguments (``mla_prefill`` checks them first).
    ``max_seqlen_k`` (a hint: Tk when None) only picks how the programs are ordered.

    Exposed for the memory-safety tests, which launch on cu_seqlens nobody validated; everything
    else should call :func:`mla_prefill`.
    """
    Tq, N, _ = q.shape
    B = cu_seqlens_q.shape[0] - 1
    if Tq == 0 or N == 0 or B == 0:
        return  # no row of any sequence: nothing to write
    plan = plan_prefill(q, k_nope, k_pe, v, batch=B, causal=causal, config=config, max_seqlen_k=max_seqlen_k)
    _launch(plan, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, out, lse, sm_scale)


def _launch(plan: PrefillPlan, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, out, lse, sm_scale: float) -> None:
    """The one kernel launch ``plan`` describes."""
    Tq = q.shape[0]
    Tk = k_nope.shape[0]
    B = cu_seqlens_q.shape[0] - 1
    consts = plan.constexprs
    kpe_sh = plan.kpe_head_stride
    kn_st, kn_sh, kn_sd = k_nope.stride()
    kpe_st, _, kpe_sd = k_pe.stride() if k_pe is not None else (0, 0, 0)
    v_st, v_sh, v_sd = v.stride()
    kn, kpe, vv = k_nope, k_pe, v
    if k_pe is None:
        kpe = q  # R = 0: the kernel has no k_pe load (D_ROPE == 0); any valid pointer
    if Tk == 0:
        # Every sequence has lk == 0, so no key is ever loaded; empty tensors may carry a null
        # pointer, which the launcher rejects: hand it q's (never read).
        kn = kpe = vv = q
        kn_st = kn_sh = kn_sd = kpe_st = kpe_sh = kpe_sd = v_st = v_sh = v_sd = 0
    if plan.use_tma == 1:
        _ensure_allocator(q.device)
    descs = [None] * 5
    if plan.use_tma == 2:
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
        B,
        plan.num_slots,
        plan.head_group,
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
