#!/usr/bin/env bash
# One call on a lent GPU machine (the session's device tool): build the HIP extension, run the
# whole test suite (GPU tests included), run the GPU kernels' tests under compute-sanitizer
# (memcheck; racecheck for kernels that use shared memory), then the named benchmarks.
#   bash perf/device_run.sh [--sanitize PYTEST_K_EXPR] [--tests PYTEST_ARGS] bench_merge [bench_x ...]
# Logs and CSV/PNG go to $OUT (the device tool's output folder) or ./results.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-results}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-} ROCM_MLA_CACHE=${ROCM_MLA_CACHE:-/tmp/rocm_mla_cache}
sanitize="merge and (hip or triton) and not large"
tests="tests"
benches=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    *) benches+=("$1"); shift ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
echo "== build HIP extension"
start=$(date +%s)
python3 -c "from rocm_mla import _ext; m = _ext.load(); print('extension:', m, _ext.unavailable_reason())" 2>&1 | tail -20
echo "build: $(( $(date +%s) - start )) s"
echo "== tests"
# shellcheck disable=SC2086
python3 -m pytest -q $tests 2>&1 | tee "$OUT/pytest.log" | tail -25
if [ -n "$sanitize" ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck: -k '$sanitize'"
  compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x tests -k "$sanitize" 2>&1 | tee "$OUT/memcheck.log" | tail -8
  if [ -n "${RACECHECK:-}" ]; then
    echo "== compute-sanitizer racecheck: -k '$RACECHECK'"
    compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -x tests -k "$RACECHECK" 2>&1 | tee "$OUT/racecheck.log" | tail -8
  fi
fi
for b in "${benches[@]}"; do
  echo "== perf/$b.py"
  python3 "perf/$b.py" --out "$OUT" 2>&1 | tee "$OUT/$b.log" | tail -40
done
python3 -m rocm_mla.tools.cli doctor --skip-isa 2>&1 | tail -12
