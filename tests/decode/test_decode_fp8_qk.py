"""mla_decode with quantize_q (FP8_QK: q rounded to the cache's e4m3 per row and head, q . k^T on
fp8 operands): the reference of the quantised q, the bad input named, the config rules."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, HAS_GPU
from decode_case import make_case

from rocm_mla.cases import decode, outside_untouched, poisoned
from rocm_mla.ops.decode_plan import stage1_config


def _quantize_q_check(case, tol, config=None):
    """quantize_q=True against the float32 reference fed the q it rounds to (``tol``: a
    decode.QUANTIZED_Q bound, which says why): every element written, nothing around out touched,
    one split and several; the reference backend gives the same; without it the result differs
    (q really rounded)."""
    ref = case.reference(quantize_q=True)
    for splits in (1, 3):
        base, out = poisoned((case.q_nope.shape[0], case.shape.N, 512), case.dtype, DEVICE, token_pad=1)
        o, lse = case.run(out=out, lse=None, config=config, num_kv_splits=splits, quantize_q=True)
        assert o is out and outside_untouched(base, out)
        case.check(o, lse, ref=ref, tol=tol)
    ref_o, ref_l = case.run(backend="reference", out=None, lse=None, quantize_q=True)
    case.check(ref_o, ref_l, ref=ref, tol=decode.QUANTIZED_Q_REFERENCE)
    plain, _ = case.run(config=config, num_kv_splits=1, out=None, lse=None)
    assert (plain.float() - o.float()).abs().max() > tol["out"].atol / 10


@pytest.mark.parametrize("q_len,N", [(1, 16), (2, 8), (1, 24)])
@pytest.mark.parametrize("tier", ["default", "d_split2"])
def test_quantize_q_matches_reference_of_quantised_q(q_len, N, tier):
    """quantize_q=True (FP8_QK: q rounded to the cache's e4m3 per row and head, q . k^T on fp8
    operands) with the default tiers and with a tier that splits the latent columns (the mode
    runs them whole), one row block and several."""
    dtype = torch.bfloat16 if HAS_GPU else torch.float16
    case = make_case((45, 7, 130), N, q_len, 16, dtype, fp8=True, k_scale=0.5, seed=17)
    cfg = None if tier == "default" else {"BLOCK_H": 16, "BLOCK_N": 16, "D_SPLIT": 2, "num_warps": 4, "num_stages": 1}
    _quantize_q_check(case, decode.QUANTIZED_Q[dtype], cfg)


@pytest.mark.parametrize(
    "kv,q_dtype,value,words",
    [
        ("fp16", torch.float16, True, "an fp8 kv_cache"),
        ("fp8", torch.float32, True, "float16 or bfloat16 q"),
        ("fp8", torch.float16, 1, "a bool"),
    ],
)
def test_quantize_q_bad_input_named(kv, q_dtype, value, words):
    case = make_case((20, 5), 4, 1, 16, q_dtype, fp8=kv == "fp8", k_scale=1.0, seed=18)
    with pytest.raises(ValueError, match=f"mla_decode: quantize_q: expected {words}"):
        case.run(quantize_q=value)


def test_fp8_qk_only_through_quantize_q():
    """FP8_QK is an accuracy trade: config= (or an overlay) cannot switch it on, quantize_q can."""
    case = make_case((20, 5), 4, 1, 16, torch.float16, fp8=True, k_scale=0.5, seed=19)
    cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "D_SPLIT": 1, "num_warps": 4, "num_stages": 1}
    for value in (True, False):
        with pytest.raises(ValueError, match="mla_decode: config: expected no FP8_QK entry"):
            case.run(config={**cfg, "FP8_QK": value}, k_scale=0.5)
    assert "FP8_QK" not in stage1_config("sm90", 16, torch.bfloat16, True)


def test_quantize_q_config_resolution():
    """quantize_q picks the tier's 'fp8+qk' overrides after 'fp8' and runs D_SPLIT 1, V_SPLIT 1
    (sm90's 64-row fp8 tier is a 128-row V_SPLIT tile without it, the timed 64-row tile with it);
    FP8_QK reaches the kernel, and the plan, only for fp8 caches and 16-bit q."""
    from rocm_mla.configs import config_for
    from rocm_mla.ops.decode_plan import stage1_meta

    tiers = config_for("mla_decode", "sm90")["stage1"]
    plain = stage1_config("sm90", 128, torch.bfloat16, True)
    qk = stage1_config("sm90", 128, torch.bfloat16, True, quantize_q=True)
    assert plain["V_SPLIT"] == 2 and plain["BLOCK_H"] == 128
    assert (qk["BLOCK_H"], qk["BLOCK_N"], qk["D_SPLIT"], qk["V_SPLIT"], qk["FP8_QK"]) == (64, 64, 1, 1, True)
    assert stage1_config("sm90", 128, torch.bfloat16, False, quantize_q=True) == stage1_config(
        "sm90", 128, torch.bfloat16, False
    )
    # float32 q keeps exact products: the plan is the plain fp8 one, as the launch runs it.
    assert stage1_config("sm90", 128, torch.float32, True, quantize_q=True) == stage1_config(
        "sm90", 128, torch.float32, True
    )
    assert "fp8+qk" in tiers[-1]
    cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "FP8_QK": True}
    on = lambda q, fp8: stage1_meta("default", cfg, q, fp8, direct=True, has_scale_ptr=False, page_mode=2)[0]  # noqa: E731
    assert on(torch.float16, True)["FP8_QK"]
    assert not on(torch.float16, False)["FP8_QK"] and not on(torch.float32, True)["FP8_QK"]


@pytest.mark.gpu
@pytest.mark.parametrize("N,q_len", [(16, 1), (16, 2), (128, 1), (128, 2)])
def test_gpu_quantize_q(N, q_len):
    """quantize_q=True on this GPU through the tiers the wrapper picks (sm90's 64-row tier: fp8
    wgmma for q . k^T): the reference of the quantised q, long and short requests."""
    case = make_case((3000, 130, 7), N, q_len, 64, torch.bfloat16, fp8=True, k_scale=0.5, seed=N + q_len)
    _quantize_q_check(case, decode.QUANTIZED_Q_SERVING)
