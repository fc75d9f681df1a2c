#!/usr/bin/env python3
"""Benchmark mla_prefill (causal bf16) against SDPA: the upstream-shaped path and cuDNN.

TFLOP/s and % of the bf16 matmul rate measured in the same run.

    python perf/bench_prefill.py [--out results] [--quick] [--tune | --config JSON]

Shapes: 4 x 4096 and 1 x 16384 tokens, N in {16, 128}, Dqk = 192 (128 nope + 64 rope), Dv = 128.
FLOPs counted per call: 2 * (192 + 128) * N * (visible (query, key) pairs), causal pairs per
sequence L * (L + 1) / 2 -- the useful work, the same count for every provider.

Providers (each timed with its copies, L2 flushed, median):
  rocm_mla-triton     mla_prefill reading k_nope / v as views of the [T, N, 256] kv_b_proj output and
                      k_pe as a slice of the [T, 576] latent buffer; out written straight into the
                      layer's [T, N*128] buffer, lse into [N, T]. Nothing else.
  upstream-flash      what vLLM 0.33 does on ROCm, with torch SDPA standing in for the FlashAttention
                      varlen call (equal lengths -> batch form): k = cat(k_nope, k_pe.expand(N)),
                      v = F.pad(v, [0, 64]), SDPA with the FLASH backend forced (head dim 192), then
                      the [..., :128] slice copied into the [T, N*128] output. Every copy counted.
  sdpa-cudnn          SDPA's best kernel on this GPU, cuDNN (takes Dv = 128 directly), on
                      pre-built k = cat(...) (kernel only: no copy counted; the ceiling to compare to).
  sdpa-flash          FLASH alone on pre-built padded tensors (kernel only; shows what the copies cost).

--tune: time every candidate config of configs/mla_prefill.json for this GPU's arch on every shape,
print the table and the winner (best geometric-mean time over the shapes), and use the winner for
the comparison. Put the winner into the JSON's "triton" entry for the arch.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rocm_mla import __version__  # noqa: E402
from rocm_mla import _platform  # noqa: E402
from rocm_mla.configs import config_for  # noqa: E402
from rocm_mla.ops.prefill import config_label, launch_config, mla_prefill  # noqa: E402
from rocm_mla.tools.benchutil import (gpu_for, Record, bar_plot, device_name, matmul_tflops,  # noqa: E402
                                      print_table, time_ms, write_csv)

P, R, V = 128, 64, 128
SCALE = 1.0 / math.sqrt(P + R)
SHAPES = [(4, 4096, 16), (4, 4096, 128), (1, 16384, 16), (1, 16384, 128)]  # (B, L, N)


def causal_flops(B: int, L: int, N: int) -> float:
    return 2.0 * (P + R + V) * N * B * L * (L + 1) / 2


class Case:
    """Inputs of one shape, laid out as the model produces them."""

    def __init__(self, B: int, L: int, N: int, dev: torch.device):
        T = B * L
        self.B, self.L, self.N, self.T = B, L, N, T
        dt = torch.bfloat16
        self.q = torch.randn(T, N, P + R, device=dev, dtype=dt)
        self.kv = torch.randn(T, N, P + V, device=dev, dtype=dt)  # kv_b_proj output
        self.latent = torch.randn(T, 512 + R, device=dev, dtype=dt)  # [kv_c | k_pe]
        self.k_nope, self.v = self.kv[..., :P], self.kv[..., P:]
        self.k_pe = self.latent[:, 512:].unsqueeze(1)  # [T, 1, 64]
        self.cu = torch.arange(0, T + 1, L, dtype=torch.int32, device=dev)
        self.out_buf = torch.empty(T, N * V, device=dev, dtype=dt)  # the layer's output
        self.out = self.out_buf.view(T, N, V)
        self.lse = torch.empty(N, T, device=dev, dtype=torch.float32)

    def bhsd(self, x: torch.Tensor) -> torch.Tensor:
        """[T, N, D] -> [B, N, L, D] view (SDPA's layout; no copy)."""
        return x.view(self.B, self.L, self.N, x.shape[-1]).transpose(1, 2)

    def ours(self, config=None):
        mla_prefill(self.q, self.k_nope, self.k_pe, self.v, self.cu, self.cu, sm_scale=SCALE, causal=True,
                    out=self.out, lse=self.lse, max_seqlen_q=self.L, max_seqlen_k=self.L, backend="triton",
                    config=config)

    def upstream_flash(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        k = torch.cat([self.k_nope, self.k_pe.expand(self.T, self.N, R)], dim=-1)
        vp = F.pad(self.v, [0, P + R - V])
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(self.bhsd(self.q), self.bhsd(k), self.bhsd(vp), is_causal=True,
                                               scale=SCALE)
        self.out.view(self.B, self.L, self.N, V).copy_(o.transpose(1, 2)[..., :V])

    def prebuilt(self):
        self.k_cat = torch.cat([self.k_nope, self.k_pe.expand(self.T, self.N, R)], dim=-1)
        self.v_pad = F.pad(self.v, [0, P + R - V])
        self.v_c = self.v.contiguous()

    def drop_prebuilt(self):
        for name in ("k_cat", "v_pad", "v_c"):
            self.__dict__.pop(name, None)

    def sdpa_kernel_only(self, backend_name: str):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        v = self.v_pad if backend_name == "FLASH_ATTENTION" else self.v_c
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(self.bhsd(self.q), self.bhsd(self.k_cat), self.bhsd(v),
                                                  is_causal=True, scale=SCALE)


def tune(dev: torch.device, shapes) -> dict | None:
    arch = _platform.device_arch(dev)
    cands = config_for("mla_prefill", arch).get("candidates", [])
    if not cands:
        print(f"--tune: no candidates for {arch} in configs/mla_prefill.json")
        return None
    print(f"--tune on {arch}: {len(cands)} candidates")
    times = {i: [] for i in range(len(cands))}
    rows = []
    for B, L, N in shapes:
        case = Case(B, L, N, dev)
        row = [f"{B}x{L} N={N}"]
        for i, cfg in enumerate(cands):
            try:
                case.ours(cfg)
                ms = time_ms(lambda: case.ours(cfg))
            except Exception as exc:  # a candidate that fails to compile/run loses, loudly
                print(f"  candidate {config_label(cfg)} failed: {type(exc).__name__}: {str(exc)[:200]}")
                ms = float("inf")
            times[i].append(ms)
            row.append(f"{causal_flops(B, L, N) / ms / 1e9:.0f}" if math.isfinite(ms) else "fail")
        rows.append(row)
        case = None  # free this shape's tensors before the next
        torch.cuda.empty_cache()
    print("\nmla_prefill candidates, TFLOP/s:")
    print_table(["shape", *[config_label(c) for c in cands]], rows)
    geo = {i: math.exp(sum(math.log(t) for t in ts) / len(ts)) if all(math.isfinite(t) for t in ts) else float("inf")
           for i, ts in times.items()}
    best = min(geo, key=geo.get)
    print(f"\nwinner (geometric-mean time): {config_label(cands[best])}\n  {cands[best]}")
    current = launch_config(arch, torch.bfloat16)
    if cands[best] != current:
        print(f"  differs from the JSON's {arch} 'triton' entry {current}: update configs/mla_prefill.json")
    return cands[best]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results", help="folder for prefill.csv and prefill.png")
    ap.add_argument("--quick", action="store_true", help="4 x 4096, N=16 only")
    ap.add_argument("--tune", action="store_true", help="time the arch's candidate configs first; use the winner")
    ap.add_argument("--config", type=json.loads, default=None, metavar="JSON",
                    help='launch config to use instead of the JSON\'s, e.g. \'{"BLOCK_M": 128, "BLOCK_N": 64, '
                         '"num_warps": 8, "num_stages": 3}\'')
    args = ap.parse_args()
    dev = gpu_for("bench_prefill")
    if dev is None:
        return 2
    name = device_name(dev)
    shapes = SHAPES[:1] if args.quick else SHAPES
    peak = matmul_tflops(dev)
    print(f"device: {name}; bf16 matmul {peak:.0f} TFLOP/s; torch {torch.__version__}")
    config = tune(dev, shapes) if args.tune else args.config
    label = config_label(config or launch_config(_platform.device_arch(dev), torch.bfloat16))
    print(f"rocm_mla-triton config: {label}")

    providers = ["rocm_mla-triton", "upstream-flash", "sdpa-cudnn", "sdpa-flash"]
    records, rows, groups = [], [], []
    series: dict[str, list[float]] = {p: [] for p in providers}
    for B, L, N in shapes:
        case = Case(B, L, N, dev)
        shape = f"{B}x{L} N={N}"
        groups.append(shape)
        flops = causal_flops(B, L, N)
        fns = {"rocm_mla-triton": lambda: case.ours(config), "upstream-flash": case.upstream_flash}
        # Correctness in the run: ours against the upstream path's output (both bf16).
        case.ours(config)
        mine = case.out.float().clone()
        try:
            case.upstream_flash()
            err = (mine - case.out.float()).abs().max().item()
            if not err <= 3e-2:
                print(f"  rocm_mla-triton {shape}: WRONG (max |diff| vs upstream-flash {err:.3g})")
        except Exception as exc:
            print(f"  upstream-flash {shape} failed: {type(exc).__name__}: {str(exc)[:200]}")
        del mine
        row = [shape]
        for pname in providers:
            try:
                if pname.startswith("sdpa-"):
                    case.prebuilt()
                    kind = "CUDNN_ATTENTION" if pname == "sdpa-cudnn" else "FLASH_ATTENTION"
                    fn = lambda kind=kind: case.sdpa_kernel_only(kind)  # noqa: E731
                else:
                    fn = fns[pname]
                fn()
                ms = time_ms(fn)
            except Exception as exc:  # a peer that cannot run this shape is reported, not fatal
                print(f"  {pname} {shape} failed: {type(exc).__name__}: {str(exc)[:200]}")
                row.append("-")
                series[pname].append(0.0)
                continue
            finally:
                case.drop_prebuilt()
            tf = flops / ms / 1e9
            row.append(f"{tf:.0f} ({100 * tf / peak:.0f}%)")
            series[pname].append(tf)
            for metric, val in (("time_us", ms * 1e3), ("TFLOP/s", tf), ("pct_matmul", 100 * tf / peak)):
                records.append(Record("mla_prefill", pname, shape, metric, val, name,
                                      __version__ if pname.startswith("rocm_mla") else torch.__version__))
        ours_tf = series["rocm_mla-triton"][-1]
        for peer in ("upstream-flash", "sdpa-cudnn"):
            if series[peer][-1] > 0 and ours_tf > 0:
                records.append(Record("mla_prefill", f"rocm_mla-triton/{peer}", shape, "speedup",
                                      ours_tf / series[peer][-1], name, __version__))
        rows.append(row)
        case = fns = None  # free this shape's tensors before the next
        torch.cuda.empty_cache()
    records.append(Record("matmul", "torch", "8192^3 bf16", "TFLOP/s", peak, name, torch.__version__))
    print(f"\nmla_prefill causal bf16, Dqk 192 / Dv 128: TFLOP/s (% of the {peak:.0f} TFLOP/s bf16 matmul)")
    print_table(["shape", *providers], rows)
    print("\nrocm_mla-triton speed-up (targets: >= 1.2x upstream-flash, >= 0.8x sdpa-cudnn):")
    for i, shape in enumerate(groups):
        ours_tf = series["rocm_mla-triton"][i]
        parts = [f"{ours_tf / series[p][i]:.2f}x {p}" for p in ("upstream-flash", "sdpa-cudnn") if series[p][i] > 0]
        print(f"  {shape}: {', '.join(parts) or '-'}")
    out_dir = Path(args.out)
    write_csv(out_dir / "prefill.csv", records)
    bar_plot(out_dir / "prefill.png", f"MLA prefill causal bf16 on {name} (rocm_mla: {label})", groups, series,
             "TFLOP/s", hline=peak, hline_label="bf16 matmul")
    print(f"wrote {out_dir / 'prefill.csv'} and {out_dir / 'prefill.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
