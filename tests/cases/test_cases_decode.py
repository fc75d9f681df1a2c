"""rocm_mla.cases.decode's named bounds (the comparisons other than the op against its float32
reference) and DecodeInputs.compare's ``tol=`` keyword that applies them."""

from __future__ import annotations

import pytest
import torch

from rocm_mla.cases import Bound, CaseMismatch, decode

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
NAMED = {
    "SPLIT_ORDER": decode.SPLIT_ORDER,
    "FP32_SHORT": decode.FP32_SHORT,
    "QUANTIZED_Q_SERVING": decode.QUANTIZED_Q_SERVING,
    "QUANTIZED_Q_REFERENCE": decode.QUANTIZED_Q_REFERENCE,
    **{f"QUANTIZED_Q[{d}]": decode.QUANTIZED_Q[d] for d in (F16, BF16)},
    **{f"FP8_DOTS_ACCURACY[{m}]": decode.FP8_DOTS_ACCURACY[m] for m in ("none", "qk", "all")},
    "FP8_DOTS_OUTLIERS": decode.FP8_DOTS_OUTLIERS,
}


def _exact(dtype=F32):
    """A small batch whose out / lse hold the reference itself."""
    c = decode.make_inputs(decode.DecodeShape(N=4, q_len=2, block=16, lens=(21, 3)), dtype=dtype, seed=3)
    ro, rl = c.reference()
    c.out.copy_(ro)
    c.lse.copy_(rl)
    return c, ro, rl


@pytest.mark.parametrize("name", list(NAMED))
def test_named_bounds_cover_out_and_lse(name):
    tol = NAMED[name]
    assert set(tol) == {"out", "lse"} and all(isinstance(b, Bound) for b in tol.values())
    assert tol["lse"].rtol == 0.0  # lse: absolute (the log of a sum)
    assert isinstance(decode.DENSE_F64, Bound)


def test_compare_tol_applies_the_named_bound():
    c, ro, rl = _exact()
    c.check()
    c.check(tol=decode.SPLIT_ORDER)
    c.out[1, 2, 5] += 5e-5  # inside TOLERANCE[fp32] (1e-4), outside SPLIT_ORDER (1e-5)
    c.check()
    with pytest.raises(CaseMismatch, match="out: 1 of .* outside atol 1e-05"):
        c.check(tol=decode.SPLIT_ORDER)
    c.out.copy_(ro)
    c.lse[2, 1] += 5e-4  # inside TOLERANCE[fp32]'s lse (1e-3), outside FP32_SHORT's (1e-4)
    c.check()
    assert c.mismatch(tol=decode.FP32_SHORT).startswith("lse: 1 of")


def test_compare_tol_with_ref_and_row_subsets():
    """A subset of rows against the same rows of a reference (the bad-page tests' form)."""
    c, ro, rl = _exact()
    c.out[0] = float("nan")  # rows of a request the test expects NaN in
    keep = [2, 3]
    c.check(c.out[keep], c.lse[keep], ref=(ro[keep], rl[keep]), tol=decode.SPLIT_ORDER)
    with pytest.raises(CaseMismatch, match="NaN where the reference is finite"):
        c.check()


def test_quantized_q_bounds_no_looser_than_the_plain_ones_on_out():
    for dtype in (F16, BF16):
        q, plain = decode.QUANTIZED_Q[dtype]["out"], decode.TOLERANCE[dtype]["out"]
        assert (q.atol, q.rtol) == (plain.atol, plain.rtol)


def test_quantize_q_bound_per_device():
    """The interpreter rounds q exactly as the reference does; a GPU may flip one e4m3 code."""
    assert decode.quantize_q_bound(torch.float16, "cpu") is decode.QUANTIZED_Q[torch.float16]
    assert decode.quantize_q_bound(torch.bfloat16, "cpu") is decode.QUANTIZED_Q[torch.bfloat16]
    assert decode.quantize_q_bound(torch.float16, "cuda") is decode.QUANTIZED_Q_SERVING


def test_fp8_dots_bounds():
    """ "qk" is quantize_q_bound; "all" keeps its lse and takes FP8_ALL_OUT for out; the accuracy
    statement is 7% relative norm and lse 0.1 for both rounded modes."""
    for dev in ("cpu", "cuda"):
        assert decode.fp8_dots_bound("qk", F16, dev) is decode.quantize_q_bound(F16, dev)
        al = decode.fp8_dots_bound("all", F16, dev)
        assert al["out"] is decode.FP8_ALL_OUT and al["lse"] is decode.quantize_q_bound(F16, dev)["lse"]
    for mode in ("qk", "all"):
        assert decode.FP8_DOTS_ACCURACY[mode]["out"].norm == 0.07 and decode.FP8_DOTS_ACCURACY[mode]["lse"].atol == 0.1
    with pytest.raises(ValueError, match="fp8_dots_bound: expected 'qk' or 'all', got 'none'"):
        decode.fp8_dots_bound("none", F16, "cpu")


def test_outliers_widen_the_chosen_channels():
    """make_inputs(outliers=): the cache's and q's chosen channels are OUTLIER_GAIN wider."""
    c = decode.make_inputs(decode.DecodeShape(N=16, block=16, lens=(400,)), dtype=F32, seed=5, outliers=4)
    k = c.kv_cache[c.block_table[0, :25].long()].reshape(-1, 576)[:400]
    std = k.std(0)
    wide = std > 8
    assert int(wide.sum()) == 4 and bool((std[~wide] < 1.5).all())
    qstd = c.q_nope.reshape(-1, 512).std(0)
    assert int((qstd > 8).sum()) == 4 and not bool(((qstd > 8) & wide[:512]).any())
