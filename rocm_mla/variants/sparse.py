"""mla_sparse_attention: the Triton variants the op can launch, for the ISA report.

Constexprs and options come from ``rocm_mla.ops.sparse_plan.triton_meta`` (the function the plan
takes a launch's from), the config from ``tier_config`` (the plan's choice). The split reduce is
mla_decode's, whose variants rocm_mla.variants.decode lists.
"""

from __future__ import annotations

from typing import Any

import torch

from ..configs import config_for, platform_fp8_dtype
from ..kernels.sparse import mla_sparse_attention_kernel
from ..ops.sparse_plan import OP, tier_config, triton_meta
from ..triton_common import amd_options, triton_type
from .triton_variant import TritonVariant

_I32 = (
    "num_rows", "num_heads", "topk", "num_splits", "split_len", "num_head_blocks", "page_size", "page_shift",
    "capacity", "num_pages", "num_reqs", "s_qn_r", "s_qn_h", "s_qp_r", "s_qp_h", "s_kv_blk", "s_kv_tok", "s_ti_r",
    "s_bt_b", "s_o_r", "s_o_h", "s_l_r", "s_po_s", "s_pl_s",
)  # fmt: skip
# Inner strides are 1 on real tensors (Triton specialises ints equal to 1).
_ONES = {"s_qn_d": 1, "s_qp_d": 1, "s_o_d": 1, "s_l_h": 1, "s_req": 1}


def variant(
    arch: str,
    cfg: dict[str, Any],
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    *,
    direct: bool,
    scale_ptr: bool = False,
    paged: bool = True,
    pow2_page: bool = True,
    tag: str = "",
) -> TritonVariant:
    """One launch of the kernel as the plan makes it (``triton_meta``), described for the AOT compile."""
    qname, kvname = triton_type(q_dtype), triton_type(kv_dtype)
    sig = {
        "q_nope": f"*{qname}",
        "q_pe": f"*{qname}",
        "kv": f"*{kvname}",
        "topk_indices": "*i32",
        "block_table": "*i32",
        "req_ids": "*i32",
        "k_scale_ptr": "*fp32",
        "out": f"*{qname}",
        "lse": "*fp32",
        "part_o": "*fp32",
        "part_lse": "*fp32",
        "qk_scale": "fp32",
        "out_scale": "fp32",
        **{n: "i32" for n in _I32},
    }
    meta, options = triton_meta(
        arch, cfg, q_dtype, kv_dtype != q_dtype, direct=direct, has_scale_ptr=scale_ptr, paged=paged,
        pow2_page=pow2_page,
    )  # fmt: skip
    amd = "".join(f" {k[:4]}{v}" for k, v in amd_options(cfg, arch).items())
    label = (
        f"{tag}q={qname} kv={kvname} H{meta['BLOCK_H']} N{meta['BLOCK_N']} d{meta['D_SPLIT']}"
        f"{'h' if meta['F16_DOT'] else ''}{'r' if meta['RELOAD_K'] else ''}"
        f" w{options['num_warps']} s{options['num_stages']}{amd} "
        f"{'direct' if direct else 'split'}{' kscale*' if scale_ptr else ''}"
        f"{'' if paged else ' slots'}{'' if pow2_page else ' div'}"
    )
    return TritonVariant(
        kernel=OP,
        config=label,
        fn=mla_sparse_attention_kernel,
        signature=sig,
        constexprs={**_ONES, **meta},
        options=options,
        # float32 q runs IEEE dots: MFMA has f32 instructions, NVIDIA tensor cores do not.
        expects_mfma=q_dtype != torch.float32 or arch.startswith("gfx"),
        divisible_by_16=(
            "q_nope",
            "q_pe",
            "kv",
            "topk_indices",
            "block_table",
            "req_ids",
            "out",
            "lse",
            "part_o",
            "part_lse",
            "s_qn_r",
            "s_qn_h",
            "s_qp_r",
            "s_qp_h",
            "s_kv_blk",
            "s_kv_tok",
            "s_ti_r",
            "s_bt_b",
            "s_o_r",
            "s_o_h",
            "s_po_s",
            "s_pl_s",
        ),  # fmt: skip
    )


def triton_variants(arch: str) -> list[TritonVariant]:
    """What the op launches on ``arch``: each tier with bf16 q over a bf16 cache and over the arch's
    fp8 kind (a tensor k_scale, as vLLM passes it), direct and split; the first tier with fp16 and
    fp32 q; and the first tier's other index paths (global slots, a page size that is not a power
    of two)."""
    fp8 = platform_fp8_dtype(arch)
    out: list[TritonVariant] = []
    tiers = config_for(OP, arch)["tiers"]
    for i, tier in enumerate(tiers):
        combos = [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, fp8)]
        if i == 0:
            combos += [(torch.float16, torch.float16), (torch.float32, torch.float32)]
        for qdt, kvdt in combos:
            cfg = tier_config(arch, tier["BLOCK_H"], qdt, kvdt == fp8)
            for direct in (True, False):
                out.append(variant(arch, cfg, qdt, kvdt, direct=direct, scale_ptr=kvdt == fp8))
    cfg = tier_config(arch, tiers[0]["BLOCK_H"], torch.bfloat16, False)
    out.append(variant(arch, cfg, torch.bfloat16, torch.bfloat16, direct=False, paged=False))
    out.append(variant(arch, cfg, torch.bfloat16, torch.bfloat16, direct=False, pow2_page=False))
    return out
