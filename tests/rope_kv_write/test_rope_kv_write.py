"""fused_rope_mla_kv_write / concat_and_cache_mla: every backend against the float32 reference and
against the unfused path vLLM runs today (torch RoPE as RotaryEmbedding.forward_static does it,
then a separate cache write); the reference against an independent formula; strided inputs,
poisoned caches (untouched rows compared bitwise), slot -1, short slot mappings, T = 0, bad input.
fp8 caches, the HIP kernel on the CPU and the GPU-only sizes: the test_rope_kv_write_*.py files
beside this one.

CPU: Triton in the interpreter (float32/float16; bf16 is wrong there) and the reference.
GPU (@pytest.mark.gpu or bf16/HIP parametrisations that only exist there): bf16, FP8, HIP.
"""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, DTYPES, backends, raises_naming
from rope_case import MAX_POS, Q_WIDTH, check_against_both, make_case, run, vllm_forward_static

import rocm_mla
from rocm_mla.cases import compare, generator, outside_untouched, poisoned, raise_on, randn
from rocm_mla.cases import rope_kv_write as cases
from rocm_mla.reference.rope_kv_write import rope_cos_sin_cache, rope_ref

F32_TOL = cases.TOLERANCE[torch.float32]


@pytest.mark.parametrize(
    "kw,arg",
    [
        ({"max_pos": -1}, "max_pos"),
        ({"max_pos": 4.0}, "max_pos"),
        ({"rot_dim": 63}, "rot_dim"),
        ({"rot_dim": 0}, "rot_dim"),
        ({"base": 0.0}, "base"),
        ({"base": float("inf")}, "base"),
        ({"mscale": float("nan")}, "mscale"),
        ({"mscale": True}, "mscale"),
    ],
)
def test_cos_sin_cache_builder_names_a_bad_argument(kw, arg):
    """rope_cos_sin_cache: a bad size, dimension or scale raises naming it (no torch error, no NaN table)."""
    args = {"max_pos": 16, **kw}
    raises_naming(ValueError, lambda: rope_cos_sin_cache(args.pop("max_pos"), **args), "rope_cos_sin_cache", arg)


def test_cos_sin_cache_builder_layout():
    """[max_pos, 64]: row p = cat(cos(p f), sin(p f)) * mscale, f_i = base^(-2i/64); zero rows allowed."""
    cs = rope_cos_sin_cache(5, mscale=2.0, compute_dtype=torch.float64, dtype=torch.float64)
    f = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    # A float64 table against its formula: float64 exactness (the cases' rule compares in float32).
    torch.testing.assert_close(cs[3], 2.0 * torch.cat(((3 * f).cos(), (3 * f).sin())), rtol=1e-12, atol=1e-12)
    assert rope_cos_sin_cache(0).shape == (0, 64)


# ---------------------------------------------------------------- the reference itself
def test_reference_rope_is_complex_rotation():
    """Independent check: GPT-J rotation is (x + iy) * r e^{i theta} on pairs (2i, 2i+1); NeoX the
    same on (i, i+32); r = mscale. float64 formula, float32 reference."""
    g = generator(1, "cpu")
    T, N = 7, 3
    x = randn((T, N, 64), g, "cpu", torch.float64)
    pos = torch.randint(0, 500, (T,), generator=g)
    theta = torch.rand(500, 32, generator=g, dtype=torch.float64) * 6.3
    r = 1.3
    cs = torch.cat((theta.cos() * r, theta.sin() * r), dim=-1)
    rot = r * torch.exp(1j * theta[pos])[:, None, :]  # [T, 1, 32]
    gptj = torch.view_as_real(torch.complex(x[..., 0::2], x[..., 1::2]) * rot).flatten(-2)
    z = torch.complex(x[..., :32], x[..., 32:]) * rot
    neox = torch.cat((z.real, z.imag), dim=-1)
    bound = F32_TOL["q_pe"]
    raise_on(compare("gptj", rope_ref(pos, x.float(), cs.float(), is_neox=False), gptj.float(), bound).problem)
    raise_on(compare("neox", rope_ref(pos, x.float(), cs.float(), is_neox=True), neox.float(), bound).problem)


@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
def test_reference_equals_vllm_forward_static_in_float64(is_neox):
    g = generator(2, "cpu")
    T, N = 9, 4
    q = randn((T, N, 64), g, "cpu", torch.float64)
    k = randn((T, 1, 64), g, "cpu", torch.float64)
    pos = torch.randint(0, MAX_POS, (T,), generator=g)
    cs = rope_cos_sin_cache(MAX_POS, mscale=1.25, compute_dtype=torch.float64, dtype=torch.float64)
    vq, vk = vllm_forward_static(pos, q, k, cs, is_neox)
    raise_on(compare("q_pe", rope_ref(pos, q, cs, is_neox=is_neox), vq.float(), F32_TOL["q_pe"]).problem)
    raise_on(compare("k_pe", rope_ref(pos, k, cs, is_neox=is_neox), vk.float(), F32_TOL["k_pe"]).problem)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("N", [1, 8, 24, 128])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_matches_reference_and_unfused(backend, dtype, is_neox, N, block_size):
    case = make_case(13, N, block_size, dtype, is_neox=is_neox, skip=(1, 6), q_width=Q_WIDTH[N])
    run(case, backend)
    check_against_both(case, exact=DEVICE.type == "cpu")


@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
def test_triton_64_bit_cos_sin_offsets(monkeypatch, is_neox):
    """The Triton kernel's CS_I64 branch (64-bit cos/sin row offsets, which the launcher takes for a
    cos_sin_cache whose last row starts 2^31 elements or more from its first: too big to allocate
    here) gives the reference's results like the 32-bit one."""
    import rocm_mla.ops.rope_kv_write as rk

    orig, taken = rk.triton_meta, []

    def forced(*args, **kw):
        consts, options = orig(*args, **{**kw, "cs_i64": True})
        taken.append(consts["CS_I64"])
        return consts, options

    monkeypatch.setattr(rk, "triton_meta", forced)
    case = make_case(13, 8, 16, torch.float32, is_neox=is_neox, skip=(1, 6))
    run(case, "triton")
    assert taken == [True]
    check_against_both(case)


def test_triton_cos_sin_offset_width_from_the_cache_extent():
    """CS_I64 is taken exactly when the cache's last row starts 2^31 elements or more from its first
    (shapes and strides only: no 8 GB cache needed)."""
    from types import SimpleNamespace

    from rocm_mla.ops.rope_kv_write import cos_sin_offsets_need_64_bit as need

    def cs(rows, row_stride):
        return SimpleNamespace(shape=(rows, 64), stride=lambda dim: (row_stride, 1)[dim])

    assert not need(cs(163840, 64)) and not need(cs(0, 64)) and not need(cs(1, 2**40))
    assert not need(cs(2**25, 64))  # last row at 2^31 - 64
    assert need(cs(2**25 + 1, 64))  # last row at 2^31
    assert need(cs(3, 2**30 + 1))


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("cs_dtype", ["q", torch.float32], ids=["cs=q", "cs=fp32"])
def test_cos_sin_cache_in_q_dtype(backend, cs_dtype):
    dtype = torch.float16
    case = make_case(11, 16, 16, dtype, cs_dtype=dtype if cs_dtype == "q" else cs_dtype)
    run(case, backend)
    check_against_both(case)


@pytest.mark.parametrize("backend", backends())
def test_strided_everything(backend):
    """Non-contiguous block stride, kv_c and cos_sin_cache with padded rows, k_pe [T, 64] 2-D,
    q_pe with a token stride that is not N * 192."""
    T, N, bs = 10, 8, 16
    case = make_case(T, N, bs, torch.float32, block_pad=1)
    q_wide, case.q = poisoned((T, N, 192), torch.float32, DEVICE, token_pad=2)
    case.q.copy_(case.q0)
    kv_c_wide, _ = poisoned((T, 512), torch.float32, DEVICE, pad_last=128)
    case.kv_c = kv_c_wide[:, 64:576].copy_(case.kv_c)
    cs_wide = torch.zeros(MAX_POS, 96, device=DEVICE)
    cs_wide[:, 16:80] = case.cos_sin
    case.cos_sin = cs_wide[:, 16:80]
    k2 = case.kv_a[:, 512:]  # [T, 64], the shape vLLM's concat_and_cache_mla takes
    rocm_mla.fused_rope_mla_kv_write(
        case.positions, case.q_pe, k2, case.kv_c, case.cos_sin, case.cache, case.slots, is_neox=False, backend=backend
    )
    check_against_both(case)
    assert outside_untouched(q_wide, case.q), "wrote heads outside the q_pe view"


@pytest.mark.parametrize("backend", backends())
def test_inner_strided_scalar_path(backend):
    """Inner stride 2 everywhere (the HIP scalar path on a GPU)."""
    case = make_case(6, 3, 4, torch.float32, is_neox=True, q_width=64, inner_stride=2)
    assert case.q_pe.stride(-1) == case.k_pe.stride(-1) == case.kv_c.stride(-1) == case.cache.stride(-1) == 2
    run(case, backend)
    check_against_both(case)  # untouched: the elements between the strided cache elements included
    assert outside_untouched(case.cache_base, case.cache), "wrote between the strided cache elements"


@pytest.mark.parametrize("backend", backends())
def test_slot_minus_one_and_short_slot_mapping(backend):
    """Negative slots and tokens past len(slot_mapping) are rotated but never cached."""
    T = 9
    case = make_case(T, 4, 16, torch.float32, skip=(0, 4, 8))
    full = case.slots.clone()
    case.slots = full[:6]  # vLLM: slot_mapping unpadded, batch padded for CUDA graphs
    run(case, backend)
    # All 9 rotated; the rows of the first 6 tokens; slots full[6:] and the -1 tokens not written.
    case.check()
    assert case.cached().sum() == 4


@pytest.mark.parametrize("backend", backends())
def test_all_slots_skipped(backend):
    case = make_case(5, 2, 16, torch.float32, is_neox=True, skip=range(5))
    run(case, backend)
    assert not case.cached().any()
    case.check()


@pytest.mark.parametrize("backend", backends())
def test_empty_batch(backend):
    case = make_case(0, 8, 16, torch.float32)
    run(case, backend)
    rocm_mla.concat_and_cache_mla(case.kv_c, case.k_pe, case.cache, case.slots, backend=backend)
    assert torch.equal(case.cache_base.view(torch.uint8), case.cache0.view(torch.uint8))


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("k_shape", ["[T,1,64]", "[T,64]"])
def test_concat_and_cache_mla(backend, k_shape):
    case = make_case(12, 1, 16, torch.float16, skip=(3,))
    k_pe = case.k_pe if k_shape == "[T,1,64]" else case.k_pe.squeeze(1)
    rocm_mla.concat_and_cache_mla(case.kv_c, k_pe, case.cache, case.slots, backend=backend)
    assert torch.equal(case.kv_a, case.kv_a0), "concat_and_cache_mla must not rotate k_pe"
    want = torch.cat((case.kv_c, case.kv_a[:, 512:]), dim=-1)[case.slots >= 0]
    assert torch.equal(case.written_rows(), want), "rows must be [kv_c | k_pe], copied exactly"
    raise_on(case.untouched())


# ---------------------------------------------------------------- bad input
def _good(T=3, N=2):
    g = generator(4, "cpu")
    return dict(
        positions=torch.randint(0, 16, (T,), generator=g),
        q_pe=randn((T, N, 64), g, "cpu"),
        k_pe=randn((T, 1, 64), g, "cpu"),
        kv_c=randn((T, 512), g, "cpu"),
        cos_sin_cache=randn((16, 64), g, "cpu"),
        kv_cache=torch.zeros(2, 4, 576),
        slot_mapping=torch.tensor([0, 5, -1]),
    )


def _fn_cache():
    return torch.zeros(2, 4, 576).to(torch.float8_e4m3fn)


@pytest.mark.parametrize(
    "change,exc,words",
    [
        (dict(q_pe=torch.zeros(3, 2, 63)), ValueError, ["q_pe", "[T, N, 64]", "(3, 2, 63)"]),
        (dict(q_pe=torch.zeros(3, 128)), ValueError, ["q_pe", "3-D", "(3, 128)"]),
        (dict(q_pe=torch.zeros(3, 2, 64, dtype=torch.int32)), TypeError, ["q_pe", "float32", "int32"]),
        (dict(k_pe=torch.zeros(3, 1, 65)), ValueError, ["k_pe", "(3, 1, 64)", "(3, 64)", "(3, 1, 65)"]),
        (dict(k_pe=torch.zeros(3, 2, 64)), ValueError, ["k_pe", "[T, 1, 64]", "(3, 2, 64)"]),
        (dict(k_pe=torch.zeros(3, 1, 64, dtype=torch.float16)), TypeError, ["k_pe", "float32", "float16"]),
        (dict(kv_c=torch.zeros(3, 511)), ValueError, ["kv_c", "[T, 512]", "(3, 512)", "(3, 511)"]),
        (dict(kv_c=torch.zeros(4, 512)), ValueError, ["kv_c", "(3, 512)", "(4, 512)"]),
        (dict(cos_sin_cache=torch.zeros(16, 128)), ValueError, ["cos_sin_cache", "[max_pos, 64]", "(16, 128)"]),
        (
            dict(cos_sin_cache=torch.zeros(16, 64, dtype=torch.float16)),
            TypeError,
            ["cos_sin_cache", "float32", "float16"],
        ),
        (dict(kv_cache=torch.zeros(2, 4, 575)), ValueError, ["kv_cache", "576", "(2, 4, 575)"]),
        (dict(kv_cache=torch.zeros(8, 576)), ValueError, ["kv_cache", "3-D", "(8, 576)"]),
        (
            dict(kv_cache=torch.zeros(2, 4, 576, dtype=torch.float16)),
            TypeError,
            ["kv_cache", "float32", "float16", "auto"],
        ),
        (dict(kv_cache=torch.zeros(2, 4, 576, dtype=torch.uint8)), TypeError, ["kv_cache", "fp8", "uint8"]),
        (dict(positions=torch.tensor([0, 1, 2], dtype=torch.int32)), TypeError, ["positions", "int64", "int32"]),
        (dict(positions=torch.tensor([0, 1])), ValueError, ["positions", "(3,)", "(2,)"]),
        (dict(slot_mapping=torch.tensor([0, 5, -1], dtype=torch.int32)), TypeError, ["slot_mapping", "int64", "int32"]),
        (dict(slot_mapping=torch.tensor([0, 1, 2, 3])), ValueError, ["slot_mapping", "S <= T = 3", "(4,)"]),
        (dict(kv_cache_dtype="fp8_e5m2"), ValueError, ["kv_cache_dtype", "'auto'", "'fp8_e4m3fnuz'", "'fp8_e5m2'"]),
        (dict(kv_cache=_fn_cache(), kv_cache_dtype="fp8"), TypeError, ["k_scale", "1-element float32", "None"]),
        (
            dict(kv_cache=_fn_cache(), kv_cache_dtype="fp8", k_scale=torch.ones(2)),
            ValueError,
            ["k_scale", "1-element", "(2,)"],
        ),
        (
            dict(kv_cache=_fn_cache(), kv_cache_dtype="fp8", k_scale=torch.ones(1, dtype=torch.float64)),
            TypeError,
            ["k_scale", "float32", "float64"],
        ),
        (
            dict(kv_cache=_fn_cache(), kv_cache_dtype="fp8_e4m3fnuz", k_scale=torch.ones(1)),
            TypeError,
            ["kv_cache", "float8_e4m3fnuz", "float8_e4m3fn"],
        ),
        (
            dict(kv_cache=torch.zeros(2, 4, 576), kv_cache_dtype="fp8", k_scale=torch.ones(1)),
            TypeError,
            ["kv_cache", "float8_e4m3fn, float8_e4m3fnuz or uint8", "float32"],
        ),
        ("expanded_q_pe", ValueError, ["q_pe", "overlap", "stride"]),
        (dict(positions=[0, 1, 2]), TypeError, ["positions", "torch.Tensor", "list"]),
    ],
)
def test_bad_input_names_argument(change, exc, words):
    if change == "expanded_q_pe":  # built on the device: .to() would materialise the expand
        change = dict(q_pe=torch.zeros(3, 1, 64, device=DEVICE).expand(3, 2, 64))
    args = {**_good(), **change}
    args = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    msg = raises_naming(exc, lambda: rocm_mla.fused_rope_mla_kv_write(is_neox=False, **args), *words)
    assert msg.startswith("fused_rope_mla_kv_write: ")


def test_concat_bad_input_names_argument():
    a = {k: v.to(DEVICE) for k, v in _good().items()}
    with pytest.raises(ValueError, match=r"concat_and_cache_mla: k_pe: expected .*\(3, 64\).* got \(3, 1, 32\)"):
        rocm_mla.concat_and_cache_mla(a["kv_c"], a["k_pe"][..., :32], a["kv_cache"], a["slot_mapping"])
    with pytest.raises(TypeError, match=r"concat_and_cache_mla: slot_mapping: expected dtype int64.*got int32"):
        rocm_mla.concat_and_cache_mla(a["kv_c"], a["k_pe"], a["kv_cache"], a["slot_mapping"].int())


def test_mixed_devices_message_without_gpu():
    a = {k: v.to(DEVICE) for k, v in _good().items()}
    a["cos_sin_cache"] = torch.empty(16, 64, device="meta")
    with pytest.raises(ValueError, match="cos_sin_cache.*device"):
        rocm_mla.fused_rope_mla_kv_write(is_neox=False, **a)


@pytest.mark.parametrize(
    "change,words",
    [
        (dict(positions=torch.tensor([0, 16, 2])), ["positions", "[0, 16)", "16 at index 1"]),
        (dict(positions=torch.tensor([0, -3, 2])), ["positions", "-3 at index 1"]),
        (
            dict(slot_mapping=torch.tensor([0, 8, -1])),
            ["slot_mapping", "< num_blocks x block_size = 8", "8 at index 1"],
        ),
        (dict(slot_mapping=torch.tensor([5, 5, -1])), ["slot_mapping", "distinct", "1 repeated"]),
    ],
)
def test_debug_range_checks(monkeypatch, change, words):
    """ROCM_MLA_DEBUG=1: out-of-range positions / slots are caught on the host, by name."""
    monkeypatch.setenv("ROCM_MLA_DEBUG", "1")
    args = {k: v.to(DEVICE) for k, v in {**_good(), **change}.items()}
    raises_naming(ValueError, lambda: rocm_mla.fused_rope_mla_kv_write(is_neox=False, **args), *words)


def test_forced_backend(monkeypatch):
    a = {k: v.to(DEVICE) for k, v in _good().items()}
    monkeypatch.setenv("ROCM_MLA_BACKEND_ROPE_KV_WRITE", "reference")
    q0 = a["q_pe"].clone()
    rocm_mla.fused_rope_mla_kv_write(is_neox=False, **a)
    want = rope_ref(a["positions"], q0, a["cos_sin_cache"], is_neox=False)
    assert torch.equal(a["q_pe"], want), "the forced reference backend is the reference"
    monkeypatch.setenv("ROCM_MLA_BACKEND_ROPE_KV_WRITE", "cuda-magic")
    with pytest.raises(
        ValueError, match="ROCM_MLA_BACKEND_ROPE_KV_WRITE='cuda-magic': expected one of hip, triton, reference"
    ):
        rocm_mla.fused_rope_mla_kv_write(is_neox=False, **a)


def test_default_dispatch():
    from rocm_mla.ops._dispatch import select

    want = ("hip", "triton") if DEVICE.type == "cuda" else ("triton",)
    assert select("rope_kv_write", DEVICE) in want
