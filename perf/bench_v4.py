#!/usr/bin/env python3
"""Benchmark mla_v4_attention (DeepSeek-V4 attention: a window list and a compressed list over two
fp8_ds_mla caches, the attention sink, the inverse RoPE fused) against vLLM 0.34's ROCm Triton path:
time per call, GB/s, TFLOP/s and % of the copy / matmul ceilings measured in the same run, every
timed output checked.

    python perf/bench_v4.py [--out results] [--peers .peers] [--preset bench|tune|selfcheck] [--quick]
                            [--shapes 'LABEL;...'] [--no-vllm]
    TRITON_INTERPRET=1 python perf/bench_v4.py --dry     (no GPU: the wiring on tiny shapes, untimed)

Shapes (rocm_mla.cases.v4_attention.SHAPES[preset]; --quick: the "tune" set and the first prefill
shape of "bench"): q bf16 [T, H, 512], fp8_ds_mla caches (window pages of 64 tokens; compressed
pages of 256 tokens' rows), each list dense global slots, attn_sink, positions + cos_sin_cache.
"bench": decode of 1..256 requests x H 8 / 16 / 64 / 128 x every layer kind (window 128 of 32K;
CSA top-512 / top-1024 of 8192 compressed rows; HCA all 8192 rows of 1M tokens); a prefill chunk
of 8192 rows after 24K cached tokens (32K context, CSA top-512) at H 64 and 128. A shape whose
requests hold more than 8 rows is a prefill shape, the others decode (MTP: q2..q8).

Counted per call (the same for every provider; rocm_mla.cases.v4_attention.V4Shape):
  bytes = entries x 584 (each named cache row once per query row that names it) + the lists
          (T x (window + compressed width) x 4) + q in, out back, lse (T x H x (2 x 512 x 2 + 4))
  FLOPs = 2 x H x entries x (512 + 512)

Providers, each captured in CUDA graphs of 8 calls rotating over cache copies larger than 3 x the
L2 (benchutil / rocm_mla.tools.timing.rotating_graph_us):
  rocm_mla-triton     mla_v4_attention(q, window_cache, window_indices, None, compressed_cache,
                      compressed_indices, None, attn_sink, positions, cos_sin_cache, sm_scale=,
                      out=, lse=, plan=): one call, the inverse RoPE fused; the plan
                      (plan_v4_attention) made once, outside the timing.
  vllm-0.34-decode    (decode shapes) rocm_sparse_attn_decode: the gfx942 path an MI300 runs
                      (split-K partials, the reduce with the sink and the inverse RoPE fused through
                      inv_rope_positions / inv_rope_cos_sin_cache, its split rule on this GPU's SM
                      count, the copy into the output), the same cache bytes, the same global-slot
                      lists as ragged indices + indptr (vLLM's build_ragged_indices_from_dense of the
                      dense lists, outside the timing, as its metadata builder makes them once a step).
  vllm-0.34-prefill   (prefill shapes) DeepseekV4ROCMAiterMLAAttention._forward_prefill without aiter,
                      then forward_mqa's standalone inverse RoPE: per chunk of requests (vLLM's chunk
                      plan, 4 requests' workspace area) dequantize_and_gather_k_cache of the
                      compressed rows and of the window rows into a bf16 workspace (one buffer made
                      outside the timing: vLLM's locked workspace), combine_topk_swa_indices,
                      rocm_sparse_attn_prefill; then rocm_inverse_rope_rows_ over the rows. Its steps
                      are also timed alone (vllm-0.34-prefill:gather / :combine / :attn / :inv_rope).
A vLLM kernel that fails (Triton refusing it, say) is reported in the row ("failed: <reason>"); the
rest is timed. Both outputs are checked against the float64 reference (cases' mismatch; vLLM gives no
lse: the reference's stands in for it, so its out alone is judged) on every row of copy 0.
vLLM's kernels come from perf/peers/get_vllm_sparse_peers.sh PEERS (PEERS/vllm_sparse/rocm_v4.py, made
for gfx942: both caches read as OCP e4m3, which is what the cases write on NVIDIA).

--dry (CPU, TRITON_INTERPRET=1): tiny decode and prefill shapes of every kind, one call of each
provider and step, each output checked, nothing timed or written. bf16 arithmetic in the Triton
interpreter works on the bits it stores (triton-lang/triton#11584), so --dry first makes the
interpreter widen bf16 operands to float32 (and round float32 -> e4m3 to nearest even); vLLM's entry
points assert their tensors are not on the CPU, so they get CPU tensors that answer is_cpu False.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch
from benchutil import RateRun, Record, bench_parser, print_table, start_bench, write_csv

from rocm_mla import __version__
from rocm_mla.cases import cold_copies
from rocm_mla.cases import v4_attention as v4
from rocm_mla.cases.v4_attention import V4Inputs, V4Shape

DTYPE = torch.bfloat16
KERNEL = "mla_v4_attention"
HEAD, NOPE, ROPE = 512, 448, 64
DECODE_ROWS = 8  # requests holding more rows than this are a prefill chunk
PREFILL_CHUNK_REQUESTS = 4  # vLLM's DeepseekV4Attention.PREFILL_CHUNK_SIZE
DECODE_PEER, PREFILL_PEER = "vllm-0.34-decode", "vllm-0.34-prefill"
# --dry's shapes: decode rows of every layer kind (MTP too) and a prefill chunk, small enough for the
# interpreter; window 128 and the model's dims, as the bench's.
DRY_SHAPES = [
    V4Shape((300, 200), 1, H=16, kind="csa", topk=32, block=16, cblock=16),
    V4Shape((700,), 2, H=16, kind="hca", ratio=16, block=16, cblock=4),
    V4Shape((200, 90), 1, H=8, kind="window", block=16),
    V4Shape((400,), 40, H=16, kind="csa", topk=32, block=16, cblock=16),
]


def _peer_tensor(x):
    """What vLLM's entry points are handed (--dry: a CPU tensor that answers is_cpu False)."""
    return x


class _NotCpu(torch.Tensor):
    """--dry: a CPU tensor vLLM's not-on-the-CPU asserts let through (the interpreter runs it)."""

    @property
    def is_cpu(self):
        return False


class Setup:
    """One shape's inputs (rocm_mla.cases.v4_attention, R cache copies over 3 x the cold-cache
    bytes, dense global-slot lists) and what the peers read of them."""

    def __init__(self, shape: V4Shape, dev: torch.device, cold_bytes: int):
        self.shape = shape
        self.R, self.cold = cold_copies(shape.set_bytes(DTYPE), cold_bytes, cap=16)
        self.case: V4Inputs = v4.make_inputs(shape, dtype=DTYPE, device=dev, copies=self.R)
        self.label = shape.label(DTYPE)
        self.dev = dev
        self.prefill = max(shape.rows, default=1) > DECODE_ROWS


# --------------------------------------------------------------------------- ours


def ours(s: Setup):
    """``(call, plan)``: the op with a plan made once (as a serving step makes it per layer kind)."""
    plan = s.case.plan(backend="triton")

    def call(i: int):
        s.case.run(i, plan=plan)
        return s.case.out

    return call, plan


def plan_label(plan) -> str:
    c = plan.config
    split = f"S={plan.num_splits}" + (f"x{plan.split_len}" if plan.split_len else "")
    return (
        f"{split} H{c.get('BLOCK_H')}x{plan.head_blocks} N{c.get('BLOCK_N')} w{c.get('num_warps')}"
        f" s{c.get('num_stages')}"
    )


# --------------------------------------------------------------------------- vLLM


def peer_reason(s: Setup) -> str:
    """'' when vLLM's V4 kernels can read this case, else why not."""
    c = s.case
    if not s.shape.fp8:
        return "16-bit caches: vLLM's V4 kernels read fp8_ds_mla (uint8) caches"
    kinds = [c.window.kind] + ([c.compressed.kind] if c.compressed is not None else [])
    if any(k != torch.float8_e4m3fn for k in kinds):
        return "an e4m3fnuz cache: this peer reads OCP e4m3 (is_fp8_fnuz() False off ROCm)"
    if c.q.stride(-1) != 1:
        return "q's last dim strided: vLLM's kernels take it contiguous"
    return ""


def peer_lists(s: Setup, mod, which: str, i: int):
    """``(dense [T, W] or None, lens [T] int32, ragged indices, indptr)`` of list ``which`` of copy
    i as vLLM's decode takes them: the ragged form by vLLM's own builder (its metadata's step)."""
    c = s.case
    if which == "window":
        idx, ptr, count, cache = c.window_indices(i), c.window_indptr(i), c.window_count, c.window.caches[i]
    else:
        idx, ptr = c.compressed_indices(i), c.compressed_indptr(i)
        count, cache = c.compressed_count, c.compressed.caches[i]
    lens = count.to(torch.int32)
    if ptr is not None:
        return None, lens, _peer_tensor(idx), _peer_tensor(ptr)
    r_idx, r_ptr = mod.build_ragged_indices_from_dense(idx, lens, num_rows=cache.shape[0] * cache.shape[1])
    return idx, lens, _peer_tensor(r_idx), _peer_tensor(r_ptr)


def vllm_decode(s: Setup, mod):
    """vLLM's rocm_sparse_attn_decode on copy i, lists built here (untimed); (None, reason) when it
    cannot read the case."""
    why = peer_reason(s)
    if why:
        return None, why
    c = s.case
    swa_only = c.compressed is None
    lists = [
        (peer_lists(s, mod, "window", i), None if swa_only else peer_lists(s, mod, "compressed", i)) for i in range(s.R)
    ]
    out = torch.full_like(c.q, math.nan, memory_format=torch.contiguous_format)
    q = _peer_tensor(c.q)

    def call(i: int):
        (w_dense, w_lens, w_idx, w_ptr), t = lists[i]
        mod.rocm_sparse_attn_decode(
            q=q,
            kv_cache=None if swa_only else _peer_tensor(c.compressed.caches[i]),
            swa_k_cache=_peer_tensor(c.window.caches[i]),
            swa_only=swa_only,
            topk_indices=None,
            topk_lens=None,
            swa_indices=w_dense if w_dense is not None else w_idx,
            swa_lens=w_lens,
            swa_ragged_indices=w_idx,
            swa_ragged_indptr=w_ptr,
            topk_ragged_indices=None if t is None else t[2],
            topk_ragged_indptr=None if t is None else t[3],
            attn_sink=c.attn_sink,
            scale=c.sm_scale,
            head_dim=HEAD,
            nope_head_dim=NOPE,
            rope_head_dim=ROPE,
            output=out,
            inv_rope_positions=c.positions,
            inv_rope_cos_sin_cache=c.cos_sin_cache,
        )
        return out

    return call, ""


def vllm_chunk_plan(shape: V4Shape) -> list[tuple[int, int, int, int]]:
    """``(first request, end request, chunk_N, chunk_M)`` per chunk, as vLLM 0.34's
    DeepseekSparseSWAMetadata.get_prefill_chunk_plan groups a step's prefill requests: requests are
    added while (requests x (most compressed rows + most gathered rows)) stays within 4 requests'
    area (compressed rows of max_model_len, the window, max_num_batched_tokens); chunk_N is the
    chunk's most compressed rows, chunk_M that plus its most gathered rows (query rows + up to
    window - 1 cached). max_model_len: the longest request; max_num_batched_tokens: the step's rows."""
    ratio = shape.ratio if shape.compressed else 0
    comp = [n // ratio if ratio else 0 for n in shape.lens]
    gather = [r + min(n - r, shape.window - 1) for n, r in zip(shape.lens, shape.rows)]
    max_len = max(shape.lens, default=0)
    area = PREFILL_CHUNK_REQUESTS * ((-(-max_len // ratio) if ratio else 0) + shape.window + shape.T)
    plan, b0, B = [], 0, len(shape.lens)
    while b0 < B:
        mc, mg, b1 = comp[b0], gather[b0], b0 + 1
        while b1 < B and (b1 - b0 + 1) * (max(mc, comp[b1]) + max(mg, gather[b1])) <= area:
            mc, mg, b1 = max(mc, comp[b1]), max(mg, gather[b1]), b1 + 1
        plan.append((b0, b1, mc, mc + mg))
        b0 = b1
    return plan


class VllmPrefill:
    """vLLM 0.34's ROCm prefill of a V4 layer without aiter (amd/rocm.py _forward_prefill, then
    forward_mqa's rocm_inverse_rope_rows_ over the prefill rows), on cache copy i. Made outside the
    timing: the step's metadata (seq_lens, gather_lens, query_start_loc, the chunk plan), the one
    bf16 workspace; ``steps`` time each part alone (the attention on lists combined here once)."""

    def __init__(self, s: Setup, mod):
        self.s, self.mod, c, sh = s, mod, s.case, s.shape
        dev = c.q.device
        i32 = dict(dtype=torch.int32, device=dev)
        self.swa_only = c.compressed is None
        self.seq_lens = torch.tensor(sh.lens, **i32)
        self.gather_lens = torch.tensor([r + min(n - r, sh.window - 1) for n, r in zip(sh.lens, sh.rows)], **i32)
        self.qsl_cpu = [0]
        for r in sh.rows:
            self.qsl_cpu.append(self.qsl_cpu[-1] + r)
        self.qsl = torch.tensor(self.qsl_cpu, **i32)
        self.chunks = vllm_chunk_plan(sh)
        most = max((b1 - b0) * m for b0, b1, _, m in self.chunks)
        self.workspace = torch.empty(most * HEAD, dtype=torch.bfloat16, device=dev)
        if self.swa_only:  # the indexer's top-k buffer, unread (top_k 0)
            self.topk, self.top_k = torch.full((sh.T, max(sh.topk, 1)), -1, **i32), 0
        else:
            self.topk, self.top_k = c.compressed_positions, c.compressed_positions.shape[-1]
        self.out = torch.full((sh.T, sh.H, HEAD), math.nan, dtype=torch.bfloat16, device=dev)
        self.q = _peer_tensor(c.q)
        self.combined = None

    def kv(self, b0: int, b1: int, m: int) -> torch.Tensor:
        """The chunk's workspace view ``[requests, chunk_M, 512]`` (vLLM's get_simultaneous)."""
        return self.workspace[: (b1 - b0) * m * HEAD].view(b1 - b0, m, HEAD)

    def gather(self, i: int) -> None:
        c, sh, mod = self.s.case, self.s.shape, self.mod
        for b0, b1, n, m in self.chunks:
            kv = self.kv(b0, b1, m)
            if not self.swa_only:
                mod.dequantize_and_gather_k_cache(
                    kv, c.compressed.caches[i], seq_lens=self.seq_lens[b0:b1] // sh.ratio, gather_lens=None,
                    block_table=c.compressed.tables[i][b0:b1], block_size=c.compressed.block_size, offset=0,
                    use_fnuz=False,
                )  # fmt: skip
            mod.dequantize_and_gather_k_cache(
                kv, c.window.caches[i], seq_lens=self.seq_lens[b0:b1], gather_lens=self.gather_lens[b0:b1],
                block_table=c.window.tables[i][b0:b1], block_size=c.window.block_size, offset=n,
                use_fnuz=False,
            )  # fmt: skip

    def combine(self) -> list:
        sh, lists = self.s.shape, []
        for b0, b1, n, m in self.chunks:
            q0, q1 = self.qsl_cpu[b0], self.qsl_cpu[b1]
            lists.append(
                self.mod.combine_topk_swa_indices(
                    self.topk[q0:q1],
                    self.qsl[b0 : b1 + 1],
                    self.seq_lens[b0:b1],
                    self.gather_lens[b0:b1],
                    sh.window,
                    sh.ratio if not self.swa_only else 1,
                    self.top_k,
                    m,
                    n,
                )  # fmt: skip
            )
        return lists

    def attn(self, combined: list) -> None:
        c = self.s.case
        for (b0, b1, _, m), (idx, lens) in zip(self.chunks, combined):
            q0, q1 = self.qsl_cpu[b0], self.qsl_cpu[b1]
            self.mod.rocm_sparse_attn_prefill(
                q=self.q[q0:q1], kv=_peer_tensor(self.kv(b0, b1, m).view(-1, 1, HEAD)), indices=idx,
                topk_length=lens, scale=c.sm_scale, head_dim=HEAD, nope_head_dim=NOPE, rope_head_dim=ROPE,
                attn_sink=c.attn_sink, output=self.out[q0:q1],
            )  # fmt: skip

    def inv_rope(self) -> None:
        c = self.s.case
        if c.positions is not None:
            self.mod.rocm_inverse_rope_rows_(self.out, c.positions, c.cos_sin_cache, ROPE)

    def __call__(self, i: int) -> torch.Tensor:
        self.gather(i)
        self.attn(self.combine())
        self.inv_rope()
        return self.out

    def steps(self) -> dict:
        """Each part alone as ``call(i)``, in order: gather, combine, attn (on the lists one combine
        made, outside its timing), inv_rope."""
        out = {"gather": self.gather}

        def combine(i: int):
            self.combined = self.combine()

        def attn(i: int):
            if self.combined is None:
                self.combined = self.combine()
            self.attn(self.combined)

        out.update(combine=combine, attn=attn, inv_rope=lambda i: self.inv_rope())
        return out


def load_vllm_v4(peers: str):
    """``(module, version)`` of vLLM 0.34's DeepSeek-V4 kernels (get_vllm_sparse_peers.sh:
    PEERS/vllm_sparse/rocm_v4.py), or ``(None, why)`` (printed) when missing or not importable."""
    folder = Path(peers, "vllm_sparse")
    if not (folder / "rocm_v4.py").is_file():
        why = f"no {folder / 'rocm_v4.py'} (run perf/peers/get_vllm_sparse_peers.sh {peers})"
        print(f"vLLM V4 peer unavailable: {why}")
        return None, why
    sys.path.insert(0, str(folder))
    try:
        import rocm_v4

        return rocm_v4, (folder / "VLLM_VERSION").read_text().strip()
    except Exception as exc:
        print(f"vLLM V4 peer unavailable: {_reason(exc)}")
        return None, f"not importable: {_reason(exc)}"


# --------------------------------------------------------------------------- timing and checks


class Run(RateRun):
    """Table rows, CSV records and notes of one run."""

    def __init__(self, name: str, copy: float | None, mm: float | None):
        super().__init__(name, copy, mm, KERNEL, __version__)

    def add(self, provider: str, s: Setup, us: float | None, config: str = "") -> str:
        return super().add(provider, s.label, s.shape.nbytes(DTYPE), s.shape.flops(), us, config)


def _reason(exc: Exception) -> str:
    """One line: the exception's kind and message (a Triton compile error's last line: its verdict)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[-1] if lines else ""
    if len(lines) > 1:
        text = f"{lines[0][:80]} ... {text}"
    return f"{type(exc).__name__}: {text[:240]}"


def checked(run: Run, provider: str, fn, s: Setup, ref: tuple, ours_: bool, timed: bool):
    """``(us or None, failure, problem)``: check copy 0's output against the reference (ours: out
    and lse; a peer: out), then time (``timed``). failure: why a call raised ('' when none; noted);
    problem: what the check found ('' when it holds; noted as WRONG)."""
    try:
        got = fn(0)
        if s.dev.type == "cuda":
            torch.cuda.synchronize()
        # vLLM gives no lse: the reference's stands in for it, so only its out is judged.
        problem = s.case.mismatch(ref=ref) if ours_ else s.case.mismatch(got, ref[1], ref=ref)
        if problem:
            run.notes.append(f"  {provider} {s.label}: WRONG ({problem})")
    except Exception as exc:  # report (a kernel Triton refuses, say), keep benchmarking the rest
        run.notes.append(f"  {provider} {s.label}: failed: {_reason(exc)}")
        return None, _reason(exc), ""
    if not timed:
        return None, "", problem
    from rocm_mla.tools.timing import rotating_graph_us

    try:
        return rotating_graph_us(fn, s.R), "", problem
    except Exception as exc:
        run.notes.append(f"  {provider} {s.label}: failed in the timing: {_reason(exc)}")
        return None, _reason(exc), problem


def step_times(run: Run, s: Setup, prefill: VllmPrefill, timed: bool) -> str:
    """Each vLLM prefill step alone (recorded as vllm-0.34-prefill:<step>, time_us): the cell."""
    from rocm_mla.tools.timing import rotating_graph_us

    parts = []
    for name, fn in prefill.steps().items():
        provider = f"{PREFILL_PEER}:{name}"
        try:
            fn(0)
            us = rotating_graph_us(fn, s.R) if timed else None
        except Exception as exc:
            run.notes.append(f"  {provider} {s.label}: failed: {_reason(exc)}")
            parts.append(f"{name} failed")
            continue
        if us is None:
            parts.append(f"{name} ran")
        else:
            run.records.append(Record(KERNEL, provider, s.label, "time_us", us, run.name, __version__))
            parts.append(f"{name} {us:.0f}")
    return " + ".join(parts) + (" us" if timed else "")


def bench_shape(run: Run, s: Setup, mod, mod_why: str | None, timed: bool) -> list[str]:
    """Check and time ours and vLLM's path of the shape's kind (decode or prefill); the table row.
    mod_why: why there is no vLLM module (None: --no-vllm)."""
    try:
        fn, plan = ours(s)
        fns, label = {"rocm_mla-triton": (fn, "")}, plan_label(plan)
    except Exception as exc:  # a plan the op refuses
        run.notes.append(f"  rocm_mla-triton {s.label}: failed: {_reason(exc)}")
        fns, label = {"rocm_mla-triton": (None, f"failed: {_reason(exc)}")}, "-"
    peer = PREFILL_PEER if s.prefill else DECODE_PEER
    prefill = None
    if mod is None:
        fns[peer] = (None, f"failed: vLLM peer {mod_why}" if mod_why else "")
    else:
        try:  # the decode's lists come from vLLM's own builder (a Triton kernel): it may fail too
            if not s.prefill:
                fns[peer] = vllm_decode(s, mod)
            else:
                why = peer_reason(s)
                prefill = None if why else VllmPrefill(s, mod)
                fns[peer] = (prefill, why)
        except Exception as exc:
            run.notes.append(f"  {peer} {s.label}: failed: {_reason(exc)}")
            fns[peer] = (None, f"failed: {_reason(exc)}")
    ref = s.case.reference()
    times: dict[str, float] = {}
    cell: dict[str, str] = {}
    for p, (f, why) in fns.items():
        if f is None:
            if why and not why.startswith("failed"):
                run.notes.append(f"  {p} skipped ({s.label}): {why}")
            cell[p] = why if why.startswith("failed") else "-"
            continue
        us, failure, problem = checked(run, p, f, s, ref, p.startswith("rocm_mla"), timed)
        if us is not None:
            times[p] = us
        if failure:
            cell[p] = f"failed: {failure}"
        elif timed:
            cell[p] = run.add(p, s, us, label if p == "rocm_mla-triton" else "") + (" WRONG" if problem else "")
        else:
            cell[p] = "WRONG" if problem else "ok"
    steps = step_times(run, s, prefill, timed) if prefill is not None else ""
    ours_us = times.get("rocm_mla-triton")
    if ours_us and peer in times:
        run.records.append(
            Record(KERNEL, "rocm_mla-triton", s.label, f"speed_vs_{peer}", times[peer] / ours_us, run.name, __version__)
        )
    ratio = f"{times[peer] / ours_us:.2f}x" if ours_us and peer in times else "-"
    cells = [s.label, label, cell["rocm_mla-triton"], cell[peer], ratio, steps]
    print(" | ".join(cells), flush=True)
    return cells


# --------------------------------------------------------------------------- --dry


def _interpreter_bf16() -> None:
    """Make the Triton CPU interpreter compute bf16 on values (it stores bf16 as uint16 bits and adds,
    multiplies, compares, reduces and dots those bits: triton-lang/triton#11584): bf16 operands widened to
    float32, bf16 results rounded back to nearest even; float32 -> e4m3fn rounded to nearest even (as
    the GPU does). For --dry only."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as interp

    bf, rtne, B, R = tl.bfloat16, interp._ir.ROUNDING_MODE.RTNE, interp.InterpreterBuilder, interp.ReduceOps

    def f32(h):
        if h.dtype.scalar != bf:
            return h.data
        return np.asarray(interp._convert_float(h.data, bf, tl.float32, None)).view(np.float32).reshape(h.data.shape)

    def to_bf(x):
        x = np.asarray(x, dtype=np.float32)
        return np.asarray(interp._convert_float(x, tl.float32, bf, rtne)).view(np.uint16).reshape(x.shape)

    def is_bf(*hs):
        return any(h.dtype.scalar == bf for h in hs)

    binary, unary, ternary, dot, fp_to_fp = B.binary_op, B.unary_op, B.ternary_op, B.create_dot, B.create_fp_to_fp
    min_max, rsum = R.min_max, R.sum

    def binary_op(self, lhs, rhs, op):
        if not is_bf(lhs, rhs):
            return binary(self, lhs, rhs, op)
        out = op(f32(lhs), f32(rhs))
        return interp.TensorHandle(out, tl.int1) if out.dtype == np.bool_ else interp.TensorHandle(to_bf(out), bf)

    def unary_op(self, arg, op):
        return unary(self, arg, op) if not is_bf(arg) else interp.TensorHandle(to_bf(op(f32(arg))), bf)

    def ternary_op(self, lhs, rhs, other, op):
        if op is np.where or not is_bf(other):
            return ternary(self, lhs, rhs, other, op)
        return interp.TensorHandle(to_bf(op(f32(lhs), f32(rhs), f32(other))), bf)

    def create_fma(self, x, y, z):
        if not is_bf(z):
            return interp.TensorHandle(x.data * y.data + z.data, z.dtype.scalar)
        return interp.TensorHandle(to_bf(f32(x) * f32(y) + f32(z)), bf)

    def create_dot(self, a, b, d, *args):
        if is_bf(a, b):
            a, b = interp.TensorHandle(f32(a), tl.float32), interp.TensorHandle(f32(b), tl.float32)
        return dot(self, a, b, d, *args)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if dst_type.scalar == tl.float8e4nv and src.dtype.scalar in (tl.float32, bf):
            x = torch.from_numpy(np.ascontiguousarray(f32(src), dtype=np.float32))
            return interp.TensorHandle(x.to(torch.float8_e4m3fn).view(torch.uint8).numpy(), dst_type.scalar)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    def reduce_min_max(self, input, val_reduce_op, idx_reduce_op=None):
        x = input[0] if isinstance(input, tuple) else input
        if x.dtype.scalar != bf:
            return min_max(self, input, val_reduce_op, idx_reduce_op)
        data, val, idx = f32(x.handle), None, None
        if val_reduce_op:
            val = self.to_tensor(to_bf(val_reduce_op(data, axis=self.axis, keepdims=self.keep_dims)), x.dtype)
        if idx_reduce_op:
            idx = self.to_tensor(idx_reduce_op(data, axis=self.axis, keepdims=self.keep_dims), tl.int32)
        return (val, idx) if val is not None and idx is not None else (val if val is not None else idx)

    def reduce_sum(self, input):
        if input.dtype.scalar != bf:
            return rsum(self, input)
        return self.to_tensor(to_bf(np.sum(f32(input.handle), axis=self.axis, keepdims=self.keep_dims)), input.dtype)

    B.binary_op, B.unary_op, B.ternary_op, B.create_fma = binary_op, unary_op, ternary_op, create_fma
    B.create_dot, B.create_fp_to_fp, R.min_max, R.sum = create_dot, create_fp_to_fp, reduce_min_max, reduce_sum


def _dry_peer(mod) -> None:
    """--dry: vLLM's entry points get CPU tensors that answer is_cpu False (also the ragged lists
    they build themselves)."""
    global _peer_tensor

    def as_device(x):
        return x.as_subclass(_NotCpu) if isinstance(x, torch.Tensor) else x

    _peer_tensor = as_device
    build = mod.build_ragged_indices_from_dense
    mod.build_ragged_indices_from_dense = lambda *a, **k: tuple(as_device(x) for x in build(*a, **k))


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for v4.csv")
    ap.add_argument("--peers", default=".peers", help="folder with vllm_sparse/rocm_v4.py (get_vllm_sparse_peers.sh)")
    ap.add_argument("--preset", default="bench", choices=sorted(v4.SHAPES), help="rocm_mla.cases.v4_attention.SHAPES")
    ap.add_argument("--quick", action="store_true", help='the "tune" set and the first prefill shape of "bench"')
    ap.add_argument("--shapes", default="", help="only shapes whose label contains one of these (';'-separated)")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--dry", action="store_true", help="CPU, TRITON_INTERPRET=1: tiny shapes, untimed")
    args = ap.parse_args()
    if args.dry:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("bench_v4 --dry: run it as TRITON_INTERPRET=1 python perf/bench_v4.py --dry")
            return 2
        _interpreter_bf16()
        torch.manual_seed(0)
        dev, name, cold, run = torch.device("cpu"), "cpu (Triton interpreter)", 0, Run("cpu", None, None)
        shapes = DRY_SHAPES
    else:
        import triton

        from rocm_mla.tools.timing import cold_cache_bytes

        gpu = start_bench("bench_v4", copy=True, matmul=True)
        if gpu is None:
            return 2
        dev, name = gpu.dev, gpu.name
        cold = cold_cache_bytes(dev)
        print(
            f"device: {name}; copy ceiling {gpu.copy_gbs:.0f} GB/s (read+write); bf16 matmul "
            f"{gpu.matmul_tflops:.0f} TFLOP/s; torch {torch.__version__} triton {triton.__version__}"
        )
        run = Run(name, gpu.copy_gbs, gpu.matmul_tflops)
        if args.quick:
            shapes = v4.SHAPES["tune"] + [next(x for x in v4.SHAPES["bench"] if max(x.rows) > DECODE_ROWS)]
        else:
            shapes = v4.SHAPES[args.preset]
    mod, ver = (None, None) if args.no_vllm else load_vllm_v4(args.peers)
    if mod is not None:
        print(f"vLLM {ver} DeepSeek-V4 ROCm kernels (gfx942 path: _ON_GFX942 {mod._ON_GFX942}, fnuz "
              f"{mod.current_platform.is_fp8_fnuz()})")  # fmt: skip
        if args.dry:
            _dry_peer(mod)
    filters = [f.strip() for f in args.shapes.split(";") if f.strip()]
    for shape in shapes:
        if filters and not any(f in shape.label(DTYPE) for f in filters):
            continue
        s = Setup(shape, dev, cold)
        if not s.cold:
            run.notes.append(f"  note: {s.label}: {s.R} copies stay under 3 x {cold >> 20} MiB: partly from L2")
        run.rows.append(bench_shape(run, s, mod, None if mod is not None else ver, timed=not args.dry))
        if not args.dry:  # after every shape: a cut-off run keeps its rows
            write_csv(Path(args.out) / "v4.csv", run.records)
        del s
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    what = "one checked call each (no timing)"
    if not args.dry:
        what = f"CUDA graphs, cold caches: per call time, GB/s (% of the {run.copy:.0f} GB/s copy ceiling), TFLOP/s"
    print(f"\n{KERNEL} (q bf16, fp8_ds_mla caches, sink, inverse RoPE) on {name}, {what}")
    print_table(["shape", "plan", "rocm_mla", "vllm-0.34", "vLLM/ours", "vLLM prefill steps"], run.rows)
    for n in run.notes:
        print(n)
    if not args.dry:
        write_csv(Path(args.out) / "v4.csv", run.records)
        print(f"wrote {Path(args.out) / 'v4.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
