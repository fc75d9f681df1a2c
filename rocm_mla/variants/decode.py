"""mla_decode: the Triton variants the wrapper can launch, for the ISA report.

Constexprs and options come from ``rocm_mla.ops.decode_plan.triton_meta`` / ``latent_core.reduce_meta``, the
functions ``plan_decode`` takes a launch's from; the stage-1 config from ``tier_config``, the plan's choice.
"""

from __future__ import annotations

from typing import Any

import torch

from ..configs import config_for, is_amd_arch, platform_fp8_dtype
from ..kernels.decode import mla_decode_stage1_kernel
from ..kernels.latent_core import mla_decode_reduce_kernel
from ..ops.decode_plan import (
    FP8_DOTS,
    OP,
    REDUCE_ARGS,
    STAGE1_ARGS,
    argument_types,
    invariant_split,
    tier_config,
    triton_meta,
)
from ..ops.latent_core import reduce_meta
from ..triton_common import amd_options, triton_type
from .triton_variant import TritonVariant


def _stage1_variant(
    arch: str,
    cfg: dict[str, Any],
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    direct: bool,
    scale_ptr: bool,
    tag: str,
    page_mode: int = 2,
    split: tuple[int, int] = (0, 0),
) -> TritonVariant:
    qname, kvname = triton_type(q_dtype), triton_type(kv_dtype)
    sig, ones, div16 = argument_types(STAGE1_ARGS, {"q": qname, "kv": kvname})
    meta, options = triton_meta(
        arch,
        cfg,
        q_dtype,
        kv_dtype != q_dtype,
        direct=direct,
        has_scale_ptr=scale_ptr,
        page_mode=page_mode,
        split_tokens=split[0],
        split_cap=split[1],
    )
    # The split rule's constexprs keep the kernel's defaults (0: the default mode) unless the
    # batch-invariant plan sets them: a launch leaves them out, an AOT compile must name them.
    consts = {**ones, "SPLIT_TOKENS": 0, "SPLIT_CAP": 0, "SPLIT_RUNS": False, **meta}
    amd = "".join(f" {k[:4]}{v}" for k, v in amd_options(cfg, arch).items())
    vsplit = f"v{consts['V_SPLIT']}" if consts["V_SPLIT"] > 1 else ""
    label = (
        f"{tag}q={qname} kv={kvname} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} d{consts['D_SPLIT']}{vsplit}"
        f"{'r' if cfg.get('RELOAD_K') else ''}{'h' if consts['F16_DOT'] else ''}"
        f"{'g' if consts['CLAMP_PAGES'] else ''}{'q8' if consts['FP8_QK'] else ''}{'p8' if consts['FP8_PV'] else ''}"
        f"{'u' if consts.get('SPLIT_RUNS') else ''} "
        f"w{cfg['num_warps']} "
        f"s{cfg['num_stages']}{amd} {'direct' if direct else 'split'}{' kscale*' if scale_ptr else ''}"
        f"{'' if page_mode == 2 else f' page{page_mode}'}"
    )
    # float32 q runs IEEE dots: MFMA has f32 instructions, NVIDIA tensor cores do not (FMA there).
    return TritonVariant(
        kernel="mla_decode_stage1",
        config=label,
        fn=mla_decode_stage1_kernel,
        signature=sig,
        constexprs=consts,
        options=options,
        expects_mfma=q_dtype != torch.float32 or is_amd_arch(arch),
        divisible_by_16=div16,
    )


def triton_variants(arch: str) -> list[TritonVariant]:
    """Every stage-1 config the wrapper can pick on ``arch`` (each tier, with its fp8/fp32
    overrides, fp8 caches in each fp8_dots mode, and the tuning candidates), for each q
    dtype and cache dtype, direct and split, fp8 with a tensor or a number scale, tiles inside
    one page (PAGE_MODE 2); each tier once more with pages smaller than a tile (PAGE_MODE 1 and
    0, bf16); and the stage-2 reduce for each output dtype and tile."""
    table = config_for(OP, arch)
    fp8 = platform_fp8_dtype(arch)  # the kind a uint8 "fp8" cache is viewed as
    variants: list[TritonVariant] = []
    seen: set[str] = set()

    def add(v: TritonVariant):
        if v.config not in seen:
            seen.add(v.config)
            variants.append(v)

    # (q dtype, cache dtype): the 16/32-bit caches hold q's dtype.
    combos = [
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.float32, torch.float32),
        (torch.bfloat16, fp8),
        (torch.float16, fp8),
    ]
    for tier in table["tiers"]:
        for qdt, kvdt in combos:
            is_fp8 = kvdt == fp8
            for dots in FP8_DOTS if is_fp8 else ("none",):  # mla_decode(fp8_dots=...)
                cfg = tier_config(arch, tier["BLOCK_H"], qdt, is_fp8, fp8_dots=dots)
                for direct in (True, False):
                    for sptr in (False, True) if is_fp8 else (False,):
                        add(_stage1_variant(arch, cfg, qdt, kvdt, direct, sptr, ""))
        # Pages smaller than a tile (block 16, block 1: PAGE_MODE 1; other sizes: 0), bf16 q and cache.
        cfg = tier_config(arch, tier["BLOCK_H"], torch.bfloat16, False)
        for mode in (1, 0):
            add(_stage1_variant(arch, cfg, torch.bfloat16, torch.bfloat16, False, False, "", mode))
    # Batch-invariant mode (SPLIT_TOKENS / SPLIT_CAP set): each tier, bf16 and fp8 caches, both launches.
    for tier in table["tiers"]:
        for qdt, kvdt in combos[:1] + combos[3:4]:
            is_fp8 = kvdt == fp8
            cfg = tier_config(arch, tier["BLOCK_H"], qdt, is_fp8)
            split = invariant_split(arch, cfg)
            for direct in (True, False):
                add(_stage1_variant(arch, cfg, qdt, kvdt, direct, is_fp8, "inv ", split=split))
    # Tuning candidates: the dtypes the benchmark tunes (bf16 and fp8 caches with bf16 q).
    for cand in table["candidates"]:
        for qdt, kvdt in combos[:1] + combos[3:4]:
            is_fp8 = kvdt == fp8
            cfg = tier_config(arch, 0, qdt, is_fp8, cand)
            for direct in (True, False):
                add(_stage1_variant(arch, cfg, qdt, kvdt, direct, is_fp8, "cand "))
    s_values = sorted({1 << i for i in range(0, 7)} | {int(table["split"]["max_splits"])})
    for qdt in (torch.bfloat16, torch.float16, torch.float32):
        oname = triton_type(qdt)
        # One variant per distinct (constexprs, options) the split counts lead to.
        metas = {}
        for s in s_values[1:]:
            consts, options = reduce_meta(s, arch)
            metas.setdefault((consts["BLOCK_S"], consts["BLOCK_D"], ""), (consts, options))
        # Batch-invariant mode: the reduce's tiles for each tier's split rule (the rule itself is
        # an argument), for the caches this output dtype runs with (fp8 in each fp8_dots mode).
        kinds = [(False, "none")] + ([(True, d) for d in FP8_DOTS] if qdt != torch.float32 else [])
        # Its tile follows the batch (reduce_meta): one program per row at large batches, the
        # columns cut in 2, 4 or 8 for few rows; a tile of 2 splits and of the arch's max_splits.
        cus = 64
        for tier in table["tiers"]:
            for is_fp8, dots in kinds:
                cfg = tier_config(arch, tier["BLOCK_H"], qdt, is_fp8, fp8_dots=dots)
                block_n = int(cfg["BLOCK_N"])
                tokens, cap = invariant_split(arch, cfg)
                for s in sorted({2, cap}):
                    for rows in (None, 2 * cus, cus, cus // 2):
                        consts, options = reduce_meta(s, arch, (tokens, cap, block_n), rows=rows, num_cus=cus)
                        key = (consts["BLOCK_S"], consts["BLOCK_D"], " inv")  # the rule is an argument
                        metas.setdefault(key, (consts, options))
        for (block_s, block_d, inv), (consts, options) in sorted(metas.items()):
            sig, ones, div16 = argument_types(REDUCE_ARGS, {"q": oname})
            # mla_decode's reduce: no sink, no rotation (mla_v4_attention's epilogue; its variants list those)
            consts = {"INVARIANT": False, "HAS_SINK": False, "ROPE": False, **consts, **ones}
            add(
                TritonVariant(
                    kernel="mla_decode_reduce",
                    config=f"out={oname} S{block_s} D{block_d} w{options['num_warps']}{inv}",
                    fn=mla_decode_reduce_kernel,
                    signature=sig,
                    constexprs=consts,
                    options=options,
                    divisible_by_16=div16,
                )
            )
    return variants


def default_tier_variants(arch: str, fp8: bool = False) -> list[TritonVariant]:
    """The stage-1 variant of each default tier of ``arch`` (configs' ``tiers``, in order) with
    bf16 q and cache, direct (one split), tiles inside one page; ``fp8``: after each, the tier
    with bf16 q and the platform's fp8 cache (a number k_scale) in each fp8_dots mode, in
    ``FP8_DOTS`` order. The same variants ``triton_variants`` lists (the decode view's rows)."""
    fp8_kind = platform_fp8_dtype(arch)
    out = []
    for tier in config_for(OP, arch)["tiers"]:
        rows = tier["BLOCK_H"]
        cfg = tier_config(arch, rows, torch.bfloat16, False)
        out.append(_stage1_variant(arch, cfg, torch.bfloat16, torch.bfloat16, True, False, ""))
        for dots in FP8_DOTS if fp8 else ():
            cfg = tier_config(arch, rows, torch.bfloat16, True, fp8_dots=dots)
            out.append(_stage1_variant(arch, cfg, torch.bfloat16, fp8_kind, True, False, ""))
    return out
