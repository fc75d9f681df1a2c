#!/usr/bin/env python3
"""Run one mla_prefill shape a few times, for a hardware profiler (Nsight Compute on NVIDIA,
rocprof on AMD) to attach to; prints the config and the per-call time.

    ncu --clock-control none --set full -k regex:mla_prefill_kernel --launch-skip 3 --launch-count 1 \
        python3 perf/profile_prefill.py --shape "16x1024 N=16" [--config '{"BLOCK_M": 128, ...}']

The inputs are bench_prefill.py's (rocm_mla.cases.prefill.make_inputs: q, k_nope / v as strided
views of one kv_b_proj output, k_pe one broadcast head of the latent buffer, causal, bf16) for one
of its shapes (--shape, the label as bench_prefill prints it). --config passes a launch config
(JSON, as in configs/mla_prefill.json) instead of the arch's default. The config is first checked
as bench_prefill checks it (check_against_reference: cases.prefill.SHAPES["reference"] against
float32 under cases.prefill.TOLERANCE; a mismatch stops the run), so a profiled config is correct
on that batch. The one perf/ script that imports another: it profiles bench_prefill's own inputs,
call and check.
"""

from __future__ import annotations

import json
import sys

from bench_prefill import SHAPES, Case, Timer, check_against_reference
from benchutil import bench_parser, one_call_us, start_bench

from rocm_mla.cases import first_problem


def main() -> int:
    ap = bench_parser(__doc__)
    names = [s.label for s in SHAPES]
    worst = "16x1024 N=16"  # the farthest shape from cuDNN
    default = worst if worst in names else names[0]
    ap.add_argument("--shape", default=default, choices=names, help=f"one of bench_prefill's shapes ({default})")
    ap.add_argument("--config", default="", help="launch config as JSON (default: the arch's)")
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--time", action="store_true", help="also print the median of CUDA-graph replays")
    args = ap.parse_args()
    gpu = start_bench("profile_prefill")
    if gpu is None:
        return 2
    shape = SHAPES[names.index(args.shape)]
    cfg = json.loads(args.config) if args.config else None
    checks = check_against_reference(gpu.dev, cfg)
    err, problem = checks[0].norm_err, first_problem(*checks)
    print(f"{shape.label}: config={cfg or 'default'} rel. error {err:.2e} against float32 (bench_prefill's check)")
    if problem:
        print(f"error too large ({problem}): not profiling a wrong result", file=sys.stderr)
        return 1
    case = Case(shape, gpu.dev)
    for i in range(args.calls):
        us = one_call_us(lambda: case.ours(cfg), gpu.dev)
        print(f"call {i}: {us:.1f} us ({shape.flops() / us / 1e6:.0f} TFLOP/s)")
    if args.time:
        timer = Timer(graphs=True)
        us = timer("ours", lambda: case.ours(cfg)) * 1e3
        how = "graph replay" if not timer.fallbacks else f"no graph ({timer.fallbacks[0]}), do_bench"
        print(f"{how}: {us:.1f} us ({shape.flops() / us / 1e6:.0f} TFLOP/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
