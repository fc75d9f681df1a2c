"""mla_indexer_topk's candidate blocks (DeepSeek-V4.1's two-level indexer): the source layer's
lists ("select": each row's best blocks by their largest logit, the newest always in) and the
later layers' mask ("mask": only the keys of the listed blocks count), on every form of the op."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, HAS_GPU, backends, raises_naming

from rocm_mla.cases.indexer_topk import POISON_LISTS, POISON_OUT, IndexerShape, make_inputs
from rocm_mla.ops.indexer_topk import plan_indexer_topk_for
from rocm_mla.reference.indexer_topk import (
    SENTINEL,
    candidate_keep_ref,
    check_indexer_topk,
    mla_indexer_candidates_ref,
)

BACKENDS = [b for b in ("triton", "reference") if b in backends()]
SMALL = {"split_keys": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "merge": {"chunk": 64, "num_warps": 4}}
# config None: one split a row (direct); SMALL: splits and a merge; the last: the prefiltered form.
FORMS = {
    "direct": None,
    "splits": SMALL,
    "prefiltered": {**SMALL, "num_warps": 1, "programs_per_cu": 64, "prefilter": {"split_keys": 32}},
}
# (backend, form): the Triton forms, and the reference (which plans no forms).
BACKEND_FORMS = [(b, f) for b in BACKENDS for f in (FORMS if b == "triton" else ["direct"])]


# (candidate block size, lists' columns, page size) x (backend, form); the interpreter's slowest form,
# the prefiltered one, at V4.1's block size alone.
SOURCE_CASES = [
    (cbs, C, block, backend, form)
    for cbs, C, block in [(8, 6, 16), (1, 40, 1), (16, 3, 64), (4, 1, 16)]
    for backend, form in BACKEND_FORMS
    if form != "prefiltered" or cbs == 8
]


@pytest.mark.parametrize("cbs,C,block,backend,form", SOURCE_CASES)
def test_source_lists_and_masked_rows(cbs, C, block, backend, form):
    """Decode, MTP and prefill rows (contexts shorter than a block, than the lists and than topk,
    and longer): the source's own answer is the plain top-k, its lists a valid top of the blocks
    (newest always in), and the masked call a valid top-k of the listed blocks' keys."""
    shape = IndexerShape((3, 70, 300, 129), (1, 2, 5, 1), 16, topk=24, block=block)
    case = make_inputs(shape, device=DEVICE, seed=cbs + C)
    own, lists, masked = case.run_two_level(cbs, C, backend=backend, config=FORMS[form])
    assert case.two_level_mismatch(own, lists, masked, cbs) == ""
    # Where float64 separates the blocks, the lists are the reference's exactly.
    ref = mla_indexer_candidates_ref(case.logits(), block_size=cbs, num_blocks=C)
    assert int((ref.cpu() != lists[: shape.T].cpu()).any(1).sum()) <= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_lists_in_any_order_with_padding_and_ids_past_the_row(backend):
    """vLLM's lists come in score order with -1 padding and may name blocks past a short row: the
    same answer as the sorted list, and an id past the row covers nothing."""
    shape = IndexerShape((200, 37), (3, 1), 8, topk=16, block=16)
    case = make_inputs(shape, device=DEVICE, seed=5)
    T, cbs = shape.T, 8
    g = torch.Generator().manual_seed(1)
    lists = torch.stack([torch.randperm(30, generator=g)[:6] for _ in range(T)]).to(torch.int32)
    lists[:, 4] = -1
    lists[T - 1, 0] = 999  # past the 37-key row's blocks
    outs = []
    for order in (lists, lists.sort(dim=1, descending=True).values):
        case.out.fill_(POISON_OUT)
        plan = case.plan(candidate_mode="mask", candidate_block_size=cbs, candidate_blocks=6, backend=backend)
        case.run(plan=plan, candidates=order.to(case.q.device))
        outs.append(case.out.clone())
    assert torch.equal(outs[0], outs[1])
    lg = case.logits()
    assert check_indexer_topk(outs[0], lg, 16, keep=candidate_keep_ref(lists, lg, cbs)) == ""


@pytest.mark.parametrize("backend,form", [bf for bf in BACKEND_FORMS if bf[1] != "prefiltered"])
def test_bad_lists_nan_and_bad_rows(backend, form):
    """An entry below -1 makes its row the sentinel; a NaN scale of an unlisted key leaves the row
    alone, of a listed key makes it the sentinel; a bad row's lists are the sentinel; the other
    rows are untouched."""
    shape = IndexerShape((120, 120, 120, 120, 120), 1, 8, topk=16, block=16)
    case = make_inputs(shape, device=DEVICE, seed=9)
    T, cbs, C = shape.T, 8, 4
    lists = torch.tensor([[0, 1, 2, 14]] * T, dtype=torch.int32)
    lists[1, 2] = -3
    bs = shape.block
    for t, pos in ((2, 100), (3, 4)):  # 100 is in block 12 (unlisted), 4 in block 0 (listed)
        page = int(case.block_table[t, pos // bs])
        case.index_cache[page].reshape(-1)[bs * 128 + 4 * (pos % bs) :][:4] = 0xFF
    plan = case.plan(candidate_mode="mask", candidate_block_size=cbs, candidate_blocks=C, backend=backend,
                     config=FORMS[form])  # fmt: skip
    case.run(plan=plan, candidates=lists.to(case.q.device))
    out = case.out.cpu()
    for t in (1, 3):
        assert out[t].tolist() == [SENTINEL] * 16, t
    lg = case.logits()
    good = [0, 2, 4]
    assert check_indexer_topk(case.out, lg, 16, rows=good, keep=candidate_keep_ref(lists, lg, cbs)) == ""
    # The source on a bad row (request out of range) and a kv_len past the table.
    case.req_ids[0] = 7
    case.kv_lens[4] = 10_000
    out_lists = torch.full((T, C), POISON_LISTS, dtype=torch.int32, device=case.q.device)
    plan = case.plan(candidate_mode="select", candidate_block_size=cbs, candidate_blocks=C, backend=backend,
                     config=FORMS[form])  # fmt: skip
    case.run(plan=plan, candidates_out=out_lists)
    o = out_lists.cpu()
    assert o[0].tolist() == [SENTINEL] * C and o[4].tolist() == [SENTINEL] * C
    assert 12 in o[2].tolist() and 14 in o[2].tolist()  # its NaN block (position 100) and newest (119)


@pytest.mark.skipif("triton" not in BACKENDS, reason="the Triton forms")
def test_row_alone_equals_row_in_batch():
    """Batch invariance holds with candidates: a row's lists and masked answer bit for bit the same
    alone and among other rows, in every form."""
    shape = IndexerShape((300, 90, 170), (2, 1, 3), 16, topk=24, block=16)
    case = make_inputs(shape, device=DEVICE, seed=4)
    alone = make_inputs(IndexerShape((170,), 3, 16, topk=24, block=16), device=DEVICE, seed=4)
    alone.q.copy_(case.q[3:6])
    alone.weights.copy_(case.weights[3:6])
    alone.caches[0], alone.tables[0] = case.caches[0], case.tables[0][2:3]
    for cfg in FORMS.values():
        _, lists, masked = case.run_two_level(8, 5, config=cfg)
        _, lists1, masked1 = alone.run_two_level(8, 5, config=cfg)
        assert torch.equal(lists[3:6], lists1[:3]) and torch.equal(masked[3:6], masked1)


def test_plan_knobs_and_call_errors():
    """The knobs' rules and the call's tensors, each error naming the argument."""
    case = make_inputs(IndexerShape((40,), 1, 8, topk=16, block=16), device=DEVICE, seed=1)
    for kw, name in (
        ({"candidate_mode": "both", "candidate_block_size": 8, "candidate_blocks": 4}, "candidate_mode"),
        ({"candidate_mode": "mask", "candidate_block_size": 6, "candidate_blocks": 4}, "candidate_block_size"),
        ({"candidate_mode": "mask", "candidate_block_size": 1024, "candidate_blocks": 4}, "candidate_block_size"),
        ({"candidate_mode": "select", "candidate_block_size": 8, "candidate_blocks": 0}, "candidate_blocks"),
        ({"candidate_block_size": 8}, "candidate_block_size"),
    ):
        raises_naming(ValueError, lambda kw=kw: case.plan(**kw), name)
    mask = case.plan(candidate_mode="mask", candidate_block_size=8, candidate_blocks=4)
    sel = case.plan(candidate_mode="select", candidate_block_size=8, candidate_blocks=4)
    from_tensors = plan_indexer_topk_for(
        case.q, case.index_cache, case.block_table, topk=16, shuffled=case.shuffled, candidate_mode="mask",
        candidate_block_size=8, candidate_blocks=4,
    )  # fmt: skip
    assert from_tensors == mask
    assert mask.launches == case.plan().launches + 1
    assert mask.workspace_numel == case.plan().workspace_numel + case.shape.T * (1 + -(-mask.max_keys // 8 // 32))
    lists = torch.zeros(case.shape.T, 4, dtype=torch.int32, device=case.q.device)
    raises_naming(ValueError, lambda: case.run(plan=mask), "candidates", "None")
    raises_naming(ValueError, lambda: case.run(plan=sel), "candidates_out", "None")
    raises_naming(ValueError, lambda: case.run(plan=case.plan(), candidates=lists), "candidates", "candidate_mode")
    raises_naming(ValueError, lambda: case.run(plan=mask, candidates_out=lists, candidates=lists), "candidates_out")
    raises_naming(ValueError, lambda: case.run(plan=mask, candidates=lists[:, :3]), "candidates", "shape")
    raises_naming(TypeError, lambda: case.run(plan=mask, candidates=lists.long()), "candidates", "int32")
    raises_naming(
        ValueError,
        lambda: case.run(plan=mask, candidates=torch.zeros_like(lists).repeat(1, 2)[:, ::2]),
        "column stride",
    )
    raises_naming(ValueError, lambda: case.run(plan=sel, candidates_out=case.out[:, :4]), "candidates_out", "out")


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU (CUDA or ROCm); none visible to torch")
@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2])
def test_gpu_model_sizes(rows):
    """DeepSeek-V4.1's sizes: 64 heads, top-512, blocks of 8 positions, 2048 lists, ratio-1 contexts
    of 40000 and 30000 keys and a short one: the source's lists valid (newest in), the masked
    answers a valid top-k of the listed keys, bits equal across a repeat."""
    shape = IndexerShape((40000, 30000, 900), rows, 64, topk=512, block=64)
    case = make_inputs(shape, device="cuda", seed=rows)
    own, lists, masked = case.run_two_level(8, 2048)
    assert case.two_level_mismatch(own, lists, masked, 8) == ""
    _, lists2, masked2 = case.run_two_level(8, 2048)
    assert torch.equal(lists, lists2) and torch.equal(masked, masked2)
