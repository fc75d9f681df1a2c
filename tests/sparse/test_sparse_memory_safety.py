"""mla_sparse_attention memory safety (the contract in tests/_util.py): bad list entries, requests and
block-table entries of every kind make exactly their rows NaN and read nothing outside the cache;
NaN in a selected cache row reaches only the rows that select it; debug mode names the bad index;
overlaps and zero sizes; no host sync, capturable."""

from __future__ import annotations

import math

import pytest
import torch
from _util import DEVICE, assert_no_sync_and_capturable, raises_naming
from sparse_case import BACKENDS, GuardedCase

import rocm_mla

HUGE = (1 << 31) - 1


def _plant_bad_entries(case: GuardedCase) -> list[int]:
    """Plants one bad entry of each kind the contract names into rows 1, 2, 4 and 5 of the lists the
    op reads (positions, or the slots in slot mode; rows 0 and 3 stay clean); returns the rows that
    must come out NaN."""
    lists = case.topk_indices()
    bs = case.shape.block
    cap = case.nb * bs if case.shape.mode == "slots" else case.block_table.shape[1] * bs
    lists[1, 3] = -2  # below -1
    lists[2, 0] = cap  # one past the table (slots: past the cache)
    lists[4, 5] = -HUGE - 1
    lists[5, 1] = HUGE
    return [1, 2, 4, 5]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["paged", "slots"])
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("bs", [1, 16])
def test_bad_entries_make_their_rows_nan(backend, mode, splits, bs):
    """Entries < -1, past the table (the cache for slots), huge either way: those rows NaN in out and
    lse, every other row exact, no guard byte of out, lse or the cache touched (a stray read of the
    finite sentinel would show as a finite row)."""
    if backend == "reference" and splits is not None:
        pytest.skip("the reference has no splits")
    case = GuardedCase((60, 33, 90), (2, 1, 3), 4, bs, K=24, mode=mode, seed=bs)
    want = case.reference()
    rows = _plant_bad_entries(case)
    case.run(backend, num_splits=splits)
    case.check(want, nan_rows=rows)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("splits", [None, 3])
def test_bad_requests_and_pages_make_their_rows_nan(backend, splits):
    """A row's request outside [0, B) (when it names a token), a used block-table entry outside
    [0, num_blocks) (-1, num_blocks, huge): its rows NaN; a request or entry nobody uses is never
    read."""
    if backend == "reference" and splits is not None:
        pytest.skip("the reference has no splits")
    case = GuardedCase((60, 33, 90, 40), (2, 1, 2, 1), 4, 16, K=24, seed=3)
    want = case.reference()
    # rows: request 0 -> 0, 1; request 1 -> 2; request 2 -> 3, 4; request 3 -> 5
    case.req_ids[1] = 4  # B = 4
    case.req_ids[5] = -1 << 30
    p = int(case.positions[2, 0])  # row 2, the only row of request 1: its first entry's page
    case.block_table[1, p // 16] = case.nb
    # request 2: a page row 3 uses -> exactly the rows of request 2 that use it
    p3 = int(case.positions[3, 0])
    case.block_table[2, p3 // 16] = -1
    used4 = {int(x) // 16 for x in case.positions[4] if x >= 0}
    nan = [1, 2, 3, 5] + ([4] if p3 // 16 in used4 else [])
    # garbage in entries nobody uses: never read
    case.block_table[0, -1] = HUGE if case.block_table.shape[1] * 16 > 60 else case.block_table[0, -1]
    case.run(backend, num_splits=splits)
    case.check(want, nan_rows=nan)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_a_selected_row_reaches_only_its_rows(backend):
    """A NaN in one cache row: the rows that select it are NaN (out), every other row exact."""
    case = GuardedCase((60, 40), (3, 2), 4, 16, K=16, seed=9)
    t_sel, p = 1, int(case.positions[1, 2])
    req = int(case.req_ids[t_sel])
    page = int(case.block_table[req, p // 16])
    want = case.reference()
    case.kv[page, p % 16, 500] = float("nan")
    hit = [t for t in range(case.shape.T) if int(case.req_ids[t]) == req and bool((case.positions[t] == p).any())]
    case.run(backend, num_splits=2 if backend == "triton" else None)
    out = case.out.view
    for t in hit:
        assert torch.isnan(out[t].float()).all(), t
    keep = [t for t in range(case.shape.T) if t not in hit]
    case.inputs.check(out[keep], case.lse.view[keep], ref=(want[0][keep], want[1][keep]))


def test_debug_names_the_bad_index():
    case = GuardedCase((60, 33), (2, 1), 4, 16, K=24)
    cap = case.block_table.shape[1] * 16
    case.positions[1, 4] = cap
    raises_naming(ValueError, lambda: case.run("reference", debug=True), "topk_indices[1, 4]", f"[0, {cap})")
    case.positions[1, 4] = -1
    case.req_ids[2] = 7
    raises_naming(ValueError, lambda: case.run("reference", debug=True), "req_id_per_token[2] = 7", "[0, 2)")
    case.req_ids[2] = 1
    p = int(case.positions[0, 0])
    case.block_table[0, p // 16] = case.nb
    raises_naming(ValueError, lambda: case.run("reference", debug=True), "block_table[0,", f"[0, {case.nb})")


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_sizes(backend):
    """T = 0, N = 0, a table of 0 rows (every list -1), a cache of 0 pages with empty lists."""
    for lens, rows, N in (((), 1, 4), ((20, 9), (1, 2), 0)):
        case = GuardedCase(lens, rows, N, 16, K=8)
        out, lse = case.run(backend)
        assert out.shape == (case.shape.T, N, 512)
        case.out.check("out")
        case.lse.check("lse")
    case = GuardedCase((20, 9), (1, 2), 4, 16, K=8)
    case.positions.fill_(-1)
    bt = case.block_table[:0]
    args = list(case.args())
    args[4] = bt
    out, lse = rocm_mla.mla_sparse_attention(*args, **case.kwargs(out=None, lse=None, backend=backend))
    assert bool((out == 0).all()) and bool((lse == -math.inf).all())
    args[2] = case.kv[:0]  # no pages at all: a named position is bad, none named is fine
    out, lse = rocm_mla.mla_sparse_attention(*args, **case.kwargs(out=None, lse=None, backend=backend))
    assert bool((out == 0).all()) and bool((lse == -math.inf).all())


def test_overlaps_rejected_naming_both():
    case = GuardedCase((9, 30), (1, 1), 4, 16, K=8)
    T, N = 2, 4
    kvflat = case.kv.view(-1)
    on_pages = kvflat[: T * N * 512].view(T, N, 512)
    raises_naming(ValueError, lambda: case.run("reference", out=on_pages), "out", "kv_cache", "no memory in common")
    raises_naming(ValueError, lambda: case.run("reference", out=case.q_nope), "out", "q_nope")
    lse_in_out = case.out.base[case.out.guard : case.out.guard + T * N].view(T, N)
    raises_naming(ValueError, lambda: case.run("reference", lse=lse_in_out), "out", "lse")
    lists = case.positions.view(torch.float32)[:, :N]
    raises_naming(ValueError, lambda: case.run("reference", lse=lists), "lse", "topk_indices")
    raises_naming(ValueError, lambda: case.run("reference", workspace=kvflat), "workspace", "kv_cache")


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("N", [8, 16, 128])
def test_gpu_bad_values(kv, N):
    """The real kernel on every bad value kind (huge ones included), one split and several, bf16 and
    fp8 caches: exactly the bad rows NaN, no guard byte touched; run under compute-sanitizer memcheck."""
    for splits in (None, 1, 4):
        for mode in ("paged", "slots"):
            test_bad_entries_make_their_rows_nan("triton", mode, splits, 16)
        test_bad_requests_and_pages_make_their_rows_nan("triton", splits)
    case = GuardedCase((3000, 900, 2500), (1, 2, 1), N, 64, K=2048, dtype=torch.bfloat16, kv=kv, seed=N)
    want = case.reference()
    case.positions[2, 100] = HUGE
    case.req_ids[3] = -(1 << 31)
    case.run("triton")
    case.check(want, nan_rows=[2, 3])


@pytest.mark.gpu
def test_gpu_checks_no_sync_and_capturable():
    """With caller-given out / lse / workspace (the overlap checks run): no host sync, capturable."""
    case = GuardedCase((3000, 70, 500), (1, 2, 1), 16, 64, K=512, dtype=torch.bfloat16)
    plan = case.plan(num_splits=4, backend="triton")
    ws = torch.empty(plan.workspace_numel, device=DEVICE)
    assert_no_sync_and_capturable(
        [lambda: case.run("triton"), lambda: case.run("triton", plan=plan, workspace=ws)], [case.out, case.lse]
    )
    case.paged.check_guards("kv_cache")
