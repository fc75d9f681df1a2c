#!/usr/bin/env bash
# session 8, device call 1: guard-form A/B (decode mask form; three RoPE forms); the decode, prefill and
# memory-safety GPU tests on this tree (mask form, runtime head_group); prefill timed at the default.
export ROCM_MLA_CACHE=/tmp/rmc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT"/device.txt 2>&1
PYTHONPATH="$PWD" timeout 300 python3 perf/guard_cost.py --ops rope,decode --case "rope triton" --case decode \
  --tree off=.guard_off --tree on=.ab_on --tree mA=.ab_mA --tree mB=.ab_mB --tree mD=.ab_mD --tree mF=.ab_mF \
  --rounds 4 --out "$OUT" > "$OUT"/guard_ab.log 2>&1
echo "guard rc $?"; tail -9 "$OUT"/guard_ab.log
# shellcheck source=/dev/null
source perf/vllm_on_device.sh >/dev/null 2>&1
timeout 150 python3 -m pytest -q -n 8 -m gpu tests/test_prefill.py tests/test_decode.py tests/test_memory_safety.py \
  -p no:cacheprovider > "$OUT"/gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 "$OUT"/gpu_tests.log
echo '{"default": null}' > /tmp/cfg_default.json
PYTHONPATH="$PWD":"$PWD"/perf timeout 100 python3 perf/results/2026-11-30/session7/prefill_probe.py /tmp/cfg_default.json 3 \
  > "$OUT"/probe_default.log 2>&1
echo "probe rc $?"; tail -8 "$OUT"/probe_default.log
