"""merge_attn_states: the Triton variants the wrapper can launch, for the ISA report.

Constexprs and options come from ``rocm_mla.ops.merge.triton_meta``, the function the launch uses.
"""

from __future__ import annotations

import torch

from ..kernels.merge_attn_states import merge_attn_states_kernel
from ..mla_dims import KV_LORA_RANK, V_HEAD_DIM
from ..ops.merge import OP, triton_meta
from ..triton_common import triton_type
from .triton_variant import TritonVariant


def triton_variants(arch: str) -> list[TritonVariant]:
    """The Triton specialisations the wrapper launches for MLA's head sizes (128: prefill V,
    512: decode latent) with contiguous rows and inner stride 1, each dtype, with and without
    output_lse."""
    variants = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        tname = triton_type(dtype)
        for head in (V_HEAD_DIM, KV_LORA_RANK):
            for has_lse in (True, False):
                consts, options = triton_meta(head, has_lse, arch)
                sig = {
                    "out": f"*{tname}",
                    "out_lse": "*fp32",
                    "pre": f"*{tname}",
                    "pre_lse": "*fp32",
                    "suf": f"*{tname}",
                    "suf_lse": "*fp32",
                    "num_rows": "i32",
                    "num_heads": "i32",
                    "out_st": "i32",
                    "out_sh": "i32",
                    "out_sd": "constexpr",
                    "pre_st": "i32",
                    "pre_sh": "i32",
                    "pre_sd": "constexpr",
                    "suf_st": "i32",
                    "suf_sh": "i32",
                    "suf_sd": "constexpr",
                    "plse_sh": "i32",
                    "plse_st": "constexpr",
                    "slse_sh": "i32",
                    "slse_st": "constexpr",
                    "olse_sh": "i32",
                    "olse_st": "constexpr",
                    "HEAD_SIZE": "constexpr",
                    "BLOCK_D": "constexpr",
                    "BLOCK_ROWS": "constexpr",
                    "HAS_OUT_LSE": "constexpr",
                }
                # Inner strides are 1 on real tensors, and Triton specialises ints equal to 1.
                ones = {k: 1 for k in ("out_sd", "pre_sd", "suf_sd", "plse_st", "slse_st", "olse_st")}
                variants.append(
                    TritonVariant(
                        kernel=OP,
                        config=f"{tname} D={head} rows={consts['BLOCK_ROWS']} "
                        f"w{options['num_warps']}{' lse' if has_lse else ''}",
                        fn=merge_attn_states_kernel,
                        signature=sig,
                        constexprs={**consts, **ones},
                        options=options,
                        divisible_by_16=(
                            "out",
                            "out_lse",
                            "pre",
                            "pre_lse",
                            "suf",
                            "suf_lse",
                            "out_st",
                            "out_sh",
                            "pre_st",
                            "pre_sh",
                            "suf_st",
                            "suf_sh",
                            "plse_sh",
                            "slse_sh",
                            "olse_sh",
                        ),
                    )
                )
    return variants
