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
        ptrs = {n: "*fp32" if n.endswith("_lse") else f"*{tname}" for n in _POINTERS}
        for head in (V_HEAD_DIM, KV_LORA_RANK):
            for has_lse in (True, False):
                consts, options = triton_meta(head, has_lse, arch)
                variants.append(
                    TritonVariant(
                        kernel=OP,
                        config=f"{tname} D={head} rows={consts['BLOCK_ROWS']} "
                        f"w{options['num_warps']}{' lse' if has_lse else ''}",
                        fn=merge_attn_states_kernel,
                        signature={**ptrs, **dict.fromkeys(_COUNTS + _ALIGNED_INTS, "i32")},
                        constexprs={**consts, **_UNIT_STRIDES},
                        options=options,
                        divisible_by_16=(*ptrs, *_ALIGNED_INTS),
                    )
                )
    return variants


_POINTERS = ("out", "out_lse", "pre", "pre_lse", "suf", "suf_lse")
# The int arguments (the report types the constexprs): row and head counts, then the strides that
# contiguous rows make multiples of 16.
_COUNTS = ("num_rows", "num_heads")
_ALIGNED_INTS = ("out_st", "out_sh", "pre_st", "pre_sh", "suf_st", "suf_sh", "plse_sh", "slse_sh", "olse_sh")
# Inner strides are 1 on real tensors, and Triton specialises ints equal to 1.
_UNIT_STRIDES = dict.fromkeys(("out_sd", "pre_sd", "suf_sd", "plse_st", "slse_st", "olse_st"), 1)
