"""mla_indexer_topk's plan: what a call launches, decided on the host from sizes alone (no device
value is read, so a call can be captured in a CUDA/HIP graph).

``plan_indexer_topk(...) -> IndexerTopkPlan``: the split size and count, the persistent grid, the
form (direct, split + merge, or prefiltered: ``IndexerTopkPlan``), each launch's grid, constexprs
and compile options (``triton_meta`` / ``merge_meta`` / ``prefilter_meta``, which the ISA report's
variants call too), the backend (``ops._dispatch.select``) and debug mode, so a call only checks
its tensors against the plan (``IndexerTopkPlan.matches``, host values alone). The answer does not
depend on the split size or the form, so a row's answer does not depend on the batch.

Launch data: rocm_mla/configs/mla_indexer_topk.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import triton

from .. import _platform
from ..configs import config_for
from ..configs.tables import is_amd_arch, wave_size
from ..mla_dims import FP8_DTYPES
from ..reference.indexer import INDEX_HEAD_DIM, INDEX_ROW_BYTES, SHUFFLE_TILE, vllm_rocm_shuffled
from ..triton_common import amd_options
from ._checks import Checker, debug_enabled, plan_device
from ._dispatch import select
from .latent_core import num_compute_units

OP = "mla_indexer_topk"

# The most warps a merge program takes to hold a long row's slots in registers.
MERGE_MAX_WARPS = 16


def _merge_register_slots(arch: str, merge: dict[str, Any]) -> int:
    """The most candidate slots of one row a merge program holds in registers: ``keys_per_thread``
    (the merge entry's, default 64) a thread of MERGE_MAX_WARPS warps."""
    return MERGE_MAX_WARPS * wave_size(arch) * int(merge.get("keys_per_thread", 64))


def triton_meta(
    arch: str, cfg: dict[str, Any], num_heads: int, split_keys: int, topk_p2: int, *, direct: bool, block_size: int,
    shuffled: bool, ranks: int = 0, ocp_cache: bool = False, candidate_mode: str | None = None,
    candidate_block_size: int = 1, group_rows: int = 1,
) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """``(constexprs, compile options)`` of the split kernel: the single place the op's launch and
    the ISA report's variants take them from. CHUNK, the keys a selection step reads from the
    stage, is the merge's chunk (at least one key a thread, at most the split). ``ranks`` > 0:
    the prefiltered form (each item writes that many bounds, no selection). ``ocp_cache``: the
    cache holds e4m3fn values and q is e4m3fnuz (OCP_CACHE: the kernel reads the bytes as uint8
    and turns them into q's kind). ``group_rows``: the rows an item scores from the same key tiles
    (G)."""
    threads = int(cfg["num_warps"]) * wave_size(arch)
    consts = {
        "H": int(num_heads),
        "BLOCK_H": max(16, triton.next_power_of_2(int(num_heads))),
        "D": INDEX_HEAD_DIM,
        "BLOCK_N": int(cfg["BLOCK_N"]),
        "SPLIT": int(split_keys),
        "TOPK_P2": int(topk_p2),
        "DIRECT": bool(direct),
        "POW2_PAGE": block_size & (block_size - 1) == 0,
        "SHUFFLED": bool(shuffled),
        "PAGE_TILE": block_size % int(cfg["BLOCK_N"]) == 0,
        "STREAMS": int(cfg.get("key_streams", 1)),
        "CHUNK": max(threads, min(int(split_keys), triton.next_power_of_2(int(cfg["merge"]["chunk"])))),
        "SELECT_PACK": int(cfg.get("select_pack", 1)),
        "RANKS": int(ranks),
        "OCP_CACHE": bool(ocp_cache),
        "CAND": CANDIDATE_MODES.index(candidate_mode),
        "CBS": int(candidate_block_size) if candidate_mode else 1,
        "G": int(group_rows),
    }
    options = {"num_warps": int(cfg["num_warps"]), "num_stages": int(cfg["num_stages"]), **amd_options(cfg, arch)}
    if cfg.get("maxnreg") and not is_amd_arch(arch):
        # ptxas otherwise takes up to 255 registers a thread whatever that costs in programs an SM
        options["maxnreg"] = int(cfg["maxnreg"])
    return consts, options


def merge_meta(
    arch: str, cfg: dict[str, Any], split_keys: int, topk_p2: int, num_splits: int, *, prefiltered: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(constexprs, compile options)`` of the merge kernel. A row's num_splits x topk_p2 slots are
    held in registers (REG, with as many warps as that takes, up to MERGE_MAX_WARPS) when they
    fit the config's ``keys_per_thread`` (merge entry) a thread; longer rows take the chunked
    passes (REG 0). ``prefiltered``: the slots are the prefilter's kept keys, at most
    ``prefilter_slots`` but for ties (a row with more takes the passes at run time)."""
    m = cfg["merge"]
    wave = wave_size(arch)
    s_p2 = triton.next_power_of_2(num_splits) if prefiltered else 0
    kept = prefilter_slots(topk_p2, split_keys, num_splits) if prefiltered else num_splits * topk_p2
    slots = triton.next_power_of_2(kept)
    per_warp = _merge_register_slots(arch, m) // MERGE_MAX_WARPS
    # Prefiltered: the most warps (fewer slots a thread: at 8 warps sm90's ptxas spills the gather).
    warps = MERGE_MAX_WARPS if prefiltered else int(m["num_warps"])
    while warps < MERGE_MAX_WARPS and slots > warps * per_warp:
        warps *= 2
    # At least one slot a thread (the sums then see no replicated element).
    reg = max(slots, warps * wave) if slots <= warps * per_warp else 0
    chunk = max(int(m["chunk"]), warps * wave)
    if prefiltered:  # its take counts slots in 16 bits
        reg = reg if reg < 1 << 16 else 0
    # PER: the prefiltered take's held slots a thread (the kernel's [PER, REG / PER] columns)
    per = max(1, reg // (warps * wave)) if prefiltered else 1
    consts = {"SPLIT": int(split_keys), "TOPK_P2": int(topk_p2), "CHUNK": chunk, "REG": reg, "PER": per}
    options = {"num_warps": warps}
    if prefiltered and not is_amd_arch(arch):
        # ptxas otherwise keeps 64 registers a thread at 16 warps and spills the held slots
        options["maxnreg"] = 65536 // (warps * wave)
    return {**consts, "S_P2": s_p2, "S_LOG": s_p2.bit_length() - 1 if s_p2 else 0}, options


# The prefiltered form serves calls whose split-form items fill at most 1 / PREFILTER_FILL of the
# grid's slots.
PREFILTER_FILL = 4

# The most rows a work item scores from the same key tiles (plan_indexer_topk's group_rows).
GROUP_ROWS_MAX = 4

# Bounds a prefiltered item writes: its keys' 1st, 2nd, 4th, ... up to SPLIT-th largest, doubling
# (mla_indexer_prefilter_kernel; ranks below 1 are 1).
PREFILTER_RANKS = 8


def prefilter_slots(topk_p2: int, split_keys: int, num_splits: int) -> int:
    """The most keys a prefiltered row keeps, ties at its floor aside: a split keeps fewer than twice
    the keys its bounds guarantee at the floor (fewer than its smallest rank when none reaches
    it), and the floor guarantees fewer than topk + one bound's rank step (<= split_keys / 2)."""
    rank0 = max(1, split_keys >> (PREFILTER_RANKS - 1))
    return 2 * topk_p2 + split_keys + num_splits * rank0


def prefilter_meta(cfg: dict[str, Any], split_keys: int, num_splits: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(constexprs, compile options)`` of the prefilter kernel (one program per item)."""
    consts = {"SPLIT": int(split_keys), "RANKS": PREFILTER_RANKS, "S_P2": triton.next_power_of_2(num_splits)}
    return consts, {"num_warps": int(cfg["num_warps"])}


# Candidate-block modes (CAND 0, 1, 2): none; "mask" (keys outside a row's listed blocks are no
# key: DeepSeek-V4.1's later index layers); "select" (each row's best blocks are written:
# V4.1's candidate source layer).
CANDIDATE_MODES = (None, "mask", "select")


# The fields a config's "candidate_modes" object may replace for calls with a candidate mode:
# compile options of the split kernel's tile (gfx942's OCP form at 106 scalar registers has none
# to spare for the candidate pass with 16-wide MFMA tiles; 32-wide ones leave some).
CANDIDATE_MODE_FIELDS = ("matrix_instr_nonkdim", "waves_per_eu", "kpack")


def candidate_meta(arch: str, chunk: int, mode: str, block_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(constexprs, compile options)`` of the candidate kernel of ``mode`` ("mask": the rows'
    bitmaps; "select": the rows' best blocks of ``block_size`` positions): a program of 4 warps per
    row, ``chunk`` entries a step (at least one a thread)."""
    consts = {"CHUNK": max(int(chunk), 4 * wave_size(arch))}
    if mode == "select":
        consts["CBS"] = int(block_size)
    return consts, {"num_warps": 4}


# The fields a config's "many_items" object may replace: the ones that leave every selection bit
# for bit the same (the split size and the tiles stay, so the logits and their order keys do).
MANY_ITEMS_FIELDS = ("select_pack", "maxnreg", "programs_per_cu")


def _kind_name(dt: object) -> str:
    return str(dt).replace("torch.", "") if isinstance(dt, torch.dtype) else repr(dt)


def _cache_kind(c: Checker, cache_kind: object, q_dtype: torch.dtype) -> torch.dtype:
    """The cache values' fp8 kind: ``q_dtype`` for None, else ``cache_kind`` where it is q's kind
    or float8_e4m3fn under a float8_e4m3fnuz q (ValueError naming ``cache_kind`` otherwise)."""
    if cache_kind is None or cache_kind == q_dtype:
        return q_dtype
    if cache_kind == torch.float8_e4m3fn and q_dtype == torch.float8_e4m3fnuz:
        return cache_kind
    c.fail(
        "cache_kind",
        f"None, q's kind ({_kind_name(q_dtype)}), or float8_e4m3fn with a float8_e4m3fnuz q",
        f"{_kind_name(cache_kind)} with q_dtype {_kind_name(q_dtype)}",
    )


def _int_in(v: object, lo: int, hi: int | None = None) -> bool:
    """Whether ``v`` is an int (a bool is not) in ``[lo, hi]``."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)


def _check_fields(c: Checker, cfg: dict) -> None:
    """The config fields whose values the plan cannot take as they come (ValueError naming them)."""
    block_n = int(cfg["BLOCK_N"])
    if block_n < 16 or block_n & (block_n - 1):
        c.fail("config", "BLOCK_N a power of two >= 16 (tl.dot)", block_n)
    if not _int_in(cfg["key_streams"], 1, 8):
        c.fail("config", "key_streams an int in [1, 8]", repr(cfg["key_streams"]))
    if cfg["select_pack"] not in (1, 2, 4) or isinstance(cfg["select_pack"], bool):
        c.fail("config", "select_pack 1, 2 or 4", repr(cfg["select_pack"]))
    if cfg.get("maxnreg") is not None and not _int_in(cfg["maxnreg"], 24, 255):
        c.fail("config", "maxnreg None or an int in [24, 255]", repr(cfg["maxnreg"]))
    if not _int_in(cfg["programs_per_cu"], 1):
        c.fail("config", "programs_per_cu an int >= 1", repr(cfg["programs_per_cu"]))


def _least_split(cfg: dict, wave: int, pack: int = 1) -> int:
    """The fewest keys a split may hold: a key tile, and at least one key (one candidate) a thread
    -- the scans and sums then see no replicated element -- or, with a packed selection (``pack``
    words of split_keys / pack), one word a thread."""
    return max(int(cfg["BLOCK_N"]), int(cfg["num_warps"]) * wave * pack)


def _split_keys(cfg: dict, topk_p2: int, wave: int) -> int:
    """The config's split size: a power of two holding the top-k and ``_least_split``'s keys."""
    least = _least_split(cfg, wave, int(cfg.get("select_pack", 1)))
    return max(triton.next_power_of_2(int(cfg["split_keys"])), topk_p2, least)


def _pop_override(c: Checker, cfg: dict, name: str, fields: tuple[str, ...]) -> dict | None:
    """``cfg[name]`` taken out of ``cfg``: None, or an object of some of ``fields`` that replaces the
    config's own for some calls (ValueError naming the config otherwise)."""
    obj = cfg.pop(name, None)
    if obj is not None and (not isinstance(obj, dict) or not set(obj) <= set(fields)):
        got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        c.fail("config", f"{name} an object of {list(fields)}", got)
    return obj


def _rows_grouped(cfg: dict, group_rows: int) -> int:
    """The rows an item groups when asked for ``group_rows``: at most GROUP_ROWS_MAX and the
    config's ``group_rows`` (default 1: an arch whose grouped form spills keeps 1)."""
    return min(int(group_rows), GROUP_ROWS_MAX, int(cfg.get("group_rows", 1)))


def _items(cfg: dict, device, rows: int, max_kv_len: int, topk_p2: int, wave: int) -> int:
    """How many more (row, split) items ``rows`` rows make at the config's split size than its
    persistent grid holds (``programs_per_cu`` x CUs); <= 0 when they fit."""
    items = rows * triton.cdiv(max_kv_len, _split_keys(cfg, topk_p2, wave))
    return items - num_compute_units(device) * int(cfg["programs_per_cu"])


def _with_many_items(c: Checker, cfg: dict, device, groups: int, max_kv_len: int, topk_p2: int, wave: int) -> dict:
    """``cfg`` with its ``many_items`` fields applied when the call's (row group, split) items at the
    config's split size outnumber its persistent grid (``programs_per_cu`` x CUs: every program
    loops over items), else without them. More programs a CU then pay for the fewer registers
    each may hold; with fewer items than slots they only lengthen each item (docs/notes/indexer.md)."""
    many = _pop_override(c, cfg, "many_items", MANY_ITEMS_FIELDS)
    if many is None:
        return cfg
    _check_fields(c, {**cfg, **many})  # checked whether this call takes them or not
    if _items(cfg, device, groups, max_kv_len, topk_p2, wave) > 0:
        cfg.update(many)
    return cfg


def _prefilter_split(c: Checker, cfg: dict, wave: int) -> int | None:
    """The config's prefilter split size (``"prefilter": {"split_keys": n}``), or None without one;
    n must be a power of two holding a key tile and one key a thread (ValueError)."""
    pf = cfg.get("prefilter")
    if pf is None:
        return None
    if not isinstance(pf, dict) or set(pf) != {"split_keys"}:
        got = sorted(pf) if isinstance(pf, dict) else type(pf).__name__
        c.fail("config", "prefilter an object of ['split_keys']", got)
    n = pf["split_keys"]
    least = _least_split(cfg, wave)
    if not _int_in(n, least) or n & (n - 1):
        c.fail("config", f"prefilter split_keys a power of two >= {least} (BLOCK_N, one key a thread)", repr(n))
    return n


def _cache_strides_ok(index_cache: torch.Tensor) -> bool:
    """The cache layout the kernels read (``Checker.index_cache``'s rule): each block's
    bytes contiguous, a block stride that is a multiple of 4 past them, a 4-byte aligned start."""
    nb, bs, _ = index_cache.shape
    st = index_cache.stride()
    return (
        st[2] == 1
        and (bs <= 1 or st[1] == INDEX_ROW_BYTES)
        and (nb <= 1 or (st[0] >= bs * INDEX_ROW_BYTES and st[0] % 4 == 0))
        and index_cache.data_ptr() % 4 == 0
    )


def _row_vector_ok(x: torch.Tensor, rows: int) -> bool:
    """req_id_per_token / kv_lens: int32 ``[>= rows]``, stride 1 (when more than one row reads it)."""
    return x.dim() == 1 and x.dtype == torch.int32 and x.shape[0] >= rows and (rows <= 1 or x.stride(0) == 1)


@dataclass(frozen=True)
class IndexerTopkPlan:
    """What one mla_indexer_topk call launches (``plan_indexer_topk`` makes it).

    The split kernel runs ``grid = (min(cdiv(T, group_rows) x num_splits, programs_per_cu x
    CUs),)`` persistent programs over the items, each the logits of up to ``split_keys`` keys of
    ``group_rows`` consecutive rows (one row by default) and their top-k per row, staged in the
    program's rows of the workspace (``[grid, group_rows, split_keys]`` uint32). ``direct`` (one
    split, and the arch's config allows it): it writes ``out [T, topk]`` itself. Otherwise the
    live splits write candidates after the stage (``[T, num_splits, topk_p2]`` uint32 order keys,
    then the same of int32 positions) and the merge kernel (``merge_grid = (T,)``) writes
    ``out``. ``workspace_bytes`` counts both. A plan serves every
    call with the same sizes, dtypes, device and cache layout, e.g. every layer of a step.

    ``prefiltered`` (calls whose items leave the grid's slots idle): splits of the config's
    ``prefilter.split_keys`` keys, each item with its own stage row ``[T x num_splits,
    split_keys]`` and ``ranks`` bounds; the prefilter kernel (``prefilter_grid = (T x
    num_splits,)``) keeps each split's keys at or above its row's floor, and the merge selects
    from them. Three launches; its items fit the grid's slots, so the workspace (stages, bounds,
    positions, counts, the merge's prefix) is bounded by the GPU's size, not by T x context.

    ``cache_kind``: the fp8 kind of the cache's values, q's own or e4m3fn under an e4m3fnuz q
    (``constexprs["OCP_CACHE"]``: the kernel turns each value into q's kind, exactly).

    ``candidate_mode`` (DeepSeek-V4.1's two-level indexer; blocks of ``candidate_block_size``
    positions, ``candidate_blocks`` of them a row): "mask" -- a first kernel turns each row's list
    (``candidates``) into a bitmap (``candidate_layout``), and the split kernel counts the keys
    outside the listed blocks as no key (their bytes are still read); "select" -- the split kernel
    also writes each block's largest order key, and a last kernel writes each row's best
    ``candidate_blocks`` blocks (``candidates_out``). One launch more either way.

    ``backend`` ("triton" or "reference", chosen when the plan is made) runs the call; both give
    the same answer (docs/indexer.md). ``matches`` checks a call's tensors against the plan from
    host values alone; ``mla_indexer_topk`` checks it before anything runs.
    """

    arch: str
    num_rows: int  # T
    num_heads: int  # H
    topk: int
    max_kv_len: int
    block_size: int
    shuffled: bool
    q_dtype: torch.dtype
    config: dict[str, Any]
    split_keys: int
    topk_p2: int
    num_splits: int
    page_shift: int  # log2(block_size) when it is a power of two, else 0
    grid: tuple[int]
    constexprs: dict[str, Any]
    options: dict[str, Any]
    merge_grid: tuple[int] | None
    merge_constexprs: dict[str, Any] | None
    merge_options: dict[str, Any] | None
    ranks: int = 0
    prefilter_constexprs: dict[str, Any] | None = None
    prefilter_options: dict[str, Any] | None = None
    device: torch.device | None = None  # where the calls run (cuda with its index)
    backend: str = "triton"  # "triton" or "reference" (rocm_mla.ops._dispatch.select, at plan time)
    debug: bool = False  # host-side checks of the index values at every call (a sync)
    # The cache values' fp8 kind: q_dtype, or float8_e4m3fn under a float8_e4m3fnuz q (None: q's).
    cache_kind: torch.dtype | None = None
    # Candidate blocks (DeepSeek-V4.1's two-level indexer): None, "mask" or "select"; blocks of
    # candidate_block_size positions; candidate_blocks columns in candidates / candidates_out.
    candidate_mode: str | None = None
    candidate_block_size: int = 0
    candidate_blocks: int = 0
    candidate_constexprs: dict[str, Any] | None = None
    candidate_options: dict[str, Any] | None = None
    group_rows: int = 1  # rows an item scores from the same key tiles (plan_indexer_topk)
    group_rows_asked: int = 1  # the group_rows the plan was asked for (a kept plan matches on it)
    # The op's KernelLaunch of each kernel ("split", "prefilter", "merge"; ops/_launch.py), made at
    # the plan's first run: its binaries are kept across calls. Not part of what the plan decides.
    kernel_launches: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def matches(self, q, weights, index_cache, block_table, req_id_per_token, kv_lens, *, topk) -> bool:
        """Whether an ``mla_indexer_topk`` call's tensors and ``topk`` are the ones this plan was
        made for: sizes (q ``[T, H, 128]``, weights ``[T, H]``, index_cache ``[num_blocks,
        block_size, 132]``), dtypes, device and the strides the kernels assume, from host values
        alone (no device read: capturable). The block table's width is free: a row with more keys
        than ``max_keys`` gets the bad-row sentinel. ``mla_indexer_topk`` names what differs when
        it is False."""
        T, H, dev = self.num_rows, self.num_heads, self.device
        try:
            return (
                topk == self.topk
                and not isinstance(topk, bool)
                and q.shape == (T, H, INDEX_HEAD_DIM)
                and q.dtype == self.q_dtype
                and q.stride(2) == 1
                and weights.shape == (T, H)
                and weights.dtype == torch.float32
                and index_cache.dim() == 3
                and index_cache.shape[1] == self.block_size
                and index_cache.shape[2] == INDEX_ROW_BYTES
                and (index_cache.dtype == torch.uint8 or index_cache.dtype in FP8_DTYPES)
                and _cache_strides_ok(index_cache)
                and block_table.dim() == 2
                and block_table.dtype == torch.int32
                and (block_table.shape[1] <= 1 or block_table.stride(1) == 1)
                and _row_vector_ok(req_id_per_token, T)
                and _row_vector_ok(kv_lens, T)
                and q.device == weights.device == index_cache.device == block_table.device == dev
                and req_id_per_token.device == kv_lens.device == dev
            )
        except (AttributeError, TypeError):  # not tensors
            return False

    @property
    def max_keys(self) -> int:
        """The most keys a row may see: what the splits cover, ``num_splits x split_keys`` (>=
        max_kv_len). A row with more (or more than its block table holds) gets the bad-row
        sentinel on every backend."""
        return self.num_splits * self.split_keys

    @property
    def direct(self) -> bool:
        return self.merge_grid is None

    @property
    def prefiltered(self) -> bool:
        return self.ranks > 0

    @property
    def items(self) -> int:
        """(row, split) pairs: T x num_splits (the prefiltered form's stage rows and bounds)."""
        return self.num_rows * self.num_splits

    @property
    def prefilter_grid(self) -> tuple[int]:
        """Prefiltered: the prefilter kernel's grid, a program per (row, split) item."""
        return (self.items,)

    @property
    def stage_numel(self) -> int:
        """int32 elements of the logit stages: grid x group_rows x split_keys (prefiltered: items x
        split_keys)."""
        return (self.items if self.prefiltered else self.grid[0] * self.group_rows) * self.split_keys

    def prefilter_layout(self) -> dict[str, tuple[int, int]]:
        """Prefiltered: ``{name: (start, numel)}`` of the workspace's parts after the stage (bounds,
        positions, counts, the merge's prefix)."""
        parts = {
            "bounds": self.items * self.ranks,
            "positions": self.items * self.split_keys,
            "counts": self.items,
            "prefix": self.num_rows * self.merge_constexprs["S_P2"],
        }
        out, at = {}, self.stage_numel + self.candidate_layout()[1]
        for name, numel in parts.items():
            out[name] = (at, numel)
            at += numel
        return out

    @property
    def candidate_row_words(self) -> int:
        """int32 words a row takes in the candidate blocks' part: "mask", a flag word (the row's
        list holds an entry < -1) and a bit a block of ``max_keys``; "select", an order key a
        block; 0 without a candidate mode."""
        if self.candidate_mode is None:
            return 0
        blocks = self.max_keys // self.candidate_block_size
        return 1 + triton.cdiv(blocks, 32) if self.candidate_mode == "mask" else blocks

    def candidate_layout(self) -> tuple[int, int]:
        """``(start, numel)`` of the candidate blocks' part of the workspace: ``[T,
        candidate_row_words]`` int32 right after the stages (where the split kernel finds it)."""
        return self.stage_numel, self.num_rows * self.candidate_row_words

    @property
    def workspace_numel(self) -> int:
        """int32 elements of the workspace: the stages, the candidate blocks' part
        (``candidate_layout``), then (more than one split) the candidates' keys and positions and
        the merge's read-ahead (a row's register-held slots past the last row's candidates);
        prefiltered: ``prefilter_layout``'s parts."""
        start, numel = self.candidate_layout()
        if self.direct:
            return start + numel
        if self.prefiltered:
            start, numel = self.prefilter_layout()["prefix"]
            return start + numel
        cands = 2 * self.num_rows * self.num_splits * self.topk_p2
        return start + numel + cands + max(0, self.merge_constexprs["REG"] - self.num_splits * self.topk_p2)

    @property
    def workspace_bytes(self) -> int:
        return 4 * self.workspace_numel

    @property
    def launches(self) -> int:
        return (1 if self.direct else 3 if self.prefiltered else 2) + (self.candidate_mode is not None)


def _size_splits(
    c: Checker,
    tier_cfg: dict,
    arch: str,
    device: torch.device,
    num_rows: int,
    group_rows: int,
    max_kv_len: int,
    topk_p2: int,
) -> tuple[dict, int, int, int, int]:
    """The split size of ``num_rows`` rows in groups of ``group_rows``, from the sizes alone:
    (the launch config with its many_items form applied or dropped, split_keys, num_splits, the
    prefilter's ranks (0: not prefiltered), the persistent grid's slots). ``tier_cfg`` is not
    changed. The answer does not depend on the split size, so none of this costs batch
    invariance."""
    cfg = dict(tier_cfg)
    wave = wave_size(arch)
    groups = triton.cdiv(num_rows, group_rows)
    if group_rows > 1:  # its few registers do not hold a group's tiles (the ISA report: it spills)
        _pop_override(c, cfg, "many_items", MANY_ITEMS_FIELDS)
    cfg = _with_many_items(c, cfg, device, groups, max_kv_len, topk_p2, wave)
    split_keys = _split_keys(cfg, topk_p2, wave)
    least = max(2 * topk_p2, _least_split(cfg, wave, cfg["select_pack"]))
    m = cfg["merge"]
    cfg["merge"] = {**m, "chunk": max(triton.next_power_of_2(int(m["chunk"])), int(m["num_warps"]) * wave)}
    # Few rows: halve the split until the items fill the grid, while a split still halves what it
    # keeps (>= 2 x topk_p2) and the merge holds a row's candidates in registers.
    register_slots = _merge_register_slots(arch, cfg["merge"])
    slots_target = num_compute_units(device) * int(cfg["programs_per_cu"])
    while (
        split_keys // 2 >= least
        and groups * triton.cdiv(max_kv_len, split_keys) < slots_target
        and triton.cdiv(max_kv_len, split_keys // 2) * topk_p2 <= register_slots
    ):
        split_keys //= 2
    S = max(1, triton.cdiv(max_kv_len, split_keys))
    # Items that leave most slots idle (at most 1 / PREFILTER_FILL of them busy): the prefiltered
    # form, whose splits need not halve what they keep, takes the smallest split (from the
    # config's prefilter size up) whose items fit the slots, where that cuts the rows finer.
    # Where the split form's items fill half the slots it was the slower (docs/notes/indexer.md).
    pf_split = _prefilter_split(c, cfg, wave)
    ranks = 0
    if pf_split is not None and groups * S * PREFILTER_FILL <= slots_target:
        while groups * triton.cdiv(max_kv_len, pf_split) > slots_target:
            pf_split *= 2
        if pf_split < split_keys and max_kv_len > pf_split:
            split_keys, S, ranks = pf_split, triton.cdiv(max_kv_len, pf_split), PREFILTER_RANKS
    return cfg, split_keys, S, ranks, slots_target


def plan_indexer_topk(
    *,
    num_rows: int,
    num_heads: int,
    topk: int,
    max_kv_len: int,
    block_size: int,
    q_dtype: torch.dtype,
    device: torch.device | str,
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
    """Everything an ``mla_indexer_topk`` call with these sizes launches, decided once on the host
    from the sizes alone (no device value is read): make it once per step and pass it to every
    layer's call (``mla_indexer_topk(..., plan=plan)``), which checks its tensors against it
    (``IndexerTopkPlan.matches``). ``plan_indexer_topk_for`` reads the sizes from the tensors.

    Args:
        num_rows: T, the query rows (``q [T, H, 128]``; decode, MTP and prefill rows alike).
        num_heads: H, indexer heads (64 for DeepSeek-V3.2, 32 for GLM-5.x; any H >= 1).
        topk: keys kept per row (2048 for the models; >= 1).
        max_kv_len: the most keys any row sees (>= every kv_lens[t]); the block table's width x
            block_size always qualifies. It fixes the split count without reading kv_lens. A row
            with more keys than the plan's splits cover (``max_keys``, num_splits x split_keys
            >= max_kv_len) gets the bad-row sentinel on every backend, never a partial answer.
        block_size: tokens per cache page (``index_cache [num_blocks, block_size, 132]``).
        q_dtype: q's fp8 kind (float8_e4m3fn or float8_e4m3fnuz).
        device: where the calls run (its arch and CU count; the CPU interpreter counts 4).
        shuffled: the cache's value layout, as ``indexer_k_cache_write`` takes it: 16 x 16 tiles
            (True; block_size 1 or a multiple of 16) or flat rows (False). None: vLLM's ROCm rule,
            tiles above block_size 1 (``reference.indexer.vllm_rocm_shuffled``).
        config: launch data replacing the configs' entry for the arch (tuning). Its
            ``many_items`` fields (select_pack, maxnreg, programs_per_cu) replace the object's own
            when the call's (row, split) items outnumber ``programs_per_cu`` x CUs; its
            ``prefilter`` (``{"split_keys": n}``) serves calls whose items fill at most
            1 / PREFILTER_FILL of them (``IndexerTopkPlan.prefiltered``). The answer is the same
            bit for bit whichever form a call takes.
        backend: "triton" or "reference" to force one (default: configs' backend_order; see
            ``rocm_mla.ops._dispatch``; ``ROCM_MLA_BACKEND_MLA_INDEXER_TOPK`` in the environment).
        debug: every call checks the index values on the host (a sync, not capturable) and
            raises naming the first bad one. Default: ``ROCM_MLA_DEBUG=1``.
        cache_kind: the fp8 kind of the cache's values: None or q_dtype (read as q's kind), or
            float8_e4m3fn with a float8_e4m3fnuz q (DeepSeek-V4's compressed indexer cache, which
            vLLM writes as OCP e4m3fn on every platform while q takes the platform's kind,
            e4m3fnuz on gfx942): each value becomes the e4m3fnuz code of half its value and its
            scale is doubled, exactly, so the dot stays fp8 in q's kind. Any other combination is
            a ValueError.
        candidate_mode: DeepSeek-V4.1's two-level indexer. None (default): every visible key
            counts. "mask": the call's ``candidates [>= T, candidate_blocks]`` lists each row's
            blocks (ids ``position // candidate_block_size``, -1 unused); keys outside them count
            as no key. "select": the call also writes ``candidates_out`` with each row's best
            blocks by their largest logit (the newest block always among them).
        candidate_block_size: positions a candidate block holds (with a mode): a power of two, at
            most the split kernel's selection chunk (``constexprs["CHUNK"]``, at least 256 on every
            shipped config; vLLM uses 8).
        candidate_blocks: the candidate lists' columns (with a mode; >= 1; vLLM's 2048).
        group_rows: rows a work item scores from the same key tiles (>= 1; it takes at most
            GROUP_ROWS_MAX and the arch's config's ``group_rows``, default 1, and 1 where rows
            alone outnumber the grid with a ``many_items`` form or the grouped call would be
            prefiltered, the forms measured faster there: the plan's ``group_rows`` says what it
            took): consecutive rows ``g x group_rows ..``; those of one request
            (MTP rows: vLLM's rows a decode request, ``num_speculative_tokens + 1``; a prefill's
            rows) read each key once for them all. Rows of different requests in a group take a
            pass each: any request ids give the same answer, bit for bit, whatever the group
            (each row keeps its own dot and sum); only the bytes read change.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    for name, v, least in (("num_rows", num_rows, 0), ("max_kv_len", max_kv_len, 0), ("num_heads", num_heads, 1),
                           ("topk", topk, 1), ("block_size", block_size, 1)):  # fmt: skip
        c.count(name, v, least)
    if q_dtype not in FP8_DTYPES:
        c.fail("q_dtype", "float8_e4m3fn or float8_e4m3fnuz", str(q_dtype).replace("torch.", ""), TypeError)
    if shuffled is not None and not isinstance(shuffled, bool):
        c.fail("shuffled", "True, False or None (vLLM's ROCm rule)", repr(shuffled), TypeError)
    shuffle = vllm_rocm_shuffled(block_size) if shuffled is None else shuffled
    if shuffle and block_size % SHUFFLE_TILE:
        why = "vLLM's ROCm rule shuffles every block_size > 1" if shuffled is None else "shuffled=True"
        c.fail("block_size", f"1 or a multiple of 16 ({why}; 16 x 16 tiles)", block_size)
    if debug is not None and not isinstance(debug, bool):
        c.fail("debug", "None, True or False", repr(debug), TypeError)
    kind = _cache_kind(c, cache_kind, q_dtype)
    _check_candidate_knobs(c, candidate_mode, candidate_block_size, candidate_blocks)
    if not _int_in(group_rows, 1):
        c.fail("group_rows", "an int >= 1", repr(group_rows))
    device = plan_device(device)
    impl = select(OP, device, backend, has_hip=False)
    arch = _platform.device_arch(device)
    tier = config_for(OP, arch)["tiers"][0]
    cfg = dict(config) if config is not None else dict(tier)
    cfg.setdefault("merge", tier["merge"])
    cfg.setdefault("programs_per_cu", 1)
    for key in ("split_keys", "BLOCK_N", "num_warps", "num_stages"):
        if key not in cfg:
            c.fail("config", f"a {key} entry", f"keys {sorted(cfg)}")
    cfg.setdefault("key_streams", 1)
    cfg.setdefault("select_pack", 1)
    two_level = _pop_override(c, cfg, "candidate_modes", CANDIDATE_MODE_FIELDS)
    if two_level is not None and candidate_mode is not None:
        cfg.update(two_level)
    _check_fields(c, cfg)
    topk_p2 = triton.next_power_of_2(topk)
    wave = wave_size(arch)
    asked = group_rows
    group_rows = _rows_grouped(cfg, group_rows)  # the answer is the same whatever the group
    if group_rows > 1 and "many_items" in cfg and _items(cfg, device, num_rows, max_kv_len, topk_p2, wave) > 0:
        # Rows alone outnumber the grid: their many_items form (more programs a CU) was the faster
        # (docs/notes/indexer.md, "Row groups").
        group_rows = 1
    launch, split_keys, S, ranks, slots_target = _size_splits(
        c, cfg, arch, device, num_rows, group_rows, max_kv_len, topk_p2
    )
    if ranks and group_rows > 1:
        # Grouping left items few enough for the prefiltered form, which was the slower grouped
        # (docs/notes/indexer.md, "Row groups"): the splits of rows alone. A grouped plan is never
        # prefiltered.
        group_rows = 1
        launch, split_keys, S, ranks, slots_target = _size_splits(
            c, cfg, arch, device, num_rows, group_rows, max_kv_len, topk_p2
        )
    cfg = launch
    groups = triton.cdiv(num_rows, group_rows)
    direct = S == 1 and bool(cfg.get("direct", True)) and not ranks
    consts, options = triton_meta(
        arch, cfg, num_heads, split_keys, topk_p2, direct=direct, block_size=block_size, shuffled=shuffle,
        ranks=ranks, ocp_cache=kind != q_dtype, candidate_mode=candidate_mode,
        candidate_block_size=candidate_block_size, group_rows=group_rows,
    )  # fmt: skip
    if candidate_mode and candidate_block_size > consts["CHUNK"]:
        c.fail(
            "candidate_block_size", f"at most the split kernel's chunk ({consts['CHUNK']} keys)", candidate_block_size
        )
    unused = (None, None)
    m_consts, m_options = unused if direct else merge_meta(arch, cfg, split_keys, topk_p2, S, prefiltered=ranks > 0)
    p_consts, p_options = prefilter_meta(cfg, split_keys, S) if ranks else unused
    c_consts, c_options = (
        candidate_meta(arch, cfg["merge"]["chunk"], candidate_mode, candidate_block_size) if candidate_mode else unused
    )
    return IndexerTopkPlan(
        arch=arch,
        num_rows=num_rows,
        num_heads=num_heads,
        topk=topk,
        max_kv_len=max_kv_len,
        block_size=block_size,
        shuffled=shuffle,
        q_dtype=q_dtype,
        config=cfg,
        split_keys=split_keys,
        topk_p2=topk_p2,
        num_splits=S,
        page_shift=block_size.bit_length() - 1 if consts["POW2_PAGE"] else 0,
        grid=(max(1, min(groups * S, slots_target)),),
        constexprs=consts,
        options=options,
        merge_grid=None if direct else (num_rows,),
        merge_constexprs=m_consts,
        merge_options=m_options,
        ranks=ranks,
        prefilter_constexprs=p_consts,
        prefilter_options=p_options,
        device=device,
        backend=impl,
        debug=debug_enabled(debug),
        cache_kind=kind,
        candidate_mode=candidate_mode,
        candidate_block_size=int(candidate_block_size) if candidate_mode else 0,
        candidate_blocks=int(candidate_blocks) if candidate_mode else 0,
        candidate_constexprs=c_consts,
        candidate_options=c_options,
        group_rows=group_rows,
        group_rows_asked=asked,
    )


def _check_candidate_knobs(c: Checker, mode: object, block_size: object, blocks: object) -> None:
    """The candidate knobs' rules (ValueError / TypeError naming the knob)."""
    if mode not in CANDIDATE_MODES:
        c.fail("candidate_mode", "None, 'mask' or 'select'", repr(mode))
    if mode is None:
        for name, v in (("candidate_block_size", block_size), ("candidate_blocks", blocks)):
            if v not in (0, None):
                c.fail(name, "0 without a candidate_mode", repr(v))
        return
    if not _int_in(block_size, 1) or block_size & (block_size - 1):
        c.fail("candidate_block_size", f"a power of two >= 1 with candidate_mode {mode!r}", repr(block_size))
    if not _int_in(blocks, 1):
        c.fail("candidate_blocks", f"an int >= 1 with candidate_mode {mode!r}", repr(blocks))


__all__ = [
    "OP",
    "CANDIDATE_MODES",
    "GROUP_ROWS_MAX",
    "IndexerTopkPlan",
    "plan_indexer_topk",
    "triton_meta",
    "merge_meta",
    "prefilter_meta",
    "candidate_meta",
]
