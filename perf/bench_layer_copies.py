"""Copy/cat/pad/fill kernels in one MLA attention step: ROCM_MLA vs the upstream-shaped composition.

One layer step (tests/vllm_harness/layer_step.py LayerStep: vLLM 0.33's MLAAttention layer, vLLM's metadata
builder, a paged cache) is run through the ROCM_MLA backend, and the calls vLLM made into the
backend (``do_kv_cache_update``, ``forward_mqa``, ``forward_mha``: the attention path) are replayed
under ``torch.profiler``. The same step runs through ``UpstreamShapedImpl``: the data movement
TRITON_MLA's decode (vllm/v1/attention/backends/mla/triton_mla.py ``forward_mqa``) and vLLM's
common prefill with the FlashAttention prefill backend on ROCm (``MLACommonBaseImpl.forward_mha``,
``_compute_prefill_context`` in vllm/model_executor/layers/attention/mla_attention.py;
``FlashAttnPrefillBackend._flash_attn_varlen_diff_headdims`` in
vllm/v1/attention/backends/mla/prefill/flash_attn.py) do around their kernels — cat q, zeros for
o and lse, cat k, pad v, slice copy, partial copies — with rocm_mla's kernels standing in for
theirs (vLLM's compiled and FlashAttention kernels do not run here). Both compositions are
checked against the float32 reference, so the count is of two correct implementations.

What is counted:
* GPU: every device kernel of the replay, by name: copy (``copy``/``Memcpy``), cat
  (``CatArray``), pad, fill (``fill``/``Memset``/``zero``); the rest are compute kernels.
* CPU (no kernels to see): the aten ops of the replay that move data — ``aten::cat``,
  ``aten::copy_``/``clone``/``_to_copy``, ``aten::constant_pad_nd``/``pad``,
  ``aten::fill_``/``zero_``/``zeros``/``full`` — counting only the outermost one of a nest
  (``zeros`` -> ``zero_`` -> ``fill_`` is one). A Triton launch is one kernel: in the CPU
  interpreter it moves its arguments with aten ops of its own, which are not counted.

Usage:  python perf/bench_layer_copies.py [--heads 16] [--dtype float16] [--kv-cache-dtype auto]
(on CPU it sets TRITON_INTERPRET=1). Prints a table; exit status 1 if ROCM_MLA's count is not 0
or a composition disagrees with the reference (LayerStep.mismatch: LAYER_TOLERANCE).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from contextlib import contextmanager

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchutil import DATA_MOVEMENT_KERNELS, data_movement_kind

# The vLLM layer-step harness lives with the tests (tests/vllm_harness).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

DATA_MOVEMENT_OPS = {
    "aten::cat": "cat",
    "aten::copy_": "copy",
    "aten::clone": "copy",
    "aten::_to_copy": "copy",
    "aten::contiguous": "copy",
    "aten::constant_pad_nd": "pad",
    "aten::pad": "pad",
    "aten::fill_": "fill",
    "aten::zero_": "fill",
    "aten::zeros": "fill",
    "aten::zeros_like": "fill",
    "aten::full": "fill",
    "aten::full_like": "fill",
}
KERNEL_PATTERNS = DATA_MOVEMENT_KERNELS  # device kernels, by name (shared with bench_layer.py)
TRITON_SCOPE = "triton_launch::"

# Batches of the two steps (requests: (cached context, new tokens)); decodes first, as vLLM orders.
DECODE_BATCH = [(40, 1), (17, 1), (90, 1), (5, 1)]
PREFILL_BATCH = [(37, 5), (0, 9), (70, 3), (20, 4)]


# ---------------------------------------------------------------- the upstream-shaped composition


def upstream_shaped_backend():
    """A backend class whose impl moves data the way TRITON_MLA + vLLM's common FA prefill do."""
    from vllm.model_executor.layers.attention.mla_attention import init_mla_context_partial

    from rocm_mla.cases.decode import call_decode
    from rocm_mla.cases.prefill import call_prefill
    from rocm_mla.ops import gather_context_chunk, merge_attn_states
    from rocm_mla.vllm.backend import RocmMLABackend, RocmMLAImpl

    class UpstreamShapedImpl(RocmMLAImpl):
        """Upstream data movement around rocm_mla kernels (each stand-in is one kernel, as the
        FlashAttention / Triton decode kernel it replaces)."""

        def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
            if type(q) is tuple:
                q = torch.cat(q, dim=-1)  # triton_mla.py: the concat of ql_nope and q_pe
            B, N = q.shape[0], q.shape[1]
            L = self.kv_lora_rank
            o = torch.zeros(B, N, L, dtype=q.dtype, device=q.device)  # triton_mla.py: memset
            lse = torch.zeros(B, N, dtype=q.dtype, device=q.device)  # triton_mla.py: memset
            # decode_attention_fwd writes o (and its lse into the logits workspace).
            lse32 = torch.empty(B, N, dtype=torch.float32, device=q.device)
            call_decode(
                q[..., :L],
                q[..., L:],
                kv_c_and_k_pe_cache,
                attn_metadata.decode.block_table,
                attn_metadata.decode.seq_lens,
                sm_scale=self.scale,
                out=o,
                lse=lse32,
                kv_cache_dtype="fp8" if self._fp8_cache else "auto",
                k_scale=layer._k_scale.reshape(1) if self._fp8_cache else None,
            )
            return o, lse

        def _fa(self, q, k, v, cu_q, cu_k, causal):
            # FlashAttnPrefillBackend._flash_attn_varlen_diff_headdims on ROCm: v padded to Dqk,
            # the kernel writes [T, N, Dqk] and its LSE.
            v = torch.nn.functional.pad(v, [0, q.shape[-1] - v.shape[-1]], value=0)
            out = torch.empty(q.shape[0], q.shape[1], q.shape[2], dtype=q.dtype, device=q.device)
            P, V = self.qk_nope_head_dim, self.v_head_dim
            _, lse = call_prefill(
                q, k[..., :P], k[..., P:], v[..., :V], cu_q, cu_k, sm_scale=self.scale, causal=causal, out=out[..., :V]
            )
            return out, lse

        def forward_mha(
            self, q, kv_c_normed, k_pe, kv_c_and_k_pe_cache, attn_metadata, k_scale, output, output_scale=None
        ):
            prefill = attn_metadata.prefill
            N, P, V = self.num_heads, self.qk_nope_head_dim, self.v_head_dim
            kv_nope = self.kv_b_proj(kv_c_normed)[0].view(-1, N, P + V)
            k_nope, v = kv_nope.split([P, V], dim=-1)
            k = self._concat_k_nope_k_pe(k_nope, k_pe)  # vLLM's own method: empty + 2 copies
            suffix, suffix_lse = self._fa(q, k, v, prefill.query_start_loc, prefill.query_start_loc, True)
            if prefill.chunked_context is None:
                output.copy_(suffix[..., :V].flatten(start_dim=-2))  # the slice copy
                return
            context, context_lse = self._context(q, kv_c_and_k_pe_cache, prefill, k_scale)
            merge_attn_states(output.view(-1, N, V), context[..., :V], context_lse, suffix[..., :V], suffix_lse)

        def _context(self, q, kv_cache, prefill, k_scale):
            # MLACommonBaseImpl._compute_prefill_context + accumulate_mla_context_chunk.
            chunked = prefill.chunked_context
            N, P, V, L = self.num_heads, self.qk_nope_head_dim, self.v_head_dim, self.kv_lora_rank
            output = output_lse = None
            for chunk in chunked.chunks:
                toks = chunk.num_context_tokens
                ws = chunked.workspace[:toks]
                gather_context_chunk(
                    kv_cache,
                    prefill.block_table[chunk.request_slice],
                    chunk.cu_seq_lens,
                    chunk.starts,
                    chunk.token_to_seq,
                    ws,
                    k_scale=k_scale.reshape(1) if self._fp8_cache else None,
                    kv_cache_dtype=self.op_kv_cache_dtype,
                )
                kv_nope = self.kv_b_proj(ws[..., :L])[0].view(-1, N, P + V)
                k_nope, v = kv_nope.split([P, V], dim=-1)
                k = self._concat_k_nope_k_pe(k_nope, ws[..., L:].unsqueeze(1))
                out, lse = self._fa(q[chunk.token_slice], k, v, chunk.query_start_loc, chunk.cu_seq_lens, False)
                if output is None:
                    if len(chunked.chunks) == 1 and not chunked.empty_token_slices:
                        return out, lse
                    output, output_lse = init_mla_context_partial(chunked, out, lse, num_tokens=q.shape[0])
                s, e = chunk.token_slice.start, chunk.token_slice.stop
                start = s
                if chunk.is_continuation:
                    start = chunk.continuation_token_end
                    n = start - s
                    _vllm_merge_in_place(output[s:start], output_lse[:, s:start], out[:n], lse[:, :n])
                if start < e:
                    output[start:e].copy_(out[start - s :])
                    output_lse[:, start:e].copy_(lse[:, start - s :])
            return output, output_lse

    def _vllm_merge_in_place(output, output_lse, suffix, suffix_lse):
        # accumulate_mla_context_chunk merges a continued request in place, LSE included: one
        # vLLM merge kernel. On a GPU that kernel itself runs (vLLM's Triton merge, which reads a
        # row's LSE in the program that writes it); in the CPU interpreter, where vLLM's Triton is
        # off, rocm_mla's merge stands in and needs a separate input LSE: the clone happens inside
        # the launch scope, so it counts as part of that one kernel.
        if output.is_cuda:
            from vllm.v1.attention.ops.triton_merge_attn_states import merge_attn_states as vllm_merge

            vllm_merge(output, output, output_lse, suffix, suffix_lse, output_lse)
            return
        with torch.profiler.record_function(TRITON_SCOPE + "vllm_merge_attn_states"):
            merge_attn_states(output, output, output_lse.clone(), suffix, suffix_lse, output_lse)

    class UpstreamShapedBackend(RocmMLABackend):
        @staticmethod
        def get_impl_cls():
            return UpstreamShapedImpl

    return UpstreamShapedBackend


# ---------------------------------------------------------------- counting


@contextmanager
def _triton_launches_as_scopes():
    """Label each Triton launch with a profiler scope (interpreter: its internal aten ops are
    then recognisable and not counted; GPU: harmless)."""
    from triton.runtime import interpreter

    orig = interpreter.InterpretedFunction.run

    def run(self, *args, **kwargs):
        with torch.profiler.record_function(TRITON_SCOPE + self.fn.__name__):
            return orig(self, *args, **kwargs)

    interpreter.InterpretedFunction.run = run
    try:
        yield
    finally:
        interpreter.InterpretedFunction.run = orig


def count_data_movement(fn) -> dict:
    """Profile ``fn()``; returns ``{"ops": Counter(category), "kernels": Counter(category),
    "kernel_names": Counter(name), "triton_launches": int}`` (see the module docstring)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    fn()  # warm-up: compile/JIT outside the measured run
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    with _triton_launches_as_scopes(), profile(activities=acts) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    ops: Counter = Counter()
    kernels: Counter = Counter()
    names: Counter = Counter()
    launches = 0
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            names[e.name] += 1
            kind = data_movement_kind(e.name)
            if kind is not None:
                kernels[kind] += 1
            continue
        if e.name.startswith(TRITON_SCOPE):
            launches += 1
            continue
        cat = DATA_MOVEMENT_OPS.get(e.name)
        if cat is None:
            continue
        parent, nested = e.cpu_parent, False
        while parent is not None:  # outermost data-movement op only; nothing inside a launch
            if parent.name in DATA_MOVEMENT_OPS or parent.name.startswith(TRITON_SCOPE):
                nested = True
                break
            parent = parent.cpu_parent
        if not nested:
            ops[cat] += 1
    return {"ops": ops, "kernels": kernels, "kernel_names": names, "triton_launches": launches}


def measure(
    backend,
    batch,
    *,
    num_heads: int,
    dtype: torch.dtype,
    kv_cache_dtype: str,
    device,
    block_size: int = 16,
    decode_threshold: int = 1,
    workspace_rows: int | None = 48,
) -> dict:
    """One step of ``batch`` through ``backend``: its check against the float32 reference
    (``mismatch``: '' or what differs, LayerStep.mismatch; ``max_abs_err``), and the data-movement
    counts of the replayed backend calls."""
    from vllm_harness.layer_step import LayerStep, Request

    step = LayerStep(
        backend,
        [Request(c, q) for c, q in batch],
        num_heads=num_heads,
        dtype=dtype,
        device=device,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        decode_threshold=decode_threshold,
        workspace_rows=workspace_rows,
        k_scale=0.05,
    )
    calls = step.capture_backend_calls()
    ref = step.reference()
    mismatch = step.mismatch(ref=ref)
    err = (step.output.float() - ref).abs().max().item()
    counts = count_data_movement(lambda: step.replay(calls))
    counts["max_abs_err"], counts["mismatch"] = err, mismatch
    counts["calls"] = [name for name, _, _ in calls]
    return counts


def compare(
    *,
    num_heads: int = 16,
    dtype: torch.dtype = torch.float16,
    kv_cache_dtype: str = "auto",
    device=None,
    compositions: tuple[str, ...] = ("ROCM_MLA", "upstream-shaped"),
) -> dict:
    """{(step, composition): counts} for the decode batch and the prefill-with-context batch, for
    each of ``compositions`` ("ROCM_MLA", "upstream-shaped")."""
    from rocm_mla.vllm.backend import RocmMLABackend

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    known = {"ROCM_MLA": lambda: RocmMLABackend, "upstream-shaped": upstream_shaped_backend}
    unknown = [c for c in compositions if c not in known]
    if unknown:
        raise ValueError(f"compare: compositions: expected some of {', '.join(known)}, got {unknown}")
    backends = [(label, known[label]()) for label in compositions]
    out = {}
    for step, batch in (("decode", DECODE_BATCH), ("prefill+context", PREFILL_BATCH)):
        for label, backend in backends:
            out[(step, label)] = measure(
                backend, batch, num_heads=num_heads, dtype=dtype, kv_cache_dtype=kv_cache_dtype, device=device
            )
    return out


def total(counts: dict) -> int:
    """Data-movement count of one measurement: device kernels on a GPU, aten ops on CPU."""
    return sum(counts["kernels"].values()) if torch.cuda.is_available() else sum(counts["ops"].values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    args = ap.parse_args(argv)
    from vllm_harness.layer_step import use_simulated_gfx942_platform

    if not (torch.version.hip and torch.cuda.is_available()):
        use_simulated_gfx942_platform()
    import rocm_mla.vllm

    rocm_mla.vllm.register()
    res = compare(num_heads=args.heads, dtype=getattr(torch, args.dtype), kv_cache_dtype=args.kv_cache_dtype)
    unit = "device kernels" if torch.cuda.is_available() else "aten ops (CPU: no kernels to see)"
    print(
        f"copy/cat/pad/fill in the attention path of one layer step, N={args.heads} {args.dtype} "
        f"kv={args.kv_cache_dtype}; unit: {unit}"
    )
    print(
        f"{'step':<16} {'composition':<16} {'cat':>4} {'copy':>5} {'pad':>4} {'fill':>5} {'total':>6} "
        f"{'launches':>8} {'max|err|':>9}"
    )
    bad = False
    for (step, label), c in res.items():
        cnt = c["kernels"] if torch.cuda.is_available() else c["ops"]
        n = total(c)
        print(
            f"{step:<16} {label:<16} {cnt['cat']:>4} {cnt['copy']:>5} {cnt['pad']:>4} {cnt['fill']:>5} "
            f"{n:>6} {c['triton_launches'] or sum(c['kernel_names'].values()):>8} {c['max_abs_err']:>9.2e}"
        )
        bad |= label == "ROCM_MLA" and n != 0
        if c["mismatch"]:
            print(f"  {step} / {label}: WRONG ({c['mismatch']})")
            bad = True
    if torch.cuda.is_available():
        for (step, label), c in res.items():
            print(f"\n{step} / {label} kernels:")
            for name, k in sorted(c["kernel_names"].items()):
                print(f"  {k:>3} x {name[:110]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
