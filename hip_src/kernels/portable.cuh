// Portability layer shared by every rocm-mla HIP kernel.
//
// The kernels are written once in the CUDA/HIP common dialect. The same file builds
//   - with hipcc / clang for AMD (torch.utils.hipify leaves this header alone: it
//     names no CUDA-only API), and with clang-19 for the gfx942 ISA report;
//   - with nvcc for sm_90, so that the very kernels we ship to MI300 run on the H200.
// Nothing here may assume a wave size: MLA_WAVE_SIZE is the platform's.
#pragma once

#include <stdint.h>

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define MLA_ON_AMD 1
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define MLA_ON_AMD 0
#endif

#if MLA_ON_AMD
// clang defines the wave size it compiles for (64 on gfx9 CDNA, 32 on RDNA wave32).
#if defined(__AMDGCN_WAVEFRONT_SIZE__)
#define MLA_WAVE_SIZE __AMDGCN_WAVEFRONT_SIZE__
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define MLA_WAVE_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define MLA_WAVE_SIZE warpSize
#endif
#else
#define MLA_WAVE_SIZE warpSize
#endif

#define MLA_DEVICE __device__ __forceinline__

namespace rocm_mla {

// Element tags: kernels are templated on these so that one source serves every dtype
// without depending on the toolkit's bf16 header (ROCm 5.x lacks hip_bf16.h).
struct f32_t { using storage = float; };
struct f16_t { using storage = __half; };
struct bf16_t { using storage = uint16_t; };

template <typename T> struct elem;

template <> struct elem<f32_t> {
  using storage = float;
  static MLA_DEVICE float to_float(float x) { return x; }
  static MLA_DEVICE float from_float(float x) { return x; }
};

template <> struct elem<f16_t> {
  using storage = __half;
  static MLA_DEVICE float to_float(__half x) { return __half2float(x); }
  static MLA_DEVICE __half from_float(float x) { return __float2half_rn(x); }
};

template <> struct elem<bf16_t> {
  using storage = uint16_t;
  static MLA_DEVICE float to_float(uint16_t x) {
    return __uint_as_float(static_cast<uint32_t>(x) << 16);
  }
  // Round to nearest even; NaN stays a quiet NaN (the rounding add could carry it to inf).
  // A select, not an early return: the branch compiled to a divergent branch per element on
  // gfx942 (~50 exec-mask updates per 16-byte unit in the KV-write kernel).
  static MLA_DEVICE uint16_t from_float(float x) {
    const uint32_t u = __float_as_uint(x);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;
    return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
};

// 16 bytes: the widest global load/store on both vendors (global_load_dwordx4 / LDG.128).
struct alignas(16) vec16_t {
  uint32_t w[4];
};

template <typename Storage>
struct vec_traits {
  static constexpr int kElems = 16 / sizeof(Storage);
};

}  // namespace rocm_mla
