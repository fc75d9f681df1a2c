"""Triton body of indexer_k_cache_write (wrapper: rocm_mla/ops/indexer_cache.py).

One program quantises ROWS key rows ``k [T, 128]`` and writes each into the lightning indexer's
cache at its slot: 128 fp8 codes and one float32 scale per token, in vLLM 0.34's ROCm layout
(docs/indexer.md; the definition: rocm_mla/reference/indexer.py). A block is ``block_size x 128``
value bytes, then ``block_size`` float32 scales; SHUFFLE stores the values in 16 x 16 tiles
``[block_size / 16, 8, 16, 16]`` (token tile, dim tile, token, dim) instead of flat rows.

Scale: ``max(1e-4, amax) / FP8_MAX``, rounded up to a power of two on its bits when UE8M0 (exact,
so the CPU interpreter, every GPU and the torch reference agree); values ``x / scale`` with a
correctly rounded division (Triton's ``/`` is approximate on NVIDIA) and the integer e4m3 code of
kernels/fp8_codes.py (the interpreter's own float -> e4m3 conversion drops rounding carries).
A NaN in a row makes its scale NaN explicitly: ``tl.max`` and ``tl.maximum`` may drop a NaN.

Bound guard: a slot outside ``[0, num_slots)`` (-1 included) and a row ``>= num_slot_rows`` (the
slot mapping's length, at most k's rows) are not written; nothing else is read or written. Addresses are int64 (a
block stride times a block id passes 2^31 on large caches).
"""

import triton
import triton.language as tl

from .fp8_codes import fp8_e4m3_code


@triton.jit
def _round_up_pow2(s):
    """The smallest power of two >= s (float32 > 0), from the bits; NaN and inf unchanged."""
    bits = s.to(tl.int32, bitcast=True)
    up = (bits & 0x7F800000) + 0x800000
    round_up = ((bits & 0x7FFFFFFF) < 0x7F800000) & ((bits & 0x7FFFFF) != 0)
    return tl.where(round_up, up, bits).to(tl.float32, bitcast=True)


@triton.jit
def indexer_k_cache_write_kernel(
    k,
    cache,
    slot_mapping,
    num_slot_rows,
    num_slots,
    block_size,
    s_k_row,
    s_k_dim,
    s_blk,
    HEAD_DIM: tl.constexpr,
    ROWS: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FNUZ: tl.constexpr,
    UE8M0: tl.constexpr,
    SHUFFLE: tl.constexpr,
    TILE: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    in_map = rows < num_slot_rows  # the slot mapping's length: rows past it are padding
    slot = tl.load(slot_mapping + rows, mask=in_map, other=-1)
    ok = in_map & (slot >= 0) & (slot < num_slots)
    # In range, so int32 (the wrapper bounds num_slots by 2^31 - 1): a 32-bit divide and modulo by
    # block_size instead of a 64-bit divide routine on the one dependent chain of a decode step.
    slot = tl.where(ok, slot, 0).to(tl.int32)
    d = tl.arange(0, HEAD_DIM)
    x = tl.load(k + rows.to(tl.int64)[:, None] * s_k_row + d[None, :] * s_k_dim, mask=ok[:, None], other=0.0)
    x = x.to(tl.float32)
    has_nan = tl.max((x != x).to(tl.int32), axis=1) > 0
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4), FP8_MAX)
    if UE8M0:
        scale = _round_up_pow2(scale)
    scale = tl.where(has_nan, float("nan"), scale)
    codes = fp8_e4m3_code(tl.math.div_rn(x, scale[:, None]), FNUZ)
    blk = (slot // block_size).to(tl.int64)
    off = slot % block_size
    if SHUFFLE:
        row_off = (off // TILE) * (TILE * HEAD_DIM) + (off % TILE) * TILE
        d_off = (d // TILE) * (TILE * TILE) + d % TILE
    else:
        row_off = off * HEAD_DIM
        d_off = d
    base = blk * s_blk
    tl.store(cache + (base + row_off)[:, None] + d_off[None, :], codes, mask=ok[:, None])
    # The scale's 4 bytes: 4-aligned (the wrapper checks the cache's start and block stride).
    scale_ptr = (cache + base + block_size * HEAD_DIM + off * 4).to(tl.pointer_type(tl.float32), bitcast=True)
    tl.store(scale_ptr, scale, mask=ok)
