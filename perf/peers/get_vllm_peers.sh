#!/usr/bin/env bash
# Makes vLLM 0.33.0's Triton MLA kernels importable WITHOUT installing vLLM, for side-by-side benchmarks:
#   perf/peers/get_vllm_peers.sh .peers          (run on this machine; it downloads the vllm wheel from PyPI)
#   then: sys.path.insert(0, ".peers"); from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd
#         from vllm.v1.attention.ops.triton_merge_attn_states import merge_attn_states
# The kernels import `packaging` and triton. The folder holds third-party code: keep it ignored (.gitignore), never commit it. A GPU machine without
# network access: make the folder on a machine with it and copy it over.
set -eu
dest=${1:?usage: get_vllm_peers.sh DEST_DIR}
ver=${VLLM_PEER_VERSION:-0.33.0}
cache=${TMPDIR:-/tmp}/vllm-wheel-$ver
mkdir -p "$cache" "$dest"
whl=$(find "$cache" -maxdepth 1 -name "vllm-$ver-*.whl" | head -n 1)
if [ -z "$whl" ]; then
  python3 -m pip download -q --no-deps --only-binary :all: --platform manylinux_2_28_x86_64 --python-version 3.12 \
    -d "$cache" "vllm==$ver"
  whl=$(find "$cache" -maxdepth 1 -name "vllm-$ver-*.whl" | head -n 1)
fi
ops=vllm/v1/attention/ops
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], [sys.argv[3] + '/triton_decode_attention.py', sys.argv[3] + '/triton_merge_attn_states.py'])" "$whl" "$cache" "$ops"
mkdir -p "$dest/vllm/v1/attention/ops"
for d in "$dest/vllm/v1" "$dest/vllm/v1/attention" "$dest/vllm/v1/attention/ops"; do : > "$d/__init__.py"; done
cp "$cache/$ops/triton_decode_attention.py" "$cache/$ops/triton_merge_attn_states.py" "$dest/vllm/v1/attention/ops/"
cat > "$dest/vllm/__init__.py" <<'PY'
# Stand-in package: only what vLLM's Triton MLA kernels import (platforms, triton_utils).
PY
cat > "$dest/vllm/triton_utils.py" <<'PY'
import triton
import triton.language as tl

__all__ = ["triton", "tl"]
PY
cat > "$dest/vllm/platforms.py" <<'PY'
import torch


class _Platform:
    """The few calls vLLM's Triton attention kernels make on current_platform."""

    device_type = "cuda"

    def is_rocm(self):
        return torch.version.hip is not None

    def is_cuda(self):
        return torch.version.hip is None

    def is_cuda_alike(self):
        return True

    def is_xpu(self):
        return False

    def fp8_dtype(self):
        return torch.float8_e4m3fnuz if self.is_rocm() else torch.float8_e4m3fn

    def num_compute_units(self):
        return torch.cuda.get_device_properties(0).multi_processor_count

    def get_device_capability(self, device_id=0):
        return torch.cuda.get_device_capability(device_id)

    def has_device_capability(self, cap, device_id=0):
        major, minor = torch.cuda.get_device_capability(device_id)
        return major * 10 + minor >= cap


current_platform = _Platform()
PY
echo "$ver" > "$dest/VLLM_VERSION"
echo "vLLM $ver Triton MLA peers ready in $dest (decode_attention_fwd, merge_attn_states)"
