"""The KV-write tests' batch (``Case``: inputs laid out as vLLM's DeepSeek path has them, a
NaN-poisoned paged cache), the float32 reference of a call, vLLM's unfused path (torch RoPE as
RotaryEmbedding.forward_static does it, then a separate cache write), and the comparisons of a
call against both (16-bit caches) or against the quantised reference (fp8 caches)."""

from __future__ import annotations

import torch
from _util import DEVICE, TOL, assert_close

import rocm_mla
from rocm_mla.reference.rope_kv_write import FP8_MAX, cache_rows_ref, quantize_fp8_ref, rope_cos_sin_cache, rope_ref

MAX_POS = 8192


def make_cos_sin_cache(dtype=torch.float32, max_pos=MAX_POS, base=10000.0, mscale=1.25):
    """vLLM's layout: cat(cos, sin) * mscale (YaRN folds mscale into the cache), [max_pos, 64];
    computed in float64, then cast to ``dtype`` and moved to DEVICE."""
    return rope_cos_sin_cache(max_pos, base=base, mscale=mscale, dtype=dtype, compute_dtype=torch.float64).to(DEVICE)


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


def check_against_both(case: Case, is_neox: bool, exact: bool = False):
    q_rot, k_rot, rows = rope_reference(case, is_neox)
    uq, uk, urows = unfused_vllm(case, is_neox)
    rtol, atol = TOL[case.dtype]
    ut = UNFUSED_TOL[case.dtype]
    valid = case.slots >= 0
    got_rows = case.rows()
    assert not torch.isnan(case.q_pe.float()).any() and not torch.isnan(got_rows.float()).any()
    assert_close(case.q_pe.float(), q_rot, rtol=rtol, atol=atol)
    assert_close(case.k_pe.float(), k_rot, rtol=rtol, atol=atol)
    assert_close(got_rows.float(), rows[valid], rtol=rtol, atol=atol)
    # The path vLLM runs today rounds after every op in the model dtype: looser, same answer.
    assert_close(case.q_pe.float(), uq.float(), rtol=ut, atol=ut)
    assert_close(case.k_pe.float(), uk.float(), rtol=ut, atol=ut)
    assert_close(got_rows.float(), urows.float(), rtol=ut, atol=ut)
    if exact:
        # Same float32 operations in the same order, no fused multiply-add: the one rounding per
        # store must give the reference's values bit for bit (catches a wrong rounding mode).
        assert torch.equal(case.q_pe, q_rot.to(case.dtype)), "q_pe: not the reference rounded once"
        assert torch.equal(case.k_pe, k_rot.to(case.dtype)), "k_pe: not the reference rounded once"
        assert torch.equal(got_rows, rows[valid].to(case.dtype)), "cache rows: not the reference rounded once"
    case.untouched_elsewhere()


FP8_KINDS = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def dequant(rows, fp8, k_scale):
    return rows.view(fp8).float() * k_scale


def check_fp8(case: Case, is_neox: bool):
    q_rot, k_rot, rows = rope_reference(case, is_neox)
    valid = case.slots >= 0
    want = quantize_fp8_ref(rows[valid], case.k_scale, case.fp8).view(torch.uint8)
    got = case.rows().view(torch.uint8)
    # The latent part involves no arithmetic: the codes are torch's, bit for bit.
    assert torch.equal(got[:, :512], want[:, :512])
    # The rope part went through float32 math whose last bit may differ on a GPU (fma): codes
    # equal, or one step apart where the exact value sits at a rounding boundary.
    g, w = dequant(got[:, 512:], case.fp8, case.k_scale), dequant(want[:, 512:], case.fp8, case.k_scale)
    step = w.abs() / 8 + 2.0**-9 * case.k_scale  # one code: 2^-3 relative, or a subnormal step
    assert ((g - w).abs() <= step).all()
    assert (got[:, 512:] != want[:, 512:]).float().mean() < 0.01
    # Round trip: stored * k_scale is within half a step (2^-4 relative, or half the smallest
    # subnormal) of the float32 value, unless the value saturated.
    x = rows[valid]
    fmax = FP8_MAX[case.fp8] * case.k_scale
    half_sub = 2.0 ** (-10 if case.fp8 == torch.float8_e4m3fn else -11)  # smallest subnormal / 2
    err = (dequant(got, case.fp8, case.k_scale) - x.clamp(-fmax, fmax)).abs()
    assert (err <= x.abs() * 2.0**-4 * 1.01 + half_sub * case.k_scale * 1.01).all()
    # q_pe / k_pe stay in the model dtype.
    rtol, atol = TOL[case.dtype]
    assert_close(case.q_pe.float(), q_rot, rtol=rtol, atol=atol)
    assert_close(case.k_pe.float(), k_rot, rtol=rtol, atol=atol)
    case.untouched_elsewhere()
