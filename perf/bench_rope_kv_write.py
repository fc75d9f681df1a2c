#!/usr/bin/env python3
"""Benchmark fused_rope_mla_kv_write: rocm_mla HIP and Triton vs the unfused two-step path vLLM 0.33
runs for DeepSeek on ROCm, as GB/s and % of the copy bandwidth measured in the same run.

    python perf/bench_rope_kv_write.py [--out results] [--quick]
    python perf/bench_rope_kv_write.py --tune [--tune-rep 50]     # launch-data sweep only (see tune())

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
"""

from __future__ import annotations

import functools
import json
import math
import sys
import threading
import time
from pathlib import Path

import torch

from rocm_mla import __version__, _ext, _platform
from rocm_mla.configs import config_for, platform_fp8_dtype, tune_candidates, tune_space
from rocm_mla.ops import fused_rope_mla_kv_write
from rocm_mla.ops._dispatch import unavailable
from rocm_mla.ops.rope_kv_write import OP, fp8_cache_kind, launch, triton_meta
from rocm_mla.reference.rope_kv_write import fused_rope_mla_kv_write_ref, quantize_fp8_ref, rope_cos_sin_cache
from rocm_mla.tools.benchutil import (
    Record,
    bar_plot,
    bench_parser,
    device_name,
    graph_ms,
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
    ap.add_argument("--out", default="results", help="folder for rope_kv_write.csv and rope_kv_write.png")
    ap.add_argument("--quick", action="store_true", help="T=4096 only")
    ap.add_argument(
        "--tune",
        action="store_true",
        help="only sweep the launch data (configs/rope_kv_write.json 'tune') of both implementations",
    )
    ap.add_argument("--tune-rep", type=float, default=50.0, help="do_bench rep (ms) per --tune timing")
    args = ap.parse_args()
    gpu = start_bench("bench_rope_kv_write", copy=True)
    if gpu is None:
        return 2
    dev, name, copy = gpu.dev, gpu.name, gpu.copy_gbs
    print(f"device: {name}; copy ceiling (read+write) {copy:.0f} GB/s")
    if args.tune:
        tune(dev, copy, args.tune_rep)
        return 0
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

    records, rows, groups = [], [], []
    series: dict[str, list[float]] = {p: [] for p in providers}
    for cache_name in ("bf16", "fp8"):
        fp8 = fp8_kind if cache_name == "fp8" else None
        for T in [4096] if args.quick else [1, 64, 4096, 32768]:
            for N in (16, 128):
                shape = f"T={T} N={N} {cache_name}"
                groups.append(shape)
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
                    series[pname].append(gbs)
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
    bar_plot(
        out_dir / "rope_kv_write.png",
        f"fused RoPE + MLA KV write on {name}",
        groups,
        series,
        "GB/s",
        hline=copy,
        hline_label="copy ceiling",
    )
    print(f"wrote {out_dir / 'rope_kv_write.csv'} and {out_dir / 'rope_kv_write.png'}")
    return 0


# ---------------------------------------------------------------- --tune

TUNE_SHAPES = (
    (4096, 16, "bf16"),
    (4096, 128, "bf16"),
    (32768, 16, "bf16"),
    (32768, 128, "bf16"),
    (32768, 16, "fp8"),
)  # the bf16 shapes come first: the fp8 pass reuses their ranking
TRITON_FP8_TOP = 4  # Triton configs (by bf16 geomean, plus the current one) also timed with the fp8 cache


def _hip_launch(T: int, N: int, cfg: dict, sms: int, ws: int) -> str:
    """The launch hip_src/rope_kv_write.cu derives from ``cfg`` (a copy of its arithmetic, for labels)."""
    upt = 4 * N + 36
    threads = cfg["waves_per_block"] * ws
    tpb = max(1, threads * cfg["units_per_thread"] // upt)
    if cfg["min_blocks_per_cu"] > 0:
        tpb = min(tpb, max(1, -(-T // (sms * cfg["min_blocks_per_cu"]))))
    rounds = -(-tpb * upt // threads)
    per_round = -(-tpb * upt // rounds)  # ceil divisions
    block_threads = -(-per_round // ws) * ws
    return f"{tpb} tok/block, {-(-T // tpb)} blocks x {block_threads} thr, {rounds} unit(s)/thread"


def _triton_launch(T: int, N: int, consts: dict, options: dict) -> str:
    tok, br = consts["TOKENS"], consts["BLOCK_R"]
    return (
        f"TOKENS {tok}, BLOCK_R {br} ({-(-tok * N // br)} q tile(s)), {options['num_warps']} warps, "
        f"{-(-T // tok)} programs"
    )


def tune(dev, copy: float, rep_ms: float = 50.0) -> None:
    """Sweep the launch data of both implementations (configs/rope_kv_write.json "tune", each
    candidate merged over this arch's entry) at TUNE_SHAPES, through ``ops.rope_kv_write.launch(...,
    config=)``: the op's own dispatch, launch arithmetic and kernels, without its argument checks.

    Every candidate is first checked against the reference (one eager call on fresh copies), then
    timed as GPU time of one captured call (benchutil.graph_ms, warm-up 10 ms, rep ``rep_ms``: the
    host work of the wrapper and of Triton's launcher, which eager timing includes whenever it
    outlasts do_bench's flush, is left out). Triton candidates that give the same constexprs and
    options at a shape are compiled and timed once. The HIP extension is built in a background
    thread while the Triton half runs. Prints the table (GB/s, % of copy), the winners per shape
    and overall (geomean over the bf16 shapes), probes for T=4096 N=16, eager times of the current
    and winning configs, and the JSON to paste into configs/rope_kv_write.json.
    """
    t_start = time.perf_counter()
    build = None
    if not _ext.is_loaded():
        build = threading.Thread(target=_ext.load, name="hip-build", daemon=True)
        build.start()
    sweep = TuneSweep(dev, copy, rep_ms)
    sweep.run(build)
    sweep.print_table()
    overall = sweep.print_winners()
    sweep.print_probes(overall)
    sweep.print_eager(overall)
    sweep.print_json(overall)
    print(f"\n(tune: {time.perf_counter() - t_start:.0f} s)")


class TuneSweep:
    """One ``--tune`` run: the candidates per implementation (the current config always among
    them, marked *), the TUNE_SHAPES cases with their references, and the results
    ``res[(impl, index in cands[impl])]`` = per shape GB/s, "WRONG", "err" or None (not timed)."""

    def __init__(self, dev, copy: float, rep_ms: float):
        self.dev, self.copy, self.rep_ms = dev, copy, rep_ms
        self.arch = _platform.device_arch(dev)
        self.current = config_for(OP, self.arch)
        props = torch.cuda.get_device_properties(dev)
        self.sms, self.ws = props.multi_processor_count, getattr(props, "warp_size", 32)
        self.space = tune_space(OP)
        self.cands = tune_candidates(OP)
        for impl in self.cands:  # the current config is always a row (marked *)
            cur = {k: self.current[impl][k] for k in self.space[impl]}
            if cur not in self.cands[impl]:
                self.cands[impl].append(cur)
        self.cos_sin = make_cos_sin(dev)
        self.k_scale = torch.tensor([0.05], device=dev)
        self.fp8_kind = platform_fp8_dtype(self.arch)
        self.cases = [self._case(T, N, cname) for T, N, cname in TUNE_SHAPES]
        self.errors: dict[str, str] = {}
        self.res: dict[tuple[str, int], list] = {}
        self.n_bf16 = sum(1 for *_, c in TUNE_SHAPES if c == "bf16")
        self.impls = [b for b in ("triton", "hip") if b in self.cands]

    def _case(self, T: int, N: int, cname: str) -> dict:
        fp8 = self.fp8_kind if cname == "fp8" else None
        q, kv_a, kv_c, pos, slots, cache, nbytes = make_case(self.dev, T, N, fp8, self.cos_sin)
        q_ref, want = expected(q, kv_a, kv_c, pos, self.cos_sin, fp8, self.k_scale)
        return dict(
            T=T,
            N=N,
            fp8=fp8,
            name=f"T={T} N={N} {cname}",
            nbytes=nbytes,
            data=(q, kv_a, kv_c, pos, slots, cache),
            q_ref=q_ref,
            want=want,
            work=(q.clone(), kv_a.clone()),
        )

    def label(self, impl: str, c: dict) -> str:
        short = {
            "waves_per_block": "w",
            "units_per_thread": "u",
            "min_blocks_per_cu": "m",
            "rows_per_program": "r",
            "block_rows": "b",
            "num_warps": "nw",
        }
        star = " *" if all(self.current[impl].get(k) == v for k, v in c.items()) else ""
        return f"{impl} " + " ".join(f"{short.get(k, k)}{v}" for k, v in c.items()) + star

    def current_config(self, impl: str) -> dict:
        return {k: self.current[impl][k] for k in self.space[impl]}

    @staticmethod
    def op_fn(impl: str, c: dict):
        def fn(pos, q, kv_a, kv_c, cs, cache, slots, fp8, ks):
            launch(pos, q[..., 128:], kv_a[:, 512:], kv_c, cs, cache, slots, False, fp8, ks, impl, config=c)

        return fn

    def graph_ms(self, fn) -> float:
        return graph_ms(fn, warmup_ms=10, rep_ms=self.rep_ms)

    def triton_meta(self, c: dict, case: dict) -> tuple[dict, dict]:
        """Constexprs and options the Triton launch of candidate ``c`` gets at ``case``."""
        kind = fp8_cache_kind(self.arch) if case["fp8"] is not None else 0
        return triton_meta(
            case["N"], self.arch, rope=True, is_neox=False, cache_kind=kind, config={**self.current["triton"], **c}
        )

    def measure(self, impl: str, c: dict, case: dict) -> float | str:
        """GB/s of ``c`` at ``case``, or why not ("WRONG", "err")."""
        q, kv_a, kv_c, pos, slots, cache = case["data"]
        fn = self.op_fn(impl, c)
        try:
            err_q, err_c = check_case(
                fn,
                q,
                kv_a,
                kv_c,
                pos,
                self.cos_sin,
                cache,
                slots,
                case["fp8"],
                self.k_scale,
                case["q_ref"],
                case["want"],
            )
            if not errors_ok(err_q, err_c, case["fp8"]):
                self.errors.setdefault(
                    self.label(impl, c), f"{case['name']}: q_pe err {err_q:.3g}, cache err {err_c:.3g}"
                )
                return "WRONG"
            qw, kw = case["work"]
            ms = self.graph_ms(lambda: fn(pos, qw, kw, kv_c, self.cos_sin, cache, slots, case["fp8"], self.k_scale))
        except Exception as exc:  # e.g. a block too large for the registers: reported, not fatal
            self.errors.setdefault(
                self.label(impl, c), f"{case['name']}: {type(exc).__name__}: {str(exc).strip()[:200]}"
            )
            try:
                torch.cuda.synchronize()
            except Exception:  # a sticky error: the context is gone, nothing after this can run
                raise exc from None
            return "err"
        return case["nbytes"] / ms / 1e6

    def geo(self, vals) -> float:
        vals = [v for v in vals[: self.n_bf16]]
        if not all(isinstance(v, float) for v in vals):
            return 0.0
        return math.exp(sum(math.log(v) for v in vals) / len(vals))

    def run(self, build) -> None:
        """Time every candidate at every shape: Triton first (its compiles overlap the HIP build);
        equal Triton launches are timed once per shape; the fp8 shape only for the best Triton
        configs of the bf16 shapes (TRITON_FP8_TOP) and the current one."""
        for impl in self.impls:
            if impl == "hip" and build is not None:
                t0 = time.perf_counter()
                build.join()
                print(f"(waited {time.perf_counter() - t0:.0f} s for the HIP extension build)")
            why = unavailable(impl, self.dev)
            if why:
                print(f"{impl}: skipped ({why})")
                continue
            t0 = time.perf_counter()
            cands = self.cands[impl]
            for i in range(len(cands)):
                self.res[(impl, i)] = [None] * len(self.cases)
            for si, case in enumerate(self.cases):
                idx = range(len(cands))
                if impl == "triton" and case["fp8"] is not None:
                    ranked = sorted(idx, key=lambda i: -self.geo(self.res[(impl, i)]))
                    cur_i = next(i for i, c in enumerate(cands) if self.label(impl, c).endswith("*"))
                    idx = sorted(set(ranked[:TRITON_FP8_TOP]) | {cur_i})
                seen: dict = {}
                for i in idx:
                    c = cands[i]
                    if impl == "triton":
                        consts, options = self.triton_meta(c, case)
                        key = (tuple(sorted(consts.items())), tuple(sorted(options.items())))
                        if key not in seen:
                            seen[key] = self.measure(impl, c, case)
                        self.res[(impl, i)][si] = seen[key]
                    else:
                        self.res[(impl, i)][si] = self.measure(impl, c, case)
            print(f"({impl}: {len(cands)} configs swept in {time.perf_counter() - t0:.0f} s)")

    def print_table(self) -> None:
        """The sweep's table, under a row of what a plain copy of each shape's bytes reaches
        under the same timing; then the candidates that failed, and why."""
        copy, dev = self.copy, self.dev

        def copy_ms(nbytes: int) -> float:
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device=dev)
            dst = torch.empty_like(src)
            return self.graph_ms(lambda: dst.copy_(src))

        copy_row = ["copy_ of the same bytes"]
        for case in self.cases:
            ms = copy_ms(case["nbytes"])
            gbs = case["nbytes"] / ms / 1e6
            copy_row.append(f"{gbs:.0f} {100 * gbs / copy:.0f}% {ms * 1e3:.1f}us")
        copy_row += ["", ""]

        def cell(v, case):
            if v is None:
                return "-"
            if isinstance(v, str):
                return v
            return f"{v:.0f} {100 * v / copy:.0f}%"

        rows = [copy_row]
        for (impl, i), vals in self.res.items():
            g = self.geo(vals)
            mn = min((v for v in vals[: self.n_bf16] if isinstance(v, float)), default=0.0)
            rows.append(
                [
                    self.label(impl, self.cands[impl][i]),
                    *(cell(v, c) for v, c in zip(vals, self.cases)),
                    f"{g:.0f}" if g else "-",
                    f"{100 * mn / copy:.0f}%",
                ]
            )
        print(
            f"\ntuning sweep on {device_name(dev)} ({self.arch}): GB/s and % of the {copy:.0f} GB/s copy ceiling, "
            f"GPU time of one captured call (graph replay, L2 flushed, do_bench rep {self.rep_ms:.0f} ms); bf16 "
            f"model, GPT-J, block {BLOCK_SIZE}; * = current config; geo = geomean GB/s over the bf16 shapes"
        )
        print_table(["config", *(c["name"] for c in self.cases), "geo bf16", "min bf16"], rows)
        for k, v in self.errors.items():
            print(f"  {k}: {v}")

    def best(self, impl: str, si: int):
        ok = [(v[si], i) for (b, i), v in self.res.items() if b == impl and isinstance(v[si], float)]
        return max(ok) if ok else None

    def launch_label(self, impl: str, c: dict, case: dict) -> str:
        if impl == "hip":
            return _hip_launch(case["T"], case["N"], {**self.current[impl], **c}, self.sms, self.ws)
        consts, options = self.triton_meta(c, case)
        return _triton_launch(case["T"], case["N"], consts, options)

    def print_winners(self) -> dict[str, dict]:
        """Print the winner per shape and overall; returns the overall winner per implementation."""
        copy = self.copy
        print("\nwinners per shape (GPU time):")
        for si, case in enumerate(self.cases):
            for impl in self.impls:
                b = self.best(impl, si)
                if b is None:
                    continue
                gbs, i = b
                c = self.cands[impl][i]
                print(
                    f"  {case['name']:20s} {self.label(impl, c):28s} {gbs:5.0f} GB/s ({100 * gbs / copy:.0f}%) "
                    f"{case['nbytes'] / gbs / 1e3:6.1f} us  [{self.launch_label(impl, c, case)}]"
                )
        overall = {}
        for impl in self.impls:
            scored = [(self.geo(v), i) for (b, i), v in self.res.items() if b == impl and self.geo(v)]
            if scored:
                overall[impl] = self.cands[impl][max(scored)[1]]
        print("\noverall winners (geomean over the bf16 shapes; per shape: GB/s, % of copy, % of that shape's best):")
        for impl, c in overall.items():
            i = self.cands[impl].index(c)
            parts = []
            for si, case in enumerate(self.cases):
                v, b = self.res[(impl, i)][si], self.best(impl, si)
                if isinstance(v, float) and b:
                    parts.append(f"{case['name']}: {v:.0f} ({100 * v / copy:.0f}%, {100 * v / b[0]:.0f}%)")
            print(f"  {self.label(impl, c)} (geo {self.geo(self.res[(impl, i)]):.0f} GB/s): " + "; ".join(parts))
        return overall

    def print_probes(self, overall: dict[str, dict]) -> None:
        """Probes of the T=4096 N=16 hypotheses, with the current and winning configs: strided vs
        contiguous q_pe/k_pe, and a T=1 call (the launch floor)."""
        case = self.cases[0]
        q, kv_a, kv_c, pos, slots, cache = case["data"]
        qw, kw = case["work"]
        q_c = qw[..., 128:].contiguous()
        k_c = kw[:, 512:].contiguous()
        cos_sin, k_scale = self.cos_sin, self.k_scale
        print(f"\nprobes at {case['name']} (GPU time, GB/s):")
        tiny = make_case(self.dev, 1, 16, None, cos_sin)
        for impl, c in overall.items():
            for tag, cfg in (("current", self.current_config(impl)), ("winner", c)):
                try:
                    strided = self.graph_ms(
                        lambda: launch(
                            pos,
                            qw[..., 128:],
                            kw[:, 512:],
                            kv_c,
                            cos_sin,
                            cache,
                            slots,
                            False,
                            None,
                            k_scale,
                            impl,
                            config=cfg,
                        )
                    )
                    contig = self.graph_ms(
                        lambda: launch(
                            pos, q_c, k_c, kv_c, cos_sin, cache, slots, False, None, k_scale, impl, config=cfg
                        )
                    )
                    tq, tkv, tkc, tpos, tsl, tca, _ = tiny
                    floor = self.graph_ms(
                        lambda: launch(
                            tpos,
                            tq[..., 128:],
                            tkv[:, 512:],
                            tkc,
                            cos_sin,
                            tca,
                            tsl,
                            False,
                            None,
                            k_scale,
                            impl,
                            config=cfg,
                        )
                    )
                except Exception as exc:
                    print(f"  {impl} {tag}: {type(exc).__name__}: {exc}")
                    continue
                nb = case["nbytes"]
                print(
                    f"  {self.label(impl, cfg):28s} ({tag}): strided q_pe/k_pe {nb / strided / 1e6:.0f} "
                    f"({strided * 1e3:.1f} us), contiguous q_pe/k_pe {nb / contig / 1e6:.0f} "
                    f"({contig * 1e3:.1f} us); T=1 call {floor * 1e3:.1f} us"
                )

    def print_eager(self, overall: dict[str, dict]) -> None:
        """Eager times: what the op costs when the host launches it (prefill is not graph-captured)."""
        print("\neager (launch: dispatch + launcher, no argument checks), us:")
        for impl, c in overall.items():
            for tag, cfg in (("current", self.current_config(impl)), ("winner", c)):
                parts = []
                for case in self.cases:
                    q, kv_a, kv_c, pos, slots, cache = case["data"]
                    qw, kw = case["work"]
                    fn = self.op_fn(impl, cfg)
                    try:
                        ms = time_ms(
                            lambda: fn(pos, qw, kw, kv_c, self.cos_sin, cache, slots, case["fp8"], self.k_scale),
                            warmup_ms=10,
                            rep_ms=self.rep_ms,
                        )
                        parts.append(
                            f"{case['name']}: {ms * 1e3:.1f} ({100 * case['nbytes'] / ms / 1e6 / self.copy:.0f}%)"
                        )
                    except Exception as exc:
                        parts.append(f"{case['name']}: {type(exc).__name__}")
                print(f"  {self.label(impl, cfg):28s} ({tag}): " + "; ".join(parts))

    def print_json(self, overall: dict[str, dict]) -> None:
        """The arch's entry with the winners merged in, to paste into configs/rope_kv_write.json."""
        arch, current = self.arch, self.current
        key = arch if arch in ("gfx942", "gfx950", "sm90") else "default"
        entry = {"backend_order": current["backend_order"]}
        for impl in ("hip", "triton"):
            entry[impl] = {**current[impl], **overall.get(impl, {})}
        print(f"\nJSON for configs/rope_kv_write.json (key {key!r}; backend_order kept -- see the eager times):")
        print(f'  "{key}": ' + json.dumps(entry, separators=(", ", ": ")) + ",")


if __name__ == "__main__":
    sys.exit(main())
