"""merge_attn_states(batch_invariant=True): a (token, head) row's output and lse are bitwise the
same merged alone and inside a batch of other rows (other T, other layouts), on every backend; and
the NaN-reach contract (docs/bad-input.md): a NaN in one side of a row reaches that row only."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, DTYPES, backends

import rocm_mla
from rocm_mla.cases import merge as cases
from rocm_mla.cases.merge import MergeShape

BACKENDS = backends()


def _same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _merge_rows(c, rows, backend):
    """Merge the rows ``rows`` of case c (in that order) into fresh contiguous buffers."""
    idx = torch.tensor(rows, device=DEVICE)
    po, so = c.prefix_output.index_select(0, idx), c.suffix_output.index_select(0, idx)
    pl, sl = c.prefix_lse.index_select(1, idx), c.suffix_lse.index_select(1, idx)
    out = torch.full_like(po, float("nan"))
    lse = torch.full_like(pl, float("nan"))
    rocm_mla.merge_attn_states(out, po, pl, so, sl, lse, backend=backend, batch_invariant=True)
    return out, lse


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_alone_equals_row_in_batches(backend, dtype):
    c = cases.make_inputs(MergeShape(T=37, N=5, D=72, layout="strided"), dtype=dtype, device=DEVICE, seed=2)
    c.run(backend=backend, batch_invariant=True)  # the whole batch, its own strided layout
    c.check()
    for t in (0, 17, 36):
        alone_o, alone_l = _merge_rows(c, [t], backend)
        assert _same_bits(c.output[t : t + 1], alone_o) and _same_bits(c.output_lse[:, t : t + 1], alone_l)
        mixed = [30, t, 3, 8]
        o, lse = _merge_rows(c, mixed, backend)
        assert _same_bits(o[1:2], alone_o) and _same_bits(lse[:, 1:2], alone_l)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("side", ["prefix_output", "suffix_output", "prefix_lse"])
def test_nan_reaches_its_row_only(backend, side):
    c = cases.make_inputs(MergeShape(T=9, N=3, D=16, layout="strided"), dtype=torch.float32, device=DEVICE, seed=3)
    c.run(backend=backend)
    clean_o, clean_l = c.output.clone(), c.output_lse.clone()
    if side == "prefix_lse":
        c.prefix_lse[1, 4] = float("nan")
    else:
        getattr(c, side)[4, 1, 7] = float("nan")
        # the NaN side must carry weight for the contract to bite: make it the heavier one
        (c.prefix_lse if side == "prefix_output" else c.suffix_lse)[1, 4] = 50.0
    c.run(backend=backend)
    nan_rows = torch.isnan(c.output).any(dim=2)
    assert nan_rows[4, 1] and nan_rows.sum() == 1
    keep = torch.ones(9, 3, dtype=torch.bool)
    keep[4, 1] = False
    assert _same_bits(c.output[keep], clean_o[keep])
    assert torch.equal(c.output_lse.T[keep], clean_l.T[keep])


def test_bad_keyword():
    c = cases.make_inputs(MergeShape(T=2, N=1, D=8), dtype=torch.float32, device=DEVICE)
    with pytest.raises(TypeError, match="merge_attn_states: batch_invariant: expected a bool"):
        c.run(batch_invariant=0)
