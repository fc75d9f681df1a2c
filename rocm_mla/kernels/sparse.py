"""Triton body of mla_sparse_attention (wrapper: rocm_mla/ops/sparse.py; reference:
rocm_mla/reference/sparse.py).

Sparse MLA (DeepSeek-V3.2, GLM-5.x): query row t attends only to the K tokens its indexer picked,
given as ``topk_indices[t, :]``: request-local positions (``PAGED``: looked up through the block
table row of the row's request, ``req_ids[t]``) or global cache slots (``slot = page x page_size +
offset``), in any order, -1 for "no token". One program = (row t, one split of the K list, one
block of BLOCK_H heads). Per tile of BLOCK_N list entries it

    reads the entries, turns each into a (page, offset) of the cache (block-table row, shift or
    division), gathers those BLOCK_N rows [kv_c (512) | k_pe (64)],
    s = q_nope . k_nope^T + q_pe . k_pe^T      (tl.dot; the 512 columns whole or in two halves)
    online softmax in base 2 (qk_scale holds log2(e)),
    acc += p . v                                (v = the first 512 columns of the same rows)

and writes the final out/lse (DIRECT: one split) or a normalised float32 partial and its base-2
lse into the workspace, which the split-K reduce (``mla_decode_reduce_kernel``,
rocm_mla/kernels/latent_core.py) merges: the partials have the decode's layout, ``[S, T x N, 512]``
and ``[S, T x N]``.

Index values are never trusted: an entry < -1, one past the table (or past the cache in global-slot
mode), a block-table entry outside [0, num_pages), or a row's request outside [0, num_reqs) when the
row names a token, is "bad": nothing is read for it, and the row's out and lse become NaN (the
split's lse is NaN, which the reduce carries into the row). Masked entries load 0, never cache
bytes, so NaN in pages nobody selected cannot leak; a selected row holding NaN reaches the rows that
selected it (its score, and so p, is NaN). Cache offsets are int64 (num_pages x page_size x 576 can
pass 2^31).
"""

import triton
import triton.language as tl

from .latent_core import close_split, page_and_offset, qk_scores, store_partial, xcd_local_order


@triton.jit
def _resolve(pos, bt_row, page_size, page_shift, capacity, num_pages, s_kv_blk, s_kv_tok,
             PAGED: tl.constexpr, POW2_PAGE: tl.constexpr):  # fmt: skip
    """``(row, ok, wrong)`` of a tile's list entries ``pos``: each selected token's element offset in
    the cache (only meaningful where ok), which entries select a token, and which are bad (see the
    module docstring). ``capacity`` is 0 for a row whose request is bad. Reads the block table for
    in-range entries alone.

    Every check is one unsigned compare (a negative value wraps past any bound) and nothing is
    selected to a safe value: each gathered row is computed once per copy a thread issues, so the
    loads' masks, not clamped addresses, keep every access inside the tensors."""
    live = pos.to(tl.uint32) < capacity.to(tl.uint32)
    blk, off = page_and_offset(pos, page_size, page_shift, POW2_PAGE)
    if PAGED:
        page = tl.load(bt_row + blk, mask=live, other=0)
        ok = live & (page.to(tl.uint32) < num_pages.to(tl.uint32))
    else:
        page = blk
        ok = live
    wrong = (pos != -1) & (ok == 0)
    # In-page offsets stay int32 (page_size x 576 is small); one widening per row.
    row = page.to(tl.int64) * s_kv_blk + off * s_kv_tok
    return row, ok, wrong


@triton.jit
def _load_tile(kv, row, ok, offs_a, offs_b, offs_pe, D_NOPE: tl.constexpr, D_SPLIT: tl.constexpr,
               RELOAD_K: tl.constexpr):  # fmt: skip
    """The cache rows at element offsets ``row`` ([BLOCK_N]) as stored: ``(va, vb, kp_t, ka_t,
    kb_t)``, V's column chunks [BLOCK_N, CHUNK], k_pe^T [64, BLOCK_N] and, with RELOAD_K, K^T's
    chunks read on their own (unused results repeat va). Entries that select nothing load 0, never
    cache bytes: 0 x NaN would poison p . v. The column pointers (``kv + offs``) are formed first, so
    they stay out of the loop and each copy adds only its row."""
    va = tl.load((kv + offs_a)[None, :] + row[:, None], mask=ok[:, None], other=0.0)
    kp_t = tl.load((kv + D_NOPE + offs_pe)[:, None] + row[None, :], mask=ok[None, :], other=0.0)
    vb = va
    ka_t = va
    kb_t = va
    if D_SPLIT == 2:
        vb = tl.load((kv + offs_b)[None, :] + row[:, None], mask=ok[:, None], other=0.0)
    if RELOAD_K:
        ka_t = tl.load((kv + offs_a)[:, None] + row[None, :], mask=ok[None, :], other=0.0)
        if D_SPLIT == 2:
            kb_t = tl.load((kv + offs_b)[:, None] + row[None, :], mask=ok[None, :], other=0.0)
    return va, vb, kp_t, ka_t, kb_t


# Counts that differ per call (rows, K, splits, page geometry) are not specialised: one compiled
# kernel per config serves every batch.
@triton.jit(
    do_not_specialize=[
        "num_rows",
        "num_heads",
        "topk",
        "num_splits",
        "split_len",
        "num_head_blocks",
        "page_size",
        "page_shift",
        "capacity",
        "num_pages",
        "num_reqs",
    ]
)
def mla_sparse_attention_kernel(
    q_nope,
    q_pe,
    kv,
    topk_indices,
    block_table,
    req_ids,
    k_scale_ptr,
    out,
    lse,
    part_o,
    part_lse,
    qk_scale,
    out_scale,
    num_rows,
    num_heads,
    topk,
    num_splits,
    split_len,
    num_head_blocks,
    page_size,
    page_shift,
    capacity,
    num_pages,
    num_reqs,
    s_qn_r,
    s_qn_h,
    s_qn_d,
    s_qp_r,
    s_qp_h,
    s_qp_d,
    s_kv_blk,
    s_kv_tok,
    s_ti_r,
    s_bt_b,
    s_req,
    s_o_r,
    s_o_h,
    s_o_d,
    s_l_r,
    s_l_h,
    s_po_s,
    s_pl_s,
    D_NOPE: tl.constexpr,
    D_PE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_SPLIT: tl.constexpr,
    DIRECT: tl.constexpr,
    HAS_K_SCALE_PTR: tl.constexpr,
    IEEE: tl.constexpr,
    PAGED: tl.constexpr,
    POW2_PAGE: tl.constexpr,
    F16_DOT: tl.constexpr,
    RELOAD_K: tl.constexpr,
    NUM_XCDS: tl.constexpr,
):
    """See the module docstring.

    q_nope [T, N, D_NOPE], q_pe [T, N, D_PE]: any strides. kv [num_pages, page_size, D_NOPE + D_PE]:
    last dim contiguous. topk_indices [T, topk] int32 (row stride s_ti_r, column stride 1).
    PAGED: block_table [B, max_blocks] int32 (row stride s_bt_b, column stride 1), req_ids [T] int32
    (stride s_req); capacity = max_blocks x page_size (entries >= capacity are bad). Otherwise the
    entries are slots and capacity = num_pages x page_size; block_table / req_ids are not read.
    POW2_PAGE: page_size == 1 << page_shift (a shift and a mask per entry instead of a division).
    Row t's list is cut into num_splits splits of split_len entries (a multiple of BLOCK_N; the last
    may be shorter). DIRECT (one split): out [T, N, D_NOPE] in q's dtype and lse [T, N] float32,
    natural log. Otherwise part_o [S, T x N, D_NOPE] and part_lse [S, T x N] float32 (base-2 lse,
    -inf where the split selected no token, NaN on a bad entry).
    qk_scale = sm_scale x log2(e) (x k_scale when given as a number), out_scale = that k_scale (or
    1); HAS_K_SCALE_PTR: both times the float32 at k_scale_ptr (fp8 caches).
    D_SPLIT (1, 2): the 512 latent columns as one tile or as two halves, each with its own q slice
    and accumulator (the same work; halves keep gfx942's q staging within its 64 KiB of LDS).
    F16_DOT (fp8 cache, bfloat16 q): both dots in float16 (e4m3 -> f16 is one conversion per two
    values on sm90, e4m3 -> bf16 three); accumulation stays float32.
    RELOAD_K: read K^T for q . k^T as its own (transposed) load instead of transposing the V tile
    (the second read of the rows hits L1/L2). Each load then has one consumer: on gfx942 and gfx950
    the 16-row fp8 tiles need fewer registers so (spill-free at 2 waves per SIMD); on sm90 it lets the
    pipeliner stage fp8 tiles in shared memory, which is slower there (docs/notes/sparse-attention.md).
    NUM_XCDS: dies that take workgroups round-robin (8 on MI300X): the head blocks and splits of a
    row, which read the same cache rows, are placed on one die's L2.
    """
    pid = tl.program_id(0)
    if NUM_XCDS > 1:
        pid = xcd_local_order(pid, num_rows * num_splits * num_head_blocks, NUM_XCDS)
    hb = pid % num_head_blocks
    rest = pid // num_head_blocks
    split = rest % num_splits
    t = (rest // num_splits).to(tl.int64)  # T x N x 576 can pass 2^31

    CHUNK: tl.constexpr = D_NOPE // D_SPLIT
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = offs_h < num_heads
    offs_n = tl.arange(0, BLOCK_N)
    offs_a = tl.arange(0, CHUNK)
    offs_b = CHUNK + tl.arange(0, CHUNK)
    offs_pe = tl.arange(0, D_PE)

    qn_row = q_nope + t * s_qn_r + offs_h[:, None] * s_qn_h
    qa = tl.load(qn_row + offs_a[None, :] * s_qn_d, mask=row_ok[:, None], other=0.0)
    if D_SPLIT == 2:
        qb = tl.load(qn_row + offs_b[None, :] * s_qn_d, mask=row_ok[:, None], other=0.0)
    qp = tl.load(
        q_pe + t * s_qp_r + offs_h[:, None] * s_qp_h + offs_pe[None, :] * s_qp_d, mask=row_ok[:, None], other=0.0
    )
    if F16_DOT:
        qa = tl.clamp(qa.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        if D_SPLIT == 2:
            qb = tl.clamp(qb.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        qp = tl.clamp(qp.to(tl.float32), -65504.0, 65504.0).to(tl.float16)

    sc = qk_scale
    osc = out_scale
    if HAS_K_SCALE_PTR:
        ks = tl.load(k_scale_ptr)
        sc = sc * ks
        osc = osc * ks

    bt_row = block_table
    cap = capacity
    if PAGED:
        req = tl.load(req_ids + t * s_req)
        req_ok = (req >= 0) & (req < num_reqs)
        bt_row = block_table + tl.where(req_ok, req, 0).to(tl.int64) * s_bt_b
        cap = tl.where(req_ok, capacity, 0)  # a bad request: every named entry is bad
    ti_row = topk_indices + t * s_ti_r
    k_lo = split * split_len
    k_hi = tl.minimum(k_lo + split_len, topk)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc_a = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
    for n0 in range(k_lo, k_hi, BLOCK_N):
        idx = n0 + offs_n
        pos = tl.load(ti_row + idx, mask=idx < k_hi, other=-1)
        row, ok, wrong = _resolve(
            pos, bt_row, page_size, page_shift, cap, num_pages, s_kv_blk, s_kv_tok, PAGED, POW2_PAGE
        )
        va, vb, kp_t, ka_t, kb_t = _load_tile(kv, row, ok, offs_a, offs_b, offs_pe, D_NOPE, D_SPLIT, RELOAD_K)
        va = va.to(qa.dtype)
        kp_t = kp_t.to(qa.dtype)
        if D_SPLIT == 2:
            vb = vb.to(qa.dtype)
        if RELOAD_K:
            ka_t = ka_t.to(qa.dtype)
            if D_SPLIT == 2:
                kb_t = kb_t.to(qa.dtype)
        else:
            ka_t = tl.trans(va)
            if D_SPLIT == 2:
                kb_t = tl.trans(vb)
        s = qk_scores(qa, qb if D_SPLIT == 2 else qa, qp, ka_t, kb_t, kp_t, IEEE, D_SPLIT)  # qb: D_SPLIT 2 alone
        # A bad entry scores NaN: p, l and acc of every head of the row turn NaN (and stay NaN
        # through the online softmax), so out and lse say so; no flag is reduced in the loop.
        s = tl.where(ok[None, :], s * sc, tl.where(wrong, float("nan"), float("-inf"))[None, :])
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row with no selected token yet keeps m = -inf; subtracting 0 avoids -inf - -inf.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc_a = acc_a * alpha[:, None] + tl.dot(p, va, input_precision="ieee")
            if D_SPLIT == 2:
                acc_b = acc_b * alpha[:, None] + tl.dot(p, vb, input_precision="ieee")
        else:
            pv = p.to(va.dtype)
            acc_a = acc_a * alpha[:, None] + tl.dot(pv, va)
            if D_SPLIT == 2:
                acc_b = acc_b * alpha[:, None] + tl.dot(pv, vb)
        m_i = m_new

    inv, lse2 = close_split(m_i, l_i, osc, False, False, 0.0)
    if DIRECT:
        o_row = out + t * s_o_r + offs_h[:, None] * s_o_h
        tl.store(o_row + offs_a[None, :] * s_o_d, (acc_a * inv).to(out.dtype.element_ty), mask=row_ok[:, None])
        if D_SPLIT == 2:
            tl.store(o_row + offs_b[None, :] * s_o_d, (acc_b * inv).to(out.dtype.element_ty), mask=row_ok[:, None])
        tl.store(lse + t * s_l_r + offs_h * s_l_h, lse2 * 0.6931471805599453, mask=row_ok)
    else:
        r = t * num_heads + offs_h
        store_partial(
            part_o, part_lse, split, s_po_s, s_pl_s, r, row_ok, True, acc_a * inv, acc_b * inv, lse2,
            offs_a, offs_b, D_NOPE, D_SPLIT, 1,
        )  # fmt: skip
