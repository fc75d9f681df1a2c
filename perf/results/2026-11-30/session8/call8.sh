#!/usr/bin/env bash
# session 8, device call 8: CPU-marked tests that take the GPU when one is there (the page-guard
# tests of this session, the empty cache, quantize_q's opt-in through the environment), and
# profile_decode's one-call timer (benchutil.one_call_us), none of which a GPU had run.
export ROCM_MLA_CACHE=/tmp/rmc PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
# shellcheck source=/dev/null
source perf/vllm_on_device.sh >/dev/null 2>&1
timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_decode.py tests/test_vllm_backend.py \
  -k "cache_without_pages or mtp_row or bad_page_id or quantize_q_opt_in" > "$OUT"/gpu_cpu_marked.log 2>&1
echo "tests rc $?"; tail -3 "$OUT"/gpu_cpu_marked.log
timeout 60 python3 perf/profile_decode.py --B 128 --seq 4096 --N 16 > "$OUT"/profile_decode.log 2>&1
echo "profile rc $?"; tail -5 "$OUT"/profile_decode.log
