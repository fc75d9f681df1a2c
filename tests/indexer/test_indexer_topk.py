"""mla_indexer_topk (the lightning indexer's scores and top-k) against the float64 reference: odd
sizes, long rows through splits and the merge, both cache layouts and any block size, batch
invariance, the plan, the workspace, the check itself, and errors that name the argument."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl
from _util import DEVICE, HAS_GPU, backends, raises_naming

import rocm_mla
from rocm_mla.cases import indexer_topk as cases
from rocm_mla.cases.indexer_topk import POISON_OUT, IndexerShape, make_inputs
from rocm_mla.kernels.fp8_codes import fp8_e4m3fn_to_fnuz_half
from rocm_mla.kernels.indexer_select import _select_in_registers, _select_packed
from rocm_mla.kernels.indexer_topk import _fnuz_half_codes, _ocp_key_tile
from rocm_mla.ops.indexer_topk import plan_indexer_topk_for
from rocm_mla.ops.indexer_topk_plan import plan_indexer_topk
from rocm_mla.ops.latent_core import num_compute_units
from rocm_mla.reference.indexer_topk import SENTINEL, check_indexer_topk

BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP kernel
# Small splits and merge chunks: the CPU interpreter then runs rows of several splits.
SMALL = {"split_keys": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "merge": {"chunk": 64, "num_warps": 4}}


def _run_and_check(case, **kw):
    case.run(**kw)
    assert not bool((case.out == POISON_OUT).any()), "an entry of out was not written"
    case.check()


def test_check_catches_wrong_answers():
    """check_indexer_topk fails a swapped-in lower key, a repeat, a position out of range, a missing
    -1 and a sentinel where none belongs (the check can fail)."""
    case = make_inputs(IndexerShape((90, 20), (1, 1), 8, topk=16, block=16), seed=5)
    ref = case.reference()
    lg = case.logits()
    assert check_indexer_topk(ref, lg, 16) == ""
    order = torch.sort(lg[0], descending=True).indices
    bad = ref.clone()
    bad[0, 0] = int(order[40])  # a key far below the 16th
    assert "not a top-16" in check_indexer_topk(bad, lg, 16)
    bad = ref.clone()
    bad[0, 1] = bad[0, 0]
    assert "distinct" in check_indexer_topk(bad, lg, 16)
    bad = ref.clone()
    bad[0, 2] = 90
    assert "in [0, 90)" in check_indexer_topk(bad, lg, 16)
    short = make_inputs(IndexerShape((9,), 1, 8, topk=16, block=16), seed=6)
    r = short.reference()
    assert bool((r[0, 9:] == -1).all())
    r[0, 12] = 4
    assert "expected -1" in check_indexer_topk(r, short.logits(), 16)
    r = short.reference()
    r[0] = SENTINEL
    assert check_indexer_topk(r, short.logits(), 16) != ""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", cases.SHAPES["odd"] + cases.SHAPES["tiny"] + cases.SHAPES["selfcheck"], ids=str)
def test_odd_sizes(shape, backend):
    """H 1/8/24/32/64, topk 1..48, blocks 1/16/64, one key, rows without keys, prefill rows, T = 0:
    every entry written, a valid top-k, -1 after a short row's keys."""
    _run_and_check(make_inputs(shape, device=DEVICE, seed=len(shape.lens)), backend=backend)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "triton"])
def test_splits_and_merge(backend):
    """Rows of many splits (kv_len up to 11 x split_keys), rows of exactly one split, of fewer keys than
    topk, and prefill rows: a valid top-k, and bitwise the answer of one split a row."""
    shape = IndexerShape((700, 64, 65, 300), (1, 2, 1, 6), 16, topk=40, block=16)
    case = make_inputs(shape, device=DEVICE, seed=2)
    _run_and_check(case, backend=backend, config=SMALL)
    # Each row's positions come in ascending order, then -1 (docs/indexer.md).
    for row in case.out.tolist():
        taken = [p for p in row if p >= 0]
        assert taken == sorted(set(taken)) and row == taken + [-1] * (len(row) - len(taken))
    # The same float32 logits through one split a row: the same answer, bit for bit (ties by
    # position either way), so the split size never shows.
    one = case.run(backend=backend, out=None, config={**SMALL, "split_keys": 1024})
    assert torch.equal(one, case.out)
    # The merge's chunked passes (rows too long for its registers) and one-page tiles (a scalar
    # page id a tile): the same answer.
    passes = {**SMALL, "merge": {**SMALL["merge"], "keys_per_thread": 0}}
    assert case.plan(config=passes).merge_constexprs["REG"] == 0
    assert torch.equal(case.run(backend=backend, out=None, config=passes), case.out)
    tile = {**SMALL, "BLOCK_N": 16}
    assert case.plan(config=tile).constexprs["PAGE_TILE"]
    assert torch.equal(case.run(backend=backend, out=None, config=tile), case.out)
    # Two key tiles a loop step (odd tile counts leave the second past the split's keys), with
    # gathered and with one-page tiles: the same answer.
    for cfg in ({**SMALL, "key_streams": 2}, {**tile, "key_streams": 2}):
        assert case.plan(config=cfg).constexprs["STREAMS"] == 2
        assert torch.equal(case.run(backend=backend, out=None, config=cfg), case.out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block,shuffled", [(1, False), (16, True), (16, False), (64, True), (12, False)])
def test_layouts_and_block_sizes(backend, block, shuffled):
    """vLLM's ROCm layout (16 x 16 tiles) and flat rows, block sizes 1, 16, 64 and 12 (not a power of
    two)."""
    shape = IndexerShape((150, 33, 90), (1, 2, 3), 8, topk=24, block=block)
    cfg = {"config": SMALL} if backend == "triton" else {}
    _run_and_check(make_inputs(shape, device=DEVICE, seed=block, shuffled=shuffled), backend=backend, **cfg)


@pytest.mark.parametrize("backend", BACKENDS)
def test_c4_shapes_take_v4s_cache(backend):
    """A ``c4`` shape (DeepSeek-V4's compressed indexer cache) is made as vLLM's compressor writes it,
    flat rows of e4m3fn values whatever q's kind, and the op's answer over it is a valid top-k."""
    shape = IndexerShape((150, 40), (1, 2), 8, topk=24, block=64, c4=True)
    case = make_inputs(shape, device=DEVICE, seed=4)
    assert not case.shuffled and case.cache_kind == torch.float8_e4m3fn and shape.label().endswith(" c4")
    _run_and_check(case, backend=backend, **({"config": SMALL} if backend == "triton" else {}))


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "triton"])
def test_batch_invariant_row_alone_equals_row_in_batch(backend, monkeypatch):
    """A row's answer is bitwise the same (order included) alone, in a batch, and in a batch whose
    longest row changes the split count; the batch takes the config's many_items form (packed
    selection, other split size and grid), the row alone does not. The plans count the CPU
    interpreter's 4 CUs on every device, so the batch's items outnumber the slots on a GPU too."""
    import rocm_mla.ops.indexer_topk_plan as plan_mod

    monkeypatch.setattr(plan_mod, "num_compute_units", lambda device: 4)
    shape = IndexerShape((300, 90, 40), (2, 1, 3), 16, topk=32, block=16)
    case = make_inputs(shape, device=DEVICE, seed=9)
    cfg = {**SMALL, "many_items": {"select_pack": 2, "programs_per_cu": 2}}
    assert case.plan(config=cfg).config["select_pack"] == 2
    alone_plan = plan_indexer_topk(
        num_rows=1, num_heads=16, topk=32, max_kv_len=case.block_table.shape[1] * 16, block_size=16,
        q_dtype=case.q.dtype, device=case.q.device, config=cfg,
    )  # fmt: skip
    assert alone_plan.config["select_pack"] == 1
    full = case.run(backend=backend, config=cfg).clone()
    for t in (0, 2, 5):
        q1 = case.q[t : t + 1]
        plan = plan_indexer_topk_for(
            q1, case.index_cache, case.block_table, topk=32, shuffled=case.shuffled, backend=backend, config=cfg
        )
        alone = rocm_mla.mla_indexer_topk(
            q1, case.weights[t : t + 1], case.index_cache, case.block_table, case.req_ids[t : t + 1],
            case.kv_lens[t : t + 1], topk=32, plan=plan,
        )  # fmt: skip
        assert torch.equal(alone[0], full[t]), t
    # max_kv_len decides the split count; rows that fit give the same bits.
    wide = case.run(backend=backend, config=SMALL, out=None, max_kv_len=4096)
    assert torch.equal(wide, full)


def test_fp8_kinds_on_the_reference():
    """Both e4m3 kinds through the reference backend (the Triton kernel runs the platform's kind; the
    ISA report compiles gfx942's e4m3fnuz)."""
    for kind in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        case = make_inputs(IndexerShape((90, 20), (2, 1), 8, topk=16, block=16), fp8=kind, seed=3)
        _run_and_check(case, backend="reference")


def test_plan_reuse_workspace_and_mismatch():
    """A plan made once serves calls of its sizes; a plan for other sizes, a short workspace and a
    non-plan are refused naming the argument; plan.workspace_bytes is 4 bytes a staged key of each
    program, 8 bytes a candidate and the merge's read-ahead."""
    shape = IndexerShape((300, 90), (1, 1), 16, topk=32, block=16)
    case = make_inputs(shape, device=DEVICE, seed=4)
    plan = case.plan(config=SMALL)
    assert plan.num_splits == -(-case.block_table.shape[1] * 16 // plan.split_keys) > 1 and not plan.direct
    assert plan.grid[0] == min(shape.T * plan.num_splits, num_compute_units(DEVICE) * plan.config["programs_per_cu"])
    read_ahead = max(0, plan.merge_constexprs["REG"] - plan.num_splits * 32)
    assert plan.workspace_bytes == 4 * (
        plan.grid[0] * plan.split_keys + 2 * shape.T * plan.num_splits * 32 + read_ahead
    )
    if "triton" in BACKENDS:
        assert plan.backend == "triton"
        ws = torch.empty(plan.workspace_numel, dtype=torch.int32, device=DEVICE)
        _run_and_check(case, plan=plan, workspace=ws)
        raises_naming(ValueError, lambda: case.run(plan=plan, workspace=ws[:10]), "workspace", ">=")
        other = case.plan(config=SMALL, topk=16)
        raises_naming(ValueError, lambda: case.run(plan=other), "plan", "topk=32")
        raises_naming(TypeError, lambda: case.run(plan=object()), "plan", "IndexerTopkPlan")
    assert case.plan(max_kv_len=50).direct  # default split_keys holds 50 keys


@pytest.mark.skipif("triton" not in BACKENDS, reason="the Triton launches")
@pytest.mark.parametrize("form", ["direct", "splits", "prefiltered"])
def test_plan_keeps_its_launches(form):
    """A plan's kernels launch through KernelLaunch objects made at its first run and kept on it
    (split, then prefilter and merge where the form has them); a second call reuses them and, on a
    GPU, launches the kept binaries directly; the answers are the same bits. The interpreter goes
    through kernel[grid]. (The direct plan covers the first row's 90 keys, not the second's 300.)"""
    case = make_inputs(IndexerShape((90, 300), (1, 1), 16, topk=32, block=16), device=DEVICE, seed=35)
    cfg = {"direct": None, "splits": SMALL, "prefiltered": CONTRACT_FORMS["prefiltered"]}[form]
    plan = case.plan(backend="triton", config=cfg, **({"max_kv_len": 128} if form == "direct" else {}))
    assert (plan.direct, plan.prefiltered) == (form == "direct", form == "prefiltered")
    want = {"split"} | ({"merge"} if form != "direct" else set()) | ({"prefilter"} if plan.prefiltered else set())
    assert plan.kernel_launches == {}
    first = case.run(plan=plan, out=None).clone()
    assert set(plan.kernel_launches) == want
    kept = dict(plan.kernel_launches)
    assert torch.equal(case.run(plan=plan, out=None), first)
    assert all(plan.kernel_launches[k] is kept[k] for k in want)
    for launch in kept.values():
        if HAS_GPU:
            assert launch.direct >= 1 and launch.via_triton == "", launch.via_triton
        else:
            assert launch.via_triton == "not a compiled Triton kernel"
    assert case.mismatch(first, rows=1 if form == "direct" else None) == ""
    if form == "direct":
        assert first[1].tolist() == [SENTINEL] * 32


@pytest.mark.parametrize("backend", BACKENDS)
def test_plan_is_checked_before_any_backend_runs(backend):
    """A frozen plan that fits the call matches it (host values only); a plan made for other sizes,
    another fp8 kind or another top-k does not, and the op refuses it naming the field before
    anything runs (out keeps its poison) on every backend; a per-row tensor the plan does not fit
    is named; non-tensors never match."""
    case = make_inputs(IndexerShape((90, 40), (2, 1), 8, topk=16, block=16), device=DEVICE, seed=31)
    args = case.args()
    plan = case.plan(backend=backend)
    assert plan.backend == backend and plan.device == case.q.device and plan.matches(*args, topk=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.topk = 8  # type: ignore[misc]
    other_kind = torch.float8_e4m3fnuz if case.fp8 == torch.float8_e4m3fn else torch.float8_e4m3fn
    for field, over in (
        ("num_rows", {"num_rows": 4}),
        ("num_heads", {"num_heads": 16}),
        ("topk", {"topk": 8}),
        ("block_size", {"block_size": 32}),
        ("q_dtype", {"q_dtype": other_kind}),
    ):
        other = case.plan(backend=backend, **over)
        assert not other.matches(*args, topk=16), field
        raises_naming(ValueError, lambda: case.run(plan=other), "plan", f"{field}=")
        assert bool((case.out == POISON_OUT).all()), f"{backend} ran with a plan made for another {field}"
    q, w, cache, table, req, lens = args
    assert not plan.matches(q, w.double(), cache, table, req, lens, topk=16)
    op = rocm_mla.mla_indexer_topk
    raises_naming(TypeError, lambda: op(q, w.double(), cache, table, req, lens, topk=16, plan=plan), "weights")
    assert not plan.matches(q, w, cache, table, req.long(), lens, topk=16)
    raises_naming(TypeError, lambda: op(q, w, cache, table, req.long(), lens, topk=16, plan=plan), "req_id_per_token")
    assert not plan.matches(q, w, cache, table, req, lens[:2], topk=16)
    assert not plan.matches(None, w, cache, table, req, lens, topk=16)
    assert bool((case.out == POISON_OUT).all())
    if HAS_GPU:  # a plan for another device
        cpu = case.plan(backend="reference", device="cpu")
        assert not cpu.matches(*args, topk=16)
        raises_naming(ValueError, lambda: case.run(plan=cpu), "plan", "device=")


# The triton forms the shared-contract test runs (the reference plans the same splits).
CONTRACT_FORMS = {
    "splits": SMALL,
    "prefiltered": {**SMALL, "num_warps": 1, "programs_per_cu": 64, "prefilter": {"split_keys": 32}},
}


@pytest.mark.skipif("triton" not in BACKENDS, reason="compares the Triton backend with the reference")
@pytest.mark.parametrize("form", list(CONTRACT_FORMS))
def test_backends_share_the_output_contract(form):
    """The same bad, NaN, tied and ordinary rows through a reference plan and a Triton plan of the
    same sizes: the same rows get the sentinel (request -1, kv_len -1, kv_len past the table, a
    used page -1, a NaN weight, a NaN key scale, kv_len past the plan's max_keys), a row past
    max_kv_len but within max_keys is answered, tied rows give their first positions, every other
    row holds distinct positions in ascending order then -1, a valid top-k, the same positions on
    both backends wherever float64 separates the top-k from the rest."""
    shape = IndexerShape((300, 90, 40, 120, 70, 64, 33, 150, 80, 200), 1, 16, topk=32, block=16)
    case = make_inputs(shape, device=DEVICE, seed=33)
    cfg = CONTRACT_FORMS[form]
    plans = {b: case.plan(backend=b, config=cfg, max_kv_len=200) for b in ("reference", "triton")}
    max_keys = plans["triton"].max_keys
    assert plans["reference"].max_keys == max_keys and 210 <= max_keys < case.block_table.shape[1] * 16
    case.req_ids[0] = -1
    case.kv_lens[1] = -1
    case.kv_lens[2] = case.block_table.shape[1] * 16 + 1
    case.block_table[3, 1] = -1
    case.weights[4, 3] = float("nan")
    case.req_ids[5], case.kv_lens[5] = 0, 210  # past max_kv_len, within max_keys: answered
    case.req_ids[6], case.kv_lens[6] = 0, max_keys + 1
    case.weights[7] = 0.0  # every logit 0: a tie taken in position order
    bs = shape.block
    page = int(case.block_table[8, 50 // bs])
    case.index_cache[page].reshape(-1)[bs * 128 + 4 * (50 % bs) :][:4] = 0xFF  # a NaN scale at position 50
    bad = {0, 1, 2, 3, 4, 6, 8}
    outs = {}
    for b, plan in plans.items():
        case.out.fill_(POISON_OUT)
        outs[b] = case.run(plan=plan).clone()
        assert not bool((outs[b] == POISON_OUT).any()), b
        for t in range(shape.T):
            row = outs[b][t].tolist()
            if t in bad:
                assert row == [SENTINEL] * 32, (b, t, row[:8])
                continue
            taken = [p for p in row if p >= 0]
            assert taken == sorted(set(taken)) and row == taken + [-1] * (32 - len(taken)), (b, t, row[:8])
        assert outs[b][7].tolist() == list(range(32)), b
        good = [t for t in range(shape.T) if t not in bad]
        assert check_indexer_topk(outs[b], case.logits(), 32, rows=good) == "", b
    lg = case.logits()
    for t in range(shape.T):
        if t not in bad and t != 7:
            v = torch.sort(lg[t], descending=True).values
            if v.numel() > 32 and float(v[31] - v[32]) <= 1e-4 * float(v.abs().max()):
                continue  # a near-tie at the boundary: float32 and float64 may take either key
        assert torch.equal(outs["reference"][t], outs["triton"][t]), t


def test_errors_name_the_argument():
    case = make_inputs(IndexerShape((40,), 1, 8, topk=16, block=16), device=DEVICE)
    a = list(case.args())
    kw = case.kwargs()

    def call(i=None, v=None, **over):
        args = list(a)
        if i is not None:
            args[i] = v
        return rocm_mla.mla_indexer_topk(*args, **{**kw, **over})

    raises_naming(TypeError, lambda: call(0, case.q.float()), "q", "float8")
    raises_naming(ValueError, lambda: call(0, case.q[..., :64]), "q", "128")
    raises_naming(ValueError, lambda: call(1, case.weights[:, :4]), "weights", "[T, H]")
    raises_naming(TypeError, lambda: call(1, case.weights.double()), "weights", "float32")
    raises_naming(ValueError, lambda: call(2, case.index_cache[..., :128]), "index_cache", "132")
    raises_naming(TypeError, lambda: call(3, case.block_table.long()), "block_table", "int32")
    raises_naming(ValueError, lambda: call(4, case.req_ids[:0]), "req_id_per_token", "at least")
    raises_naming(TypeError, lambda: call(5, case.kv_lens.long()), "kv_lens", "int32")
    raises_naming(ValueError, lambda: call(topk=0), "topk", ">= 1")
    raises_naming(
        ValueError, lambda: call(out=torch.empty(2, 16, dtype=torch.int32, device=DEVICE)), "out", "[T, topk]"
    )
    # The knobs live in the plan: plan_indexer_topk_for checks them, naming each.
    q, cache, table = case.q, case.index_cache, case.block_table
    raises_naming(ValueError, lambda: plan_indexer_topk_for(q, cache, table, topk=16, max_kv_len=-1), "max_kv_len")
    raises_naming(TypeError, lambda: plan_indexer_topk_for(q, cache, table, topk=16, shuffled="yes"), "shuffled")
    odd = torch.full((3, 12, 132), 0xFF, dtype=torch.uint8, device=DEVICE)
    raises_naming(ValueError, lambda: plan_indexer_topk_for(q, odd, table, topk=16, shuffled=True), "index_cache", "16")
    # The op without a plan plans from the tensors (vLLM's layout rule) and checks them alike.
    raises_naming(TypeError, lambda: call(0, case.q.float(), plan=None), "q", "float8")
    raises_naming(ValueError, lambda: call(2, odd, plan=None), "index_cache", "16")
    raises_naming(ValueError, lambda: call(topk=0, plan=None), "topk", ">= 1")
    raises_naming(ValueError, lambda: call(1, case.weights[:, :4], plan=None), "weights", "[T, H]")


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm); none visible to torch")
@pytest.mark.gpu
@pytest.mark.parametrize("H", [64, 32])
def test_gpu_model_sizes(H):
    """The models' sizes on the GPU: topk 2048, block 64, vLLM's ROCm layout, rows of one split and
    of several (merge), MTP and prefill rows; the first rows checked against float64."""
    shape = IndexerShape((20000, 9000, 1500, 3000), (1, 2, 1, 40), H, topk=2048, block=64)
    case = make_inputs(shape, device=DEVICE, seed=H)
    case.run(backend="triton")
    assert not bool((case.out == POISON_OUT).any())
    rows = [0, 1, 2, 3, shape.T - 1]
    lg = case.logits()
    # Valid up to float32 rounding: near-ties at the 2048th key may differ from float64's choice.
    assert check_indexer_topk(case.out, lg, 2048, rows=rows) == ""


def test_split_follows_the_rows():
    """A call of few rows halves the split (more items for the grid), never below twice the top-k,
    with the merge still holding a row's candidates in registers; many rows keep the config's."""
    kw = dict(num_heads=16, topk=32, block_size=16, q_dtype=torch.float8_e4m3fn, device=DEVICE)
    cfg = {**SMALL, "split_keys": 1024}
    few = plan_indexer_topk(num_rows=1, max_kv_len=2048, config=cfg, **kw)
    many = plan_indexer_topk(num_rows=4096, max_kv_len=2048, config=cfg, **kw)
    assert many.split_keys == 1024
    assert 2 * few.topk_p2 <= few.split_keys < 1024 and few.merge_constexprs["REG"] > 0


def test_many_items_only_where_items_outnumber_the_grid():
    """A config's many_items fields apply to a call whose (row, split) items outnumber the config's
    grid (programs_per_cu x CUs), not to one with as many or fewer; other fields are refused."""
    kw = dict(num_heads=16, topk=32, block_size=16, q_dtype=torch.float8_e4m3fn, device=DEVICE)
    slots = num_compute_units(DEVICE) * 2
    cfg = {**SMALL, "split_keys": 1024, "programs_per_cu": 2, "many_items": {"select_pack": 2, "programs_per_cu": 3}}
    at = plan_indexer_topk(num_rows=slots, max_kv_len=2048, config=cfg, **kw)  # 2 x slots items
    below = plan_indexer_topk(num_rows=slots // 2, max_kv_len=2048, config=cfg, **kw)  # slots items
    assert at.config["select_pack"] == 2 and at.grid == (num_compute_units(DEVICE) * 3,)
    assert "many_items" not in at.config and at.constexprs["SELECT_PACK"] == 2
    assert below.config["select_pack"] == 1 and below.config["programs_per_cu"] == 2
    assert below.grid == (slots,) and below.constexprs["SELECT_PACK"] == 1
    for bad in ({"BLOCK_N": 32}, {"num_stages": 3}, 4):
        raises_naming(
            ValueError,
            lambda: plan_indexer_topk(num_rows=1, max_kv_len=64, config={**SMALL, "many_items": bad}, **kw),
            "many_items",
        )


# The prefiltered form on any device: a grid of more slots than the items (programs_per_cu 64) and
# prefilter splits of 128 keys (one key a thread), finer than the split form's (twice topk's power
# of two, 256, for topk 100).
PREFILTERED = {**SMALL, "split_keys": 512, "programs_per_cu": 64, "prefilter": {"split_keys": 128}}


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "triton"])
def test_prefiltered_same_bits(backend):
    """A call whose items leave slots idle takes the prefiltered form (bounds, floor, the kept keys'
    merge): rows of many splits, rows shorter than a split and than topk, prefill rows give a valid
    top-k with every entry written, bit for bit the split form's answer."""
    shape = IndexerShape((700, 64, 65, 300, 129), (1, 2, 1, 3, 1), 16, topk=100, block=16)
    case = make_inputs(shape, device=DEVICE, seed=21)
    plan = case.plan(config=PREFILTERED)
    assert plan.prefiltered and plan.split_keys == 128 and plan.num_splits >= 6 and plan.launches == 3
    _run_and_check(case, backend=backend, config=PREFILTERED)
    assert torch.equal(case.run(backend=backend, out=None, config=SMALL), case.out)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "triton"])
def test_prefiltered_merge_holds_slots_a_thread(backend):
    """A prefiltered merge holding several slots a thread (PER > 1: the kernel's column-wise take)
    gives the split form's answer bit for bit, with random logits and with every logit equal (the
    1300-key row then keeps all its keys, fewer than the registers hold, and takes the first topk
    of the tie)."""
    shape = IndexerShape((1300, 64), (1, 1), 16, topk=300, block=16)
    case = make_inputs(shape, device=DEVICE, seed=23)
    plan = case.plan(config=PREFILTERED)
    assert plan.prefiltered and plan.merge_constexprs["PER"] > 1 and plan.merge_constexprs["REG"] > 1300
    _run_and_check(case, backend=backend, config=PREFILTERED)
    assert torch.equal(case.run(backend=backend, out=None, config=SMALL), case.out)
    case.weights.zero_()
    case.run(backend=backend, config=PREFILTERED)
    for t, n in enumerate(shape.kv_lens()):
        k = min(300, n)
        assert case.out[t, :k].tolist() == list(range(k)) and bool((case.out[t, k:] == -1).all()), t
    assert torch.equal(case.run(backend=backend, out=None, config=SMALL), case.out)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "triton"])
def test_prefiltered_ties_keep_every_key(backend):
    """Every logit equal (weights 0, a deliberate tie): the floor keeps every key of a row, more than
    the merge holds in registers for the 700-key row (its passes) and fewer for the others; the
    answer is the first topk positions, as the split form gives."""
    shape = IndexerShape((700, 300, 30), (1, 2, 1), 16, topk=100, block=16)
    case = make_inputs(shape, device=DEVICE, seed=22)
    case.weights.zero_()
    plan = case.plan(config=PREFILTERED)
    assert plan.prefiltered and 300 < plan.merge_constexprs["REG"] < 700
    case.run(backend=backend, config=PREFILTERED)
    for t, n in enumerate(shape.kv_lens()):
        k = min(100, n)
        assert case.out[t, :k].tolist() == list(range(k)) and bool((case.out[t, k:] == -1).all()), t
    assert torch.equal(case.run(backend=backend, out=None, config=SMALL), case.out)


def test_prefilter_only_where_items_leave_slots_idle():
    """The prefiltered form serves a call whose items (at the split its rows give) fill at most a
    quarter of the grid's slots (PREFILTER_FILL): its split is the smallest, from the config's
    prefilter size up, whose items fit the slots, taken where that cuts the rows finer than the
    split form and more than once. Other calls keep the split form. A bad prefilter object is
    refused, naming it."""
    kw = dict(num_heads=16, topk=2048, block_size=16, q_dtype=torch.float8_e4m3fn, device=DEVICE)
    slots = num_compute_units(DEVICE)
    cfg = {**SMALL, "split_keys": 8192, "programs_per_cu": 1, "prefilter": {"split_keys": 128}}
    fits = plan_indexer_topk(num_rows=1, max_kv_len=128 * slots, config=cfg, **kw)
    assert fits.prefiltered and fits.num_splits == slots and fits.split_keys == 128 and not fits.direct
    assert fits.workspace_numel == fits.prefilter_layout()["prefix"][0] + fits.merge_constexprs["S_P2"]
    wider = plan_indexer_topk(num_rows=1, max_kv_len=128 * slots + 1, config=cfg, **kw)
    assert wider.prefiltered and wider.split_keys == 256 and wider.num_splits <= slots
    # one split a row; the slots filled; more than a quarter filled; no finer split fits the slots
    for rows, keys in ((1, 128), (slots, 8192), (slots // 4 + 1, 4096), (slots - 1, 4096)):
        assert not plan_indexer_topk(num_rows=rows, max_kv_len=keys, config=cfg, **kw).prefiltered, (rows, keys)
    for bad in ({"split_keys": 96}, {"split_keys": 64}, {"split_keys": 128, "ranks": 4}, 128):
        raises_naming(
            ValueError,
            lambda: plan_indexer_topk(num_rows=1, max_kv_len=64, config={**SMALL, "prefilter": bad}, **kw),
            "prefilter",
        )


@triton.jit
def _both_selections(stage, n, topk, res, SPLIT: tl.constexpr, PACK: tl.constexpr):
    """(n_valid, nan, thr, k_rem) of the stage's first n keys from the register-held search, then
    from the packed one."""
    row = stage.to(tl.pointer_type(tl.uint32))
    offs = tl.arange(0, SPLIT)
    held = tl.where(offs < n, tl.load(row + offs), 0)
    n_valid, nan, thr, k_rem = _select_in_registers(held, topk)
    tl.store(res + 0, n_valid)
    tl.store(res + 1, nan.to(tl.int32))
    tl.store(res + 2, thr.to(tl.int32, bitcast=True))
    tl.store(res + 3, k_rem)
    n_valid, nan, thr, k_rem = _select_packed(row, n, topk, SPLIT, PACK)
    tl.store(res + 4, n_valid)
    tl.store(res + 5, nan.to(tl.int32))
    tl.store(res + 6, thr.to(tl.int32, bitcast=True))
    tl.store(res + 7, k_rem)


@pytest.mark.skipif(HAS_GPU, reason="the interpreter's check; on a GPU test_gpu_packed_selection_same_bits")
@pytest.mark.parametrize("pack", [2, 4])
def test_packed_selection_equals_register_search(pack):
    """``select_pack``'s digit-at-a-time threshold (fewer registers held) gives the 32-bit search's
    (n_valid, nan, thr, k_rem) exactly: keys spread over the range, sharing all but the last
    digits, many equal, keys whose top digits are 0, the NaN key, slots without a key, k = 0, k =
    n_valid and k past it."""
    split = 512
    g = torch.Generator().manual_seed(pack)

    def u32(x):
        return (x & 0xFFFFFFFF).to(torch.int64)

    sets = {
        "spread": u32(torch.randint(0, 1 << 32, (split,), generator=g, dtype=torch.int64)),
        "shared_top": 0x9ABCD000 + torch.randint(0, 1 << 12, (split,), generator=g),
        "few_values": torch.tensor([0x80000000, 0x80000001, 0xC0000000, 0x7FFFFFFF])[
            torch.randint(0, 4, (split,), generator=g)
        ],
        "small": torch.randint(1, 1 << 9, (split,), generator=g),
        "nan_and_holes": torch.where(
            torch.rand(split, generator=g) < 0.3, 0, 0x80000000 + torch.randint(0, 1 << 20, (split,), generator=g)
        ),
    }
    sets["nan_and_holes"][7] = 0xFFFFFFFF
    res = torch.empty(8, dtype=torch.int32)
    for name, keys in sets.items():
        stage = torch.tensor([k - (1 << 32) if k >= 1 << 31 else k for k in keys.tolist()], dtype=torch.int32)
        # (keys held, k): none (k = 0), one, a full stage with k below it, k = every key held
        # (no search), k past the keys held. Each is an interpreter launch: the list stays short.
        for n, topk in ((0, 1), (1, 1), (split, 37), (300, 300), (300, 600)):
            _both_selections[(1,)](stage, n, topk, res, SPLIT=split, PACK=pack)
            got = res.tolist()
            assert got[:4] == got[4:], f"{name} n={n} topk={topk}: registers {got[:4]}, packed {got[4:]}"


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm); none visible to torch")
@pytest.mark.gpu
def test_gpu_many_items_same_bits():
    """A call with more (row, split) items than the grid takes the config's many_items form (the
    arch's own, or sm90's where the arch has none) and gives bit for bit the form without it."""
    from rocm_mla import _platform
    from rocm_mla.configs import config_for

    shipped = dict(config_for("mla_indexer_topk", _platform.device_arch(DEVICE))["tiers"][0])
    many = shipped.pop("many_items", {"select_pack": 4, "maxnreg": 128, "programs_per_cu": 4})
    cus = num_compute_units(DEVICE)
    case = make_inputs(IndexerShape.decode(2 * cus, 16384, 64, topk=2048, block=64), device=DEVICE, seed=5)
    plan = case.plan(config={**shipped, "many_items": many}, backend="triton")
    assert plan.config["select_pack"] == many["select_pack"] and plan.num_splits >= 2
    assert plan.grid == (min(case.shape.T * plan.num_splits, cus * many["programs_per_cu"]),)
    base = case.run(backend="triton", out=None, config=shipped).clone()
    assert torch.equal(case.run(out=None, plan=plan), base)
    assert check_indexer_topk(base, case.logits(2), 2048, rows=[0, 1]) == ""


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm); none visible to torch")
@pytest.mark.gpu
@pytest.mark.parametrize("pack,maxnreg", [(2, 168), (4, 128)])
def test_gpu_packed_selection_same_bits(pack, maxnreg):
    """``select_pack`` (and a register cap, which NVIDIA takes and AMD ignores) at the models' sizes:
    bit for bit the arch's shipped answer, through split + merge and through one split a row."""
    from rocm_mla import _platform
    from rocm_mla.configs import config_for

    shipped = dict(config_for("mla_indexer_topk", _platform.device_arch(DEVICE))["tiers"][0])
    shipped.pop("prefilter", None)  # (its form has no selection of its own; tested apart)
    cfg = {**shipped, "select_pack": pack, "maxnreg": maxnreg}
    shape = IndexerShape((20000, 9000, 1500, 3000), (1, 2, 1, 40), 64, topk=2048, block=64)
    case = make_inputs(shape, device=DEVICE, seed=pack)
    for kw in ({}, {"max_kv_len": 1 << 17}):
        base = case.run(backend="triton", out=None, config=shipped, **kw).clone()
        assert torch.equal(case.run(backend="triton", out=None, config=cfg, **kw), base)
    # Rows of one split (direct where the arch's config has it), H 32.
    short = make_inputs(IndexerShape((4000, 3000, 2100), (1, 3, 1), 32, topk=2048, block=64), device=DEVICE, seed=9)
    base = short.run(backend="triton", out=None, config=shipped, max_kv_len=4096).clone()
    assert short.plan(config=cfg, max_kv_len=4096).num_splits == 1
    assert torch.equal(short.run(backend="triton", out=None, config=cfg, max_kv_len=4096), base)


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm); none visible to torch")
@pytest.mark.gpu
def test_gpu_prefiltered_same_bits():
    """The arch's prefiltered form (its config's prefilter, or 1024-key splits where it has none) at
    the models' sizes, 2 MTP rows over 128K keys and a row of fewer keys than topk: bit for bit the
    split form (the config without prefilter), a valid top-k against float64; with every logit
    equal (weights 0) the kept keys overflow the merge's registers and the answer is still the
    split form's, the first topk positions."""
    from rocm_mla import _platform
    from rocm_mla.configs import config_for

    shipped = dict(config_for("mla_indexer_topk", _platform.device_arch(DEVICE))["tiers"][0])
    pf = shipped.pop("prefilter", {"split_keys": 1024})
    case = make_inputs(IndexerShape((131072, 1500), (2, 1), 64, topk=2048, block=64), device=DEVICE, seed=7)
    plan = case.plan(config={**shipped, "prefilter": pf}, backend="triton")
    assert plan.prefiltered and plan.num_splits >= 32
    base = case.run(backend="triton", out=None, config=shipped).clone()
    assert torch.equal(case.run(out=None, plan=plan), base)
    assert check_indexer_topk(base, case.logits(3), 2048, rows=[0, 1, 2]) == ""
    case.weights.zero_()
    base = case.run(backend="triton", out=None, config=shipped).clone()
    assert torch.equal(case.run(out=None, plan=plan), base)
    assert base[0].tolist() == list(range(2048)) and bool((base[2, 1500:] == -1).all())


# ----------------------------------------------------------------------------------------------
# An e4m3fn cache under an e4m3fnuz q (the plan's cache_kind): DeepSeek-V4's compressed indexer
# cache, which vLLM writes as OCP e4m3fn on every platform while q takes the platform's kind.

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz


def _decode_e4m3_f64(codes: torch.Tensor, kind: torch.dtype) -> torch.Tensor:
    """float64 values of E4M3 codes from the formats' definitions (not torch's fp8 types): sign,
    4 exponent bits of bias 7 (e4m3fn) or 8 (e4m3fnuz), 3 mantissa bits, subnormals at exponent 0;
    NaN: S.1111.111 (e4m3fn), 0x80 (e4m3fnuz)."""
    c = codes.long()
    bias = 8 if kind == FNUZ else 7
    e, m = (c >> 3) & 0xF, (c & 7).double()
    mag = torch.where(e == 0, m * 2.0 ** (-2 - bias), (1 + m / 8) * torch.pow(2.0, (e - bias).double()))
    val = torch.where((c & 0x80) != 0, -mag, mag)
    nan = (c == 0x80) if kind == FNUZ else ((c & 0x7F) == 0x7F)
    return torch.where(nan, float("nan"), val)


def _expected_fnuz_codes(codes: torch.Tensor) -> torch.Tensor:
    """The transform's rule on uint8 e4m3fn codes: 0x80 -> 0x00, 0x7F / 0xFF -> 0x80, others kept."""
    out = torch.where(codes == 0x80, 0, codes)
    return torch.where((codes & 0x7F) == 0x7F, 0x80, out).to(torch.uint8)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN."""
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


@triton.jit
def _words_probe(src, dst, N: tl.constexpr):
    """dst[i] = fp8_e4m3fn_to_fnuz_half(src[i]), N int32 words of four codes each."""
    o = tl.arange(0, N)
    tl.store(dst + o, fp8_e4m3fn_to_fnuz_half(tl.load(src + o)).to(tl.int32, bitcast=True))


@triton.jit
def _bytes_probe(src, dst, R: tl.constexpr, W: tl.constexpr):
    """The kernel's unpacking: ``[R, W]`` int32 words -> ``[R, 4 W]`` converted codes (uint8)."""
    r = tl.arange(0, R)[:, None]
    words = tl.load(src + r * W + tl.arange(0, W)[None, :])
    tl.store(dst + r * (4 * W) + tl.arange(0, 4 * W)[None, :], _fnuz_half_codes(words, (R, 4 * W)))


@pytest.mark.skipif(HAS_GPU, reason="the byte conversion in the CPU interpreter (integer ops only)")
@pytest.mark.parametrize("seed", [0, 1])
def test_fn_to_fnuz_half_every_code(seed):
    """All 256 e4m3fn codes, in a fresh random order (every code at every byte position of a word
    over the seeds' runs): the converted code read as e4m3fnuz and doubled is torch's own decoding
    of the e4m3fn code (NaN where NaN, -0 as +0), through the word helper and through the kernel's
    unpacking to bytes in memory order; the special codes map as documented."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)[torch.randperm(256, generator=g)]
    want = codes.view(FN).float()
    out = torch.empty(64, dtype=torch.int32)
    _words_probe[(1,)](codes.view(torch.int32), out, N=64)
    got = out.view(torch.uint8)
    assert _same_values(got.view(FNUZ).float() * 2, want)
    assert torch.equal(got, _expected_fnuz_codes(codes))
    assert int(got[codes == 0x80]) == 0x00 and got[(codes & 0x7F) == 0x7F].tolist() == [0x80, 0x80]
    tile = torch.empty(4, 64, dtype=torch.uint8)
    _bytes_probe[(1,)](codes.view(torch.int32).reshape(4, 16), tile, R=4, W=16)
    assert torch.equal(tile.reshape(-1), got)


@triton.jit
def _tile_probe(cache, pages, offs, dst, s_c_blk, BLOCK_N: tl.constexpr, D: tl.constexpr,
                SHUFFLED: tl.constexpr, PAGE_TILE: tl.constexpr):  # fmt: skip
    """The kernel's OCP key tile: key n is row offs[n] of page pages[n] (PAGE_TILE: of pages[0]);
    a negative offset is a key not read; dst [BLOCK_N, D] gets the read keys' codes."""
    n = tl.arange(0, BLOCK_N)
    off = tl.load(offs + n)
    ok = off >= 0
    off = tl.maximum(off, 0)
    if PAGE_TILE:
        base = tl.load(pages).to(tl.int64) * s_c_blk
    else:
        base = tl.load(pages + n).to(tl.int64) * s_c_blk
    codes = _ocp_key_tile(cache, base, off, ok, D, BLOCK_N, SHUFFLED, PAGE_TILE)
    tl.store(dst + n[:, None] * D + tl.arange(0, D)[None, :], codes, mask=ok[:, None])


@pytest.mark.skipif(HAS_GPU, reason="the OCP key tile's loads in the CPU interpreter")
@pytest.mark.parametrize("block,shuffled,page_tile", [(64, False, True), (16, False, False), (1, False, False),
                                                      (64, True, True), (16, True, False)])  # fmt: skip
def test_ocp_key_tile_reads_the_cache(block, shuffled, page_tile):
    """The mixed form's key loads (4-byte words through word pointers, flat and vLLM's 16 x 16
    tiles, one page a tile or a page a key) in the interpreter: every read key's codes are its
    e4m3fn bytes converted (the reference's read-back, index_cache_keys), so its e4m3fnuz values
    doubled are the keys' e4m3fn values; a key holding NaN (0x7F / 0xFF codes) and one holding -0
    among them; keys not read leave dst as it was. A padded block stride (not 132 x block_size)."""
    from rocm_mla.reference.indexer import INDEX_ROW_BYTES, index_cache_keys, indexer_k_cache_write_ref

    g = torch.Generator().manual_seed(block + shuffled)
    n_keys, nb, n_tile = 3 * block + 5, -(-(3 * block + 5) // block) + 1, 32
    stride = block * INDEX_ROW_BYTES + 64
    store = torch.full((nb * stride,), 0xEE, dtype=torch.uint8)
    cache = store.as_strided((nb, block, INDEX_ROW_BYTES), (stride, INDEX_ROW_BYTES, 1))
    k = torch.randn(n_keys, 128, generator=g)
    k[3, 7] = float("nan")
    k[5, :8] = -1e-30  # rounds to e4m3fn -0 (0x80)
    slots = torch.randperm(nb * block, generator=g)[:n_keys]
    indexer_k_cache_write_ref(k, cache, slots, fp8_dtype=FN, shuffled=shuffled)
    # a tile: keys of one page (page_tile) or of any pages, some not read
    if page_tile:
        page = int(slots[0]) // block
        pick = torch.arange(n_tile) % block
        sl = page * block + pick
        pages = torch.full((n_tile,), page, dtype=torch.int32)
    else:
        sl = slots[torch.randint(0, n_keys, (n_tile,), generator=g)]
        sl[:2] = slots[torch.tensor([3, 5])]
        pages = (sl // block).to(torch.int32)
    offs = (sl % block).to(torch.int32)
    skip = torch.rand(n_tile, generator=g) < 0.2
    skip[:2] = False
    offs = torch.where(skip, -1, offs)
    out = torch.full((n_tile, 128), 0x55, dtype=torch.uint8)
    _tile_probe[(1,)](cache, pages, offs, out, stride, BLOCK_N=n_tile, D=128, SHUFFLED=shuffled, PAGE_TILE=page_tile)
    _, values, _ = index_cache_keys(cache, sl, fp8_dtype=FN, shuffled=shuffled)
    read = ~skip
    assert torch.equal(out[read], _expected_fnuz_codes(values.view(torch.uint8))[read])
    assert _same_values(out[read].view(FNUZ).float() * 2, values[read].float())
    assert bool((out[skip] == 0x55).all())
    if not page_tile:  # the NaN key and the -0 key were read
        codes = values.view(torch.uint8)
        assert bool(((codes[0] & 0x7F) == 0x7F).any()) and bool((codes[1] == 0x80).any())


def test_cache_kind_plan_choices_and_errors():
    """cache_kind: None and q's own kind plan the same-kind path (an equal plan, OCP_CACHE off);
    e4m3fn under an e4m3fnuz q turns OCP_CACHE on and keeps the kind on the plan; an e4m3fnuz cache
    under an e4m3fn q, a non-fp8 dtype and a name are ValueErrors naming cache_kind, what is
    accepted and what came, from plan_indexer_topk and plan_indexer_topk_for alike."""
    kw = dict(num_rows=3, num_heads=8, topk=16, max_kv_len=300, block_size=16, device=DEVICE)
    for q_kind in (FN, FNUZ):
        base = plan_indexer_topk(q_dtype=q_kind, **kw)
        same = plan_indexer_topk(q_dtype=q_kind, cache_kind=q_kind, **kw)
        assert same == base and base.cache_kind == q_kind and not base.constexprs["OCP_CACHE"]
    mixed = plan_indexer_topk(q_dtype=FNUZ, cache_kind=FN, **kw)
    assert mixed.cache_kind == FN and mixed.constexprs["OCP_CACHE"] and mixed != plan_indexer_topk(q_dtype=FNUZ, **kw)
    for q_kind, bad, got in (
        (FN, FNUZ, "float8_e4m3fnuz with q_dtype float8_e4m3fn"),
        (FNUZ, torch.float16, "float16 with q_dtype float8_e4m3fnuz"),
        (FNUZ, torch.uint8, "uint8"),
        (FNUZ, "fp8_e4m3fn", "'fp8_e4m3fn'"),
    ):
        raises_naming(
            ValueError, lambda: plan_indexer_topk(q_dtype=q_kind, cache_kind=bad, **kw), "cache_kind",
            "float8_e4m3fn with a float8_e4m3fnuz q", got,
        )  # fmt: skip
    case = make_inputs(IndexerShape((40,), 1, 8, topk=16, block=16), device=DEVICE, fp8=FN)
    q, cache, table = case.q, case.index_cache, case.block_table
    raises_naming(ValueError, lambda: plan_indexer_topk_for(q, cache, table, topk=16, cache_kind=FNUZ), "cache_kind")
    fnuz_q = torch.empty(q.shape, dtype=FNUZ, device=DEVICE)  # (only its dtype and sizes are read)
    from_tensors = plan_indexer_topk_for(fnuz_q, cache, table, topk=16, cache_kind=FN)
    assert from_tensors.constexprs["OCP_CACHE"] and from_tensors.cache_kind == FN


def _independent_logits(case) -> list:
    """float64 logits of every row from the cache's bytes, decoded in the case's cache kind by the
    format's definition and addressed by the documented layout, independent of the reference."""
    bs, shuffled = case.shape.block, case.shuffled
    flat = case.index_cache.cpu().reshape(case.index_cache.shape[0], -1)
    q = _decode_e4m3_f64(case.q.cpu().view(torch.uint8), case.fp8)
    w = case.weights.cpu().double()
    d = torch.arange(128)
    out = []
    for t in range(case.shape.T):
        r, n = int(case.req_ids[t]), int(case.kv_lens[t])
        pos = torch.arange(n)
        page, o = case.block_table.cpu()[r, pos // bs].long(), pos % bs
        if shuffled:
            byte = (o[:, None] // 16) * 2048 + (d[None, :] // 16) * 256 + (o[:, None] % 16) * 16 + d[None, :] % 16
        else:
            byte = o[:, None] * 128 + d[None, :]
        vals = _decode_e4m3_f64(flat[page[:, None], byte], case.cache_kind)
        sb = bs * 128 + 4 * o[:, None] + torch.arange(4)[None, :]
        scale = flat[page[:, None], sb].contiguous().view(torch.float32).double().reshape(n)
        s = q[t] @ (vals * scale[:, None]).T  # [H, n]
        out.append((w[t][:, None] * torch.where(s < 0, 0.0, s)).sum(0))
    return out


@pytest.mark.parametrize("block,shuffled", [(16, False), (64, True)])
def test_reference_reads_the_cache_kind(block, shuffled):
    """The float64 reference with cache_kind=e4m3fn under an e4m3fnuz q against the formats' own
    definitions (an e4m3fn cache as vLLM's DeepSeek-V4 writer fills it: scales from e4m3fn's 448):
    the same logits, a NaN key code makes its row the sentinel, a -0 code (e4m3fnuz's NaN) does
    not. Read as q's kind instead (cache_kind None) the same bytes give half the logits, the NaN
    key is lost and the -0 row turns NaN: the knob decides. The op's reference backend with a mixed plan gives the
    top-k of the independent logits."""
    shape = IndexerShape((150, 33, 90), (1, 2, 3), 8, topk=24, block=block)
    case = make_inputs(shape, fp8=FNUZ, cache_kind=FN, shuffled=shuffled, seed=block)
    assert case.cache_kind == FN and case.plan().constexprs["OCP_CACHE"]
    # A NaN code in row 0's keys (position 40 of request 0), -0 codes in request 1's position 7.
    flat = case.index_cache.view(case.index_cache.shape[0], -1)

    def code_at(req, pos, dim):
        o = pos % block
        byte = (o // 16) * 2048 + (dim // 16) * 256 + (o % 16) * 16 + dim % 16 if shuffled else o * 128 + dim
        return int(case.block_table[req, pos // block]), byte

    flat[code_at(0, 40, 5)] = 0xFF
    for dim in (0, 9, 77):
        flat[code_at(1, 7, dim)] = 0x80
    want = _independent_logits(case)
    got = case.logits()
    for t in range(shape.T):
        assert got[t].shape == want[t].shape, t
        assert torch.allclose(got[t], want[t], rtol=1e-12, atol=0, equal_nan=True), t
    assert bool(torch.isnan(want[0]).any())  # the NaN key's row
    rows_req1 = [t for t in range(shape.T) if int(case.req_ids[t]) == 1]
    assert rows_req1 and not any(bool(torch.isnan(want[t]).any()) for t in rows_req1)
    from rocm_mla.reference.indexer_topk import mla_indexer_logits_ref

    # cache_kind None: the bytes read as q's kind. The NaN code reads as -240 (the NaN is lost), the
    # -0 codes as NaN, every other value at half.
    as_q = mla_indexer_logits_ref(*case._ref_args(shape.T, 0), shuffled=shuffled)
    for t in range(shape.T):
        if t in rows_req1:
            assert bool(torch.isnan(as_q[t]).any()), t
        elif t == 0:
            assert not bool(torch.isnan(as_q[t]).any())
        else:
            assert torch.allclose(as_q[t] * 2, want[t], rtol=1e-12, atol=0), t
    out = case.run(backend="reference")
    assert bool((out[0] == SENTINEL).all())
    assert check_indexer_topk(out, want, shape.topk) == ""


@pytest.mark.skipif(HAS_GPU, reason="the interpreter's limit; on a GPU test_gpu_mixed_cache_kind")
def test_mixed_form_compiles_for_gfx942(tmp_path):
    """The mixed form's Triton kernel (OCP_CACHE) cannot run in the CPU interpreter: Triton's
    interpreter has no e4m3fnuz type (a pointer to one fails before the kernel starts), so an
    e4m3fnuz q never reaches it. The interpreter checks the mixed form's own helpers (above: the
    byte conversion of every code, the key tile's loads); here the ISA report compiles the mixed
    form for gfx942 as the op launches it (its split and prefiltered forms, flat and shuffled
    caches of block 64), with fp8 MFMA for q . k, an e4m3fn uint8 cache and no spills; the
    GPU-marked test runs it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler, not the interpreter
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "rocm_mla.tools.isa_report", "--arch", "gfx942", "--filter", "cache=fp8e4nv",
           "-q", "--strict", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert len(rows) >= 4 and {r["kernel"] for r in rows} == {"mla_indexer_topk"}, rows
    for words in (("flat", " split"), ("flat", "bounds"), ("shuffled", " split"), ("shuffled", "bounds")):
        assert any(all(w in r["config"] for w in words) for r in rows), words
    for r in rows:
        assert r["error"] == "" and r["spills"] == 0 and r["scratch"] == 0 and r["mfma"] > 0, r
        assert "q=fp8e4b8" in r["config"], r["config"]
    from rocm_mla.variants.indexer_topk import triton_variants

    mixed = [v for v in triton_variants("gfx942") if v.constexprs.get("OCP_CACHE")]
    assert {v.config for v in mixed} == {r["config"] for r in rows}
    assert all(v.signature["cache"] == "*u8" for v in mixed)
    assert not any(v.constexprs.get("OCP_CACHE") for v in triton_variants("gfx950"))  # e4m3fn q there


def _triton_e4m3fnuz() -> str:
    """An empty string when the GPU's Triton backend has e4m3fnuz (fp8e4b8), else why not."""
    from triton.compiler.compiler import make_backend

    target = triton.runtime.driver.active.get_current_target()
    kinds = getattr(make_backend(target).parse_options({}), "supported_fp8_dtypes", ())
    if "fp8e4b8" in kinds:
        return ""
    return f"Triton's {target.backend} backend ({target.arch}) has no e4m3fnuz (fp8e4b8); its fp8 kinds: {kinds}"


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm); none visible to torch")
@pytest.mark.gpu
@pytest.mark.parametrize("shuffled", [False, True])
def test_gpu_mixed_cache_kind(shuffled):
    """An e4m3fn cache under an e4m3fnuz q on the GPU (where Triton has e4m3fnuz: AMD), in the
    split + merge form and the arch's own: every entry written, a valid top-k of the float64
    logits of the e4m3fn keys, the reference backend's answer wherever float64 separates the
    top-k; a NaN key code gives its row the sentinel and -0 codes do not."""
    why = _triton_e4m3fnuz()
    if why:
        pytest.skip(why)
    shape = IndexerShape((3000, 700, 64, 300), (1, 2, 1, 6), 64, topk=256, block=64)
    case = make_inputs(shape, device=DEVICE, fp8=FNUZ, cache_kind=FN, shuffled=shuffled, seed=41 + shuffled)
    flat = case.index_cache.view(case.index_cache.shape[0], -1)
    o = 100 % 64
    dim = 3
    byte = (o // 16) * 2048 + (dim // 16) * 256 + (o % 16) * 16 + dim % 16 if shuffled else o * 128 + dim
    flat[int(case.block_table[1, 100 // 64]), byte] = 0x7F  # request 1's position 100: both its rows see it
    flat[int(case.block_table[0, 0]), :128] = 0x80  # -0 codes in request 0's first page
    lg = case.logits()
    ref = case.run(backend="reference", out=None).clone()
    for cfg in (None, SMALL):
        case.out.fill_(POISON_OUT)
        out = case.run(backend="triton", config=cfg)
        assert case.plan(config=cfg).constexprs["OCP_CACHE"]
        assert not bool((out == POISON_OUT).any())
        assert out[1].tolist() == [SENTINEL] * 256 and out[2].tolist() == [SENTINEL] * 256
        assert bool((out[0] >= 0).all())
        assert check_indexer_topk(out, lg, 256) == ""
        for t in range(shape.T):
            v = torch.sort(lg[t], descending=True).values
            if v.numel() > 256 and float(v[255] - v[256]) <= 1e-4 * float(v.abs().max()):
                continue  # a near-tie at the boundary
            assert torch.equal(out[t].cpu(), ref[t].cpu()), t
