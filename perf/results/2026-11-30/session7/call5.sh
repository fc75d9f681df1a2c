#!/usr/bin/env bash
# session 7, device call 5 (final): bench_prefill --tune --context with peers; GPU suite; memcheck of the prefill GPU tests
export ROCM_MLA_CACHE=/tmp/rmc PYTHONPATH="$PWD":"$PWD"/perf
cp perf/RESULTS.md "$OUT"/RESULTS.md
timeout 290 python3 perf/bench_prefill.py --tune --context --out "$OUT" --update-results "$OUT"/RESULTS.md > "$OUT"/bench_prefill.log 2>&1
echo "bench rc $?"; tail -30 "$OUT"/bench_prefill.log
# shellcheck source=/dev/null
source perf/vllm_on_device.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q -n 8 -m gpu tests/ -p no:cacheprovider > "$OUT"/gpu_suite.log 2>&1
tail -2 "$OUT"/gpu_suite.log
timeout 90 compute-sanitizer --tool memcheck python3 -m pytest -q -x -m gpu tests/test_prefill.py -k "tma_candidates or strided_bf16" -p no:cacheprovider > "$OUT"/memcheck_prefill.log 2>&1
tail -3 "$OUT"/memcheck_prefill.log
