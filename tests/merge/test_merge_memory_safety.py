"""merge_attn_states memory safety (the contract in tests/_util.py): guarded strided destinations,
head size 0, zero sizes, overlaps named, and the HIP kernel compiled for the host."""

from __future__ import annotations

import ctypes

import pytest
import torch
from _hip_cpu import compile_hip_on_cpu
from _util import DEVICE, assert_no_sync_and_capturable, backends, raises_naming

import rocm_mla
from rocm_mla.cases import Guarded, compare, generator, raise_on, randn
from rocm_mla.cases import merge as cases
from rocm_mla.cases.merge import MergeShape
from rocm_mla.reference import merge_attn_states_ref

F32 = torch.float32


def _merge_inputs(T, N, D, seed=0, dtype=F32):
    """Contiguous prefix/suffix outputs [T, N, D] and lse [N, T] (normal x 2); the tests give their
    own guarded destinations."""
    return cases.make_inputs(MergeShape(T, N, D, "contiguous"), dtype=dtype, device=DEVICE, seed=seed, lse_scale=2.0)


def _sides(case):
    return case.prefix_output, case.prefix_lse, case.suffix_output, case.suffix_lse


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("T,N,D", [(5, 3, 13), (7, 2, 128)])
def test_merge_guarded_destinations(backend, T, N, D):
    """Strided destinations inside sentinel guards: every element written, nothing else."""
    case = _merge_inputs(T, N, D)
    out = Guarded((T, N, D), F32, device=DEVICE, fill="nan", pad_last=3)
    olse = Guarded((N, T), F32, device=DEVICE, fill="nan", pad_last=1)
    rocm_mla.merge_attn_states(out.view, *_sides(case), olse.view, backend=backend)
    case.check(out.view, olse.view)
    out.check("output")
    olse.check("output_lse")


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("T,N", [(5, 3), (1, 1)])
def test_merge_head_size_zero_writes_only_output_lse(backend, T, N):
    """D = 0 with output_lse: the lse is merged, nothing else (no division by the head size)."""
    case = _merge_inputs(T, N, 0)
    po, pl, so, sl = _sides(case)
    olse = Guarded((N, T), F32, device=DEVICE, fill="nan")
    out = case.output  # [T, N, 0]
    rocm_mla.merge_attn_states(out, po, pl, so, sl, olse.view, backend=backend)
    bound = cases.TOLERANCE[F32]["output_lse"]
    raise_on(compare("output_lse", olse.view, torch.logaddexp(pl, sl), bound).problem)
    olse.check("output_lse")
    rocm_mla.merge_attn_states(out, po, pl, so, sl, backend=backend)  # no output_lse: nothing to do


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("T,N,D", [(0, 3, 8), (4, 0, 8), (0, 0, 0)])
def test_merge_zero_sizes(backend, T, N, D):
    case = _merge_inputs(T, N, D)
    for olse in (None, case.output_lse):
        rocm_mla.merge_attn_states(case.output, *_sides(case), olse, backend=backend)


def test_merge_overlaps_rejected_naming_both():
    T, N, D = 4, 3, 8
    case = _merge_inputs(T, N, D)
    po, pl, so, sl = _sides(case)
    gen = generator(1, DEVICE)
    buf = randn((T * N * D + N * T,), gen, DEVICE)
    out, olse = buf[: T * N * D].view(T, N, D), buf[T * N * D - 1 : T * N * D - 1 + N * T].view(N, T)
    raises_naming(
        ValueError,
        lambda: rocm_mla.merge_attn_states(out, po, pl, so, sl, olse),
        "output",
        "output_lse",
        "no memory in common",
    )
    # output over an input lse (written while other threads read it), in either dtype view.
    lse_buf = randn((T * N * D,), gen, DEVICE)
    raises_naming(
        ValueError,
        lambda: rocm_mla.merge_attn_states(lse_buf.view(T, N, D), po, lse_buf[: N * T].view(N, T), so, sl),
        "output",
        "prefix_lse",
    )
    # output_lse over an output input.
    raises_naming(
        ValueError,
        lambda: rocm_mla.merge_attn_states(case.output, po, pl, so, sl, so.view(-1)[: N * T].view(N, T)),
        "output_lse",
        "suffix_output",
    )
    # output_lse == an input lse, even the very same view.
    raises_naming(
        ValueError,
        lambda: rocm_mla.merge_attn_states(case.output, po, pl, so, sl, sl),
        "output_lse",
        "suffix_lse",
    )
    # The documented alias still passes: output is suffix_output itself.
    s2 = so.clone()
    rocm_mla.merge_attn_states(s2, po, pl, s2, sl)
    ref, _ = merge_attn_states_ref(po, pl, so, sl)
    raise_on(compare("output", s2, ref, cases.TOLERANCE[F32]["output"]).problem)


# ---------------------------------------------------------------- the HIP merge kernel on the CPU
_MERGE_DRIVER = r"""
#include <algorithm>
#include "merge_attn_states.cuh"
using namespace rocm_mla;
thread_local mla_dim3 threadIdx, blockIdx, blockDim, gridDim;

// The launcher's arithmetic (hip_src/merge_attn_states.cu: dispatch / launch_index), float32.
template <int VEC, int UNROLL>
static void run(float* out, float* olse, const float* pre, const float* plse, const float* suf,
                const float* slse, const MergeParams& p, int threads) {
  const int64_t total = p.num_tokens * p.num_heads * std::max<int64_t>(1, p.head_size / (VEC * UNROLL));
  if (total == 0) return;
  const int64_t blocks = (total + threads - 1) / threads;
  gridDim.x = blocks;
  blockDim.x = threads;
  for (int64_t b = 0; b < blocks; ++b) {
    blockIdx.x = b;
    for (int t = 0; t < threads; ++t) {
      threadIdx.x = t;
      merge_attn_states_kernel<f32_t, VEC, UNROLL, uint32_t>(out, olse, pre, plse, suf, slse, p);
    }
  }
}

extern "C" int mla_merge_run(float* out, float* olse, const float* pre, const float* plse, const float* suf,
                             const float* slse, const MergeParams* p, int threads, int vec) {
  if (vec) run<4, 1>(out, olse, pre, plse, suf, slse, *p, threads);
  else run<1, 1>(out, olse, pre, plse, suf, slse, *p, threads);
  return 0;
}
"""


class _MergeParams(ctypes.Structure):
    """hip_src/kernels/merge_attn_states.cuh's MergeParams, field for field."""

    _fields_ = [
        (n, ctypes.c_int64)
        for n in (
            "num_tokens",
            "num_heads",
            "head_size",
            "out_st",
            "out_sh",
            "out_sd",
            "pre_st",
            "pre_sh",
            "pre_sd",
            "suf_st",
            "suf_sh",
            "suf_sd",
            "plse_sh",
            "plse_st",
            "slse_sh",
            "slse_st",
            "olse_sh",
            "olse_st",
        )
    ]


@pytest.fixture(scope="module")
def hip_merge_on_cpu(tmp_path_factory):
    if DEVICE.type != "cpu":
        pytest.skip("CPU emulation test (the GPU tests run the real kernel)")
    return compile_hip_on_cpu(tmp_path_factory.mktemp("hip_merge_cpu"), _MERGE_DRIVER, "libmerge_cpu.so")


def _run_hip_merge_on_cpu(lib, out, olse, po, pl, so, sl, *, vec):
    p = _MergeParams()
    p.num_tokens, p.num_heads, p.head_size = out.shape
    p.out_st, p.out_sh, p.out_sd = out.stride()
    p.pre_st, p.pre_sh, p.pre_sd = po.stride()
    p.suf_st, p.suf_sh, p.suf_sd = so.stride()
    p.plse_sh, p.plse_st = pl.stride()
    p.slse_sh, p.slse_st = sl.stride()
    p.olse_sh, p.olse_st = olse.stride() if olse is not None else (0, 0)
    # The launcher's vector test, head_size > 0 included (head_size 0 takes the scalar path).
    vec = vec and p.head_size > 0 and p.head_size % 4 == 0
    ptr = lambda x: ctypes.c_void_p(x.data_ptr() if x is not None and x.numel() else 0)  # noqa: E731
    assert (
        lib.mla_merge_run(ptr(out), ptr(olse), ptr(po), ptr(pl), ptr(so), ptr(sl), ctypes.byref(p), 64, int(vec)) == 0
    )


@pytest.mark.parametrize("vec", [True, False], ids=["vec", "scalar"])
@pytest.mark.parametrize("T,N,D", [(5, 3, 0), (7, 2, 16), (3, 5, 13)])
def test_hip_merge_kernel_on_cpu(hip_merge_on_cpu, vec, T, N, D):
    """hip_src/kernels/merge_attn_states.cuh on the host: head size 0 writes output_lse only
    (the kernel counted no work before and left it unwritten); guards untouched."""
    case = _merge_inputs(T, N, D, seed=7)
    out = Guarded((T, N, D), F32, device=DEVICE, fill="nan")
    olse = Guarded((N, T), F32, device=DEVICE, fill="nan", pad_last=2)
    _run_hip_merge_on_cpu(hip_merge_on_cpu, out.view, olse.view, *_sides(case), vec=vec)
    case.check(out.view, olse.view)
    out.check("output")
    olse.check("output_lse")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hip", "triton", "reference"])
def test_gpu_merge_head_size_zero_and_guards(backend):
    if backend not in backends():
        pytest.skip(f"{backend} unavailable")
    test_merge_head_size_zero_writes_only_output_lse(backend, 37, 5)
    test_merge_guarded_destinations(backend, 37, 5, 13)
    test_merge_zero_sizes(backend, 0, 3, 8)


@pytest.mark.gpu
def test_gpu_merge_checks_no_sync_and_capturable():
    """merge_attn_states with caller-given output / output_lse (the overlap checks run), HIP and
    Triton: no host sync, capturable."""
    case = _merge_inputs(33, 8, 128, dtype=torch.bfloat16)
    ops = [
        lambda b=b: rocm_mla.merge_attn_states(case.output, *_sides(case), case.output_lse, backend=b)
        for b in ("hip", "triton")
        if b in backends()
    ]
    assert_no_sync_and_capturable(ops, [])
