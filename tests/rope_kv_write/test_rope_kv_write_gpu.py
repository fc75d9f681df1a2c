"""fused_rope_mla_kv_write on the GPU only: bf16 and fp8 at serving sizes, HIP's scalar fallback for
misaligned inputs, HIP and Triton bitwise equal on an fp8 latent."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, backends
from rope_case import FP8_KINDS, check_against_both, check_fp8, make_case, run


# ---------------------------------------------------------------- GPU-only paths
def _gpu_backends():
    return [b for b in ("hip", "triton") if b in backends()]


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("T,N,bs", [(4099, 128, 64), (5000, 16, 16), (333, 24, 1)])
def test_gpu_large_bf16(is_neox, T, N, bs):
    for backend in _gpu_backends():
        case = make_case(T, N, bs, torch.bfloat16, is_neox=is_neox, skip=(0, 7, T - 1), block_pad=1)
        run(case, backend)
        check_against_both(case)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
def test_gpu_large_fp8(fp8):
    for backend in _gpu_backends():
        case = make_case(4099, 128, 64, torch.bfloat16, fp8=fp8, skip=(3,))
        run(case, backend)
        check_fp8(case)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_hip_misaligned_falls_back_to_scalar(dtype):
    """A q_pe whose rows sit off 16-byte alignment takes the HIP scalar path and stays right."""
    if "hip" not in backends():
        pytest.skip("HIP extension unavailable")
    T, N = 37, 16
    case = make_case(T, N, 16, dtype)
    base = torch.empty(T * N * 192 + 1, dtype=dtype, device=DEVICE)
    case.q = base[1:].view(T, N, 192).copy_(case.q0)
    run(case, "hip")
    check_against_both(case)


@pytest.mark.gpu
def test_hip_and_triton_agree_bitwise_on_fp8_latent():
    """Both GPU kernels store the same FP8 codes for the latent part (pure conversion)."""
    if len(_gpu_backends()) < 2:
        pytest.skip("needs both the HIP extension and Triton")
    out = []
    for backend in _gpu_backends():
        case = make_case(1000, 16, 64, torch.bfloat16, fp8=torch.float8_e4m3fn, seed=5)
        run(case, backend)
        out.append(case.written_rows().view(torch.uint8)[:, :512])
    assert torch.equal(out[0], out[1])
