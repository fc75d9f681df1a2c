"""Triton pieces shared by the ops, their variant lists, tools/ and perf/: the Triton type name of a
torch dtype, the compile options only AMD's Triton backend knows, LOG2E (the kernels' softmax runs
in base 2: the wrappers fold log2(e) into the score scale) and INT32_MAX (the clamp of the bounds
that int32 index checks compare against).

One copy of each, so that what the ISA report compiles and what a wrapper launches name types and
options the same way. Imports no op and no kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from .configs import AMD_OPTIONS, is_amd_arch, platform_fp8_dtype

LOG2E = 1.4426950408889634  # log2(e)
# The largest int32: kernels that check int32 indices with 32-bit unsigned compares take their
# bounds clamped to it (a bound past it excludes nothing more).
INT32_MAX = 2**31 - 1

# torch dtype -> Triton pointer element type ("*" + this) in a kernel signature.
TRITON_TYPE = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.uint8: "u8",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e4m3fnuz: "fp8e4b8",
}

# Launch/compile options only AMD's Triton backend takes (an NVIDIA launch rejects unknown keyword
# options): the overlay schema's list (configs.AMD_OPTIONS). Absent, 0 and "none" all mean the
# backend's default.
AMD_ONLY_OPTIONS = tuple(AMD_OPTIONS)


def triton_type(dtype: torch.dtype) -> str:
    """Triton's name of ``dtype`` (``"bf16"``, ``"fp8e4b8"``, ...)."""
    return TRITON_TYPE[dtype]


def fp8_triton_type(arch: str) -> str:
    """Triton's name of the FP8 kind a plain "fp8" cache holds on ``arch`` (configs/platform.json)."""
    return TRITON_TYPE[platform_fp8_dtype(arch)]


def amd_options(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """The AMD-only options ``cfg`` sets, as compile options for ``arch``; none off AMD."""
    if not is_amd_arch(arch):
        return {}
    return {k: cfg[k] for k in AMD_ONLY_OPTIONS if k in cfg}


def without_amd_options(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` without the launch options only AMD's Triton backend knows (an NVIDIA launch
    rejects unknown keyword options)."""
    return {k: v for k, v in cfg.items() if k not in AMD_ONLY_OPTIONS}


__all__ = [
    "INT32_MAX",
    "LOG2E",
    "TRITON_TYPE",
    "AMD_ONLY_OPTIONS",
    "triton_type",
    "fp8_triton_type",
    "amd_options",
    "without_amd_options",
]
