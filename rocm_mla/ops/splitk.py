"""The split-K model that mla_decode and mla_sparse_attention share: how many splits fill the GPU,
the workspace the float32 partials take, and the reduce that merges them.

  * ``num_compute_units``: the CUs / SMs the split model fills;
  * ``choose_num_splits``: the split count that minimises a modelled time (rows x row blocks x
    splits programs in waves over the CUs, each streaming its share of the tiles);
  * ``mla_decode_workspace_numel``: the workspace of S splits, partial outputs ``[S, R, 512]`` then
    partial lses ``[S, R]`` (R = rows x heads), float32;
  * ``stage2_meta``: the reduce's tile, constexprs and compile options (the kernel is
    ``mla_decode_reduce_kernel``; its launch data is configs/mla_decode.json's ``stage2``).

Both plans (ops/decode_plan.py, ops/sparse_plan.py) take these from here, so a split of either op
is costed and reduced the same way.
"""

from __future__ import annotations

import functools
import math

import torch
import triton

from ..configs import config_for
from ..mla_dims import KV_LORA_RANK, KV_ROW_DIM
from ..triton_common import amd_options
from ._checks import Checker

# The reduce's launch data lives with mla_decode's (configs/mla_decode.json "stage2"); its config
# errors name that op.
REDUCE_OP = "mla_decode"
D_NOPE = KV_LORA_RANK  # the partial outputs' width (V)
D_KV = KV_ROW_DIM  # a cache row: what one tile streams per token


def mla_decode_workspace_numel(rows: int, num_heads: int, num_kv_splits: int) -> int:
    """float32 elements a ``workspace=`` needs for ``num_kv_splits`` splits (0 for one split):
    partial outputs ``[S, rows*N, 512]`` then partial lses ``[S, rows*N]``."""
    if num_kv_splits <= 1:
        return 0
    return num_kv_splits * rows * num_heads * (D_NOPE + 1)


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
    partial_tiles = 2.0 * block_h * (D_NOPE + 1) * 4 / (block_n * D_KV * kv_elem_bytes)
    best_s, best = 1, math.inf
    for s in range(1, s_max + 1):
        waves = triton.cdiv(batch * row_blocks * s, slots)
        per_prog = triton.cdiv(tiles, s) + fixed_tiles + (partial_tiles if s > 1 else 0.0)
        cost = waves * per_prog + (launch_tiles if s > 1 else 0.0)
        if cost < best - 1e-9:
            best_s, best = s, cost
    return best_s


def stage2_meta(
    num_splits: int,
    arch: str,
    invariant: tuple[int, int, int] | None = None,
    rows: int | None = None,
    num_cus: int | None = None,
) -> tuple[dict, dict]:
    """``(constexprs, compile options)`` of the stage-2 reduce for ``num_splits`` splits, for the
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
        block_d = max(64, min(D_NOPE, tile // block_s))
    else:
        col_blocks = 1
        if rows is not None and num_cus is not None and rows > 0:
            col_blocks = min(D_NOPE // 64, triton.next_power_of_2(triton.cdiv(4 * num_cus, rows)))
        block_d = D_NOPE // col_blocks
        cap = int(cfg["invariant_max_block_s"])  # the split rows a tile folds without spilling (ISA report)
        if cap < 1 or cap & (cap - 1) or cap > 64:
            Checker(REDUCE_OP).fail("config stage2", "invariant_max_block_s a power of two <= 64", cap)
        block_s = max(1, min(triton.next_power_of_2(max(1, num_splits)), tile // block_d, cap))
    options = {"num_warps": int(cfg["num_warps"]), **amd_options(cfg, arch)}
    consts = {"D": D_NOPE, "BLOCK_D": block_d, "BLOCK_S": block_s}
    if invariant is not None:
        consts["INVARIANT"] = True  # the rule itself is an argument (DecodePlan.split_rule)
    return consts, options


__all__ = [
    "REDUCE_OP",
    "choose_num_splits",
    "mla_decode_workspace_numel",
    "num_compute_units",
    "stage2_meta",
]
