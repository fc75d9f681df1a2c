"""Sparse MLA (DeepSeek-V3.2, GLM-5.x) through vLLM's classes on rocm_mla: the ROCM_MLA_SPARSE
backend, the indexer on mla_indexer_topk, and the hook that routes vLLM's ROCm DeepSeek-V3.2 layers.

Each layer step (vllm_harness.sparse_step) runs the indexer on this step's metadata, then vLLM's
MLAAttention (``use_sparse=True``) with the backend: decode rows, MTP rows, prefill rows with
cached context (sparse: longer than index_topk) and short prefills (dense, vLLM's rule), against
the float32 composition of the references; the indexer's answer must be a valid top-k of the
float64 logits. Same set-up as test_vllm_backend.py (vLLM 0.34.0 or 0.33.0, simulated gfx942
platform, Triton interpreter on the CPU; the same tests on a GPU).
"""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, HAS_GPU
from vllm_harness import require_vllm

require_vllm()

from vllm_harness.layer_step import (  # noqa: E402
    LayerStep,
    Request,
    ensure_single_process_group,
    use_simulated_gfx942_platform,
)

use_simulated_gfx942_platform()

import rocm_mla.vllm as rocm_vllm  # noqa: E402

rocm_vllm.register()

from vllm_harness.sparse_step import SparseLayerStep  # noqa: E402

from rocm_mla.cases import raise_on  # noqa: E402
from rocm_mla.mla_dims import PREFILL_GEOMETRIES  # noqa: E402
from rocm_mla.vllm import sparse_layer  # noqa: E402
from rocm_mla.vllm.sparse_backend import RocmMLASparseBackend  # noqa: E402

DTYPE = torch.bfloat16 if HAS_GPU else torch.float32
DSV32 = dict(dims=(128, 64, 128), index_heads=64)  # DeepSeek-V3.2: 128 heads / TP, indexer 64 x 128
GLM5 = dict(dims=PREFILL_GEOMETRIES["glm-lite"], index_heads=32)  # GLM-5.x: 192/64/256, indexer 32 x 128
TOPK = 32  # small, so that contexts of tens of tokens already select

# (model, heads per rank, requests, MTP width, kv cache, block size, whether the prefill runs dense)
STEPS = {
    # decodes, then a prefill with cached context longer than the top-k (sparse rows)
    "dsv32-decode-prefill": (DSV32, 16, [Request(40, 1), Request(71, 1), Request(50, 9)], 1, "auto", 16, False),
    # MTP: rows of 1 + 1 speculative tokens, causal inside a request; fp8 latent cache, 64-token pages
    "dsv32-mtp-fp8": (DSV32, 128, [Request(45, 2), Request(3, 2), Request(90, 2)], 2, "fp8", 64, None),
    # GLM-5 at TP 8 (8 heads): a decode and two short prefills (<= top-k: dense), page size 1
    "glm5-short-prefill": (GLM5, 8, [Request(60, 1), Request(0, 20), Request(7, 11)], 1, "auto", 1, True),
    # one head per rank, a prompt longer than the top-k without context, fp8, 16-token pages
    "glm5-long-prompt-fp8": (GLM5, 1, [Request(0, 45)], 1, "fp8", 16, False),
    # a decode and short prefills (<= top-k: dense) with cached context, fp8, 16-token pages
    "dsv32-short-prefill-fp8": (DSV32, 16, [Request(30, 1), Request(9, 12), Request(14, 5)], 1, "fp8", 16, True),
}


def _step(name: str, **kw) -> SparseLayerStep:
    model, N, reqs, mtp, kv, bs, _ = STEPS[name]
    kw.setdefault("kv_cache_dtype", kv)
    return SparseLayerStep(
        RocmMLASparseBackend,
        reqs,
        num_heads=N,
        dtype=DTYPE,
        device=DEVICE,
        block_size=bs,
        decode_threshold=mtp,
        index_topk=TOPK,
        **model,
        **kw,
    )


@pytest.mark.parametrize("name", list(STEPS))
def test_sparse_layer_step(name):
    """Indexer + attention of one step through vLLM's MLAAttention and the backend's own builder:
    the top-k a valid one, every output element written and equal to the float32 composition."""
    step = _step(name)
    dense = STEPS[name][-1]
    if dense is not None:
        assert step.dense_prefill == dense
    nd = sum(r.query for r in step.requests if r.query <= STEPS[name][3])
    assert step.metadata.num_decode_tokens == nd
    step.output.fill_(float("nan"))
    step.run()
    raise_on(step.indexer_mismatch())
    raise_on(step.mismatch())


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3"])
def test_short_prefill_with_context_on_uint8_fp8_storage(kv_cache_dtype):
    """A short (dense) prefill with cached context whose forward_mha gets the fp8 cache as vLLM
    allocates it (uint8 storage, as vLLM's sparse-MLA backend tests call it) rather than
    forward_impl's float8 view: the context gather reads the bytes as the layer's fp8 kind, and
    the step (its decode row sparse, its prefill rows dense) matches the float32 composition."""
    step = _step("dsv32-short-prefill-fp8", kv_cache_dtype=kv_cache_dtype)
    assert step.dense_prefill and step.metadata.prefill.chunked_context is not None
    assert step.kv_cache.dtype == torch.uint8 and step.layer.impl.op_kv_cache_dtype == kv_cache_dtype
    step.output.fill_(float("nan"))
    out = step.run_prefill_on_stored_cache()
    raise_on(step.indexer_mismatch())
    raise_on(step.mismatch(out))


def test_indexer_rows_see_their_positions():
    """The builder's per-row request and key count (position + 1: decode rows their context, MTP
    and prefill rows causal), and vLLM's request mapping for tokens past the batch (request 0)."""
    step = _step("dsv32-mtp-fp8")
    md = step.metadata
    T = step.num_tokens
    assert torch.equal(md.req_id_per_token[:T].cpu(), step.req_ids)
    assert torch.equal(md.indexer_kv_lens[:T].cpu(), step.kv_lens)


def test_skip_layer_reads_the_shared_buffer():
    """A layer without an indexer (index_topk_freq's skip layers) attends over the top-k its group
    leader wrote into the shared buffer: the same output as the leader from the same buffer."""
    lead = _step("dsv32-decode-prefill")
    lead.run()
    skip = _step("dsv32-decode-prefill", index_leader=False)
    skip.topk_buffer.copy_(lead.topk_buffer)
    assert skip.layer.impl.topk_indices_buffer is skip.topk_buffer
    skip.output.fill_(float("nan"))
    LayerStep.run(skip)  # the KV write and the attention, no indexer of its own
    raise_on(skip.mismatch())
    assert torch.equal(skip.output, lead.output)


def test_bad_page_gives_a_nan_row():
    """A block-table entry outside the cache among a row's keys: the indexer marks the row (-2
    everywhere) and the attention writes NaN there; the other rows stay exact."""
    step = _step("dsv32-decode-prefill")
    step.block_table[1, 0] = step.kv_cache.shape[0] + 5  # request 1's first page
    step.run()
    assert bool((step.topk_buffer[1] == -2).all())
    out = step.output.view(step.num_tokens, -1)
    assert bool(out[1].isnan().all())
    others = [0] + list(range(2, step.num_tokens))
    raise_on(step.mismatch(out[others], ref=step.reference()[others]))


def test_backend_declarations():
    """Sparse, MLA, the latent row only, any block size, fp8 and 16-bit caches of the model dtype."""
    B = RocmMLASparseBackend
    assert B.is_sparse() and B.is_mla() and B.get_name() == "ROCM_MLA_SPARSE"
    assert B.supports_combination(576, torch.bfloat16, "fp8", 1, True, False, True, False, None) is None
    why = B.supports_combination(512, torch.bfloat16, "auto", 16, True, False, True, False, None)
    assert "latent head size 512" in why
    why = B.supports_combination(576, torch.bfloat16, "float16", 16, True, False, True, False, None)
    assert "16-bit cache" in why
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert AttentionBackendEnum["ROCM_MLA_SPARSE"].get_path() == rocm_vllm.SPARSE_BACKEND_CLASS


def test_hook_routes_only_when_selected(tmp_path, monkeypatch):
    """On the (simulated) ROCm platform register() puts rocm_mla's subclass where vLLM's ROCm
    DeepSeek-V3.2 model takes its attention class. A layer built with ROCM_MLA selected runs
    ROCM_MLA_SPARSE, no aiter indexer op, a 16-bit query and a dense prefill backend; with any
    other backend the layer is built by vLLM's own class, untouched."""
    import json
    from unittest import mock

    import vllm.models.deepseek_v32.amd.model as amd_model
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.attention import AttentionConfig

    cls = sparse_layer.installed_class()
    assert cls is not None and amd_model.DeepseekV32MLAAttention is cls
    base = cls._rocm_mla_base
    cfg = {
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "hidden_size": 256,
        "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 16,
        "num_key_value_heads": 16, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": 128, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 1024, "max_position_embeddings": 4096,
        "rope_theta": 10000, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "index_topk": TOPK, "index_n_heads": 64, "index_head_dim": 128,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    buf = torch.full((8, TOPK), -1, dtype=torch.int32, device=DEVICE)

    def build(backend, layer):
        mc = ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, max_model_len=4096, dtype=DTYPE)
        vc = VllmConfig(
            model_config=mc,
            cache_config=CacheConfig(block_size=16),
            device_config=DeviceConfig(device=DEVICE.type),
            attention_config=AttentionConfig(backend=backend),
        )
        # The layer reads the tensor-parallel world size: a 1-rank group, whichever test ran first.
        ensure_single_process_group(vc)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(DTYPE)
        try:
            with set_current_vllm_config(vc), torch.device(DEVICE):
                return vc, cls(vc, mc.hf_config, prefix=f"model.layers.{layer}.self_attn", topk_indices_buffer=buf)
        finally:
            torch.set_default_dtype(prev)

    for i, name in enumerate(("ROCM_MLA", "ROCM_MLA_SPARSE")):
        vc, layer = build(name, 10 + i)
        assert sparse_layer.rocm_mla_selected(vc)
        assert layer.attn_backend is RocmMLASparseBackend and type(layer.impl).__name__ == "RocmMLASparseImpl"
        assert layer.indexer_op is None and layer._fp8_kv is False and layer.prefill_backend is not None
        assert layer.impl.topk_indices_buffer is buf
    with mock.patch.object(base, "__init__", return_value=None) as vllm_init:
        for name in (None, "TRITON_MLA", "ROCM_AITER_MLA_SPARSE"):
            mc = ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, max_model_len=4096, dtype=DTYPE)
            vc = VllmConfig(model_config=mc, attention_config=AttentionConfig(backend=name))
            assert not sparse_layer.rocm_mla_selected(vc)
            layer = cls(vc, mc.hf_config, "model.layers.20.self_attn", buf)
            assert layer._rocm_mla is False
        assert vllm_init.call_count == 3
    # Re-entrant: a second install keeps the one subclass.
    assert sparse_layer.install() and sparse_layer.installed_class() is cls


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm)")
def test_decode_step_captures_in_a_graph():
    """A uniform MTP decode step (indexer + KV write + sparse attention, fp8 cache) captured in one
    CUDA/HIP graph: replayed on new queries it gives the eager step's output bit for bit."""
    step = _step("dsv32-mtp-fp8")
    step.run()  # compiles every kernel outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step.run()
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    step.q_all.copy_(torch.randn(step.q_all.shape, generator=gen, device=DEVICE).to(step.q_all.dtype) * 0.5)
    step.index_q.copy_(torch.randn(step.index_q.shape, generator=gen, device=DEVICE).mul_(2).to(step.index_q.dtype))
    step.output.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    replayed = step.output.clone()
    raise_on(step.indexer_mismatch())
    raise_on(step.mismatch())
    step.run()
    assert torch.equal(replayed, step.output)


@pytest.fixture
def plan_calls(monkeypatch):
    """Counts of the planner calls: the backend's and the indexer hook's (``backend``,
    ``indexer``), and the ops' own, which a call made with a plan never reaches (``op``)."""
    import rocm_mla.ops.indexer_topk as indexer_op
    import rocm_mla.ops.sparse as sparse_op
    from rocm_mla.vllm import sparse_backend

    counts = {"backend": 0, "indexer": 0, "op": 0}

    def counted(module, name, key):
        fn = getattr(module, name)

        def wrapper(*args, **kwargs):
            counts[key] += 1
            return fn(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(sparse_backend, "plan_sparse_attention", "backend")
    counted(sparse_layer, "plan_indexer_topk", "indexer")
    counted(sparse_op, "plan_sparse_attention", "op")
    counted(indexer_op, "plan_indexer_topk", "op")
    return counts


@pytest.mark.parametrize("name", ["dsv32-decode-prefill", "dsv32-mtp-fp8", "glm5-short-prefill"])
def test_step_plans_once(name, plan_calls):
    """The builder plans the step's sparse attention (its rows: every row, or the decode rows when
    the prefill runs dense); the first layer's indexer plans the indexer; the step's later layers
    (indexer + attention on the same metadata) plan nothing and stay exact."""
    step = _step(name)
    md = step.metadata
    plan = md.rocm_mla_sparse_plan
    assert plan_calls == {"backend": 1, "indexer": 0, "op": 0}
    assert plan is not None and plan.num_rows == (md.num_decode_tokens if step.dense_prefill else step.num_tokens)
    for _ in range(3):
        step.output.fill_(float("nan"))
        step.run()
        raise_on(step.indexer_mismatch())
        raise_on(step.mismatch())
    assert plan_calls == {"backend": 1, "indexer": 1, "op": 0}
    assert md.rocm_mla_sparse_plan is plan and md.rocm_mla_indexer_plan.num_rows == step.num_tokens
    # MTP rows (2 a decode request) are grouped as far as the arch's config allows.
    idx = md.rocm_mla_indexer_plan
    assert idx.group_rows == min(2 if name == "dsv32-mtp-fp8" else 1, int(idx.config.get("group_rows", 1)))


def test_decode_group_rows():
    """The indexer's row groups: a decode request's rows when every decode request has as many; 1
    without decode rows or with uneven ones."""
    from types import SimpleNamespace

    from rocm_mla.vllm.sparse_layer import decode_group_rows

    for n, rows, want in ((0, 0, 1), (3, 3, 1), (3, 6, 2), (3, 7, 1), (2, 16, 8), (4, 12, 3)):
        assert decode_group_rows(SimpleNamespace(num_decodes=n, num_decode_tokens=rows)) == want
    assert decode_group_rows(SimpleNamespace()) == 1


@pytest.mark.parametrize("name", ["dsv32-decode-prefill", "glm5-long-prompt-fp8"])
def test_step_plan_equals_the_call_own(name, plan_calls):
    """The plan a layer runs is the one its own tensors give: forward_mqa on metadata without a
    plan plans from the call, gets the builder's plan field for field, and the same output bits;
    the layers after it run that plan."""
    step = _step(name)
    q, kv, md, layer = step.forward_mqa_args()
    built = md.rocm_mla_sparse_plan
    out, lse = layer.impl.forward_mqa(q, kv, md, layer)
    md.rocm_mla_sparse_plan = None  # metadata with no plan: the call plans from its tensors
    own_out, own_lse = layer.impl.forward_mqa(q, kv, md, layer)
    own = md.rocm_mla_sparse_plan
    assert own is not built and own == built
    assert torch.equal(own_out, out) and torch.equal(own_lse, lse)
    layer.impl.forward_mqa(q, kv, md, layer)
    assert md.rocm_mla_sparse_plan is own
    assert plan_calls["backend"] == 2 and plan_calls["op"] == 0


def test_forward_mqa_on_uint8_fp8_storage(plan_calls):
    """forward_mqa handed the fp8 cache as vLLM allocates it (uint8 storage) rather than
    forward_impl's float8 view: the builder's plan, made for the view, does not match; the call
    plans for the storage it got (the layer's fp8 name: the same kind read) and answers as on the
    view, bit for bit; a later call on the view plans for the view again."""
    step = _step("glm5-long-prompt-fp8")
    q, kv, md, layer = step.forward_mqa_args()
    built = md.rocm_mla_sparse_plan
    assert kv.dtype != torch.uint8 and step.kv_cache.dtype == torch.uint8 and built.kv_dtype == kv.dtype
    out, lse = layer.impl.forward_mqa(q, kv, md, layer)
    calls = plan_calls["backend"]
    raw_out, raw_lse = layer.impl.forward_mqa(q, step.kv_cache, md, layer)
    own = md.rocm_mla_sparse_plan
    assert plan_calls["backend"] == calls + 1 and plan_calls["op"] == 0
    assert own.kv_dtype == torch.uint8 and own.kv_kind == built.kv_kind == kv.dtype
    assert torch.equal(raw_out, out) and torch.equal(raw_lse, lse)
    layer.impl.forward_mqa(q, kv, md, layer)
    assert plan_calls["backend"] == calls + 2 and md.rocm_mla_sparse_plan == built


def test_other_rows_get_a_fresh_plan(plan_calls):
    """A call on other rows than the step's (vLLM 0.34's ShardQ: later rows through ``topk_start``,
    its metadata copied from the step's, plan and all; on 0.33, which has no row offset, the first
    rows): a call whose rows differ from the stored plan plans from its own tensors, leaves that
    plan on its metadata for the next layer, and answers as the op planned alone does; the step's
    own metadata keeps its plan. Likewise the indexer."""
    from dataclasses import fields, replace

    from rocm_mla.ops import mla_sparse_attention, plan_indexer_topk

    step = _step("dsv32-decode-prefill")
    (ql_nope, q_pe), kv, md, layer = step.forward_mqa_args()
    full_plan = md.rocm_mla_sparse_plan
    full_out, _ = layer.impl.forward_mqa((ql_nope, q_pe), kv, md, layer)
    s = md.num_decode_tokens
    if "topk_start" in {f.name for f in fields(md)}:  # vLLM 0.34: the prefill rows, their top-k after the decodes'
        lo, hi, narrowed = s, step.num_tokens, dict(num_decodes=0, num_decode_tokens=0, topk_start=s)
    else:  # vLLM 0.33 has no row offset: a call on the first (decode) rows
        lo, hi, narrowed = 0, s, {}
    assert 0 < hi - lo < step.num_tokens
    sub = replace(md, req_id_per_token=md.req_id_per_token[lo:hi], **narrowed)
    assert sub.rocm_mla_sparse_plan is full_plan  # copied with the metadata, made for every row
    calls = plan_calls["backend"]
    out, lse = layer.impl.forward_mqa((ql_nope[lo:hi], q_pe[lo:hi]), kv, sub, layer)
    fresh = sub.rocm_mla_sparse_plan
    assert plan_calls["backend"] == calls + 1 and fresh.num_rows == hi - lo
    assert md.rocm_mla_sparse_plan is full_plan
    alone_out, alone_lse = mla_sparse_attention(
        ql_nope[lo:hi], q_pe[lo:hi], kv, step.topk_buffer[lo:hi], md.block_table, md.req_id_per_token[lo:hi],
        sm_scale=layer.impl.scale,
    )  # fmt: skip
    assert plan_calls["op"] == 1
    assert torch.equal(out, alone_out) and torch.equal(lse, alone_lse)
    tol = 1e-5 if DTYPE == torch.float32 else 2e-2  # another split of the lists: rounding only
    torch.testing.assert_close(out, full_out[lo:hi], rtol=tol, atol=tol)
    layer.impl.forward_mqa((ql_nope[lo:hi], q_pe[lo:hi]), kv, sub, layer)  # the next layer: no new plan
    assert sub.rocm_mla_sparse_plan is fresh and plan_calls["backend"] == calls + 1

    # The indexer: a stored plan made for fewer rows is replaced by the call's own.
    idx_plan = md.rocm_mla_indexer_plan
    md.rocm_mla_indexer_plan = plan_indexer_topk(
        num_rows=step.num_tokens - 1, num_heads=idx_plan.num_heads, topk=idx_plan.topk,
        max_kv_len=idx_plan.max_kv_len, block_size=idx_plan.block_size, q_dtype=idx_plan.q_dtype,
        device=step.device, shuffled=idx_plan.shuffled,
    )  # fmt: skip
    calls = plan_calls["indexer"]
    step.run_indexer()
    assert plan_calls["indexer"] == calls + 1 and md.rocm_mla_indexer_plan == idx_plan
    raise_on(step.indexer_mismatch())
