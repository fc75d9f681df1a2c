"""Triton body of merge_attn_states (wrapper: rocm_mla/ops/merge.py).

One program merges BLOCK_ROWS (token, head) rows of BLOCK_D elements. Rows are token-major, so a
program covers neighbouring heads of a token: with head stride == head size the tile is one
contiguous span, and with the pad_v view (head stride 192, size 128) it is BLOCK_ROWS spans.
Addresses are int64: T x token stride exceeds 2^31 at 32k tokens x 128 heads x 512.
"""

import triton
import triton.language as tl


@triton.jit
def merge_attn_states_kernel(
    out,
    out_lse,
    pre,
    pre_lse,
    suf,
    suf_lse,
    num_rows,
    num_heads,
    out_st,
    out_sh,
    out_sd,
    pre_st,
    pre_sh,
    pre_sd,
    suf_st,
    suf_sh,
    suf_sd,
    plse_sh,
    plse_st,
    slse_sh,
    slse_st,
    olse_sh,
    olse_st,
    HEAD_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    HAS_OUT_LSE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    rmask = rows < num_rows
    t = rows // num_heads
    h = rows % num_heads

    lp = tl.load(pre_lse + h * plse_sh + t * plse_st, mask=rmask, other=float("-inf"))
    ls = tl.load(suf_lse + h * slse_sh + t * slse_st, mask=rmask, other=float("-inf"))
    # FlashAttention writes +inf for a row that saw no key: same meaning as -inf.
    lp = tl.where(lp == float("inf"), float("-inf"), lp)
    ls = tl.where(ls == float("inf"), float("-inf"), ls)
    # A NaN lse (a side that saw a NaN) poisons the row: NaN weights, NaN out and lse. Said
    # explicitly: tl.maximum may return the non-NaN operand, and max(NaN, -inf) = -inf would read
    # the poisoned side as "saw no key" and drop it.
    poisoned = (lp != lp) | (ls != ls)
    m = tl.maximum(lp, ls)
    empty = (m == float("-inf")) & ~poisoned
    m_safe = tl.where(empty, 0.0, m)
    ep = tl.exp(lp - m_safe)
    es = tl.exp(ls - m_safe)
    sum_e = ep + es
    inv = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, sum_e))
    wp = tl.where(poisoned, float("nan"), ep * inv)
    ws = tl.where(poisoned, float("nan"), es * inv)
    if HAS_OUT_LSE:
        lse = tl.where(empty, float("-inf"), tl.log(tl.where(empty, 1.0, sum_e)) + m_safe)
        lse = tl.where(poisoned, float("nan"), lse)
        tl.store(out_lse + h * olse_sh + t * olse_st, lse, mask=rmask)

    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_SIZE
    # A zero-weight side is not read (masked to 0): an unwritten NaN side cannot leak. A NaN
    # weight is not zero: a poisoned row reads both sides and comes out NaN.
    pm = (rmask & (wp != 0.0))[:, None] & dmask[None, :]
    sm = (rmask & (ws != 0.0))[:, None] & dmask[None, :]
    p = tl.load(pre + t[:, None] * pre_st + h[:, None] * pre_sh + d[None, :] * pre_sd, mask=pm, other=0.0)
    s = tl.load(suf + t[:, None] * suf_st + h[:, None] * suf_sh + d[None, :] * suf_sd, mask=sm, other=0.0)
    o = p.to(tl.float32) * wp[:, None] + s.to(tl.float32) * ws[:, None]
    om = rmask[:, None] & dmask[None, :]
    tl.store(out + t[:, None] * out_st + h[:, None] * out_sh + d[None, :] * out_sd, o.to(out.dtype.element_ty), mask=om)
