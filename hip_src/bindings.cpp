// Python bindings of the rocm-mla HIP extension (module rocm_mla._C / JIT rocm_mla_hip).
// Each op's host function lives in its own <op>.cu beside this file.
#include <torch/extension.h>

namespace rocm_mla {
void merge_attn_states(at::Tensor out, c10::optional<at::Tensor> out_lse, at::Tensor prefix,
                       at::Tensor prefix_lse, at::Tensor suffix, at::Tensor suffix_lse,
                       int64_t waves_per_block, int64_t vecs_per_thread);
}  // namespace rocm_mla

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rocm-mla HIP kernels (built from hip_src/ for ROCm gfx942 or CUDA sm_90)";
  m.def("merge_attn_states", &rocm_mla::merge_attn_states,
        "LSE merge of two partial attentions, any strides (see rocm_mla.merge_attn_states)");
}
