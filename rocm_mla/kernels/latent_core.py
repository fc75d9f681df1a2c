"""The latent-attention core: the @triton.jit pieces that more than one op's kernels share, each
written once.

Imported by the op kernel files (decode.py, sparse.py, indexer_topk.py) and, for the
split-K reduce, by the op wrappers that launch it (rocm_mla/ops/decode.py, rocm_mla/ops/sparse.py)
and the ISA report's variants. An op's kernel file imports this module and fp8_codes.py, never
another op's kernel file (tests/tools/test_layering.py checks it), so a change to one op's kernel
reaches another only through here.

Holds
    page_and_offset     a request-local position -> (block-table index, row in the page)
    xcd_local_order     hardware program id -> logical id, so neighbours share a die's L2
    qk_scores           s = q_nope . k_nope^T + q_pe . k_pe^T, the 512 columns whole or in two
                        halves, in q's dtype or IEEE float32
    close_split         a finished split's normaliser and base-2 lse (empty and poisoned splits)
    store_partial       one split's normalised partial rows and lse into the workspace
    invariant_split_len the batch-invariant split length (decode stage 1 and the reduce agree on it)
    sink_denominator    a softmax denominator with an attention sink (mla_v4_attention's kernel
                        and the reduce)
    rotate_back         GPT-J inverse RoPE of a tile's RoPE columns (mla_v4_attention's epilogues)
    mla_decode_reduce_kernel
                        the split-K reduce: merges the partials ``[S, rows x N, 512]`` and lses
                        ``[S, rows x N]`` of mla_decode's stage 1, mla_sparse_attention or
                        mla_v4_attention into out and lse (the last with its sink and inverse
                        RoPE)

The workspace layout every split kernel writes and the reduce reads: part_o [S, R, D] float32 (row
stride D, split stride s_po_s) with R = rows x N numbered r = row x N + h, and part_lse [S, R]
float32 (split stride s_pl_s), base-2 lse, -inf where the split saw no key, NaN where it read a bad
index. Split offsets are int64 (S x R x 512 can pass 2^31).
"""

import triton
import triton.language as tl


@triton.jit
def page_and_offset(pos, page_size, page_shift, POW2_PAGE: tl.constexpr):
    """``(block, offset)`` of request-local positions in pages of ``page_size`` tokens: a shift and a
    mask when ``page_size == 1 << page_shift`` (POW2_PAGE), else a division."""
    if POW2_PAGE:
        return pos >> page_shift, pos & (page_size - 1)
    return pos // page_size, pos % page_size


@triton.jit
def xcd_local_order(pid, num_pids, NUM_XCDS: tl.constexpr):
    """Logical program id for hardware id ``pid`` when workgroups are dealt round-robin to
    NUM_XCDS dies (hardware id i runs on die i % NUM_XCDS): die x gets the contiguous logical ids
    [x * per, (x + 1) * per) (one fewer on the dies past ``num_pids % NUM_XCDS``), so programs
    with neighbouring logical ids share an L2. A bijection on [0, num_pids)."""
    per = tl.cdiv(num_pids, NUM_XCDS)
    full = num_pids % NUM_XCDS  # dies that get `per` programs; 0 means all of them
    full = tl.where(full == 0, NUM_XCDS, full)
    xcd = pid % NUM_XCDS
    local = pid // NUM_XCDS
    return tl.where(xcd < full, xcd * per + local, full * per + (xcd - full) * (per - 1) + local)


@triton.jit
def qk_scores(qa, qb, qp, ka_t, kb_t, kp_t, IEEE: tl.constexpr, D_SPLIT: tl.constexpr):
    """The raw scores ``[BLOCK_H, BLOCK_N]`` (float32, unscaled) of a tile:
    ``qa . ka_t (+ qb . kb_t) + qp . kp_t``.

    qa, qb [BLOCK_H, CHUNK]: q_nope's column chunks (qb read only when D_SPLIT == 2; CHUNK =
    512 / D_SPLIT); qp [BLOCK_H, 64]: q_pe. ka_t, kb_t [CHUNK, BLOCK_N]: K^T's chunks; kp_t
    [64, BLOCK_N]: k_pe^T. The operands come in the dtype the dots run in. IEEE: the dots in
    float32 with input_precision="ieee" (float32 q, the CPU interpreter); otherwise the operands'
    own precision (MFMA / tensor cores), accumulating in float32. The chunks' dots are summed in
    column order, so the two D_SPLIT forms are the same sum."""
    if IEEE:
        s = tl.dot(qa, ka_t, input_precision="ieee")
        if D_SPLIT == 2:
            s += tl.dot(qb, kb_t, input_precision="ieee")
        s += tl.dot(qp, kp_t, input_precision="ieee")
    else:
        s = tl.dot(qa, ka_t)
        if D_SPLIT == 2:
            s += tl.dot(qb, kb_t)
        s += tl.dot(qp, kp_t)
    return s


@triton.jit
def close_split(m_i, l_i, osc, poison, FP8_PV: tl.constexpr, LOG2_PMAX: tl.constexpr):
    """``(inv, lse2)`` of a finished split: the factor that normalises its accumulator (NaN when
    ``poison``) and its base-2 lse (-inf when it saw no key; NaN when ``poison``). l_i == 0 only
    when no key was seen; a NaN l_i (a NaN or inf in a used KV row) is kept, so the lse says NaN
    too and the reduce cannot mistake the split for an empty one. FP8_PV: p (and so l_i) was
    scaled by 2^LOG2_PMAX, which the lse takes back."""
    no_key = (l_i == 0.0) & (poison == 0)
    inv = tl.where(poison, float("nan"), osc / tl.where(no_key, 1.0, l_i))[:, None]
    lse2 = tl.where(no_key, float("-inf"), m_i + tl.log2(tl.where(no_key, 1.0, l_i)))
    if FP8_PV:
        lse2 = lse2 - LOG2_PMAX  # l summed p scaled by fmax
    return inv, tl.where(poison, float("nan"), lse2)


@triton.jit
def store_partial(
    part_o,
    part_lse,
    split,
    s_po_s,
    s_pl_s,
    r,
    row_ok,
    own_lse,
    o_a,
    o_b,
    lse2,
    offs_a,
    offs_b,
    D_NOPE: tl.constexpr,
    D_SPLIT: tl.constexpr,
    V_SPLIT: tl.constexpr,
):
    """Writes one split's partial output rows (``o_a`` / ``o_b``: the column chunks at ``offs_a`` /
    ``offs_b``, ``[BLOCK_H, CHUNK]``) and lse (``[BLOCK_H]``, where ``own_lse``) at workspace rows
    ``r``; ``o_b`` only when D_SPLIT == 2 and V_SPLIT == 1."""
    split64 = tl.zeros([], dtype=tl.int64) + split  # S x rows x N x 512 can pass 2^31
    tl.store(part_lse + split64 * s_pl_s + r, lse2, mask=row_ok & own_lse)
    po_row = part_o + split64 * s_po_s + r[:, None] * D_NOPE
    tl.store(po_row + offs_a[None, :], o_a, mask=row_ok[:, None])
    if D_SPLIT == 2 and V_SPLIT == 1:
        tl.store(po_row + offs_b[None, :], o_b, mask=row_ok[:, None])


@triton.jit
def invariant_split_len(seq_len, split_tokens, split_cap, block_n):
    """Keys per split of a request of ``seq_len`` keys in batch-invariant mode: a function of the
    request alone (decode stage 1 cuts by it with the rule as constexprs, the reduce counts the
    request's splits by it with the rule as arguments: one reduce binary per tile serves every
    rule)."""
    return tl.maximum(tl.cdiv(tl.cdiv(seq_len, split_cap), block_n) * block_n, split_tokens)


@triton.jit
def sink_denominator(l_i, m_i, sink2):
    """The softmax denominator ``l + 2^(sink2 - m)`` of running sums ``l_i`` over keys whose base-2
    maximum is ``m_i`` (-inf: no key), with an attention sink of base-2 logit ``sink2`` (-inf:
    none): the sink is a key of value 0. With no key (``l_i == 0``: a seen key adds at least 1)
    it is 1 whatever the sink, so the output is 0; 2^(sink2 - m) may be inf (the sink outweighs
    every key: the output is 0); a NaN sum or sink stays NaN."""
    m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
    return tl.where(l_i == 0.0, 1.0, l_i + tl.exp2(sink2 - m_use))


@triton.jit
def rotate_back(x, cos_sin, pos, bad, s_cs, col0, ROWS: tl.constexpr, COLS: tl.constexpr):
    """GPT-J inverse RoPE of a ``[ROWS, COLS]`` tile holding columns ``[col0, col0 + COLS)`` of
    512-wide rows whose last 64 values (448 on) are the RoPE part, at position ``pos`` of
    ``cos_sin`` (``[P, 64]`` cos | sin, row stride ``s_cs``): pairs (2i, 2i + 1) from 448 on become
    ``(a cos + b sin, b cos - a sin)``; other columns stay, and a ``bad`` position reads nothing
    (the caller makes that row NaN)."""
    pair = (col0 + 2 * tl.arange(0, COLS // 2) - 448) // 2  # the numerator is even: exact
    turn = (pair >= 0) & (bad == 0)
    cs_row = cos_sin + tl.where(bad, 0, pos) * s_cs
    cos = tl.load(cs_row + pair, mask=turn, other=1.0).to(tl.float32)
    sin = tl.load(cs_row + 32 + pair, mask=turn, other=0.0).to(tl.float32)
    ev, od = tl.split(tl.reshape(x, [ROWS, COLS // 2, 2]))
    return tl.reshape(tl.join(ev * cos[None, :] + od * sin[None, :], od * cos[None, :] - ev * sin[None, :]),
                      [ROWS, COLS])  # fmt: skip


@triton.jit
def _rows_msb_last(x, BLOCK_D: tl.constexpr, LEVELS: tl.constexpr):
    """A ``[2**LEVELS, BLOCK_D]`` tile as ``[BLOCK_D, 2, ..., 2]`` with the row index's bits in the
    trailing dims, most significant last: ``tl.split`` then halves it into rows [0, n/2) and
    [n/2, n), in order (``_chain_rows``)."""
    if LEVELS == 0:
        return tl.reshape(x, [BLOCK_D])
    elif LEVELS == 1:
        return tl.permute(x, [1, 0])
    elif LEVELS == 2:
        return tl.permute(tl.reshape(x, [2, 2, BLOCK_D]), [2, 1, 0])
    elif LEVELS == 3:
        return tl.permute(tl.reshape(x, [2, 2, 2, BLOCK_D]), [3, 2, 1, 0])
    elif LEVELS == 4:
        return tl.permute(tl.reshape(x, [2, 2, 2, 2, BLOCK_D]), [4, 3, 2, 1, 0])
    elif LEVELS == 5:
        return tl.permute(tl.reshape(x, [2, 2, 2, 2, 2, BLOCK_D]), [5, 4, 3, 2, 1, 0])
    else:
        tl.static_assert(LEVELS == 6, "a reduce tile of at most 64 split rows")
        return tl.permute(tl.reshape(x, [2, 2, 2, 2, 2, 2, BLOCK_D]), [6, 5, 4, 3, 2, 1, 0])


@triton.jit
def _chain_rows(po, w, ok, acc, total, LEVELS: tl.constexpr):
    """``acc = fma(po_s, w_s, acc)`` and ``total += w_s`` for the tile's rows s in order (rows
    whose ``ok`` is false change nothing): one chain per column, the same for any tile."""
    if LEVELS == 0:
        acc = tl.where(ok, tl.fma(po, w, acc), acc)
        total = tl.where(ok, total + w, total)
    else:
        po_lo, po_hi = tl.split(po)
        w_lo, w_hi = tl.split(w)
        ok_lo, ok_hi = tl.split(ok)
        acc, total = _chain_rows(po_lo, w_lo, ok_lo, acc, total, LEVELS - 1)
        acc, total = _chain_rows(po_hi, w_hi, ok_hi, acc, total, LEVELS - 1)
    return acc, total


@triton.jit(
    do_not_specialize=[
        "num_heads", "num_splits", "q_len", "capacity", "split_tokens", "split_cap", "split_block_n", "num_pos",
    ]
)  # fmt: skip
def mla_decode_reduce_kernel(
    part_o,
    part_lse,
    out,
    lse,
    seq_lens,
    num_heads,
    num_splits,
    q_len,
    capacity,
    split_tokens,
    split_cap,
    split_block_n,
    s_sl,
    s_po_s,
    s_pl_s,
    s_o_r,
    s_o_h,
    s_o_d,
    s_l_r,
    s_l_h,
    sink,
    positions,
    cos_sin,
    num_pos,
    s_pos,
    s_cs,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    INVARIANT: tl.constexpr = False,
    HAS_SINK: tl.constexpr = False,
    ROPE: tl.constexpr = False,
):
    """The split-K reduce (mla_decode's stage 2; mla_sparse_attention's split rows):
    out[r] = sum_s w_s * part_o[s, r] with w = softmax_s(part_lse[s, r]).

    One program = one (row, head) pair r = row * N + h and BLOCK_D of the D columns. Splits are
    read BLOCK_S at a time (the default mode: [BLOCK_S, BLOCK_D] tiles summed by tl.sum, a split
    whose lse is -inf not read, as it may be unwritten workspace; batch-invariant mode: a
    [BLOCK_S, BLOCK_D] tile loaded at once, its rows added in split order). Writes out in
    out's dtype (any strides) and lse (natural log; -inf when no split saw a key, out then 0).
    Batch-invariant mode (INVARIANT, decode only; ``split_tokens``, ``split_cap``,
    ``split_block_n``: decode stage 1's split rule, unused otherwise): the splits read are the
    request's own, cdiv(seq_len, split length) from its seq_len (``seq_lens``, clamped to
    ``capacity`` as stage 1 clamps it), not the grid's, and they are summed one after another in
    split order, so the bits follow from the request alone whatever the tile and the grid.
    mla_v4_attention's epilogue: HAS_SINK adds ``2^(sink[h] x log2(e) - m)`` to the denominator
    (``sink`` [>= N] float32; lse stays the keys' own); ROPE rotates the output's pairs of columns
    from 448 on back at the row's position (``positions`` [rows], stride ``s_pos``; ``cos_sin``
    [num_pos, 64], row stride ``s_cs``, cos | sin); a position outside ``[0, num_pos)`` makes the
    row's out and lse NaN. The pointers are not read otherwise.
    """
    r = tl.program_id(0).to(tl.int64)
    dblk = tl.program_id(1)
    row = r // num_heads
    h = r % num_heads
    offs_s = tl.arange(0, BLOCK_S).to(tl.int64)  # split x (rows x N x 512) can pass 2^31
    offs_d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    n_splits = num_splits
    if INVARIANT:
        seq_len = tl.maximum(tl.minimum(tl.load(seq_lens + (row // q_len) * s_sl), capacity), 0)
        split_len = invariant_split_len(seq_len, split_tokens, split_cap, split_block_n)
        n_splits = tl.minimum(tl.cdiv(seq_len, split_len), num_splits)

    m = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    for s0 in range(0, n_splits, BLOCK_S):
        ls = tl.load(part_lse + (s0 + offs_s) * s_pl_s + r, mask=s0 + offs_s < n_splits, other=float("-inf"))
        m = tl.maximum(m, ls)
    m_max = tl.max(m, axis=0)
    m_use = tl.where(m_max == float("-inf"), 0.0, m_max)

    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    if INVARIANT:
        # One split after another, in split order: every column's sum (and the weights' total) is
        # a chain whose order is the request's own, whatever BLOCK_S and BLOCK_D (they follow the
        # batch). Stage 1 writes every partial of the request's splits (a bad page: NaN lse), so
        # none is masked by its weight: a NaN partial reaches out even where its weight
        # underflows to 0.
        # The [BLOCK_S, BLOCK_D] tile is loaded at once (every load in flight) and its rows are
        # taken apart in order (_rows_msb_last, _chain_rows: exact data movement).
        LEVELS: tl.constexpr = BLOCK_S.bit_length() - 1
        total = tl.zeros([BLOCK_D], dtype=tl.float32)  # BLOCK_D copies of one chain
        for s0 in range(0, n_splits, BLOCK_S):
            sp = s0 + offs_s
            ok = sp < n_splits
            ls = tl.load(part_lse + sp * s_pl_s + r, mask=ok, other=float("-inf"))
            po = tl.load(part_o + sp[:, None] * s_po_s + r * D + offs_d[None, :], mask=ok[:, None], other=0.0)
            w = tl.exp2(ls - m_use)  # one per split, then broadcast
            w2 = w[:, None] + tl.zeros([BLOCK_S, BLOCK_D], dtype=tl.float32)
            ok2 = ok[:, None] & (offs_d >= 0)[None, :]  # ok broadcast over the tile's columns
            acc, total = _chain_rows(
                _rows_msb_last(po, BLOCK_D, LEVELS),
                _rows_msb_last(w2, BLOCK_D, LEVELS),
                _rows_msb_last(ok2, BLOCK_D, LEVELS),
                acc,
                total,
                LEVELS,
            )
    else:
        wsum = tl.zeros([BLOCK_S], dtype=tl.float32)
        for s0 in range(0, n_splits, BLOCK_S):
            sp = s0 + offs_s
            ls = tl.load(part_lse + sp * s_pl_s + r, mask=sp < n_splits, other=float("-inf"))
            w = tl.exp2(ls - m_use)
            wsum += w
            po = tl.load(part_o + sp[:, None] * s_po_s + r * D + offs_d[None, :], mask=(w > 0.0)[:, None], other=0.0)
            acc += tl.sum(w[:, None] * po, axis=0)
        total = tl.sum(wsum, axis=0)
    # A NaN partial lse (a poisoned split) makes its weight, total and acc NaN: kept, never read as
    # "no key" (total == 0 only when no split saw a key).
    if INVARIANT:
        total = tl.sum(tl.where(offs_d == dblk * BLOCK_D, total, 0.0), axis=0)  # one copy, exactly (x + 0)
    no_key = total == 0.0
    if HAS_SINK:
        o = acc / sink_denominator(total, m_max, tl.load(sink + h) * 1.4426950408889634)
    else:
        o = acc / tl.where(no_key, 1.0, total)
    lse2 = tl.where(no_key, float("-inf"), m_use + tl.log2(tl.where(no_key, 1.0, total)))
    if ROPE:
        pos = tl.load(positions + row * s_pos).to(tl.int64)
        bad = (pos < 0) | (pos >= num_pos)
        o = tl.reshape(rotate_back(tl.reshape(o, [1, BLOCK_D]), cos_sin, pos, bad, s_cs, dblk * BLOCK_D, 1, BLOCK_D),
                       [BLOCK_D])  # fmt: skip
        o = tl.where(bad, float("nan"), o)
        lse2 = tl.where(bad, float("nan"), lse2)
    tl.store(out + row * s_o_r + h * s_o_h + offs_d * s_o_d, o.to(out.dtype.element_ty))
    if dblk == 0:
        tl.store(lse + row * s_l_r + h * s_l_h, lse2 * 0.6931471805599453)
