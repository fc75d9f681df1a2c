"""mla_indexer_topk: the Triton variants the op can launch, for the ISA report.

Constexprs and options come from ``rocm_mla.ops.indexer_topk_plan.triton_meta`` / ``merge_meta``,
the functions the plan takes a launch's from.
"""

from __future__ import annotations

import itertools

import torch

from ..configs import config_for, platform_fp8_dtype
from ..kernels.indexer_topk import (
    mla_indexer_candidate_mask_kernel,
    mla_indexer_candidate_select_kernel,
    mla_indexer_merge_kernel,
    mla_indexer_prefilter_kernel,
    mla_indexer_split_topk_kernel,
)
from ..ops.indexer_topk_plan import OP, PREFILTER_RANKS, candidate_meta, merge_meta, prefilter_meta, triton_meta
from ..triton_common import amd_options, triton_type
from .triton_variant import TritonVariant

_SPLIT_PTRS = (
    "q", "weights", "cache", "block_table", "req_ids", "kv_lens", "out", "cand_key", "cand_pos", "stage", "bounds",
)  # fmt: skip
_SPLIT_I32 = (
    "num_rows", "num_splits", "topk", "page_size", "page_shift", "capacity", "num_pages", "num_reqs",
    "s_q_r", "s_q_h", "s_w_r", "s_c_blk", "s_bt_b", "s_o_r",
)  # fmt: skip
# DeepSeek-V4.1's two-level indexer: its top-k and candidate blocks (candidate_block_size 8).
_V41_TOPK, _V41_CBS = 512, 8
_SPLIT_ALIGNED = ("s_q_r", "s_q_h", "s_c_blk", "s_bt_b", "s_o_r")  # the strides of 16-byte aligned rows
_UNIT = {"s_req": 1, "s_kl": 1}  # unit strides (Triton specialises ints equal to 1)
_ONES = {"s_w_h": 1, **_UNIT}


def _variant(config: str, fn, ptrs: tuple, ints: tuple, aligned: tuple, constexprs: dict, options: dict, *,
             typed: dict | None = None, expects_mfma: bool = False, resident: int = 0) -> TritonVariant:  # fmt: skip
    """A variant of one of the op's kernels: its pointers ``ptrs`` (int32 but those ``typed`` names),
    every one 16-byte aligned, then its int32 arguments ``ints``, of which ``aligned`` are multiples
    of 16; ``resident``: the programs a CU its persistent grid places at once (the split kernel's)."""
    signature = {**{p: "*i32" for p in ptrs}, **(typed or {}), **{n: "i32" for n in ints}}
    return TritonVariant(
        kernel=OP, config=config, fn=fn, signature=signature, constexprs=constexprs, options=options,
        divisible_by_16=ptrs + aligned, expects_mfma=expects_mfma, resident=resident,
    )  # fmt: skip


def triton_variants(arch: str) -> list[TritonVariant]:
    """What the op launches on ``arch`` with the models' sizes (topk 2048): H 64 (DeepSeek-V3.2) and
    32 (GLM-5.x), over the arch's fp8 kind, one split (direct, where the arch's config allows it)
    and split + merge, vLLM's ROCm cache layout (shuffled, block 64) and the flat one of block 1;
    where the config has a prefilter, its three kernels for a 128K-key row. Where the arch's kind is
    e4m3fnuz (gfx942), the split kernel reading an e4m3fn cache (``cache_kind``, OCP_CACHE: vLLM's
    DeepSeek-V4 indexer caches, flat (C4) or shuffled, block 64) in the config's split and
    prefiltered forms, H 64. DeepSeek-V4.1's two-level indexer (H 64, top-512, blocks of 8, its
    cache's kind as above, shuffled): the split kernel's candidate mask and block keys in the
    config's split form and, where it is a kernel of its own, its many_items form, and the two
    candidate kernels. Row groups up to the config's ``group_rows`` (H 64, vLLM's layout) in the
    split form. A split row claims the programs a CU its grid places (``resident``)."""
    fp8 = platform_fp8_dtype(arch)
    fname = triton_type(fp8)
    cfg = config_for(OP, arch)["tiers"][0]
    topk_p2 = 2048
    split_keys = max(int(cfg["split_keys"]), topk_p2)
    out: list[TritonVariant] = []
    directs = (True, False) if cfg.get("direct", True) else (False,)
    # (form, layouts, split keys, ranks, programs a CU its grid places): the config's own (both
    # layouts), its many_items form and its prefiltered form (vLLM's layout). A many_items form
    # that changes the grid alone is the config's own kernel, then placed at its programs a CU.
    ppc = int(cfg.get("programs_per_cu", 1))
    many = cfg.get("many_items")
    grid_only = many is not None and set(many) <= {"programs_per_cu"}
    own_ppc = max(ppc, int(many["programs_per_cu"])) if grid_only else ppc
    forms = [(cfg, (True, False), split_keys, 0, own_ppc)]
    if many is not None and not grid_only:
        forms.append(({**cfg, **many}, (True,), split_keys, 0, int(many.get("programs_per_cu", ppc))))
    pf = cfg.get("prefilter")
    if pf:
        forms.append((cfg, (True,), int(pf["split_keys"]), PREFILTER_RANKS, ppc))
    typed = {"q": f"*{fname}", "weights": "*fp32", "cache": f"*{fname}"}
    # (form, split keys, ranks, H, direct, shuffled, block size, e4m3fn cache under an e4m3fnuz q,
    # candidate mode, top-k, programs a CU)
    launches = []
    for (form, layouts, split, ranks, resident), H, direct in itertools.product(forms, (64, 32), directs):
        if ranks and direct:
            continue
        for shuffled in layouts if H == 64 and direct == directs[0] else (True,):
            block = 64 if shuffled else 1
            launches.append((form, split, ranks, H, direct, shuffled, block, False, None, topk_p2, resident))
    mixed = fp8 == torch.float8_e4m3fnuz
    if mixed:
        launches += [(form, split, ranks, 64, False, shuffled, 64, True, None, topk_p2, resident) for form, _, split,
                     ranks, resident in forms if form is cfg for shuffled in (False, True)]  # fmt: skip
    # The plan's configs for a candidate mode: the split form, and its many_items form (the plan
    # takes it for a candidate mode's calls as for any).
    two_level = {**cfg, **cfg.get("candidate_modes", {})}
    two_levels = [(two_level, own_ppc)]
    if many is not None and not grid_only:
        two_levels.append(({**two_level, **many}, int(many.get("programs_per_cu", ppc))))
    launches += [(form, split_keys, 0, 64, False, True, 64, mixed, mode, _V41_TOPK, resident)
                 for form, resident in two_levels for mode in ("mask", "select")]  # fmt: skip
    launches = [(*launch, 1) for launch in launches]
    # Row groups (MTP rows of a request scored from the same key tiles) up to the config's
    # group_rows, in the form a grouped call takes (the config's split form without many_items; a
    # grouped plan is never prefiltered), H 64, vLLM's layout; over the e4m3fn cache too where q
    # is e4m3fnuz.
    groups = range(2, int(cfg.get("group_rows", 1)) + 1)
    grouped = [(split_keys, 0)]
    launches += [(cfg, split, ranks, 64, False, True, 64, ocp, None, topk_p2, ppc, g)
                 for split, ranks in grouped for g in groups for ocp in sorted({False, mixed})]  # fmt: skip
    for form, split, ranks, H, direct, shuffled, block, ocp, mode, topk, resident, group in launches:
        meta, options = triton_meta(
            arch, form, H, split, topk, direct=direct, block_size=block, shuffled=shuffled, ranks=ranks,
            ocp_cache=ocp, candidate_mode=mode, candidate_block_size=_V41_CBS, group_rows=group,
        )  # fmt: skip
        amd = "".join(f" {k[:4]}{v}" for k, v in amd_options(form, arch).items())
        pack = f" pack{meta['SELECT_PACK']}" if meta["SELECT_PACK"] > 1 else ""
        regs = f" maxnreg{options['maxnreg']}" if "maxnreg" in options else ""
        layout = "shuffled" if shuffled else "flat"
        if ocp:
            layout = f"cache={triton_type(torch.float8_e4m3fn)} {layout} block{block}"
        label = (
            f"q={fname} H{H} topk{topk} split{split} N{meta['BLOCK_N']} w{options['num_warps']}"
            f" s{options['num_stages']}{amd}{pack}{regs} {layout} "
            f"{'bounds' + str(ranks) if ranks else 'direct' if direct else 'split'}"
            f"{f' candidates={mode} block{_V41_CBS}' if mode else ''}{f' rows{group}' if group > 1 else ''}"
        )
        out.append(_variant(
            label, mla_indexer_split_topk_kernel, _SPLIT_PTRS, _SPLIT_I32, _SPLIT_ALIGNED, {**_ONES, **meta},
            options, typed={**typed, "cache": "*u8"} if ocp else typed, expects_mfma=True, resident=resident,
        ))  # fmt: skip
    # A 128K-token row (its slots held in registers) and a 1M-token one (the chunked passes); the
    # prefiltered merge of a 128K-token row (kept keys in registers, passes past them).
    merges = [(split_keys, context // split_keys, False) for context in (1 << 17, 1 << 20)]
    if pf:
        merges.append((int(pf["split_keys"]), (1 << 17) // int(pf["split_keys"]), True))
    for split, num_splits, prefiltered in merges:
        m_consts, m_options = merge_meta(arch, cfg, split, topk_p2, num_splits, prefiltered=prefiltered)
        label = (
            f"merge topk{topk_p2} chunk{m_consts['CHUNK']} w{m_options['num_warps']} "
            f"{'registers' + str(m_consts['REG']) if m_consts['REG'] else 'passes'}"
            f"{' prefiltered S' + str(num_splits) if prefiltered else ''}"
        )
        out.append(_variant(
            label, mla_indexer_merge_kernel, ("cand_key", "cand_pos", "counts", "prefix", "req_ids", "kv_lens", "out"),
            ("num_rows", "num_splits", "topk", "capacity", "num_reqs", "s_o_r"), ("s_o_r",), {**_UNIT, **m_consts},
            m_options,
        ))  # fmt: skip
    if pf:
        p_consts, p_options = prefilter_meta(cfg, int(pf["split_keys"]), (1 << 17) // int(pf["split_keys"]))
        label = f"prefilter split{p_consts['SPLIT']} ranks{p_consts['RANKS']} S{p_consts['S_P2']}"
        out.append(_variant(
            f"{label} w{p_options['num_warps']}", mla_indexer_prefilter_kernel,
            ("stage", "bounds", "counts", "cand_pos", "req_ids", "kv_lens"),
            ("num_rows", "num_splits", "topk", "capacity", "num_reqs"), (), {**_UNIT, **p_consts}, p_options,
        ))  # fmt: skip
    m_consts, m_options = candidate_meta(arch, cfg["merge"]["chunk"], "mask", _V41_CBS)
    out.append(_variant(
        f"candidate mask chunk{m_consts['CHUNK']} w{m_options['num_warps']}", mla_indexer_candidate_mask_kernel,
        ("candidates", "bits"), ("num_cols", "row_words", "s_c_r"), ("s_c_r",), m_consts, m_options,
    ))  # fmt: skip
    s_consts, s_options = candidate_meta(arch, cfg["merge"]["chunk"], "select", _V41_CBS)
    select_ints = ("num_cols", "row_words", "capacity", "max_keys", "num_reqs", "s_o_r")
    out.append(_variant(
        f"candidate select block{_V41_CBS} chunk{s_consts['CHUNK']} w{s_options['num_warps']}",
        mla_indexer_candidate_select_kernel, ("block_keys", "req_ids", "kv_lens", "out"), select_ints, ("s_o_r",),
        {**_UNIT, **s_consts}, s_options,
    ))  # fmt: skip
    return out


__all__ = ["triton_variants"]
