"""mla_prefill and mla_prefill_with_context with batch_invariant=True: a sequence's out and lse are
bitwise the same alone and inside shuffled batches of other sequences (other lengths, other
positions, other context chunkings); and the NaN-reach contract (docs/bad-input.md): a NaN in q
reaches its own row and head, a NaN in K the rows of its sequence that see that key, a NaN in V
rows of its sequence (those that see the key, and others of the same key tile), never another
sequence.

A pool of sequences is built once (rocm_mla.cases.prefill); a batch is some of its sequences in
some order, their rows concatenated into fresh tensors.
"""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE
from prefill_case import KERNEL_BACKENDS, case

from rocm_mla._platform import device_arch
from rocm_mla.cases.prefill import call_prefill, call_prefill_with_context
from rocm_mla.ops import plan_prefill_with_context_for
from rocm_mla.ops.prefill_context import ContextChunk
from rocm_mla.ops.prefill_plan import launch_config

LENS = (20, 7, 1, 33, 0)  # causal self-attention, lq == lk per sequence
N = 3
pytestmark = pytest.mark.skipif(not KERNEL_BACKENDS, reason="Triton unavailable")


def _rows(lens, i):
    a = sum(lens[:i])
    return a, a + lens[i]


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def _take(pool, idx):
    """(q, k_nope, k_pe, v) of the pool's sequences ``idx`` in that order, fresh tensors."""
    parts = [[], [], [], []]
    for i in idx:
        a, b = _rows(LENS, i)
        for p, t in zip(parts, pool.args()[:4], strict=True):
            p.append(t[a:b])
    return [torch.cat(p).clone() for p in parts]


def _same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _prefill(tensors, lens, **kw):
    cu = _cu(lens)
    return call_prefill(*tensors, cu, cu, sm_scale=0.125, batch_invariant=True, **kw)


BATCHES = ([2, 0, 3], [3, 1, 4, 0, 2], [0, 0, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_sequence_alone_equals_in_batches(dtype):
    pool = case(LENS, LENS, N, dtype, seed=11)
    for target in (0, 3):
        ref_o, ref_l = _prefill(_take(pool, [target]), [LENS[target]])
        for idx in BATCHES:
            if target not in idx:
                continue
            lens = [LENS[i] for i in idx]
            o, lse = _prefill(_take(pool, idx), lens)
            a, b = _rows(lens, idx.index(target))
            assert _same_bits(o[a:b], ref_o) and _same_bits(lse[:, a:b], ref_l), f"sequence {target} in {idx}"


def _context(gen, n, dtype):
    """Random cached-context keys of one sequence: (k_nope [n, N, 128], k_pe [n, 1, 64], v [n, N, 128])."""
    return (
        torch.randn(n, N, 128, generator=gen).to(dtype),
        torch.randn(n, 1, 64, generator=gen).to(dtype),
        torch.randn(n, N, 128, generator=gen).to(dtype),
    )


def _chunks(ctx, idx, cuts):
    """Context chunks for the batch ``idx``: ``cuts[i]`` = the chunk boundaries of sequence i's
    context (sequence i's keys of chunk c: its rows cuts[i][c]:cuts[i][c + 1])."""
    n_chunks = max(len(cuts[i]) - 1 for i in idx)
    chunks = []
    for c in range(n_chunks):
        parts, lens = [[], [], []], []
        for i in idx:
            cs = cuts[i]
            a, b = (cs[c], cs[c + 1]) if c + 1 < len(cs) else (cs[-1], cs[-1])
            for p, t in zip(parts, ctx[i], strict=True):
                p.append(t[a:b])
            lens.append(b - a)
        chunks.append(ContextChunk(*(torch.cat(p).to(DEVICE) for p in parts), _cu(lens)))
    return chunks


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_with_context_other_chunkings(dtype):
    """The target's own context cut the same way ([0, 10, 25], or with an empty chunk between);
    the other sequences' contexts cut differently from batch to batch."""
    pool = case(LENS, LENS, N, dtype, seed=12)
    g = torch.Generator().manual_seed(3)
    ctx_len = {0: 25, 1: 40, 2: 3, 3: 17, 4: 0}
    ctx = {i: _context(g, n, dtype) for i, n in ctx_len.items()}

    def run(idx, cuts):
        lens = [LENS[i] for i in idx]
        cu = _cu(lens)
        return call_prefill_with_context(
            *_take(pool, idx), cu, cu, _chunks(ctx, idx, cuts), sm_scale=0.125, batch_invariant=True
        )

    ref_o, ref_l = run([0], {0: [0, 10, 25]})
    for idx, cuts in (
        ([1, 0, 3], {0: [0, 10, 25], 1: [0, 40], 3: [0, 5, 9, 17]}),
        ([2, 4, 0, 1], {0: [0, 10, 25], 1: [0, 20, 21, 40], 2: [0, 3], 4: [0]}),
        ([3, 0], {0: [0, 10, 10, 25], 3: [0, 1, 2, 17]}),  # an empty chunk of the target's
    ):
        o, lse = run(idx, cuts)
        a, b = _rows([LENS[i] for i in idx], idx.index(0))
        assert _same_bits(o[a:b], ref_o) and _same_bits(lse[:, a:b], ref_l), f"sequence 0 in {idx} {cuts}"


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_prefill_nan_reach(where):
    """A NaN in sequence 3 (key / query 12 of 33, head 1): the rows the contract names get it, the
    other sequences keep their bits (and sequence 3's rows before the key, for a NaN in K)."""
    pool = case(LENS, LENS, N, torch.float32, seed=13)
    idx = [0, 3, 1]
    lens = [LENS[i] for i in idx]
    clean = _prefill(_take(pool, idx), lens)
    t = _take(pool, idx)
    a, b = _rows(lens, 1)
    j = a + 12
    if where == "q":
        t[0][j, 1, 5] = float("nan")
    elif where == "k":
        t[1][j, 1, 5] = float("nan")
    else:
        t[3][j, 1, 5] = float("nan")
    o, lse = _prefill(t, lens)
    nan_rows = torch.isnan(o).any(dim=2)  # [Tq, N]
    outside = torch.ones(sum(lens), dtype=torch.bool)
    outside[a:b] = False
    assert _same_bits(o[outside], clean[0][outside]) and _same_bits(lse[:, outside], clean[1][:, outside])
    assert not nan_rows[:, [0, 2]].any(), "a NaN in head 1 reached another head"
    if where == "q":
        assert nan_rows[j, 1] and nan_rows[:, 1].sum() == 1
    else:
        assert nan_rows[j:b, 1].all(), "rows that see the key must be NaN"
        if where == "k":
            assert not nan_rows[a:j, 1].any(), "a NaN in K reached a row that does not see its key"
            assert _same_bits(o[a:j], clean[0][a:j])


def test_bad_keyword():
    pool = case((3,), (3,), 1, torch.float32)
    with pytest.raises(TypeError, match="batch_invariant: expected a bool"):
        pool.run(batch_invariant="yes")
    with pytest.raises(TypeError, match="batch_invariant: expected a bool"):
        call_prefill_with_context(*pool.args(), (), sm_scale=0.1, batch_invariant=None)
    with pytest.raises(TypeError, match="mla_prefill_with_context: batch_invariant: expected a bool"):
        plan_prefill_with_context_for(*pool.args(), batch_invariant=None)


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, "host"])
def test_gpu_prefill_bf16_alone_equals_in_batches(tma):
    """bf16 on the GPU, with and without host TMA descriptors."""
    lens = (1000, 17, 4096, 1, 333)
    pool = case(lens, lens, 16, torch.bfloat16, seed=14)
    cfg = dict(launch_config(device_arch(DEVICE), torch.bfloat16), tma=tma)

    def take(idx):
        out = []
        for t in pool.args()[:4]:
            out.append(torch.cat([t[sum(lens[:i]) : sum(lens[: i + 1])] for i in idx]).clone())
        return out

    def run(idx):
        cu = _cu([lens[i] for i in idx])
        return call_prefill(*take(idx), cu, cu, sm_scale=0.1, batch_invariant=True, config=cfg)

    ref = run([2])
    for idx in ([0, 2], [4, 3, 2, 1, 0], [2, 2]):
        o, lse = run(idx)
        a = sum(lens[i] for i in idx[: idx.index(2)])
        assert _same_bits(o[a : a + lens[2]], ref[0]) and _same_bits(lse[:, a : a + lens[2]], ref[1])
