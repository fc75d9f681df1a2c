"""rocm_mla.cases.sparse: the lists an indexer's top-k gives (distinct visible positions, -1 padded),
holes and repeats, the slot form, the counts benches divide by, and the check."""

from __future__ import annotations

import pytest
import torch

from rocm_mla.cases import CaseMismatch, sparse

F32 = torch.float32


def test_lists_are_distinct_visible_positions_padded_with_minus_one():
    s = sparse.SparseShape((40, 90, 5), (3, 2, 1), N=4, K=48, block=16)
    c = sparse.make_inputs(s, dtype=F32, seed=1)
    assert c.positions.shape == (6, 48) and c.positions.dtype == torch.int32
    t = 0
    for n, r in zip(s.lens, s.rows):
        for i in range(r):
            row = c.positions[t]
            vis = n - r + 1 + i  # keys row i of the request sees
            named = row[row >= 0]
            assert len(set(named.tolist())) == len(named) == min(vis, 48)  # distinct, as many as fit
            assert int(named.max()) < vis and bool((row[len(named) :] == -1).all())
            assert int(c.req_ids[t]) == s.lens.index(n)
            t += 1
    assert s.entries() == int((c.positions >= 0).sum())
    assert c.req_ids.shape[0] == s.T + 3  # vLLM pads it


def test_holes_and_repeats():
    s = sparse.SparseShape((500,), 4, N=2, K=256, block=16)
    c = sparse.make_inputs(s, dtype=F32, holes=0.2, dups=0.2, seed=2)
    holes = int((c.positions == -1).sum())
    assert 0.1 * 4 * 256 < holes < 0.3 * 4 * 256
    repeats = sum(len(r[r >= 0]) - len(set(r[r >= 0].tolist())) for r in c.positions)
    assert repeats > 0.1 * 4 * 256 * 0.5


def test_slot_mode_names_the_same_rows():
    """The slot lists of each cache copy name the rows the positions name through that copy's table."""
    s = sparse.SparseShape((70, 33), (2, 1), N=4, K=24, block=16, mode="slots")
    c = sparse.make_inputs(s, dtype=F32, copies=2, seed=3)
    for i in range(2):
        slots, pos, bt = c.topk_indices(i), c.positions, c.paged.tables[i]
        assert slots.dtype == torch.int32 and torch.equal(slots < 0, pos < 0)
        for t in range(s.T):
            for j in range(s.K):
                p = int(pos[t, j])
                if p >= 0:
                    assert int(slots[t, j]) == int(bt[int(c.req_ids[t]), p // 16]) * 16 + p % 16
    assert c.args(0)[4] is None and c.args(0)[5] is None


def test_counts_and_labels():
    d = sparse.SparseShape.decode(128, 8192, 16)
    assert d.T == 128 and d.entries() == 128 * 2048
    assert d.nbytes(torch.bfloat16) == 128 * 2048 * 576 * 2 + 128 * 2048 * 4 + 128 * 16 * (576 + 512) * 2
    assert d.flops() == 2 * 16 * 128 * 2048 * (576 + 512)
    assert d.label() == "bf16 B=128 ctx=8192 N=16 K=2048"
    assert sparse.SparseShape.decode(64, 8192, 128, 2, kv="fp8").label() == "fp8 B=64 ctx=8192 N=128 K=2048 q2"
    assert sparse.SparseShape((16384,), 8192, 16).label() == "bf16 B=1 ctx=16384 N=16 K=2048 T=8192"
    with pytest.raises(ValueError, match="more query rows than keys"):
        sparse.SparseShape((4,), 5)
    with pytest.raises(ValueError, match="mode"):
        sparse.SparseShape((4,), 1, mode="x")


def test_check_passes_the_reference_and_fails_a_broken_result():
    c = sparse.make_inputs(sparse.SHAPES["selfcheck"][0], dtype=F32, seed=4)
    ro, rl = c.reference()
    c.out.copy_(ro)
    c.lse.copy_(rl)
    c.check()
    c.out[1, 2, 3] += 1.0
    with pytest.raises(CaseMismatch, match="out"):
        c.check()
    c.out.copy_(ro)
    c.lse[0, 0] = float("nan")
    with pytest.raises(CaseMismatch, match="NaN"):
        c.check()
