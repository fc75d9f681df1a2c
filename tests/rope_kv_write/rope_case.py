"""Test glue of the KV-write tests over rocm_mla.cases.rope_kv_write: the batch the tests use
(:func:`make_case`: the cases' inputs with the tests' defaults), the call with the cache in its own
dtype, vLLM's unfused path (torch RoPE as RotaryEmbedding.forward_static does it, then a separate
cache write), and the checks of a call against the reference and the unfused path (16-bit caches)
or against the quantised reference (fp8 caches)."""

from __future__ import annotations

import torch
from _util import DEVICE
from benchutil import vllm_forward_static

import rocm_mla
from rocm_mla.cases import compare, first_problem, raise_on
from rocm_mla.cases import rope_kv_write as cases
from rocm_mla.cases.rope_kv_write import RopeInputs, RopeShape
from rocm_mla.reference.rope_kv_write import FP8_MAX, quantize_fp8_ref, rope_cos_sin_cache

MAX_POS = 8192
FP8_KINDS = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]

# q row width per head count: 64 = contiguous q_pe, 192 = DeepSeek's [T, N, 192], 136 / 256 other
# head strides (all 16-byte multiples in every dtype, so the HIP VEC path still applies).
Q_WIDTH = {1: 64, 8: 192, 16: 136, 24: 256, 128: 192}


def make_case(T, N, block_size, dtype, *, fp8=None, cs_dtype=torch.float32, skip=(1,), q_width=192, **kw) -> RopeInputs:
    """The cases' inputs of ``RopeShape(T, N, block_size)`` on DEVICE with the tests' choices: a
    YaRN-like table (mscale 1.25, float64 angles, ``cs_dtype``) of MAX_POS rows, k_scale 0.37,
    token 1's slot -1; ``fp8`` an e4m3 kind (an fp8 cache). ``kw``: make_inputs' keywords
    (is_neox, seed, block_pad, scale, inner_stride)."""
    cos_sin = rope_cos_sin_cache(MAX_POS, mscale=1.25, compute_dtype=torch.float64, dtype=cs_dtype, device=DEVICE)
    shape = RopeShape(T, N, block=block_size, kv="fp8" if fp8 else "auto", q_width=q_width)
    return cases.make_inputs(shape, dtype=dtype, device=DEVICE, cos_sin=cos_sin, k_scale=0.37, fp8=fp8, skip=skip, **kw)


def run(case: RopeInputs, backend, **kw):
    """The op on the case's tensors, the cache as its own dtype (an fp8 cache as float8; uint8
    storage is what ``case.run()`` passes)."""
    positions, q_pe, k_pe, kv_c, cos_sin, _, slots = case.args()
    rocm_mla.fused_rope_mla_kv_write(
        positions, q_pe, k_pe, kv_c, cos_sin, case.cache, slots, **case.kwargs(backend=backend, **kw)
    )


# ---------------------------------------------------------------- vLLM's unfused path
def unfused_vllm(case: RopeInputs):
    """What vLLM does today: torch RoPE (several kernels, model dtype), copy back into q, then a
    separate cache write of [kv_c | k_pe]. Returns (q_pe, k_pe, rows at the written slots)."""
    nope = case.q.shape[-1] - 64
    q = case.q0.clone()
    k_pe = case.kv_a0[:, 512:].unsqueeze(1)
    q_rot, k_rot = vllm_forward_static(case.positions, q[..., nope:], k_pe, case.cos_sin.to(case.dtype), case.is_neox)
    q[..., nope:] = q_rot
    row = torch.cat((case.kv_c, k_rot.squeeze(1)), dim=-1)[: case.slots.shape[0]][case.cached()]
    if case.fp8 is not None:
        row = quantize_fp8_ref(row.float(), case.k_scale, case.fp8)
    return q[..., nope:], k_rot, row


def check_against_both(case: RopeInputs, exact: bool = False):
    """The reference (the op's bound; untouched rows and q/kv_a outside the rope parts bitwise) and
    vLLM's unfused path (its looser bound: it rounds after every op in the model dtype)."""
    case.check()
    uq, uk, urows = unfused_vllm(case)
    unfused = cases.TOLERANCE[case.dtype]["unfused"]
    got_rows = case.written_rows()
    raise_on(
        first_problem(
            compare("q_pe against the unfused path", case.q_pe, uq, unfused),
            compare("k_pe against the unfused path", case.k_pe, uk, unfused),
            compare("cache rows against the unfused path", got_rows, urows, unfused),
        )
    )
    if exact:
        # Same float32 operations in the same order, no fused multiply-add: the one rounding per
        # store must give the reference's values bit for bit (catches a wrong rounding mode).
        q_rot, k_rot, rows = case.reference()
        rows = rows[: case.slots.shape[0]][case.cached()]
        assert torch.equal(case.q_pe, q_rot.to(case.dtype)), "q_pe: not the reference rounded once"
        assert torch.equal(case.k_pe, k_rot.to(case.dtype)), "k_pe: not the reference rounded once"
        assert torch.equal(got_rows, rows.to(case.dtype)), "cache rows: not the reference rounded once"


def check_fp8(case: RopeInputs):
    """q_pe / k_pe in the model dtype and the cache codes (one step of the reference's, untouched
    rows bitwise: ``case.check()``), the latent codes bit for bit, the rope codes equal almost
    everywhere, and every code within half a step of the unrounded x / k_scale."""
    case.check()
    _, _, rows = case.reference()
    x = rows[: case.slots.shape[0]][case.cached()]
    want = quantize_fp8_ref(x, case.k_scale, case.fp8).view(torch.uint8)
    got = case.written_rows().view(torch.uint8)
    # The latent part involves no arithmetic: the codes are torch's, bit for bit.
    assert torch.equal(got[:, :512], want[:, :512]), "latent codes: not torch's conversion"
    # The rope part went through float32 math whose last bit may differ on a GPU (fma): codes
    # equal, or one step apart (case.check) where the exact value sits at a rounding boundary.
    assert (got[:, 512:] != want[:, 512:]).float().mean() < 0.01
    m = FP8_MAX[case.fp8]
    exact = (x / case.k_scale).clamp(-m, m)
    trip = compare("fp8 codes against x / k_scale", got.view(case.fp8), exact, cases.FP8_ROUND_TRIP[case.fp8])
    raise_on(trip.problem)
