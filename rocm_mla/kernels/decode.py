"""Triton bodies of mla_decode (wrapper: rocm_mla/ops/decode.py; reference: rocm_mla/reference/decode.py).

Split-KV ("flash-decoding") paged MQA over the MLA latent cache, in two kernels:

stage 1  ``mla_decode_stage1_kernel``: one program = (one request b, one KV split s, one block of
         BLOCK_H query rows of that request). A request's query rows are its q_len new tokens x N
         heads, numbered m = t * N + h (t: token within the request, h: head). Every row of the block
         reads the same KV tiles, so each KV byte is loaded once per (split, head block) -- for
         q_len * N <= BLOCK_H once per split -- instead of once per 16 heads. Per KV tile of BLOCK_N
         tokens it computes
             s = q_nope . k_nope^T + q_pe . k_pe^T      two tl.dot (512 + 64)
             online softmax in base 2 (exp2; qk_scale already holds log2(e))
             acc += p . v                               tl.dot, v = the first 512 columns of the
                                                        same tile (MLA's K and V share the row)
         and writes either the final output and lse (DIRECT: one split, no stage 2) or a
         normalised partial output plus its base-2 lse into the workspace.
stage 2  ``mla_decode_reduce_kernel``: merges the S partials of each (row, head) by their lse and
         writes out/lse into the caller's buffers. It is the split-K reduce of the latent core
         (rocm_mla/kernels/latent_core.py, shared with mla_sparse_attention), as are the helpers
         both ops' split kernels use (page/offset, XCD order, the q . k^T dots, split close and
         partial store).

Causality (MTP / spec-decode verification): row t of a request with seq_len keys sees keys
j < seq_len - q_len + t + 1. Tokens at or beyond seq_len are never loaded (masked loads give 0),
so NaN in unused pages or page tails cannot leak. A row that sees no key (seq_len == 0 padding
requests) gets out 0 and lse -inf.

Split ranges are computed per request from its own seq_len (split_len = cdiv(seq_len, S) rounded
up to BLOCK_N), so the host never needs the lengths and the split count is only a load-balancing
choice: correctness does not depend on it. Addresses that scale with the cache size are int64
(num_blocks x block_size x 576 exceeds 2^31).

Batch-invariant mode (SPLIT_TOKENS > 0): the split length is a function of the request's own
seq_len, S (the workspace's splits) only bounds how many a request may have, and with SPLIT_RUNS a
program takes a run of consecutive splits of its request (split_programs programs per request,
chosen from the batch), writing each split's partial as its loop leaves it; the reduce then adds a
request's partials one after another in split order. A request's bits follow from the request
alone; how many programs share its splits, and the reduce's tile, follow the batch.
"""

import triton
import triton.language as tl

from .fp8_codes import fp8_e4m3_code
from .latent_core import (
    close_split,
    invariant_split_len,
    mla_decode_reduce_kernel,
    page_and_offset,
    qk_scores,
    store_partial,
    xcd_local_order,
)


@triton.jit
def _pages_outside(bt_row, first_blk, last_blk, num_pages, BLOCK_N: tl.constexpr):
    """1 when a block-table entry in [first_blk, last_blk] of the row at ``bt_row`` lies outside
    [0, num_pages), else 0 (entries read BLOCK_N at a time: 4 bytes per page)."""
    bad = tl.zeros([], dtype=tl.int32)
    for p0 in range(first_blk, last_blk + 1, BLOCK_N):
        idx = p0 + tl.arange(0, BLOCK_N)
        pg = tl.load(bt_row + idx, mask=idx <= last_blk, other=0)
        bad = bad | tl.max(((pg < 0) | (pg >= num_pages)).to(tl.int32), axis=0)
    return bad


# Counts that are often 1 (q_len, splits, head blocks, page size) are not specialised: one compiled
# kernel per config serves every batch, and the ISA report's variants are exactly what runs.
@triton.jit(
    do_not_specialize=[
        "num_heads",
        "q_len",
        "num_splits",
        "split_programs",
        "num_head_blocks",
        "page_size",
        "page_shift",
        "capacity",
        "num_pages",
    ]
)
def mla_decode_stage1_kernel(
    q_nope,
    q_pe,
    kv,
    block_table,
    seq_lens,
    k_scale_ptr,
    out,
    lse,
    part_o,
    part_lse,
    qk_scale,
    out_scale,
    num_heads,
    q_len,
    num_splits,
    split_programs,
    num_head_blocks,
    page_size,
    page_shift,
    capacity,
    num_pages,
    s_qn_r,
    s_qn_h,
    s_qn_d,
    s_qp_r,
    s_qp_h,
    s_qp_d,
    s_kv_blk,
    s_kv_tok,
    s_bt_b,
    s_sl,
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
    DIRECT: tl.constexpr,
    HAS_K_SCALE_PTR: tl.constexpr,
    IEEE: tl.constexpr,
    D_SPLIT: tl.constexpr,
    RELOAD_K: tl.constexpr,
    NUM_XCDS: tl.constexpr,
    F16_DOT: tl.constexpr = False,
    PAGE_MODE: tl.constexpr = 0,
    V_SPLIT: tl.constexpr = 1,
    CLAMP_PAGES: tl.constexpr = False,
    FP8_QK: tl.constexpr = False,
    Q8_INT: tl.constexpr = False,
    FP8_PV: tl.constexpr = False,
    SPLIT_TOKENS: tl.constexpr = 0,
    SPLIT_CAP: tl.constexpr = 0,
    SPLIT_RUNS: tl.constexpr = False,
):
    """Stage 1; see the module docstring.

    q_nope [rows, N, D_NOPE], q_pe [rows, N, D_PE]: any strides (s_qn_*, s_qp_*).
    kv [num_blocks, page_size, D_NOPE + D_PE]: last dim contiguous; s_kv_blk/s_kv_tok in elements.
    block_table [B, max_blocks] int32 (row stride s_bt_b, column stride 1); seq_lens [B] int32
    (stride s_sl), clamped to capacity = max_blocks x page_size so that a bad length can never
    read past the table (the wrapper's debug mode reports it instead).
    DIRECT: out [rows, N, D_NOPE] (q's dtype, strides s_o_*) and lse [rows, N] float32 (s_l_*),
        natural log. Otherwise part_o [S, rows * N, D_NOPE] float32 (row stride D_NOPE) and
        part_lse [S, rows * N] float32, base-2 log, -inf where the split saw no key.
    qk_scale = sm_scale * log2(e) (times k_scale when given as a number); out_scale = k_scale as a
    number (or 1). HAS_K_SCALE_PTR: multiply both by the float32 at k_scale_ptr (fp8 caches).
    D_SPLIT (1 or 2): handle the 512 latent columns whole, or as two halves each with its own q
    slice, K/V tile and accumulator -- the same work, but every layout conversion and register
    block half as big (on gfx942 the q staging through LDS drops from 64 to 32 KiB at
    BLOCK_H=64; on sm90 ptxas allocates the whole-tile form better). Chosen per arch in the config.
    RELOAD_K: read K^T for q.k^T as its own (transposed) load instead of transposing the V tile
    (see the loop); used for fp8 caches on sm90.
    NUM_XCDS: dies that the hardware deals consecutive workgroups to round-robin, each with its
    own L2 (8 on MI300X); 1 elsewhere.
    F16_DOT (fp8 caches with a bfloat16 q): run both dots in float16 instead of q's dtype. e4m3 ->
    f16 is one hardware instruction per two values on sm90 (cvt.rn.f16x2.e4m3x2, exact), while
    e4m3 -> bf16 goes e4m3 -> f16 -> bf16 (three conversions per two values, on the quarter-rate
    conversion unit: that, not the bytes, bounded the fp8 kernel). q is rounded to f16 once
    (saturated to +-65504; f16 has 3 more mantissa bits than bf16), p is rounded to f16 for p . v;
    accumulation stays float32.
    PAGE_MODE: how a tile's token rows are found in the paged cache. 0: any page size (a block-table
    gather and an integer division per row); 1: page_size == 1 << page_shift (shift and mask per
    row); 2: page_size a multiple of BLOCK_N, so a tile (BLOCK_N-aligned: split starts are) lies in
    one page: one scalar block-table load per tile and contiguous rows. The division per row is
    most of the loop's integer work, several times the instructions of the loads and dots it
    serves (the profile: docs/notes/decode-tiers-and-splits.md).
    V_SPLIT (1 or 2; 2 needs D_SPLIT == 2): programs per (request, split, head block). With 2, program
    v accumulates p . V only over the latent half v ("own" columns) and writes only those columns
    of out / part_o; both compute q . k^T over all 576 columns (the other half is read as K only).
    That recomputes the scores (1664 instead of 1088 MACs per row and key) but halves the
    accumulator, so one warp group can own 64 rows outright (p stays in registers as the second
    dot's A operand, no cross-warp-group softmax): the trade FlashMLA avoids with two cooperating
    warp groups, which Triton does not express. The two programs are neighbours: the second finds
    the tile in L2.
    num_pages: the cache's page count. No block-table value makes a load leave kv, and a used entry
    outside [0, num_pages) makes the program's rows NaN (out and lse): loud, and other requests are
    unaffected. CLAMP_PAGES picks how: False checks the entries before the KV loop and skips the
    loop on a bad one; True (used in PAGE_MODE 2 only) clamps every tile's page into the cache as
    the loop reads it and checks the entries after the loop. Same results; the first adds a
    reduction ahead of the first KV load (the first BLOCK_N entries are loaded beside seq_len, so a
    split that starts at block 0 and uses no more waits for no load of its own), the second a few
    instructions into the loop (the sm90 64-row tier spills with it; the sm90 fp8 16-row tier is
    faster with it: docs/notes/bound-guards.md).
    FP8_QK (fp8 caches, D_SPLIT 1): q is rounded once per program to the cache's e4m3 kind with one
    scale per (row, head) -- absmax of its 576 values over the kind's largest value -- and q . k^T
    runs on fp8 operands read straight from the cache (no conversion of K; on sm90 fp8 wgmma/mma,
    on gfx942 fp8 MFMA); p . v stays as without it. An accuracy trade, so no default tier sets it:
    reference.decode.quantize_q_fp8 is its exact spec (out a few percent from the unquantised
    float32 result on random inputs, against a fraction of a percent without it:
    docs/notes/fp8-decode.md). Q8_INT: round q (and FP8_PV's p) by integer
    code (fp8_codes) after exact divisions -- set for the CPU interpreter, whose float -> e4m3
    conversion is wrong near exponent boundaries.
    FP8_PV (needs FP8_QK): p . v on fp8 operands too, V read as stored (no conversion in the loop).
    p is rounded to the cache's e4m3 kind after the running-max subtraction, scaled so that a
    row's largest weight maps to the kind's largest value (p = exp2(s - m + log2(fmax)), in
    [0, fmax]); l sums the unrounded p with the same scale, so out = acc / l needs no unscaling
    and only lse subtracts log2(fmax). A scale per tile would change nothing above e4m3's
    subnormals: its relative precision (2^-4) is the same in every normal binade, and the normal
    range reaches weights 2^-15 below the row's largest. reference.decode.mla_decode_ref(p_fp8=)
    rounds p the same way against the global row max (the kernel's running max differs on early
    tiles, so the two agree to the rounding, not bit for bit).
    SPLIT_TOKENS, SPLIT_CAP (batch-invariant mode when SPLIT_TOKENS > 0): a split holds
    max(SPLIT_TOKENS, cdiv(seq_len, SPLIT_CAP) rounded up to BLOCK_N) keys, a function of the
    request's own seq_len, so its partials do not depend on num_splits (the grid's split count,
    which the host takes from the batch); splits past the request's last key are empty, and the
    last split of the grid takes every key left (a grid too small for a request stays correct).
    SPLIT_TOKENS is a multiple of BLOCK_N. 0: the split length follows num_splits.
    split_programs: programs per (request, head block); == num_splits (one split each) but with
    SPLIT_RUNS, where program p of a request takes its splits [p x per, (p + 1) x per), per =
    cdiv(own splits, split_programs): the loop writes each split's partial (normalised output and
    lse) as it leaves the split and restarts the softmax, so a split's partial is the one a program
    of its own would write, and the software pipeline runs on across the run. The splits a run's
    loop does not reach (an MTP head block's past its rows' last key; all of them on a bad page)
    get lse -inf (NaN) and a zero partial: the batch-invariant reduce reads every own split.
    SPLIT_RUNS is a per-tier config field: the partial store inside the loop converts the
    accumulator's layout through shared memory beside the pipeline buffers, which only the small
    tiers afford (the ISA report's "u" rows).
    NaN / inf in a used KV row reaches the request's output and lse (lse -inf means only "no key"),
    also through stage 2.
    """
    pid = tl.program_id(0)
    if NUM_XCDS > 1:
        pid = xcd_local_order(pid, tl.num_programs(0), NUM_XCDS)
    # Row blocks (and V halves) of one (request, split) get consecutive logical ids: they read the
    # same KV tiles, and run at about the same time on the same L2, so only the first reads HBM.
    vh = pid % V_SPLIT
    pid = pid // V_SPLIT
    hb = pid % num_head_blocks
    rest = pid // num_head_blocks
    split = rest % split_programs
    b = rest // split_programs
    bt_row = block_table + b.to(tl.int64) * s_bt_b
    # The first BLOCK_N block-table entries of the request (those in the table), loaded beside
    # seq_len: the page guard's check of them below then waits for no load of its own. (A load
    # issued after seq_len, in the check, would put one memory latency before the first KV load,
    # which at B=128, where each program is the kernel's length, adds to the kernel's time.)
    head_blk = tl.arange(0, BLOCK_N)
    head_pages = tl.load(bt_row + head_blk, mask=head_blk * page_size < capacity, other=0)

    seq_len = tl.minimum(tl.load(seq_lens + b * s_sl), capacity)
    m_rows = q_len * num_heads
    offs_m = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = offs_m < m_rows
    t = offs_m // num_heads
    h = offs_m % num_heads
    q_row = (b * q_len + t).to(tl.int64)
    r = (b * m_rows + offs_m).to(tl.int64)  # the rows' index in the partials: q_row * num_heads + h
    # Key j is visible to row t when j < row_end[t] (causal among the request's new tokens).
    row_end = tl.where(row_ok, seq_len - q_len + 1 + t, 0)

    # The rows of this block see nothing past their largest row_end: stop loading there.
    top = tl.max(row_end, axis=0)
    if SPLIT_TOKENS > 0:
        # The request's own splits (the grid's last takes every key left) in consecutive runs of
        # `per`, one run per program: the runs follow the batch, the splits (the bits) do not.
        split_len = invariant_split_len(seq_len, SPLIT_TOKENS, SPLIT_CAP, BLOCK_N)
        n_own = tl.minimum(tl.cdiv(seq_len, split_len), num_splits)
        per = tl.cdiv(n_own, split_programs)
        f_first = split * per
        f_stop = tl.minimum(f_first + per, n_own)
        start = f_first * split_len
        end = tl.where(f_stop == num_splits, top, tl.minimum(f_stop * split_len, top))
    else:
        split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        f_first = split
        f_stop = split + 1
        start = split * split_len
        end = tl.minimum(start + split_len, top)
    # A run of several splits per program (SPLIT_RUNS): each split's partial is written as the loop
    # leaves it and the softmax restarts; the pipeline runs on across the splits.
    tl.static_assert(not SPLIT_RUNS or (SPLIT_TOKENS > 0 and not DIRECT), "SPLIT_RUNS needs the split rule, two stages")
    f = f_first  # the split the loop is in

    # Column chunk a = [0, CHUNK), chunk b = [CHUNK, 2 CHUNK) (only when D_SPLIT == 2). With
    # V_SPLIT == 2, a is this program's own half (K and V) and b the other half (K only).
    tl.static_assert(V_SPLIT == 1 or D_SPLIT == 2, "V_SPLIT == 2 needs D_SPLIT == 2")
    CHUNK: tl.constexpr = D_NOPE // D_SPLIT
    offs_a = vh * CHUNK + tl.arange(0, CHUNK)
    offs_b = (1 - vh) * CHUNK + tl.arange(0, CHUNK)
    offs_pe = tl.arange(0, D_PE)
    offs_n = tl.arange(0, BLOCK_N)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc_a = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)  # dead (removed) when D_SPLIT == 1 or V_SPLIT == 2
    bad_page = tl.zeros([], dtype=tl.int32)  # 1 once a used block-table entry lies outside the cache
    fnuz: tl.constexpr = kv.dtype.element_ty == tl.float8e4b8
    # log2 of the e4m3 kind's largest value (240 fnuz, 448 fn): FP8_PV's p scale.
    LOG2_PMAX: tl.constexpr = 7.906890595608519 if fnuz else 8.807354922057604
    tl.static_assert(not FP8_PV or FP8_QK, "FP8_PV needs FP8_QK")

    osc = out_scale
    if HAS_K_SCALE_PTR:
        osc = osc * tl.load(k_scale_ptr)
    if end > start:
        qn_row = q_nope + q_row[:, None] * s_qn_r + h[:, None] * s_qn_h
        qa = tl.load(qn_row + offs_a[None, :] * s_qn_d, mask=row_ok[:, None], other=0.0)
        if D_SPLIT == 2:
            qb = tl.load(qn_row + offs_b[None, :] * s_qn_d, mask=row_ok[:, None], other=0.0)
        qp = tl.load(
            q_pe + q_row[:, None] * s_qp_r + h[:, None] * s_qp_h + offs_pe[None, :] * s_qp_d,
            mask=row_ok[:, None],
            other=0.0,
        )
        # Bound guard: no block-table value can take a load outside kv, and a used entry outside
        # [0, num_pages) makes the program's rows NaN (out and lse). Two forms, chosen per tier in
        # the config (CLAMP_PAGES), both loud and both safe; they differ only in cost.
        first_blk = start // page_size
        last_blk = (end - 1) // page_size
        # Only where a tile lies in one page (PAGE_MODE 2) is the clamp one scalar per tile; per
        # row (page modes 0/1) it spilled the sm90 16-row tier: those check before the loop.
        LATE: tl.constexpr = CLAMP_PAGES and PAGE_MODE == 2
        if LATE:
            # Each page is clamped into the cache as the loop reads it (one unsigned min per tile
            # in page mode 2) and the entries are checked after the loop: the first KV load waits
            # for no check. (Table loads issued here and examined after the loop would hold
            # registers across the loop. The 64-row sm90 tier spills with the clamp: it checks
            # first.)
            top_page = tl.maximum(num_pages - 1, 0).to(tl.uint32)
            end = tl.where(num_pages > 0, end, start)  # an empty cache: nothing to read
        else:
            # The entries are checked before the loop and a bad one skips it: no register cost
            # in the loop. A split starting at block 0 checks its first BLOCK_N entries from
            # head_pages, the rest with loads of its own. A bad entry moves `end` itself (not a
            # separate loop bound): the loop then bounds and masks by one value, as unguarded.
            # (Each alternative's cost: docs/notes/bound-guards.md.)
            in_head = (first_blk == 0) & (head_blk <= last_blk)
            head_bad = in_head & ((head_pages < 0) | (head_pages >= num_pages))
            rest_blk = tl.where(first_blk == 0, BLOCK_N, first_blk)
            bad_page = tl.max(head_bad.to(tl.int32), axis=0)
            bad_page = bad_page | _pages_outside(bt_row, rest_blk, last_blk, num_pages, BLOCK_N)
            end = tl.where(bad_page != 0, start, end)
        if FP8_QK:
            # q quantised once per program to the cache's fp8 kind, one scale per row (its absmax
            # over the 576 columns maps to the kind's largest value): q . k^T then runs on fp8
            # operands straight from the cache, no conversion of K. The row scale goes into s.
            tl.static_assert(D_SPLIT == 1, "FP8_QK needs D_SPLIT == 1")
            qaf = qa.to(tl.float32)
            qpf = qp.to(tl.float32)
            amax = tl.maximum(tl.max(tl.abs(qaf), axis=1), tl.max(tl.abs(qpf), axis=1))
            fmax: tl.constexpr = 240.0 if fnuz else 448.0  # the kind's largest value
            if Q8_INT:
                # The CPU interpreter's float -> e4m3 conversion drops the carry into the exponent:
                # integer rounding (fp8_codes) after exact divisions, bit for bit the codes of
                # reference.decode.quantize_q_fp8. Not on GPUs (below): there the exact divisions
                # cost time (docs/notes/fp8-decode.md); the hardware rounds to nearest even too,
                # and a reciprocal's last-bit error can only move a value that sits on a rounding
                # boundary to the neighbouring code.
                q_sc = tl.where(amax > 0.0, tl.math.div_rn(amax, fmax), 1.0)  # a zero row: any scale
                qa8 = fp8_e4m3_code(tl.math.div_rn(qaf, q_sc[:, None]), fnuz).to(kv.dtype.element_ty, bitcast=True)
                qp8 = fp8_e4m3_code(tl.math.div_rn(qpf, q_sc[:, None]), fnuz).to(kv.dtype.element_ty, bitcast=True)
            else:
                # Clamped: the reciprocal may take the absmax a hair past the largest code, which
                # a non-saturating conversion would turn into NaN.
                q_sc = tl.where(amax > 0.0, amax / fmax, 1.0)
                inv = (1.0 / q_sc)[:, None]
                qa8 = tl.clamp(qaf * inv, -fmax, fmax).to(kv.dtype.element_ty)
                qp8 = tl.clamp(qpf * inv, -fmax, fmax).to(kv.dtype.element_ty)
        if F16_DOT:
            qa = tl.clamp(qa.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
            if D_SPLIT == 2:
                qb = tl.clamp(qb.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
            qp = tl.clamp(qp.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        sc = qk_scale
        if HAS_K_SCALE_PTR:
            sc = sc * tl.load(k_scale_ptr)
        if FP8_QK:
            s_scale = (q_sc * sc)[:, None]
        else:
            s_scale = sc
        f_end = tl.where(f + 1 == num_splits, end, tl.minimum((f + 1) * split_len, end))
        for n0 in range(start, end, BLOCK_N):
            tok = n0 + offs_n
            tok_ok = tok < end
            if PAGE_MODE == 2:
                page = tl.load(bt_row + n0 // page_size)  # n0 < end <= capacity
                if LATE:
                    page = tl.minimum(page.to(tl.uint32), top_page)
                page = page.to(tl.int64)
                tok_ptr = kv + page * s_kv_blk + (n0 % page_size + offs_n) * s_kv_tok  # [BLOCK_N]
            else:
                pidx, prow = page_and_offset(tok, page_size, page_shift, PAGE_MODE == 1)
                page = tl.load(bt_row + pidx, mask=tok_ok, other=0).to(tl.int64)  # checked before the loop
                tok_ptr = kv + page * s_kv_blk + prow * s_kv_tok  # [BLOCK_N]
            tok_ptr2 = tok_ptr[:, None]
            ok2 = tok_ok[:, None]
            # Masked tokens load 0, never the cache's NaN/garbage: 0 * NaN would poison p . v.
            # fp8 caches: the dots run in q's dtype (FP8_QK: q . k^T on fp8, its scale in s_scale);
            # k_scale is folded into sc and out_scale.
            va = tl.load(tok_ptr2 + offs_a[None, :], mask=ok2, other=0.0)  # [BLOCK_N, CHUNK]
            if not FP8_PV:
                va = va.to(qa.dtype)
            if D_SPLIT == 2:
                vb = tl.load(tok_ptr2 + offs_b[None, :], mask=ok2, other=0.0).to(qa.dtype)
            if FP8_QK:
                ka_t = tl.load(tok_ptr[None, :] + offs_a[:, None], mask=tok_ok[None, :], other=0.0)  # fp8
                kp_t = tl.load(tok_ptr[None, :] + D_NOPE + offs_pe[:, None], mask=tok_ok[None, :], other=0.0)
            elif RELOAD_K:
                # K^T read a second time, already transposed: each load then has one consumer, which
                # lets the software pipeliner stage fp8 tiles in shared memory (a tile converted once
                # and used by both dots is not pipelined on sm90). The re-read hits L1/L2.
                ka_t = tl.load(tok_ptr[None, :] + offs_a[:, None], mask=tok_ok[None, :], other=0.0).to(qa.dtype)
                if D_SPLIT == 2:
                    kb_t = tl.load(tok_ptr[None, :] + offs_b[:, None], mask=tok_ok[None, :], other=0.0).to(qa.dtype)
            else:
                ka_t = tl.trans(va)
                if D_SPLIT == 2:
                    kb_t = tl.trans(vb)
            if not FP8_QK:
                kp_t = tl.load(tok_ptr[None, :] + D_NOPE + offs_pe[:, None], mask=tok_ok[None, :], other=0.0).to(
                    qa.dtype
                )  # [D_PE, BLOCK_N]
            if FP8_QK:
                s = tl.dot(qa8, ka_t)
                s += tl.dot(qp8, kp_t)
            else:
                # qb and kb_t exist with D_SPLIT == 2 alone (the constexpr picks the branch).
                s = qk_scores(
                    qa, qb if D_SPLIT == 2 else qa, qp, ka_t, kb_t if D_SPLIT == 2 else ka_t, kp_t, IEEE, D_SPLIT
                )
            s = tl.where(tok[None, :] < row_end[:, None], s * s_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            # A row with no visible key yet keeps m = -inf; subtracting 0 instead avoids -inf - -inf.
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            if FP8_PV:
                p = tl.exp2(s - (m_use - LOG2_PMAX)[:, None])  # in [0, fmax]: see FP8_PV
            else:
                p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if FP8_PV:
                if Q8_INT:
                    p8 = fp8_e4m3_code(p, fnuz).to(kv.dtype.element_ty, bitcast=True)
                else:
                    p8 = p.to(kv.dtype.element_ty)
                acc_a = acc_a * alpha[:, None] + tl.dot(p8, va)
            elif IEEE:
                acc_a = acc_a * alpha[:, None] + tl.dot(p, va, input_precision="ieee")
                if D_SPLIT == 2 and V_SPLIT == 1:
                    acc_b = acc_b * alpha[:, None] + tl.dot(p, vb, input_precision="ieee")
            else:
                pv = p.to(va.dtype)
                acc_a = acc_a * alpha[:, None] + tl.dot(pv, va)
                if D_SPLIT == 2 and V_SPLIT == 1:
                    acc_b = acc_b * alpha[:, None] + tl.dot(pv, vb)
            m_i = m_new
            if SPLIT_RUNS:
                if n0 + BLOCK_N >= f_end:
                    inv_f, lse_f = close_split(m_i, l_i, osc, bad_page != 0, FP8_PV, LOG2_PMAX)
                    store_partial(
                        part_o, part_lse, f, s_po_s, s_pl_s, r, row_ok, vh == 0, acc_a * inv_f, acc_b * inv_f, lse_f,
                        offs_a, offs_b, D_NOPE, D_SPLIT, V_SPLIT,
                    )  # fmt: skip
                    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
                    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
                    acc_a = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
                    acc_b = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
                    f += 1
                    f_end = tl.where(f + 1 == num_splits, end, tl.minimum((f + 1) * split_len, end))
        if LATE:
            bad_page = _pages_outside(bt_row, first_blk, last_blk, num_pages, BLOCK_N)

    poison = bad_page != 0
    own_lse = vh == 0  # both V halves compute the same lse: one writes it
    if SPLIT_RUNS:
        # The program's splits its loop did not close -- past the rows' last key (MTP head blocks),
        # or all of them on a bad page -- get lse -inf (NaN on a bad page) and a zero partial, so
        # stage 2 reads no unwritten workspace.
        fill = tl.where(poison, float("nan"), float("-inf")) + tl.zeros([BLOCK_H], dtype=tl.float32)
        zero = tl.zeros([BLOCK_H, CHUNK], dtype=tl.float32)
        for f2 in range(tl.where(poison, f_first, f), f_stop):
            store_partial(
                part_o, part_lse, f2, s_po_s, s_pl_s, r, row_ok, own_lse, zero, zero, fill, offs_a, offs_b,
                D_NOPE, D_SPLIT, V_SPLIT,
            )  # fmt: skip
    else:
        inv, lse2 = close_split(m_i, l_i, osc, poison, FP8_PV, LOG2_PMAX)
        if DIRECT:
            o_row = out + q_row[:, None] * s_o_r + h[:, None] * s_o_h
            tl.store(o_row + offs_a[None, :] * s_o_d, (acc_a * inv).to(out.dtype.element_ty), mask=row_ok[:, None])
            if D_SPLIT == 2 and V_SPLIT == 1:
                tl.store(o_row + offs_b[None, :] * s_o_d, (acc_b * inv).to(out.dtype.element_ty), mask=row_ok[:, None])
            tl.store(lse + q_row * s_l_r + h * s_l_h, lse2 * 0.6931471805599453, mask=row_ok & own_lse)
        else:
            # An empty split writes only its lse (-inf, NaN on a bad page): stage 2 reads no partial
            # past the request's own splits. An own split that is empty for this head block (MTP:
            # past its rows' last key) writes its zero partial too (acc is 0, inv finite): the
            # batch-invariant reduce reads every own split's.
            write_o = end > start
            if SPLIT_TOKENS > 0:
                write_o = write_o | ((f_first < f_stop) & (bad_page == 0))
            if write_o:
                store_partial(
                    part_o, part_lse, split, s_po_s, s_pl_s, r, row_ok, own_lse, acc_a * inv, acc_b * inv, lse2,
                    offs_a, offs_b, D_NOPE, D_SPLIT, V_SPLIT,
                )  # fmt: skip
            else:
                split64 = split.to(tl.int64)  # S x rows x N x 512 can pass 2^31
                tl.store(part_lse + split64 * s_pl_s + r, lse2, mask=row_ok & own_lse)


__all__ = ["mla_decode_stage1_kernel", "mla_decode_reduce_kernel"]
