// FP8 E4M3 conversions in plain integer code, for every compiler the package meets.
//
// Why not cuda_fp8.h / hip_fp8.h: Debian's ROCm 5.2 headers (the gfx942 ISA report's toolchain)
// have no hip_fp8.h, and gfx942's format is not NVIDIA's:
//   e4m3fn   (OCP, NVIDIA, gfx950): bias 7, max 448 (0x7e), no inf, NaN = 0x7f / 0xff, -0 = 0x80.
//   e4m3fnuz (gfx942 / MI300):      bias 8, max 240 (0x7f), no inf, NaN = 0x80, no -0.
// Both are written by one template over a format descriptor, bit for bit what torch's
// `tensor.clamp(-max, max).to(torch.float8_e4m3fn / float8_e4m3fnuz)` stores (round to nearest
// even, subnormals included); tests/rope_kv_write/test_rope_kv_write_fp8.py compiles this header with the host compiler
// and compares every float16 value and a million random float32 patterns with torch.
//
// This header needs no GPU header at all: it builds as device code (nvcc, hipcc, clang -x hip)
// and as host C++ (the test harness).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
// plain inline: __forceinline__ comes from the vendor runtime headers, which this header does not need
#define MLA_HD __host__ __device__ inline
#else
#define MLA_HD inline
#endif

namespace rocm_mla {

struct fp8_e4m3fn_format {
  static constexpr uint32_t kBias = 7;
  static constexpr uint32_t kMaxBits = 0x43E00000u;  // 448.0f
  static constexpr uint32_t kMaxCode = 0x7Eu;
  static constexpr bool kFnuz = false;
};

struct fp8_e4m3fnuz_format {
  static constexpr uint32_t kBias = 8;
  static constexpr uint32_t kMaxBits = 0x43700000u;  // 240.0f
  static constexpr uint32_t kMaxCode = 0x7Fu;
  static constexpr bool kFnuz = true;
};

MLA_HD uint32_t mla_f32_bits(float x) {
  uint32_t u;
  __builtin_memcpy(&u, &x, sizeof(u));
  return u;
}

MLA_HD float mla_f32_from_bits(uint32_t u) {
  float x;
  __builtin_memcpy(&x, &u, sizeof(x));
  return x;
}

// float -> E4M3 code, saturating: |x| >= max (inf included) stores +-max, so a finite input never
// becomes NaN. NaN stays NaN (fn keeps the sign: 0x7f / 0xff; fnuz has one NaN, 0x80).
// Zero and values that round to zero store 0x00 in fnuz whatever their sign (0x80 is its NaN).
template <class F>
MLA_HD uint8_t fp8_e4m3_from_float(float x) {
  const uint32_t bits = mla_f32_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t u = bits & 0x7FFFFFFFu;
  if (u > 0x7F800000u) return static_cast<uint8_t>(F::kFnuz ? 0x80u : (sign | 0x7Fu));
  if (u >= F::kMaxBits) return static_cast<uint8_t>(sign | F::kMaxCode);
  const uint32_t e = u >> 23;  // float32 biased exponent
  uint32_t code;
  if (e >= 128u - F::kBias) {
    // Normal in E4M3: keep 3 of 23 mantissa bits, round half to even on the 20 dropped bits.
    // A carry out of the mantissa bumps the exponent, which is the right encoding; u < max
    // keeps the result at or below the largest finite code.
    const uint32_t r = u + 0x7FFFFu + ((u >> 20) & 1u);
    code = (r >> 20) - ((127u - F::kBias) << 3);
  } else {
    // Subnormal in E4M3: code = round(|x| / 2^(-bias-2)) with |x| = m * 2^(e-150).
    // shift >= 21 here; shift >= 25 means |x| < half a step (m < 2^24), which is 0.
    const uint32_t shift = 148u - F::kBias - e;
    if (shift >= 25u) {
      code = 0;
    } else {
      const uint32_t m = (u & 0x7FFFFFu) | 0x800000u;
      const uint32_t q = m >> shift;
      const uint32_t rem = m & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1u);
      code = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);  // may reach 8 = min normal
    }
  }
  if (F::kFnuz && code == 0) return 0;
  return static_cast<uint8_t>(sign | code);
}

// E4M3 code -> float (exact).
template <class F>
MLA_HD float fp8_e4m3_to_float(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xFu;
  const uint32_t m = c & 0x7u;
  if (F::kFnuz ? c == 0x80u : (c & 0x7Fu) == 0x7Fu) return mla_f32_from_bits(0x7FC00000u);
  if (e == 0) {
    // m * 2^(-bias-2): exact in float32.
    const float step = mla_f32_from_bits((127u - F::kBias - 2u) << 23);
    return mla_f32_from_bits(mla_f32_bits(static_cast<float>(m) * step) | sign);
  }
  return mla_f32_from_bits(sign | ((e + 127u - F::kBias) << 23) | (m << 20));
}

}  // namespace rocm_mla
