#!/usr/bin/env python3
"""Benchmark mla_decode against vLLM 0.33's Triton MLA decode (called as TRITON_MLA calls it), the
torch reference at small shapes, and FlashInfer's MLA decode when importable: time per call,
GB/s, TFLOP/s and % of the copy / matmul ceilings measured in the same run.

    python perf/bench_decode.py [--out results] [--peers .peers] [--quick] [--tune] [--dtypes bf16,fp8]

Shapes (FlashMLA's benchmark): B in {1, 32, 128}, seq in {1024, 4096, 16384} (every request that
long), N in {16, 128}, block size 64, q bf16, cache bf16 or fp8 (e4m3fn on NVIDIA, e4m3fnuz on
gfx942) with a per-tensor k_scale. --quick: B in {1, 128}, seq 4096 (the three H200 targets).

Counted per call (the same for every provider):
  bytes  = B x seq x 576 x cache elem (each request's KV read once) + B x N x 576 x 2 (q read)
           + B x N x 512 x 2 (out written)
  FLOPs  = B x 2 x N x seq x (576 + 512)          (q.k over 576 columns, p.v over 512)

Providers, each captured in a CUDA graph (one call per graph) and timed as back-to-back replays:
  rocm_mla-triton    mla_decode(ql_nope, q_pe, ...) with ql_nope the [N, B, 512] bmm output seen as
                     [B, N, 512] and q_pe a slice of q [B, N, 192]; out/lse preallocated (vLLM's
                     layer buffers); max_seq_len passed as vLLM has it on the host. The chosen split
                     count and launches are printed.
  vllm-0.33-triton   decode_attention_fwd exactly as TRITON_MLA.forward_mqa calls it: torch.cat of
                     q (counted), torch.zeros o and lse (counted), attn_logits workspace preallocated
                     (vLLM reserves it once), num_kv_splits from its _compute_num_kv_splits
                     (next_pow2(max_seq_len // 512), capped at 2 x SMs), k_scale/v_scale = the layer's
                     scale tensor. Importable via `../shared/peers/get_vllm_peers.sh .peers`.
  flashinfer-fa3     BatchMLAPagedAttentionWrapper(backend="fa3") planned outside the timing, q
                     pre-concatenated (kernel only), fp8 with ckv_scale = kpe_scale = k_scale;
                     skipped with a note when not importable or when it refuses the shape. See ../shared/peers/get_flashinfer_peer.sh.
  torch-reference    rocm_mla.reference.mla_decode_ref, eager (it syncs), B x seq <= 32 x 4096 only.

Cold caches: each provider's graphs rotate over R copies of the KV cache and block table (fresh
page permutations), R chosen so the copies together exceed 3 x the L2 size; a replay therefore
finds its KV in HBM, as a decode step does after the other layers ran.

--tune: additionally time every stage-1 candidate of configs/mla_decode.json for this arch
(rocm_mla.ops.decode.tuning_candidates, passed as launch_config=) on every shape and dtype, print
a table of times and the winner per shape, and write tune.csv. --splits / --b1-splits also force
split counts (a grid candidate x S per shape; 'auto' = the heuristic), --cands picks candidates by
index, --shapes filters shapes; the winners are printed with their config object as JSON. Move winners into the arch's
"stage1" tiers (by BLOCK_H, with fp8 overrides) by hand.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rocm_mla import __version__, _platform  # noqa: E402
import triton  # noqa: E402

from rocm_mla.ops.decode import decode_plan, fp8_dtype_for, mla_decode, tuning_candidates  # noqa: E402
from rocm_mla.reference import mla_decode_ref  # noqa: E402
from rocm_mla.tools.benchutil import (gpu_for, Record, bar_plot, copy_bandwidth_gbs, device_name,  # noqa: E402
                                      load_vllm_peer, matmul_tflops, print_table, time_ms, write_csv)

L, R_DIM, D = 512, 64, 576
BLOCK = 64
SCALE = 1.0 / math.sqrt(192)


# --------------------------------------------------------------------------- inputs

class Setup:
    """One shape: q as vLLM produces it, out/lse buffers, R (cache, block table) copies."""

    def __init__(self, B: int, seq: int, N: int, kv_kind: str, dev: torch.device, l2_bytes: int,
                 block: int = BLOCK):
        self.B, self.seq, self.N, self.kv_kind, self.block = B, seq, N, kv_kind, block
        self.fp8 = kv_kind == "fp8"
        blocks = math.ceil(seq / block)
        elem = 1 if self.fp8 else 2
        set_bytes = B * blocks * block * D * elem
        self.R = max(1, min(64, math.ceil(3 * l2_bytes / set_bytes)))
        self.k_scale = torch.tensor([0.05], device=dev) if self.fp8 else None
        self.caches, self.tables = [], []
        fp8 = fp8_dtype_for(_platform.device_arch(dev))  # e4m3fnuz on gfx942, e4m3fn elsewhere
        for _ in range(self.R):
            npages = B * blocks
            kv = torch.randn(npages, block, D, device=dev, dtype=torch.bfloat16)
            if self.fp8:
                kv = (kv.float() / 0.05).clamp(-200, 200).to(fp8)
            self.caches.append(kv)
            self.tables.append(torch.randperm(npages, device=dev, dtype=torch.int32).view(B, blocks))
        self.seq_lens = torch.full((B,), seq, dtype=torch.int32, device=dev)
        # ql_nope = bmm(q_nope^T [N, B, 128], W_UK_T [N, 128, 512]) -> [N, B, 512], read as [B, N, 512].
        self.ql_nope = torch.randn(N, B, L, device=dev, dtype=torch.bfloat16).transpose(0, 1)
        self.q = torch.randn(B, N, 192, device=dev, dtype=torch.bfloat16)
        self.q_pe = self.q[..., 128:]
        self.out = torch.empty(B, N, L, device=dev, dtype=torch.bfloat16)
        self.lse = torch.empty(B, N, device=dev, dtype=torch.float32)

    @property
    def label(self) -> str:
        return f"{self.kv_kind} B={self.B} seq={self.seq} N={self.N}"

    def nbytes(self) -> float:
        elem = 1 if self.fp8 else 2
        return self.B * self.seq * D * elem + self.B * self.N * D * 2 + self.B * self.N * L * 2

    def flops(self) -> float:
        return self.B * 2.0 * self.N * self.seq * (D + L)


# --------------------------------------------------------------------------- providers

def ours(s: Setup, launch_config=None, num_kv_splits=None):
    def call(i: int):
        mla_decode(s.ql_nope, s.q_pe, s.caches[i], s.tables[i], s.seq_lens, sm_scale=SCALE, out=s.out, lse=s.lse,
                   kv_cache_dtype="fp8" if s.fp8 else "auto", k_scale=s.k_scale, max_seq_len=s.seq,
                   backend="triton", launch_config=launch_config, num_kv_splits=num_kv_splits)
        return s.out
    return call


def vllm_num_kv_splits(max_seq_len: int, sm_count: int) -> int:
    """vLLM 0.33 triton_mla.py _compute_num_kv_splits (min work per split 512, 2 x SMs cap)."""
    return min(triton.next_power_of_2(max(1, max_seq_len // 512)), sm_count * 2)


def vllm(s: Setup, decode_attention_fwd, sm_count: int):
    S = vllm_num_kv_splits(s.seq, sm_count)
    attn_logits = torch.empty(s.B, s.N, S, L + 1, dtype=torch.float32, device=s.q.device)
    scale = s.k_scale if s.fp8 else torch.ones(1, device=s.q.device)  # layer._k_scale is a tensor

    def call(i: int):
        q = torch.cat((s.ql_nope, s.q_pe), dim=-1)
        o = torch.zeros(s.B, s.N, L, dtype=q.dtype, device=q.device)
        lse = torch.zeros(s.B, s.N, dtype=q.dtype, device=q.device)
        kv = s.caches[i].unsqueeze(2)
        decode_attention_fwd(q, kv, kv[..., :L], o, lse, s.tables[i], s.seq_lens, attn_logits, S, SCALE,
                             kv.size(1), k_scale=scale, v_scale=scale, is_mla=True)
        return o
    return call, S


def flashinfer(s: Setup):
    """FlashInfer's fa3 MLA decode, planned here (host work, untimed); None plus a reason when it
    cannot run."""
    try:
        import flashinfer as fi
        from flashinfer.mla import MLAPlanMetadata
    except Exception as exc:
        return None, f"not importable ({type(exc).__name__})"
    try:
        dev = s.q.device
        ws = torch.empty(256 << 20, dtype=torch.int8, device=dev)
        blocks = s.tables[0].shape[1]
        q_full = torch.cat((s.ql_nope, s.q_pe), dim=-1).contiguous()
        wrappers = []
        for i in range(s.R):
            w = fi.mla.BatchMLAPagedAttentionWrapper(ws if i == 0 else torch.empty_like(ws), backend="fa3")
            md = MLAPlanMetadata.csr(
                qo_indptr=torch.arange(s.B + 1, dtype=torch.int32, device=dev),
                kv_indptr=torch.arange(s.B + 1, dtype=torch.int32, device=dev) * blocks,
                kv_indices=s.tables[i].reshape(-1), kv_len_arr=s.seq_lens)
            w.plan(metadata=md, num_heads=s.N, head_dim_ckv=L, head_dim_kpe=R_DIM, page_size=BLOCK, causal=False,
                   sm_scale=SCALE, q_data_type=torch.bfloat16, kv_data_type=s.caches[i].dtype)
            wrappers.append(w)
            if s.R > 8 and i >= 7:  # planning is slow and workspaces are big: reuse beyond 8
                break
        out = torch.empty(s.B, s.N, L, dtype=torch.bfloat16, device=dev)
        # fp8: the per-tensor dequantisation scale of both cache parts (our k_scale).
        scales = {"ckv_scale": float(s.k_scale), "kpe_scale": float(s.k_scale)} if s.fp8 else {}

        def call(i: int):
            w = wrappers[i % len(wrappers)]
            w.run(query=q_full, kv_cache=s.caches[i % len(wrappers)], out=out, **scales)
            return out
        return call, ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


# --------------------------------------------------------------------------- timing

def graph_time_us(call, R: int, min_ms: float = 30.0, reps: int = 5) -> float:
    """Median per-call time of back-to-back replays of R one-call CUDA graphs (call(i) for cache
    copy i), rotating over the copies."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture: compiles, allocator pools
        for i in range(min(R, 2)):
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    for i in range(R):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            call(i)
        graphs.append(g)
    for g in graphs:
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for g in graphs:
        g.replay()
    end.record()
    torch.cuda.synchronize()
    per = start.elapsed_time(end) / len(graphs)
    iters = max(R, int(min_ms / max(per, 1e-3)))
    samples = []
    for _ in range(reps):
        start.record()
        for k in range(iters):
            graphs[k % R].replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / iters)
    del graphs
    return statistics.median(samples)


def check(name: str, got: torch.Tensor, s: Setup, ref_rows: int) -> str:
    """Max abs error on the first ref_rows requests against the float32 reference ('' if fine)."""
    ro, _ = mla_decode_ref(s.ql_nope[:ref_rows], s.q_pe[:ref_rows], s.caches[0], s.tables[0][:ref_rows],
                           s.seq_lens[:ref_rows], SCALE, s.k_scale)
    err = (got[:ref_rows].float() - ro).abs().max().item()
    if not err <= 3e-2:
        return f"  {name} {s.label}: WRONG (max err {err:.3g})"
    return ""


# --------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results", help="folder for decode.csv, decode_*.png (and tune.csv)")
    ap.add_argument("--peers", default=".peers", help="folder made by get_vllm_peers.sh")
    ap.add_argument("--quick", action="store_true", help="B in {1, 128}, seq 4096 only")
    ap.add_argument("--tune", action="store_true", help="time every stage-1 candidate config too")
    ap.add_argument("--dtypes", default="bf16,fp8", help="cache dtypes, comma-separated: bf16, fp8")
    ap.add_argument("--no-flashinfer", action="store_true", help="skip the FlashInfer peer")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM peer")
    ap.add_argument("--splits", default="", help="--tune: also force these split counts for B > 1 "
                    "(comma-separated; 'auto' = choose_num_splits), e.g. auto,1,2,4")
    ap.add_argument("--b1-splits", default="", help="--tune: split counts for B = 1 (default: --splits)")
    ap.add_argument("--shapes", default="", help="only shapes whose label contains one of these "
                    "';'-separated substrings, e.g. 'bf16 B=128;fp8 B=128 seq=4096 N=16'")
    ap.add_argument("--cands", default="", help="--tune: only these candidate indices (comma-separated)")
    args = ap.parse_args()
    dev = gpu_for("bench_decode")
    if dev is None:
        return 2
    name = device_name(dev)
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    l2 = int(getattr(props, "L2_cache_size", 50 << 20) or (50 << 20))
    copy = copy_bandwidth_gbs(dev)
    mm = matmul_tflops(dev)
    print(f"device: {name} ({sms} SMs/CUs, L2 {l2 >> 20} MiB); copy ceiling {copy:.0f} GB/s (read+write); "
          f"bf16 matmul {mm:.0f} TFLOP/s; torch {torch.__version__}")
    vllm_fwd = None if args.no_vllm else load_vllm_peer(args.peers, "triton_decode_attention", "decode_attention_fwd")

    def split_list(text: str) -> list:
        return [None if t.strip() == "auto" else int(t) for t in text.split(",") if t.strip()] or [None]

    splits_b, splits_1 = split_list(args.splits), split_list(args.b1_splits or args.splits)
    shape_filter = [f.strip() for f in args.shapes.split(";") if f.strip()]

    Bs, seqs = ((1, 128), (4096,)) if args.quick else ((1, 32, 128), (1024, 4096, 16384))
    kinds = [k.strip() for k in args.dtypes.split(",") if k.strip()]
    records: list[Record] = [Record("copy", "torch", "2 GiB", "GB/s", copy, name, torch.__version__),
                             Record("matmul", "torch", "8192^3 bf16", "TFLOP/s", mm, name, torch.__version__)]
    rows, groups = [], []
    providers = ["rocm_mla-triton", "vllm-0.33-triton", "flashinfer-fa3", "torch-reference"]
    gbs_series: dict[str, list[float]] = {p: [] for p in providers}
    tf_series: dict[str, list[float]] = {p: [] for p in providers}
    tune_rows, tune_records = [], []
    cands = tuning_candidates(_platform.device_arch(dev)) if args.tune else []
    cand_ids = [int(c) for c in args.cands.split(",") if c.strip()] or list(range(len(cands)))
    winners: list[tuple[str, int, object, float]] = []
    notes: list[str] = []
    fi_skipped: set[tuple[str, str]] = set()

    for kind in kinds:
        for N in (16, 128):
            for B in Bs:
                for seq in seqs:
                    lab = f"{kind} B={B} seq={seq} N={N}"
                    if shape_filter and not any(f in lab for f in shape_filter):
                        continue
                    s = Setup(B, seq, N, kind, dev, l2)
                    plan = decode_plan(batch=B, num_heads=N, q_len=1, max_blocks=s.tables[0].shape[1],
                                       block_size=BLOCK, q_dtype=torch.bfloat16, kv_fp8=s.fp8,
                                       kv_elem_bytes=1 if s.fp8 else 2, device=dev, max_seq_len=seq)
                    cfg = plan["config"]
                    ours_note = (f"S={plan['num_kv_splits']} H{cfg['BLOCK_H']}x{plan['row_blocks']} "
                                 f"N{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}")
                    groups.append(s.label)
                    ref_rows = min(B, 2)
                    fns: dict[str, object] = {"rocm_mla-triton": ours(s)}
                    vllm_S = None
                    if vllm_fwd is not None:
                        fns["vllm-0.33-triton"], vllm_S = vllm(s, vllm_fwd, sms)
                    if not args.no_flashinfer:
                        fi_call, why = flashinfer(s)
                        if fi_call is not None:
                            fns["flashinfer-fa3"] = fi_call
                        elif (kind, why) not in fi_skipped:
                            fi_skipped.add((kind, why))
                            notes.append(f"  flashinfer-fa3 skipped ({kind}): {why}")
                    row = [s.label, ours_note]
                    times: dict[str, float] = {}
                    for p in providers:
                        fn = fns.get(p)
                        if p == "torch-reference":
                            if B * seq > 32 * 4096:
                                row.append("-")
                                gbs_series[p].append(0.0)
                                tf_series[p].append(0.0)
                                continue
                            ms = time_ms(lambda s=s: mla_decode_ref(s.ql_nope, s.q_pe, s.caches[0], s.tables[0],
                                                                s.seq_lens, SCALE, s.k_scale), rep_ms=200)
                            us = ms * 1e3
                        elif fn is None:
                            row.append("-")
                            gbs_series[p].append(0.0)
                            tf_series[p].append(0.0)
                            continue
                        else:
                            try:
                                got = fn(0)
                                torch.cuda.synchronize()
                                bad = check(p, got, s, ref_rows)
                                if bad:
                                    notes.append(bad)
                                us = graph_time_us(fn, s.R)
                            except Exception as exc:  # report, keep benchmarking the rest
                                notes.append(f"  {p} {s.label}: {type(exc).__name__}: {str(exc)[:200]}")
                                row.append("err")
                                gbs_series[p].append(0.0)
                                tf_series[p].append(0.0)
                                continue
                        times[p] = us
                        gbs = s.nbytes() / us / 1e3
                        tfs = s.flops() / us / 1e6
                        gbs_series[p].append(gbs)
                        tf_series[p].append(tfs)
                        row.append(f"{us:.1f}us {gbs:.0f}GB/s ({100 * gbs / copy:.0f}%) {tfs:.0f}TF "
                                   f"({100 * tfs / mm:.0f}%)")
                        for metric, val in (("time_us", us), ("GB/s", gbs), ("pct_copy", 100 * gbs / copy),
                                            ("TFLOP/s", tfs), ("pct_matmul", 100 * tfs / mm)):
                            records.append(Record("mla_decode", p, s.label, metric, val, name, __version__))
                    records.append(Record("mla_decode", "rocm_mla-triton", s.label, "num_kv_splits",
                                          plan["num_kv_splits"], name, __version__))
                    if vllm_S is not None:
                        records.append(Record("mla_decode", "vllm-0.33-triton", s.label, "num_kv_splits", vllm_S,
                                              name, __version__))
                    if "rocm_mla-triton" in times and "vllm-0.33-triton" in times:
                        row.append(f"{times['vllm-0.33-triton'] / times['rocm_mla-triton']:.2f}x")
                        records.append(Record("mla_decode", "rocm_mla-triton", s.label, "speedup_vs_vllm",
                                              times["vllm-0.33-triton"] / times["rocm_mla-triton"], name,
                                              __version__))
                    else:
                        row.append("-")
                    rows.append(row)
                    print(" | ".join(row), flush=True)

                    best = None
                    for ci in cand_ids:
                        cand = cands[ci]
                        for S in (splits_1 if B == 1 else splits_b):
                            p = decode_plan(batch=B, num_heads=N, q_len=1, max_blocks=s.tables[0].shape[1],
                                            block_size=BLOCK, q_dtype=torch.bfloat16, kv_fp8=s.fp8,
                                            kv_elem_bytes=1 if s.fp8 else 2, device=dev, max_seq_len=seq,
                                            num_kv_splits=S, launch_config=cand)
                            label = (f"c{ci}:H{cand['BLOCK_H']} N{cand['BLOCK_N']} d{cand.get('D_SPLIT', 1)} "
                                     f"w{cand['num_warps']} s{cand['num_stages']}")
                            col = f"{label} S={'a' if S is None else S}"
                            try:
                                fn = ours(s, cand, S)
                                bad = check(label, fn(0), s, ref_rows)
                                us = float("nan") if bad else graph_time_us(fn, s.R, min_ms=15, reps=3)
                                if bad:
                                    notes.append(bad)
                            except Exception as exc:
                                notes.append(f"  tune {col} {s.label}: {type(exc).__name__}: {str(exc)[:160]}")
                                us = float("nan")
                            tune_rows.append((s.label, ci, S, p["num_kv_splits"], us))
                            tune_records.append(Record("mla_decode_tune", col, s.label, "time_us", us, name,
                                                       __version__))
                            if us == us and (best is None or us < best[3]):
                                best = (s.label, ci, p["num_kv_splits"], us)
                    if best is not None:
                        winners.append(best)
                    del s, fns
                    torch.cuda.empty_cache()

    print(f"\nmla_decode (q bf16, block {BLOCK}, CUDA-graph replay, cold L2): per call time, GB/s (% of the "
          f"{copy:.0f} GB/s copy ceiling), TFLOP/s (% of {mm:.0f} bf16 matmul)")
    print_table(["shape", "rocm_mla plan", *providers, "vs vLLM"], rows)
    for n in notes:
        print(n)
    out_dir = Path(args.out)
    write_csv(out_dir / "decode.csv", records)
    bar_plot(out_dir / "decode_gbs.png", f"mla_decode GB/s on {name}", groups, gbs_series, "GB/s",
             hline=copy, hline_label="copy ceiling")
    bar_plot(out_dir / "decode_tflops.png", f"mla_decode TFLOP/s on {name}", groups, tf_series, "TFLOP/s",
             hline=mm, hline_label="bf16 matmul")
    print(f"wrote {out_dir / 'decode.csv'}, decode_gbs.png, decode_tflops.png")
    if cands:
        print("\n--tune: per-call us of each stage-1 candidate (rows) x forced split count S (a = the "
              "heuristic; [n] = the S it picked); best per shape marked *")
        shapes = list(dict.fromkeys(sh for sh, *_ in tune_rows))
        for sh in shapes:
            rows_sh = [r for r in tune_rows if r[0] == sh]
            svals = list(dict.fromkeys(r[2] for r in rows_sh))
            bst = min((r[4] for r in rows_sh if r[4] == r[4]), default=float("nan"))
            table = []
            for ci in dict.fromkeys(r[1] for r in rows_sh):
                c = cands[ci]
                line = [f"c{ci} H{c['BLOCK_H']} N{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']}"]
                for S in svals:
                    r = next(r for r in rows_sh if r[1] == ci and r[2] == S)
                    txt = "x" if r[4] != r[4] else f"{r[4]:.1f}{'*' if r[4] == bst else ''}"
                    line.append(txt + (f" [{r[3]}]" if S is None else ""))
                table.append(line)
            print(f"\n{sh}")
            print_table(["cand", *(f"S={'a' if S is None else S}" for S in svals)], table)
        print("\nwinners (shape: candidate, S, us) and the config object to move into the stage1 tiers:")
        for sh, ci, S, us in winners:
            print(f"  {sh}: c{ci} S={S} {us:.1f}us  {json.dumps(cands[ci], separators=(',', ':'))}")
        write_csv(out_dir / "tune.csv", tune_records)
        print(f"wrote {out_dir / 'tune.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
