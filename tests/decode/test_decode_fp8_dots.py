"""mla_decode's fp8_dots modes on fp8 caches ("qk": q rounded to the cache's e4m3 per row and head,
q . k^T on fp8 operands; "all": p rounded to e4m3 too, p . v on fp8 V as stored): each against the
reference of the values it rounds, each against the unrounded reference (the accuracy it trades),
data with large latent channels, NaN reach, the bad input named, the config rules."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, HAS_GPU
from decode_case import make_case

from rocm_mla.cases import decode, outside_untouched, poisoned
from rocm_mla.ops.decode_plan import FP8_DOTS, tier_config, triton_meta

# bf16 q with fp8 caches runs on GPUs; the CPU interpreter converts e4m3 -> bf16 wrongly, so the
# CPU cases take fp16 q (the kernel's code path is the same but for F16_DOT).
Q_DTYPE = torch.bfloat16 if HAS_GPU else torch.float16
D_SPLIT2 = {"BLOCK_H": 16, "BLOCK_N": 16, "D_SPLIT": 2, "num_warps": 4, "num_stages": 1}


def _mode_check(case, mode, config=None, splits=(1, 3)):
    """fp8_dots=mode against the float32 reference of the q (and p) it rounds, under
    decode.fp8_dots_bound: every element written, nothing around out touched, one split and
    several; the reference backend gives the same; the result differs from "none" (the values
    really are rounded)."""
    tol = decode.fp8_dots_bound(mode, case.dtype, DEVICE)
    ref = case.reference(fp8_dots=mode)
    for s in splits:
        base, out = poisoned((case.q_nope.shape[0], case.shape.N, 512), case.dtype, DEVICE, token_pad=1)
        o, lse = case.run(out=out, lse=None, config=config, num_splits=s, fp8_dots=mode)
        assert o is out and outside_untouched(base, out)
        case.check(o, lse, ref=ref, tol=tol)
    ref_o, ref_l = case.run(backend="reference", out=None, lse=None, fp8_dots=mode)
    case.check(ref_o, ref_l, ref=ref, tol=decode.QUANTIZED_Q_REFERENCE)
    plain, _ = case.run(config=config, num_splits=1, out=None, lse=None, fp8_dots="none")
    assert (plain.float() - o.float()).abs().max() > tol["out"].atol / 10
    return o, lse


@pytest.mark.parametrize("mode", ["qk", "all"])
@pytest.mark.parametrize("q_len,N", [(1, 16), (2, 8), (1, 24)])
@pytest.mark.parametrize("tier", ["default", "d_split2"])
def test_fp8_dots_match_reference_of_rounded_values(mode, q_len, N, tier):
    """Both modes with the default tiers and with a tier that splits the latent columns (the
    modes run them whole), one row block and several, requests of 45, 7 and 130 keys."""
    case = make_case((45, 7, 130), N, q_len, 16, Q_DTYPE, fp8=True, k_scale=0.5, seed=17)
    # "all": p . v's K is BLOCK_N, and fp8 matrix instructions take K >= 32.
    split2 = dict(D_SPLIT2, BLOCK_N=32) if mode == "all" else D_SPLIT2
    _mode_check(case, mode, None if tier == "default" else split2)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90", "default"])
def test_fp8_dots_all_tiles_take_fp8_matrix_instructions(arch):
    """Every tier of every arch runs fp8_dots="all" with BLOCK_N >= 32 (Triton's NVIDIA backend
    refuses 8-bit dots with K < 32, its AMD backend falls back to FMA there); a config with a
    smaller tile is refused by name."""
    for rows in (1, 16, 32, 64, 128):
        cfg = tier_config(arch, rows, torch.bfloat16, True, fp8_dots="all")
        assert cfg["BLOCK_N"] >= 32 and cfg["FP8_PV"]
    with pytest.raises(ValueError, match="BLOCK_N >= 32 with fp8_dots='all'.*got BLOCK_N=16"):
        tier_config(arch, 16, torch.bfloat16, True, dict(D_SPLIT2), fp8_dots="all")


@pytest.mark.parametrize("mode", FP8_DOTS)
@pytest.mark.parametrize(
    "N,q_len,block,splits",
    [(16, 1, 16, 1), (16, 1, 1, 8), (128, 1, 64, 3), (8, 2, 16, 5), (16, 2, 64, 2)],
)
def test_fp8_dots_accuracy_against_unrounded_q(mode, N, q_len, block, splits):
    """Each mode against the float32 reference of the unrounded q over the dequantised cache
    (decode.FP8_DOTS_ACCURACY: "qk" and "all" within 7% relative norm and lse 0.1), for N 8..128,
    MTP rows, blocks 1/16/64, 1..8 splits."""
    case = make_case((150, 33, 64), N, q_len, block, Q_DTYPE, fp8=True, k_scale=0.5, seed=N + block)
    o, lse = case.run(out=None, lse=None, num_splits=splits, fp8_dots=mode)
    case.check(o, lse, tol=decode.FP8_DOTS_ACCURACY[mode])


@pytest.mark.parametrize("mode", ["qk", "all"])
def test_fp8_dots_on_large_latent_channels(mode):
    """Data shaped like a model's latent cache: 8 channels of the cache and 8 others of q with 16x
    the standard deviation. Each (row, head)'s own q scale maps its largest value to the e4m3
    range, so no row's values fall into subnormals because another row is large: the mode stays
    within decode.FP8_DOTS_OUTLIERS (the random-data norm bound), and a single scale for all of q
    (what a per-tensor pre-quantised q has) is worse on the same data."""
    from rocm_mla.reference import mla_decode_ref
    from rocm_mla.reference.decode import quantize_q_fp8
    from rocm_mla.reference.rope_kv_write import FP8_MAX, quantize_fp8_ref

    case = make_case((150, 33), 16, 1, 16, Q_DTYPE, fp8=True, k_scale=0.5, seed=31, outliers=8)
    # Rows of very different norms, as a batch holds them.
    norms = torch.logspace(-2, 0, case.q_nope.shape[0] * case.shape.N, device=DEVICE)
    case.q_nope.mul_(norms.view(-1, case.shape.N, 1).to(case.dtype))
    o, lse = case.run(out=None, lse=None, num_splits=2, fp8_dots=mode)
    case.check(o, lse, tol=decode.FP8_DOTS_OUTLIERS)
    # The scales compared on the rounded q alone. e4m3 is a float format, so one scale for all of
    # q costs little while the rows' norms stay inside its range, and more once small rows fall
    # into subnormals (norms 1e-6..1; the figures: docs/notes/fp8-decode.md#accuracy). The
    # per-row scale is never the worse one.
    kind = case.kv_cache.dtype
    args = (case.kv_cache, case.block_table, case.seq_lens, case.sm_scale, case.k_scale)
    for lo in (-2, -6):
        qn = (
            case.q_nope.float()
            / norms.view(-1, case.shape.N, 1)
            * torch.logspace(lo, 0, norms.numel(), device=DEVICE).view(-1, case.shape.N, 1)
        )
        qn = qn.to(case.dtype)
        ro, _ = mla_decode_ref(qn, case.q_pe, *args)
        per_row = quantize_q_fp8(qn, case.q_pe, kind)
        amax = max(qn.float().abs().max(), case.q_pe.float().abs().max())
        one = torch.tensor(float(amax) / FP8_MAX[kind], device=DEVICE)
        per_tensor = [quantize_fp8_ref(x.float(), one, kind).float() * one for x in (qn, case.q_pe)]
        err = lambda q: float((mla_decode_ref(*q, *args)[0] - ro).norm() / ro.norm())  # noqa: E731
        assert err(per_row) < err(per_tensor)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", FP8_DOTS)
def test_gpu_fp8_dots_nan_reaches_its_request_only(mode):
    """A NaN in a used KV row's V columns reaches every row of its request (out), and no other
    request: the fp8 p . v keeps 0 x NaN = NaN. (GPU only: the CPU interpreter reads an e4m3 NaN
    code as a finite value.)"""
    case = make_case((45, 30, 20), 8, 2, 16, torch.bfloat16, fp8=True, k_scale=0.5, seed=41)
    page = int(case.block_table[1, 0])
    case.kv_cache.view(torch.uint8)[page, 3, 100] = 0x7F if case.kv_cache.dtype == torch.float8_e4m3fn else 0x80
    o, lse = case.run(out=None, lse=None, num_splits=2, fp8_dots=mode)
    rows = o.float().isnan().any(-1)  # [rows, N]
    assert rows[2:4].all() and not rows[:2].any() and not rows[4:].any()
    assert not lse[:2].isnan().any() and not lse[4:].isnan().any()


@pytest.mark.parametrize(
    "kv,q_dtype,kw,words",
    [
        ("fp16", torch.float16, {"fp8_dots": "all"}, "fp8_dots: expected an fp8 kv_cache"),
        ("fp8", torch.float32, {"fp8_dots": "qk"}, "fp8_dots: expected float16 or bfloat16 q"),
        ("fp8", torch.float16, {"fp8_dots": "pv"}, "fp8_dots: expected None or one of 'none', 'qk', 'all'"),
    ],
)
def test_fp8_dots_bad_input_named(kv, q_dtype, kw, words):
    case = make_case((20, 5), 4, 1, 16, q_dtype, fp8=kv == "fp8", k_scale=1.0, seed=18)
    with pytest.raises(ValueError, match=f"mla_decode: {words}"):
        case.run(**kw)


def test_fp8_dots_none_on_a_16bit_cache_is_accepted():
    case = make_case((20, 5), 4, 1, 16, torch.float16, seed=19)
    case.run(fp8_dots="none")
    case.check()


@pytest.mark.parametrize("key", ["FP8_QK", "FP8_PV"])
def test_fp8_dots_only_by_name(key):
    """The fp8 dots are an accuracy trade: config= (or an overlay) cannot switch them on."""
    case = make_case((20, 5), 4, 1, 16, torch.float16, fp8=True, k_scale=0.5, seed=19)
    cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "D_SPLIT": 1, "num_warps": 4, "num_stages": 1}
    for value in (True, False):
        with pytest.raises(ValueError, match=f"mla_decode: config: expected no {key} entry"):
            case.run(config={**cfg, key: value})
    plain = tier_config("sm90", 16, torch.bfloat16, True)
    assert "FP8_QK" not in plain and "FP8_PV" not in plain


def test_fp8_dots_config_resolution():
    """ "qk" picks the tier's 'fp8+qk' overrides after 'fp8', "all" then 'fp8+all'; both run
    D_SPLIT 1, V_SPLIT 1 (sm90's 64-row fp8 tier is a 128-row V_SPLIT tile in "none");
    FP8_QK / FP8_PV reach the kernel only for fp8 caches and 16-bit q."""
    plain = tier_config("sm90", 128, torch.bfloat16, True)
    qk = tier_config("sm90", 128, torch.bfloat16, True, fp8_dots="qk")
    assert plain["V_SPLIT"] == 2 and plain["BLOCK_H"] == 128
    assert (qk["BLOCK_H"], qk["BLOCK_N"], qk["D_SPLIT"], qk["V_SPLIT"], qk["FP8_QK"], qk["FP8_PV"]) == (
        64,
        64,
        1,
        1,
        True,
        False,
    )
    for arch in ("gfx942", "sm90"):
        tiers = __import__("rocm_mla.configs", fromlist=["config_for"]).config_for("mla_decode", arch)["tiers"]
        for tier in tiers:
            al = tier_config(arch, tier["BLOCK_H"], torch.bfloat16, True, fp8_dots="all")
            expect = {**tier, **tier.get("fp8", {}), **tier.get("fp8+qk", {}), **tier.get("fp8+all", {})}
            assert al["FP8_QK"] and al["FP8_PV"] and al["D_SPLIT"] == 1 and al["V_SPLIT"] == 1
            assert (al["BLOCK_H"], al["BLOCK_N"], al["num_warps"]) == (
                expect["BLOCK_H"],
                expect["BLOCK_N"],
                expect["num_warps"],
            )
    for dots in FP8_DOTS:
        assert tier_config("sm90", 128, torch.bfloat16, False, fp8_dots=dots) == tier_config(
            "sm90", 128, torch.bfloat16, False
        )
        # float32 q keeps exact products: the plan is the plain fp8 one, as the launch runs it.
        assert tier_config("sm90", 128, torch.float32, True, fp8_dots=dots) == tier_config(
            "sm90", 128, torch.float32, True
        )
    cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "FP8_QK": True, "FP8_PV": True}
    on = lambda q, fp8: triton_meta("default", cfg, q, fp8, direct=True, has_scale_ptr=False, page_mode=2)[0]  # noqa: E731
    assert on(torch.float16, True)["FP8_QK"] and on(torch.float16, True)["FP8_PV"]
    assert not on(torch.float16, False)["FP8_PV"] and not on(torch.float32, True)["FP8_PV"]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["qk", "all"])
@pytest.mark.parametrize("N,q_len", [(16, 1), (16, 2), (128, 1), (128, 2)])
def test_gpu_fp8_dots(mode, N, q_len):
    """Both modes on this GPU through the tiers the wrapper picks, long and short requests: the
    reference of the rounded values, and the accuracy against the unrounded q."""
    case = make_case((3000, 130, 7), N, q_len, 64, torch.bfloat16, fp8=True, k_scale=0.5, seed=N + q_len)
    o, lse = _mode_check(case, mode)
    case.check(o, lse, tol=decode.FP8_DOTS_ACCURACY[mode])
