"""mla_sparse_attention on the GPU only: bf16 and fp8 caches at serving sizes (K = 2048), every tier
and block size, decode / MTP / prefill rows, batch invariance across batches, CUDA-graph capture."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE
from sparse_case import make_case

from rocm_mla.cases import outside_untouched, sparse


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("N,rows", [(8, 1), (16, 1), (16, 2), (32, 1), (64, 2), (128, 1)])
def test_gpu_serving_sizes(kv, N, rows):
    """K = 2048 over contexts longer and shorter than K (-1 padded lists), the plan's split count,
    one split and many, batch-invariant splits; every element written, nothing outside out."""
    case = make_case((5000, 1200, 3000, 2100), rows, N=N, K=2048, block=64, dtype=torch.bfloat16, kv=kv,
                     k_scale=0.25, q_layout="vllm", out_layout="token_pad", holes=0.02, dups=0.02, seed=N)  # fmt: skip
    for kw in ({}, {"num_splits": 1}, {"num_splits": 16}, {"batch_invariant": True}):
        case.out.fill_(float("nan"))
        case.lse.fill_(float("nan"))
        case.run(**kw)
        case.check()
        assert outside_untouched(case.out_base, case.out)


@pytest.mark.gpu
@pytest.mark.parametrize("block", [1, 16, 24, 64])
@pytest.mark.parametrize("mode", ["paged", "slots"])
def test_gpu_block_sizes(block, mode):
    case = make_case((700, 5, 1300), (2, 1, 1), N=16, K=512, block=block, dtype=torch.bfloat16, mode=mode, seed=block)
    case.run()
    case.check()


@pytest.mark.gpu
@pytest.mark.parametrize("N", [16, 128])
def test_gpu_prefill_rows(N):
    """A prefill chunk: 300 rows of one request after 2000 cached tokens, lists full (K = 2048 of
    up to 2300 visible keys) and early rows of a second request's first chunk (-1 padded)."""
    case = make_case((2300, 400), (300, 400), N=N, K=2048, block=64, dtype=torch.bfloat16, q_layout="vllm")
    case.run()
    case.check(rows=None)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("N", [8, 16, 128])
def test_gpu_batch_invariant(kv, N):
    """batch_invariant=True: every row of a batch is bitwise the same as in batches of 1 and 5 rows
    and in the batch reversed (its request rows permuted with it)."""
    case = make_case((4000, 2500, 3000, 900, 2200), (1, 2, 1, 1, 3), N=N, K=2048, block=64,
                     dtype=torch.bfloat16, kv=kv, k_scale=0.25, seed=7)  # fmt: skip
    o, lse = case.run(batch_invariant=True, out=None, lse=None)
    case.check(o, lse)
    args = case.args()
    T = case.shape.T

    def rows(sel):
        sel = torch.tensor(sel, device=DEVICE)
        return sparse.call_sparse(
            args[0][sel], args[1][sel], args[2], args[3][sel], args[4], args[5][sel], sm_scale=case.sm_scale,
            k_scale=case.k_scale, kv_cache_dtype=case.kv_cache_dtype, batch_invariant=True,
        )  # fmt: skip

    for sel in ([t] for t in range(T)):
        oa, la = rows(sel)
        assert torch.equal(oa, o[sel]) and torch.equal(la, lse[sel]), sel
    rev = list(range(T))[::-1]
    oa, la = rows(rev)
    assert torch.equal(oa, o[rev]) and torch.equal(la, lse[rev])
    oa, la = rows([0, 3, 4, 6, 7])
    assert torch.equal(oa, o[[0, 3, 4, 6, 7]])


@pytest.mark.gpu
def test_gpu_no_host_sync_and_cuda_graph():
    """No synchronising call, and a captured graph replays with new q values and new lists."""
    case = make_case((3000, 900, 5000), (1, 2, 1), N=16, K=2048, block=64, dtype=torch.bfloat16, q_layout="separate")
    plan = case.plan()
    case.run(plan=plan)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        case.run(plan=plan)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        case.run(plan=plan)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        case.run(plan=plan)
    case.q_nope.copy_(torch.randn_like(case.q_nope, dtype=torch.float32).to(torch.bfloat16))
    case.positions.copy_(case.positions.flip(1))
    case.out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    case.check()


@pytest.mark.gpu
def test_gpu_default_dispatch_is_triton():
    from rocm_mla.ops._dispatch import select

    assert select("mla_sparse_attention", DEVICE) == "triton"
    assert sparse.TOLERANCE[torch.bfloat16]["out"].norm is not None
