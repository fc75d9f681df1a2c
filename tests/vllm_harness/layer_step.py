"""One MLA layer step through a vLLM attention backend (0.34 or 0.33), on vLLM's own objects, with a float32
reference: what the tests, ``perf/bench_layer_copies.py`` and a GPU check run.

A :class:`LayerStep` builds the pieces a serving step has, with vLLM's own code:

* a ``VllmConfig`` of a DeepSeek-V3-shaped model (``kv_lora_rank`` 512, rope 64, nope 128, v 128;
  a ``config.json`` written to a temporary folder: nothing is downloaded), with
  ``attention_config.backend`` / ``mla_prefill_backend`` naming the backend under test;
* vLLM's ``MLAAttention`` layer with that backend and a real ``ColumnParallelLinear`` ``kv_b_proj``
  (a one-process gloo "distributed" group, as vLLM's CPU tests use), weights processed by
  ``process_weights_after_loading`` (``W_UK_T`` / ``W_UV``);
* a paged cache (NaN-filled; shuffled block tables from ``rocm_mla.cases.paged_cache``) holding
  each request's cached context, written through the backend's own KV write;
* ``CommonAttentionMetadata`` of the batch and the backend's metadata builder's ``build`` output.

:meth:`LayerStep.run` is one layer step as vLLM's ``MLAAttention.forward`` does it:
``update_kv_cache`` (new tokens into the cache) then ``forward_impl`` (decode rows through
``forward_mqa``, prefill rows through ``forward_mha``, plus vLLM's W_UK / W_UV bmms).
:meth:`LayerStep.reference` is the same attention in float32 through ``rocm_mla.reference``
(``mla_decode_ref`` for the decode rows, ``mla_prefill_ref`` for the prefill rows), reading cached
keys back from the cache (dequantised for fp8) exactly where the backend reads them from the cache.

Requires vLLM 0.33 or 0.34 and a platform set before vLLM modules are imported (tests: a simulated gfx942
``RocmPlatform``; a real ROCm box: the real one).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import tempfile
from dataclasses import dataclass

import torch

from rocm_mla.cases import Bound, generator, nan_filled, paged_cache
from rocm_mla.mla_dims import KV_LORA_RANK, KV_ROW_DIM, VLLM_FP8_KV_CACHE_DTYPES
from rocm_mla.mla_dims import QK_NOPE_HEAD_DIM as QK_NOPE
from rocm_mla.mla_dims import QK_ROPE_HEAD_DIM as QK_ROPE
from rocm_mla.mla_dims import V_HEAD_DIM as V_HEAD
from vllm_harness import process_weights

# DeepSeek-V3 per-layer attention geometry (rocm_mla.mla_dims, docs/ARCHITECTURE.md); N is per GPU
# rank and chosen per step.

_model_dirs: dict[tuple[int, int, int], str] = {}


def use_simulated_gfx942_platform() -> None:
    """Make vLLM's ``current_platform`` a ROCm platform that reports an MI300 (gfx942), on a
    machine without one. Call before importing any vLLM module that binds ``current_platform``
    (``vllm.model_executor...``, ``vllm.config`` users): they keep the object they imported.

    vllm/platforms/rocm.py asks torch for the GPU arch at import (patched for that import only)
    and for the device capability (patched to gfx942's 9.4, as ``RocmPlatform`` reports it).
    Two more host facts are made to match the machine rather than an MI300, each because the
    real value cannot work here:

    * ``fp8_dtype``: gfx942 stores fp8 as e4m3fnuz, which neither the Triton CPU interpreter
      nor an NVIDIA GPU implements; e4m3fn (gfx950's and NVIDIA's kind) is used unless the
      device really is a gfx94x. The backend follows ``current_platform.fp8_dtype()`` for
      both its cache writes and reads, so the choice is consistent either way.
    * ``is_pin_memory_available``: pinned host memory needs a GPU driver.

    Where vLLM's compiled ROCm ops are absent (an NVIDIA GPU with a copy of vLLM's pure-Python
    part, perf/vllm_on_device.sh), two queries vLLM's own layers make of them take torch's
    answer: its linear layers' skinny GEMMs (``VLLM_ROCM_USE_SKINNY_GEMM=0``: torch's GEMM, as on
    a GPU without them) and the shared memory per block that its batch-invariant matmul sizes
    tiles by (the device's property). Neither is a rocm_mla path.

    Model-class inspection, which vLLM runs in a child interpreter, runs in this process
    instead (see the comment below).
    """
    import types
    from unittest import mock

    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability

    from rocm_mla import _platform
    from rocm_mla.configs import platform_fp8_dtype

    if isinstance(platforms._current_platform, _SimulatedMarker):
        return
    with mock.patch.object(
        torch.cuda, "get_device_properties", lambda *a, **k: types.SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-")
    ):
        from vllm.platforms.rocm import RocmPlatform

    # The machine's own fp8 kind (configs/platform.json), not the simulated gfx942's.
    fp8 = platform_fp8_dtype(_platform.device_arch(torch.device("cuda" if torch.cuda.is_available() else "cpu")))

    class SimulatedGfx942Platform(RocmPlatform, _SimulatedMarker):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(9, 4)

        @classmethod
        def fp8_dtype(cls) -> torch.dtype:
            return fp8

        @classmethod
        def is_pin_memory_available(cls) -> bool:
            return torch.cuda.is_available()

    platforms._current_platform = SimulatedGfx942Platform()
    if torch.cuda.is_available() and importlib.util.find_spec("vllm._rocm_C") is None:
        import vllm._custom_ops as vllm_ops

        os.environ["VLLM_ROCM_USE_SKINNY_GEMM"] = "0"
        vllm_ops.get_max_shared_memory_per_block_device_attribute = lambda gpu: torch.cuda.get_device_properties(
            gpu
        ).shared_memory_per_block_optin

    # vLLM inspects a model class in a fresh interpreter (so the parent never initialises CUDA).
    # That child knows nothing of the simulated platform: on a machine with an NVIDIA GPU it
    # detects CUDA and imports vllm/platforms/cuda.py, which needs vLLM's compiled CUDA ops
    # (``vllm._C_stable_libtorch``), absent from a ROCm/CPU install and from a copy of vLLM's
    # pure-Python part (perf/vllm_on_device.sh).
    # The class's facts do not depend on where they are read, so read them here.
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = _run_here


# The compiled vLLM ops that vLLM's fusion-pass modules look up: the first five when
# mla_rope_kvcache_cat_fusion.py is imported (matcher_utils.py: ROTARY_OP, QUANT_OPS,
# SILU_MUL_OP), the rest when FixFunctionalizationPass walks a graph (its if-elif chain compares
# each auto_functionalized target with them). Schemas as vLLM's _C library (0.33, 0.34) registers them
# (read from its wheel). Only the schemas are needed: nothing in these tests calls them.
VLLM_C_SCHEMAS = {
    "rotary_embedding": "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) -> ()",
    "static_scaled_fp8_quant": "static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, "
    "int[]? group_shape=None) -> ()",
    "dynamic_scaled_fp8_quant": "dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()",
    "dynamic_per_token_scaled_fp8_quant": "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, "
    "Tensor! scale, Tensor? scale_ub) -> ()",
    "silu_and_mul": "silu_and_mul(Tensor! result, Tensor input) -> ()",
    "fused_add_rms_norm": "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()",
    "fused_add_rms_norm_static_fp8_quant": "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, "
    "Tensor! residual, Tensor weight, Tensor scale, float epsilon) -> ()",
    "rms_norm_dynamic_per_token_quant": "rms_norm_dynamic_per_token_quant(Tensor! result, Tensor input, "
    "Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, "
    "Tensor!? residual) -> ()",
    "rms_norm": "rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()",
    "rms_norm_static_fp8_quant": "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, "
    "Tensor scale, float epsilon) -> ()",
    "silu_and_mul_quant": "silu_and_mul_quant(Tensor! result, Tensor input, Tensor scale) -> ()",
    "fused_qk_norm_rope": "fused_qk_norm_rope(Tensor! qkv, int num_heads_q, int num_heads_k, int num_heads_v, "
    "int head_dim, float eps, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, "
    "bool is_neox, Tensor position_ids, int forced_token_heads_per_warp=-1) -> ()",
}
_libs: list = []  # torch.library.Library objects made here (kept alive)


def stub_vllm_compiled_op_schemas() -> list[str]:
    """Define the ``torch.ops._C`` schemas of :data:`VLLM_C_SCHEMAS` that are missing (vLLM's
    compiled ops did not load: a CPU machine, or the GPU machine with vLLM's pure-Python part
    only), so that vLLM's fusion-pass modules import. Schemas only: calling one raises.
    Returns the names defined."""
    missing = [n for n in VLLM_C_SCHEMAS if not _has_op("_C", n)]
    if missing:
        lib = torch.library.Library("_C", "FRAGMENT")
        for n in missing:
            lib.define(VLLM_C_SCHEMAS[n])
        _libs.append(lib)
    return missing


def _has_op(ns: str, name: str) -> bool:
    try:
        getattr(getattr(torch.ops, ns), name)
        return True
    except (AttributeError, RuntimeError):
        return False


def dispatch_vllm_attention_ops_on_cpu() -> None:
    """vLLM registers its attention custom ops (``torch.ops.vllm.unified_mla_kv_cache_update``,
    ``unified_mla_attention_with_output``) on the platform's dispatch key, "CUDA" for the
    simulated ROCm platform; on a CPU-only machine the tensors are CPU tensors. Register the same
    Python functions for the CPU key (nothing changes on a GPU machine)."""
    if getattr(dispatch_vllm_attention_ops_on_cpu, "_done", False):
        return
    from vllm.model_executor.layers.attention import mla_attention

    lib = torch.library.Library("vllm", "IMPL")
    for name in ("unified_mla_kv_cache_update", "unified_mla_attention_with_output"):
        lib.impl(name, getattr(mla_attention, name), "CPU")
    _libs.append(lib)
    dispatch_vllm_attention_ops_on_cpu._done = True


class normalized_fusion_patterns:
    """Context manager: vLLM's fusion passes trace their patterns like Inductor has already
    normalised the model graph they search -- torch's joint-graph ``early_patterns`` (no-op
    ``view`` removal) applied to the pattern too.

    Why (seen with torch 2.13, vLLM 0.33): ``MLARoPEKVCacheCatPattern`` traces RoPE's
    ``forward_static``, whose ``query.view(num_tokens, -1, head_size)`` stays in the pattern (torch's
    ``pattern_matcher.fwd_only`` no longer applies ``early_patterns`` to user patterns), while
    Inductor's joint-graph pass ``pointless_view`` has removed the same no-op view from the model
    graph before the post-grad custom passes run: the pass then matches nothing. Tests only: it
    patches a vLLM class attribute for the duration of the ``with``.
    """

    def __enter__(self):
        import torch._inductor.pattern_matcher as pm
        from torch._inductor.fx_passes.joint_graph import early_patterns
        from vllm.compilation.passes import vllm_inductor_pass as vip

        self._cls = vip.VllmFusionPatternMatcherPass
        self._orig = self._cls.__dict__["_trace_fn"]

        def trace(*args, **kwargs):
            gm = pm.fwd_only(*args, **kwargs)
            early_patterns.apply(gm.graph)
            gm.graph.eliminate_dead_code()
            gm.recompile()
            vip._fx_view_to_reshape(gm)
            vip._remove_noop_permutes(gm)
            return gm

        self._cls._trace_fn = staticmethod(trace)
        return self

    def __exit__(self, *exc):
        self._cls._trace_fn = self._orig
        return False


def _run_here(fn):
    """``vllm.model_executor.models.registry._run_in_subprocess`` without the subprocess."""
    return fn()


class _SimulatedMarker:
    """Marks the simulated platform (so a second call is a no-op)."""


def _tiny_deepseek_v3_dir(
    dims: tuple[int, int, int] = (QK_NOPE, QK_ROPE, V_HEAD), index_topk: int | None = None
) -> str:
    """A folder with the config.json of a one-layer DeepSeek-V3-shaped model (no weights), of head
    geometry ``dims`` = (qk_nope, qk_rope, v) (GLM-4.x-Lite's attention is DeepSeek-V2's with 192/64/256);
    with ``index_topk`` a sparse one (DeepSeek-V3.2's lightning indexer: 64 heads of 128)."""
    key = (*dims, index_topk)
    if key not in _model_dirs:
        d = tempfile.mkdtemp(prefix="rocm_mla_dsv3_")
        cfg = {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_size": 256,
            "intermediate_size": 512,
            "moe_intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "kv_lora_rank": KV_LORA_RANK,
            "q_lora_rank": 128,
            "qk_nope_head_dim": dims[0],
            "qk_rope_head_dim": dims[1],
            "v_head_dim": dims[2],
            "vocab_size": 1024,
            "max_position_embeddings": 4096,
            "rope_theta": 10000,
            "torch_dtype": "bfloat16",
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
        }
        if index_topk is not None:
            cfg.update(index_topk=index_topk, index_n_heads=64, index_head_dim=128)
        with open(f"{d}/config.json", "w") as f:
            json.dump(cfg, f)
        _model_dirs[key] = d
    return _model_dirs[key]


def ensure_single_process_group(vllm_config) -> None:
    """vLLM's tensor/decode-parallel groups of world size 1 (gloo), once per process."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config):
        ps.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{port}"
        )
        ps.initialize_model_parallel(1, 1)


# A layer step through a backend against LayerStep.reference, as max |err| over max(1, max |ref|):
# the step runs vLLM's W_UK / W_UV bmms and the attention in the model dtype, the reference in
# float32 from the same weights and cache.
LAYER_TOLERANCE = {torch.float32: 2e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}

# The same form for one layer step compiled with vLLM's fusion pass (the fused RoPE + KV write in
# the graph) against that step run eagerly (vLLM's forward_static RoPE, then the KV write): the
# fused op rotates in float32 and rounds once, forward_static rounds after each op in the model
# dtype, and attention carries that difference into the output.
COMPILED_VS_EAGER = {torch.float32: 1e-5, torch.float16: 3e-2, torch.bfloat16: 3e-2}

# Decode context parallelism (vllm_harness.dcp) against the 1-rank step, in the same form: each
# rank attends its KV shard and vLLM's cp_lse_ag_out_rs rescales and sums the partials in the model
# dtype, a different summation order of the same float32 softmax.
DCP_TOLERANCE = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


# perf/bench_layer.py's layer steps (its own compositions, bf16 on a GPU): rocm_mla's output against
# the upstream composition's on the same inputs, as the relative Frobenius error (element-wise
# unbounded): two bf16 compositions of the same attention (FlashAttention on padded v with vLLM's
# Triton kernels, against ours) agree to about 1e-2.
LAYER_AGREEMENT = Bound(math.inf, 0.0, norm=2e-2)


def scaled_error(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |got - ref|, max(1, max |ref|)): the two sides of the layer-step bounds above (NaN
    anywhere gives a NaN error, which no bound holds)."""
    err = (got.float() - ref.float()).abs().max().item() if got.numel() else 0.0
    return err, max(1.0, ref.float().abs().max().item()) if ref.numel() else 1.0


def layer_mismatch(got: torch.Tensor, ref: torch.Tensor, tol: float, what: str = "layer output") -> str:
    """'' when ``max |got - ref| <= tol * max(1, max |ref|)`` (got finite), else what differs."""
    err, scale = scaled_error(got, ref)
    if not bool(torch.isfinite(got).all()):
        return f"{what}: {int((~torch.isfinite(got)).sum())} elements not finite"
    if not err <= tol * scale:
        return f"{what}: max |err| {err:.3g} > {tol:g} x {scale:.3g}"
    return ""


def nan_cache(num_blocks: int, block_size: int, dtype: torch.dtype, fp8: bool, device) -> torch.Tensor:
    """vLLM's latent cache ``[num_blocks, block_size, 576]`` holding NaN in every slot: ``dtype``,
    or with ``fp8`` uint8 storage of the platform kind's NaN code (vLLM's fp8 cache)."""
    if fp8:
        from vllm.platforms import current_platform

        kind = current_platform.fp8_dtype()
        return nan_filled((num_blocks, block_size, KV_ROW_DIM), kind, device).view(torch.uint8)
    return nan_filled((num_blocks, block_size, KV_ROW_DIM), dtype, device)


@dataclass
class Request:
    """One request of the batch: ``context`` tokens already cached, ``query`` new tokens."""

    context: int
    query: int


class LayerStep:
    """A batch of requests through one MLA layer with a given vLLM attention backend.

    Args:
        backend: the attention backend class (e.g. ``RocmMLABackend``).
        requests: decode-shaped requests first (vLLM's runner orders the batch that way).
        num_heads: heads on this rank (N).
        dtype: model dtype; kv_cache_dtype: vLLM's string ("auto", "fp8", ...).
        decode_threshold: widest query still run as decode (1; 1 + speculative tokens for MTP).
        workspace_rows: chunked-context workspace rows (small values force several context chunks
            and requests split across chunks); default vLLM's.
        k_scale: the layer's fp8 KV scale.
        prefill_backend: vLLM's ``mla_prefill_backend`` name ("ROCM_MLA" by default).
        dims: the head geometry (qk_nope_head_dim, qk_rope_head_dim, v_head_dim); DeepSeek-V3's by
            default, e.g. (192, 64, 256) for GLM-4.x-Lite (the latent row stays 512 + 64).
        index_topk: a sparse MLA layer (DeepSeek-V3.2, GLM-5.x) with this top-k: the layer reads
            its rows' positions from ``topk_buffer`` ``[T, index_topk]`` int32 (-1 filled; the
            caller fills it, e.g. through the indexer), as vLLM's indexer layers hand it over.
        index_leader: the layer owns an indexer (False: a skip layer of ``index_topk_freq``, which
            reads the buffer its group's leader wrote).
    """

    def __init__(
        self,
        backend,
        requests: list[Request],
        *,
        num_heads: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kv_cache_dtype: str = "auto",
        block_size: int = 16,
        decode_threshold: int = 1,
        workspace_rows: int | None = None,
        k_scale: float = 1.0,
        prefill_backend: str = "ROCM_MLA",
        seed: int = 0,
        dims: tuple[int, int, int] = (QK_NOPE, QK_ROPE, V_HEAD),
        index_topk: int | None = None,
        index_leader: bool = True,
    ):
        from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
        from vllm.config.attention import AttentionConfig
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention
        from vllm.model_executor.layers.linear import ColumnParallelLinear
        from vllm.v1.attention.backend import CommonAttentionMetadata

        self.device = torch.device(device)
        self.dtype, self.N, self.bs = dtype, num_heads, block_size
        self.kv_cache_dtype, self.fp8 = kv_cache_dtype, kv_cache_dtype in VLLM_FP8_KV_CACHE_DTYPES
        self.requests = requests
        dims = tuple(dims)
        P, R, V = dims
        if R != QK_ROPE:
            raise ValueError(f"LayerStep: dims: expected qk_rope_head_dim {QK_ROPE} (latent row 512 + 64), got {R}")
        self.P, self.V = P, V
        gen = torch.Generator().manual_seed(seed)

        def randn(*shape, scale=1.0):
            return (torch.randn(*shape, generator=gen, device="cpu") * scale).to(device=self.device)

        dev_type = "cpu" if self.device.type == "cpu" else "cuda"
        model_config = ModelConfig(
            model=_tiny_deepseek_v3_dir(dims, index_topk), skip_tokenizer_init=True, max_model_len=4096, dtype=dtype
        )
        self.index_topk = index_topk
        sparse_args = {}
        if index_topk is not None:
            import types

            tokens = sum(r.query for r in requests)
            self.topk_buffer = torch.full((tokens, index_topk), -1, dtype=torch.int32, device=self.device)
            holder = types.SimpleNamespace(topk_indices_buffer=self.topk_buffer) if index_leader else None
            sparse_args = dict(use_sparse=True, indexer=holder, topk_indices_buffer=self.topk_buffer)
        cache_config = CacheConfig(block_size=block_size, cache_dtype=kv_cache_dtype)
        self.vllm_config = vc = VllmConfig(
            model_config=model_config,
            cache_config=cache_config,
            device_config=DeviceConfig(device=dev_type),
            attention_config=AttentionConfig(backend=backend.get_name(), mla_prefill_backend=prefill_backend),
        )
        ensure_single_process_group(vc)

        self.scale = 1.0 / math.sqrt(P + QK_ROPE)
        prev_dtype = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # vLLM builds layers under the model dtype
        try:
            with set_current_vllm_config(vc), torch.device(self.device):
                kvb = ColumnParallelLinear(
                    KV_LORA_RANK,
                    num_heads * (P + V),
                    bias=False,
                    prefix="model.layers.0.self_attn.kv_b_proj",
                )
                kvb.weight.data.copy_(randn(*kvb.weight.shape, scale=KV_LORA_RANK**-0.5))
                self.layer = MLAAttention(
                    num_heads=num_heads,
                    scale=self.scale,
                    qk_nope_head_dim=P,
                    qk_rope_head_dim=QK_ROPE,
                    v_head_dim=V,
                    q_lora_rank=None,
                    kv_lora_rank=KV_LORA_RANK,
                    kv_b_proj=kvb,
                    cache_config=cache_config,
                    prefix="model.layers.0.self_attn.attn",
                    attn_backend=backend,
                    **sparse_args,
                )
                process_weights(self.layer, dtype)
                if self.fp8:
                    self.layer._k_scale.fill_(k_scale)
                    self.layer._k_scale_float = k_scale
                spec = self.layer.get_kv_cache_spec(vc)
                self.builder = backend.get_builder_cls()(spec, [self.layer.layer_name], vc, self.device)
        finally:
            torch.set_default_dtype(prev_dtype)
        self.builder.reorder_batch_threshold = decode_threshold
        if workspace_rows is not None:
            self.builder.chunked_prefill_workspace_size = workspace_rows
            self.builder.chunked_prefill_workspace = torch.empty(
                workspace_rows,
                KV_ROW_DIM,
                dtype=self.builder.chunked_prefill_workspace.dtype,
                device=self.device,
            )

        # Paged cache: shuffled pages and a spare column from rocm_mla.cases.paged_cache (its own
        # generator: the values above keep their seed); vLLM's cache object is NaN everywhere (fp8:
        # the platform kind's NaN code, as uint8 storage) until the backend's KV write fills it.
        paged = paged_cache(
            [r.context + r.query for r in requests],
            block_size,
            dtype=torch.float32,
            device=self.device,
            gen=generator(seed, self.device),
        )
        self.block_table = paged.table
        num_blocks = paged.cache.shape[0]
        del paged
        self.kv_cache = nan_cache(num_blocks, block_size, dtype, self.fp8, self.device)

        # Per request: the latent rows of its whole sequence (context + new) and its new queries.
        self.kv_c = [randn(r.context + r.query, KV_LORA_RANK).to(dtype) for r in requests]
        self.k_pe = [randn(r.context + r.query, QK_ROPE).to(dtype) for r in requests]
        self.q = [randn(r.query, num_heads, P + QK_ROPE, scale=0.5).to(dtype) for r in requests]

        def slots(i: int, lo: int, hi: int) -> torch.Tensor:
            pos = torch.arange(lo, hi, device=self.device)
            return self.block_table[i, pos // block_size].long() * block_size + pos % block_size

        # Cached context, through the backend's KV write (as the earlier steps wrote it).
        for i, r in enumerate(requests):
            if r.context:
                self.layer.impl.do_kv_cache_update(
                    self.kv_c[i][: r.context],
                    self.k_pe[i][: r.context, None, :],
                    self.kv_cache,
                    slots(i, 0, r.context),
                    kv_cache_dtype,
                    self.layer._k_scale,
                )

        # This step's inputs, laid out as the model hands them over: q [T, N, 192] with q_pe a
        # strided slice, k_pe [T, 1, 64] a slice of the kv_a output row.
        self.q_all = torch.cat(self.q)
        kv_a = torch.cat(
            [torch.cat([c[r.context :], p[r.context :]], dim=-1) for c, p, r in zip(self.kv_c, self.k_pe, requests)]
        )
        self.kv_c_new = kv_a[:, :KV_LORA_RANK]
        self.k_pe_new = kv_a[:, KV_LORA_RANK:].unsqueeze(1)
        self.slot_mapping = torch.cat([slots(i, r.context, r.context + r.query) for i, r in enumerate(requests)])
        qlens = [r.query for r in requests]
        seq_lens = [r.context + r.query for r in requests]
        qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
        self.num_tokens = int(qsl[-1])
        self.common = CommonAttentionMetadata(
            query_start_loc=qsl.to(self.device),
            query_start_loc_cpu=qsl,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=self.device),
            num_reqs=len(requests),
            num_actual_tokens=self.num_tokens,
            max_query_len=max(qlens),
            max_seq_len=max(seq_lens),
            block_table_tensor=self.block_table,
            slot_mapping=self.slot_mapping,
            seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
        )
        self.metadata = self.builder.build(0, self.common)
        self.output = torch.empty(self.num_tokens, num_heads * V, dtype=dtype, device=self.device)

    # ------------------------------------------------------------------ the step

    def capture_backend_calls(self) -> list[tuple[str, tuple, dict]]:
        """Run the step once and record the calls ``forward_impl`` / ``update_kv_cache`` made into
        the backend impl (``do_kv_cache_update``, ``forward_mqa``, ``forward_mha``) with their
        exact arguments, so that they can be replayed alone (e.g. under a profiler)."""
        impl = self.layer.impl
        calls: list[tuple[str, tuple, dict]] = []
        names = ("do_kv_cache_update", "forward_mqa", "forward_mha")
        for name in names:
            bound = getattr(impl, name)

            def wrapper(*args, __name=name, __bound=bound, **kwargs):
                calls.append((__name, args, kwargs))
                return __bound(*args, **kwargs)

            setattr(impl, name, wrapper)
        try:
            self.run()
        finally:
            for name in names:
                delattr(impl, name)
        return calls

    def replay(self, calls: list[tuple[str, tuple, dict]]) -> None:
        """Run recorded backend calls again (same tensors: the KV write and the outputs are
        idempotent)."""
        for name, args, kwargs in calls:
            getattr(self.layer.impl, name)(*args, **kwargs)

    def run_prefill_on_stored_cache(self) -> torch.Tensor:
        """The step, then its prefill rows again through ``forward_mha`` handed the cache as vLLM
        allocates it (uint8 storage for fp8) in place of the float8 view ``forward_impl`` gives:
        how vLLM's own backend tests call it. The prefill rows are NaN-filled before that call;
        returns the step's output ``[T, N * V]``."""
        ((_, args, kwargs),) = [c for c in self.capture_backend_calls() if c[0] == "forward_mha"]
        viewed = args[3]
        assert viewed.data_ptr() == self.kv_cache.data_ptr()
        assert viewed.dtype != torch.uint8 or not self.fp8, "forward_impl hands over the float8 view"
        kwargs["output"].fill_(float("nan"))
        self.layer.impl.forward_mha(*args[:3], self.kv_cache, *args[4:], **kwargs)
        return self.output

    def run(self) -> torch.Tensor:
        """One layer step: KV write of the new tokens, then attention; returns ``[T, N * 128]``."""
        self.layer.update_kv_cache(
            self.kv_c_new,
            self.k_pe_new,
            self.kv_cache,
            self.slot_mapping,
            self.metadata,
            self.kv_cache_dtype,
            self.layer._k_scale,
        )
        self.layer.forward_impl(
            self.q_all, self.kv_c_new, self.k_pe_new, self.kv_cache, self.metadata, output=self.output
        )
        return self.output

    # ------------------------------------------------------------------ float32 reference

    def mismatch(self, out: torch.Tensor | None = None, *, ref: torch.Tensor | None = None) -> str:
        """'' when ``out`` (default: the step's output) agrees with :meth:`reference` under
        LAYER_TOLERANCE[dtype], else what differs."""
        out = self.output if out is None else out
        return layer_mismatch(out, self.reference() if ref is None else ref, LAYER_TOLERANCE[self.dtype])

    def cached_rows(self, i: int, lo: int, hi: int, *, codes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Request i's tokens [lo, hi) as the cache holds them, in float32 (fp8 dequantised, or with
        ``codes`` the stored e4m3 values themselves: value / k_scale)."""
        from vllm.platforms import current_platform

        pos = torch.arange(lo, hi, device=self.device)
        rows = self.kv_cache[self.block_table[i, pos // self.bs].long(), pos % self.bs]
        if self.fp8:
            rows = rows.view(current_platform.fp8_dtype()).float()
            if not codes:
                rows = rows * float(self.layer._k_scale)
        rows = rows.float()
        return rows[:, :KV_LORA_RANK], rows[:, KV_LORA_RANK:]

    def reference(self) -> torch.Tensor:
        """The step's attention output ``[T, N * 128]`` in float32, through ``rocm_mla.reference``.

        The layer's own projection weights are applied here (float32); the attention itself is the
        package's references:

        * decode requests (the first ``num_decodes``, uniform q_len): ``mla_decode_ref`` on the
          absorbed query ``q_nope @ W_UK`` ``[rows, N, 512]`` and ``q_pe``, reading every key (the
          new ones too) back from the paged cache through the block table (fp8: dequantised with
          k_scale), then ``@ W_UV``;
        * prefill requests: ``mla_prefill_ref`` (causal, bottom-right aligned) on keys and values
          up-projected from ``[kv_c | k_pe]``: the context as the cache holds it, the new tokens
          from the activations.
        """
        from rocm_mla.reference import mla_decode_ref, mla_prefill_ref

        N, dev, P, V = self.N, self.device, self.P, self.V
        w = self.layer.kv_b_proj.weight.float().T.reshape(KV_LORA_RANK, N, P + V)
        w_uk, w_uv = w[..., :P], w[..., P:]
        nd = self.metadata.num_decodes
        outs = []
        if nd:
            reqs = self.requests[:nd]
            q_len = reqs[0].query
            assert all(r.query == q_len for r in reqs), "decode rows: uniform q_len"
            q = torch.cat(self.q[:nd]).float()  # [nd * q_len, N, 192]
            ql_nope = torch.einsum("tnd,lnd->tnl", q[..., :P], w_uk)
            cache, k_scale = self.kv_cache, None
            if self.fp8:
                from vllm.platforms import current_platform

                cache, k_scale = cache.view(current_platform.fp8_dtype()), float(self.layer._k_scale)
            seq_lens = torch.tensor([r.context + r.query for r in reqs], dtype=torch.int32, device=dev)
            o, _ = mla_decode_ref(ql_nope, q[..., P:], cache, self.block_table[:nd], seq_lens, self.scale, k_scale)
            outs.append(torch.einsum("tnl,lnd->tnd", o, w_uv).reshape(-1, N * V))
        if nd < len(self.requests):
            kv_c, k_pe, cu_k = [], [], [0]
            for i in range(nd, len(self.requests)):
                r = self.requests[i]
                c_kv, c_pe = self.cached_rows(i, 0, r.context)
                kv_c += [c_kv, self.kv_c[i][r.context :].float()]
                k_pe += [c_pe, self.k_pe[i][r.context :].float()]
                cu_k.append(cu_k[-1] + r.context + r.query)
            kv_c, k_pe = torch.cat(kv_c), torch.cat(k_pe)
            q = torch.cat(self.q[nd:]).float()
            cu_q = [0]
            for r in self.requests[nd:]:
                cu_q.append(cu_q[-1] + r.query)
            o, _ = mla_prefill_ref(
                q,
                torch.einsum("sl,lnd->snd", kv_c, w_uk),
                k_pe[:, None, :],
                torch.einsum("sl,lnd->snd", kv_c, w_uv),
                torch.tensor(cu_q, device=dev),
                torch.tensor(cu_k, device=dev),
                self.scale,
                causal=True,
            )
            outs.append(o.reshape(-1, N * V))
        return torch.cat(outs)
