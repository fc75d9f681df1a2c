// Python bindings of the rocm-mla HIP extension (module rocm_mla._C / JIT rocm_mla_hip).
// Each op's host function lives in its own <op>.cu beside this file.
#include <torch/extension.h>

namespace rocm_mla {
void merge_attn_states(at::Tensor out, c10::optional<at::Tensor> out_lse, at::Tensor prefix,
                       at::Tensor prefix_lse, at::Tensor suffix, at::Tensor suffix_lse,
                       int64_t waves_per_block, int64_t vecs_per_thread);
void rope_mla_kv_write(c10::optional<at::Tensor> positions, c10::optional<at::Tensor> q_pe, at::Tensor k_pe,
                       at::Tensor kv_c, c10::optional<at::Tensor> cos_sin_cache, at::Tensor kv_cache,
                       at::Tensor slot_mapping, c10::optional<at::Tensor> k_scale, bool is_neox,
                       int64_t cache_kind, int64_t waves_per_block, int64_t units_per_thread,
                       int64_t min_blocks_per_cu);
}  // namespace rocm_mla

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rocm-mla HIP kernels (built from hip_src/ for ROCm gfx942 or CUDA sm_90)";
  m.def("merge_attn_states", &rocm_mla::merge_attn_states,
        "LSE merge of two partial attentions, any strides (see rocm_mla.merge_attn_states)");
  m.def("rope_mla_kv_write", &rocm_mla::rope_mla_kv_write,
        "RoPE of q_pe/k_pe in place + latent KV-cache write, optional FP8 (see rocm_mla.fused_rope_mla_kv_write; "
        "q_pe/positions/cos_sin_cache None = concat_and_cache_mla)");
}
