"""NaN is not "no key": a NaN in k, q or v reaches exactly the rows that see it, in one shot and
through the chunked-context merge (either side poisoned)."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, DTYPES
from prefill_case import KERNEL_BACKENDS, case

from rocm_mla.cases import compare, first_problem, prefill, raise_on

# ---------------------------------------------------------------- NaN is not "no key"


def _seq_rows_seeing(lq, lk, b, key, causal=True):
    """Global q rows of sequence b that see its key ``key`` (bottom-right causal)."""
    q0 = sum(lq[:b])
    return [q0 + i for i in range(lq[b]) if not causal or key <= i + lk[b] - lq[b]]


def _assert_nan_exactly(x, rows, what):
    """x [Tq, ...] (rows first): NaN in every element of ``rows`` and in no other row."""
    nan_rows = torch.isnan(x.float()).reshape(x.shape[0], -1)
    want = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    want[rows] = True
    assert bool(nan_rows[want].all()), f"{what}: a row that sees the NaN is not NaN"
    assert not bool(nan_rows[~want].any()), f"{what}: NaN reached a row that does not see it"


@pytest.mark.parametrize("backend", [*KERNEL_BACKENDS, "reference"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_nan_in_k_reaches_exactly_the_rows_that_see_it(backend, dtype, causal):
    """A NaN in k_nope (or k_pe) of one key: the rows that see that key get NaN out and NaN lse
    (not 0 / -inf, which merge would read as "saw no key"); every other row is unaffected."""
    lq, lk, N = [37, 21, 5], [37, 40, 5], 3
    for which, b, key in (("k_nope", 0, 29), ("k_pe", 1, 3)):
        c = case(lq, lk, N, dtype, causal=causal, out_layout="contiguous")
        row = sum(lk[:b]) + key
        if which == "k_nope":
            c.k_nope[row, 1, 7] = float("nan")  # one head
            heads = [1]
        else:
            c.k_pe[row, 0, 5] = float("nan")  # the rope head is shared: every head
            heads = list(range(N))
        out, lse = c.run(backend=backend)
        hit = _seq_rows_seeing(lq, lk, b, key, causal)
        assert hit, "the case must have rows that see the key"
        for h in range(N):
            rows = hit if h in heads else []
            _assert_nan_exactly(out[:, h], rows, f"{which} out head {h}")
            _assert_nan_exactly(lse[h], rows, f"{which} lse head {h}")
        # NaN exactly where the reference has it (out and lse), every other element within the bound
        c.check()


@pytest.mark.parametrize("backend", [*KERNEL_BACKENDS, "reference"])
def test_nan_in_q_or_v_reaches_the_rows_that_see_it(backend):
    """NaN in one q row: that row's out and lse are NaN, nothing else. NaN in one v row: every
    row that sees it is NaN (lse stays finite); rows outside the key's diagonal q tile (BLOCK_M
    32 here) that do not see it are unaffected and equal to the reference."""
    lq, lk, N = [70, 9], [70, 9], 2
    cfg = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    kw = dict(backend=backend, config=cfg if backend == "triton" else None)
    c = case(lq, lk, N, torch.float32, seed=1)
    c.q[40, 0, 150] = float("nan")
    out, lse = c.run(**kw)
    _assert_nan_exactly(out[:, 0], [40], "q: out")
    _assert_nan_exactly(lse[0], [40], "q: lse")
    assert not torch.isnan(out[:, 1]).any() and not torch.isnan(lse[1]).any()

    c = case(lq, lk, N, torch.float32, seed=2)
    key = 50  # sequence 0 (rows 0..69): rows 50..69 see it; the kernel's q tiles: 0..31, 32..63, 64..69
    c.v[key, 1, 3] = float("nan")
    out, lse = c.run(**kw)
    ref, ref_lse = c.reference()
    assert bool(torch.isnan(out[50:70, 1, 3]).all()) and bool(torch.isnan(ref[50:70, 1, 3]).all())
    assert not torch.isnan(lse).any() and not torch.isnan(ref_lse).any()
    _assert_nan_exactly(ref[:, 1, 3], list(range(50, 70)), "reference: v")
    other = torch.ones(sum(lq), dtype=torch.bool, device=DEVICE)
    other[32:70] = False  # the key's diagonal tile (rows 32..63) and the rows that see it
    assert not torch.isnan(out[other]).any()
    tol = prefill.TOLERANCE[torch.float32]
    raise_on(
        first_problem(compare("out", out[other], ref[other], tol["out"]), compare("lse", lse, ref_lse, tol["lse"]))
    )


def _check_poisoned_side(backend, where, lq, splits, N, dtype, b, key):
    """A NaN in head 0 of new key ``key`` of sequence b (where="new"), or of chunk 1's first key
    of sequence b (where="context"): exactly the rows that see it are NaN (out and lse), the rest
    equal one-shot attention over [context, new]."""
    shape = prefill.ContextShape(lq, splits, N)
    c = prefill.make_context_inputs(shape, dtype=dtype, device=DEVICE, out_layout="contiguous")
    q0 = sum(lq[:b])
    if where == "new":
        c.k_nope[q0 + key, 0, 2] = float("nan")  # causal: the sequence's rows key.. see it
        hit = [q0 + i for i in range(key, lq[b])]
    else:
        chunk = c.chunks[1]
        chunk.k_nope[int(chunk.cu_seqlens_k[b]), 0, 2] = float("nan")  # every row of b sees it
        hit = list(range(q0, q0 + lq[b]))
    out, lse = c.run(backend=backend)
    _assert_nan_exactly(out[:, 0], hit, "out head 0")
    _assert_nan_exactly(lse[0], hit, "lse head 0")
    assert not torch.isnan(out[:, 1:].float()).any() and not torch.isnan(lse[1:]).any()
    ref, ref_lse = c.reference()  # one shot over [context, new] as the tensors are now
    _assert_nan_exactly(ref[:, 0], hit, "reference out head 0")
    c.check(ref=(ref, ref_lse))


@pytest.mark.parametrize("backend", [*KERNEL_BACKENDS, "reference"])
@pytest.mark.parametrize("where", ["new", "context"])
def test_chunked_context_keeps_a_poisoned_side(backend, where):
    """mla_prefill_with_context: a NaN in the new tokens' K, or in a context chunk's K, reaches the
    out and lse of exactly the rows that see it -- the merge must not read the poisoned side's
    lse as "saw no key" and return attention over the other side alone."""
    lq, splits = [6, 20, 9], [[4, 7, 3], [5, 0, 6]]
    b, key = (1, 13) if where == "new" else (2, 0)
    _check_poisoned_side(backend, where, lq, splits, 2, torch.float32, b, key)


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["new", "context"])
def test_gpu_chunked_context_keeps_a_poisoned_side_bf16(where):
    """The NaN rule on the GPU (its row max ignores NaN, unlike the interpreter's), bf16, the arch's
    launch config, q blocks of every kind (full, diagonal, ragged end)."""
    lq, splits = [300, 1029, 77], [[2000, 64, 5], [512, 700, 0], [5, 0, 9]]
    b, key = (1, 517) if where == "new" else (0, 0)
    _check_poisoned_side("triton", where, lq, splits, 16, torch.bfloat16, b, key)
