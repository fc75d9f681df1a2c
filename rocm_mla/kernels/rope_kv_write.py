"""Triton body of fused_rope_mla_kv_write / concat_and_cache_mla (wrapper: rocm_mla/ops/rope_kv_write.py).

One pass. A program owns TOKENS consecutive tokens: it rotates their q_pe heads in place, walking
the (token, head) rows in [BLOCK_R, 64] tiles (full tiles whatever N is: 16 heads x 8 tokens
is one 128-row sweep), rotates their k_pe in place ([TOKENS, 64]), and writes their cache rows
[kv_c | rope(k_pe)] ([TOKENS, 512] + [TOKENS, 64]) at slot_mapping[t], masked where the slot is
negative or t >= len(slot_mapping). Rotation is float32 with one rounding per store.

Bound guards (no extra loads; a compare and a select per token / row): a slot >= num_slots
(num_blocks x block_size) is skipped like -1; a position outside [0, max_pos) reads cos/sin row 0
with cos replaced by NaN (a NaN cos makes both outputs of each rotation pair NaN), so that token's
q_pe, k_pe and the rope part of its cache row are NaN (its kv_c part is cached as given). Nothing
outside the given tensors is read or written.

GPT-J pairs (2i, 2i+1) are neighbours: the tile is loaded whole (contiguous, 16-byte accesses),
reshaped [.., 32, 2] and split, so a pair lives in one thread's registers. NeoX pairs (i, i+32)
are the two halves of the head: loaded as two [.., 32] tiles, no shuffle at all.

FP8 caches are written as their bit patterns through a uint8 view, by the same integer code as
hip_src/kernels/fp8.cuh (round to nearest even, saturating, fnuz without -0): identical on every
vendor and in the CPU interpreter, and independent of which fp8 types a Triton backend knows
(NVIDIA's has no e4m3fnuz). Addresses are int64 (slot x row stride passes 2^31 on big caches),
except the cos/sin row offset, 32-bit below the guard's bound unless CS_I64.
"""

import triton
import triton.language as tl

from .fp8_codes import fp8_e4m3_code


@triton.jit
def _to_cache(x, k_scale, cache_ty, CACHE_KIND: tl.constexpr):
    """float32 values -> what the cache stores: CACHE_KIND 0 its dtype (q's), 1 / 2 e4m3fn /
    e4m3fnuz codes of x / k_scale (the wrapper's ``_FP8_KIND``)."""
    if CACHE_KIND == 0:
        return x.to(cache_ty)
    else:
        # Correctly rounded division (Triton's `/` is approximate on NVIDIA): the code matches
        # torch's x / k_scale exactly.
        return fp8_e4m3_code(tl.math.div_rn(x, k_scale), CACHE_KIND == 2)


@triton.jit
def _rotate(x1, x2, cos, sin):
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _cs_offset(pos, pok, cs_sp, CS_I64: tl.constexpr):
    """Element offset of the cos/sin row of ``pos`` (row 0 where ``pok`` is false). The guard bounds
    the row below max_pos, so the offset is 32-bit unless the wrapper says the cache's extent needs
    64 (CS_I64): the 64-bit form makes the guard cost measurable, the 32-bit one leaves it in the
    noise (docs/notes/bound-guards.md)."""
    row = tl.where(pok, pos, 0)
    if not CS_I64:
        row = row.to(tl.int32)
    return row * cs_sp


@triton.jit
def rope_mla_kv_write_kernel(
    positions,
    q_pe,
    k_pe,
    kv_c,
    cos_sin,
    cache,
    slot_mapping,
    k_scale,
    num_tokens,
    num_heads,
    num_cached,
    block_size,
    num_slots,
    max_pos,
    q_st,
    q_sh,
    q_sd,
    k_st,
    k_sd,
    c_st,
    c_sd,
    cs_sp,
    cs_sd,
    kv_sb,
    kv_so,
    kv_sd,
    ROPE: tl.constexpr,
    IS_NEOX: tl.constexpr,
    TOKENS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    CACHE_KIND: tl.constexpr,
    CS_I64: tl.constexpr = False,
):
    t0 = tl.program_id(0).to(tl.int64) * TOKENS
    d32 = tl.arange(0, 32)
    d64 = tl.arange(0, 64)
    q_ty = k_pe.dtype.element_ty
    cache_ty = cache.dtype.element_ty
    scale = 1.0
    if CACHE_KIND != 0:
        scale = tl.load(k_scale)  # on the device: no host sync, CUDA graphs see its current value

    tok = t0 + tl.arange(0, TOKENS)
    tmask = tok < num_tokens
    slot = tl.load(slot_mapping + tok, mask=tok < num_cached, other=-1)
    smask = (slot >= 0) & (slot < num_slots)  # guard: a slot outside the cache is skipped like -1
    slot = tl.where(smask, slot, 0)
    blk = slot // block_size
    dst = cache + blk * kv_sb + (slot - blk * block_size) * kv_so  # [TOKENS] row pointers
    k_rows = k_pe + tok * k_st

    if ROPE:
        # q_pe: the program's TOKENS x N rows, BLOCK_R at a time.
        # int32 rows: r // num_heads below is then a 32-bit division (64-bit ones are long on GPUs).
        n_rows = (tl.minimum(num_tokens - t0, TOKENS) * num_heads).to(tl.int32)
        for r0 in range(0, n_rows, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            rmask = r < n_rows
            tr = t0 + r // num_heads
            hr = r % num_heads
            # Guard: a position outside [0, max_pos) reads no cos/sin; NaN makes the row NaN.
            pos = tl.load(positions + tr, mask=rmask, other=0)
            pok = pos.to(tl.uint64) < max_pos.to(tl.uint64)  # one compare: a negative one is huge
            cs = cos_sin + _cs_offset(pos, pok, cs_sp, CS_I64)
            # NaN in cos alone makes both outputs of every pair NaN: sin needs no select.
            pm = (rmask & pok)[:, None]
            cos = tl.load(cs[:, None] + d32[None, :] * cs_sd, mask=pm, other=float("nan")).to(tl.float32)
            sin = tl.load(cs[:, None] + (d32[None, :] + 32) * cs_sd, mask=rmask[:, None]).to(tl.float32)
            rows = q_pe + tr * q_st + hr * q_sh
            m2 = rmask[:, None]
            if IS_NEOX:
                p1 = rows[:, None] + d32[None, :] * q_sd
                p2 = rows[:, None] + (d32[None, :] + 32) * q_sd
                o1, o2 = _rotate(tl.load(p1, mask=m2).to(tl.float32), tl.load(p2, mask=m2).to(tl.float32), cos, sin)
                tl.store(p1, o1.to(q_ty), mask=m2)
                tl.store(p2, o2.to(q_ty), mask=m2)
            else:
                pq = rows[:, None] + d64[None, :] * q_sd
                xe, xo = tl.split(tl.reshape(tl.load(pq, mask=m2).to(tl.float32), (BLOCK_R, 32, 2)))
                oe, oo = _rotate(xe, xo, cos, sin)
                tl.store(pq, tl.reshape(tl.join(oe, oo), (BLOCK_R, 64)).to(q_ty), mask=m2)

        # k_pe: rotated in place whatever the slot; its float32 rotation also feeds the cache.
        pos = tl.load(positions + tok, mask=tmask, other=0)
        pok = pos.to(tl.uint64) < max_pos.to(tl.uint64)  # the same guard as q_pe's
        cs = cos_sin + _cs_offset(pos, pok, cs_sp, CS_I64)
        km = tmask[:, None]
        pm = (tmask & pok)[:, None]
        cos = tl.load(cs[:, None] + d32[None, :] * cs_sd, mask=pm, other=float("nan")).to(tl.float32)
        sin = tl.load(cs[:, None] + (d32[None, :] + 32) * cs_sd, mask=km).to(tl.float32)
        if IS_NEOX:
            p1 = k_rows[:, None] + d32[None, :] * k_sd
            p2 = k_rows[:, None] + (d32[None, :] + 32) * k_sd
            r1, r2 = _rotate(tl.load(p1, mask=km).to(tl.float32), tl.load(p2, mask=km).to(tl.float32), cos, sin)
            tl.store(p1, r1.to(q_ty), mask=km)
            tl.store(p2, r2.to(q_ty), mask=km)
        else:
            pk = k_rows[:, None] + d64[None, :] * k_sd
            ke, ko = tl.split(tl.reshape(tl.load(pk, mask=km).to(tl.float32), (TOKENS, 32, 2)))
            re, ro = _rotate(ke, ko, cos, sin)
            k_rot = tl.reshape(tl.join(re, ro), (TOKENS, 64))
            tl.store(pk, k_rot.to(q_ty), mask=km)

    # Cache rows: [kv_c | k], only where the slot is valid.
    cm = smask[:, None]
    d512 = tl.arange(0, 512)
    kvc = tl.load(kv_c + tok[:, None] * c_st + d512[None, :] * c_sd, mask=cm).to(tl.float32)
    tl.store(dst[:, None] + d512[None, :] * kv_sd, _to_cache(kvc, scale, cache_ty, CACHE_KIND), mask=cm)
    kdst = dst[:, None] + 512 * kv_sd
    if ROPE and IS_NEOX:
        tl.store(kdst + d32[None, :] * kv_sd, _to_cache(r1, scale, cache_ty, CACHE_KIND), mask=cm)
        tl.store(kdst + (d32[None, :] + 32) * kv_sd, _to_cache(r2, scale, cache_ty, CACHE_KIND), mask=cm)
    elif ROPE:
        tl.store(kdst + d64[None, :] * kv_sd, _to_cache(k_rot, scale, cache_ty, CACHE_KIND), mask=cm)
    else:
        k_in = tl.load(k_rows[:, None] + d64[None, :] * k_sd, mask=cm).to(tl.float32)
        tl.store(kdst + d64[None, :] * kv_sd, _to_cache(k_in, scale, cache_ty, CACHE_KIND), mask=cm)
