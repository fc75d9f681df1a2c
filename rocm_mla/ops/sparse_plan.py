"""mla_sparse_attention's plan: what a call launches, decided on the host from the call's sizes,
dtypes and device alone (no device value is read, so the call can be captured in a CUDA/HIP graph).

``plan_sparse_attention(...) -> SparsePlan`` (flashinfer's plan/run split): the op validates, plans
(or takes a caller's plan, made once for many layers), then launches what the plan says:

  * the tier (BLOCK_H heads per program) from N (``tier_config``; configs' ``tiers``);
  * the split of each row's K list over programs: the default mode fills the GPU from the rows,
    the head blocks and K (mla_decode's cost model, ``choose_num_splits``): one split when rows x
    head blocks fill it, up to ``max_splits`` for a lone decode row; ``batch_invariant=True`` cuts
    every list into splits of ``split_tokens`` entries, a function of K alone, so a row's bits do
    not depend on the batch (the reduce's tile follows the split count, which then follows K);
  * one split: the kernel writes out/lse itself; more: float32 partials into a workspace
    (``mla_decode_workspace_numel`` elements, mla_decode's layout) and mla_decode's reduce;
  * each launch's grid, constexprs and compile options (``kernel_meta``; the ISA report compiles
    its variants from the same function, so what it reports is what runs).

Launch data: rocm_mla/configs/mla_sparse_attention.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton

from .. import _platform
from ..configs import SPARSE_DTYPE_TAGS, config_for
from ..mla_dims import FP8_DTYPES, KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM
from ..triton_common import amd_options
from .decode_plan import choose_num_splits, mla_decode_workspace_numel, num_compute_units, stage2_meta

OP = "mla_sparse_attention"
D_NOPE = KV_LORA_RANK
D_PE = QK_ROPE_HEAD_DIM
D_KV = KV_ROW_DIM
# What an absent tier field means.
TIER_DEFAULTS = {"D_SPLIT": 1, "F16_DOT": False, "RELOAD_K": False, "ctas_per_cu": 1}


def tier_index(tiers: list[dict[str, Any]], num_heads: int) -> int:
    """Index of the tier that serves ``num_heads``: the first whose BLOCK_H holds them all, else the
    last (several head blocks per row)."""
    return next((i for i, t in enumerate(tiers) if t["BLOCK_H"] >= num_heads), len(tiers) - 1)


def tier_config(
    arch: str, num_heads: int, q_dtype: torch.dtype, fp8: bool, override: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The resolved launch config for ``num_heads`` heads: the tier (or ``override``, a tuning
    candidate / ``config=``), then its ``fp8`` (fp8 cache) and ``fp32`` (float32 q) sub-objects,
    then the defaults of absent fields."""
    if override is not None:
        tier = override
    else:
        tiers = config_for(OP, arch)["tiers"]
        tier = tiers[tier_index(tiers, num_heads)]
    cfg = {**TIER_DEFAULTS, **{k: v for k, v in tier.items() if k not in SPARSE_DTYPE_TAGS}}
    for tag, on in (("fp8", fp8), ("fp32", q_dtype == torch.float32)):
        if on:
            cfg.update(tier.get(tag, {}))
    for key in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages"):
        if key not in cfg:
            raise ValueError(f"{OP}: config: expected a {key} entry, got keys {sorted(cfg)}")
    if int(cfg["D_SPLIT"]) not in (1, 2):
        raise ValueError(f"{OP}: config: expected D_SPLIT 1 or 2, got {cfg['D_SPLIT']!r}")
    for key in ("BLOCK_H", "BLOCK_N"):
        v = int(cfg[key])
        if v < 16 or v & (v - 1):
            raise ValueError(f"{OP}: config: expected {key} a power of two >= 16 (tl.dot), got {v}")
    return cfg


def kernel_meta(
    arch: str,
    cfg: dict[str, Any],
    q_dtype: torch.dtype,
    kv_fp8: bool,
    *,
    direct: bool,
    has_scale_ptr: bool,
    paged: bool,
    pow2_page: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(constexprs, compile options)`` of one launch of the kernel: the single place the op's
    launch and the ISA report's variants take them from."""
    consts = {
        "D_NOPE": D_NOPE,
        "D_PE": D_PE,
        "BLOCK_H": int(cfg["BLOCK_H"]),
        "BLOCK_N": int(cfg["BLOCK_N"]),
        "D_SPLIT": int(cfg.get("D_SPLIT", 1)),
        "DIRECT": bool(direct),
        "HAS_K_SCALE_PTR": bool(has_scale_ptr),
        "IEEE": q_dtype == torch.float32,
        "PAGED": bool(paged),
        "POW2_PAGE": bool(pow2_page),
        "F16_DOT": bool(kv_fp8 and q_dtype == torch.bfloat16 and cfg.get("F16_DOT", False)),
        "RELOAD_K": bool(cfg.get("RELOAD_K", False)),
        "NUM_XCDS": int(config_for(OP, arch).get("num_xcds", 1)),
    }
    options = {"num_warps": int(cfg["num_warps"]), "num_stages": int(cfg["num_stages"]), **amd_options(cfg, arch)}
    return consts, options


def invariant_split_len(arch: str, cfg: dict[str, Any]) -> int:
    """Entries per split in batch-invariant mode: configs' ``batch_invariant.split_tokens`` rounded
    up to the tile (BLOCK_N)."""
    tokens = int(config_for(OP, arch)["batch_invariant"]["split_tokens"])
    if tokens < 1:
        raise ValueError(f"{OP}: config batch_invariant: expected split_tokens >= 1, got {tokens}")
    block_n = int(cfg["BLOCK_N"])
    return triton.cdiv(tokens, block_n) * block_n


@dataclass(frozen=True)
class SparsePlan:
    """What one mla_sparse_attention call launches (``plan_sparse_attention`` makes it).

    The kernel runs ``grid = (num_rows x num_splits x head_blocks,)`` programs, each BLOCK_H heads
    of one row over ``split_len`` entries of its list. With ``num_splits == 1`` it writes out
    ``[T, N, 512]`` and lse ``[T, N]``; otherwise float32 partials into a workspace of
    ``workspace_numel`` elements (``[S, T x N, 512]`` then ``[S, T x N]``) that mla_decode's reduce
    (``reduce_grid``) merges into out and lse. A plan serves every call with the same sizes,
    dtypes, device and table kind (``paged``), e.g. every layer of a step.
    """

    arch: str
    num_cus: int
    num_rows: int  # T
    num_heads: int  # N
    topk: int  # K
    block_size: int
    paged: bool  # entries are request-local positions (block table) rather than global slots
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    k_scale_on_device: bool
    tier: int | None  # index into configs' tiers; None when config= replaces the tier
    config: dict[str, Any]
    head_blocks: int
    num_splits: int  # S
    split_len: int  # list entries per split (a multiple of BLOCK_N)
    workspace_numel: int
    page_shift: int  # log2(block_size) when it is a power of two, else 0
    grid: tuple[int]
    constexprs: dict[str, Any]
    options: dict[str, Any]
    reduce_grid: tuple[int, int] | None
    reduce_constexprs: dict[str, Any] | None
    reduce_options: dict[str, Any] | None
    batch_invariant: bool = False

    @property
    def direct(self) -> bool:
        return self.num_splits == 1

    @property
    def launches(self) -> int:
        return 1 if self.direct else 2


def plan_sparse_attention(
    *,
    num_rows: int,
    num_heads: int,
    topk: int,
    block_size: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    device: torch.device,
    paged: bool = True,
    num_splits: int | None = None,
    workspace_numel: int | None = None,
    config: dict[str, Any] | None = None,
    k_scale_on_device: bool = False,
    batch_invariant: bool = False,
) -> SparsePlan:
    """The launches of an mla_sparse_attention call with these sizes, from the sizes alone.

    Args:
        num_rows: T, the query rows (``q_nope [T, N, 512]``; decode, MTP and prefill rows alike).
        num_heads: N (1 .. 128, or more: several head blocks per row).
        topk: K, the entries per row (``topk_indices [T, K]``).
        block_size: tokens per cache page (``kv_cache [num_blocks, block_size, 576]``).
        q_dtype: float16, bfloat16 or float32.
        kv_dtype: the cache's dtype as read: q's dtype, or an fp8 e4m3 kind (uint8 counts as fp8).
        device: where the call runs (its arch and CU/SM count; the CPU interpreter counts 4).
        paged: the entries are request-local positions looked up through a block table (False:
            global slots).
        num_splits: the most splits per row (>= 1); default: the cost model (``batch_invariant``:
            the fixed rule). The plan cuts a list into ``cdiv(K, split_len)`` splits of
            ``split_len`` entries, a multiple of the tile. Only speed depends on it.
        workspace_numel: float32 elements of a caller's ``workspace=``: with no num_splits, the
            split count is capped to what it holds (batch-invariant mode: never; the op then
            rejects a short workspace).
        config: a tier config replacing the configs' tier (tuning; ``tier_config``'s override).
        k_scale_on_device: k_scale is a device tensor the kernel reads.
        batch_invariant: splits of ``split_tokens`` entries (configs' ``batch_invariant``): the
            split count depends on K alone, and a row's out and lse are bitwise the same in any
            batch. num_splits must be None.
    """
    for name, v in (("num_rows", num_rows), ("num_heads", num_heads), ("topk", topk), ("block_size", block_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{OP}: {name}: expected an int >= 0, got {v!r}")
    if block_size < 1:
        raise ValueError(f"{OP}: block_size: expected >= 1, got {block_size}")
    if num_splits is not None and (not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1):
        raise ValueError(f"{OP}: num_splits: expected None or an int >= 1, got {num_splits!r}")
    if batch_invariant and num_splits is not None:
        raise ValueError(f"{OP}: num_splits: expected None with batch_invariant=True (the split rule is fixed)")
    arch = _platform.device_arch(device)
    num_cus = num_compute_units(device)
    kv_fp8 = kv_dtype in FP8_DTYPES or kv_dtype == torch.uint8
    tier = None if config is not None else tier_index(config_for(OP, arch)["tiers"], num_heads)
    cfg = tier_config(arch, num_heads, q_dtype, kv_fp8, config)
    block_h, block_n = int(cfg["BLOCK_H"]), int(cfg["BLOCK_N"])
    head_blocks = max(1, triton.cdiv(num_heads, block_h))
    tiles = max(1, triton.cdiv(topk, block_n))
    if batch_invariant:
        split_len = invariant_split_len(arch, cfg)
    else:
        S = num_splits
        if S is None:
            sp = config_for(OP, arch)["split"]
            S = choose_num_splits(
                num_rows,
                head_blocks,
                max(topk, 1),
                block_n,
                block_h,
                1 if kv_fp8 else torch.empty((), dtype=kv_dtype).element_size(),
                num_cus,
                int(cfg["ctas_per_cu"]),
                int(sp["min_tokens_per_split"]),
                int(sp["max_splits"]),
                float(sp["fixed_tiles"]),
                float(sp["launch_tiles"]),
            )
            if workspace_numel is not None:
                S = max(1, min(S, workspace_numel // max(1, num_rows * num_heads * (D_NOPE + 1))))
        split_len = triton.cdiv(tiles, min(S, tiles)) * block_n
    S = max(1, triton.cdiv(topk, split_len))
    pow2 = block_size & (block_size - 1) == 0
    consts, options = kernel_meta(
        arch, cfg, q_dtype, kv_fp8, direct=S == 1, has_scale_ptr=k_scale_on_device, paged=paged, pow2_page=pow2
    )
    r_grid = r_consts = r_options = None
    if S > 1:
        r_consts, r_options = stage2_meta(S, arch)
        r_grid = (num_rows * num_heads, D_NOPE // r_consts["BLOCK_D"])
    return SparsePlan(
        arch=arch,
        num_cus=num_cus,
        num_rows=num_rows,
        num_heads=num_heads,
        topk=topk,
        block_size=block_size,
        paged=bool(paged),
        q_dtype=q_dtype,
        kv_dtype=kv_dtype,
        k_scale_on_device=bool(k_scale_on_device),
        tier=tier,
        config=cfg,
        head_blocks=head_blocks,
        num_splits=S,
        split_len=split_len,
        workspace_numel=mla_decode_workspace_numel(num_rows, num_heads, S),
        page_shift=block_size.bit_length() - 1 if pow2 else 0,
        grid=(num_rows * S * head_blocks,),
        constexprs=consts,
        options=options,
        reduce_grid=r_grid,
        reduce_constexprs=r_consts,
        reduce_options=r_options,
        batch_invariant=bool(batch_invariant),
    )


__all__ = [
    "OP",
    "SparsePlan",
    "plan_sparse_attention",
    "tier_config",
    "tier_index",
    "kernel_meta",
    "invariant_split_len",
    "SPARSE_DTYPE_TAGS",
    "TIER_DEFAULTS",
]
