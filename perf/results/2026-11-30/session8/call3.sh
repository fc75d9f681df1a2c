#!/usr/bin/env bash
# session 8, device call 3: the guards' cost, every case (HIP RoPE included), this tree against its
# unguarded copy; the whole GPU suite on this tree.
export ROCM_MLA_CACHE=/tmp/rmc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT"/device.txt 2>&1
PYTHONPATH="$PWD" timeout 330 python3 perf/guard_cost.py --tree off=.guard_off --tree on=. --rounds 5 --out "$OUT" \
  > "$OUT"/guard_cost.log 2>&1
echo "guard rc $?"; tail -12 "$OUT"/guard_cost.log
# shellcheck source=/dev/null
source perf/vllm_on_device.sh >/dev/null 2>&1
timeout 240 python3 -m pytest -q -n 8 -m gpu tests/ -p no:cacheprovider > "$OUT"/gpu_suite.log 2>&1
echo "suite rc $?"; tail -3 "$OUT"/gpu_suite.log
