"""mla_decode's plan: everything a call launches, decided on the host from the call's sizes, dtypes
and device, without reading any device value (so the call can be captured in a CUDA/HIP graph).

``plan_decode(...) -> DecodePlan`` (flashinfer's plan/run split): the wrapper validates, plans, then
launches exactly what the plan says. What it decides:
  * the stage-1 tier (BLOCK_H query rows per program) from M = q_len x N (``tier_config``);
  * the split count S (``choose_num_splits``, ops/latent_core.py: the split-K model that
    mla_sparse_attention shares): a small cost model over the CU/SM count, the batch, the head
    blocks and an upper bound of the longest sequence (the ``max_seq_len`` hint, else the block
    table's capacity ``max_blocks x block_size``), capped to what a given workspace holds;
  * batch-invariant mode (``batch_invariant=True``, ``invariant_split``): a split holds a number of
    keys that is a function of the request's own length (configs' ``batch_invariant``:
    ``split_tokens``, ``max_splits``; a tier's ``invariant_split_tokens``), the grid has enough
    splits for the longest request the hint (else the table) allows and the reduce adds each
    request's own splits in split order, so a request's bits do not depend on the batch
    (docs/batch-invariance.md);
  * S == 1: stage 1 writes out/lse directly (one launch); S > 1: partials go to a float32
    workspace of ``mla_decode_workspace_numel`` elements and stage 2 (the reduce) merges them;
  * each launch's grid, constexprs and compile options (``triton_meta``, ``latent_core.reduce_meta``: the ISA
    report compiles its variants from the same two functions, so what it reports is what runs).

Launch data: rocm_mla/configs/mla_decode.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from .. import _platform
from ..configs import config_for, resolve_tier, tier_index
from ..mla_dims import KV_LORA_RANK, QK_ROPE_HEAD_DIM
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

OP = "mla_decode"
D_NOPE = KV_LORA_RANK  # V width and the nope part of K (the kernel's constexpr names)
D_PE = QK_ROPE_HEAD_DIM

# What an absent tier field means (rocm-mla tune compares configs with the same table).
TIER_DEFAULTS = {
    "D_SPLIT": 1,
    "V_SPLIT": 1,
    "RELOAD_K": False,
    "F16_DOT": False,
    "CLAMP_PAGES": False,
    "FP8_QK": False,
    "FP8_PV": False,
    "SPLIT_RUNS": False,
}

# mla_decode(fp8_dots=): which dots of an fp8-cache decode run on fp8 matrix instructions.
# "none": both in q's dtype (K and V converted from e4m3 in the loop); "qk": q rounded to e4m3
# per (row, head), q . k^T on fp8 (FP8_QK); "all": p rounded to e4m3 too, p . v on fp8 (FP8_PV).
FP8_DOTS = ("none", "qk", "all")
# fp8_dots of an fp8-cache plan that names none (16-bit q): the trade docs/notes/fp8-decode.md measures.
DEFAULT_FP8_DOTS = "none"
# fp8_dots="all": the smallest tile (p . v's K) fp8 matrix instructions take.
FP8_PV_MIN_BLOCK_N = 32


# The kernels' runtime arguments, in their order, with their kind: the launch (ops/decode.py) fills
# them by name and the ISA report (variants/decode.py) types them from these tables, so the
# signature is written once beside the kernels (tests/decode/test_decode_plan.py checks both tables
# against them). Kinds: "*q", "*kv", "*i32", "*fp32" pointers to q's dtype (out's), the cache's
# kind, int32, float32, "/16" when real tensors keep them 16-byte aligned; "fp32"; "i32"; "i32/16"
# a stride real tensors keep a multiple of 16 elements; "1" an inner stride (1 on real tensors,
# which Triton specialises).
STAGE1_ARGS: tuple[tuple[str, str], ...] = (
    ("q_nope", "*q/16"),
    ("q_pe", "*q/16"),
    ("kv", "*kv/16"),
    ("block_table", "*i32/16"),
    ("seq_lens", "*i32/16"),
    ("k_scale_ptr", "*fp32"),
    ("out", "*q/16"),
    ("lse", "*fp32/16"),
    ("part_o", "*fp32/16"),
    ("part_lse", "*fp32/16"),
    ("qk_scale", "fp32"),
    ("out_scale", "fp32"),
    ("num_heads", "i32"),
    ("q_len", "i32"),
    ("num_splits", "i32"),
    ("split_programs", "i32"),
    ("num_head_blocks", "i32"),
    ("page_size", "i32"),
    ("page_shift", "i32"),
    ("capacity", "i32"),
    ("num_pages", "i32"),
    ("s_qn_r", "i32/16"),
    ("s_qn_h", "i32/16"),
    ("s_qn_d", "1"),
    ("s_qp_r", "i32/16"),
    ("s_qp_h", "i32/16"),
    ("s_qp_d", "1"),
    ("s_kv_blk", "i32/16"),
    ("s_kv_tok", "i32/16"),
    ("s_bt_b", "i32"),
    ("s_sl", "1"),
    ("s_o_r", "i32/16"),
    ("s_o_h", "i32/16"),
    ("s_o_d", "1"),
    ("s_l_r", "i32"),
    ("s_l_h", "1"),
    ("s_po_s", "i32/16"),
    ("s_pl_s", "i32/16"),
)
REDUCE_ARGS: tuple[tuple[str, str], ...] = (
    ("part_o", "*fp32/16"),
    ("part_lse", "*fp32/16"),
    ("out", "*q/16"),
    ("lse", "*fp32/16"),
    ("seq_lens", "*i32/16"),
    ("num_heads", "i32"),
    ("num_splits", "i32"),
    ("q_len", "i32"),
    ("capacity", "i32"),
    ("split_tokens", "i32"),
    ("split_cap", "i32"),
    ("split_block_n", "i32"),
    ("s_sl", "1"),
    ("s_po_s", "i32/16"),
    ("s_pl_s", "i32/16"),
    ("s_o_r", "i32/16"),
    ("s_o_h", "i32/16"),
    ("s_o_d", "1"),
    ("s_l_r", "i32"),
    ("s_l_h", "1"),
    ("sink", "*fp32/16"),
    ("positions", "*i32/16"),
    ("cos_sin", "*fp32/16"),
    ("num_pos", "i32"),
    ("s_pos", "i32"),
    ("s_cs", "i32"),
)


def argument_types(
    args: tuple[tuple[str, str], ...], pointee: dict[str, str]
) -> tuple[dict[str, str], dict[str, int], tuple[str, ...]]:
    """``(signature, unit strides, divisible_by_16 names)`` of an argument table for an
    ahead-of-time compile; ``pointee`` maps "q" and "kv" to Triton type names (``triton_type``)."""
    sig: dict[str, str] = {}
    ones: dict[str, int] = {}
    div16 = []
    for name, kind in args:
        base, _, div = kind.partition("/")
        if base == "1":
            ones[name] = 1
            continue
        if base.startswith("*"):
            elem = base[1:]
            sig[name] = "*" + pointee.get(elem, elem)
        else:
            sig[name] = base
        if div:
            div16.append(name)
    return sig, ones, tuple(div16)


# --------------------------------------------------------------------------- launch decisions


def tier_config(
    arch: str,
    rows_per_request: int,
    q_dtype: torch.dtype,
    fp8: bool,
    override: dict[str, Any] | None = None,
    fp8_dots: str = "none",
) -> dict[str, Any]:
    """The stage-1 launch config for ``rows_per_request`` = q_len x N query rows.

    The first tier (configs' ``tiers``, sorted by BLOCK_H) that holds every row of a request;
    else the largest tier, with several head blocks per request. ``override`` (a tuning candidate,
    or ``config=``) replaces the tier. The chosen object's sub-objects then override fields,
    in this order: ``fp8`` (fp8 cache), ``fp8+qk`` (fp8 cache, ``fp8_dots`` "qk" or "all"),
    ``fp8+all`` (``fp8_dots="all"``), ``fp32`` (float32 q), ``fp16+fp8`` (float16 q, fp8 cache).
    ``fp8_dots`` (fp8 caches, 16-bit q; ``FP8_DOTS``) then sets FP8_QK ("qk", "all") and FP8_PV
    ("all"), which run the 512 latent columns as one tile (D_SPLIT 1, V_SPLIT 1 whatever the
    tier says).
    """
    if fp8_dots not in FP8_DOTS:
        Checker(OP).fail("fp8_dots", f"one of {', '.join(map(repr, FP8_DOTS))}", repr(fp8_dots))
    if override is not None:
        tier = override
    else:
        tiers = config_for(OP, arch)["tiers"]
        tier = tiers[tier_index(tiers, rows_per_request)]
    dots = fp8_dots if fp8 and q_dtype != torch.float32 else "none"  # float32 q keeps exact products
    qk = dots != "none"
    tags = (
        (["fp8"] if fp8 else [])
        + (["fp8+qk"] if qk else [])
        + (["fp8+all"] if dots == "all" else [])
        + (["fp32"] if q_dtype == torch.float32 else [])
        + (["fp16+fp8"] if fp8 and q_dtype == torch.float16 else [])
    )
    cfg = resolve_tier(tier, tags)
    cfg.setdefault("ctas_per_cu", 1)
    for key in ("FP8_QK", "FP8_PV"):  # an accuracy trade the caller asks for by name, never a tuning field
        if key in cfg:
            Checker(OP).fail("config", f"no {key} entry (fp8_dots= sets it)", f"{key}={cfg[key]!r}")
    if qk:
        cfg.update(FP8_QK=True, FP8_PV=dots == "all", D_SPLIT=1, V_SPLIT=1)
    for key in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages"):
        if key not in cfg:
            Checker(OP).fail("config", f"a {key} entry", f"keys {sorted(cfg)}")
    if cfg.get("FP8_PV") and int(cfg["BLOCK_N"]) < FP8_PV_MIN_BLOCK_N:
        # p . v's K is the tile's BLOCK_N keys: Triton's NVIDIA backend refuses 8-bit dots below K = 32
        # and its AMD backend falls back to FMA there, so a smaller tile is an error on both.
        Checker(OP).fail(
            "config",
            f"BLOCK_N >= {FP8_PV_MIN_BLOCK_N} with fp8_dots='all' (p . v on fp8 operands, K = BLOCK_N keys)",
            f"BLOCK_N={cfg['BLOCK_N']}",
        )
    return cfg


def invariant_split(arch: str, tier: dict[str, Any]) -> tuple[int, int]:
    """``(split_tokens, max_splits)`` of the batch-invariant mode on ``arch`` for a resolved stage-1
    tier (``tier_config``): a request of seq_len keys is cut into splits of
    ``max(split_tokens, cdiv(seq_len, max_splits) rounded up to BLOCK_N)`` keys, split_tokens
    rounded up to a multiple of BLOCK_N (the tile). split_tokens is the tier's
    ``invariant_split_tokens``, else configs' ``batch_invariant`` one; the tier follows q_len x N
    alone, so the rule is a function of the request (and the model)."""
    cfg = config_for(OP, arch)["batch_invariant"]
    tokens, cap = int(tier.get("invariant_split_tokens", cfg["split_tokens"])), int(cfg["max_splits"])
    if tokens < 1 or cap < 1:
        Checker(OP).fail(
            "config batch_invariant",
            "split_tokens >= 1 (tier's invariant_split_tokens included), max_splits >= 1",
            f"{tokens}, {cap}",
        )
    block_n = int(tier["BLOCK_N"])
    return triton.cdiv(tokens, block_n) * block_n, cap


def invariant_num_splits(bound: int, split_tokens: int, max_splits: int) -> int:
    """The grid's split count in batch-invariant mode: enough splits for every request of up to
    ``bound`` keys (the max_seq_len hint, else the table's capacity max_blocks x block_size). A
    request's own splits are a function of its length, so any grid at least that large gives it
    the same bits: the hint only has to be an upper bound (vLLM captures graphs with
    max_model_len, the capacity of its tables)."""
    return max(1, min(max_splits, triton.cdiv(max(bound, 1), split_tokens)))


def _num_xcds(arch: str) -> int:
    """Dies dealt workgroups round-robin (configs' ``num_xcds``; 1 = no remap). The remap is
    applied whatever the head-block count (harmless with one), so one compiled kernel per config."""
    return int(config_for(OP, arch).get("num_xcds", 1))


def page_mode_for(page_size: int, block_n: int) -> tuple[int, int]:
    """Stage 1's PAGE_MODE and page_shift for a cache page size and a tile of block_n tokens:
    (2, 0) when every tile lies in one page (page_size a multiple of block_n), (1, log2) for other
    powers of two, (0, 0) otherwise (see the kernel's docstring)."""
    if page_size % block_n == 0:
        return 2, 0
    if page_size & (page_size - 1) == 0:
        return 1, page_size.bit_length() - 1
    return 0, 0


def triton_meta(
    arch: str,
    cfg: dict[str, Any],
    q_dtype: torch.dtype,
    kv_fp8: bool,
    *,
    direct: bool,
    has_scale_ptr: bool,
    page_mode: int,
    split_tokens: int = 0,
    split_cap: int = 0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(constexprs, compile options)`` of one stage-1 launch: the single place both the wrapper's
    launch and the ISA report's variants take them from, so what the report compiles is what runs."""
    field = {**TIER_DEFAULTS, **cfg}
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
        "FP8_PV": bool(kv_fp8 and q_dtype != torch.float32 and field["FP8_QK"] and field["FP8_PV"]),
        # The Triton interpreter's float -> e4m3 conversion is wrong near exponent boundaries.
        "Q8_INT": arch == "cpu" or _platform.interpreter_active(),
    }
    if split_tokens:  # batch-invariant mode (invariant_split); absent, the kernel's default 0
        consts.update(SPLIT_TOKENS=int(split_tokens), SPLIT_CAP=int(split_cap))
        if not direct and field["SPLIT_RUNS"]:
            consts["SPLIT_RUNS"] = True
    options = {"num_warps": int(cfg["num_warps"]), "num_stages": int(cfg["num_stages"]), **amd_options(cfg, arch)}
    return consts, options


@dataclass(frozen=True)
class DecodePlan(LatentPlan):
    """What one mla_decode call launches (``plan_decode`` makes it; the wrapper runs it).

    The call: ``rows = batch x q_len`` query rows of ``num_heads`` heads; R = rows x num_heads.
    Stage 1 runs ``grid = (batch x split_programs x head_blocks x V_SPLIT,)`` programs, each
    ``BLOCK_H`` query rows of one request over one split of its keys (batch-invariant mode with
    the tier's ``SPLIT_RUNS``: over a run of consecutive splits, ``split_programs`` <= S). With
    ``num_splits == 1`` it writes out ``[rows, N, 512]`` and lse ``[rows, N]`` directly and
    nothing else runs; otherwise it writes float32 partials into a workspace of
    ``workspace_numel`` elements, partial outputs ``[S, R, 512]`` then partial lses ``[S, R]``,
    and stage 2 (the reduce,
    ``reduce.grid = (R, 512 / BLOCK_D)``) merges them into out and lse.
    """

    arch: str  # the device's arch key (gfx942, sm90, cpu, ...)
    num_cus: int  # CUs / SMs the split model fills
    batch: int
    num_heads: int
    q_len: int
    tier: int | None  # index into configs' tiers; None when a config= override replaces the tier
    config: dict[str, Any]  # the resolved stage-1 config (tier_config)
    head_blocks: int  # cdiv(q_len x N, BLOCK_H): blocks of BLOCK_H (token, head) rows per request and split
    num_splits: int  # S
    split_programs: int  # stage-1 programs per (request, head block): P == S, or P <= S with the tier's SPLIT_RUNS
    workspace_numel: int  # float32 elements of the partials; 0 when S == 1
    page_mode: int  # stage 1's PAGE_MODE (page_mode_for)
    page_shift: int
    grid: tuple[int]  # stage 1's (the kernel's); its constexprs and compile options follow
    constexprs: dict[str, Any]
    options: dict[str, Any]
    reduce: SplitReduce | None  # stage 2; None when S == 1
    batch_invariant: bool = False  # split lengths from each request's own length (invariant_split)
    # (split_tokens, split_cap, BLOCK_N) of that rule: stage 1 takes them as constexprs, the reduce
    # as arguments (one reduce binary per tile for every rule); (0, 0, 1) in the default mode.
    split_rule: tuple[int, int, int] = (0, 0, 1)
    # The call the plan was made for (mla_decode checks its tensors against these).
    device: torch.device | None = None
    max_blocks: int = 0
    block_size: int = 0
    q_dtype: torch.dtype | None = None
    kv_dtype: torch.dtype | None = None  # the cache tensor's dtype (uint8 storage for a named fp8 kind)
    kv_kind: torch.dtype | None = None  # as the kernel reads it (uint8 viewed as the fp8 kind)
    kv_cache_dtype: str = "auto"
    fp8_dots: str = "none"
    k_scale_on_device: bool = False
    backend: str = "triton"  # "triton" or "reference" (rocm_mla.ops._dispatch)
    debug: bool = False  # host-side checks of seq_lens and page ids at every call (a sync)
    # The wrapper's KernelLaunch of each stage ("kernel", "reduce"; ops/_launch.py), made at the
    # plan's first run: its binaries are kept across calls. Not part of what the plan decides.
    kernel_launches: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def rows(self) -> int:
        """Query rows: batch x q_len."""
        return self.batch * self.q_len

    def matches(self, q_nope, q_pe, kv_cache, block_table, seq_lens) -> bool:
        """Whether an ``mla_decode`` call's tensors are the ones this plan was made for (sizes,
        dtypes, device, unit strides): the whole per-call check of a planned call, in one
        expression. ``mla_decode`` names what differs when it is False."""
        try:
            return (
                latent_inputs_match(self, self.rows, q_nope, q_pe, kv_cache)
                and block_table.shape == (self.batch, self.max_blocks)
                and block_table.dtype == torch.int32
                and (block_table.stride(1) == 1 or self.max_blocks <= 1)
                and seq_lens.shape == (self.batch,)
                and seq_lens.dtype == torch.int32
                and block_table.device == self.device
                and seq_lens.device == self.device
            )
        except (AttributeError, TypeError):  # not tensors
            return False

    @property
    def workspace_shapes(self) -> tuple[tuple[int, int, int], tuple[int, int]] | None:
        """``([S, R, 512], [S, R])``: the partial outputs and lses in the workspace; None when S == 1."""
        if self.direct:
            return None
        r = self.batch * self.q_len * self.num_heads
        return (self.num_splits, r, D_NOPE), (self.num_splits, r)


def plan_decode(
    *,
    batch: int,
    num_heads: int,
    q_len: int,
    max_blocks: int,
    block_size: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    device: torch.device | str,
    kv_cache_dtype: str = "auto",
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    workspace_numel: int | None = None,
    config: dict[str, Any] | None = None,
    fp8_dots: str | None = None,
    k_scale_on_device: bool = False,
    batch_invariant: bool = False,
    backend: str | None = None,
    debug: bool | None = None,
) -> DecodePlan:
    """Everything an ``mla_decode`` call with these sizes launches, decided once on the host
    (flashinfer's plan/run): make it once per step and pass it to every layer's call
    (``mla_decode(..., plan=plan)``), which then only checks its tensors against it. No device
    value is read, so the calls that use it can be captured in a CUDA/HIP graph.

    Args:
        batch: B, the block table's rows; ``q_nope`` is ``[B x q_len, num_heads, 512]``.
        num_heads: N (query heads on this rank).
        q_len: query rows per request (1 for decode, more for MTP / spec-decode verification).
        max_blocks: the block table's columns (``block_table [B, max_blocks]``).
        block_size: tokens per cache page (``kv_cache [num_blocks, block_size, 576]``).
        q_dtype: float16, bfloat16 or float32.
        kv_dtype: the cache tensor's dtype: q's dtype, a float8 e4m3 kind, or uint8 storage
            with an fp8 ``kv_cache_dtype``.
        device: where the calls run (its arch and CU/SM count; the CPU interpreter counts 4).
        kv_cache_dtype: the cache's storage form: "auto" (the cache's dtype;
            float8 dtypes mean fp8), "bfloat16", "float16", "float32" (must match the cache),
            or an fp8 name (``mla_dims.FP8_KV_CACHE_DTYPES``): "fp8" / "fp8_e4m3" (uint8 storage
            read as the platform's e4m3: e4m3fnuz on gfx942, e4m3fn elsewhere), "fp8_e4m3fn" /
            "fp8_e4m3fnuz" (uint8 storage read as that kind; a float8 cache must be that kind).
        max_seq_len: a host-side upper bound of max(seq_lens) (vLLM's
            ``attn_metadata.max_seq_len``); default the table's capacity ``max_blocks x
            block_size``. Only the split count depends on it: a wrong hint costs speed, not
            correctness (batch-invariant mode: it must bound every seq_len).
        num_splits: force S (>= 1); default ``choose_num_splits``. Only load balance depends
            on it, never the result.
        workspace_numel: float32 elements of the ``workspace=`` the calls will pass; with no
            num_splits, S is capped to what it holds.
        config: a stage-1 config replacing the tier (``BLOCK_H``, ``BLOCK_N``, ``num_warps``,
            ``num_stages``, AMD options, ``ctas_per_cu``): tuning.
        fp8_dots: fp8 caches only: which dots run on fp8 matrix instructions (fp8 MFMA on gfx9,
            fp8 mma/wgmma on NVIDIA), an accuracy trade for speed (docs/notes/fp8-decode.md):
            ``"none"``: both dots in q's dtype, K and V converted from e4m3 in the loop;
            ``"qk"``: q rounded to the cache's e4m3 kind with one scale per (row, head) (absmax
            of its 576 values over the kind's largest value; ``reference.decode.quantize_q_fp8``
            is the exact spec) and q . k^T on fp8 operands read straight from the cache;
            ``"all"``: "qk" plus p rounded to e4m3 after the running-max subtraction (a row's
            largest weight maps to the kind's largest value) and p . v on fp8 V as stored. None:
            ``DEFAULT_FP8_DOTS`` for fp8 caches, "none" otherwise. The reference backend rounds
            the same values (p against the global row max). Not for float32 q (exact products)
            nor 16/32-bit caches (ValueError).
        k_scale_on_device: the calls pass ``k_scale`` as a float32 tensor of one element read
            by the kernel (no host sync) rather than a number (fp8 caches; ignored otherwise).
        batch_invariant: a request's out and lse do not depend on the batch: bitwise the same
            whatever the other requests, their lengths, their order and its position (every
            cache dtype, q_len, block size, N; under CUDA/HIP graphs too). Each request is split
            by ``invariant_split`` (a function of its own length); S =
            ``invariant_num_splits`` of the max_seq_len hint (else the table's capacity), which
            must then bound every seq_len (vLLM's does: graphs are captured with
            max_model_len); workspace_numel does not change S; num_splits must be None. With
            the tier's ``SPLIT_RUNS`` the programs per request (``split_programs``) follow the
            batch as the default mode's split count does, each taking a run of the request's
            splits. Stage 2 adds each request's own splits in split order, its tile following
            the batch (``latent_core.reduce_meta``). docs/batch-invariance.md gives the rule and its cost.
        backend: "triton" or "reference" to force one (default: configs' backend_order; see
            ``rocm_mla.ops._dispatch``; ``ROCM_MLA_BACKEND_MLA_DECODE`` in the environment).
        debug: every call validates seq_lens and block-table entries against the cache (reads
            device values: a host sync, so not capturable). Default: ``ROCM_MLA_DEBUG=1``.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    device = plan_device(device)
    for name, v, low in (("batch", batch, 0), ("num_heads", num_heads, 0), ("q_len", q_len, 1),
                         ("max_blocks", max_blocks, 0), ("block_size", block_size, 1)):  # fmt: skip
        c.count(name, v, low)
    if q_dtype not in FLOAT_DTYPES:
        c.fail("q_dtype", "float16, bfloat16 or float32", str(q_dtype).replace("torch.", ""), TypeError)
    arch = _platform.device_arch(device)
    kv_kind, kv_fp8 = kv_kind_for(c, kv_dtype, kv_cache_dtype, q_dtype, arch)
    dots = resolve_fp8_dots(c, fp8_dots, kv_fp8, kv_dtype, q_dtype)
    check_split_knobs(c, num_splits, batch_invariant, workspace_numel)
    c.count("max_seq_len", max_seq_len, 0, optional=True)
    impl = select(OP, device, backend, has_hip=False)
    num_cus = num_compute_units(device)
    m_rows = q_len * num_heads
    tiers = config_for(OP, arch)["tiers"]
    tier = None if config is not None else tier_index(tiers, m_rows)
    cfg = tier_config(arch, m_rows, q_dtype, kv_fp8, config if config is not None else tiers[tier], fp8_dots=dots)
    head_blocks = triton.cdiv(m_rows, int(cfg["BLOCK_H"]))
    block_n = int(cfg["BLOCK_N"])
    r = batch * q_len * num_heads
    S = num_splits
    split_tokens = split_cap = 0
    cap = max_blocks * block_size
    bound = cap if max_seq_len is None else min(max_seq_len, cap)
    if batch_invariant:
        split_tokens, split_cap = invariant_split(arch, cfg)
        S = invariant_num_splits(bound, split_tokens, split_cap)
    P = None
    if S is None or batch_invariant:
        # V_SPLIT programs share each head block's tiles: they count as head blocks for the model.
        blocks = head_blocks * int(cfg.get("V_SPLIT", TIER_DEFAULTS["V_SPLIT"]))
        P = modelled_splits(config_for(OP, arch)["split"], batch, blocks, bound, cfg, kv_kind.itemsize, num_cus)
        if batch_invariant:
            # With SPLIT_RUNS the programs per request follow the batch as the default mode's
            # split count does, each taking a run of the request's splits; without, one per split.
            P = min(P, S) if cfg.get("SPLIT_RUNS", False) else S
        else:
            S = P
            if workspace_numel is not None:
                S = P = max(1, min(S, workspace_numel // max(1, r * (D_NOPE + 1))))
    if P is None:
        P = S
    page_mode, page_shift = page_mode_for(block_size, block_n)
    consts1, options1 = triton_meta(
        arch,
        cfg,
        q_dtype,
        kv_fp8,
        direct=S == 1,
        has_scale_ptr=kv_fp8 and bool(k_scale_on_device),
        page_mode=page_mode,
        split_tokens=split_tokens,
        split_cap=split_cap,
    )
    reduce = None
    if S > 1:
        rule = (split_tokens, split_cap, block_n) if batch_invariant else None
        reduce = split_reduce(S, arch, r, rule, num_cus=num_cus)
    return DecodePlan(
        arch=arch,
        num_cus=num_cus,
        batch=batch,
        num_heads=num_heads,
        q_len=q_len,
        tier=tier,
        config=cfg,
        head_blocks=head_blocks,
        num_splits=S,
        split_programs=P,
        workspace_numel=mla_decode_workspace_numel(batch * q_len, num_heads, S),
        page_mode=page_mode,
        page_shift=page_shift,
        grid=(batch * P * head_blocks * consts1["V_SPLIT"],),
        constexprs=consts1,
        options=options1,
        reduce=reduce,
        batch_invariant=batch_invariant,
        split_rule=(split_tokens, split_cap, block_n) if batch_invariant else (0, 0, 1),
        device=device,
        max_blocks=max_blocks,
        block_size=block_size,
        q_dtype=q_dtype,
        kv_dtype=kv_dtype,
        kv_kind=kv_kind,
        kv_cache_dtype=kv_cache_dtype,
        fp8_dots=dots,
        k_scale_on_device=kv_fp8 and bool(k_scale_on_device),
        backend=impl,
        debug=debug_enabled(debug),
    )


def resolve_fp8_dots(c: Checker, fp8_dots, kv_fp8: bool, kv_dtype: torch.dtype, q_dtype: torch.dtype) -> str:
    """The fp8_dots mode of a plan (``FP8_DOTS``): the argument or the default; "none" for
    16/32-bit caches."""
    if fp8_dots is not None and fp8_dots not in FP8_DOTS:
        c.fail("fp8_dots", f"None or one of {', '.join(map(repr, FP8_DOTS))}", repr(fp8_dots))
    if not kv_fp8:
        if fp8_dots not in (None, "none"):
            got = f"a {str(kv_dtype).replace('torch.', '')} cache"
            c.fail("fp8_dots", "an fp8 kv_cache (q and p are rounded to the cache's fp8 kind)", got)
        return "none"
    if fp8_dots is None:
        return DEFAULT_FP8_DOTS if q_dtype != torch.float32 else "none"
    if fp8_dots != "none" and q_dtype == torch.float32:
        c.fail("fp8_dots", "float16 or bfloat16 q (float32 q keeps exact products)", "float32 q")
    return fp8_dots


__all__ = [
    "STAGE1_ARGS",
    "REDUCE_ARGS",
    "argument_types",
    "DecodePlan",
    "plan_decode",
    "DEFAULT_FP8_DOTS",
    "invariant_split",
    "invariant_num_splits",
    "tier_config",
    "triton_meta",
    "page_mode_for",
    "TIER_DEFAULTS",
    "FP8_DOTS",
]
