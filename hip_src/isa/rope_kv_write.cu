// ISA-report translation unit: every kernel instantiation the launcher (../rope_kv_write.cu) can
// choose, compiled alone for gfx942 (clang-19) and sm_90 (nvcc).
// Launcher choices: q dtype (f32/f16/bf16) x cos_sin_cache (float32 or the q dtype) x cache
// (the q dtype, FP8 e4m3fn, FP8 e4m3fnuz) x VEC (16-byte accesses) / scalar (any strides).
#include "../kernels/rope_kv_write.cuh"

namespace rocm_mla {
#define MLA_INSTANTIATE_ONE(Q, CS, CACHE, VEC)                                                      \
  template __global__ void rope_mla_kv_write_kernel<Q, CS, CACHE, VEC>(                            \
      const int64_t*, elem<Q>::storage*, elem<Q>::storage*, const elem<Q>::storage*,               \
      const elem<CS>::storage*, cache_conv<CACHE>::storage*, const int64_t*, const float*,         \
      const RopeKVParams);
#define MLA_INSTANTIATE(Q, CS)                    \
  MLA_INSTANTIATE_ONE(Q, CS, Q, true)             \
  MLA_INSTANTIATE_ONE(Q, CS, Q, false)            \
  MLA_INSTANTIATE_ONE(Q, CS, fp8e4m3fn_t, true)   \
  MLA_INSTANTIATE_ONE(Q, CS, fp8e4m3fn_t, false)  \
  MLA_INSTANTIATE_ONE(Q, CS, fp8e4m3fnuz_t, true) \
  MLA_INSTANTIATE_ONE(Q, CS, fp8e4m3fnuz_t, false)
MLA_INSTANTIATE(bf16_t, f32_t)
MLA_INSTANTIATE(bf16_t, bf16_t)
MLA_INSTANTIATE(f16_t, f32_t)
MLA_INSTANTIATE(f16_t, f16_t)
MLA_INSTANTIATE(f32_t, f32_t)
#undef MLA_INSTANTIATE
#undef MLA_INSTANTIATE_ONE
}  // namespace rocm_mla
