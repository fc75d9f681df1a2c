#!/usr/bin/env bash
# session 8, device call 6: HIP RoPE with a 32-bit cos/sin row offset (VEC path) -- guard cost against
# the unguarded copy and HEAD (.ab_on); the RoPE and memory-safety GPU tests; memcheck of the latter.
export ROCM_MLA_CACHE=/tmp/rmc PYTHONUNBUFFERED=1
PYTHONPATH="$PWD" timeout 280 python3 perf/guard_cost.py --ops rope --case "rope hip" \
  --tree off=.guard_off --tree on=.ab_on --tree new=. --rounds 4 --out "$OUT" > "$OUT"/guard_hip.log 2>&1
echo "guard rc $?"; tail -6 "$OUT"/guard_hip.log
timeout 100 python3 -m pytest -q -n 8 -m gpu tests/test_rope_kv_write.py tests/test_memory_safety.py \
  -p no:cacheprovider > "$OUT"/gpu_tests.log 2>&1
echo "tests rc $?"; tail -2 "$OUT"/gpu_tests.log
timeout 90 compute-sanitizer --tool memcheck python3 -m pytest -q -m gpu tests/test_memory_safety.py \
  -k "rope or concat" -p no:cacheprovider > "$OUT"/memcheck_rope.log 2>&1
echo "memcheck rc $?"; tail -3 "$OUT"/memcheck_rope.log
