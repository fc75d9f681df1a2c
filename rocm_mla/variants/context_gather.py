"""context_gather: the Triton variants the wrapper can launch, for the ISA report.

Constexprs and options come from ``rocm_mla.ops.context_gather.triton_meta``, the function the launch uses.
"""

from __future__ import annotations

import torch

from ..kernels.context_gather import context_gather_kernel
from ..ops.context_gather import OP, triton_meta
from ..triton_common import fp8_triton_type, triton_type
from .triton_variant import TritonVariant


def triton_variants(arch: str) -> list[TritonVariant]:
    """The Triton specialisations the wrapper launches on ``arch``: per workspace dtype (bf16,
    fp16, fp32), a cache of that dtype, and for bf16/fp16 an fp8 cache of the arch's kind
    (e4m3fnuz on gfx942, e4m3fn elsewhere). vLLM's layouts: int32 index tensors, contiguous
    576-element rows, block_size a multiple of 16 (16, 64)."""
    fp8_t = fp8_triton_type(arch)
    consts, options = triton_meta(arch)
    variants = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        tname = triton_type(dtype)
        for fp8 in (False, True) if dtype != torch.float32 else (False,):
            cache_t = fp8_t if fp8 else tname
            # The report types the constexprs (D_NOPE, D_PE, BLOCK_T, FP8).
            sig = {
                "cache": f"*{cache_t}",
                "block_table": "*i32",
                "cu_seq_lens": "*i32",
                "starts": "*i32",
                "token_to_seq": "*i32",
                "k_scale_ptr": "*fp32" if fp8 else f"*{tname}",
                "dst": f"*{tname}",
                **dict.fromkeys(_INTS, "i32"),
            }
            variants.append(
                TritonVariant(
                    kernel=OP,
                    config=f"dst={tname} cache={cache_t} rows={consts['BLOCK_T']} w{options['num_warps']}",
                    fn=context_gather_kernel,
                    signature=sig,
                    constexprs={**consts, "FP8": fp8},
                    options=options,
                    divisible_by_16=_ALIGNED,
                )
            )
    return variants


_INTS = ("num_tokens", "page_size", "num_seqs", "capacity", "num_blocks", "s_c_blk", "s_c_tok", "s_bt", "s_dst")
# What vLLM's layouts make 16-aligned: the cache, scale and workspace pointers, page size, capacity and
# row strides (not the int32 index tensors' slices).
_ALIGNED = ("cache", "k_scale_ptr", "dst", "page_size", "capacity", "s_c_blk", "s_c_tok", "s_dst")
