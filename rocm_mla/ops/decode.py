"""mla_decode: paged MQA over the MLA latent cache (absorbed-weight decode), split-KV, in place.

Kernels: rocm_mla/kernels/mla_decode.py (Triton, stage 1 + stage 2). Reference:
rocm_mla/reference/decode.py. Launch data: rocm_mla/configs/mla_decode.json.

What the wrapper decides on the host, without reading any device value (so the call can be
captured in a CUDA/HIP graph):
  * the stage-1 tier (BLOCK_H query rows per program) from M = q_len x N;
  * the split count S (``choose_num_splits``): a small cost model over the CU/SM count, the
    batch, the row blocks and an upper bound of the longest sequence (the ``max_seq_len`` hint,
    else the block table's capacity ``max_blocks x block_size``);
  * S == 1: stage 1 writes out/lse directly (one launch); S > 1: partials go to a float32
    workspace (``torch.empty`` per call, or the caller's ``workspace=``) and stage 2 merges them.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import triton

from .. import _platform
from ..configs import DECODE_DTYPE_TAGS, config_for, platform_fp8_dtype
from ..kernels.mla_decode import mla_decode_reduce_kernel, mla_decode_stage1_kernel
from ..mla_dims import FP8_DTYPES, FP8_KV_CACHE_DTYPES, KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM
from ..reference.decode import mla_decode_ref, quantize_q_fp8
from ..triton_common import LOG2E, amd_options
from ._checks import FLOAT_DTYPES, Checker, debug_enabled
from ._dispatch import select

OP = "mla_decode"
D_NOPE = KV_LORA_RANK  # V width and the nope part of K (the kernel's constexpr names)
D_PE = QK_ROPE_HEAD_DIM
D_KV = KV_ROW_DIM

# What an absent stage-1 config field means (rocm-mla tune compares configs with the same table).
STAGE1_DEFAULTS = {
    "D_SPLIT": 1,
    "V_SPLIT": 1,
    "RELOAD_K": False,
    "F16_DOT": False,
    "CLAMP_PAGES": False,
    "FP8_QK": False,
}

_KV_DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32", *FP8_KV_CACHE_DTYPES)


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
        num_kv_splits: force the split count S (>= 1). Default: ``choose_num_splits``. Only
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
        quantize_q: fp8 caches only (16-bit q): round q to the cache's e4m3 kind, one scale per
            (row, head) = absmax of its 576 values over the kind's largest value, and compute
            q . k^T on fp8 operands (``reference.decode.quantize_q_fp8`` is the exact spec; the
            reference backend applies it too). FlashMLA's fp8 mode; an accuracy trade: on random
            inputs out moves ~3.6% (relative norm) from the unquantised float32 result, against
            ~0.2% without it. On the H200 at N=128 it runs 1.6x faster than the fp8 default
            (perf/RESULTS.md); off by default.
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
    if out is None:
        out = torch.empty(rows, N, D_NOPE, dtype=q_nope.dtype, device=q_nope.device)
    else:
        c.tensor("out", out, shape=(rows, N, D_NOPE), layout="[rows, N, 512]", dtypes=(q_nope.dtype,), like="q_nope's")
        c.writable("out", out)
    if lse is None:
        lse = torch.empty(rows, N, dtype=torch.float32, device=q_nope.device)
    else:
        c.tensor("lse", lse, shape=(rows, N), layout="[rows, N]", dtypes=(torch.float32,), like="q_nope's rows, N")
        c.writable("lse", lse)
    if workspace is not None:
        c.tensor("workspace", workspace, layout="(float32, contiguous)", dtypes=(torch.float32,))
        if not workspace.is_contiguous():
            c.fail("workspace", "a contiguous tensor", f"strides {tuple(workspace.stride())}")
    scale_t = _check_k_scale(c, k_scale, q_nope.device)
    if not isinstance(quantize_q, bool):
        c.fail("quantize_q", "a bool", repr(quantize_q))
    if quantize_q and not is_fp8:
        got = f"a {str(kv.dtype).replace('torch.', '')} cache"
        c.fail("quantize_q", "an fp8 kv_cache (q is rounded to the cache's fp8 kind)", got)
    if quantize_q and q_nope.dtype == torch.float32:
        c.fail("quantize_q", "float16 or bfloat16 q (float32 q keeps exact products)", "float32 q")
    if num_kv_splits is not None and (
        not isinstance(num_kv_splits, int) or isinstance(num_kv_splits, bool) or num_kv_splits < 1
    ):
        c.fail("num_kv_splits", "None or an int >= 1", repr(num_kv_splits))
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
        _launch_triton(
            q_nope,
            q_pe,
            kv,
            block_table,
            seq_lens,
            out,
            lse,
            float(sm_scale),
            q_len,
            is_fp8,
            ks_float,
            scale_t if is_fp8 else None,
            num_kv_splits,
            max_seq_len,
            workspace,
            config,
            quantize_q,
        )
    else:
        ref_scale = (scale_t if scale_t is not None else ks_float) if is_fp8 else None
        qn, qp = quantize_q_fp8(q_nope, q_pe, kv.dtype) if quantize_q else (q_nope, q_pe)
        o, lse_ref = mla_decode_ref(qn, qp, kv, block_table, seq_lens, float(sm_scale), ref_scale)
        out.copy_(o)
        lse.copy_(lse_ref)
    return out, lse


# --------------------------------------------------------------------------- validation helpers


def fp8_dtype_for(arch: str) -> torch.dtype:
    """The e4m3 dtype a uint8 fp8 cache holds on ``arch`` (configs/platform.json, shared with the
    KV write; vLLM's current_platform.fp8_dtype(): e4m3fnuz on gfx942, e4m3fn on gfx950 and NVIDIA)."""
    return platform_fp8_dtype(arch)


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


def mla_decode_workspace_numel(rows: int, num_heads: int, num_kv_splits: int) -> int:
    """float32 elements a ``workspace=`` needs for ``num_kv_splits`` splits (0 for one split):
    partial outputs ``[S, rows*N, 512]`` then partial lses ``[S, rows*N]``."""
    if num_kv_splits <= 1:
        return 0
    return num_kv_splits * rows * num_heads * (D_NOPE + 1)


# --------------------------------------------------------------------------- launch decisions


@functools.cache
def _num_cus(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def num_compute_units(device: torch.device) -> int:
    """CUs (AMD) / SMs (NVIDIA) of ``device``; 4 for the CPU interpreter (no hardware to fill)."""
    if device.type != "cuda":
        return 4
    return _num_cus(device.index if device.index is not None else torch.cuda.current_device())


def stage1_tier_index(tiers: list[dict[str, Any]], rows_per_request: int) -> int:
    """Index of the stage-1 tier that serves ``rows_per_request`` query rows: the first whose
    BLOCK_H holds them all, else the last (several row blocks per request)."""
    return next((i for i, t in enumerate(tiers) if t["BLOCK_H"] >= rows_per_request), len(tiers) - 1)


def stage1_config(
    arch: str,
    rows_per_request: int,
    q_dtype: torch.dtype,
    fp8: bool,
    override: dict[str, Any] | None = None,
    quantize_q: bool = False,
) -> dict[str, Any]:
    """The stage-1 launch config for ``rows_per_request`` = q_len x N query rows.

    The first tier (configs' ``stage1``, sorted by BLOCK_H) that holds every row of a request;
    else the largest tier, with several row blocks per request. ``override`` (a tuning candidate,
    or ``config=``) replaces the tier. The chosen object's sub-objects then override fields,
    in this order: ``fp8`` (fp8 cache), ``fp8+qk`` (fp8 cache, ``quantize_q``), ``fp32`` (float32
    q), ``fp16+fp8`` (float16 q, fp8 cache). ``quantize_q`` (fp8 caches) then sets FP8_QK, which
    runs the 512 latent columns as one tile (D_SPLIT 1, V_SPLIT 1 whatever the tier says).
    """
    if override is not None:
        tier = override
    else:
        tiers = config_for(OP, arch)["stage1"]
        tier = tiers[stage1_tier_index(tiers, rows_per_request)]
    cfg = {k: v for k, v in tier.items() if k not in DECODE_DTYPE_TAGS}
    qk = quantize_q and fp8 and q_dtype != torch.float32  # float32 q keeps exact products
    tags = (
        (["fp8"] if fp8 else [])
        + (["fp8+qk"] if qk else [])
        + (["fp32"] if q_dtype == torch.float32 else [])
        + (["fp16+fp8"] if fp8 and q_dtype == torch.float16 else [])
    )
    for tag in tags:
        cfg.update(tier.get(tag, {}))
    cfg.setdefault("ctas_per_cu", 1)
    if "FP8_QK" in cfg:  # an accuracy trade the caller asks for by name, never a tuning field
        got = f"FP8_QK={cfg['FP8_QK']!r}"
        raise ValueError(f"{OP}: config: expected no FP8_QK entry (quantize_q=True sets it), got {got}")
    if qk:
        cfg.update(FP8_QK=True, D_SPLIT=1, V_SPLIT=1)
    for key in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages"):
        if key not in cfg:
            raise ValueError(f"{OP}: config: expected a {key} entry, got keys {sorted(cfg)}")
    return cfg


@functools.lru_cache(maxsize=4096)
def choose_num_splits(
    batch: int,
    row_blocks: int,
    max_seq_len: int,
    block_n: int,
    block_h: int,
    kv_elem_bytes: int,
    num_cus: int,
    ctas_per_cu: int,
    min_tokens_per_split: int,
    max_splits: int,
    fixed_tiles: float,
    launch_tiles: float,
) -> int:
    """Split count S that minimises a modelled time, in units of one program streaming one KV tile.

    Programs = batch x row_blocks x S run in waves of ``num_cus x ctas_per_cu`` slots; each
    streams ``cdiv(tiles, S)`` tiles (tiles = cdiv(max_seq_len, block_n)) plus ``fixed_tiles`` of
    prologue/epilogue. S > 1 adds, per program, the float32 partial written and read back
    (2 x block_h x 513 x 4 bytes, in tiles of block_n x 576 x kv_elem_bytes) and one stage-2
    launch (``launch_tiles``). S ranges over 1 .. min(max_splits, cdiv(max_seq_len,
    min_tokens_per_split)); ties go to fewer splits. Examples with the sm90 config (132 SMs,
    1 program/SM, block_n 64, max_splits 64): B=128, N=16, seq 4096 -> 1 (one launch: 128
    programs already fill the GPU); B=32 -> 4 (128 programs); B=1 -> 64 (one tile per program:
    latency-bound, two launches).
    """
    if batch <= 0 or max_seq_len <= 0:
        return 1
    slots = max(1, num_cus * ctas_per_cu)
    tiles = triton.cdiv(max_seq_len, block_n)
    s_max = max(1, min(max_splits, triton.cdiv(max_seq_len, max(1, min_tokens_per_split)), tiles))
    partial_tiles = 2.0 * block_h * (D_NOPE + 1) * 4 / (block_n * D_KV * kv_elem_bytes)
    best_s, best = 1, math.inf
    for s in range(1, s_max + 1):
        waves = triton.cdiv(batch * row_blocks * s, slots)
        per_prog = triton.cdiv(tiles, s) + fixed_tiles + (partial_tiles if s > 1 else 0.0)
        cost = waves * per_prog + (launch_tiles if s > 1 else 0.0)
        if cost < best - 1e-9:
            best_s, best = s, cost
    return best_s


def _num_xcds(arch: str) -> int:
    """Dies dealt workgroups round-robin (configs' ``num_xcds``; 1 = no remap). The remap is
    applied whatever the row-block count (harmless with one), so one compiled kernel per config."""
    return int(config_for(OP, arch).get("num_xcds", 1))


def stage2_meta(num_splits: int, arch: str) -> tuple[dict, dict]:
    """``(constexprs, compile options)`` of the stage-2 reduce for ``num_splits`` splits, for the
    launch and the ISA report alike. Reduce tile: BLOCK_S splits x BLOCK_D columns with
    BLOCK_S x BLOCK_D <= tile_elems, so a long split list is read in few, wide steps (each step
    waits for its loads once)."""
    cfg = config_for(OP, arch)["stage2"]
    block_s = min(triton.next_power_of_2(max(1, num_splits)), int(cfg["max_block_s"]))
    block_d = max(64, min(D_NOPE, int(cfg["tile_elems"]) // block_s))
    options = {"num_warps": int(cfg["num_warps"]), **amd_options(cfg, arch)}
    return {"D": D_NOPE, "BLOCK_D": block_d, "BLOCK_S": block_s}, options


def decode_plan(
    *,
    batch: int,
    num_heads: int,
    q_len: int,
    max_blocks: int,
    block_size: int,
    q_dtype: torch.dtype,
    kv_fp8: bool,
    kv_elem_bytes: int,
    device: torch.device,
    max_seq_len: int | None = None,
    num_kv_splits: int | None = None,
    config: dict[str, Any] | None = None,
    quantize_q: bool = False,
) -> dict[str, Any]:
    """What a call with these shapes launches, decided on the host from shapes alone:
    ``{"config": stage-1 config, "row_blocks": int, "num_kv_splits": S, "launches": 1 or 2}``.
    (perf/bench_decode.py prints it next to each timing.)"""
    arch = _platform.device_arch(device)
    m_rows = q_len * num_heads
    cfg = stage1_config(arch, m_rows, q_dtype, kv_fp8, config, quantize_q=quantize_q)
    row_blocks = triton.cdiv(m_rows, int(cfg["BLOCK_H"]))
    S = num_kv_splits
    if S is None:
        sp = config_for(OP, arch)["split"]
        cap = max_blocks * block_size
        bound = cap if max_seq_len is None else min(max_seq_len, cap)
        # V_SPLIT programs share each row block's tiles: they count as row blocks for the model.
        S = choose_num_splits(
            batch,
            row_blocks * int(cfg.get("V_SPLIT", STAGE1_DEFAULTS["V_SPLIT"])),
            bound,
            int(cfg["BLOCK_N"]),
            int(cfg["BLOCK_H"]),
            kv_elem_bytes,
            num_compute_units(device),
            int(cfg["ctas_per_cu"]),
            int(sp["min_tokens_per_split"]),
            int(sp["max_splits"]),
            float(sp["fixed_tiles"]),
            float(sp["launch_tiles"]),
        )
    return {"config": cfg, "row_blocks": row_blocks, "num_kv_splits": S, "launches": 1 if S == 1 else 2}


def page_mode_for(page_size: int, block_n: int) -> tuple[int, int]:
    """Stage 1's PAGE_MODE and page_shift for a cache page size and a tile of block_n tokens:
    (2, 0) when every tile lies in one page (page_size a multiple of block_n), (1, log2) for other
    powers of two, (0, 0) otherwise (see the kernel's docstring)."""
    if page_size % block_n == 0:
        return 2, 0
    if page_size & (page_size - 1) == 0:
        return 1, page_size.bit_length() - 1
    return 0, 0


def stage1_meta(
    arch: str,
    cfg: dict[str, Any],
    q_dtype: torch.dtype,
    kv_fp8: bool,
    *,
    direct: bool,
    has_scale_ptr: bool,
    page_mode: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(constexprs, compile options)`` of one stage-1 launch: the single place both the wrapper's
    launch and the ISA report's variants take them from, so what the report compiles is what runs."""
    field = {**STAGE1_DEFAULTS, **cfg}
    v_split = int(field["V_SPLIT"])
    consts = {
        "D_NOPE": D_NOPE,
        "D_PE": D_PE,
        "BLOCK_H": int(cfg["BLOCK_H"]),
        "BLOCK_N": int(cfg["BLOCK_N"]),
        "DIRECT": bool(direct),
        "HAS_K_SCALE_PTR": bool(has_scale_ptr),
        "IEEE": q_dtype == torch.float32,
        "D_SPLIT": 2 if v_split == 2 else int(field["D_SPLIT"]),
        "RELOAD_K": bool(field["RELOAD_K"]),
        "NUM_XCDS": _num_xcds(arch),
        "F16_DOT": bool(kv_fp8 and q_dtype == torch.bfloat16 and field["F16_DOT"]),
        "PAGE_MODE": int(page_mode),
        "V_SPLIT": v_split,
        "CLAMP_PAGES": bool(field["CLAMP_PAGES"]) and page_mode == 2,  # the kernel's LATE: labels say what runs
        "FP8_QK": bool(kv_fp8 and q_dtype != torch.float32 and field["FP8_QK"]),
        # The Triton interpreter's float -> e4m3 conversion is wrong near exponent boundaries.
        "Q8_INT": arch == "cpu" or _platform.interpreter_active(),
    }
    options = {"num_warps": int(cfg["num_warps"]), "num_stages": int(cfg["num_stages"]), **amd_options(cfg, arch)}
    return consts, options


def _launch_triton(
    q_nope,
    q_pe,
    kv,
    block_table,
    seq_lens,
    out,
    lse,
    sm_scale,
    q_len,
    is_fp8,
    ks_float,
    ks_tensor,
    num_kv_splits,
    max_seq_len,
    workspace,
    config,
    quantize_q,
):
    rows, N, _ = q_nope.shape
    B, max_blocks = block_table.shape
    page_size = kv.shape[1]
    arch = _platform.device_arch(q_nope.device)
    R = rows * N
    plan = decode_plan(
        batch=B,
        num_heads=N,
        q_len=q_len,
        max_blocks=max_blocks,
        block_size=page_size,
        q_dtype=q_nope.dtype,
        kv_fp8=is_fp8,
        kv_elem_bytes=kv.element_size(),
        device=q_nope.device,
        max_seq_len=max_seq_len,
        num_kv_splits=num_kv_splits,
        config=config,
        quantize_q=quantize_q,
    )
    cfg, row_blocks, S = plan["config"], plan["row_blocks"], plan["num_kv_splits"]
    block_n = int(cfg["BLOCK_N"])
    if num_kv_splits is None and workspace is not None:
        S = max(1, min(S, workspace.numel() // max(1, R * (D_NOPE + 1))))
    direct = S == 1
    if direct:
        part_o = part_lse = lse  # unused placeholders (DIRECT=True never touches them)
        s_po = s_pl = 0
    else:
        need = mla_decode_workspace_numel(rows, N, S)
        if workspace is None:
            ws = torch.empty(need, dtype=torch.float32, device=q_nope.device)
        else:
            if workspace.numel() < need:  # dtype and layout: checked by the wrapper
                raise ValueError(
                    f"{OP}: workspace: expected a contiguous float32 tensor of >= {need} elements "
                    f"(S={S} splits x {R} rows x 513), got {workspace.numel()} elements"
                )
            ws = workspace.reshape(-1)
        part_o = ws[: S * R * D_NOPE]
        part_lse = ws[S * R * D_NOPE : need]
        s_po, s_pl = R * D_NOPE, R

    qk_scale = sm_scale * LOG2E * (ks_float if ks_float is not None else 1.0)
    out_scale = ks_float if ks_float is not None else 1.0
    scale_ptr = ks_tensor if ks_tensor is not None else lse  # unused when HAS_K_SCALE_PTR=False
    page_mode, page_shift = page_mode_for(page_size, block_n)
    consts, options = stage1_meta(
        arch, cfg, q_nope.dtype, is_fp8, direct=direct, has_scale_ptr=ks_tensor is not None, page_mode=page_mode
    )
    grid = (B * S * row_blocks * consts["V_SPLIT"],)
    mla_decode_stage1_kernel[grid](
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
        q_len,
        S,
        row_blocks,
        page_size,
        page_shift,
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
        **consts,
        **options,
    )
    if direct:
        return
    consts, options2 = stage2_meta(S, arch)
    mla_decode_reduce_kernel[(R, D_NOPE // consts["BLOCK_D"])](
        part_o, part_lse, out, lse, N, S, s_po, s_pl, *out.stride(), *lse.stride(), **consts, **options2
    )


__all__ = [
    "mla_decode",
    "mla_decode_workspace_numel",
    "choose_num_splits",
    "stage1_config",
    "decode_plan",
    "stage1_meta",
    "stage2_meta",
    "fp8_dtype_for",
]
