#!/usr/bin/env bash
# Packs FlashInfer 0.7.4 (its Hopper MLA decode is the fastest measured peer on the H200) small enough to copy
# to a GPU machine without network access:
#   perf/peers/get_flashinfer_peer.sh .peers/flashinfer       (run here; downloads from PyPI; ~20 MB result)
# On the GPU machine, before Python starts (with .peers copied there):
#   mkdir -p /tmp/fi && tar -xJf .peers/flashinfer/flashinfer.tar.xz -C /tmp/fi
#   python3 -m pip install -q --no-index --no-deps --target /tmp/fi .peers/flashinfer/*.whl
#   export PYTHONPATH=/tmp/fi:$PYTHONPATH FLASHINFER_WORKSPACE_BASE=/tmp/fiws TVM_FFI_CACHE_DIR=/tmp/tvmffi
# Seen working on the H200 (2026-11-29): flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="fa3"),
#   .plan(metadata=MLAPlanMetadata.csr(qo_indptr=, kv_indptr=, kv_indices=, kv_len_arr=), num_heads=N,
#         head_dim_ckv=512, head_dim_kpe=64, page_size=64, causal=False, sm_scale=..., q_data_type=, kv_data_type=)
#   .run(query=q[B, N, 576], kv_cache=cache[P, page, 576], out=o[B, N, 512])   (vLLM's cache layout, no copy)
#   JIT build of the sm90 MLA module: ~22 s there. If linking fails on -lcuda, point
#   FLASHINFER_EXTRA_LDFLAGS=-L<dir with a libcuda.so symlink to the driver's libcuda.so.1>.
# Third-party code: keep the folder ignored, never commit it.
set -eu
dest=${1:?usage: get_flashinfer_peer.sh DEST_DIR}
ver=${FLASHINFER_PEER_VERSION:-0.7.4}
work=${TMPDIR:-/tmp}/flashinfer-peer-$ver
mkdir -p "$work" "$dest"
python3 -m pip download -q --no-deps --only-binary :all: -d "$work" "flashinfer-python==$ver"
python3 -m pip download -q --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$dest" apache-tvm-ffi
rm -rf "$work/tree" && mkdir -p "$work/tree"
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$work"/flashinfer_python-"$ver"-*.whl "$work/tree"
# Kernel sources of every other module live in subfolders of data/csrc; the MLA decode JIT needs only the
# top-level csrc files, include/, cutlass, cccl and spdlog.
find "$work/tree/flashinfer/data/csrc" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
tar -cJf "$dest/flashinfer.tar.xz" -C "$work/tree" flashinfer
du -sh "$dest"/* | sed 's/^/  /'
echo "FlashInfer $ver packed in $dest"
