#!/usr/bin/env python3
"""The attention path of one sparse MLA layer step (DeepSeek-V3.2 / GLM-5.x: the lightning indexer's
top-k, then sparse attention) on rocm_mla beside vLLM 0.34's ROCm Triton composition: whole-path time,
kernels launched and copy/fill kernels among them, every timed output checked.

    python perf/bench_sparse_layer.py [--out results] [--peers .peers] [--steps decode,prefill]

Steps (topk 2048; indexer 64 heads x 128 fp8 with folded weights, its cache in vLLM's ROCm layout;
N = 16 attention heads, DeepSeek-V3.2 at TP 8; page size 64; bf16 latent cache and q):
  decode   64 requests x 1 row at context 32768
  prefill  one 8192-token prompt (8192 causal rows; longer than topk, so the rows run sparse)

Providers (the same inputs; what runs after vLLM's fused_norm_rope / fused_q, before W_UV):
  rocm_mla       mla_indexer_topk into the top-k buffer, mla_sparse_attention reading it with
                 req_id_per_token and the block table (ROCM_MLA_SPARSE's forward_mqa); plans and
                 the indexer's workspace made once outside the timing, as a step does for its layers.
  vllm-0.34      decode: rocm_fp8_paged_mqa_logits_triton ([T, max_model_len] float32 logits) +
                 torch.topk (standing in for vLLM's top_k_per_row_decode); prefill:
                 cp_gather_indexer_k_quant_cache_triton + fp8_mqa_logits_torch in row pieces +
                 torch.topk (vLLM's ROCm path without aiter); then triton_convert_req_index_to_global_index
                 (positions -> cache slots, a [T, 2048] int32 temporary), the torch.cat of ql_nope
                 and q_pe vLLM's sparse impl makes, and rocm_sparse_attn_prefill (vLLM's Triton sparse
                 attention; its split-K decode kernel does not compile on Triton 3.6). Its top-k
                 positions are shifted to request-local ones for the prefill (vLLM's localisation).
Timing: decode as CUDA/HIP graphs of 8 calls (benchutil.rotating_graph_us; 277 MB of index cache, so
HBM-bound by size), prefill eagerly (benchutil.time_ms: the torch peer runs for a second).
Counting: one eager call of each path under torch.profiler (bench_layer_copies.count_data_movement):
GPU kernels, and among them copy / cat / pad / fill kernels by name.
Checked: each provider's top-k on its first CHECK_ROWS rows as a valid top-k of the float64 logits,
and its attention output on those rows against mla_sparse_attention_ref over its own selection.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_indexer import load_vllm_indexer, prefill_rows  # noqa: E402
from bench_layer_copies import count_data_movement  # noqa: E402
from bench_sparse import load_vllm_sparse  # noqa: E402
from benchutil import Record, print_table, start_bench, write_csv  # noqa: E402

from rocm_mla import __version__  # noqa: E402
from rocm_mla.cases import indexer_topk  # noqa: E402
from rocm_mla.cases.indexer_topk import IndexerShape  # noqa: E402
from rocm_mla.mla_dims import KV_LORA_RANK as L  # noqa: E402
from rocm_mla.mla_dims import KV_ROW_DIM as D  # noqa: E402
from rocm_mla.ops import mla_indexer_topk, mla_sparse_attention, plan_sparse_attention  # noqa: E402
from rocm_mla.reference import mla_sparse_attention_ref  # noqa: E402
from rocm_mla.reference.indexer_topk import check_indexer_topk  # noqa: E402
from rocm_mla.tools.timing import rotating_graph_us, time_ms  # noqa: E402

KERNEL = "sparse_layer_attention"
N, TOPK, BLOCK, INDEX_HEADS = 16, 2048, 64, 64
DTYPE = torch.bfloat16
CHECK_ROWS = 4
STEPS = {
    "decode": IndexerShape.decode(64, 32768, INDEX_HEADS, topk=TOPK, block=BLOCK),
    "prefill": IndexerShape((8192,), (8192,), INDEX_HEADS, topk=TOPK, block=BLOCK),
}


class Step:
    """One step's inputs: the indexer's (rocm_mla.cases.indexer_topk, one cache copy) and a bf16
    latent cache on the same pages and block table."""

    def __init__(self, name: str, dev: torch.device):
        self.name, self.shape, self.dev = name, STEPS[name], dev
        self.case = indexer_topk.make_inputs(self.shape, device=dev, copies=1)
        c, T = self.case, self.shape.T
        g = torch.Generator(device=dev).manual_seed(5)
        pages = c.caches[0].shape[0]
        self.kv = torch.randn(pages, BLOCK, D, generator=g, device=dev).to(DTYPE)
        self.q_nope = torch.randn(T, N, L, generator=g, device=dev).to(DTYPE)
        self.q_pe = torch.randn(T, N, D - L, generator=g, device=dev).to(DTYPE)
        self.sm_scale = 192**-0.5
        self.out = torch.empty(T, N, L, dtype=DTYPE, device=dev)
        self.label = f"{name} {self.shape.label()} N={N}"

    def attention_mismatch(self, out: torch.Tensor, sel: torch.Tensor, slots: bool) -> str:
        """'' when ``out``'s first rows match the float32 reference over ``sel`` (positions with
        the block table, or global slots)."""
        r = CHECK_ROWS
        c = self.case
        table, req = (None, None) if slots else (c.tables[0], c.req_ids[:r])
        ref, _ = mla_sparse_attention_ref(self.q_nope[:r], self.q_pe[:r], self.kv, sel[:r], table, req, self.sm_scale)
        err = (out[:r].float() - ref).abs().max().item()
        # bf16 q, cache and output against float32: the output's own rounding and the
        # probabilities' (2^-8 relative).
        return "" if err <= 3e-2 * max(1.0, ref.abs().max().item()) else f"attention: max |err| {err:.3g}"


def ours(s: Step):
    c = s.case
    iplan = c.plan()
    ws = torch.empty(iplan.workspace_numel, dtype=torch.int32, device=s.dev) if iplan.workspace_numel else None
    buf = torch.empty(s.shape.T, TOPK, dtype=torch.int32, device=s.dev)
    splan = plan_sparse_attention(
        num_rows=s.shape.T, num_heads=N, topk=TOPK, block_size=BLOCK, q_dtype=DTYPE,
        kv_dtype=DTYPE, device=s.dev, paged=True, k_scale_on_device=False,
    )  # fmt: skip
    lse = torch.empty(s.shape.T, N, dtype=torch.float32, device=s.dev)

    def call(i: int = 0):
        mla_indexer_topk(*c.args(0), topk=TOPK, out=buf, plan=iplan, workspace=ws)
        mla_sparse_attention(
            s.q_nope, s.q_pe, s.kv, buf, c.tables[0], c.req_ids, sm_scale=s.sm_scale, out=s.out, lse=lse, plan=splan
        )
        return s.out

    def check() -> str:
        r = CHECK_ROWS
        why = check_indexer_topk(buf[:r], c.logits(r), TOPK)
        return why or s.attention_mismatch(s.out, buf, slots=False)

    return call, check


def vllm(s: Step, idx_mod, sparse_mods):
    """(call, check, note) of vLLM's composition; (None, None, why) when it cannot run."""
    if idx_mod is None or not sparse_mods:
        return None, None, "vLLM peers missing (perf/peers/get_vllm_sparse_peers.sh)"
    sys.path.insert(0, str(Path(sparse_mods["rocm"].__file__).parent))
    import rocm_convert

    c, T, dev = s.case, s.shape.T, s.dev
    idx_mod.FP8_DTYPE = c.fp8
    B = len(s.shape.lens)
    mml = c.tables[0].shape[1] * BLOCK
    vals = torch.empty(T, TOPK, dtype=torch.float32, device=dev)
    idx = torch.empty(T, TOPK, dtype=torch.int64, device=dev)
    slots = torch.empty(T * TOPK, dtype=torch.int32, device=dev)
    cu = torch.arange(T + 1, dtype=torch.int32, device=dev) * TOPK
    out = torch.empty(T, N, L, dtype=DTYPE, device=dev)
    flat_kv = s.kv.view(-1, 1, D)
    if s.name == "decode":
        nn = s.shape.rows[0]
        cache = c.caches[0].clone()
        nb = cache.shape[0]
        v = cache.view(nb, -1)[:, : BLOCK * 128]
        v.copy_(idx_mod._unshuffle_indexer_k_values(c.caches[0].view(nb, -1)[:, : BLOCK * 128], BLOCK, 128))
        q4 = c.q.view(B, nn, INDEX_HEADS, 128)
        lens = torch.tensor(s.shape.lens, dtype=torch.int32, device=dev)
        (logits,) = idx_mod.current_workspace_manager().get_simultaneous(((T, mml), torch.float32))
        logits.fill_(float("-inf"))
        starts = None

        def topk_positions():
            lg = idx_mod.rocm_fp8_paged_mqa_logits_triton(q4, cache, c.weights, lens, c.tables[0], mml)
            torch.topk(lg, TOPK, dim=1, out=(vals, idx))
            return idx

        note = ""
    else:
        keys = int(sum(s.shape.lens))
        lens64 = torch.tensor(s.shape.lens, dtype=torch.int64, device=dev)
        cu_k = torch.zeros(B + 1, dtype=torch.int32, device=dev)
        cu_k[1:] = torch.cumsum(lens64, 0).to(torch.int32)
        t2s = torch.repeat_interleave(torch.arange(B, dtype=torch.int32, device=dev), lens64)
        k_fp8 = torch.empty(keys, 128, dtype=c.fp8, device=dev)
        k_scale = torch.empty(keys, 4, dtype=torch.uint8, device=dev)
        starts = cu_k[c.req_ids[:T].long()]
        ends = starts + c.kv_lens[:T]
        m = min(T, prefill_rows(s.shape, keys))

        def topk_positions():
            idx_mod.cp_gather_indexer_k_quant_cache_triton(c.caches[0], k_fp8, k_scale, c.tables[0], cu_k, t2s)
            kv = (k_fp8, k_scale.view(torch.float32))
            for r0 in range(0, T, m):
                r1 = min(T, r0 + m)
                lg = idx_mod.fp8_mqa_logits_torch(c.q[r0:r1], kv, c.weights[r0:r1], starts[r0:r1], ends[r0:r1])
                torch.topk(lg, TOPK, dim=1, out=(vals[r0:r1], idx[r0:r1]))
            # request-local positions (vLLM localises its prefill top-k), -1 for a row's -inf
            # columns (fewer keys than TOPK)
            torch.sub(idx, starts[:, None], out=idx)
            return idx.masked_fill_(vals == float("-inf"), -1)

        note = f"{-(-T // m)} pieces of {m} rows"

    pos32 = torch.empty(T, TOPK, dtype=torch.int32, device=dev)

    def call(i: int = 0):
        pos32.copy_(topk_positions())  # torch.topk's int64 -> int32 (vLLM's own top-k writes int32)
        rocm_convert.triton_convert_req_index_to_global_index(
            c.req_ids[:T],
            c.tables[0],
            pos32,
            cu,
            slots,
            BLOCK_STRIDE_ROWS=BLOCK,
            BLOCK_SIZE=BLOCK,
            NUM_TOPK_TOKENS=TOPK,
        )
        q = torch.cat((s.q_nope, s.q_pe), dim=-1)
        sparse_mods["rocm"].rocm_sparse_attn_prefill(
            q, flat_kv, slots.view(T, 1, TOPK), None, s.sm_scale, D, L, D - L, None, out
        )
        return out

    def check() -> str:
        r = CHECK_ROWS
        why = check_indexer_topk(pos32[:r], c.logits(r), TOPK)
        return why or s.attention_mismatch(out, slots.view(T, TOPK), slots=True)

    return call, check, note


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results", help="folder for sparse_layer.csv")
    ap.add_argument("--peers", default=".peers", help="folder with vllm_sparse/ (get_vllm_sparse_peers.sh)")
    ap.add_argument("--steps", default="decode,prefill", help="comma-separated: decode, prefill")
    args = ap.parse_args()
    gpu = start_bench("bench_sparse_layer", copy=True)
    if gpu is None:
        return 2
    dev, name = gpu.dev, gpu.name
    idx_mod = load_vllm_indexer(args.peers)
    sparse_mods = load_vllm_sparse(args.peers)
    records = [Record("copy", "torch", "2 GiB", "GB/s", gpu.copy_gbs, name, torch.__version__)]
    rows, failed = [], False
    for step in [x.strip() for x in args.steps.split(",") if x.strip()]:
        print(f"[{step}] making inputs", flush=True)
        s = Step(step, dev)
        results = {}
        for provider in ("rocm_mla", "vllm-0.34"):
            try:
                if provider == "rocm_mla":
                    (call, check), note = ours(s), ""
                else:
                    call, check, note = vllm(s, idx_mod, sparse_mods)
                if call is None:
                    print(f"  {provider}: skipped ({note})")
                    continue
                call()
                torch.cuda.synchronize()
                why = check()
                if why:
                    print(f"  {provider}: WRONG ({why})")
                    failed |= provider == "rocm_mla"
                us = rotating_graph_us(call, 1) if step == "decode" else 1000 * time_ms(call, warmup_ms=0, rep_ms=1)
                counts = count_data_movement(call)
                kernels = sum(counts["kernel_names"].values())
                moves = sum(counts["kernels"].values())
                results[provider] = us
                print(f"  {provider}: {us:.1f} us, {kernels} kernels, {moves} copy/fill {note}")
                print(f"    kernels: {dict(counts['kernel_names'])}")
                for metric, val in (("time_us", us), ("kernels", kernels), ("copy_fill_kernels", moves)):
                    records.append(Record(KERNEL, provider, s.label, metric, val, name, __version__))
                if why:
                    records.append(Record(KERNEL, provider, s.label, "wrong", 1.0, name, __version__))
            except Exception as exc:  # a peer that fails is reported, the run goes on
                print(f"  {provider}: failed ({type(exc).__name__}: {str(exc)[:300]})")
                failed |= provider == "rocm_mla"
        if "rocm_mla" in results and "vllm-0.34" in results:
            ratio = results["vllm-0.34"] / results["rocm_mla"]
            records.append(Record(KERNEL, "rocm_mla", s.label, "speed_vs_vllm-0.34", ratio, name, __version__))
        rows.append([s.label] + [f"{results[p]:.1f}" if p in results else "-" for p in ("rocm_mla", "vllm-0.34")])
        s = None
        torch.cuda.empty_cache()
        write_csv(Path(args.out) / "sparse_layer.csv", records)
    print_table(["step", "rocm_mla us", "vllm-0.34 us"], rows)
    print(f"wrote {Path(args.out) / 'sparse_layer.csv'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
