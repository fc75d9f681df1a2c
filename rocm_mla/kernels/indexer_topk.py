"""Triton bodies of mla_indexer_topk (wrapper: rocm_mla/ops/indexer_topk.py; reference:
rocm_mla/reference/indexer_topk.py).

The lightning indexer of sparse MLA (DeepSeek-V3.2, GLM-5.x) scores every key a query row sees,

    logit(t, j) = sum_h weights[t, h] x relu(q[t, h] . k_j),    k_j = fp8 row j x its float32 scale,

and keeps the ``topk`` largest as request-local positions. No logits matrix is written: the
persistent programs of ``mla_indexer_split_topk_kernel`` take (row, split) items in turn; a
program scores one split of SPLIT keys into its own stage row of the workspace (bounded by the
grid, not by the rows or the context), holds the stage in registers to find the split's
threshold, and keeps the split's top-k: with one split per row it writes the row's answer,
otherwise the split's candidates (order keys and positions, ``[T, S, TOPK_P2]``), which
``mla_indexer_merge_kernel`` reduces to the row's answer. Calls of few items take the prefiltered
form: the split kernel (RANKS) keeps each item's order keys in a stage row of its own and writes
rank bounds of them, ``mla_indexer_prefilter_kernel`` keeps each split's keys at or above its
row's floor, and the merge selects among the kept keys.

Selection is exact, on order keys (a float's bits mapped so that unsigned order is float order; 0
marks "no key"): the k-th largest key is found bit by bit from the top (keep a bit while >= k keys
stay at or above the threshold; rocm_mla/kernels/indexer_select.py), every larger key is taken,
and keys equal to it in position order until k are taken. So the answer is the selected positions
in ascending order, whatever the split size or grid: deterministic and independent of the batch.

The cache's values are read as q's fp8 kind, or (OCP_CACHE) as OCP e4m3fn codes under an e4m3fnuz
q -- DeepSeek-V4's compressed indexer cache in vLLM is e4m3fn on every platform -- turned in
registers into the e4m3fnuz codes of half their values (kernels/fp8_codes.py), with the scales
doubled: the same logits, and the dot stays an fp8 MFMA of q's kind.

DeepSeek-V4.1's two-level indexer (CAND): a pass over an item's staged keys either drops the keys
outside the row's listed candidate blocks (a bitmap ``mla_indexer_candidate_mask_kernel`` made) or
writes each block's largest key, from which ``mla_indexer_candidate_select_kernel`` takes the row's
best blocks with the same exact search.

NaN and bad values are never dropped silently: a NaN logit (NaN in q, weights, a key or its scale)
maps to the largest order key, so it is always selected, and a row whose selection holds one
writes the bad-row sentinel (every entry -2), which mla_sparse_attention turns into a NaN row.
A block-table entry outside [0, num_pages) among the row's visible keys scores NaN (nothing is read
for it); a row whose request or kv_len is out of range writes the sentinel without reading, and
so does a row with more keys than the call's splits cover (its plan's max_kv_len).
"""

import triton
import triton.language as tl

from .fp8_codes import fp8_e4m3fn_to_fnuz_half
from .indexer_select import (
    _bound_rank,
    _dense_slots,
    _fill_tail,
    _rank_bounds,
    _select_in_registers,
    _select_packed,
    _select_passes,
    _slots,
    _take_step,
    _threshold_flat,
    _written,
)
from .latent_core import page_and_offset


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
def _second(a, b):
    return b


@triton.jit
def _fnuz_half_codes(words, SHAPE: tl.constexpr):
    """uint32 words of e4m3fn codes (``[R, W]`` or ``[R, W / 4, 4]``) -> their bytes as ``SHAPE``
    ``[R, 4 W]`` uint8 in memory order (byte k of word j at 4 j + k, little-endian), each the
    e4m3fnuz code of half its value (``fp8_e4m3fn_to_fnuz_half``), computed in the layout the
    load gave: a thread converts only the words it loaded.

    The closing scan is the identity (each element its own value) and compiles to nothing; it
    keeps Triton from hoisting the dot operand's layout conversion above the conversion of the
    codes, where every warp would convert the whole tile (4x the work a thread and about 60 more
    VGPRs on gfx942)."""
    r = fp8_e4m3fn_to_fnuz_half(words)
    b0 = (r & 0xFF).to(tl.uint8)
    b1 = ((r >> 8) & 0xFF).to(tl.uint8)
    b2 = ((r >> 16) & 0xFF).to(tl.uint8)
    b3 = (r >> 24).to(tl.uint8)
    # join adds a last axis: [..., j, i] = byte 2 j + i of the word
    codes = tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), SHAPE)
    return tl.associative_scan(codes, 1, _second)


@triton.jit
def _ocp_key_tile(
    cache, base, off, ok, D: tl.constexpr, BLOCK_N: tl.constexpr, SHUFFLED: tl.constexpr, PAGE_TILE: tl.constexpr
):
    """``[BLOCK_N, D]`` uint8: a key tile of an e4m3fn cache as the e4m3fnuz codes of half its values
    (``_fnuz_half_codes``). Key n is row ``off[n]`` of the page at byte ``base`` (one scalar with
    PAGE_TILE, else ``base[n]``), its values flat or SHUFFLED as ``_key_tile`` reads them; keys
    not ``ok`` read nothing (their codes undefined). The bytes come as 4-byte words through word
    pointers (the cache's blocks are 4-byte aligned): a thread's load stays one 16-byte vector.
    Shuffled, the words are loaded token-major ([BLOCK_N, D / 16, 4]), so that the converted codes
    reach the dot in the flat form's layout; a wave still reads the same 128-byte runs."""
    if SHUFFLED:
        dt = tl.arange(0, D // 16)
        tile = (off[:, None, None] // 16) * (16 * D) + dt[None, :, None] * 256 + (off[:, None, None] % 16) * 16
        if PAGE_TILE:
            p3 = (cache + base + tile).to(tl.pointer_type(tl.uint32))
        else:
            p3 = (cache + base[:, None, None] + tile).to(tl.pointer_type(tl.uint32))
        words = tl.load(p3 + tl.arange(0, 4)[None, None, :], mask=ok[:, None, None])  # [BLOCK_N, D / 16, 4]
    else:
        rows = (cache + base[:, None] + off[:, None] * D).to(tl.pointer_type(tl.uint32))
        words = tl.load(rows + tl.arange(0, D // 4)[None, :], mask=ok[:, None])  # [BLOCK_N, D / 4]
    return _fnuz_half_codes(words, (BLOCK_N, D))


@triton.jit
def _listed(bits_row, pos, live, CBS: tl.constexpr):
    """Whether positions ``pos`` lie in a listed candidate block: bit ``pos // CBS`` of the row's
    bitmap (``bits_row``: a flag word, then the bits; ``mla_indexer_candidate_mask_kernel``)."""
    blk = pos // CBS
    word = tl.load(bits_row + 1 + blk // 32, mask=live, other=0)
    return live & (((word >> (blk % 32)) & 1) != 0)


@triton.jit
def _candidate_pass(stage_row, cand_row, n, lo, n_keys, CHUNK: tl.constexpr, CAND: tl.constexpr, CBS: tl.constexpr):
    """An item's candidate blocks over its n staged order keys (positions lo ..): CAND 1, a key
    outside the row's listed blocks (``cand_row``: its flag word, then its bitmap; ``_listed``)
    becomes no key (0), and every key of a row whose flag is set (a bad list) the NaN key; CAND 2,
    each of the item's blocks' largest key goes to ``cand_row`` (its block's word), the row's
    newest block (the one holding position n_keys - 1) as the NaN key. The item starts on a
    block (CBS divides SPLIT and CHUNK), so each chunk holds CHUNK / CBS whole blocks."""
    offs = tl.arange(0, CHUNK)
    if CAND == 1:
        list_bad = tl.load(cand_row) != 0
    for c0 in range(0, n, CHUNK):
        c = c0 + offs
        live = c < n
        key = tl.load(stage_row + c, mask=live, other=0)
        if CAND == 1:
            key = tl.where(list_bad, 0xFFFFFFFF, tl.where(_listed(cand_row, lo + c, live, CBS), key, 0))
            tl.store(stage_row + c, key, mask=live)
        else:
            bkey = tl.max(tl.reshape(key, [CHUNK // CBS, CBS]), axis=1)
            b = (lo + c0) // CBS + tl.arange(0, CHUNK // CBS)
            bkey = tl.where(b == (n_keys - 1) // CBS, 0xFFFFFFFF, bkey)
            tl.store(cand_row.to(tl.pointer_type(tl.uint32)) + b, bkey, mask=b * CBS < lo + n)


@triton.jit
def _key_tile(
    cache, bt_row, p0, hi, page_size, page_shift, num_pages, s_c_blk, kind,
    D: tl.constexpr, BLOCK_N: tl.constexpr, POW2_PAGE: tl.constexpr, SHUFFLED: tl.constexpr,
    PAGE_TILE: tl.constexpr, OCP_CACHE: tl.constexpr,
):  # fmt: skip
    """``[BLOCK_N, D]`` fp8 of ``kind`` (q's): the values of keys [p0, p0 + BLOCK_N) of the table row
    ``bt_row``; keys at or past hi, or on a page outside [0, num_pages), read nothing (their
    values undefined: their logits are not kept, and the scale pass scores a bad page NaN).
    OCP_CACHE: ``cache`` holds e4m3fn bytes (uint8) and q is e4m3fnuz: the codes become the
    e4m3fnuz codes of half the keys' values (``_ocp_key_tile``), so the logits are half the keys'
    and the scale pass doubles the scales."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    pos = p0 + offs_n
    live = pos < hi
    if PAGE_TILE:
        # A tile lies in one page (page_size a multiple of BLOCK_N, tiles aligned): one scalar
        # page id a tile, so no load address waits on a gathered vector.
        blk0, off0 = page_and_offset(p0, page_size, page_shift, POW2_PAGE)
        page = tl.load(bt_row + blk0, mask=p0 < hi, other=0)
        off = off0 + offs_n
        ok = live & (page.to(tl.uint32) < num_pages.to(tl.uint32))
    else:
        blk, off = page_and_offset(pos, page_size, page_shift, POW2_PAGE)
        page = tl.load(bt_row + blk, mask=live, other=0)
        ok = live & (page.to(tl.uint32) < num_pages.to(tl.uint32))
    base = page.to(tl.int64) * s_c_blk
    if OCP_CACHE:
        kr = _ocp_key_tile(cache, base, off, ok, D, BLOCK_N, SHUFFLED, PAGE_TILE).to(kind, bitcast=True)
    elif SHUFFLED:
        # 16 x 16 tiles of (token, byte): token-tile, byte-tile, token, byte. Loaded as [D / 16,
        # BLOCK_N, 16] (byte-tile, token, byte) so that a thread's 16 bytes are one token's
        # byte-tile and neighbouring lanes take neighbouring tokens: each group of 8 lanes (one
        # 128-bit transaction) then reads 128 contiguous bytes. In the [BLOCK_N, D] form those
        # lanes take one token's 8 byte-tiles, 256 bytes apart, and every sector is fetched twice.
        dt = tl.arange(0, D // 16)
        b16 = tl.arange(0, 16)
        col3 = (
            (off[None, :, None] // 16) * (16 * D)
            + dt[:, None, None] * 256
            + (off[None, :, None] % 16) * 16
            + b16[None, None, :]
        )
        if PAGE_TILE:
            k3 = tl.load(cache + base + col3, mask=ok[None, :, None])
        else:
            k3 = tl.load(cache + base[None, :, None] + col3, mask=ok[None, :, None])
        kr = tl.reshape(tl.permute(k3, (1, 0, 2)), (BLOCK_N, D))  # [BLOCK_N, D] fp8
    else:
        col = off[:, None] * D + offs_d[None, :]
        kr = tl.load(cache + base[:, None] + col, mask=ok[:, None])  # [BLOCK_N, D] fp8
    return kr


@triton.jit
def _tile_logits(
    kr, qt_t, w_h, h_ok, stage_row, i, p0, hi, H: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr
):
    """One row's raw logits (before the keys' scales) of the key tile ``kr`` (keys p0 ..) into tile
    i of its stage row (a float32 view of the uint32 words), those of keys below hi only."""
    offs_n = tl.arange(0, BLOCK_N)
    s = tl.dot(kr, qt_t)  # [BLOCK_N, BLOCK_H] float32
    if BLOCK_H > H:
        s = tl.where(h_ok[None, :], s, 0.0)
    # relu that keeps NaN (a NaN product must reach the logit)
    lg = tl.sum(w_h[None, :] * tl.where(s < 0.0, 0.0, s), axis=1)
    tl.store(stage_row.to(tl.pointer_type(tl.float32)) + i * BLOCK_N + offs_n, lg, mask=p0 + offs_n < hi)


@triton.jit
def _in_rows(t0, r: tl.constexpr, num_rows):
    """Whether row t0 + r of a group is below T (row 0 of a work item's group always is: a constant)."""
    if r == 0:
        return True
    else:
        return t0 + r < num_rows


@triton.jit
def _group_row(t0, r: tl.constexpr, num_rows):
    """Row t0 + r of a group, or row 0 (a row to read, whose results are not kept) past T."""
    if r == 0:
        return t0
    else:
        return tl.where(t0 + r < num_rows, t0 + r, 0)


@triton.jit
def _leads(oks, reqs, p: tl.constexpr):
    """Whether row p of a group leads a pass: it is below T and no earlier row of the group has its
    request. Row 0 always does (a constant: the single-row form keeps no check)."""
    if p == 0:
        return True
    else:
        lead = oks[p]
        for e in tl.static_range(p):
            lead = lead & (reqs[e] != reqs[p])
        return lead


@triton.jit
def _finish_row(
    t, split, lo, row_bad, kv_len, stage_row, bt_row, cache, stage, out, cand_key, cand_pos, bounds,
    num_rows, num_splits, topk, page_size, page_shift, num_pages, s_c_blk, s_o_r,
    D: tl.constexpr, SPLIT: tl.constexpr, TOPK_P2: tl.constexpr, DIRECT: tl.constexpr, POW2_PAGE: tl.constexpr,
    CHUNK: tl.constexpr, SELECT_PACK: tl.constexpr, RANKS: tl.constexpr, OCP_CACHE: tl.constexpr,
    CAND: tl.constexpr, CBS: tl.constexpr, G: tl.constexpr,
):  # fmt: skip
    """Row t's split after its raw logits are staged (``stage_row``, keys lo ..): the keys' scales
    and order keys, the candidate blocks' pass, then its bounds (prefiltered) or its top-k
    (``mla_indexer_split_topk_kernel``'s outputs). The merge reads only a row's live splits (one
    for a bad row): a dead split does nothing (prefiltered: it writes zero bounds)."""
    offs_c = tl.arange(0, CHUNK)
    offs_s = tl.arange(0, SPLIT)
    n_keys = tl.where(row_bad, 0, kv_len)
    hi = tl.minimum(lo + SPLIT, n_keys)
    stage_f32 = stage_row.to(tl.pointer_type(tl.float32))  # the same words: raw logits, then keys
    if DIRECT | (lo < hi) | (row_bad & (split == 0)) | (RANKS > 0):
        # The keys' scales (> 0, so they commute with the relu) in a pass of their own: a
        # load in the dot loop would wait in every tile, while here a chunk's gathers are
        # all in flight at once. A key of a bad page scores NaN. Each thread rewrites what
        # it read, as order keys.
        n = tl.maximum(hi - lo, 0)
        for c0 in range(0, n, CHUNK):
            c = c0 + offs_c
            live = c < n
            blk, off = page_and_offset(lo + c, page_size, page_shift, POW2_PAGE)
            page = tl.load(bt_row + blk, mask=live, other=0)
            ok = live & (page.to(tl.uint32) < num_pages.to(tl.uint32))
            sc_ptr = (cache + page.to(tl.int64) * s_c_blk + page_size * D + off * 4).to(tl.pointer_type(tl.float32))
            scale = tl.load(sc_ptr, mask=ok, other=0.0)
            if OCP_CACHE:
                scale = scale * 2.0  # the values were read at half (exact: a power of two)
            lg = tl.where(ok, tl.load(stage_f32 + c, mask=live, other=0.0) * scale, float("nan"))
            tl.store(stage_row + c, _order_key(lg), mask=live)
        tl.debug_barrier()
        if CAND > 0:
            # The candidate blocks in a pass of their own over the staged keys, after the dot
            # and scale loops, and the candidate part's address derived here, not passed: in
            # those loops the extra addresses cost scalar registers that gfx942's OCP form
            # does not have (it spilled).
            if RANKS > 0:
                cand_part = stage + num_rows.to(tl.int64) * num_splits * SPLIT
            else:
                cand_part = stage + tl.num_programs(0).to(tl.int64) * G * SPLIT
            if CAND == 1:
                row_words = 1 + tl.cdiv(num_splits * (SPLIT // CBS), 32)
            else:
                row_words = num_splits * (SPLIT // CBS)
            _candidate_pass(stage_row, cand_part + t * row_words, n, lo, n_keys, CHUNK, CAND, CBS)
            tl.debug_barrier()

        if RANKS > 0:
            # Prefiltered: the item's stage row stays for the prefilter; only its bounds here.
            held = tl.where(offs_s < n, tl.load(stage_row + offs_s), 0)  # (the stage has SPLIT words)
            tl.store(
                bounds.to(tl.pointer_type(tl.uint32)) + (t * num_splits + split) * RANKS + tl.arange(0, RANKS),
                _rank_bounds(held, SPLIT, RANKS),
            )
        else:
            # The split's top-k: its threshold from the stage held in registers (only here, not
            # in the dot loop), then the taken keys streamed in stage order.
            if SELECT_PACK == 1:
                held = tl.where(offs_s < n, tl.load(stage_row + offs_s), 0)  # (the stage has SPLIT words)
                n_valid, nan, thr, k_rem = _select_in_registers(held, topk)
            else:  # fewer registers held through the search (more programs a CU)
                n_valid, nan, thr, k_rem = _select_packed(stage_row, n, topk, SPLIT, SELECT_PACK)
            poison = row_bad | nan  # a NaN key is the largest, so always among the taken
            o_row = out + t * s_o_r
            c_row = (t * num_splits + split) * TOPK_P2
            taken = tl.zeros([], dtype=tl.int32)
            eq_seen = tl.zeros([], dtype=tl.int32)
            if (poison == 0) | (DIRECT == 0):
                for c0 in range(0, n, CHUNK):
                    c = c0 + offs_c
                    keys = tl.load(stage_row + c, mask=c < n, other=0)
                    take, slot, taken, eq_seen = _take_step(keys, thr, k_rem, taken, eq_seen)
                    if DIRECT:
                        tl.store(o_row + slot, lo + c, mask=take)
                    else:
                        tl.store(cand_key + c_row + slot, keys, mask=take)
                        tl.store(cand_pos + c_row + slot, lo + c, mask=take)
            if DIRECT:
                _fill_tail(o_row, topk, taken, poison, CHUNK)
            elif row_bad:
                tl.store(cand_key + c_row, 0xFFFFFFFF)
            elif CAND == 1:
                # The merge reads min(topk, the split's keys) slots: those the mask left
                # empty hold no key (0), not a stale one.
                m = tl.minimum(topk, n)
                for j0 in range(0, m, CHUNK):
                    j = j0 + offs_c
                    tl.store(cand_key + c_row + j, tl.zeros([CHUNK], dtype=tl.uint32), mask=(j >= taken) & (j < m))
        tl.debug_barrier()  # every thread has read the stage before the next item rewrites it


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
    stage,
    bounds,
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
    PAGE_TILE: tl.constexpr,
    STREAMS: tl.constexpr,
    CHUNK: tl.constexpr,
    SELECT_PACK: tl.constexpr,
    RANKS: tl.constexpr,
    OCP_CACHE: tl.constexpr,
    CAND: tl.constexpr,
    CBS: tl.constexpr,
    G: tl.constexpr,
):
    """A persistent program: work items (group g, split s) = pid, pid + grid, ... of cdiv(T, G) x
    num_splits, each the logits of keys [s x SPLIT, (s + 1) x SPLIT) for each of the G rows g x G
    .. (those below T), to the row's kv_len, and their top ``topk`` per row. The group's rows of
    one request (MTP rows, prefill rows) are scored from the same key tiles: each key is read
    once for them all.

    The logits loop keeps no per-key state in registers: each tile's order keys go to the
    program's own ``stage`` rows (SPLIT uint32 a row, rewritten by every item, so they stay in L2), and
    the selection reads them back once the split is scored. That keeps the loop's registers
    small enough for several programs a CU, whose loads hide each other's latency.

    q [T, H, D] fp8 (any row/head strides, last dim contiguous), weights [T, H] float32, cache
    [num_pages, page_size, D + 4] bytes viewed as q's fp8 kind (OCP_CACHE: uint8 holding e4m3fn
    values, q e4m3fnuz; ``_key_tile`` turns them into q's kind), pages s_c_blk bytes apart:
    page_size x D fp8 values (row by row, or SHUFFLED in 16 x 16 tiles: rocm_mla/reference/
    indexer.py), then page_size float32 scales. block_table [B, max_blocks] int32, req_ids [T],
    kv_lens [T] int32; capacity = max_blocks x page_size. stage [grid, G, SPLIT] int32. DIRECT (one
    split per row): out [T, topk] int32 (row stride s_o_r): the positions, -1 past the row's keys,
    -2 (reference.indexer_topk.SENTINEL) everywhere for a bad row. Otherwise cand_key / cand_pos
    [T, num_splits, TOPK_P2] (contiguous): the split's selected order keys and positions in slots
    [0, n), the rest not written; the NaN key 0xFFFFFFFF in slot 0 marks a bad row.

    RANKS > 0 (prefiltered, ``mla_indexer_prefilter_kernel`` then the merge follow): stage is
    ``[T x num_splits, SPLIT]``, a row per (row, split), which keeps the item's order keys (its first n
    words) for the prefilter, and ``bounds [T x num_splits, RANKS]`` gets the item's
    ``_rank_bounds`` (zeros for a split past the row's keys or a bad row); no selection here.

    Candidate blocks (blocks of CBS positions; the workspace's ``[T, row_words]`` int32 right
    after the stages, ``IndexerTopkPlan.candidate_layout``): CAND 1, the
    row's bitmap (``mla_indexer_candidate_mask_kernel``): a key outside the listed blocks is no
    key (its bytes are still read), and a row whose flag word is set (its list held an entry < -1)
    scores every key NaN, so it gets the bad-row sentinel. CAND 2: each block's largest order
    key of the row's keys (the unmasked logits) goes to its word, the row's newest block (the one
    holding position kv_len - 1) as the NaN key, for ``mla_indexer_candidate_select_kernel``.
    """
    tl.static_assert((RANKS == 0) | (G == 1), "a prefiltered call scores a row an item")
    cand_key = cand_key.to(tl.pointer_type(tl.uint32))  # int32 workspaces holding uint32 keys
    pid = tl.program_id(0)
    stage_u32 = stage.to(tl.pointer_type(tl.uint32))

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    h_ok = offs_h < H
    num_groups = tl.cdiv(num_rows, G)
    for w in range(pid, num_groups * num_splits, tl.num_programs(0)):
        split = w % num_splits
        t0 = (w // num_splits).to(tl.int64) * G
        lo = split * SPLIT
        # The group's rows (G consecutive rows; a row past T reads row 0's and stores nothing):
        # their q tiles and weights, held for the passes below.
        qts = ()
        whs = ()
        for r in tl.static_range(G):
            t_u = _group_row(t0, r, num_rows)
            # fp8 loads take no `other` (the CPU interpreter cannot make an e4m3fnuz constant):
            # padded heads' scores are zeroed in _tile_logits.
            qt = tl.load(q + t_u * s_q_r + offs_h[:, None] * s_q_h + offs_d[None, :], mask=h_ok[:, None])
            qts = qts + (tl.trans(qt),)  # [D, BLOCK_H]: the keys are the dot's rows (M = BLOCK_N)
            whs = whs + (tl.load(weights + t_u * s_w_r + offs_h * s_w_h, mask=h_ok, other=0.0),)
        if RANKS > 0:  # the item's stage row (the plan never groups a prefiltered call)
            stage0 = stage_u32 + (t0 * num_splits + split) * SPLIT
            s_stage = num_splits * SPLIT
        else:  # the program's G stage rows
            stage0 = stage_u32 + pid.to(tl.int64) * G * SPLIT
            s_stage = SPLIT
        # A pass a request among the group's rows (one when they are one request's, as MTP rows
        # are): its rows' logits from the same key tiles, each row's own dot and sum, so a row's
        # logits are the same bits in any group. Row p leads a pass unless an earlier row of the
        # group has its request; rows of another request wait for their own pass.
        for p in tl.static_range(G):
            # The group's requests, key counts and key ends, read for each pass, so that only the
            # pass's own values stay live through its loop (scalar registers are short on gfx942).
            reqs = ()
            kvls = ()
            bads = ()
            his = ()
            oks = ()
            for r in tl.static_range(G):
                ok_u = _in_rows(t0, r, num_rows)
                t_u = _group_row(t0, r, num_rows)
                req_u, kv_len_u, bad_u = _row(
                    req_ids, kv_lens, t_u, s_req, s_kl, num_reqs, capacity, num_splits * SPLIT
                )  # fmt: skip
                reqs = reqs + (req_u,)
                kvls = kvls + (kv_len_u,)
                bads = bads + (bad_u,)
                oks = oks + (ok_u,)
                his = his + (tl.minimum(lo + SPLIT, tl.where(ok_u & (bad_u == 0), kv_len_u, 0)),)
            if _leads(oks, reqs, p):
                # (the leader's keys end: its own; a member's: its own, a non-member's: none)
                hi_pass = his[p]
                ends = ()
                for mb in tl.static_range(G):
                    if mb > p:
                        mem = oks[mb] & (reqs[mb] == reqs[p])
                        hi_pass = tl.where(mem, tl.maximum(hi_pass, his[mb]), hi_pass)
                        ends = ends + (tl.where(mem, his[mb], lo),)
                    else:
                        ends = ends + (his[mb],)
                req_ok = (reqs[p] >= 0) & (reqs[p] < num_reqs)
                bt_row = block_table + tl.where(req_ok, reqs[p], 0).to(tl.int64) * s_bt_b
                for i in range(0, tl.cdiv(hi_pass - lo, BLOCK_N * STREAMS)):
                    # STREAMS adjacent tiles a step: their copies are independent, so the software
                    # pipeline keeps STREAMS tiles in flight where one tile's page id -> key chain
                    # would otherwise leave one.
                    for v in tl.static_range(STREAMS):
                        p0 = lo + (i * STREAMS + v) * BLOCK_N
                        kr = _key_tile(
                            cache, bt_row, p0, hi_pass, page_size, page_shift, num_pages, s_c_blk, qts[0].dtype,
                            D, BLOCK_N, POW2_PAGE, SHUFFLED, PAGE_TILE, OCP_CACHE,
                        )  # fmt: skip
                        for mb in tl.static_range(p, G):
                            _tile_logits(
                                kr, qts[mb], whs[mb], h_ok, stage0 + mb * s_stage, i * STREAMS + v, p0, ends[mb],
                                H, BLOCK_H, BLOCK_N,
                            )  # fmt: skip
                tl.debug_barrier()  # the stage, written by the dot's threads, read by all
                # The leader's row, then the group's later rows of its request.
                _finish_row(
                    t0 + p, split, lo, bads[p], kvls[p], stage0 + p * s_stage, bt_row, cache, stage, out, cand_key,
                    cand_pos, bounds, num_rows, num_splits, topk, page_size, page_shift, num_pages, s_c_blk, s_o_r,
                    D, SPLIT, TOPK_P2, DIRECT, POW2_PAGE, CHUNK, SELECT_PACK, RANKS, OCP_CACHE, CAND, CBS, G,
                )  # fmt: skip
                for u in range(p + 1, G):
                    t = t0 + u
                    req, kv_len, row_bad = _row(
                        req_ids, kv_lens, tl.where(t < num_rows, t, 0), s_req, s_kl, num_reqs, capacity,
                        num_splits * SPLIT,
                    )  # fmt: skip
                    if (t < num_rows) & (req == reqs[p]):
                        _finish_row(
                            t, split, lo, row_bad, kv_len, stage0 + u * s_stage, bt_row, cache, stage, out, cand_key,
                            cand_pos, bounds, num_rows, num_splits, topk, page_size, page_shift, num_pages, s_c_blk,
                            s_o_r, D, SPLIT, TOPK_P2, DIRECT, POW2_PAGE, CHUNK, SELECT_PACK, RANKS, OCP_CACHE, CAND,
                            CBS, G,
                        )  # fmt: skip


@triton.jit(do_not_specialize=["num_rows", "num_splits", "topk", "capacity", "num_reqs"])
def mla_indexer_prefilter_kernel(
    stage,
    bounds,
    counts,
    cand_pos,
    req_ids,
    kv_lens,
    num_rows,
    num_splits,
    topk,
    capacity,
    num_reqs,
    s_req,
    s_kl,
    SPLIT: tl.constexpr,
    RANKS: tl.constexpr,
    S_P2: tl.constexpr,
):
    """Program w = (row t, split s) of a prefiltered call, after ``mla_indexer_split_topk_kernel``
    (RANKS > 0) wrote every item's order keys (``stage [T x num_splits, SPLIT]``) and bounds.

    The row's floor: split s's bound j says it holds at least ``_bound_rank(j)`` keys at or above
    it, so a value v has at least G(v) = sum over the row's bounds >= v of their rank increments
    keys at or above it; the floor is the largest v with G(v) >= k = min(topk, kv_len) (0 when
    none: every key stays), found bit by bit over the row's num_splits x RANKS bounds. Every key
    of the row's top-k is at or above it. Each split keeps the keys at or above the floor, in
    position order, at the front of its own stage row (``counts[w]`` of them, their positions in
    ``cand_pos [T x num_splits, SPLIT]``). A split holds fewer than twice its share of G at the
    floor plus its smallest rank, so the kept keys stay near 2 x topk whatever the data, ties
    aside. Every program computes its row's floor from the same bounds: the same value."""
    stage_u32 = stage.to(tl.pointer_type(tl.uint32))  # int32 workspaces holding uint32 keys
    bounds_u32 = bounds.to(tl.pointer_type(tl.uint32))
    w = tl.program_id(0).to(tl.int64)
    t = w // num_splits
    split = w % num_splits
    req, kv_len, row_bad = _row(req_ids, kv_lens, t, s_req, s_kl, num_reqs, capacity, num_splits * SPLIT)
    n_keys = tl.where(row_bad, 0, kv_len)
    k = tl.minimum(topk, n_keys)
    offs_b = tl.arange(0, S_P2 * RANKS)
    b = tl.load(bounds_u32 + t * num_splits * RANKS + offs_b, mask=offs_b < num_splits * RANKS, other=0)
    jb = offs_b % RANKS
    weight = _bound_rank(jb, SPLIT, RANKS) - _bound_rank(jb - 1, SPLIT, RANKS)
    floor = tl.zeros([], dtype=tl.uint32)
    for bit in range(32):
        cand = floor | (tl.full([], 0x80000000, tl.uint32) >> (tl.zeros([], tl.uint32) + bit))
        floor = tl.where(tl.sum(tl.where(b >= cand, weight, 0), axis=0) >= k, cand, floor)

    n = tl.minimum(tl.maximum(n_keys - split * SPLIT, 0), SPLIT)
    offs = tl.arange(0, SPLIT)
    row = stage_u32 + w * SPLIT
    keys = tl.where(offs < n, tl.load(row + offs), 0)  # (the row has SPLIT words)
    take = (keys >= floor) & (keys != 0)
    slot = tl.cumsum(take.to(tl.int32), 0) - 1
    tl.debug_barrier()  # every thread has read the row before it is rewritten in place
    tl.store(row + slot, keys, mask=take)
    tl.store(cand_pos + w * SPLIT + slot, split * SPLIT + offs, mask=take)
    tl.store(counts + w, tl.sum(take.to(tl.int32), axis=0))


@triton.jit
def _merge_held(
    cand_key, cand_pos, o_row, n, topk, row_bad, base, prefix_row, counts_row, SPLIT: tl.constexpr,
    REG: tl.constexpr, PER: tl.constexpr, S_P2: tl.constexpr, S_LOG: tl.constexpr,
):  # fmt: skip
    """(poison, taken) of a prefiltered row whose n <= REG kept keys are gathered into registers
    once, through the prefix's search (``_dense_slots``): the threshold and the take both read
    them there, so no chunked re-gather repeats that search. The same slots, order and answer as
    ``_merge_chunked``.

    Held as ``[PER, REG // PER]`` (PER = REG / the program's threads), column j the slots j x PER
    .. j x PER + PER - 1, so that under the default layout a thread holds a whole column: the
    slot-order scan is then a sum and a scan within each thread plus one scan of a value a thread
    (a 1-D scan of PER values a thread, strided over the threads, takes 2-3x the registers and
    spills on gfx942)."""
    c = tl.arange(0, PER)[:, None] + tl.arange(0, REG // PER)[None, :] * PER
    rel, valid = _dense_slots(c, n, prefix_row, counts_row, SPLIT, S_P2, S_LOG)
    held = tl.load(cand_key + base + rel, mask=valid, other=0)
    pos = tl.load(cand_pos + base + rel, mask=valid, other=0)  # read with the keys: no address kept
    n_valid, nan, thr, k_rem = _select_in_registers(tl.reshape(held, [REG], can_reorder=True), topk)
    poison = row_bad | nan
    gt = (held > thr) & (held != 0)
    eq = (held == thr) & (held != 0)
    # A slot is taken when > thr or among the first k_rem == thr, so the taken up to it number
    # gt + min(eq, k_rem): one scan counts both (16 bits each: REG < 2**16 slots).
    tl.static_assert(REG < 65536)
    x = eq.to(tl.int32) * 65536 + gt.to(tl.int32)
    col = tl.sum(x, axis=0)
    both = (tl.cumsum(col, 0) - col)[None, :] + tl.cumsum(x, 0)  # inclusive, in slot order
    eq_incl = both >> 16
    take = (gt | (eq & (eq_incl <= k_rem))) & (poison == 0)
    slot = (both & 0xFFFF) + tl.minimum(eq_incl, k_rem) - 1
    tl.store(o_row + slot, pos, mask=take)
    return poison, tl.sum(tl.sum(take.to(tl.int32), axis=0), axis=0)


@triton.jit
def _merge_chunked(
    cand_key, cand_pos, o_row, n, topk, row_bad, kv_len, base, prefix_row, counts_row, SPLIT: tl.constexpr,
    TOPK_P2: tl.constexpr, CHUNK: tl.constexpr, REG: tl.constexpr, S_P2: tl.constexpr, S_LOG: tl.constexpr,
):  # fmt: skip
    """(poison, taken): the row's threshold (REG > 0, the split form: every slot held in
    registers; else by passes over memory), then the taken candidates streamed in slot order,
    CHUNK at a time, into out's row ``o_row``."""
    if REG > 0:
        offs_r = tl.arange(0, REG)
        # Unmasked (the workspace holds REG slots past any row's start; a masked load of many
        # elements a thread costs a lane mask apiece on AMD): slots not written count as no key.
        held = tl.load(cand_key + base + offs_r)
        held = tl.where(_written(offs_r, n, row_bad, kv_len, topk, SPLIT, TOPK_P2), held, 0)
        n_valid, nan, thr, k_rem = _select_in_registers(held, topk)
    else:
        n_valid, nan, thr, k_rem = _select_passes(
            cand_key, n, topk, row_bad, kv_len, base, prefix_row, counts_row, SPLIT, TOPK_P2, S_P2, S_LOG, CHUNK
        )
    poison = row_bad | nan
    offs = tl.arange(0, CHUNK)
    taken = tl.zeros([], dtype=tl.int32)
    eq_seen = tl.zeros([], dtype=tl.int32)
    if poison == 0:
        for c0 in range(0, n, CHUNK):
            c = c0 + offs
            idx, valid = _slots(c, n, row_bad, kv_len, topk, base, prefix_row, counts_row, SPLIT, TOPK_P2, S_P2, S_LOG)
            keys = tl.load(cand_key + idx, mask=valid, other=0)
            pos = tl.load(cand_pos + idx, mask=valid, other=0)
            take, slot, taken, eq_seen = _take_step(keys, thr, k_rem, taken, eq_seen)
            tl.store(o_row + slot, pos, mask=take)
    return poison, taken


@triton.jit(do_not_specialize=["num_rows", "num_splits", "topk", "capacity", "num_reqs"])
def mla_indexer_merge_kernel(
    cand_key,
    cand_pos,
    counts,
    prefix,
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
    REG: tl.constexpr,
    S_P2: tl.constexpr,
    S_LOG: tl.constexpr,
    PER: tl.constexpr,
):
    """Program t: the top ``topk`` of row t's split candidates (``mla_indexer_split_topk_kernel``,
    its live splits only: cdiv(kv_len, SPLIT), one for a bad row); writes out[t] as the DIRECT
    split kernel. The threshold: with REG > 0 (>= num_splits x TOPK_P2) from every slot held in
    registers, else by passes over chunks of CHUNK candidates (four bits a pass); the taken
    candidates then stream in slot order, CHUNK at a time.

    Prefiltered (S_P2 = 2**S_LOG > 0, after ``mla_indexer_prefilter_kernel``): the candidates are
    the kept keys of each split (cand_key: the stage ``[T x num_splits, SPLIT]``, ``counts``
    of them at each row's front), their inclusive prefix goes to ``prefix [T, S_P2]``, and the
    row's slots are dense over it (``_slots``): held in registers when they fit REG, the take
    then read from those registers too (``_merge_held``), else passes."""
    cand_key = cand_key.to(tl.pointer_type(tl.uint32))  # an int32 workspace holding uint32 keys
    t = tl.program_id(0).to(tl.int64)
    req, kv_len, row_bad = _row(req_ids, kv_lens, t, s_req, s_kl, num_reqs, capacity, num_splits * SPLIT)
    if S_P2 > 0:
        base = t * num_splits * SPLIT
        counts_row = counts + t * num_splits
        prefix_row = prefix + t * S_P2
        offs_s = tl.arange(0, S_P2)
        incl = tl.cumsum(tl.load(counts_row + offs_s, mask=offs_s < num_splits, other=0), 0)
        n = tl.max(incl, axis=0)
        tl.store(prefix_row + offs_s, incl)
        tl.debug_barrier()  # the prefix, written by all, is gathered by all
    else:
        base = t * num_splits * TOPK_P2
        counts_row = counts
        prefix_row = prefix
        n = tl.where(row_bad, 1, tl.cdiv(tl.maximum(kv_len, 0), SPLIT)) * TOPK_P2

    # The NaN key (a bad row's mark or a NaN logit) is known before anything is written.
    o_row = out + t * s_o_r
    if (REG > 0) & (S_P2 > 0):
        if n <= REG:  # the usual prefiltered row: its kept keys fit the registers
            poison, taken = _merge_held(
                cand_key, cand_pos, o_row, n, topk, row_bad, base, prefix_row, counts_row, SPLIT, REG, PER, S_P2,
                S_LOG,
            )  # fmt: skip
        else:  # ties at the floor kept more keys than the registers hold
            poison, taken = _merge_chunked(
                cand_key, cand_pos, o_row, n, topk, row_bad, kv_len, base, prefix_row, counts_row, SPLIT, TOPK_P2,
                CHUNK, 0, S_P2, S_LOG,
            )  # fmt: skip
    else:
        poison, taken = _merge_chunked(
            cand_key, cand_pos, o_row, n, topk, row_bad, kv_len, base, prefix_row, counts_row, SPLIT, TOPK_P2,
            CHUNK, REG, S_P2, S_LOG,
        )  # fmt: skip
    _fill_tail(o_row, topk, taken, poison, CHUNK)


@triton.jit(do_not_specialize=["num_cols", "row_words", "s_c_r"])
def mla_indexer_candidate_mask_kernel(candidates, bits, num_cols, row_words, s_c_r, CHUNK: tl.constexpr):
    """Program t: row t's candidate bitmap, before the split kernel (CAND 1). ``candidates [>= T,
    num_cols]`` int32 (row stride s_c_r, column stride 1): block ids, -1 unused; ``bits [T,
    row_words]`` int32: word 0 is 1 when the list holds an entry < -1 (a bad list), else 0; bit
    b of the words after it is set for each listed block b < (row_words - 1) x 32 (an id past
    them covers no key a row may see: nothing is written for it)."""
    t = tl.program_id(0).to(tl.int64)
    row = bits + t * row_words
    offs = tl.arange(0, CHUNK)
    for w0 in range(0, row_words, CHUNK):
        tl.store(row + w0 + offs, tl.zeros([CHUNK], dtype=tl.int32), mask=w0 + offs < row_words)
    tl.debug_barrier()  # the zeros, stored by all, before any thread sets a bit
    bad = tl.zeros([], dtype=tl.int32)
    n_bits = (row_words - 1) * 32
    for c0 in range(0, num_cols, CHUNK):
        c = c0 + offs
        b = tl.load(candidates + t * s_c_r + c, mask=c < num_cols, other=-1)
        bad = tl.maximum(bad, tl.max((b < -1).to(tl.int32), axis=0))
        ok = (b >= 0) & (b < n_bits)
        bb = tl.where(ok, b, 0)
        tl.atomic_or(row + 1 + bb // 32, tl.full([CHUNK], 1, tl.int32) << (bb % 32), mask=ok)
    tl.store(row, bad)


@triton.jit(do_not_specialize=["num_cols", "row_words", "capacity", "max_keys", "num_reqs"])
def mla_indexer_candidate_select_kernel(
    block_keys, req_ids, kv_lens, out, num_cols, row_words, capacity, max_keys, num_reqs, s_req, s_kl, s_o_r,
    CBS: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Program t, after the split kernel (CAND 2) wrote ``block_keys [T, row_words]`` (each of row
    t's cdiv(kv_len, CBS) blocks' largest order key, its newest block the NaN key): out[t]
    (``[num_cols]`` int32, row stride s_o_r) the ids of its min(num_cols, blocks) largest, ties
    by id, in ascending order, then -1; -2 everywhere for a bad row (``_row``)."""
    t = tl.program_id(0).to(tl.int64)
    keys = block_keys.to(tl.pointer_type(tl.uint32)) + t * row_words
    req, kv_len, row_bad = _row(req_ids, kv_lens, t, s_req, s_kl, num_reqs, capacity, max_keys)
    n = tl.where(row_bad, 0, tl.cdiv(tl.maximum(kv_len, 0), CBS))
    k = tl.minimum(num_cols, n)
    thr, k_rem = _threshold_flat(keys, n, k, CHUNK)
    offs = tl.arange(0, CHUNK)
    o_row = out + t * s_o_r
    taken = tl.zeros([], dtype=tl.int32)
    eq_seen = tl.zeros([], dtype=tl.int32)
    for c0 in range(0, n, CHUNK):
        c = c0 + offs
        key = tl.load(keys + c, mask=c < n, other=0)
        take, slot, taken, eq_seen = _take_step(key, thr, k_rem, taken, eq_seen)
        tl.store(o_row + slot, c, mask=take)
    _fill_tail(o_row, num_cols, taken, row_bad, CHUNK)
