"""rocm-mla: MLA (DeepSeek Multi-head Latent Attention) kernels for AMD MI300 (gfx942), in HIP and
Triton, that write their outputs in place.

Public API (see each function's docstring for shapes and layouts):
    merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None)
    plan_prefill(*, batch, num_heads, q_rows, k_rows, dtype, device, head_dims=(128, 64, 128),
                 causal=True, max_seqlen_q=None, max_seqlen_k=None, config=None, ...)
                 -> PrefillPlan   (made once per step, passed to every layer's mla_prefill)
    plan_prefill_for(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, **knobs) -> PrefillPlan   (sizes from tensors)
    mla_prefill(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, *, sm_scale, plan=None, out=None,
                lse=None) -> (out, lse)
    mla_prefill_with_context(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, context_chunks, *,
                             sm_scale, out=None, lse=None, ...plan_prefill's knobs) -> (out, lse)
    plan_decode(*, batch, num_heads, q_len, max_blocks, block_size, q_dtype, kv_dtype, device,
                kv_cache_dtype="auto", max_seq_len=None, fp8_dots=None, batch_invariant=False, ...)
                -> DecodePlan   (made once per step, passed to every layer's mla_decode)
    plan_decode_for(q_nope, kv_cache, block_table, **knobs) -> DecodePlan   (sizes from tensors)
    mla_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, *, sm_scale, plan=None, out=None,
               lse=None, k_scale=None, workspace=None) -> (out, lse)
    fused_rope_mla_kv_write(positions, q_pe, k_pe, kv_c, cos_sin_cache, kv_cache, slot_mapping, *,
                            is_neox, kv_cache_dtype="auto", k_scale=None) -> None (in place)
    concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, *, kv_cache_dtype="auto",
                         k_scale=None) -> None (in place)
    mla_sparse_attention(q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token, *,
                         sm_scale, out=None, lse=None, kv_cache_dtype="auto", k_scale=None)
                         -> (out, lse)   (sparse MLA: DeepSeek-V3.2, GLM-5.x)
    plan_sparse_attention(...) -> SparsePlan   (its launches, computed once for many calls)
    indexer_k_cache_write(k, index_cache, slot_mapping, *, scale_fmt="ue8m0", shuffled=None,
                          kv_cache_dtype="fp8") -> None (in place; the lightning indexer's fp8 key cache)

Every op also takes ``backend=`` (and the index-reading ones ``debug=``; mla_decode and mla_prefill
through their plans); bad index values never make a kernel touch memory outside its tensors, and
destinations may not overlap inputs (docs/bad-input.md).

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
    "merge_attn_states",
    "mla_prefill",
    "plan_prefill",
    "plan_prefill_for",
    "PrefillPlan",
    "mla_prefill_with_context",
    "fused_rope_mla_kv_write",
    "concat_and_cache_mla",
    "mla_sparse_attention",
    "plan_sparse_attention",
    "indexer_k_cache_write",
    "mla_indexer_topk",
    "plan_indexer_topk",
    "__version__",
]


def __getattr__(name):
    if name in __all__:
        from . import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'rocm_mla' has no attribute {name!r}")
