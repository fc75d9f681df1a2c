"""The fp8_ds_mla encoder of rocm_mla.cases.v4_attention (vLLM's writer) and the reference's decoder:
decode(encode(x)) within one e4m3 rounding of x, the UE8M0 bytes by formula, byte 7 zero, e4m3fnuz
never 0x80 for a zero, bytes hard-coded by hand, the page layout byte by byte (page stride, scale
area, untouched neighbours), NaN / inf decoding, the value tables against the e4m3 bit formulas."""

from __future__ import annotations

import math

import pytest
import torch
from v4_case import FN, FNUZ, e4m3_values

from rocm_mla.cases import v4_attention as v4
from rocm_mla.reference import fp8_ds_mla_rows
from rocm_mla.reference.v4_attention import fp8_value_table, ue8m0_values

KINDS = [pytest.param(FN, id="e4m3fn"), pytest.param(FNUZ, id="e4m3fnuz")]
FMAX = {FN: 448.0, FNUZ: 224.0}


def _rows(n: int, seed: int = 0) -> torch.Tensor:
    """``[n, 512]`` bf16 rows over many magnitudes: each 64-value block its own scale (1e-7 .. 1e4),
    with an all-zero block, a block below the 1e-4 floor and a block with one large outlier."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, 64, generator=g) * torch.logspace(-7, 4, n * 8).view(n, 8)[..., None]
    x[0, 0] = 0.0
    x[0, 1] = 3e-5 * torch.randn(64, generator=g)
    x[n - 1, 2, 5] = 1e3
    return x.view(n, 512).to(torch.bfloat16)


def _cache(nb: int, bs: int, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed flat buffer and an fp8_ds_mla cache view of it whose pages are ``pad`` bytes wider."""
    flat = torch.zeros(nb * (bs * 584 + pad), dtype=torch.uint8)
    return flat, flat.view(nb, bs * 584 + pad)[:, : bs * 584].view(nb, bs, 584)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_within_one_e4m3_rounding(kind):
    """decode(encode(x)): each NoPE value within half an e4m3 step of x at its block's scale
    (2^-4 relative for normals, 2^-(bias + 3) x scale below the smallest normal), the RoPE part
    exact; the scale puts the block's amax in (fmax / 2, fmax]."""
    x = _rows(24)
    flat, cache = _cache(3, 8, pad=8)
    v4.fp8_ds_mla_write(cache, x, torch.arange(24), kind)
    got = fp8_ds_mla_rows(cache, kind)
    xd = x.double()
    assert torch.equal(got[:, 448:], xd[:, 448:])
    _, scales = v4.fp8_ds_mla_views(cache)
    scale = 2.0 ** (scales.reshape(24, 8)[:, :7].double() - 127)
    err = (got[:, :448] - xd[:, :448]).abs().view(24, 7, 64)
    sub = 2.0 ** (-(7 if kind == FN else 8) - 3)  # half the e4m3 subnormal step, unscaled
    bound = xd[:, :448].abs().view(24, 7, 64) * 2.0**-4 + sub * scale[..., None]
    assert bool((err <= bound).all()), float((err - bound).max())
    amax = xd[:, :448].abs().view(24, 7, 64).amax(-1).clamp_min(1e-4)
    assert bool((amax / scale <= FMAX[kind]).all() and (amax / scale > FMAX[kind] / 2).all())


@pytest.mark.parametrize("kind", KINDS)
def test_scale_bytes_by_formula_and_byte_7_zero(kind):
    """Scale byte i = 127 + ceil(log2(max(absmax of block i, 1e-4) / fmax)) (worked in float64 here);
    the 8th byte 0."""
    x = _rows(16, seed=1)
    _, scales = v4.fp8_ds_mla_encode(x, kind)
    amax = x[:, :448].double().abs().view(16, 7, 64).amax(-1).clamp_min(1e-4)
    want = [[127 + math.ceil(math.log2(a / FMAX[kind])) for a in row] for row in amax.tolist()]
    assert scales[:, :7].tolist() == want
    assert bool((scales[:, 7] == 0).all())


def test_fnuz_never_writes_0x80_for_zero():
    """Zeros, negative zeros and negative values that round to zero are 0x00 in e4m3fnuz (0x80 is its
    NaN); e4m3fn keeps its negative zero (0x80 is -0 there)."""
    x = torch.zeros(1, 512)
    x[0, :64] = 1.0
    x[0, 1] = -0.0
    x[0, 2] = -1e-9  # rounds to zero at the block's scale
    x[0, 64:128] = -0.0  # an all-zero block, negative zeros
    d, _ = v4.fp8_ds_mla_encode(x, FNUZ)
    assert not bool((d[0, :448] == 0x80).any())
    assert d[0, 1] == 0 and d[0, 2] == 0 and bool((d[0, 64:128] == 0).all())
    d, _ = v4.fp8_ds_mla_encode(x, FN)
    assert d[0, 1] == 0x80 and d[0, 2] == 0x80


def test_bytes_hard_coded_by_hand():
    """A block of 1.0: amax 1, e = ceil(log2(1 / 448)) = -8, scale byte 119, 1.0 / 2^-8 = 256 = code
    0x78 in e4m3fn (e4m3fnuz: e = ceil(log2(1 / 224)) = -7, byte 120, 128 = 0x78); -1.0 -> 0xF8. A
    block of 1e-6 (below the floor 1e-4): e = ceil(log2(1e-4 / 448)) = -22, byte 105, 1e-6 x 2^22 =
    4.19 -> 4.0 = 0x48 (an all-zero block: the same byte). A block with amax 448: e = 0, byte 127,
    448 = 0x7E (e4m3fnuz: e = 1, 224 = 0x7E). amax 512: e = 1, byte 128, 512 / 2 = 256 = 0x78.
    RoPE value 1.0 (bf16 0x3F80): bytes 0x80 0x3F; -2.0 (0xC000): 0x00 0xC0."""
    x = torch.zeros(1, 512)
    x[0, 0:64] = 1.0
    x[0, 63] = -1.0
    x[0, 64:128] = 1e-6
    x[0, 128:192] = 1.0
    x[0, 128] = 448.0
    x[0, 192:256] = 1.0
    x[0, 192] = 512.0
    x[0, 448] = 1.0
    x[0, 449] = -2.0
    d, s = v4.fp8_ds_mla_encode(x, FN)
    assert s[0].tolist() == [119, 105, 127, 128, 105, 105, 105, 0]  # all-zero blocks: floor 1e-4 -> e = -22
    assert d[0, 0] == 0x78 and d[0, 63] == 0xF8 and d[0, 64] == 0x48
    assert d[0, 128] == 0x7E and d[0, 129] == 0x38  # 1.0 at scale 1: 0x38
    assert d[0, 192] == 0x78 and d[0, 193] == 0x30  # 1.0 / 2 = 0.5: 0x30
    assert d[0, 448:452].tolist() == [0x80, 0x3F, 0x00, 0xC0]
    assert bool((d[0, 256:448] == 0).all())
    d, s = v4.fp8_ds_mla_encode(x, FNUZ)
    assert s[0, 0] == 120 and d[0, 0] == 0x78 and d[0, 63] == 0xF8
    assert s[0, 2] == 128 and d[0, 128] == 0x7E and d[0, 129] == 0x38  # 448 / 2 = 224 = 0x7E; 0.5 = 0x38


def test_ue8m0_and_value_tables():
    """The decoder's tables: e4m3 codes of both kinds equal the bit formulas of the tests (NaN at
    0x7F / 0xFF for e4m3fn, 0x80 for e4m3fnuz); UE8M0 byte e is 2^(e - 127), 0 -> 2^-127, 255 -> inf."""
    codes = torch.arange(256).to(torch.uint8)
    for kind in (FN, FNUZ):
        t, want = fp8_value_table(kind), e4m3_values(codes, kind)
        assert torch.equal(t.isnan(), want.isnan())
        assert torch.equal(torch.nan_to_num(t), torch.nan_to_num(want))
    assert torch.isnan(fp8_value_table(FN)[[0x7F, 0xFF]]).all() and torch.isnan(fp8_value_table(FNUZ)[0x80])
    u = ue8m0_values(codes)
    assert u[127] == 1.0 and u[0] == 2.0**-127 and u[254] == 2.0**127 and u[255] == math.inf


@pytest.mark.parametrize("kind", KINDS)
def test_write_layout_byte_by_byte(kind):
    """Token p of page b: its 576 data bytes at b x stride(0) + p x 576, its 8 scale bytes at
    b x stride(0) + block_size x 576 + p x 8; nothing else changes (the page's pad, the other
    slots); slot -1 is skipped, a slot past the cache raises."""
    bs, nb, pad = 5, 4, 13
    flat, cache = _cache(nb, bs, pad)
    flat.fill_(0xA5)
    x = _rows(3, seed=2)
    slots = torch.tensor([7, -1, 19])  # page 1 offset 2, skipped, page 3 offset 4
    v4.fp8_ds_mla_write(cache, x, slots, kind)
    d, s = v4.fp8_ds_mla_encode(x, kind)
    page = bs * 584 + pad
    touched = torch.zeros_like(flat, dtype=torch.bool)
    for row, slot in ((0, 7), (2, 19)):
        b, p = divmod(slot, bs)
        at = b * page + p * 576
        assert torch.equal(flat[at : at + 576], d[row])
        at_s = b * page + bs * 576 + p * 8
        assert torch.equal(flat[at_s : at_s + 8], s[row])
        touched[b * page + p * 576 : b * page + p * 576 + 576] = True
        touched[at_s : at_s + 8] = True
    assert bool((flat[~touched] == 0xA5).all())
    with pytest.raises(ValueError, match="slots"):
        v4.fp8_ds_mla_write(cache, x[:1], torch.tensor([nb * bs]), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_poisoned_slots_decode_to_nan(kind):
    _, cache = _cache(2, 3)
    v4.fp8_ds_mla_poison(cache, kind)
    assert bool(fp8_ds_mla_rows(cache, kind).isnan().all())
    v4.fp8_ds_mla_write(cache, _rows(1), torch.tensor([4]), kind)
    rows = fp8_ds_mla_rows(cache, kind)
    assert bool(rows[4].isfinite().all()) and bool(rows[[0, 1, 2, 3, 5]].isnan().all())


def test_inf_and_tiny_scales():
    """A scale byte of 255 decodes to inf (x 0 = NaN), 0 to 2^-127."""
    _, cache = _cache(1, 2)
    v4.fp8_ds_mla_write(cache, _rows(3)[1:], torch.tensor([0, 1]), FN)
    data, scales = v4.fp8_ds_mla_views(cache)
    scales[0, 0, 0] = 255
    scales[0, 1, 0] = 0
    rows = fp8_ds_mla_rows(cache, FN)
    v = fp8_value_table(FN)[data[0, :, :64].long()]
    assert bool((v[0] != 0).any()) and bool((v[1] != 0).any())
    assert torch.equal(rows[0, :64].isnan(), v[0] == 0)
    assert torch.equal(rows[0, :64][v[0] != 0], (v[0] * math.inf)[v[0] != 0])
    assert torch.equal(rows[1, :64], v[1] * 2.0**-127)
