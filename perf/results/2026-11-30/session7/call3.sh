#!/usr/bin/env bash
# session 7, device call 3: one-trip sequence lookup (this tree) vs the two-trip one (.ab_before), host TMA
S=perf/results/2026-11-30/session7
export ROCM_MLA_CACHE=/tmp/rmc
for tree in after before after; do
  root="$PWD"; [ "$tree" = before ] && root="$PWD"/.ab_before
  echo "== $tree" >> "$OUT"/probe_lookup.log
  PYTHONPATH="$root":"$PWD"/perf python3 "$S"/prefill_probe.py "$S"/cfgs_lookup.json 2 >> "$OUT"/probe_lookup.log 2>&1
done
PYTHONPATH="$PWD":"$PWD"/perf timeout 120 python3 -m pytest -q -x -m gpu tests/test_prefill.py -p no:cacheprovider 2>&1 | tail -1
grep -v "^{" "$OUT"/probe_lookup.log
