"""Triton body of context_gather (wrapper: rocm_mla/ops/context_gather.py).

One program gathers BLOCK_T chunk rows. Row t belongs to request ``seq = token_to_seq[t]``, is
that request's context position ``pos = starts[seq] + t - cu_seq_lens[seq]`` and lives at
``cache[block_table[seq, pos // page_size], pos % page_size]``; the row is read in two
power-of-two pieces (D_NOPE = 512 latent, D_PE = 64 rope: tl.arange needs powers of two) and
written to ``dst[t]`` in dst's dtype (an fp8 cache dequantised on the way: value = stored x k_scale).
"""

import triton
import triton.language as tl


@triton.jit
def context_gather_kernel(
    cache,
    block_table,
    cu_seq_lens,
    starts,
    token_to_seq,
    k_scale_ptr,
    dst,
    num_tokens,
    page_size,
    num_seqs,
    capacity,
    num_blocks,
    s_c_blk,
    s_c_tok,
    s_bt,
    s_dst,
    D_NOPE: tl.constexpr,
    D_PE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    FP8: tl.constexpr,
):
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
