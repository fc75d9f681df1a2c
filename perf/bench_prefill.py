#!/usr/bin/env python3
"""Benchmark mla_prefill (causal bf16, Dqk 192 / Dv 128) beside cuDNN, aiter's Triton MHA and FLASH,
and mla_prefill_with_context against the upstream-shaped chunked-context composition.

    python perf/bench_prefill.py --quick                       # compact table, 4 shapes, ~1 min
    python perf/bench_prefill.py --context                     # the full run (perf/bench.py --ops prefill)
    python perf/bench_prefill.py --geometry                    # the other MLA head geometries (--ops prefill_geometry)
    options: --config JSON (our launch config), --no-graphs, --aiter-peers DIR, --vllm-peers DIR, --out DIR

Shapes (B x L, heads N): 4x4096 and 1x16384 at N=16/128, 16x1024 at N=16, and a varlen batch of
unequal lengths (log-uniform draws from 128..8192 plus one 8192) at N=16/128. FLOPs per call:
2 * (192 + 128) * N * visible (query, key) pairs, L (L + 1) / 2 per causal sequence -- the useful
work, the same count for every provider. Times: CUDA-graph replays (one call captured, replayed,
median of rounds; --no-graphs: events with L2 flushes, triton's do_bench).

--geometry: the same providers on the other head geometries (P, R, V) vLLM serves for MLA
(SHAPES["bench-geometry"]): GLM-4.x-Lite's 192/64/256 at the shapes above (4x4096 N=16/128, 16x1024,
1x16384, varlen N=16), 64/64/128 and the no-RoPE 256/0/256 at 4x4096 N=16/128; each with our launch
data for that geometry, FLOPs 2 * (P + R + V) * N * pairs, cuDNN's k = cat(k_nope, k_pe) (k_nope
itself when R = 0) and FLASH's v padded to P + R (vLLM's F.pad, width 0 when V = P + R) as below.

Providers (inputs laid out as the model produces them: k_nope / v views of the [T, N, P + V]
kv_b_proj output, k_pe the [T, 512 + R][:, 512:] slice of the latent buffer):
  ours          mla_prefill: strided k_nope / v, broadcast k_pe, out written into the layer's
                [T, N*128] buffer, lse into [N, T]. No cat, pad or copy.
  cuDNN         SDPA's cuDNN kernel (Dv 128 directly) on a pre-built k = cat(k_nope, k_pe) and a
                contiguous v; kernel only (the cat is not timed). Varlen: one call per sequence.
  aiter         aiter's flash_attn_varlen_func (aiter/ops/triton/mha.py: what vLLM's
                AITER_TRITON_MLA backend runs on ROCm) on the pre-built k (not timed), v as is,
                return_lse; its own zeros for out and lse are inside its time. Triton files from
                the amd-aiter wheel (perf/peers/get_aiter_peers.sh DIR); on NVIDIA its MI300X
                config without the AMD-only options, and a second column with our sm90 tile.
  FLASH         SDPA FLASH on pre-built k and V padded to 192 (kernel only).
  upstream      vLLM's ROCm FA path with SDPA FLASH standing in for the varlen call: cat k,
                pad v, FLASH, the [..., :128] slice copied out -- every copy timed.

Shapes, inputs and checks come from rocm_mla.cases.prefill (SHAPES["bench"] / ["bench-quick"],
make_inputs, TOLERANCE). Our launch config is first checked against the float32 reference on
SHAPES["reference"] (ragged ends, an empty sequence, lq != lk); then on every shape each provider's
output (and lse, where it returns one) on the first 128 causal rows against float32, and ours
against cuDNN over all of T, before anything is timed. The launch configs are swept by
`rocm-mla tune`, not here.

--context: mla_prefill_with_context (one sequence, 4096 new tokens after 8192 cached ones in 2,
3 or 4 chunks, N=16/128) against the upstream-shaped composition of vLLM 0.33's chunked-context
prefill (MLACommonImpl._compute_prefill_context + the new tokens + the final merge): per chunk
cat k + pad v + FLASH with lse, merge_attn_states into a fresh buffer from the second chunk on,
the new tokens' causal FLASH, the final merge, the [..., :128] copy into the layer output. The
merge is vLLM's Triton kernel when --vllm-peers has it (perf/peers/get_vllm_peers.sh), else
ours (said in the output). Both sides see the chunks already up-projected (not timed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from benchutil import Record, aiter_peer_version, bench_parser, load_aiter_peer, load_vllm_peer, start_bench, write_csv

from rocm_mla import __version__, _platform
from rocm_mla.cases import compare, first_problem, prefill
from rocm_mla.cases.prefill import SM_SCALE as SCALE
from rocm_mla.cases.prefill import VARLEN, PrefillShape
from rocm_mla.configs import is_nvidia_arch
from rocm_mla.mla_dims import PREFILL_DIMS
from rocm_mla.ops.merge import merge_attn_states
from rocm_mla.ops.prefill_context import ContextChunk, mla_prefill_with_context, plan_prefill_with_context_for
from rocm_mla.ops.prefill_plan import launch_config
from rocm_mla.tools.timing import device_name, rotating_graph_us, time_ms
from rocm_mla.triton_common import without_amd_options
from rocm_mla.variants.prefill import config_label

P, R, V = PREFILL_DIMS  # 128, 64, 128
DTYPE = torch.bfloat16  # the serving dtype (a CPU smoke run of this script sets float16)
CHECK_ROWS = 128  # every timed output: the first causal rows of sequence 0 against float32

SHAPES = prefill.SHAPES["bench"]
QUICK = prefill.SHAPES["bench-quick"]  # 4x4096 N=16/128, 16x1024 N=16 and the varlen batch
GEOMETRY = prefill.SHAPES["bench-geometry"]  # 192/64/256 (GLM-4.x-Lite), 64/64/128, 256/0/256
GEOMETRY_QUICK = [s for s in GEOMETRY if s.name.startswith("4x4096 N=16 ")]
REF_CASE = prefill.SHAPES["reference"][0]  # ragged ends, an empty sequence, lq != lk

PROVIDERS = ["ours", "cuDNN", "aiter", "aiter-tile", "FLASH", "upstream"]
HEADERS = {
    "ours": "ours",
    "cuDNN": "cuDNN",
    "aiter": "aiter",
    "aiter-tile": "aiter@tile",
    "FLASH": "FLASH",
    "upstream": "upstream",
}
LEGEND = (
    "aiter: its MI300X config (AMD-only options dropped on NVIDIA); aiter@tile: aiter's kernel with our tile "
    "(M128 N64 w8 s3 on sm90); FLASH: SDPA FLASH on V padded to P + R; upstream: cat k + pad v + FLASH + "
    "slice copy, all timed; ours/aiter: against the faster aiter column"
)


# --------------------------------------------------------------------------- timing


class Timer:
    """ms per call: with graphs, the median of 7 rounds of back-to-back replays of one captured
    call (~50 ms each; benchutil.rotating_graph_us over one input copy), else do_bench."""

    def __init__(self, graphs: bool):
        self.graphs = graphs
        self.fallbacks: list[str] = []

    def __call__(self, what: str, fn) -> float:
        if self.graphs:
            try:
                return rotating_graph_us(lambda i: fn(), 1, min_ms=50.0, reps=7, calls_per_graph=1) / 1e3
            except Exception as exc:  # not capturable: say so, time it plainly
                self.fallbacks.append(f"{what}: {type(exc).__name__}: {str(exc)[:120]}")
                torch.cuda.synchronize()
        return time_ms(fn)


# --------------------------------------------------------------------------- inputs and providers


class Case:
    """Inputs of one shape, laid out as the model produces them (rocm_mla.cases.prefill.make_inputs:
    k_nope / v views of the kv_b_proj output, k_pe the latent buffer's slice (None when R = 0), out
    the layer's [T, N*V] buffer, lse [N, T]), and the peers' calls on them."""

    def __init__(self, shape: PrefillShape, dev: torch.device, dtype=None):
        self.inputs = c = prefill.make_inputs(shape, dtype=dtype or DTYPE, device=dev)
        self.P, self.R, self.V = shape.dims
        self.scale = c.sm_scale
        self.shape, self.N, self.lengths = shape, shape.N, list(shape.lq)
        self.T = shape.Tq
        self.equal = len(set(self.lengths)) == 1
        self.q, self.k_nope, self.k_pe, self.v = c.q, c.k_nope, c.k_pe, c.v
        self.cu = c.cu_seqlens_q
        self.offs = self.cu.tolist()
        self.max_len = max(self.lengths)
        self.out, self.lse = c.out, c.lse
        self._k_cat = self._v_pad = self._v_c = None

    # pre-built operands of the kernel-only peers (built once, outside their time)
    @property
    def k_cat(self):
        if self._k_cat is None:
            self._k_cat = self.cat_k()
        return self._k_cat

    def cat_k(self) -> torch.Tensor:
        """vLLM's k = cat(k_nope, k_pe.expand(N)) (_concat_k_nope_k_pe: k_nope itself when R = 0)."""
        if self.k_pe is None:
            return self.k_nope
        return torch.cat([self.k_nope, self.k_pe.expand(self.T, self.N, self.R)], dim=-1)

    def pad_v(self) -> torch.Tensor:
        """vLLM's ROCm FA path: v padded to P + R (F.pad, a copy even at width 0)."""
        return F.pad(self.v, [0, self.P + self.R - self.V])

    @property
    def v_pad(self):
        if self._v_pad is None:
            self._v_pad = self.pad_v()
        return self._v_pad

    @property
    def v_c(self):
        if self._v_c is None:
            self._v_c = self.v.contiguous()
        return self._v_c

    def seqs(self):
        """(start, end) of each sequence; one (0, T) batch view when lengths are equal."""
        return [(self.offs[i], self.offs[i + 1]) for i in range(len(self.lengths))]

    def bhsd(self, x: torch.Tensor, s: int, e: int) -> torch.Tensor:
        """[T, N, D][s:e] -> [1, N, L, D] view (or, for equal lengths over all of T, [B, N, L, D])."""
        if (s, e) == (0, self.T) and self.equal and len(self.lengths) > 1:
            return x.view(len(self.lengths), self.lengths[0], self.N, x.shape[-1]).transpose(1, 2)
        return x[s:e].unsqueeze(0).transpose(1, 2)

    def _spans(self):
        return [(0, self.T)] if self.equal else self.seqs()

    def ours(self, config=None):
        self.inputs.run(backend="triton", config=config)

    def sdpa(self, backend_name: str, v, out_view=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        outs = []
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            for s, e in self._spans():
                o = F.scaled_dot_product_attention(
                    self.bhsd(self.q, s, e),
                    self.bhsd(self.k_cat, s, e),
                    self.bhsd(v, s, e),
                    is_causal=True,
                    scale=self.scale,
                )
                outs.append((s, e, o))
        return outs

    def cudnn(self):
        return self.sdpa("CUDNN_ATTENTION", self.v_c)

    def flash_kernel(self):
        return self.sdpa("FLASH_ATTENTION", self.v_pad)

    def upstream(self):
        """cat k + pad v + FLASH + [..., :V] copy into the layer output, each copy timed."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        k, vp = self.cat_k(), self.pad_v()
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for s, e in self._spans():
                o = F.scaled_dot_product_attention(
                    self.bhsd(self.q, s, e), self.bhsd(k, s, e), self.bhsd(vp, s, e), is_causal=True, scale=self.scale
                )
                self.bhsd(self.out, s, e).copy_(o[..., : self.V])

    def gather(self, outs) -> torch.Tensor:
        """SDPA results ([B, N, L, D] per span) as one [T, N, V] float tensor."""
        full = torch.empty(self.T, self.N, self.V, device=self.q.device, dtype=torch.float32)
        for s, e, o in outs:
            self.bhsd(full, s, e).copy_(o[..., : self.V].float())
        return full


class Aiter:
    """aiter's flash_attn_varlen_func, or the reason it cannot run."""

    def __init__(self, peers: str):
        self.mod, self.reason, self.cfg, self.version = None, "", {}, ""
        if not Path(peers, "aiter", "ops", "triton").is_dir():
            self.reason = f"no {peers}/aiter/ops/triton (bash perf/peers/get_aiter_peers.sh {peers}; carry it)"
            return
        try:
            self.mod = load_aiter_peer(peers, "mha", config_arch="gfx942", raise_errors=True)
        except Exception as exc:  # the line load_aiter_peer would print, less its prefix
            self.reason = f"{type(exc).__name__}: {exc}"
            return
        try:
            self.cfg = dict(self.mod._get_config(False, torch.bfloat16, has_pe=True))
        except Exception as exc:
            self.mod, self.reason = None, f"its MI300X config: {type(exc).__name__}: {exc}"
        self.version = aiter_peer_version(peers)

    def launch_cfg(self, tile: dict | None = None) -> dict:
        cfg = dict(self.cfg)
        if tile is not None:  # our tile in aiter's kernel
            cfg.update(
                BLOCK_M=tile["BLOCK_M"],
                BLOCK_N=tile["BLOCK_N"],
                num_warps=tile["num_warps"],
                num_stages=tile.get("num_stages", 1),
                PRELOAD_V=False,
            )
        return cfg if torch.version.hip else without_amd_options(cfg)

    def run(self, case: Case, cfg: dict):
        return self.mod.flash_attn_varlen_func(
            case.q,
            case.k_cat,
            case.v,
            case.cu,
            case.cu,
            case.max_len,
            case.max_len,
            softmax_scale=case.scale,
            causal=True,
            return_lse=True,
            config=cfg,
        )


# --------------------------------------------------------------------------- correctness


def check_against_reference(dev: torch.device, config, dims=PREFILL_DIMS) -> list:
    """mla_prefill (``config``) on REF_CASE (of head geometry ``dims``) against the float32
    reference: the comparisons of out and lse (rocm_mla.cases.prefill.TOLERANCE)."""
    shape = PrefillShape(REF_CASE.lq, REF_CASE.N, lk=REF_CASE.lk, name=REF_CASE.name, dims=dims)
    case = prefill.make_inputs(shape, dtype=DTYPE, device=dev, seed=5)
    case.run(backend="triton", config=config)
    return case.compare()


def out_problem(case: Case, out: torch.Tensor, ref: tuple) -> str:
    """'' when ``out``'s first rows agree with the float32 reference ``ref``, else what differs."""
    ro = ref[0]
    return compare("out", out[: ro.shape[0]], ro, prefill.TOLERANCE[case.inputs.dtype]["out"]).problem


# --------------------------------------------------------------------------- chunked context


class ContextCase:
    """One sequence: `new` new tokens after `ctx` cached ones in `n_chunks` chunks (up-projected
    already: k_nope / v views of [Tc, N, 256], k_pe a slice of [Tc, 576])."""

    def __init__(self, new: int, ctx: int, n_chunks: int, N: int, dev):
        dt = DTYPE
        self.new, self.N, self.n_chunks = new, N, n_chunks
        self.inputs = c = prefill.make_inputs(PrefillShape((new,), N), dtype=dt, device=dev)
        self.q, self.k_nope, self.v, self.k_pe, self.cu = c.q, c.k_nope, c.v, c.k_pe, c.cu_seqlens_q
        sizes = [ctx // n_chunks + (1 if i < ctx % n_chunks else 0) for i in range(n_chunks)]
        self.chunks = []
        for i, tc in enumerate(sizes):  # a chunk's keys: a prefill of no queries over tc keys
            k = prefill.make_inputs(PrefillShape((0,), N, lk=(tc,)), dtype=dt, device=dev, seed=1 + i)
            self.chunks.append(ContextChunk(k.k_nope, k.k_pe, k.v, k.cu_seqlens_k, tc))
        self.out, self.lse = c.out, c.lse
        self.flops = 2.0 * (P + R + V) * N * (new * (new + 1) / 2 + new * ctx)
        self._plans: list[tuple[dict | None, object]] = []  # (config, its plan)

    def plan(self, config=None):
        """The call's plan with launch data ``config`` (None: the arch's), made once per config as
        a serving step makes it for every layer."""
        for cfg, plan in self._plans:
            if cfg == config:
                return plan
        tensors = (self.q, self.k_nope, self.k_pe, self.v, self.cu, self.cu)
        plan = plan_prefill_with_context_for(*tensors, max_seqlen_q=self.new, max_seqlen_k=self.new, config=config)
        self._plans.append((config, plan))
        return plan

    def ours(self, config=None):
        mla_prefill_with_context(
            self.q,
            self.k_nope,
            self.k_pe,
            self.v,
            self.cu,
            self.cu,
            self.chunks,
            sm_scale=SCALE,
            out=self.out,
            lse=self.lse,
            plan=self.plan(config),
        )

    def _flash(self, k_nope, k_pe, v, causal):
        """vLLM's FA call for one key set: cat k, pad v, FLASH with lse ([L, N, 192], [N, L])."""
        k = torch.cat([k_nope, k_pe.expand(-1, self.N, R)], dim=-1)
        vp = F.pad(v, [0, P + R - V])
        b = lambda x: x.unsqueeze(0).transpose(1, 2)  # noqa: E731
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            b(self.q), b(k), b(vp), 0.0, causal, False, scale=SCALE
        )[:2]
        return o[0].transpose(0, 1), lse[0]

    def upstream(self, merge):
        """vLLM 0.33 MLACommonImpl: _compute_prefill_context (per chunk FA + merge into a new
        buffer), the new tokens' causal FA, the final merge into a new buffer, [..., :128] out."""
        output = output_lse = None
        for c in self.chunks:
            o, lse = self._flash(c.k_nope, c.k_pe, c.v, False)
            if output is None:
                output, output_lse = o, lse
            else:
                tmp, tmp_lse = torch.empty_like(output), torch.empty_like(output_lse)
                merge(tmp, output, output_lse, o, lse, tmp_lse)
                output, output_lse = tmp, tmp_lse
        suffix, suffix_lse = self._flash(self.k_nope, self.k_pe, self.v, True)
        final = torch.empty_like(suffix)
        merge(final, output, output_lse, suffix, suffix_lse, self.lse)
        self.out.copy_(final[..., :V])  # output[..., :v_head_dim].flatten(): the unpad copy


def context_bench(
    dev, timer: Timer, vllm_peers: str, quick: bool, config=None
) -> tuple[list[list[str]], list[Record], str]:
    vllm_merge = load_vllm_peer(vllm_peers, "triton_merge_attn_states", "merge_attn_states")
    note = "vLLM 0.33's Triton merge_attn_states" if vllm_merge else "rocm_mla's merge_attn_states (vLLM peer missing)"
    merge = vllm_merge or (lambda o, po, pl, so, sl, ol: merge_attn_states(o, po, pl, so, sl, ol))
    rows, records, name = [], [], device_name(dev)
    for N in (16,) if quick else (16, 128):
        for n_chunks in (2, 4) if quick else (2, 3, 4):
            case = ContextCase(4096, 8192, n_chunks, N, dev)
            label = f"N={N} 4096 new + 8192 ctx in {n_chunks} chunks"
            case.out.fill_(float("nan"))
            case.upstream(merge)
            up = case.out.float().clone(), case.lse.clone()
            case.out.fill_(float("nan"))
            case.ours(config)
            agree = case.inputs.compare(ref=up)  # rocm_mla.cases.prefill's rule, upstream's result as reference
            err, problem = agree[0].norm_err, first_problem(*agree)
            flag = f" DISAGREE ({problem})" if problem else ""
            t_up = timer(f"context upstream {label}", lambda case=case: case.upstream(merge))
            t_ours = timer(f"context ours {label}", lambda case=case: case.ours(config))
            rows.append(
                [
                    label,
                    f"{t_ours * 1e3:.0f}",
                    f"{t_up * 1e3:.0f}",
                    f"{t_up / t_ours:.2f}x",
                    f"{case.flops / t_ours / 1e9:.0f}",
                    f"{case.flops / t_up / 1e9:.0f}",
                    f"{err:.1e}{flag}",
                ]
            )
            for prov, t in (("ours", t_ours), ("upstream", t_up)):
                records.append(Record("mla_prefill_with_context", prov, label, "time_us", t * 1e3, name, __version__))
            del case
            torch.cuda.empty_cache()
    return rows, records, note


# --------------------------------------------------------------------------- output


def table_lines(headers: list[str], rows: list[list[str]]) -> list[str]:
    cells = [headers] + rows
    w = [max(len(str(r[i])) for r in cells) for i in range(len(headers))]
    out = []
    for k, r in enumerate(cells):
        out.append("  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r)).rstrip())
        if k == 0:
            out.append("  ".join("-" * x for x in w))
    return out


def bench_shape(
    shape, dev, config, aiter, tile, timer, peak: float, name: str, records: list, notes: list
) -> list[str]:
    """One shape: every provider checked against float32 (ours also against cuDNN), then timed;
    appends to records and notes; returns the table row."""
    case = Case(shape, dev)
    fns = {
        "ours": lambda: case.ours(config),
        "cuDNN": case.cudnn,
        "FLASH": case.flash_kernel,
        "upstream": case.upstream,
    }
    if aiter.mod is not None:
        fns["aiter"] = lambda: aiter.run(case, aiter.launch_cfg())
        fns["aiter-tile"] = lambda: aiter.run(case, aiter.launch_cfg(tile))
    # Correctness in the run, before any timing: every provider's output (and lse where it has one)
    # on the first CHECK_ROWS causal rows against float32, and ours against cuDNN over all of T, by
    # rocm_mla.cases.prefill's rule and TOLERANCE.
    ref = case.inputs.reference(first_rows=CHECK_ROWS)
    checks, mine = [], None
    for pname in fns:
        try:
            case.out.fill_(float("nan"))
            got = fns[pname]()
            if pname == "ours":
                problem = case.inputs.mismatch(ref=ref)
                mine = case.out.float().clone()
            elif pname.startswith("aiter"):
                o, lse = got
                problem = case.inputs.mismatch(o, lse.transpose(0, 1), ref=ref)  # its lse: [T, N]
            elif pname == "upstream":
                problem = out_problem(case, case.out, ref)
            else:
                full = case.gather(got)
                problem = out_problem(case, full, ref)
                if pname == "cuDNN" and mine is not None:
                    c = compare("out", mine, full, prefill.TOLERANCE[case.inputs.dtype]["out"])
                    checks.append(f"out vs cuDNN {c.norm_err:.1e}" + (f" DISAGREE ({c.problem})" if c.problem else ""))
            checks.append(f"{pname} WRONG ({problem})" if problem else f"{pname} ok")
        except Exception as exc:
            checks.append(f"{pname} failed: {type(exc).__name__}: {str(exc)[:150]}")
    print(f"  {shape.label} (T={case.T}, first {CHECK_ROWS} rows vs float32): " + "; ".join(checks))
    del mine
    row, tf = [shape.label], {}
    for pname in PROVIDERS:
        if pname not in fns:
            row.append("-")
            continue
        try:
            ms = timer(f"{pname} {shape.label}", fns[pname])
        except Exception as exc:  # a peer that cannot run this shape is reported, not fatal
            notes.append(f"{pname} {shape.label}: {type(exc).__name__}: {str(exc)[:200]}")
            print(f"  {notes[-1]}")
            row.append("fail")
            torch.cuda.synchronize()
            continue
        tf[pname] = shape.flops() / ms / 1e9
        row.append(f"{tf[pname]:.0f}")
        for metric, val in (("time_us", ms * 1e3), ("TFLOP/s", tf[pname]), ("pct_matmul", 100 * tf[pname] / peak)):
            records.append(
                Record(
                    "mla_prefill",
                    pname,
                    shape.label,
                    metric,
                    val,
                    name,
                    __version__ if pname == "ours" else torch.__version__,
                )
            )
    best_aiter = max(tf.get("aiter", 0), tf.get("aiter-tile", 0))
    for peer, val in (("cuDNN", tf.get("cuDNN", 0)), ("aiter", best_aiter), ("upstream", tf.get("upstream", 0))):
        r = tf.get("ours", 0) / val if val else None
        row.append(f"{r:.2f}x" if r else "-")
        if r:
            records.append(Record("mla_prefill", f"ours/{peer}", shape.label, "speedup", r, name, __version__))
    case = fns = None
    torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--out", default="results", help="folder for prefill.csv")
    ap.add_argument("--quick", action="store_true", help="4 shapes (the issue's three + varlen N=16), compact table")
    ap.add_argument(
        "--config", type=json.loads, default=None, metavar="JSON", help="our launch config instead of the JSON's"
    )
    ap.add_argument("--context", action="store_true", help="also mla_prefill_with_context vs the upstream composition")
    ap.add_argument(
        "--geometry",
        action="store_true",
        help="the other MLA head geometries (192/64/256 GLM-4.x-Lite, 64/64/128, 256/0/256) instead of DeepSeek's",
    )
    ap.add_argument("--no-graphs", action="store_true", help="time with triton's do_bench instead of CUDA graphs")
    ap.add_argument("--aiter-peers", default=".peers/aiter", help="folder made by perf/peers/get_aiter_peers.sh")
    ap.add_argument("--vllm-peers", default=".peers", help="folder made by perf/peers/get_vllm_peers.sh")
    args = ap.parse_args()
    gpu = start_bench("bench_prefill", matmul=True)
    if gpu is None:
        return 2
    dev, name, peak = gpu.dev, gpu.name, gpu.matmul_tflops
    arch = _platform.device_arch(dev)
    if args.geometry:
        shapes = GEOMETRY_QUICK if args.quick else GEOMETRY
    else:
        shapes = QUICK if args.quick else SHAPES
    import triton

    print(
        f"device: {name} ({arch}); bf16 matmul {peak:.0f} TFLOP/s; "
        f"torch {torch.__version__}, triton {triton.__version__}"
    )
    timer = Timer(not args.no_graphs)
    aiter = Aiter(args.aiter_peers)
    if aiter.mod is None:
        print(f"aiter unavailable: {aiter.reason}")
    else:
        print(f"aiter {aiter.version or '?'}: MI300X config {aiter.cfg}; on this GPU: {aiter.launch_cfg()}")
    config = args.config
    labels = {}  # head geometry -> our launch config's label
    for dims in dict.fromkeys(s.dims for s in shapes):
        labels[dims] = config_label(config or launch_config(arch, DTYPE, dims))
        problem = first_problem(*check_against_reference(dev, config, dims))
        geo = "" if dims == PREFILL_DIMS else f" {'/'.join(map(str, dims))}"
        print(
            f"ours{geo}: config {labels[dims]}; vs float32 reference ({REF_CASE.label}): "
            + (f"WRONG ({problem})" if problem else "within rocm_mla.cases.prefill.TOLERANCE")
        )
    label = " | ".join(labels.values())

    records, rows = [], []
    tile = (
        launch_config(arch, DTYPE)
        if is_nvidia_arch(arch)
        else {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    )
    notes = []
    for shape in shapes:
        first = len(records)
        rows.append(bench_shape(shape, dev, config, aiter, tile, timer, peak, name, records, notes))
        for r in records[first:]:
            if r.provider == "ours":
                r.config = labels[shape.dims]
    records.append(Record("matmul", "torch", "8192^3 bf16", "TFLOP/s", peak, name, torch.__version__))
    headers = ["shape", *[HEADERS[p] for p in PROVIDERS], "ours/cuDNN", "ours/aiter", "ours/upstream"]
    timing = "CUDA graphs" if timer.graphs else "do_bench (events, L2 flushed)"
    dims_text = "head geometries P/R/V as labelled" if args.geometry else "Dqk 192 / Dv 128"
    title = f"mla_prefill causal bf16, {dims_text}, TFLOP/s ({timing}; bf16 matmul {peak:.0f} TFLOP/s); ours: {label}"
    print(f"\n{title}")
    print("\n".join(table_lines(headers, rows)))
    print(LEGEND)
    print(f"varlen lengths: {list(VARLEN)} (T={sum(VARLEN)}); target: ours >= 0.85x cuDNN")
    for f in timer.fallbacks:
        print(f"  (not graph-captured, timed with do_bench: {f})")

    ctx_rows, ctx_note = [], ""
    if args.context and not args.geometry:
        ctx_rows, ctx_records, ctx_note = context_bench(dev, timer, args.vllm_peers, args.quick, config)
        records += ctx_records
        ctx_headers = [
            "case",
            "ours us",
            "upstream us",
            "speed-up",
            "ours TFLOP/s",
            "upstream TFLOP/s",
            "rel err vs upstream",
        ]
        print(f"\nmla_prefill_with_context vs the upstream-shaped composition (merge: {ctx_note}; {timing})")
        print("\n".join(table_lines(ctx_headers, ctx_rows)))

    out_dir = Path(args.out)
    write_csv(out_dir / "prefill.csv", records)
    if notes:
        print("notes: " + "; ".join(notes))
    print(f"wrote {out_dir / 'prefill.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
