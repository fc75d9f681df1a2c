"""Memory safety and loud failures (issue #15), every op x backend.

Contract under test (README "Bad input"):
1. No op reads or writes outside the tensors it was given, whatever the values in slot_mapping,
   positions, block_table, seq_lens and cu_seqlens, debug off. Every destination and cache here
   lives inside a larger buffer whose other elements hold a sentinel (``_util.Guarded``): a guard
   byte that changes fails the test, and a stray *read* of a (finite) sentinel shows up as a
   finite result where NaN is required.
2. Debug mode names the argument, the index and the bound.
3. A destination that overlaps an input, a cache it reads or the other destination is a
   ValueError naming both (host pointer arithmetic), except the documented in-place aliases.
4. The reference backend follows the same contract.
5. Zero sizes work with every optional output; scales are validated alike.

Inputs are fresh random values, destinations are poisoned with NaN (every element must be
written) and sizes are odd. CPU: Triton in the interpreter, the reference, and the HIP kernels
compiled for the host (tests/_hip_cpu.py). ``@pytest.mark.gpu`` tests run the real HIP and
Triton kernels; on the H200 run this file under ``compute-sanitizer --tool memcheck``.
"""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _hip_cpu import compile_hip_on_cpu
from _util import DEVICE, PAGE_GUARD_CFGS, Guarded, backends, raises_naming

import rocm_mla
from rocm_mla.reference import merge_attn_states_ref

ROOT = Path(__file__).resolve().parents[2]
NAN = float("nan")
F32 = torch.float32


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(shape, dtype=F32, seed=0, scale=1.0):
    return (torch.randn(shape, generator=_gen(seed)) * scale).to(dtype).to(DEVICE)


# =============================================================================================
# the overlap check itself (rocm_mla/ops/_checks.py: Checker.no_overlap)
# =============================================================================================


def test_no_overlap_never_misses_an_overlap():
    """Random strided views (dtypes of 1, 2 and 4 bytes) of one byte buffer, against a
    byte-exact brute force: every real overlap is reported (the check may be conservative, never
    blind); interleaved views it proves disjoint are disjoint."""
    from rocm_mla.ops._checks import Checker

    g = _gen(123)
    buf = torch.zeros(4096, dtype=torch.uint8)
    c = Checker("t")
    proved = 0
    for _ in range(600):
        views = []
        for _ in range(2):
            dt = [torch.uint8, torch.float16, torch.float32][int(torch.randint(0, 3, (1,), generator=g))]
            es = torch.empty(0, dtype=dt).element_size()
            nd = int(torch.randint(1, 4, (1,), generator=g))
            shape = [int(torch.randint(1, 6, (1,), generator=g)) for _ in range(nd)]
            stride = [int(torch.randint(0, 40, (1,), generator=g)) for _ in range(nd)]
            stride[-1] = int(torch.randint(1, 3, (1,), generator=g))
            ext = (1 + sum((n - 1) * st for n, st in zip(shape, stride))) * es
            off = int(torch.randint(0, 4096 - ext, (1,), generator=g)) // es * es
            views.append(buf[off:].view(dt)[: (4096 - off) // es].as_strided(shape, stride))
        a, b = views
        bytes_of = []
        for v in (a, b):
            idx = torch.zeros(4096, dtype=torch.bool)
            es = v.element_size()
            base = v.data_ptr() - buf.data_ptr()
            pos = torch.zeros((), dtype=torch.long)
            for n, st in zip(v.shape, v.stride()):
                pos = pos[..., None] + torch.arange(n) * st * es
            for k in range(es):
                idx[(base + pos.flatten() + k)] = True
            bytes_of.append(idx)
        real = bool((bytes_of[0] & bytes_of[1]).any())
        try:
            c.no_overlap({"a": a}, {"b": b})
            flagged = False
        except ValueError:
            flagged = True
        assert flagged or not real, (a.shape, a.stride(), b.shape, b.stride(), a.data_ptr() - b.data_ptr())
        ext_meet = not (
            a.data_ptr() + a.element_size() * (1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride())))
            <= b.data_ptr()
            or b.data_ptr() + b.element_size() * (1 + sum((n - 1) * s for n, s in zip(b.shape, b.stride())))
            <= a.data_ptr()
        )
        proved += int(ext_meet and not flagged)
    assert proved > 0  # the period test did accept some interleaved pairs


def test_no_overlap_accepts_the_usual_interleavings():
    from rocm_mla.ops._checks import Checker

    c = Checker("t")
    kv_a = torch.empty(7, 576)
    c.no_overlap({"k_pe": kv_a[:, 512:]}, {"kv_c": kv_a[:, :512]})  # vLLM's kv_a split
    q = torch.empty(5, 3, 192)
    c.no_overlap({"q_pe": q[..., 128:]}, {"q_nope": q[..., :128]})  # q's nope / rope parts
    kv = torch.empty(5, 3, 256)
    c.no_overlap({"out": kv[..., 128:]}, {"k_nope": kv[..., :128]})
    with pytest.raises(ValueError, match="a: expected no memory in common with b"):
        c.no_overlap({"a": q[..., 127:191]}, {"b": q[..., :128]})


# =============================================================================================
# merge_attn_states
# =============================================================================================


def _merge_inputs(T, N, D, seed=0, dtype=F32):
    return (
        _randn((T, N, D), dtype, seed),
        _randn((N, T), F32, seed + 1, 2.0),
        _randn((T, N, D), dtype, seed + 2),
        _randn((N, T), F32, seed + 3, 2.0),
    )


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("T,N,D", [(5, 3, 13), (7, 2, 128)])
def test_merge_guarded_destinations(backend, T, N, D):
    """Strided destinations inside sentinel guards: every element written, nothing else."""
    po, pl, so, sl = _merge_inputs(T, N, D)
    out = Guarded((T, N, D), F32, fill="nan", pad_last=3)
    olse = Guarded((N, T), F32, fill="nan", pad_last=1)
    rocm_mla.merge_attn_states(out.view, po, pl, so, sl, olse.view, backend=backend)
    ref, ref_lse = merge_attn_states_ref(po, pl, so, sl)
    torch.testing.assert_close(out.view, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(olse.view, ref_lse, rtol=1e-5, atol=1e-5)
    out.check("output")
    olse.check("output_lse")


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("T,N", [(5, 3), (1, 1)])
def test_merge_head_size_zero_writes_only_output_lse(backend, T, N):
    """D = 0 with output_lse (was a ZeroDivisionError): the lse is merged, nothing else."""
    po, pl, so, sl = _merge_inputs(T, N, 0)
    olse = Guarded((N, T), F32, fill="nan")
    out = torch.empty(T, N, 0, device=DEVICE)
    rocm_mla.merge_attn_states(out, po, pl, so, sl, olse.view, backend=backend)
    torch.testing.assert_close(olse.view, torch.logaddexp(pl, sl), rtol=1e-5, atol=1e-5)
    olse.check("output_lse")
    rocm_mla.merge_attn_states(out, po, pl, so, sl, backend=backend)  # no output_lse: nothing to do


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("T,N,D", [(0, 3, 8), (4, 0, 8), (0, 0, 0)])
def test_merge_zero_sizes(backend, T, N, D):
    po, pl, so, sl = _merge_inputs(T, N, D)
    for olse in (None, torch.empty(N, T, device=DEVICE)):
        rocm_mla.merge_attn_states(torch.empty(T, N, D, device=DEVICE), po, pl, so, sl, olse, backend=backend)


def test_merge_overlaps_rejected_naming_both():
    T, N, D = 4, 3, 8
    po, pl, so, sl = _merge_inputs(T, N, D)
    buf = torch.randn(T * N * D + N * T, device=DEVICE)
    out, olse = buf[: T * N * D].view(T, N, D), buf[T * N * D - 1 : T * N * D - 1 + N * T].view(N, T)
    raises_naming(
        ValueError,
        lambda: rocm_mla.merge_attn_states(out, po, pl, so, sl, olse),
        "output",
        "output_lse",
        "no memory in common",
    )
    # output over an input lse (written while other threads read it), in either dtype view.
    lse_buf = torch.randn(T * N * D, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: rocm_mla.merge_attn_states(lse_buf.view(T, N, D), po, lse_buf[: N * T].view(N, T), so, sl),
        "output",
        "prefix_lse",
    )
    # output_lse over an output input.
    raises_naming(
        ValueError,
        lambda: rocm_mla.merge_attn_states(torch.empty_like(po), po, pl, so, sl, so.view(-1)[: N * T].view(N, T)),
        "output_lse",
        "suffix_output",
    )
    # output_lse == an input lse, even the very same view.
    raises_naming(
        ValueError,
        lambda: rocm_mla.merge_attn_states(torch.empty_like(po), po, pl, so, sl, sl),
        "output_lse",
        "suffix_lse",
    )
    # The documented alias still passes: output is suffix_output itself.
    s2 = so.clone()
    rocm_mla.merge_attn_states(s2, po, pl, s2, sl)
    torch.testing.assert_close(s2, merge_attn_states_ref(po, pl, so, sl)[0], rtol=1e-5, atol=1e-5)


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
    po, pl, so, sl = _merge_inputs(T, N, D, seed=7)
    out = Guarded((T, N, D), F32, fill="nan")
    olse = Guarded((N, T), F32, fill="nan", pad_last=2)
    _run_hip_merge_on_cpu(hip_merge_on_cpu, out.view, olse.view, po, pl, so, sl, vec=vec)
    ref, ref_lse = merge_attn_states_ref(po, pl, so, sl)
    torch.testing.assert_close(out.view, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(olse.view, ref_lse, rtol=1e-5, atol=1e-5)
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


# =============================================================================================
# fused_rope_mla_kv_write / concat_and_cache_mla
# =============================================================================================
from rocm_mla.reference.rope_kv_write import (  # noqa: E402
    cache_rows_ref,
    quantize_fp8_ref,
    rope_cos_sin_cache,
    rope_ref,
)

MAX_POS = 300
HUGE = [1 << 40, (1 << 62) + 5]


def _cos_sin(max_pos=MAX_POS):
    return rope_cos_sin_cache(max_pos, compute_dtype=torch.float64)


class RopeCase:
    """One KV-write batch with every tensor inside a sentinel-guarded buffer: q [T, N, 192] (q_pe
    its rope slice), kv_a [T, 576] (k_pe its [:, 512:] slice), cos/sin cache, a NaN-poisoned paged
    cache whose guards reach two whole pages past each end (a stray row write lands there)."""

    def __init__(self, T, N, bs, nb, *, dtype=F32, fp8=None, max_pos=MAX_POS, seed=0):
        g = _gen(seed)
        self.T, self.N, self.fp8 = T, N, fp8
        self.q = Guarded((T, N, 192), dtype, generator=g)
        self.kv_a = Guarded((T, 576), dtype, generator=g)
        self.kv_c = Guarded((T, 512), dtype, generator=g)
        self.cos_sin = Guarded((max_pos, 64), F32, fill=_cos_sin(max_pos).to(DEVICE))
        self.cache = Guarded((nb, bs, 576), fp8 or dtype, fill="nan", guard=2 * bs * 576 + 64)
        self.k_scale = torch.tensor([0.5], device=DEVICE)
        self.q0, self.k0 = self.q.view.clone(), self.kv_a.view.clone()
        self.num_slots = nb * bs
        self.positions = torch.randint(0, max(1, max_pos), (T,), generator=g).to(DEVICE)
        self.slots = torch.randperm(self.num_slots, generator=g)[:T].to(DEVICE)

    @property
    def q_pe(self):
        return self.q.view[..., 128:]

    @property
    def k_pe(self):
        return self.kv_a.view[:, 512:].unsqueeze(1)

    def run(self, backend, is_neox, **kw):
        kw.setdefault("kv_cache_dtype", "fp8" if self.fp8 else "auto")
        rocm_mla.fused_rope_mla_kv_write(
            self.positions,
            self.q_pe,
            self.k_pe,
            self.kv_c.view,
            self.cos_sin.view,
            self.cache.view,
            self.slots,
            is_neox=is_neox,
            k_scale=self.k_scale,
            backend=backend,
            **kw,
        )

    def check(self, is_neox, *, rope=True, tol=1e-5):
        """Good tokens as the reference, bad positions NaN, bad slots skipped, guards intact."""
        pos, slots = self.positions.long(), self.slots.long()
        good_pos = (pos >= 0) & (pos < self.cos_sin.view.shape[0])
        good_slot = (slots >= 0) & (slots < self.num_slots)
        if rope:
            q_rot = rope_ref(self.positions, self.q0[..., 128:], self.cos_sin.view, is_neox=is_neox)
            k_rot = rope_ref(self.positions, self.k0[:, 512:], self.cos_sin.view, is_neox=is_neox)
            assert torch.isnan(self.q_pe[~good_pos].float()).all(), "bad position: q_pe not NaN"
            assert torch.isnan(self.k_pe[~good_pos].float()).all(), "bad position: k_pe not NaN"
            torch.testing.assert_close(self.q_pe[good_pos].float(), q_rot[good_pos], rtol=tol, atol=tol)
            torch.testing.assert_close(self.k_pe[good_pos].squeeze(1).float(), k_rot[good_pos], rtol=tol, atol=tol)
        else:
            k_rot = self.k0[:, 512:].float()
            assert torch.equal(self.kv_a.view, self.k0), "concat_and_cache_mla changed k_pe"
        assert torch.equal(self.q.view[..., :128], self.q0[..., :128])
        assert torch.equal(self.kv_a.view[:, :512], self.k0[:, :512])
        rows = cache_rows_ref(self.kv_c.view, k_rot)  # [T, 576] float32, NaN rope part on bad positions
        bs = self.cache.view.shape[1]
        flat = self.cache.view.reshape(-1, 576)
        written = torch.zeros(flat.shape[0], dtype=torch.bool, device=DEVICE)
        written[slots[good_slot]] = True
        got = flat[slots[good_slot]]
        want = rows[: slots.shape[0]][good_slot]
        if self.fp8 is not None:
            want = quantize_fp8_ref(want, self.k_scale, self.fp8)
            got, want = got.float(), want.float()
        nan_want = torch.isnan(want.float())
        assert torch.equal(torch.isnan(got.float()), nan_want), "NaN pattern of the cache rows"
        torch.testing.assert_close(got.float()[~nan_want], want.float()[~nan_want], rtol=tol, atol=tol)
        snap = self.cache._snap[self.cache.guard : self.cache.guard + flat.numel()].view(-1, 576)
        assert torch.equal(
            flat[~written].view(torch.uint8) if flat.dtype.itemsize == 1 else flat[~written].view(torch.uint8),
            snap[~written].view(torch.uint8),
        ), "cache rows without a valid slot were written"
        assert bs >= 1
        for name in ("q", "kv_a", "kv_c", "cos_sin", "cache"):
            getattr(self, name).check(name)
        assert torch.equal(
            self.kv_c.view,
            self.kv_c._snap[self.kv_c.guard : self.kv_c.guard + self.kv_c.view.numel()].view_as(self.kv_c.view),
        ), "kv_c changed"


def _bad_indices(case: RopeCase, bad_slots=True, bad_pos=True):
    T = case.T
    if bad_slots:  # one past the end, a few past, negative, huge (a segfault before the guard)
        vals = [case.num_slots, case.num_slots + 1, -7] + HUGE
        for i, v in zip(range(1, T, 2), vals):
            case.slots[i] = v
    if bad_pos:
        mp = case.cos_sin.view.shape[0]
        vals = [-1, mp, mp + 3] + HUGE + [-(1 << 40)]
        for i, v in zip(range(0, T, 3), vals):
            case.positions[i] = v


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("N,bs", [(3, 16), (1, 1), (16, 5)])
def test_rope_bad_slots_and_positions(backend, is_neox, N, bs):
    case = RopeCase(19, N, bs, nb=7 if bs > 1 else 40, seed=N)
    _bad_indices(case)
    case.run(backend, is_neox)
    case.check(is_neox)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=str)
def test_rope_bad_indices_fp8_cache(backend, fp8):
    case = RopeCase(13, 2, 8, nb=4, dtype=torch.float16, fp8=fp8, seed=3)
    _bad_indices(case)
    case.run(backend, False)
    case.check(False, tol=2e-3)


@pytest.mark.parametrize("backend", backends())
def test_concat_bad_slots_skipped(backend):
    case = RopeCase(11, 1, 4, nb=5, seed=5)
    _bad_indices(case, bad_pos=False)
    rocm_mla.concat_and_cache_mla(case.kv_c.view, case.k_pe, case.cache.view, case.slots, backend=backend)
    case.check(False, rope=False)


@pytest.mark.parametrize("backend", backends())
def test_rope_zero_sizes(backend):
    """T = 0; an empty cache (every slot outside: nothing cached); an empty cos/sin cache
    (every position outside: all NaN)."""
    empty = RopeCase(0, 4, 16, nb=2)
    empty.run(backend, False)
    empty.check(False)
    no_cache = RopeCase(5, 2, 16, nb=0)
    no_cache.slots = torch.tensor([0, 3, -1, 16, 1], device=DEVICE)
    no_cache.run(backend, False)
    no_cache.check(False)
    no_rows = RopeCase(5, 2, 4, nb=3, max_pos=0)
    no_rows.positions.zero_()
    no_rows.run(backend, True)
    no_rows.check(True)
    assert torch.isnan(no_rows.q_pe).all()


@pytest.mark.parametrize("debug", ["kwarg", "env"])
def test_rope_debug_names_argument_index_and_bound(monkeypatch, debug):
    case = RopeCase(6, 2, 4, nb=3)
    case.positions[4] = MAX_POS
    kw = {"debug": True} if debug == "kwarg" else {}
    if debug == "env":
        monkeypatch.setenv("ROCM_MLA_DEBUG", "1")
    raises_naming(
        ValueError, lambda: case.run(None, False, **kw), "positions", f"[0, {MAX_POS})", f"{MAX_POS} at index 4"
    )
    case.positions[4] = 0
    case.slots[2] = 12
    raises_naming(ValueError, lambda: case.run(None, False, **kw), "slot_mapping", "= 12", "12 at index 2")
    raises_naming(
        ValueError,
        lambda: rocm_mla.concat_and_cache_mla(case.kv_c.view, case.k_pe, case.cache.view, case.slots, **kw),
        "concat_and_cache_mla: slot_mapping",
        "12 at index 2",
    )
    monkeypatch.delenv("ROCM_MLA_DEBUG", raising=False)
    case.run(None, False, debug=False)  # debug off: the guard skips the slot, no error


def test_rope_overlaps_rejected_naming_both():
    case = RopeCase(4, 2, 4, nb=3)
    q = case.q.view
    kv = dict(
        positions=case.positions,
        q_pe=case.q_pe,
        k_pe=case.k_pe,
        kv_c=case.kv_c.view,
        cos_sin_cache=case.cos_sin.view,
        kv_cache=case.cache.view,
        slot_mapping=case.slots,
    )

    def call(**change):
        rocm_mla.fused_rope_mla_kv_write(is_neox=False, **{**kv, **change})

    raises_naming(ValueError, lambda: call(k_pe=q[:, :1, 100:164]), "q_pe", "k_pe", "no memory in common")
    raises_naming(ValueError, lambda: call(kv_c=case.cache.view.view(-1)[: 4 * 512].view(4, 512)), "kv_cache", "kv_c")
    raises_naming(
        ValueError, lambda: call(cos_sin_cache=q.reshape(-1)[: 16 * 64].view(16, 64)), "q_pe", "cos_sin_cache"
    )
    pos_in_cache = case.cache.view.view(-1)[:8].view(torch.int64)
    raises_naming(ValueError, lambda: call(positions=pos_in_cache), "kv_cache", "positions")
    raises_naming(
        ValueError,
        lambda: rocm_mla.concat_and_cache_mla(
            case.cache.view.view(-1)[: 4 * 512].view(4, 512), case.k_pe, case.cache.view, case.slots
        ),
        "concat_and_cache_mla: kv_cache",
        "kv_c",
    )
    # Allowed: kv_c and k_pe interleaved in one [T, 576] buffer (vLLM's kv_a split), q_pe a slice of q.
    call(kv_c=case.kv_a.view[:, :512])


# ---------------------------------------------------------------- the HIP rope kernel on the CPU
@pytest.fixture(scope="module")
def hip_rope_on_cpu(tmp_path_factory):
    if DEVICE.type != "cpu":
        pytest.skip("CPU emulation test (the GPU tests run the real kernel)")
    from test_rope_kv_write import _DRIVER

    return compile_hip_on_cpu(tmp_path_factory.mktemp("hip_rope_cpu"), _DRIVER, "librope_cpu.so")


@pytest.mark.parametrize("vec", [True, False], ids=["vec", "scalar"])
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fnuz], ids=str)
def test_hip_rope_kernel_on_cpu_bad_indices(hip_rope_on_cpu, vec, is_neox, fp8):
    """hip_src/kernels/rope_kv_write.cuh on the host, launched as the launcher does: the same
    guards as Triton (bad slot skipped, bad position NaN, guards intact), an empty cos/sin
    cache and an empty cache included."""
    from test_rope_kv_write import run_hip_kernel_on_cpu

    def go(case, rope=True):
        run_hip_kernel_on_cpu(
            hip_rope_on_cpu,
            case.positions if rope else None,
            case.q_pe if rope else None,
            case.k_pe,
            case.kv_c.view,
            case.cos_sin.view if rope else None,
            case.cache.view,
            case.slots,
            case.k_scale,
            is_neox=is_neox,
            fp8=fp8,
            vec=vec,
        )

    dtype = torch.bfloat16 if fp8 else F32
    tol = 1.6e-2 if fp8 else 1e-5
    case = RopeCase(17, 3, 8, nb=5, dtype=dtype, fp8=fp8, seed=11)
    _bad_indices(case)
    go(case)
    case.check(is_neox, tol=tol)
    concat = RopeCase(9, 1, 8, nb=2, dtype=dtype, fp8=fp8, seed=12)
    _bad_indices(concat, bad_pos=False)
    go(concat, rope=False)
    concat.check(is_neox, rope=False, tol=tol)
    no_rows = RopeCase(4, 2, 8, nb=2, dtype=dtype, fp8=fp8, max_pos=0)
    no_rows.positions.zero_()
    go(no_rows)
    no_rows.check(is_neox, tol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hip", "triton", "reference"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
def test_gpu_rope_bad_indices(backend, dtype, is_neox):
    """The real kernels (run under compute-sanitizer memcheck on the H200): vector and scalar
    paths, bf16 and fp8 caches, huge indices."""
    if backend not in backends():
        pytest.skip(f"{backend} unavailable")
    tol = 3.2e-2
    for N, bs, nb, fp8 in ((16, 16, 9, None), (128, 64, 3, None), (3, 5, 40, "fp8")):
        fp8_dtype = (torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn) if fp8 else None
        case = RopeCase(101, N, bs, nb=nb, dtype=dtype, fp8=fp8_dtype, seed=N)
        _bad_indices(case)
        case.run(backend, is_neox)
        case.check(is_neox, tol=tol)
    misaligned = RopeCase(33, 4, 16, nb=3, dtype=dtype, seed=9)  # HIP scalar path: q_pe off 16 bytes
    base = Guarded((33 * 4 * 192 + 1,), dtype)
    misaligned.q = base
    misaligned.q.view = base.view[1:].view(33, 4, 192)
    misaligned.q0 = misaligned.q.view.clone()
    _bad_indices(misaligned)
    misaligned.run(backend, is_neox)
    misaligned.check(is_neox, tol=tol)
    empty = RopeCase(7, 2, 16, nb=0, dtype=dtype)
    empty.run(backend, is_neox)
    empty.check(is_neox, tol=tol)


# =============================================================================================
# mla_decode
# =============================================================================================
from rocm_mla.reference import mla_decode_ref  # noqa: E402

DECODE_BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP decode kernel


class DecodeCase:
    """A decode batch with a sentinel-guarded paged cache (random values; guards reach two pages
    past each end), a shuffled block table, and guarded out / lse that start random (finite), so
    that a request's NaN rows are the kernel's and an unwritten row fails the comparison."""

    def __init__(self, lens, N, q_len, bs, *, dtype=F32, spare_pages=2, spare_cols=1, seed=0):
        g = _gen(seed)
        self.B, self.N, self.q_len, self.bs, self.dtype = len(lens), N, q_len, bs, dtype
        nblk = [max(0, math.ceil(L / bs)) for L in lens]
        self.nb = sum(nblk) + spare_pages
        self.kv = Guarded((self.nb, bs, 576), dtype, guard=2 * bs * 576 + 64, generator=g)
        perm = torch.randperm(self.nb, generator=g)
        self.max_blocks = max(nblk + [0]) + spare_cols
        bt = torch.empty(self.B, self.max_blocks, dtype=torch.int32)
        k = 0
        for b, n in enumerate(nblk):
            bt[b, :n] = perm[k : k + n].int()
            bt[b, n:] = perm[(sum(nblk) + b) % self.nb].int() if self.nb else 0
            k += n
        self.block_table = bt.to(DEVICE)
        self.seq_lens = torch.tensor(list(lens), dtype=torch.int32, device=DEVICE)
        rows = self.B * q_len
        self.q_nope = _randn((rows, N, 512), dtype, seed + 1)
        self.q_pe = _randn((rows, N, 192), dtype, seed + 2)[..., 128:]
        self.out = Guarded((rows, N, 512), dtype, fill="randn", pad_last=8, generator=g)
        self.lse = Guarded((rows, N), F32, fill="randn", pad_last=1, generator=g)
        self.sm_scale = 192**-0.5

    def run(self, backend, **kw):
        kw.setdefault("out", self.out.view)
        kw.setdefault("lse", self.lse.view)
        return rocm_mla.mla_decode(
            self.q_nope,
            self.q_pe,
            self.kv.view,
            self.block_table,
            self.seq_lens,
            sm_scale=self.sm_scale,
            backend=backend,
            **kw,
        )

    def ref(self, block_table=None, seq_lens=None):
        return mla_decode_ref(
            self.q_nope,
            self.q_pe,
            self.kv.view,
            self.block_table if block_table is None else block_table,
            self.seq_lens if seq_lens is None else seq_lens,
            self.sm_scale,
        )

    def check(self, want, *, nan_requests=(), tol=1e-4):
        """Requests in nan_requests: every row NaN in out and lse; the others as ``want``."""
        ro, rl = want
        out, lse = self.out.view.float(), self.lse.view
        for b in range(self.B):
            r = slice(b * self.q_len, (b + 1) * self.q_len)
            if b in nan_requests:
                assert torch.isnan(out[r]).all() and torch.isnan(lse[r]).all(), f"request {b}: not NaN"
            else:
                assert not torch.isnan(out[r]).any(), f"request {b}: NaN in out (leaked from another request)"
                torch.testing.assert_close(out[r], ro[r], rtol=tol, atol=tol)
                torch.testing.assert_close(lse[r], rl[r], rtol=0, atol=1e-3)
        self.out.check("out")
        self.lse.check("lse")
        self.kv.check("kv_cache")


@pytest.mark.parametrize("backend", DECODE_BACKENDS)
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("q_len,bs", [(1, 16), (2, 5), (1, 1)])
def test_decode_bad_lengths_and_unused_entries(backend, splits, q_len, bs):
    """seq_len past the table's capacity is clamped to it (not an error, not a read past the
    table); a negative seq_len sees no key; garbage in unused block-table entries is never read."""
    if backend == "reference" and splits is not None:
        pytest.skip("the reference has no splits")
    case = DecodeCase((9, 20, 7, 12), 3, q_len, bs, spare_cols=2, seed=bs)
    cap = case.max_blocks * bs
    clean_lens = case.seq_lens.clone()
    clean_lens[1] = cap  # request 1: length past the capacity -> clamped
    case.seq_lens[1] = cap + 1000
    case.seq_lens[2] = -5  # request 2: negative -> no key
    clean_lens[2] = 0
    used0 = math.ceil(9 / bs)  # request 0: garbage past its used entries
    garbage = [-1, 1 << 30, -(1 << 31), case.nb] * case.max_blocks
    case.block_table[0, used0:] = torch.tensor(garbage[: case.max_blocks - used0], dtype=torch.int32)
    clean_bt = case.block_table.clone()
    clean_bt[0, used0:] = 0
    want = case.ref(clean_bt, clean_lens)
    case.run(backend, num_kv_splits=splits)
    case.check(want)
    rows2 = slice(2 * q_len, 3 * q_len)
    assert bool((case.lse.view[rows2] == -math.inf).all()) and bool((case.out.view[rows2] == 0).all())


@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_reference_bad_page_makes_its_request_nan(q_len):
    """The spec: a used page outside [0, num_blocks) -- no wrap of -1 to the last page -- NaNs
    every row of its request and nothing else."""
    case = DecodeCase((17, 30, 5), 4, q_len, 8, seed=4)
    want = case.ref()
    case.block_table[1, 2] = -1
    case.block_table[2, 0] = case.nb
    case.run("reference")
    case.check(want, nan_requests=(1, 2))
    o, lse = case.ref()  # the reference function itself, too
    assert torch.isnan(o[q_len:]).all() and torch.isnan(lse[q_len:]).all()
    torch.testing.assert_close(o[:q_len], want[0][:q_len])


@pytest.mark.parametrize("cfg", PAGE_GUARD_CFGS)
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("q_len,bs,bad", [(1, 16, -1), (1, 16, "nb"), (2, 5, "nb+1"), (1, 1, -1), (3, 32, "nb")])
def test_decode_kernel_bad_page_makes_its_request_nan(cfg, splits, q_len, bs, bad):
    """Triton, either form of the page guard: a used block-table entry just outside the cache
    (within the guard) makes its request NaN -- every split and row block that reads it -- and
    reads nothing outside kv_cache (a read of the sentinel would give a finite result); other
    requests are unaffected."""
    if "triton" not in backends():
        pytest.skip("Triton unavailable")
    case = DecodeCase((21, 40, 6), 4, q_len, bs, seed=6)
    want = case.ref()
    page = {-1: -1, "nb": case.nb, "nb+1": case.nb + 1}[bad]
    case.block_table[1, 0] = page  # the first page: every row of the request sees it
    case.run("triton", num_kv_splits=splits, config=cfg)
    case.check(want, nan_requests=(1,))


_HUGE_PAGE_CHILD = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.getcwd())
import torch, rocm_mla
g = torch.Generator().manual_seed(0)
kv = torch.randn(4, 16, 576, generator=g)
bt = torch.tensor([[0, 1], [int(sys.argv[1]), 2]], dtype=torch.int32)
sl = torch.tensor([20, 20], dtype=torch.int32)
q, qp = torch.randn(2, 4, 512, generator=g), torch.randn(2, 4, 64, generator=g)
out, lse = rocm_mla.mla_decode(q, qp, kv, bt, sl, sm_scale=0.1, backend="triton", num_kv_splits=int(sys.argv[2]))
ok = bool(torch.isnan(out[1]).all() and torch.isnan(lse[1]).all() and not torch.isnan(out[0]).any())
sys.exit(0 if ok else 3)
"""


@pytest.mark.parametrize("page", [(1 << 31) - 1, -(1 << 31)])
def test_decode_kernel_huge_page_in_child(page):
    """A huge page id read unguarded is a segfault of the interpreter: run it in a child."""
    if DEVICE.type != "cpu":
        pytest.skip("the GPU version is test_gpu_decode_bad_pages")
    for splits in (1, 2):
        r = subprocess.run(
            [sys.executable, "-c", _HUGE_PAGE_CHILD, str(page), str(splits)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("backend", DECODE_BACKENDS)
def test_decode_zero_sizes(backend):
    """B = 0, N = 0, a table of 0 columns (every row sees no key) and a cache of 0 pages with
    zero lengths: with and without out / lse / workspace."""
    for lens, N, bs, spare_pages, spare_cols in (
        ((), 4, 16, 2, 1),
        ((5, 3), 0, 16, 2, 1),
        ((5, 3), 4, 16, 2, 0),
        ((0, 0), 4, 16, 0, 1),
    ):
        for given in (True, False):
            case = DecodeCase(lens, N, 1, bs, spare_pages=spare_pages, spare_cols=spare_cols)
            if spare_cols == 0:  # no columns at all: the lengths are clamped to capacity 0
                case.block_table = case.block_table[:, :0]
                assert case.block_table.shape[1] == 0
            kw = {} if given else {"out": None, "lse": None}
            ws = torch.empty(4096, device=DEVICE) if backend == "triton" else None
            out, lse = case.run(backend, workspace=ws, **kw)
            assert out.shape == (len(lens), N, 512) and lse.shape == (len(lens), N)
            if out.numel():
                assert bool((out == 0).all()) and bool((lse == -math.inf).all())
            case.out.check("out")
            case.lse.check("lse")


def test_decode_overlaps_rejected_naming_both():
    case = DecodeCase((9, 3), 4, 1, 16)
    rows, N = 2, 4
    kvflat = case.kv.view.view(-1)
    on_pages = kvflat[: rows * N * 512].view(rows, N, 512)  # out on cache pages a request reads
    raises_naming(ValueError, lambda: case.run("reference", out=on_pages), "out", "kv_cache", "no memory in common")
    raises_naming(ValueError, lambda: case.run("reference", out=case.q_nope), "out", "q_nope")
    lse_in_out = case.out.base[case.out.guard : case.out.guard + rows * N].view(rows, N)
    raises_naming(ValueError, lambda: case.run("reference", lse=lse_in_out), "out", "lse")
    raises_naming(ValueError, lambda: case.run("reference", lse=case.q_pe[:, :, 0]), "lse", "q_pe")
    bt_buf = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: rocm_mla.mla_decode(
            case.q_nope,
            case.q_pe,
            case.kv.view,
            bt_buf[: 2 * case.max_blocks].view(2, -1),
            case.seq_lens,
            sm_scale=0.1,
            lse=bt_buf[2:10].view(torch.float32).view(2, 4),
        ),
        "lse",
        "block_table",
    )
    raises_naming(
        ValueError, lambda: case.run("reference", workspace=case.out.base[case.out.guard :]), "out", "workspace"
    )
    raises_naming(ValueError, lambda: case.run("reference", workspace=kvflat), "workspace", "kv_cache")
    lse = torch.ones(rows, N, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: rocm_mla.mla_decode(
            case.q_nope,
            case.q_pe,
            case.kv.view.to(torch.float8_e4m3fn),
            case.block_table,
            case.seq_lens,
            sm_scale=0.1,
            k_scale=lse.view(-1)[3:4],
            lse=lse,
        ),
        "lse",
        "k_scale",
    )


@pytest.mark.parametrize("op", ["mla_decode", "mla_prefill"])
@pytest.mark.parametrize(
    "bad,exc,words",
    [
        ("x", TypeError, ["a float", "str"]),
        (True, TypeError, ["a float", "bool"]),
        (0.0, ValueError, ["finite number > 0", "0.0"]),
        (-1, ValueError, ["finite number > 0", "-1"]),
        (float("nan"), ValueError, ["finite number > 0", "nan"]),
        (float("inf"), ValueError, ["finite number > 0", "inf"]),
    ],
)
def test_scale_validated_alike(op, bad, exc, words):
    """sm_scale: one rule (Checker.scale) for decode and prefill, the same messages."""
    if op == "mla_decode":
        case = DecodeCase((5,), 2, 1, 16)

        def fn():
            return rocm_mla.mla_decode(
                case.q_nope, case.q_pe, case.kv.view, case.block_table, case.seq_lens, sm_scale=bad
            )
    else:
        q = _randn((3, 2, 192))
        cu = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)

        def fn():
            return rocm_mla.mla_prefill(
                q, _randn((3, 2, 128)), _randn((3, 1, 64)), _randn((3, 2, 128)), cu, cu, sm_scale=bad
            )

    raises_naming(exc, fn, f"{op}: sm_scale", *words)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_gpu_decode_bad_pages(kv, bs):
    """The real decode kernel (lead's guard) on bad pages, huge ones included, every split
    choice; run under compute-sanitizer memcheck."""
    for splits in (None, 1, 4):
        for page in ("-1", "nb", (1 << 31) - 1, -(1 << 31)):
            case = DecodeCase((300, 77, 1000, 5), 16, 1, bs, dtype=torch.bfloat16, seed=bs)
            want = case.ref()
            case.block_table[2, 3] = {"-1": -1, "nb": case.nb}.get(page, page)
            kw = {}
            if kv == "fp8":
                fp8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
                case.kv = Guarded((case.nb, bs, 576), fp8, fill=case.kv.view.float().to(fp8), guard=2 * bs * 576 + 64)
                want = case.ref()
                case.block_table[2, 3] = {"-1": -1, "nb": case.nb}.get(page, page)
                kw = {"k_scale": 1.0}
            case.run("triton", num_kv_splits=splits, **kw)
            case.check(want, nan_requests=(2,), tol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_gpu_decode_bad_lengths_zero_sizes(bs):
    """Clamped lengths, garbage in unused entries, zero sizes: on the real kernel (memcheck)."""
    for splits in (None, 1, 3):
        test_decode_bad_lengths_and_unused_entries("triton", splits, 1, bs)
    test_decode_zero_sizes("triton")


# =============================================================================================
# mla_prefill / mla_prefill_with_context
# =============================================================================================
from rocm_mla.ops.prefill import ContextChunk, launch_triton  # noqa: E402
from rocm_mla.reference import mla_prefill_ref  # noqa: E402

PREFILL_BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP prefill kernel


def _cu(lengths, start=0):
    vals = [start]
    for n in lengths:
        vals.append(vals[-1] + n)
    return torch.tensor(vals, dtype=torch.int32, device=DEVICE)


class PrefillCase:
    """q [Tq, N, 192], k_nope/v views of one [Tk, N, 256] buffer, k_pe a [Tk, 576][:, 512:] view:
    all inside sentinel guards; out / lse guarded and NaN-poisoned (lse as the transpose of a
    [Tq, N] buffer)."""

    def __init__(self, Tq, Tk, N, *, dtype=F32, seed=0):
        g = _gen(seed)
        self.Tq, self.Tk, self.N = Tq, Tk, N
        self.q = Guarded((Tq, N, 192), dtype, generator=g)
        self.kv = Guarded((Tk, N, 256), dtype, generator=g)
        self.latent = Guarded((Tk, 576), dtype, generator=g)
        self.out = Guarded((Tq, N, 128), dtype, fill="nan", pad_last=16)
        self.lse_t = Guarded((Tq, N), F32, fill="nan", pad_last=1)

    @property
    def args(self):
        return (self.q.view, self.kv.view[..., :128], self.latent.view[:, 512:].unsqueeze(1), self.kv.view[..., 128:])

    @property
    def lse(self):
        return self.lse_t.view.transpose(0, 1)

    def check_guards(self):
        for name in ("q", "kv", "latent", "out", "lse_t"):
            getattr(self, name).check(name)


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_prefill_writes_only_the_rows_of_sequences(backend, causal):
    """q rows outside every sequence are never written (the reference backend wrote them)."""
    case = PrefillCase(15, 11, 3, seed=1)
    cq, ck = _cu([4, 0, 5], start=2), _cu([3, 6, 2])  # rows 0-1 and 11-14 belong to no sequence
    rocm_mla.mla_prefill(
        *case.args, cq, ck, sm_scale=0.1, causal=causal, out=case.out.view, lse=case.lse, backend=backend
    )
    ref, ref_lse = mla_prefill_ref(*case.args, cq, ck, 0.1, causal)
    own = torch.zeros(15, dtype=torch.bool)
    own[2:11] = True
    torch.testing.assert_close(case.out.view[own], ref[own], rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(case.lse[:, own], ref_lse[:, own], rtol=2e-5, atol=2e-5)
    assert torch.isnan(case.out.view[~own]).all() and torch.isnan(case.lse[:, ~own]).all(), (
        "rows that belong to no sequence were written"
    )
    case.check_guards()


BAD_OFFSETS = {  # (cu_seqlens_q, cu_seqlens_k) for Tq = 13, Tk = 9, B = 3
    "past_the_end": ([0, 5, 9, 40], [0, 3, 6, 30]),
    "negative_start": ([-7, 4, 9, 13], [-3, 2, 5, 9]),
    "decreasing": ([0, 9, 4, 13], [0, 7, 2, 9]),
    "huge": ([0, (1 << 31) - 1, -(1 << 31), 13], [(1 << 31) - 1, 0, -(1 << 31), 9]),
}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("bad", list(BAD_OFFSETS))
@pytest.mark.parametrize("tma", [False, True, "host"], ids=["pointers", "device_desc", "host_desc"])
def test_prefill_kernel_clamps_bad_offsets(causal, bad, tma):
    """The Triton kernel with offsets nobody validated (a GPU call without debug; here the
    launcher is called directly to bypass the CPU check): whatever they hold, nothing outside
    q, k_nope, k_pe, v, out, lse is read or written -- with pointer loads and with either kind
    of TMA descriptor (16-bit inputs; the interpreter runs the TMA path as sm90 does)."""
    from rocm_mla import _platform
    from rocm_mla.ops.prefill import _tma_arch, _tma_ok

    if "triton" not in backends():
        pytest.skip("Triton unavailable")
    if tma and not _tma_arch(_platform.device_arch(torch.device(DEVICE))):
        pytest.skip("TMA descriptors need an NVIDIA sm90+ GPU or the interpreter")
    case = PrefillCase(13, 9, 2, dtype=torch.float16 if tma else F32, seed=2)
    if tma:
        q, kn, kpe, v = case.args
        assert _tma_ok(q, kn, kpe, v, 0), "the case must take the TMA path"
    cq, ck = (torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in BAD_OFFSETS[bad])
    launch_triton(
        *case.args,
        cq,
        ck,
        case.out.view,
        case.lse,
        sm_scale=0.1,
        causal=causal,
        config={"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "tma": tma},
    )
    case.check_guards()


def test_prefill_offsets_named_by_reference_and_debug():
    """The reference (the spec) names bad offsets, with the index and the bound; so do the op's
    checks (on the CPU always; on a GPU with debug=True or for the reference backend)."""
    case = PrefillCase(13, 9, 2)
    cq, ck = _cu([5, 4, 4]), torch.tensor([0, 7, 2, 9], dtype=torch.int32, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: mla_prefill_ref(*case.args, cq, ck, 0.1),
        "mla_prefill_ref: cu_seqlens_k",
        "[0, 9]",
        "[0, 7, 2, 9]",
    )
    raises_naming(
        ValueError, lambda: mla_prefill_ref(*case.args, _cu([5, 4, 5]), _cu([3, 3, 3]), 0.1), "cu_seqlens_q", "[0, 13]"
    )
    for backend in PREFILL_BACKENDS:
        raises_naming(
            ValueError,
            lambda: rocm_mla.mla_prefill(*case.args, cq, ck, sm_scale=0.1, backend=backend, debug=True),
            "mla_prefill: cu_seqlens_k",
            "cu_seqlens_k[2] = 2 < cu_seqlens_k[1] = 7",
        )
        raises_naming(
            ValueError,
            lambda: rocm_mla.mla_prefill(
                *case.args, _cu([5, 4, 5]), _cu([3, 3, 3]), sm_scale=0.1, backend=backend, debug=True
            ),
            "cu_seqlens_q[3] = 14 > Tq=13",
        )
    case.check_guards()


def test_prefill_overlaps_rejected_naming_both():
    case = PrefillCase(6, 6, 2)
    q, kn, kpe, v = case.args
    cq = _cu([6])

    def call(**kw):
        return rocm_mla.mla_prefill(q, kn, kpe, v, cq, cq, sm_scale=0.1, **kw)

    raises_naming(ValueError, lambda: call(out=v, causal=False), "out", "v", "no memory in common")
    raises_naming(ValueError, lambda: call(out=q[..., :128]), "out", "q")
    raises_naming(ValueError, lambda: call(out=kn), "out", "k_nope")
    lse_in_out = case.out.base[case.out.guard : case.out.guard + 12].view(2, 6)
    raises_naming(ValueError, lambda: call(out=case.out.view, lse=lse_in_out), "out", "lse")
    raises_naming(ValueError, lambda: call(lse=case.latent.view[:, 512:514].transpose(0, 1)), "lse", "k_pe")
    cu_buf = torch.zeros(16, dtype=torch.int32, device=DEVICE)
    cu_buf[1] = 6
    raises_naming(
        ValueError,
        lambda: rocm_mla.mla_prefill(
            q, kn, kpe, v, cu_buf[:2], cq, sm_scale=0.1, lse=cu_buf[1:13].view(torch.float32).view(2, 6)
        ),
        "lse",
        "cu_seqlens_q",
    )
    # A context chunk read after out was written may not overlap it.
    chunk = ContextChunk(case.out.view, kpe, case.out.view, cq)
    raises_naming(
        ValueError,
        lambda: rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, cq, [chunk], sm_scale=0.1, out=case.out.view),
        "context_chunks[0]",
        "out",
        "k_nope",
    )
    case.check_guards()


@pytest.mark.parametrize("as_generator", [False, True], ids=["list", "generator"])
@pytest.mark.parametrize("bad_at", [0, 1, 2])
@pytest.mark.parametrize("kind", ["shape", "offsets", "overlap", "type"])
def test_prefill_with_context_validates_every_chunk_before_writing(as_generator, bad_at, kind):
    """A bad chunk anywhere -- the last one of a generator included -- raises with out and lse
    bitwise untouched (they were poisoned: nothing was written)."""
    case = PrefillCase(7, 7, 2, seed=3)
    q, kn, kpe, v = case.args
    cq = _cu([3, 4])
    g = _gen(9)
    chunks = []
    for lens in ([2, 5], [0, 3], [4, 1]):
        Tc = sum(lens)
        kvc = torch.randn(Tc, 2, 256, generator=g).to(DEVICE)
        chunks.append(
            ContextChunk(kvc[..., :128], torch.randn(Tc, 1, 64, generator=g).to(DEVICE), kvc[..., 128:], _cu(lens))
        )
    good = chunks[bad_at]
    if kind == "shape":
        chunks[bad_at] = good._replace(v=good.v[..., :64])
    elif kind == "offsets":
        chunks[bad_at] = good._replace(cu_seqlens_k=_cu([good.k_nope.shape[0] + 1, 0]))
    elif kind == "overlap":
        chunks[bad_at] = good._replace(k_nope=case.out.view)._replace(
            k_pe=torch.randn(7, 1, 64, device=DEVICE), v=torch.randn(7, 2, 128, device=DEVICE), cu_seqlens_k=_cu([3, 4])
        )
    else:
        chunks[bad_at] = 3
    drawn = []

    def gen():
        for ch in chunks:
            drawn.append(1)
            yield ch

    arg = gen() if as_generator else chunks
    exc = TypeError if kind == "type" else ValueError
    # Offsets on a GPU are read (a sync) only with debug; on the CPU always.
    raises_naming(
        exc,
        lambda: rocm_mla.mla_prefill_with_context(
            q, kn, kpe, v, cq, cq, arg, sm_scale=0.1, out=case.out.view, lse=case.lse, debug=True
        ),
        f"context_chunks[{bad_at}]",
    )
    assert torch.isnan(case.out.view).all() and torch.isnan(case.lse).all(), "written before validation"
    case.check_guards()
    if as_generator:
        assert len(drawn) == bad_at + 1, "the generator was drawn past the bad chunk"


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
def test_prefill_with_context_generator_matches_list(backend):
    """The lazy path (running result in its own buffer, out/lse written by the last merge only)
    equals the sized path bit for bit (same merges in the same order); 0, 1 and 3 chunks."""
    case = PrefillCase(9, 9, 3, seed=4)
    q, kn, kpe, v = case.args
    cq = _cu([2, 7])
    g = _gen(5)
    chunks = []
    for lens in ([3, 0], [4, 6], [0, 2]):
        Tc = sum(lens)
        chunks.append(
            (
                torch.randn(Tc, 3, 128, generator=g).to(DEVICE),
                torch.randn(Tc, 1, 64, generator=g).to(DEVICE),
                torch.randn(Tc, 3, 128, generator=g).to(DEVICE),
                _cu(lens),
            )
        )
    for n in (0, 1, 3):
        o1, l1 = rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, cq, chunks[:n], sm_scale=0.1, backend=backend)
        rocm_mla.mla_prefill_with_context(
            q,
            kn,
            kpe,
            v,
            cq,
            cq,
            (c for c in chunks[:n]),
            sm_scale=0.1,
            out=case.out.view,
            lse=case.lse,
            backend=backend,
        )
        assert torch.equal(o1, case.out.view) and torch.equal(l1, case.lse)
    case.check_guards()


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
def test_prefill_zero_sizes(backend):
    """Tq = 0, Tk = 0, B = 0, with out/lse given or not; empty chunks; an empty generator."""
    for Tq, Tk, lq, lk in ((0, 0, [0, 0], [0, 0]), (5, 0, [2, 3], [0, 0]), (0, 4, [0, 0], [1, 3]), (3, 3, [], [])):
        for given in (True, False):
            case = PrefillCase(Tq, Tk, 2)
            cq, ck = _cu(lq), _cu(lk)
            kw = {"out": case.out.view, "lse": case.lse} if given else {}
            out, lse = rocm_mla.mla_prefill(*case.args, cq, ck, sm_scale=0.1, backend=backend, **kw)
            assert out.shape == (Tq, 2, 128) and lse.shape == (2, Tq)
            if lq:  # every row belongs to a sequence and sees no key when Tk = 0
                if Tk == 0 and Tq:
                    assert bool((out == 0).all()) and bool((lse == -math.inf).all())
            empty = ContextChunk(
                torch.empty(0, 2, 128, device=DEVICE),
                torch.empty(0, 1, 64, device=DEVICE),
                torch.empty(0, 2, 128, device=DEVICE),
                _cu([0] * len(lq)),
            )
            for chunks in ([empty, empty], (c for c in [empty]), iter(())):
                rocm_mla.mla_prefill_with_context(*case.args, cq, ck, chunks, sm_scale=0.1, backend=backend, **kw)
            case.check_guards()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("bad", list(BAD_OFFSETS))
def test_gpu_prefill_bad_offsets_stay_inside(causal, bad):
    """On a GPU, mla_prefill does not read cu_seqlens (no sync): the kernel's clamp keeps every
    access inside the tensors (compute-sanitizer memcheck); debug=True names the error."""
    for dtype in (torch.bfloat16, torch.float16):
        case = PrefillCase(13, 9, 16, dtype=dtype, seed=2)
        cq, ck = (torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in BAD_OFFSETS[bad])
        rocm_mla.mla_prefill(
            *case.args, cq, ck, sm_scale=0.1, causal=causal, out=case.out.view, lse=case.lse, backend="triton"
        )
        torch.cuda.synchronize()
        case.check_guards()
        with pytest.raises(ValueError, match="cu_seqlens"):
            rocm_mla.mla_prefill(*case.args, cq, ck, sm_scale=0.1, causal=causal, backend="triton", debug=True)
        with pytest.raises(ValueError, match="cu_seqlens"):
            rocm_mla.mla_prefill(*case.args, cq, ck, sm_scale=0.1, causal=causal, backend="reference")


@pytest.mark.gpu
def test_gpu_prefill_rows_zero_sizes_and_context():
    for backend in ("triton", "reference"):
        test_prefill_writes_only_the_rows_of_sequences(backend, True)
        test_prefill_zero_sizes(backend)
        test_prefill_with_context_generator_matches_list(backend)


# =============================================================================================
# context_gather (rocm_mla/ops/context_gather.py; vLLM's chunked-prefill context gather)
# =============================================================================================
from rocm_mla.ops import gather_context_chunk  # noqa: E402
from rocm_mla.reference import context_gather_ref  # noqa: E402

GATHER_BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP kernel


def _gather_case(bs=4, nb=6, seed=0, dtype=F32, fp8=None):
    """Two requests with 5 and 6 context rows in the chunk (starts 2 and 0), a guarded cache of
    fresh random values (guards reach two pages past each end), a guarded dst of finite random
    values (rows that must come out NaN have to be written NaN; good rows are compared exactly)."""
    g = _gen(seed)
    fill = torch.randn(nb, bs, 576, generator=g).to(fp8).to(DEVICE) if fp8 else "randn"
    cache = Guarded((nb, bs, 576), fp8 or dtype, fill=fill, guard=2 * bs * 576 + 64, generator=g)
    bt = torch.tensor([[3, 0, 5, 1], [2, 4, 1, 0]], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 5, 11], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    t2s = torch.tensor([0] * 5 + [1] * 6, dtype=torch.int32, device=DEVICE)
    dst = Guarded((11, 576), dtype, fill="randn", pad_last=8, generator=g)
    return cache, bt, cu, starts, t2s, dst


def _gather_want(cache, bt, cu, starts, t2s, scale=1.0):
    rows = []
    flat = cache.view.view(torch.uint8) if cache.view.element_size() == 1 else cache.view
    for t in range(t2s.shape[0]):
        s = int(t2s[t])
        pos = int(starts[s]) + t - int(cu[s])
        row = flat[int(bt[s, pos // cache.view.shape[1]]), pos % cache.view.shape[1]]
        rows.append(row.view(cache.view.dtype).float() * scale)
    return torch.stack(rows)


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn], ids=["cache=f32", "cache=fp8"])
def test_context_gather_bad_indices_nan_rows(backend, fp8):
    """A page outside the cache (-1, num_blocks, huge), a request outside the table and a
    position past the table row: that chunk row is NaN, nothing outside the tensors is read
    (a sentinel read would be finite) or written; other rows are gathered exactly."""
    cache, bt, cu, starts, t2s, dst = _gather_case(fp8=fp8)
    kw = {"k_scale": torch.tensor([0.5], device=DEVICE)} if fp8 else {}
    want = _gather_want(cache, bt, cu, starts, t2s, 0.5 if fp8 else 1.0)
    bt[0, 1] = -1  # request 0, positions 4..7 -> chunk rows 2..4
    bt[1, 1] = cache.view.shape[0]  # request 1, positions 4..7 -> chunk rows 9, 10
    t2s_bad = t2s.clone()
    t2s_bad[0] = 2  # a request past the table
    t2s_bad[5] = -1
    bad = torch.zeros(11, dtype=torch.bool)
    bad[[0, 2, 3, 4, 5, 9, 10]] = True
    gather_context_chunk(cache.view, bt, cu, starts, t2s_bad, dst.view, backend=backend, **kw)
    assert torch.isnan(dst.view[bad]).all(), "bad rows not NaN"
    torch.testing.assert_close(dst.view[~bad].float(), want[~bad], rtol=0, atol=0)
    ref = context_gather_ref(cache.view, bt, cu, starts, t2s_bad, 11, kw.get("k_scale"))
    assert torch.equal(torch.isnan(ref), torch.isnan(dst.view))
    # positions past the table row (starts too large) and huge pages
    dst2 = Guarded((11, 576), F32, fill="randn")
    bt2 = torch.tensor([[3, 0, 5, 1], [2, (1 << 31) - 1, 1, -(1 << 31)]], dtype=torch.int32, device=DEVICE)
    st2 = torch.tensor([14, 0], dtype=torch.int32, device=DEVICE)
    gather_context_chunk(cache.view, bt2, cu, st2, t2s, dst2.view, backend=backend, **kw)
    bad2 = torch.zeros(11, dtype=torch.bool)
    bad2[[2, 3, 4, 9, 10]] = True  # request 0 positions 16..18 (capacity 16); request 1 a huge page
    assert torch.isnan(dst2.view[bad2]).all()
    assert not torch.isnan(dst2.view[~bad2]).any()
    want2 = context_gather_ref(cache.view, bt2, cu, st2, t2s, 11, kw.get("k_scale"))
    torch.testing.assert_close(dst2.view, want2, rtol=0, atol=0, equal_nan=True)
    for x, name in ((cache, "kv_cache"), (dst, "dst"), (dst2, "dst")):
        x.check(name)
    assert torch.equal(cache.base, cache._snap), "kv_cache changed"


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("bs,nb", [(1, 30), (16, 3), (64, 1)])
def test_context_gather_every_bad_page_kind_per_block_size(backend, bs, nb):
    """Block sizes 1, 16, 64: each used table entry of request 1 replaced in turn by -1,
    num_blocks, num_blocks + 1, 2^31 - 1 and -2^31; request 1's rows on that page are NaN,
    request 0's rows exact, guards intact."""
    g = _gen(bs)
    cache = Guarded((nb, bs, 576), F32, guard=2 * bs * 576 + 64, generator=g)
    ctx = [min(nb * bs, 13), min(nb * bs, 7)]
    cols = -(-max(ctx) // bs)
    bt = torch.randint(0, nb, (2, cols), generator=g).int().to(DEVICE)
    cu = torch.tensor([0, ctx[0], sum(ctx)], dtype=torch.int32, device=DEVICE)
    starts = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    t2s = torch.tensor([0] * ctx[0] + [1] * ctx[1], dtype=torch.int32, device=DEVICE)
    want = _gather_want(cache, bt, cu, starts, t2s)
    for col in range(-(-ctx[1] // bs)):
        for page in (-1, nb, nb + 1, (1 << 31) - 1, -(1 << 31)):
            dst = Guarded((sum(ctx), 576), F32, fill="randn", pad_last=3)
            bad_bt = bt.clone()
            bad_bt[1, col] = page
            gather_context_chunk(cache.view, bad_bt, cu, starts, t2s, dst.view, backend=backend)
            rows = torch.arange(sum(ctx))
            pos = rows - ctx[0]
            bad = (pos >= 0) & (pos // bs == col)
            assert torch.isnan(dst.view[bad]).all(), (col, page)
            torch.testing.assert_close(dst.view[~bad], want[~bad], rtol=0, atol=0)
            dst.check("dst")
    cache.check("kv_cache")


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
def test_context_gather_zero_sizes(backend):
    """T = 0 (an empty chunk), an empty table (R = 0: every row's request is outside), an empty
    cache (every page outside): nothing read outside, rows NaN where there are rows."""
    cache, bt, cu, starts, t2s, _ = _gather_case()
    gather_context_chunk(cache.view, bt, cu, starts, t2s, torch.empty(0, 576, device=DEVICE), backend=backend)
    no_req = Guarded((4, 576), F32, fill="randn")
    gather_context_chunk(
        cache.view,
        torch.empty(0, 3, dtype=torch.int32, device=DEVICE),
        torch.zeros(1, dtype=torch.int32, device=DEVICE),
        torch.empty(0, dtype=torch.int32, device=DEVICE),
        torch.zeros(4, dtype=torch.int32, device=DEVICE),
        no_req.view,
        backend=backend,
    )
    assert torch.isnan(no_req.view).all()
    no_cache = Guarded((11, 576), F32, fill="randn")
    gather_context_chunk(torch.empty(0, 4, 576, device=DEVICE), bt, cu, starts, t2s, no_cache.view, backend=backend)
    assert torch.isnan(no_cache.view).all()
    for x, name in ((cache, "kv_cache"), (no_req, "dst"), (no_cache, "dst")):
        x.check(name)


def test_context_gather_overlap_and_shapes_named():
    cache, bt, cu, starts, t2s, dst = _gather_case()
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(cache.view, bt, cu, starts, t2s, cache.view.view(-1, 576)[:11]),
        "dst",
        "kv_cache",
    )
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(cache.view, bt, cu, starts, t2s[:5], dst.view),
        "token_to_seq",
        "11 rows",
    )
    raises_naming(
        ValueError, lambda: gather_context_chunk(cache.view, bt, cu[:2], starts, t2s, dst.view), "cu_seq_lens", "(3,)"
    )
    buf = torch.zeros(11 * 576 + 8, dtype=torch.int32, device=DEVICE)  # dst over the block table
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(
            cache.view, buf[:8].view(2, 4), cu, starts, t2s, buf.view(torch.float32)[: 11 * 576].view(11, 576)
        ),
        "dst",
        "block_table",
        "no memory in common",
    )
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(  # stride 0: two rows on one element
            cache.view, bt, cu, starts, t2s, torch.zeros(1, 576, device=DEVICE).expand(11, 576)
        ),
        "dst",
        "overlap",
    )
    cache.check("kv_cache")
    dst.check("dst")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, "fp8"], ids=str)
def test_gpu_context_gather_bad_indices(dtype):
    fp8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
    cache, bt, cu, starts, t2s, dst = _gather_case(bs=16, nb=9, dtype=torch.bfloat16)
    bt[1, 0] = -1
    bt[0, 0] = (1 << 31) - 1
    kw = {}
    if dtype == "fp8":
        cache = Guarded((9, 16, 576), fp8, fill=cache.view.float().to(fp8), guard=2 * 16 * 576 + 64)
        kw = {"k_scale": torch.ones(1, device=DEVICE)}
    gather_context_chunk(cache.view, bt, cu, starts, t2s, dst.view, backend="triton", **kw)
    torch.cuda.synchronize()
    assert torch.isnan(dst.view.float()).all()  # every row of both requests reads a bad first page
    cache.check("kv_cache")
    dst.check("dst")
    for backend in ("triton", "reference"):
        test_context_gather_every_bad_page_kind_per_block_size(backend, 16, 3)
        test_context_gather_zero_sizes(backend)


# =============================================================================================
# host checks stay sync-free and capturable (GPU)
# =============================================================================================
@pytest.mark.gpu
def test_gpu_checks_no_sync_and_capturable():
    """Every op with caller-given destinations (the overlap checks run) under torch's sync debug
    mode (raises on a synchronising call) and inside a CUDA graph capture, then replayed."""
    bf16 = torch.bfloat16
    rope = RopeCase(64, 16, 16, nb=8, dtype=bf16)
    merge_in = _merge_inputs(33, 8, 128, dtype=bf16)
    merge_out, merge_lse = torch.empty(33, 8, 128, dtype=bf16, device=DEVICE), torch.empty(8, 33, device=DEVICE)
    dec = DecodeCase((300, 70, 5), 16, 1, 64, dtype=bf16)
    pre = PrefillCase(40, 40, 16, dtype=bf16)
    cq = _cu([10, 30])
    ops = []
    for b in [x for x in ("hip", "triton") if x in backends()]:
        ops.append(lambda b=b: rope.run(b, False))
        ops.append(
            lambda b=b: rocm_mla.merge_attn_states(merge_out, *merge_in[:2], *merge_in[2:], merge_lse, backend=b)
        )
    ops.append(lambda: dec.run("triton", max_seq_len=300))
    ops.append(
        lambda: rocm_mla.mla_prefill(*pre.args, cq, cq, sm_scale=0.1, out=pre.out.view, lse=pre.lse, backend="triton")
    )
    gat = _gather_case(bs=16, nb=9, dtype=bf16)
    ops.append(lambda: gather_context_chunk(gat[0].view, *gat[1:5], gat[5].view, backend="triton"))
    for op in ops:
        op()  # compile / build outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for op in ops:
            op()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for op in ops:
            op()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for op in ops:
            op()
    g.replay()
    torch.cuda.synchronize()
    for x in (rope.q, rope.kv_a, rope.cache, dec.out, dec.lse, dec.kv, pre.out, pre.lse_t, gat[0], gat[5]):
        x.check()
