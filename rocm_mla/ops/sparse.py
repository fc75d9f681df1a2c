"""mla_sparse_attention: sparse MLA (DeepSeek-V3.2, GLM-5.x) over per-row top-k token lists, decode
and prefill rows alike, in place.

Kernel: rocm_mla/kernels/sparse.py (Triton) and the split-K reduce of
rocm_mla/kernels/latent_core.py for split rows. Reference:
rocm_mla/reference/sparse.py. The plan (``plan_sparse_attention``, rocm_mla/ops/sparse_plan.py, or
``plan_sparse_attention_for`` here: every choice that is not a tensor, decided on the host from
sizes alone so the call can be captured in a CUDA/HIP graph) is made once per step and passed to
every layer's call; the call checks its tensors against it (``SparsePlan.matches``) before any
backend runs, then launches what it says.
"""

from __future__ import annotations

from typing import Any

import torch

from ..kernels.latent_core import mla_decode_reduce_kernel
from ..kernels.sparse import mla_sparse_attention_kernel
from ..reference.sparse import mla_sparse_attention_ref
from ..triton_common import INT32_MAX
from ._checks import Checker
from ._launch import kernel_launch
from .latent_core import check_call, check_latent_inputs, launch_args, plan_needs_kind
from .sparse_plan import D_KV, OP, SparsePlan, plan_sparse_attention


def mla_sparse_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    topk_indices: torch.Tensor,
    block_table: torch.Tensor | None,
    req_id_per_token: torch.Tensor | None,
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    k_scale: float | torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    plan: SparsePlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse multi-query attention over the MLA latent cache; returns ``(out, lse)``.

    Row t attends over the multiset of cache rows its list ``topk_indices[t]`` names (a repeated
    entry counts twice), with softmax(sm_scale x q . k) over all 576 columns and V = the first 512.
    Rows are independent: decode rows, MTP rows and prefill rows of any requests mix freely.

    Args:
        q_nope: ``[T, N, 512]`` (q_nope absorbed through W_UK), float16/bfloat16/float32, any
            strides. Any N >= 1 (no padding: N = 8 runs 8 heads).
        q_pe: ``[T, N, 64]`` rotary part, q_nope's dtype, any strides. Read in place (no concat).
        kv_cache: ``[num_blocks, block_size, 576]`` paged latent cache, rows ``[kv_c (512) | k_pe
            (64)]``, any block size, block and token strides free, last dim contiguous; q's dtype,
            or fp8: float8_e4m3fn / float8_e4m3fnuz, or uint8 storage with a plan made with an fp8
            ``kv_cache_dtype`` ("fp8": the platform's kind, e4m3fnuz on gfx942).
        topk_indices: ``[T, K]`` int32, column stride 1: entry ``p`` of row t is position p of
            row t's request (``block_table`` given) or the cache slot ``page x block_size + offset``
            (``block_table`` None: FlashMLA's convention, slots into ``kv_cache.view(-1, 576)``), in
            any order; -1 names no token. K >= 0 (2048 in DeepSeek-V3.2 and GLM-5; any K works).
        block_table: ``[B, max_blocks]`` int32, column stride 1: position p of request r is
            ``kv_cache[block_table[r, p // block_size], p % block_size]``. None: entries are slots.
        req_id_per_token: ``[>= T]`` int32, stride 1: the request (block-table row) of each query
            row; entries past T are not read. None exactly when block_table is None. The kernel
            turns positions into slots itself: no ``[T, K]`` slot tensor is made.
        sm_scale: softmax scale applied to q . k: a finite number > 0; a layer's own value, so one
            plan serves every layer.
        out: optional ``[T, N, 512]`` destination in q's dtype, any non-overlapping strides; every
            element is written (never zeroed first). Allocated when None.
        lse: optional ``[T, N]`` float32 destination (natural log), any strides. Allocated when None.
        k_scale: fp8 dequant scale, value = stored x k_scale: a float, or a one-element float32
            device tensor (read by the kernel, no host sync; the plan must be made with
            ``k_scale_on_device=True``). Ignored for 16/32-bit caches. None means 1.
        workspace: optional contiguous float32 tensor for split partials, at least
            ``plan.workspace_numel`` elements (``rocm_mla.ops.mla_decode_workspace_numel(T, N, S)``);
            without it a split call does one ``torch.empty``. A destination (no overlap).
        plan: what to launch, from ``plan_sparse_attention`` (sizes) or
            ``plan_sparse_attention_for`` (tensors): the cache's storage (``kv_cache_dtype``), the
            split count, batch invariance, the config, the backend, debug. Make it once per step
            and pass it to every layer. The tensors must be the ones it was made for
            (``SparsePlan.matches``: sizes, dtypes, device, table kind, kind of k_scale; ValueError
            naming the first field that differs), checked before any backend runs. None: planned
            here from the tensors with every default (a float8 cache's kind from its dtype; a
            uint8 cache needs a plan naming its fp8 kind, as ``mla_decode``'s does).

    Returns:
        ``(out, lse)``: the destinations (given or allocated). A row that selects no token gets
        out 0 and lse -inf.

    Bad values (no host sync unless the plan's debug): nothing outside the given tensors is read
    or written. An entry < -1, an entry >= ``max_blocks x block_size`` (one past the request's
    table; slots: >= ``num_blocks x block_size``), a block-table entry outside ``[0, num_blocks)``
    that an entry uses, or a row's request outside ``[0, B)`` when the row names a token: that
    row's out and lse are NaN; every other row is exact. A NaN in a selected cache row reaches
    only the rows that select it. A debug plan raises a ValueError naming the first bad index
    instead.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    if plan is None:
        plan_needs_kind(c, kv_cache, "plan_sparse_attention")
        plan = plan_sparse_attention_for(q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token,
                                         k_scale=k_scale, workspace=workspace)  # fmt: skip
    elif not isinstance(plan, SparsePlan):
        c.fail("plan", "a plan from plan_sparse_attention (SparsePlan)", type(plan).__name__, TypeError)
    if not plan.matches(q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token, k_scale):
        _explain_mismatch(c, plan, q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token, k_scale)
    inputs = dict(q_nope=q_nope, q_pe=q_pe, kv_cache=kv_cache, topk_indices=topk_indices, block_table=block_table,
                  req_id_per_token=req_id_per_token)  # fmt: skip
    sm_scale, out, lse, scale_t, ks_float = check_call(
        c, plan, q_nope, inputs, sm_scale, out, lse, k_scale, workspace, rows_name="T"
    )
    kv = kv_cache.view(plan.kv_kind) if kv_cache.dtype != plan.kv_kind else kv_cache
    if plan.debug:
        _debug_checks(c, kv, topk_indices, block_table, req_id_per_token)
    if out.numel() == 0 and lse.numel() == 0:
        return out, lse
    if plan.topk == 0:  # empty lists: no row selects a token
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    if plan.backend == "triton":
        _launch_triton(
            plan, q_nope, q_pe, kv, topk_indices, block_table, req_id_per_token, out, lse, workspace,
            float(sm_scale), ks_float, scale_t,
        )  # fmt: skip
    else:
        ref_scale = (scale_t if scale_t is not None else ks_float) if plan.kv_fp8 else None
        o, lse_ref = mla_sparse_attention_ref(
            q_nope, q_pe, kv, topk_indices, block_table, req_id_per_token, float(sm_scale), ref_scale
        )
        out.copy_(o)
        lse.copy_(lse_ref)
    return out, lse


# --------------------------------------------------------------------------- validation helpers


def _validate_tensors(c: Checker, q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token):
    """The tensors' own rules (shapes, dtypes, strides, the table kind, devices agree), with errors
    naming the argument; returns the sizes a plan for them has (``plan_sparse_attention``'s
    keywords)."""
    T, N = check_latent_inputs(c, q_nope, q_pe, kv_cache, "T")
    if q_pe is None:  # decode's tensor planner takes none; this op's always reads it
        c.tensor("q_pe", q_pe, layout="[T, N, 64]")
    c.tensor("topk_indices", topk_indices, ndim=2, layout="[T, K]", dtypes=(torch.int32,))
    if topk_indices.shape[0] != T:
        c.fail("topk_indices", f"shape [T, K] = ({T}, *) (q_nope's T)", tuple(topk_indices.shape))
    K = topk_indices.shape[1]
    if K > 1 and topk_indices.stride(1) != 1:
        c.fail("topk_indices", "column stride 1", f"strides {topk_indices.stride()}")
    paged = block_table is not None
    if paged != (req_id_per_token is not None):
        name = "req_id_per_token" if paged else "block_table"
        c.fail(name, "a tensor exactly when the other of block_table / req_id_per_token is one", "None")
    if paged:
        c.tensor("block_table", block_table, ndim=2, layout="[B, max_blocks]", dtypes=(torch.int32,))
        if block_table.shape[1] > 1 and block_table.stride(1) != 1:
            c.fail("block_table", "column stride 1", f"strides {block_table.stride()}")
        c.tensor("req_id_per_token", req_id_per_token, ndim=1, layout="[>= T]", dtypes=(torch.int32,))
        if req_id_per_token.shape[0] < T:
            c.fail("req_id_per_token", f"a 1-D tensor of at least q_nope's {T} rows", tuple(req_id_per_token.shape))
        if T > 1 and req_id_per_token.stride(0) != 1:
            c.fail("req_id_per_token", "stride 1", f"strides {req_id_per_token.stride()}")
    c.same_device(
        q_nope=q_nope,
        q_pe=q_pe,
        kv_cache=kv_cache,
        topk_indices=topk_indices,
        block_table=block_table,
        req_id_per_token=req_id_per_token,
    )
    return dict(
        num_rows=T,
        num_heads=N,
        topk=K,
        block_size=kv_cache.shape[1],
        q_dtype=q_nope.dtype,
        kv_dtype=kv_cache.dtype,
        device=q_nope.device,
        paged=paged,
    )


def plan_sparse_attention_for(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    topk_indices: torch.Tensor,
    block_table: torch.Tensor | None = None,
    req_id_per_token: torch.Tensor | None = None,
    *,
    k_scale: float | torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    **knobs: Any,
) -> SparsePlan:
    """``plan_sparse_attention`` with the sizes, dtypes, device and table kind read from a call's
    tensors (``q_nope [T, N, 512]``, ``q_pe [T, N, 64]``, ``kv_cache [num_blocks, block_size,
    576]``, ``topk_indices [T, K]``, ``block_table [B, max_blocks]`` and ``req_id_per_token [>= T]``
    or both None), the k_scale form from ``k_scale`` (a tensor: read on the device) and the split
    cap from ``workspace``; ``knobs``: the rest of ``plan_sparse_attention``'s keywords
    (kv_cache_dtype, num_splits, batch_invariant, config, backend, debug). The tensors are checked
    as ``mla_sparse_attention`` checks them."""
    c = Checker(OP)
    sizes = _validate_tensors(c, q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token)
    if isinstance(workspace, torch.Tensor) and "workspace_numel" not in knobs:
        knobs["workspace_numel"] = workspace.numel()
    knobs.setdefault("k_scale_on_device", isinstance(k_scale, torch.Tensor))
    return plan_sparse_attention(**sizes, **knobs)


def _explain_mismatch(c: Checker, plan: SparsePlan, q_nope, q_pe, kv_cache, topk_indices, block_table, req_ids,
                      k_scale) -> None:  # fmt: skip
    """Raise for tensors that ``SparsePlan.matches`` refused: their own rule first, else the plan
    field that differs."""
    sizes = _validate_tensors(c, q_nope, q_pe, kv_cache, topk_indices, block_table, req_ids)
    want = {**sizes, "k_scale_on_device": plan.kv_fp8 and isinstance(k_scale, torch.Tensor)}
    c.plan_for(plan, SparsePlan, "plan_sparse_attention", want)


def _debug_checks(c: Checker, kv, topk_indices, block_table, req_id_per_token) -> None:
    """Index checks on the host (one sync): every entry >= -1 and within the table (or the cache),
    every row that names a token belongs to a request of the table, every block-table entry an entry
    uses within the cache."""
    T, K = topk_indices.shape
    if T == 0 or K == 0:
        return
    idx = topk_indices.cpu().long()
    num_blocks, block_size = kv.shape[0], kv.shape[1]
    if block_table is None:
        cap, what = num_blocks * block_size, f"num_blocks {num_blocks} x block_size {block_size}"
    else:
        cap = block_table.shape[1] * block_size
        what = f"max_blocks {block_table.shape[1]} x block_size {block_size}"
    bad = ((idx < -1) | (idx >= cap)).nonzero()
    if bad.numel():
        t, j = int(bad[0, 0]), int(bad[0, 1])
        c.fail("topk_indices", f"-1 or an entry in [0, {cap}) ({what})", f"topk_indices[{t}, {j}] = {int(idx[t, j])}")
    if block_table is None:
        return
    req = req_id_per_token[:T].cpu().long()
    B = block_table.shape[0]
    named = (idx >= 0).any(1)
    bad = (named & ((req < 0) | (req >= B))).nonzero()
    if bad.numel():
        t = int(bad[0, 0])
        c.fail("req_id_per_token", f"a request in [0, {B}) (block_table's rows) for rows that name a token",
               f"req_id_per_token[{t}] = {int(req[t])}")  # fmt: skip
    # Entries and requests are in range here: what is left is the page each named entry uses.
    named = idx >= 0
    if not bool(named.any()):
        return
    blk = torch.where(named, idx // block_size, 0)
    rows = torch.where(named, req[:, None], 0)
    pages = block_table.cpu().long()[rows, blk]
    bad = (named & ((pages < 0) | (pages >= num_blocks))).nonzero()
    if bad.numel():
        t, j = int(bad[0, 0]), int(bad[0, 1])
        c.fail(
            "block_table",
            f"page ids in [0, {num_blocks}) (num_blocks) for every block an entry uses",
            f"block_table[{int(req[t])}, {int(blk[t, j])}] = {int(pages[t, j])} (topk_indices row {t})",
        )


def _launch_triton(
    plan: SparsePlan,
    q_nope,
    q_pe,
    kv,
    topk_indices,
    block_table,
    req_ids,
    out,
    lse,
    workspace,
    sm_scale: float,
    ks_float: float | None,
    ks_tensor: torch.Tensor | None,
) -> None:
    """Runs ``plan`` on validated tensors: the kernel, then (S > 1) mla_decode's reduce."""
    T, N, S = plan.num_rows, plan.num_heads, plan.num_splits
    a = launch_args(plan, workspace, T, lse, sm_scale, ks_float, ks_tensor)
    part_o, part_lse, s_po, s_pl = a["part_o"], a["part_lse"], a["s_po_s"], a["s_pl_s"]
    # An empty cache: every entry is then bad and nothing is read; the stand-in keeps kv's type.
    cache = kv if kv.numel() else torch.empty(1, 1, D_KV, dtype=kv.dtype, device=kv.device)
    if block_table is not None:
        bt = block_table if block_table.numel() else topk_indices
        reqs, B, cap, s_bt, s_req = (
            req_ids,
            block_table.shape[0],
            block_table.shape[1] * kv.shape[1],
            block_table.stride(0),
            req_ids.stride(0),
        )
    else:
        bt = reqs = topk_indices
        B, cap, s_bt, s_req = 0, kv.shape[0] * kv.shape[1], 0, 0
    ti = topk_indices
    # Entries and pages are int32 and the kernel checks them with 32-bit unsigned compares: bounds
    # past 2^31 - 1 exclude nothing more.
    cap, num_pages = min(cap, INT32_MAX), min(kv.shape[0], INT32_MAX)
    # Kept binaries, launched again without Triton's per-call binder (ops/_launch.py), made at the
    # plan's first run; the arguments are the kernels' runtime parameters in their order.
    launches = plan.kernel_launches
    if not launches:
        launches["kernel"] = kernel_launch(mla_sparse_attention_kernel, plan.constexprs, plan.options)
        if not plan.direct:
            launches["reduce"] = kernel_launch(mla_decode_reduce_kernel, plan.reduce.constexprs, plan.reduce.options)
    launches["kernel"](plan.grid, (
        q_nope, q_pe, cache, ti, bt, reqs, a["k_scale_ptr"], out, lse, part_o, part_lse,
        a["qk_scale"], a["out_scale"],
        T, N, plan.topk, S, plan.split_len, plan.head_blocks,
        kv.shape[1], plan.page_shift, cap, num_pages, B,
        *q_nope.stride(), *q_pe.stride(), kv.stride(0), kv.stride(1), topk_indices.stride(0), s_bt, s_req,
        *out.stride(), *lse.stride(), s_po, s_pl,
    ))  # fmt: skip
    if plan.direct:
        return
    # The reduce in its default mode: every split of the grid is the row's; seq_lens (the lists
    # stand in), capacity and the split rule are batch-invariant decode's and unread here.
    launches["reduce"](plan.reduce.grid, (
        part_o, part_lse, out, lse, ti,
        N, S, 1, 0, 0, 0, 1,
        0, s_po, s_pl, *out.stride(), *lse.stride(),
        lse, ti, lse, 0, 0, 0,  # the sink and inverse-RoPE arguments: unread
    ))  # fmt: skip


__all__ = ["mla_sparse_attention", "plan_sparse_attention_for"]
