"""Triton body of mla_v4_attention (wrapper: rocm_mla/ops/v4_attention.py; reference:
rocm_mla/reference/v4_attention.py).

DeepSeek-V4 attention: query row t attends over the rows two lists name, each list over its own
cache: the sliding-window list (window cache) and the compressed list (CSA top-k or HCA rows of
the compressed cache; none in window-only layers). One KV head, a 512-wide row that is both K and
V (448 NoPE values + 64 RoPE values), a per-head attention sink in the softmax denominator and,
optionally, the inverse RoPE of the output's last 64 values at the row's position.

One program = (row t, one split of the row's entries, one block of BLOCK_H heads). A row's entries
are the window list then the compressed list, one virtual list of ``L = Lw + Lc`` entries; split s
covers ``[s x len, (s + 1) x len)`` of it (``split_len`` 0: len = cdiv(L, S) rounded up to
BLOCK_N, the row's own; else that fixed length and the last split takes the rest), each part read
from its own cache. Per tile of BLOCK_N entries of a list it

    reads the entries (global slots ``page x block_size + offset``), gathers those cache rows as
    two 256-column halves in q's dtype (fp8_ds_mla: e4m3 values times their 64-value block's
    UE8M0 scale; the second half ends with the 64 bf16 RoPE values; 16-bit caches as stored),
    s = q . k^T                       (two tl.dot of 256 columns, summed)
    online softmax in base 2 (qk_scale holds log2(e)),
    acc_h += p . v_h                  (v = the same halves: K = V)

and closes with the sink ``out = acc / (l + 2^(sink - m))`` (lse without it) and the inverse RoPE
(DIRECT: one split), or writes a normalised float32 partial and its base-2 lse into the workspace
(``[S, T x H, 512]``, ``[S, T x H]``: mla_decode's layout), which the shared split-K reduce
(``mla_decode_reduce_kernel``, rocm_mla/kernels/latent_core.py) merges with the sink and the
inverse RoPE in its epilogue.

fp8_ds_mla page layout (vLLM's DeepSeek-V4 cache, uint8): token p of page b holds its 576 data
bytes at ``b x page_stride + p x 576`` (448 e4m3 then 64 little-endian bf16) and its 8 scale
bytes at ``b x page_stride + block_size x 576 + p x 8`` (7 used). The e4m3 kind is per cache
(KIND 1: e4m3fn, 2: e4m3fnuz); SOFT_FP8 decodes the codes in integer arithmetic (targets without
that conversion, the CPU interpreter).

Index values are never trusted: an entry < -1 or >= the cache's slots, a ragged row whose indptr
pair is out of order or outside ``[0, nnz]``, a position outside ``[0, P)`` (inverse RoPE): the
row's out and lse are NaN (every head). Nothing is read for such entries; masked entries load 0,
never cache bytes, so NaN in pages nobody selected cannot leak; a selected row holding NaN
reaches the rows that select it. Cache offsets are int64.
"""

import triton
import triton.language as tl

from .fp8_codes import fp8_e4m3_value
from .latent_core import close_split, rotate_back, sink_denominator, store_partial, xcd_local_order


@triton.jit
def _half(cache, data, scl, ok, HALF: tl.constexpr, offs, like, KIND: tl.constexpr, SOFT_FP8: tl.constexpr):
    """Columns ``[256 HALF, 256 HALF + 256)`` of the cache rows at ``data`` ([BLOCK_N] offsets;
    ``scl``: their scale bytes) as a ``[BLOCK_N, 256]`` tile in ``like``'s dtype; 0 where ``ok``
    is false. KIND 0: the cache's own 16/32-bit values. KIND 1 / 2 (fp8_ds_mla, e4m3fn /
    e4m3fnuz): each 64-value block times 2^(e - 127) of its scale byte; the second half's last 64
    columns are the bf16 RoPE tail (a second, masked load: no byte of it is read twice)."""
    BLOCK_N: tl.constexpr = data.shape[0]
    if KIND == 0:
        x = tl.load(cache + (data[:, None] + HALF * 256) + offs[None, :], mask=ok[:, None], other=0.0)
        return x.to(like.dtype)
    else:
        nope = ok[:, None] & ((offs < 192) | (HALF == 0))[None, :]
        code = tl.load(cache + (data[:, None] + HALF * 256) + offs[None, :], mask=nope, other=0)
        # Four scale bytes (one per 64 columns; the second half's fourth is the unused eighth byte).
        e = tl.load(cache + (scl[:, None] + HALF * 4) + tl.arange(0, 4)[None, :], mask=ok[:, None], other=127)
        e = e.to(tl.int32)
        # UE8M0: 2^(e - 127) built from its exponent bits (e = 0: 2^-127, a float32 subnormal).
        scale = tl.where(e == 0, 0x400000, e << 23).to(tl.float32, bitcast=True)
        if SOFT_FP8:
            v = fp8_e4m3_value(code, KIND == 2)
        elif KIND == 2:
            v = code.to(tl.float8e4b8, bitcast=True).to(tl.float32)
        else:
            v = code.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        v = tl.reshape(tl.reshape(v, [BLOCK_N, 4, 64]) * scale[:, :, None], [BLOCK_N, 256])
        if HALF == 1:
            rope = (cache + data + 448).to(tl.pointer_type(tl.bfloat16))
            tail = offs >= 192
            r = tl.load(rope[:, None] + (offs - 192)[None, :], mask=ok[:, None] & tail[None, :], other=0.0)
            v = tl.where(tail[None, :], r.to(tl.float32), v)
        return v.to(like.dtype)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _attend_list(
    cache, idx_row, lo, hi, block_size, num_slots, s_blk, s_tok,
    qa, qb, m_i, l_i, acc_a, acc_b, sc,
    KIND: tl.constexpr, SOFT_FP8: tl.constexpr, IEEE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Entries ``[lo, hi)`` of one list (``idx_row``: the row's first entry) folded into the
    running softmax ``(m_i, l_i)`` and the two accumulator halves; returns them."""
    offs_n = tl.arange(0, BLOCK_N)
    offs = tl.arange(0, 256)
    # The next tile's entries are read one step ahead: their load is in flight while this tile's
    # rows are gathered and folded (the gather's addresses wait on them otherwise).
    nxt = tl.load(idx_row + lo + offs_n, mask=lo + offs_n < hi, other=-1)
    for n0 in range(lo, hi, BLOCK_N):
        slot = nxt
        j = n0 + BLOCK_N + offs_n
        nxt = tl.load(idx_row + j, mask=j < hi, other=-1)
        # One unsigned compare: a negative slot wraps past any bound.
        ok = slot.to(tl.uint32) < num_slots.to(tl.uint32)
        wrong = (slot != -1) & (ok == 0)
        s_ok = tl.where(ok, slot, 0)
        page = s_ok // block_size
        off = s_ok - page * block_size
        base = page.to(tl.int64) * s_blk
        if KIND == 0:
            data = base + off * s_tok
            scl = data
        else:
            data = base + off * 576
            scl = base + block_size * 576 + off * 8
        ka = _half(cache, data, scl, ok, 0, offs, qa, KIND, SOFT_FP8)
        kb = _half(cache, data, scl, ok, 1, offs, qa, KIND, SOFT_FP8)
        s = _dot(qa, tl.trans(ka), IEEE)
        s += _dot(qb, tl.trans(kb), IEEE)
        # A bad entry scores NaN: p, l and acc of every head turn NaN and stay so.
        s = tl.where(ok[None, :], s * sc, tl.where(wrong, float("nan"), float("-inf"))[None, :])
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: avoid -inf - -inf
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if not IEEE:
            p = p.to(qa.dtype)
        acc_a = acc_a * alpha[:, None] + _dot(p, ka, IEEE)
        acc_b = acc_b * alpha[:, None] + _dot(p, kb, IEEE)
        m_i = m_new
    return m_i, l_i, acc_a, acc_b


@triton.jit
def _list_range(idx, indptr, t, s_row, nnz, RAGGED: tl.constexpr):
    """``(first entry pointer, length, bad)`` of row t's list: dense ``[T, W]`` rows (``nnz`` = W)
    or ragged ``indices[indptr[t]:indptr[t + 1]]`` (``nnz`` = the indices' length; a bad indptr
    pair reads nothing and marks the row)."""
    if RAGGED:
        start = tl.load(indptr + t)
        end = tl.load(indptr + t + 1)
        bad = (start < 0) | (end < start) | (end > nnz)
        return idx + tl.where(bad, 0, start).to(tl.int64), tl.where(bad, 0, end - start), bad
    else:
        return idx + t * s_row, nnz + tl.zeros([], dtype=tl.int32), t < 0


# Counts that differ per call are not specialised: one compiled kernel per config serves every batch.
@triton.jit(
    do_not_specialize=[
        "num_rows", "num_heads", "num_splits", "split_len", "num_head_blocks",
        "w_nnz", "w_block", "w_slots", "c_nnz", "c_block", "c_slots", "num_pos",
    ]
)  # fmt: skip
def mla_v4_attention_kernel(
    q,
    w_cache,
    w_idx,
    w_indptr,
    c_cache,
    c_idx,
    c_indptr,
    sink,
    positions,
    cos_sin,
    out,
    lse,
    part_o,
    part_lse,
    qk_scale,
    num_rows,
    num_heads,
    num_splits,
    split_len,
    num_head_blocks,
    w_nnz,
    w_block,
    w_slots,
    c_nnz,
    c_block,
    c_slots,
    num_pos,
    s_q_r,
    s_q_h,
    s_q_d,
    s_w_blk,
    s_w_tok,
    s_wi_r,
    s_c_blk,
    s_c_tok,
    s_ci_r,
    s_pos,
    s_cs,
    s_o_r,
    s_o_h,
    s_o_d,
    s_l_r,
    s_l_h,
    s_po_s,
    s_pl_s,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    W_KIND: tl.constexpr,
    C_KIND: tl.constexpr,
    W_RAGGED: tl.constexpr,
    C_RAGGED: tl.constexpr,
    HAS_SINK: tl.constexpr,
    ROPE: tl.constexpr,
    DIRECT: tl.constexpr,
    IEEE: tl.constexpr,
    SOFT_FP8: tl.constexpr,
    NUM_XCDS: tl.constexpr,
):
    """See the module docstring.

    q [T, H, 512] any strides. Caches: KIND 0 ``[num_pages, block, 512]`` (page stride s_*_blk,
    token stride s_*_tok, last dim contiguous), KIND 1/2 fp8_ds_mla uint8 (page stride s_*_blk
    bytes). Lists: dense ``[T, nnz]`` int32 (row stride s_*i_r, column stride 1) or ragged
    (``*_RAGGED``: ``[nnz]`` int32 and ``[T + 1]`` int32 indptr). C_KIND -1: no compressed list.
    ``*_slots``: num_pages x block (entries at or past it are bad). sink [>= H] float32 (HAS_SINK).
    ROPE: positions [T] (stride s_pos), cos_sin [P, 64] (row stride s_cs, cos | sin); with a split
    grid the reduce rotates. DIRECT: out [T, H, 512] in q's dtype and lse [T, H] (natural log,
    sink excluded). Otherwise part_o [S, T x H, 512] and part_lse [S, T x H] float32 (base-2 lse).
    qk_scale = sm_scale x log2(e).
    """
    pid = tl.program_id(0)
    if NUM_XCDS > 1:
        pid = xcd_local_order(pid, num_rows * num_splits * num_head_blocks, NUM_XCDS)
    hb = pid % num_head_blocks
    rest = pid // num_head_blocks
    split = rest % num_splits
    t = (rest // num_splits).to(tl.int64)  # T x H x 512 can pass 2^31

    offs = tl.arange(0, 256)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < num_heads
    q_row = q + t * s_q_r + offs_h[:, None] * s_q_h
    qa = tl.load(q_row + offs[None, :] * s_q_d, mask=h_ok[:, None], other=0.0)
    qb = tl.load(q_row + (offs + 256)[None, :] * s_q_d, mask=h_ok[:, None], other=0.0)

    w_row, w_len, bad = _list_range(w_idx, w_indptr, t, s_wi_r, w_nnz, W_RAGGED)
    c_row = c_idx
    c_len = w_len * 0
    if C_KIND >= 0:
        c_row, c_len, c_bad = _list_range(c_idx, c_indptr, t, s_ci_r, c_nnz, C_RAGGED)
        bad = bad | c_bad
    total = w_len + c_len
    if split_len == 0:
        per = tl.cdiv(tl.cdiv(total, num_splits), BLOCK_N) * BLOCK_N
    else:
        per = split_len + w_len * 0
    lo = split * per
    hi = tl.where(split == num_splits - 1, total, tl.minimum(lo + per, total))

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc_a = tl.zeros([BLOCK_H, 256], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_H, 256], dtype=tl.float32)
    m_i, l_i, acc_a, acc_b = _attend_list(
        w_cache, w_row, tl.minimum(lo, w_len), tl.minimum(hi, w_len), w_block, w_slots, s_w_blk, s_w_tok,
        qa, qb, m_i, l_i, acc_a, acc_b, qk_scale, W_KIND, SOFT_FP8, IEEE, BLOCK_N,
    )  # fmt: skip
    if C_KIND >= 0:
        m_i, l_i, acc_a, acc_b = _attend_list(
            c_cache, c_row, tl.maximum(lo, w_len) - w_len, tl.maximum(hi, w_len) - w_len, c_block, c_slots,
            s_c_blk, s_c_tok, qa, qb, m_i, l_i, acc_a, acc_b, qk_scale, C_KIND, SOFT_FP8, IEEE, BLOCK_N,
        )  # fmt: skip

    if DIRECT:
        if ROPE:
            pos = tl.load(positions + t * s_pos).to(tl.int64)
            bad = bad | (pos < 0) | (pos >= num_pos)
        no_key = l_i == 0.0
        if HAS_SINK:
            sk = tl.load(sink + offs_h, mask=h_ok, other=float("-inf")) * 1.4426950408889634
            den = sink_denominator(l_i, m_i, sk)
        else:
            den = tl.where(no_key, 1.0, l_i)
        inv = tl.where(bad, float("nan"), 1.0 / den)[:, None]
        lse2 = tl.where(no_key, float("-inf"), m_i + tl.log2(tl.where(no_key, 1.0, l_i)))
        lse2 = tl.where(bad, float("nan"), lse2)
        ob = acc_b * inv
        if ROPE:
            ob = rotate_back(ob, cos_sin, pos, bad, s_cs, 256, BLOCK_H, 256)  # the second half: columns 256..511
        o_row = out + t * s_o_r + offs_h[:, None] * s_o_h
        tl.store(o_row + offs[None, :] * s_o_d, (acc_a * inv).to(out.dtype.element_ty), mask=h_ok[:, None])
        tl.store(o_row + (offs + 256)[None, :] * s_o_d, ob.to(out.dtype.element_ty), mask=h_ok[:, None])
        tl.store(lse + t * s_l_r + offs_h * s_l_h, lse2 * 0.6931471805599453, mask=h_ok)
    else:
        inv, lse2 = close_split(m_i, l_i, 1.0, bad, False, 0.0)
        r = t * num_heads + offs_h
        store_partial(
            part_o, part_lse, split, s_po_s, s_pl_s, r, h_ok, True, acc_a * inv, acc_b * inv, lse2,
            offs, offs + 256, 512, 2, 1,
        )  # fmt: skip
