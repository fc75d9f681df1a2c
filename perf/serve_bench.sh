#!/usr/bin/env bash
# Thin wrapper of perf/serve_bench.py for an MI300 machine or the image of docker/Dockerfile:
# unbuffered output (the logs interleave with vLLM's), results in $OUT (default ./results); every argument goes on to serve_bench.py (a later --out wins), e.g.
#   bash perf/serve_bench.sh --model deepseek-ai/DeepSeek-V3 --tp 8 --lm-eval
#   bash perf/serve_bench.sh --dry-run
set -euo pipefail
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" "$(dirname "$0")/serve_bench.py" --out "${OUT:-results}" "$@"
