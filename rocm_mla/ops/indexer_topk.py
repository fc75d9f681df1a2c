"""mla_indexer_topk: the lightning indexer's scores and top-k in one pass, without a logits matrix
(sparse MLA: DeepSeek-V3.2, GLM-5.x).

Kernels: rocm_mla/kernels/indexer_topk.py (Triton). Plan: rocm_mla/ops/indexer_topk_plan.py.
Reference: rocm_mla/reference/indexer_topk.py. Launch data: configs/mla_indexer_topk.json. Backend
switch: ``ROCM_MLA_BACKEND_MLA_INDEXER_TOPK``. Contract: docs/indexer.md.
"""

from __future__ import annotations

from typing import Any

import torch

from ..kernels.indexer_topk import (
    mla_indexer_candidate_mask_kernel,
    mla_indexer_candidate_select_kernel,
    mla_indexer_merge_kernel,
    mla_indexer_prefilter_kernel,
    mla_indexer_split_topk_kernel,
)
from ..mla_dims import FP8_DTYPES
from ..reference.indexer import INDEX_HEAD_DIM
from ..reference.indexer_topk import (
    SENTINEL,
    candidate_keep_ref,
    mla_indexer_candidates_ref,
    mla_indexer_logits_ref,
    topk_from_logits,
)
from ..triton_common import INT32_MAX
from ._checks import Checker
from ._launch import kernel_launch
from .indexer_topk_plan import OP, IndexerTopkPlan, plan_indexer_topk


def mla_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    block_table: torch.Tensor,
    req_id_per_token: torch.Tensor,
    kv_lens: torch.Tensor,
    candidates: torch.Tensor | None = None,
    *,
    topk: int,
    out: torch.Tensor | None = None,
    candidates_out: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    plan: IndexerTopkPlan | None = None,
) -> torch.Tensor:
    """For each query row, the request-local positions of the ``topk`` keys with the largest
    indexer logits, ``logit(t, j) = sum_h weights[t, h] x relu(q[t, h] . k_j)``.

    The logits stream through registers, split by split; no ``[T, context]`` matrix is written
    (the workspace's parts: ``IndexerTopkPlan``; sizes: docs/indexer.md).

    Args:
        q: ``[T, H, 128]`` float8_e4m3fn or float8_e4m3fnuz (H = 64 for DeepSeek-V3.2, 32 for
            GLM-5.x; any H >= 1), any row/head strides, last dim contiguous. The query's fp8 scale
            is folded into ``weights``, as vLLM passes them. The cache's values are read as q's
            kind (vLLM's V3.2 path writes both with the platform's: e4m3fnuz on gfx942), or as
            e4m3fn under an e4m3fnuz q when the plan's ``cache_kind`` says so (DeepSeek-V4's
            compressed indexer cache, OCP e4m3fn on every platform).
        weights: ``[T, H]`` float32, any strides.
        index_cache: ``[num_blocks, block_size, 132]`` uint8 (or a float8 view): the indexer key
            cache as ``indexer_k_cache_write`` (and vLLM's ROCm model path) writes it, in the
            value layout the plan names (``shuffled``).
        block_table: ``[B, max_blocks]`` int32, column stride 1: each request's pages.
        req_id_per_token: ``[>= T]`` int32, stride 1: row t's request.
        kv_lens: ``[>= T]`` int32, stride 1: the keys row t sees, positions ``[0, kv_lens[t])`` of
            its request (decode and MTP rows their context, a prefill row its position + 1).
        candidates: with a plan of ``candidate_mode="mask"`` (DeepSeek-V4.1's later index
            layers), ``[>= T, C]`` int32 (C the plan's candidate_blocks, column stride 1): row
            t's candidate blocks, ids ``position // candidate_block_size`` in any order, -1
            unused. Only the keys of listed blocks count (a NaN or a bad page elsewhere is not
            seen); an id past the row's keys covers nothing; an entry below -1 makes the row
            bad. Else None.
        topk: keys kept per row (2048 for the models; >= 1).
        out: ``[T, topk]`` int32 destination, column stride 1 (allocated when None).
        candidates_out: with a plan of ``candidate_mode="select"`` (V4.1's candidate source
            layer), ``[>= T, C]`` int32 destination (column stride 1): per row the ids of its
            min(C, cdiv(kv_len, candidate_block_size)) blocks with the largest logit (of every
            visible key; the block holding position kv_len - 1 always among them, and a block
            with a NaN logit), ties by id, in ascending order, then -1; -2 everywhere for a bad
            row (request or kv_len out of range). Rows past T are not written. Else None.
        workspace: optional contiguous int32 tensor of at least ``plan.workspace_numel`` elements;
            without it a Triton call does one ``torch.empty``.
        plan: an ``IndexerTopkPlan`` (``plan_indexer_topk`` / ``plan_indexer_topk_for``: once per
            step for every layer) holding every choice that is not a tensor: max_kv_len, the
            cache layout (shuffled) and fp8 kind (cache_kind), launch data (config), backend and
            debug. It must match the call (``IndexerTopkPlan.matches``, checked before anything
            runs; ValueError naming the field). None: ``plan_indexer_topk_for(q, index_cache, block_table, topk=topk)``
            (max_kv_len the table's ``max_blocks x block_size``, vLLM's ROCm layout rule).

    Returns:
        ``out``, the same on every backend: per row ``min(topk, kv_lens[t])`` distinct positions
        in ascending order (so the same bits on every call and in any batch), then -1. Ties in
        logit value are taken in position order. A valid top-k up to float rounding: the Triton
        logits are float32 sums, the reference's float64.

    Bad values and NaN (no host sync unless the plan's debug): nothing outside the given tensors
    is read or written; a row whose request is outside ``[0, B)``, whose kv_len is negative, past
    ``max_blocks x block_size`` or past ``plan.max_keys`` (what the splits cover, >=
    max_kv_len), or whose visible keys use a block-table entry outside ``[0, num_blocks)``, gets
    -2 in every entry (``SENTINEL``: ``mla_sparse_attention`` answers a -2 with a NaN row). So
    does a row with a NaN logit (a NaN in its q or weights, or in a key or scale it sees): a NaN
    is never dropped silently. Other rows are exact. Rows that see no key get -1 everywhere. A
    debug plan raises a ValueError naming the first bad index (kv_len past max_kv_len included).

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    if plan is None:
        plan = plan_indexer_topk_for(q, index_cache, block_table, topk=topk)
    elif not isinstance(plan, IndexerTopkPlan):
        c.fail("plan", "a plan from plan_indexer_topk (IndexerTopkPlan)", type(plan).__name__, TypeError)
    if not plan.matches(q, weights, index_cache, block_table, req_id_per_token, kv_lens, topk=topk):
        _explain_mismatch(c, plan, q, weights, index_cache, block_table, req_id_per_token, kv_lens, topk)
    T = plan.num_rows
    given_out = out
    if out is None:
        out = torch.empty(T, topk, dtype=torch.int32, device=q.device)
    else:
        c.tensor("out", out, shape=(T, topk), layout="[T, topk]", like="q's T, topk", dtypes=(torch.int32,))
        if topk > 1 and out.stride(1) != 1:
            c.fail("out", "column stride 1", f"strides {out.stride()}")
        c.writable("out", out)
    _check_candidates(c, plan, candidates, candidates_out)
    if workspace is not None:
        c.tensor("workspace", workspace, ndim=1, layout="[n] contiguous", dtypes=(torch.int32,))
        if workspace.numel() > 1 and workspace.stride(0) != 1:
            c.fail("workspace", "a contiguous tensor", f"strides {workspace.stride()}")
    c.same_device(q=q, out=out, workspace=workspace, candidates=candidates, candidates_out=candidates_out)
    c.no_overlap(
        {"out": given_out, "workspace": workspace, "candidates_out": candidates_out},
        {
            "q": q,
            "weights": weights,
            "index_cache": index_cache,
            "block_table": block_table,
            "req_id_per_token": req_id_per_token,
            "kv_lens": kv_lens,
            "candidates": candidates,
        },
    )
    if plan.debug:
        _debug_checks(c, index_cache, block_table, req_id_per_token, kv_lens, T, plan.max_kv_len)
    if T == 0:
        return out
    if plan.backend == "triton":
        if workspace is not None and workspace.numel() < plan.workspace_numel:
            c.fail(
                "workspace",
                f"a contiguous int32 tensor of >= {plan.workspace_numel} elements (plan.workspace_numel)",
                f"{workspace.numel()} elements",
            )
        _launch_triton(
            plan, q, weights, index_cache, block_table, req_id_per_token, kv_lens, out, workspace,
            candidates, candidates_out,
        )  # fmt: skip
        return out
    # The reference backend: the float64 logits once, then the answer (and the lists) from them.
    logits = mla_indexer_logits_ref(
        q, weights, index_cache, block_table, req_id_per_token, kv_lens, shuffled=plan.shuffled,
        max_keys=plan.max_keys, cache_kind=plan.cache_kind,
    )  # fmt: skip
    keep = None if candidates is None else candidate_keep_ref(candidates[:T], logits, plan.candidate_block_size)
    out.copy_(topk_from_logits(logits, topk, keep=keep))
    if candidates_out is not None:
        lists = mla_indexer_candidates_ref(
            logits, block_size=plan.candidate_block_size, num_blocks=plan.candidate_blocks
        )
        candidates_out[:T].copy_(lists)
    return out


def _check_candidates(c: Checker, plan: IndexerTopkPlan, candidates, candidates_out) -> None:
    """``candidates`` / ``candidates_out`` against the plan's candidate mode: the one it names given
    (``[>= T, candidate_blocks]`` int32, column stride 1; the output writable), the other None."""
    want = {"mask": "candidates", "select": "candidates_out"}.get(plan.candidate_mode)
    for name, x in (("candidates", candidates), ("candidates_out", candidates_out)):
        if name != want:
            if x is not None:
                goes = "mask" if name == "candidates" else "select"
                why = f"the plan's candidate_mode is {plan.candidate_mode!r}; {name} goes with {goes!r}"
                c.fail(name, f"None ({why})", f"a {type(x).__name__}")
            continue
        if x is None:
            c.fail(name, f"a [>= T, {plan.candidate_blocks}] int32 tensor (the plan's candidate_mode is "
                   f"{plan.candidate_mode!r})", "None")  # fmt: skip
        C = plan.candidate_blocks
        c.tensor(name, x, ndim=2, layout="[>= T, candidate_blocks]", dtypes=(torch.int32,))
        if x.shape[0] < plan.num_rows or x.shape[1] != C:
            c.fail(name, f"shape [>= {plan.num_rows}, {C}] (q's T, the plan's candidate_blocks)", tuple(x.shape))
        if C > 1 and x.stride(1) != 1:
            c.fail(name, "column stride 1", f"strides {x.stride()}")
        if name == "candidates_out":
            c.writable(name, x)


def _validate_tensors(c: Checker, q, index_cache, block_table, topk, shuffled=None) -> dict[str, Any]:
    """The rules of the tensors a plan is made from (q, index_cache, block_table) and of ``topk``,
    with errors naming the argument; returns their sizes as ``plan_indexer_topk`` takes them."""
    c.tensor("q", q, ndim=3, layout="[T, H, 128]", dtypes=FP8_DTYPES)
    T, H, dq = q.shape
    if dq != INDEX_HEAD_DIM:
        c.fail("q", f"shape [T, H, 128] = (*, *, {INDEX_HEAD_DIM})", tuple(q.shape))
    if H < 1:
        c.fail("q", "H >= 1 heads", tuple(q.shape))
    if q.stride(2) != 1:
        c.fail("q", "a contiguous last dim (stride 1)", f"strides {q.stride()}")
    shuffle = c.index_cache(index_cache, shuffled)
    c.tensor("block_table", block_table, ndim=2, layout="[B, max_blocks]", dtypes=(torch.int32,))
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        c.fail("block_table", "column stride 1", f"strides {block_table.stride()}")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        c.fail("topk", "an int >= 1", repr(topk), TypeError if not isinstance(topk, int) else ValueError)
    c.same_device(q=q, index_cache=index_cache, block_table=block_table)
    return dict(
        num_rows=T,
        num_heads=H,
        topk=topk,
        block_size=index_cache.shape[1],
        q_dtype=q.dtype,
        device=q.device,
        shuffled=shuffle,
    )


def plan_indexer_topk_for(
    q: torch.Tensor,
    index_cache: torch.Tensor,
    block_table: torch.Tensor,
    *,
    topk: int,
    max_kv_len: int | None = None,
    shuffled: bool | None = None,
    config: dict[str, Any] | None = None,
    backend: str | None = None,
    debug: bool | None = None,
    cache_kind: torch.dtype | None = None,
    candidate_mode: str | None = None,
    candidate_block_size: int = 0,
    candidate_blocks: int = 0,
    group_rows: int = 1,
) -> IndexerTopkPlan:
    """``plan_indexer_topk`` with the sizes, dtype and device read from a call's tensors (``q``
    ``[T, H, 128]`` fp8, ``index_cache`` ``[num_blocks, block_size, 132]``, ``block_table`` ``[B,
    max_blocks]`` int32), checked as ``mla_indexer_topk`` checks them. ``max_kv_len`` defaults
    to the table's capacity ``max_blocks x block_size``; ``shuffled`` (None: vLLM's ROCm rule),
    ``config``, ``backend``, ``debug``, ``cache_kind`` (None: q's kind; the cache's dtype does
    not tell it, a uint8 cache holds either), the candidate knobs and ``group_rows`` as
    ``plan_indexer_topk`` takes them."""
    c = Checker(OP)
    sizes = _validate_tensors(c, q, index_cache, block_table, topk, shuffled)
    if max_kv_len is None:
        max_kv_len = block_table.shape[1] * sizes["block_size"]
    c.count("max_kv_len", max_kv_len, 0)
    return plan_indexer_topk(
        **sizes, max_kv_len=max_kv_len, config=config, backend=backend, debug=debug, cache_kind=cache_kind,
        candidate_mode=candidate_mode, candidate_block_size=candidate_block_size, candidate_blocks=candidate_blocks,
        group_rows=group_rows,
    )  # fmt: skip


def _explain_mismatch(c: Checker, plan: IndexerTopkPlan, q, weights, index_cache, block_table, req_ids, kv_lens, topk):
    """Raise for a call that ``IndexerTopkPlan.matches`` refused: the tensors' own rules first
    (weights ``[T, H]`` float32, req_ids and kv_lens int32 ``[>= T]`` of stride 1), else the plan
    field that differs."""
    sizes = _validate_tensors(c, q, index_cache, block_table, topk, plan.shuffled)
    T, H = sizes["num_rows"], sizes["num_heads"]
    c.tensor("weights", weights, shape=(T, H), layout="[T, H]", like="q's T, H", dtypes=(torch.float32,))
    for name, x in (("req_id_per_token", req_ids), ("kv_lens", kv_lens)):
        c.tensor(name, x, ndim=1, layout="[>= T]", dtypes=(torch.int32,))
        if x.shape[0] < T:
            c.fail(name, f"a 1-D tensor of at least q's {T} rows", tuple(x.shape))
        if T > 1 and x.stride(0) != 1:
            c.fail(name, "stride 1", f"strides {x.stride()}")
    c.same_device(q=q, weights=weights, req_id_per_token=req_ids, kv_lens=kv_lens)
    sizes.pop("shuffled")  # the cache does not show its layout: the plan's is taken
    c.plan_for(plan, IndexerTopkPlan, "plan_indexer_topk", sizes)


def _debug_checks(c: Checker, index_cache, block_table, req_id_per_token, kv_lens, T, max_kv_len) -> None:
    """Index checks on the host (one sync): every row's request in the table, its kv_len in [0,
    min(max_blocks x block_size, max_kv_len)], every page its keys use within the cache."""
    if T == 0:
        return
    nb, bs = index_cache.shape[0], index_cache.shape[1]
    B, mb = block_table.shape
    req = req_id_per_token[:T].cpu().long()
    lens = kv_lens[:T].cpu().long()
    bad = ((req < 0) | (req >= B)).nonzero()
    if bad.numel():
        t = int(bad[0, 0])
        c.fail(
            "req_id_per_token", f"a request in [0, {B}) (block_table's rows)", f"req_id_per_token[{t}] = {int(req[t])}"
        )
    cap = min(mb * bs, max_kv_len)
    bad = ((lens < 0) | (lens > cap)).nonzero()
    if bad.numel():
        t = int(bad[0, 0])
        c.fail("kv_lens", f"values in [0, {cap}] (max_blocks {mb} x block_size {bs}, max_kv_len {max_kv_len})",
               f"kv_lens[{t}] = {int(lens[t])}")  # fmt: skip
    bt = block_table.cpu().long()
    for t in range(T):
        used = bt[int(req[t]), : -(-int(lens[t]) // bs)]
        bad = ((used < 0) | (used >= nb)).nonzero()
        if bad.numel():
            j = int(bad[0, 0])
            c.fail("block_table", f"page ids in [0, {nb}) (num_blocks) for every block a row's keys use",
                   f"block_table[{int(req[t])}, {j}] = {int(used[j])} (row {t})")  # fmt: skip


def _launch_triton(
    plan, q, weights, index_cache, block_table, req_ids, kv_lens, out, workspace, candidates, candidates_out
) -> None:
    """Runs ``plan`` on validated tensors: (candidate mask) the rows' bitmaps, the split kernel,
    then (more than one split) the prefilter (prefiltered form) and the merge, then (candidate
    select) the rows' best blocks, each through the plan's ``KernelLaunch`` (ops/_launch.py: the
    compiled kernels kept across calls; ``kernel[grid]`` under the interpreter)."""
    T, S = plan.num_rows, plan.num_splits
    # The bytes as q's fp8 kind: the kernel loads values without a bitcast (which the CPU
    # interpreter lacks for e4m3fnuz) and reads the scales through a float32 pointer. An e4m3fn
    # cache under an e4m3fnuz q (OCP_CACHE) goes as uint8: the kernel turns its codes into q's kind.
    cache = index_cache.view(torch.uint8 if plan.constexprs["OCP_CACHE"] else q.dtype)
    need = plan.workspace_numel
    ws = torch.empty(need, dtype=torch.int32, device=q.device) if workspace is None else workspace
    n_stage = plan.stage_numel
    stage = ws[:n_stage]
    bounds = counts = prefix = out  # unused unless prefiltered
    if plan.direct:
        cand_key = cand_pos = out  # unused (DIRECT never touches them)
    elif plan.prefiltered:
        parts = {k: ws[a : a + n] for k, (a, n) in plan.prefilter_layout().items()}
        cand_key, cand_pos = stage, parts["positions"]
        bounds, counts, prefix = parts["bounds"], parts["counts"], parts["prefix"]
    else:
        # The keys' view runs to the end: the merge's register-held read of the last row's slots
        # goes past its keys (into the positions and the read-ahead), all inside this view.
        n_cand = T * S * plan.topk_p2
        at = n_stage + plan.candidate_layout()[1]
        cand_key, cand_pos = ws[at:need], ws[at + n_cand : need]
    nb, bs = cache.shape[0], cache.shape[1]
    if nb == 0:  # every row's keys are then bad; the stand-in keeps a live pointer
        cache = torch.empty(1, 1, cache.shape[2], dtype=cache.dtype, device=cache.device)
    bt = block_table if block_table.numel() else kv_lens
    capacity = min(block_table.shape[1] * bs, INT32_MAX)
    c_start, c_numel = plan.candidate_layout()
    cand_part = ws[c_start : c_start + c_numel] if c_numel else out  # (unused without a mode)
    launches = plan.kernel_launches
    if not launches:
        launches["split"] = kernel_launch(mla_indexer_split_topk_kernel, plan.constexprs, plan.options)
        if plan.candidate_mode is not None:
            kern = {"mask": mla_indexer_candidate_mask_kernel, "select": mla_indexer_candidate_select_kernel}
            launches["candidates"] = kernel_launch(
                kern[plan.candidate_mode], plan.candidate_constexprs, plan.candidate_options
            )
        if plan.prefiltered:
            launches["prefilter"] = kernel_launch(
                mla_indexer_prefilter_kernel, plan.prefilter_constexprs, plan.prefilter_options
            )
        if not plan.direct:
            launches["merge"] = kernel_launch(mla_indexer_merge_kernel, plan.merge_constexprs, plan.merge_options)
    words = plan.candidate_row_words
    if plan.candidate_mode == "mask":
        launches["candidates"]((T,), (candidates, cand_part, plan.candidate_blocks, words, candidates.stride(0)))
    launches["split"](plan.grid, (
        q, weights, cache, bt, req_ids, kv_lens, out, cand_key, cand_pos, ws, bounds,  # ws: the stages first
        T, S, plan.topk, bs, plan.page_shift, capacity, min(nb, INT32_MAX), block_table.shape[0],
        q.stride(0), q.stride(1), weights.stride(0), weights.stride(1), cache.stride(0),
        block_table.stride(0), req_ids.stride(0), kv_lens.stride(0), out.stride(0),
    ))  # fmt: skip
    if plan.candidate_mode == "select":
        launches["candidates"]((T,), (
            cand_part, req_ids, kv_lens, candidates_out, plan.candidate_blocks, words, capacity, plan.max_keys,
            block_table.shape[0], req_ids.stride(0), kv_lens.stride(0), candidates_out.stride(0),
        ))  # fmt: skip
    if plan.direct:
        return
    if plan.prefiltered:
        launches["prefilter"](plan.prefilter_grid, (
            stage, bounds, counts, cand_pos, req_ids, kv_lens,
            T, S, plan.topk, capacity, block_table.shape[0], req_ids.stride(0), kv_lens.stride(0),
        ))  # fmt: skip
    launches["merge"](plan.merge_grid, (
        cand_key, cand_pos, counts, prefix, req_ids, kv_lens, out,
        T, S, plan.topk, capacity, block_table.shape[0],
        req_ids.stride(0), kv_lens.stride(0), out.stride(0),
    ))  # fmt: skip


__all__ = ["mla_indexer_topk", "plan_indexer_topk_for", "SENTINEL"]
