"""mla_sparse_attention's plan: what a call launches, decided on the host from the call's sizes,
dtypes and device alone (no device value is read, so the call can be captured in a CUDA/HIP graph).

``plan_sparse_attention(...) -> SparsePlan`` (flashinfer's plan/run split) holds every choice of a
call that is not a tensor: the cache's storage (``kv_cache_dtype``), the split count, batch
invariance, the config, the backend and debug. The op checks its tensors against a caller's plan
(``SparsePlan.matches``; made once for every layer of a step) or plans from them
(``plan_sparse_attention_for``, rocm_mla/ops/sparse.py), then launches what the plan says:

  * the backend ("triton" or "reference", resolved when the plan is made);
  * the cache's dtype as the kernel reads it (uint8 storage viewed as its named fp8 kind,
    ``latent_core.kv_kind_for``: mla_decode's rule);
  * the tier (BLOCK_H heads per program) from N (``tier_config``; configs' ``tiers``);
  * the split of each row's K list over programs: the default mode fills the GPU from the rows,
    the head blocks and K (the split-K model mla_decode shares, ops/latent_core.py): one split when rows x
    head blocks fill it, up to ``max_splits`` for a lone decode row; ``batch_invariant=True`` cuts
    every list into splits of ``split_tokens`` entries, a function of K alone, so a row's bits do
    not depend on the batch (the reduce's tile follows the split count, which then follows K);
  * one split: the kernel writes out/lse itself; more: float32 partials into a workspace
    (``mla_decode_workspace_numel`` elements, mla_decode's layout) and mla_decode's reduce;
  * each launch's grid, constexprs and compile options (``triton_meta``; the ISA report compiles
    its variants from the same function, so what it reports is what runs).

Launch data: rocm_mla/configs/mla_sparse_attention.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from .. import _platform
from ..configs import config_for, resolve_tier, tier_index
from ..mla_dims import KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM
from ..triton_common import amd_options
from ._checks import FLOAT_DTYPES, Checker, debug_enabled, plan_device
from ._dispatch import select
from .latent_core import (
    LatentPlan,
    SplitReduce,
    check_split_knobs,
    kv_kind_for,
    latent_inputs_match,
    mla_decode_workspace_numel,
    modelled_splits,
    num_compute_units,
    split_reduce,
)

OP = "mla_sparse_attention"
D_NOPE = KV_LORA_RANK
D_PE = QK_ROPE_HEAD_DIM
D_KV = KV_ROW_DIM
# What an absent tier field means.
TIER_DEFAULTS = {"D_SPLIT": 1, "F16_DOT": False, "RELOAD_K": False, "ctas_per_cu": 1}


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
    tags = [tag for tag, on in (("fp8", fp8), ("fp32", q_dtype == torch.float32)) if on]
    cfg = {**TIER_DEFAULTS, **resolve_tier(tier, tags)}
    c = Checker(OP)
    for key in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages"):
        if key not in cfg:
            c.fail("config", f"a {key} entry", f"keys {sorted(cfg)}")
    if int(cfg["D_SPLIT"]) not in (1, 2):
        c.fail("config", "D_SPLIT 1 or 2", repr(cfg["D_SPLIT"]))
    for key in ("BLOCK_H", "BLOCK_N"):
        v = int(cfg[key])
        if v < 16 or v & (v - 1):
            c.fail("config", f"{key} a power of two >= 16 (tl.dot)", v)
    return cfg


def triton_meta(
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
        Checker(OP).fail("config batch_invariant", "split_tokens >= 1", tokens)
    block_n = int(cfg["BLOCK_N"])
    return triton.cdiv(tokens, block_n) * block_n


@dataclass(frozen=True)
class SparsePlan(LatentPlan):
    """What one mla_sparse_attention call launches (``plan_sparse_attention`` makes it).

    The kernel runs ``grid = (num_rows x num_splits x head_blocks,)`` programs, each BLOCK_H heads
    of one row over ``split_len`` entries of its list. With ``num_splits == 1`` it writes out
    ``[T, N, 512]`` and lse ``[T, N]``; otherwise float32 partials into a workspace of
    ``workspace_numel`` elements (``[S, T x N, 512]`` then ``[S, T x N]``) that mla_decode's reduce
    (``reduce.grid``) merges into out and lse. A plan serves every call with the same sizes,
    dtypes, device, table kind (``paged``) and kind of k_scale, e.g. every layer of a step:
    ``matches`` says whether a call's tensors are those.
    """

    arch: str  # the device's arch key (gfx942, sm90, cpu, ...)
    num_cus: int  # CUs / SMs the split model fills
    num_rows: int  # T
    num_heads: int  # N
    topk: int  # K
    block_size: int
    paged: bool  # entries are request-local positions (block table) rather than global slots
    q_dtype: torch.dtype
    kv_dtype: torch.dtype  # the cache tensor's dtype (uint8 storage for a named fp8 kind)
    kv_kind: torch.dtype  # as the kernel reads it (uint8 viewed as the fp8 kind)
    kv_cache_dtype: str  # the name the plan was made with ("auto", "fp8", ...)
    k_scale_on_device: bool  # fp8 caches: k_scale is a one-element float32 tensor the kernel reads
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
    reduce: SplitReduce | None  # None when S == 1
    batch_invariant: bool
    device: torch.device
    backend: str  # "triton" or "reference" (rocm_mla.ops._dispatch)
    debug: bool  # host-side checks of the index values at every call (a sync)
    # The op's KernelLaunch of each kernel ("kernel", "reduce"; ops/_launch.py), made at the plan's
    # first Triton run: its binaries are kept across calls. Not part of what the plan decides.
    kernel_launches: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def matches(self, q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token, k_scale=None) -> bool:
        """Whether an ``mla_sparse_attention`` call's tensors are the ones this plan was made for:
        sizes (``q_nope [T, N, 512]``, ``q_pe [T, N, 64]``, ``kv_cache [num_blocks, block_size,
        576]``, ``topk_indices [T, K]``), dtypes, device, unit strides, the table kind (block_table
        and req_id_per_token both tensors, or both None) and, for an fp8 cache, the kind of k_scale
        (a tensor exactly when the plan reads it on the device). Host values only (no device read,
        capturable). ``mla_sparse_attention`` names what differs when it is False."""
        T, K, dev = self.num_rows, self.topk, self.device
        try:
            ok = (
                latent_inputs_match(self, T, q_nope, q_pe, kv_cache)
                and topk_indices.shape == (T, K)
                and topk_indices.dtype == torch.int32
                and (K <= 1 or topk_indices.stride(1) == 1)
                and (block_table is not None) == self.paged
                and (req_id_per_token is not None) == self.paged
                and topk_indices.device == dev
                and (not self.kv_fp8 or isinstance(k_scale, torch.Tensor) == self.k_scale_on_device)
            )
            if ok and self.paged:
                ok = (
                    block_table.dtype == torch.int32
                    and block_table.dim() == 2
                    and (block_table.shape[1] <= 1 or block_table.stride(1) == 1)
                    and req_id_per_token.dtype == torch.int32
                    and req_id_per_token.dim() == 1
                    and req_id_per_token.shape[0] >= T
                    and (T <= 1 or req_id_per_token.stride(0) == 1)
                    and block_table.device == dev
                    and req_id_per_token.device == dev
                )
            return ok
        except (AttributeError, TypeError):  # not tensors
            return False


def plan_sparse_attention(
    *,
    num_rows: int,
    num_heads: int,
    topk: int,
    block_size: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    device: torch.device | str,
    paged: bool = True,
    kv_cache_dtype: str = "auto",
    k_scale_on_device: bool = False,
    num_splits: int | None = None,
    batch_invariant: bool = False,
    workspace_numel: int | None = None,
    config: dict[str, Any] | None = None,
    backend: str | None = None,
    debug: bool | None = None,
) -> SparsePlan:
    """Everything an ``mla_sparse_attention`` call with these sizes launches, decided once on the
    host from the sizes alone (flashinfer's plan/run): make it once per step and pass it to every
    layer's call (``mla_sparse_attention(..., plan=plan)``), which then only checks its tensors
    against it (``SparsePlan.matches``). No device value is read, so the calls that use it can be
    captured in a CUDA/HIP graph.

    Args:
        num_rows: T, the query rows (``q_nope [T, N, 512]``; decode, MTP and prefill rows alike).
        num_heads: N (1 .. 128, or more: several head blocks per row).
        topk: K, the entries per row (``topk_indices [T, K]``).
        block_size: tokens per cache page (``kv_cache [num_blocks, block_size, 576]``), >= 1.
        q_dtype: float16, bfloat16 or float32.
        kv_dtype: the cache tensor's dtype as the calls pass it: q's dtype, a float8 e4m3 kind, or
            uint8 storage with an fp8 ``kv_cache_dtype``.
        device: where the calls run (its arch and CU/SM count; the CPU interpreter counts 4).
        paged: the entries are request-local positions looked up through a block table (False:
            global slots; the calls then pass ``block_table=None, req_id_per_token=None``).
        kv_cache_dtype: as ``plan_decode`` takes it: "auto" (the cache's dtype; float8 dtypes mean
            fp8), "bfloat16", "float16", "float32" (must match the cache), or an fp8 name
            (``mla_dims.FP8_KV_CACHE_DTYPES``): "fp8" / "fp8_e4m3" (uint8 storage read as the
            platform's e4m3: e4m3fnuz on gfx942, e4m3fn elsewhere), "fp8_e4m3fn" / "fp8_e4m3fnuz"
            (uint8 storage read as that kind; a float8 cache must be that kind).
        k_scale_on_device: fp8 caches: the calls pass ``k_scale`` as a one-element float32 tensor
            the kernel reads (no host sync) rather than a number. Ignored for 16/32-bit caches.
        num_splits: the most splits per row (>= 1); default: the cost model (``batch_invariant``:
            the fixed rule). The plan cuts a list into ``cdiv(K, split_len)`` splits of
            ``split_len`` entries, a multiple of the tile. Only speed depends on it.
        batch_invariant: splits of ``split_tokens`` entries (configs' ``batch_invariant``): the
            split count depends on K alone, and a row's out and lse are bitwise the same in any
            batch, at any position (docs/sparse-attention.md gives the cost). num_splits must be
            None.
        workspace_numel: float32 elements of the ``workspace=`` the calls will pass: with no
            num_splits, the split count is capped to what it holds (batch-invariant mode: never;
            the op then rejects a short workspace).
        config: a tier config replacing the configs' tier (tuning; ``tier_config``'s override).
        backend: "triton" or "reference" to force one (default: configs' backend_order, see
            ``rocm_mla.ops._dispatch``; ``ROCM_MLA_BACKEND_MLA_SPARSE_ATTENTION`` in the
            environment). Resolved here: the plan holds the backend that runs.
        debug: every call checks the index values on the host (a sync, not capturable) and raises
            a ValueError naming the first bad one. Default: ``ROCM_MLA_DEBUG=1``.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came;
        RuntimeError for a forced backend that cannot run.
    """
    c = Checker(OP)
    for name, v, low in (("num_rows", num_rows, 0), ("num_heads", num_heads, 0), ("topk", topk, 0),
                         ("block_size", block_size, 1)):  # fmt: skip
        c.count(name, v, low)
    if q_dtype not in FLOAT_DTYPES:
        c.fail("q_dtype", "float16, bfloat16 or float32", str(q_dtype).replace("torch.", ""), TypeError)
    for name, v in (("paged", paged), ("k_scale_on_device", k_scale_on_device)):
        if not isinstance(v, bool):
            c.fail(name, "a bool", repr(v), TypeError)
    check_split_knobs(c, num_splits, batch_invariant, workspace_numel)
    if config is not None and not isinstance(config, dict):
        c.fail("config", "None or a dict (a tier config)", type(config).__name__, TypeError)
    device = plan_device(device)
    arch = _platform.device_arch(device)
    kv_kind, kv_fp8 = kv_kind_for(c, kv_dtype, kv_cache_dtype, q_dtype, arch)
    impl = select(OP, device, backend, has_hip=False)
    num_cus = num_compute_units(device)
    tiers = config_for(OP, arch)["tiers"]
    tier = None if config is not None else tier_index(tiers, num_heads)
    cfg = tier_config(arch, num_heads, q_dtype, kv_fp8, config if config is not None else tiers[tier])
    block_h, block_n = int(cfg["BLOCK_H"]), int(cfg["BLOCK_N"])
    head_blocks = max(1, triton.cdiv(num_heads, block_h))
    tiles = max(1, triton.cdiv(topk, block_n))
    if batch_invariant:
        split_len = invariant_split_len(arch, cfg)
    else:
        S = num_splits
        if S is None:
            sp = config_for(OP, arch)["split"]
            S = modelled_splits(sp, num_rows, head_blocks, max(topk, 1), cfg, kv_kind.itemsize, num_cus)
            if workspace_numel is not None:
                S = max(1, min(S, workspace_numel // max(1, num_rows * num_heads * (D_NOPE + 1))))
        split_len = triton.cdiv(tiles, min(S, tiles)) * block_n
    S = max(1, triton.cdiv(topk, split_len))
    on_device = kv_fp8 and k_scale_on_device
    pow2 = block_size & (block_size - 1) == 0
    consts, options = triton_meta(
        arch, cfg, q_dtype, kv_fp8, direct=S == 1, has_scale_ptr=on_device, paged=paged, pow2_page=pow2
    )
    return SparsePlan(
        arch=arch,
        num_cus=num_cus,
        num_rows=num_rows,
        num_heads=num_heads,
        topk=topk,
        block_size=block_size,
        paged=paged,
        q_dtype=q_dtype,
        kv_dtype=kv_dtype,
        kv_kind=kv_kind,
        kv_cache_dtype=kv_cache_dtype,
        k_scale_on_device=on_device,
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
        reduce=split_reduce(S, arch, num_rows * num_heads) if S > 1 else None,
        batch_invariant=batch_invariant,
        device=device,
        backend=impl,
        debug=debug_enabled(debug),
    )


__all__ = [
    "OP",
    "SparsePlan",
    "plan_sparse_attention",
    "tier_config",
    "triton_meta",
    "invariant_split_len",
    "TIER_DEFAULTS",
]
