"""mla_indexer_topk memory safety and bad values (the contract in tests/_util.py): a bad request,
kv_len or used block-table entry, and a NaN in q, a weight, a key or its scale, give exactly their
rows the sentinel, read nothing outside the cache and leave every other row exact; table entries
past a row's keys are never read; debug mode names the bad index; zero sizes; no host sync,
capturable."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, HAS_GPU, assert_no_sync_and_capturable, backends, raises_naming

import rocm_mla
from rocm_mla.cases import Guarded
from rocm_mla.cases.indexer_topk import POISON_OUT, IndexerShape, make_inputs
from rocm_mla.ops.indexer_topk import plan_indexer_topk_for
from rocm_mla.reference.indexer import indexer_value_offsets
from rocm_mla.reference.indexer_topk import SENTINEL

BACKENDS = [b for b in ("triton", "reference") if b in backends()]
SMALL = {"split_keys": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "merge": {"chunk": 64, "num_warps": 4}}
HUGE = (1 << 31) - 1
SHAPE = IndexerShape((300, 90, 40, 120, 70, 64, 33, 150), 1, 16, topk=32, block=16)


# The launch forms a Triton call can take: the arch's own; small splits with a merge; tiles of one
# page (a scalar page id a tile: BLOCK_N divides the block size); the merge's chunked passes; the
# prefiltered form (its items fill fewer than the grid's slots).
FORMS = {
    "default": None,
    "splits": SMALL,
    "page-tile": {**SMALL, "BLOCK_N": 16},
    "merge-passes": {**SMALL, "merge": {**SMALL["merge"], "keys_per_thread": 0}},
    # one warp: prefilter splits of 32 keys, finer than the split form's (twice topk 32)
    "prefiltered": {**SMALL, "num_warps": 1, "programs_per_cu": 64, "prefilter": {"split_keys": 32}},
}


def _config(backend, form: str):
    return {"config": FORMS[form]} if backend == "triton" and FORMS[form] else {}


def test_prefiltered_form_is_taken():
    """The "prefiltered" form's calls below do take it (the tests would otherwise run the split form)."""
    for shape in (SHAPE, IndexerShape((300, 20), (1, 1), 16, topk=32, block=16)):
        assert make_inputs(shape, device=DEVICE, seed=1).plan(config=FORMS["prefiltered"]).prefiltered


def _poke_nan_scale(case, row_req: int, pos: int):
    """A NaN scale for position ``pos`` of request ``row_req`` (all its rows then see a NaN key)."""
    bs = case.shape.block
    page = int(case.block_table[row_req, pos // bs])
    off = pos % bs
    view = case.index_cache[page].reshape(-1)
    view[bs * 128 + 4 * off : bs * 128 + 4 * off + 4] = 0xFF


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", list(FORMS))
def test_bad_values_give_their_rows_the_sentinel(backend, form):
    """Row 0: request -1; row 1: kv_len -1; row 2: kv_len past the table; row 3: kv_len 2^31 - 1; row
    4: a used page -1; row 5: a used page num_blocks; row 6: a NaN weight; row 7: a NaN q element.
    Every planted row gets -2 everywhere. Then a NaN key scale in one request: its row gets the
    sentinel, the other request's row stays exact."""
    case = make_inputs(SHAPE, device=DEVICE, seed=11)
    nb = case.index_cache.shape[0]
    case.req_ids[0] = -1
    case.kv_lens[1] = -1
    case.kv_lens[2] = case.block_table.shape[1] * 16 + 1
    case.kv_lens[3] = HUGE
    case.block_table[4, 1] = -1
    case.block_table[5, 0] = nb
    case.weights[6, 3] = float("nan")
    nan_code = 0x80 if case.fp8 == torch.float8_e4m3fnuz else 0x7F
    case.q.view(torch.uint8)[7, 2, 5] = nan_code
    case.run(backend=backend, **_config(backend, form))
    assert not bool((case.out == POISON_OUT).any())
    # The CPU interpreter decodes e4m3fn's NaN code 0x7F as 480 (the GPU and the reference as NaN):
    # row 7 is checked where the kernel runs on the hardware's conversion.
    interpreted = backend == "triton" and DEVICE.type == "cpu"
    for t in range(7 if interpreted else 8):
        assert bool((case.out[t] == SENTINEL).all()), t
    clean = make_inputs(IndexerShape((300, 20), (1, 1), 16, topk=32, block=16), device=DEVICE, seed=12)
    _poke_nan_scale(clean, 0, 123)
    clean.run(backend=backend, **_config(backend, form))
    assert bool((clean.out[0] == SENTINEL).all())
    assert clean.mismatch() == ""  # row 1 exact, row 0 the sentinel the reference expects


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["splits", "prefiltered"])
def test_table_entries_past_the_keys_are_never_read(backend, form):
    """Block-table entries past each row's last block hold -1, num_blocks or 2^31 - 1, and the spare
    pages are 0xFF (NaN scales): every row still exact, nothing read outside the guarded cache."""
    case = make_inputs(SHAPE, device=DEVICE, seed=13)
    nb = case.index_cache.shape[0]
    bs = case.shape.block
    for b, n in enumerate(case.shape.lens):
        used = -(-n // bs)
        case.block_table[b, used:] = torch.tensor([-1, nb, HUGE], dtype=torch.int32, device=DEVICE).repeat(64)[
            : case.block_table.shape[1] - used
        ]
    guarded = Guarded(tuple(case.index_cache.shape), torch.uint8, device=DEVICE, fill=case.index_cache, guard=4096)
    case.caches[0] = guarded.view
    case.run(backend=backend, **_config(backend, form))
    case.check()
    guarded.check("index_cache")


def test_shuffled_offsets_stay_in_a_block():
    """The shuffled layout's offsets are a permutation of a block's value bytes (no read past it)."""
    for bs in (16, 64):
        offs = indexer_value_offsets(bs, True).reshape(-1)
        assert torch.equal(torch.sort(offs).values, torch.arange(bs * 128))


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_sizes(backend):
    """T = 0; an empty cache with rows of no keys (-1 everywhere) and of some keys (the sentinel)."""
    case = make_inputs(IndexerShape((), 1, 8, topk=16, block=16), device=DEVICE)
    assert case.run(backend=backend).shape == (0, 16)
    empty = torch.empty(0, 16, 132, dtype=torch.uint8, device=DEVICE)
    q = torch.randn(2, 8, 128, device=DEVICE).to(case.fp8)
    w = torch.randn(2, 8, device=DEVICE)
    bt = torch.zeros(1, 2, dtype=torch.int32, device=DEVICE)
    req = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    plan = plan_indexer_topk_for(q, empty, bt, topk=16, backend=backend)
    out = rocm_mla.mla_indexer_topk(q, w, empty, bt, req, lens, topk=16, plan=plan)
    assert bool((out[0] == -1).all()) and bool((out[1] == SENTINEL).all())


def test_debug_names_the_index():
    case = make_inputs(SHAPE, device=DEVICE, seed=14)
    kw = case.kwargs(plan=case.plan(debug=True))
    case.req_ids[2] = 9
    raises_naming(ValueError, lambda: rocm_mla.mla_indexer_topk(*case.args(), **kw), "req_id_per_token[2] = 9")
    case.req_ids[2] = 2
    case.kv_lens[3] = -4
    raises_naming(ValueError, lambda: rocm_mla.mla_indexer_topk(*case.args(), **kw), "kv_lens[3] = -4")
    case.kv_lens[3] = 120
    case.block_table[1, 2] = case.index_cache.shape[0]
    raises_naming(ValueError, lambda: rocm_mla.mla_indexer_topk(*case.args(), **kw), "block_table[1, 2]", "row 1")


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm); none visible to torch")
@pytest.mark.gpu
@pytest.mark.parametrize("small", [False, True], ids=["default", "splits"])
def test_gpu_no_sync_and_capturable(small):
    """With a plan and a workspace made once: no host sync, runs on a side stream and in a CUDA graph;
    the replay's answer is valid."""
    case = make_inputs(SHAPE, device=DEVICE, seed=15)
    plan = case.plan(backend="triton", **({"config": SMALL} if small else {}))
    ws = torch.empty(max(1, plan.workspace_numel), dtype=torch.int32, device=DEVICE)
    out = Guarded((SHAPE.T, SHAPE.topk), torch.int32, device=DEVICE, fill=torch.full((SHAPE.T, SHAPE.topk), POISON_OUT))
    assert_no_sync_and_capturable([lambda: case.run(plan=plan, workspace=ws, out=out.view)], [out])
    assert case.mismatch(out.view) == ""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_fuzz_bad_values(backend, seed):
    """Random bad values in random rows (requests, kv_lens, used pages, of every kind and size):
    exactly the rows the reference calls bad get the sentinel, the others are valid, nothing outside
    the guarded cache changes."""
    g = torch.Generator().manual_seed(seed)
    case = make_inputs(SHAPE, device=DEVICE, seed=20 + seed)
    nb, bs = case.index_cache.shape[0], case.shape.block
    wild = [-1, -(1 << 31), nb, nb + 7, HUGE]
    for t in torch.randperm(SHAPE.T, generator=g)[:3].tolist():
        what = int(torch.randint(0, 3, (1,), generator=g))
        pick = wild[int(torch.randint(0, len(wild), (1,), generator=g))]
        if what == 0:
            case.req_ids[t] = pick
        elif what == 1:
            case.kv_lens[t] = pick
        else:
            used = max(1, -(-int(case.kv_lens[t]) // bs))
            case.block_table[int(case.req_ids[t]), int(torch.randint(0, used, (1,), generator=g))] = pick
    guarded = Guarded(tuple(case.index_cache.shape), torch.uint8, device=DEVICE, fill=case.index_cache, guard=4096)
    case.caches[0] = guarded.view
    case.run(backend=backend, **_config(backend, "splits" if seed % 2 else "default"))
    assert not bool((case.out == POISON_OUT).any())
    case.check()  # the reference's verdict per row: the sentinel where it says bad, valid elsewhere
    guarded.check("index_cache")
