"""mla_indexer_topk's row groups (``group_rows``: consecutive rows scored from the same key tiles, so
the MTP rows of a request read each key once): bit for bit the ungrouped answer in every form,
whatever the request ids (groups across requests, rows past T, bad rows in a group), the plan's
rules and errors."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, HAS_GPU, backends, raises_naming

from rocm_mla.cases import Guarded
from rocm_mla.cases.indexer_topk import POISON_OUT, IndexerShape, make_inputs
from rocm_mla.ops.indexer_topk_plan import GROUP_ROWS_MAX, plan_indexer_topk
from rocm_mla.reference.indexer_topk import SENTINEL, check_indexer_topk

pytestmark = pytest.mark.skipif("triton" not in backends(), reason="row groups are a Triton launch form")

SMALL = {"split_keys": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "merge": {"chunk": 64, "num_warps": 4},
         "group_rows": GROUP_ROWS_MAX}  # fmt: skip
# The forms a grouped call can take: one split a row (direct); splits and a merge; tiles of one page.
FORMS = {
    "direct": {"split_keys": 512, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "group_rows": GROUP_ROWS_MAX},
    "splits": SMALL,
    "page-tile": {**SMALL, "BLOCK_N": 16},
}
# A config whose calls of few items are prefiltered (never grouped).
PREFILTERED = {**SMALL, "num_warps": 1, "programs_per_cu": 64, "prefilter": {"split_keys": 32}}
# Requests of 2, 3, 1 and 5 rows (MTP and prefill rows; groups of 2, 3 and 4 straddle requests),
# contexts shorter than topk, a split and a block, and longer.
SHAPE = IndexerShape((300, 70, 9, 150, 40), (2, 3, 1, 5, 2), 16, topk=24, block=16)


def _grouped(case, form: str, group: int, **kw) -> torch.Tensor:
    plan = case.plan(config=FORMS[form], group_rows=group, **kw)
    assert plan.group_rows == group
    case.out.fill_(POISON_OUT)
    case.run(plan=plan)
    assert not bool((case.out == POISON_OUT).any()), "an entry of out was not written"
    return case.out.clone()


@pytest.mark.parametrize("form", list(FORMS))
def test_groups_give_the_same_bits(form):
    """Groups of 2 and 3 rows (4 in the split form): a valid top-k, bit for bit the ungrouped call's,
    in every form."""
    case = make_inputs(SHAPE, device=DEVICE, seed=31)
    base = _grouped(case, form, 1)
    case.check()
    for group in (2, 3, 4) if form == "splits" else (2, 3):
        assert torch.equal(_grouped(case, form, group), base), group


@pytest.mark.parametrize("form", ["splits", "page-tile"])
def test_bad_rows_in_a_group(form):
    """Rows of one request where one row is bad (kv_len past the table, negative, a NaN weight) and
    a group whose first row's request is -1: exactly the planted rows get the sentinel, their
    group's other rows stay the ungrouped answer, and nothing is read outside the guarded cache."""
    case = make_inputs(IndexerShape((200, 90, 120), (3, 3, 2), 16, topk=24, block=16), device=DEVICE, seed=32)
    base = _grouped(case, form, 1)
    case.kv_lens[1] = case.block_table.shape[1] * 16 + 1  # request 0's middle row
    case.kv_lens[5] = -1  # request 1's last row
    case.weights[6, 2] = float("nan")  # request 2's first row
    case.req_ids[3] = -1  # request 1's first row: a group of 3 then starts with it
    guarded = Guarded(tuple(case.index_cache.shape), torch.uint8, device=DEVICE, fill=case.index_cache, guard=4096)
    case.caches[0] = guarded.view
    bad = [1, 3, 5, 6]
    for group in (1, 2, 3):
        out = _grouped(case, form, group)
        for t in range(case.shape.T):
            if t in bad:
                assert bool((out[t] == SENTINEL).all()), (group, t)
            else:
                assert torch.equal(out[t], base[t]), (group, t)
    guarded.check("index_cache")


def test_candidate_modes_in_groups():
    """DeepSeek-V4.1's two-level calls (lists, then the mask) in groups of 2 and 3: the same lists
    and answers as ungrouped."""
    case = make_inputs(SHAPE, device=DEVICE, seed=33)
    base = case.run_two_level(8, 6, config=SMALL, group_rows=1)
    assert case.two_level_mismatch(*base, 8) == ""
    for group in (2, 3):
        got = case.run_two_level(8, 6, config=SMALL, group_rows=group)
        for a, b in zip(got, base):
            assert torch.equal(a, b), group


def test_plan_rules_and_errors():
    """group_rows is capped by GROUP_ROWS_MAX and the arch's config (an arch whose grouped form
    spills keeps 1), sizes the stages grid x group_rows x split_keys; a bad value names the
    argument."""
    case = make_inputs(SHAPE, device=DEVICE, seed=34)
    assert case.plan(config={k: v for k, v in SMALL.items() if k != "group_rows"}, group_rows=4).group_rows == 1
    assert case.plan(config={**SMALL, "group_rows": 2}, group_rows=4).group_rows == 2
    assert case.plan(config={**SMALL, "group_rows": 64}, group_rows=9).group_rows == GROUP_ROWS_MAX
    plan = case.plan(config=SMALL, group_rows=3)
    assert plan.stage_numel == plan.grid[0] * 3 * plan.split_keys
    assert plan.grid[0] <= -(-SHAPE.T // 3) * plan.num_splits
    kw = dict(num_rows=4, num_heads=8, topk=8, max_kv_len=64, block_size=16, q_dtype=case.fp8, device=DEVICE)
    for bad in (0, -1, True, 2.0, "2"):
        raises_naming(ValueError, lambda b=bad: plan_indexer_topk(**kw, group_rows=b), "group_rows", repr(bad))


def test_plan_takes_rows_alone_where_grouping_was_slower():
    """Where rows alone outnumber the grid and the config has a many_items form, and where the
    grouped call would be prefiltered, a plan asked for groups is the plan of rows alone (those
    forms were the faster there); it still records what it was asked (a kept plan matches on it).
    A grouped plan leaves out many_items."""
    case = make_inputs(SHAPE, device=DEVICE, seed=34)
    many = {"select_pack": 2, "programs_per_cu": 1}
    fits = {**SMALL, "programs_per_cu": 64, "many_items": many}  # 13 rows x 5 splits fit 4 CUs x 64
    plan = case.plan(config=fits, group_rows=2)
    assert (plan.group_rows, plan.group_rows_asked, plan.config.get("select_pack", 1)) == (2, 2, 1)
    crowded = {**SMALL, "many_items": many}  # 65 items outnumber 4 CUs x 1
    plan, alone = case.plan(config=crowded, group_rows=2), case.plan(config=crowded, group_rows=1)
    assert (plan.group_rows, plan.group_rows_asked, plan.config["select_pack"]) == (1, 2, 2)
    assert (plan.grid, plan.num_splits, plan.config) == (alone.grid, alone.num_splits, alone.config)
    assert case.plan(config={k: v for k, v in crowded.items() if k != "many_items"}, group_rows=2).group_rows == 2
    # Groups would leave few enough items for the prefiltered form: rows alone, in the split form
    # here and prefiltered for a lone request's 2 rows.
    lone = make_inputs(IndexerShape((300,), 2, 16, topk=24, block=16), device=DEVICE, seed=36)
    for c, form in ((case, False), (lone, True)):
        plan, alone = c.plan(config=PREFILTERED, group_rows=2), c.plan(config=PREFILTERED, group_rows=1)
        assert (plan.group_rows, plan.group_rows_asked, plan.prefiltered, alone.prefiltered) == (1, 2, form, form)
        assert (plan.grid, plan.num_splits, plan.split_keys) == (alone.grid, alone.num_splits, alone.split_keys)
        c.out.fill_(POISON_OUT)
        c.run(plan=plan)
        c.check()


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm); none visible to torch")
@pytest.mark.gpu
def test_gpu_groups_same_bits():
    """The arch's own config allowed GROUP_ROWS_MAX rows at the models' sizes (2 and 4 MTP rows a
    request over 8K and 32K keys, H 64; a lone request's 2 rows over 128K keys): bit for bit the
    ungrouped answer, a valid top-k against float64, and at least one shape grouped on this GPU."""
    from rocm_mla import _platform
    from rocm_mla.configs import config_for

    tier = dict(config_for("mla_indexer_topk", _platform.device_arch(DEVICE))["tiers"][0])
    grouped = {**tier, "group_rows": GROUP_ROWS_MAX}
    took = []
    for shape in (IndexerShape.decode(16, 32768, 64, 2), IndexerShape.decode(16, 32768, 64, 4),
                  IndexerShape.decode(64, 8192, 64, 2), IndexerShape.decode(1, 131072, 64, 2)):  # fmt: skip
        case = make_inputs(shape, device=DEVICE, seed=35)
        base = case.run(out=None, config=tier, group_rows=1).clone()
        assert check_indexer_topk(base, case.logits(4), 2048, rows=[0, 1, 2, 3][: shape.T]) == ""
        plan = case.plan(config=grouped, group_rows=shape.rows[0])
        took.append(plan.group_rows)
        assert torch.equal(case.run(out=None, plan=plan), base), shape.label()
    assert max(took) > 1, took
