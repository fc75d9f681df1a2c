"""mla_v4_attention memory safety (the contract in tests/_util.py): bad list entries of either list,
bad ragged offsets and bad positions make exactly their rows NaN and read nothing outside the caches
(every cache, out and lse inside sentinel guards, pages wider than their bytes); NaN in a named cache
row reaches only the rows naming it, NaN in an unnamed slot nothing; debug mode names the bad value;
overlaps and zero sizes; no host sync, capturable."""

from __future__ import annotations

import math

import pytest
import torch
from _util import DEVICE, assert_no_sync_and_capturable, raises_naming
from v4_case import BACKENDS, GuardedCase

import rocm_mla.ops as v4op
from rocm_mla.cases import v4_attention as v4

HUGE = (1 << 31) - 1


def _at(case, which: str, t: int, j: int):
    """Where entry j of row t of a list sits in the tensor the op reads (dense [t, j]; ragged flat)."""
    ptr = getattr(case, f"{which}_indptr")()
    return (t, j) if ptr is None else int(ptr[t]) + j


def _plant_bad_entries(case) -> list[int]:
    """One bad entry of each kind in rows 1, 2, 4 and 5 (rows 0 and 3 stay clean): below -1, one past
    the window cache, one past the compressed cache (a valid window slot), huge either way."""
    w, c = case.window_indices(), case.compressed_indices()
    w_cap = case.window_cache.shape[0] * case.window_cache.shape[1]
    c_cap = case.compressed_cache.shape[0] * case.compressed_cache.shape[1]
    w[_at(case, "window", 1, 3)] = -2
    w[_at(case, "window", 2, 0)] = w_cap
    c[_at(case, "compressed", 4, 1)] = c_cap
    c[_at(case, "compressed", 5, 0)] = -HUGE - 1
    w[_at(case, "window", 5, 2)] = HUGE
    return [1, 2, 4, 5]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ragged,splits", [(False, None), (True, 3)])
def test_bad_entries_make_their_rows_nan(backend, ragged, splits):
    """Entries < -1, past their own cache, huge either way, in either list: those rows NaN in out
    and lse, every other row exact, no guard byte of out, lse or either cache touched (a stray read
    of the finite sentinel would show as a finite row)."""
    case = GuardedCase((60, 33, 90), (2, 1, 3), 4, "csa", topk=8, ragged=ragged, seed=1)
    want = case.reference()
    rows = _plant_bad_entries(case)
    case.run(backend, num_splits=splits if backend == "triton" else None)
    case.check(want, nan_rows=rows)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_indptr_and_positions_make_their_rows_nan(backend):
    """Ragged offsets decreasing, negative or past nnz, and positions < 0 or >= P (int32 and huge):
    those rows NaN; the others exact; nothing outside read."""
    case = GuardedCase((50, 40, 30, 45), (2, 1, 2, 2), 4, "hca", ratio=8, cblock=2, ragged=True, seed=2,
                       build={"positions_dtype": torch.int32})  # fmt: skip
    want = case.reference()
    T = case.shape.T
    w_ptr, c_ptr = case.window_indptr(), case.compressed_indptr()
    w_ptr[1] = -5  # row 0 ends before it starts, row 1 starts below 0
    c_ptr[4] = int(c_ptr[5]) + 1  # row 4 decreasing (row 3 now ends inside row 4's entries: its position is bad)
    c_ptr[T] = case.compressed_indices().shape[0] + 1  # the last row ends past nnz
    case.positions[3] = case.cos_sin_cache.shape[0]
    case.positions[1] = -HUGE
    case.run(backend, num_splits=2 if backend == "triton" else None)
    case.check(want, nan_rows=[0, 1, 3, 4, T - 1])
    assert T == 7


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_a_named_row_reaches_only_its_rows(backend):
    """A NaN code in a window row that one row names and an inf scale in a compressed row another
    names: those rows NaN in out; NaN planted in slots no list names changes nothing."""
    case = GuardedCase((70, 40), (2, 1), 4, "csa", topk=8, seed=3)
    want = case.reference()
    bs, cbs = case.shape.block, case.shape.cblock
    w_slot = int(case.window_indices()[2, 4])  # row 2 (request 1) alone
    data, _ = v4.fp8_ds_mla_views(case.window_cache)
    data[w_slot // bs, w_slot % bs, 100] = 0x7F if case.window.kind == torch.float8_e4m3fn else 0x80
    c_slot = int(case.compressed_indices()[0, 0])
    named = set(int(x) for x in case.compressed_indices()[0].tolist())
    hit = [0, 2] + [t for t in (1,) if c_slot in set(case.compressed_indices()[t].tolist())]
    _, scales = v4.fp8_ds_mla_views(case.compressed_cache)
    scales[c_slot // cbs, c_slot % cbs, 2] = 255
    free = sorted(set(range(case.window_cache.shape[0] * bs)) - set(case.window_indices().flatten().tolist()))
    for s in free[:5]:
        data[s // bs, s % bs, :] = 0x7F
    assert c_slot in named
    case.run(backend, num_splits=2 if backend == "triton" else None)
    out = case.out.view
    for t in hit:
        assert torch.isnan(out[t].float()).all(), t
    keep = [t for t in range(case.shape.T) if t not in hit]
    case.inputs.check(out[keep], case.lse.view[keep], ref=(want[0][keep], want[1][keep]))
    case.check_guards()


def test_debug_names_the_bad_value():
    case = GuardedCase((60, 33), (2, 1), 4, "csa", topk=8)
    cap = case.window_cache.shape[0] * case.window_cache.shape[1]
    case.window_indices()[1, 4] = cap
    raises_naming(ValueError, lambda: case.run("reference", debug=True), "window_indices[1, 4]", str(cap))
    case.window_indices()[1, 4] = -1
    case.positions[2] = -3
    raises_naming(ValueError, lambda: case.run("reference", debug=True), "positions[2] = -3")
    r = GuardedCase((60, 33), (2, 1), 4, "csa", topk=8, ragged=True)
    r.compressed_indptr()[2] = 0
    raises_naming(ValueError, lambda: r.run("reference", debug=True), "compressed_indptr")


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_sizes(backend):
    """T = 0 (no launch), caches of no page with lists naming none (-1 everywhere): out 0, lse -inf;
    with a list naming a slot: NaN rows."""
    empty = GuardedCase((), 1, 4, "csa", topk=8)
    out, lse = empty.run(backend)
    assert out.shape == (0, 4, 512) and lse.shape == (0, 4)
    empty.check_guards()
    case = GuardedCase((20, 9), (1, 2), 4, "window")
    case.window_indices().fill_(-1)
    a = list(case.args())
    a[1] = case.window_cache[:0]
    out, lse = v4op.mla_v4_attention(*a, **case.kwargs(out=None, lse=None, backend=backend))
    assert bool((out == 0).all()) and bool((lse == -math.inf).all())
    case.window_indices()[1, 0] = 0
    out, lse = v4op.mla_v4_attention(*a, **case.kwargs(out=None, lse=None, backend=backend))
    assert bool(torch.isnan(out[1]).all()) and bool((out[[0, 2]] == 0).all())


def test_overlaps_rejected_naming_both():
    case = GuardedCase((9, 30), (1, 1), 4, "csa", topk=8, dtype=torch.float32, kv="auto")
    T, H = 2, 4
    on_cache = case.window_cache[0].reshape(-1)[: T * H * 512].view(T, H, 512)
    raises_naming(ValueError, lambda: case.run("reference", out=on_cache), "out", "window_cache")
    raises_naming(ValueError, lambda: case.run("reference", out=case.q), "out", "q")
    lse_in_out = case.out.base[case.out.guard : case.out.guard + T * H].view(T, H)
    raises_naming(ValueError, lambda: case.run("reference", lse=lse_in_out), "out", "lse")
    on_list = case.compressed_indices().view(torch.float32)[:, :H]
    raises_naming(ValueError, lambda: case.run("reference", lse=on_list), "lse", "compressed_indices")
    on_rope = case.cos_sin_cache[:T, :H]
    raises_naming(ValueError, lambda: case.run("reference", lse=on_rope), "lse", "cos_sin_cache")


@pytest.mark.gpu
@pytest.mark.parametrize("H", [8, 16, 64, 128])
def test_gpu_bad_values(H):
    """The real kernel on every bad value kind, one split and several, fp8 window e4m3fnuz +
    compressed e4m3fn and bf16 caches: exactly the bad rows NaN, no guard byte touched; run under
    compute-sanitizer memcheck."""
    for backend_splits in (None, 1, 4):
        for ragged in (False, True):
            case = GuardedCase((3000, 900, 2500, 700, 64, 1500), 1, H, "csa", topk=512, ragged=ragged, seed=H,
                               dtype=torch.bfloat16, block=64, cblock=64, window_fp8="e4m3fnuz",
                               compressed_fp8="e4m3fn")  # fmt: skip
            want = case.reference()
            rows = _plant_bad_entries(case)
            case.run("triton", num_splits=backend_splits)
            case.check(want, nan_rows=rows)
    test_bad_indptr_and_positions_make_their_rows_nan("triton")


@pytest.mark.gpu
def test_gpu_checks_no_sync_and_capturable():
    """With caller-given out / lse / workspace (the overlap checks run): no host sync, capturable."""
    case = GuardedCase((3000, 70, 500), (1, 2, 1), 16, "csa", topk=512, dtype=torch.bfloat16, block=64, cblock=64)
    plan = case.plan(num_splits=4, backend="triton")
    ws = torch.empty(plan.workspace_numel, device=DEVICE)
    assert_no_sync_and_capturable(
        [lambda: case.run("triton"), lambda: case.run("triton", plan=plan, workspace=ws)], [case.out, case.lse]
    )
    case.inputs.check_guards()
