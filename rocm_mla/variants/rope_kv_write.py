"""fused_rope_mla_kv_write / concat_and_cache_mla: the Triton variants the wrapper can launch, for
the ISA report.

Constexprs and options come from ``rocm_mla.ops.rope_kv_write.triton_meta``, the function the launch uses.
"""

from __future__ import annotations

import torch

from ..kernels.rope_kv_write import rope_mla_kv_write_kernel
from ..ops.rope_kv_write import fp8_cache_kind, triton_meta
from ..triton_common import triton_type
from .triton_variant import TritonVariant


def triton_variants(arch: str) -> list[TritonVariant]:
    """The Triton specialisations the wrapper launches for DeepSeek's shapes on ``arch``.

    Per q dtype (bf16, fp16): GPT-J and NeoX, cos_sin_cache float32 or the q dtype, cache in the
    q dtype or FP8 (the arch's kind, configs/platform.json: e4m3fnuz on gfx942, e4m3fn elsewhere),
    at N = 16 and 128 (TOKENS 8 and 1); plus concat_and_cache_mla (no rope) per cache kind.
    Contiguous rows of vLLM's layouts: inner strides 1, the rest multiples of 16, block_size 64.
    """
    fp8_kind = fp8_cache_kind(arch)
    variants = []
    for dtype in (torch.bfloat16, torch.float16):
        tname = triton_type(dtype)
        for kind in (0, fp8_kind):
            rope_cases = [(True, cs, neox, n) for cs in ("fp32", tname) for neox in (False, True) for n in (16, 128)]
            for rope, cs, neox, n in [*rope_cases, (False, tname, False, 0)]:
                consts, options = triton_meta(n, arch, rope=rope, is_neox=neox, cache_kind=kind)
                cache_t = "u8" if kind else tname
                ptrs = {
                    "positions": "*i64",
                    "q_pe": f"*{tname}",
                    "k_pe": f"*{tname}",
                    "kv_c": f"*{tname}",
                    "cos_sin": f"*{cs}",
                    "cache": f"*{cache_t}",
                    "slot_mapping": "*i64",
                    "k_scale": "*fp32",
                }
                kind_name = {0: tname, 1: "fp8e4m3fn", 2: "fp8e4m3fnuz"}[kind]
                label = (
                    f"{tname} cs={cs} cache={kind_name} {'neox' if neox else 'gptj'} N={n} "
                    f"tok={consts['TOKENS']} rows={consts['BLOCK_R']} w{options['num_warps']}"
                    if rope
                    else f"concat {tname} cache={kind_name} w{options['num_warps']}"
                )
                variants.append(
                    TritonVariant(
                        kernel="fused_rope_mla_kv_write" if rope else "concat_and_cache_mla",
                        config=label,
                        fn=rope_mla_kv_write_kernel,
                        signature={**ptrs, **dict.fromkeys(_COUNTS + _ALIGNED_INTS, "i32")},
                        constexprs={**consts, **_UNIT_STRIDES},
                        options=options,
                        divisible_by_16=(*ptrs, *_ALIGNED_INTS),
                    )
                )
    return variants


# The int arguments (the report types the constexprs): token and head counts, then the sizes and
# strides that vLLM's layouts make multiples of 16.
_COUNTS = ("num_tokens", "num_heads", "num_cached")
_ALIGNED_INTS = ("block_size", "num_slots", "max_pos", "q_st", "q_sh", "k_st", "c_st", "cs_sp", "kv_sb", "kv_so")
# Inner strides are 1 on real tensors, and Triton specialises ints equal to 1.
_UNIT_STRIDES = dict.fromkeys(("q_sd", "k_sd", "c_sd", "cs_sd", "kv_sd"), 1)
