#!/usr/bin/env python3
"""One DeepSeek-V3 MLA attention layer step, upstream composition vs rocm_mla, side by side:
time per step and the number of copy/cat/pad/fill kernels launched (torch.profiler).

    python perf/bench_layer.py [--out results] [--peers .peers] [--quick]

Heads per rank: 128 (TP1) and 16 (TP8). bf16 activations and cache, block 64, GPT-J RoPE.

decode step (B requests, each with `ctx` cached tokens, one new token):
  upstream  vLLM 0.33 on ROCm: torch RoPE (RotaryEmbedding.forward_static) + copy back into q,
            cat + index_copy_ cache write (stand-in for vLLM's compiled concat_and_cache_mla,
            which needs vLLM's GPU build), q_nope @ W_UK_T (bmm), TRITON_MLA forward_mqa
            (torch.cat(ql_nope, q_pe), torch.zeros for o and lse, vLLM's Triton decode), then
            o @ W_UV into the layer output (bmm out=, in place upstream too)
  rocm_mla_nopass  ROCM_MLA without vLLM's fuse_rope_kvcache_cat_mla pass: the same torch RoPE +
            copy back, then the backend's KV write (rocm_mla.concat_and_cache_mla), the same W_UK
            bmm, mla_decode into preallocated o/lse, the same W_UV bmm
  rocm_mla  ROCM_MLA with the pass (docker/serve.sh's default): fused_rope_mla_kv_write (one
            kernel: RoPE of q_pe/k_pe in place + cache write), then as rocm_mla_nopass
prefill step (B sequences, `new` new tokens after `ctx` cached ones, one context chunk):
  both      kv_b_proj of the new tokens and of the gathered context chunk (matmuls, the same
            in both; the gather from the paged cache is the same index_select in both)
  upstream  k = cat(k_nope, k_pe.expand), v padded to 192 (F.pad), FlashAttention (SDPA's
            flash kernel with lse) causal on the new tokens and non-causal on the context,
            [..., :128] slices, vLLM's Triton merge_attn_states into the layer output
  rocm_mla  mla_prefill_with_context: strided k_nope/v, broadcast k_pe, out/lse in place,
            strided merge in place

RoPE + KV write alone (second table), per decode batch (B tokens) and prefill (new tokens):
  upstream    torch RoPE + copy back + cat/index_copy_ cache write (as above)
  nopass      torch RoPE + copy back + rocm_mla.concat_and_cache_mla (ROCM_MLA without the pass)
  fused       rocm_mla.fused_rope_mla_kv_write called directly
  vllm_op     torch.ops.vllm.fused_rope_unified_mla_kv_cache_update, the op the pass puts in the
              graph, dispatched to rocm_mla's kernel by the plugin (rocm_mla/vllm/fused_rope_kv_op.py)
              for a ROCM_MLA layer: measures the eager dispatch cost (Python + forward context);
              inside vLLM's CUDA graphs that cost is not paid. Needs vLLM importable
              (perf/vllm_on_device.sh); skipped with a note otherwise.

The upstream decode needs vLLM's Triton kernels (perf/peers/get_vllm_peers.sh .peers).
`python perf/bench_layer.py --check-rope-kv` runs only the RoPE + KV write variants once on tiny
shapes and checks each against the float32 reference and against each other (check_rope_kv; also
on CPU, in the Triton interpreter; no timing).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if "--check-rope-kv" in sys.argv and not torch.cuda.is_available():
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit runs

from benchutil import (
    DATA_MOVEMENT_KERNELS,
    Record,
    bench_parser,
    data_movement_kind,
    load_vllm_peer,
    print_table,
    start_bench,
    vllm_forward_static,
    vllm_num_kv_splits,
    vllm_triton_mla_decode,
    vllm_unfused_rope_kv_write,
    write_csv,
)

from rocm_mla import __version__
from rocm_mla.cases import Bound, compare, first_problem, generator, paged_cache, rope_kv_write
from rocm_mla.cases.decode import call_decode
from rocm_mla.cases.rope_kv_write import ONE_MODEL_ROUNDING, RopeShape
from rocm_mla.mla_dims import KV_LORA_RANK, PREFILL_DIMS
from rocm_mla.ops import (
    concat_and_cache_mla,
    fused_rope_mla_kv_write,
    mla_prefill_with_context,
    plan_prefill_with_context,
)
from rocm_mla.reference.rope_kv_write import rope_cos_sin_cache
from rocm_mla.tools.timing import time_ms

# The vLLM layer-step harness lives with the tests (tests/vllm_harness).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

P, R, V, L = *PREFILL_DIMS, KV_LORA_RANK  # 128, 64, 128, 512
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
        # [max_pos, 64] = cat(cos, sin), vLLM's layout, in the model dtype as forward_native casts it
        self.cos_sin = rope_cos_sin_cache(65536, dtype=dt, device=dev)


class DecodeStep:
    def __init__(self, layer: Layer, B: int, ctx: int, vllm_decode, sm_count: int):
        dev, N, dt = layer.dev, layer.N, torch.bfloat16
        self.layer, self.B, self.ctx = layer, B, ctx
        seq = ctx + 1
        blocks = math.ceil(seq / BLOCK)
        # rocm_mla.cases' paged cache: shuffled pages, every slot finite (the step writes slot ctx)
        paged = paged_cache(
            [seq] * B, BLOCK, dtype=dt, device=dev, gen=generator(0, dev), spare_pages=0, spare_cols=0, unused="randn"
        )
        self.cache, self.table = paged.cache, paged.table
        assert self.table.shape == (B, blocks)
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
        self.S = vllm_num_kv_splits(seq, sm_count)
        self.logits = torch.empty(B, N, self.S, L + 1, device=dev, dtype=torch.float32)
        self.one = torch.ones(1, device=dev)  # k_scale / v_scale: layer._k_scale is a tensor made once
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
        fused_rope_mla_kv_write(
            self.positions, self.q[..., P:], k_pe, kv_c, self.layer.cos_sin, self.cache, self.slots, is_neox=False
        )
        ql_nope = self._absorb()
        call_decode(
            ql_nope,
            self.q[..., P:],
            self.cache,
            self.table,
            self.seq_lens,
            sm_scale=SCALE,
            out=self.o,
            lse=self.lse,
            max_seq_len=self.ctx + 1,
        )
        self._up(self.o)

    def ours_nopass(self):
        """ROCM_MLA without the fusion pass: vLLM's torch RoPE, then the backend's KV write."""
        q_rot, k_rot = vllm_forward_static(
            self.positions, self.q[..., P:], self.kv_a[:, L:].unsqueeze(1), self.layer.cos_sin
        )
        self.q[..., P:] = q_rot
        concat_and_cache_mla(self.kv_a[:, :L], k_rot, self.cache, self.slots)
        ql_nope = self._absorb()
        call_decode(
            ql_nope,
            self.q[..., P:],
            self.cache,
            self.table,
            self.seq_lens,
            sm_scale=SCALE,
            out=self.o,
            lse=self.lse,
            max_seq_len=self.ctx + 1,
        )
        self._up(self.o)

    def upstream(self):
        vllm_unfused_rope_kv_write(
            self.positions, self.q, self.kv_a, self.kv_a[:, :L], self.layer.cos_sin, self.cache, self.slots, None, None
        )
        o = vllm_triton_mla_decode(
            self.vllm_decode,
            self._absorb(),
            self.q[..., P:],
            self.cache,
            self.table,
            self.seq_lens,
            self.logits,
            SCALE,
            self.one,
        )
        self._up(o)


class PrefillStep:
    def __init__(self, layer: Layer, B: int, new: int, ctx: int):
        dev, N, dt = layer.dev, layer.N, torch.bfloat16
        self.layer, self.B, self.new, self.ctx = layer, B, new, ctx
        T, Tc = B * new, B * ctx
        self.q = torch.randn(T, N, P + R, device=dev, dtype=dt)
        self.latent = torch.randn(T, L + R, device=dev, dtype=dt)  # new tokens' [kv_c | k_pe]
        # The cached context in rocm_mla.cases' paged cache (shuffled pages, every slot finite),
        # gathered per step through its block table (an index copy in both compositions).
        paged = paged_cache(
            [ctx] * B, BLOCK, dtype=dt, device=dev, gen=generator(1, dev), spare_pages=0, spare_cols=0, unused="randn"
        )
        self.ctx_pages = paged.cache
        tok = torch.arange(ctx, device=dev)
        self.ctx_rows = (paged.table[:, tok // BLOCK].long() * BLOCK + tok % BLOCK).flatten()  # [B * ctx] slots
        assert self.ctx_rows.shape == (Tc,)
        self.cu_q = torch.arange(0, T + 1, new, dtype=torch.int32, device=dev)
        self.cu_c = torch.arange(0, Tc + 1, ctx, dtype=torch.int32, device=dev)
        self.output = torch.empty(T, N * V, device=dev, dtype=dt)
        self.lse = torch.empty(N, T, device=dev, dtype=torch.float32)
        # Made once from the new tokens' sizes, as a serving step makes it for every layer.
        self.plan = plan_prefill_with_context(
            batch=B, num_heads=N, q_rows=T, k_rows=T, q_dtype=dt, device=dev, max_seqlen_q=new, max_seqlen_k=new
        )

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
        mla_prefill_with_context(
            self.q,
            k_nope,
            k_pe,
            v,
            self.cu_q,
            self.cu_q,
            [(ck, cpe, cv, self.cu_c, self.ctx)],
            sm_scale=SCALE,
            out=self.output.view(-1, self.layer.N, V),
            lse=self.lse,
            plan=self.plan,
        )

    def _flash(self, q, k_nope, k_pe, v, Lq, Lk, causal):
        """The upstream-shaped FlashAttention call: cat k, pad v, [B, N, L, D] views, lse."""
        N, B = self.layer.N, self.B
        k = torch.cat([k_nope, k_pe.expand(-1, N, R)], dim=-1)
        vp = F.pad(v, [0, P + R - V])
        bhsd = lambda x, n: x.view(B, n, N, x.shape[-1]).transpose(1, 2)  # noqa: E731
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            bhsd(q, Lq), bhsd(k, Lk), bhsd(vp, Lk), 0.0, causal, False, scale=SCALE
        )[:2]
        # [B, N, Lq, 192] -> [T, N, 192] view; lse [B, N, Lq] -> [N, T]
        return out.transpose(1, 2).reshape(B * Lq, N, P + R), lse.transpose(0, 1).reshape(N, B * Lq)

    def upstream(self, vllm_merge):
        k_nope, v, k_pe = self._up(self.latent)
        o_new, l_new = self._flash(self.q, k_nope, k_pe, v, self.new, self.new, True)
        ck, cv, cpe = self._up(self._context())
        o_ctx, l_ctx = self._flash(self.q, ck, cpe, cv, self.new, self.ctx, False)
        vllm_merge(self.output.view(-1, self.layer.N, V), o_ctx[..., :V], l_ctx, o_new[..., :V], l_new, self.lse)


class RopeKV:
    """RoPE of q_pe / k_pe + the latent KV-cache write of T new tokens, in the variants of the
    module docstring, on rocm_mla.cases.rope_kv_write's inputs: q [T, N, 192] (q_pe = q[..., 128:]),
    kv_a [T, 576] (k_pe = kv_a[:, 512:]), kv_c [T, 512] (kv_a_layernorm's output), a NaN-poisoned
    cache [blocks, 64, 576] in q's dtype, slots drawn without repeats from a quarter more slots than
    tokens, random positions."""

    def __init__(self, N: int, T: int, dev: torch.device, cos_sin: torch.Tensor, dtype=torch.bfloat16):
        self.N, self.T, self.dev, self.cos_sin = N, T, dev, cos_sin
        self.case = rope_kv_write.make_inputs(RopeShape(T, N, block=BLOCK), dtype=dtype, device=dev, cos_sin=cos_sin)
        c = self.case
        self.q, self.kv_a, self.kv_c, self.positions, self.slots = c.q, c.kv_a, c.kv_c, c.positions, c.slots
        self.cache = c.cache
        self._vllm = None  # (layer step, forward-context factory), built on first use

    def reset(self):
        """The inputs and the cache as drawn (the variants rotate q_pe / k_pe in place)."""
        self.case.restore()

    def upstream(self):
        vllm_unfused_rope_kv_write(
            self.positions, self.q, self.kv_a, self.kv_c, self.cos_sin, self.cache, self.slots, None, None
        )

    def nopass(self):
        q_rot, k_rot = vllm_forward_static(self.positions, self.q[..., P:], self.kv_a[:, L:].unsqueeze(1), self.cos_sin)
        self.q[..., P:] = q_rot
        concat_and_cache_mla(self.kv_c, k_rot, self.cache, self.slots)

    def fused(self):
        fused_rope_mla_kv_write(
            self.positions,
            self.q[..., P:],
            self.kv_a[:, L:],
            self.kv_c,
            self.cos_sin,
            self.cache,
            self.slots,
            is_neox=False,
        )

    def vllm_op_context(self):
        """A context manager under which :meth:`vllm_op` runs: a ROCM_MLA MLAAttention layer
        registered with vLLM (harness.LayerStep), its kv_cache bound to this cache, and vLLM's
        forward context with this slot mapping. Raises if vLLM or the plugin's override is missing."""
        from vllm.forward_context import set_forward_context
        from vllm.utils.torch_utils import _encode_layer_name
        from vllm_harness import layer_step as harness

        from rocm_mla.vllm import fused_rope_kv_op
        from rocm_mla.vllm.backend import RocmMLABackend

        if self._vllm is None:
            step = harness.LayerStep(
                RocmMLABackend,
                [harness.Request(0, 1)],
                num_heads=self.N,
                dtype=self.q.dtype,
                device=self.dev,
                block_size=BLOCK,
            )
            self._vllm = (step, _encode_layer_name(step.layer.layer_name))
        step, self._ln = self._vllm
        if not fused_rope_kv_op.installed():
            raise RuntimeError(f"the plugin's override is not installed ({fused_rope_kv_op.last_error()})")
        step.layer.kv_cache = self.cache
        name = step.layer.layer_name
        return set_forward_context({name: None}, step.vllm_config, slot_mapping={name: self.slots})

    def vllm_op(self):
        torch.ops.vllm.fused_rope_unified_mla_kv_cache_update(
            self.positions,
            self.q[..., P:],
            self.kv_a[:, L:],
            self.kv_c,
            self.cos_sin,
            False,
            "auto",
            self._vllm[0].layer._k_scale,
            self._ln,
        )


def setup_vllm_op(dev: torch.device) -> str | None:
    """Make the vLLM op path available (simulated ROCm platform, the plugin registered, vLLM's
    fusion module importable with the compiled-op schemas it looks up stubbed); None when it is,
    else why not."""
    try:
        from vllm_harness import layer_step as harness

        from rocm_mla.vllm import fused_rope_kv_op

        harness.use_simulated_gfx942_platform()
        harness.stub_vllm_compiled_op_schemas()
        import rocm_mla.vllm as rocm_vllm

        rocm_vllm.register()
        keys = ("CUDA",) if dev.type == "cuda" else ("CUDA", "CPU")
        if not fused_rope_kv_op.install(keys):
            return fused_rope_kv_op.last_error()
        return None
    except Exception as e:  # noqa: BLE001 - an optional column
        return f"{type(e).__name__}: {e}"


ROPE_KV_VARIANTS = ("upstream", "nopass", "fused", "vllm_op")


def check_rope_kv(dev: torch.device, N: int = 4, T: int = 7) -> dict[str, str | None]:
    """Run every RoPE + KV write variant once on the same inputs (bf16 on a GPU, float32 on CPU);
    per variant '' when it holds, else what differs (None: vllm_op skipped, vLLM cannot be set up).

    Each variant against the float32 reference (rocm_mla.cases.rope_kv_write): the fused ones
    (fused, vllm_op) under the op's TOLERANCE (q_pe, k_pe, the written rows), the unfused ones
    (upstream, nopass: torch RoPE in the model dtype, k_pe left unrotated in kv_a, as vLLM's
    unfused path leaves it) under its "unfused" bounds; every variant leaves q outside q_pe, kv_a
    outside k_pe and the cache rows without a slot bitwise as they were. Against each other:
    nopass is upstream bitwise (the same RoPE, a copy of the same rows), vllm_op is fused bitwise
    (the same kernel), fused is upstream within one rounding of the model dtype."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cos_sin = rope_cos_sin_cache(4096).to(dev, dtype)  # float32, then moved and cast
    rk = RopeKV(N, T, dev, cos_sin, dtype)
    case = rk.case
    ref = case.reference()
    why = setup_vllm_op(dev)
    results, got = {}, {}
    for v in ROPE_KV_VARIANTS:
        rk.reset()
        if v == "vllm_op":
            if why is not None:
                results[v] = None
                continue
            with rk.vllm_op_context():
                rk.vllm_op()
        else:
            getattr(rk, v)()
        checks = case.compare(ref=ref) if v in ("fused", "vllm_op") else case.compare_unfused(ref=ref)
        got[v] = (case.q_pe.clone(), case.kv_a.clone(), case.written_rows().clone())
        results[v] = first_problem(*checks) or case.untouched()
    same = Bound(0.0, 0.0)
    for v, base, bound in (
        ("nopass", "upstream", same),
        ("vllm_op", "fused", same),
        ("fused", "upstream", ONE_MODEL_ROUNDING[dtype]),
    ):
        if results.get(v) == "" and base in got:
            (q, kv_a, rows), (q0, kv_a0, rows0) = got[v], got[base]
            pairs = [compare(f"q_pe vs {base}", q, q0, bound), compare(f"cache rows vs {base}", rows, rows0, bound)]
            if bound is same and v == "vllm_op":
                pairs.append(compare(f"kv_a vs {base}", kv_a, kv_a0, bound))
            results[v] = first_problem(*pairs)
    return results


def rope_kv_table(dev, name, shapes, cos_sin, records) -> list[list[str]]:
    """Time the RoPE + KV write variants per (label, N, T)."""
    why = setup_vllm_op(dev)
    if why is not None:
        print(f"bench_layer: vllm_op column skipped ({why})")
    rows = []
    for label, N, T in shapes:
        rk = RopeKV(N, T, dev, cos_sin)
        row, times = [label], {}
        for v in ROPE_KV_VARIANTS:
            if v == "vllm_op" and why is not None:
                row.append("-")
                continue
            rk.reset()
            if v == "vllm_op":
                with rk.vllm_op_context():
                    ms = time_ms(rk.vllm_op)
            else:
                ms = time_ms(getattr(rk, v))
            times[v] = ms
            row.append(f"{ms * 1e3:.1f}")
            records.append(Record("rope_kv_write", v, label, "time_us", ms * 1e3, name, __version__))
        row.append(f"{times['upstream'] / times['fused']:.2f}x")
        row.append(f"{times['nopass'] / times['fused']:.2f}x")
        rows.append(row)
        del rk
    return rows


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for layer.csv")
    ap.add_argument("--peers", default=".peers", help="folder made by get_vllm_peers.sh")
    ap.add_argument("--quick", action="store_true", help="smaller batches")
    ap.add_argument(
        "--check-rope-kv",
        action="store_true",
        help="only run the RoPE + KV write variants once on tiny shapes and compare (CPU too)",
    )
    args = ap.parse_args()
    if args.check_rope_kv:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        res = check_rope_kv(dev)
        print("bench_layer --check-rope-kv: what differs ('' = agrees):", res)
        return 0 if all(not v for v in res.values()) else 1
    gpu = start_bench("bench_layer")
    if gpu is None:
        return 2
    dev, name = gpu.dev, gpu.name
    from vllm_harness.layer_step import LAYER_AGREEMENT

    decode_attention_fwd = load_vllm_peer(args.peers, "triton_decode_attention", "decode_attention_fwd")
    vllm_merge = load_vllm_peer(args.peers, "triton_merge_attn_states", "merge_attn_states")
    if decode_attention_fwd is None or vllm_merge is None:
        print("bench_layer: vLLM's Triton kernels are needed for the upstream side")
        return 2
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    B_dec, ctx_dec = (32, 2048) if args.quick else (64, 4096)
    # One sequence: SDPA returns lse as [B, N, L], and for B > 1 turning that into vLLM's [N, T]
    # would need a copy that upstream's varlen FlashAttention does not make.
    B_pre, new_pre, ctx_pre = (1, 2048, 4096) if args.quick else (1, 4096, 8192)
    rows, records = [], []
    for N, tp in ((128, "TP1"), (16, "TP8")):
        layer = Layer(N, dev)
        steps = [
            (
                f"decode {tp} N={N} B={B_dec} ctx={ctx_dec}",
                DecodeStep(layer, B_dec, ctx_dec, decode_attention_fwd, sms),
            ),
            (f"prefill {tp} N={N} {B_pre}x{new_pre} new + {ctx_pre} ctx", PrefillStep(layer, B_pre, new_pre, ctx_pre)),
        ]
        for label, step in steps:
            calls = {
                "upstream": (lambda s=step: s.upstream(vllm_merge)) if isinstance(step, PrefillStep) else step.upstream,
                # the prefill step starts after RoPE + KV write: with or without the pass it is the same
                "rocm_mla_nopass": step.ours_nopass if isinstance(step, DecodeStep) else step.ours,
                "rocm_mla": step.ours,
            }
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
            for prov in ("rocm_mla_nopass", "rocm_mla"):
                c = compare(f"{prov} vs upstream", outs[prov], outs["upstream"], LAYER_AGREEMENT)
                finite = bool(torch.isfinite(outs[prov]).all() and torch.isfinite(outs["upstream"]).all())
                if c.problem or not finite:
                    print(f"  {label}: {prov} and upstream DISAGREE ({c.problem or 'not finite'})")
                err = c.norm_err if finite else math.nan
                records.append(Record("layer_step", prov, label, "rel_err_vs_upstream", err, name, __version__))
            fmt = lambda m: "/".join(str(m[k]) for k in ("cat", "pad", "copy", "fill")) + f" ={sum(m.values())}"  # noqa: E731
            rows.append(
                [
                    label,
                    f"{res['upstream'][0] * 1e3:.0f}",
                    f"{res['rocm_mla_nopass'][0] * 1e3:.0f}",
                    f"{res['rocm_mla'][0] * 1e3:.0f}",
                    f"{res['upstream'][0] / res['rocm_mla'][0]:.2f}x",
                    fmt(res["upstream"][1]),
                    fmt(res["rocm_mla_nopass"][1]),
                    fmt(res["rocm_mla"][1]),
                ]
            )
        del layer
        torch.cuda.empty_cache()
    print(f"\nMLA layer step on {name}, bf16: time (us) and data-movement kernels (cat/pad/copy/fill)")
    print_table(
        [
            "step",
            "upstream us",
            "rocm_mla no-pass us",
            "rocm_mla fused us",
            "speed-up (fused)",
            "upstream moves",
            "no-pass moves",
            "fused moves",
        ],
        rows,
    )
    print(
        "(upstream's decode copies include its cache write's index_copy_. The context gather from the "
        "paged cache, the same index_select in both, matches no pattern and is not counted; rocm_mla's "
        "attention path itself launches none: perf/bench_layer_copies.py)"
    )
    cos_sin = Layer(16, dev).cos_sin
    shapes = [(f"decode B={B_dec} N={N}", N, B_dec) for N in (128, 16)] + [
        (f"prefill T={B_pre * new_pre} N={N}", N, B_pre * new_pre) for N in (128, 16)
    ]
    rk_rows = rope_kv_table(dev, name, shapes, cos_sin, records)
    print(
        f"\nRoPE + KV write alone on {name}, bf16 (us): upstream = torch RoPE + cat/index_copy_; no-pass = "
        "torch RoPE + rocm_mla.concat_and_cache_mla; fused = fused_rope_mla_kv_write; vllm_op = vLLM's "
        "fused op dispatched to it (eager, with the op's Python)"
    )
    print_table(["tokens", *ROPE_KV_VARIANTS, "upstream/fused", "no-pass/fused"], rk_rows)
    out = Path(args.out)
    write_csv(out / "layer.csv", records)
    print(f"wrote {out / 'layer.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
