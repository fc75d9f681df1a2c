// ISA-report translation unit: every kernel instantiation the launcher
// (../merge_attn_states.cu) can choose, compiled alone for gfx942 (clang-19) and sm_90 (nvcc).
#include "../kernels/merge_attn_states.cuh"

namespace rocm_mla {
#define MLA_INSTANTIATE(TAG, VEC, UNROLL)                                                      \
  template __global__ void merge_attn_states_kernel<TAG, VEC, UNROLL, uint32_t>(               \
      elem<TAG>::storage*, float*, const elem<TAG>::storage*, const float*,                    \
      const elem<TAG>::storage*, const float*, const MergeParams);                             \
  template __global__ void merge_attn_states_kernel<TAG, VEC, UNROLL, int64_t>(                \
      elem<TAG>::storage*, float*, const elem<TAG>::storage*, const float*,                    \
      const elem<TAG>::storage*, const float*, const MergeParams);
MLA_INSTANTIATE(bf16_t, 8, 4)
MLA_INSTANTIATE(bf16_t, 8, 2)
MLA_INSTANTIATE(bf16_t, 8, 1)
MLA_INSTANTIATE(bf16_t, 1, 1)
MLA_INSTANTIATE(f16_t, 8, 4)
MLA_INSTANTIATE(f16_t, 8, 2)
MLA_INSTANTIATE(f16_t, 8, 1)
MLA_INSTANTIATE(f16_t, 1, 1)
MLA_INSTANTIATE(f32_t, 4, 4)
MLA_INSTANTIATE(f32_t, 4, 2)
MLA_INSTANTIATE(f32_t, 4, 1)
MLA_INSTANTIATE(f32_t, 1, 1)
#undef MLA_INSTANTIATE
}  // namespace rocm_mla
