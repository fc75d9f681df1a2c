#!/usr/bin/env python3
"""Benchmark mla_decode against vLLM 0.33's Triton MLA decode (called as TRITON_MLA calls it), the
torch reference at small shapes, and FlashInfer's MLA decode when importable: time per call,
GB/s, TFLOP/s and % of the copy / matmul ceilings measured in the same run.

    python perf/bench_decode.py [--out results] [--peers .peers] [--preset flashmla|quick|serving]
                                [--dtypes bf16,fp8] [--shapes 'LABEL;...']

Shapes: --preset flashmla (default; FlashMLA's benchmark): B in {1, 32, 128}, seq in {1024, 4096,
16384} (every request that long), N in {16, 128}; --preset quick: B in {1, 128}, seq 4096;
--preset serving: what DeepSeek-V3 decode runs on a rank (TP8 16 heads, DP 128 heads, MTP q_len 2
and 4, fp8 cache, B=1). The presets are rocm_mla.cases.decode's shape sets (PRESETS), and the inputs
and the check of every timed output (its first requests against float32, cases.decode.TOLERANCE)
come from there too. Block size 64, q bf16, cache bf16 or fp8 (e4m3fn on
NVIDIA, e4m3fnuz on gfx942) with a per-tensor k_scale. MTP rows: request b owns rows
b*q_len .. b*q_len+q_len-1, causal among themselves (row t sees seq - q_len + 1 + t keys).

Counted per call (the same for every provider):
  bytes  = B x seq x 576 x cache elem (each request's KV read once) + rows x N x 576 x 2 (q read)
           + rows x N x 512 x 2 (out written)                       (rows = B x q_len)
  FLOPs  = B x 2 x N x keys x (576 + 512)   (q.k over 576 columns, p.v over 512; keys = the keys
                                            one request's rows see, summed: q_len x seq at q_len 1)

Providers, each captured in CUDA graphs of 8 calls (benchutil.rotating_graph_us) and timed as back-to-back replays:
  rocm_mla-triton    mla_decode(ql_nope, q_pe, ...) with ql_nope the [N, B, 512] bmm output seen as
                     [B, N, 512] and q_pe a slice of q [B, N, 192]; out/lse preallocated (vLLM's
                     layer buffers); max_seq_len passed as vLLM has it on the host. The chosen split
                     count and launches are printed.
  rocm_mla-triton-fp8qk / -fp8all  (fp8 caches) the same call with fp8_dots="qk" / "all", checked
                     against the unrounded float32 reference under cases.decode.FP8_DOTS_ACCURACY.
  vllm-0.33-triton   decode_attention_fwd exactly as TRITON_MLA.forward_mqa calls it: torch.cat of
                     q (counted), torch.zeros o and lse (counted), attn_logits workspace preallocated
                     (vLLM reserves it once), num_kv_splits from its _compute_num_kv_splits
                     (next_pow2(max_seq_len // 512), capped at 2 x SMs), k_scale/v_scale = the layer's
                     scale tensor. Importable via `perf/peers/get_vllm_peers.sh .peers`.
  flashinfer-fa3     BatchMLAPagedAttentionWrapper(backend="fa3") planned outside the timing, q
                     pre-concatenated (kernel only), fp8 with ckv_scale = kpe_scale = k_scale, MTP
                     rows causal (qo_indptr steps by q_len);
                     skipped with a note when not importable or when it refuses the shape. See
                     perf/peers/get_flashinfer_peer.sh.
  aiter-triton       aiter's decode_attention_fwd_grouped_rope (amd-aiter wheel's Triton files, made
                     importable by perf/peers/get_aiter_peers.sh PEERS/aiter), rope off, its MI300X
                     config (AMD-only options dropped on NVIDIA), q pre-concatenated and token indices
                     built outside the timing; bf16 cache, q_len 1 (what it supports).
  torch-reference    rocm_mla.reference.mla_decode_ref, eager (it syncs), B x seq <= 32 x 4096 only.

Cold caches: each provider's calls rotate over R copies of the KV cache and block table (fresh
page permutations), R chosen so the copies together exceed 3 x the L2 size (on AMD at least the
256 MB Infinity Cache: benchutil.cold_cache_bytes, rocm-mla tune's rule too; at most 64 copies, and
a shape they cannot cover prints a note); a call therefore
finds its KV in HBM, as a decode step does after the other layers ran. Each CUDA graph holds 8
consecutive calls of the rotation (benchutil.rotating_graph_us), so a short call (B=1) is timed
as the GPU runs it inside a captured step, not at the host's graph-replay rate.

--shapes filters shapes. The launch configs are swept by `rocm-mla tune`, not here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from benchutil import (
    Record,
    aiter_peer_version,
    bench_parser,
    load_aiter_peer,
    load_vllm_peer,
    print_table,
    start_bench,
    vllm_num_kv_splits,
    vllm_triton_mla_decode,
    write_csv,
)

from rocm_mla import __version__
from rocm_mla.cases import cold_copies, compare, decode
from rocm_mla.cases.decode import SM_SCALE as SCALE
from rocm_mla.cases.decode import DecodeInputs, DecodeShape
from rocm_mla.mla_dims import KV_LORA_RANK as L
from rocm_mla.mla_dims import KV_ROW_DIM as D
from rocm_mla.mla_dims import QK_ROPE_HEAD_DIM as R_DIM
from rocm_mla.reference import mla_decode_ref
from rocm_mla.tools.timing import cold_cache_bytes, rotating_graph_us, time_ms

DTYPE = torch.bfloat16  # q's and out's dtype (and a 16-bit cache's)
CHECK_REQUESTS = 2  # every timed output is checked on its first requests against float32

# --preset -> the rocm_mla.cases.decode shape set it runs.
PRESETS = {"flashmla": "sweep", "quick": "sweep-quick", "serving": "serving"}


class Setup:
    """One shape's inputs (``case``: rocm_mla.cases.decode, R cache copies over 3 x the cold-cache
    bytes, table as wide as the longest request) and what the peers read of them."""

    def __init__(self, shape: DecodeShape, dev: torch.device, cold_bytes: int, dtype: torch.dtype | None = None):
        dtype = dtype or DTYPE
        self.shape, self.dtype = shape, dtype
        self.R, self.cold = cold_copies(shape.set_bytes(dtype), cold_bytes)
        self.case: DecodeInputs = decode.make_inputs(shape, dtype=dtype, device=dev, copies=self.R, spare_cols=0)
        c = self.case
        self.B, self.seq, self.N, self.q_len, self.block = shape.B, shape.seq, shape.N, shape.q_len, shape.block
        self.rows, self.fp8, self.label = shape.rows, shape.fp8, shape.label(dtype)
        self.ql_nope, self.q_pe, self.seq_lens, self.k_scale = c.q_nope, c.q_pe, c.seq_lens, c.k_scale
        self.caches, self.tables = c.paged.caches, c.paged.tables  # typed (fp8: the e4m3 kind)
        self.dev = dev

    def nbytes(self) -> float:
        return self.shape.nbytes(self.dtype)

    def flops(self) -> float:
        return self.shape.flops()


# --------------------------------------------------------------------------- providers


def ours(s: Setup, fp8_dots: str | None = None):
    """``call(i)``: mla_decode (Triton) on cache copy i as vLLM hands it over (an fp8 cache as uint8
    storage, kv_cache_dtype "fp8"), max_seq_len as vLLM has it on the host; ``fp8_dots``: that mode
    (fp8 caches), else the op's default."""
    kw = {} if fp8_dots is None else {"fp8_dots": fp8_dots}

    def call(i: int):
        s.case.run(i, max_seq_len=s.seq, backend="triton", **kw)
        return s.case.out

    return call


def vllm(s: Setup, decode_attention_fwd, sm_count: int):
    """(call, "") running TRITON_MLA's decode as forward_mqa does; (None, reason) when it cannot
    run the shape (it takes one query row per request)."""
    if s.q_len > 1:
        return None, "q_len > 1 (TRITON_MLA decodes one row per request)"
    S = vllm_num_kv_splits(s.seq, sm_count)
    attn_logits = torch.empty(s.B, s.N, S, L + 1, dtype=torch.float32, device=s.dev)
    scale = s.k_scale if s.fp8 else torch.ones(1, device=s.dev)  # layer._k_scale is a tensor

    def call(i: int):
        return vllm_triton_mla_decode(
            decode_attention_fwd, s.ql_nope, s.q_pe, s.caches[i], s.tables[i], s.seq_lens, attn_logits, SCALE, scale
        )

    return call, ""


def aiter(s: Setup, mod, sm_count: int):
    """aiter's Triton MLA decode (``decode_attention_fwd_grouped_rope``, rope off), as vLLM's ROCm
    Triton MLA path calls it: q pre-concatenated (not timed), the paged cache seen as token rows
    through ``kv_indices`` (page x block + offset, built outside the timing), the MI300X JSON
    config without its AMD-only options on NVIDIA, vLLM's split rule. (None, reason) when it
    cannot run the shape."""
    if mod is None:
        return None, "not loaded"
    if s.fp8 or s.q_len > 1:
        return None, "bf16 cache and q_len 1 only"
    from rocm_mla.triton_common import without_amd_options

    dev = s.dev
    S = vllm_num_kv_splits(s.seq, sm_count)
    q_full = torch.cat((s.ql_nope, s.q_pe), dim=-1).contiguous()
    o = torch.empty(s.B, s.N, L, dtype=torch.bfloat16, device=dev)
    logits = torch.empty(s.B, s.N, S, L + 1, dtype=torch.float32, device=dev)
    indptr = torch.arange(s.B + 1, dtype=torch.int32, device=dev) * s.seq
    offs = torch.arange(s.seq, device=dev)
    indices = [(t[:, offs // s.block].long() * s.block + offs % s.block).reshape(-1).to(torch.int32) for t in s.tables]
    from aiter.ops.triton._triton_kernels.mla_decode_rope import _get_config

    cfg = _get_config()
    if torch.version.hip is None:
        cfg = {k: without_amd_options(v) for k, v in cfg.items()}

    def call(i: int):
        k_buf = s.caches[i].view(-1, 1, D)
        mod.decode_attention_fwd_grouped_rope(
            q_full,
            k_buf,
            k_buf[..., :L],
            o,
            indptr,
            indices[i],
            None,
            L,
            R_DIM,
            None,
            None,
            logits,
            S,
            SCALE,
            config={k: dict(v) for k, v in cfg.items()},
        )
        return o

    return call, ""


def flashinfer(s: Setup):
    """FlashInfer's fa3 MLA decode, planned here (host work, untimed); None plus a reason when it
    cannot run. MTP rows: qo_indptr steps by q_len, causal (bottom-right, as ours)."""
    try:
        import flashinfer as fi
        from flashinfer.mla import MLAPlanMetadata
    except Exception as exc:
        return None, f"not importable ({type(exc).__name__})"
    try:
        dev = s.dev
        ws = torch.empty(256 << 20, dtype=torch.int8, device=dev)
        blocks = s.tables[0].shape[1]
        q_full = torch.cat((s.ql_nope, s.q_pe), dim=-1).contiguous()
        wrappers = []
        for i in range(s.R):
            w = fi.mla.BatchMLAPagedAttentionWrapper(ws if i == 0 else torch.empty_like(ws), backend="fa3")
            md = MLAPlanMetadata.csr(
                qo_indptr=torch.arange(s.B + 1, dtype=torch.int32, device=dev) * s.q_len,
                kv_indptr=torch.arange(s.B + 1, dtype=torch.int32, device=dev) * blocks,
                kv_indices=s.tables[i].reshape(-1),
                kv_len_arr=s.seq_lens,
            )
            w.plan(
                metadata=md,
                num_heads=s.N,
                head_dim_ckv=L,
                head_dim_kpe=R_DIM,
                page_size=s.block,
                causal=s.q_len > 1,
                sm_scale=SCALE,
                q_data_type=torch.bfloat16,
                kv_data_type=s.caches[i].dtype,
            )
            wrappers.append(w)
            if s.R > 8 and i >= 7:  # planning is slow and workspaces are big: reuse beyond 8
                break
        out = torch.empty(s.rows, s.N, L, dtype=torch.bfloat16, device=dev)
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


def check(name: str, got: torch.Tensor, s: Setup, ref: tuple) -> str:
    """'' when ``got``'s first CHECK_REQUESTS requests agree with the float32 reference ``ref``
    under rocm_mla.cases.decode.TOLERANCE, else the table's note."""
    ro = ref[0]
    problem = compare("out", got[: ro.shape[0]], ro, decode.TOLERANCE[s.dtype]["out"]).problem
    return f"  {name} {s.label}: WRONG ({problem})" if problem else ""


def shape_list(preset: str, kinds: list[str]) -> list[DecodeShape]:
    """The preset's shapes whose cache kind ("bf16" for a cache in q's dtype, "fp8") is in ``kinds``."""
    return [sh for sh in decode.SHAPES[PRESETS[preset]] if ("fp8" if sh.fp8 else "bf16") in kinds]


# Our fp8_dots modes on fp8 caches (rounded q, and p): each checked against the unrounded float32
# reference under cases.decode.FP8_DOTS_ACCURACY, the accuracy it trades.
LOSSY = {"rocm_mla-triton-fp8qk": "qk", "rocm_mla-triton-fp8all": "all"}
PROVIDERS = ["rocm_mla-triton", *LOSSY, "flashinfer-fa3", "vllm-0.33-triton", "aiter-triton", "torch-reference"]


class Run:
    """What one benchmark run accumulates: table rows, CSV records, notes."""

    def __init__(self, name: str, copy: float, mm: float):
        self.name, self.copy, self.mm = name, copy, mm
        self.records: list[Record] = [
            Record("copy", "torch", "2 GiB", "GB/s", copy, name, torch.__version__),
            Record("matmul", "torch", "8192^3 bf16", "TFLOP/s", mm, name, torch.__version__),
        ]
        self.rows: list[list[str]] = []
        self.notes: list[str] = []
        self.skipped: set[tuple[str, str]] = set()

    def skip(self, provider: str, s: Setup, why: str) -> None:
        if (provider, why) not in self.skipped:
            self.skipped.add((provider, why))
            self.notes.append(f"  {provider} skipped ({s.label} and alike): {why}")

    def add(self, provider: str, s: Setup, us: float | None, config: str = "") -> str:
        if us is None:
            return "-"
        gbs, tfs = s.nbytes() / us / 1e3, s.flops() / us / 1e6
        for metric, val in (
            ("time_us", us),
            ("GB/s", gbs),
            ("pct_copy", 100 * gbs / self.copy),
            ("TFLOP/s", tfs),
            ("pct_matmul", 100 * tfs / self.mm),
        ):
            self.records.append(Record("mla_decode", provider, s.label, metric, val, self.name, __version__, config))
        return f"{us:.1f}us {gbs:.0f}GB/s ({100 * gbs / self.copy:.0f}%) {tfs:.0f}TF ({100 * tfs / self.mm:.0f}%)"


def time_checked(run: Run, provider: str, fn, s: Setup, ref: tuple) -> float | None:
    """Check the output against float32 first (ours: out and lse), then time; None (noted) on error."""
    try:
        got = fn(0)
        torch.cuda.synchronize()
        if provider == "rocm_mla-triton" or provider in LOSSY:
            tol = decode.FP8_DOTS_ACCURACY[LOSSY[provider]] if provider in LOSSY else None
            problem = s.case.mismatch(ref=ref, tol=tol)
            bad = f"  {provider} {s.label}: WRONG ({problem})" if problem else ""
        else:
            bad = check(provider, got, s, ref)
        if bad:
            run.notes.append(bad)
        return rotating_graph_us(fn, s.R)
    except Exception as exc:  # report, keep benchmarking the rest
        run.notes.append(f"  {provider} {s.label}: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def bench_shape(run: Run, s: Setup, dev, peers: dict, sms: int) -> None:
    plan = s.case.plan(dev, max_seq_len=s.seq)
    cfg = plan.config
    row = [
        s.label,
        f"S={plan.num_splits} H{cfg['BLOCK_H']}x{plan.head_blocks} N{cfg['BLOCK_N']} "
        f"w{cfg['num_warps']} s{cfg['num_stages']}",
    ]
    fns = {"rocm_mla-triton": (ours(s), "")}
    if s.fp8:
        fns.update({p: (ours(s, mode), "") for p, mode in LOSSY.items()})
    if "vllm" in peers:
        fns["vllm-0.33-triton"] = vllm(s, peers["vllm"], sms)
    if "flashinfer" in peers:
        fns["flashinfer-fa3"] = flashinfer(s)
    if "aiter" in peers:
        fns["aiter-triton"] = aiter(s, peers["aiter"], sms)
    ref = s.case.reference(CHECK_REQUESTS)
    times: dict[str, float] = {}
    for p in PROVIDERS:
        us = None
        if p == "torch-reference":
            if s.B * s.seq <= 32 * 4096:
                us = 1e3 * time_ms(
                    lambda: mla_decode_ref(s.ql_nope, s.q_pe, s.caches[0], s.tables[0], s.seq_lens, SCALE, s.k_scale),
                    rep_ms=200,
                )
        elif p in fns:
            fn, why = fns[p]
            if fn is None:
                run.skip(p, s, why)
            else:
                us = time_checked(run, p, fn, s, ref)
        if us is not None:
            times[p] = us
        row.append(run.add(p, s, us, row[1] if p == "rocm_mla-triton" else ""))
    ours_us = times.get("rocm_mla-triton")
    for peer in ("flashinfer-fa3", "vllm-0.33-triton", "aiter-triton"):
        if ours_us and peer in times:
            run.records.append(
                Record(
                    "mla_decode",
                    "rocm_mla-triton",
                    s.label,
                    f"speed_vs_{peer}",
                    times[peer] / ours_us,
                    run.name,
                    __version__,
                )
            )
    row.append(f"{times['flashinfer-fa3'] / ours_us:.2f}x" if ours_us and "flashinfer-fa3" in times else "-")
    row.append(f"{times['vllm-0.33-triton'] / ours_us:.2f}x" if ours_us and "vllm-0.33-triton" in times else "-")
    run.records.append(
        Record("mla_decode", "rocm_mla-triton", s.label, "num_kv_splits", plan.num_splits, run.name, __version__)
    )
    if fns.get("vllm-0.33-triton", (None,))[0] is not None:  # the split count TRITON_MLA ran with
        vllm_S = vllm_num_kv_splits(s.seq, sms)
        run.records.append(
            Record("mla_decode", "vllm-0.33-triton", s.label, "num_kv_splits", vllm_S, run.name, __version__)
        )
    run.rows.append(row)
    print(" | ".join(row), flush=True)


def report(run: Run, out_dir: Path) -> None:
    print(
        f"\nmla_decode (q bf16, block 64, CUDA-graph replay, cold caches): per call time, GB/s (% of the "
        f"{run.copy:.0f} GB/s copy ceiling), TFLOP/s (% of {run.mm:.0f} bf16 matmul)"
    )
    print_table(["shape", "rocm_mla plan", *PROVIDERS, "FI/ours", "vLLM/ours"], run.rows)
    for n in run.notes:
        print(n)
    write_csv(out_dir / "decode.csv", run.records)
    print(f"wrote {out_dir / 'decode.csv'}")


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for decode.csv")
    ap.add_argument("--peers", default=".peers", help="folder made by get_vllm_peers.sh (aiter under PEERS/aiter)")
    ap.add_argument(
        "--preset",
        default="flashmla",
        choices=["flashmla", "quick", "serving"],
        help="shape set: rocm_mla.cases.decode.SHAPES[PRESETS[preset]]",
    )
    ap.add_argument("--quick", action="store_true", help="= --preset quick")
    ap.add_argument("--dtypes", default="bf16,fp8", help="cache dtypes, comma-separated: bf16, fp8")
    ap.add_argument("--no-flashinfer", action="store_true", help="skip the FlashInfer peer")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM peer")
    ap.add_argument("--no-aiter", action="store_true", help="skip the aiter peer")
    ap.add_argument(
        "--shapes",
        default="",
        help="only shapes whose label contains one of these (';'-separated, e.g. 'bf16 B=128 seq=4096 N=16;q2')",
    )
    args = ap.parse_args()
    gpu = start_bench("bench_decode", copy=True, matmul=True)
    if gpu is None:
        return 2
    dev, name, copy, mm = gpu.dev, gpu.name, gpu.copy_gbs, gpu.matmul_tflops
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    l2 = int(getattr(props, "L2_cache_size", 50 << 20) or (50 << 20))
    cold = cold_cache_bytes(dev)  # what the input copies together exceed (x3)
    print(
        f"device: {name} ({sms} SMs/CUs, L2 {l2 >> 20} MiB, cold-cache sets > 3 x {cold >> 20} MiB); "
        f"copy ceiling {copy:.0f} GB/s (read+write); "
        f"bf16 matmul {mm:.0f} TFLOP/s; torch {torch.__version__} triton {triton.__version__}"
    )
    peers: dict = {}
    if not args.no_vllm:
        fwd = load_vllm_peer(args.peers, "triton_decode_attention", "decode_attention_fwd")
        if fwd is not None:
            peers["vllm"] = fwd
    if not args.no_flashinfer:
        peers["flashinfer"] = True
    if not args.no_aiter:
        mod = load_aiter_peer(str(Path(args.peers) / "aiter"), "mla_decode_rope")
        if mod is not None:
            peers["aiter"] = mod
            print(f"aiter peer: amd-aiter {aiter_peer_version(str(Path(args.peers) / 'aiter'))}")

    shape_filter = [f.strip() for f in args.shapes.split(";") if f.strip()]
    kinds = [k.strip() for k in args.dtypes.split(",") if k.strip()]
    run = Run(name, copy, mm)
    for shape in shape_list("quick" if args.quick else args.preset, kinds):
        if shape_filter and not any(f in shape.label(DTYPE) for f in shape_filter):
            continue
        s = Setup(shape, dev, cold)
        if not s.cold:
            mib = shape.set_bytes(DTYPE) * s.R >> 20
            print(f"  note: {s.label}: {s.R} copies ({mib} MiB) stay under 3 x {cold >> 20} MiB: not all from HBM")
        bench_shape(run, s, dev, peers, sms)
        del s
        torch.cuda.empty_cache()
    report(run, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
