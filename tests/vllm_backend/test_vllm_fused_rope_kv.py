"""vLLM's fused RoPE + MLA KV-cache op (``torch.ops.vllm.fused_rope_unified_mla_kv_cache_update``,
what the ``fuse_rope_kvcache_cat_mla`` compile pass puts in the graph) served by rocm_mla for
ROCM_MLA layers (rocm_mla/vllm/fused_rope_kv_op.py), against the real vLLM (0.34.0 or 0.33.0).

No MI300 here: vLLM's ROCm platform is simulated (harness), vLLM's fusion module is imported
with the five compiled-op schemas it looks up stubbed (vLLM's compiled ops do not load without
its GPU build). On a CPU-only torch the kernels run in the Triton interpreter and the vLLM
Python ops, registered on the platform's key ("CUDA"), also get a CPU kernel. GPU-marked tests
add bf16, 128 heads, and CUDA-graph capture.
"""

from __future__ import annotations

import pytest
import torch
import torch._inductor.custom_graph_pass  # noqa: F401 - _PostGradPasses subclasses it
from _util import DEVICE, HAS_GPU
from vllm_harness import require_vllm

require_vllm()

from vllm_harness import layer_step as H  # noqa: E402

H.use_simulated_gfx942_platform()
H.stub_vllm_compiled_op_schemas()

import rocm_mla.vllm as rocm_vllm  # noqa: E402
from rocm_mla.cases import Bound, compare, raise_on  # noqa: E402
from rocm_mla.cases import rope_kv_write as rope_cases  # noqa: E402
from rocm_mla.vllm import fused_rope_kv_op as F  # noqa: E402

rocm_vllm.register()
KEYS = ("CUDA",) if HAS_GPU else ("CUDA", "CPU")
assert F.install(KEYS), F.last_error()
if not HAS_GPU:
    H.dispatch_vllm_attention_ops_on_cpu()

from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.utils.torch_utils import _encode_layer_name  # noqa: E402

from rocm_mla.vllm.backend import RocmMLABackend  # noqa: E402

OP = torch.ops.vllm.fused_rope_unified_mla_kv_cache_update
ROPES = {
    "gptj": (False, None),
    "neox": (True, None),
    # DeepSeek-V3's rope_scaling (deepseek_yarn: cos/sin carry mscale)
    "deepseek_yarn": (
        False,
        {
            "rope_type": "deepseek_yarn",
            "factor": 40.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
        },
    ),
}
BATCH = [H.Request(37, 1), H.Request(0, 1), H.Request(70, 1), H.Request(12, 5), H.Request(0, 6)]


class FusedCase:
    """A LayerStep (ROCM_MLA or another backend) plus the fused op's inputs for its new tokens,
    two CUDA-graph padding tokens included (slot -1 and past the slot mapping's end)."""

    def __init__(
        self, backend, *, dtype, kv_cache_dtype="auto", block_size=16, rope="gptj", num_heads=8, requests=BATCH, seed=0
    ):
        self.step = H.LayerStep(
            backend,
            requests,
            num_heads=num_heads,
            dtype=dtype,
            device=DEVICE,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            k_scale=0.05,
            seed=seed,
        )
        s = self.step
        self.layer = s.layer
        self.layer.kv_cache = s.kv_cache  # bound as vLLM's bind_kv_cache leaves it: [blocks, block, 576]
        self.is_neox, params = ROPES[rope]
        from vllm.model_executor.layers.rotary_embedding import get_rope

        with set_current_vllm_config(s.vllm_config):
            self.rope = get_rope(
                64, max_position=4096, is_neox_style=self.is_neox, rope_parameters=params, dtype=dtype
            ).to(DEVICE)
        gen = torch.Generator().manual_seed(seed + 1)
        T = s.num_tokens
        self.T = T + 2
        pos = torch.cat([torch.arange(r.context, r.context + r.query) for r in requests])
        self.positions = torch.cat([pos, torch.randint(0, 4096, (2,), generator=gen)]).to(DEVICE)
        q = torch.cat([s.q_all, (torch.randn(2, num_heads, 192, generator=gen)).to(DEVICE, dtype)])
        kv_a = torch.cat(
            [torch.cat([s.kv_c_new, s.k_pe_new[:, 0]], dim=-1), torch.randn(2, 576, generator=gen).to(DEVICE, dtype)]
        )
        self.q, self.kv_a = q, kv_a
        # the model's layout: q_pe a strided slice of q, k_pe / kv_c slices of the kv_a row
        self.slots = torch.cat([s.slot_mapping, torch.tensor([-1], device=DEVICE)])  # S = T + 1 < T + 2
        self.cache0 = s.kv_cache.clone()

    def inputs(self):
        """Fresh copies: (positions, q, kv_a, q_pe view, k_pe view, kv_c view)."""
        q, kv_a = self.q.clone(), self.kv_a.clone()
        return q, kv_a, q[..., 128:], kv_a[:, 512:], kv_a[:, :512]

    def forward_context(self, slot_mapping=True):
        name = self.layer.layer_name
        sm = {name: self.slots} if slot_mapping else {}
        return set_forward_context({name: self.step.metadata}, self.step.vllm_config, slot_mapping=sm)

    def run_op(self, q_pe, k_pe, kv_c, slot_mapping=True):
        with self.forward_context(slot_mapping):
            return OP(
                self.positions,
                q_pe,
                k_pe,
                kv_c,
                self.rope.cos_sin_cache,
                self.is_neox,
                self.layer.kv_cache_dtype,
                self.layer._k_scale,
                _encode_layer_name(self.layer.layer_name),
            )

    def reference(self):
        """vLLM's unfused path: the rope module's forward_static, then the layer's backend
        do_kv_cache_update (rows of slot >= 0) into a copy of the cache."""
        q, kv_a, q_pe, k_pe, kv_c = self.inputs()
        q_rot, k_rot = type(self.rope).forward_static(
            self.positions, q_pe, k_pe.unsqueeze(1), 64, 64, self.rope.cos_sin_cache, self.is_neox
        )
        cache = self.cache0.clone()
        n = self.slots.shape[0]
        self.layer.impl.do_kv_cache_update(
            kv_c[:n], k_rot[:n], cache, self.slots, self.layer.kv_cache_dtype, self.layer._k_scale
        )
        return q_rot, k_rot[:, 0], cache

    def cache_rows(self, cache):
        """Float32 rows of the written slots (fp8 dequantised) and the bytes of every other row."""
        from vllm.platforms import current_platform

        flat = cache.view(-1, 576)
        valid = self.slots[self.slots >= 0]
        rows = flat[valid]
        if self.step.fp8:
            rows = rows.view(current_platform.fp8_dtype()).float() * float(self.layer._k_scale)
        mask = torch.ones(flat.shape[0], dtype=torch.bool, device=flat.device)
        mask[valid] = False
        return rows.float(), flat[mask].view(torch.uint8) if flat.dtype != torch.uint8 else flat[mask]


def _close(got, want, dtype, what):
    raise_on(compare(what, got, want, rope_cases.ONE_MODEL_ROUNDING[dtype]).problem)


def _fp8_rows_close(got, want, dtype):
    raise_on(compare("fp8 cache rows", got, want, rope_cases.fp8_rows_vs_model_rounding(dtype, 0.05)).problem)


def _check_against_unfused(case: FusedCase, dtype):
    calls = dict(F.calls)
    q, kv_a, q_pe, k_pe, kv_c = case.inputs()
    kv_a_before = kv_a.clone()
    dep = case.run_op(q_pe, k_pe, kv_c)
    assert dep.numel() == 0 and F.calls["rocm_mla"] == calls["rocm_mla"] + 1
    q_rot, k_rot, cache_ref = case.reference()
    _close(q_pe, q_rot, dtype, "q_pe")
    _close(k_pe, k_rot, dtype, "k_pe")
    assert torch.equal(q[..., :128], case.q[..., :128]) and torch.equal(kv_a[:, :512], kv_a_before[:, :512])
    got, got_rest = case.cache_rows(case.layer.kv_cache)
    want, want_rest = case.cache_rows(cache_ref)
    if case.step.fp8:
        _fp8_rows_close(got, want, dtype)
    else:
        _close(got, want, dtype, "cache rows")
    assert torch.equal(got_rest, want_rest)  # no other byte of the cache was touched
    _, rest0 = case.cache_rows(case.cache0)
    assert torch.equal(got_rest, rest0)


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_fused_op_equals_forward_static_and_kv_update(block_size, kv_cache_dtype, rope):
    if HAS_GPU:
        pytest.skip("CPU variant (interpreter); the gpu-marked test covers the GPU")
    dtype = torch.float16 if rope == "neox" else torch.float32
    _check_against_unfused(
        FusedCase(RocmMLABackend, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=block_size, rope=rope), dtype
    )


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads", [16, 128])
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_op_equals_forward_static_and_kv_update_gpu(dtype, block_size, kv_cache_dtype, rope, num_heads):
    _check_against_unfused(
        FusedCase(
            RocmMLABackend,
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            rope=rope,
            num_heads=num_heads,
        ),
        dtype,
    )


def test_without_slot_mapping_q_and_k_are_still_rotated():
    """Profile/dummy runs have no slot mapping: vLLM's kernel then rotates nothing (its
    kernel call sits under ``if layer_slot_mapping is not None``); ours rotates and writes nothing."""
    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    case = FusedCase(RocmMLABackend, dtype=dtype)
    n = F.calls["rocm_mla_unfused_write"]
    q, kv_a, q_pe, k_pe, kv_c = case.inputs()
    case.run_op(q_pe, k_pe, kv_c, slot_mapping=False)
    assert F.calls["rocm_mla_unfused_write"] == n + 1
    q_rot, k_rot, _ = case.reference()
    _close(q_pe, q_rot, dtype, "q_pe")
    _close(k_pe, k_rot, dtype, "k_pe")
    assert torch.equal(case.layer.kv_cache.view(torch.uint8), case.cache0.view(torch.uint8))


def test_pcp_layer_writes_through_the_layers_update_kv_cache(monkeypatch):
    """With prefill context parallelism the cache inputs are gathered across ranks first
    (vLLM's update_kv_cache): the override rotates, then hands the write to the layer."""
    from vllm.model_executor.layers.attention import mla_attention

    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    case = FusedCase(RocmMLABackend, dtype=dtype, block_size=1)
    seen = []

    def gather(kv_c, k_pe, slot_mapping, num_decode_tokens, use_pcp, pcp_shard_decode_requests=False):
        seen.append((kv_c.shape, k_pe.shape, use_pcp))
        return kv_c, k_pe, slot_mapping  # one PCP rank: nothing to gather

    monkeypatch.setattr(mla_attention, "maybe_gather_mla_latent_cache_inputs", gather)
    monkeypatch.setattr(case.layer, "use_pcp", True)
    n = F.calls["rocm_mla_unfused_write"]
    q, kv_a, q_pe, k_pe, kv_c = case.inputs()
    case.run_op(q_pe, k_pe, kv_c)
    assert F.calls["rocm_mla_unfused_write"] == n + 1 and seen and seen[0][2] is True
    assert seen[0][1] == (case.T, 1, 64)
    q_rot, k_rot, cache_ref = case.reference()
    _close(q_pe, q_rot, dtype, "q_pe")
    got, rest = case.cache_rows(case.layer.kv_cache)
    want, want_rest = case.cache_rows(cache_ref)
    _close(got, want, dtype, "cache rows")
    assert torch.equal(rest, want_rest)


@pytest.mark.parametrize("block_size", [1, 16])
def test_another_backends_layer_gets_vllms_kernel(block_size, monkeypatch):
    """A TRITON_MLA layer: the override calls vLLM's own kernel function, which calls vLLM's
    compiled concat_and_cache_mla_rope_fused (recorded here: it needs vLLM's GPU build) on
    ``kv_cache.squeeze(1)`` -- at block size 1 that drops the block dim of the layer's
    [blocks, 1, 576] cache, which is why ROCM_MLA layers get the layer's cache as it is."""
    import vllm._custom_ops as ops
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    if not HAS_GPU:  # TritonMLAImpl asks the GPU for its SM count
        monkeypatch.setattr(type(current_platform), "num_compute_units", classmethod(lambda cls, device_id=0: 8))
    reqs = [H.Request(0, 3), H.Request(0, 2)]  # no context: building it would call vLLM's compiled write
    case = FusedCase(TritonMLABackend, dtype=dtype, block_size=block_size, requests=reqs)
    assert not isinstance(case.layer.impl, rocm_vllm.backend.RocmMLAImpl)
    rec = []
    monkeypatch.setattr(ops, "concat_and_cache_mla_rope_fused", lambda *a: rec.append(a))
    before = dict(F.calls)
    q, kv_a, q_pe, k_pe, kv_c = case.inputs()
    case.run_op(q_pe, k_pe, kv_c)
    assert F.calls["vllm"] == before["vllm"] + 1 and F.calls["rocm_mla"] == before["rocm_mla"]
    (args,) = rec
    assert args[1] is q_pe and args[2] is k_pe and args[6] is case.slots
    assert args[7].shape == case.layer.kv_cache.squeeze(1).shape
    assert args[7].dim() == (2 if block_size == 1 else 3)
    assert torch.equal(q_pe, case.q[..., 128:])  # the recorder rotated nothing


def test_override_is_what_torch_compile_runs():
    """A compiled function calling the op (as the fused graph does, through auto-functionalization
    of the mutated q_pe / k_pe) runs rocm_mla's kernel and gives the eager result."""
    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    case = FusedCase(RocmMLABackend, dtype=dtype, block_size=16)
    ln = _encode_layer_name(case.layer.layer_name)
    cs = case.rope.cos_sin_cache

    def step(positions, q, kv_a, k_scale):
        OP(positions, q[..., 128:], kv_a[:, 512:], kv_a[:, :512], cs, case.is_neox, "auto", k_scale, ln)
        return q * 2, kv_a + 1

    compiled = torch.compile(step, backend="inductor", fullgraph=True, dynamic=False)
    q, kv_a, *_ = case.inputs()
    before = F.calls["rocm_mla"]
    with case.forward_context():
        q2, kv2 = compiled(case.positions, q, kv_a, case.layer._k_scale)
    assert F.calls["rocm_mla"] == before + 1
    cache_compiled = case.layer.kv_cache.clone()
    case.layer.kv_cache.copy_(case.cache0)
    qe, kve, *_ = case.inputs()
    with case.forward_context():
        qe2, kve2 = step(case.positions, qe, kve, case.layer._k_scale)
    assert torch.equal(q2, qe2) and torch.equal(kv2, kve2) and torch.equal(q, qe) and torch.equal(kv_a, kve)
    assert torch.equal(cache_compiled.view(torch.uint8), case.layer.kv_cache.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("block_size", [1, 64])
def test_override_runs_inside_a_cuda_graph(block_size, kv_cache_dtype):
    """Captured once (the override's Python runs at capture), replayed on new inputs copied into
    the captured buffers: the replay rotates and writes like the eager op."""
    dtype = torch.bfloat16
    case = FusedCase(RocmMLABackend, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=block_size, num_heads=16)
    q, kv_a, q_pe, k_pe, kv_c = case.inputs()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (Triton compile) outside the capture
        case.run_op(q_pe, k_pe, kv_c)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    n = F.calls["rocm_mla"]
    with torch.cuda.graph(g):
        case.run_op(q_pe, k_pe, kv_c)
    assert F.calls["rocm_mla"] == n + 1
    for _ in range(2):  # new values in the captured buffers, fresh cache, replay
        case.q.normal_()
        case.kv_a.normal_()
        q.copy_(case.q)
        kv_a.copy_(case.kv_a)
        case.layer.kv_cache.copy_(case.cache0)
        g.replay()
        torch.cuda.synchronize()
        assert F.calls["rocm_mla"] == n + 1  # no Python on replay
        q_rot, k_rot, cache_ref = case.reference()
        _close(q_pe, q_rot, dtype, "q_pe")
        _close(k_pe, k_rot, dtype, "k_pe")
        got, rest = case.cache_rows(case.layer.kv_cache)
        want, want_rest = case.cache_rows(cache_ref)
        if case.step.fp8:
            _fp8_rows_close(got, want, dtype)
        else:
            _close(got, want, dtype, "cache rows")
        assert torch.equal(rest, want_rest)


def test_uninstall_restores_vllms_kernel(monkeypatch):
    """The dispatcher keeps vLLM's registration under ours: dropping our library brings it back."""
    import vllm._custom_ops as ops

    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    case = FusedCase(RocmMLABackend, dtype=dtype)
    rec = []
    monkeypatch.setattr(ops, "concat_and_cache_mla_rope_fused", lambda *a: rec.append(a))
    F.uninstall()
    try:
        q, kv_a, q_pe, k_pe, kv_c = case.inputs()
        if HAS_GPU:
            case.run_op(q_pe, k_pe, kv_c)
            assert len(rec) == 1  # vLLM's kernel for a ROCM_MLA layer, as without the plugin
        else:  # vLLM registered its kernel for "CUDA" only
            with pytest.raises(NotImplementedError):
                case.run_op(q_pe, k_pe, kv_c)
    finally:
        assert F.install(KEYS)
    q, kv_a, q_pe, k_pe, kv_c = case.inputs()
    case.run_op(q_pe, k_pe, kv_c)
    assert len(rec) == (1 if HAS_GPU else 0)


# ---------------------------------------------------------------- vLLM's compile pass on a layer graph


def _graph_ops(graph) -> list:
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    ops = []
    for n in graph.nodes:
        if n.op == "call_function":
            ops.append(n.args[0] if n.target is auto_functionalized else n.target)
    return ops


class _PostGradPasses(torch._inductor.custom_graph_pass.CustomGraphPass):
    """vLLM's post-grad sequence for this fusion (as vLLM's own test of the pass runs it):
    no-op elimination, MLARoPEKVCacheCatFusionPass, cleanup, fix-functionalization (which
    vLLM's pass manager always runs last: it turns the fused op back into an in-place call on
    q's slice). Records the graph's ops before and after."""

    def __init__(self, vllm_config):
        from vllm.compilation.passes import vllm_inductor_pass as vip
        from vllm.compilation.passes.fusion.mla_rope_kvcache_cat_fusion import MLARoPEKVCacheCatFusionPass
        from vllm.compilation.passes.utility.fix_functionalization import FixFunctionalizationPass
        from vllm.compilation.passes.utility.noop_elimination import NoOpEliminationPass
        from vllm.compilation.passes.utility.post_cleanup import PostCleanupPass

        device_type = vip.DEVICE_TYPE
        if not HAS_GPU:  # patterns are traced with (fake) tensors on the platform's device
            vip.DEVICE_TYPE = "cpu"
        try:
            with set_current_vllm_config(vllm_config):
                self.fusion = MLARoPEKVCacheCatFusionPass(vllm_config)
                self.passes = [
                    NoOpEliminationPass(vllm_config),
                    self.fusion,
                    PostCleanupPass(vllm_config),
                    FixFunctionalizationPass(vllm_config),
                ]
        finally:
            vip.DEVICE_TYPE = device_type
        self.before: list = []
        self.after: list = []

    def __call__(self, graph):
        self.before = _graph_ops(graph)
        for p in self.passes:
            p(graph)
        self.after = _graph_ops(graph)

    def uuid(self):
        return None  # no FX-graph caching


def _deepseek_layer_step(case: FusedCase, passes: _PostGradPasses):
    """One DeepSeek MLA layer step as vLLM's MultiHeadLatentAttentionWrapper.forward runs it
    (q_lora_rank None; kv_a_layernorm as plain torch; rope module and MLAAttention layer are
    vLLM's), compiled with Inductor and ``passes`` as its post-grad custom pass, and eagerly.
    Returns (compiled outputs, compiled cache, eager outputs, eager cache)."""
    from torch._inductor.compile_fx import compile_fx

    s = case.step
    layer, rope, N, dtype = case.layer, case.rope, s.N, s.dtype
    gen = torch.Generator().manual_seed(7)
    w_q = (torch.randn(256, N * 192, generator=gen) / 16).to(DEVICE, dtype)
    w_kva = (torch.randn(256, 576, generator=gen) / 16).to(DEVICE, dtype)
    hidden = torch.randn(s.num_tokens, 256, generator=gen).to(DEVICE, dtype)
    positions = case.positions[: s.num_tokens].clone()
    case.slots = s.slot_mapping

    def layer_step(positions, hidden):
        kv_lora = hidden @ w_kva  # kv_a_proj_with_mqa
        kv_c, k_pe = kv_lora.split([512, 64], dim=-1)
        kv_c_normed = kv_c * torch.rsqrt(kv_c.pow(2).mean(-1, keepdim=True) + 1e-6)
        k_pe = k_pe.unsqueeze(1)
        q = (hidden @ w_q).view(-1, N, 192)
        q[..., 128:], k_pe = rope(positions, q[..., 128:], k_pe)
        out = layer(q, kv_c_normed, k_pe, output_shape=(hidden.shape[0], N * 128))
        return out, q, k_pe, kv_c_normed

    def backend(gm, example_inputs):
        return compile_fx(
            gm,
            example_inputs,
            config_patches={
                "post_grad_custom_post_pass": passes,
                "enable_auto_functionalized_v2": False,
                "fx_graph_cache": False,
            },
        )

    compiled = torch.compile(layer_step, backend=backend, fullgraph=True)
    torch._dynamo.mark_dynamic(hidden, 0)  # as vLLM's support_torch_compile marks num_tokens
    torch._dynamo.mark_dynamic(positions, 0)
    with set_current_vllm_config(s.vllm_config), case.forward_context():
        got = compiled(positions, hidden)
    got_cache = case.layer.kv_cache.clone()
    case.layer.kv_cache.copy_(case.cache0)
    with set_current_vllm_config(s.vllm_config), case.forward_context():
        want = layer_step(positions, hidden)
    return got, got_cache, want, case.layer.kv_cache


LAYER_STEP = [H.Request(37, 1), H.Request(0, 1), H.Request(70, 1), H.Request(12, 5)]


def _pass_case(rope, kv_cache_dtype="auto"):
    dtype = torch.float32 if not HAS_GPU else torch.bfloat16
    case = FusedCase(
        RocmMLABackend, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=16, rope=rope, requests=LAYER_STEP
    )
    with set_current_vllm_config(case.step.vllm_config):
        assert not case.rope.enabled()  # vLLM's default custom_ops "none": forward_native RoPE in the graph
    return case, dtype


@pytest.mark.parametrize("rope", ["deepseek_yarn", "gptj"])
def test_vllm_fusion_pass_as_shipped(rope):
    """vLLM's pass exactly as shipped, on the layer step with DeepSeek-V3/R1's RoPE
    (DeepseekScalingRotaryEmbedding, deepseek_yarn): it matches. With plain RotaryEmbedding
    (rope_type default) it matches nothing with torch 2.13 -> xfail, with why."""
    case, _ = _pass_case(rope)
    passes = _PostGradPasses(case.step.vllm_config)
    n = F.calls["rocm_mla"]
    got, _, want, _ = _deepseek_layer_step(case, passes)
    t = H.COMPILED_VS_EAGER[case.step.dtype]  # the compiled step is right either way
    raise_on(compare("attention output, compiled vs eager", got[0], want[0], Bound(t, t)).problem)
    if passes.fusion.matched_count == 0 and rope == "gptj":
        pytest.xfail(
            f"torch {torch.__version__} + vLLM, plain RotaryEmbedding: 0 matches. The pattern "
            "keeps forward_static's no-op query.view(num_tokens, -1, 64); Inductor's joint-graph "
            "pointless_view removed it from the model graph (torch's fwd_only does not apply "
            "early_patterns to user patterns)"
        )
    assert passes.fusion.matched_count == 1
    assert torch.ops.vllm.fused_rope_unified_mla_kv_cache_update.default in passes.after
    assert F.calls["rocm_mla"] == n + 1


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("rope", ["deepseek_yarn", "gptj", "neox"])
def test_fusion_pass_puts_the_fused_op_in_a_deepseek_layer_step(rope, kv_cache_dtype):
    """vLLM's MLARoPEKVCacheCatFusionPass on the Inductor graph of one DeepSeek MLA layer step:
    RoPE and unified_mla_kv_cache_update are replaced by the fused op, whose kernel is
    rocm_mla's; the compiled step's attention output, q, k_pe and cache equal the eager
    (unfused) step's. DeepSeek's yarn RoPE: the pass as shipped; plain RotaryEmbedding: with
    the patterns normalised as Inductor normalises the graph (harness.normalized_fusion_patterns,
    see test_vllm_fusion_pass_as_shipped)."""
    if kv_cache_dtype == "fp8" and rope != "deepseek_yarn":
        pytest.skip("one fp8 case is enough (each Inductor compile costs 15-40 s)")
    case, dtype = _pass_case(rope, kv_cache_dtype)
    fused = torch.ops.vllm.fused_rope_unified_mla_kv_cache_update.default
    update = torch.ops.vllm.unified_mla_kv_cache_update.default
    if rope == "deepseek_yarn":
        passes = _PostGradPasses(case.step.vllm_config)
    else:
        with H.normalized_fusion_patterns():
            passes = _PostGradPasses(case.step.vllm_config)
    n = F.calls["rocm_mla"]
    got, got_cache, want, want_cache = _deepseek_layer_step(case, passes)
    assert passes.fusion.matched_count == 1
    assert update in passes.before and fused not in passes.before
    assert fused in passes.after and update not in passes.after
    assert torch.ops.aten.index.Tensor not in passes.after  # the cos/sin gather went with the RoPE
    assert F.calls["rocm_mla"] == n + 1
    tol = H.COMPILED_VS_EAGER[dtype]
    for g, w, what in zip(got, want, ("attention output", "q", "k_pe", "kv_c")):
        raise_on(H.layer_mismatch(g, w, tol, what))
    g_rows, g_rest = case.cache_rows(got_cache)
    w_rows, w_rest = case.cache_rows(want_cache)
    if case.step.fp8:  # in code units (value / k_scale): one e4m3 step apart
        ks = float(case.layer._k_scale)
        raise_on(compare("fp8 cache rows", g_rows / ks, w_rows / ks, rope_cases.TOLERANCE[dtype]["rows_fp8"]).problem)
    else:
        raise_on(H.layer_mismatch(g_rows, w_rows, tol, "cache rows"))
    assert torch.equal(g_rest, w_rest)


# ---------------------------------------------------------------- docker/serve.sh's flags, as vLLM reads them


@pytest.mark.parametrize(
    "fuse,user_args", [("1", ()), ("0", ()), ("1", ("-cc", '{"cudagraph_mode": "PIECEWISE"}'))], ids=str
)
def test_serve_sh_flags_as_vllm_reads_them(fuse, user_args):
    """docker/serve.sh's command line through vLLM's own `vllm serve` argument parser and
    create_engine_config (ROCm platform): with ROCM_MLA_FUSE_ROPE_KV=1 the fusion pass is on and
    the MLA KV update is no longer a splitting op (so RoPE and the update share one graph), also
    when the user passes a JSON compilation config (the keys merged into it, its own kept); with 0,
    vLLM's default (-O2: off, the update split out)."""
    import os
    import shlex
    import subprocess
    from pathlib import Path

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "MODEL", "TP", "ATTENTION"))}
    env.update(DRY_RUN="1", MODEL=H._tiny_deepseek_v3_dir(), MAX_MODEL_LEN="512", ROCM_MLA_FUSE_ROPE_KV=fuse)
    proc = subprocess.run(
        ["bash", str(repo / "docker" / "serve.sh"), "--skip-tokenizer-init", *user_args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout.splitlines()[-1])
    assert argv[:2] == ["vllm", "serve"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", argv[2], *argv[3:]])
    cfg = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    cc = cfg.compilation_config
    assert cfg.attention_config.backend.name == "ROCM_MLA"
    assert cc.pass_config.fuse_rope_kvcache_cat_mla is (fuse == "1")
    assert cc.use_inductor_graph_partition is (fuse == "1")
    assert ("vllm::unified_mla_kv_cache_update" in cc.splitting_ops) is (fuse == "0")
    assert "vllm::unified_mla_attention_with_output" in cc.splitting_ops  # attention still split out
    if user_args:
        assert cc.cudagraph_mode.name == "PIECEWISE"  # the user's own key kept


def test_bench_layer_rope_kv_variants_agree():
    """perf/bench_layer.py's RoPE + KV write columns (upstream, no-pass, fused, vLLM's fused op
    dispatched by the plugin) compute the same thing: its --check-rope-kv mode, which also runs on CPU."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    # The script imports the package as installed; PYTHONPATH makes that this checkout's.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    r = subprocess.run(
        [sys.executable, str(repo / "perf" / "bench_layer.py"), "--check-rope-kv"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if "--check-rope-kv" in ln][-1]
    assert "'vllm_op': None" not in line, line  # the vLLM op path ran too
