// fused_rope_mla_kv_write / concat_and_cache_mla: rotate q_pe and k_pe in place and write the
// latent cache row [kv_c | rope(k_pe)] (576 wide) at slot_mapping[t], in one pass.
//
// Rotation, with cos/sin = cos_sin_cache[positions[t]] split 32 + 32:
//   GPT-J (DeepSeek, is_neox = 0): pairs (2i, 2i+1);  NeoX (is_neox = 1): pairs (i, i+32)
//   x' = x cos_i - y sin_i,  y' = y cos_i + x sin_i      (float32, one rounding per store)
// Cache row: [kv_c (512) | rope(k_pe) (64)], converted once from float32: to the cache's own
// type, or to FP8 E4M3 (fn / fnuz) as x / k_scale, saturated (fp8.cuh). slot < 0: no cache
// write for that token; its q_pe and k_pe are still rotated. Tokens t >= num_cached (vLLM's
// CUDA-graph padding: slot_mapping shorter than the batch) are rotated and not cached.
//
// Bound guards, the same contract as the Triton kernel's: a slot outside [0, num_slots)
// (num_blocks x block_size) is skipped like -1; a position outside [0, max_pos) reads its cos/sin
// from kNanRow (a constant of this file) instead of the cache, so that token's q_pe, k_pe and the
// rope part of its cache row are NaN (its kv_c part is cached as given). Whatever the values in
// positions and slot_mapping, nothing outside the given tensors is read or written. Each guard is
// one unsigned compare (it also catches negatives) and, for the position, one pointer select per
// 16-element unit: the rotation itself makes the NaN, no per-element select.
//
// Work split. A "unit" is 16 elements: 8 rotation pairs of one 64-wide head (q_pe or k_pe),
// or 16 consecutive latent elements (kv_c -> cache). One token has 4N + 4 + 32 units:
//   [0, 4N)       q_pe head u/4, quarter u%4          (read + write q_pe in place)
//   [4N, 4N+4)    k_pe quarter                         (read k_pe, write it back and to the cache)
//   [4N+4, 4N+36) kv_c sixteenth                       (read kv_c, write the cache)
// A block owns tokens_per_block consecutive tokens (each token's heads and its cache row stay in
// one block); its threads walk the block's units token-major, so neighbouring threads touch
// neighbouring 16-byte chunks of one head / one row. A quarter of a head is the 8 pairs
// (2i, 2i+1), i in [8r, 8r+8) for GPT-J -- elements [16r, 16r+16) -- or (i, i+32) for NeoX --
// elements [8r, 8r+8) and [32+8r, 40+8r) -- so every thread needs the same 8 cos and 8 sin.
//
// VEC: every row is 16-byte aligned with unit inner stride (the launcher checks): 8 elements
// are one 16-byte access for 16-bit types, two for float32; an FP8 latent unit is one 16-byte
// store. !VEC: element-wise with any strides.
// The launcher lives in ../rope_kv_write.cu; rocm_mla/ops/rope_kv_write.py is the only caller.
#pragma once

#include "portable.cuh"
#include "fp8.cuh"

namespace rocm_mla {

constexpr int kRopeDim = 64;
constexpr int kLatentDim = 512;
constexpr int kCacheRowDim = kLatentDim + kRopeDim;  // 576
constexpr int kRopeUnits = kRopeDim / 16;            // 4
constexpr int kLatentUnits = kLatentDim / 16;        // 32

// Cache element tags beyond portable.cuh's f32_t / f16_t / bf16_t (which store the q dtype).
struct fp8e4m3fn_t {};
struct fp8e4m3fnuz_t {};

// How a float32 value becomes a cache element.
template <typename CacheTag>
struct cache_conv {
  using storage = typename elem<CacheTag>::storage;
  MLA_DEVICE explicit cache_conv(const float*) {}
  MLA_DEVICE storage operator()(float x) const { return elem<CacheTag>::from_float(x); }
};

template <typename Format>
struct fp8_cache_conv {
  using storage = uint8_t;
  float scale;
  // k_scale is read on the device: no host sync, and CUDA-graph capture sees its current value.
  MLA_DEVICE explicit fp8_cache_conv(const float* k_scale) : scale(*k_scale) {}
  // A true division (not x * (1 / scale)): the stored code is what torch's x / k_scale gives.
  MLA_DEVICE uint8_t operator()(float x) const { return fp8_e4m3_from_float<Format>(x / scale); }
};

template <>
struct cache_conv<fp8e4m3fn_t> : fp8_cache_conv<fp8_e4m3fn_format> {
  using fp8_cache_conv<fp8_e4m3fn_format>::fp8_cache_conv;
};
template <>
struct cache_conv<fp8e4m3fnuz_t> : fp8_cache_conv<fp8_e4m3fnuz_format> {
  using fp8_cache_conv<fp8_e4m3fnuz_format>::fp8_cache_conv;
};

struct RopeKVParams {
  int64_t num_tokens;   // T: tokens to process (rotation)
  int64_t num_cached;   // S <= T: tokens that have a slot_mapping entry
  int64_t num_slots;    // num_blocks x block_size: slots >= this are skipped (guard)
  int64_t max_pos;      // cos_sin_cache rows: positions outside [0, max_pos) give NaN (guard)
  int32_t block_size;   // cache slots per block: slot = block * block_size + offset
  int32_t num_heads;    // N (0 for concat_and_cache_mla: no q_pe)
  int32_t tokens_per_block;
  int32_t units_per_token;  // 4N + 36
  int32_t is_neox;
  int32_t rope;  // 0: concat_and_cache_mla (k_pe copied as is, nothing rotated)
  // Element strides, int32 (the launcher checks |stride| < 2^31; every product with an index is
  // taken in 64 bits): 12 int64 strides kept live in the scalar path overflowed gfx942's SGPRs.
  int32_t q_st, q_sh, q_sd;      // q_pe [T, N, 64]
  int32_t k_st, k_sd;            // k_pe [T, 64]
  int32_t c_st, c_sd;            // kv_c [T, 512]
  int32_t cs_sp, cs_sd;          // cos_sin_cache [max_pos, 64]
  int32_t kv_sb, kv_so, kv_sd;   // kv_cache [num_blocks, block_size, 576]
};

// 8 consecutive (VEC) or strided (!VEC) elements of S -> float.
template <bool VEC, typename Tag>
MLA_DEVICE void load8(const typename elem<Tag>::storage* p, int64_t stride, float (&v)[8]) {
  using S = typename elem<Tag>::storage;
  if constexpr (VEC) {
    constexpr int kPer = 16 / sizeof(S);
    static_assert(8 % kPer == 0, "8 elements are whole 16-byte vectors");
#pragma unroll
    for (int j = 0; j < 8; j += kPer) {
      const vec16_t w = *reinterpret_cast<const vec16_t*>(p + j);
      S e[kPer];
      __builtin_memcpy(e, &w, 16);
#pragma unroll
      for (int i = 0; i < kPer; ++i) v[j + i] = elem<Tag>::to_float(e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = elem<Tag>::to_float(p[i * stride]);
  }
}

// K (8 or 16) converted elements -> memory, VEC: as 16-byte stores (an 8-byte store for 8 FP8).
template <bool VEC, int K, typename S>
MLA_DEVICE void storeK(S* p, int64_t stride, const S (&e)[K]) {
  if constexpr (VEC) {
    constexpr int kBytes = K * static_cast<int>(sizeof(S));
    if constexpr (kBytes % 16 == 0) {
#pragma unroll
      for (int j = 0; j < kBytes / 16; ++j) {
        vec16_t w;
        __builtin_memcpy(&w, reinterpret_cast<const char*>(e) + 16 * j, 16);
        reinterpret_cast<vec16_t*>(p)[j] = w;
      }
    } else {
      static_assert(kBytes == 8, "8 FP8 elements");
      uint2 w;
      __builtin_memcpy(&w, e, 8);
      *reinterpret_cast<uint2*>(p) = w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < K; ++i) p[i * stride] = e[i];
  }
}

// 8 float32 values -> converted -> memory.
template <bool VEC, typename Conv>
MLA_DEVICE void store8(typename Conv::storage* p, int64_t stride, const float (&v)[8], const Conv& conv) {
  typename Conv::storage e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = conv(v[i]);
  storeK<VEC, 8>(p, stride, e);
}

// 16 float32 values (lo then hi, contiguous in memory) -> converted -> memory: for FP8 one
// 16-byte store instead of two 8-byte ones.
template <bool VEC, typename Conv>
MLA_DEVICE void store16(typename Conv::storage* p, int64_t stride, const float (&lo)[8],
                        const float (&hi)[8], const Conv& conv) {
  typename Conv::storage e[16];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    e[i] = conv(lo[i]);
    e[8 + i] = conv(hi[i]);
  }
  storeK<VEC, 16>(p, stride, e);
}

// Rotate one quarter head in registers: lo = the 8 elements at offset a, hi = the 8 at b.
// NeoX pairs (lo[j], hi[j]); GPT-J pairs neighbours, lo holding pairs 0..3 and hi pairs 4..7.
MLA_DEVICE void rotate_pair(float& x, float& y, float c, float s) {
  const float x0 = x, y0 = y;
  x = x0 * c - y0 * s;
  y = y0 * c + x0 * s;
}

MLA_DEVICE void rotate_quarter(float (&lo)[8], float (&hi)[8], const float (&c)[8],
                               const float (&s)[8], bool neox) {
  if (neox) {
#pragma unroll
    for (int j = 0; j < 8; ++j) rotate_pair(lo[j], hi[j], c[j], s[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      rotate_pair(lo[2 * j], lo[2 * j + 1], c[j], s[j]);
      rotate_pair(hi[2 * j], hi[2 * j + 1], c[4 + j], s[4 + j]);
    }
  }
}

// cos/sin for a position outside the cache: any NaN makes both outputs of each rotation pair NaN.
// 64 float32 NaN bit patterns (0xffffffff) are also 128 bf16 / f16 NaNs (0xffff), so one row
// serves every CSTag; 16-byte aligned for the VEC loads.
alignas(16) __device__ const uint32_t kNanRow[kRopeDim] = {
    0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
    0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
    0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
    0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
    0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
    0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
    0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
    0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};

// Whether 0 <= i < n, in one compare: a negative i is a huge unsigned value.
MLA_DEVICE bool in_range(int64_t i, int64_t n) { return static_cast<uint64_t>(i) < static_cast<uint64_t>(n); }

// Element offset of cache row `slot` (>= 0). The launcher guarantees num_blocks * block_size
// < 2^32: a 32-bit division is a few instructions, a 64-bit one a long sequence on AMD.
MLA_DEVICE int64_t slot_offset(int64_t slot, const RopeKVParams& p) {
  const uint32_t s = static_cast<uint32_t>(slot);
  const uint32_t bs = static_cast<uint32_t>(p.block_size);
  const uint32_t blk = s / bs;
  return static_cast<int64_t>(blk) * p.kv_sb + static_cast<int64_t>(s - blk * bs) * p.kv_so;
}

template <typename QTag, typename CSTag, typename CacheTag, bool VEC>
__global__ void rope_mla_kv_write_kernel(const int64_t* __restrict__ positions,
                                         typename elem<QTag>::storage* __restrict__ q_pe,
                                         typename elem<QTag>::storage* __restrict__ k_pe,
                                         const typename elem<QTag>::storage* __restrict__ kv_c,
                                         const typename elem<CSTag>::storage* __restrict__ cos_sin,
                                         typename cache_conv<CacheTag>::storage* __restrict__ cache,
                                         const int64_t* __restrict__ slot_mapping,
                                         const float* __restrict__ k_scale, const RopeKVParams p) {
  using QS = typename elem<QTag>::storage;
  using Conv = cache_conv<CacheTag>;
  using CS = typename Conv::storage;

  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * p.tokens_per_block;
  const int64_t left = p.num_tokens - t0;
  const uint32_t ntok = static_cast<uint32_t>(left < p.tokens_per_block ? left : p.tokens_per_block);
  const uint32_t upt = static_cast<uint32_t>(p.units_per_token);
  const uint32_t q_units = 4u * static_cast<uint32_t>(p.num_heads);
  const uint32_t total = ntok * upt;
  const bool neox = p.is_neox != 0;
  // VEC: inner strides are 1 (launcher-checked); as constants they cost no multiplies.
  const int64_t q_sd = VEC ? 1 : p.q_sd, k_sd = VEC ? 1 : p.k_sd, c_sd = VEC ? 1 : p.c_sd;
  const int64_t cs_sd = VEC ? 1 : p.cs_sd, kv_sd = VEC ? 1 : p.kv_sd;
  const Conv conv(k_scale);  // only the FP8 converters dereference k_scale
  const cache_conv<QTag> qconv(nullptr);  // float -> q dtype, for the in-place writes

  for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
    const uint32_t tok = i / upt;
    const uint32_t u = i - tok * upt;
    const int64_t t = t0 + tok;

    if (u >= q_units + kRopeUnits) {
      // kv_c -> cache: 16 latent elements, no rotation.
      const int64_t slot = t < p.num_cached ? slot_mapping[t] : -1;
      if (!in_range(slot, p.num_slots)) continue;  // -1, and the guard: outside the cache = skipped
      const int64_t e0 = 16 * static_cast<int64_t>(u - q_units - kRopeUnits);
      const QS* src = kv_c + t * p.c_st + e0 * c_sd;
      float lo[8], hi[8];
      load8<VEC, QTag>(src, c_sd, lo);
      load8<VEC, QTag>(src + 8 * c_sd, c_sd, hi);
      store16<VEC>(cache + slot_offset(slot, p) + e0 * kv_sd, kv_sd, lo, hi, conv);
      continue;
    }

    // Quarter r of a 64-wide rope head: q_pe head u / 4, or k_pe (u >= q_units).
    const bool is_k = u >= q_units;
    const int r = static_cast<int>(is_k ? u - q_units : u & 3u);
    const int64_t slot = (is_k && t < p.num_cached) ? slot_mapping[t] : -1;
    const bool cached = in_range(slot, p.num_slots);  // guard: outside the cache = skipped like -1
    if (is_k && !p.rope && !cached) continue;  // concat only: nothing to do for this token
    const int64_t a = neox ? 8 * r : 16 * r;     // element offsets of the two 8-element halves
    const int64_t b = neox ? 32 + 8 * r : 16 * r + 8;
    QS* row = is_k ? k_pe + t * p.k_st : q_pe + t * p.q_st + static_cast<int64_t>(u >> 2) * p.q_sh;
    const int64_t sd = is_k ? k_sd : q_sd;
    float lo[8], hi[8];
    load8<VEC, QTag>(row + a * sd, sd, lo);
    load8<VEC, QTag>(row + b * sd, sd, hi);
    if (p.rope) {
      // Guard: a position outside [0, max_pos) rotates with kNanRow's NaNs (the Triton kernel's
      // masked load with other=NaN). A pointer select and the same loads, no branch: a branch
      // around the loads cost 5-7% at T=32768 on the H200, a select on each of the 16 outputs 2-5%.
      const int64_t pos = positions[t];
      const bool pos_ok = in_range(pos, p.max_pos);  // max_pos == 0: every position is outside
      using CSS = typename elem<CSTag>::storage;
      float c[8], s[8];
      if constexpr (VEC) {
        // 32-bit row offset: the launcher takes VEC only where every row starts below 2^31 elements,
        // and pos_ok bounds the row (unsigned: a bad pos wraps harmlessly, its pointer is not used).
        const uint32_t cs_off = static_cast<uint32_t>(pos) * static_cast<uint32_t>(p.cs_sp);
        const CSS* cs = pos_ok ? cos_sin + cs_off : reinterpret_cast<const CSS*>(kNanRow);
        load8<VEC, CSTag>(cs + 8 * r, 1, c);
        load8<VEC, CSTag>(cs + 32 + 8 * r, 1, s);
      } else {
        // Any strides: kNanRow cannot stand in for a strided row; read row 0 (if any), NaN after.
        const CSS* cs = cos_sin + (pos_ok ? pos : 0) * p.cs_sp;
        if (p.max_pos > 0) {
          load8<VEC, CSTag>(cs + (8 * r) * cs_sd, cs_sd, c);
          load8<VEC, CSTag>(cs + (32 + 8 * r) * cs_sd, cs_sd, s);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) c[j] = s[j] = 0.f;
        }
      }
      rotate_quarter(lo, hi, c, s, neox);
      if constexpr (!VEC) {
        const float nan = __int_as_float(0x7fc00000);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          lo[j] = pos_ok ? lo[j] : nan;
          hi[j] = pos_ok ? hi[j] : nan;
        }
      }
      store8<VEC>(row + a * sd, sd, lo, qconv);
      store8<VEC>(row + b * sd, sd, hi, qconv);
    }
    if (cached) {
      // The cache gets the float32 rotation, rounded once to its own type.
      CS* dst = cache + slot_offset(slot, p) + static_cast<int64_t>(kLatentDim) * kv_sd;
      if (!neox) {
        store16<VEC>(dst + a * kv_sd, kv_sd, lo, hi, conv);  // b == a + 8
      } else {
        store8<VEC>(dst + a * kv_sd, kv_sd, lo, conv);
        store8<VEC>(dst + b * kv_sd, kv_sd, hi, conv);
      }
    }
  }
}

}  // namespace rocm_mla
