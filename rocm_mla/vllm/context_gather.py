"""Gather one chunk of cached context out of the paged MLA cache, for chunked prefill.

vLLM's MLA prefill with cached context gathers each context chunk's latent rows
``[kv_c (512) | k_pe (64)]`` from the paged cache into a contiguous workspace before the
``kv_b_proj`` up-projection (a GEMM needs the rows). Upstream this is vLLM's compiled
``gather_and_maybe_dequant_cache`` (vllm/_custom_ops.py), which is not importable where vLLM's
compiled extension is missing; rocm_mla needs no compiled vLLM op, so this module holds an
equivalent: one Triton launch that gathers, and dequantises an fp8 cache (value = stored x
k_scale) on the way, straight into the workspace rows. It is the one data-movement kernel of the
context path and it exists upstream as well: it is a gather, not one of the copies rocm_mla removes.

Indexing follows ``MLACommonPrefillMetadata.ContextChunk`` (vllm/model_executor/layers/attention/
mla_attention.py): chunk row t belongs to request ``s = token_to_seq[t]`` (0-based within the
chunk), is that request's context token ``starts[s] + t - cu_seq_lens[s]``, and lives at
``cache[block_table[s, pos // block_size], pos % block_size]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _platform

BLOCK_T = 4  # chunk rows per program: 4 x 576 elements, enough bytes in flight per program


@triton.jit
def _gather_context_kernel(cache, block_table, cu_seq_lens, starts, token_to_seq, k_scale_ptr, dst,
                           num_tokens, page_size,
                           s_c_blk, s_c_tok, s_bt, s_dst,
                           D_NOPE: tl.constexpr, D_PE: tl.constexpr, BLOCK_T: tl.constexpr,
                           FP8: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    valid = rows < num_tokens
    seq = tl.load(token_to_seq + rows, mask=valid, other=0)
    pos = tl.load(starts + seq, mask=valid, other=0) + rows - tl.load(cu_seq_lens + seq, mask=valid, other=0)
    page = tl.load(block_table + seq.to(tl.int64) * s_bt + pos // page_size, mask=valid, other=0)
    # int64: num_blocks x block_size x 576 exceeds 2^31 on large caches.
    src = page.to(tl.int64) * s_c_blk + (pos % page_size).to(tl.int64) * s_c_tok
    out = rows.to(tl.int64) * s_dst
    if FP8:
        scale = tl.load(k_scale_ptr)
    d0 = tl.arange(0, D_NOPE)
    # No `other=`: rows past num_tokens are never stored (and fp8 has no literal 0 to fill with).
    x = tl.load(cache + src[:, None] + d0[None, :], mask=valid[:, None])
    if FP8:
        x = x.to(tl.float32) * scale
    tl.store(dst + out[:, None] + d0[None, :], x.to(dst.dtype.element_ty), mask=valid[:, None])
    d1 = D_NOPE + tl.arange(0, D_PE)
    y = tl.load(cache + src[:, None] + d1[None, :], mask=valid[:, None])
    if FP8:
        y = y.to(tl.float32) * scale
    tl.store(dst + out[:, None] + d1[None, :], y.to(dst.dtype.element_ty), mask=valid[:, None])


def gather_context_chunk(kv_cache: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
                         starts: torch.Tensor, token_to_seq: torch.Tensor, dst: torch.Tensor, *,
                         k_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Gather ``dst.shape[0]`` context rows of one chunk from the paged cache into ``dst``.

    Args:
        kv_cache: ``[num_blocks, block_size, 576]``, last dim contiguous; the model dtype, or an
            fp8 (float8_e4m3fn / float8_e4m3fnuz) cache, dequantised with ``k_scale``.
        block_table: ``[R, max_blocks]`` int32, the chunk's requests (column stride 1).
        cu_seq_lens: ``[R + 1]`` int32, the chunk's context rows per request, cumulative.
        starts: ``[R]`` int32, each request's first context position in this chunk.
        token_to_seq: ``[num_tokens]`` int32, the request (0..R-1) of each chunk row.
        dst: ``[num_tokens, 576]`` destination (the workspace rows), last dim contiguous.
        k_scale: one-element float32 tensor, fp8 caches only (read on the device: no host sync).

    Returns:
        ``dst``.
    """
    T, D = dst.shape
    fp8 = kv_cache.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    if fp8 and k_scale is None:
        raise ValueError("gather_context_chunk: k_scale: expected a float32 tensor for an fp8 cache, got None")
    if D != 576 or kv_cache.shape[-1] != D or kv_cache.stride(-1) != 1 or dst.stride(-1) != 1:
        raise ValueError(f"gather_context_chunk: kv_cache/dst: expected rows of 576 with stride 1, got "
                         f"{tuple(kv_cache.shape)} {kv_cache.stride()} and {tuple(dst.shape)} {dst.stride()}")
    if T == 0:
        return dst
    if kv_cache.device.type == "cuda" or _platform.interpreter_active():
        grid = (triton.cdiv(T, BLOCK_T),)
        _gather_context_kernel[grid](
            kv_cache, block_table, cu_seq_lens, starts, token_to_seq,
            k_scale if fp8 else dst, dst, T, kv_cache.shape[1],
            kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0), dst.stride(0),
            D_NOPE=512, D_PE=D - 512, BLOCK_T=BLOCK_T, FP8=fp8)
        return dst
    # Plain-torch path (CPU without the Triton interpreter): same indexing, several ops.
    seq = token_to_seq[:T].long()
    pos = starts.long()[seq] + torch.arange(T, device=dst.device) - cu_seq_lens.long()[seq]
    page = block_table.long()[seq, pos // kv_cache.shape[1]]
    rows = kv_cache[page, pos % kv_cache.shape[1]]
    if fp8:
        rows = rows.float() * k_scale.float().reshape(())
    dst.copy_(rows)
    return dst
