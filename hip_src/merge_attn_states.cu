// Host launcher for kernels/merge_attn_states.cuh (the only place that launches it).
// Argument validation with readable errors lives in rocm_mla/ops/_checks.py; the checks
// here are the last line of defence for direct callers of the extension.
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <limits>

#include "kernels/merge_attn_states.cuh"
#include "launch_util.h"

namespace rocm_mla {
namespace {

template <typename Tag, int VEC, int UNROLL, typename Index>
void launch(at::Tensor& out, float* out_lse, const at::Tensor& prefix, const float* prefix_lse,
            const at::Tensor& suffix, const float* suffix_lse, const MergeParams& p,
            int64_t total, int threads) {
  using S = typename elem<Tag>::storage;
  // Grid-stride loop in the kernel covers whatever a capped grid leaves.
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, std::numeric_limits<int32_t>::max());
  auto stream = c10::cuda::getCurrentCUDAStream();
  merge_attn_states_kernel<Tag, VEC, UNROLL, Index><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      reinterpret_cast<S*>(out.data_ptr()), out_lse,
      reinterpret_cast<const S*>(prefix.data_ptr()), prefix_lse,
      reinterpret_cast<const S*>(suffix.data_ptr()), suffix_lse, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool aligned16(const at::Tensor& x) {
  return reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
}

template <typename Tag, int VEC, int UNROLL>
void launch_index(at::Tensor& out, float* out_lse, const at::Tensor& prefix, const float* prefix_lse,
                  const at::Tensor& suffix, const float* suffix_lse, const MergeParams& p, int threads) {
  // head_size 0: one (lse-only) group per row, as the kernel counts them.
  const int64_t total = p.num_tokens * p.num_heads * std::max<int64_t>(1, p.head_size / (VEC * UNROLL));
  if (total == 0) return;
  // uint32 indices while idx + grid stride cannot wrap.
  if (2 * (total + threads) < static_cast<int64_t>(std::numeric_limits<uint32_t>::max()))
    launch<Tag, VEC, UNROLL, uint32_t>(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, p, total, threads);
  else
    launch<Tag, VEC, UNROLL, int64_t>(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, p, total, threads);
}

template <typename Tag>
void dispatch(at::Tensor& out, float* out_lse, const at::Tensor& prefix, const float* prefix_lse,
              const at::Tensor& suffix, const float* suffix_lse, const MergeParams& p,
              int threads, int max_unroll) {
  using S = typename elem<Tag>::storage;
  constexpr int kVec = vec_traits<S>::kElems;
  const bool vec = p.head_size > 0 && p.head_size % kVec == 0 && p.out_sd == 1 && p.pre_sd == 1 && p.suf_sd == 1 &&
                   p.out_st % kVec == 0 && p.out_sh % kVec == 0 && p.pre_st % kVec == 0 &&
                   p.pre_sh % kVec == 0 && p.suf_st % kVec == 0 && p.suf_sh % kVec == 0 &&
                   aligned16(out) && aligned16(prefix) && aligned16(suffix);
  if (!vec) {
    launch_index<Tag, 1, 1>(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, p, threads);
    return;
  }
  const int64_t vecs = p.head_size / kVec;  // 16-byte vectors per row
  if (max_unroll >= 4 && vecs % 4 == 0)
    launch_index<Tag, kVec, 4>(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, p, threads);
  else if (max_unroll >= 2 && vecs % 2 == 0)
    launch_index<Tag, kVec, 2>(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, p, threads);
  else
    launch_index<Tag, kVec, 1>(out, out_lse, prefix, prefix_lse, suffix, suffix_lse, p, threads);
}

}  // namespace

// out/prefix/suffix: [T, N, D] any strides, one dtype (f32/f16/bf16);
// *_lse: [N, T] float32 any strides; out_lse optional.
// waves_per_block: block size in waves of the platform's width; vecs_per_thread: 16-byte
// vectors per operand a thread moves (1, 2 or 4) — both from rocm_mla/configs, per arch.
void merge_attn_states(at::Tensor out, c10::optional<at::Tensor> out_lse, at::Tensor prefix,
                       at::Tensor prefix_lse, at::Tensor suffix, at::Tensor suffix_lse,
                       int64_t waves_per_block, int64_t vecs_per_thread) {
  TORCH_CHECK(out.dim() == 3 && prefix.sizes() == out.sizes() && suffix.sizes() == out.sizes(),
              "merge_attn_states: output, prefix_output, suffix_output must share one [T, N, D] shape");
  TORCH_CHECK(prefix.scalar_type() == out.scalar_type() && suffix.scalar_type() == out.scalar_type(),
              "merge_attn_states: outputs must share one dtype");
  TORCH_CHECK(prefix_lse.scalar_type() == at::kFloat && suffix_lse.scalar_type() == at::kFloat,
              "merge_attn_states: lse tensors must be float32");
  const c10::cuda::OptionalCUDAGuard guard(out.device());
  const int64_t threads64 = waves_per_block * wave_size(out.get_device());
  TORCH_CHECK(waves_per_block > 0 && threads64 <= 1024,
              "merge_attn_states: waves_per_block x wave size must be in 1..1024, got ", threads64);
  TORCH_CHECK(out.device() == prefix.device() && out.device() == suffix.device() &&
              out.device() == prefix_lse.device() && out.device() == suffix_lse.device(),
              "merge_attn_states: all tensors must be on one device");
  MergeParams p;
  p.num_tokens = out.size(0);
  p.num_heads = out.size(1);
  p.head_size = out.size(2);
  p.out_st = out.stride(0); p.out_sh = out.stride(1); p.out_sd = out.stride(2);
  p.pre_st = prefix.stride(0); p.pre_sh = prefix.stride(1); p.pre_sd = prefix.stride(2);
  p.suf_st = suffix.stride(0); p.suf_sh = suffix.stride(1); p.suf_sd = suffix.stride(2);
  p.plse_sh = prefix_lse.stride(0); p.plse_st = prefix_lse.stride(1);
  p.slse_sh = suffix_lse.stride(0); p.slse_st = suffix_lse.stride(1);
  float* olse = nullptr;
  p.olse_sh = p.olse_st = 0;
  if (out_lse.has_value()) {
    TORCH_CHECK(out_lse->scalar_type() == at::kFloat, "merge_attn_states: output_lse must be float32");
    olse = out_lse->data_ptr<float>();
    p.olse_sh = out_lse->stride(0);
    p.olse_st = out_lse->stride(1);
  }
  const float* plse = prefix_lse.data_ptr<float>();
  const float* slse = suffix_lse.data_ptr<float>();
  const int t = static_cast<int>(threads64);
  const int u = static_cast<int>(vecs_per_thread);
  switch (out.scalar_type()) {
    case at::kFloat: dispatch<f32_t>(out, olse, prefix, plse, suffix, slse, p, t, u); break;
    case at::kHalf: dispatch<f16_t>(out, olse, prefix, plse, suffix, slse, p, t, u); break;
    case at::kBFloat16: dispatch<bf16_t>(out, olse, prefix, plse, suffix, slse, p, t, u); break;
    default: TORCH_CHECK(false, "merge_attn_states: unsupported dtype ", out.scalar_type());
  }
}

}  // namespace rocm_mla
