"""Compiler flags of the HIP extension, shared by the run-time build (rocm_mla/_ext.py) and
setup.py's install-time build. Standalone (torch only, no package imports): setup.py loads this
file by path before the package is installed."""

from __future__ import annotations

import torch


def build_flags() -> dict[str, list[str]]:
    """``{"cxx": [...], "nvcc": [...]}`` for torch's extension builder (hipcc reads the nvcc list)."""
    cxx = ["-O3"]
    dev = ["-O3"]
    if torch.version.hip:
        dev += ["-DUSE_ROCM=1"]
    else:
        dev += ["--expt-relaxed-constexpr", "-lineinfo"]
    return {"cxx": cxx, "nvcc": dev}
