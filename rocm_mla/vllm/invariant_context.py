"""Chunked-context prefill whose context chunks are cut per request (the vLLM backend's
batch-invariant mode, docs/batch-invariance.md): a request's bits must not depend on which other
requests share its step, and vLLM's chunk plan packs requests into the workspace, so where it cuts a
request's context follows the requests before it.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.attention.mla_attention import MLACommonPrefillMetadata, _get_kv_b_proj_input_dtype

from rocm_mla.ops import gather_context_chunk, merge_attn_states, mla_prefill, plan_prefill_for


def fold_in_context_invariant(
    impl,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    prefill: MLACommonPrefillMetadata,
    k_scale: torch.Tensor,
    out: torch.Tensor,
    lse_new: torch.Tensor,
) -> None:
    """``RocmMLAImpl._fold_in_context`` with chunk boundaries that depend on the request alone
    (``impl``: the layer's RocmMLAImpl; out ``[T, N, V]`` holds the new-token attention, lse_new
    ``[N, T]`` its LSE; both updated in place).

    vLLM's chunk plan packs requests into the workspace, so where a request's context is cut
    follows the requests before it. Here each request's context is cut at multiples of the
    workspace's rows (a constant of the deployment) and attended piece by piece, in order,
    each piece merged into its rows: the request's bits are then the same in any batch. One
    gather, one up-projection, one attention and one merge per piece (more launches than
    vLLM's packing when many short contexts share a step). The query offsets come from the
    host (``query_lens_cpu``, else one copy of query_start_loc): prefill is not captured.
    """
    chunked = prefill.chunked_context
    assert chunked is not None
    N, P, V, L = impl.num_heads, impl.qk_nope_head_dim, impl.v_head_dim, impl.kv_lora_rank
    fp8 = impl._fp8_cache
    proj_dtype = _get_kv_b_proj_input_dtype(impl.kv_b_proj, False)
    piece = int(chunked.workspace.shape[0])
    if prefill.query_lens_cpu is not None:
        qsl = [0, *torch.as_tensor(prefill.query_lens_cpu).cumsum(0).tolist()]
    else:
        qsl = prefill.query_start_loc.tolist()
    dev = q.device
    rows_max = max(qsl[i + 1] - qsl[i] for i in range(len(qsl) - 1))
    chunk_out = torch.empty(rows_max, N, V, dtype=q.dtype, device=dev)
    chunk_lse = torch.empty(N, rows_max, dtype=torch.float32, device=dev)
    lse_alt = torch.empty_like(lse_new)
    for r, ctx in enumerate(chunked.context_lens_list):
        s, e = qsl[r], qsl[r + 1]
        if ctx <= 0 or e <= s:
            continue
        n_q = e - s
        src = lse_new  # the rows' running LSE
        for start in range(0, ctx, piece):
            n = min(piece, ctx - start)
            ws = chunked.workspace[:n]
            gather_context_chunk(
                kv_cache,
                prefill.block_table[r : r + 1],
                torch.tensor([0, n], dtype=torch.int32, device=dev),
                torch.tensor([start], dtype=torch.int32, device=dev),
                torch.zeros(n, dtype=torch.int32, device=dev),
                ws,
                k_scale=k_scale.reshape(1) if fp8 else None,
                kv_cache_dtype=impl.op_kv_cache_dtype,
            )
            kv_c = ws[:, :L]
            if proj_dtype is not None and proj_dtype != kv_c.dtype:
                kv_c = kv_c.to(proj_dtype)
            kv_nope = impl.kv_b_proj(kv_c)[0].view(n, N, P + V)
            tensors = (q[s:e], kv_nope[..., :P], ws[:, L:].unsqueeze(1), kv_nope[..., P:])
            tensors += (
                torch.tensor([0, n_q], dtype=torch.int32, device=dev),
                torch.tensor([0, n], dtype=torch.int32, device=dev),
            )
            # One plan per piece: each piece has its own sizes (one request, its rows, its keys).
            plan = plan_prefill_for(*tensors, causal=False, max_seqlen_q=n_q, max_seqlen_k=n, batch_invariant=True)
            mla_prefill(*tensors, sm_scale=impl.scale, plan=plan, out=chunk_out[:n_q], lse=chunk_lse[:, :n_q])
            last = start + piece >= ctx
            dst = None if last else (lse_alt if src is lse_new else lse_new)
            merge_attn_states(
                out[s:e],
                out[s:e],
                src[:, s:e],
                chunk_out[:n_q],
                chunk_lse[:, :n_q],
                None if dst is None else dst[:, s:e],
                batch_invariant=True,
            )
            if dst is not None:
                src = dst


__all__ = ["fold_in_context_invariant"]
