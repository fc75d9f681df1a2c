"""mla_decode(batch_invariant=True): a request's out and lse are bitwise the same alone and inside
shuffled batches of other sizes, other lengths, other table widths (so other split counts), MTP
rows, block sizes 1/16/64, 16-bit and fp8 caches; the one-launch (DIRECT) path and the two-stage
path give the same bits for a request with one live split; the mode's plan and its validation.

A pool of requests is built once (rocm_mla.cases.decode: shuffled block table, NaN in unused
pages); a batch is a subset of its requests in some order, their q rows copied into fresh
buffers, their table rows (optionally widened with columns pointing at the NaN pages).
"""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE
from decode_case import make_case

from rocm_mla.cases import decode
from rocm_mla.cases.decode import call_decode
from rocm_mla.configs import config_for
from rocm_mla.ops import plan_decode
from rocm_mla.ops.decode_plan import invariant_num_splits, invariant_split


def _batch(case, idx, q_len, extra_cols=0, trim=False):
    """mla_decode's positional arguments for the pool's requests ``idx`` (in that order); ``trim``:
    a table only as wide as those requests need (a smaller capacity: fewer splits in the grid)."""
    rows = torch.tensor([i * q_len + t for i in idx for t in range(q_len)], device=DEVICE)
    q_nope = case.q_nope.index_select(0, rows).clone()
    q_pe = case.q_pe.index_select(0, rows).clone()
    sel = torch.tensor(idx, device=DEVICE)
    table = case.block_table.index_select(0, sel)
    if trim:
        need = max(1, -(-max(case.shape.seq_lens[i] for i in idx) // case.shape.block))
        table = table[:, :need]
    if extra_cols:
        spare = table[:, -1:].expand(-1, extra_cols)  # the pool's spare column: an all-NaN page
        table = torch.cat([table, spare], dim=1)
    return q_nope, q_pe, case.paged.stored(0), table.contiguous(), case.seq_lens.index_select(0, sel).contiguous()


def _run(case, idx, q_len, extra_cols=0, trim=False, **kw):
    args = _batch(case, idx, q_len, extra_cols, trim)
    kw.setdefault("batch_invariant", True)
    return call_decode(*args, sm_scale=case.sm_scale, kv_cache_dtype=case.kv_cache_dtype, k_scale=case.k_scale, **kw)


def _rows_of(out, lse, pos, q_len):
    return out[pos * q_len : (pos + 1) * q_len], lse[pos * q_len : (pos + 1) * q_len]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _batches(n_pool, target, sizes, seed):
    """Shuffled index lists of each size, each containing ``target`` at a random position."""
    g = torch.Generator().manual_seed(seed)
    others = [i for i in range(n_pool) if i != target]
    for size in sizes:
        pick = [others[int(j)] for j in torch.randperm(len(others), generator=g)[: size - 1]]
        pos = int(torch.randint(0, size, (1,), generator=g))
        yield pick[:pos] + [target] + pick[pos:], pos


# Long and short requests mixed: 100 keys is 4 splits of the CPU rule (32 tokens).
POOL = (100, 1, 37, 5, 33, 0)


@pytest.mark.parametrize(
    "dtype,fp8,N,q_len,block",
    [
        (torch.float32, False, 8, 1, 16),
        (torch.float16, False, 3, 1, 1),
        (torch.float16, True, 4, 1, 16),
        (torch.float32, False, 4, 2, 64),  # MTP rows, causal among themselves
    ],
)
def test_request_alone_equals_request_in_batches(dtype, fp8, N, q_len, block):
    case = make_case(POOL, N, q_len, block, dtype, fp8=fp8, k_scale=0.5, seed=3)
    _alone_vs_batches(case, q_len)
    # The whole pool in order is also right (not only self-consistent).
    o, lse = _run(case, list(range(len(POOL))), q_len)
    case.check(o, lse)


@pytest.mark.parametrize("mode", ["qk", "all"])
def test_fp8_dots_request_alone_equals_request_in_batches(mode):
    """Each fp8_dots mode: q's per-(row, head) scale and p's rounding are per row, so the mode
    keeps a request's bits whatever the batch; and it is right against its rounded reference."""
    case = make_case(POOL, 4, 1, 16, torch.float16, fp8=True, k_scale=0.5, seed=5)
    _alone_vs_batches(case, 1, fp8_dots=mode)
    o, lse = _run(case, list(range(len(POOL))), 1, fp8_dots=mode)
    case.check(o, lse, fp8_dots=mode, tol=decode.fp8_dots_bound(mode, torch.float16, DEVICE))


def _alone_vs_batches(case, q_len, **kw):
    """A long and a middle request of the pool alone (a table as wide as it needs) against the
    same request in shuffled batches of 3 and of the whole pool with wider tables: same bits."""
    for target in (0, 2):
        o1, l1 = _run(case, [target], q_len, trim=True, **kw)
        ref_o, ref_l = o1.clone(), l1.clone()
        for k, (idx, pos) in enumerate(_batches(len(POOL), target, (3, len(POOL)), seed=target)):
            o, lse = _run(case, idx, q_len, extra_cols=3 * k, **kw)
            go, gl = _rows_of(o, lse, pos, q_len)
            assert _same_bits(go, ref_o), f"out of request {target} differs in batch {idx} (position {pos})"
            assert _same_bits(gl, ref_l), f"lse of request {target} differs in batch {idx} (position {pos})"


def test_the_hint_changes_no_bit():
    """The grid's split count follows max_seq_len (an upper bound of the batch's lengths); a
    request gets the same bits with the tightest hint, a loose one and none (the table's width)."""
    case = make_case(POOL, 4, 2, 16, torch.float32, seed=6)
    idx = [3, 0, 2]  # 100 keys the longest
    ref = [t.clone() for t in _run(case, idx, 2)]
    for hint in (100, 101, 333):
        o, lse = _run(case, idx, 2, max_seq_len=hint)
        assert _same_bits(o, ref[0]) and _same_bits(lse, ref[1]), f"max_seq_len={hint}"


def test_default_mode_is_not_invariant_here():
    """The comparison can fail: the same request under two split counts differs in its bits."""
    case = make_case(POOL, 8, 1, 16, torch.float32, seed=3)
    o1, l1 = _run(case, [0], 1, batch_invariant=False, num_splits=1)
    o3, l3 = _run(case, [0], 1, batch_invariant=False, num_splits=3)
    assert not (_same_bits(o1, o3) and _same_bits(l1, l3))


def test_direct_equals_two_stage_for_one_split():
    """A request shorter than one split: alone with a narrow table the plan launches stage 1 only
    (S == 1, DIRECT), inside a wide table two stages with one live split; the bits agree."""
    case = make_case((20, 70, 9), 4, 2, 16, torch.float32, seed=5, spare_cols=0)
    narrow = _batch(case, [0], 2)
    narrow = (*narrow[:3], narrow[3][:, :2].contiguous(), narrow[4])  # capacity 32: one split
    plan = plan_decode(
        batch=1,
        num_heads=4,
        q_len=2,
        max_blocks=2,
        block_size=16,
        q_dtype=torch.float32,
        kv_dtype=torch.float32,
        device=DEVICE,
        batch_invariant=True,
    )
    assert plan.direct
    o1, l1 = call_decode(*narrow, sm_scale=case.sm_scale, batch_invariant=True)
    o2, l2 = _run(case, [1, 0, 2], 2, extra_cols=4)
    assert _same_bits(o1, o2[2:4]) and _same_bits(l1, l2[2:4])


def test_plan_split_rule_is_data_and_the_grid_follows_the_bound():
    cpu = torch.device("cpu")
    kw = dict(num_heads=16, q_len=1, block_size=16, q_dtype=torch.float16, kv_dtype=torch.float16, device=cpu)
    a = plan_decode(batch=1, max_blocks=64, batch_invariant=True, **kw)
    tokens, cap = invariant_split("cpu", a.config)
    assert tokens % a.config["BLOCK_N"] == 0 and cap >= 1
    b = plan_decode(batch=128, max_blocks=64, batch_invariant=True, workspace_numel=1, **kw)
    assert a.num_splits == b.num_splits == invariant_num_splits(64 * 16, tokens, cap)
    hinted = plan_decode(batch=128, max_blocks=64, max_seq_len=40, batch_invariant=True, **kw)
    assert hinted.num_splits == invariant_num_splits(40, tokens, cap) < a.num_splits
    assert a.constexprs["SPLIT_TOKENS"] == tokens and a.constexprs["SPLIT_CAP"] == cap
    # The schedule follows the batch, the split rule does not: one request gets several programs,
    # a full batch one program per request taking a run of its splits (stage 1), and the reduce's
    # tile narrows for few rows; both read each request's own splits by the same rule.
    assert a.num_splits >= a.split_programs > b.split_programs == 1
    assert a.grid == (a.split_programs,) and b.grid == (128,)
    one = plan_decode(batch=1, max_blocks=64, batch_invariant=True, **{**kw, "num_heads": 2})
    assert one.reduce.constexprs["BLOCK_D"] < b.reduce.constexprs["BLOCK_D"] == 512
    for plan in (a, b):
        assert plan.reduce.constexprs["INVARIANT"] and plan.split_rule == (tokens, cap, plan.config["BLOCK_N"])
    few = plan_decode(batch=1, max_blocks=3, batch_invariant=True, **kw)  # 48 keys: 2 splits
    assert few.reduce.constexprs["BLOCK_S"] == 2  # the tile's split rows: the grid's splits, no more
    default = plan_decode(batch=1, max_blocks=64, **kw)
    assert default.constexprs.get("SPLIT_TOKENS", 0) == 0 and default.split_rule == (0, 0, 1)
    assert not (default.reduce.constexprs if default.reduce else {}).get("INVARIANT", False)


def test_bad_keyword_values():
    case = make_case((10,), 4, 1, 16, torch.float32)
    with pytest.raises(TypeError, match="batch_invariant: expected a bool, got 1"):
        case.run(batch_invariant=1)
    with pytest.raises(ValueError, match="num_splits"):
        case.run(batch_invariant=True, num_splits=2)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8", "fp8-qk", "fp8-all"])
@pytest.mark.parametrize("N,q_len,block", [(16, 1, 64), (128, 1, 64), (16, 2, 16), (128, 1, 1)])
def test_gpu_invariant_serving_sizes(kv, N, q_len, block):
    """bf16/fp8 (each fp8_dots mode) at serving lengths: a request alone vs batches of 1..64."""
    lens = tuple([4096, 17, 8192, 1, 1500] + [64 * (i + 1) + i for i in range(59)])
    case = make_case(lens, N, q_len, block, torch.bfloat16, fp8=kv != "bf16", k_scale=0.25, seed=7)
    kw = {"fp8_dots": kv.split("-")[1]} if "-" in kv else {}
    for target in (0, 2):
        ref_o, ref_l = (t.clone() for t in _run(case, [target], q_len, **kw))
        for k, (idx, pos) in enumerate(_batches(len(lens), target, (2, 8, 32, 64), seed=target)):
            o, lse = _run(case, idx, q_len, extra_cols=k, **kw)
            go, gl = _rows_of(o, lse, pos, q_len)
            assert _same_bits(go, ref_o) and _same_bits(gl, ref_l), f"request {target} in {len(idx)}"
    mode = kw.get("fp8_dots", "none")
    tol = decode.fp8_dots_bound(mode, torch.bfloat16, DEVICE) if mode != "none" else None
    case.check(*_run(case, list(range(len(lens))), q_len, **kw), fp8_dots=mode, tol=tol)


@pytest.mark.gpu
def test_gpu_invariant_under_cuda_graph():
    """A graph captured for a batch of 8 gives the request the bits it gets alone, eagerly."""
    case = make_case((8192, 33, 1000, 4096, 5, 700, 64, 2048), 16, 1, 64, torch.bfloat16, seed=9)
    ref_o, ref_l = (t.clone() for t in _run(case, [0], 1))
    args = _batch(case, [3, 1, 0, 2, 4, 5, 6, 7], 1)
    out = torch.empty(8, 16, 512, dtype=torch.bfloat16, device=DEVICE)
    lse = torch.empty(8, 16, dtype=torch.float32, device=DEVICE)
    kw = dict(sm_scale=case.sm_scale, out=out, lse=lse, batch_invariant=True)
    call_decode(*args, **kw)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call_decode(*args, **kw)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert _same_bits(out[2:3], ref_o) and _same_bits(lse[2:3], ref_l)


@pytest.mark.parametrize("where", ["q", "kv"])
def test_nan_reaches_its_request_only(where):
    """NaN-reach contract (docs/bad-input.md): a NaN in q reaches its own row and head; a NaN in a
    used cache row (K and V: the same row) the rows of its request; never another request."""
    case = make_case(POOL, 4, 2, 16, torch.float32, seed=8)
    idx = [2, 0, 3]  # the request with 100 keys in the middle: rows 2, 3
    clean = [t.clone() for t in _run(case, idx, 2)]
    q_nope, q_pe, kv, table, seq_lens = _batch(case, idx, 2)
    if where == "q":
        q_nope[3, 1, 100] = float("nan")
    else:
        kv = kv.clone()
        j = 40  # a key both rows of the request see
        kv[int(table[1, j // 16]), j % 16, 7] = float("nan")
    o, lse = call_decode(q_nope, q_pe, kv, table, seq_lens, sm_scale=case.sm_scale, batch_invariant=True)
    nan_rows = torch.isnan(o).any(dim=2)  # [rows, N]
    others = [0, 1, 4, 5]
    assert _same_bits(o[others], clean[0][others]) and _same_bits(lse[others], clean[1][others])
    if where == "q":
        assert nan_rows[3, 1] and nan_rows.sum() == 1 and torch.isnan(lse[3, 1])
    else:
        assert nan_rows[2:4].all() and torch.isnan(lse[2:4]).all()


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90", "default"])
def test_every_arch_has_the_split_rule(arch):
    """Each arch's launch data carries the mode's split rule (a missing one would fail every
    batch-invariant call there, and the ISA report's variants)."""
    for tier in config_for("mla_decode", arch)["tiers"]:
        tokens, cap = invariant_split(arch, tier)
        assert tokens % tier["BLOCK_N"] == 0 and tokens > 0 and cap >= 1


def test_a_tier_may_set_its_own_split_tokens():
    """A tier's invariant_split_tokens replaces the arch's split_tokens for that tier (rounded up to
    its tile) in both launches; a value below 1 is an error that names the field."""
    kw = dict(batch=1, num_heads=16, q_len=1, max_blocks=64, block_size=16, batch_invariant=True)
    kw.update(q_dtype=torch.float16, kv_dtype=torch.float16, device=torch.device("cpu"))
    base = plan_decode(**kw)
    assert "invariant_split_tokens" not in base.config and base.config["BLOCK_N"] == 16
    own = plan_decode(**kw, config={**base.config, "invariant_split_tokens": 40})
    assert own.constexprs["SPLIT_TOKENS"] == own.split_rule[0] == 48
    assert base.constexprs["SPLIT_TOKENS"] != 48
    with pytest.raises(ValueError, match="invariant_split_tokens"):
        plan_decode(**kw, config={**base.config, "invariant_split_tokens": 0})


def _tier(case, q_len, **fields):
    """The CPU stage-1 tier the plan picks for ``case``, with ``fields`` replaced (config=)."""
    plan = plan_decode(
        batch=1,
        num_heads=case.shape.N,
        q_len=q_len,
        max_blocks=case.block_table.shape[1],
        block_size=case.shape.block,
        q_dtype=case.q_nope.dtype,
        kv_dtype=case.q_nope.dtype,
        device=DEVICE,
        batch_invariant=True,
    )
    return {**plan.config, "ctas_per_cu": 1, **fields}


@pytest.mark.parametrize("clamp", [False, True])
def test_split_runs_change_no_bit(clamp):
    """The programs a request gets are a schedule, not arithmetic: a batch whose programs each take
    a run of a request's splits (SPLIT_RUNS) gives the bits of one program per split, MTP rows
    included (a row block's own split past its last key: a zero partial), both page-guard forms."""
    N, q_len = 16, 2  # 32 query rows: two row blocks of 16 (the first sees one key fewer)
    case = make_case(POOL, N, q_len, 16, torch.float32, seed=11)
    idx = [4, 0, 2, 1, 5, 3]  # 33 keys: the first row block's second split is empty
    runs = _run(case, idx, q_len, config=_tier(case, q_len, SPLIT_RUNS=True, CLAMP_PAGES=clamp))
    single = _run(case, idx, q_len, config=_tier(case, q_len, SPLIT_RUNS=False, CLAMP_PAGES=clamp))
    plan = case.plan(DEVICE, batch_invariant=True, config=_tier(case, q_len, SPLIT_RUNS=True))
    assert plan.split_programs < plan.num_splits  # the runs path did run
    assert _same_bits(runs[0], single[0]) and _same_bits(runs[1], single[1])
    case.check(*_run(case, list(range(len(POOL))), q_len, config=_tier(case, q_len, SPLIT_RUNS=True)))


@pytest.mark.parametrize("clamp", [False, True])
def test_split_runs_bad_page_is_loud(clamp):
    """A used block-table entry outside the cache, in a request whose splits one program runs:
    that request's rows are NaN (out and lse), every other request keeps its bits."""
    case = make_case(POOL, 4, 1, 16, torch.float32, seed=12)
    idx = [2, 0, 3, 1]  # the 100-key request second: 7 pages
    cfg = _tier(case, 1, SPLIT_RUNS=True, CLAMP_PAGES=clamp)
    clean = [t.clone() for t in _run(case, idx, 1, config=cfg)]
    q_nope, q_pe, kv, table, seq_lens = _batch(case, idx, 1)
    table[1, 4] = kv.shape[0] + 3
    o, lse = call_decode(q_nope, q_pe, kv, table, seq_lens, sm_scale=case.sm_scale, batch_invariant=True, config=cfg)
    assert torch.isnan(o[1]).all() and torch.isnan(lse[1]).all()
    others = [0, 2, 3]
    assert _same_bits(o[others], clean[0][others]) and _same_bits(lse[others], clean[1][others])


def test_the_reduce_tile_changes_no_bit():
    """The reduce loads a tile of up to invariant_max_block_s splits at once and takes its rows
    apart in split order: 1 to 64 rows a tile give the same bits (every depth of the row split),
    for a request of 100 keys (7 splits of 16) among shorter ones, MTP rows included."""
    from rocm_mla.configs.loader import override

    case = make_case(POOL, 4, 2, 16, torch.float32, seed=14)
    idx = [2, 0, 5, 3]
    arch = case.plan(DEVICE, batch_invariant=True).arch
    base = config_for("mla_decode", arch)
    runs, tiles = [], []
    for cap in (1, 2, 8, 64):
        obj = {**base, "reduce": {**base["reduce"], "invariant_max_block_s": cap, "tile_elems": 64 * 512}}
        obj["batch_invariant"] = {"split_tokens": 16, "max_splits": 64}  # a grid of 64 splits
        with override("mla_decode", arch, obj):
            args = _batch(case, idx, 2, extra_cols=60)
            o, lse = call_decode(*args, sm_scale=case.sm_scale, batch_invariant=True)
            runs.append((o.clone(), lse.clone()))
            plan = plan_decode(
                batch=len(idx), num_heads=4, q_len=2, max_blocks=args[3].shape[1], block_size=16,
                q_dtype=torch.float32, kv_dtype=torch.float32, device=DEVICE, batch_invariant=True,
            )  # fmt: skip
            tiles.append(plan.reduce.constexprs["BLOCK_S"])
    assert tiles[0] == 1 and tiles[-1] == 64, tiles
    for o, lse in runs[1:]:
        assert _same_bits(o, runs[0][0]) and _same_bits(lse, runs[0][1])
    case.check(*_run(case, list(range(len(POOL))), 2))
