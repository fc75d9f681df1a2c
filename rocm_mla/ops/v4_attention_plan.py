"""mla_v4_attention's plan: what a call launches, decided on the host from the call's sizes, dtypes
and device alone (no device value is read, so the call can be captured in a CUDA/HIP graph).

``plan_v4_attention(...) -> V4Plan`` holds every choice of a call that is not a tensor: each
cache's kind as the kernel reads it (fp8_ds_mla with its e4m3 kind, or 16-bit), the list forms
(dense or ragged), the sink and the inverse RoPE, the tier (BLOCK_H heads per program, from H),
the split count (the split-K model mla_decode and mla_sparse_attention share, over the rows, the
head blocks and a row's entries; or ``batch_invariant``'s fixed rule), the config, the backend
and debug. One split: the kernel writes out and lse itself, the sink and the inverse RoPE in its
epilogue; more: float32 partials into a workspace (``mla_decode_workspace_numel``) and the shared
reduce, which applies both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from .. import _platform
from ..configs import config_for, resolve_tier, tier_index
from ..triton_common import amd_options
from ._checks import FLOAT_DTYPES, Checker, debug_enabled, plan_device
from ._dispatch import select
from .latent_core import (
    LatentPlan,
    SplitReduce,
    check_split_knobs,
    mla_decode_workspace_numel,
    modelled_splits,
    num_compute_units,
    split_reduce,
)

OP = "mla_v4_attention"
HEAD_DIM = 512  # the K = V row: 448 NoPE + 64 RoPE values
ROPE_DIM = 64
FP8_DS_MLA_TOKEN_BYTES = 584  # 448 e4m3 + 64 bf16 (576 data bytes) + 8 scale bytes
# The cache names a plan takes for each cache ("auto": a uint8 cache is fp8_ds_mla in the kind
# vLLM's writer of that cache uses; a float cache its own dtype).
V4_CACHE_DTYPES = ("auto", "fp8_ds_mla", "fp8_ds_mla_e4m3fn", "fp8_ds_mla_e4m3fnuz", "bfloat16", "float16", "float32")
# The kernel's cache kinds (its W_KIND / C_KIND constexprs).
KIND_CODES = {torch.float8_e4m3fn: 1, torch.float8_e4m3fnuz: 2}
TIER_DEFAULTS = {"ctas_per_cu": 1}


def cache_kind(c: Checker, name: str, dt: torch.dtype, cache_dtype: str, q_dtype: torch.dtype, arch: str,
               window: bool) -> torch.dtype:  # fmt: skip
    """The kind the kernel reads a cache of tensor dtype ``dt`` as: an e4m3 kind (uint8 fp8_ds_mla
    storage) or the 16/32-bit dtype itself. ``fp8_ds_mla`` (and "auto" for uint8): the kind vLLM's
    writer of that cache uses: the window cache e4m3fnuz on gfx942 (a C++ writer of the platform's
    kind), e4m3fn elsewhere; the compressed cache e4m3fn everywhere (a Triton writer)."""
    arg = f"{name}_kv_cache_dtype"
    if cache_dtype not in V4_CACHE_DTYPES:
        c.fail(arg, f"one of {', '.join(map(repr, V4_CACHE_DTYPES))}", repr(cache_dtype))
    got = str(dt).replace("torch.", "")
    if cache_dtype.startswith("fp8_ds_mla") or (cache_dtype == "auto" and dt == torch.uint8):
        if dt != torch.uint8:
            c.fail(f"{name}_cache", f"dtype uint8 (fp8_ds_mla storage; {arg}={cache_dtype!r})", got, TypeError)
        if cache_dtype.endswith("e4m3fnuz"):
            return torch.float8_e4m3fnuz
        if cache_dtype.endswith("e4m3fn"):
            return torch.float8_e4m3fn
        return torch.float8_e4m3fnuz if window and arch == "gfx942" else torch.float8_e4m3fn
    if dt == torch.uint8:
        c.fail(arg, "'auto' or an fp8_ds_mla name for a uint8 cache", repr(cache_dtype))
    if cache_dtype != "auto" and got != cache_dtype:
        c.fail(f"{name}_cache", f"dtype {cache_dtype} ({arg})", got, TypeError)
    ok = (torch.bfloat16, torch.float16) if q_dtype != torch.float32 else (torch.float32, torch.bfloat16, torch.float16)
    if dt not in ok:
        c.fail(
            f"{name}_cache", "dtype uint8 (fp8_ds_mla), bfloat16 or float16 (float32 with float32 q)", got, TypeError
        )
    return dt


def tier_config(arch: str, num_heads: int, q_dtype: torch.dtype, override: dict[str, Any] | None = None) -> dict:
    """The resolved launch config for ``num_heads`` heads: the tier (or ``override``), then its
    ``fp32`` sub-object for float32 q, then the defaults of absent fields."""
    if override is not None:
        tier = override
    else:
        tiers = config_for(OP, arch)["tiers"]
        tier = tiers[tier_index(tiers, num_heads)]
    cfg = {**TIER_DEFAULTS, **resolve_tier(tier, ["fp32"] if q_dtype == torch.float32 else [])}
    c = Checker(OP)
    for key in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages"):
        if key not in cfg:
            c.fail("config", f"a {key} entry", f"keys {sorted(cfg)}")
    for key in ("BLOCK_H", "BLOCK_N"):
        v = int(cfg[key])
        if v < 16 or v & (v - 1):
            c.fail("config", f"{key} a power of two >= 16 (tl.dot)", v)
    return cfg


def soft_fp8(arch: str, kinds: tuple[torch.dtype, ...]) -> bool:
    """Whether the kernel decodes e4m3 codes in integer arithmetic: in the CPU interpreter (its
    e4m3 conversions are not exact) and on NVIDIA for e4m3fnuz (its Triton has no such type); AMD
    targets convert natively."""
    if arch == "cpu":
        return any(k in KIND_CODES for k in kinds)
    return not arch.startswith("gfx") and torch.float8_e4m3fnuz in kinds


def triton_meta(
    arch: str,
    cfg: dict[str, Any],
    q_dtype: torch.dtype,
    window_kind: torch.dtype,
    compressed_kind: torch.dtype | None,
    *,
    window_ragged: bool,
    compressed_ragged: bool,
    has_sink: bool,
    inverse_rope: bool,
    direct: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(constexprs, compile options)`` of one launch of the kernel: the single place the op's
    launch and the ISA report's variants take them from."""
    kinds = (window_kind,) if compressed_kind is None else (window_kind, compressed_kind)
    consts = {
        "BLOCK_H": int(cfg["BLOCK_H"]),
        "BLOCK_N": int(cfg["BLOCK_N"]),
        "W_KIND": KIND_CODES.get(window_kind, 0),
        "C_KIND": -1 if compressed_kind is None else KIND_CODES.get(compressed_kind, 0),
        "W_RAGGED": bool(window_ragged),
        "C_RAGGED": bool(compressed_ragged and compressed_kind is not None),
        "HAS_SINK": bool(has_sink),
        "ROPE": bool(inverse_rope),
        "DIRECT": bool(direct),
        "IEEE": q_dtype == torch.float32,
        "SOFT_FP8": soft_fp8(arch, kinds),
        "NUM_XCDS": int(config_for(OP, arch).get("num_xcds", 1)),
    }
    options = {"num_warps": int(cfg["num_warps"]), "num_stages": int(cfg["num_stages"]), **amd_options(cfg, arch)}
    return consts, options


@dataclass(frozen=True)
class V4Plan(LatentPlan):
    """What one mla_v4_attention call launches (``plan_v4_attention`` makes it).

    The kernel runs ``grid = (num_rows x num_splits x head_blocks,)`` programs, each BLOCK_H heads
    of one row over one split of its entries (window list, then compressed list). With
    ``num_splits == 1`` it writes out ``[T, H, 512]`` and lse ``[T, H]``; otherwise float32
    partials into a workspace of ``workspace_numel`` elements that the shared reduce
    (``reduce.grid``) merges into out and lse, with the sink and the inverse RoPE. A plan serves
    every call with the same sizes, dtypes, device and list forms (every layer of a step whose
    kind is the same): ``matches`` says whether a call's tensors are those.
    """

    arch: str
    num_cus: int
    num_rows: int  # T
    num_heads: int  # H
    q_dtype: torch.dtype
    window_dtype: torch.dtype  # the window cache tensor's dtype (uint8: fp8_ds_mla)
    window_kind: torch.dtype  # as read: float8_e4m3fn / float8_e4m3fnuz, or the 16/32-bit dtype
    window_block_size: int
    window_len: int  # dense: the list's width W; ragged: the most entries a row is planned for
    window_ragged: bool
    compressed_dtype: torch.dtype | None  # None: a window-only layer
    compressed_kind: torch.dtype | None
    compressed_block_size: int
    compressed_len: int
    compressed_ragged: bool
    has_sink: bool
    inverse_rope: bool
    tier: int | None
    config: dict[str, Any]
    head_blocks: int
    num_splits: int  # S
    split_len: int  # 0: each row cuts its own entries into S splits; else entries per split
    workspace_numel: int
    grid: tuple[int]
    constexprs: dict[str, Any]
    options: dict[str, Any]
    reduce: SplitReduce | None
    batch_invariant: bool
    device: torch.device
    backend: str
    debug: bool
    kernel_launches: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def kv_kind(self) -> torch.dtype:
        """The window cache's kind (``LatentPlan.kv_fp8`` reads it)."""
        return self.window_kind

    def matches(self, q, window_cache, window_indices, window_indptr=None, compressed_cache=None,
                compressed_indices=None, compressed_indptr=None, attn_sink=None, positions=None,
                cos_sin_cache=None) -> bool:  # fmt: skip
        """Whether an ``mla_v4_attention`` call's tensors are the ones this plan was made for:
        sizes, dtypes, device, the list forms (dense width, ragged), a compressed list exactly when
        planned, a sink and positions exactly when planned. Host values only (capturable);
        ``mla_v4_attention`` names what differs when it is False."""
        T, H, dev = self.num_rows, self.num_heads, self.device
        try:
            ok = (
                q.shape == (T, H, HEAD_DIM)
                and q.dtype == self.q_dtype
                and q.device == dev
                and _cache_matches(window_cache, self.window_dtype, self.window_block_size, dev)
                and _list_matches(window_indices, window_indptr, T, self.window_len, self.window_ragged, dev)
                and (attn_sink is not None) == self.has_sink
                and (positions is not None) == self.inverse_rope
                and (cos_sin_cache is not None) == self.inverse_rope
            )
            if ok and self.compressed_dtype is None:
                ok = compressed_cache is None and compressed_indices is None and compressed_indptr is None
            elif ok:
                ok = _cache_matches(
                    compressed_cache, self.compressed_dtype, self.compressed_block_size, dev
                ) and _list_matches(compressed_indices, compressed_indptr, T, self.compressed_len,
                                    self.compressed_ragged, dev)  # fmt: skip
            return bool(ok)
        except (AttributeError, TypeError):  # not tensors
            return False


def _cache_matches(cache, dtype, block_size, dev) -> bool:
    width = FP8_DS_MLA_TOKEN_BYTES if dtype == torch.uint8 else HEAD_DIM
    return (
        cache.dim() == 3
        and cache.dtype == dtype
        and cache.shape[1] == block_size
        and cache.shape[2] == width
        and cache.stride(2) == 1
        and cache.device == dev
    )


def _list_matches(indices, indptr, T, width, ragged, dev) -> bool:
    if indices.dtype != torch.int32 or indices.device != dev or (indptr is not None) != ragged:
        return False
    if ragged:
        return indices.dim() == 1 and indptr.dtype == torch.int32 and indptr.shape == (T + 1,) and indptr.device == dev
    return indices.dim() == 2 and indices.shape == (T, width)


def plan_v4_attention(
    *,
    num_rows: int,
    num_heads: int,
    q_dtype: torch.dtype,
    device: torch.device | str,
    window_dtype: torch.dtype,
    window_block_size: int,
    window_len: int,
    window_ragged: bool = False,
    compressed_dtype: torch.dtype | None = None,
    compressed_block_size: int = 0,
    compressed_len: int = 0,
    compressed_ragged: bool = False,
    window_kv_cache_dtype: str = "auto",
    compressed_kv_cache_dtype: str = "auto",
    has_sink: bool = True,
    inverse_rope: bool = False,
    num_splits: int | None = None,
    batch_invariant: bool = False,
    workspace_numel: int | None = None,
    config: dict[str, Any] | None = None,
    backend: str | None = None,
    debug: bool | None = None,
) -> V4Plan:
    """Everything an ``mla_v4_attention`` call with these sizes launches, decided once on the host
    from the sizes alone: make it once per step (per layer kind) and pass it to every layer's call,
    which then only checks its tensors against it (``V4Plan.matches``). No device value is read, so
    the calls can be captured in a CUDA/HIP graph.

    Args:
        num_rows: T, the query rows (``q [T, H, 512]``; decode, MTP and prefill rows alike).
        num_heads: H (any H >= 1: 64 or 8 per rank for V4-Flash, 128 or 16 for V4-Pro).
        q_dtype: float16, bfloat16 or float32.
        device: where the calls run (its arch and CU/SM count).
        window_dtype: the window cache tensor's dtype: uint8 (fp8_ds_mla ``[num_blocks,
            block_size, 584]``) or a 16-bit dtype (``[num_blocks, block_size, 512]``).
        window_block_size: tokens per window-cache page (vLLM: 64).
        window_len: dense lists: their width W (``[T, W]``, 128 in V4); ragged: the most entries a
            row is expected to hold (the split model's size; any length is read).
        window_ragged: the window list is ``indices [nnz]`` + ``indptr [T + 1]``.
        compressed_dtype / compressed_block_size / compressed_len / compressed_ragged: the same for
            the compressed list and its cache (block: compressed rows per page, vLLM: 64 for C4,
            2 for C128); ``compressed_dtype=None``: a window-only layer.
        window_kv_cache_dtype / compressed_kv_cache_dtype: "auto" (uint8: "fp8_ds_mla"; a float
            cache: its dtype), "fp8_ds_mla" (the kind vLLM's writer of that cache uses: the window
            cache's e4m3fnuz on gfx942 and e4m3fn elsewhere, the compressed cache's e4m3fn
            everywhere), "fp8_ds_mla_e4m3fn" / "fp8_ds_mla_e4m3fnuz" (that kind), or the float
            dtype's name.
        has_sink: the calls pass ``attn_sink``. inverse_rope: they pass ``positions`` and
            ``cos_sin_cache`` (the output's last 64 values rotated back).
        num_splits: the most splits per row (>= 1); default: the cost model (``batch_invariant``:
            the fixed rule). Only speed depends on it.
        batch_invariant: splits of ``split_tokens`` entries (configs' ``batch_invariant``), their
            count from the planned lengths alone: a row's out and lse are bitwise the same in any
            batch. num_splits must be None.
        workspace_numel: float32 elements of the ``workspace=`` the calls will pass: with no
            num_splits, the split count is capped to what it holds.
        config: a tier config replacing the configs' tier (tuning).
        backend: "triton" or "reference" (default: configs' backend_order;
            ``ROCM_MLA_BACKEND_MLA_V4_ATTENTION``).
        debug: every call checks the index values on the host (a sync) and raises a ValueError
            naming the first bad one. Default: ``ROCM_MLA_DEBUG=1``.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    c.count("num_rows", num_rows, 0)
    c.count("num_heads", num_heads, 1)
    c.count("window_block_size", window_block_size, 1)
    c.count("window_len", window_len, 0)
    if q_dtype not in FLOAT_DTYPES:
        c.fail("q_dtype", "float16, bfloat16 or float32", str(q_dtype).replace("torch.", ""), TypeError)
    for name, v in (("window_ragged", window_ragged), ("compressed_ragged", compressed_ragged),
                    ("has_sink", has_sink), ("inverse_rope", inverse_rope)):  # fmt: skip
        if not isinstance(v, bool):
            c.fail(name, "a bool", repr(v), TypeError)
    check_split_knobs(c, num_splits, batch_invariant, workspace_numel)
    if config is not None and not isinstance(config, dict):
        c.fail("config", "None or a dict (a tier config)", type(config).__name__, TypeError)
    device = plan_device(device)
    arch = _platform.device_arch(device)
    w_kind = cache_kind(c, "window", window_dtype, window_kv_cache_dtype, q_dtype, arch, True)
    c_kind = None
    if compressed_dtype is not None:
        c.count("compressed_block_size", compressed_block_size, 1)
        c.count("compressed_len", compressed_len, 0)
        c_kind = cache_kind(c, "compressed", compressed_dtype, compressed_kv_cache_dtype, q_dtype, arch, False)
    else:
        compressed_block_size, compressed_len, compressed_ragged = 0, 0, False
    impl = select(OP, device, backend, has_hip=False)
    num_cus = num_compute_units(device)
    tiers = config_for(OP, arch)["tiers"]
    tier = None if config is not None else tier_index(tiers, num_heads)
    cfg = tier_config(arch, num_heads, q_dtype, config if config is not None else tiers[tier])
    block_h, block_n = int(cfg["BLOCK_H"]), int(cfg["BLOCK_N"])
    head_blocks = triton.cdiv(num_heads, block_h)
    entries = max(1, window_len + compressed_len)
    tiles = triton.cdiv(entries, block_n)
    if batch_invariant:
        tokens = int(config_for(OP, arch)["batch_invariant"]["split_tokens"])
        if tokens < 1:
            c.fail("config batch_invariant", "split_tokens >= 1", tokens)
        split_len = triton.cdiv(tokens, block_n) * block_n
        S = triton.cdiv(entries, split_len)
    else:
        S = num_splits
        if S is None:
            sp = config_for(OP, arch)["split"]
            itemsize = 1 if w_kind in KIND_CODES else w_kind.itemsize
            S = modelled_splits(sp, num_rows, head_blocks, entries, cfg, itemsize, num_cus)
            if workspace_numel is not None:
                S = max(1, min(S, workspace_numel // max(1, num_rows * num_heads * (HEAD_DIM + 1))))
        S = max(1, min(S, tiles))
        split_len = 0
    consts, options = triton_meta(
        arch, cfg, q_dtype, w_kind, c_kind, window_ragged=window_ragged, compressed_ragged=compressed_ragged,
        has_sink=has_sink, inverse_rope=inverse_rope, direct=S == 1,
    )  # fmt: skip
    reduce = None
    if S > 1:
        r = split_reduce(S, arch, num_rows * num_heads)
        reduce = SplitReduce(r.grid, {**r.constexprs, "HAS_SINK": has_sink, "ROPE": inverse_rope}, r.options)
    return V4Plan(
        arch=arch,
        num_cus=num_cus,
        num_rows=num_rows,
        num_heads=num_heads,
        q_dtype=q_dtype,
        window_dtype=window_dtype,
        window_kind=w_kind,
        window_block_size=window_block_size,
        window_len=window_len,
        window_ragged=window_ragged,
        compressed_dtype=compressed_dtype,
        compressed_kind=c_kind,
        compressed_block_size=compressed_block_size,
        compressed_len=compressed_len,
        compressed_ragged=compressed_ragged,
        has_sink=has_sink,
        inverse_rope=inverse_rope,
        tier=tier,
        config=cfg,
        head_blocks=head_blocks,
        num_splits=S,
        split_len=split_len,
        workspace_numel=mla_decode_workspace_numel(num_rows, num_heads, S),
        grid=(num_rows * S * head_blocks,),
        constexprs=consts,
        options=options,
        reduce=reduce,
        batch_invariant=batch_invariant,
        device=device,
        backend=impl,
        debug=debug_enabled(debug),
    )


__all__ = [
    "OP",
    "V4Plan",
    "plan_v4_attention",
    "tier_config",
    "triton_meta",
    "cache_kind",
    "soft_fp8",
    "TIER_DEFAULTS",
    "V4_CACHE_DTYPES",
]
