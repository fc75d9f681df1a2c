"""Triton body of mla_prefill (wrapper: rocm_mla/ops/prefill.py).

FlashAttention-2 forward for MLA prefill, varlen, reading the model's tensors where they lie:

    q       [Tq, N, D_NOPE + D_ROPE]   nope part then rope part of each head (192 = 128 + 64)
    k_nope  [Tk, N, D_NOPE]            e.g. kv_b_proj(...)[Tk, N, 256][..., :128] (strided view)
    k_pe    [Tk, 1 or N, D_ROPE]       one rope head broadcast over N (head stride 0), or a slice
                                       of the [Tk, 576] latent buffer
    v       [Tk, N, D_V]               e.g. the same [Tk, N, 256] buffer [..., 128:]
    out     [Tq, N, D_V]               written in place, any strides
    lse     [N, Tq] float32            natural-log LSE, written in place, any strides

so there is no ``cat(k_nope, k_pe.expand)``, no padding of v to 192 and no slice copy of the output.
Scores are two dots accumulated into one tile: ``q_nope @ k_nope^T + q_pe @ k_pe^T``.

Head geometry (P, R, V) = (D_NOPE, D_ROPE, D_V), any of MLA's: (128, 64, 128) DeepSeek-V2/V3, (192, 64,
256) GLM-4.x-Lite, (64, 64, 128), (256, 0, 256). tl.arange wants powers of two, so each dim is tiled by
BLOCK_DN / BLOCK_DR / BLOCK_DV (the next power of two, >= 16 for tl.dot) and, where that is wider than
the dim, the columns past it are masked in every load (read as 0, so they add 0 to the scores and to
acc) and in the store: nothing past a head's last column is read or written, nothing is padded in
memory. Where tile and dim agree the masks are not emitted at all (constexpr branches), so the
(128, 64, 128) kernel is the same code with or without this generality. D_ROPE == 0 (no RoPE part)
removes the k_pe loads and the second dot; KPE is then never read.

Grid: one axis of num_slots x N programs. Slot -> (sequence, q block) needs no host table and no
host sync: sequence b owns the slots ``first(b) = cu_seqlens_q[b] // BLOCK_M + b`` onward. ``first`` grows by
at least ceil(lq_b / BLOCK_M) from one sequence to the next, so the ranges never overlap, and
``Tq // BLOCK_M + B`` slots cover every sequence (a slot between ranges exits at once). A program
finds its sequence by counting the ``first(b) <= slot`` with vector loads of SEQ_CHUNK entries of
cu_seqlens_q (one pass for B <= SEQ_CHUNK). Within a sequence the last (causally heaviest) q block
takes the lowest slot, so long programs start first and short ones fill the tail.

Programs are numbered (head group, slot, head within the group), head_group heads per group (a
divisor of N; the wrapper picks it): GPUs start programs roughly in that order, so the group's
heaviest q blocks of all its heads start together and its light ones end it. Numbered (head, slot)
instead, the last head's heaviest block would start when only that head's work was left, and run
on alone while the rest of the GPU idled (docs/notes/prefill-tma-and-head-groups.md). Groups, not
all N heads at once: the programs running together then read the K/V of head_group heads, which
stays in L2 between one q block and the next.

Per program (BLOCK_M queries of one sequence, one head), keys are visited in two loops:
  1. blocks every row of the tile fully sees: no mask at all (loads, scores);
  2. the causal diagonal and the ragged end of the sequence: masked
  (and under USE_TMA 2 a third, of one step at most: the block that crosses the sequence's end).
Causal masking is bottom-right aligned (query i of a sequence with lq queries and lk keys sees
keys j <= i + lk - lq); blocks beyond the diagonal are never loaded. The online softmax runs in
fp32 in the exp2 domain (log2(e) folded into the score scale); a row that sees no key ends with
l == 0 and is written as 0 with lse -inf. NaN is not "no key": a NaN in q, or in the K of a key
the row sees, makes l NaN and the row's out and lse NaN (a NaN in a K the row does not see is
masked to -inf and does not reach it). A NaN in V reaches every row that sees that key; it can
also reach rows of the same diagonal tile that do not (0 * NaN in the P.V product, as in
FlashAttention), never rows of other tiles.

USE_TMA (sm90, launch option "tma"): K, k_pe and V blocks come through Hopper TMA tensor
descriptors (asynchronous bulk copies into shared memory, no per-thread address math) instead of
pointer loads. 1 ("tma": true): per-program descriptors over the sequence's keys, built in global
memory by each program (zero fill past the sequence's last key). 2 ("tma": "host"): descriptors the
wrapper builds once on the host over all heads of a row (q's too); the rows past a sequence's end
are the next sequence's, so the key block that crosses the end goes through loop 3's masked pointer
loads. Per-program descriptors cost each program three global-memory builds, which short
sequences do not amortise (docs/notes/prefill-tma-and-head-groups.md).
Compiled elsewhere (gfx942, the interpreter) descriptors become pointer loads again; the wrapper
only turns TMA on for NVIDIA (and the interpreter, to test the path).

Addresses: a sequence's base is computed in int64 (Tk x token stride passes 2^31 at ~64k tokens
with N=128) and advanced per key block as a scalar pointer; the per-tile offsets stay int32 and loop
invariant, so a key block costs one scalar add per operand, not a 64-bit multiply per element
(gfx942 with triton 3.7.1: 16-byte global_load_dwordx4 for K and V). The kernel calls no other
@triton.jit function so that the ISA report can compile it from a process that imported it under
TRITON_INTERPRET=1 (rocm_mla.tools.isa_report.triton_compile.as_jit).
"""

import triton
import triton.language as tl


@triton.jit
def mla_prefill_kernel(
    Q,
    KN,
    KPE,
    V,
    O,  # noqa: E741 - the output pointer, named like Q and V
    LSE,
    CU_Q,
    CU_K,
    QN_D,  # USE_TMA 2: host tensor descriptors (else None), see USE_TMA in the module docstring
    QP_D,
    KN_D,
    KP_D,
    V_D,
    qk_scale,  # sm_scale * log2(e): scores go straight into exp2
    num_seqs,
    num_slots,  # Tq // BLOCK_M + B (see Grid in the module docstring)
    head_group,  # heads per program group, a divisor of N (not a constexpr; Triton still specialises 1)
    num_q_rows,
    num_k_rows,  # Tq, Tk: the bound guard below
    q_st,
    q_sh,
    q_sd,
    kn_st,
    kn_sh,
    kn_sd,
    kpe_st,
    kpe_sh,
    kpe_sd,
    v_st,
    v_sh,
    v_sd,
    o_st,
    o_sh,
    o_sd,
    lse_sh,
    lse_st,
    cuq_s,
    cuk_s,
    D_NOPE: tl.constexpr,
    D_ROPE: tl.constexpr,
    D_V: tl.constexpr,
    BLOCK_DN: tl.constexpr,  # the tiles of D_NOPE, D_ROPE, D_V: powers of two >= 16 (>= the dim)
    BLOCK_DR: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SEQ_CHUNK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DIAG_STAGES: tl.constexpr,
    USE_TMA: tl.constexpr,  # 0 pointer loads, 1 per-program descriptors, 2 host descriptors
):
    # 1-D grid in dispatch order: head groups, then slots, then the group's heads (see Grid).
    pid = tl.program_id(0)
    per_group = num_slots * head_group
    group = pid // per_group
    r = pid - group * per_group
    slot = r // head_group
    h = (group * head_group + (r - slot * head_group)).to(tl.int64)

    # ---- which sequence owns this slot. Sequence b's q rows are taken as [lo(b), lo(b + 1)) with
    # lo(b) = max(cu_q[0..b]) clamped to [0, Tq] -- its own rows for valid offsets, and for any
    # offsets consecutive disjoint ranges inside q, so that the slots ``first(b) = lo(b) // BLOCK_M
    # + b`` grow with b and cover every row. The owner is the last b with first(b) <= slot, found
    # without a prefix scan: first(b) > slot exactly when some b' <= b has
    # clamp(cu_q[b']) // BLOCK_M > slot - b, so the first failing b is min over b' of
    # max(b', slot + 1 - clamp(cu_q[b']) // BLOCK_M).
    fail = num_seqs
    for c in range(0, num_seqs, SEQ_CHUNK):
        idx = c + tl.arange(0, SEQ_CHUNK)
        ok = idx < num_seqs
        starts = tl.minimum(tl.maximum(tl.load(CU_Q + idx * cuq_s, mask=ok, other=0), 0), num_q_rows)
        fails_at = tl.where(ok, tl.maximum(idx, slot + 1 - starts // BLOCK_M), num_seqs)
        fail = tl.minimum(fail, tl.min(fails_at, axis=0))
    seq = fail - 1
    if seq < 0:
        return
    q_lo = tl.zeros([], dtype=tl.int32)
    for c in range(0, seq + 1, SEQ_CHUNK):
        idx = c + tl.arange(0, SEQ_CHUNK)
        starts = tl.load(CU_Q + idx * cuq_s, mask=idx <= seq, other=0)
        q_lo = tl.maximum(q_lo, tl.max(tl.minimum(tl.maximum(starts, 0), num_q_rows), axis=0))
    cu_q0 = tl.load(CU_Q + seq * cuq_s)
    cu_q1 = tl.load(CU_Q + (seq + 1) * cuq_s)
    cu_k0 = tl.load(CU_K + seq * cuk_s)
    cu_k1 = tl.load(CU_K + (seq + 1) * cuk_s)
    # ---- bound guard: cu_seqlens on a GPU are not validated (that would sync). A sequence whose
    # bounds are invalid -- q: cu_q[b] < 0, decreasing, past Tq, or below an earlier sequence's
    # start (overlapping rows); k: cu_k[b] < 0, decreasing, past Tk -- gets NaN out and lse in every
    # row it owns (l starts at NaN, below), detected here from the offsets alone. Every access stays in
    # the tensors: rows [q_start, q_end) of q/out/lse within [0, Tq), keys within [0, Tk).
    bad_seq = (cu_q1 < cu_q0) | (cu_q1 > num_q_rows) | (q_lo != cu_q0)
    bad_seq = bad_seq | (cu_k0 < 0) | (cu_k1 < cu_k0) | (cu_k1 > num_k_rows)
    q_start = q_lo
    q_end = tl.minimum(tl.maximum(cu_q1, q_start), num_q_rows)
    k_start = tl.minimum(tl.maximum(cu_k0, 0), num_k_rows)
    k_end = tl.minimum(tl.maximum(cu_k1, k_start), num_k_rows)
    # ---- end of the bound guard
    lq = q_end - q_start
    lk = k_end - k_start
    n_mblocks = (lq + BLOCK_M - 1) // BLOCK_M
    j = slot - (q_start // BLOCK_M + seq)
    if j >= n_mblocks:
        return  # a slot between two sequences' ranges (or past the last one)
    m0 = (n_mblocks - 1 - j) * BLOCK_M  # heaviest causal block first

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    d_nope = tl.arange(0, BLOCK_DN)
    d_rope = tl.arange(0, BLOCK_DR)
    d_v = tl.arange(0, BLOCK_DV)
    # Column masks of tiles wider than their dim; used only under `BLOCK_D* != D_*` (else unused).
    dn_ok = d_nope < D_NOPE
    dr_ok = d_rope < D_ROPE
    dv_ok = d_v < D_V
    rows = m0 + offs_m  # query index within the sequence
    row_ok = rows < lq

    # ---- Q tile, loaded once: nope [BLOCK_M, D_NOPE] and rope [BLOCK_M, D_ROPE] parts.
    if USE_TMA == 2:
        # Rows past the sequence belong to the next one (or are TMA's zero fill past Tq): each
        # row's softmax is its own and those rows are never stored, so they cannot reach ours.
        # (The plan takes this mode only where every tile equals its dim: a host descriptor's
        # columns past a head's dim are the next head's, not zero fill.)
        q_nope = QN_D.load([q_start + m0, (h * q_sh).to(tl.int32)])
        if D_ROPE > 0:
            q_pe = QP_D.load([q_start + m0, (h * q_sh).to(tl.int32) + D_NOPE])
    else:
        q_base = Q + (q_start + m0).to(tl.int64) * q_st + h * q_sh
        qn_mask = row_ok[:, None]
        if BLOCK_DN != D_NOPE:
            qn_mask = qn_mask & dn_ok[None, :]
        q_nope = tl.load(q_base + offs_m[:, None] * q_st + d_nope[None, :] * q_sd, mask=qn_mask, other=0.0)
        if D_ROPE > 0:
            qp_mask = row_ok[:, None]
            if BLOCK_DR != D_ROPE:
                qp_mask = qp_mask & dr_ok[None, :]
            q_pe = tl.load(q_base + offs_m[:, None] * q_st + (D_NOPE + d_rope)[None, :] * q_sd, mask=qp_mask, other=0.0)

    # K is read transposed ([D, BLOCK_N] tiles) so the score dot needs no permute.
    kn_base = KN + k_start.to(tl.int64) * kn_st + h * kn_sh
    kpe_base = KPE + k_start.to(tl.int64) * kpe_st + h * kpe_sh  # kpe_sh == 0: one head for all
    v_base = V + k_start.to(tl.int64) * v_st + h * v_sh
    kn_off = d_nope[:, None] * kn_sd + offs_n[None, :] * kn_st
    kpe_off = d_rope[:, None] * kpe_sd + offs_n[None, :] * kpe_st
    v_off = offs_n[:, None] * v_st + d_v[None, :] * v_sd

    # ---- key ranges. diag: query i sees keys j <= i + diag.
    diag = lk - lq
    if CAUSAL:
        seen_by_all = tl.minimum(m0 + diag + 1, lk)  # keys the tile's first row sees
        hi = tl.minimum(m0 + BLOCK_M + diag, lk)  # keys its last row sees
    else:
        seen_by_all = lk
        hi = lk
    n_full = tl.maximum(seen_by_all, 0) // BLOCK_N * BLOCK_N
    hi = tl.maximum(hi, n_full)

    hi_in = hi  # the masked loop's end; USE_TMA 2 leaves a tile that crosses lk to loop 3
    if USE_TMA == 2:
        hi_in = tl.maximum(tl.minimum(hi, lk // BLOCK_N * BLOCK_N), n_full)
        kn_col = (h * kn_sh).to(tl.int32)
        kpe_col = (h * kpe_sh).to(tl.int32)
        v_col = (h * v_sh).to(tl.int32)
    if USE_TMA == 1:
        # Per-program 2-D descriptors over this sequence's keys of this head: rows [0, lk) of k_nope,
        # k_pe, v from the sequence's base (the wrapper checked 16-byte aligned bases and row
        # strides, unit inner strides). Rows past lk read as 0 (TMA zero fill), so no load needs a
        # mask -- not even another sequence's NaN can reach this one.
        # A tile wider than its dim reads TMA's zero fill past the dim's last column.
        lk_box = tl.maximum(lk, 1)
        kn_desc = tl.make_tensor_descriptor(
            kn_base, shape=[lk_box, D_NOPE], strides=[kn_st, 1], block_shape=[BLOCK_N, BLOCK_DN]
        )
        if D_ROPE > 0:
            kpe_desc = tl.make_tensor_descriptor(
                kpe_base, shape=[lk_box, D_ROPE], strides=[kpe_st, 1], block_shape=[BLOCK_N, BLOCK_DR]
            )
        v_desc = tl.make_tensor_descriptor(
            v_base, shape=[lk_box, D_V], strides=[v_st, 1], block_shape=[BLOCK_N, BLOCK_DV]
        )

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    # Invalid bounds (the guard above) start l at NaN: it stays NaN through every update, so the
    # epilogue writes NaN out and lse, and no flag is held across the loops.
    l_i = tl.where(bad_seq, float("nan"), tl.zeros([BLOCK_M], dtype=tl.float32))
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # ---- loop 1: key blocks that every row sees in full -- no masks.
    # Scalar base pointers walk the key blocks (int64 arithmetic); the tile offsets stay int32.
    kn_ptr = kn_base
    kpe_ptr = kpe_base
    v_ptr = v_base
    for start_n in range(0, n_full, BLOCK_N):
        # (load, dot, load, dot: both loads ahead of both dots hold both tiles at once, which costs
        # gfx942 registers: docs/notes/prefill-tma-and-head-groups.md)
        if USE_TMA == 2:
            kt = tl.trans(KN_D.load([k_start + start_n, kn_col]))
        elif USE_TMA == 1:
            kt = tl.trans(kn_desc.load([start_n, 0]))
        elif BLOCK_DN == D_NOPE:
            kt = tl.load(kn_ptr + kn_off)
        else:
            kt = tl.load(kn_ptr + kn_off, mask=dn_ok[:, None], other=0.0)
        s = tl.dot(q_nope, kt, input_precision=DOT_PREC)
        if D_ROPE > 0:
            if USE_TMA == 2:
                kt_pe = tl.trans(KP_D.load([k_start + start_n, kpe_col]))
            elif USE_TMA == 1:
                kt_pe = tl.trans(kpe_desc.load([start_n, 0]))
            elif BLOCK_DR == D_ROPE:
                kt_pe = tl.load(kpe_ptr + kpe_off)
            else:
                kt_pe = tl.load(kpe_ptr + kpe_off, mask=dr_ok[:, None], other=0.0)
            s = tl.dot(q_pe, kt_pe, s, input_precision=DOT_PREC)
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_TMA == 2:
            vt = V_D.load([k_start + start_n, v_col])
        elif USE_TMA == 1:
            vt = v_desc.load([start_n, 0])
        elif BLOCK_DV == D_V:
            vt = tl.load(v_ptr + v_off)
        else:
            vt = tl.load(v_ptr + v_off, mask=dv_ok[None, :], other=0.0)
        acc = tl.dot(p.to(vt.dtype), vt, acc, input_precision=DOT_PREC)
        m_i = m_new
        kn_ptr += BLOCK_N * kn_st
        kpe_ptr += BLOCK_N * kpe_st
        v_ptr += BLOCK_N * v_st

    # ---- loop 2: the causal diagonal and the sequence's ragged end -- masked.
    # Loop 1 left the pointers at key n_full whether or not it ran. It runs BLOCK_M / BLOCK_N + 1
    # steps at most, so its software pipelining is a launch option of its own (DIAG_STAGES): on
    # gfx942 unpipelined (1) it saves registers and a second copy of the loop's MFMA code; on sm90
    # the pipelined loop keeps cp.async (unpipelined loads go through registers). The compile
    # report's figures: docs/notes/prefill-tma-and-head-groups.md.
    for start_n in tl.range(n_full, hi_in, BLOCK_N, num_stages=DIAG_STAGES):
        cols = start_n + offs_n
        col_ok = cols < lk
        if USE_TMA == 2:
            kt = tl.trans(KN_D.load([k_start + start_n, kn_col]))
        elif USE_TMA == 1:
            kt = tl.trans(kn_desc.load([start_n, 0]))
        else:
            kn_mask = col_ok[None, :]
            if BLOCK_DN != D_NOPE:
                kn_mask = kn_mask & dn_ok[:, None]
            kt = tl.load(kn_ptr + kn_off, mask=kn_mask, other=0.0)
        s = tl.dot(q_nope, kt, input_precision=DOT_PREC)
        if D_ROPE > 0:
            if USE_TMA == 2:
                kt_pe = tl.trans(KP_D.load([k_start + start_n, kpe_col]))
            elif USE_TMA == 1:
                kt_pe = tl.trans(kpe_desc.load([start_n, 0]))
            else:
                kp_mask = col_ok[None, :]
                if BLOCK_DR != D_ROPE:
                    kp_mask = kp_mask & dr_ok[:, None]
                kt_pe = tl.load(kpe_ptr + kpe_off, mask=kp_mask, other=0.0)
            s = tl.dot(q_pe, kt_pe, s, input_precision=DOT_PREC)
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + diag)
        s = tl.where(keep, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with no visible key so far keeps m = -inf; subtracting 0 keeps its p at 0, not NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if USE_TMA == 2:
            vt = V_D.load([k_start + start_n, v_col])
        elif USE_TMA == 1:
            vt = v_desc.load([start_n, 0])
        else:
            v_mask = col_ok[:, None]
            if BLOCK_DV != D_V:
                v_mask = v_mask & dv_ok[None, :]
            vt = tl.load(v_ptr + v_off, mask=v_mask, other=0.0)
        acc = tl.dot(p.to(vt.dtype), vt, acc, input_precision=DOT_PREC)
        m_i = m_new
        kn_ptr += BLOCK_N * kn_st
        kpe_ptr += BLOCK_N * kpe_st
        v_ptr += BLOCK_N * v_st

    # ---- loop 3 (USE_TMA 2 only, one step at most): the key block that crosses the sequence's
    # end. A host descriptor's rows past lk are the next sequence's keys: their scores are masked
    # like any, but P.V would still multiply their V by 0 -- a NaN there would reach this sequence.
    # So this block comes through masked pointer loads (0 past lk), as in loop 2 without TMA.
    if USE_TMA == 2:
        # From the bases, not from loops 1-2's walking pointers: those go unused under USE_TMA 2
        # and so compile away.
        kn_ptr = kn_base + hi_in.to(tl.int64) * kn_st
        kpe_ptr = kpe_base + hi_in.to(tl.int64) * kpe_st
        v_ptr = v_base + hi_in.to(tl.int64) * v_st
        for start_n in tl.range(hi_in, hi, BLOCK_N, num_stages=1):
            cols = start_n + offs_n
            col_ok = cols < lk
            kt = tl.load(kn_ptr + kn_off, mask=col_ok[None, :], other=0.0)
            s = tl.dot(q_nope, kt, input_precision=DOT_PREC)
            if D_ROPE > 0:
                kt_pe = tl.load(kpe_ptr + kpe_off, mask=col_ok[None, :], other=0.0)
                s = tl.dot(q_pe, kt_pe, s, input_precision=DOT_PREC)
            keep = col_ok[None, :]
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None] + diag)
            s = tl.where(keep, s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_use[:, None])
            alpha = tl.math.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            vt = tl.load(v_ptr + v_off, mask=col_ok[:, None], other=0.0)
            acc = tl.dot(p.to(vt.dtype), vt, acc, input_precision=DOT_PREC)
            m_i = m_new
            kn_ptr += BLOCK_N * kn_st
            kpe_ptr += BLOCK_N * kpe_st
            v_ptr += BLOCK_N * v_st

    # ---- epilogue: l == 0 exactly when the row saw no key (the row max contributes exp2(0) = 1);
    # only then out 0, lse -inf. l is NaN when a key the row saw (or its q) holds a NaN: that NaN
    # goes on into out and lse, never read as "no key" (`l > 0` would have been false for it).
    blind = l_i == 0.0
    l_safe = tl.where(blind, 1.0, l_i)
    out = tl.where(blind[:, None], 0.0, acc * (1.0 / l_safe)[:, None])
    o_base = O + (q_start + m0).to(tl.int64) * o_st + h * o_sh
    o_mask = row_ok[:, None]
    if BLOCK_DV != D_V:
        o_mask = o_mask & dv_ok[None, :]
    tl.store(o_base + offs_m[:, None] * o_st + d_v[None, :] * o_sd, out.to(O.dtype.element_ty), mask=o_mask)
    # Back from the log2 domain: lse = ln(2) * (m + log2(l)).
    lse = tl.where(blind, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    lse_base = LSE + h * lse_sh + (q_start + m0).to(tl.int64) * lse_st
    tl.store(lse_base + offs_m * lse_st, lse, mask=row_ok)
