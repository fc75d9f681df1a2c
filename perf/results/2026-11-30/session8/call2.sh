#!/usr/bin/env bash
# session 8, device call 2: guard cost of this tree (decode: the first table entries loaded beside
# seq_len; Triton RoPE: one unsigned compare, 32-bit cos/sin offset) against the unguarded copy and
# HEAD (.ab_on); GPU tests of decode, RoPE and memory safety; memcheck of the memory-safety GPU tests.
export ROCM_MLA_CACHE=/tmp/rmc PYTHONUNBUFFERED=1
PYTHONPATH="$PWD" timeout 200 python3 perf/guard_cost.py --ops rope,decode --case "rope triton" --case decode \
  --tree off=.guard_off --tree on=.ab_on --tree new=. --rounds 6 --out "$OUT" > "$OUT"/guard_ab2.log 2>&1
echo "guard rc $?"; tail -7 "$OUT"/guard_ab2.log
# shellcheck source=/dev/null
source perf/vllm_on_device.sh >/dev/null 2>&1
timeout 150 python3 -m pytest -q -n 8 -m gpu tests/test_decode.py tests/test_rope_kv_write.py tests/test_memory_safety.py \
  -p no:cacheprovider > "$OUT"/gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 "$OUT"/gpu_tests.log
timeout 200 compute-sanitizer --tool memcheck python3 -m pytest -q -m gpu tests/test_memory_safety.py \
  -p no:cacheprovider > "$OUT"/memcheck_memory_safety.log 2>&1
echo "memcheck rc $?"; tail -4 "$OUT"/memcheck_memory_safety.log
