"""The host side of the latent-attention core that mla_decode and mla_sparse_attention share (the
kernels' side is rocm_mla/kernels/latent_core.py): how a call reads the latent cache, the split-K
model, and the checks of the destinations both ops write.

  * ``kv_kind_for``: the cache's dtype as the kernels read it (uint8 storage of a named fp8 kind
    viewed as that kind) and whether it is fp8;
  * ``destinations`` / ``check_k_scale`` / ``check_workspace``: the out / lse / workspace / k_scale
    rules of both ops;

  * ``num_compute_units``: the CUs / SMs the split model fills;
  * ``choose_num_splits``: the split count that minimises a modelled time (rows x row blocks x
    splits programs in waves over the CUs, each streaming its share of the tiles);
  * ``mla_decode_workspace_numel``: the workspace of S splits, partial outputs ``[S, R, 512]`` then
    partial lses ``[S, R]`` (R = rows x heads), float32;
  * ``reduce_meta`` / ``split_reduce``: the reduce's tile, constexprs, compile options and grid
    (``SplitReduce``, the one launch record both plans hold; the kernel is
    ``mla_decode_reduce_kernel``; its launch data is configs/mla_decode.json's ``stage2``).

Both ops and their plans (ops/decode*.py, ops/sparse*.py) take these from here, so a split of
either op is costed, checked and reduced the same way.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import triton

from ..configs import config_for
from ..mla_dims import FP8_DTYPES, FP8_KV_CACHE_DTYPES, KV_LORA_RANK, KV_ROW_DIM
from ..triton_common import amd_options
from ._checks import Checker

# The kv_cache_dtype names an op that reads the latent cache takes (vLLM's, "auto" = the cache's dtype).
KV_CACHE_DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32", *FP8_KV_CACHE_DTYPES)

# The reduce's launch data lives with mla_decode's (configs/mla_decode.json "stage2"); its config
# errors name that op.
REDUCE_OP = "mla_decode"
KV_LORA_RANK = KV_LORA_RANK  # the partial outputs' width (V)
D_KV = KV_ROW_DIM  # a cache row: what one tile streams per token


def kv_kind_for(
    c: Checker, dt: torch.dtype, kv_cache_dtype: str, q_dtype: torch.dtype, arch: str
) -> tuple[torch.dtype, bool]:
    """The cache's dtype as the kernel reads it (uint8 storage of a named fp8 kind viewed as that
    kind) and whether it is fp8, for a cache tensor of dtype ``dt`` (errors name ``kv_cache``)."""
    if kv_cache_dtype not in KV_CACHE_DTYPE_NAMES:
        c.fail("kv_cache_dtype", f"one of {', '.join(map(repr, KV_CACHE_DTYPE_NAMES))}", repr(kv_cache_dtype))
    if kv_cache_dtype in FP8_KV_CACHE_DTYPES:
        return c.fp8_kind_of(dt, arch, kv_cache_dtype), True
    if dt in FP8_DTYPES:
        if kv_cache_dtype != "auto":
            name = str(dt).replace("torch.", "")
            c.fail("kv_cache_dtype", f"'auto' or 'fp8' for a {name} cache", repr(kv_cache_dtype))
        return dt, True
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
    return dt, False


def destinations(c: Checker, out, lse, workspace, q_nope: torch.Tensor, rows_name: str):
    """``(out, lse)``: the caller's, checked (``[rows, N, 512]`` in q's dtype, ``[rows, N]`` float32,
    any non-overlapping strides), or fresh ``torch.empty`` ones; a workspace must be a contiguous
    float32 tensor. ``rows_name``: what the op calls its rows in messages ("rows", "T")."""
    rows, N = q_nope.shape[0], q_nope.shape[1]
    if out is None:
        out = torch.empty(rows, N, KV_LORA_RANK, dtype=q_nope.dtype, device=q_nope.device)
    else:
        layout = f"[{rows_name}, N, 512]"
        c.tensor("out", out, shape=(rows, N, KV_LORA_RANK), layout=layout, dtypes=(q_nope.dtype,), like="q_nope's")
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


def check_k_scale(c: Checker, k_scale) -> torch.Tensor | None:
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


def check_workspace(c: Checker, workspace: torch.Tensor | None, numel: int, splits: int, rows: int) -> None:
    """A caller's workspace holds the plan's ``numel`` float32 elements (``splits`` x ``rows`` rows
    x 513: the partial outputs and lses)."""
    if workspace is not None and workspace.numel() < numel:
        c.fail(
            "workspace",
            f"a contiguous float32 tensor of >= {numel} elements (S={splits} splits x {rows} rows x 513)",
            f"{workspace.numel()} elements",
        )


def mla_decode_workspace_numel(rows: int, num_heads: int, num_splits: int) -> int:
    """float32 elements a ``workspace=`` needs for ``num_splits`` splits (0 for one split):
    partial outputs ``[S, rows*N, 512]`` then partial lses ``[S, rows*N]``."""
    if num_splits <= 1:
        return 0
    return num_splits * rows * num_heads * (KV_LORA_RANK + 1)


@functools.cache
def _num_cus(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def num_compute_units(device: torch.device) -> int:
    """CUs (AMD) / SMs (NVIDIA) of ``device``; 4 for the CPU interpreter (no hardware to fill)."""
    if device.type != "cuda":
        return 4
    return _num_cus(device.index if device.index is not None else torch.cuda.current_device())


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
    partial_tiles = 2.0 * block_h * (KV_LORA_RANK + 1) * 4 / (block_n * D_KV * kv_elem_bytes)
    best_s, best = 1, math.inf
    for s in range(1, s_max + 1):
        waves = triton.cdiv(batch * row_blocks * s, slots)
        per_prog = triton.cdiv(tiles, s) + fixed_tiles + (partial_tiles if s > 1 else 0.0)
        cost = waves * per_prog + (launch_tiles if s > 1 else 0.0)
        if cost < best - 1e-9:
            best_s, best = s, cost
    return best_s


def reduce_meta(
    num_splits: int,
    arch: str,
    invariant: tuple[int, int, int] | None = None,
    rows: int | None = None,
    num_cus: int | None = None,
) -> tuple[dict, dict]:
    """``(constexprs, compile options)`` of the split-K reduce for ``num_splits`` splits, for the
    launch and the ISA report alike. Reduce tile: BLOCK_S splits x BLOCK_D columns with
    BLOCK_S x BLOCK_D <= tile_elems, so a long split list is read in few, wide steps (each step
    waits for its loads once). ``invariant``: the batch-invariant mode's ``(split_tokens,
    max_splits, block_n)``: the reduce then reads each request's own splits and sums them one after
    another (the bits do not depend on the tile), so the tile follows the batch: with ``rows``
    (R = B x q_len x N) below 4 programs per CU of ``num_cus``, the 512 columns are cut into up
    to 8 blocks (more programs in flight for a small batch); otherwise one program per row; at most
    ``invariant_max_block_s`` split rows a tile (the tile is held whole while its rows are taken
    apart: gfx942 and gfx950 cap it at 16)."""
    cfg = config_for(REDUCE_OP, arch)["stage2"]
    tile = int(cfg["tile_elems"])
    if invariant is None:
        block_s = min(triton.next_power_of_2(max(1, num_splits)), int(cfg["max_block_s"]))
        block_d = max(64, min(KV_LORA_RANK, tile // block_s))
    else:
        col_blocks = 1
        if rows is not None and num_cus is not None and rows > 0:
            col_blocks = min(KV_LORA_RANK // 64, triton.next_power_of_2(triton.cdiv(4 * num_cus, rows)))
        block_d = KV_LORA_RANK // col_blocks
        cap = int(cfg["invariant_max_block_s"])  # the split rows a tile folds without spilling (ISA report)
        if cap < 1 or cap & (cap - 1) or cap > 64:
            Checker(REDUCE_OP).fail("config stage2", "invariant_max_block_s a power of two <= 64", cap)
        block_s = max(1, min(triton.next_power_of_2(max(1, num_splits)), tile // block_d, cap))
    options = {"num_warps": int(cfg["num_warps"]), **amd_options(cfg, arch)}
    consts = {"D": KV_LORA_RANK, "BLOCK_D": block_d, "BLOCK_S": block_s}
    if invariant is not None:
        consts["INVARIANT"] = True  # the rule itself is an argument (DecodePlan.split_rule)
    return consts, options


@dataclass(frozen=True)
class SplitReduce:
    """One launch of the split-K reduce (``mla_decode_reduce_kernel``, kernels/latent_core.py), as
    ``DecodePlan.reduce`` and ``SparsePlan.reduce`` hold it: ``grid = (R, 512 / BLOCK_D)`` programs
    (R = rows x heads), the constexprs and the compile options."""

    grid: tuple[int, int]
    constexprs: dict[str, Any]
    options: dict[str, Any]


def split_reduce(
    num_splits: int,
    arch: str,
    rows: int,
    invariant: tuple[int, int, int] | None = None,
    num_cus: int | None = None,
) -> SplitReduce:
    """The reduce launch that merges ``num_splits`` splits of ``rows`` (rows x heads) partial rows:
    ``reduce_meta``'s tile (``invariant`` and ``num_cus`` as it takes them) and its grid."""
    consts, options = reduce_meta(num_splits, arch, invariant, rows=rows, num_cus=num_cus)
    return SplitReduce((rows, KV_LORA_RANK // consts["BLOCK_D"]), consts, options)


__all__ = [
    "KV_CACHE_DTYPE_NAMES",
    "REDUCE_OP",
    "check_k_scale",
    "check_workspace",
    "choose_num_splits",
    "destinations",
    "kv_kind_for",
    "mla_decode_workspace_numel",
    "num_compute_units",
    "reduce_meta",
    "split_reduce",
    "SplitReduce",
]
