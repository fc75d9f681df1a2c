// Host launcher for kernels/rope_kv_write.cuh (the only place that launches it).
// Argument validation with readable errors lives in rocm_mla/ops/rope_kv_write.py; the checks here are
// the last line of defence for direct callers of the extension.
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include "kernels/rope_kv_write.cuh"
#include "launch_util.h"

namespace rocm_mla {
namespace {

// Compute units (CUs / SMs) of a device, asked once per device: the launcher keeps at least
// min_blocks_per_cu blocks per CU in flight when the batch is small.
int cu_count(int device) {
  static std::atomic<int> cached[64] = {};
  if (device >= 0 && device < 64) {
    const int c = cached[device].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (device >= 0 && device < 64) cached[device].store(n, std::memory_order_relaxed);
  return n;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Dim `d` can be walked in 16-byte steps of `k` elements (a dim of size 1 has no step).
bool step_ok(const at::Tensor& x, int d, int64_t k) { return x.size(d) <= 1 || x.stride(d) % k == 0; }

bool inner_ok(const at::Tensor& x) { return x.size(-1) <= 1 || x.stride(-1) == 1; }

// Strides travel as int32 (kernels/rope_kv_write.cuh, RopeKVParams); one step of 2^31 elements
// or more is no layout anyone passes.
int32_t stride32(int64_t s, const char* name) {
  TORCH_CHECK(s > std::numeric_limits<int32_t>::min() && s < std::numeric_limits<int32_t>::max(),
              "rope_mla_kv_write: ", name, " has a stride of 2^31 elements or more (", s, ")");
  return static_cast<int32_t>(s);
}

struct Launch {
  int64_t blocks;
  int threads;
};

template <typename QTag, typename CSTag, typename CacheTag>
void dispatch(const at::Tensor* positions, const at::Tensor* q_pe, at::Tensor& k_pe, const at::Tensor& kv_c,
              const at::Tensor* cos_sin, at::Tensor& cache, const at::Tensor& slots, const float* k_scale,
              const RopeKVParams& p, const Launch& l) {
  using QS = typename elem<QTag>::storage;
  using CSS = typename elem<CSTag>::storage;
  using CacheS = typename cache_conv<CacheTag>::storage;
  constexpr int64_t kq = 16 / sizeof(QS), kcs = 16 / sizeof(CSS), kc = 16 / sizeof(CacheS);
  bool vec = inner_ok(k_pe) && step_ok(k_pe, 0, kq) && aligned16(k_pe.data_ptr()) &&
             inner_ok(kv_c) && step_ok(kv_c, 0, kq) && aligned16(kv_c.data_ptr()) &&
             inner_ok(cache) && step_ok(cache, 0, kc) && step_ok(cache, 1, kc) && aligned16(cache.data_ptr());
  if (q_pe != nullptr) {
    // The vector kernel's cos/sin row offsets are 32-bit: every row must start below 2^31 elements.
    const bool cs_off32 = (cos_sin->size(0) - 1) * cos_sin->stride(0) < (int64_t{1} << 31);
    vec = vec && inner_ok(*q_pe) && step_ok(*q_pe, 0, kq) && step_ok(*q_pe, 1, kq) &&
          aligned16(q_pe->data_ptr()) && inner_ok(*cos_sin) && step_ok(*cos_sin, 0, kcs) &&
          aligned16(cos_sin->data_ptr()) && cs_off32;
  }
  const int64_t* pos = positions ? positions->data_ptr<int64_t>() : nullptr;
  QS* q = q_pe ? reinterpret_cast<QS*>(q_pe->data_ptr()) : nullptr;
  const CSS* cs = cos_sin ? reinterpret_cast<const CSS*>(cos_sin->data_ptr()) : nullptr;
  auto stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid(static_cast<unsigned>(l.blocks));
  if (vec) {
    rope_mla_kv_write_kernel<QTag, CSTag, CacheTag, true><<<grid, l.threads, 0, stream>>>(
        pos, q, reinterpret_cast<QS*>(k_pe.data_ptr()), reinterpret_cast<const QS*>(kv_c.data_ptr()), cs,
        reinterpret_cast<CacheS*>(cache.data_ptr()), slots.data_ptr<int64_t>(), k_scale, p);
  } else {
    rope_mla_kv_write_kernel<QTag, CSTag, CacheTag, false><<<grid, l.threads, 0, stream>>>(
        pos, q, reinterpret_cast<QS*>(k_pe.data_ptr()), reinterpret_cast<const QS*>(kv_c.data_ptr()), cs,
        reinterpret_cast<CacheS*>(cache.data_ptr()), slots.data_ptr<int64_t>(), k_scale, p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// cache_kind: 0 = the q dtype, 1 = FP8 E4M3FN, 2 = FP8 E4M3FNUZ (cache passed as uint8).
template <typename QTag, typename CSTag>
void dispatch_cache(int64_t cache_kind, const at::Tensor* positions, const at::Tensor* q_pe, at::Tensor& k_pe,
                    const at::Tensor& kv_c, const at::Tensor* cos_sin, at::Tensor& cache, const at::Tensor& slots,
                    const float* k_scale, const RopeKVParams& p, const Launch& l) {
  switch (cache_kind) {
    case 0: dispatch<QTag, CSTag, QTag>(positions, q_pe, k_pe, kv_c, cos_sin, cache, slots, k_scale, p, l); break;
    case 1:
      dispatch<QTag, CSTag, fp8e4m3fn_t>(positions, q_pe, k_pe, kv_c, cos_sin, cache, slots, k_scale, p, l);
      break;
    case 2:
      dispatch<QTag, CSTag, fp8e4m3fnuz_t>(positions, q_pe, k_pe, kv_c, cos_sin, cache, slots, k_scale, p, l);
      break;
    default: TORCH_CHECK(false, "rope_mla_kv_write: cache_kind must be 0, 1 or 2, got ", cache_kind);
  }
}

// cos_sin_cache is float32 or the q dtype; without rope (nullptr) any tag will do.
template <typename QTag>
void dispatch_cs(int64_t cache_kind, const at::Tensor* positions, const at::Tensor* q_pe, at::Tensor& k_pe,
                 const at::Tensor& kv_c, const at::Tensor* cos_sin, at::Tensor& cache, const at::Tensor& slots,
                 const float* k_scale, const RopeKVParams& p, const Launch& l) {
  if (cos_sin != nullptr && cos_sin->scalar_type() == at::kFloat) {
    dispatch_cache<QTag, f32_t>(cache_kind, positions, q_pe, k_pe, kv_c, cos_sin, cache, slots, k_scale, p, l);
  } else {
    dispatch_cache<QTag, QTag>(cache_kind, positions, q_pe, k_pe, kv_c, cos_sin, cache, slots, k_scale, p, l);
  }
}

}  // namespace

// Rope mode (q_pe given): positions [T] int64, q_pe [T, N, 64], cos_sin_cache [max_pos, 64]
// (float32 or the q dtype). Concat mode (q_pe, positions, cos_sin_cache all None): no rotation.
// k_pe [T, 64], kv_c [T, 512] (q dtype), kv_cache [num_blocks, block_size, 576] (the q dtype,
// or uint8 holding FP8 codes when cache_kind is 1 or 2; k_scale then a 1-element float32),
// slot_mapping [S <= T] int64. Any strides; 16-byte vector accesses when they allow.
// waves_per_block, units_per_thread, min_blocks_per_cu: launch shape (rocm_mla/configs, per arch).
void rope_mla_kv_write(c10::optional<at::Tensor> positions, c10::optional<at::Tensor> q_pe, at::Tensor k_pe,
                       at::Tensor kv_c, c10::optional<at::Tensor> cos_sin_cache, at::Tensor kv_cache,
                       at::Tensor slot_mapping, c10::optional<at::Tensor> k_scale, bool is_neox,
                       int64_t cache_kind, int64_t waves_per_block, int64_t units_per_thread,
                       int64_t min_blocks_per_cu) {
  const bool rope = q_pe.has_value();
  TORCH_CHECK(rope == positions.has_value() && rope == cos_sin_cache.has_value(),
              "rope_mla_kv_write: q_pe, positions and cos_sin_cache are given together or not at all");
  const int64_t T = k_pe.size(0);
  TORCH_CHECK(k_pe.dim() == 2 && k_pe.size(1) == kRopeDim, "rope_mla_kv_write: k_pe must be [T, 64]");
  TORCH_CHECK(kv_c.dim() == 2 && kv_c.size(0) == T && kv_c.size(1) == kLatentDim,
              "rope_mla_kv_write: kv_c must be [T, 512]");
  TORCH_CHECK(kv_cache.dim() == 3 && kv_cache.size(2) == kCacheRowDim,
              "rope_mla_kv_write: kv_cache must be [num_blocks, block_size, 576]");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) <= T && slot_mapping.scalar_type() == at::kLong,
              "rope_mla_kv_write: slot_mapping must be int64 [S <= T]");
  TORCH_CHECK(kv_c.scalar_type() == k_pe.scalar_type(), "rope_mla_kv_write: kv_c and k_pe must share a dtype");
  if (rope) {
    TORCH_CHECK(q_pe->dim() == 3 && q_pe->size(0) == T && q_pe->size(2) == kRopeDim &&
                    q_pe->scalar_type() == k_pe.scalar_type(),
                "rope_mla_kv_write: q_pe must be [T, N, 64] of k_pe's dtype");
    TORCH_CHECK(positions->dim() == 1 && positions->size(0) == T && positions->scalar_type() == at::kLong,
                "rope_mla_kv_write: positions must be int64 [T]");
    TORCH_CHECK(cos_sin_cache->dim() == 2 && cos_sin_cache->size(1) == kRopeDim &&
                    (cos_sin_cache->scalar_type() == at::kFloat || cos_sin_cache->scalar_type() == k_pe.scalar_type()),
                "rope_mla_kv_write: cos_sin_cache must be [max_pos, 64], float32 or q_pe's dtype");
  }
  if (cache_kind == 0) {
    TORCH_CHECK(kv_cache.scalar_type() == k_pe.scalar_type(), "rope_mla_kv_write: kv_cache must have k_pe's dtype");
  } else {
    TORCH_CHECK(kv_cache.scalar_type() == at::kByte, "rope_mla_kv_write: an FP8 kv_cache is passed as uint8");
    TORCH_CHECK(k_scale.has_value() && k_scale->numel() == 1 && k_scale->scalar_type() == at::kFloat,
                "rope_mla_kv_write: an FP8 cache needs k_scale, a 1-element float32 tensor");
    TORCH_CHECK(k_scale->device() == kv_cache.device(), "rope_mla_kv_write: k_scale must be on kv_cache's device");
  }
  const c10::cuda::OptionalCUDAGuard guard(kv_cache.device());
  for (const at::Tensor* x : {&k_pe, &kv_c, &slot_mapping}) {
    TORCH_CHECK(x->device() == kv_cache.device(), "rope_mla_kv_write: all tensors must be on one device");
  }
  if (rope) {
    for (const at::Tensor* x : {&*q_pe, &*positions, &*cos_sin_cache}) {
      TORCH_CHECK(x->device() == kv_cache.device(), "rope_mla_kv_write: all tensors must be on one device");
    }
  }
  // Slots are divided in 32 bits (kernels/rope_kv_write.cuh, slot_offset).
  TORCH_CHECK(kv_cache.size(0) * kv_cache.size(1) < (int64_t{1} << 32),
              "rope_mla_kv_write: num_blocks x block_size must be < 2^32");
  if (T == 0) return;

  RopeKVParams p;
  p.num_tokens = T;
  p.num_cached = slot_mapping.size(0);
  p.num_slots = kv_cache.size(0) * kv_cache.size(1);
  p.max_pos = rope ? cos_sin_cache->size(0) : 0;
  p.block_size = static_cast<int32_t>(kv_cache.size(1));
  p.num_heads = rope ? static_cast<int32_t>(q_pe->size(1)) : 0;
  p.units_per_token = 4 * p.num_heads + kRopeUnits + kLatentUnits;
  p.is_neox = rope && is_neox ? 1 : 0;  // concat mode: contiguous quarters (one FP8 store each)
  p.rope = rope ? 1 : 0;
  p.q_st = rope ? stride32(q_pe->stride(0), "q_pe") : 0;
  p.q_sh = rope ? stride32(q_pe->stride(1), "q_pe") : 0;
  p.q_sd = rope ? stride32(q_pe->stride(2), "q_pe") : 0;
  p.k_st = stride32(k_pe.stride(0), "k_pe");
  p.k_sd = stride32(k_pe.stride(1), "k_pe");
  p.c_st = stride32(kv_c.stride(0), "kv_c");
  p.c_sd = stride32(kv_c.stride(1), "kv_c");
  p.cs_sp = rope ? stride32(cos_sin_cache->stride(0), "cos_sin_cache") : 0;
  p.cs_sd = rope ? stride32(cos_sin_cache->stride(1), "cos_sin_cache") : 0;
  p.kv_sb = stride32(kv_cache.stride(0), "kv_cache");
  p.kv_so = stride32(kv_cache.stride(1), "kv_cache");
  p.kv_sd = stride32(kv_cache.stride(2), "kv_cache");

  // Launch shape: a block of waves_per_block waves owns tokens_per_block whole tokens, about
  // units_per_thread units per thread, but fewer tokens when that would leave CUs idle.
  const int device = kv_cache.get_device();
  const int ws = wave_size(device);
  const int64_t threads = waves_per_block * ws;
  TORCH_CHECK(waves_per_block > 0 && threads <= 1024 && units_per_thread > 0 && min_blocks_per_cu >= 0,
              "rope_mla_kv_write: bad launch config (waves_per_block x wave size in 1..1024, units_per_thread > 0)");
  int64_t tpb = std::max<int64_t>(1, threads * units_per_thread / p.units_per_token);
  const int64_t want_blocks = static_cast<int64_t>(cu_count(device)) * min_blocks_per_cu;
  if (want_blocks > 0) tpb = std::min<int64_t>(tpb, std::max<int64_t>(1, (T + want_blocks - 1) / want_blocks));
  p.tokens_per_block = static_cast<int32_t>(tpb);
  // As many rounds over the block's units as `threads` needs, but the fewest whole waves that
  // cover them in that many rounds (N=128: 548 units, 3 rounds of 192 threads, not 256 + 256 + 36).
  const int64_t units = tpb * p.units_per_token;
  const int64_t rounds = (units + threads - 1) / threads;
  const int64_t per_round = (units + rounds - 1) / rounds;
  const int64_t block_threads = (per_round + ws - 1) / ws * ws;
  const Launch l{(T + tpb - 1) / tpb, static_cast<int>(block_threads)};
  TORCH_CHECK(l.blocks <= std::numeric_limits<int32_t>::max(), "rope_mla_kv_write: too many tokens: ", T);

  const at::Tensor* pos = rope ? &*positions : nullptr;
  const at::Tensor* q = rope ? &*q_pe : nullptr;
  const at::Tensor* cs = rope ? &*cos_sin_cache : nullptr;
  const float* ks = (cache_kind != 0) ? k_scale->data_ptr<float>() : nullptr;
  switch (k_pe.scalar_type()) {
    case at::kFloat: dispatch_cs<f32_t>(cache_kind, pos, q, k_pe, kv_c, cs, kv_cache, slot_mapping, ks, p, l); break;
    case at::kHalf: dispatch_cs<f16_t>(cache_kind, pos, q, k_pe, kv_c, cs, kv_cache, slot_mapping, ks, p, l); break;
    case at::kBFloat16:
      dispatch_cs<bf16_t>(cache_kind, pos, q, k_pe, kv_c, cs, kv_cache, slot_mapping, ks, p, l);
      break;
    default: TORCH_CHECK(false, "rope_mla_kv_write: unsupported dtype ", k_pe.scalar_type());
  }
}

}  // namespace rocm_mla
