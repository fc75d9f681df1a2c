#!/usr/bin/env python3
"""Run one mla_decode shape a few times, for a hardware profiler (Nsight Compute on NVIDIA,
rocprof on AMD) to attach to; prints the plan and the per-call time.

    ncu --clock-control none --set full -k regex:mla_decode_stage1 --launch-skip 3 --launch-count 1 \
        python3 perf/profile_decode.py --B 128 --seq 4096 --N 16 [--kv fp8] [--config '{"BLOCK_H": 64, ...}']

The inputs are bench_decode.py's (rocm_mla.tools.bench_decode_inputs: block 64, shuffled pages,
q as vLLM produces it), one cache copy (a profiler replays the kernel with its own cache control).
--config passes a stage-1 launch config (JSON, as in configs/mla_decode.json) instead of the
arch's default.
"""

from __future__ import annotations

import json
import sys

from rocm_mla.tools.bench_decode_inputs import BLOCK, Setup, ours, plan_for
from rocm_mla.tools.benchutil import bench_parser, one_call_us, rotating_graph_us, start_bench


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--B", type=int, default=128)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--N", type=int, default=16)
    ap.add_argument("--kv", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--q-len", type=int, default=1, help="query rows per request (MTP)")
    ap.add_argument("--block", type=int, default=BLOCK, help="cache page size (tokens)")
    ap.add_argument("--config", default="", help="stage-1 launch config as JSON (default: the arch's)")
    ap.add_argument("--splits", type=int, default=None, help="force the KV split count")
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--time", action="store_true", help="also print the CUDA-graph replay time (rotating_graph_us)")
    args = ap.parse_args()
    gpu = start_bench("profile_decode")
    if gpu is None:
        return 2
    dev = gpu.dev
    s = Setup(args.B, args.seq, args.N, args.kv, dev, cold_bytes=0, block=args.block, q_len=args.q_len)
    cfg = json.loads(args.config) if args.config else None
    plan = plan_for(s, dev, cfg, args.splits)
    print(f"{s.label} block={s.block}: S={plan.num_kv_splits} row_blocks={plan.row_blocks} config={plan.config}")
    fn = ours(s, cfg, args.splits)
    for i in range(args.calls):
        us = one_call_us(lambda: fn(0), dev)
        print(f"call {i}: {us:.1f} us ({s.nbytes() / us / 1e3:.0f} GB/s)")
    if args.time:
        us = rotating_graph_us(fn, 1)
        print(f"graph replay: {us:.1f} us ({s.nbytes() / us / 1e3:.0f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
