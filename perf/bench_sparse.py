#!/usr/bin/env python3
"""Benchmark mla_sparse_attention (sparse MLA: DeepSeek-V3.2, GLM-5.x) against vLLM 0.34's Triton
sparse kernels and FlashInfer's fa3 MLA with page size 1: time per call, GB/s, TFLOP/s and % of the
copy / matmul ceilings measured in the same run, every timed output checked.

    python perf/bench_sparse.py [--out results] [--peers .peers] [--preset bench|quick]
                                [--shapes 'LABEL;...'] [--configs JSON] [--no-flashinfer] [--no-vllm]

Shapes (rocm_mla.cases.sparse.SHAPES[preset]): K = 2048 entries per row, block 64, q bf16, cache bf16 or
fp8 (the platform's e4m3 kind, per-tensor k_scale); decode 1, 32 and 128 requests of 8192 cached
tokens x N = 8, 16, 128 x 1 and 2 rows per request; prefill chunks of 8192 rows after 8192 cached
tokens (every row's list full) at N = 16 and 128. The lists are what an indexer's top-k gives: K
distinct positions of the row's visible keys, random order.

Counted per call (the same for every provider; rocm_mla.cases.sparse.SparseShape):
  bytes = entries x 576 x cache elem (each selected row once per query row that selects it) + the lists
          (T x K x 4) + q in and out back (T x N x (576 + 512) x 2)
  FLOPs = 2 x N x entries x (576 + 512)

Providers, each captured in CUDA graphs of 8 calls rotating over cache copies larger than 3 x the
L2 (benchutil.rotating_graph_us; the prefill chunk's 8192 x 2048 gathers mostly hit L2 by nature):
  rocm_mla-triton      mla_sparse_attention(ql_nope, q_pe, cache, positions, block_table,
                       req_id_per_token, out=, lse=, plan=): positions through the block table inside
                       the kernel; ql_nope the [N, T, 512] bmm output seen as [T, N, 512], q_pe a
                       slice; the plan (plan_sparse_attention) made once, outside the timing.
  rocm_mla-triton-inv  the same with a plan_sparse_attention(batch_invariant=True) plan (splits of a
                       fixed size).
  flashinfer-fa3-p1    FlashInfer 0.7.4's BatchMLAPagedAttentionWrapper(backend="fa3") over the cache
                       as 1-token pages, the rows' global slots as kv_indices, one request per query
                       row: what vLLM's FLASHINFER_MLA_SPARSE_SM90 runs. Planned outside the timing;
                       the slots (vLLM's convert kernel) and q's concat made outside it too.
  vllm-0.34-prefill    vLLM 0.34's rocm_sparse_attn_prefill (its ROCm Triton one-pass kernel, aiter
                       absent) on [T, 1, K] global slots, q concatenated outside the timing.
  vllm-0.34-decode     rocm_sparse_attn_decode_bf16 (split-K) with its split rule, ragged slot lists
                       built outside the timing; reported as not compiling where Triton refuses it.
  vllm-0.34-xpu        triton_bf16_mla_sparse_interface, vLLM's portable Triton kernel.
The vLLM kernels come from perf/peers/get_vllm_sparse_peers.sh PEERS; FlashInfer from
perf/peers/get_flashinfer_peer.sh (perf/device_run.sh unpacks it).

--configs: a JSON list of tier configs (as configs/mla_sparse_attention.json's ``tiers`` entries)
timed beside the default as ``rocm_mla-triton[k]`` (a sweep; rocm-mla tune is the tuner).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
from benchutil import RateRun, Record, bench_parser, print_table, start_bench, write_csv

from rocm_mla import __version__
from rocm_mla.cases import cold_copies, compare, sparse
from rocm_mla.cases.sparse import SparseInputs, SparseShape, positions_to_slots
from rocm_mla.mla_dims import KV_LORA_RANK as L
from rocm_mla.mla_dims import KV_ROW_DIM as D
from rocm_mla.tools.timing import cold_cache_bytes, rotating_graph_us

DTYPE = torch.bfloat16
CHECK_ROWS = 4  # every timed output is checked on its first rows against float32
KERNEL = "mla_sparse_attention"


class Setup:
    """One shape's inputs (rocm_mla.cases.sparse, R cache copies over 3 x the cold-cache bytes) and
    what the peers read of them (global slots per copy, q concatenated)."""

    def __init__(self, shape: SparseShape, dev: torch.device, cold_bytes: int):
        self.shape = shape
        self.R, self.cold = cold_copies(shape.set_bytes(DTYPE), cold_bytes, cap=16)
        self.case: SparseInputs = sparse.make_inputs(shape, dtype=DTYPE, device=dev, copies=self.R, spare_cols=0)
        self.label = shape.label(DTYPE)
        self.dev = dev
        c = self.case
        self.slots = [positions_to_slots(c.positions, c.paged.tables[i], c.req_ids, shape.block) for i in range(self.R)]
        self._q_full = None

    @property
    def q_full(self) -> torch.Tensor:
        if self._q_full is None:
            self._q_full = torch.cat((self.case.q_nope, self.case.q_pe), dim=-1).contiguous()
        return self._q_full

    def flat_cache(self, i: int) -> torch.Tensor:
        """Cache copy i as 1-token rows ``[slots, 1, 576]`` (a view)."""
        c = self.case.paged.caches[i]
        return c.view(-1, 1, D)


# --------------------------------------------------------------------------- providers


def ours(s: Setup, **kw):
    """``(call, plan)``: the op with a plan made once (as a serving step makes it for every layer);
    ``kw``: config (a ``--configs`` entry, whose ``num_splits`` key, if any, forces the split
    count), batch_invariant."""
    cfg = dict(kw.get("config") or {})
    splits = cfg.pop("num_splits", None)
    inv = {k: v for k, v in kw.items() if k == "batch_invariant"}
    plan = s.case.plan(config=cfg or None, num_splits=splits, backend="triton", **inv)

    def call(i: int):
        s.case.run(i, plan=plan)
        return s.case.out

    return call, plan


def flashinfer(s: Setup):
    """FlashInfer's fa3 MLA over 1-token pages, planned here (untimed); (None, reason) when it
    cannot run."""
    try:
        import flashinfer as fi
        from flashinfer.mla import MLAPlanMetadata
    except Exception as exc:
        return None, f"not importable ({type(exc).__name__})"
    if s.shape.fp8:
        return None, "fp8 cache: the fa3 MLA kernel takes 16-bit caches here"
    try:
        T, K, dev = s.shape.T, s.shape.K, s.dev
        wrappers = []
        for i in range(min(s.R, 8)):
            w = fi.mla.BatchMLAPagedAttentionWrapper(
                torch.empty(256 << 20, dtype=torch.int8, device=dev), backend="fa3"
            )
            md = MLAPlanMetadata.csr(
                qo_indptr=torch.arange(T + 1, dtype=torch.int32, device=dev),
                kv_indptr=torch.arange(T + 1, dtype=torch.int32, device=dev) * K,
                kv_indices=s.slots[i].reshape(-1),
                kv_len_arr=torch.full((T,), K, dtype=torch.int32, device=dev),
            )
            w.plan(
                metadata=md,
                num_heads=s.shape.N,
                head_dim_ckv=L,
                head_dim_kpe=D - L,
                page_size=1,
                causal=False,
                sm_scale=s.case.sm_scale,
                q_data_type=DTYPE,
                kv_data_type=DTYPE,
            )
            wrappers.append(w)
        out = torch.empty(T, s.shape.N, L, dtype=DTYPE, device=dev)

        def call(i: int):
            k = i % len(wrappers)
            wrappers[k].run(query=s.q_full, kv_cache=s.flat_cache(k), out=out)
            return out

        return call, ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


def vllm_prefill(s: Setup, mod):
    if s.shape.fp8:
        return None, "bf16 caches only"
    out = torch.empty(s.shape.T, s.shape.N, L, dtype=DTYPE, device=s.dev)
    idx = [x.view(s.shape.T, 1, s.shape.K) for x in s.slots]

    def call(i: int):
        mod.rocm_sparse_attn_prefill(s.q_full, s.flat_cache(i), idx[i], None, s.case.sm_scale, D, L, D - L, None, out)
        return out

    return call, ""


def vllm_decode(s: Setup, mod):
    if s.shape.fp8:
        return None, "bf16 caches only"
    T, N, K = s.shape.T, s.shape.N, s.shape.K
    splits = mod.rocm_sparse_decode_bf16_num_splits(T, N, K)
    ragged = [
        mod.build_ragged_indices_from_dense(x, torch.full((T,), K, dtype=torch.int32, device=s.dev)) for x in s.slots
    ]
    out = torch.empty(T, N, L, dtype=DTYPE, device=s.dev)

    def call(i: int):
        ind, ptr = ragged[i]
        mod.rocm_sparse_attn_decode_bf16(
            s.q_full, s.flat_cache(i), s.case.sm_scale, D, L, D - L, None, out, ind, ptr, splits
        )
        return out

    return call, ""


def vllm_xpu(s: Setup, mod):
    if s.shape.fp8:
        return None, "bf16 caches only"
    idx = [x.view(s.shape.T, 1, s.shape.K) for x in s.slots]

    def call(i: int):
        return mod.triton_bf16_mla_sparse_interface(s.q_full, s.flat_cache(i), idx[i], s.case.sm_scale)[0]

    return call, ""


def load_vllm_sparse(peers: str):
    """vLLM 0.34's sparse MLA kernels (perf/peers/get_vllm_sparse_peers.sh); {} with the reason
    printed when missing."""
    folder = Path(peers, "vllm_sparse")
    if not folder.is_dir():
        print(f"vLLM sparse peers unavailable: no {folder} (run perf/peers/get_vllm_sparse_peers.sh {peers})")
        return {}
    sys.path.insert(0, str(folder))
    try:
        import rocm_sparse
        import xpu_sparse

        return {"rocm": rocm_sparse, "xpu": xpu_sparse, "version": (folder / "VLLM_VERSION").read_text().strip()}
    except Exception as exc:
        print(f"vLLM sparse peers unavailable: {type(exc).__name__}: {exc}")
        return {}


# --------------------------------------------------------------------------- timing


class Run(RateRun):
    """Table rows, CSV records and notes of one run."""

    def __init__(self, name: str, copy: float, mm: float):
        super().__init__(name, copy, mm, KERNEL, __version__)
        self.skipped: set[tuple[str, str]] = set()

    def skip(self, provider: str, s: Setup, why: str) -> None:
        if (provider, why) not in self.skipped:
            self.skipped.add((provider, why))
            self.notes.append(f"  {provider} skipped ({s.label} and alike): {why}")

    def add(self, provider: str, s: Setup, us: float | None, config: str = "") -> str:
        return super().add(provider, s.label, s.shape.nbytes(DTYPE), s.shape.flops(), us, config)


def time_checked(run: Run, provider: str, fn, s: Setup, ref: tuple, ours_: bool) -> float | None:
    """Check the first rows against float32 (ours: out and lse), then time; None (noted) on error."""
    try:
        got = fn(0)
        torch.cuda.synchronize()
        if ours_:
            problem = s.case.mismatch(ref=ref)
        else:
            ro = ref[0]
            problem = compare("out", got[: ro.shape[0]], ro, sparse.TOLERANCE[DTYPE]["out"]).problem
        if problem:
            run.notes.append(f"  {provider} {s.label}: WRONG ({problem})")
        return rotating_graph_us(fn, s.R)
    except Exception as exc:  # report, keep benchmarking the rest
        run.notes.append(f"  {provider} {s.label}: {type(exc).__name__}: {str(exc)[:300]}")
        return None


PEERS = ["flashinfer-fa3-p1", "vllm-0.34-prefill", "vllm-0.34-decode", "vllm-0.34-xpu"]


def plan_label(plan) -> str:
    c = plan.config
    return (
        f"S={plan.num_splits}x{plan.split_len} H{c['BLOCK_H']}x{plan.head_blocks} N{c['BLOCK_N']} d{c['D_SPLIT']}"
        f"{'h' if plan.constexprs['F16_DOT'] else ''}{'r' if plan.constexprs['RELOAD_K'] else ''}"
        f" w{c['num_warps']} s{c['num_stages']}"
    )


def bench_shape(run: Run, s: Setup, peers: dict, extra: list[dict]) -> list[str]:
    fn, plan = ours(s)
    fns = {"rocm_mla-triton": (fn, "")}
    inv_fn, inv_plan = ours(s, batch_invariant=True)
    fns["rocm_mla-triton-inv"] = (inv_fn, "")
    for k, cfg in enumerate(extra):
        try:
            fns[f"rocm_mla-triton[{k}]"] = (ours(s, config=cfg)[0], "")
        except ValueError as exc:
            fns[f"rocm_mla-triton[{k}]"] = (None, str(exc))
    if peers.get("flashinfer"):
        fns["flashinfer-fa3-p1"] = flashinfer(s)
    if "rocm" in peers:
        fns["vllm-0.34-prefill"] = vllm_prefill(s, peers["rocm"])
        fns["vllm-0.34-decode"] = vllm_decode(s, peers["rocm"])
        fns["vllm-0.34-xpu"] = vllm_xpu(s, peers["xpu"])
    ref = s.case.reference(CHECK_ROWS)
    times: dict[str, float] = {}
    cell: dict[str, str] = {}
    for p, (f, why) in fns.items():
        us = None
        if f is None:
            run.skip(p, s, why)
        else:
            us = time_checked(run, p, f, s, ref, p.startswith("rocm_mla"))
        if us is not None:
            times[p] = us
        cfg = {"rocm_mla-triton": plan_label(plan), "rocm_mla-triton-inv": plan_label(inv_plan)}.get(p, "")
        cell[p] = run.add(p, s, us, cfg)
    ours_us = times.get("rocm_mla-triton")
    for peer in [*PEERS, "rocm_mla-triton-inv", *(f"rocm_mla-triton[{k}]" for k in range(len(extra)))]:
        if ours_us and peer in times:
            run.records.append(
                Record(
                    KERNEL, "rocm_mla-triton", s.label, f"speed_vs_{peer}", times[peer] / ours_us, run.name, __version__
                )
            )
    best_vllm = min((times[p] for p in PEERS[1:] if p in times), default=None)
    ratio = lambda t: f"{t / ours_us:.2f}x" if ours_us and t else "-"  # noqa: E731
    cells = [s.label, plan_label(plan), *(cell.get(p, "-") for p in ("rocm_mla-triton", "rocm_mla-triton-inv", *PEERS))]
    cells += [ratio(times.get("flashinfer-fa3-p1")), ratio(best_vllm), ratio(times.get("rocm_mla-triton-inv"))]
    for k in range(len(extra)):
        p = f"rocm_mla-triton[{k}]"
        if p in times:
            print(f"  {s.label} {p} {json.dumps(extra[k])}: {times[p]:.1f} us ({ratio(times[p])} of default)")
    print(" | ".join(cells), flush=True)
    return cells


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for sparse.csv")
    ap.add_argument("--peers", default=".peers", help="folder with vllm_sparse/ (get_vllm_sparse_peers.sh)")
    ap.add_argument("--preset", default="bench", choices=sorted(sparse.SHAPES), help="rocm_mla.cases.sparse.SHAPES")
    ap.add_argument("--quick", action="store_true", help="= --preset quick")
    ap.add_argument("--shapes", default="", help="only shapes whose label contains one of these (';'-separated)")
    ap.add_argument("--configs", default="", help="JSON list of tier configs timed beside the default")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()
    gpu = start_bench("bench_sparse", copy=True, matmul=True)
    if gpu is None:
        return 2
    dev, name = gpu.dev, gpu.name
    cold = cold_cache_bytes(dev)
    print(
        f"device: {name}; copy ceiling {gpu.copy_gbs:.0f} GB/s (read+write); bf16 matmul {gpu.matmul_tflops:.0f} "
        f"TFLOP/s; torch {torch.__version__} triton {triton.__version__}"
    )
    peers: dict = {} if args.no_vllm else load_vllm_sparse(args.peers)
    peers["flashinfer"] = not args.no_flashinfer
    extra = json.loads(args.configs) if args.configs else []
    run = Run(name, gpu.copy_gbs, gpu.matmul_tflops)
    filters = [f.strip() for f in args.shapes.split(";") if f.strip()]
    for shape in sparse.SHAPES["quick" if args.quick else args.preset]:
        if filters and not any(f in shape.label(DTYPE) for f in filters):
            continue
        s = Setup(shape, dev, cold)
        if not s.cold:
            run.notes.append(f"  note: {s.label}: {s.R} copies stay under 3 x {cold >> 20} MiB: partly from L2")
        run.rows.append(bench_shape(run, s, peers, extra))
        write_csv(Path(args.out) / "sparse.csv", run.records)  # after every shape: a cut-off run keeps its rows
        del s
        torch.cuda.empty_cache()
    print(
        f"\n{KERNEL} (q bf16, K 2048, block 64, CUDA-graph replay, cold caches): per call time, GB/s (% of the "
        f"{run.copy:.0f} GB/s copy ceiling), TFLOP/s"
    )
    print_table(["shape", "plan", "rocm_mla", "invariant", *PEERS, "FI/ours", "vLLM/ours", "inv/ours"], run.rows)
    for n in run.notes:
        print(n)
    write_csv(Path(args.out) / "sparse.csv", run.records)
    print(f"wrote {Path(args.out) / 'sparse.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
