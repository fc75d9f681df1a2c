#!/usr/bin/env bash
# The two set-up commands of the README, usable on a fresh machine:
#   ./dev.sh doctor   install what is missing, then run the main job (rocm-mla doctor)
#   ./dev.sh test     install what is missing, then run the test suite (ROCM_MLA_TEST_WORKERS processes, default 2)
#   VLLM_VERSION=0.33.0 ./dev.sh test-vllm   the vLLM tests against that vLLM release (it replaces
#                     the installed one; 0.34.0 is the default and what `test` installs)
# Python: $PYTHON (default python3). A torch that is already installed (ROCm or CUDA build) is
# kept; otherwise the CPU build torch==2.13.0 is installed (a plain `torch` would pull a
# multi-GB CUDA build). apt installs clang-19 and clang-22 (with lld and llvm) and the ROCm device
# libs for the gfx942 and gfx950 HIP checks.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

setup() {
  if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==2.13.0 (CPU) and triton==3.7.1" >&2
    "$PY" -m pip install -q torch==2.13.0 triton==3.7.1
  fi
  "$PY" -c "import triton" 2>/dev/null || "$PY" -m pip install -q triton==3.7.1
  "$PY" -c "import pytest" 2>/dev/null || "$PY" -m pip install -q "pytest>=7"
  "$PY" -c "import xdist" 2>/dev/null || "$PY" -m pip install -q "pytest-xdist==3.8.0"
  "$PY" -c "import matplotlib" 2>/dev/null || "$PY" -m pip install -q matplotlib || echo "[setup] matplotlib unavailable: benchmarks will skip plots" >&2
  # Editable, no build isolation: uses the torch above, so a GPU torch gets the HIP extension built now.
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
  bash .ci/install_amd_toolchain.sh
  PYTHON="$PY" bash .ci/install_vllm_cpu.sh  # vLLM (VLLM_VERSION, default 0.34.0) for the vLLM tests (they skip without it)
}

# run_pytest PATH [pytest args]. Test processes (pytest-xdist; ROCM_MLA_TEST_WORKERS, default 2):
# the CPU interpreter's cases are single-threaded Python. Work stealing hands out single tests, so a
# few long files (the vLLM backend's, the ISA report's) do not leave a worker idle at the end as
# whole files do. 1 runs everything in one process.
run_pytest() {
  local path=$1 workers=${ROCM_MLA_TEST_WORKERS:-2}
  shift
  if [ "$workers" -gt 1 ]; then set -- -n "$workers" --dist worksteal "$@"; fi
  exec "$PY" -m pytest -q "$path" "$@"
}

cmd=${1:-}
shift || true
case "$cmd" in
  doctor) setup; exec "$PY" -m rocm_mla.tools.cli doctor "$@" ;;
  test)
    setup
    run_pytest tests "$@" ;;
  test-vllm)
    setup
    "$PY" -c "import vllm; print(f'[test-vllm] vLLM {vllm.__version__}')"
    run_pytest tests/vllm_backend "$@" ;;
  *) echo "usage: ./dev.sh doctor|test|test-vllm [extra args]" >&2; exit 2 ;;
esac
