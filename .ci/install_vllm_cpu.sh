#!/usr/bin/env bash
# Installs vLLM 0.33.0 for the CPU tests of the ROCM_MLA backend (the vLLM tests), as
# docs/notes/vllm-0.33-on-cpu.md describes:
#   1. `pip install --no-deps vllm==0.33.0`: the CUDA-13 wheel's metadata wants torch==2.14.0, which
#      would replace the torch in use (ROCm, CUDA or CPU 2.13); --no-deps keeps it. Its compiled ops
#      do not load without a GPU driver, and nothing under test needs them.
#   2. the 52 pins of .ci/vllm-0.33-cpu-requirements.txt with --no-deps: unpinned installs pull
#      transformers/fastapi above vLLM's limits, the wrong openai_harmony, a broken xgrammar.
#   3. typing_extensions >= 4.16 when older (anyio 4.16 of the pins imports typing_extensions.sentinel,
#      which vLLM's model inspection reaches through fastapi).
# Idempotent and quiet when vLLM 0.33.0 is already importable. Another vLLM version already
# installed (a serving machine) is left alone. Outside CI a failed install does not fail the caller
# (the vLLM tests then skip with the reason); in CI (CI=true) it does, so CI never goes green
# without having run them.
# Python: $PYTHON (default python3). About 1.2 GB and two minutes on a fresh machine.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}

have_vllm() { "$PY" -c "import vllm, sys; sys.exit(vllm.__version__ != '0.33.0')" >/dev/null 2>&1; }

fail() {
  echo "[setup] WARNING: $1; the vLLM tests (tests/vllm_backend/) will skip" >&2
  [ "${CI:-}" = true ] && exit 1
  exit 0
}
if "$PY" -c "import vllm" >/dev/null 2>&1 && ! have_vllm; then
  echo "[setup] vLLM $("$PY" -c "import vllm; print(vllm.__version__)") is installed, not 0.33.0: left alone" >&2
  exit 0
fi
if ! have_vllm; then
  echo "[setup] installing vLLM 0.33.0 (--no-deps) and its 52 pinned CPU dependencies" >&2
  if ! { "$PY" -m pip install -q --no-deps vllm==0.33.0 &&
         "$PY" -m pip install -q --no-deps -r .ci/vllm-0.33-cpu-requirements.txt; }; then
    fail "vLLM 0.33.0 could not be installed"
  fi
fi
if ! "$PY" -c "from typing_extensions import sentinel" >/dev/null 2>&1; then
  "$PY" -m pip install -q "typing_extensions>=4.16" ||
    echo "[setup] WARNING: typing_extensions>=4.16 not installed; vLLM's model inspection may fail" >&2
fi
have_vllm || fail "vLLM 0.33.0 is not importable after the install"
exit 0
