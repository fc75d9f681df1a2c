"""Triton bodies of mla_indexer_topk (wrapper: rocm_mla/ops/indexer_topk.py; reference:
rocm_mla/reference/indexer_topk.py).

The lightning indexer of sparse MLA (DeepSeek-V3.2, GLM-5.x) scores every key a query row sees,

    logit(t, j) = sum_h weights[t, h] x relu(q[t, h] . k_j),    k_j = fp8 row j x its float32 scale,

and keeps the ``topk`` largest as request-local positions. No logits matrix is written: a program
(``mla_indexer_split_topk_kernel``) takes one row and one split of SPLIT keys, keeps that split's
logits in registers (a [SPLIT // BLOCK_N, BLOCK_N] tile, one tile row per key block), and selects
their top-k there; with one split per row it writes the row's answer, otherwise the split's
candidates (order keys and positions, ``[T, S, TOPK_P2]``), which ``mla_indexer_merge_kernel``
reduces to the row's answer.

Selection is exact, on order keys (a float's bits mapped so that unsigned order is float order; 0
marks "no key"): the k-th largest key is found bit by bit from the top (keep a bit while >= k keys
stay at or above the threshold; the merge tests four bits a pass), every larger key is taken, and
keys equal to it in position order until k are taken. So the answer is the selected positions in
ascending order, whatever the split size: deterministic and independent of the batch.

NaN and bad values are never dropped silently: a NaN logit (NaN in q, weights, a key or its scale)
maps to the largest order key, so it is always selected, and a row whose selection holds one
writes the bad-row sentinel (every entry -2), which mla_sparse_attention turns into a NaN row.
A block-table entry outside [0, num_pages) among the row's visible keys scores NaN (nothing is read
for it); a row whose request or kv_len is out of range writes the sentinel without reading, and
so does a row with more keys than the call's splits cover (its plan's max_kv_len).
"""

import triton
import triton.language as tl

from .mla_sparse import page_and_offset


@triton.jit
def _order_key(x):
    """uint32 keys whose unsigned order is the float order of ``x``; NaN -> 0xFFFFFFFF, and no float
    maps to 0 (the "no key" mark)."""
    bits = x.to(tl.uint32, bitcast=True)
    key = tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)  # (~ trips the CPU interpreter on uint32)
    return tl.where(x != x, 0xFFFFFFFF, key)


@triton.jit
def _row(req_ids, kv_lens, t, s_req, s_kl, num_reqs, capacity, max_keys):
    """Row t's request, kv_len, and whether the row is bad: its request outside [0, num_reqs), its
    kv_len negative, past the table (capacity) or past what the call's splits cover (max_keys)."""
    req = tl.load(req_ids + t * s_req)
    kv_len = tl.load(kv_lens + t * s_kl)
    bad = (req < 0) | (req >= num_reqs) | (kv_len < 0) | (kv_len > capacity) | (kv_len > max_keys)
    return req, kv_len, bad


@triton.jit
def _kth_largest(keys, k):
    """The k-th largest of the order keys ``keys`` (a register tensor; k >= 1, k <= its nonzero
    keys; k = 0 gives 0xFFFFFFFF), bit by bit from the top: keep each bit whose setting still leaves
    >= k keys at or above the threshold."""
    thr = tl.zeros([], dtype=tl.uint32)
    for b in range(32):
        cand = thr | (tl.full([], 0x80000000, tl.uint32) >> (tl.zeros([], tl.uint32) + b))
        cnt = tl.sum((keys >= cand).to(tl.int32), axis=0)
        thr = tl.where(cnt >= k, cand, thr)
    return thr


@triton.jit(
    do_not_specialize=[
        "num_rows",
        "num_splits",
        "topk",
        "page_size",
        "page_shift",
        "capacity",
        "num_pages",
        "num_reqs",
    ]
)
def mla_indexer_split_topk_kernel(
    q,
    weights,
    cache,
    block_table,
    req_ids,
    kv_lens,
    out,
    cand_key,
    cand_pos,
    num_rows,
    num_splits,
    topk,
    page_size,
    page_shift,
    capacity,
    num_pages,
    num_reqs,
    s_q_r,
    s_q_h,
    s_w_r,
    s_w_h,
    s_c_blk,
    s_bt_b,
    s_req,
    s_kl,
    s_o_r,
    H: tl.constexpr,
    BLOCK_H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    TOPK_P2: tl.constexpr,
    DIRECT: tl.constexpr,
    POW2_PAGE: tl.constexpr,
    SHUFFLED: tl.constexpr,
):
    """Program (row t, split s): the logits of the row's keys [s x SPLIT, min((s + 1) x SPLIT,
    kv_len)) and their top ``topk``.

    q [T, H, D] fp8 (any row/head strides, last dim contiguous), weights [T, H] float32, cache
    [num_pages, page_size, D + 4] bytes viewed as q's fp8 kind, pages s_c_blk bytes apart:
    page_size x D fp8 values (row by row, or SHUFFLED in 16 x 16 tiles: rocm_mla/reference/
    indexer.py), then page_size float32 scales. block_table [B, max_blocks] int32, req_ids [T],
    kv_lens [T] int32; capacity = max_blocks x page_size. DIRECT (one split per row): out [T, topk]
    int32 (row stride s_o_r): the positions,
    -1 past the row's keys, -2 (reference.indexer_topk.SENTINEL) everywhere for a bad row. Otherwise cand_key / cand_pos
    [T, num_splits, TOPK_P2] (contiguous): the split's selected order keys and positions in slots
    [0, n), the rest not written; the NaN key 0xFFFFFFFF in slot 0 marks a bad row.
    """
    cand_key = cand_key.to(tl.pointer_type(tl.uint32))  # an int32 workspace holding uint32 keys
    pid = tl.program_id(0)
    split = pid % num_splits
    t = (pid // num_splits).to(tl.int64)

    req, kv_len, row_bad = _row(req_ids, kv_lens, t, s_req, s_kl, num_reqs, capacity, num_splits * SPLIT)
    n_keys = tl.where(row_bad, 0, kv_len)
    lo = split * SPLIT
    hi = tl.minimum(lo + SPLIT, n_keys)
    if not DIRECT:
        if (lo >= hi) & (row_bad == 0):
            return  # the merge reads only the row's live splits
    bt_row = block_table + tl.where(row_bad, 0, req).to(tl.int64) * s_bt_b

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    h_ok = offs_h < H
    # fp8 loads take no `other` (the CPU interpreter cannot make an e4m3fnuz constant): padded
    # heads' scores are zeroed below and masked keys' logits replaced, so their bytes never count.
    qt = tl.load(q + t * s_q_r + offs_h[:, None] * s_q_h + offs_d[None, :], mask=h_ok[:, None])
    w = tl.load(weights + t * s_w_r + offs_h * s_w_h, mask=h_ok, other=0.0)
    qt_t = tl.trans(qt)  # [D, BLOCK_H]: the keys are the dot's rows (M = BLOCK_N)

    NT: tl.constexpr = SPLIT // BLOCK_N
    tiles = tl.arange(0, NT)
    offs_n = tl.arange(0, BLOCK_N)
    keys2 = tl.zeros([NT, BLOCK_N], dtype=tl.uint32)
    for i in range(0, tl.cdiv(hi - lo, BLOCK_N)):
        pos = lo + i * BLOCK_N + offs_n
        live = pos < hi
        blk, off = page_and_offset(pos, page_size, page_shift, POW2_PAGE)
        page = tl.load(bt_row + blk, mask=live, other=0)
        ok = live & (page.to(tl.uint32) < num_pages.to(tl.uint32))
        base = page.to(tl.int64) * s_c_blk
        if SHUFFLED:
            # 16 x 16 tiles of (token, byte): token-tile, byte-tile, token, byte.
            col = (
                (off[:, None] // 16) * (16 * D)
                + (offs_d[None, :] // 16) * 256
                + (off[:, None] % 16) * 16
                + offs_d[None, :] % 16
            )
        else:
            col = off[:, None] * D + offs_d[None, :]
        kr = tl.load(cache + base[:, None] + col, mask=ok[:, None])  # [BLOCK_N, D] fp8
        sc_ptr = (cache + base + page_size * D + off * 4).to(tl.pointer_type(tl.float32))
        scale = tl.load(sc_ptr, mask=ok, other=0.0)
        s = tl.dot(kr, qt_t)  # [BLOCK_N, BLOCK_H] float32
        if BLOCK_H > H:
            s = tl.where(h_ok[None, :], s, 0.0)
        # relu that keeps NaN (a NaN product must reach the logit)
        lg = tl.sum(w[None, :] * tl.where(s < 0.0, 0.0, s), axis=1) * scale
        lg = tl.where(ok, lg, float("nan"))
        key = tl.where(live, _order_key(lg), 0)
        keys2 = tl.where(tiles[:, None] == i, key[None, :], keys2)

    keys = tl.reshape(keys2, [SPLIT])
    positions = lo + tl.arange(0, SPLIT)
    n_valid = tl.maximum(hi - lo, 0)
    k = tl.minimum(topk, n_valid)
    thr = _kth_largest(keys, k)
    k_rem = k - tl.sum((keys > thr).to(tl.int32), axis=0)  # keys equal to thr still to take
    eq = keys == thr
    eq_rank = tl.cumsum(eq.to(tl.int32), 0) - 1
    take = (keys > thr) | (eq & (eq_rank < k_rem))
    take = take & (keys != 0)
    slot = tl.cumsum(take.to(tl.int32), 0) - 1
    n_taken = tl.sum(take.to(tl.int32), axis=0)
    poison = row_bad | (tl.max(tl.where(take, keys, 0), axis=0) == 0xFFFFFFFF)
    if DIRECT:
        o_row = out + t * s_o_r
        tl.store(o_row + slot, positions, mask=take & (poison == 0))
        j = tl.arange(0, TOPK_P2)  # topk <= TOPK_P2
        fill = tl.zeros([TOPK_P2], dtype=tl.int32) + tl.where(poison, -2, -1)
        tl.store(o_row + j, fill, mask=(j < topk) & ((j >= n_taken) | poison))
    else:
        c_row = (t * num_splits + split) * TOPK_P2
        tl.store(cand_key + c_row + slot, keys, mask=take)
        tl.store(cand_pos + c_row + slot, positions, mask=take)
        if row_bad:
            tl.store(cand_key + c_row, 0xFFFFFFFF)


@triton.jit
def _written(c, n, row_bad, kv_len, topk, SPLIT: tl.constexpr, TOPK_P2: tl.constexpr):
    """Which of the candidate slots ``c`` (row-relative, [0, n)) a split wrote: split ``c //
    TOPK_P2`` wrote min(topk, its keys) of them (one, the mark, for a bad row); the rest are stale."""
    sp = c // TOPK_P2
    cnt = tl.where(row_bad, 1, tl.minimum(topk, tl.minimum(kv_len - sp * SPLIT, SPLIT)))
    return (c < n) & ((c % TOPK_P2) < cnt)


@triton.jit(do_not_specialize=["num_rows", "num_splits", "topk", "capacity", "num_reqs"])
def mla_indexer_merge_kernel(
    cand_key,
    cand_pos,
    req_ids,
    kv_lens,
    out,
    num_rows,
    num_splits,
    topk,
    capacity,
    num_reqs,
    s_req,
    s_kl,
    s_o_r,
    SPLIT: tl.constexpr,
    TOPK_P2: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Program t: the top ``topk`` of row t's split candidates (``mla_indexer_split_topk_kernel``,
    its live splits only: cdiv(kv_len, SPLIT), one for a bad row), the same threshold search over
    chunks of CHUNK candidates read from the workspace (four bits a pass); writes out[t] as the
    DIRECT split kernel."""
    cand_key = cand_key.to(tl.pointer_type(tl.uint32))  # an int32 workspace holding uint32 keys
    t = tl.program_id(0).to(tl.int64)
    req, kv_len, row_bad = _row(req_ids, kv_lens, t, s_req, s_kl, num_reqs, capacity, num_splits * SPLIT)
    live = tl.where(row_bad, 1, tl.cdiv(tl.maximum(kv_len, 0), SPLIT))
    base = t * num_splits * TOPK_P2
    n = live * TOPK_P2
    offs = tl.arange(0, CHUNK)

    # The first pass counts the candidates and finds a NaN key (a bad row's mark or a NaN logit):
    # the sentinel is known before anything is written. Then the k-th largest key, four bits a pass
    # (15 thresholds counted per read of the candidates).
    n_valid = tl.zeros([], dtype=tl.int32)
    poison = row_bad
    for c0 in range(0, n, CHUNK):
        c = c0 + offs
        keys = tl.load(cand_key + base + c, mask=_written(c, n, row_bad, kv_len, topk, SPLIT, TOPK_P2), other=0)
        n_valid += tl.sum((keys != 0).to(tl.int32), axis=0)
        poison = poison | (tl.max(keys, axis=0) == 0xFFFFFFFF)
    k = tl.minimum(topk, n_valid)
    nib = tl.arange(0, 16).to(tl.uint32)
    thr = tl.zeros([], dtype=tl.uint32)
    for p in range(8):
        shift = tl.zeros([], tl.uint32) + (28 - 4 * p)
        cands = thr | (nib << shift)  # [16]; nib 0 is thr itself (count >= k holds)
        cnt = tl.zeros([16], dtype=tl.int32)
        for c0 in range(0, n, CHUNK):
            c = c0 + offs
            keys = tl.load(cand_key + base + c, mask=_written(c, n, row_bad, kv_len, topk, SPLIT, TOPK_P2), other=0)
            cnt += tl.sum((keys[:, None] >= cands[None, :]).to(tl.int32), axis=0)
        best = tl.max(tl.where(cnt >= k, nib, 0), axis=0)
        thr = thr | (best << shift)
    n_gt = tl.zeros([], dtype=tl.int32)
    for c0 in range(0, n, CHUNK):
        c = c0 + offs
        keys = tl.load(cand_key + base + c, mask=_written(c, n, row_bad, kv_len, topk, SPLIT, TOPK_P2), other=0)
        n_gt += tl.sum((keys > thr).to(tl.int32), axis=0)
    k_rem = k - n_gt

    o_row = out + t * s_o_r
    taken = tl.zeros([], dtype=tl.int32)
    eq_seen = tl.zeros([], dtype=tl.int32)
    if poison == 0:
        for c0 in range(0, n, CHUNK):
            c = c0 + offs
            valid = _written(c, n, row_bad, kv_len, topk, SPLIT, TOPK_P2)
            keys = tl.load(cand_key + base + c, mask=valid, other=0)
            pos = tl.load(cand_pos + base + c, mask=valid, other=0)
            eq = keys == thr
            eq_rank = eq_seen + tl.cumsum(eq.to(tl.int32), 0) - 1
            take = ((keys > thr) | (eq & (eq_rank < k_rem))) & (keys != 0)
            slot = taken + tl.cumsum(take.to(tl.int32), 0) - 1
            tl.store(o_row + slot, pos, mask=take)
            taken += tl.sum(take.to(tl.int32), axis=0)
            eq_seen += tl.sum(eq.to(tl.int32), axis=0)
    fill = tl.where(poison, -2, -1)
    for j0 in range(0, topk, CHUNK):
        j = j0 + offs
        tl.store(o_row + j, tl.zeros([CHUNK], dtype=tl.int32) + fill, mask=(j < topk) & ((j >= taken) | poison))
