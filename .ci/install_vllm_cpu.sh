#!/usr/bin/env bash
# Installs vLLM for the CPU tests of the ROCM_MLA backend (the vLLM tests), as
# docs/notes/vllm-on-cpu.md describes. VLLM_VERSION picks the release: 0.34.0 (default, what CI
# tests) or 0.33.0 (also supported: `VLLM_VERSION=0.33.0 ./dev.sh test-vllm`).
#   1. `pip install --no-deps vllm==$VLLM_VERSION`: the CUDA-13 wheel's metadata wants torch==2.14.0,
#      which would replace the torch in use (ROCm, CUDA or CPU 2.13); --no-deps keeps it. Its
#      compiled ops do not load without a GPU driver, and nothing under test needs them.
#   2. the pins of .ci/vllm-cpu-requirements.txt with --no-deps (they satisfy both releases):
#      unpinned installs pull transformers/fastapi above vLLM's limits, the wrong openai_harmony, a
#      broken xgrammar.
#   3. typing_extensions >= 4.16 when older (anyio 4.16 of the pins imports typing_extensions.sentinel,
#      which vLLM's model inspection reaches through fastapi).
# Idempotent and quiet when the asked vLLM is already importable. Outside CI another vLLM already
# installed (a serving machine) is left alone and a failed install does not fail the caller (the
# vLLM tests then skip with the reason). In CI (CI=true) the asked version replaces any other and
# anything short of it importable fails the script, so CI never goes green without the vLLM tests.
# Python: $PYTHON (default python3). About 1.2 GB and two minutes on a fresh machine.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
WANT=${VLLM_VERSION:-0.34.0}
case "$WANT" in
  0.34.0 | 0.33.0) ;;
  *) echo "[setup] VLLM_VERSION=$WANT: expected 0.34.0 or 0.33.0 (the releases the backend supports)" >&2; exit 2 ;;
esac

installed() { "$PY" -c "import vllm; print(vllm.__version__)" 2>/dev/null; }
have_vllm() { "$PY" -c "import vllm, sys; sys.exit(vllm.__version__ != '$WANT')" >/dev/null 2>&1; }

fail() {
  echo "[setup] WARNING: $1; the vLLM tests (tests/vllm_backend/) will skip" >&2
  [ "${CI:-}" = true ] && exit 1
  exit 0
}
have=$(installed)
if [ -n "$have" ] && [ "$have" != "$WANT" ] && [ "${CI:-}" != true ] && [ -z "${VLLM_VERSION:-}" ]; then
  echo "[setup] vLLM $have is installed, not $WANT: left alone (VLLM_VERSION=$WANT replaces it)" >&2
  exit 0
fi
if ! have_vllm; then
  echo "[setup] installing vLLM $WANT (--no-deps) and its pinned CPU dependencies" >&2
  if ! { "$PY" -m pip install -q --no-deps "vllm==$WANT" &&
         "$PY" -m pip install -q --no-deps -r .ci/vllm-cpu-requirements.txt; }; then
    fail "vLLM $WANT could not be installed"
  fi
fi
if ! "$PY" -c "from typing_extensions import sentinel" >/dev/null 2>&1; then
  "$PY" -m pip install -q "typing_extensions>=4.16" ||
    echo "[setup] WARNING: typing_extensions>=4.16 not installed; vLLM's model inspection may fail" >&2
fi
have=$(installed)
have_vllm || fail "vLLM $WANT is not importable after the install (found: ${have:-none})"
exit 0
