#!/usr/bin/env bash
# Makes aiter's Triton kernels importable WITHOUT aiter's ROCm runtime, for side-by-side benchmarks
# and the gfx942 compile report:
#   perf/peers/get_aiter_peers.sh .peers/aiter      (run on this machine; downloads the amd-aiter wheel from PyPI)
#   then: sys.path.insert(0, ".peers/aiter")
#         from aiter.ops.triton.mla_decode_rope import decode_attention_fwd_grouped_rope
#         from aiter.ops.triton.mha import flash_attn_varlen_func
# (perf/benchutil.py's load_aiter_peer does both.) Only the wheel's aiter/ops/triton tree is unpacked (~5 MB);
# `import aiter` itself loads ROCm libraries, so aiter/__init__.py and aiter/ops/__init__.py are empty
# stand-ins. The folder holds third-party code: keep it ignored (.gitignore has .peers/), never commit
# it. A GPU machine without network access: make the folder on a machine with it and copy it over.
set -eu
dest=${1:?usage: get_aiter_peers.sh DEST_DIR}
ver=${AITER_PEER_VERSION:-0.1.7.post2.dev18}
cache=${TMPDIR:-/tmp}/aiter-wheel-$ver
mkdir -p "$cache" "$dest"
whl=$(find "$cache" -maxdepth 1 -name "amd_aiter-$ver-*.whl" | head -n 1)
if [ -z "$whl" ]; then
  python3 -m pip download -q --no-deps --only-binary :all: -d "$cache" "amd-aiter==$ver"
  whl=$(find "$cache" -maxdepth 1 -name "amd_aiter-$ver-*.whl" | head -n 1)
fi
python3 - "$whl" "$dest" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("aiter/ops/triton/")]
    z.extractall(dest, names)
print(f"aiter peer: {len(names)} files of {whl.rsplit('/', 1)[-1]} in {dest}")
PY
printf '# Stand-in: the real aiter/__init__.py loads ROCm libraries. Only aiter.ops.triton is here.\n' > "$dest/aiter/__init__.py"
: > "$dest/aiter/ops/__init__.py"
echo "$ver" > "$dest/AITER_VERSION"
