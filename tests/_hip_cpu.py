"""Run a HIP kernel of hip_src/kernels/ on the CPU: the header is compiled as host C++ (a shim
stands in for cuda_runtime.h / cuda_fp16.h) with a test's driver, and loaded through ctypes.

Faithful for kernels without shared memory or barriers (every one of ours): the driver runs each
block's threads one after another. Used by the HIP-on-CPU tests of rope_kv_write and merge.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SHIM_RUNTIME = r"""
#pragma once
#include <stdint.h>
#include <string.h>
#include <math.h>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
struct mla_dim3 { unsigned x = 0, y = 1, z = 1; };
extern thread_local mla_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define warpSize 32
inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int32_t u) { float f; memcpy(&f, &u, 4); return f; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
struct uint2 { unsigned x, y; };
"""

SHIM_FP16 = r"""
#pragma once
struct __half { _Float16 v; };
inline float __half2float(__half h) { return static_cast<float>(h.v); }
inline __half __float2half_rn(float f) { return __half{static_cast<_Float16>(f)}; }
"""


def compile_hip_on_cpu(d: Path, driver: str, lib_name: str) -> ctypes.CDLL:
    """Compile ``driver`` (C++ that includes a hip_src/kernels header) into ``d / lib_name``;
    skips the test when there is no host compiler (or it lacks _Float16)."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    (d / "shim").mkdir(exist_ok=True)
    (d / "shim" / "cuda_runtime.h").write_text(SHIM_RUNTIME)
    (d / "shim" / "cuda_fp16.h").write_text(SHIM_FP16)
    (d / "drv.cpp").write_text(driver)
    lib = d / lib_name
    # -ffp-contract=off: no fused multiply-add, so float32 results are the reference's bit for bit.
    r = subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-shared",
            "-fPIC",
            f"-I{d / 'shim'}",
            f"-I{ROOT / 'hip_src' / 'kernels'}",
            str(d / "drv.cpp"),
            "-o",
            str(lib),
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        if "_Float16" in r.stderr:
            pytest.skip("host compiler lacks _Float16")
        raise AssertionError(r.stderr)
    return ctypes.CDLL(str(lib))
