"""mla_prefill on the GPU only: bf16/fp16/fp32 at serving sizes with the arch's config, strided
bf16 with poisoned outputs, the TMA candidates, int64 addressing, no host sync."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE
from prefill_case import case

import rocm_mla
from rocm_mla.cases import outside_untouched, poisoned
from rocm_mla.cases.prefill import V
from rocm_mla.ops import mla_prefill_with_context, plan_prefill_with_context_for

# ---------------------------------------------------------------- GPU only (bf16, serving sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("N", [1, 16, 128])
def test_gpu_varlen(dtype, causal, N):
    lq = [700, 1, 0, 1500, 129]
    lk = [700, 64, 9, 1500, 300]
    c = case(lq, lk, N, dtype, causal=causal)
    out, lse = c.run(backend="triton", out=None, lse=None)
    c.check(out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("N", [16, 128])
@pytest.mark.parametrize("kpe_layout", ["latent", "expand"])
def test_gpu_strided_bf16_poisoned(N, kpe_layout):
    lq, lk = [1000, 37, 2048], [1000, 500, 2048]
    Tq = sum(lq)
    c = case(lq, lk, N, torch.bfloat16, kpe_layout=kpe_layout, lse_layout="transposed")
    out_base, out_rows = poisoned((Tq, N * V), torch.bfloat16, DEVICE, pad_last=64)  # the layer's out, padded rows
    out = out_rows.view(Tq, N, V)
    c.run(backend="triton", out=out)
    c.check(out)
    assert outside_untouched(out_base, out) and outside_untouched(c.lse_base, c.lse)


def _sm90_tma_candidates():
    from rocm_mla.configs import config_for

    return [c for c in config_for("mla_prefill", "sm90").get("candidates", []) if c.get("tma")]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg", _sm90_tma_candidates(), ids=lambda c: f"M{c['BLOCK_M']}N{c['BLOCK_N']}s{c['num_stages']}"
)
def test_gpu_tma_candidates_bf16(cfg):
    """The sm90 "tma" candidates `rocm-mla tune` times: bf16 varlen (ragged ends, lq != lk, an empty
    sequence), N=16 and N=128 heads, key rows after the last sequence poisoned with NaN (TMA's
    zero fill must keep them out), out into a strided view, checked against the float32 reference."""
    from rocm_mla import _platform
    from rocm_mla.ops.prefill_plan import _tma_arch

    if not _tma_arch(_platform.device_arch(torch.device(DEVICE))):
        pytest.skip("TMA descriptors need an NVIDIA sm90+ GPU")
    for N in (16, 128):
        lq, lk = [700, 1, 0, 1029, 129], [700, 64, 9, 1100, 300]
        c = case(lq, lk, N, torch.bfloat16, key_tail=40)  # 40 NaN key rows after the last sequence
        Tq = sum(lq)
        out_base, out_rows = poisoned((Tq, N * V), torch.bfloat16, DEVICE, pad_last=64)
        out = out_rows.view(Tq, N, V)
        _, lse = c.run(out=out, lse=None, backend="triton", config=cfg)
        c.check(out, lse)
        assert outside_untouched(out_base, out)


@pytest.mark.gpu
def test_gpu_int64_addressing():
    """A sequence whose last key row sits past 2^31 elements of k_nope/v (N=128, 256 wide rows)."""
    N, lq, lk = 128, [16, 16], [1000, 69000]
    c = case(lq, lk, N, torch.bfloat16, causal=False)
    assert (sum(lk) - 1) * c.k_nope.stride(0) > 2**31
    out, lse = c.run(backend="triton", out=None, lse=None)
    c.check(out, lse)


@pytest.mark.gpu
def test_gpu_no_host_sync():
    """The Triton path must not read cu_seqlens on the host (a sync would serialise the stream)."""
    c = case([300, 200], [300, 250], 16, torch.bfloat16)
    q, kn, kpe, v, cq, ck = c.args()
    sm_scale = c.sm_scale
    plan = rocm_mla.plan_prefill_for(q, kn, kpe, v, cq, ck, backend="triton")
    rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=sm_scale, plan=plan)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rocm_mla.mla_prefill(q, kn, kpe, v, cq, ck, sm_scale=sm_scale, plan=plan)
        ctx_plan = plan_prefill_with_context_for(q, kn, kpe, v, cq, cq, backend="triton")  # planning reads nothing
        mla_prefill_with_context(q, kn, kpe, v, cq, cq, [(kn, kpe, v, ck)], sm_scale=sm_scale, plan=ctx_plan)
    finally:
        torch.cuda.set_sync_debug_mode("default")
