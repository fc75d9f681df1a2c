"""mla_v4_attention on the GPU only: bf16 q over the self-check shapes, fp8_ds_mla caches of both kinds
in one call (window e4m3fnuz + compressed e4m3fn) at H 8 / 16 / 64 / 128 for every layer kind, a
prefill chunk, batch invariance across batches, no host sync and CUDA-graph capture."""

from __future__ import annotations

import math

import pytest
import torch
from _util import DEVICE
from v4_case import make_case

from rocm_mla.cases import outside_untouched
from rocm_mla.cases import v4_attention as v4

BF16 = torch.bfloat16
MIXED = dict(window_fp8="e4m3fnuz", compressed_fp8="e4m3fn")


def _fresh(case) -> None:
    case.out.fill_(math.nan)
    case.lse.fill_(math.nan)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", v4.SHAPES["selfcheck"], ids=lambda s: s.label(BF16))
def test_gpu_selfcheck_shapes(shape):
    """The plan's split count, one split, many, batch-invariant splits; every element written."""
    case = v4.make_inputs(shape, dtype=BF16, device=DEVICE, seed=1)
    for kw in ({}, {"num_splits": 1}, {"num_splits": 16}, {"batch_invariant": True}):
        _fresh(case)
        case.run(**kw)
        case.check()


@pytest.mark.gpu
@pytest.mark.parametrize("kind,kw", [("window", {}), ("csa", {"topk": 512}), ("csa", {"topk": 1024}), ("hca", {})],
                         ids=["window", "csa512", "csa1024", "hca"])  # fmt: skip
@pytest.mark.parametrize("H", [8, 16, 64, 128])
def test_gpu_fp8_kinds_and_heads(H, kind, kw):
    """Decode and MTP rows of requests whose contexts give CSA 2K-4K compressed rows and HCA 300-700,
    window cache e4m3fnuz and compressed e4m3fn, q a transposed buffer, out a token-padded view,
    -1 holes and repeats, the compressed lists ragged for HCA; nothing outside out written."""
    ratio = 128 if kind == "hca" else 4
    lens = tuple(n * ratio for n in ((700, 300, 520, 410) if kind == "hca" else (4000, 2100, 3300, 2600)))
    case = make_case(lens, (1, 2, 1, 4), H, kind, dtype=BF16, block=64, seed=H, holes=0.02, dups=0.02,
                     ragged="compressed" if kind == "hca" else False, **MIXED, **kw,
                     build=dict(q_layout="heads_major", out_layout="token_pad"))  # fmt: skip
    for splits in (None, 1, 8):
        _fresh(case)
        case.run(num_splits=splits)
        case.check()
        assert outside_untouched(case.out_base, case.out)


@pytest.mark.gpu
@pytest.mark.parametrize("H", [64, 128])
def test_gpu_prefill_chunk(H):
    """Prefill chunks: 1024 rows of one request after 3072 cached tokens and 512 rows of another
    after 988 (those see fewer than 512 compressed rows: -1 padded), CSA top-512; rows sampled
    from both checked."""
    case = make_case((4096, 1500), (1024, 512), H, "csa", topk=512, dtype=BF16, block=64, cblock=64, seed=3)
    o, lse = case.run(out=None, lse=None)
    ro, rl = case.reference()
    for sel in (slice(0, 128), slice(960, 1100), slice(1500, 1536)):
        case.check(o[sel], lse[sel], ref=(ro[sel], rl[sel]))


@pytest.mark.gpu
@pytest.mark.parametrize("H", [16, 128])
def test_gpu_batch_invariant(H):
    """batch_invariant=True: every row is bitwise the same alone, in the batch and in the batch
    reversed."""
    case = make_case((4000, 2500, 3000, 900), (1, 2, 1, 3), H, "csa", topk=512, dtype=BF16, block=64, cblock=64,
                     seed=7, **MIXED)  # fmt: skip
    o, lse = case.run(batch_invariant=True, out=None, lse=None)
    case.check(o, lse)
    a = case.args()
    names = dict(window_kv_cache_dtype=case.window.kv_cache_dtype,
                 compressed_kv_cache_dtype=case.compressed.kv_cache_dtype)  # fmt: skip

    def rows(sel):
        sel = torch.tensor(sel, device=DEVICE)
        return v4.call_v4(a[0][sel], a[1], a[2][sel], None, a[4], a[5][sel], None, a[7], a[8][sel], a[9],
                          sm_scale=case.sm_scale, batch_invariant=True, **names)  # fmt: skip

    T = case.shape.T
    for t in range(T):
        oa, la = rows([t])
        assert torch.equal(oa, o[t : t + 1]) and torch.equal(la, lse[t : t + 1]), t
    rev = list(range(T))[::-1]
    oa, la = rows(rev)
    assert torch.equal(oa, o[rev]) and torch.equal(la, lse[rev])


@pytest.mark.gpu
def test_gpu_no_host_sync_and_cuda_graph():
    """No synchronising call; a captured graph replays with new q values and new lists (the
    compressed lists reversed, windows with holes), one split and several."""
    for splits in (1, 4):
        case = make_case((3000, 900, 5000), (1, 2, 1), 16, "csa", topk=512, dtype=BF16, block=64, cblock=64,
                         seed=splits, **MIXED)  # fmt: skip
        plan = case.plan(num_splits=splits)
        ws = torch.empty(plan.workspace_numel, device=DEVICE)
        case.run(plan=plan, workspace=ws)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            case.run(plan=plan, workspace=ws)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            case.run(plan=plan, workspace=ws)
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            case.run(plan=plan, workspace=ws)
        case.q.copy_(torch.randn(case.q.shape, device=DEVICE).to(BF16) * v4.Q_STD)
        c = case.compressed_indices()
        c.copy_(c.flip(1))
        w = case.window_indices()
        w[:, ::7] = -1
        _fresh(case)
        g.replay()
        torch.cuda.synchronize()
        case.check()
