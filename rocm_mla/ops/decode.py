"""mla_decode: paged MQA over the MLA latent cache (absorbed-weight decode), split-KV, in place.

Kernels: rocm_mla/kernels/decode.py (Triton stage 1) and the split-K reduce of
rocm_mla/kernels/latent_core.py (stage 2). Reference: rocm_mla/reference/decode.py. The plan
(``plan_decode``, rocm_mla/ops/decode_plan.py: tier, split count, workspace, launch configs, fp8
dots, batch-invariant mode, backend, decided on the host from sizes alone so the call can be
captured in a CUDA/HIP graph) is made once per step and passed to every layer's call; the call
checks its tensors against it and launches what it says: stage 1 alone (one split: it writes
out/lse), or stage 1 into a float32 workspace (``torch.empty`` per call, or the caller's
``workspace=``) and stage 2 merging the splits."""

from __future__ import annotations

from typing import Any

import torch

from ..kernels.decode import mla_decode_stage1_kernel
from ..kernels.latent_core import mla_decode_reduce_kernel
from ..reference.decode import mla_decode_ref, quantize_q_fp8
from ._checks import Checker
from ._launch import kernel_launch
from .decode_plan import (
    DEFAULT_FP8_DOTS,
    OP,
    REDUCE_ARGS,
    STAGE1_ARGS,
    DecodePlan,
    plan_decode,
)
from .latent_core import check_call, check_latent_inputs, launch_args, plan_needs_kind


def mla_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    k_scale: float | torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    plan: DecodePlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged multi-query attention of MLA decode over the latent cache; returns ``(out, lse)``.

    Args:
        q_nope: ``[rows, N, 512]`` (q_nope absorbed through W_UK), float16/bfloat16/float32, any
            strides. rows = B x q_len: request b owns rows ``b*q_len .. b*q_len + q_len - 1``, its
            last q_len tokens in order (q_len >= 1 uniform: decode 1, MTP / spec-decode more).
        q_pe: ``[rows, N, 64]`` rotary part, q_nope's dtype, any strides (e.g. a slice of q).
            Read in place: no concatenation, no copy.
        kv_cache: ``[num_blocks, block_size, 576]`` paged latent cache; a row is
            ``[kv_c (512) | k_pe (64)]``; K is all 576 columns, V the first 512. Any block size;
            the last dim must be contiguous (block and token strides free). dtype q's, or fp8:
            float8_e4m3fn / float8_e4m3fnuz, or uint8 storage with a plan made with
            ``kv_cache_dtype="fp8"`` (``plan_decode``).
        block_table: ``[B, max_blocks]`` int32, page ids in any order; token j of request b is
            ``kv_cache[block_table[b, j // block_size], j % block_size]``. Column stride 1.
            Entries past a request's seq_len are never read. A used entry outside
            ``[0, num_blocks)`` makes that request's rows NaN (see "Bad values").
        seq_lens: ``[B]`` int32, keys per request including the new tokens. Row t of request b
            sees keys ``j <= seq_len - q_len + t`` (causal among the new tokens). A row that sees
            no key (e.g. seq_len 0 padding) gets out 0 and lse -inf. Lengths must be <= the
            table's capacity ``max_blocks x block_size``: checking that needs a host sync, so only
            a plan made with ``debug=True`` does; without it the kernel clamps to the capacity
            (never reads past the table).
        sm_scale: softmax scale applied to q.k: a finite number > 0 (as in mla_prefill); a
            layer's own value, so one plan serves every layer.
        out: optional ``[rows, N, 512]`` destination in q's dtype, any non-overlapping strides;
            every element is written (no memset needed). Allocated when None. It may not
            overlap lse, workspace or anything the op reads (q_nope, q_pe, kv_cache -- e.g. cache
            pages a request reads --, block_table, seq_lens, k_scale): ValueError naming both.
        lse: optional ``[rows, N]`` float32 destination (natural log), any strides. Allocated
            when None. Same no-overlap rule as out.
        k_scale: fp8 dequant scale, value = stored x k_scale (K and V share it). A float, or a
            float32 tensor of one element on the device (read by the kernel: no host sync; the
            plan must be made with ``k_scale_on_device=True``). Ignored for 16/32-bit caches
            (vLLM passes 1.0 there). None means 1.
        workspace: optional float32 tensor (contiguous) for split partials, at least
            ``plan.workspace_numel`` elements; without it each call with S > 1 does one
            ``torch.empty`` (no memset). A destination: the same no-overlap rule as out.
        plan: what to launch, from ``plan_decode`` (the tier, split count, workspace, fp8 dots,
            batch-invariant mode, backend): make it once per step and pass it to every layer.
            The tensors must be the ones it was made for (sizes, dtypes, device, kind of
            k_scale: ValueError naming the first field that differs). None: planned here from
            the tensors with every default (the fp8 kind of a float8 cache from its dtype; a
            uint8 cache needs a plan naming its kind).

    Returns:
        ``(out, lse)``: the destinations (given or allocated).

    Bad values (no host sync unless the plan's debug): nothing outside the given tensors is read
    or written. seq_lens are clamped to the table's capacity (negative = 0). A request whose
    used block-table entries include a page outside ``[0, num_blocks)`` gets NaN out and lse in
    every row (the kernel checks a program's entries before its KV loop and then skips it, or --
    ``CLAMP_PAGES`` tiers -- clamps each tile's page into the cache and checks the entries after
    the loop: no page outside the cache is read either way); other requests are unaffected.
    A debug plan raises a ValueError naming the entry and the bound instead.
    Overlap checks are host pointer arithmetic: the call stays capturable in a CUDA graph.
    Zero sizes (B = 0, N = 0, max_blocks = 0) work with or without out/lse/workspace.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    if plan is None:
        plan_needs_kind(c, kv_cache, "plan_decode")
        plan = plan_decode_for(q_nope, kv_cache, block_table, k_scale=k_scale, workspace=workspace)
    elif not isinstance(plan, DecodePlan):
        c.fail("plan", "a plan from plan_decode (DecodePlan)", type(plan).__name__, TypeError)
    if not plan.matches(q_nope, q_pe, kv_cache, block_table, seq_lens):
        _explain_mismatch(c, plan, q_nope, q_pe, kv_cache, block_table, seq_lens)
    inputs = dict(q_nope=q_nope, q_pe=q_pe, kv_cache=kv_cache, block_table=block_table, seq_lens=seq_lens)
    sm_scale, out, lse, scale_t, ks_float = check_call(c, plan, q_nope, inputs, sm_scale, out, lse, k_scale, workspace)
    kv = kv_cache.view(plan.kv_kind) if kv_cache.dtype != plan.kv_kind else kv_cache
    if plan.debug:
        _debug_checks(c, kv, block_table, seq_lens, plan.q_len)
    if out.numel() == 0 and lse.numel() == 0:
        return out, lse
    if plan.backend == "triton":
        _launch_triton(
            plan, q_nope, q_pe, kv, block_table, seq_lens, out, lse, workspace, float(sm_scale), ks_float, scale_t
        )
    else:
        dots = plan.fp8_dots
        ref_scale = (scale_t if scale_t is not None else ks_float) if plan.kv_fp8 else None
        qn, qp = quantize_q_fp8(q_nope, q_pe, kv.dtype) if dots != "none" else (q_nope, q_pe)
        p_fp8 = kv.dtype if dots == "all" else None
        o, lse_ref = mla_decode_ref(qn, qp, kv, block_table, seq_lens, float(sm_scale), ref_scale, p_fp8=p_fp8)
        out.copy_(o)
        lse.copy_(lse_ref)
    return out, lse


# --------------------------------------------------------------------------- validation helpers


def _validate_tensors(c: Checker, q_nope, q_pe, kv_cache, block_table, seq_lens=None) -> dict[str, Any]:
    """The tensors' own rules (shapes, dtypes, strides, devices agree), with errors naming the
    argument; returns the sizes a plan for them has (``plan_decode``'s keywords)."""
    rows, N = check_latent_inputs(c, q_nope, q_pe, kv_cache, "rows")
    c.tensor("block_table", block_table, ndim=2, layout="[B, max_blocks]", dtypes=(torch.int32,))
    B, max_blocks = block_table.shape
    if block_table.stride(1) != 1 and max_blocks > 1:
        c.fail("block_table", "column stride 1", f"strides {block_table.stride()}")
    if seq_lens is not None:
        c.tensor("seq_lens", seq_lens, shape=(B,), layout="[B]", like="block_table's B", dtypes=(torch.int32,))
    if B == 0 and rows != 0:
        c.fail("q_nope", "0 rows for an empty batch (block_table has B = 0)", f"{rows} rows")
    if B and rows % B:
        c.fail("q_nope", f"rows = B x q_len with uniform q_len (B = {B} from block_table)", f"{rows} rows")
    c.same_device(q_nope=q_nope, q_pe=q_pe, kv_cache=kv_cache, block_table=block_table, seq_lens=seq_lens)
    return dict(
        batch=B,
        num_heads=N,
        q_len=rows // B if B else 1,
        max_blocks=max_blocks,
        block_size=kv_cache.shape[1],
        q_dtype=q_nope.dtype,
        kv_dtype=kv_cache.dtype,
        device=q_nope.device,
    )


def plan_decode_for(
    q_nope: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    *,
    k_scale: float | torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    **knobs: Any,
) -> DecodePlan:
    """``plan_decode`` with the sizes, dtypes and device read from a call's tensors (``q_nope``
    ``[rows, N, 512]``, ``kv_cache`` ``[num_blocks, block_size, 576]``, ``block_table`` ``[B,
    max_blocks]``), the k_scale form from ``k_scale`` and the split cap from ``workspace``;
    ``knobs``: the rest of ``plan_decode``'s keywords (kv_cache_dtype, max_seq_len,
    num_splits, config, fp8_dots, batch_invariant, backend, debug). The tensors are checked
    as ``mla_decode`` checks them."""
    c = Checker(OP)
    sizes = _validate_tensors(c, q_nope, None, kv_cache, block_table)
    if isinstance(workspace, torch.Tensor) and "workspace_numel" not in knobs:
        knobs["workspace_numel"] = workspace.numel()
    knobs.setdefault("k_scale_on_device", isinstance(k_scale, torch.Tensor))
    return plan_decode(**sizes, **knobs)


def _explain_mismatch(c: Checker, plan: DecodePlan, q_nope, q_pe, kv_cache, block_table, seq_lens) -> None:
    """Raise for tensors that ``DecodePlan.matches`` refused: their own rule first, else the plan field
    that differs."""
    sizes = _validate_tensors(c, q_nope, q_pe, kv_cache, block_table, seq_lens)
    c.plan_for(plan, DecodePlan, "plan_decode", sizes)


def _debug_checks(c: Checker, kv: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, q_len: int) -> None:
    """Checks that read device values (one host sync): lengths within the table's capacity and
    used page ids within the cache."""
    B, max_blocks = block_table.shape
    if B == 0:
        return
    cap = max_blocks * kv.shape[1]
    sl = seq_lens.long().cpu()
    bad = ((sl < 0) | (sl > cap)).nonzero()
    if bad.numel():
        b = int(bad[0, 0])
        c.fail(
            "seq_lens",
            f"0 <= seq_len <= block-table capacity {cap} (max_blocks {max_blocks} x block_size {kv.shape[1]})",
            f"seq_lens[{b}] = {int(sl[b])}",
        )
    used = (torch.arange(max_blocks)[None, :] * kv.shape[1]) < sl[:, None]
    bt = block_table.cpu()
    bad = (used & ((bt < 0) | (bt >= kv.shape[0]))).nonzero()
    if bad.numel():
        b, j = int(bad[0, 0]), int(bad[0, 1])
        c.fail(
            "block_table",
            f"page ids in [0, {kv.shape[0]}) (num_blocks) for every used block",
            f"block_table[{b}, {j}] = {int(bt[b, j])} ({bad.shape[0]} used entries out of range)",
        )


def _launch_triton(
    plan: DecodePlan,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    workspace: torch.Tensor | None,
    sm_scale: float,
    ks_float: float | None,
    ks_tensor: torch.Tensor | None,
) -> None:
    """Runs ``plan`` on validated tensors: stage 1, then (S > 1) the reduce."""
    page_size = kv.shape[1]
    max_blocks = block_table.shape[1]
    q_s, p_s, o_s, l_s = q_nope.stride(), q_pe.stride(), out.stride(), lse.stride()
    vals = dict(
        q_nope=q_nope,
        q_pe=q_pe,
        kv=kv,
        block_table=block_table,
        seq_lens=seq_lens,
        out=out,
        lse=lse,
        num_heads=plan.num_heads,
        q_len=plan.q_len,
        num_splits=plan.num_splits,
        split_programs=plan.split_programs,
        num_head_blocks=plan.head_blocks,
        page_size=page_size,
        page_shift=plan.page_shift,
        capacity=max_blocks * page_size,
        num_pages=kv.shape[0],
        s_qn_r=q_s[0],
        s_qn_h=q_s[1],
        s_qn_d=q_s[2],
        s_qp_r=p_s[0],
        s_qp_h=p_s[1],
        s_qp_d=p_s[2],
        s_kv_blk=kv.stride(0),
        s_kv_tok=kv.stride(1),
        s_bt_b=block_table.stride(0),
        s_sl=seq_lens.stride(0),
        s_o_r=o_s[0],
        s_o_h=o_s[1],
        s_o_d=o_s[2],
        s_l_r=l_s[0],
        s_l_h=l_s[1],
        **launch_args(plan, workspace, plan.rows, lse, sm_scale, ks_float, ks_tensor),
    )
    # Positional in the kernel's order (STAGE1_ARGS): a name the table has and the launch lacks
    # is a KeyError here, never a silently shifted argument.
    launches = plan.kernel_launches
    if not launches:
        launches["kernel"] = kernel_launch(mla_decode_stage1_kernel, plan.constexprs, plan.options)
        if not plan.direct:
            launches["reduce"] = kernel_launch(mla_decode_reduce_kernel, plan.reduce.constexprs, plan.reduce.options)
    launches["kernel"](plan.grid, [vals[name] for name, _ in STAGE1_ARGS])
    if plan.direct:
        return
    split_tokens, split_cap, split_block_n = plan.split_rule
    vals.update(split_tokens=split_tokens, split_cap=split_cap, split_block_n=split_block_n)
    # The sink and inverse-RoPE arguments (mla_v4_attention's epilogue): unread here.
    vals.update(sink=lse, positions=seq_lens, cos_sin=lse, num_pos=0, s_pos=0, s_cs=0)
    launches["reduce"](plan.reduce.grid, [vals[name] for name, _ in REDUCE_ARGS])


__all__ = ["mla_decode", "plan_decode_for", "DEFAULT_FP8_DOTS"]
