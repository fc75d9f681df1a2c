"""hip_src/kernels/rope_kv_write.cuh run on the CPU (tests/_hip_cpu.py): every dtype, head count,
block size, launch shape and VEC / scalar path against the reference, fp8 included."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE
from rope_case import FP8_KINDS, Q_WIDTH, check_against_both, check_fp8, make_case
from rope_hip_cpu import compile_rope_kv_on_cpu, run_hip_kernel_on_cpu

from rocm_mla.cases import raise_on
from rocm_mla.reference.rope_kv_write import quantize_fp8_ref


@pytest.fixture(scope="module")
def hip_kernel_on_cpu(tmp_path_factory):
    return compile_rope_kv_on_cpu(tmp_path_factory.mktemp("hip_cpu"))


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
    case = make_case(13, N, block_size, dtype, is_neox=is_neox, skip=(1, 6), block_pad=int(vec), q_width=Q_WIDTH[N])
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
    check_against_both(case, exact=True)


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
    case = make_case(11, 8, 16, dtype, is_neox=is_neox, fp8=fp8, cs_dtype=cs, scale=0.8)
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
    check_fp8(case)


@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
@pytest.mark.parametrize("vec", [True, False], ids=["vec", "scalar"])
@pytest.mark.parametrize("scale", [1.0, 7.0, 0.37])
def test_hip_kernel_on_cpu_fp8_every_half_value(hip_kernel_on_cpu, fp8, vec, scale):
    if DEVICE.type != "cpu":
        pytest.skip("CPU emulation test (the GPU tests run the real kernel)")
    T = 128
    case = make_case(T, 1, 16, torch.float32, fp8=fp8, skip=())
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
    assert torch.equal(case.written_rows()[:, :512].view(torch.uint8), want)


@pytest.mark.parametrize("vec", [True, False], ids=["vec", "scalar"])
def test_hip_kernel_on_cpu_concat_and_short_slots(hip_kernel_on_cpu, vec):
    """No-rope mode (concat_and_cache_mla), slot_mapping shorter than the batch, T = 0."""
    if DEVICE.type != "cpu":
        pytest.skip("CPU emulation test (the GPU tests run the real kernel)")
    case = make_case(9, 1, 16, torch.bfloat16, skip=(2,))
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
    assert torch.equal(case.kv_a, case.kv_a0)
    want = torch.cat((case.kv_c, case.kv_a[:, 512:]), dim=-1)[:7][case.slots >= 0]
    assert torch.equal(case.written_rows(), want)
    raise_on(case.untouched())
    empty = make_case(0, 4, 16, torch.bfloat16)
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
