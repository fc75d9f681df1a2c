"""Float32 PyTorch references of every op. Imports nothing of rocm_mla but the constants of the
leaf module ``rocm_mla.mla_dims`` (the tests check them against independent formulas, and every
kernel against them)."""

from .context_gather import context_gather_ref
from .decode import mla_decode_ref
from .indexer import index_cache_keys, indexer_k_cache_write_ref, indexer_k_quant_ref
from .indexer_topk import check_indexer_topk, mla_indexer_logits_ref, mla_indexer_topk_ref
from .merge import merge_attn_states_ref
from .prefill import mla_prefill_ref
from .rope_kv_write import fused_rope_mla_kv_write_ref
from .sparse import mla_sparse_attention_ref
from .v4_attention import fp8_ds_mla_rows, mla_v4_attention_ref

__all__ = [
    "context_gather_ref",
    "mla_decode_ref",
    "merge_attn_states_ref",
    "mla_prefill_ref",
    "fused_rope_mla_kv_write_ref",
    "mla_sparse_attention_ref",
    "indexer_k_quant_ref",
    "indexer_k_cache_write_ref",
    "index_cache_keys",
    "mla_indexer_logits_ref",
    "mla_indexer_topk_ref",
    "check_indexer_topk",
    "fp8_ds_mla_rows",
    "mla_v4_attention_ref",
]
