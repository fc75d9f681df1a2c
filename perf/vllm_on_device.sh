#!/usr/bin/env bash
# For a GPU machine without network access, from the repo root:  source perf/vllm_on_device.sh
# (or `bash perf/vllm_on_device.sh` and use the export line it prints), with the carry folder
# $VLLM_CARRY (default .vllm_carry, git-ignored via .git/info/exclude; copy it there with the
# repository). Its contents (perf/vllm_on_device_manifest.txt lists them) are built on the
# CPU machine: vllm-<V>-py.tar.xz = the vllm==<V> wheel (V = 0.34.0, 0.33.0) minus *.so, vllm/vllm-rs
# and the C/C++/CUDA sources under third_party; whl/ and whl_override/ = cp312 manylinux wheels of the
# pins in .ci/vllm-cpu-requirements.txt that the device image lacks / may have older
# (`pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#  --platform manylinux_2_28_x86_64 ...`), plus typing_extensions 4.16. About 30 MB in all.
# Seen on the H200 (2026-11-29, torch 2.11 / transformers 5.17 there): vLLM imports, and every GPU
# test of tests/vllm_backend/test_vllm_backend.py passes. vLLM's compiled CUDA ops are not carried, so anything
# that resolves vLLM's platform to CUDA fails; the test harness
# (tests/vllm_harness/layer_step.py: use_simulated_gfx942_platform) keeps vLLM on a simulated ROCm platform,
# in spawned interpreters too.
# Makes vLLM $VLLM_VERSION (default 0.34.0; pure-Python part, no compiled ops) importable next to the image's own torch,
# numpy, triton, transformers, tokenizers, huggingface_hub, safetensors, pillow, which are NOT carried.
#   /tmp/vsite : vLLM + the pinned dependencies the image lacks (whl/*.whl). On sys.path AFTER the
#                image's site-packages, so whatever the image already has wins.
#   /tmp/vover : small pinned packages the image has (whl_override/*.whl), installed only where the
#                image's version is OLDER than the carried pin (or missing); BEFORE site-packages.
#   rocm_mla   : the repo root on the path + a hand-written dist-info in /tmp/vsite for the
#                vllm.general_plugins entry point (no pip install -e needed).
# Interpreter: $PYTHON (default python3).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
C=$(cd "${VLLM_CARRY:-$REPO/.vllm_carry}" && pwd)
PY=${PYTHON:-python3}
VV=${VLLM_VERSION:-0.34.0}
_vpip() { env -u PYTHONPATH "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --disable-pip-version-check "$@"; }
_vsetup() {
  rm -rf /tmp/vsite /tmp/vover && mkdir -p /tmp/vsite /tmp/vover || return 1
  tar -xJf "$C/vllm-$VV-py.tar.xz" -C /tmp/vsite || return 1
  _vpip --target /tmp/vsite "$C"/whl/*.whl || return 1
  local sel
  sel=$(env -u PYTHONPATH "$PY" - "$C"/whl_override/*.whl <<'EOF'
import sys, os, re
from importlib import metadata
from packaging.version import Version
out = []
for w in sys.argv[1:]:
    name, ver = os.path.basename(w).split("-")[:2]
    try:
        have = metadata.version(re.sub(r"[-_.]+", "-", name))
    except metadata.PackageNotFoundError:
        have = None
    take = have is None or Version(have) < Version(ver)
    print(f"[vsetup] {name}: image {have}, carried {ver} -> {'OVERRIDE' if take else 'keep image'}",
          file=sys.stderr)
    if take:
        out.append(w)
print(" ".join(out))
EOF
  ) || return 1
  if [ -n "$sel" ]; then
    # shellcheck disable=SC2086
    _vpip --target /tmp/vover $sel || return 1
  fi
  local D=/tmp/vsite/rocm_mla-0.1.0.dist-info
  mkdir -p "$D" || return 1
  printf 'Metadata-Version: 2.1\nName: rocm-mla\nVersion: 0.1.0\n' > "$D/METADATA"
  printf '[vllm.general_plugins]\nrocm_mla = rocm_mla.vllm:register\n\n[console_scripts]\nrocm-mla = rocm_mla.tools.cli:main\n' > "$D/entry_points.txt"
  printf 'rocm_mla\n' > "$D/top_level.txt"
  : > "$D/RECORD"
}
if _vsetup; then
  _VSP=$(env -u PYTHONPATH "$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  export PYTHONPATH="/tmp/vover:$REPO:$_VSP:/tmp/vsite"
  echo "export PYTHONPATH=$PYTHONPATH"
  "$PY" -c "import vllm, transformers, torch; print('[vsetup] vllm', vllm.__version__, vllm.__file__, '| transformers', transformers.__version__, '| torch', torch.__version__)" >&2 ||
    echo "[vsetup] WARNING: import vllm failed" >&2
else
  echo "[vsetup] FAILED" >&2
  false
fi
