#!/usr/bin/env bash
# For a GPU machine without network access (the repository and the peer folders copied there): build
# the HIP extension, run the whole test suite (GPU tests included), run the GPU kernels' tests under
# compute-sanitizer (memcheck; racecheck for kernels that use shared memory), then the op benchmarks
# through perf/bench.py and any other perf/ scripts named.
#   bash perf/device_run.sh [--sanitize PYTEST_K_EXPR] [--tests PYTEST_ARGS] [--no-tests] \
#       [--ops merge,decode[:--quick]] [--base DIR] [guard_cost[:ARGS] ...]
#   (text after ':' = the script's own arguments). --base DIR: a copy of another tree (e.g. `git archive
#   REV | tar -x -C DIR`); its --ops benchmarks run first, on the same GPU in the same sitting, into
#   base.csv, and perf/compare_csv.py prints this tree's time over the base's per shape.
# Everything lands in $OUT/run/ ($OUT defaults to ./results): logs, the benchmarks' rows in
# results.csv (fold them into perf/results.csv with `python perf/bench.py --merge FILE`), packed
# into $OUT/run.tgz, one file to copy back. FlashInfer (the decode peer) is unpacked from
# .peers/flashinfer when present (perf/peers/get_flashinfer_peer.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
TOP=${OUT:-results}
OUT=$TOP/run; mkdir -p "$OUT"
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-} ROCM_MLA_CACHE=${ROCM_MLA_CACHE:-/tmp/rocm_mla_cache}
sanitize="merge and (hip or triton) and not large"
tests="tests"
run_tests=1
benches=()
ops=""
base=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --no-tests) run_tests=0; sanitize=""; shift ;;
    --ops) ops=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    *) benches+=("$1"); shift ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
if [ "$run_tests" = 1 ]; then  # benches that need it build it on first use
  echo "== build HIP extension"
  start=$(date +%s)
  python3 -c "from rocm_mla import _ext; m = _ext.load(); print('extension:', m, _ext.unavailable_reason())" 2>&1 | tail -20
  echo "build: $(( $(date +%s) - start )) s"
fi
if [ -f .peers/flashinfer/flashinfer.tar.xz ]; then
  mkdir -p /tmp/fi && tar -xJf .peers/flashinfer/flashinfer.tar.xz -C /tmp/fi \
    && python3 -m pip install -q --no-index --no-deps --target /tmp/fi .peers/flashinfer/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/fi FLASHINFER_WORKSPACE_BASE=/tmp/fiws TVM_FFI_CACHE_DIR=/tmp/tvmffi
fi
if [ "$run_tests" = 1 ]; then
  echo "== tests"
  # shellcheck disable=SC2086
  python3 -m pytest -q $tests 2>&1 | tee "$OUT/pytest.log" | tail -25
fi
if [ -n "$sanitize" ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck: -k '$sanitize'"
  timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x tests -k "$sanitize" 2>&1 | tee "$OUT/memcheck.log" | tail -8
  if [ -n "${RACECHECK:-}" ]; then
    echo "== compute-sanitizer racecheck: -k '$RACECHECK'"
    timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -x tests -k "$RACECHECK" 2>&1 | tee "$OUT/racecheck.log" | tail -8
  fi
fi
if [ -n "$ops" ]; then
  extra=""
  [ "$ops" != "${ops%%:*}" ] && extra=${ops#*:}
  if [ -n "$base" ]; then
    echo "== base tree $base: perf/bench.py --ops ${ops%%:*} $extra"
    abs_out=$(cd "$OUT" && pwd)
    # shellcheck disable=SC2086
    (cd "$base" && PYTHONPATH=$PWD python3 perf/bench.py --ops "${ops%%:*}" --timeout "$BENCH_TIMEOUT" --commit base \
      --out "$abs_out/base.csv" --logs "$abs_out/base_logs" $extra) 2>&1 | tee "$OUT/base_bench.log" | tail -40
  fi
  echo "== perf/bench.py --ops ${ops%%:*} $extra"
  # shellcheck disable=SC2086
  python3 perf/bench.py --ops "${ops%%:*}" --timeout "$BENCH_TIMEOUT" --out "$OUT/results.csv" --logs "$OUT/logs" \
    $extra 2>&1 | tee "$OUT/bench.log" | tail -80
  if [ -n "$base" ]; then
    python3 perf/compare_csv.py "$OUT/base.csv" "$OUT/results.csv" --label-a base --label-b tree 2>&1 | tee "$OUT/compare.txt"
  fi
fi
for spec in "${benches[@]}"; do
  b=${spec%%:*}
  extra=""
  [ "$spec" != "$b" ] && extra=${spec#*:}
  echo "== perf/$b.py $extra"
  # shellcheck disable=SC2086
  timeout "$BENCH_TIMEOUT" python3 "perf/$b.py" --out "$OUT" $extra 2>&1 | tee "$OUT/$b.log" | tail -60
done
if [ "$run_tests" = 1 ]; then
  python3 -m rocm_mla.tools.cli doctor --skip-isa 2>&1 | tail -30
fi
tar -czf "$TOP/run.tgz" -C "$TOP" run
