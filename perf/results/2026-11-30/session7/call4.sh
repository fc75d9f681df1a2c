#!/usr/bin/env bash
# session 7, device call 4: q through pointer loads (this tree) vs two q descriptor loads (.ab_before), host TMA, kv16M
S=perf/results/2026-11-30/session7
export ROCM_MLA_CACHE=/tmp/rmc
for tree in after before after before; do
  root="$PWD"; [ "$tree" = before ] && root="$PWD"/.ab_before
  echo "== $tree" >> "$OUT"/probe_q.log
  PYTHONPATH="$root":"$PWD"/perf python3 "$S"/prefill_probe.py "$S"/cfgs_q.json 2 >> "$OUT"/probe_q.log 2>&1
done
grep -v "^{" "$OUT"/probe_q.log
