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
from ..ops._checks import Checker

BLOCK_T = 4  # chunk rows per program: 4 x 576 elements, enough bytes in flight per program


@triton.jit
def _gather_context_kernel(cache, block_table, cu_seq_lens, starts, token_to_seq, k_scale_ptr, dst,
                           num_tokens, page_size, num_seqs, capacity, num_blocks,
                           s_c_blk, s_c_tok, s_bt, s_dst,
                           D_NOPE: tl.constexpr, D_PE: tl.constexpr, BLOCK_T: tl.constexpr,
                           FP8: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    valid = rows < num_tokens
    seq = tl.load(token_to_seq + rows, mask=valid, other=0)
    # Bound guards (the KV write's contract; compares and selects, no extra loads): a request
    # outside the block table, a position outside its row of the table, or a page outside the
    # cache reads nothing and makes that chunk row NaN; other rows are unaffected.
    ok = valid & (seq >= 0) & (seq < num_seqs)
    seq = tl.where(ok, seq, 0)
    pos = tl.load(starts + seq, mask=ok, other=0) + rows - tl.load(cu_seq_lens + seq, mask=ok, other=0)
    ok = ok & (pos >= 0) & (pos < capacity)  # capacity = max_blocks x page_size
    pos = tl.where(ok, pos, 0)
    page = tl.load(block_table + seq.to(tl.int64) * s_bt + pos // page_size, mask=ok, other=0)
    ok = ok & (page >= 0) & (page < num_blocks)
    # int64: num_blocks x block_size x 576 exceeds 2^31 on large caches.
    src = tl.where(ok, page, 0).to(tl.int64) * s_c_blk + (pos % page_size).to(tl.int64) * s_c_tok
    out = rows.to(tl.int64) * s_dst
    if FP8:
        scale = tl.load(k_scale_ptr)
    d0 = tl.arange(0, D_NOPE)
    # No `other=`: masked rows are replaced below (and fp8 has no literal 0 to fill with).
    x = tl.load(cache + src[:, None] + d0[None, :], mask=ok[:, None])
    x = x.to(tl.float32)
    if FP8:
        x = x * scale
    x = tl.where(ok[:, None], x, float("nan"))
    tl.store(dst + out[:, None] + d0[None, :], x.to(dst.dtype.element_ty), mask=valid[:, None])
    d1 = D_NOPE + tl.arange(0, D_PE)
    y = tl.load(cache + src[:, None] + d1[None, :], mask=ok[:, None])
    y = y.to(tl.float32)
    if FP8:
        y = y * scale
    y = tl.where(ok[:, None], y, float("nan"))
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
        token_to_seq: ``[>= num_tokens]`` int32, the request (0..R-1) of each chunk row.
        dst: ``[num_tokens, 576]`` destination (the workspace rows), last dim contiguous; it may
            not overlap any input (ValueError naming both).
        k_scale: one-element float32 tensor, fp8 caches only (read on the device: no host sync).

    Bad indices (the KV write's contract, no host sync): nothing outside the given tensors is
    read or written. A chunk row whose request is outside ``[0, R)``, whose position is outside
    its table row ``[0, max_blocks x block_size)``, or whose page is outside ``[0, num_blocks)``
    gets NaN (all 576 values); other rows are unaffected.

    Returns:
        ``dst``.
    """
    c = Checker("gather_context_chunk")
    T, D = dst.shape
    fp8 = kv_cache.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    if fp8 and k_scale is None:
        raise ValueError("gather_context_chunk: k_scale: expected a float32 tensor for an fp8 cache, got None")
    if D != 576 or kv_cache.shape[-1] != D or kv_cache.stride(-1) != 1 or dst.stride(-1) != 1:
        raise ValueError(f"gather_context_chunk: kv_cache/dst: expected rows of 576 with stride 1, got "
                         f"{tuple(kv_cache.shape)} {kv_cache.stride()} and {tuple(dst.shape)} {dst.stride()}")
    R = block_table.shape[0]
    c.tensor("cu_seq_lens", cu_seq_lens, shape=(R + 1,), layout="[R + 1]", like="block_table's R")
    c.tensor("starts", starts, shape=(R,), layout="[R]", like="block_table's R")
    if token_to_seq.dim() != 1 or token_to_seq.shape[0] < T:
        c.fail("token_to_seq", f"a 1-D tensor of at least dst's {T} rows", f"shape {tuple(token_to_seq.shape)}")
    c.no_overlap({"dst": dst}, {"kv_cache": kv_cache, "block_table": block_table, "cu_seq_lens": cu_seq_lens,
                                "starts": starts, "token_to_seq": token_to_seq,
                                "k_scale": k_scale if fp8 else None})
    if T == 0:
        return dst
    num_blocks, page_size = kv_cache.shape[0], kv_cache.shape[1]
    max_blocks = block_table.shape[1]
    if kv_cache.device.type == "cuda" or _platform.interpreter_active():
        grid = (triton.cdiv(T, BLOCK_T),)
        # Empty tensors are never dereferenced (every row is then out of range) but may carry a
        # null pointer: hand the launcher dst instead.
        cache = kv_cache if kv_cache.numel() else dst
        bt = block_table if block_table.numel() else token_to_seq
        cu_l = cu_seq_lens
        st = starts if starts.numel() else token_to_seq
        _gather_context_kernel[grid](
            cache, bt, cu_l, st, token_to_seq,
            k_scale if fp8 else dst, dst, T, page_size, R, max_blocks * page_size, num_blocks,
            kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0), dst.stride(0),
            D_NOPE=512, D_PE=D - 512, BLOCK_T=BLOCK_T, FP8=fp8)
        return dst
    # Plain-torch path (CPU without the Triton interpreter): same indexing and guards, several ops.
    seq = token_to_seq[:T].long()
    ok = (seq >= 0) & (seq < R)
    seq = torch.where(ok, seq, 0)
    if R:
        pos = starts.long()[seq] + torch.arange(T, device=dst.device) - cu_seq_lens.long()[seq]
    else:
        pos = torch.zeros(T, dtype=torch.long, device=dst.device)
    ok &= (pos >= 0) & (pos < max_blocks * page_size)
    pos = torch.where(ok, pos, 0)
    page = block_table.long()[seq, pos // page_size] if R and max_blocks else torch.zeros_like(pos)
    ok &= (page >= 0) & (page < num_blocks)
    if num_blocks:
        rows = kv_cache[torch.where(ok, page, 0), pos % page_size].float()
    else:
        rows = torch.zeros(T, D, device=dst.device)
    if fp8:
        rows = rows * k_scale.float().reshape(())
    dst.copy_(torch.where(ok[:, None], rows, float("nan")))
    return dst
