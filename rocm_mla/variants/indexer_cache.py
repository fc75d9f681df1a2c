"""indexer_k_cache_write: the Triton variants the wrapper can launch, for the ISA report.

Constexprs and options come from ``rocm_mla.ops.indexer_cache.triton_meta``, the function the launch uses.
"""

from __future__ import annotations

import torch

from ..configs import config_for, platform_fp8_dtype
from ..kernels.indexer_cache import indexer_k_cache_write_kernel
from ..ops.indexer_cache import OP, triton_meta
from ..triton_common import triton_type
from .triton_variant import TritonVariant


def triton_variants(arch: str) -> list[TritonVariant]:
    """The Triton specialisations the wrapper launches on ``arch``: per key dtype (bf16, fp16), the
    arch's fp8 kind (configs/platform.json: e4m3fnuz on gfx942, e4m3fn elsewhere), scale format
    "ue8m0" and plain, values shuffled (vLLM's ROCm layout at block_size > 1: block 64) and flat
    (block 1), at the config's rows a program; and the fewer rows a call of few keys takes
    (``launch_rows``), at bf16 and ue8m0 (vLLM's). vLLM's layouts: k a column slice with unit
    column stride, int64 slots, 132-byte rows."""
    fp8 = platform_fp8_dtype(arch)
    variants = []
    full = config_for(OP, arch)["tiers"][0]["rows_per_program"]
    forms = [(dtype, fmt, shuffled, full) for dtype in (torch.bfloat16, torch.float16) for fmt in ("ue8m0", None)
             for shuffled in (True, False)]  # fmt: skip
    forms += [(torch.bfloat16, "ue8m0", shuffled, full >> i) for i in range(1, full.bit_length())
              for shuffled in (True, False)]  # fmt: skip
    for dtype, scale_fmt, shuffled, rows in forms:
        tname = triton_type(dtype)
        consts, options = triton_meta(arch, fp8=fp8, scale_fmt=scale_fmt, shuffled=shuffled, rows=rows)
        sig = {
            "k": f"*{tname}", "cache": "*u8", "slot_mapping": "*i64", "num_slot_rows": "i32", "num_slots": "i32",
            "block_size": "i32", "s_k_row": "i32", "s_k_dim": "constexpr", "s_blk": "i32",
            **{name: "constexpr" for name in consts},
        }  # fmt: skip
        label = (
            f"k={tname} cache={triton_type(fp8)} {scale_fmt or 'plain'} "
            f"{'shuffled' if shuffled else 'flat'} rows={consts['ROWS']} w{options['num_warps']}"
        )
        aligned = ("k", "cache", "slot_mapping", "s_k_row", "s_blk") + (("block_size",) if shuffled else ())
        variants.append(TritonVariant(
            kernel=OP, config=label, fn=indexer_k_cache_write_kernel, signature=sig,
            constexprs={**consts, "s_k_dim": 1},  # Triton specialises an int equal to 1
            options=options, divisible_by_16=aligned,
        ))  # fmt: skip
    return variants
