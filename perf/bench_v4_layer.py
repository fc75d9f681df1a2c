#!/usr/bin/env python3
"""The attention path of one DeepSeek-V4 layer step on rocm_mla beside vLLM 0.34's V4 ROCm Triton
composition (no aiter): whole-path time, kernels launched and copy/fill kernels among them, every
timed output checked.

    python perf/bench_v4_layer.py [--out results] [--quick] [--steps decode,mtp,prefill] [--kinds csa,hca,window]
    python perf/bench_v4_layer.py --cpu-smoke --out DIR     (no GPU: tiny steps in the Triton interpreter)

Needs vLLM 0.34 importable (a GPU machine without it: ``source perf/vllm_on_device.sh`` first); the
layer is vLLM's own ROCm V4 layer code on the simulated gfx942 platform
(tests/vllm_harness/layer_step.py), so vLLM's kernels run as Triton on any GPU.

Steps (tests/vllm_harness/v4_step.py V4Step: one V4-Flash attention layer, window 128, bf16 q
``[T, H, 512]``, fp8_ds_mla window and compressed caches, the CSA indexer's C4 key cache, shuffled
block tables, the sink and the inverse RoPE), each at H = 64 (TP1) and 8 (TP8) heads a rank:
  decode   64 requests x 1 row at context 32768: a CSA layer (ratio 4, top-512 of 8192 compressed
           rows), an HCA layer (ratio 128, all 256 rows), a window-only layer
  mtp      the same with 2 rows a request (MTP verification)
  prefill  one request: 8192 causal rows after 8192 cached tokens (16K context: the rows see 2048..
           4096 compressed rows, so the CSA indexer selects), a CSA and an HCA layer
--quick: decode of 16 requests at 8192 (the three kinds), MTP of the CSA layer, a prefill of 2048
rows after 2048 cached (CSA, HCA), all at H = 8.

Providers (the same V4Step: the same inputs, caches, metadata and layer object):
  rocm_mla    the hooked layer (rocm_mla/vllm/v4_layer.py): the CSA indexer through rocm_mla's op in
              vLLM's indexer seat (mla_indexer_topk into vLLM's topk_indices_buffer), then vLLM's
              forward_mqa taking the in-place branch into mla_v4_attention (one call per decode and
              prefill part, sink and inverse RoPE fused) on vLLM's own global-slot list builders.
  vllm-0.34   the same layer object with the hook off (``_rocm_mla`` and the ``_use_aiter_sparse_mla*``
              flags False): vLLM's own forward_mqa without aiter: decode rocm_sparse_attn_decode (the
              gfx942 split-K partials and reduce, the inverse RoPE fused, the copy into the output);
              prefill per chunk of requests (vLLM's get_prefill_chunk_plan, its workspace manager)
              dequantize_and_gather_k_cache of the compressed and window rows into a bf16 workspace,
              combine_topk_swa_indices, rocm_sparse_attn_prefill, then rocm_inverse_rope_rows_.
              Its CSA indexer: vLLM's SparseAttnIndexer.forward_hip refuses gfx942 without aiter, so
              what its ROCm indexer op runs there stands in (rocm_aiter_sparse_attn_indexer with its
              compiled top-k replaced): the buffer cleared (-1), then decode rows
              rocm_fp8_paged_mqa_logits_triton ([rows, max_model_len / 4] float32 logits in vLLM's
              workspace, per-row compressed lengths) + torch.topk (for vLLM's top_k_per_row_decode);
              prefill rows cp_gather_indexer_k_quant_cache_triton (block-flat C4 cache) +
              fp8_mqa_logits_torch (rocm_fp8_mqa_logits without aiter; in row pieces so its
              [H, rows, keys] temporaries stay within 8 GB) + torch.topk (for top_k_per_row_prefill),
              shifted to request-local positions; the int64 answer copied into the int32 buffer.
              The window cache is read in the kind it is written (is_fp8_fnuz() follows the
              platform's fp8 kind) and the gather takes vLLM's Triton kernel (its ROCm branch).

Measured per provider and step (one CSV, perf/bench.py's v4_layer.csv; kernel "v4_layer_step"):
  time_us            the whole path (indexer + forward_mqa). decode / mtp: CUDA graphs of 8 steps
                     (rocm_mla.tools.timing.rotating_graph_us over the one input set: the 1.2 GB
                     window cache is named 128 rows a request, so part of a step's reads come from
                     L2) when both providers capture, else both eager (time_ms), the method in the
                     row's config; prefill: eager (time_ms, L2 flushed) for both.
  attention_us       (CSA layers) forward_mqa alone on the provider's own top-k, the same method.
  kernels            GPU kernels of one step under torch.profiler (bench_layer_copies.count_data_movement)
  copy_fill_kernels  the copy / cat / pad / fill kernels among them (by name)
  attention_kernels, attention_copy_fill_kernels  (CSA layers) the same of forward_mqa alone (the
                     indexer stand-ins' torch kernels left out)
  speed_vs_vllm-0.34 (rocm_mla) vLLM's time_us over ours
  wrong              1 for a provider whose output failed its check (printed as WRONG)
What a serving step makes once for all its layers is made before the timing, by the checked call:
vLLM's metadata (V4Step: its builders' lists and prefill fields), rocm_mla's plans and per-row
compressed lengths kept on that metadata, vLLM's workspace.
Checked, after the first step and again after the timing: the layer output against the float64
reference over the slots each row sees (V4Step.reference: the window's last 128 positions, the
compressed rows of the provider's own top-k or HCA's all; rocm_mla.cases.v4_attention.TOLERANCE)
on every row; the CSA indexer's answer a valid top-k of the float64 logits (check_indexer_topk) on
every decode row and 512 evenly spaced prefill rows (the reference logits are computed on the host;
vLLM's answer is a set, sorted first; its prefill rows with rtol 1e-2: bf16 dot products; on sm90
both providers' fp8 logits with rocm_mla.cases.indexer_topk.fp8_dot_rtol); after the timing, the same
selection as the checked step.

--cpu-smoke (no GPU; sets TRITON_INTERPRET=1 and an empty HIP_VISIBLE_DEVICES before vLLM's first
import): tiny decode, MTP and prefill steps of a CSA layer, both providers through the interpreter,
each output checked, host-clock times of one call (they measure nothing of a GPU), aten
data-movement ops and Triton launches counted instead of kernels, the CSV written. What the
interpreter needs there: bf16 computed on values (bench_v4's --dry shim), vLLM's entry points
handed tensors that answer is_cpu False during its calls, its workspace growth without a device
cache to empty.
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

if "--cpu-smoke" in sys.argv and not torch.cuda.is_available():
    # Before any Triton kernel is defined and before vLLM's first import (its Triton, not its CPU
    # placeholder: tests/vllm_harness/dcp.py cpu_env).
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("HIP_VISIBLE_DEVICES", "")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # the vLLM harness (tests/vllm_harness)

from bench_layer_copies import count_data_movement  # noqa: E402
from bench_v4 import _interpreter_bf16, _reason  # noqa: E402
from benchutil import Record, bench_parser, print_table, start_bench, write_csv  # noqa: E402

from rocm_mla import __version__  # noqa: E402
from rocm_mla.cases.indexer_topk import fp8_dot_rtol  # noqa: E402

KERNEL = "v4_layer_step"
OURS, PEER = "rocm_mla", "vllm-0.34"
PROVIDERS = (OURS, PEER)
DTYPE = torch.bfloat16
IN_PLACE_FLAGS = ("_use_aiter_sparse_mla_decode", "_use_aiter_sparse_mla_prefill", "_use_aiter_sparse_mla")
PREFILL_INDEX_ROWS = 512  # prefill rows whose indexer answer is checked (every decode row is)
PREFILL_INDEX_RTOL = 1e-2  # vLLM's torch prefill logits: bf16 dot products round each head at 2^-9
VLLM_LOGITS_BYTES = 512 << 20  # VLLM_SPARSE_INDEXER_MAX_LOGITS_MB: rows of one prefill logits chunk
PREFILL_TORCH_BYTES = 8 << 30  # fp8_mqa_logits_torch's [H, rows, keys] temporaries per piece
PREFILL_TORCH_ELEM = 14  # bytes of them per element (bf16 scores, float32 products and mask)


@dataclass(frozen=True)
class StepSpec:
    """One step: ``requests`` requests of ``rows`` query rows each after ``context`` cached tokens,
    through a V4 layer of ``kind`` ("csa", "hca", "window") at ``heads`` heads a rank; ``topk`` the
    model's index_topk. phase "decode" / "mtp": every request is a decode request (vLLM's decode
    path); "prefill": none is."""

    phase: str
    kind: str
    heads: int
    requests: int
    context: int
    rows: int
    topk: int = 512

    @property
    def num_decodes(self) -> int:
        return 0 if self.phase == "prefill" else self.requests

    @property
    def label(self) -> str:
        if self.phase == "prefill":
            rows = f" T={self.requests * self.rows}"
        else:
            rows = f" q{self.rows}" if self.rows > 1 else ""
        topk = f" topk={self.topk}" if self.kind == "csa" else ""
        return f"{self.phase} {self.kind} B={self.requests} ctx={self.context}{rows} H={self.heads}{topk}"


def _decode_steps(B: int, ctx: int, heads, kinds, phases=(("decode", 1), ("mtp", 2)), topk: int = 512):
    return [StepSpec(p, k, h, B, ctx, r, topk) for p, r in phases for k in kinds for h in heads]


STEPS = {
    "full": _decode_steps(64, 32768, (64, 8), ("csa", "hca", "window"))
    + [StepSpec("prefill", k, h, 1, 8192, 8192) for k in ("csa", "hca") for h in (64, 8)],
    "quick": _decode_steps(16, 8192, (8,), ("csa", "hca", "window"), phases=(("decode", 1),))
    + [StepSpec("mtp", "csa", 8, 16, 8192, 2)]
    + [StepSpec("prefill", k, 8, 1, 2048, 2048) for k in ("csa", "hca")],
    # --cpu-smoke: requests past topk x 4 tokens, so the CSA indexer selects (vLLM runs it only then).
    "cpu-smoke": [
        StepSpec("decode", "csa", 8, 2, 140, 1, 32),
        StepSpec("mtp", "csa", 8, 2, 136, 2, 32),
        StepSpec("prefill", "csa", 8, 1, 136, 4, 32),
    ],
}


# --------------------------------------------------------------------------- the vLLM environment


def setup_vllm(dev: torch.device):
    """vLLM on the simulated gfx942 platform, read the way its ROCm V4 path reads caches off aiter;
    returns ``(VllmConfig(), vllm version)``. The workspace manager is vLLM's own (its prefill
    gather and decode logits buffers come from it)."""
    from vllm_harness.layer_step import use_simulated_gfx942_platform

    use_simulated_gfx942_platform()
    import vllm
    from vllm.config import VllmConfig
    from vllm.models.deepseek_v4.common.ops import cache_utils
    from vllm.platforms import current_platform
    from vllm.v1.worker import workspace

    # The window cache is written in the platform's fp8 kind (V4Step: e4m3fn off gfx94x) and vLLM
    # reads it as is_fp8_fnuz() says: the two answers agree, as on a real gfx942.
    current_platform.is_fp8_fnuz = lambda: current_platform.fp8_dtype() == torch.float8_e4m3fnuz
    # vLLM's ROCm branch of the prefill gather (its Triton kernel), whatever an NVIDIA image holds.
    cache_utils.has_cutedsl = lambda: False
    if dev.type != "cuda":  # growing the workspace empties the device cache: there is none
        torch.accelerator.empty_cache = lambda: None
    if not workspace.is_workspace_manager_initialized():
        workspace.init_workspace_manager(dev)
    return VllmConfig(), vllm.__version__


@contextmanager
def _device_tensors(on: bool):
    """--cpu-smoke: vLLM's entry points assert their tensors are not on the CPU; during its calls
    every tensor answers is_cpu False (the interpreter runs them). No effect when ``on`` is False."""
    if not on:
        yield
        return
    torch.Tensor.is_cpu = property(lambda self: False)
    try:
        yield
    finally:
        del torch.Tensor.is_cpu


# --------------------------------------------------------------------------- the providers


class VllmIndexer:
    """What vLLM's ROCm indexer op runs for a V4 CSA layer without aiter (see the module docstring),
    writing ``step.topk_buffer`` ``[T, topk]`` int32: request-local compressed positions, -1 where a
    row sees fewer than topk. Buffers made once (vLLM's workspace / its indexer's persistent ones)."""

    def __init__(self, step):
        from vllm.v1.attention.ops import rocm_aiter_mla_sparse as ops
        from vllm.v1.worker.workspace import current_workspace_manager

        self.ops, s = ops, step
        self.s, self.T, self.Td, self.k = s, s.T, s.num_decode_tokens, s.topk
        dev, ratio = s.device, s.ratio
        i32 = dict(dtype=torch.int32, device=dev)
        kv_lens = torch.div(s.positions + 1, ratio, rounding_mode="floor").to(torch.int32)
        self.mml = s.layer.max_model_len // ratio  # the indexer op's max_model_len
        self.short = bool((kv_lens < self.k).any())  # some row sees fewer than topk: -inf columns
        self.cache = s.index_cache.unsqueeze(-2)  # [num_blocks, 64, 1, 132] as vLLM hands it
        if self.Td:
            B = s.num_decodes
            if self.Td % B:
                raise ValueError("VllmIndexer: decode requests of different row counts (vLLM pads them)")
            self.q4 = s.index_q[: self.Td].view(B, self.Td // B, *s.index_q.shape[1:])
            self.ctx = kv_lens[: self.Td].view(B, self.Td // B)  # the builder's per-row compressed lengths
            self.d_table = s.c_table[:B]
            (logits,) = current_workspace_manager().get_simultaneous(((self.Td, self.mml), torch.float32))
            logits.fill_(-math.inf)  # the kernel writes a row's [0, len): torch.topk ranks those alone
            self.d_vals = torch.empty(self.Td, self.k, dtype=torch.float32, device=dev)
            self.d_idx = torch.empty(self.Td, self.k, dtype=torch.int64, device=dev)
        P = self.T - self.Td
        if P:
            first = s.num_decodes
            lens = s.seq_lens[first:].long() // ratio  # every compressed row of each prefill request
            self.keys = int(lens.sum())
            cu = torch.zeros(lens.shape[0] + 1, **i32)
            cu[1:] = torch.cumsum(lens, 0).to(torch.int32)
            self.cu = cu
            self.t2s = torch.repeat_interleave(torch.arange(lens.shape[0], **i32), lens)
            self.p_table = s.c_table[first:]
            self.k_fp8 = torch.empty(self.keys, s.index_q.shape[-1], dtype=ops.FP8_DTYPE, device=dev)
            self.k_scale = torch.empty(self.keys, 4, dtype=torch.uint8, device=dev)
            self.ks = cu[(s.req[self.Td :] - first).long()]
            self.ke = self.ks + kv_lens[self.Td :]
            heads = s.index_q.shape[1]
            per_piece = PREFILL_TORCH_BYTES // (PREFILL_TORCH_ELEM * heads * max(1, self.keys))
            self.piece = max(1, min(P, VLLM_LOGITS_BYTES // (4 * max(1, self.keys)), per_piece))
            self.p_vals = torch.empty(P, self.k, dtype=torch.float32, device=dev)
            self.p_idx = torch.empty(P, self.k, dtype=torch.int64, device=dev)

    def __call__(self) -> None:
        s, ops, buf = self.s, self.ops, self.s.topk_buffer
        buf[: self.T] = -1  # the op clears the step's rows first
        if self.Td:
            w = s.index_w[: self.Td]
            lg = ops.rocm_fp8_paged_mqa_logits_triton(self.q4, self.cache, w, self.ctx, self.d_table, self.mml)
            torch.topk(lg, self.k, dim=1, out=(self.d_vals, self.d_idx))
            if self.short:
                self.d_idx.masked_fill_(self.d_vals == -math.inf, -1)
            buf[: self.Td, : self.k].copy_(self.d_idx)
        if self.T > self.Td:
            ops.cp_gather_indexer_k_quant_cache_triton(s.index_cache, self.k_fp8, self.k_scale, self.p_table, self.cu,
                                                       self.t2s, cache_layout="NORMAL")  # fmt: skip
            kv = (self.k_fp8, self.k_scale.view(torch.float32))
            q, w = s.index_q[self.Td :], s.index_w[self.Td :]
            for r0 in range(0, self.T - self.Td, self.piece):
                r1 = min(self.T - self.Td, r0 + self.piece)
                lg = ops.fp8_mqa_logits_torch(q[r0:r1], kv, w[r0:r1], self.ks[r0:r1], self.ke[r0:r1])
                torch.topk(lg, self.k, dim=1, out=(self.p_vals[r0:r1], self.p_idx[r0:r1]))
            torch.sub(self.p_idx, self.ks[:, None], out=self.p_idx)  # request-local positions
            if self.short:
                self.p_idx.masked_fill_(self.p_vals == -math.inf, -1)
            buf[self.Td : self.T, : self.k].copy_(self.p_idx)

    def notes(self) -> str:
        """What the run prints beside the check: the prefill logits' row pieces, when cut."""
        if self.T > self.Td and self.piece < self.T - self.Td:
            return f"prefill logits in pieces of {self.piece} rows"
        return ""


class Provider:
    """One provider's step on the shared V4Step ``step``: ``call()`` the whole path (indexer, then
    forward_mqa into ``out`` ``[T, H, 512]``), ``attention()`` forward_mqa alone; the layer's hook
    and in-place flags set for the provider at every call (the same layer object serves both)."""

    def __init__(self, name: str, step, vc, cpu: bool):
        self.name, self.s, self.vc = name, step, vc
        self.hooked = name == OURS
        self.cpu_shim = cpu and not self.hooked
        self.out = torch.full((step.T, step.H, 512), math.nan, dtype=step.dtype, device=step.device)
        self.first_us = math.nan  # the checked call's host time (--cpu-smoke's time)
        self.indexer = None
        if step.indexed:
            op = step.layer.indexer.indexer_op
            if self.hooked:  # rocm_mla's op in vLLM's indexer seat, as V4Step.run calls it
                self.indexer = lambda: op.forward_hip(None, step.index_q, None, step.index_w)
            else:
                self.indexer = VllmIndexer(step)

    def _mqa(self) -> None:
        layer = self.s.layer
        layer._rocm_mla = self.hooked
        for flag in IN_PLACE_FLAGS:
            setattr(layer, flag, self.hooked)
        layer.forward_mqa(self.s.q, None, self.s.positions, self.out)

    def call(self, i: int = 0) -> torch.Tensor:
        from vllm.forward_context import set_forward_context

        with _device_tensors(self.cpu_shim), set_forward_context(self.s.metadata, self.vc):
            if self.indexer is not None:
                self.indexer()
            self._mqa()
        return self.out

    def attention(self, i: int = 0) -> torch.Tensor:
        from vllm.forward_context import set_forward_context

        with _device_tensors(self.cpu_shim), set_forward_context(self.s.metadata, self.vc):
            self._mqa()
        return self.out


# --------------------------------------------------------------------------- checks


def sorted_positions(buf: torch.Tensor) -> torch.Tensor:
    """``buf [T, k]`` int positions as a set: the valid ones (>= 0) ascending, then -1 (vLLM's top-k
    leaves them in score order; its consumers read a set)."""
    b = buf.long()
    big = torch.iinfo(torch.int64).max
    s = torch.sort(torch.where(b >= 0, b, big), dim=1).values
    return torch.where(s == big, -1, s)


class Checker:
    """The float64 yardsticks of one step: the CSA indexer's logits on ``rows`` (every decode row and
    at most PREFILL_INDEX_ROWS evenly spaced prefill rows: the reference computes them on the host)
    and the layer output's reference, which for CSA follows the selection in the step's buffer."""

    def __init__(self, step):
        from rocm_mla.reference.indexer_topk import mla_indexer_logits_ref

        self.s, self._ref = step, None  # window / HCA: one reference for every provider
        self.logits, self.decode_rows, self.prefill_rows = None, [], []
        if not step.indexed:
            return
        T, Td = step.T, step.num_decode_tokens
        self.decode_rows = list(range(Td))
        n = min(T - Td, PREFILL_INDEX_ROWS)
        self.prefill_rows = sorted({Td + (T - Td - 1) * i // max(1, n - 1) for i in range(n)})
        rows = self.decode_rows + self.prefill_rows
        idx = torch.tensor(rows, dtype=torch.long, device=step.device)
        kv = torch.div(step.positions[idx] + 1, step.ratio, rounding_mode="floor").to(torch.int32)
        got = mla_indexer_logits_ref(step.index_q[idx], step.index_w[idx], step.index_cache, step.c_table,
                                     step.req[idx], kv, shuffled=step.shuffled)  # fmt: skip
        self.logits = [None] * T  # [T]: the float64 logits of the checked rows
        for t, lg in zip(rows, got):
            self.logits[t] = lg

    def reference(self) -> torch.Tensor:
        """``[T, H, 512]`` float32: the float64 reference over the slots each row sees now."""
        if self._ref is not None:
            return self._ref
        ref, _ = self.s.reference()
        if not self.s.indexed:
            self._ref = ref
        return ref

    def check_indexer(self, p: Provider) -> str:
        """'' when the step's top-k buffer holds a valid top-k on the checked rows (vLLM's: as a
        set; its prefill rows with PREFILL_INDEX_RTOL), else what is wrong."""
        from rocm_mla.reference.indexer_topk import check_indexer_topk

        s = self.s
        sel = s.topk_buffer[: s.T] if p.hooked else sorted_positions(s.topk_buffer[: s.T])
        dot_rtol = fp8_dot_rtol(s.device)
        why = check_indexer_topk(sel, self.logits, s.topk, rtol=dot_rtol, rows=self.decode_rows)
        if not why:
            rtol = dot_rtol if p.hooked else PREFILL_INDEX_RTOL
            why = check_indexer_topk(sel, self.logits, s.topk, rtol=rtol, rows=self.prefill_rows)
        return f"indexer: {why}" if why else ""

    def check_out(self, p: Provider, ref: torch.Tensor) -> str:
        """'' when ``p.out`` ``[T, H, 512]`` matches ``ref`` on every row within the V4 tolerance."""
        from rocm_mla.cases._compare import compare
        from rocm_mla.cases.v4_attention import TOLERANCE

        return compare("out", p.out.float(), ref, TOLERANCE[self.s.dtype]["out"]).problem


# --------------------------------------------------------------------------- timing and counting


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def time_us(fn, method: str) -> float:
    """Per-step time of ``fn(i)`` in us: "graph" (CUDA graphs of 8 steps, back to back), "eager"
    (events, L2 flushed before each call), "host" (one call by the host clock: --cpu-smoke)."""
    from rocm_mla.tools.timing import rotating_graph_us, time_ms

    if method == "graph":
        return rotating_graph_us(fn, 1)
    if method == "eager":
        return 1000 * time_ms(lambda: fn(0), warmup_ms=25, rep_ms=200)
    t0 = time.perf_counter()
    fn(0)
    return (time.perf_counter() - t0) * 1e6


def kernel_counts(fn, dev: torch.device) -> tuple[int, int, dict]:
    """``(kernels, copy/fill kernels, {kernel name: count})`` of one call of ``fn`` under
    torch.profiler; on the CPU Triton launches and aten data-movement ops stand in (and the
    warm-up call count_data_movement makes first is left out: the interpreter compiles nothing)."""
    warm = [dev.type != "cuda"]  # True: the next call is the warm-up to leave out

    def once():
        if warm[0]:
            warm[0] = False
            return
        fn(0)

    c = count_data_movement(once)
    if dev.type == "cuda":
        return sum(c["kernel_names"].values()), sum(c["kernels"].values()), dict(c["kernel_names"])
    return c["triton_launches"], sum(c["ops"].values()), dict(c["ops"])


class Run:
    """The run's CSV records, table rows and failures."""

    def __init__(self, device: str, vllm_version: str, out: Path | None):
        self.device, self.vllm_version, self.out = device, vllm_version, out
        self.records: list[Record] = []
        self.rows: list[list[str]] = []
        self.failed = False

    def add(self, provider: str, label: str, metric: str, value: float, config: str = "") -> None:
        version = __version__ if provider == OURS else self.vllm_version
        self.records.append(Record(KERNEL, provider, label, metric, value, self.device, version, config))

    def write(self) -> None:
        if self.out is not None:
            write_csv(self.out / "v4_layer.csv", self.records)


def bench_step(run: Run, spec: StepSpec, dev: torch.device, vc, seed: int) -> None:
    """Build the step, check each provider, time and count both, check again; records and a row."""
    from vllm_harness.v4_step import V4Request, V4Step

    cpu = dev.type != "cuda"
    if spec.kind == "csa" and (spec.context + spec.rows) // 4 <= spec.topk:
        # vLLM's indexer then fills every compressed row instead of running (DeepseekV4Indexer.forward)
        raise ValueError(f"{spec.label}: a CSA step's requests must exceed topk x 4 tokens")
    print(f"[{spec.label}] making inputs", flush=True)
    s = V4Step(spec.kind, spec.heads, [V4Request(spec.context, spec.rows)] * spec.requests,
               num_decodes=spec.num_decodes, topk=spec.topk, dtype=DTYPE, device=dev, seed=seed)  # fmt: skip
    checker = Checker(s)
    paths: dict[str, Provider] = {}
    refs, selections, why = {}, {}, {}  # per provider: its reference, its top-k as a set, its check
    for name in PROVIDERS:
        try:
            p = Provider(name, s, vc, cpu)
            t0 = time.perf_counter()
            p.call()
            _sync(dev)
            first_us = (time.perf_counter() - t0) * 1e6
            refs[name] = checker.reference()
            selections[name] = sorted_positions(s.topk_buffer) if s.indexed else None
            why[name] = (checker.check_indexer(p) if s.indexed else "") or checker.check_out(p, refs[name])
            p.first_us = first_us
            paths[name] = p
            state = f"WRONG ({why[name]})" if why[name] else "checked"
            note = p.indexer.notes() if isinstance(p.indexer, VllmIndexer) else ""
            print(f"  {name}: {state}{'; ' + note if note else ''}", flush=True)
            run.failed |= bool(why[name]) and name == OURS
        except Exception as exc:  # a provider that fails is reported, the run goes on
            print(f"  {name}: failed ({_reason(exc)})", flush=True)
            run.failed |= name == OURS
    method = "host" if cpu else ("graph" if spec.phase != "prefill" else "eager")

    def timed(method: str) -> dict[str, dict[str, float]]:
        """{provider: {"time_us": .., "attention_us": .. (CSA)}}; in eager mode a provider that
        raises is reported and dropped, in graph mode the exception propagates."""
        got = {}
        for name, p in list(paths.items()):
            try:  # --cpu-smoke: the whole path's time is the checked call's
                got[name] = {"time_us": p.first_us if cpu else time_us(p.call, method)}
                if s.indexed:
                    got[name]["attention_us"] = time_us(p.attention, method)
            except Exception as exc:
                if method == "graph":
                    raise
                print(f"  {name}: failed in the timing ({_reason(exc)})", flush=True)
                run.failed |= name == OURS
                del paths[name]
        return got

    try:
        times = timed(method)
    except Exception as exc:
        print(f"  a provider does not capture in a CUDA graph ({_reason(exc)}): both timed eagerly", flush=True)
        method = "eager"
        times = timed(method)
    cells = {}
    for name, p in paths.items():
        counts = {}
        if s.indexed:  # forward_mqa alone: the attention beside the indexer stand-ins' kernels
            counts["attention_kernels"], counts["attention_copy_fill_kernels"], _ = kernel_counts(p.attention, dev)
        kernels, moves, names = kernel_counts(p.call, dev)
        _sync(dev)
        # The timed and counted steps' answers: the checked selection again, the output checked again.
        again = why[name]
        if not again:
            if s.indexed and not torch.equal(sorted_positions(s.topk_buffer), selections[name]):
                again = "indexer: the timed steps selected other rows than the checked step"
            else:
                again = checker.check_out(p, refs[name])
            if again:
                print(f"  {name}: WRONG after the timing ({again})", flush=True)
                run.failed |= name == OURS
        t = times[name]
        for metric, val in (*t.items(), ("kernels", kernels), ("copy_fill_kernels", moves), *counts.items()):
            run.add(name, spec.label, metric, val, method if metric.endswith("_us") else "")
        if again:
            run.add(name, spec.label, "wrong", 1.0)
        attn = ""
        if counts:
            attn = (f"; forward_mqa alone {t['attention_us']:.1f} us, {counts['attention_kernels']} kernels, "
                    f"{counts['attention_copy_fill_kernels']} copy/fill")  # fmt: skip
        print(f"  {name}: {t['time_us']:.1f} us [{method}], {kernels} kernels, {moves} copy/fill{attn}"
              f"{' WRONG' if again else ''}")  # fmt: skip
        print(f"    {'kernels' if not cpu else 'aten data-movement ops'}: {names}")
        cells[name] = (t, kernels, moves, again)
    ratio = "-"
    if OURS in cells and PEER in cells:
        r = cells[PEER][0]["time_us"] / cells[OURS][0]["time_us"]
        run.add(OURS, spec.label, f"speed_vs_{PEER}", r)
        ratio = f"{r:.2f}x"

    def cell(name: str, key: str = "time_us") -> str:
        if name not in cells or key not in cells[name][0]:
            return "-"
        return f"{cells[name][0][key]:.1f}" + (" WRONG" if cells[name][3] and key == "time_us" else "")

    def count(i: int) -> str:
        return "/".join(str(cells[n][i]) if n in cells else "-" for n in PROVIDERS)

    run.rows.append([spec.label, method, cell(OURS), cell(PEER), ratio, cell(OURS, "attention_us"),
                     cell(PEER, "attention_us"), count(1), count(2)])  # fmt: skip
    run.write()


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for v4_layer.csv")
    ap.add_argument("--quick", action="store_true", help="smaller steps (16 requests at 8K, a 2K prefill)")
    ap.add_argument("--steps", default="decode,mtp,prefill", help="comma-separated phases: decode, mtp, prefill")
    ap.add_argument("--kinds", default="csa,hca,window", help="comma-separated layer kinds: csa, hca, window")
    ap.add_argument("--cpu-smoke", action="store_true", help="no GPU: tiny steps in the Triton interpreter")
    ap.add_argument("--peers", default=".peers", help="accepted for perf/bench.py; vLLM itself is the peer")
    args = ap.parse_args()
    if args.cpu_smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("bench_v4_layer --cpu-smoke: needs TRITON_INTERPRET=1 (and no GPU)")
            return 2
        _interpreter_bf16()
        torch.manual_seed(0)
        dev, device_name, specs = torch.device("cpu"), "cpu (Triton interpreter)", STEPS["cpu-smoke"]
    else:
        gpu = start_bench("bench_v4_layer", copy=True)
        if gpu is None:
            return 2
        dev, device_name = gpu.dev, gpu.name
        specs = STEPS["quick" if args.quick else "full"]
    try:
        vc, vllm_version = setup_vllm(dev)
    except Exception as exc:
        print(f"bench_v4_layer: vLLM is not importable ({_reason(exc)}); on a GPU machine without it: "
              "source perf/vllm_on_device.sh")  # fmt: skip
        return 2
    if not vllm_version.startswith("0.34."):
        print(f"bench_v4_layer: written against vLLM 0.34's V4 ROCm layer, found {vllm_version}")
        return 2
    phases = {p.strip() for p in args.steps.split(",") if p.strip()}
    kinds = {k.strip() for k in args.kinds.split(",") if k.strip()}
    run = Run(device_name, vllm_version, Path(args.out))
    if not args.cpu_smoke:
        run.records.append(Record("copy", "torch", "2 GiB", "GB/s", gpu.copy_gbs, device_name, torch.__version__))
    print(f"{device_name}; vLLM {vllm_version}; torch {torch.__version__}", flush=True)
    for seed, spec in enumerate(specs):
        if spec.phase not in phases or spec.kind not in kinds:
            continue
        try:
            bench_step(run, spec, dev, vc, seed)
        except Exception as exc:
            print(f"  [{spec.label}] failed ({_reason(exc)})", flush=True)
            run.failed = True
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    how = "host clock, one call (nothing of a GPU)" if args.cpu_smoke else "the method column's timer"
    print(f"\n{KERNEL} on {device_name}: us per step ({how}); kernels and copy/fill kernels {OURS}/{PEER}")
    print_table(["step", "method", f"{OURS} us", f"{PEER} us", "vLLM/ours", f"{OURS} attn us", f"{PEER} attn us",
                 "kernels", "copy/fill"], run.rows)  # fmt: skip
    run.write()
    print(f"wrote {Path(args.out) / 'v4_layer.csv'}")
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
