"""mla_prefill on the GPU only: bf16/fp16/fp32 at serving sizes with the arch's config, strided
bf16 with poisoned outputs, the TMA candidates, int64 addressing, no host sync."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, outside_untouched, poisoned_view
from prefill_case import (
    SCALE,
    V,
    assert_matches,
    cu,
    make_inputs,
)

import rocm_mla
from rocm_mla.reference import mla_prefill_ref

# ---------------------------------------------------------------- GPU only (bf16, serving sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("N", [1, 16, 128])
def test_gpu_varlen(dtype, causal, N):
    lq = [700, 1, 0, 1500, 129]
    lk = [700, 64, 9, 1500, 300]
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, N, dtype)
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, causal=causal, backend="triton")
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, causal)
    assert_matches(out, lse, ref, ref_lse, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("N", [16, 128])
@pytest.mark.parametrize("kpe_layout", ["latent", "expand"])
def test_gpu_strided_bf16_poisoned(N, kpe_layout):
    lq, lk = [1000, 37, 2048], [1000, 500, 2048]
    Tq = sum(lq)
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, N, torch.bfloat16, kpe_layout=kpe_layout)
    out_base = torch.full((Tq, N * V + 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    out = out_base[:, : N * V].view(Tq, N, V)
    lse_base, lse = poisoned_view((N, Tq), torch.float32, transpose01=True)
    rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, out=out, lse=lse, backend="triton")
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, True)
    assert_matches(out, lse, ref, ref_lse, torch.bfloat16)
    assert outside_untouched(out_base, out) and outside_untouched(lse_base, lse)


def _sm90_tma_candidates():
    from rocm_mla.configs import config_for

    return [c for c in config_for("mla_prefill", "sm90").get("candidates", []) if c.get("tma")]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg", _sm90_tma_candidates(), ids=lambda c: f"M{c['BLOCK_M']}N{c['BLOCK_N']}s{c['num_stages']}"
)
def test_gpu_tma_candidates_bf16(cfg):
    """The sm90 "tma" candidates --tune will time: bf16 varlen (ragged ends, lq != lk, an empty
    sequence), N=16 and N=128 heads, key rows after the last sequence poisoned with NaN (TMA's
    zero fill must keep them out), out into a strided view, checked against the float32 reference."""
    from rocm_mla import _platform
    from rocm_mla.ops.prefill import _tma_arch

    if not _tma_arch(_platform.device_arch(torch.device(DEVICE))):
        pytest.skip("TMA descriptors need an NVIDIA sm90+ GPU")
    for N in (16, 128):
        lq, lk = [700, 1, 0, 1029, 129], [700, 64, 9, 1100, 300]
        q, kn, kpe, v, cq, ck = make_inputs(lq, [*lk[:-1], lk[-1] + 40], N, torch.bfloat16)
        ck = cu(lk)
        for x in (kn, kpe, v):
            x[sum(lk) :] = float("nan")
        Tq = sum(lq)
        out_base = torch.full((Tq, N * V + 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        out = out_base[:, : N * V].view(Tq, N, V)
        _, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, out=out, backend="triton", config=cfg)
        ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, True)
        assert_matches(out, lse, ref, ref_lse, torch.bfloat16)
        assert outside_untouched(out_base, out)


@pytest.mark.gpu
def test_gpu_int64_addressing():
    """A sequence whose last key row sits past 2^31 elements of k_nope/v (N=128, 256 wide rows)."""
    N, lq, lk = 128, [16, 16], [1000, 69000]
    q, kn, kpe, v, cq, ck = make_inputs(lq, lk, N, torch.bfloat16)
    assert (sum(lk) - 1) * kn.stride(0) > 2**31
    out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, causal=False, backend="triton")
    ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cq, ck, SCALE, False)
    assert_matches(out, lse, ref, ref_lse, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_no_host_sync():
    """The Triton path must not read cu_seqlens on the host (a sync would serialise the stream)."""
    q, kn, kpe, v, cq, ck = make_inputs([300, 200], [300, 250], 16, torch.bfloat16)
    rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, backend="triton")  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=SCALE, backend="triton")
        rocm_mla.mla_prefill_with_context(q, kn, kpe, v, cq, cq, [(kn, kpe, v, ck)], sm_scale=SCALE, backend="triton")
    finally:
        torch.cuda.set_sync_debug_mode("default")
