#!/usr/bin/env python3
"""Benchmark fused_rope_mla_kv_write: rocm_mla HIP and Triton vs the unfused two-step path vLLM 0.33
runs for DeepSeek on ROCm, as GB/s and % of the copy bandwidth measured in the same run.

    python perf/bench_rope_kv_write.py [--out results] [--quick]

Unfused path ("unfused-torch", benchutil.vllm_unfused_rope_kv_write): vLLM 0.33's
DeepseekScalingRotaryEmbedding.forward_native (its forward_static, verbatim in torch: gather
cos/sin, repeat_interleave, rotate_gptj, mul/add in the model dtype), the rotated q_pe copied back
into q (the model's ``q[..., 128:] = ...``), then the cache write as torch ops: cat([kv_c, k_pe])
(FP8: / k_scale, clamp, convert) and index_copy_ into the flattened cache. The fused kernels do all
of it in one pass, k_pe rotated in place.

Layout (DeepSeek-V3, bf16 model): q [T, N, 192] with q_pe = q[..., 128:] (strided); k_pe =
kv_a[:, 512:] of a [T, 576] buffer (strided); kv_c [T, 512] contiguous; cos_sin_cache
[163840, 64] bf16 (vLLM keeps it in the model dtype); random positions; cache
[num_blocks, 64, 576] bf16 or FP8 (e4m3fn on NVIDIA, e4m3fnuz on gfx94x) with k_scale; shuffled
slots. T in {1, 64, 4096, 32768}, N in {16, 128}. Shapes and inputs: rocm_mla.cases.rope_kv_write
(SHAPES["bench"] / ["bench-quick"], make_inputs); every provider is checked against the float32
reference on the untouched inputs before it is timed (the fused kernels: q_pe, k_pe, the cache rows
and nothing else written, cases TOLERANCE; the unfused path: RopeInputs.compare_unfused).

Bytes counted per call (the same for every provider: it is the op's work, not a provider's
traffic): q_pe read + write (T*N*64*2 each), k_pe read + write (T*64*2 each), kv_c read (T*512*2),
cache row write (T*576*cache element), positions and slots (T*8 each), cos_sin rows (T*64*2).
The launch data are swept by `rocm-mla tune`, not here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from benchutil import Record, bench_parser, print_table, start_bench, vllm_unfused_rope_kv_write, write_csv

from rocm_mla import __version__, _platform
from rocm_mla.cases import first_problem, rope_kv_write
from rocm_mla.cases.rope_kv_write import MAX_POS
from rocm_mla.configs import platform_fp8_dtype
from rocm_mla.ops import fused_rope_mla_kv_write
from rocm_mla.ops._dispatch import unavailable
from rocm_mla.reference.rope_kv_write import rope_cos_sin_cache
from rocm_mla.tools.timing import time_ms


def make_cos_sin(dev):
    """[MAX_POS, 64] bf16 cat(cos, sin), no mscale: |rotation| = 1, stable when repeated."""
    return rope_cos_sin_cache(MAX_POS, dtype=torch.bfloat16, device=dev)


def call_args(case: rope_kv_write.RopeInputs) -> tuple:
    """A provider's arguments (positions, q, kv_a, kv_c, cos_sin, cache, slots, fp8, k_scale) on ``case``."""
    return (case.positions, case.q, case.kv_a, case.kv_c, case.cos_sin, case.cache, case.slots, case.fp8, case.k_scale)


def problem(pname: str, fn, case: rope_kv_write.RopeInputs, ref) -> str:
    """Run ``fn`` once on the untouched inputs; '' when its result agrees with the reference."""
    case.restore()
    fn(*call_args(case))
    if pname == "unfused-torch":
        return first_problem(*case.compare_unfused(ref=ref)) or case.untouched()
    return case.mismatch(ref=ref)


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for rope_kv_write.csv")
    ap.add_argument("--quick", action="store_true", help="T=4096 only")
    args = ap.parse_args()
    gpu = start_bench("bench_rope_kv_write", copy=True)
    if gpu is None:
        return 2
    dev, name, copy = gpu.dev, gpu.name, gpu.copy_gbs
    print(f"device: {name}; copy ceiling (read+write) {copy:.0f} GB/s")
    fp8_kind = platform_fp8_dtype(_platform.device_arch(dev))

    providers = {}
    for b in ("hip", "triton"):
        why = unavailable(b, dev)
        if why:
            print(f"rocm_mla-{b} skipped: {why}")
        else:

            def fused(pos, q, kv_a, kv_c, cs, cache, slots, fp8, ks, b=b):
                fused_rope_mla_kv_write(
                    pos,
                    q[..., 128:],
                    kv_a[:, 512:].unsqueeze(1),
                    kv_c,
                    cs,
                    cache,
                    slots,
                    is_neox=False,
                    kv_cache_dtype="fp8" if fp8 is not None else "auto",
                    k_scale=ks,
                    backend=b,
                )

            providers[f"rocm_mla-{b}"] = fused
    providers["unfused-torch"] = vllm_unfused_rope_kv_write

    cos_sin = make_cos_sin(dev)

    records, rows = [], []
    for shape in rope_kv_write.SHAPES["bench-quick" if args.quick else "bench"]:
        label = shape.label(torch.bfloat16)
        case = rope_kv_write.make_inputs(shape, dtype=torch.bfloat16, device=dev, cos_sin=cos_sin, fp8=fp8_kind)
        ref = case.reference()
        nbytes = shape.nbytes(torch.bfloat16)
        timed_args = call_args(case)
        row = [label]
        times = {}
        for pname, fn in providers.items():
            bad = problem(pname, fn, case, ref)  # correctness first, on the untouched inputs
            if bad:
                print(f"  {pname} {label}: WRONG ({bad})")
            # the timed calls rotate q_pe / k_pe over and over (|rotation| = 1: the values stay bounded)
            ms = time_ms(lambda fn=fn, a=timed_args: fn(*a))
            times[pname] = ms
            gbs = nbytes / ms / 1e6
            row.append(f"{gbs:.0f} ({100 * gbs / copy:.0f}%) {ms * 1e3:.1f}us")
            for metric, val in (("time_us", ms * 1e3), ("GB/s", gbs), ("pct_copy", 100 * gbs / copy)):
                records.append(Record("fused_rope_mla_kv_write", pname, label, metric, val, name, __version__))
        fused_times = [v for k, v in times.items() if k != "unfused-torch"]
        if fused_times:
            speedup = times["unfused-torch"] / min(fused_times)
            row.append(f"{speedup:.1f}x")
            records.append(
                Record("fused_rope_mla_kv_write", "best-fused", label, "speedup_vs_unfused", speedup, name, __version__)
            )
        else:
            row.append("-")
        rows.append(row)
        del case, ref, timed_args
        torch.cuda.empty_cache()
    records.append(Record("copy", "torch", "2 GiB", "GB/s", copy, name, torch.__version__))
    print(
        f"\nfused_rope_mla_kv_write, bf16 model, GPT-J: GB/s (% of the {copy:.0f} GB/s copy ceiling) time;"
        f" fp8 = {str(fp8_kind).replace('torch.', '')}"
    )
    print_table(["shape", *providers, "best fused / unfused"], rows)
    out_dir = Path(args.out)
    write_csv(out_dir / "rope_kv_write.csv", records)
    print(f"wrote {out_dir / 'rope_kv_write.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
