"""rocm_mla.cases.rope_kv_write and .merge: the options and bounds the op tests use beyond the
common ones (tests/cases/test_cases.py): skipped and short slot mappings, the inner-stride layout, the
fp8 code bounds, the one-side merge bound."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _util import DEVICE

from rocm_mla.cases import CaseMismatch, compare, merge
from rocm_mla.cases import rope_kv_write as rope
from rocm_mla.reference.rope_kv_write import FP8_MAX, quantize_fp8_ref, write_cache_ref

F32 = torch.float32


def _write_reference(case: rope.RopeInputs) -> None:
    """The op's results by the reference, written into the case's working tensors."""
    q_rot, k_rot, rows = case.reference()
    case.q_pe.copy_(q_rot)
    case.k_pe.copy_(k_rot)
    write_cache_ref(case.cache, case.slots, rows, fp8_dtype=case.fp8, k_scale=case.k_scale)


def test_rope_slots_outside_the_cache_and_short_mappings_are_skipped():
    """A negative slot, one past the cache and a huge one are not cached (the op's contract); a
    slot mapping shorter than the batch caches its tokens only; written_rows / untouched follow."""
    case = rope.make_inputs(rope.RopeShape(9, 4, block=16), dtype=F32, device=DEVICE, skip=(0,))
    num_slots = case.cache.shape[0] * case.cache.shape[1]
    case.slots[3], case.slots[5] = num_slots, 1 << 40
    case.slots = case.slots[:7]
    assert case.cached().tolist() == [False, True, True, False, True, False, True]
    _write_reference(case)
    case.check()
    assert case.written_rows().shape == (4, 576)
    case.cache[int(case.slots[1]) // 16, int(case.slots[1]) % 16, 0] += 1.0
    with pytest.raises(CaseMismatch, match="cache rows"):
        case.check()


def test_rope_inner_stride_layout_and_untouched_between_elements():
    """inner_stride=2: q, kv_a, kv_c and the cache step 2 elements; the reference still passes and
    a write between two cache elements of a written row is caught."""
    shape = rope.RopeShape(6, 3, block=4, q_width=64)
    case = rope.make_inputs(shape, dtype=F32, device=DEVICE, inner_stride=2, block_pad=1)
    for x in (case.q, case.kv_a, case.kv_c, case.cache):
        assert x.stride(-1) == 2
    assert case.cache_base.shape[-1] == 2 * 576
    _write_reference(case)
    case.check()
    s = int(case.slots[0])
    case.cache_base[2 * (s // 4), s % 4, 1] = 0.0  # between elements 0 and 1 of a written row
    assert "kv_cache" in case.untouched()


def test_rope_fp8_bounds():
    """FP8_SAME_CODES allows one smallest-subnormal step and no more; FP8_ROUND_TRIP holds for
    torch's own conversion of every kind and fails a code one step off."""
    one_step = torch.tensor([2.0**-9])
    assert compare("c", one_step, torch.zeros(1), rope.FP8_SAME_CODES).ok
    assert not compare("c", torch.tensor([1.125]), torch.tensor([1.0]), rope.FP8_SAME_CODES).ok
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 100
    k_scale = torch.tensor([0.37])
    for fp8, bound in rope.FP8_ROUND_TRIP.items():
        m = FP8_MAX[fp8]
        codes = quantize_fp8_ref(x, k_scale, fp8).float()
        exact = (x / k_scale).clamp(-m, m)
        assert compare("codes", codes, exact, bound).ok
        # The code nearest its exact value (well inside the range), moved one step up.
        rel = ((exact - codes).abs() / codes.abs()).masked_fill((codes.abs() < 1) | (codes.abs() > m / 4), 1.0)
        i = int(rel.argmin())
        off = codes.clone()
        off[i] = codes[i] + codes[i].abs() * 2.0**-3
        assert not compare("codes", off, exact, bound).ok


def test_rope_compare_takes_an_fp8_bound():
    case = rope.make_inputs(
        dataclasses.replace(rope.SHAPES["tiny"][0], kv="fp8"), dtype=F32, device=DEVICE, fp8=torch.float8_e4m3fn
    )
    _write_reference(case)
    names = [c.name for c in case.compare(fp8_bound=rope.FP8_SAME_CODES)]
    assert names == ["q_pe", "k_pe", "cache rows (fp8 codes)"]
    case.check(fp8_bound=rope.FP8_SAME_CODES)


def test_merge_one_side_bound_is_tighter_than_the_output_bound():
    out = merge.TOLERANCE[F32]["output"]
    assert merge.ONE_SIDE.atol <= out.atol and merge.ONE_SIDE.rtol < out.rtol
