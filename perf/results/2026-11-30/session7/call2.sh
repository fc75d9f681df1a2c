#!/usr/bin/env bash
# session 7, device call 2: host TMA descriptors + head groups; ncu of host mode at 16x1024; prefill GPU tests
S=perf/results/2026-11-30/session7
export ROCM_MLA_CACHE=/tmp/rmc PYTHONPATH="$PWD":"$PWD"/perf
timeout 200 python3 -m pytest -q -x -m gpu tests/test_prefill.py -p no:cacheprovider > "$OUT"/gpu_prefill.log 2>&1
tail -2 "$OUT"/gpu_prefill.log
python3 "$S"/prefill_probe.py "$S"/cfgs_host.json 3 > "$OUT"/probe_host.log 2>&1
C='{"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "tma": "host", "head_group": 8}'
ncu --set full --import-source yes -k regex:mla_prefill_kernel --launch-skip 3 --launch-count 1 -o /tmp/ncu_h \
    python3 perf/profile_prefill.py --shape "16x1024 N=16" --config "$C" > /tmp/ncu_h.log 2>&1
tail -2 /tmp/ncu_h.log
ncu --import /tmp/ncu_h.ncu-rep --page details > "$OUT"/ncu_host_16x1024_details.txt 2>&1
ncu --import /tmp/ncu_h.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > "$OUT"/ncu_host_16x1024_sass.csv.gz
grep -v "^{" "$OUT"/probe_host.log | tail -12
