#!/usr/bin/env bash
# session 7, device call 1: head-group A/B, ncu of the prefill kernel, GPU suite
S=perf/results/2026-11-30/session7
export ROCM_MLA_CACHE=/tmp/rmc PYTHONPATH="$PWD":"$PWD"/perf
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT"/gpu.txt
python3 "$S"/prefill_probe.py "$S"/cfgs_hg.json 3 > "$OUT"/probe_hg.log 2>&1
for shp in "16x1024 N=16" "4x4096 N=16"; do
  tag=$(echo "$shp" | tr -d ' =')
  ncu --set full --import-source yes -k regex:mla_prefill_kernel --launch-skip 3 --launch-count 1 -o "$OUT/ncu_$tag" \
      python3 perf/profile_prefill.py --shape "$shp" > "$OUT/ncu_$tag.log" 2>&1
  ncu --import "$OUT/ncu_$tag.ncu-rep" --page details > "$OUT/ncu_${tag}_details.txt" 2>&1
  ncu --import "$OUT/ncu_$tag.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$OUT/ncu_${tag}_sass.csv.gz"
done
# shellcheck source=/dev/null
source perf/vllm_on_device.sh >/dev/null 2>&1
timeout 300 python3 -m pytest -q -n 8 -m gpu tests/ -p no:cacheprovider > "$OUT"/gpu_suite.log 2>&1
tail -3 "$OUT"/gpu_suite.log
grep -v "^{" "$OUT"/probe_hg.log | tail -12
