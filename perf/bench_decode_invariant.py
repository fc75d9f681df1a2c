#!/usr/bin/env python3
"""Benchmark mla_decode's batch-invariant mode: ours default vs ours batch_invariant=True (one row
per split rule) vs vLLM 0.33 TRITON_MLA's batch-invariant decode (one KV split), same run.

    python perf/bench_decode_invariant.py [--out results] [--peers .peers] [--quick]
                                          [--split-tokens 256,512,1024] [--max-splits 64]
                                          [--dtypes bf16,fp8] [--shapes 'LABEL;...']

Shapes (block 64, q bf16, every request as long as the label says): B in {1, 8} x seq in {8192,
16384} x N in {16, 128, 32}, B=128 seq 4096 N in {16, 128, 32}, and N=16 with two MTP rows (q2)
at B=1 and 8 seq 8192 and B=128 seq 4096 (--quick: B=1 seq 16384 N=16, B=8 seq 8192 N=16, B=128
seq 4096 N=16). Inputs, cold-cache rotation, CUDA-graph timing and the
providers' calls are perf/bench_decode.py's (its Setup, ``ours``, ``vllm``; benchutil's
rotating_graph_us). Providers:

  rocm_mla-default       mla_decode as vLLM calls it (max_seq_len passed), the default split count
  rocm_mla-invariant     mla_decode(batch_invariant=True), once per --split-tokens value: the
                         configs' ``batch_invariant`` object replaced in-process (configs.loader's
                         override) by {"split_tokens": T, "max_splits": --max-splits} and the
                         tiers' invariant_split_tokens dropped (one rule for every tier); without
                         --split-tokens the package's data for the arch. The config column says
                         the rule the plan ran.
  vllm-0.33-triton-1split  TRITON_MLA's decode_attention_fwd with num_kv_splits = 1, what it runs
                         under VLLM_BATCH_INVARIANT=1 (torch.cat of q and the memsets counted)

Checks, before timing: every provider's first requests against float32 (cases.decode.TOLERANCE);
for ours invariant also request 0's out and lse bitwise equal to a batch of request 0 alone (same
table width). Rows: time_us per provider and shape (config: the split rule), the ratios
invariant / default and vLLM-1split / invariant.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from bench_decode import Setup, check, ours
from benchutil import Record, bench_parser, load_vllm_peer, print_table, start_bench, vllm_triton_mla_decode, write_csv

from rocm_mla import __version__
from rocm_mla._platform import device_arch
from rocm_mla.cases.decode import DecodeShape, call_decode
from rocm_mla.configs import config_for
from rocm_mla.configs.loader import override
from rocm_mla.tools.timing import cold_cache_bytes, rotating_graph_us

CHECK_REQUESTS = 2


def shapes(quick: bool, kinds: list[str]) -> list[DecodeShape]:
    """(B, seq, N, q_len): N=16 and 128 (the 16- and 64-row tiers), N=32 and N=16 with two MTP rows
    (the 32-row tier)."""
    if quick:
        base = [(1, 16384, 16, 1), (8, 8192, 16, 1), (128, 4096, 16, 1)]
    else:
        base = [(b, s, n, 1) for n in (16, 128, 32) for b in (1, 8) for s in (8192, 16384)]
        base += [(128, 4096, n, 1) for n in (16, 128, 32)]
        base += [(1, 8192, 16, 2), (8, 8192, 16, 2), (128, 4096, 16, 2)]
    return [
        DecodeShape(B=b, seq=s, N=n, q_len=q, block=64, kv="fp8" if k == "fp8" else "auto")
        for k in kinds
        for b, s, n, q in base
    ]


def invariant_call(s: Setup):
    def call(i: int):
        s.case.run(i, backend="triton", batch_invariant=True)
        return s.case.out

    return call


def alone_matches(s: Setup) -> str:
    """'' when request 0 of the batch has the bits it has in a batch of itself (invariant mode)."""
    c = s.case
    o, lse = (t.clone() for t in c.run(0, backend="triton", batch_invariant=True))
    q_len = s.q_len
    o1, l1 = call_decode(
        c.q_nope[:q_len].clone(),
        c.q_pe[:q_len].clone(),
        c.paged.stored(0),
        c.paged.tables[0][:1].contiguous(),
        c.seq_lens[:1].contiguous(),
        sm_scale=c.sm_scale,
        kv_cache_dtype=c.kv_cache_dtype,
        k_scale=c.k_scale,
        backend="triton",
        batch_invariant=True,
    )
    same = torch.equal(o[:q_len].view(torch.uint8), o1.view(torch.uint8)) and torch.equal(lse[:q_len], l1)
    return "" if same else "request 0 alone differs from request 0 in the batch"


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for decode_invariant.csv")
    ap.add_argument("--peers", default=".peers", help="folder made by get_vllm_peers.sh")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--split-tokens", default="", help="split rules to time, e.g. 256,512,1024 (default: the config)")
    ap.add_argument("--max-splits", type=int, default=64, help="max_splits of the --split-tokens rules")
    ap.add_argument("--dtypes", default="bf16", help="cache dtypes: bf16, fp8")
    ap.add_argument("--shapes", default="", help="only shapes whose label contains one of these (';'-separated)")
    args = ap.parse_args()
    gpu = start_bench("bench_decode_invariant")
    if gpu is None:
        return 2
    dev, name = gpu.dev, gpu.name
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cold = cold_cache_bytes(dev)
    arch = device_arch(dev)
    base_cfg = config_for("mla_decode", arch)
    rules = [None] + [int(t) for t in args.split_tokens.split(",") if t.strip()]
    if len(rules) > 1:
        rules = rules[1:]
    print(f"device: {name} ({sms} SMs/CUs); torch {torch.__version__} triton {triton.__version__}; arch {arch}")
    fwd = load_vllm_peer(args.peers, "triton_decode_attention", "decode_attention_fwd")
    filt = [f.strip() for f in args.shapes.split(";") if f.strip()]
    kinds = [k.strip() for k in args.dtypes.split(",") if k.strip()]
    records: list[Record] = []
    rows, notes = [], []
    for shape in shapes(args.quick, kinds):
        label = shape.label(torch.bfloat16)
        if filt and not any(f in label for f in filt):
            continue
        s = Setup(shape, dev, cold)
        ref = s.case.reference(CHECK_REQUESTS)

        def timed(provider, fn, config=""):
            try:
                fn(0)
                torch.cuda.synchronize()
                problem = s.case.mismatch(ref=ref) if provider.startswith("rocm_mla") else ""
                if problem:
                    notes.append(f"  {provider} {label}: WRONG ({problem})")
                us = rotating_graph_us(fn, s.R)
            except Exception as exc:
                notes.append(f"  {provider} {label}: {type(exc).__name__}: {str(exc)[:200]}")
                return None
            records.append(Record("mla_decode", provider, label, "time_us", us, name, __version__, config))
            return us

        t_def = timed("rocm_mla-default", ours(s))
        row = [label, f"{t_def:.1f}" if t_def else "-"]
        best = None
        for rule in rules:
            obj = dict(base_cfg)
            if rule is not None:
                obj["batch_invariant"] = {"split_tokens": rule, "max_splits": args.max_splits}
                # One rule for every tier: the tiers' own invariant_split_tokens give way.
                obj["tiers"] = [{k: v for k, v in t.items() if k != "invariant_split_tokens"} for t in obj["tiers"]]
            with override("mla_decode", arch, obj):
                plan = s.case.plan(dev, batch_invariant=True)
                # The rule the plan runs (a tier's invariant_split_tokens, else the arch's).
                c1 = plan.constexprs
                tag = f"split_tokens={c1['SPLIT_TOKENS']} max_splits={c1['SPLIT_CAP']}"
                bad = alone_matches(s)
                if bad:
                    notes.append(f"  rocm_mla-invariant {label} {tag}: WRONG ({bad})")
                t = timed("rocm_mla-invariant", invariant_call(s), tag)
            row.append(f"{t:.1f} (S={plan.num_splits})" if t else "-")
            if t and t_def:
                records.append(
                    Record("mla_decode", "rocm_mla-invariant", label, "vs_default", t / t_def, name, "", tag)
                )
            if t and (best is None or t < best):
                best = t
        t_v = None
        if fwd is not None and s.q_len == 1 and not s.fp8:
            logits = torch.empty(s.B, s.N, 1, 513, dtype=torch.float32, device=dev)
            ones = torch.ones(1, device=dev)

            def one_split(i):
                return vllm_triton_mla_decode(
                    fwd, s.ql_nope, s.q_pe, s.caches[i], s.tables[i], s.seq_lens, logits, s.case.sm_scale, ones
                )

            got = one_split(0)
            torch.cuda.synchronize()
            bad = check("vllm-0.33-triton-1split", got, s, ref)
            if bad:
                notes.append(bad)
            t_v = timed("vllm-0.33-triton-1split", one_split)
        row.append(f"{t_v:.1f}" if t_v else "-")
        row.append(f"{best / t_def:.2f}x" if best and t_def else "-")
        row.append(f"{t_v / best:.1f}x" if best and t_v else "-")
        if best and t_v:
            records.append(
                Record("mla_decode", "rocm_mla-invariant", label, "speed_vs_vllm_1split", t_v / best, name, "")
            )
        rows.append(row)
        print(" | ".join(row), flush=True)
        s = None  # free this shape's cache copies before the next shape's
        torch.cuda.empty_cache()
    heads = ["shape", "default us"] + [f"invariant T={r or 'config'} us" for r in rules]
    print_table(heads + ["vLLM 1-split us", "best inv/default", "vLLM-1split/best inv"], rows)
    for n in notes:
        print(n)
    write_csv(Path(args.out) / "decode_invariant.csv", records)
    print(f"wrote {Path(args.out) / 'decode_invariant.csv'}")
    return 1 if any("WRONG" in n for n in notes) else 0


if __name__ == "__main__":
    sys.exit(main())
