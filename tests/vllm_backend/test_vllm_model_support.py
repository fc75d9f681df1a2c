"""Every MLA-family model of vLLM 0.34 with ``--attention-backend ROCM_MLA``: served by rocm-mla (the class
vLLM picks for its attention is rocm-mla's) or refused when its first attention layer is built, with a
message naming the model (``rocm_mla.vllm.model_support.MLA_FAMILY``, docs/vllm.md's table).

Each model's config is vLLM's own: a ``config.json`` of the model's architecture and model type (tiny
sizes, no weights) read by vLLM's ``ModelConfig``. Where vLLM's module of a model needs a package this
machine lacks (its registry inspects the class by importing it), the config lists DeepSeek-V3's
architecture after the model's own: vLLM then inspects that class instead, and the model's name, its
config and everything rocm-mla reads stay the model's. Same set-up as test_vllm_backend.py (vLLM 0.34.0
or 0.33.0, the simulated gfx942 ROCm platform, the Triton interpreter on the CPU).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import tempfile
import types
from pathlib import Path

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

from rocm_mla.cases import raise_on  # noqa: E402
from rocm_mla.reference import mla_decode_ref  # noqa: E402
from rocm_mla.vllm import model_support, sparse_layer  # noqa: E402
from rocm_mla.vllm.backend import RocmMLABackend, RocmMLAImpl  # noqa: E402
from rocm_mla.vllm.model_support import MLA_FAMILY, REFUSED, SERVED  # noqa: E402
from rocm_mla.vllm.sparse_backend import RocmMLASparseBackend  # noqa: E402

DTYPE = torch.bfloat16 if HAS_GPU else torch.float32
ROWS = {row.model: row for row in MLA_FAMILY}
INSPECTABLE = "DeepseekV3ForCausalLM"  # vLLM inspects it on any machine (see the module docstring)

_BASE = dict(
    hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=4, vocab_size=1024,
    max_position_embeddings=4096, rope_theta=10000, torch_dtype="bfloat16", rms_norm_eps=1e-6,
    tie_word_embeddings=False, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, q_lora_rank=128,
    kv_lora_rank=512,
)  # fmt: skip


def _mla(heads: int, nope: int, rope: int, v: int) -> dict:
    return dict(num_attention_heads=heads, num_key_value_heads=heads, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                v_head_dim=v)  # fmt: skip


_KIMI_TEXT = dict(
    _BASE, model_type="kimi_linear", mla_use_nope=True, **_mla(96, 128, 64, 128),
    linear_attn_config={"kda_layers": [1, 2, 3], "full_attn_layers": [4], "head_dim": 128, "num_heads": 8,
                        "short_conv_kernel_size": 4},
)  # fmt: skip
_V32_INDEX = dict(index_topk=2048, index_n_heads=64, index_head_dim=128)

# Each model's config.json (the fields vLLM's config classes and rocm-mla read), by MLA_FAMILY row.
CONFIGS: dict[str, dict] = {
    "DeepSeek-V3 / R1 (and V2)": dict(_BASE, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                                      **_mla(128, 128, 64, 128)),
    "Kimi-K2 / K2.5": dict(_BASE, architectures=["DeepseekV3ForCausalLM"], model_type="kimi_k2",
                           **_mla(64, 128, 64, 128)),
    "GLM-4.x-Lite (GLM-4.7-Flash)": dict(_BASE, architectures=["Glm4MoeLiteForCausalLM"],
                                         model_type="glm4_moe_lite", **_mla(20, 192, 64, 256)),
    "Kimi-K3 (and Kimi-Linear)": dict(architectures=["KimiK3ForConditionalGeneration", INSPECTABLE],
                                      model_type="kimi_k3", text_config=_KIMI_TEXT, vision_config={}),
    "Kimi-K3.1": dict(architectures=["KimiK31ForConditionalGeneration", INSPECTABLE], model_type="kimi_k3",
                      text_config=dict(_KIMI_TEXT, dsa_config={"dsa_layers": [4], "index_topk": 2048}),
                      vision_config={}),
    # the sparse models with the heads of one rank at TP8 (their layer class reads the config's)
    "DeepSeek-V3.2": dict(_BASE, architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32",
                          **_mla(16, 128, 64, 128), **_V32_INDEX),
    "GLM-5.x": dict(_BASE, architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa",
                    **_mla(8, 192, 64, 256), **dict(_V32_INDEX, index_n_heads=32)),
    "GLM-5.3-Flash": dict(_BASE, architectures=["Glm5NextForCausalLM", INSPECTABLE], model_type="glm5_next_text",
                          **_mla(64, 256, 0, 256), index_topk=2048, index_n_heads=32, index_head_dim=128,
                          index_kpool=16),
    "DeepSeek-V4": dict(_BASE, architectures=["DeepseekV4ForCausalLM", INSPECTABLE], model_type="deepseek_v4",
                        num_attention_heads=64),
    "DeepSeek-V4.1": dict(_BASE, architectures=["DeepseekV41ForCausalLM", INSPECTABLE],
                          model_type="deepseek_v41", num_attention_heads=64),
}  # fmt: skip

_dirs: dict[str, str] = {}


def _model_dir(name: str) -> str:
    if name not in _dirs:
        d = tempfile.mkdtemp(prefix="rocm_mla_family_")
        Path(d, "config.json").write_text(json.dumps(CONFIGS[name]))
        _dirs[name] = d
    return _dirs[name]


def _vllm_config(name: str, backend: str | None = "ROCM_MLA", kv_cache_dtype: str = "auto"):
    """vLLM's VllmConfig of the model ``name`` with ``backend`` selected (as ``--attention-backend``) and
    ROCM_MLA's MLA prefill (vLLM's FlashAttention prefills are not installed here)."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig
    from vllm.config.attention import AttentionConfig
    from vllm.v1.attention.selector import _cached_get_attn_backend

    # vLLM caches each selection by the layer's facts, not by model: a new model selects afresh.
    _cached_get_attn_backend.cache_clear()
    mc = ModelConfig(model=_model_dir(name), skip_tokenizer_init=True, max_model_len=4096, dtype=DTYPE)
    return VllmConfig(
        model_config=mc,
        cache_config=CacheConfig(block_size=16, cache_dtype=kv_cache_dtype),
        device_config=DeviceConfig(device="cpu" if DEVICE.type == "cpu" else "cuda"),
        attention_config=AttentionConfig(backend=backend, mla_prefill_backend="ROCM_MLA"),
    )


def _build_mla_layer(vc, *, num_heads: int, dims: tuple[int, int, int], sparse_topk: int | None = None):
    """vLLM's MLAAttention of one layer of the model of ``vc``, built as the model builds it (no
    backend given: vLLM's attention selector chooses, from the config's ``--attention-backend``)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    ensure_single_process_group(vc)
    P, R, V = dims
    sparse = {}
    if sparse_topk is not None:
        buf = torch.full((8, sparse_topk), -1, dtype=torch.int32, device=DEVICE)
        sparse = dict(use_sparse=True, indexer=types.SimpleNamespace(topk_indices_buffer=buf), topk_indices_buffer=buf)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    try:
        with set_current_vllm_config(vc), torch.device(DEVICE):
            kvb = ColumnParallelLinear(512, num_heads * (P + V), bias=False, prefix="model.layers.3.self_attn.kvb")
            return MLAAttention(
                num_heads=num_heads, scale=(P + R) ** -0.5, qk_nope_head_dim=P, qk_rope_head_dim=R, v_head_dim=V,
                q_lora_rank=128, kv_lora_rank=512, kv_b_proj=kvb, cache_config=vc.cache_config,
                prefix="model.layers.3.self_attn.attn", **sparse,
            )  # fmt: skip
    finally:
        torch.set_default_dtype(prev)


# ---------------------------------------------------------------- the table


def test_every_row_is_complete_and_names_its_test():
    """Each row: a status, a reason or a route, its vLLM module, and a test of this file that exists
    with the row's parameter; each model's config here finds exactly its own row."""
    assert [r.model for r in MLA_FAMILY] and set(ROWS) == set(CONFIGS)
    for row in MLA_FAMILY:
        assert row.status in (SERVED, REFUSED) and row.why and row.vllm_module.startswith("vllm.") and row.heads
        assert row.attention and row.runs and (row.runs == "nothing") == (row.status == REFUSED)
        path, _, node = row.test.partition("::")
        assert path == "tests/vllm_backend/test_vllm_model_support.py", row.test
        name, _, param = node.partition("[")
        fn = globals().get(name)
        assert callable(fn), row.test
        if param:
            marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
            assert any(param.rstrip("]") in m.args[1] for m in marks), row.test
        assert model_support.find_model(_vllm_config(row.model)) is row, row.model
    refused = {r.model for r in MLA_FAMILY if r.status == REFUSED}
    assert refused == {"GLM-5.3-Flash", "Kimi-K3.1"}


def test_docs_table_shows_every_row():
    """docs/vllm.md's table under "Which models run on it": one line per row, with the row's status
    and its test."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "vllm.md").read_text()
    section = text.split("## Which models run on it", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith(("| model", "| ---"))]
    cells = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in lines)}
    assert sorted(cells) == sorted(ROWS) and len(lines) == len(ROWS)
    for row in MLA_FAMILY:
        assert cells[row.model][5].startswith(row.status), (row.model, cells[row.model][5])
        assert row.test.split("/")[-1] in cells[row.model][6], (row.model, cells[row.model][6])


def test_a_model_the_table_does_not_list_is_left_to_the_backends():
    """An architecture outside the table: no model reason (the backends' own checks decide)."""
    assert model_support.find_model(architectures=["LlamaForCausalLM"]) is None
    assert model_support.refusal(architectures=["LlamaForCausalLM"], head_size=512) is None
    assert model_support.refusal(None) is None


# ---------------------------------------------------------------- served through the selector

DENSE = {  # row -> (heads per rank, head geometry)
    "DeepSeek-V3 / R1 (and V2)": (16, (128, 64, 128)),
    "Kimi-K2 / K2.5": (8, (128, 64, 128)),
    "GLM-4.x-Lite (GLM-4.7-Flash)": (5, (192, 64, 256)),
    "Kimi-K3 (and Kimi-Linear)": (12, (128, 64, 128)),
}


@pytest.mark.parametrize("name", list(DENSE))
def test_served_model_selects_rocm_mla(name):
    """The model's MLA layer, built as vLLM builds it with ROCM_MLA (or CUSTOM) selected: vLLM's
    selector picks RocmMLABackend and the layer's impl is RocmMLAImpl, bf16/fp8 caches alike; no
    model reason. A checkpoint of the model with another latent row is refused naming the model."""
    row = ROWS[name]
    heads, dims = DENSE[name]
    assert row.status == SERVED
    for backend, kv in (("ROCM_MLA", "auto"), ("CUSTOM", "fp8")):
        vc = _vllm_config(name, backend, kv)
        assert model_support.find_model(vc) is row and model_support.refusal(vc, head_size=576) is None
        layer = _build_mla_layer(vc, num_heads=heads, dims=dims)
        assert layer.attn_backend is RocmMLABackend and type(layer.impl) is RocmMLAImpl
        assert layer.impl.num_heads == heads and layer.kv_cache_dtype == kv
    why = model_support.refusal(_vllm_config(name), head_size=512)
    assert why.startswith(row.model) and "latent row is 512" in why


@pytest.mark.parametrize("name", ["Kimi-K3.1", "GLM-5.3-Flash"])
def test_refused_model_fails_at_start_up(name):
    """The model's first MLA layer, built with ROCM_MLA, ROCM_MLA_SPARSE or CUSTOM selected: vLLM's
    selector raises at construction with rocm-mla's reason naming the model. With another backend
    selected rocm-mla says nothing (vLLM's own choice stands)."""
    row = ROWS[name]
    assert row.status == REFUSED
    shape = dict(num_heads=12, dims=(128, 64, 128))  # Kimi-K3.1: dense on ROCm (vLLM's amd layer drops DSA)
    if name == "GLM-5.3-Flash":
        shape = dict(num_heads=8, dims=(256, 0, 256), sparse_topk=2176)  # 512-wide row, pooled top-k buffer
    for backend in ("ROCM_MLA", "ROCM_MLA_SPARSE", "CUSTOM"):
        vc = _vllm_config(name, backend)
        with pytest.raises(ValueError) as err:
            _build_mla_layer(vc, **shape)
        assert f"{row.model} ({row.vllm_module}): {row.why}" in str(err.value), str(err.value)
    assert model_support.refusal(vc).startswith(row.model)
    with pytest.raises(ValueError, match=f"rocm_mla cannot serve {row.model}"):
        model_support.check_supported(vc)
    if name == "Kimi-K3.1":
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.selector import get_attn_backend

        with set_current_vllm_config(_vllm_config(name, "TRITON_MLA")):
            picked = get_attn_backend(576, torch.bfloat16, "auto", use_mla=True, num_heads=12)
        assert picked.get_name() == "TRITON_MLA"
    else:
        why = model_support.refusal(vc)
        assert why.startswith("GLM-5.3-Flash (vllm.models.glm5next)") and "512-wide latent row" in why
        assert "qk_rope_head_dim 0" in why and "2176" in why and "ROCM_AITER_MLA_SPARSE" in why


# ---------------------------------------------------------------- sparse: through the V3.2 hook

SPARSE = {"DeepSeek-V3.2": 16, "GLM-5.x": 8}  # heads per rank at TP8


@pytest.mark.parametrize("name", list(SPARSE))
def test_sparse_model_runs_the_hook(name):
    """vLLM's ROCm DeepSeek-V3.2 / GLM-5 attention class, as the model builds it with ROCM_MLA selected:
    the class is rocm-mla's hook, the layer runs RocmMLASparseBackend (RocmMLASparseImpl) and the
    indexer on rocm-mla; no model reason."""
    from vllm.config import set_current_vllm_config

    cls = sparse_layer.installed_class()
    assert cls is not None
    vc = _vllm_config(name)
    assert model_support.find_model(vc) is ROWS[name] and model_support.refusal(vc, head_size=576) is None
    hf = vc.model_config.hf_config
    assert hf.num_attention_heads == SPARSE[name]
    ensure_single_process_group(vc)
    buf = torch.full((8, 2048), -1, dtype=torch.int32, device=DEVICE)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    try:
        with set_current_vllm_config(vc), torch.device(DEVICE):
            layer = cls(vc, hf, prefix="model.layers.3.self_attn", topk_indices_buffer=buf)
    finally:
        torch.set_default_dtype(prev)
    assert layer._rocm_mla and layer.attn_backend is RocmMLASparseBackend
    assert type(layer.impl).__name__ == "RocmMLASparseImpl" and layer.impl.num_heads == SPARSE[name]
    assert layer.indexer_op is None  # the indexer runs rocm_mla.mla_indexer_topk


# ---------------------------------------------------------------- DeepSeek-V4: left to its hook


@pytest.mark.parametrize("name", ["DeepSeek-V4", "DeepSeek-V4.1"])
def test_v4_model_is_left_to_its_hook(name, monkeypatch):
    """V4 / V4.1 layers never reach the selector-routed backends (vLLM builds them with a fixed class):
    the table routes them to rocm_mla.vllm.v4_layer, whose refusal model_support reports (none for the
    default FP8 indexer cache); the selector hooks give no reason for these models."""
    from vllm.config import set_current_vllm_config

    from rocm_mla.vllm import v4_layer

    row = ROWS[name]
    vc = _vllm_config(name)
    assert model_support.find_model(vc) is row and row.status == SERVED and "v4_layer" in row.why
    assert v4_layer.refusal(name, vc) is None and model_support.refusal(vc) is None
    with set_current_vllm_config(vc):
        assert model_support.current_refusal(576) is None
    calls = []
    monkeypatch.setattr(v4_layer, "refusal", lambda model, config, layer=None: calls.append(model) or "its indexer")
    assert model_support.refusal(vc) == f"{name} ({row.vllm_module}): its indexer"
    assert calls == [name]


def test_v41_backend_check_accepts_rocm_mla():
    """V4.1's backend check (vLLM's _select_dsv4_attn_cls, which refuses every other name) takes
    ROCM_MLA once the hook is installed and returns rocm-mla's layer class."""
    try:
        import vllm.models.deepseek_v41.amd.model as v41
    except ImportError as e:  # its module needs packages this machine may lack
        pytest.skip(f"vLLM's DeepSeek-V4.1 module does not import here ({e})")
    from rocm_mla.vllm import v4_layer

    assert "DeepSeek-V4.1" in v4_layer.install()
    cls = v41._select_dsv4_attn_cls(_vllm_config("DeepSeek-V4.1"))
    assert getattr(cls, "_rocm_mla_model", None) == "DeepSeek-V4.1"


# ---------------------------------------------------------------- Kimi-K3: vLLM's fused aiter decode prep


def _kimi_k3_mla_module():
    """vLLM's models/kimi_k3/amd/mla.py, loaded from its file: the package's __init__ imports the whole
    Kimi-K3 model (and its optional packages), which this file does not need."""
    import vllm

    path = Path(vllm.__file__).parent / "models" / "kimi_k3" / "amd" / "mla.py"
    spec = importlib.util.spec_from_file_location("rocm_mla_test_kimi_k3_amd_mla", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _aiter_fused_qk_rope_concat_and_cache_mla(
    ql_nope, q_pe, kv_c, k_pe, kv_cache, q_out, slot_mapping, k_scale, q_scale, positions, cos, sin, *, is_neox,
    is_nope_first,
):  # fmt: skip
    """aiter's ``fused_qk_rope_concat_and_cache_mla`` as vLLM's own test of it states it: for the rows
    whose slot is >= 0, q_out = fp8(cat(ql_nope, rope(q_pe)) / q_scale) and the cache row at the slot =
    fp8(cat(kv_c, rope(k_pe)) / k_scale); rows with slot -1 are left as they are. Positions are clamped
    into the cos/sin cache, as the kernel vLLM's Kimi-K3 layer relies on does (a one-row identity cache)."""
    assert is_neox and is_nope_first
    fp8 = q_out.dtype
    fmax = torch.finfo(fp8).max
    ok = slot_mapping >= 0
    pos = positions.clamp(0, cos.shape[0] - 1)
    c, s = cos[pos].float(), sin[pos].float()

    def rope(x):  # NeoX halves
        x1, x2 = x.float().chunk(2, dim=-1)
        cc, ss = (c[:, None], s[:, None]) if x.dim() == 3 else (c, s)
        return torch.cat([x1 * cc - x2 * ss, x2 * cc + x1 * ss], dim=-1)

    q = torch.cat([ql_nope.float(), rope(q_pe)], dim=-1) / q_scale.float()
    q_out.view(torch.uint8)[ok] = q.clamp(-fmax, fmax).to(fp8)[ok].view(torch.uint8)
    row = (torch.cat([kv_c.float(), rope(k_pe)], dim=-1) / k_scale.float()).clamp(-fmax, fmax).to(fp8)
    slot = slot_mapping[ok].long()
    kv_cache.view(torch.uint8)[slot // kv_cache.shape[1], slot % kv_cache.shape[1]] = row[ok].view(torch.uint8)


@pytest.mark.parametrize("pad", [0, 3, 4], ids=["no-padding", "padding-3-rows", "padding-4-rows"])
def test_kimi_k3_fused_aiter_decode_query(pad, monkeypatch):
    """Kimi-K3 with aiter MLA on and an fp8 cache: vLLM's own gate (_fused_qk_prep_supported) takes its
    fused decode path for a ROCM_MLA layer, and its _fused_decode runs as written (aiter's kernel
    replaced by its stated semantics): the fp8 [T, 12, 576] query (a view of a 16-head buffer, the
    step's padding rows included, q scale 0.37) reaches RocmMLAImpl.forward_mqa, whose output is the
    attention of the fp8-rounded query over the cache (float32 reference), the padding rows 0."""
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.platforms import current_platform

    vc = _vllm_config("Kimi-K3 (and Kimi-Linear)", "ROCM_MLA", "fp8")
    assert model_support.refusal(vc, head_size=576) is None
    mla = _kimi_k3_mla_module()
    wrapper_cls = mla.KimiK3MultiHeadLatentAttentionWrapper
    N, reqs = 12, [Request(37, 1), Request(5, 1), Request(60, 1), Request(20, 1)]
    step = LayerStep(RocmMLABackend, reqs, num_heads=N, dtype=DTYPE, device=DEVICE, kv_cache_dtype="fp8", k_scale=0.5)
    layer, B = step.layer, len(reqs)
    layer._q_scale.fill_(0.37)
    assert layer.attn_backend is RocmMLABackend and layer.q_pad_num_heads is None
    monkeypatch.setattr(rocm_aiter_ops, "is_mla_enabled", classmethod(lambda cls: True))
    gate = types.SimpleNamespace(mla_attn=layer, kv_lora_rank=512, qk_rope_head_dim=64, num_heads=N)
    assert wrapper_cls._fused_qk_prep_supported(gate), "vLLM's Kimi-K3 layer takes its fused path here"

    aiter = types.ModuleType("aiter")
    aiter.ops = types.ModuleType("aiter.ops")
    aiter.ops.cache = types.ModuleType("aiter.ops.cache")
    name = "fused_qk_rope_concat_and_cache_mla"  # the kernel vLLM's layer imports from aiter.ops.cache
    monkeypatch.setattr(aiter.ops.cache, name, _aiter_fused_qk_rope_concat_and_cache_mla, raising=False)
    for mod in (aiter, aiter.ops, aiter.ops.cache):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    T = B + pad
    gen = torch.Generator().manual_seed(11)
    junk = torch.randn(pad, N, 192, generator=gen).to(DEVICE, DTYPE)
    q = torch.cat([step.q_all, junk])
    kv_c = torch.cat([step.kv_c_new, torch.randn(pad, 512, generator=gen).to(DEVICE, DTYPE)])
    k_pe = torch.cat([step.k_pe_new, torch.randn(pad, 1, 64, generator=gen).to(DEVICE, DTYPE)])
    slots = torch.cat([step.slot_mapping, torch.full((pad,), -1, dtype=step.slot_mapping.dtype, device=DEVICE)])
    wrapper = types.SimpleNamespace(
        mla_attn=layer, num_heads=N, qk_nope_head_dim=128, qk_rope_head_dim=64, kv_lora_rank=512,
        _fused_q_heads=16, _identity_rope=None, _zero_positions=torch.zeros(64, dtype=torch.int64, device=DEVICE),
    )  # fmt: skip
    seen = {}
    forward_mqa = layer.impl.forward_mqa

    def spy(q_out, *args):
        seen["q"] = q_out
        return forward_mqa(q_out, *args)

    monkeypatch.setattr(layer.impl, "forward_mqa", spy)
    # vLLM 0.33's signature also takes the tokens' positions (its cos/sin cache is one row as well).
    positions = torch.cat([torch.tensor([r.context for r in reqs]), torch.zeros(pad, dtype=torch.int64)]).to(DEVICE)
    extra = {"positions": positions} if "positions" in inspect.signature(wrapper_cls._fused_decode).parameters else {}
    out = wrapper_cls._fused_decode(
        wrapper, q, kv_c, k_pe, output_shape=(T, N * 128), attn_metadata=step.metadata, layer=layer,
        kv_cache=step.kv_cache, slot_mapping=slots, **extra,
    )  # fmt: skip
    q8 = seen["q"]
    assert q8.dtype == current_platform.fp8_dtype() and q8.shape == (T, N, 576) and q8.stride(0) == 16 * 576
    assert out.shape == (T, N * 128) and step.metadata.num_decode_tokens == B

    # The float32 attention of the rounded query the layer decoded (q8 x q scale) over the cache.
    w = layer.kv_b_proj.weight.float().T.reshape(512, N, 256)
    ql = q8[:B].float() * 0.37
    cache = step.kv_cache.view(current_platform.fp8_dtype())
    lens = torch.tensor([r.context + 1 for r in reqs], dtype=torch.int32, device=DEVICE)
    o, _ = mla_decode_ref(ql[..., :512], ql[..., 512:], cache, step.block_table, lens, step.scale, 0.5)
    ref = torch.einsum("tnl,lnd->tnd", o, w[..., 128:]).reshape(B, N * 128)
    from vllm_harness.layer_step import LAYER_TOLERANCE, layer_mismatch

    raise_on(layer_mismatch(out[:B], ref, LAYER_TOLERANCE[DTYPE], "Kimi-K3 fused decode"))
    assert bool((out[B:] == 0).all()), "the padding rows"
    # The same step through vLLM's ordinary path (16-bit query): the fp8 rounding of q apart, one answer.
    step.output.fill_(float("nan"))
    raise_on(layer_mismatch(out[:B], step.run(), 0.1, "Kimi-K3 fused vs ordinary decode"))
