#!/usr/bin/env python3
"""Run one mla_decode shape a few times, for a hardware profiler (Nsight Compute on NVIDIA,
rocprof on AMD) to attach to; prints the plan and the per-call time.

    ncu --clock-control none --set full -k regex:mla_decode_stage1 --launch-skip 3 --launch-count 1 \
        python3 perf/profile_decode.py --B 128 --seq 4096 --N 16 [--kv fp8] [--config '{"BLOCK_H": 64, ...}']

The inputs are bench_decode.py's (rocm_mla.cases.decode.make_inputs: block 64, shuffled pages, q
as vLLM produces it, a table as wide as the longest request), one cache copy (a profiler replays
the kernel with its own cache control). --config passes a stage-1 launch config (JSON, as in
configs/mla_decode.json) instead of the arch's default.
"""

from __future__ import annotations

import json
import sys

import torch
from benchutil import bench_parser, one_call_us, start_bench

from rocm_mla.cases import decode
from rocm_mla.tools.timing import rotating_graph_us


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--B", type=int, default=128)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--N", type=int, default=16)
    ap.add_argument("--kv", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--q-len", type=int, default=1, help="query rows per request (MTP)")
    ap.add_argument("--block", type=int, default=64, help="cache page size (tokens)")
    ap.add_argument("--config", default="", help="stage-1 launch config as JSON (default: the arch's)")
    ap.add_argument("--splits", type=int, default=None, help="force the KV split count")
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--time", action="store_true", help="also print the CUDA-graph replay time (rotating_graph_us)")
    args = ap.parse_args()
    gpu = start_bench("profile_decode")
    if gpu is None:
        return 2
    dev = gpu.dev
    kv = "fp8" if args.kv == "fp8" else "auto"
    shape = decode.DecodeShape(args.B, args.seq, args.N, args.q_len, block=args.block, kv=kv)
    case = decode.make_inputs(shape, dtype=torch.bfloat16, device=dev, spare_cols=0)
    cfg = json.loads(args.config) if args.config else None
    plan = case.plan(dev, config=cfg, num_splits=args.splits)
    label = shape.label(torch.bfloat16)
    print(f"{label} block={shape.block}: S={plan.num_splits} head_blocks={plan.head_blocks} config={plan.config}")
    nbytes = shape.nbytes(torch.bfloat16)

    def fn(i: int = 0):
        case.run(i, max_seq_len=shape.seq, backend="triton", config=cfg, num_splits=args.splits)

    for i in range(args.calls):
        us = one_call_us(fn, dev)
        print(f"call {i}: {us:.1f} us ({nbytes / us / 1e3:.0f} GB/s)")
    if args.time:
        us = rotating_graph_us(fn, 1)
        print(f"graph replay: {us:.1f} us ({nbytes / us / 1e3:.0f} GB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
