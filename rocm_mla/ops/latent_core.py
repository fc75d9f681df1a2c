"""The host side of the latent-attention core that mla_decode and mla_sparse_attention share (the
kernels' side is rocm_mla/kernels/latent_core.py), each piece once, so a call of either op is
checked, costed, split and reduced the same way:

  * the cache as read (``kv_kind_for``) and the inputs' rules (``check_latent_inputs``,
    ``latent_inputs_match``, ``plan_needs_kind``);
  * the call's other arguments (``check_call``) and its launch scalars (``launch_args``);
  * the split-K model (``choose_num_splits`` / ``modelled_splits`` over ``num_compute_units``,
    ``check_split_knobs``, ``mla_decode_workspace_numel``: ``[S, R, 512]`` then ``[S, R]`` float32);
  * the reduce's launch (``reduce_meta`` / ``split_reduce`` -> ``SplitReduce``, the one record
    both plans hold; launch data: configs/mla_decode.json's ``reduce``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import triton

from ..configs import config_for
from ..mla_dims import FP8_DTYPES, FP8_KV_CACHE_DTYPES, KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM
from ..triton_common import LOG2E, amd_options
from ._checks import FLOAT_DTYPES, Checker

# The kv_cache_dtype names an op that reads the latent cache takes (vLLM's, "auto" = the cache's dtype).
KV_CACHE_DTYPE_NAMES = ("auto", "bfloat16", "float16", "float32", *FP8_KV_CACHE_DTYPES)

# The reduce's launch data lives with mla_decode's (configs/mla_decode.json "reduce"); its config
# errors name that op.
REDUCE_OP = "mla_decode"
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


class LatentPlan:
    """What a latent-attention plan (``DecodePlan``, ``SparsePlan``) derives from its
    ``num_splits`` and ``kv_kind`` fields."""

    @property
    def direct(self) -> bool:
        """One split: the kernel writes out/lse itself (one launch, no workspace)."""
        return self.num_splits == 1

    @property
    def launches(self) -> int:
        return 1 if self.direct else 2

    @property
    def kv_fp8(self) -> bool:
        return self.kv_kind in FP8_DTYPES


def plan_needs_kind(c: Checker, kv_cache, maker: str) -> None:
    """A call without a plan plans from its tensors, and uint8 storage does not say its fp8 kind:
    such a call names the plan it needs (``maker``, e.g. "plan_decode")."""
    if isinstance(kv_cache, torch.Tensor) and kv_cache.dtype == torch.uint8:
        c.fail("plan", f"a plan naming the fp8 kind of a uint8 cache ({maker}(kv_cache_dtype='fp8', ...))", "None")


def latent_inputs_match(plan, rows: int, q_nope, q_pe, kv_cache) -> bool:
    """The part of a latent-attention plan's ``matches`` both ops share: ``q_nope [rows, N, 512]``
    and ``q_pe [rows, N, 64]`` in the plan's q_dtype, ``kv_cache [num_blocks, block_size, 576]`` of
    its kv_dtype with a contiguous last dim, all on its device. Host values only; the caller
    catches what is not a tensor."""
    N, dev = plan.num_heads, plan.device
    return (
        q_nope.shape == (rows, N, KV_LORA_RANK)
        and q_pe.shape == (rows, N, QK_ROPE_HEAD_DIM)
        and q_nope.dtype == plan.q_dtype
        and q_pe.dtype == plan.q_dtype
        and kv_cache.dtype == plan.kv_dtype
        and kv_cache.dim() == 3
        and kv_cache.shape[1] == plan.block_size
        and kv_cache.shape[2] == KV_ROW_DIM
        and kv_cache.stride(2) == 1
        and q_nope.device == dev
        and q_pe.device == dev
        and kv_cache.device == dev
    )


def check_latent_inputs(c: Checker, q_nope, q_pe, kv_cache, rows_name: str) -> tuple[int, int]:
    """The latent inputs' own rules, with errors naming the argument: ``q_nope [rows, N, 512]``
    float16/bfloat16/float32, ``q_pe [rows, N, 64]`` in its dtype (None: not given),
    ``kv_cache [num_blocks, block_size >= 1, 576]`` with a contiguous last dim. Returns
    ``(rows, N)``; ``rows_name``: what the op calls its rows ("rows", "T")."""
    c.tensor("q_nope", q_nope, ndim=3, layout=f"[{rows_name}, N, 512]", dtypes=FLOAT_DTYPES)
    rows, N, dq = q_nope.shape
    if dq != KV_LORA_RANK:
        c.fail("q_nope", f"last dim 512 (kv_lora_rank) in [{rows_name}, N, 512]", f"shape {tuple(q_nope.shape)}")
    if q_pe is not None:
        like = f"q_nope's {rows_name}, N"
        c.tensor("q_pe", q_pe, shape=(rows, N, QK_ROPE_HEAD_DIM), layout=f"[{rows_name}, N, 64]", like=like)
        c.same_dtype("q_nope", q_nope, q_pe=q_pe)
    c.tensor("kv_cache", kv_cache, ndim=3, layout="[num_blocks, block_size, 576]")
    if kv_cache.shape[2] != KV_ROW_DIM:
        shape = f"shape {tuple(kv_cache.shape)}"
        c.fail("kv_cache", "last dim 576 (512 + 64) in [num_blocks, block_size, 576]", shape)
    if kv_cache.shape[1] < 1:
        c.fail("kv_cache", "block_size >= 1", f"shape {tuple(kv_cache.shape)}")
    if kv_cache.stride(2) != 1:
        c.fail("kv_cache", "a contiguous last dim (stride 1)", f"strides {kv_cache.stride()}")
    return rows, N


def check_call(c: Checker, plan, q_nope, sources: dict, sm_scale, out, lse, k_scale, workspace, rows_name="rows"):
    """The arguments of a latent-attention call (mla_decode, mla_sparse_attention) beside its
    inputs, once ``plan`` matches them: sm_scale; ``out`` ``[rows, N, 512]`` in q's dtype and
    ``lse`` ``[rows, N]`` float32 (any non-overlapping strides), or fresh ``torch.empty`` ones;
    ``k_scale`` a number / None, or a one-element float32 tensor exactly when the plan reads it on
    the device (16/32-bit caches ignore it); ``workspace`` a contiguous float32 tensor of at least
    ``plan.workspace_numel`` elements; one device; no destination sharing memory with another
    argument (``sources``: the inputs by name; host pointer arithmetic, capturable). ``rows_name``:
    what the op's messages call its rows ("rows", "T").

    Returns ``(sm_scale, out, lse, k_scale tensor or None, k_scale float or None)``."""
    sm_scale = c.scale("sm_scale", sm_scale)
    given = {"out": out, "lse": lse, "workspace": workspace}
    rows, N = q_nope.shape[0], q_nope.shape[1]
    if out is None:
        out = torch.empty(rows, N, KV_LORA_RANK, dtype=q_nope.dtype, device=q_nope.device)
    else:
        c.tensor("out", out, shape=(rows, N, KV_LORA_RANK), layout=f"[{rows_name}, N, 512]", dtypes=(q_nope.dtype,),
                 like="q_nope's")  # fmt: skip
        c.writable("out", out)
    if lse is None:
        lse = torch.empty(rows, N, dtype=torch.float32, device=q_nope.device)
    else:
        like = f"q_nope's {rows_name}, N"
        c.tensor("lse", lse, shape=(rows, N), layout=f"[{rows_name}, N]", dtypes=(torch.float32,), like=like)
        c.writable("lse", lse)
    if workspace is not None:
        c.workspace(workspace, plan.workspace_numel, f"S={plan.num_splits} splits x {rows * N} rows x 513")
    scale_t = _check_k_scale(c, k_scale, plan)
    c.same_device(q_nope=q_nope, out=out, lse=lse, k_scale=scale_t, workspace=workspace)
    # Destinations (the caller's: fresh ones overlap nothing) vs everything the kernels read, e.g.
    # an out placed on cache pages that a later request reads.
    c.no_overlap(given, {**sources, "k_scale": scale_t})
    ks_float = float(k_scale) if plan.kv_fp8 and k_scale is not None and scale_t is None else None
    return sm_scale, out, lse, scale_t, ks_float


def launch_args(plan, workspace, out_rows: int, lse, sm_scale: float, ks_float, ks_tensor) -> dict[str, Any]:
    """The kernel arguments a latent-attention launch derives beside its tensors: the split
    partials (``part_o [S, R, 512]`` then ``part_lse [S, R]`` float32, R = ``out_rows`` x heads,
    carved from the caller's workspace or one ``torch.empty``; with one split they are never
    dereferenced and lse stands in) and their split strides, ``qk_scale`` = sm_scale x log2(e)
    (x a number k_scale), ``out_scale`` = that k_scale, and ``k_scale_ptr`` (the device scale, or
    a live stand-in the kernel does not read)."""
    R = out_rows * plan.num_heads
    part_o = part_lse = lse
    if not plan.direct:
        need = plan.workspace_numel
        ws = torch.empty(need, dtype=torch.float32, device=lse.device) if workspace is None else workspace.reshape(-1)
        part_o, part_lse = ws[: plan.num_splits * R * KV_LORA_RANK], ws[plan.num_splits * R * KV_LORA_RANK : need]
    ks = ks_float if ks_float is not None else 1.0
    return dict(
        part_o=part_o, part_lse=part_lse, s_po_s=0 if plan.direct else R * KV_LORA_RANK, s_pl_s=0 if plan.direct else R,
        qk_scale=sm_scale * LOG2E * ks, out_scale=ks, k_scale_ptr=ks_tensor if ks_tensor is not None else lse,
    )  # fmt: skip


def _check_k_scale(c: Checker, k_scale, plan) -> torch.Tensor | None:
    """A tensor scale (returned: read on the device) or a number / None (returns None), of the
    kind the plan reads; None for 16/32-bit caches, which ignore it."""
    if k_scale is None or (isinstance(k_scale, (int, float)) and not isinstance(k_scale, bool)):
        if k_scale is not None:
            c.scale("k_scale", k_scale)
        if plan.kv_fp8 and k_scale is not None and plan.k_scale_on_device:
            c.fail("k_scale", "a float32 tensor (the plan was made with k_scale_on_device=True)", repr(k_scale))
        return None
    if not isinstance(k_scale, torch.Tensor):
        c.fail("k_scale", "None, a float or a float32 tensor of one element", type(k_scale).__name__, TypeError)
    if k_scale.dtype != torch.float32:
        c.fail("k_scale", "dtype float32", str(k_scale.dtype).replace("torch.", ""), TypeError)
    if k_scale.numel() != 1:
        c.fail("k_scale", "one element", f"shape {tuple(k_scale.shape)}")
    if not plan.kv_fp8:
        return None
    if not plan.k_scale_on_device:
        c.fail("k_scale", "a float or None (the plan was made with k_scale_on_device=False)", "a tensor")
    return k_scale


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
    head_blocks: int,
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

    Programs = batch x head_blocks x S run in waves of ``num_cus x ctas_per_cu`` slots; each
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
        waves = triton.cdiv(batch * head_blocks * s, slots)
        per_prog = triton.cdiv(tiles, s) + fixed_tiles + (partial_tiles if s > 1 else 0.0)
        cost = waves * per_prog + (launch_tiles if s > 1 else 0.0)
        if cost < best - 1e-9:
            best_s, best = s, cost
    return best_s


def modelled_splits(
    split: dict[str, Any], groups: int, head_blocks: int, keys: int, tier: dict[str, Any], kv_bytes: int, cus: int
) -> int:
    """:func:`choose_num_splits` for ``groups`` (requests, or independent rows) of ``head_blocks``
    programs over ``keys`` keys, with an op's ``split`` config (configs' ``min_tokens_per_split``,
    ``max_splits``, ``fixed_tiles``, ``launch_tiles``) and a resolved tier's BLOCK_N, BLOCK_H and
    ``ctas_per_cu``; ``kv_bytes``: a cache element's bytes as read."""
    return choose_num_splits(
        groups, head_blocks, keys, int(tier["BLOCK_N"]), int(tier["BLOCK_H"]), kv_bytes, cus, int(tier["ctas_per_cu"]),
        int(split["min_tokens_per_split"]), int(split["max_splits"]), float(split["fixed_tiles"]),
        float(split["launch_tiles"]),
    )  # fmt: skip


def check_split_knobs(c: Checker, num_splits, batch_invariant, workspace_numel) -> None:
    """A split-K plan's knobs: ``num_splits`` None or an int >= 1, ``batch_invariant`` a bool
    (which fixes the split rule: num_splits must then be None), ``workspace_numel`` None or an
    int >= 0."""
    c.count("num_splits", num_splits, 1, optional=True)
    if not isinstance(batch_invariant, bool):
        c.fail("batch_invariant", "a bool", repr(batch_invariant), TypeError)
    if batch_invariant and num_splits is not None:
        c.fail("num_splits", "None with batch_invariant=True (the split rule is fixed)", repr(num_splits))
    c.count("workspace_numel", workspace_numel, 0, optional=True)


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
    cfg = config_for(REDUCE_OP, arch)["reduce"]
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
            Checker(REDUCE_OP).fail("config reduce", "invariant_max_block_s a power of two <= 64", cap)
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
    "LatentPlan",
    "KV_CACHE_DTYPE_NAMES",
    "REDUCE_OP",
    "check_call",
    "check_latent_inputs",
    "check_split_knobs",
    "choose_num_splits",
    "modelled_splits",
    "kv_kind_for",
    "launch_args",
    "latent_inputs_match",
    "plan_needs_kind",
    "mla_decode_workspace_numel",
    "num_compute_units",
    "reduce_meta",
    "split_reduce",
    "SplitReduce",
]
