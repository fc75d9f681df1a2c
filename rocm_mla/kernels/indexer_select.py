"""Selection helpers of mla_indexer_topk (kernels: rocm_mla/kernels/indexer_topk.py): the k-th
largest of uint32 order keys held in registers (bit by bit, or a digit at a time over packed
words), by passes over candidate slots in memory, the prefiltered form's rank bounds, and where a
row's candidate slots lie.

Order keys: a float's bits mapped so that unsigned order is float order; 0 marks "no key", the
NaN key 0xFFFFFFFF is the largest.
"""

import triton
import triton.language as tl


@triton.jit
def _written(c, n, row_bad, kv_len, topk, SPLIT: tl.constexpr, TOPK_P2: tl.constexpr):
    """Which of the key slots ``c`` (row-relative, [0, n)) hold a key: split ``c // TOPK_P2``
    wrote min(topk, its keys) of its TOPK_P2 slots (one, the mark, for a bad row); the rest are
    stale."""
    sp = c // TOPK_P2
    cnt = tl.where(row_bad, 1, tl.minimum(topk, tl.minimum(kv_len - sp * SPLIT, SPLIT)))
    return (c < n) & ((c % TOPK_P2) < cnt)


@triton.jit
def _slots(
    c, n, row_bad, kv_len, topk, base, prefix_row, counts_row, SPLIT: tl.constexpr, TOPK_P2: tl.constexpr,
    S_P2: tl.constexpr, S_LOG: tl.constexpr,
):  # fmt: skip
    """(index, valid): where a row's candidate slots ``c`` lie in the candidate arrays and whether
    they hold a key. S_P2 0: split s's slots are ``base + s x TOPK_P2 + [0, min(topk, its keys))``
    (``_written``). Prefiltered (S_P2 = 2**S_LOG >= the row's splits): the n slots are dense, split
    s holding ``counts_row[s]`` of them at ``base + s x SPLIT``; ``prefix_row`` holds the counts'
    inclusive prefix (S_P2 entries, the last repeated past the splits) and a binary search finds
    a slot's split."""
    if S_P2 == 0:
        idx = base + c
        valid = _written(c, n, row_bad, kv_len, topk, SPLIT, TOPK_P2)
    else:
        rel, valid = _dense_slots(c, n, prefix_row, counts_row, SPLIT, S_P2, S_LOG)
        idx = base + rel
    return idx, valid


@triton.jit
def _dense_slots(c, n, prefix_row, counts_row, SPLIT: tl.constexpr, S_P2: tl.constexpr, S_LOG: tl.constexpr):
    """(offset from the row's base, int32; valid) of a prefiltered row's slots ``c`` (``_slots``):
    split s holds ``counts_row[s]`` of the n dense slots at offset s x SPLIT; a binary search over
    the counts' inclusive prefix ``prefix_row`` (S_P2 entries) finds a slot's split. A row's
    splits x SPLIT keys fit int32 (its kv_len does)."""
    valid = c < n
    s = tl.zeros_like(c)
    for i in tl.static_range(S_LOG):
        step = S_P2 >> (i + 1)
        s = tl.where(tl.load(prefix_row + s + (step - 1)) <= c, s + step, s)
    end = tl.load(prefix_row + s)  # s < S_P2; for a valid slot end > c
    cnt = tl.load(counts_row + s, mask=valid, other=0)
    return s * SPLIT + tl.where(valid, c - (end - cnt), 0), valid


@triton.jit
def _count_keys(
    keys_ptr, n, row_bad, kv_len, topk, base, prefix_row, counts_row, SPLIT: tl.constexpr, TOPK_P2: tl.constexpr,
    S_P2: tl.constexpr, S_LOG: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """(keys held, whether one is the NaN key 0xFFFFFFFF) over the slots ``_slots`` names."""
    offs = tl.arange(0, CHUNK)
    n_valid = tl.zeros([], dtype=tl.int32)
    nan = tl.zeros([], dtype=tl.int1)
    for c0 in range(0, n, CHUNK):
        idx, valid = _slots(
            c0 + offs, n, row_bad, kv_len, topk, base, prefix_row, counts_row, SPLIT, TOPK_P2, S_P2, S_LOG
        )
        keys = tl.load(keys_ptr + idx, mask=valid, other=0)
        n_valid += tl.sum((keys != 0).to(tl.int32), axis=0)
        nan = nan | (tl.max(keys, axis=0) == 0xFFFFFFFF)
    return n_valid, nan


@triton.jit
def _threshold(
    keys_ptr, n, k, n_valid, row_bad, kv_len, topk, base, prefix_row, counts_row, SPLIT: tl.constexpr,
    TOPK_P2: tl.constexpr, S_P2: tl.constexpr, S_LOG: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """(thr, k_rem) for taking the k largest of the n_valid keys held (k <= n_valid): every key >
    thr and the first k_rem keys == thr in slot order. thr is the k-th largest key, found four
    bits a pass from the top (15 thresholds counted per read of the keys); k = n_valid takes them
    all (thr 0) without a search."""
    offs = tl.arange(0, CHUNK)
    nib = tl.arange(0, 16).to(tl.uint32)
    thr = tl.zeros([], dtype=tl.uint32)
    k_rem = tl.zeros([], dtype=tl.int32)
    if k < n_valid:
        for p in range(8):
            shift = tl.zeros([], tl.uint32) + (28 - 4 * p)
            cands = thr | (nib << shift)  # [16]; nib 0 is thr itself (count >= k holds)
            cnt = tl.zeros([16], dtype=tl.int32)
            for c0 in range(0, n, CHUNK):
                idx, valid = _slots(
                    c0 + offs, n, row_bad, kv_len, topk, base, prefix_row, counts_row, SPLIT, TOPK_P2, S_P2, S_LOG
                )
                keys = tl.load(keys_ptr + idx, mask=valid, other=0)
                cnt += tl.sum((keys[:, None] >= cands[None, :]).to(tl.int32), axis=0)
            best = tl.max(tl.where(cnt >= k, nib, 0), axis=0)
            thr = thr | (best << shift)
        n_gt = tl.zeros([], dtype=tl.int32)
        for c0 in range(0, n, CHUNK):
            idx, valid = _slots(
                c0 + offs, n, row_bad, kv_len, topk, base, prefix_row, counts_row, SPLIT, TOPK_P2, S_P2, S_LOG
            )
            keys = tl.load(keys_ptr + idx, mask=valid, other=0)
            n_gt += tl.sum((keys > thr).to(tl.int32), axis=0)
        k_rem = k - n_gt
    return thr, k_rem


@triton.jit
def _threshold_flat(keys_ptr, n, k, CHUNK: tl.constexpr):
    """``_threshold`` of the n order keys at ``keys_ptr`` (every slot holds a key): (thr, k_rem)
    for taking the k largest (k <= n), four bits a pass over memory."""
    return _threshold(keys_ptr, n, k, n, False, n, n, 0, keys_ptr, keys_ptr, 1 << 30, 1 << 30, 0, 0, CHUNK)


@triton.jit
def _take_step(keys, thr, k_rem, taken, eq_seen):
    """One chunk of the take that follows a threshold search, in slot order: (take, slot, taken,
    eq_seen) -- which of the order ``keys`` are taken (> thr, or among the first k_rem == thr;
    never the no-key 0), where each goes (taken so far + its rank), and the running counts."""
    eq = keys == thr
    eq_rank = eq_seen + tl.cumsum(eq.to(tl.int32), 0) - 1
    take = ((keys > thr) | (eq & (eq_rank < k_rem))) & (keys != 0)
    slot = taken + tl.cumsum(take.to(tl.int32), 0) - 1
    return take, slot, taken + tl.sum(take.to(tl.int32), axis=0), eq_seen + tl.sum(eq.to(tl.int32), axis=0)


@triton.jit
def _fill_tail(o_row, width, taken, poison, CHUNK: tl.constexpr):
    """The end of a row's answer ``o_row [width]``: -1 in the entries past the ``taken`` ones, or,
    for a ``poison`` row, the bad-row sentinel -2 in every entry."""
    offs = tl.arange(0, CHUNK)
    fill = tl.where(poison, -2, -1)
    for j0 in range(0, width, CHUNK):
        j = j0 + offs
        tl.store(o_row + j, tl.zeros([CHUNK], dtype=tl.int32) + fill, mask=(j < width) & ((j >= taken) | poison))


@triton.jit
def _kth_largest(keys, k):
    """The k-th largest of the order keys ``keys`` (a register tensor; 1 <= k <= its nonzero keys;
    k = 0 gives 0xFFFFFFFF), bit by bit from the top: keep each bit whose setting still leaves
    >= k keys at or above the threshold (32 block-wide counts, no memory pass)."""
    thr = tl.zeros([], dtype=tl.uint32)
    for b in range(32):
        cand = thr | (tl.full([], 0x80000000, tl.uint32) >> (tl.zeros([], tl.uint32) + b))
        cnt = tl.sum((keys >= cand).to(tl.int32), axis=0)
        thr = tl.where(cnt >= k, cand, thr)
    return thr


@triton.jit
def _bound_rank(j, SPLIT: tl.constexpr, RANKS: tl.constexpr):
    """The rank of a prefiltered split's bound j: its max(1, SPLIT >> (RANKS - 1 - j))-th largest key
    (doubling up to SPLIT, its smallest); j = -1 gives 0."""
    r = tl.maximum(1, SPLIT >> tl.maximum(RANKS - 1 - j, 0))
    return tl.where(j < 0, 0, r)


@triton.jit
def _rank_bounds(keys, SPLIT: tl.constexpr, RANKS: tl.constexpr):
    """[RANKS] uint32: bound j the ``_bound_rank(j)``-th largest of the order keys ``keys`` (a
    register tensor, 0 = no key), 0 when fewer keys are held; the RANKS searches run together,
    bit by bit from the top."""
    rank = _bound_rank(tl.arange(0, RANKS), SPLIT, RANKS)
    thr = tl.zeros([RANKS], dtype=tl.uint32)
    for b in range(32):
        cand = thr | (tl.full([RANKS], 0x80000000, tl.uint32) >> (tl.zeros([RANKS], tl.uint32) + b))
        cnt = tl.sum((keys[:, None] >= cand[None, :]).to(tl.int32), axis=0)
        thr = tl.where(cnt >= rank, cand, thr)
    return thr


@triton.jit
def _select_in_registers(keys, topk):
    """(n_valid, nan, thr, k_rem) of the order keys ``keys`` held in registers (0 = no key): the
    keys held, whether one is the NaN key, and the ``_threshold`` pair for the top min(topk,
    n_valid)."""
    n_valid = tl.sum((keys != 0).to(tl.int32), axis=0)
    nan = tl.max(keys, axis=0) == 0xFFFFFFFF
    k = tl.minimum(topk, n_valid)
    thr = _kth_largest(keys, k)
    k_rem = k - tl.sum((keys > thr).to(tl.int32), axis=0)
    return n_valid, nan, thr, k_rem


@triton.jit
def _lane_count(packed_h, c, PACK: tl.constexpr):
    """How many digits of ``packed_h`` are >= c (< 2**DB, each lane's top bit set, DB = 32 / PACK
    - 1): c, repeated in every lane, is subtracted from all lanes at once (no lane borrows from the
    next: its top bit covers it), and a lane's top bit survives when its digit is >= c. The lane
    hits are summed two 16-bit lanes to a word."""
    W: tl.constexpr = 32 // PACK
    DB: tl.constexpr = W - 1
    if PACK == 2:
        rep = c | (c << 16)
        t = ((packed_h - rep) >> DB) & 0x00010001
    else:
        rep = c | (c << 8) | (c << 16) | (c << 24)
        d = packed_h - rep
        t = ((d >> 7) & 0x00010001) + ((d >> 15) & 0x00010001)
    tot = tl.sum(t, axis=0)
    return ((tot & 0xFFFF) + (tot >> 16)).to(tl.int32)


@triton.jit
def _select_packed(stage_row, n, topk, SPLIT: tl.constexpr, PACK: tl.constexpr):
    """``_select_in_registers`` of the stage's first n order keys (SPLIT words; the rest count as
    no key) holding SPLIT / PACK words through the search instead of SPLIT: the threshold is
    found a digit of DB = 32 / PACK - 1 bits at a time from the top, each pass re-reading the
    stage and packing PACK keys' digits to a word, one a lane of 32 / PACK bits whose top bit is
    set (``_lane_count``). A key that does not match the digits found so far, and a slot without
    a key, give digit 0, which no count reads: every candidate tried has a set bit. So the result
    is the 32-bit search's: thr the k-th largest key, k_rem what is left of k once every key
    above thr is counted (k = 0: thr 0xFFFFFFFF, k_rem 0)."""
    PART: tl.constexpr = SPLIT // PACK
    W: tl.constexpr = 32 // PACK
    DB: tl.constexpr = W - 1
    PASSES: tl.constexpr = (32 + DB - 1) // DB
    offs = tl.arange(0, PART)
    thr = tl.zeros([], dtype=tl.uint32)
    n_valid = tl.zeros([], dtype=tl.int32)
    top = tl.zeros([], dtype=tl.uint32)
    k = tl.zeros([], dtype=tl.int32)
    for p in tl.static_range(PASSES):
        # digit bits [sh, sh + db) of the key; the bits above them are the threshold's so far
        db = min(DB, 32 - DB * p)
        sh = 32 - DB * p - db
        packed_h = tl.zeros([PART], dtype=tl.uint32)
        for j in tl.static_range(PACK):
            # volatile: a read of its own, not the previous pass's values kept live in registers
            x = tl.where(offs + j * PART < n, tl.load(stage_row + j * PART + offs, volatile=p > 0), 0)
            if p == 0:
                n_valid += tl.sum((x != 0).to(tl.int32), axis=0)
                top = tl.maximum(top, tl.max(x, axis=0))
                d = x >> sh
            else:
                d = tl.where((x >> (sh + db)) == (thr >> (sh + db)), (x >> sh) & ((1 << db) - 1), 0)
            packed_h = packed_h | ((d | (1 << DB)) << (W * j))
        if p == 0:
            k = tl.minimum(topk, n_valid)
        # The k-th largest digit (k = 0: all ones).
        dthr = tl.zeros([], dtype=tl.uint32)
        for b in range(db):
            cand = dthr | (tl.full([], 1 << (db - 1), tl.uint32) >> (tl.zeros([], tl.uint32) + b))
            dthr = tl.where(_lane_count(packed_h, cand, PACK) >= k, cand, dthr)
        k -= _lane_count(packed_h, dthr + 1, PACK)
        thr = thr | (dthr << sh)
    return n_valid, top == 0xFFFFFFFF, thr, k


@triton.jit
def _select_passes(
    cand_key, n, topk, row_bad, kv_len, base, prefix_row, counts_row, SPLIT: tl.constexpr, TOPK_P2: tl.constexpr,
    S_P2: tl.constexpr, S_LOG: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """``_select_in_registers`` of a row's candidate slots by passes over memory, CHUNK at a time."""
    n_valid, nan = _count_keys(
        cand_key, n, row_bad, kv_len, topk, base, prefix_row, counts_row, SPLIT, TOPK_P2, S_P2, S_LOG, CHUNK
    )
    k = tl.minimum(topk, n_valid)
    thr, k_rem = _threshold(
        cand_key, n, k, n_valid, row_bad, kv_len, topk, base, prefix_row, counts_row, SPLIT, TOPK_P2, S_P2, S_LOG, CHUNK
    )
    return n_valid, nan, thr, k_rem
