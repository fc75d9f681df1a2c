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
slots. T in {1, 64, 4096, 32768}, N in {16, 128}.

Bytes counted per call (the same for every provider: it is the op's work, not a provider's
traffic): q_pe read + write (T*N*64*2 each), k_pe read + write (T*64*2 each), kv_c read (T*512*2),
cache row write (T*576*cache element), positions and slots (T*8 each), cos_sin rows (T*64*2).
The launch data are swept by `rocm-mla tune`, not here.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

from rocm_mla import __version__, _platform
from rocm_mla.configs import platform_fp8_dtype
from rocm_mla.ops import fused_rope_mla_kv_write
from rocm_mla.ops._dispatch import unavailable
from rocm_mla.reference.rope_kv_write import fused_rope_mla_kv_write_ref, quantize_fp8_ref, rope_cos_sin_cache
from rocm_mla.tools.benchutil import (
    Record,
    bench_parser,
    print_table,
    start_bench,
    time_ms,
    vllm_unfused_rope_kv_write,
    write_csv,
)

MAX_POS = 163840  # DeepSeek-V3: 4096 positions x YaRN factor 40
BLOCK_SIZE = 64


def make_case(dev, T: int, N: int, fp8, cos_sin):
    """One benchmark shape in the layouts described above; returns its tensors and byte count."""
    q = torch.randn(T, N, 192, device=dev, dtype=torch.bfloat16)
    kv_a = torch.randn(T, 576, device=dev, dtype=torch.bfloat16)
    kv_c = torch.randn(T, 512, device=dev, dtype=torch.bfloat16)
    pos = torch.randint(0, MAX_POS, (T,), device=dev)
    num_blocks = (T * 5 // 4 + BLOCK_SIZE - 1) // BLOCK_SIZE + 1
    slots = torch.randperm(num_blocks * BLOCK_SIZE, device=dev)[:T]
    cache = torch.zeros(num_blocks, BLOCK_SIZE, 576, device=dev, dtype=torch.bfloat16)
    if fp8 is not None:
        cache = cache.to(fp8)
    elem = cache.element_size()
    nbytes = 2 * T * N * 64 * 2 + 2 * T * 64 * 2 + T * 512 * 2 + T * 576 * elem + 2 * T * 8 + T * 64 * 2
    return q, kv_a, kv_c, pos, slots, cache, nbytes


def expected(q, kv_a, kv_c, pos, cos_sin, fp8, k_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_pe after RoPE, the cache rows as stored and read back) by the float32 reference: what every
    provider's output is checked against (fp8: quantised by k_scale, dequantised again)."""
    q_ref, _, rows_ref = fused_rope_mla_kv_write_ref(pos, q[..., 128:], kv_a[:, 512:], kv_c, cos_sin, is_neox=False)
    want = rows_ref if fp8 is None else quantize_fp8_ref(rows_ref, k_scale, fp8).float() * k_scale
    return q_ref, want


def check_case(fn, q, kv_a, kv_c, pos, cos_sin, cache, slots, fp8, k_scale, q_ref, want) -> tuple[float, float]:
    """Run ``fn`` once on fresh copies of the inputs; max relative errors of q_pe and the cache rows."""
    qc, kc, cc = q.clone(), kv_a.clone(), cache.clone()
    fn(pos, qc, kc, kv_c, cos_sin, cc, slots, fp8, k_scale)
    if fp8 is not None:  # gather bytes: float8 indexing is not in every torch build
        got = cc.view(torch.uint8)[slots // BLOCK_SIZE, slots % BLOCK_SIZE].view(fp8).float() * k_scale
    else:
        got = cc[slots // BLOCK_SIZE, slots % BLOCK_SIZE].float()
    err_q = ((qc[..., 128:].float() - q_ref).abs() / (1 + q_ref.abs())).max().item()
    err_c = ((got - want).abs() / (1 + want.abs())).max().item()
    return err_q, err_c


def errors_ok(err_q: float, err_c: float, fp8) -> bool:
    # FP8: one code step (2^-3 relative) apart is right (the unfused path quantises the
    # bf16-rounded k_pe, the fused kernels the float32 rotation).
    return err_q <= 3e-2 and err_c <= (0.13 if fp8 is not None else 3e-2)


def make_cos_sin(dev):
    """[MAX_POS, 64] bf16 cat(cos, sin), no mscale: |rotation| = 1, stable when repeated."""
    return rope_cos_sin_cache(MAX_POS, dtype=torch.bfloat16, device=dev)


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
    k_scale = torch.tensor([0.05], device=dev)

    records, rows = [], []
    for cache_name in ("bf16", "fp8"):
        fp8 = fp8_kind if cache_name == "fp8" else None
        for T in [4096] if args.quick else [1, 64, 4096, 32768]:
            for N in (16, 128):
                shape = f"T={T} N={N} {cache_name}"
                q, kv_a, kv_c, pos, slots, cache, nbytes = make_case(dev, T, N, fp8, cos_sin)
                q_ref, want = expected(q, kv_a, kv_c, pos, cos_sin, fp8, k_scale)
                row = [shape]
                times = {}
                q_work, kv_work = q.clone(), kv_a.clone()  # the timed calls rotate these over and over
                for pname, fn in providers.items():
                    # Correctness first, on fresh copies of the untouched inputs.
                    err_q, err_c = check_case(fn, q, kv_a, kv_c, pos, cos_sin, cache, slots, fp8, k_scale, q_ref, want)
                    if not errors_ok(err_q, err_c, fp8):
                        print(f"  {pname} {shape}: WRONG (q_pe err {err_q:.3g}, cache err {err_c:.3g})")
                    ms = time_ms(functools.partial(fn, pos, q_work, kv_work, kv_c, cos_sin, cache, slots, fp8, k_scale))
                    times[pname] = ms
                    gbs = nbytes / ms / 1e6
                    row.append(f"{gbs:.0f} ({100 * gbs / copy:.0f}%) {ms * 1e3:.1f}us")
                    for metric, val in (("time_us", ms * 1e3), ("GB/s", gbs), ("pct_copy", 100 * gbs / copy)):
                        records.append(Record("fused_rope_mla_kv_write", pname, shape, metric, val, name, __version__))
                fused_times = [v for k, v in times.items() if k != "unfused-torch"]
                if fused_times:
                    speedup = times["unfused-torch"] / min(fused_times)
                    row.append(f"{speedup:.1f}x")
                    records.append(
                        Record(
                            "fused_rope_mla_kv_write",
                            "best-fused",
                            shape,
                            "speedup_vs_unfused",
                            speedup,
                            name,
                            __version__,
                        )
                    )
                else:
                    row.append("-")
                rows.append(row)
                del q, kv_a, q_work, kv_work, kv_c, cache, q_ref, want
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
