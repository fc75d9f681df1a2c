"""rocm-mla: MLA (DeepSeek Multi-head Latent Attention) kernels for AMD MI300 (gfx942), in HIP and
Triton, that write their outputs in place.

Public API. Every attention op is ``op(tensors..., *, sm_scale, out=None, lse=None, k_scale=None,
workspace=None, plan=None)``: every knob that is not a tensor (cache dtype, split count, fp8 dots, batch
invariance, launch config, backend, debug, max lengths) lives in the op's plan, made once per step by
``plan_<op>(sizes..., **knobs)`` or ``plan_<op>_for(tensors..., **knobs)`` and passed to every layer;
``plan=None`` plans from the tensors. A plan is frozen, ``plan.matches(tensors...)`` tells whether it
fits a call, and the op refuses one that does not (ValueError naming the field) before any backend
runs. Each docstring gives shapes and layouts.

    mla_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, *, sm_scale, out=None, lse=None,
               k_scale=None, workspace=None, plan=None) -> (out, lse)
        plan_decode(*, batch, num_heads, q_len, max_blocks, block_size, q_dtype, kv_dtype, device, ...)
        plan_decode_for(q_nope, kv_cache, block_table, **knobs) -> DecodePlan
    mla_prefill(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, *, sm_scale, out=None, lse=None,
                plan=None) -> (out, lse)
        plan_prefill(*, batch, num_heads, q_rows, k_rows, q_dtype, device, head_dims=(128, 64, 128), ...)
        plan_prefill_for(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, **knobs) -> PrefillPlan
    mla_prefill_with_context(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, context_chunks=(), *,
                             sm_scale, out=None, lse=None, plan=None) -> (out, lse)
        plan_prefill_with_context(*, batch, num_heads, q_rows, k_rows, q_dtype, device, ...)
        plan_prefill_with_context_for(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, **knobs)
            -> PrefillContextPlan
    mla_sparse_attention(q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token, *,
                         sm_scale, out=None, lse=None, k_scale=None, workspace=None, plan=None)
                         -> (out, lse)   (sparse MLA: DeepSeek-V3.2, GLM-5.x)
        plan_sparse_attention(*, num_rows, num_heads, topk, block_size, q_dtype, kv_dtype, device, ...)
        plan_sparse_attention_for(q_nope, q_pe, kv_cache, topk_indices, block_table=None,
                                  req_id_per_token=None, *, k_scale=None, workspace=None, **knobs)
            -> SparsePlan
    mla_v4_attention(q, window_cache, window_indices, window_indptr=None, compressed_cache=None,
                     compressed_indices=None, compressed_indptr=None, attn_sink=None, positions=None,
                     cos_sin_cache=None, *, sm_scale, out=None, lse=None, workspace=None, plan=None)
                     -> (out, lse)   (DeepSeek-V4: window + compressed lists, sink, inverse RoPE)
        plan_v4_attention(*, num_rows, num_heads, q_dtype, device, window_dtype, window_block_size,
                          window_len, ...)
        plan_v4_attention_for(<the op's tensors>, *, workspace=None, **knobs) -> V4Plan
    mla_indexer_topk(q, weights, index_cache, block_table, req_id_per_token, kv_lens, *, topk,
                     out=None, workspace=None, plan=None) -> out   (the lightning indexer's top-k)
        plan_indexer_topk(*, num_rows, num_heads, topk, max_kv_len, block_size, q_dtype, device, ...)
        plan_indexer_topk_for(q, index_cache, block_table, *, topk, **knobs) -> IndexerTopkPlan

The cache writes and the merge keep vLLM's drop-in signatures (``backend=`` forces an implementation):
    merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None)
    fused_rope_mla_kv_write(positions, q_pe, k_pe, kv_c, cos_sin_cache, kv_cache, slot_mapping, *,
                            is_neox, kv_cache_dtype="auto", k_scale=None) -> None (in place)
    concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, *, kv_cache_dtype="auto",
                         k_scale=None) -> None (in place)
    indexer_k_cache_write(k, index_cache, slot_mapping, *, scale_fmt="ue8m0", shuffled=None,
                          kv_cache_dtype="fp8") -> None (in place; the lightning indexer's fp8 key cache)
    gather_context_chunk(kv_cache, block_table, cu_seq_lens, starts, token_to_seq, dst, *,
                         k_scale=None, kv_cache_dtype="auto") -> dst   (one context chunk, chunked prefill)

A latent cache is read in q's dtype, as a float8 tensor, or as uint8 storage with an fp8
``kv_cache_dtype`` (in the plan, or on the call of the writes and the gather). Bad index values never
make a kernel touch memory outside its tensors, and destinations may not overlap inputs
(docs/bad-input.md).

The ops are imported lazily: ``rocm_mla.tools`` can set TRITON_INTERPRET (which Triton reads when a
kernel is decorated) before any kernel module loads.
"""

__version__ = "0.1.0"

from . import env as _env  # noqa: E402

# A ROCM_MLA_* variable rocm_mla does not read (a misspelt op switch, say) is reported, not ignored.
_env.check_environment()

__all__ = [
    "mla_decode",
    "plan_decode",
    "plan_decode_for",
    "DecodePlan",
    "mla_prefill",
    "plan_prefill",
    "plan_prefill_for",
    "PrefillPlan",
    "mla_prefill_with_context",
    "plan_prefill_with_context",
    "plan_prefill_with_context_for",
    "PrefillContextPlan",
    "mla_sparse_attention",
    "plan_sparse_attention",
    "plan_sparse_attention_for",
    "SparsePlan",
    "mla_v4_attention",
    "plan_v4_attention",
    "plan_v4_attention_for",
    "V4Plan",
    "mla_indexer_topk",
    "plan_indexer_topk",
    "plan_indexer_topk_for",
    "IndexerTopkPlan",
    "merge_attn_states",
    "fused_rope_mla_kv_write",
    "concat_and_cache_mla",
    "indexer_k_cache_write",
    "gather_context_chunk",
    "__version__",
]


def __getattr__(name):
    if name in __all__:
        from . import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'rocm_mla' has no attribute {name!r}")
