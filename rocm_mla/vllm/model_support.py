"""The MLA-family models of vLLM 0.34 (and 0.33) on rocm-mla: which it serves and how, which it refuses and why.

A model is either served by rocm-mla when the user selects it (``--attention-backend ROCM_MLA``) or
refused when vLLM builds its first attention layer, with a reason that names the model: never a layer
that starts and then answers wrongly or fails in the middle of serving.

* :data:`MLA_FAMILY`: one :class:`MLAModel` row per model (what docs/vllm.md's table shows, for
  tools to list too): its vLLM module, attention kind, heads per rank, what rocm-mla runs for it,
  served or refused, and the test that covers the row.
* :func:`refusal`: the reason rocm-mla does not serve the model of a vLLM config (None: it does or
  it is not an MLA-family model this table knows). :func:`check_supported` raises ``ValueError``
  with it.

Where the check runs: the layers vLLM's attention selector routes (dense MLA, and sparse MLA where the
selector runs) reach ``RocmMLABackendTraits.supports_combination`` (backend.py), so the selector's
start-up error carries the reason; the layers vLLM builds with a fixed class on ROCm reach rocm-mla
through the hooks (``sparse_layer``: DeepSeek-V3.2 / GLM-5.x; ``v4_layer``: DeepSeek-V4 / V4.1), whose
own refusals this module reports for those rows.

Importing this module imports nothing of vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rocm_mla.mla_dims import KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM

SERVED = "served"
REFUSED = "refused"

_TESTS = "tests/vllm_backend/test_vllm_model_support.py"


@dataclass(frozen=True)
class MLAModel:
    """One MLA-family model of vLLM 0.34 and what rocm-mla does with it.

    ``architectures``: the Hugging Face architecture names vLLM's registry maps to it (main model,
    MTP / draft heads); ``model_types``: when given, the config's ``model_type`` (its own or its text
    config's) must be one of them (rows that share an architecture: Kimi-K2 runs DeepSeek-V3's);
    ``config_key``: when given, the text config must carry that attribute, not None (Kimi-K3.1's
    ``dsa_config``). ``why``: for a served row, how its layers reach rocm-mla; for a refused row, the
    reason :func:`refusal` reports. ``test``: the test of the row (``file::test``)."""

    model: str
    architectures: tuple[str, ...]
    vllm_module: str
    attention: str
    heads: str
    runs: str
    status: str
    why: str
    test: str
    model_types: tuple[str, ...] = ()
    config_key: str | None = None

    def matches(self, architectures: Iterable[str], model_types: Iterable[str], hf_config) -> bool:
        """Whether a model with these architecture names, config model types and text config is
        this row's."""
        if not set(architectures) & set(self.architectures):
            return False
        if self.model_types and not set(model_types) & set(self.model_types):
            return False
        return self.config_key is None or getattr(hf_config, self.config_key, None) is not None


_DENSE_RUNS = (
    "ROCM_MLA (RocmMLABackend / RocmMLAImpl): mla_decode, mla_prefill + merge_attn_states, "
    "concat_and_cache_mla or fused_rope_mla_kv_write"
)
_SELECTOR = "vLLM's attention selector picks ROCM_MLA for the layer's MLAAttention (latent row 576)"
_SPARSE_RUNS = (
    "ROCM_MLA_SPARSE (RocmMLASparseImpl): mla_sparse_attention, mla_prefill for short prompts, mla_indexer_topk"
)
_SPARSE_HOOK = "rocm_mla.vllm.sparse_layer puts rocm-mla's subclass in place of vLLM's fixed ROCm class"

# Rows that share an architecture name, most specific first: find_model returns the first that matches.
MLA_FAMILY: tuple[MLAModel, ...] = (
    MLAModel(
        model="Kimi-K2 / K2.5",
        architectures=("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration"),
        model_types=("kimi_k2", "kimi_k25"),
        vllm_module="vllm.model_executor.models.deepseek_v2 (K2.5: kimi_k25 around it)",
        attention="dense",
        heads="64: 8 per rank at TP8",
        runs=_DENSE_RUNS,
        status=SERVED,
        why=_SELECTOR,
        test=f"{_TESTS}::test_served_model_selects_rocm_mla[Kimi-K2 / K2.5]",
    ),
    MLAModel(
        model="DeepSeek-V3 / R1 (and V2)",
        architectures=("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "DeepSeekMTPModel"),
        vllm_module="vllm.model_executor.models.deepseek_v2",
        attention="dense",
        heads="128: 16 per rank at TP8",
        runs=_DENSE_RUNS,
        status=SERVED,
        why=_SELECTOR,
        test=f"{_TESTS}::test_served_model_selects_rocm_mla[DeepSeek-V3 / R1 (and V2)]",
    ),
    MLAModel(
        model="Kimi-K3.1",
        architectures=(
            "KimiK3ForConditionalGeneration",
            "KimiK31ForConditionalGeneration",
            "KimiLinearForCausalLM",
            "KimiK3MTPModel",
        ),
        config_key="dsa_config",
        vllm_module="vllm.models.kimi_k3",
        attention="sparse (DSA) on the MLA layers, KDA elsewhere",
        heads="96: 12 per rank at TP8",
        runs="nothing",
        status=REFUSED,
        why=(
            "its MLA layers are DSA-sparse (dsa_config), but vLLM's ROCm Kimi layer "
            "(models/kimi_k3/amd) builds them dense, without the indexer, so every backend would "
            "attend every token; rocm-mla does not serve it"
        ),
        test=f"{_TESTS}::test_refused_model_fails_at_start_up[Kimi-K3.1]",
    ),
    MLAModel(
        model="Kimi-K3 (and Kimi-Linear)",
        architectures=(
            "KimiK3ForConditionalGeneration",
            "KimiK31ForConditionalGeneration",
            "KimiLinearForCausalLM",
            "KimiK3MTPModel",
        ),
        vllm_module="vllm.models.kimi_k3 (ROCm: amd/linear.py, amd/mla.py)",
        attention="dense MLA layers (no RoPE on the 64 rope values), KDA elsewhere",
        heads="96: 12 per rank at TP8",
        runs=_DENSE_RUNS,
        status=SERVED,
        why=(
            _SELECTOR + "; with aiter MLA on and an fp8 cache vLLM's fused aiter decode prep writes the "
            "cache and hands forward_mqa one packed fp8 [T, N, 576] query (a 12-of-16-head view, CUDA-graph "
            "padding rows included): RocmMLAImpl dequantises it with the layer's q scale and decodes the "
            "step's decode rows"
        ),
        test=f"{_TESTS}::test_kimi_k3_fused_aiter_decode_query",
    ),
    MLAModel(
        model="GLM-4.x-Lite (GLM-4.7-Flash)",
        architectures=("Glm4MoeLiteForCausalLM", "Glm4MoeLiteMTPModel"),
        vllm_module="vllm.model_executor.models.glm4_moe_lite",
        attention="dense (qk_nope 192, v 256)",
        heads="20: 5 per rank at TP4",
        runs=_DENSE_RUNS,
        status=SERVED,
        why=_SELECTOR,
        test=f"{_TESTS}::test_served_model_selects_rocm_mla[GLM-4.x-Lite (GLM-4.7-Flash)]",
    ),
    MLAModel(
        model="DeepSeek-V3.2",
        architectures=("DeepseekV32ForCausalLM", "DeepseekV32MTPModel"),
        vllm_module="vllm.models.deepseek_v32 (ROCm: amd/rocm.py DeepseekV32MLAAttention)",
        attention="sparse (lightning indexer, top-k 2048)",
        heads="128: 16 per rank at TP8",
        runs=_SPARSE_RUNS,
        status=SERVED,
        why=_SPARSE_HOOK,
        test=f"{_TESTS}::test_sparse_model_runs_the_hook[DeepSeek-V3.2]",
    ),
    MLAModel(
        model="GLM-5.x",
        architectures=("GlmMoeDsaForCausalLM",),
        vllm_module="vllm.models.deepseek_v32 (ROCm: amd/rocm.py DeepseekV32MLAAttention)",
        attention="sparse (lightning indexer, top-k 2048; qk_nope 192, v 256)",
        heads="64: 8 per rank at TP8",
        runs=_SPARSE_RUNS,
        status=SERVED,
        why=_SPARSE_HOOK,
        test=f"{_TESTS}::test_sparse_model_runs_the_hook[GLM-5.x]",
    ),
    MLAModel(
        model="GLM-5.3-Flash",
        architectures=("Glm5NextForCausalLM", "Glm5NextForConditionalGeneration", "Glm5NextMTPModel"),
        vllm_module="vllm.models.glm5next",
        attention="sparse MLA without RoPE, pooled indexer; KDA on three layers of four",
        heads="64: 8 per rank at TP8",
        runs="nothing",
        status=REFUSED,
        why=(
            "sparse MLA without RoPE (a 512-wide latent row, qk_rope_head_dim 0) with a pooled indexer "
            "(index_kpool 16, a top-k buffer 2176 wide) is not served by rocm-mla, whose kernels take the "
            "576-wide row (512 + 64) and the lightning indexer; run it without --attention-backend: vLLM "
            "then picks ROCM_AITER_MLA_SPARSE, which needs aiter (VLLM_ROCM_USE_AITER=1; gfx950 is its target)"
        ),
        test=f"{_TESTS}::test_refused_model_fails_at_start_up[GLM-5.3-Flash]",
    ),
    MLAModel(
        model="DeepSeek-V4",
        architectures=(
            "DeepseekV4ForCausalLM",
            "DeepseekV4ForConditionalGeneration",
            "DeepSeekV4MTPModel",
            "DSparkDraftModel",
        ),
        vllm_module="vllm.models.deepseek_v4 (ROCm: amd/rocm.py DeepseekV4ROCMAiterMLAAttention)",
        attention="V4: window-only, CSA (window + indexer top-k) and HCA (window + every compressed row)",
        heads="64 (Flash) / 128 (Pro): 8 / 16 per rank at TP8",
        runs="mla_v4_attention (sink and inverse RoPE fused) for every layer kind, mla_indexer_topk for CSA",
        status=SERVED,
        why="rocm_mla.vllm.v4_layer puts rocm-mla's subclass in place of vLLM's fixed ROCm class",
        test=f"{_TESTS}::test_v4_model_is_left_to_its_hook[DeepSeek-V4]",
    ),
    MLAModel(
        model="DeepSeek-V4.1",
        architectures=("DeepseekV41ForCausalLM", "DSparkV41DraftModel"),
        vllm_module="vllm.models.deepseek_v41 (ROCm: amd/rocm.py DeepseekV41ROCMAiterMLAAttention)",
        attention="V4: window-only, CSA and HCA, caches and indexers shared across layers",
        heads="64: 8 per rank at TP8",
        runs="mla_v4_attention for every layer kind, mla_indexer_topk for CSA (its candidate modes for the "
        "two-level indexer)",
        status=SERVED,
        why=(
            "rocm_mla.vllm.v4_layer puts rocm-mla's subclass in place of vLLM's fixed ROCm class and makes "
            "ROCM_MLA acceptable to V4.1's backend check (_select_dsv4_attn_cls); the two-level indexer "
            "(candidate_source_layer_id) runs mla_indexer_topk's candidate modes"
        ),
        test=f"{_TESTS}::test_v4_model_is_left_to_its_hook[DeepSeek-V4.1]",
    ),
)

_V4_MODELS = ("DeepSeek-V4", "DeepSeek-V4.1")


def _model_identity(vllm_config, architectures, hf_config) -> tuple[list[str], list[str], object]:
    """(architecture names, config model types, text config) from the explicit arguments, else
    from ``vllm_config.model_config``."""
    model_config = getattr(vllm_config, "model_config", None)
    if architectures is None:
        architectures = getattr(model_config, "architectures", None) or []
    if isinstance(architectures, str):
        architectures = [architectures]
    configs = [hf_config] if hf_config is not None else []
    if model_config is not None and hf_config is None:
        configs = [getattr(model_config, "hf_text_config", None), getattr(model_config, "hf_config", None)]
    configs = [c for c in configs if c is not None]
    model_types = [getattr(c, "model_type", None) for c in configs]
    return list(architectures), [t for t in model_types if t], (configs[0] if configs else None)


def find_model(vllm_config=None, *, architectures=None, hf_config=None) -> MLAModel | None:
    """The :data:`MLA_FAMILY` row of a model: from ``vllm_config.model_config`` (its architecture
    names, its text config), or from ``architectures`` (names) and ``hf_config`` (its text config)
    given explicitly. None for a model the table does not list."""
    archs, model_types, hf = _model_identity(vllm_config, architectures, hf_config)
    for arch in archs:  # the first name is the model's; vLLM tries the others after it
        for row in MLA_FAMILY:
            if row.matches((arch,), model_types, hf):
                return row
    return None


def refusal(vllm_config=None, *, head_size: int | None = None, architectures=None, hf_config=None) -> str | None:
    """Why rocm-mla does not serve this model, naming it (None: it serves it, or the table does
    not know the model and the backends' own checks decide).

    Args:
        vllm_config: vLLM's ``VllmConfig`` of the model being built (the current one at layer
            construction and backend validation); its ``model_config`` names the model.
        head_size: the latent row an attention layer of the model asks a rocm-mla backend for
            (``kv_lora_rank + qk_rope_head_dim``), when known: a served model whose checkpoint has
            another row is refused, naming the model.
        architectures, hf_config: the model's architecture names and text config, instead of
            ``vllm_config``'s (tests, tools).

    The reasons: a refused row's (GLM-5.3-Flash, Kimi-K3.1); a selector-routed row whose layer asks
    for a latent row other than 576; for DeepSeek-V4 / V4.1, the refusal of their hook
    (``rocm_mla.vllm.v4_layer.refusal``: configurations it does not serve, e.g. an MXFP4 indexer cache).
    """
    row = find_model(vllm_config, architectures=architectures, hf_config=hf_config)
    if row is None:
        return None
    if row.status == REFUSED:
        return f"{row.model} ({row.vllm_module}): {row.why}"
    if row.model in _V4_MODELS:
        return _v4_refusal(row, vllm_config)
    if head_size is not None and head_size != KV_ROW_DIM:
        return (
            f"{row.model} ({row.vllm_module}): this checkpoint's MLA latent row is {head_size} wide; "
            f"rocm-mla's kernels take kv_lora_rank {KV_LORA_RANK} + qk_rope_head_dim {QK_ROPE_HEAD_DIM} "
            f"= {KV_ROW_DIM}"
        )
    return None


def _v4_refusal(row: MLAModel, vllm_config) -> str | None:
    """The V4 hook's refusal of this configuration, naming the model (None without a config: the
    hook decides when the layer is built)."""
    if vllm_config is None:
        return None
    from rocm_mla.vllm import v4_layer

    why = v4_layer.refusal(row.model, vllm_config)
    return None if why is None else f"{row.model} ({row.vllm_module}): {why}"


def check_supported(vllm_config=None, *, head_size: int | None = None, architectures=None, hf_config=None) -> None:
    """Raise ``ValueError`` with :func:`refusal`'s reason when rocm-mla does not serve the model."""
    why = refusal(vllm_config, head_size=head_size, architectures=architectures, hf_config=hf_config)
    if why is not None:
        raise ValueError(f"rocm_mla cannot serve {why}")


def current_refusal(head_size: int | None = None) -> str | None:
    """:func:`refusal` for the model vLLM is building now (its current ``VllmConfig``; None
    outside one): what the backends' selector hooks ask."""
    from vllm.config import get_current_vllm_config_or_none

    vllm_config = get_current_vllm_config_or_none()
    if vllm_config is None or getattr(vllm_config, "model_config", None) is None:
        return None
    return refusal(vllm_config, head_size=head_size)


__all__ = [
    "SERVED",
    "REFUSED",
    "MLAModel",
    "MLA_FAMILY",
    "find_model",
    "refusal",
    "check_supported",
    "current_refusal",
]
