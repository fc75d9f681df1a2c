"""hip_src/kernels/rope_kv_write.cuh compiled for the host (tests/_hip_cpu.py) with a driver that
launches it as hip_src/rope_kv_write.cu does, and the call that runs it on torch CPU tensors.

The HIP kernel has no shared memory and no barriers, so running its threads one after another is
a faithful execution: its indexing, strides, VEC / scalar paths, conversions (bf16 included, which
the Triton interpreter cannot do) and launch shapes are checked before any GPU run."""

from __future__ import annotations

import ctypes

import torch
from _hip_cpu import compile_hip_on_cpu

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


def compile_rope_kv_on_cpu(d):
    """The kernel and its driver as a shared library in folder ``d`` (skips without a host compiler)."""
    return compile_hip_on_cpu(d, _DRIVER, "librope_kv_cpu.so")


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
