"""fused_rope_mla_kv_write / concat_and_cache_mla: every backend against the float32 reference and
against the unfused path vLLM runs today (torch RoPE as RotaryEmbedding.forward_static does it,
then a separate cache write); the reference against an independent formula; the FP8 bit code
against torch; strided inputs, poisoned caches (untouched rows compared bitwise), slot -1, short
slot mappings, T = 0, bad input.

CPU: Triton in the interpreter (float32/float16; bf16 is wrong there) and the reference.
GPU (@pytest.mark.gpu or bf16/HIP parametrisations that only exist there): bf16, FP8, HIP.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from _hip_cpu import compile_hip_on_cpu
from _util import DEVICE, DTYPES, TOL, backends, raises_naming

import rocm_mla
from rocm_mla.reference.rope_kv_write import FP8_MAX, cache_rows_ref, quantize_fp8_ref, rope_cos_sin_cache, rope_ref

MAX_POS = 8192
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- inputs
def make_cos_sin_cache(dtype=torch.float32, max_pos=MAX_POS, base=10000.0, mscale=1.25):
    """vLLM's layout: cat(cos, sin) * mscale (YaRN folds mscale into the cache), [max_pos, 64];
    computed in float64, then cast to ``dtype`` and moved to DEVICE."""
    return rope_cos_sin_cache(max_pos, base=base, mscale=mscale, dtype=dtype, compute_dtype=torch.float64).to(DEVICE)


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
    torch.testing.assert_close(cs[3], 2.0 * torch.cat(((3 * f).cos(), (3 * f).sin())), rtol=1e-12, atol=1e-12)
    assert rope_cos_sin_cache(0).shape == (0, 64)


class Case:
    """One call's inputs, laid out as vLLM's DeepSeek path has them.

    q [T, N, q_width] with q_pe = q[..., -64:] (DeepSeek: q_width 192, strided; 64 = contiguous);
    kv_a [T, 576] with k_pe = kv_a[:, 512:]
    viewed [T, 1, 64] (strided); kv_c contiguous [T, 512]; the cache [num_blocks, block_size, 576]
    poisoned (NaN) with shuffled slots, a few of them -1.
    """

    def __init__(
        self,
        T,
        N,
        block_size,
        dtype,
        *,
        fp8=None,
        cs_dtype=torch.float32,
        skip=(1,),
        block_pad=0,
        seed=0,
        scale=1.0,
        q_width=192,
    ):
        g = torch.Generator().manual_seed(seed)
        self.T, self.N, self.dtype, self.fp8 = T, N, dtype, fp8
        self.q = (torch.randn(T, N, q_width, generator=g) * scale).to(dtype).to(DEVICE)
        self.nope = q_width - 64
        self.kv_a = (torch.randn(T, 576, generator=g) * scale).to(dtype).to(DEVICE)
        self.kv_c = (torch.randn(T, 512, generator=g) * scale).to(dtype).to(DEVICE)
        self.positions = torch.randint(0, MAX_POS, (T,), generator=g).to(DEVICE)
        self.cos_sin = make_cos_sin_cache(cs_dtype)
        num_blocks = (T + block_size - 1) // block_size + 3
        self.slots = torch.randperm(num_blocks * block_size, generator=g)[:T].to(DEVICE)
        for i in skip:
            if i < T:
                self.slots[i] = -1
        cache_dtype = fp8 or dtype
        # block_pad: extra blocks between the ones the view shows -> a non-contiguous block stride.
        base = torch.full((num_blocks * (1 + block_pad), block_size, 576), float("nan")).to(cache_dtype)
        self.cache_base = base.to(DEVICE)
        self.cache = self.cache_base[:: 1 + block_pad]
        self.k_scale = torch.tensor([0.37], device=DEVICE)
        self.before = {"q": self.q.clone(), "kv_a": self.kv_a.clone(), "cache": self.cache_base.clone()}

    @property
    def q_pe(self):
        return self.q[..., self.nope :]

    @property
    def k_pe(self):
        return self.kv_a[:, 512:].unsqueeze(1)

    def run(self, backend, is_neox, **kw):
        kw.setdefault("kv_cache_dtype", "fp8" if self.fp8 else "auto")
        kw.setdefault("k_scale", self.k_scale)
        rocm_mla.fused_rope_mla_kv_write(
            self.positions,
            self.q_pe,
            self.k_pe,
            self.kv_c,
            self.cos_sin,
            self.cache,
            self.slots,
            is_neox=is_neox,
            backend=backend,
            **kw,
        )

    def rows(self, slots=None):
        """The cache rows at the valid slots, in token order."""
        slots = self.slots if slots is None else slots
        valid = slots[slots >= 0]
        bs = self.cache.shape[1]
        # Gather bytes: float8 indexing is missing from some torch builds (CUDA).
        return self.cache.view(torch.uint8)[valid // bs, valid % bs].view(self.cache.dtype)

    def untouched_elsewhere(self):
        """Every cache row but the written ones, and q/kv_a outside the rope parts, are bitwise
        what they were (NaN stays NaN: compared as bytes, not values)."""
        written = torch.zeros(self.cache_base.shape[:2], dtype=torch.bool, device=DEVICE)
        valid = self.slots[self.slots >= 0]
        bs = self.cache.shape[1]
        step = self.cache_base.shape[0] // self.cache.shape[0]
        written[(valid // bs) * step, valid % bs] = True
        b = self.cache_base.view(torch.uint8)[~written]
        a = self.before["cache"].view(torch.uint8)[~written]
        assert torch.equal(a, b), "the op wrote cache rows it was not given a slot for"
        assert torch.equal(self.q[..., : self.nope], self.before["q"][..., : self.nope]), "q outside q_pe changed"
        assert torch.equal(self.kv_a[:, :512], self.before["kv_a"][:, :512]), "kv_a outside k_pe changed"


def rope_reference(case: Case, is_neox: bool):
    q_rot = rope_ref(case.positions, case.before["q"][..., case.nope :], case.cos_sin, is_neox=is_neox)
    k_rot = rope_ref(case.positions, case.before["kv_a"][:, 512:].unsqueeze(1), case.cos_sin, is_neox=is_neox)
    rows = cache_rows_ref(case.kv_c, k_rot)
    return q_rot, k_rot, rows


# ---------------------------------------------------------------- vLLM's unfused path
def _rotate_neox(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _rotate_gptj(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def vllm_forward_static(positions, query, key, cos_sin_cache, is_neox):
    """DeepseekScalingRotaryEmbedding.forward_static of vLLM 0.33 (rotary_dim == head_size == 64),
    in the inputs' dtype; cos_sin_cache in the model dtype (vLLM converts it at init)."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    if is_neox:
        cos = torch.cat((cos, cos), dim=-1).unsqueeze(-2)
        sin = torch.cat((sin, sin), dim=-1).unsqueeze(-2)
    else:
        cos = cos.repeat_interleave(2, dim=-1).unsqueeze(-2)
        sin = sin.repeat_interleave(2, dim=-1).unsqueeze(-2)
    rot = _rotate_neox if is_neox else _rotate_gptj
    return query * cos + rot(query) * sin, key * cos + rot(key) * sin


def unfused_vllm(case: Case, is_neox: bool):
    """What vLLM does today: torch RoPE (several kernels, model dtype), copy back into q, then a
    separate cache write of [kv_c | k_pe]. Returns (q_pe, k_pe, rows at the valid slots)."""
    q = case.before["q"].clone()
    k_pe = case.before["kv_a"][:, 512:].unsqueeze(1)
    q_rot, k_rot = vllm_forward_static(case.positions, q[..., case.nope :], k_pe, case.cos_sin.to(case.dtype), is_neox)
    q[..., case.nope :] = q_rot
    row = torch.cat((case.kv_c, k_rot.squeeze(1)), dim=-1)[case.slots >= 0]
    if case.fp8 is not None:
        row = quantize_fp8_ref(row.float(), case.k_scale, case.fp8)
    return q[..., case.nope :], k_rot, row


# q row width per head count: 64 = contiguous q_pe, 192 = DeepSeek's [T, N, 192], 136 / 256 other
# head strides (all 16-byte multiples in every dtype, so the HIP VEC path still applies).
Q_WIDTH = {1: 64, 8: 192, 16: 136, 24: 256, 128: 192}

UNFUSED_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3.2e-2}


# ---------------------------------------------------------------- the reference itself
def test_reference_rope_is_complex_rotation():
    """Independent check: GPT-J rotation is (x + iy) * r e^{i theta} on pairs (2i, 2i+1); NeoX the
    same on (i, i+32); r = mscale. float64 formula, float32 reference."""
    g = torch.Generator().manual_seed(1)
    T, N = 7, 3
    x = torch.randn(T, N, 64, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 500, (T,), generator=g)
    theta = torch.rand(500, 32, generator=g, dtype=torch.float64) * 6.3
    r = 1.3
    cs = torch.cat((theta.cos() * r, theta.sin() * r), dim=-1)
    rot = r * torch.exp(1j * theta[pos])[:, None, :]  # [T, 1, 32]
    gptj = torch.view_as_real(torch.complex(x[..., 0::2], x[..., 1::2]) * rot).flatten(-2)
    z = torch.complex(x[..., :32], x[..., 32:]) * rot
    neox = torch.cat((z.real, z.imag), dim=-1)
    torch.testing.assert_close(rope_ref(pos, x.float(), cs.float(), is_neox=False), gptj.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rope_ref(pos, x.float(), cs.float(), is_neox=True), neox.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
def test_reference_equals_vllm_forward_static_in_float64(is_neox):
    g = torch.Generator().manual_seed(2)
    T, N = 9, 4
    q = torch.randn(T, N, 64, generator=g, dtype=torch.float64)
    k = torch.randn(T, 1, 64, generator=g, dtype=torch.float64)
    pos = torch.randint(0, MAX_POS, (T,), generator=g)
    cs = make_cos_sin_cache(torch.float64).cpu()
    vq, vk = vllm_forward_static(pos, q, k, cs, is_neox)
    torch.testing.assert_close(rope_ref(pos, q, cs, is_neox=is_neox), vq.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rope_ref(pos, k, cs, is_neox=is_neox), vk.float(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- every backend
def _check_against_both(case: Case, is_neox: bool, exact: bool = False):
    q_rot, k_rot, rows = rope_reference(case, is_neox)
    uq, uk, urows = unfused_vllm(case, is_neox)
    rtol, atol = TOL[case.dtype]
    ut = UNFUSED_TOL[case.dtype]
    valid = case.slots >= 0
    got_rows = case.rows()
    assert not torch.isnan(case.q_pe.float()).any() and not torch.isnan(got_rows.float()).any()
    torch.testing.assert_close(case.q_pe.float(), q_rot, rtol=rtol, atol=atol)
    torch.testing.assert_close(case.k_pe.float(), k_rot, rtol=rtol, atol=atol)
    torch.testing.assert_close(got_rows.float(), rows[valid], rtol=rtol, atol=atol)
    # The path vLLM runs today rounds after every op in the model dtype: looser, same answer.
    torch.testing.assert_close(case.q_pe.float(), uq.float(), rtol=ut, atol=ut)
    torch.testing.assert_close(case.k_pe.float(), uk.float(), rtol=ut, atol=ut)
    torch.testing.assert_close(got_rows.float(), urows.float(), rtol=ut, atol=ut)
    if exact:
        # Same float32 operations in the same order, no fused multiply-add: the one rounding per
        # store must give the reference's values bit for bit (catches a wrong rounding mode).
        assert torch.equal(case.q_pe, q_rot.to(case.dtype)), "q_pe: not the reference rounded once"
        assert torch.equal(case.k_pe, k_rot.to(case.dtype)), "k_pe: not the reference rounded once"
        assert torch.equal(got_rows, rows[valid].to(case.dtype)), "cache rows: not the reference rounded once"
    case.untouched_elsewhere()


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("N", [1, 8, 24, 128])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_matches_reference_and_unfused(backend, dtype, is_neox, N, block_size):
    case = Case(13, N, block_size, dtype, skip=(1, 6), q_width=Q_WIDTH[N])
    case.run(backend, is_neox)
    _check_against_both(case, is_neox, exact=DEVICE.type == "cpu")


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
    case = Case(13, 8, 16, torch.float32, skip=(1, 6))
    case.run("triton", is_neox)
    assert taken == [True]
    _check_against_both(case, is_neox)


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
    case = Case(11, 16, 16, dtype, cs_dtype=dtype if cs_dtype == "q" else cs_dtype)
    case.run(backend, False)
    _check_against_both(case, False)


@pytest.mark.parametrize("backend", backends())
def test_strided_everything(backend):
    """Non-contiguous block stride, kv_c and cos_sin_cache with padded rows, k_pe [T, 64] 2-D,
    q_pe with a token stride that is not N * 192."""
    T, N, bs = 10, 8, 16
    case = Case(T, N, bs, torch.float32, block_pad=1)
    q_wide = torch.full((T, N + 2, 192), float("nan"), device=DEVICE)
    q_wide[:, :N] = case.q
    case.q = q_wide[:, :N]
    case.before["q"] = case.q.clone()
    kv_c_wide = torch.full((T, 640), float("nan"), device=DEVICE)
    kv_c_wide[:, 64:576] = case.kv_c
    case.kv_c = kv_c_wide[:, 64:576]
    cs_wide = torch.zeros(MAX_POS, 96, device=DEVICE)
    cs_wide[:, 16:80] = case.cos_sin
    case.cos_sin = cs_wide[:, 16:80]
    k2 = case.kv_a[:, 512:]  # [T, 64], the shape vLLM's concat_and_cache_mla takes
    rocm_mla.fused_rope_mla_kv_write(
        case.positions, case.q_pe, k2, case.kv_c, case.cos_sin, case.cache, case.slots, is_neox=False, backend=backend
    )
    _check_against_both(case, False)
    assert torch.isnan(q_wide[:, N:]).all(), "wrote heads outside the q_pe view"


@pytest.mark.parametrize("backend", backends())
def test_inner_strided_scalar_path(backend):
    """Inner stride 2 everywhere (the HIP scalar path on a GPU)."""
    T, N = 6, 3
    case = Case(T, N, 4, torch.float32)
    qb = torch.randn(T, N, 128, device=DEVICE)
    kb = torch.randn(T, 1, 128, device=DEVICE)
    cb = torch.randn(T, 1024, device=DEVICE)
    q_pe, k_pe, kv_c = qb[..., ::2], kb[..., ::2], cb[:, ::2]
    q0, k0 = q_pe.clone(), k_pe.clone()
    cache_b = torch.full((case.cache.shape[0], 4, 1152), float("nan"), device=DEVICE)
    cache = cache_b[..., ::2]
    rocm_mla.fused_rope_mla_kv_write(
        case.positions, q_pe, k_pe, kv_c, case.cos_sin, cache, case.slots, is_neox=True, backend=backend
    )
    q_rot = rope_ref(case.positions, q0, case.cos_sin, is_neox=True)
    k_rot = rope_ref(case.positions, k0, case.cos_sin, is_neox=True)
    torch.testing.assert_close(q_pe, q_rot, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_pe, k_rot, rtol=1e-5, atol=1e-5)
    valid = case.slots[case.slots >= 0]
    rows = cache[valid // 4, valid % 4]
    torch.testing.assert_close(rows, cache_rows_ref(kv_c, k_rot)[case.slots >= 0], rtol=1e-5, atol=1e-5)
    assert torch.isnan(cache_b[..., 1::2]).all(), "wrote between the strided cache elements"


@pytest.mark.parametrize("backend", backends())
def test_slot_minus_one_and_short_slot_mapping(backend):
    """Negative slots and tokens past len(slot_mapping) are rotated but never cached."""
    T = 9
    case = Case(T, 4, 16, torch.float32, skip=(0, 4, 8))
    full = case.slots.clone()
    case.slots = full[:6]  # vLLM: slot_mapping unpadded, batch padded for CUDA graphs
    case.run(backend, False)
    q_rot, k_rot, rows = rope_reference(case, False)
    torch.testing.assert_close(case.q_pe, q_rot, rtol=1e-5, atol=1e-5)  # all 9 rotated
    torch.testing.assert_close(case.k_pe, k_rot, rtol=1e-5, atol=1e-5)
    valid = case.slots >= 0
    torch.testing.assert_close(case.rows(), rows[:6][valid], rtol=1e-5, atol=1e-5)
    case.untouched_elsewhere()  # slots full[6:] and the -1 tokens: not written
    assert valid.sum() == 4


@pytest.mark.parametrize("backend", backends())
def test_all_slots_skipped(backend):
    case = Case(5, 2, 16, torch.float32, skip=range(5))
    case.run(backend, True)
    q_rot, _, _ = rope_reference(case, True)
    torch.testing.assert_close(case.q_pe, q_rot, rtol=1e-5, atol=1e-5)
    case.untouched_elsewhere()


@pytest.mark.parametrize("backend", backends())
def test_empty_batch(backend):
    case = Case(0, 8, 16, torch.float32)
    case.run(backend, False)
    rocm_mla.concat_and_cache_mla(case.kv_c, case.k_pe, case.cache, case.slots, backend=backend)
    assert torch.equal(case.cache_base.view(torch.uint8), case.before["cache"].view(torch.uint8))


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("k_shape", ["[T,1,64]", "[T,64]"])
def test_concat_and_cache_mla(backend, k_shape):
    case = Case(12, 1, 16, torch.float16, skip=(3,))
    k_pe = case.k_pe if k_shape == "[T,1,64]" else case.k_pe.squeeze(1)
    rocm_mla.concat_and_cache_mla(case.kv_c, k_pe, case.cache, case.slots, backend=backend)
    assert torch.equal(case.kv_a, case.before["kv_a"]), "concat_and_cache_mla must not rotate k_pe"
    want = torch.cat((case.kv_c, case.kv_a[:, 512:]), dim=-1)[case.slots >= 0]
    assert torch.equal(case.rows(), want), "rows must be [kv_c | k_pe], copied exactly"
    case.untouched_elsewhere()


# ---------------------------------------------------------------- FP8
FP8_KINDS = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def _dequant(rows, fp8, k_scale):
    return rows.view(fp8).float() * k_scale


def _check_fp8(case: Case, is_neox: bool):
    q_rot, k_rot, rows = rope_reference(case, is_neox)
    valid = case.slots >= 0
    want = quantize_fp8_ref(rows[valid], case.k_scale, case.fp8).view(torch.uint8)
    got = case.rows().view(torch.uint8)
    # The latent part involves no arithmetic: the codes are torch's, bit for bit.
    assert torch.equal(got[:, :512], want[:, :512])
    # The rope part went through float32 math whose last bit may differ on a GPU (fma): codes
    # equal, or one step apart where the exact value sits at a rounding boundary.
    g, w = _dequant(got[:, 512:], case.fp8, case.k_scale), _dequant(want[:, 512:], case.fp8, case.k_scale)
    step = w.abs() / 8 + 2.0**-9 * case.k_scale  # one code: 2^-3 relative, or a subnormal step
    assert ((g - w).abs() <= step).all()
    assert (got[:, 512:] != want[:, 512:]).float().mean() < 0.01
    # Round trip: stored * k_scale is within half a step (2^-4 relative, or half the smallest
    # subnormal) of the float32 value, unless the value saturated.
    x = rows[valid]
    fmax = FP8_MAX[case.fp8] * case.k_scale
    half_sub = 2.0 ** (-10 if case.fp8 == torch.float8_e4m3fn else -11)  # smallest subnormal / 2
    err = (_dequant(got, case.fp8, case.k_scale) - x.clamp(-fmax, fmax)).abs()
    assert (err <= x.abs() * 2.0**-4 * 1.01 + half_sub * case.k_scale * 1.01).all()
    # q_pe / k_pe stay in the model dtype.
    rtol, atol = TOL[case.dtype]
    torch.testing.assert_close(case.q_pe.float(), q_rot, rtol=rtol, atol=atol)
    torch.testing.assert_close(case.k_pe.float(), k_rot, rtol=rtol, atol=atol)
    case.untouched_elsewhere()


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_cache(backend, fp8, is_neox, dtype):
    case = Case(11, 8, 16, dtype, fp8=fp8, scale=0.8)
    case.run(backend, is_neox)
    _check_fp8(case, is_neox)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
def test_fp8_uint8_storage(backend, fp8):
    """vLLM passes the FP8 cache as uint8: the kind comes from kv_cache_dtype."""
    case = Case(7, 4, 16, torch.float32, fp8=fp8)
    case.cache_base = case.cache_base.view(torch.uint8)
    case.cache = case.cache_base
    case.before["cache"] = case.before["cache"].view(torch.uint8)
    name = {torch.float8_e4m3fn: "fp8_e4m3fn", torch.float8_e4m3fnuz: "fp8_e4m3fnuz"}[fp8]
    case.run(backend, False, kv_cache_dtype=name)
    _check_fp8(case, False)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
def test_fp8_saturates_and_signed_zero(backend, fp8):
    """Beyond +-max stores +-max (torch's plain .to() would store NaN); -0.0 and tiny negatives
    store 0x00 in fnuz (0x80 is its NaN); inf saturates too."""
    case = Case(4, 2, 16, torch.float32, fp8=fp8, skip=())
    m = FP8_MAX[fp8]
    pattern = torch.tensor([1e6, -1e6, float("inf"), -float("inf"), -0.0, -1e-12, 0.0, m * 0.37 * 1.01], device=DEVICE)
    case.kv_c.copy_(pattern.repeat(64)[None, :].expand(4, 512))
    case.run(backend, False)
    rows = case.rows()[:, :8].view(fp8).float()
    assert not torch.isnan(rows).any(), "a finite or infinite input stored NaN"
    want = torch.tensor([m, -m, m, -m, 0.0, 0.0, 0.0, m], device=DEVICE)
    assert torch.equal(rows[0], want)
    codes = case.rows()[:, :8].view(torch.uint8)
    if fp8 == torch.float8_e4m3fnuz:
        assert (codes[:, 4:6] == 0).all(), "fnuz has no -0: 0x80 would read as NaN"
    else:
        assert (codes[:, 4:6] == 0x80).all(), "e4m3fn keeps the sign of zero, as torch does"


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
@pytest.mark.parametrize("scale", [1.0, 7.0, 0.37])
def test_fp8_every_half_value(backend, fp8, scale):
    """Every float16 bit pattern (exact rounding ties, subnormals, inf, NaN included) through the
    kernel's latent path: the codes are torch's clamp(x / k_scale).to(fp8), bit for bit. At scale 7
    about 60 of these codes differ between x / 7 and x * (1 / 7): a division is what is checked."""
    T = 128
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    case = Case(T, 1, 16, torch.float32, fp8=fp8, skip=())
    case.kv_c.copy_(x.view(T, 512).to(DEVICE))
    case.k_scale.fill_(scale)
    case.run(backend, False)
    want = quantize_fp8_ref(case.kv_c, case.k_scale, fp8).view(torch.uint8)
    got = case.rows()[:, :512].view(torch.uint8)
    bad = (got != want).nonzero()
    assert bad.shape[0] == 0, [(case.kv_c[i, j].item(), int(want[i, j]), int(got[i, j])) for i, j in bad[:5].tolist()]


def test_fp8_bit_code_matches_torch(tmp_path):
    """hip_src/kernels/fp8.cuh compiled for the host: every float16 value, 2^20 random float32 bit
    patterns and the edge cases, both kinds, against torch's clamp + .to(); and all 256 codes back."""
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = tmp_path / "fp8_check.cpp"
    src.write_text(r"""
#include <cstdio>
#include <vector>
#include "fp8.cuh"
using namespace rocm_mla;
int main(int, char** argv) {
  std::vector<float> x;
  float v;
  FILE* f = std::fopen(argv[1], "rb");
  while (std::fread(&v, 4, 1, f) == 1) x.push_back(v);
  std::fclose(f);
  FILE* o = std::fopen(argv[2], "wb");
  for (float y : x) { uint8_t c = fp8_e4m3_from_float<fp8_e4m3fn_format>(y); std::fwrite(&c, 1, 1, o); }
  for (float y : x) { uint8_t c = fp8_e4m3_from_float<fp8_e4m3fnuz_format>(y); std::fwrite(&c, 1, 1, o); }
  for (int c = 0; c < 256; ++c) { float d = fp8_e4m3_to_float<fp8_e4m3fn_format>(c); std::fwrite(&d, 4, 1, o); }
  for (int c = 0; c < 256; ++c) { float d = fp8_e4m3_to_float<fp8_e4m3fnuz_format>(c); std::fwrite(&d, 4, 1, o); }
  std::fclose(o);
  return 0;
}
""")
    exe = tmp_path / "fp8_check"
    subprocess.run(
        [cxx, "-std=c++17", "-O2", f"-I{ROOT / 'hip_src' / 'kernels'}", str(src), "-o", str(exe)],
        check=True,
        capture_output=True,
    )
    g = torch.Generator().manual_seed(3)
    halves = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    rnd = torch.randint(-(2**31), 2**31 - 1, (1 << 20,), generator=g, dtype=torch.int64)
    rnd = rnd.to(torch.int32).view(torch.float32)
    edges = torch.tensor(
        [
            0.0,
            -0.0,
            448,
            -448,
            464,
            464.1,
            480,
            240,
            247.9,
            248,
            248.1,
            1e30,
            float("inf"),
            -float("inf"),
            float("nan"),
            2**-6,
            2**-7,
            2**-9,
            2**-10,
            2**-11,
            1.5 * 2**-10,
            -(2**-12),
            3e-45,
            -1e-40,
            0.1,
            -0.3,
        ]
    )
    x = torch.cat((halves, rnd, edges)).contiguous()
    x.numpy().tofile(tmp_path / "in.bin")
    subprocess.run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    out = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.uint8)
    n = x.numel()
    for k, fp8 in enumerate(FP8_KINDS):
        want = x.clamp(-FP8_MAX[fp8], FP8_MAX[fp8]).to(fp8).view(torch.uint8)
        got = out[k * n : (k + 1) * n]
        bad = (got != want).nonzero().flatten()
        assert bad.numel() == 0, (fp8, [(x[i].item(), int(want[i]), int(got[i])) for i in bad[:5]])
        dec = out[2 * n + 1024 * k : 2 * n + 1024 * (k + 1)].view(torch.float32)
        ref = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8).float()
        same = (dec.view(torch.int32) == ref.view(torch.int32)) | (dec.isnan() & ref.isnan())
        assert same.all(), fp8


# ---------------------------------------------------------------- the HIP kernel, on the CPU
# The HIP kernel has no shared memory and no barriers, so running its threads one after another
# is a faithful execution. hip_src/kernels/rope_kv_write.cuh is compiled as host C++ (a shim
# stands in for cuda_runtime.h / cuda_fp16.h) and run on torch CPU tensors through ctypes: its
# indexing, strides, VEC / scalar paths, conversions (bf16 included, which the Triton interpreter
# cannot do) and launch shapes are checked here before any GPU run.
_DRIVER = r"""
#include "rope_kv_write.cuh"
using namespace rocm_mla;
thread_local mla_dim3 threadIdx, blockIdx, blockDim, gridDim;

template <class Q, class CS, class C, bool V>
static void run_t(void** a, const RopeKVParams& p, int blocks, int threads) {
  using QS = typename elem<Q>::storage;
  gridDim.x = blocks;
  blockDim.x = threads;
  for (int b = 0; b < blocks; ++b) {
    blockIdx.x = b;
    for (int t = 0; t < threads; ++t) {
      threadIdx.x = t;
      rope_mla_kv_write_kernel<Q, CS, C, V>(
          static_cast<const int64_t*>(a[0]), static_cast<QS*>(a[1]), static_cast<QS*>(a[2]),
          static_cast<const QS*>(a[3]), static_cast<const typename elem<CS>::storage*>(a[4]),
          static_cast<typename cache_conv<C>::storage*>(a[5]), static_cast<const int64_t*>(a[6]),
          static_cast<const float*>(a[7]), p);
    }
  }
}

template <class Q, class CS>
static int by_cache(int kind, int vec, void** a, const RopeKVParams& p, int blocks, int threads) {
  switch (kind * 2 + vec) {
    case 0: run_t<Q, CS, Q, false>(a, p, blocks, threads); return 0;
    case 1: run_t<Q, CS, Q, true>(a, p, blocks, threads); return 0;
    case 2: run_t<Q, CS, fp8e4m3fn_t, false>(a, p, blocks, threads); return 0;
    case 3: run_t<Q, CS, fp8e4m3fn_t, true>(a, p, blocks, threads); return 0;
    case 4: run_t<Q, CS, fp8e4m3fnuz_t, false>(a, p, blocks, threads); return 0;
    case 5: run_t<Q, CS, fp8e4m3fnuz_t, true>(a, p, blocks, threads); return 0;
  }
  return 1;
}

template <class Q>
static int by_cs(int cs_fp32, int kind, int vec, void** a, const RopeKVParams& p, int blocks, int threads) {
  return cs_fp32 ? by_cache<Q, f32_t>(kind, vec, a, p, blocks, threads)
                 : by_cache<Q, Q>(kind, vec, a, p, blocks, threads);
}

extern "C" int mla_rope_kv_run(int q, int cs_fp32, int kind, int vec, void** a, const RopeKVParams* p,
                                int blocks, int threads) {
  switch (q) {
    case 0: return by_cs<f32_t>(1, kind, vec, a, *p, blocks, threads);
    case 1: return by_cs<f16_t>(cs_fp32, kind, vec, a, *p, blocks, threads);
    case 2: return by_cs<bf16_t>(cs_fp32, kind, vec, a, *p, blocks, threads);
  }
  return 1;
}
"""


class _Params(ctypes.Structure):
    """hip_src/kernels/rope_kv_write.cuh's RopeKVParams, field for field."""

    _fields_ = [(n, ctypes.c_int64) for n in ("num_tokens", "num_cached", "num_slots", "max_pos")] + [
        (n, ctypes.c_int32)
        for n in (
            "block_size",
            "num_heads",
            "tokens_per_block",
            "units_per_token",
            "is_neox",
            "rope",
            "q_st",
            "q_sh",
            "q_sd",
            "k_st",
            "k_sd",
            "c_st",
            "c_sd",
            "cs_sp",
            "cs_sd",
            "kv_sb",
            "kv_so",
            "kv_sd",
        )
    ]


@pytest.fixture(scope="module")
def hip_kernel_on_cpu(tmp_path_factory):
    return compile_hip_on_cpu(tmp_path_factory.mktemp("hip_cpu"), _DRIVER, "librope_kv_cpu.so")


def run_hip_kernel_on_cpu(
    lib,
    positions,
    q_pe,
    k_pe,
    kv_c,
    cos_sin,
    cache,
    slots,
    k_scale,
    *,
    is_neox,
    fp8,
    threads=256,
    units_per_thread=4,
    vec=None,
):
    """Launch the HIP kernel the way hip_src/rope_kv_write.cu does (same VEC test, same tokens per
    block, wave 64), on CPU tensors. ``vec=False`` forces the scalar path."""
    rope = q_pe is not None
    k2 = k_pe.select(1, 0) if k_pe.dim() == 3 else k_pe
    kind = {None: 0, torch.float8_e4m3fn: 1, torch.float8_e4m3fnuz: 2}[fp8]
    c = cache.view(torch.uint8) if fp8 else cache

    def ok(x, k):  # inner stride 1, outer steps multiples of k elements, 16-byte aligned
        return (
            (x.shape[-1] <= 1 or x.stride(-1) == 1)
            and x.data_ptr() % 16 == 0
            and all(x.shape[i] <= 1 or x.stride(i) % k == 0 for i in range(x.dim() - 1))
        )

    kq = 16 // k2.element_size()
    auto_vec = (
        ok(k2, kq)
        and ok(kv_c, kq)
        and ok(c, 16 // c.element_size())
        and (not rope or (ok(q_pe, kq) and ok(cos_sin, 16 // cos_sin.element_size())))
    )
    vec = auto_vec if vec is None else (vec and auto_vec)
    T = k2.shape[0]
    p = _Params()
    p.num_tokens, p.num_cached, p.block_size = T, slots.shape[0], cache.shape[1]
    p.num_slots, p.max_pos = cache.shape[0] * cache.shape[1], cos_sin.shape[0] if rope else 0
    p.num_heads = q_pe.shape[1] if rope else 0
    p.units_per_token = 4 * p.num_heads + 36
    p.is_neox, p.rope = int(bool(is_neox) and rope), int(rope)
    p.q_st, p.q_sh, p.q_sd = q_pe.stride() if rope else (0, 0, 0)
    p.k_st, p.k_sd = k2.stride()
    p.c_st, p.c_sd = kv_c.stride()
    p.cs_sp, p.cs_sd = cos_sin.stride() if rope else (0, 0)
    p.kv_sb, p.kv_so, p.kv_sd = c.stride()
    p.tokens_per_block = max(1, threads * units_per_thread // p.units_per_token)
    units = p.tokens_per_block * p.units_per_token
    rounds = (units + threads - 1) // threads
    block_threads = ((units + rounds - 1) // rounds + 63) // 64 * 64
    blocks = (T + p.tokens_per_block - 1) // p.tokens_per_block
    if T == 0:
        return
    qcode = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[k2.dtype]
    dummy = k2
    ptrs = (ctypes.c_void_p * 8)(
        *[
            x.data_ptr()
            for x in (
                positions if rope else slots,
                q_pe if rope else dummy,
                k2,
                kv_c,
                cos_sin if rope else dummy,
                c,
                slots,
                k_scale if fp8 else dummy,
            )
        ]
    )
    cs_fp32 = int(not rope or cos_sin.dtype == torch.float32)
    assert lib.mla_rope_kv_run(qcode, cs_fp32, kind, int(vec), ptrs, ctypes.byref(p), blocks, block_threads) == 0


HIP_CPU_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HIP_CPU_DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize(
    "N,block_size,threads,upt", [(1, 16, 256, 4), (8, 1, 64, 1), (24, 64, 256, 4), (128, 16, 256, 8), (16, 16, 128, 4)]
)
@pytest.mark.parametrize("vec", [True, False], ids=["vec", "scalar"])
def test_hip_kernel_on_cpu(hip_kernel_on_cpu, dtype, is_neox, N, block_size, threads, upt, vec):
    if DEVICE.type != "cpu":
        pytest.skip("CPU emulation test (the GPU tests run the real kernel)")
    case = Case(13, N, block_size, dtype, skip=(1, 6), block_pad=int(vec), q_width=Q_WIDTH[N])
    run_hip_kernel_on_cpu(
        hip_kernel_on_cpu,
        case.positions,
        case.q_pe,
        case.k_pe,
        case.kv_c,
        case.cos_sin,
        case.cache,
        case.slots,
        case.k_scale,
        is_neox=is_neox,
        fp8=None,
        threads=threads,
        units_per_thread=upt,
        vec=vec,
    )
    _check_against_both(case, is_neox, exact=True)


@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize(
    "dtype,cs",
    [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16)],
    ids=str,
)
@pytest.mark.parametrize("vec", [True, False], ids=["vec", "scalar"])
def test_hip_kernel_on_cpu_fp8(hip_kernel_on_cpu, fp8, is_neox, dtype, cs, vec):
    if DEVICE.type != "cpu":
        pytest.skip("CPU emulation test (the GPU tests run the real kernel)")
    case = Case(11, 8, 16, dtype, fp8=fp8, cs_dtype=cs, scale=0.8)
    run_hip_kernel_on_cpu(
        hip_kernel_on_cpu,
        case.positions,
        case.q_pe,
        case.k_pe,
        case.kv_c,
        case.cos_sin,
        case.cache,
        case.slots,
        case.k_scale,
        is_neox=is_neox,
        fp8=fp8,
        vec=vec,
    )
    _check_fp8(case, is_neox)


@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
@pytest.mark.parametrize("vec", [True, False], ids=["vec", "scalar"])
@pytest.mark.parametrize("scale", [1.0, 7.0, 0.37])
def test_hip_kernel_on_cpu_fp8_every_half_value(hip_kernel_on_cpu, fp8, vec, scale):
    if DEVICE.type != "cpu":
        pytest.skip("CPU emulation test (the GPU tests run the real kernel)")
    T = 128
    case = Case(T, 1, 16, torch.float32, fp8=fp8, skip=())
    case.k_scale.fill_(scale)
    case.kv_c.copy_(
        torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float().view(T, 512)
    )
    run_hip_kernel_on_cpu(
        hip_kernel_on_cpu,
        case.positions,
        case.q_pe,
        case.k_pe,
        case.kv_c,
        case.cos_sin,
        case.cache,
        case.slots,
        case.k_scale,
        is_neox=False,
        fp8=fp8,
        vec=vec,
    )
    want = quantize_fp8_ref(case.kv_c, case.k_scale, fp8).view(torch.uint8)
    assert torch.equal(case.rows()[:, :512].view(torch.uint8), want)


@pytest.mark.parametrize("vec", [True, False], ids=["vec", "scalar"])
def test_hip_kernel_on_cpu_concat_and_short_slots(hip_kernel_on_cpu, vec):
    """No-rope mode (concat_and_cache_mla), slot_mapping shorter than the batch, T = 0."""
    if DEVICE.type != "cpu":
        pytest.skip("CPU emulation test (the GPU tests run the real kernel)")
    case = Case(9, 1, 16, torch.bfloat16, skip=(2,))
    case.slots = case.slots[:7]
    run_hip_kernel_on_cpu(
        hip_kernel_on_cpu,
        None,
        None,
        case.k_pe,
        case.kv_c,
        None,
        case.cache,
        case.slots,
        None,
        is_neox=True,
        fp8=None,
        vec=vec,
    )
    assert torch.equal(case.kv_a, case.before["kv_a"])
    want = torch.cat((case.kv_c, case.kv_a[:, 512:]), dim=-1)[:7][case.slots >= 0]
    assert torch.equal(case.rows(), want)
    case.untouched_elsewhere()
    empty = Case(0, 4, 16, torch.bfloat16)
    run_hip_kernel_on_cpu(
        hip_kernel_on_cpu,
        empty.positions,
        empty.q_pe,
        empty.k_pe,
        empty.kv_c,
        empty.cos_sin,
        empty.cache,
        empty.slots,
        None,
        is_neox=False,
        fp8=None,
        vec=vec,
    )


# ---------------------------------------------------------------- bad input
def _good(T=3, N=2):
    g = torch.Generator().manual_seed(4)
    return dict(
        positions=torch.randint(0, 16, (T,), generator=g),
        q_pe=torch.randn(T, N, 64, generator=g),
        k_pe=torch.randn(T, 1, 64, generator=g),
        kv_c=torch.randn(T, 512, generator=g),
        cos_sin_cache=torch.randn(16, 64, generator=g),
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
    torch.testing.assert_close(a["q_pe"], rope_ref(a["positions"], q0, a["cos_sin_cache"], is_neox=False))
    monkeypatch.setenv("ROCM_MLA_BACKEND_ROPE_KV_WRITE", "cuda-magic")
    with pytest.raises(ValueError, match="backend.*hip, triton, reference.*cuda-magic"):
        rocm_mla.fused_rope_mla_kv_write(is_neox=False, **a)


def test_default_dispatch():
    from rocm_mla.ops._dispatch import select

    want = ("hip", "triton") if DEVICE.type == "cuda" else ("triton",)
    assert select("rope_kv_write", DEVICE) in want


# ---------------------------------------------------------------- GPU-only paths
def _gpu_backends():
    return [b for b in ("hip", "triton") if b in backends()]


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("T,N,bs", [(4099, 128, 64), (5000, 16, 16), (333, 24, 1)])
def test_gpu_large_bf16(is_neox, T, N, bs):
    for backend in _gpu_backends():
        case = Case(T, N, bs, torch.bfloat16, skip=(0, 7, T - 1), block_pad=1)
        case.run(backend, is_neox)
        _check_against_both(case, is_neox)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
def test_gpu_large_fp8(fp8):
    for backend in _gpu_backends():
        case = Case(4099, 128, 64, torch.bfloat16, fp8=fp8, skip=(3,))
        case.run(backend, False)
        _check_fp8(case, False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_hip_misaligned_falls_back_to_scalar(dtype):
    """A q_pe whose rows sit off 16-byte alignment takes the HIP scalar path and stays right."""
    if "hip" not in backends():
        pytest.skip("HIP extension unavailable")
    T, N = 37, 16
    case = Case(T, N, 16, dtype)
    base = torch.randn(T * N * 192 + 1, device=DEVICE).to(dtype)
    case.q = base[1:].view(T, N, 192)
    case.q.copy_(case.before["q"])
    case.run("hip", False)
    _check_against_both(case, False)


@pytest.mark.gpu
def test_hip_and_triton_agree_bitwise_on_fp8_latent():
    """Both GPU kernels store the same FP8 codes for the latent part (pure conversion)."""
    if len(_gpu_backends()) < 2:
        pytest.skip("needs both the HIP extension and Triton")
    out = []
    for backend in _gpu_backends():
        case = Case(1000, 16, 64, torch.bfloat16, fp8=torch.float8_e4m3fn, seed=5)
        case.run(backend, False)
        out.append(case.rows().view(torch.uint8)[:, :512])
    assert torch.equal(out[0], out[1])
