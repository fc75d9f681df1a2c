"""mla_decode: paged MQA over the MLA latent cache (absorbed-weight decode), split-KV, in place.

Kernels: rocm_mla/kernels/mla_decode.py (Triton, stage 1 + stage 2). Reference:
rocm_mla/reference/decode.py. The wrapper validates, plans (``plan_decode``,
rocm_mla/ops/decode_plan.py: tier, split count, workspace, launch configs, decided on the host from
sizes alone so the call can be captured in a CUDA/HIP graph), then launches what the plan says:
stage 1 alone (one split: it writes out/lse), or stage 1 into a float32 workspace (``torch.empty``
per call, or the caller's ``workspace=``) and stage 2 merging the splits.
"""

from __future__ import annotations

from typing import Any

import torch

from ..kernels.mla_decode import mla_decode_reduce_kernel, mla_decode_stage1_kernel
from ..mla_dims import FP8_DTYPES, FP8_KV_CACHE_DTYPES
from ..reference.decode import mla_decode_ref, quantize_q_fp8
from ..triton_common import LOG2E
from ._checks import FLOAT_DTYPES, Checker, debug_enabled
from ._dispatch import select
from .decode_plan import D_KV, D_NOPE, D_PE, FP8_DOTS, OP, DecodePlan, plan_decode

_KV_DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32", *FP8_KV_CACHE_DTYPES)
# fp8_dots of an fp8-cache call that names none (16-bit q): the trade docs/notes/fp8-decode.md measures.
DEFAULT_FP8_DOTS = "none"


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
    kv_cache_dtype: str = "auto",
    k_scale: float | torch.Tensor | None = None,
    num_kv_splits: int | None = None,
    max_seq_len: int | None = None,
    workspace: torch.Tensor | None = None,
    backend: str | None = None,
    config: dict[str, Any] | None = None,
    debug: bool | None = None,
    quantize_q: bool = False,
    fp8_dots: str | None = None,
    batch_invariant: bool = False,
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
            float8_e4m3fn / float8_e4m3fnuz, or uint8 storage with ``kv_cache_dtype="fp8"``.
        block_table: ``[B, max_blocks]`` int32, page ids in any order; token j of request b is
            ``kv_cache[block_table[b, j // block_size], j % block_size]``. Column stride 1.
            Entries past a request's seq_len are never read. A used entry outside
            ``[0, num_blocks)`` makes that request's rows NaN (see "Bad values").
        seq_lens: ``[B]`` int32, keys per request including the new tokens. Row t of request b
            sees keys ``j <= seq_len - q_len + t`` (causal among the new tokens). A row that sees
            no key (e.g. seq_len 0 padding) gets out 0 and lse -inf. Lengths must be <= the
            table's capacity ``max_blocks x block_size``: checking that needs a host sync, so only
            ``debug=True`` does; without it the kernel clamps to the capacity (never reads past
            the table).
        sm_scale: softmax scale applied to q.k: a finite number > 0 (as in mla_prefill).
        out: optional ``[rows, N, 512]`` destination in q's dtype, any non-overlapping strides;
            every element is written (no memset needed). Allocated when None. It may not
            overlap lse, workspace or anything the op reads (q_nope, q_pe, kv_cache -- e.g. cache
            pages a request reads --, block_table, seq_lens, k_scale): ValueError naming both.
        lse: optional ``[rows, N]`` float32 destination (natural log), any strides. Allocated
            when None. Same no-overlap rule as out.
        kv_cache_dtype: "auto" (the cache's dtype; float8 dtypes mean fp8), "bfloat16",
            "float16", "float32" (must match the cache), or an fp8 name (``mla_dims``, as the KV
            write takes them): "fp8" / "fp8_e4m3" (uint8 storage is viewed as the platform's
            e4m3: e4m3fnuz on gfx942, e4m3fn elsewhere), "fp8_e4m3fn" / "fp8_e4m3fnuz" (uint8
            storage viewed as that kind; a float8 cache must be that kind).
        k_scale: fp8 dequant scale, value = stored x k_scale (K and V share it). A float, or a
            float32 tensor of one element on the device (read by the kernel: no host sync).
            Ignored for 16/32-bit caches (vLLM passes 1.0 there). None means 1.
        num_kv_splits: force the split count S (>= 1). Default: ``plan_decode``'s choice. Only
            load balance depends on it, never the result.
        max_seq_len: optional host-side upper bound of max(seq_lens) (vLLM's
            ``attn_metadata.max_seq_len``); sharpens the split choice. Default: the block table's
            capacity ``max_blocks x block_size``. A wrong hint costs speed, not correctness.
        workspace: optional float32 tensor (contiguous) for split partials, at least
            ``mla_decode_workspace_numel(rows, N, S)`` elements; without it each call with S > 1
            does one ``torch.empty`` (no memset). With a workspace and no num_kv_splits, S is
            capped to what it holds. A destination: the same no-overlap rule as out.
        backend: "triton" or "reference" to force one (default: configs' backend_order; see
            ``rocm_mla.ops._dispatch``; ``ROCM_MLA_BACKEND_MLA_DECODE`` in the environment).
            No HIP or aiter kernel exists for decode yet.
        config: override the stage-1 launch config (``BLOCK_H``, ``BLOCK_N``,
            ``num_warps``, ``num_stages``, AMD options, ``ctas_per_cu``); for tuning.
        fp8_dots: fp8 caches only: which dots run on fp8 matrix instructions (fp8 MFMA on gfx9,
            fp8 mma/wgmma on NVIDIA), an accuracy trade for speed (docs/notes/fp8-decode.md):
            ``"none"``: both dots in q's dtype, K and V converted from e4m3 in the loop;
            ``"qk"``: q rounded to the cache's e4m3 kind with one scale per (row, head) (absmax
            of its 576 values over the kind's largest value; ``reference.decode.quantize_q_fp8``
            is the exact spec) and q . k^T on fp8 operands read straight from the cache;
            ``"all"``: "qk" plus p rounded to e4m3 after the running-max subtraction (a row's
            largest weight maps to the kind's largest value) and p . v on fp8 V as stored: no
            conversion in the loop. None: ``DEFAULT_FP8_DOTS`` for fp8 caches, "none" otherwise.
            The reference backend rounds the same values (p against the global row max). Not
            for float32 q (exact products) nor 16/32-bit caches (ValueError).
        quantize_q: ``True`` is ``fp8_dots="qk"`` (FlashMLA's fp8 mode; kept for callers that
            name it).
        batch_invariant: a request's out and lse do not depend on the batch: bitwise the same
            whatever the other requests, their lengths, their order and its position (every
            cache dtype, q_len, block size, N; under CUDA/HIP graphs too). Each request is split
            by a number of keys that is a function of its own seq_len (configs/mla_decode.json
            ``batch_invariant``); the grid has enough splits for max_seq_len (else the table's
            capacity), which must then bound every seq_len (vLLM's does: graphs are captured
            with max_model_len), and the reduce reads each request's own splits in tiles of a
            fixed size; num_kv_splits must be None. A workspace must hold that split count
            (ValueError).
            docs/batch-invariance.md gives the rule and its cost. vLLM's VLLM_BATCH_INVARIANT.
        debug: validate seq_lens and block-table entries against the cache (reads device values:
            a host sync, so not capturable). Default: ``ROCM_MLA_DEBUG=1`` in the environment.

    Returns:
        ``(out, lse)``: the destinations (given or allocated).

    Bad values (debug off; no host sync): nothing outside the given tensors is read or written.
    seq_lens are clamped to the table's capacity (negative = 0). A request whose used
    block-table entries include a page outside ``[0, num_blocks)`` gets NaN out and lse in
    every row (the kernel checks a program's entries before its KV loop and then skips it, or --
    ``CLAMP_PAGES`` tiers -- clamps each tile's page into the cache and checks the entries after
    the loop: no page outside the cache is read either way); other requests are unaffected.
    ``debug=True`` raises a ValueError naming the entry and the bound instead.
    Overlap checks are host pointer arithmetic: the call stays capturable in a CUDA graph.
    Zero sizes (B = 0, N = 0, max_blocks = 0) work with or without out/lse/workspace.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    c.tensor("q_nope", q_nope, ndim=3, layout="[rows, N, 512]", dtypes=FLOAT_DTYPES)
    rows, N, dq = q_nope.shape
    if dq != D_NOPE:
        c.fail("q_nope", f"last dim {D_NOPE} (kv_lora_rank) in [rows, N, 512]", f"shape {tuple(q_nope.shape)}")
    c.tensor("q_pe", q_pe, shape=(rows, N, D_PE), layout="[rows, N, 64]", like="q_nope's rows, N")
    c.same_dtype("q_nope", q_nope, q_pe=q_pe)
    c.tensor("kv_cache", kv_cache, ndim=3, layout="[num_blocks, block_size, 576]")
    if kv_cache.shape[2] != D_KV:
        c.fail(
            "kv_cache", f"last dim {D_KV} (512 + 64) in [num_blocks, block_size, 576]", f"shape {tuple(kv_cache.shape)}"
        )
    if kv_cache.stride(2) != 1 and kv_cache.shape[2] > 1:
        c.fail("kv_cache", "a contiguous last dim (stride 1)", f"strides {kv_cache.stride()}")
    kv, is_fp8 = _kv_view(c, kv_cache, kv_cache_dtype, q_nope.dtype)
    c.tensor("block_table", block_table, ndim=2, layout="[B, max_blocks]", dtypes=(torch.int32,))
    B, max_blocks = block_table.shape
    if block_table.stride(1) != 1 and max_blocks > 1:
        c.fail("block_table", "column stride 1", f"strides {block_table.stride()}")
    c.tensor("seq_lens", seq_lens, shape=(B,), layout="[B]", like="block_table's B", dtypes=(torch.int32,))
    if B == 0 and rows != 0:
        c.fail("q_nope", "0 rows for an empty batch (block_table has B = 0)", f"{rows} rows")
    if B and rows % B:
        c.fail("q_nope", f"rows = B x q_len with uniform q_len (B = {B} from block_table)", f"{rows} rows")
    q_len = rows // B if B else 1
    sm_scale = c.scale("sm_scale", sm_scale)
    given_out, given_lse = out, lse
    out, lse = _destinations(c, out, lse, workspace, q_nope, "rows")
    scale_t = _check_k_scale(c, k_scale, q_nope.device)
    dots = _fp8_dots(c, fp8_dots, quantize_q, is_fp8, kv.dtype, q_nope.dtype)
    if num_kv_splits is not None and (
        not isinstance(num_kv_splits, int) or isinstance(num_kv_splits, bool) or num_kv_splits < 1
    ):
        c.fail("num_kv_splits", "None or an int >= 1", repr(num_kv_splits))
    if not isinstance(batch_invariant, bool):
        c.fail("batch_invariant", "a bool", repr(batch_invariant), TypeError)
    if batch_invariant and num_kv_splits is not None:
        c.fail("num_kv_splits", "None with batch_invariant=True (the split rule is fixed)", repr(num_kv_splits))
    if max_seq_len is not None and (not isinstance(max_seq_len, int) or max_seq_len < 0):
        c.fail("max_seq_len", "None or an int >= 0", repr(max_seq_len))
    c.same_device(
        q_nope=q_nope,
        q_pe=q_pe,
        kv_cache=kv_cache,
        block_table=block_table,
        seq_lens=seq_lens,
        out=out,
        lse=lse,
        k_scale=scale_t,
        workspace=workspace,
    )
    # Destinations (the caller's: fresh ones overlap nothing) vs everything the kernels read,
    # e.g. an out placed on cache pages that a later request reads. Pointer arithmetic only.
    c.no_overlap(
        {"out": given_out, "lse": given_lse, "workspace": workspace},
        {
            "q_nope": q_nope,
            "q_pe": q_pe,
            "kv_cache": kv_cache,
            "block_table": block_table,
            "seq_lens": seq_lens,
            "k_scale": scale_t,
        },
    )
    if debug_enabled(debug):
        _debug_checks(c, kv, block_table, seq_lens, q_len)

    impl = select(OP, q_nope.device, backend, has_hip=False)
    if out.numel() == 0 and lse.numel() == 0:
        return out, lse
    ks_float = None
    if is_fp8 and k_scale is not None and scale_t is None:
        ks_float = float(k_scale)
    if impl == "triton":
        plan = plan_decode(
            batch=B,
            num_heads=N,
            q_len=q_len,
            max_blocks=max_blocks,
            block_size=kv.shape[1],
            q_dtype=q_nope.dtype,
            kv_dtype=kv.dtype,
            device=q_nope.device,
            max_seq_len=max_seq_len,
            num_kv_splits=num_kv_splits,
            workspace_numel=None if workspace is None else workspace.numel(),
            config=config,
            fp8_dots=dots,
            k_scale_on_device=is_fp8 and scale_t is not None,
            batch_invariant=batch_invariant,
        )
        if workspace is not None and workspace.numel() < plan.workspace_numel:
            R = rows * N
            c.fail(
                "workspace",
                f"a contiguous float32 tensor of >= {plan.workspace_numel} elements "
                f"(S={plan.num_kv_splits} splits x {R} rows x 513)",
                f"{workspace.numel()} elements",
            )
        _launch_triton(
            plan,
            q_nope,
            q_pe,
            kv,
            block_table,
            seq_lens,
            out,
            lse,
            workspace,
            float(sm_scale),
            ks_float,
            scale_t if is_fp8 else None,
        )
    else:
        ref_scale = (scale_t if scale_t is not None else ks_float) if is_fp8 else None
        qn, qp = quantize_q_fp8(q_nope, q_pe, kv.dtype) if dots != "none" else (q_nope, q_pe)
        p_fp8 = kv.dtype if dots == "all" else None
        o, lse_ref = mla_decode_ref(qn, qp, kv, block_table, seq_lens, float(sm_scale), ref_scale, p_fp8=p_fp8)
        out.copy_(o)
        lse.copy_(lse_ref)
    return out, lse


# --------------------------------------------------------------------------- validation helpers


def _fp8_dots(c: Checker, fp8_dots, quantize_q, is_fp8: bool, kv_dtype: torch.dtype, q_dtype: torch.dtype) -> str:
    """The fp8_dots mode of a call (``FP8_DOTS``): the argument, ``quantize_q=True`` as "qk", or
    the default; "none" for 16/32-bit caches."""
    if not isinstance(quantize_q, bool):
        c.fail("quantize_q", "a bool", repr(quantize_q))
    if fp8_dots is not None and fp8_dots not in FP8_DOTS:
        c.fail("fp8_dots", f"None or one of {', '.join(map(repr, FP8_DOTS))}", repr(fp8_dots))
    if quantize_q:
        if fp8_dots not in (None, "qk"):
            c.fail("quantize_q", "quantize_q=True only with fp8_dots None or 'qk' (it means 'qk')", repr(fp8_dots))
        name, dots = "quantize_q", "qk"
    else:
        name, dots = "fp8_dots", fp8_dots
    if not is_fp8:
        if dots not in (None, "none"):
            got = f"a {str(kv_dtype).replace('torch.', '')} cache"
            c.fail(name, "an fp8 kv_cache (q and p are rounded to the cache's fp8 kind)", got)
        return "none"
    if dots is None:
        return DEFAULT_FP8_DOTS if q_dtype != torch.float32 else "none"
    if dots != "none" and q_dtype == torch.float32:
        c.fail(name, "float16 or bfloat16 q (float32 q keeps exact products)", "float32 q")
    return dots


def _destinations(c: Checker, out, lse, workspace, q_nope: torch.Tensor, rows_name: str):
    """``(out, lse)``: the caller's, checked (``[rows, N, 512]`` in q's dtype, ``[rows, N]`` float32,
    any non-overlapping strides), or fresh ``torch.empty`` ones; a workspace must be a contiguous
    float32 tensor. ``rows_name``: what the op calls its rows in messages ("rows", "T")."""
    rows, N = q_nope.shape[0], q_nope.shape[1]
    if out is None:
        out = torch.empty(rows, N, D_NOPE, dtype=q_nope.dtype, device=q_nope.device)
    else:
        layout = f"[{rows_name}, N, 512]"
        c.tensor("out", out, shape=(rows, N, D_NOPE), layout=layout, dtypes=(q_nope.dtype,), like="q_nope's")
        c.writable("out", out)
    if lse is None:
        lse = torch.empty(rows, N, dtype=torch.float32, device=q_nope.device)
    else:
        layout, like = f"[{rows_name}, N]", f"q_nope's {rows_name}, N"
        c.tensor("lse", lse, shape=(rows, N), layout=layout, dtypes=(torch.float32,), like=like)
        c.writable("lse", lse)
    if workspace is not None:
        c.tensor("workspace", workspace, layout="(float32, contiguous)", dtypes=(torch.float32,))
        if not workspace.is_contiguous():
            c.fail("workspace", "a contiguous tensor", f"strides {tuple(workspace.stride())}")
    return out, lse


def _kv_view(
    c: Checker, kv_cache: torch.Tensor, kv_cache_dtype: str, q_dtype: torch.dtype
) -> tuple[torch.Tensor, bool]:
    """The cache as the kernel reads it (uint8 fp8 viewed as e4m3), and whether it is fp8."""
    if kv_cache_dtype not in _KV_DTYPE_NAMES:
        c.fail("kv_cache_dtype", f"one of {', '.join(map(repr, _KV_DTYPE_NAMES))}", repr(kv_cache_dtype))
    dt = kv_cache.dtype
    if kv_cache_dtype in FP8_KV_CACHE_DTYPES:
        kind = c.fp8_cache_kind(kv_cache, kv_cache_dtype)
        return (kv_cache.view(kind) if dt == torch.uint8 else kv_cache), True
    if dt in FP8_DTYPES:
        if kv_cache_dtype != "auto":
            c.fail(
                "kv_cache_dtype", f"'auto' or 'fp8' for a {str(dt).replace('torch.', '')} cache", repr(kv_cache_dtype)
            )
        return kv_cache, True
    if dt == torch.uint8:
        c.fail("kv_cache_dtype", "'fp8' or 'fp8_e4m3' for a uint8 cache", repr(kv_cache_dtype))
    if kv_cache_dtype != "auto" and str(dt) != f"torch.{kv_cache_dtype}":
        c.fail("kv_cache", f"dtype {kv_cache_dtype} (kv_cache_dtype)", str(dt).replace("torch.", ""), TypeError)
    if dt != q_dtype:
        c.fail(
            "kv_cache",
            f"dtype {str(q_dtype).replace('torch.', '')} (like q_nope) or fp8",
            str(dt).replace("torch.", ""),
            TypeError,
        )
    return kv_cache, False


def _check_k_scale(c: Checker, k_scale, device: torch.device) -> torch.Tensor | None:
    """A tensor scale (returned, read on the device) or a number / None (returns None)."""
    if k_scale is None or (isinstance(k_scale, (int, float)) and not isinstance(k_scale, bool)):
        if k_scale is not None:
            c.scale("k_scale", k_scale)
        return None
    if not isinstance(k_scale, torch.Tensor):
        c.fail("k_scale", "None, a float or a float32 tensor of one element", type(k_scale).__name__, TypeError)
    if k_scale.dtype != torch.float32:
        c.fail("k_scale", "dtype float32", str(k_scale.dtype).replace("torch.", ""), TypeError)
    if k_scale.numel() != 1:
        c.fail("k_scale", "one element", f"shape {tuple(k_scale.shape)}")
    return k_scale


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
    N = plan.num_heads
    S = plan.num_kv_splits
    R = plan.batch * plan.q_len * N
    if plan.direct:
        part_o = part_lse = lse  # unused placeholders (DIRECT=True never touches them)
        s_po = s_pl = 0
    else:
        need = plan.workspace_numel
        if workspace is None:
            ws = torch.empty(need, dtype=torch.float32, device=q_nope.device)
        else:
            ws = workspace.reshape(-1)
        part_o = ws[: S * R * D_NOPE]
        part_lse = ws[S * R * D_NOPE : need]
        s_po, s_pl = R * D_NOPE, R

    qk_scale = sm_scale * LOG2E * (ks_float if ks_float is not None else 1.0)
    out_scale = ks_float if ks_float is not None else 1.0
    scale_ptr = ks_tensor if ks_tensor is not None else lse  # unused when HAS_K_SCALE_PTR=False
    page_size = kv.shape[1]
    max_blocks = block_table.shape[1]
    mla_decode_stage1_kernel[plan.stage1_grid](
        q_nope,
        q_pe,
        kv,
        block_table,
        seq_lens,
        scale_ptr,
        out,
        lse,
        part_o,
        part_lse,
        qk_scale,
        out_scale,
        N,
        plan.q_len,
        S,
        plan.split_programs,
        plan.row_blocks,
        page_size,
        plan.page_shift,
        max_blocks * page_size,
        kv.shape[0],
        *q_nope.stride(),
        *q_pe.stride(),
        kv.stride(0),
        kv.stride(1),
        block_table.stride(0),
        seq_lens.stride(0),
        *out.stride(),
        *lse.stride(),
        s_po,
        s_pl,
        **plan.stage1_constexprs,
        **plan.stage1_options,
    )
    if plan.direct:
        return
    mla_decode_reduce_kernel[plan.stage2_grid](
        part_o,
        part_lse,
        out,
        lse,
        seq_lens,
        N,
        S,
        plan.q_len,
        max_blocks * page_size,
        *plan.split_rule,
        seq_lens.stride(0),
        s_po,
        s_pl,
        *out.stride(),
        *lse.stride(),
        **plan.stage2_constexprs,
        **plan.stage2_options,
    )


__all__ = ["mla_decode", "DEFAULT_FP8_DOTS"]
