#!/usr/bin/env python3
"""Benchmark merge_attn_states: rocm_mla HIP and Triton vs vLLM 0.33's Triton merge and the torch
reference, as GB/s and % of the copy bandwidth measured in the same run.

    python perf/bench_merge.py [--out results] [--peers .peers] [--quick]

Bytes counted per call: prefix + suffix read and output written (T*N*D elements each) plus the
two lse reads and the output_lse write (T*N float32 each). Shapes: T in {4096, 32768}, N in
{16, 128}, D in {128, 512}; "contiguous" rows, or "strided" rows padded to D+64 (the pad_v view
[T, N, 192][..., :128] at D=128; [T, N, 576][..., :512] at D=512). bf16. Shapes, inputs and the
check of every timed output and output_lse against float32 come from rocm_mla.cases.merge
(SHAPES["bench"] / ["bench-quick"], make_inputs, TOLERANCE).
vLLM's merge is made importable by perf/peers/get_vllm_peers.sh .peers (never committed).
The launch configs are swept by `rocm-mla tune`, not here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from benchutil import Record, bench_parser, load_vllm_peer, print_table, start_bench, write_csv

from rocm_mla import __version__
from rocm_mla.cases import merge
from rocm_mla.ops import merge_attn_states
from rocm_mla.ops._dispatch import unavailable
from rocm_mla.reference import merge_attn_states_ref
from rocm_mla.tools.timing import time_ms


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for merge.csv")
    ap.add_argument("--peers", default=".peers", help="folder made by get_vllm_peers.sh")
    ap.add_argument("--quick", action="store_true", help="T=4096 only")
    args = ap.parse_args()
    gpu = start_bench("bench_merge", copy=True)
    if gpu is None:
        return 2
    dev, name, copy = gpu.dev, gpu.name, gpu.copy_gbs
    print(f"device: {name}; copy ceiling (read+write) {copy:.0f} GB/s")
    vllm_merge = load_vllm_peer(args.peers, "triton_merge_attn_states", "merge_attn_states")
    providers = {}
    for b in ("hip", "triton"):
        why = unavailable(b, dev)
        if why:
            print(f"rocm_mla-{b} skipped: {why}")
        else:
            providers[f"rocm_mla-{b}"] = lambda o, po, pl, so, sl, ol, b=b: merge_attn_states(
                o, po, pl, so, sl, ol, backend=b
            )
    if vllm_merge is not None:
        providers["vllm-0.33-triton"] = lambda o, po, pl, so, sl, ol: vllm_merge(o, po, pl, so, sl, ol)

    def torch_ref(o, po, pl, so, sl, ol):
        r, rl = merge_attn_states_ref(po, pl, so, sl)
        o.copy_(r)
        ol.copy_(rl)

    providers["torch-reference"] = torch_ref

    records, rows = [], []
    for shape in merge.SHAPES["bench-quick" if args.quick else "bench"]:
        case = merge.make_inputs(shape, dtype=torch.bfloat16, device=dev)
        ref = case.reference()
        nbytes = shape.nbytes(case.dtype)
        call_args = case.args()
        row = [shape.label]
        for pname, fn in providers.items():
            if pname == "torch-reference" and shape.T * shape.N * shape.D > 4096 * 128 * 512:
                row.append("-")  # float32 temporaries of ~50 GB: not informative
                continue
            case.output.fill_(float("nan"))
            case.output_lse.fill_(float("nan"))
            fn(*call_args)
            problem = case.mismatch(ref=ref)
            if problem:
                print(f"  {pname} {shape.label}: WRONG ({problem})")
            ms = time_ms(lambda fn=fn, a=call_args: fn(*a))
            gbs = nbytes / ms / 1e6
            row.append(f"{gbs:.0f} ({100 * gbs / copy:.0f}%)")
            for metric, val in (("time_us", ms * 1e3), ("GB/s", gbs), ("pct_copy", 100 * gbs / copy)):
                records.append(Record("merge_attn_states", pname, shape.label, metric, val, name, __version__))
        rows.append(row)
        del case, call_args, ref
        torch.cuda.empty_cache()
    records.append(Record("copy", "torch", "2 GiB", "GB/s", copy, name, torch.__version__))
    print(f"\nmerge_attn_states, bf16: GB/s (% of the {copy:.0f} GB/s copy ceiling)")
    print_table(["shape", *providers], rows)
    out_dir = Path(args.out)
    write_csv(out_dir / "merge.csv", records)
    print(f"wrote {out_dir / 'merge.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
