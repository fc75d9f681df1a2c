"""Public ops: validation, then dispatch to HIP, Triton or the float32 reference."""

from .context_gather import gather_context_chunk
from .decode import mla_decode, plan_decode_for
from .decode_plan import DecodePlan, plan_decode
from .indexer_cache import indexer_k_cache_write
from .indexer_topk import mla_indexer_topk, plan_indexer_topk_for
from .indexer_topk_plan import IndexerTopkPlan, plan_indexer_topk
from .latent_core import mla_decode_workspace_numel
from .merge import merge_attn_states
from .prefill import mla_prefill, plan_prefill_for
from .prefill_context import mla_prefill_with_context, plan_prefill_with_context_for
from .prefill_plan import PrefillContextPlan, PrefillPlan, plan_prefill, plan_prefill_with_context
from .rope_kv_write import concat_and_cache_mla, fused_rope_mla_kv_write
from .sparse import mla_sparse_attention, plan_sparse_attention_for
from .sparse_plan import SparsePlan, plan_sparse_attention
from .v4_attention import mla_v4_attention, plan_v4_attention_for
from .v4_attention_plan import V4Plan, plan_v4_attention

__all__ = [
    "mla_decode",
    "plan_decode",
    "plan_decode_for",
    "DecodePlan",
    "mla_decode_workspace_numel",
    "merge_attn_states",
    "mla_prefill",
    "plan_prefill",
    "plan_prefill_for",
    "PrefillPlan",
    "mla_prefill_with_context",
    "plan_prefill_with_context",
    "plan_prefill_with_context_for",
    "PrefillContextPlan",
    "fused_rope_mla_kv_write",
    "concat_and_cache_mla",
    "gather_context_chunk",
    "mla_sparse_attention",
    "plan_sparse_attention",
    "plan_sparse_attention_for",
    "SparsePlan",
    "mla_v4_attention",
    "plan_v4_attention",
    "plan_v4_attention_for",
    "V4Plan",
    "indexer_k_cache_write",
    "mla_indexer_topk",
    "plan_indexer_topk",
    "plan_indexer_topk_for",
    "IndexerTopkPlan",
]
