#!/usr/bin/env python3
"""Benchmark the lightning indexer's ops (sparse MLA: DeepSeek-V3.2, GLM-5.x), mla_indexer_topk and
indexer_k_cache_write, against what vLLM 0.34's ROCm path runs without aiter: time per call, GB/s and
% of the copy ceiling measured in the same run, every timed output checked.

    python perf/bench_indexer.py [--out results] [--peers .peers] [--preset bench|quick]
                                 [--shapes 'LABEL;...'] [--configs JSON] [--no-vllm]

Shapes: mla_indexer_topk on rocm_mla.cases.indexer_topk.SHAPES[preset] (H 64 and 32, decode 1 / 32 /
128 requests x 1 and 2 rows at 8K, 32K and 128K keys, 256 requests at 8K and 32K, 32 requests x 4
rows, a prefill chunk of 8192 rows over 32K keys; topk 2048, block 64, q fp8 with the platform's
kind, the cache in vLLM's ROCm layout: 16 x 16 shuffled values, float32 scales; and DeepSeek-V4's
CSA indexer, labelled "c4": top-512 and top-1024 over 8K and 32K compressed keys -- "ctx" counts
them -- in flat rows of e4m3fn values, as vLLM's compressor writes them); indexer_k_cache_write on
rocm_mla.cases.indexer_cache.SHAPES["bench"] (T = 1, 64, 4K, 32K keys, block 64, bf16 k, UE8M0
scales; --preset quick: 64 and 32K).

Counted per call (the same for every provider):
  mla_indexer_topk       bytes = IndexerShape.nbytes(): 132 per visible key per row (the index
                         cache read), q, weights and the answer; the prefill chunk's rows re-read
                         one request's 4 MB of keys: mostly from L2 by nature (GB/s past the copy
                         ceiling there says so).
  indexer_k_cache_write  bytes = IndexerCacheShape.nbytes(bf16): k read, 132 written, the slot.

Providers, mla_indexer_topk (CUDA graphs of 8 calls rotating over cache copies larger than 3 x the
L2, benchutil.rotating_graph_us, where the copies' bytes allow; "partly from L2" noted otherwise):
  rocm_mla-triton         mla_indexer_topk(...) with a plan made once outside the timing (its
                          group_rows a request's rows at the MTP shapes, as the vLLM backend
                          plans; the arch's config caps it) and a
                          preallocated workspace (plan.workspace_bytes); out checked on its first
                          CHECK_ROWS rows against float64 logits (IndexerInputs.mismatch).
  vllm-0.34-triton+topk   decode and MTP rows: rocm_fp8_paged_mqa_logits_triton (vLLM's Triton
                          decode logits, [T, max_model_len] float32 into its workspace buffer) then
                          torch.topk(logits, topk), timed together. vLLM's ROCm decode without
                          aiter runs its torch reference for a shuffled cache (this Triton kernel
                          serves its block-flat caches), and its top-k is vLLM's own CUDA op
                          (top_k_per_row_decode); torch.topk stands in. The kernel reads
                          block-flat values: it gets each cache copy with the same bytes
                          unshuffled (vLLM's _unshuffle_indexer_k_values, made outside the timing:
                          the same keys, scales untouched). Its logits buffer is filled with -inf
                          once (the kernel writes only each row's [0, kv_len)), so torch.topk
                          ranks a row's keys alone. Checked: column indices -> positions, -1
                          where kv_len < topk (vllm_positions), then IndexerInputs.mismatch.
  vllm-0.34-torch+topk    prefill rows: vLLM's ROCm prefill without aiter, one chunk:
                          cp_gather_indexer_k_quant_cache_triton (gathers the rows' keys from the
                          shuffled cache into [keys, 128] fp8 + scales), fp8_mqa_logits_torch (q
                          and k in bfloat16, [rows, keys] float32 logits, -inf outside a row's
                          [start, end)), then torch.topk in place of vLLM's top_k_per_row_prefill.
                          vLLM sizes a chunk's rows to 512 MB of logits; its torch path holds
                          [H, rows, keys] intermediates (about 14 bytes each), so the rows are cut
                          further to fit PREFILL_TORCH_BYTES. Timed eagerly (benchutil.time_ms:
                          each call runs long, its launches do not count). Checked like the
                          decode peer with rtol PREFILL_RTOL: its bfloat16 dot products round
                          the logits at 2^-9.
Providers, indexer_k_cache_write (rotating graphs over R input sets):
  rocm_mla-triton         indexer_k_cache_write(k, cache, slots, scale_fmt="ue8m0"); the cache's
                          bytes checked equal to the reference's (IndexerCacheInputs.mismatch).
  vllm-0.34-triton        indexer_k_quant_and_cache_triton, vLLM's ROCm insert (shuffled above
                          block 1), on k made contiguous outside the timing (its kernel reads rows
                          head_dim apart) and the slots with the ones past the cache set to -1 (it
                          writes them unchecked; ours skips them). Its bytes are compared with the
                          reference too.

A peer whose output differs from the reference is noted, its time kept; our outputs failing their
check print WRONG (perf/bench.py then fails the run). A provider that cannot run prints "skipped
(...): why", and the others carry on. The vLLM peers come from perf/peers/get_vllm_sparse_peers.sh
PEERS (PEERS/vllm_sparse/rocm_indexer.py: torch and triton alone, no vllm import).

Targets printed at the end: ours >= 1.3x the vLLM composition at every decode shape; >= 80% of the
copy ceiling at every decode shape of >= 32 rows x >= 32K keys (bytes counted per row, so rows that
share a request's keys can pass 100%); the lone row of 128K keys at <= 40 us (an H200's figure).
Memory: every shape's copies (and the decode peer's block-flat copies) stay under COPIES_BYTES, then
are freed; the largest shape, 128 x 128K keys x 132 B = 2.2 GB a copy, gets one.

--configs: a JSON list of mla_indexer_topk launch configs (as configs/mla_indexer_topk.json's arch
entries) timed beside the default as ``rocm_mla-triton[k]`` (a sweep).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
from benchutil import Record, bench_parser, print_table, start_bench, write_csv

from rocm_mla import __version__
from rocm_mla.cases import cold_copies
from rocm_mla.cases import indexer_cache as write_cases
from rocm_mla.cases import indexer_topk as topk_cases
from rocm_mla.cases.indexer_cache import IndexerCacheInputs, IndexerCacheShape
from rocm_mla.cases.indexer_topk import IndexerInputs, IndexerShape
from rocm_mla.reference.indexer import INDEX_HEAD_DIM
from rocm_mla.reference.indexer_topk import check_indexer_topk
from rocm_mla.tools.timing import cold_cache_bytes, rotating_graph_us, time_ms

KERNEL = "mla_indexer_topk"
WRITE_KERNEL = "indexer_k_cache_write"
CHECK_ROWS = 4  # every timed output is checked on its first rows
COPIES_CAP = 64  # cache copies per shape at most (cold_copies)
COPIES_BYTES = 16 << 30  # all copies of one shape, the decode peer's block-flat ones included
PREFILL_TORCH_BYTES = 8 << 30  # the vLLM torch prefill path's [H, rows, keys] intermediates per piece
PREFILL_TORCH_ELEM = 14  # bytes per [H, rows, keys] element it holds at once (bf16 dots, 3 float32 temporaries)
VLLM_LOGITS_BYTES = 512 << 20  # vLLM's VLLM_SPARSE_INDEXER_MAX_LOGITS_MB default: rows per prefill chunk
PREFILL_RTOL = 1e-2  # the torch prefill peer's check: bf16 dots round each head's score at 2^-9
MAX_DECODE_ROWS = 8  # rows per request the decode peer takes (vLLM's decode threshold: 1 + draft tokens)
OURS = "rocm_mla-triton"
DECODE_PEER = "vllm-0.34-triton+topk"
PREFILL_PEER = "vllm-0.34-torch+topk"
WRITE_PEER = "vllm-0.34-triton"
PEERS = [DECODE_PEER, PREFILL_PEER]


def write_shapes(preset: str) -> list[IndexerCacheShape]:
    """The write op's shapes of a preset (its cases hold one list, "bench"; quick takes two)."""
    shapes = write_cases.SHAPES["bench"]
    return [s for s in shapes if s.T in (64, 32768)] if preset == "quick" else list(shapes)


def vllm_positions(idx: torch.Tensor, kv_lens: torch.Tensor, topk: int, starts: torch.Tensor | None = None):
    """torch.topk's column indices over vLLM's logits ``[T, k]`` (k <= topk) as mla_indexer_topk
    answers: request-local positions (``idx - starts``; decode logits start at position 0), an
    index outside the row's ``[0, kv_lens[t])`` (a -inf column, taken where kv_len < k) -> -1,
    the valid ones first in ascending order (a top-k is a set; the order is the one the op gives
    and its check asks for), then -1 up to ``topk`` columns. int32 ``[T, topk]``."""
    idx = idx.long()
    if starts is not None:
        idx = idx - starts.long()[:, None]
    n = kv_lens.long().to(idx.device)[:, None]
    valid = (idx >= 0) & (idx < n)
    last = torch.iinfo(torch.int64).max
    pos = torch.sort(torch.where(valid, idx, last), dim=1).values
    pos = torch.where(pos == last, -1, pos)
    if pos.shape[1] < topk:
        pos = torch.cat((pos, pos.new_full((pos.shape[0], topk - pos.shape[1]), -1)), dim=1)
    return pos.to(torch.int32)


def is_decode(shape: IndexerShape) -> bool:
    """Rows the decode peer takes: every request the same few rows (``[B, next_n]`` queries)."""
    return len(set(shape.rows)) == 1 and 0 < shape.rows[0] <= MAX_DECODE_ROWS


def load_vllm_indexer(peers: str):
    """vLLM 0.34's indexer functions (perf/peers/get_vllm_sparse_peers.sh: rocm_indexer.py); None
    with the reason printed when missing."""
    folder = Path(peers, "vllm_sparse")
    if not (folder / "rocm_indexer.py").is_file():
        print(
            f"vLLM indexer peers unavailable: no {folder}/rocm_indexer.py "
            f"(run perf/peers/get_vllm_sparse_peers.sh {peers})"
        )
        return None
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    try:
        import rocm_indexer

        return rocm_indexer
    except Exception as exc:
        print(f"vLLM indexer peers unavailable: {type(exc).__name__}: {exc}")
        return None


# --------------------------------------------------------------------------- mla_indexer_topk


def copies_for(shape: IndexerShape, cold_bytes: int, flat_copies: bool) -> tuple[int, bool]:
    """(R, cold): cache copies of ``shape`` over 3 x ``cold_bytes`` (cold_copies, at most
    COPIES_CAP), cut to COPIES_BYTES together with the decode peer's block-flat copies
    (``flat_copies``); ``cold`` False when they stay short of 3 x cold_bytes."""
    per_copy = shape.set_bytes() * (2 if flat_copies else 1)
    R, cold = cold_copies(shape.set_bytes(), cold_bytes, cap=COPIES_CAP)
    kept = max(1, min(R, COPIES_BYTES // max(per_copy, 1)))
    return kept, cold and kept == R


class Setup:
    """One shape's inputs (rocm_mla.cases.indexer_topk, R cache copies) and the label."""

    def __init__(self, shape: IndexerShape, dev: torch.device, cold_bytes: int, flat_copies: bool):
        self.shape = shape
        self.R, self.cold = copies_for(shape, cold_bytes, flat_copies)
        self.case: IndexerInputs = topk_cases.make_inputs(shape, device=dev, copies=self.R)
        self.label = shape.label()
        self.dev = dev

    def check(self, out: torch.Tensor, rtol: float | None = None) -> str:
        if rtol is None:
            return self.case.mismatch(out, rows=CHECK_ROWS)
        r = min(CHECK_ROWS, self.shape.T)
        return check_indexer_topk(out[:r], self.case.logits(r), self.shape.topk, rtol=rtol)


def decode_rows(shape: IndexerShape) -> int:
    """The rows every request has when they are decode or MTP rows, else 1: the ``group_rows`` the
    vLLM backend plans with (``rocm_mla.vllm.sparse_layer.decode_group_rows``)."""
    return shape.rows[0] if is_decode(shape) else 1


def ours(s: Setup, config: dict | None = None):
    """``(call, plan)``: the op with a plan made once (as a serving step makes it for every layer,
    with its rows a decode request as ``group_rows``) and its workspace preallocated."""
    plan = s.case.plan(config=config, backend="triton", group_rows=decode_rows(s.shape))
    ws = torch.empty(plan.workspace_numel, dtype=torch.int32, device=s.dev) if plan.workspace_numel else None

    def call(i: int):
        s.case.run(i, plan=plan, workspace=ws)
        return s.case.out

    return call, plan


def vllm_decode(s: Setup, mod):
    """(call, check, "") for rocm_fp8_paged_mqa_logits_triton + torch.topk; (None, None, why)."""
    shape, c = s.shape, s.case
    if not is_decode(shape):
        return None, None, f"decode and MTP rows only (<= {MAX_DECODE_ROWS} a request)"
    bs = c.caches[0].shape[1]
    if bs % 64:
        return None, None, f"its kernel takes pages of a multiple of 64 tokens, not {bs}"
    B, nn, T, k = len(shape.lens), shape.rows[0], shape.T, shape.topk
    mml = c.tables[0].shape[1] * bs
    if k > mml:
        return None, None, f"topk {k} > max_model_len {mml}"
    mod.FP8_DTYPE = c.fp8
    flat = []
    for cache in c.caches:
        if not c.shuffled:
            flat.append(cache)
            continue
        f = cache.clone()
        nb = f.shape[0]
        vals = f.view(nb, -1)[:, : bs * INDEX_HEAD_DIM]
        vals.copy_(mod._unshuffle_indexer_k_values(cache.view(nb, -1)[:, : bs * INDEX_HEAD_DIM], bs, INDEX_HEAD_DIM))
        flat.append(f)
    q4 = c.q.view(B, nn, shape.H, INDEX_HEAD_DIM)
    lens = torch.tensor(shape.lens, dtype=torch.int32, device=s.dev)
    (logits,) = mod.current_workspace_manager().get_simultaneous(((T, mml), torch.float32))
    logits.fill_(float("-inf"))
    vals = torch.empty(T, k, dtype=torch.float32, device=s.dev)
    idx = torch.empty(T, k, dtype=torch.int64, device=s.dev)

    def call(i: int):
        lg = mod.rocm_fp8_paged_mqa_logits_triton(q4, flat[i], c.weights, lens, c.tables[i], mml)
        torch.topk(lg, k, dim=1, out=(vals, idx))
        return idx

    def check(got):
        return s.check(vllm_positions(got, c.kv_lens[:T], k))

    return call, check, ""


def prefill_rows(shape: IndexerShape, keys: int) -> int:
    """Rows per piece of the torch prefill peer: vLLM's 512 MB of logits, cut to PREFILL_TORCH_BYTES
    of [H, rows, keys] intermediates."""
    vllm_rows = max(1, VLLM_LOGITS_BYTES // (4 * max(1, keys)))
    return max(1, min(vllm_rows, PREFILL_TORCH_BYTES // (PREFILL_TORCH_ELEM * shape.H * max(1, keys))))


def vllm_prefill(s: Setup, mod):
    """(call, check, "") for cp_gather + fp8_mqa_logits_torch + torch.topk; (None, None, why)."""
    shape, c = s.shape, s.case
    if is_decode(shape):
        return None, None, "prefill rows only (decode rows: the decode peer)"
    T, dev = shape.T, s.dev
    mod.FP8_DTYPE = c.fp8
    lens = torch.tensor(shape.lens, dtype=torch.int64, device=dev)
    cu = torch.zeros(len(shape.lens) + 1, dtype=torch.int32, device=dev)
    cu[1:] = torch.cumsum(lens, 0).to(torch.int32)
    keys = int(sum(shape.lens))
    if keys == 0:
        return None, None, "no keys"
    t2s = torch.repeat_interleave(torch.arange(len(shape.lens), dtype=torch.int32, device=dev), lens)
    k_fp8 = torch.empty(keys, INDEX_HEAD_DIM, dtype=c.fp8, device=dev)
    k_scale = torch.empty(keys, 4, dtype=torch.uint8, device=dev)
    starts = cu[c.req_ids[:T].long()]
    ends = starts + c.kv_lens[:T]
    k = min(shape.topk, keys)
    vals = torch.empty(T, k, dtype=torch.float32, device=dev)
    idx = torch.empty(T, k, dtype=torch.int64, device=dev)
    m = min(T, prefill_rows(shape, keys))

    def call(i: int):
        mod.cp_gather_indexer_k_quant_cache_triton(c.caches[i], k_fp8, k_scale, c.tables[i], cu, t2s)
        kv = (k_fp8, k_scale.view(torch.float32))
        for r0 in range(0, T, m):
            r1 = min(T, r0 + m)
            lg = mod.fp8_mqa_logits_torch(c.q[r0:r1], kv, c.weights[r0:r1], starts[r0:r1], ends[r0:r1])
            torch.topk(lg, k, dim=1, out=(vals[r0:r1], idx[r0:r1]))
        return idx

    def check(got):
        return s.check(vllm_positions(got, c.kv_lens[:T], shape.topk, starts), rtol=PREFILL_RTOL)

    return call, check, f"{-(-T // m)} pieces of {m} rows"


# --------------------------------------------------------------------------- timing


class Run:
    """Table rows, CSV records and notes of one run."""

    def __init__(self, name: str, copy: float):
        self.name, self.copy = name, copy
        self.records: list[Record] = [Record("copy", "torch", "2 GiB", "GB/s", copy, name, torch.__version__)]
        self.rows: list[list[str]] = []
        self.write_rows: list[list[str]] = []
        self.notes: list[str] = []
        self.targets: list[str] = []
        self.skipped: set[tuple[str, str]] = set()

    def skip(self, provider: str, label: str, why: str) -> None:
        if (provider, why) not in self.skipped:
            self.skipped.add((provider, why))
            self.notes.append(f"  {provider} skipped ({label} and alike): {why}")

    def add(self, kernel: str, provider: str, label: str, nbytes: float, us: float | None, config: str = "") -> str:
        if us is None:
            return "-"
        gbs = nbytes / us / 1e3
        for metric, val in (("time_us", us), ("GB/s", gbs), ("pct_copy", 100 * gbs / self.copy)):
            self.records.append(Record(kernel, provider, label, metric, val, self.name, __version__, config))
        return f"{us:.1f}us {gbs:.0f}GB/s ({100 * gbs / self.copy:.0f}%)"

    def speedups(self, kernel: str, label: str, times: dict[str, float], peers: list[str]) -> None:
        ours_us = times.get(OURS)
        for p in peers:
            if ours_us and p in times:
                self.records.append(
                    Record(kernel, OURS, label, f"speed_vs_{p}", times[p] / ours_us, self.name, __version__)
                )


def time_checked(run: Run, provider: str, label: str, fn, check, timer, ours_: bool) -> float | None:
    """One call, its check (ours: WRONG on failure; a peer: noted), then the timer; None (noted)
    on error."""
    try:
        got = fn(0)
        torch.cuda.synchronize()
        problem = check(got)
        if problem and ours_:
            run.notes.append(f"  {provider} {label}: WRONG ({problem})")
        elif problem:
            run.notes.append(f"  {provider} {label}: differs from the reference ({problem})")
        return timer(fn)
    except Exception as exc:  # report, keep benchmarking the rest
        run.notes.append(f"  {provider} {label}: {type(exc).__name__}: {str(exc)[:300]}")
        return None


def plan_label(plan) -> str:
    c = plan.config
    pack = f" pack{c['select_pack']}" if c.get("select_pack", 1) > 1 else ""
    return (
        f"S={plan.num_splits}x{plan.split_keys}{' prefiltered' if plan.prefiltered else ''} N{c['BLOCK_N']}"
        f" w{c['num_warps']} s{c['num_stages']} {c['programs_per_cu']}/CU{pack}"
    )


def bench_shape(run: Run, s: Setup, mod, extra: list[dict]) -> list[str]:
    shape, label = s.shape, s.label
    rotating = lambda f: rotating_graph_us(f, s.R)  # noqa: E731
    eager = lambda f: time_ms(lambda: f(0)) * 1e3  # noqa: E731
    fns: dict[str, tuple] = {}
    plan = None
    try:
        fn, plan = ours(s)
        fns[OURS] = (fn, lambda out: s.check(out), rotating, "")
    except Exception as exc:
        fns[OURS] = (None, None, None, f"{type(exc).__name__}: {str(exc)[:200]}")
    for k, cfg in enumerate(extra):
        try:
            fns[f"{OURS}[{k}]"] = (ours(s, cfg)[0], lambda out: s.check(out), rotating, "")
        except Exception as exc:
            fns[f"{OURS}[{k}]"] = (None, None, None, f"{type(exc).__name__}: {str(exc)[:200]}")
    if mod is not None:
        for p, make, timer in ((DECODE_PEER, vllm_decode, rotating), (PREFILL_PEER, vllm_prefill, eager)):
            try:
                call, check, why = make(s, mod)
            except Exception as exc:
                call, check, why = None, None, f"{type(exc).__name__}: {str(exc)[:200]}"
            fns[p] = (call, check, timer, why)
            if call is not None and why:
                run.notes.append(f"  {p} {label}: {why}")
    times: dict[str, float] = {}
    cell: dict[str, str] = {}
    for p, (f, check, timer, why) in fns.items():
        us = None
        if f is None:
            run.skip(p, label, why)
        else:
            print(f"  {label}: {p} ...", flush=True)
            us = time_checked(run, p, label, f, check, timer, p.startswith(OURS))
        if us is not None:
            times[p] = us
        cell[p] = run.add(KERNEL, p, label, shape.nbytes(), us, plan_label(plan) if p == OURS and plan else "")
    run.speedups(KERNEL, label, times, [*PEERS, *(f"{OURS}[{k}]" for k in range(len(extra)))])
    ours_us = times.get(OURS)
    peer_us = min((times[p] for p in PEERS if p in times), default=None)
    ratio = f"{peer_us / ours_us:.2f}x" if ours_us and peer_us else "-"
    copy_us = shape.nbytes() / run.copy / 1e3
    targets(run, s, ours_us, peer_us, copy_us)
    for k in range(len(extra)):
        p = f"{OURS}[{k}]"
        if p in times and ours_us:
            print(f"  {label} {p} {json.dumps(extra[k])}: {times[p]:.1f} us ({ours_us / times[p]:.2f}x of default)")
    cells = [label, plan_label(plan) if plan else "-", *(cell.get(p, "-") for p in (OURS, *PEERS)), ratio]
    cells.append(f"{copy_us:.1f}us")
    print(" | ".join(cells), flush=True)
    return cells


def targets(run: Run, s: Setup, ours_us: float | None, peer_us: float | None, copy_us: float) -> None:
    """The goals' lines: >= 1.3x the vLLM composition at decode shapes; >= 80% of copy at >= 32 rows
    x >= 32K keys; the lone 128K row at <= 40 us."""
    shape, label = s.shape, s.label
    if ours_us is None:
        run.targets.append(f"  {label}: ours did not run")
        return
    parts = []
    decode = is_decode(shape)
    if peer_us is not None:
        r = peer_us / ours_us
        parts.append(f"vLLM/ours {r:.2f}x" + (f" (>= 1.3x: {'met' if r >= 1.3 else 'MISSED'})" if decode else ""))
    else:
        parts.append("vLLM/ours - (no peer time)")
    uniform = len(set(shape.lens)) == 1 and decode
    ctx = shape.lens[0] if shape.lens else 0
    pct = 100 * copy_us / ours_us
    parts.append(f"{pct:.0f}% of copy")
    if uniform and shape.T >= 32 and ctx >= 32768:
        parts[-1] += f" (>= 80%: {'met' if pct >= 80 else 'MISSED'})"
    if uniform and shape.T == 1 and ctx == 131072:
        parts.append(f"{ours_us:.1f} us (<= 40 us: {'met' if ours_us <= 40 else 'MISSED'})")
    run.targets.append(f"  {label}: " + "; ".join(parts))


# --------------------------------------------------------------------------- indexer_k_cache_write


class WriteSetup:
    """One write shape's R input sets (rocm_mla.cases.indexer_cache, seeds 0..R-1)."""

    def __init__(self, shape: IndexerCacheShape, dev: torch.device, cold_bytes: int):
        self.shape = shape
        self.label = shape.label
        one = write_cases.make_inputs(shape, device=dev)
        set_bytes = one.k.untyped_storage().nbytes() + one.cache_base.numel()
        R, self.cold = cold_copies(set_bytes, cold_bytes, cap=16)
        self.cases: list[IndexerCacheInputs] = [one] + [
            write_cases.make_inputs(shape, device=dev, seed=i) for i in range(1, R)
        ]
        self.R = R
        self.ref = one.reference()

    def check(self) -> str:
        return self.cases[0].mismatch(ref=self.ref)


def write_ours(w: WriteSetup):
    def call(i: int):
        w.cases[i].run(backend="triton")

    return call


def write_vllm(w: WriteSetup, mod):
    mod.FP8_DTYPE = w.cases[0].fp8
    if w.cases[0].shuffled != mod.indexer_k_cache_is_shuffled(w.shape.block):
        return None, "its layout rule differs from the shape's (shuffled given)"
    args = []
    for c in w.cases:
        n = c.index_cache.shape[0] * c.index_cache.shape[1]
        s = c.slot_mapping
        args.append((c.k.contiguous(), c.index_cache, torch.where((s >= 0) & (s < n), s, -1)))

    def call(i: int):
        k, cache, slots = args[i]
        mod.indexer_k_quant_and_cache_triton(k, cache, slots, INDEX_HEAD_DIM, w.shape.scale_fmt)

    return call, ""


def bench_write(run: Run, w: WriteSetup, mod) -> list[str]:
    label = w.label
    nbytes = w.shape.nbytes(w.cases[0].k.dtype)
    fns = {OURS: (write_ours(w), "")}
    if mod is not None:
        try:
            fns[WRITE_PEER] = write_vllm(w, mod)
        except Exception as exc:
            fns[WRITE_PEER] = (None, f"{type(exc).__name__}: {str(exc)[:200]}")

    def check(_):
        return w.check()

    times: dict[str, float] = {}
    cell: dict[str, str] = {}
    for p, (f, why) in fns.items():
        us = None
        if f is None:
            run.skip(p, label, why)
        else:
            print(f"  {label}: {p} ...", flush=True)
            w.cases[0].restore()  # the check reads what this provider alone wrote
            us = time_checked(run, p, label, f, check, lambda f: rotating_graph_us(f, w.R), p == OURS)
        if us is not None:
            times[p] = us
        cell[p] = run.add(WRITE_KERNEL, p, label, nbytes, us)
    run.speedups(WRITE_KERNEL, label, times, [WRITE_PEER])
    o, v = times.get(OURS), times.get(WRITE_PEER)
    cells = [label, cell.get(OURS, "-"), cell.get(WRITE_PEER, "-"), f"{v / o:.2f}x" if o and v else "-"]
    print(" | ".join(cells), flush=True)
    return cells


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for indexer.csv")
    ap.add_argument("--peers", default=".peers", help="folder with vllm_sparse/ (get_vllm_sparse_peers.sh)")
    ap.add_argument("--preset", default="bench", choices=("bench", "quick"), help="cases' SHAPES")
    ap.add_argument("--quick", action="store_true", help="= --preset quick")
    ap.add_argument("--shapes", default="", help="only shapes whose label contains one of these (';'-separated)")
    ap.add_argument("--configs", default="", help="JSON list of mla_indexer_topk configs timed beside the default")
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()
    gpu = start_bench("bench_indexer", copy=True)
    if gpu is None:
        return 2
    dev, name = gpu.dev, gpu.name
    cold = cold_cache_bytes(dev)
    print(
        f"device: {name}; copy ceiling {gpu.copy_gbs:.0f} GB/s (read+write); torch {torch.__version__} "
        f"triton {triton.__version__}",
        flush=True,
    )
    mod = None if args.no_vllm else load_vllm_indexer(args.peers)
    extra = json.loads(args.configs) if args.configs else []
    preset = "quick" if args.quick else args.preset
    run = Run(name, gpu.copy_gbs)
    out_csv = Path(args.out) / "indexer.csv"
    filters = [f.strip() for f in args.shapes.split(";") if f.strip()]
    keep = lambda label: not filters or any(f in label for f in filters)  # noqa: E731
    shapes = [s for s in topk_cases.SHAPES[preset] if keep(s.label())]
    for n, shape in enumerate(shapes, 1):
        print(f"[{n}/{len(shapes)}] {KERNEL} {shape.label()}: making inputs", flush=True)
        try:
            s = Setup(shape, dev, cold, flat_copies=mod is not None and is_decode(shape))
        except Exception as exc:  # e.g. out of memory: the other shapes still run
            run.notes.append(f"  {shape.label()}: inputs failed: {type(exc).__name__}: {str(exc)[:200]}")
            torch.cuda.empty_cache()
            continue
        if not s.cold:
            run.notes.append(
                f"  note: {s.label}: {s.R} copies of {shape.set_bytes() >> 20} MiB stay under 3 x {cold >> 20} MiB: "
                "partly from L2"
            )
        run.rows.append(bench_shape(run, s, mod, extra))
        write_csv(out_csv, run.records)  # after every shape: a cut-off run keeps its rows
        del s
        if mod is not None:  # the decode peer's logits buffers (its workspace stand-in keeps one per shape)
            getattr(getattr(mod, "_WORKSPACE", None), "buffers", {}).clear()
        torch.cuda.empty_cache()
    wshapes = [s for s in write_shapes(preset) if keep(s.label)]
    for n, shape in enumerate(wshapes, 1):
        print(f"[{n}/{len(wshapes)}] {WRITE_KERNEL} {shape.label}: making inputs", flush=True)
        try:
            w = WriteSetup(shape, dev, cold)
        except Exception as exc:
            run.notes.append(f"  {shape.label}: inputs failed: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        if not w.cold:
            run.notes.append(f"  note: {w.label}: {w.R} input sets stay under 3 x {cold >> 20} MiB: partly from L2")
        run.write_rows.append(bench_write(run, w, mod))
        write_csv(out_csv, run.records)
        del w
        torch.cuda.empty_cache()
    print(
        f"\n{KERNEL} (q fp8, topk 2048, block 64, CUDA-graph replay, cold caches): per call time, GB/s (% of the "
        f"{run.copy:.0f} GB/s copy ceiling)"
    )
    print_table(["shape", "plan", "rocm_mla", *PEERS, "vLLM/ours", "copy time"], run.rows)
    print(f"\n{WRITE_KERNEL} (bf16 k, block 64, UE8M0): per call time, GB/s (% of copy)")
    print_table(["shape", "rocm_mla", WRITE_PEER, "vLLM/ours"], run.write_rows)
    print("\ntargets:")
    for t in run.targets:
        print(t)
    if run.notes:
        print("notes:")
    for n in run.notes:
        print(n)
    write_csv(out_csv, run.records)
    print(f"wrote {out_csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
