"""mla_decode on the GPU only: bf16 and fp8 at serving sizes, every block size, no host sync and
CUDA-graph capture, the default dispatch (V_SPLIT and the wide tiles: tests/decode/test_decode.py)."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE
from decode_case import make_case

from rocm_mla.cases import outside_untouched, poisoned


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("N,q_len", [(16, 1), (128, 1), (24, 2), (64, 3)])
def test_gpu_large(kv, N, q_len):
    lens = (4000, 17, 1500, 1) if q_len == 1 else (4000, 17, 1500, 3)
    case = make_case(lens, N, q_len, 64, torch.bfloat16, fp8=kv == "fp8", k_scale=0.25, seed=2, q_layout="separate")
    ks = torch.tensor(0.25, device=DEVICE) if kv == "fp8" else None
    out_base, out = poisoned((4 * q_len, N, 512), torch.bfloat16, DEVICE, token_pad=1)
    for splits in (None, 1, 16):
        out.fill_(float("nan"))
        o, lse = case.run(out=out, lse=None, k_scale=ks, num_splits=splits)
        case.check(o, lse)
        assert outside_untouched(out_base, out)


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [1, 16, 24, 32, 96, 128])
def test_gpu_block_sizes(block_size):
    case = make_case((700, 5, 129), 16, 1, block_size, torch.bfloat16, seed=4)
    case.check(*case.run(out=None, lse=None))


@pytest.mark.gpu
def test_gpu_no_host_sync_and_cuda_graph():
    """No synchronising call (torch's sync debug mode raises on one), and a captured graph
    replays with new q values in place."""
    case = make_case((900, 33, 4096, 70), 16, 1, 64, torch.bfloat16, q_layout="separate")
    out, lse = case.out, case.lse  # NaN-poisoned [4, 16, 512] bf16 and [4, 16] float32
    case.run(out=out, lse=lse, max_seq_len=4096)  # compile outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        case.run(out=out, lse=lse, max_seq_len=4096)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        case.run(out=out, lse=lse, max_seq_len=4096)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        case.run(out=out, lse=lse, max_seq_len=4096)
    case.q_nope.copy_(torch.randn_like(case.q_nope, dtype=torch.float32).to(torch.bfloat16))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    case.check(out, lse)


@pytest.mark.gpu
def test_gpu_default_dispatch_is_triton():
    from rocm_mla.ops._dispatch import select

    assert select("mla_decode", DEVICE) == "triton"
