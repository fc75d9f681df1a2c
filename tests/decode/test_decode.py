"""mla_decode: Triton against the float32 reference, the reference against an independent dense
formulation, the data paths that go wrong (strides, poisoned pages, splits, causal MTP rows), the
split heuristic, and bad input.

Every cache slot not covered by seq_lens holds NaN (page tails and whole unused pages), and
unused block-table entries point at all-NaN pages: one stray read poisons the output.
"""

from __future__ import annotations

import math

import pytest
import torch
from _util import DEVICE, DTYPES, HAS_GPU, raises_naming
from decode_case import BACKENDS, V_SPLIT_CFG, make_case

from rocm_mla.cases import compare, decode, outside_untouched, poisoned, raise_on
from rocm_mla.cases.decode import call_decode
from rocm_mla.configs import config_for
from rocm_mla.ops.decode_plan import tier_config
from rocm_mla.ops.latent_core import choose_num_splits, mla_decode_workspace_numel
from rocm_mla.reference import mla_decode_ref
from rocm_mla.variants.decode import triton_variants


# ---------------------------------------------------------------- the reference itself
def _dense_attention(case):
    """Independent formulation in float64: per request, the logical (never paged) K rows as the
    cache holds them (case.paged.values) and SDPA with an explicit causal mask; lse from logsumexp
    of explicit scores."""
    q = torch.cat([case.q_nope, case.q_pe], -1).double().cpu()
    N, q_len = case.shape.N, case.shape.q_len
    outs, lses = [], []
    for b, L in enumerate(case.shape.seq_lens):
        k = case.paged.values[b].double().cpu()
        qb = q[b * q_len : (b + 1) * q_len].transpose(0, 1)  # [N, q_len, 576]
        pos = torch.arange(q_len) + L - q_len
        mask = torch.arange(L)[None, :] <= pos[:, None]  # [q_len, L]
        o = torch.nn.functional.scaled_dot_product_attention(
            qb,
            k[None].expand(N, L, 576),
            k[None, :, :512].expand(N, L, 512),
            attn_mask=mask,
            scale=case.sm_scale,
        )
        s = (qb @ k.T) * case.sm_scale
        lses.append(torch.logsumexp(s.masked_fill(~mask, -math.inf), -1).transpose(0, 1))
        outs.append(o.transpose(0, 1))
    return torch.cat(outs).float(), torch.cat(lses).float()


@pytest.mark.parametrize("q_len,block_size,lens", [(1, 16, (37, 5)), (3, 4, (9, 3)), (2, 1, (6, 2))])
def test_reference_equals_dense_attention(q_len, block_size, lens):
    case = make_case(lens, 3, q_len, block_size, seed=1)
    ro, rl = case.reference()
    do, dl = _dense_attention(case)
    raise_on(compare("out", ro.cpu(), do, decode.DENSE_F64).problem)
    raise_on(compare("lse", rl.cpu(), dl, decode.DENSE_F64).problem)


def test_reference_row_without_keys():
    case = make_case((0, 4), 2)
    ro, rl = case.reference()
    assert torch.equal(ro[0], torch.zeros_like(ro[0])) and bool((rl[0] == -math.inf).all())


def test_page_mode_for():
    from rocm_mla.ops.decode_plan import page_mode_for

    assert page_mode_for(64, 64) == (2, 0) and page_mode_for(128, 32) == (2, 0) and page_mode_for(48, 16) == (2, 0)
    assert page_mode_for(16, 64) == (1, 4) and page_mode_for(1, 16) == (1, 0) and page_mode_for(32, 64) == (1, 5)
    assert page_mode_for(24, 16) == (0, 0) and page_mode_for(96, 64) == (0, 0)


# ---------------------------------------------------------------- kernel vs reference
CASES = {
    # name: (B, N, q_len, block_size, lens)
    "n16_b16": (2, 16, 1, 16, (37, 5)),
    "n1_block1": (3, 1, 1, 1, (7, 1, 3)),
    "n3_mtp2_block64": (2, 3, 2, 64, (70, 2)),
    "n24_block16": (2, 24, 1, 16, (33, 60)),
    "n5_mtp4": (3, 5, 4, 16, (19, 4, 40)),
    "seq1": (2, 8, 1, 16, (1, 1)),
    # Page sizes that are no power of two: smaller than a tile (PAGE_MODE 0: a division per row)
    # and a multiple of the CPU configs' 16-token tile (PAGE_MODE 2: one page per tile).
    "n8_block24": (2, 8, 1, 24, (50, 7)),
    "n4_mtp2_block48": (2, 4, 2, 48, (100, 3)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("splits", [None, 1, 7])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(backend, dtype, splits, name):
    if backend == "reference" and splits not in (None,):
        pytest.skip("the reference has no splits")
    B, N, q_len, bs, lens = CASES[name]
    case = make_case(lens, N, q_len, bs, dtype, q_layout="one_buffer" if splits != 7 else "separate")
    # out and lse allocated by the op (the given-buffer path: the strided tests below)
    out, lse = case.run(num_splits=splits, backend=backend, out=None, lse=None)
    assert out.shape == (B * q_len, N, 512) and out.dtype == dtype
    assert lse.shape == (B * q_len, N) and lse.dtype == torch.float32
    case.check(out, lse)


@pytest.mark.parametrize("splits", [1, 3])
def test_many_heads_several_head_blocks(splits):
    """N=128 with q_len=2: 256 rows per request, several row blocks sharing each KV tile."""
    case = make_case((21,), 128, 2, 16, torch.float16, seed=3)
    case.run(num_splits=splits, backend="triton")
    case.check()


@pytest.mark.parametrize("splits", [1, 3])
def test_strided_outputs_written_in_place(splits):
    """out a token- and dim-padded view, lse the transpose of an [N, rows] buffer: every element
    of both views written (by stage 1 directly, or by stage 2), nothing around them touched, and
    the given tensors returned."""
    case = make_case((25, 9), 6, 2, 16, torch.float16, q_layout="separate")
    out_base, out = poisoned((4, 6, 512), torch.float16, DEVICE, pad_last=64, token_pad=2)
    lse_base, lse = poisoned((4, 6), torch.float32, DEVICE, transpose01=True)
    o2, l2 = case.run(out=out, lse=lse, num_splits=splits)
    assert o2 is out and l2 is lse
    case.check(out, lse)
    assert outside_untouched(out_base, out) and outside_untouched(lse_base, lse)


@pytest.mark.parametrize("splits", [1, None, 5])
def test_mixed_lengths_one_much_longer(splits):
    case = make_case((3, 300, 9), 4, 1, 16, torch.float16, seed=5)
    case.run(num_splits=splits, max_seq_len=300)
    case.check()


def test_more_splits_than_tokens_and_empty_requests():
    """seq_len 0 (a padding request) gives out 0 and lse -inf; splits past a request's end write
    nothing the reduction reads."""
    case = make_case((0, 2, 17), 4, 1, 16, torch.float16)
    out, lse = case.run(num_splits=9)
    assert torch.equal(out[0].float(), torch.zeros(4, 512, device=DEVICE))
    assert bool((lse[0] == -math.inf).all())
    case.check()  # row 0 too: out 0 and lse -inf are the reference's


@pytest.mark.parametrize("splits", [1, 2])
def test_rows_without_keys_in_a_multi_token_block(splits):
    """seq_len 2 with q_len 3: row 0 sees no key (out 0, lse -inf) while rows 1 and 2 of the same
    program do -- the online softmax must not turn the empty row into NaN."""
    case = make_case((2, 20), 4, 3, 16)
    out, lse = case.run(num_splits=splits)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and bool((lse[0] == -math.inf).all())
    case.check(tol=decode.FP32_SHORT)


def test_split_count_does_not_change_result():
    case = make_case((90, 47), 16, 1, 16, seed=7)
    one = tuple(t.clone() for t in case.run(num_splits=1))
    case.check(*one)
    for s in (2, 4, 6):
        out, lse = case.run(num_splits=s, out=None, lse=None)
        case.check(out, lse, ref=one, tol=decode.SPLIT_ORDER)


def test_causal_rows_see_their_own_prefix():
    """MTP rows: row t must not see the keys of later new tokens. A huge value on the last key
    would dominate every row that (wrongly) saw it."""
    case = make_case((10,), 2, 3, 16)
    page = int(case.block_table[0, 0])
    case.kv_cache[page, 9, :] = 0.0
    case.kv_cache[page, 9, :512] = 50.0  # V of the last token: only row 2 may see it
    case.kv_cache[page, 9, 512:] = 0.0
    out, _ = case.run(num_splits=2)
    assert float(out[:2].abs().max()) < 10.0 < float(out[2].abs().max())
    case.check()


# ---------------------------------------------------------------- fp8 caches
@pytest.mark.parametrize("scale_kind", ["tensor", "float"])
@pytest.mark.parametrize(
    "storage,kv_name", [("float8", "auto"), ("float8", "fp8"), ("uint8", "fp8"), ("uint8", "fp8_e4m3")]
)
def test_fp8_cache(scale_kind, storage, kv_name):
    """fp8 caches as vLLM hands them over: a float8 tensor, or uint8 storage plus the
    kv_cache_dtype string (viewed as the platform's e4m3: e4m3fnuz on gfx942, e4m3fn elsewhere)."""
    dtype = torch.bfloat16 if HAS_GPU else torch.float16
    case = make_case((40, 6), 8, 2, 16, dtype, fp8=True, k_scale=0.5, seed=11)
    ks = torch.tensor(0.5, device=DEVICE) if scale_kind == "tensor" else 0.5
    kv = case.kv_cache.view(torch.uint8) if storage == "uint8" else case.kv_cache
    for splits in (1, 3):
        out, lse = call_decode(
            case.q_nope,
            case.q_pe,
            kv,
            case.block_table,
            case.seq_lens,
            sm_scale=case.sm_scale,
            kv_cache_dtype=kv_name,
            k_scale=ks,
            num_splits=splits,
        )
        case.check(out, lse)
    # The same values against the dense formulation (the scale really applied, to K and V).
    do, dl = _dense_attention(case)
    raise_on(compare("out", out.float().cpu(), do, decode.TOLERANCE[dtype]["out"]).problem)


@pytest.mark.parametrize("storage", ["float8", "uint8"])
def test_fp8_cache_named_kind(storage):
    """The fp8 names that name a kind ("fp8_e4m3fn", "fp8_e4m3fnuz"), as fused_rope_mla_kv_write
    takes them: uint8 storage is read as that kind; a float8 cache of the other kind is refused."""
    dtype = torch.bfloat16 if HAS_GPU else torch.float16
    case = make_case((40, 6), 8, 2, 16, dtype, fp8=True, k_scale=0.5, seed=11)
    name = {torch.float8_e4m3fn: "fp8_e4m3fn", torch.float8_e4m3fnuz: "fp8_e4m3fnuz"}[case.paged.fp8]
    kv = case.kv_cache.view(torch.uint8) if storage == "uint8" else case.kv_cache
    out, lse = call_decode(
        case.q_nope,
        case.q_pe,
        kv,
        case.block_table,
        case.seq_lens,
        sm_scale=case.sm_scale,
        kv_cache_dtype=name,
        k_scale=0.5,
        num_splits=3,
    )
    case.check(out, lse)
    if storage == "float8":
        other = "fp8_e4m3fnuz" if name == "fp8_e4m3fn" else "fp8_e4m3fn"
        with pytest.raises(TypeError, match=f"kv_cache: expected dtype float8_e4m3fnu?z? \\(kv_cache_dtype='{other}'"):
            call_decode(
                case.q_nope,
                case.q_pe,
                kv,
                case.block_table,
                case.seq_lens,
                sm_scale=case.sm_scale,
                kv_cache_dtype=other,
                k_scale=0.5,
            )


def test_k_scale_ignored_for_16bit_cache():
    """vLLM passes layer._k_scale (1.0) for every cache; a 16-bit cache is not scaled."""
    case = make_case((20,), 4, 1, 16, torch.float16)
    case.run(k_scale=torch.tensor(3.0, device=DEVICE))
    case.check()


# ---------------------------------------------------------------- workspace, dispatch
def test_workspace_reused_and_capped():
    case = make_case((50, 20), 4, 1, 16)
    need = mla_decode_workspace_numel(2, 4, 4)
    ws = torch.full((need,), math.nan, device=DEVICE)
    case.check(*case.run(num_splits=4, workspace=ws))
    small = torch.empty(mla_decode_workspace_numel(2, 4, 2), device=DEVICE)
    case.check(*case.run(workspace=small, out=None, lse=None))  # S capped to what the workspace holds
    with pytest.raises(ValueError, match="workspace: expected a contiguous float32 tensor of >= "):
        case.run(num_splits=4, workspace=small)


@pytest.mark.parametrize("backend", BACKENDS)
def test_workspace_dtype_and_layout_checked_on_every_path(backend):
    """A workspace the split path could not use is rejected by the wrapper, also where this call
    would not touch it (reference backend, one split)."""
    case = make_case((50, 20), 4, 1, 16)
    need = mla_decode_workspace_numel(2, 4, 4)
    with pytest.raises(TypeError, match="mla_decode: workspace: expected dtype float32, got float16"):
        case.run(backend=backend, num_splits=1, workspace=torch.empty(need, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="mla_decode: workspace: expected a contiguous tensor"):
        case.run(backend=backend, workspace=torch.empty(2 * need, device=DEVICE)[::2])


def test_forced_backend_env(monkeypatch):
    case = make_case((9,), 4, 1, 16)
    monkeypatch.setenv("ROCM_MLA_BACKEND_MLA_DECODE", "reference")
    case.check(*case.run())
    # No HIP decode kernel: forcing it raises (on CPU because HIP cannot run at all).
    with pytest.raises(RuntimeError, match="backend 'hip' was requested but"):
        case.run(backend="hip")


def test_empty_batch():
    case = make_case((3,), 4, 1, 16)
    qn, qp = case.q_nope[:0], case.q_pe[:0]
    out, lse = call_decode(qn, qp, case.kv_cache, case.block_table[:0], case.seq_lens[:0], sm_scale=0.1)
    assert out.shape == (0, 4, 512) and lse.shape == (0, 4)


# ---------------------------------------------------------------- the split heuristic
H200 = dict(
    block_n=32,
    block_h=16,
    kv_elem_bytes=2,
    num_cus=132,
    ctas_per_cu=1,
    min_tokens_per_split=64,
    max_splits=64,
    fixed_tiles=2.0,
    launch_tiles=3.0,
)


def test_split_heuristic_examples():
    assert choose_num_splits(128, 1, 4096, **H200) == 1  # the GPU is already full: one launch
    assert choose_num_splits(1, 1, 4096, **H200) == 64  # latency-bound: two tiles a program
    h64 = dict(H200, block_n=64)  # the sm90 N=16 tier (the docstring's examples)
    assert [choose_num_splits(b, 1, 4096, **h64) for b in (128, 32, 1)] == [1, 4, 64]
    assert choose_num_splits(1, 1, 40, **H200) == 1  # too short to split
    s8 = choose_num_splits(8, 1, 160_000, **H200)
    assert 8 <= s8 <= 64 and 8 * s8 <= 2 * 132  # fills about one wave
    big = dict(H200, block_h=64)
    assert choose_num_splits(128, 2, 4096, **big) == 1
    assert choose_num_splits(0, 1, 4096, **H200) == 1


def test_stage1_config_tiers_and_overrides():
    fp16 = torch.float16
    assert tier_config("sm90", 16, fp16, False)["BLOCK_H"] == 16
    assert tier_config("sm90", 17, fp16, False)["BLOCK_H"] == 32
    assert tier_config("sm90", 256, fp16, False)["BLOCK_H"] == 64
    fp8_wide = tier_config("sm90", 256, fp16, True)  # fp8 override: 128 rows, V halves
    assert (fp8_wide["BLOCK_H"], fp8_wide["V_SPLIT"], fp8_wide["num_warps"]) == (128, 2, 8)
    assert tier_config("sm90", 16, fp16, True).get("RELOAD_K") is True
    cand = config_for("mla_decode", "sm90")["candidates"][-1]
    assert tier_config("sm90", 16, fp16, False, cand)["BLOCK_N"] == cand["BLOCK_N"]
    with pytest.raises(ValueError, match="config: expected a BLOCK_N entry"):
        tier_config("sm90", 16, fp16, False, {"BLOCK_H": 16, "num_warps": 4, "num_stages": 1})


def test_launch_config_override_runs():
    case = make_case((30, 12), 4, 1, 16, torch.float16)
    cfg = {"BLOCK_H": 32, "BLOCK_N": 32, "D_SPLIT": 2, "num_warps": 4, "num_stages": 1}
    case.check(*case.run(config=cfg, num_splits=2))


def test_fp8_cache_f16_dots_with_bf16_q():
    """F16_DOT (sm90 fp8 tiers): a bfloat16 q and an fp8 cache run both dots in float16; the
    result stays within the bf16 tolerance, split or not, and q beyond the f16 range saturates
    instead of turning into inf/NaN."""
    case = make_case((45, 7), 20, 1, 16, torch.bfloat16, fp8=True, k_scale=0.5, seed=21)
    cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "RELOAD_K": True, "F16_DOT": True}
    for splits in (1, 2):
        case.check(*case.run(config=cfg, num_splits=splits, k_scale=0.5, out=None, lse=None))
    assert tier_config("sm90", 16, torch.bfloat16, True)["F16_DOT"] is True


def _arch_configs():
    """Every stage-1 config of the GPU arches (tiers and tuning candidates), for fp16 and fp8
    caches, as (id, config, fp8) -- the interpreter runs each code path (BLOCK_H/BLOCK_N, D_SPLIT,
    RELOAD_K) that the GPUs compile."""
    out = []
    for arch in ("gfx942", "gfx950", "sm90"):
        table = config_for("mla_decode", arch)
        configs = table["tiers"] + table["candidates"]
        for i, tier in enumerate(c for j, c in enumerate(configs) if c not in configs[:j]):
            for fp8 in (False, True):
                cfg = tier_config(arch, 0, torch.float16, fp8, tier)
                out.append(pytest.param(cfg, fp8, id=f"{arch}-{i}-{'fp8' if fp8 else 'fp16'}"))
    return out


@pytest.mark.parametrize("cfg,fp8", _arch_configs())
def test_every_arch_config_is_right(cfg, fp8):
    case = make_case((45, 7), 20, 1, 16, torch.float16, fp8=fp8, k_scale=0.5, seed=13)
    for splits in (1, 2):
        case.check(*case.run(config=cfg, num_splits=splits, k_scale=0.5 if fp8 else None, out=None, lse=None))


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90"])
def test_variants_cover_every_config(arch):
    """The ISA report's list holds each tier's config for each dtype, direct and split."""
    vs = triton_variants(arch)
    s1 = [v for v in vs if v.kernel == "mla_decode_stage1"]
    assert len({v.config for v in vs}) == len(vs)
    for fp8 in (False, True):
        for m in (1, 24, 256):
            cfg = tier_config(arch, m, torch.bfloat16, fp8)
            hits = [
                v
                for v in s1
                if v.constexprs["BLOCK_H"] == cfg["BLOCK_H"]
                and v.constexprs["BLOCK_N"] == cfg["BLOCK_N"]
                and v.options["num_warps"] == cfg["num_warps"]
                and v.signature["q_nope"] == "*bf16"
                and (v.signature["kv"] != "*bf16") == fp8
            ]
            assert {v.constexprs["DIRECT"] for v in hits} >= {True, False}, (arch, fp8, m)
    assert all(v.expects_mfma for v in s1 if "fp32" not in v.config)
    assert any(v.kernel == "mla_decode_reduce" for v in vs)


# ---------------------------------------------------------------- bad input
def _good(c=None):
    c = make_case((9, 3), 4, 1, 16) if c is None else c
    return dict(
        q_nope=c.q_nope, q_pe=c.q_pe, kv_cache=c.kv_cache, block_table=c.block_table, seq_lens=c.seq_lens, sm_scale=0.1
    )


def _z(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "change,exc,words",
    [
        (lambda a: dict(q_nope=_z(2, 4, 511)), ValueError, ["q_nope", "last dim 512", "(2, 4, 511)"]),
        (lambda a: dict(q_pe=_z(2, 4, 32)), ValueError, ["q_pe", "(2, 4, 64)", "(2, 4, 32)"]),
        (lambda a: dict(q_pe=a["q_pe"].half()), TypeError, ["q_pe", "float32", "float16"]),
        (lambda a: dict(kv_cache=_z(5, 16, 575)), ValueError, ["kv_cache", "last dim 576", "(5, 16, 575)"]),
        (
            lambda a: dict(kv_cache=a["kv_cache"].half()),
            TypeError,
            ["kv_cache", "float32 (like q_nope) or fp8", "float16"],
        ),
        (
            lambda a: dict(kv_cache=a["kv_cache"].view(torch.uint8)[..., :576]),
            ValueError,
            ["kv_cache_dtype", "'fp8'", "'auto'"],
        ),
        (lambda a: dict(kv_cache_dtype="fp8_e5m2"), ValueError, ["kv_cache_dtype", "'fp8_e4m3'", "fp8_e5m2"]),
        (lambda a: dict(kv_cache_dtype="fp8"), TypeError, ["kv_cache", "uint8", "float32"]),
        (lambda a: dict(kv_cache_dtype="float16"), TypeError, ["kv_cache", "float16 (kv_cache_dtype)", "float32"]),
        (lambda a: dict(block_table=a["block_table"].long()), TypeError, ["block_table", "int32", "int64"]),
        (lambda a: dict(seq_lens=a["seq_lens"][:1]), ValueError, ["seq_lens", "(2,)", "(1,)"]),
        (lambda a: dict(seq_lens=a["seq_lens"].long()), TypeError, ["seq_lens", "int32", "int64"]),
        (lambda a: dict(q_nope=_z(3, 4, 512), q_pe=_z(3, 4, 64)), ValueError, ["q_nope", "uniform q_len", "3 rows"]),
        (lambda a: dict(out=_z(2, 4, 512, dtype=torch.float16)), TypeError, ["out", "float32", "float16"]),
        (lambda a: dict(out=_z(2, 1, 512).expand(2, 4, 512)), ValueError, ["out", "overlap", "stride"]),
        (lambda a: dict(lse=_z(4, 2)), ValueError, ["lse", "(2, 4)", "(4, 2)"]),
        (
            lambda a: dict(k_scale=torch.tensor([1.0, 2.0], device=DEVICE)),
            ValueError,
            ["k_scale", "one element", "(2,)"],
        ),
        (
            lambda a: dict(k_scale=torch.tensor(1.0, dtype=torch.float64, device=DEVICE)),
            TypeError,
            ["k_scale", "float32", "float64"],
        ),
        (lambda a: dict(num_splits=0), ValueError, ["num_splits", "int >= 1", "0"]),
        (lambda a: dict(sm_scale="x"), TypeError, ["sm_scale", "a float", "str"]),
        (lambda a: dict(sm_scale=0.0), ValueError, ["sm_scale", "finite number > 0", "0.0"]),
        (lambda a: dict(sm_scale=-0.1), ValueError, ["sm_scale", "finite number > 0", "-0.1"]),
        (lambda a: dict(sm_scale=float("nan")), ValueError, ["sm_scale", "finite number > 0", "nan"]),
        (lambda a: dict(sm_scale=float("inf")), ValueError, ["sm_scale", "finite number > 0", "inf"]),
        (lambda a: dict(k_scale=-1.0), ValueError, ["k_scale", "finite number > 0", "-1.0"]),
        (lambda a: dict(q_nope=[1]), TypeError, ["q_nope", "torch.Tensor", "list"]),
        (
            lambda a: dict(kv_cache=_z(5, 576, 16).transpose(1, 2)),
            ValueError,
            ["kv_cache", "contiguous last dim", "strides"],
        ),
    ],
)
def test_bad_input_names_argument(change, exc, words):
    args = _good()
    args.update(change(args))
    raises_naming(exc, lambda: call_decode(**args), *words)


# The no-debug call below reads request 1's all-NaN spare page on purpose (interpreter warns).
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered")
def test_debug_checks_seq_lens_and_pages():
    """The syncing checks (debug=True / ROCM_MLA_DEBUG=1): lengths past the table's capacity, and
    page ids outside the cache for blocks in use."""
    case = make_case((9, 3), 4, 1, 16)
    args = _good(case)
    cap = args["block_table"].shape[1] * args["kv_cache"].shape[1]
    bad = args["seq_lens"].clone()
    bad[1] = cap + 1
    words = ("seq_lens", f"capacity {cap}", f"seq_lens[1] = {cap + 1}")
    raises_naming(ValueError, lambda: call_decode(**{**args, "seq_lens": bad}, debug=True), *words)
    bt = args["block_table"].clone()
    bt[0, 0] = 10_000
    with pytest.raises(ValueError, match=r"block_table: expected page ids in \[0, 5\).*10000"):
        call_decode(**{**args, "block_table": bt}, debug=True)
    # Without debug: no sync, no check; the kernel clamps the bad length to the capacity, so it
    # reads nothing past the table (request 1 then reads its poisoned spare page: garbage in,
    # garbage out), and the other request is unaffected.
    out, lse = call_decode(**{**args, "seq_lens": bad})
    ro, rl = mla_decode_ref(args["q_nope"], args["q_pe"], args["kv_cache"], args["block_table"], args["seq_lens"], 0.1)
    case.check(out[:1], lse[:1], ref=(ro[:1], rl[:1]))


# ---------------------------------------------------------------- V_SPLIT


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("name", ["n24_block16", "n5_mtp4", "n8_block24"])
def test_v_split_matches_reference(dtype, splits, name):
    """V_SPLIT=2: two programs per row block, each owning half of the 512 output columns; every
    element still written once (NaN-poisoned strided out), lse written by one of them."""
    B, N, q_len, bs, lens = CASES[name]
    case = make_case(lens, N, q_len, bs, dtype, seed=31)
    out_base, out = poisoned((B * q_len, N, 512), dtype, DEVICE, token_pad=3)
    lse_base, lse = poisoned((B * q_len, N), torch.float32, DEVICE, transpose01=True)
    case.run(out=out, lse=lse, config=V_SPLIT_CFG, num_splits=splits, backend="triton")
    case.check(out, lse)
    assert outside_untouched(out_base, out) and outside_untouched(lse_base, lse)


def test_v_split_needs_d_split_two_is_forced():
    from rocm_mla.ops.decode_plan import triton_meta

    consts, _ = triton_meta(
        "cpu", {**V_SPLIT_CFG, "D_SPLIT": 1}, torch.float16, False, direct=True, has_scale_ptr=False, page_mode=2
    )
    assert consts["V_SPLIT"] == 2 and consts["D_SPLIT"] == 2


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("N,q_len", [(128, 1), (128, 2), (16, 2), (16, 4)])
def test_gpu_v_split_and_wide_tiles(kv, N, q_len):
    """V_SPLIT and the 64-row tiles on the GPU (wgmma on sm90), MTP and fp8 included."""
    lens = (3000, 17, 900, q_len)
    case = make_case(lens, N, q_len, 64, torch.bfloat16, fp8=kv == "fp8", k_scale=0.25, seed=5, q_layout="separate")
    for cfg in (
        {"BLOCK_H": 64, "BLOCK_N": 32, "D_SPLIT": 2, "V_SPLIT": 2, "num_warps": 4, "num_stages": 2},
        {"BLOCK_H": 64, "BLOCK_N": 64, "D_SPLIT": 1, "num_warps": 8, "num_stages": 2},
    ):
        for splits in (None, 1, 7):
            out_base, out = poisoned((4 * q_len, N, 512), torch.bfloat16, DEVICE, token_pad=1)
            o, lse = case.run(out=out, lse=None, config=cfg, num_splits=splits, k_scale=0.25 if kv == "fp8" else None)
            case.check(o, lse)
            assert outside_untouched(out_base, out)
