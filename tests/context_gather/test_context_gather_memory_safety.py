"""gather_context_chunk memory safety (the contract in tests/_util.py): bad block-table entries and
starts give NaN rows of their request only, at every block size; zero sizes; overlaps named."""

from __future__ import annotations

import pytest
import torch
from _util import (
    DEVICE,
    F32,
    Guarded,
    assert_close,
    assert_no_sync_and_capturable,
    backends,
    raises_naming,
    seeded_generator,
)

from rocm_mla.ops import gather_context_chunk
from rocm_mla.reference import context_gather_ref

GATHER_BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP kernel


def _gather_case(bs=4, nb=6, seed=0, dtype=F32, fp8=None):
    """Two requests with 5 and 6 context rows in the chunk (starts 2 and 0), a guarded cache of
    fresh random values (guards reach two pages past each end), a guarded dst of finite random
    values (rows that must come out NaN have to be written NaN; good rows are compared exactly)."""
    g = seeded_generator(seed)
    fill = torch.randn(nb, bs, 576, generator=g).to(fp8).to(DEVICE) if fp8 else "randn"
    cache = Guarded((nb, bs, 576), fp8 or dtype, fill=fill, guard=2 * bs * 576 + 64, generator=g)
    bt = torch.tensor([[3, 0, 5, 1], [2, 4, 1, 0]], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 5, 11], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    t2s = torch.tensor([0] * 5 + [1] * 6, dtype=torch.int32, device=DEVICE)
    dst = Guarded((11, 576), dtype, fill="randn", pad_last=8, generator=g)
    return cache, bt, cu, starts, t2s, dst


def _gather_want(cache, bt, cu, starts, t2s, scale=1.0):
    rows = []
    flat = cache.view.view(torch.uint8) if cache.view.element_size() == 1 else cache.view
    for t in range(t2s.shape[0]):
        s = int(t2s[t])
        pos = int(starts[s]) + t - int(cu[s])
        row = flat[int(bt[s, pos // cache.view.shape[1]]), pos % cache.view.shape[1]]
        rows.append(row.view(cache.view.dtype).float() * scale)
    return torch.stack(rows)


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn], ids=["cache=f32", "cache=fp8"])
def test_context_gather_bad_indices_nan_rows(backend, fp8):
    """A page outside the cache (-1, num_blocks, huge), a request outside the table and a
    position past the table row: that chunk row is NaN, nothing outside the tensors is read
    (a sentinel read would be finite) or written; other rows are gathered exactly."""
    cache, bt, cu, starts, t2s, dst = _gather_case(fp8=fp8)
    kw = {"k_scale": torch.tensor([0.5], device=DEVICE)} if fp8 else {}
    want = _gather_want(cache, bt, cu, starts, t2s, 0.5 if fp8 else 1.0)
    bt[0, 1] = -1  # request 0, positions 4..7 -> chunk rows 2..4
    bt[1, 1] = cache.view.shape[0]  # request 1, positions 4..7 -> chunk rows 9, 10
    t2s_bad = t2s.clone()
    t2s_bad[0] = 2  # a request past the table
    t2s_bad[5] = -1
    bad = torch.zeros(11, dtype=torch.bool)
    bad[[0, 2, 3, 4, 5, 9, 10]] = True
    gather_context_chunk(cache.view, bt, cu, starts, t2s_bad, dst.view, backend=backend, **kw)
    assert torch.isnan(dst.view[bad]).all(), "bad rows not NaN"
    assert_close(dst.view[~bad].float(), want[~bad], rtol=0, atol=0)
    ref = context_gather_ref(cache.view, bt, cu, starts, t2s_bad, 11, kw.get("k_scale"))
    assert torch.equal(torch.isnan(ref), torch.isnan(dst.view))
    # positions past the table row (starts too large) and huge pages
    dst2 = Guarded((11, 576), F32, fill="randn")
    bt2 = torch.tensor([[3, 0, 5, 1], [2, (1 << 31) - 1, 1, -(1 << 31)]], dtype=torch.int32, device=DEVICE)
    st2 = torch.tensor([14, 0], dtype=torch.int32, device=DEVICE)
    gather_context_chunk(cache.view, bt2, cu, st2, t2s, dst2.view, backend=backend, **kw)
    bad2 = torch.zeros(11, dtype=torch.bool)
    bad2[[2, 3, 4, 9, 10]] = True  # request 0 positions 16..18 (capacity 16); request 1 a huge page
    assert torch.isnan(dst2.view[bad2]).all()
    assert not torch.isnan(dst2.view[~bad2]).any()
    want2 = context_gather_ref(cache.view, bt2, cu, st2, t2s, 11, kw.get("k_scale"))
    assert_close(dst2.view, want2, rtol=0, atol=0, equal_nan=True)
    for x, name in ((cache, "kv_cache"), (dst, "dst"), (dst2, "dst")):
        x.check(name)
    assert torch.equal(cache.base, cache._snap), "kv_cache changed"


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("bs,nb", [(1, 30), (16, 3), (64, 1)])
def test_context_gather_every_bad_page_kind_per_block_size(backend, bs, nb):
    """Block sizes 1, 16, 64: each used table entry of request 1 replaced in turn by -1,
    num_blocks, num_blocks + 1, 2^31 - 1 and -2^31; request 1's rows on that page are NaN,
    request 0's rows exact, guards intact."""
    g = seeded_generator(bs)
    cache = Guarded((nb, bs, 576), F32, guard=2 * bs * 576 + 64, generator=g)
    ctx = [min(nb * bs, 13), min(nb * bs, 7)]
    cols = -(-max(ctx) // bs)
    bt = torch.randint(0, nb, (2, cols), generator=g).int().to(DEVICE)
    cu = torch.tensor([0, ctx[0], sum(ctx)], dtype=torch.int32, device=DEVICE)
    starts = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    t2s = torch.tensor([0] * ctx[0] + [1] * ctx[1], dtype=torch.int32, device=DEVICE)
    want = _gather_want(cache, bt, cu, starts, t2s)
    for col in range(-(-ctx[1] // bs)):
        for page in (-1, nb, nb + 1, (1 << 31) - 1, -(1 << 31)):
            dst = Guarded((sum(ctx), 576), F32, fill="randn", pad_last=3)
            bad_bt = bt.clone()
            bad_bt[1, col] = page
            gather_context_chunk(cache.view, bad_bt, cu, starts, t2s, dst.view, backend=backend)
            rows = torch.arange(sum(ctx))
            pos = rows - ctx[0]
            bad = (pos >= 0) & (pos // bs == col)
            assert torch.isnan(dst.view[bad]).all(), (col, page)
            assert_close(dst.view[~bad], want[~bad], rtol=0, atol=0)
            dst.check("dst")
    cache.check("kv_cache")


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
def test_context_gather_zero_sizes(backend):
    """T = 0 (an empty chunk), an empty table (R = 0: every row's request is outside), an empty
    cache (every page outside): nothing read outside, rows NaN where there are rows."""
    cache, bt, cu, starts, t2s, _ = _gather_case()
    gather_context_chunk(cache.view, bt, cu, starts, t2s, torch.empty(0, 576, device=DEVICE), backend=backend)
    no_req = Guarded((4, 576), F32, fill="randn")
    gather_context_chunk(
        cache.view,
        torch.empty(0, 3, dtype=torch.int32, device=DEVICE),
        torch.zeros(1, dtype=torch.int32, device=DEVICE),
        torch.empty(0, dtype=torch.int32, device=DEVICE),
        torch.zeros(4, dtype=torch.int32, device=DEVICE),
        no_req.view,
        backend=backend,
    )
    assert torch.isnan(no_req.view).all()
    no_cache = Guarded((11, 576), F32, fill="randn")
    gather_context_chunk(torch.empty(0, 4, 576, device=DEVICE), bt, cu, starts, t2s, no_cache.view, backend=backend)
    assert torch.isnan(no_cache.view).all()
    for x, name in ((cache, "kv_cache"), (no_req, "dst"), (no_cache, "dst")):
        x.check(name)


def test_context_gather_overlap_and_shapes_named():
    cache, bt, cu, starts, t2s, dst = _gather_case()
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(cache.view, bt, cu, starts, t2s, cache.view.view(-1, 576)[:11]),
        "dst",
        "kv_cache",
    )
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(cache.view, bt, cu, starts, t2s[:5], dst.view),
        "token_to_seq",
        "11 rows",
    )
    raises_naming(
        ValueError, lambda: gather_context_chunk(cache.view, bt, cu[:2], starts, t2s, dst.view), "cu_seq_lens", "(3,)"
    )
    buf = torch.zeros(11 * 576 + 8, dtype=torch.int32, device=DEVICE)  # dst over the block table
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(
            cache.view, buf[:8].view(2, 4), cu, starts, t2s, buf.view(torch.float32)[: 11 * 576].view(11, 576)
        ),
        "dst",
        "block_table",
        "no memory in common",
    )
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(  # stride 0: two rows on one element
            cache.view, bt, cu, starts, t2s, torch.zeros(1, 576, device=DEVICE).expand(11, 576)
        ),
        "dst",
        "overlap",
    )
    cache.check("kv_cache")
    dst.check("dst")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, "fp8"], ids=str)
def test_gpu_context_gather_bad_indices(dtype):
    fp8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
    cache, bt, cu, starts, t2s, dst = _gather_case(bs=16, nb=9, dtype=torch.bfloat16)
    bt[1, 0] = -1
    bt[0, 0] = (1 << 31) - 1
    kw = {}
    if dtype == "fp8":
        cache = Guarded((9, 16, 576), fp8, fill=cache.view.float().to(fp8), guard=2 * 16 * 576 + 64)
        kw = {"k_scale": torch.ones(1, device=DEVICE)}
    gather_context_chunk(cache.view, bt, cu, starts, t2s, dst.view, backend="triton", **kw)
    torch.cuda.synchronize()
    assert torch.isnan(dst.view.float()).all()  # every row of both requests reads a bad first page
    cache.check("kv_cache")
    dst.check("dst")
    for backend in ("triton", "reference"):
        test_context_gather_every_bad_page_kind_per_block_size(backend, 16, 3)
        test_context_gather_zero_sizes(backend)


@pytest.mark.gpu
def test_gpu_context_gather_checks_no_sync_and_capturable():
    """gather_context_chunk with a caller-given dst (the overlap checks run): no host sync, capturable."""
    gat = _gather_case(bs=16, nb=9, dtype=torch.bfloat16)
    assert_no_sync_and_capturable(
        [lambda: gather_context_chunk(gat[0].view, *gat[1:5], gat[5].view, backend="triton")], [gat[0], gat[5]]
    )
