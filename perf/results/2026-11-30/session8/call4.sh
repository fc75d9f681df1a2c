#!/usr/bin/env bash
# session 8, device call 4: the prefill kernel at the sm90 default (host descriptors, runtime
# head_group) under compute-sanitizer racecheck and memcheck; bench_rope_kv_write --quick.
export ROCM_MLA_CACHE=/tmp/rmc PYTHONUNBUFFERED=1
timeout 100 compute-sanitizer --tool memcheck python3 -m pytest -q -m gpu tests/test_prefill.py \
  -k "strided_bf16 or chunked_context" -p no:cacheprovider > "$OUT"/memcheck_prefill.log 2>&1
echo "memcheck rc $?"; tail -3 "$OUT"/memcheck_prefill.log
timeout 300 compute-sanitizer --tool racecheck python3 -m pytest -q -m gpu tests/test_prefill.py \
  -k "strided_bf16_poisoned and 16 and latent" -p no:cacheprovider > "$OUT"/racecheck_prefill.log 2>&1
echo "racecheck rc $?"; tail -3 "$OUT"/racecheck_prefill.log
PYTHONPATH="$PWD" timeout 150 python3 perf/bench_rope_kv_write.py --quick --out "$OUT" > "$OUT"/bench_rope_kv_write.log 2>&1
echo "bench rc $?"; tail -12 "$OUT"/bench_rope_kv_write.log
