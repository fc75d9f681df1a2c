"""float32 -> FP8 E4M3 codes in integer arithmetic, shared by the Triton kernels that write or
make fp8 values (rope_kv_write's cache rows, mla_decode's quantised q).

Integer code rather than ``.to(float8)``: the same bits on every vendor and in the CPU interpreter
(whose float -> e4m3 conversion loses the carry into the exponent: -126.74 became -64.0 with
triton 3.7.1), and independent of which fp8 types a Triton backend knows (NVIDIA's has no
e4m3fnuz). The same rounding as hip_src/kernels/fp8.cuh.
"""

import triton
import triton.language as tl


@triton.jit
def _fp8_e4m3_bits(x, BIAS: tl.constexpr, MAX_BITS: tl.constexpr, MAX_CODE: tl.constexpr, FNUZ: tl.constexpr):
    """float32 -> E4M3 code (uint8): saturating, round to nearest even (see fp8.cuh).

    e4m3fn: BIAS 7, MAX_BITS 0x43E00000 (448.0), MAX_CODE 0x7E;
    e4m3fnuz: BIAS 8, MAX_BITS 0x43700000 (240.0), MAX_CODE 0x7F.
    """
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    u = bits & 0x7FFFFFFF  # non-negative: signed shifts and compares are safe from here on
    e = u >> 23
    # Normal: keep 3 mantissa bits, round half to even on the 20 dropped ones.
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - ((127 - BIAS) << 3)
    # Subnormal: round(m / 2^shift), m = mantissa with its hidden bit; shift >= 25 rounds to 0.
    shift = 148 - BIAS - e
    sh = tl.minimum(tl.maximum(shift, 1), 24)
    m = (u & 0x7FFFFF) | 0x800000
    q = m >> sh
    rem = m & ((1 << sh) - 1)
    half = 1 << (sh - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    sub = tl.where(shift >= 25, 0, q + up.to(tl.int32))
    code = tl.where(e >= 128 - BIAS, normal, sub)
    code = tl.where(u >= MAX_BITS, MAX_CODE, code)
    if FNUZ:
        res = tl.where(code == 0, 0, sign | code)  # 0x80 is NaN in fnuz: zero has no sign
        res = tl.where(u > 0x7F800000, 0x80, res)
    else:
        res = tl.where(u > 0x7F800000, sign | 0x7F, sign | code)
    return res.to(tl.uint8)


@triton.jit
def fp8_e4m3_code(x, FNUZ: tl.constexpr):
    """float32 -> the e4m3fnuz (FNUZ) or e4m3fn code of x (uint8): _fp8_e4m3_bits with that kind's
    constants."""
    if FNUZ:
        return _fp8_e4m3_bits(x, 8, 0x43700000, 0x7F, True)
    else:
        return _fp8_e4m3_bits(x, 7, 0x43E00000, 0x7E, False)


@triton.jit
def fp8_e4m3_value(code, FNUZ: tl.constexpr):
    """E4M3 code (uint8) -> its float32 value in integer arithmetic: e4m3fnuz (FNUZ: bias 8, 0x80
    NaN, no -0, no infinity) or e4m3fn (bias 7, S.1111.111 NaN). For the targets whose Triton has
    no conversion of that kind (NVIDIA: no e4m3fnuz) and the CPU interpreter (whose e4m3
    conversions are not exact); exact for every code."""
    c = code.to(tl.int32)
    sign = (c & 0x80) << 24
    e = (c >> 3) & 0xF
    m = c & 0x7
    BIAS: tl.constexpr = 8 if FNUZ else 7
    normal = (sign | ((e + (127 - BIAS)) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    # Subnormals: m x 2^(1 - BIAS - 3); the sign from the code (0x80 is not a number in fnuz).
    sub = m.to(tl.float32) * (2.0 ** (-2 - BIAS))
    sub = tl.where((c & 0x80) != 0, -sub, sub)
    v = tl.where(e == 0, sub, normal)
    if FNUZ:
        return tl.where(c == 0x80, float("nan"), v)
    else:
        return tl.where((c & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def fp8_e4m3fn_to_fnuz_half(words):
    """e4m3fn codes -> the e4m3fnuz codes of half their values, exactly, four codes a 32-bit word
    (uint32 or int32 in, uint32 out, any shape; byte k of a word is code k, little-endian). A
    finite e4m3fn code read as e4m3fnuz is half its value (bias 8 against 7, subnormals alike),
    so it stays, except 0x80 (e4m3fn -0, e4m3fnuz NaN), which becomes 0x00; the e4m3fn NaN codes
    0x7F / 0xFF (e4m3fnuz +-240) become 0x80, e4m3fnuz's NaN. A reader bitcasts the bytes to
    e4m3fnuz and doubles the values' scale.

    Word-wide integer operations (no carry or borrow crosses a byte): a handful of instructions
    for four codes where a select a byte costs unpacking each, and the same bits on every target
    and in the CPU interpreter (which has no e4m3fnuz constants)."""
    x = words.to(tl.uint32, bitcast=True)
    low = x & 0x7F7F7F7F  # each code's magnitude bits
    nan = (low + 0x01010101) & 0x80808080  # 0x80 in each byte whose magnitude bits are all set
    nonzero = (low + 0x7F7F7F7F) & 0x80808080  # 0x80 in each byte whose magnitude bits are not 0
    # A NaN byte's magnitude 0x7F cleared (0x80 - 0x01 a byte: no borrow), its sign set; a zero
    # magnitude loses its sign (-0 -> +0); every other byte stays.
    return (low ^ (nan - (nan >> 7))) | (x & nonzero) | nan
