"""mla_indexer_topk's streamed form (many rows at long context): the split kernel writes every
row's order keys, a program a row selects from them by a radix search. The same answer as the
split form bit for bit, on every shape and layout; the plan takes it only where the split form's
items outnumber the grid and the keys fit STREAMED_MAX_BYTES; the radix search equals the
register-held one on hard key sets; a row's answer does not depend on its batch."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from _util import DEVICE, HAS_GPU, raises_naming

import rocm_mla
import rocm_mla.ops.indexer_topk_plan as plan_mod
from rocm_mla.cases.indexer_topk import POISON_OUT, IndexerShape, make_inputs
from rocm_mla.kernels.indexer_select import _select_in_registers, _select_radix
from rocm_mla.ops.indexer_topk import plan_indexer_topk_for
from rocm_mla.ops.indexer_topk_plan import STREAMED_MAX_BYTES, plan_indexer_topk
from rocm_mla.reference.indexer_topk import check_indexer_topk

SMALL = {"split_keys": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "merge": {"chunk": 64, "num_warps": 4}}
# The streamed form of small splits: several a row in the CPU interpreter.
STREAMED = {**SMALL, "streamed": {"split_keys": 128, "programs_per_cu": 2, "select": {"chunk": 128, "num_warps": 4}}}


@pytest.fixture
def four_cus(monkeypatch):
    """The plans count 4 CUs (the CPU interpreter's) on every device, so that small calls' items
    outnumber the grid on a GPU too."""
    monkeypatch.setattr(plan_mod, "num_compute_units", lambda device: 4)


@pytest.mark.parametrize(
    "lens,rows,H,topk,block,shuffled",
    [
        ((700, 300, 129, 1, 64), (1, 2, 5, 1, 1), 16, 24, 16, True),  # decode, MTP, prefill rows; 1 key
        ((1000, 37, 256), (3, 1, 1), 8, 200, 16, False),  # rows shorter than topk
        ((513, 90, 260), (1, 1, 2), 1, 32, 1, False),  # one head, pages of one token
        ((900, 300), (2, 1), 24, 64, 64, True),  # vLLM's block, 24 heads
        ((400, 130), (1, 3), 8, 48, 12, False),  # a block size not a power of two
    ],
)
def test_same_bits_as_the_split_form(four_cus, lens, rows, H, topk, block, shuffled):
    """Every entry written, a valid top-k against float64, and bit for bit the split form's answer."""
    shape = IndexerShape(lens, rows, H, topk=topk, block=block)
    case = make_inputs(shape, device=DEVICE, seed=sum(lens) + H, shuffled=shuffled)
    plan = case.plan(config=STREAMED)
    assert plan.streamed and plan.num_splits > 1 and plan.launches == 2
    case.run(plan=plan)
    assert not bool((case.out == POISON_OUT).any()), "an entry of out was not written"
    case.check()
    assert torch.equal(case.run(out=None, config=SMALL), case.out)


def test_ties_take_the_first_positions(four_cus):
    """Every logit equal (weights 0): each row takes its first min(topk, kv_len) positions, then -1."""
    shape = IndexerShape((700, 300, 30), (1, 2, 1), 16, topk=100, block=16)
    case = make_inputs(shape, device=DEVICE, seed=22)
    case.weights.zero_()
    assert case.plan(config=STREAMED).streamed
    case.run(config=STREAMED)
    for t, n in enumerate(shape.kv_lens()):
        k = min(100, n)
        assert case.out[t, :k].tolist() == list(range(k)) and bool((case.out[t, k:] == -1).all()), t


def test_row_alone_equals_row_in_batch(four_cus):
    """A row's answer is bitwise the same in a streamed batch and alone (where the plan takes the
    split form)."""
    shape = IndexerShape((300, 90, 40), (2, 1, 3), 16, topk=32, block=16)
    case = make_inputs(shape, device=DEVICE, seed=9)
    assert case.plan(config=STREAMED).streamed
    full = case.run(config=STREAMED).clone()
    for t in (0, 2, 5):
        q1 = case.q[t : t + 1]
        plan = plan_indexer_topk_for(q1, case.index_cache, case.block_table, topk=32, shuffled=case.shuffled,
                                     config=STREAMED)  # fmt: skip
        assert not plan.streamed
        alone = rocm_mla.mla_indexer_topk(
            q1, case.weights[t : t + 1], case.index_cache, case.block_table, case.req_ids[t : t + 1],
            case.kv_lens[t : t + 1], topk=32, plan=plan,
        )  # fmt: skip
        assert torch.equal(alone[0], full[t]), t


def test_taken_only_where_items_fill_the_grid_and_the_keys_fit():
    """The plan takes the streamed form where the split form's (row, split) items outnumber its grid
    (programs_per_cu x CUs) and the rows' keys (T x max_keys x 4 bytes) fit STREAMED_MAX_BYTES, else
    the split or prefiltered form; its workspace is the rows' keys. A bad streamed object is refused,
    naming it."""
    kw = dict(num_heads=64, topk=2048, block_size=64, q_dtype=torch.float8_e4m3fn, device=DEVICE)
    cus = plan_mod.num_compute_units(DEVICE)
    cfg = {**SMALL, "split_keys": 4096, "streamed": {"split_keys": 256, "programs_per_cu": 8,
                                                     "select": {"chunk": 1024, "num_warps": 8}}}  # fmt: skip
    busy = plan_indexer_topk(num_rows=cus + 1, max_kv_len=4096, config=cfg, **kw)
    assert busy.streamed and busy.split_keys == 256 and busy.num_splits == 16 and busy.grid == (min(8 * cus, 16 * (cus + 1)),)
    assert busy.workspace_numel == (cus + 1) * 4096 and busy.merge_grid == (cus + 1,)
    assert not plan_indexer_topk(num_rows=cus, max_kv_len=4096, config=cfg, **kw).streamed  # the grid's items
    rows = STREAMED_MAX_BYTES // (4 * 1 << 20)
    assert plan_indexer_topk(num_rows=rows, max_kv_len=1 << 20, config=cfg, **kw).streamed
    long = plan_indexer_topk(num_rows=rows + 1, max_kv_len=1 << 20, config=cfg, **kw)  # past the bound
    assert not long.streamed
    assert not plan_indexer_topk(num_rows=8192, max_kv_len=32768, config=cfg, **kw).streamed  # a long prefill
    for bad in ({"split_keys": 256}, {"split_keys": 96, "select": {"chunk": 64, "num_warps": 4}},
                {"split_keys": 256, "select": {"chunk": 64}}, {"split_keys": 256, "tiles": 2, "select": {}}, 256):  # fmt: skip
        raises_naming(ValueError, lambda: plan_indexer_topk(num_rows=cus + 1, max_kv_len=4096,
                                                            config={**SMALL, "streamed": bad}, **kw), "streamed")  # fmt: skip


@triton.jit
def _both_searches(stage, n, topk, res, SPLIT: tl.constexpr):
    """(n_valid, nan, thr, k_rem) of the stage's first n keys from the register-held search, then
    from the radix search over memory."""
    row = stage.to(tl.pointer_type(tl.uint32))
    offs = tl.arange(0, SPLIT)
    n_valid, nan, thr, k_rem = _select_in_registers(tl.where(offs < n, tl.load(row + offs), 0), topk)
    tl.store(res + 0, n_valid)
    tl.store(res + 1, nan.to(tl.int32))
    tl.store(res + 2, thr.to(tl.int32, bitcast=True))
    tl.store(res + 3, k_rem)
    n_valid, nan, thr, k_rem = _select_radix(row, n, topk, 128)
    tl.store(res + 4, n_valid)
    tl.store(res + 5, nan.to(tl.int32))
    tl.store(res + 6, thr.to(tl.int32, bitcast=True))
    tl.store(res + 7, k_rem)


def _taken(keys: list[int], thr: int, k_rem: int) -> list[int]:
    """The positions a take over ``keys`` (uint32 values) keeps: > thr, or among the first k_rem ==
    thr; never a no-key 0."""
    thr &= 0xFFFFFFFF
    eq = [j for j, k in enumerate(keys) if k == thr and k != 0][: max(k_rem, 0)]
    return sorted([j for j, k in enumerate(keys) if k > thr] + eq)


def test_radix_search_equals_register_search():
    """The radix search gives the 32-bit register search's keys held, NaN flag and taken keys
    (where every key is taken it skips the search: (thr, k_rem) then differ, the take does not): keys
    spread over the range, sharing their top digits, few distinct values, keys whose top digits are
    0, the NaN key among holes; no key (k = 0), one, k below the keys held, k = every key held and k
    past them."""
    split = 512
    g = torch.Generator().manual_seed(5)
    sets = {
        "spread": torch.randint(0, 1 << 32, (split,), generator=g, dtype=torch.int64),
        "shared_top": 0x9ABCD000 + torch.randint(0, 1 << 12, (split,), generator=g),
        "shared_two_digits": 0xC0A01400 + torch.randint(0, 1 << 10, (split,), generator=g),
        "few_values": torch.tensor([0x80000000, 0x80000001, 0xC0000000, 0x7FFFFFFF])[
            torch.randint(0, 4, (split,), generator=g)
        ],
        "small": torch.randint(1, 1 << 9, (split,), generator=g),
        "nan_and_holes": torch.where(
            torch.rand(split, generator=g) < 0.3, 0, 0x80000000 + torch.randint(0, 1 << 20, (split,), generator=g)
        ),
    }
    sets["nan_and_holes"][7] = 0xFFFFFFFF
    res = torch.empty(8, dtype=torch.int32, device=DEVICE)
    for name, keys in sets.items():
        stage = torch.tensor([k - (1 << 32) if k >= 1 << 31 else k for k in keys.tolist()], dtype=torch.int32)
        stage = stage.to(DEVICE)
        for n, topk in ((0, 1), (1, 1), (split, 37), (300, 300), (300, 600), (split, 1)):
            _both_searches[(1,)](stage, n, topk, res, SPLIT=split, num_warps=4)
            got = res.tolist()
            what = f"{name} n={n} topk={topk}: registers {got[:4]}, radix {got[4:]}"
            assert got[:2] == got[4:6], what
            held = keys[:n].tolist()
            regs = _taken(held, got[2], got[3])
            assert _taken(held, got[6], got[7]) == regs and len(regs) == min(topk, got[0]), what
            if min(topk, got[0]) < got[0]:  # a search ran: the same threshold
                assert got[2:4] == got[6:8], what


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm); none visible to torch")
@pytest.mark.gpu
@pytest.mark.parametrize("H,topk", [(64, 2048), (32, 2048), (64, 512)])
def test_gpu_model_sizes_same_bits(H, topk):
    """The arch's streamed form at the models' sizes (DeepSeek-V3.2's 64 heads, GLM-5's 32, V4's
    top-512), 160 rows over up to 40K keys and MTP rows: bit for bit the split form (the config
    without the streamed object), a valid top-k against float64 on sampled rows; all logits equal
    (weights 0) gives the first topk positions."""
    from rocm_mla import _platform
    from rocm_mla.configs import config_for

    shipped = dict(config_for("mla_indexer_topk", _platform.device_arch(DEVICE))["tiers"][0])
    split_only = {k: v for k, v in shipped.items() if k != "streamed"}
    lens = tuple(40000 - 397 * i for i in range(80))
    case = make_inputs(IndexerShape(lens, 2, H, topk=topk, block=64), device=DEVICE, seed=H + topk)
    plan = case.plan(config=shipped)
    assert plan.streamed, "the shipped config's streamed form is not taken at 160 rows x 40K keys"
    got = case.run(out=None, plan=plan).clone()
    assert torch.equal(case.run(out=None, config=split_only), got)
    rows = [0, 1, 77, 159]
    assert check_indexer_topk(got[rows], case.logits(160)[rows], topk) == ""
    case.weights.zero_()
    got = case.run(out=None, plan=plan)
    assert got[0].tolist() == list(range(topk))
