#!/usr/bin/env python3
"""One DeepSeek-V3 MLA attention layer step, upstream composition vs rocm_mla, side by side:
time per step and the number of copy/cat/pad/fill kernels launched (torch.profiler).

    python perf/bench_layer.py [--out results] [--peers .peers] [--quick]

Heads per rank: 128 (TP1) and 16 (TP8). bf16 activations and cache, block 64, GPT-J RoPE.

decode step (B requests, each with `ctx` cached tokens, one new token):
  upstream  vLLM 0.33 on ROCm: torch RoPE (RotaryEmbedding.forward_static) + copy back into q,
            cat + index_copy_ cache write, q_nope @ W_UK_T (bmm), TRITON_MLA forward_mqa
            (torch.cat(ql_nope, q_pe), torch.zeros for o and lse, vLLM's Triton decode), then
            o @ W_UV into the layer output (bmm out=, in place upstream too)
  rocm_mla  fused_rope_mla_kv_write, the same W_UK bmm, mla_decode(q_nope, q_pe) into
            preallocated o/lse (no memset), the same W_UV bmm
prefill step (B sequences, `new` new tokens after `ctx` cached ones, one context chunk):
  both      kv_b_proj of the new tokens and of the gathered context chunk (matmuls, the same
            in both; the gather from the paged cache is the same index_select in both)
  upstream  k = cat(k_nope, k_pe.expand), v padded to 192 (F.pad), FlashAttention (SDPA's
            flash kernel with lse) causal on the new tokens and non-causal on the context,
            [..., :128] slices, vLLM's Triton merge_attn_states into the layer output
  rocm_mla  mla_prefill_with_context: strided k_nope/v, broadcast k_pe, out/lse in place,
            strided merge in place

The upstream decode needs vLLM's Triton kernels (../shared/peers/get_vllm_peers.sh .peers).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rocm_mla import __version__  # noqa: E402
from rocm_mla.ops import fused_rope_mla_kv_write, mla_decode, mla_prefill_with_context  # noqa: E402
from rocm_mla.tools.benchutil import (gpu_for, DATA_MOVEMENT_KERNELS, Record, bar_plot, data_movement_kind,  # noqa: E402
                                      device_name, load_vllm_peer, print_table, time_ms, write_csv)

P, R, V, L = 128, 64, 128, 512
BLOCK = 64
SCALE = 1.0 / math.sqrt(P + R)


def count_moves(fn, names: set[str] | None = None) -> dict[str, int]:
    """Device kernels of one call of ``fn`` that only move or fill data, by kind; their names are
    added to ``names`` (so that a reader can see what was counted)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    counts = {k: 0 for k, _ in DATA_MOVEMENT_KERNELS}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = data_movement_kind(ev.name)
        if kind is not None:
            counts[kind] += 1
            if names is not None:
                names.add(f"{kind}: {ev.name[:100]}")
    return counts


class Layer:
    """Weights and inputs of one layer step with N heads."""

    def __init__(self, N: int, dev: torch.device):
        dt = torch.bfloat16
        self.N, self.dev = N, dev
        self.w_uk_t = torch.randn(N, P, L, device=dev, dtype=dt) / math.sqrt(P)
        self.w_uv = torch.randn(N, L, V, device=dev, dtype=dt) / math.sqrt(L)
        self.w_kv_b = torch.randn(L, N * (P + V), device=dev, dtype=dt) / math.sqrt(L)
        inv = 1.0 / (10000 ** (torch.arange(0, R, 2, device=dev, dtype=torch.float32) / R))
        t = torch.arange(65536, device=dev, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        # [max_pos, 64] = cat(cos, sin), vLLM's layout, in the model dtype as forward_native casts it
        self.cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dt)


class DecodeStep:
    def __init__(self, layer: Layer, B: int, ctx: int, vllm_decode, sm_count: int):
        dev, N, dt = layer.dev, layer.N, torch.bfloat16
        self.layer, self.B, self.ctx = layer, B, ctx
        seq = ctx + 1
        blocks = math.ceil(seq / BLOCK)
        self.cache = torch.randn(B * blocks, BLOCK, L + R, device=dev, dtype=dt)
        self.table = torch.randperm(B * blocks, device=dev, dtype=torch.int32).view(B, blocks)
        self.seq_lens = torch.full((B,), seq, dtype=torch.int32, device=dev)
        self.positions = torch.full((B,), ctx, dtype=torch.int64, device=dev)
        pages = self.table[:, ctx // BLOCK].long()
        self.slots = pages * BLOCK + ctx % BLOCK
        self.q = torch.randn(B, N, P + R, device=dev, dtype=dt)
        self.kv_a = torch.randn(B, L + R, device=dev, dtype=dt)  # [kv_c | k_pe] from kv_a_proj
        self.output = torch.empty(B, N * V, device=dev, dtype=dt)
        self.o = torch.empty(B, N, L, device=dev, dtype=dt)
        self.lse = torch.empty(B, N, device=dev, dtype=torch.float32)
        self.vllm_decode = vllm_decode
        from bench_decode import vllm_num_kv_splits

        self.S = vllm_num_kv_splits(seq, sm_count)
        self.logits = torch.empty(B, N, self.S, L + 1, device=dev, dtype=torch.float32)
        self._saved = (self.q.clone(), self.kv_a.clone())

    def reset(self):
        """Restore the inputs RoPE rotates in place (for the cross-check; timing ignores it)."""
        self.q.copy_(self._saved[0])
        self.kv_a.copy_(self._saved[1])

    def _absorb(self):
        # [N, B, 128] @ [N, 128, 512] -> [N, B, 512], read as [B, N, 512] (a view, as in vLLM)
        return torch.bmm(self.q[..., :P].transpose(0, 1), self.layer.w_uk_t).transpose(0, 1)

    def _up(self, o):
        torch.bmm(o.transpose(0, 1), self.layer.w_uv, out=self.output.view(self.B, self.layer.N, V).transpose(0, 1))

    def ours(self):
        kv_c, k_pe = self.kv_a[:, :L], self.kv_a[:, L:].unsqueeze(1)
        fused_rope_mla_kv_write(self.positions, self.q[..., P:], k_pe, kv_c, self.layer.cos_sin, self.cache,
                                self.slots, is_neox=False)
        ql_nope = self._absorb()
        mla_decode(ql_nope, self.q[..., P:], self.cache, self.table, self.seq_lens, sm_scale=SCALE, out=self.o,
                   lse=self.lse, max_seq_len=self.ctx + 1)
        self._up(self.o)

    def upstream(self):
        from bench_rope_kv import unfused

        unfused(self.positions, self.q, self.kv_a, self.kv_a[:, :L], self.layer.cos_sin, self.cache,
                self.slots, None, None)
        ql_nope = self._absorb()
        q = torch.cat((ql_nope, self.q[..., P:]), dim=-1)
        o = torch.zeros(self.B, self.layer.N, L, dtype=q.dtype, device=q.device)
        lse = torch.zeros(self.B, self.layer.N, dtype=q.dtype, device=q.device)
        kv = self.cache.unsqueeze(2)
        one = torch.ones(1, device=q.device)
        self.vllm_decode(q, kv, kv[..., :L], o, lse, self.table, self.seq_lens, self.logits, self.S, SCALE,
                         BLOCK, k_scale=one, v_scale=one, is_mla=True)
        self._up(o)


class PrefillStep:
    def __init__(self, layer: Layer, B: int, new: int, ctx: int):
        dev, N, dt = layer.dev, layer.N, torch.bfloat16
        self.layer, self.B, self.new, self.ctx = layer, B, new, ctx
        T, Tc = B * new, B * ctx
        self.q = torch.randn(T, N, P + R, device=dev, dtype=dt)
        self.latent = torch.randn(T, L + R, device=dev, dtype=dt)  # new tokens' [kv_c | k_pe]
        # the cached context, in pages; gathered per step (an index copy in both compositions)
        self.ctx_pages = torch.randn(Tc // BLOCK + 1, BLOCK, L + R, device=dev, dtype=dt)
        self.ctx_rows = torch.randperm(self.ctx_pages.shape[0] * BLOCK, device=dev)[:Tc]
        self.cu_q = torch.arange(0, T + 1, new, dtype=torch.int32, device=dev)
        self.cu_c = torch.arange(0, Tc + 1, ctx, dtype=torch.int32, device=dev)
        self.output = torch.empty(T, N * V, device=dev, dtype=dt)
        self.lse = torch.empty(N, T, device=dev, dtype=torch.float32)

    def reset(self):
        pass

    def _up(self, latent):
        """kv_b_proj: [T, 512] -> k_nope [T, N, 128], v [T, N, 128] (strided views of one buffer)."""
        kv = (latent[:, :L] @ self.layer.w_kv_b).view(-1, self.layer.N, P + V)
        return kv[..., :P], kv[..., P:], latent[:, L:].unsqueeze(1)

    def _context(self):
        return self.ctx_pages.view(-1, L + R).index_select(0, self.ctx_rows)

    def ours(self):
        k_nope, v, k_pe = self._up(self.latent)
        ck, cv, cpe = self._up(self._context())
        mla_prefill_with_context(self.q, k_nope, k_pe, v, self.cu_q, self.cu_q, [(ck, cpe, cv, self.cu_c, self.ctx)],
                                 sm_scale=SCALE, out=self.output.view(-1, self.layer.N, V), lse=self.lse,
                                 max_seqlen_q=self.new, max_seqlen_k=self.new)

    def _flash(self, q, k_nope, k_pe, v, Lq, Lk, causal):
        """The upstream-shaped FlashAttention call: cat k, pad v, [B, N, L, D] views, lse."""
        N, B = self.layer.N, self.B
        k = torch.cat([k_nope, k_pe.expand(-1, N, R)], dim=-1)
        vp = F.pad(v, [0, P + R - V])
        bhsd = lambda x, n: x.view(B, n, N, x.shape[-1]).transpose(1, 2)  # noqa: E731
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            bhsd(q, Lq), bhsd(k, Lk), bhsd(vp, Lk), 0.0, causal, False, scale=SCALE)[:2]
        # [B, N, Lq, 192] -> [T, N, 192] view; lse [B, N, Lq] -> [N, T]
        return out.transpose(1, 2).reshape(B * Lq, N, P + R), lse.transpose(0, 1).reshape(N, B * Lq)

    def upstream(self, vllm_merge):
        k_nope, v, k_pe = self._up(self.latent)
        o_new, l_new = self._flash(self.q, k_nope, k_pe, v, self.new, self.new, True)
        ck, cv, cpe = self._up(self._context())
        o_ctx, l_ctx = self._flash(self.q, ck, cpe, cv, self.new, self.ctx, False)
        vllm_merge(self.output.view(-1, self.layer.N, V), o_ctx[..., :V], l_ctx, o_new[..., :V], l_new, self.lse)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results", help="folder for layer.csv and layer.png")
    ap.add_argument("--peers", default=".peers", help="folder made by get_vllm_peers.sh")
    ap.add_argument("--quick", action="store_true", help="smaller batches")
    args = ap.parse_args()
    dev = gpu_for("bench_layer")
    if dev is None:
        return 2
    decode_attention_fwd = load_vllm_peer(args.peers, "triton_decode_attention", "decode_attention_fwd")
    vllm_merge = load_vllm_peer(args.peers, "triton_merge_attn_states", "merge_attn_states")
    if decode_attention_fwd is None or vllm_merge is None:
        print("bench_layer: vLLM's Triton kernels are needed for the upstream side")
        return 2
    name = device_name(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    B_dec, ctx_dec = (32, 2048) if args.quick else (64, 4096)
    # One sequence: SDPA returns lse as [B, N, L], and for B > 1 turning that into vLLM's [N, T]
    # would need a copy that upstream's varlen FlashAttention does not make.
    B_pre, new_pre, ctx_pre = (1, 2048, 4096) if args.quick else (1, 4096, 8192)
    rows, records, groups = [], [], []
    series: dict[str, list[float]] = {"upstream": [], "rocm_mla": []}
    for N, tp in ((128, "TP1"), (16, "TP8")):
        layer = Layer(N, dev)
        steps = [(f"decode {tp} N={N} B={B_dec} ctx={ctx_dec}", DecodeStep(layer, B_dec, ctx_dec, decode_attention_fwd, sms)),
                 (f"prefill {tp} N={N} {B_pre}x{new_pre} new + {ctx_pre} ctx", PrefillStep(layer, B_pre, new_pre, ctx_pre))]
        for label, step in steps:
            calls = {"upstream": (lambda s=step: s.upstream(vllm_merge)) if isinstance(step, PrefillStep) else step.upstream,
                     "rocm_mla": step.ours}
            res, outs = {}, {}
            for prov, fn in calls.items():
                step.reset()
                step.output.fill_(float("nan"))
                fn()
                outs[prov] = step.output.float().clone()
                ms = time_ms(fn)
                kernel_names: set[str] = set()
                moves = count_moves(fn, kernel_names)
                for k in sorted(kernel_names):
                    print(f"    [{prov} {label}] {k}")
                res[prov] = (ms, moves)
                records.append(Record("layer_step", prov, label, "time_us", ms * 1e3, name, __version__))
                for kind, n in moves.items():
                    records.append(Record("layer_step", prov, label, f"{kind}_kernels", n, name, __version__))
                series[prov].append(ms * 1e3)
            err = ((outs["rocm_mla"] - outs["upstream"]).norm() / outs["upstream"].norm()).item()
            if not err < 2e-2:  # bf16 compositions agree to ~1e-2 relative; NaN fails too
                print(f"  {label}: rocm_mla and upstream DISAGREE (relative error {err:.3g})")
            records.append(Record("layer_step", "rocm_mla", label, "rel_err_vs_upstream", err, name, __version__))
            groups.append(label)
            fmt = lambda m: "/".join(str(m[k]) for k in ("cat", "pad", "copy", "fill")) + f" ={sum(m.values())}"  # noqa: E731
            rows.append([label, f"{res['upstream'][0] * 1e3:.0f}", f"{res['rocm_mla'][0] * 1e3:.0f}",
                         f"{res['upstream'][0] / res['rocm_mla'][0]:.2f}x", fmt(res["upstream"][1]), fmt(res["rocm_mla"][1])])
        del layer
        torch.cuda.empty_cache()
    print(f"\nMLA layer step on {name}, bf16: time (us) and data-movement kernels (cat/pad/copy/fill)")
    print_table(["step", "upstream us", "rocm_mla us", "speed-up", "upstream moves", "rocm_mla moves"], rows)
    print("(upstream's decode copies include its cache write's index_copy_. The context gather from the "
          "paged cache, the same index_select in both, matches no pattern and is not counted; rocm_mla's "
          "attention path itself launches none: perf/bench_layer_copies.py)")
    out = Path(args.out)
    write_csv(out / "layer.csv", records)
    bar_plot(out / "layer.png", f"MLA layer step on {name}", groups, series, "us per step")
    print(f"wrote {out / 'layer.csv'} and {out / 'layer.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
