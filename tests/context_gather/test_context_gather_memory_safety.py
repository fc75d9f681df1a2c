"""gather_context_chunk memory safety (the contract in tests/_util.py): bad block-table entries and
starts give NaN rows of their request only, at every block size; zero sizes; overlaps named."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, assert_no_sync_and_capturable, backends, raises_naming
from gather_case import by_definition

from rocm_mla.cases import Guarded, compare, context_gather, generator, platform_fp8, raise_on
from rocm_mla.cases.context_gather import ChunkShape
from rocm_mla.ops import gather_context_chunk
from rocm_mla.reference import context_gather_ref

F32 = torch.float32
GATHER_BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP kernel
EXACT = context_gather.TOLERANCE[F32]["dst"]


def _gather_case(bs=4, seed=0, dtype=F32, fp8=None):
    """Two requests with 7 and 6 cached tokens, the chunk reading 5 and 6 of them (starts 2 and 0);
    a 4-column block table (the columns past a request's pages point at spare pages) into a cache
    of fresh random values in every slot, guards reaching two pages past each end; a guarded dst
    of finite random values (rows that must come out NaN have to be written NaN; good rows are
    compared exactly). Returns (ChunkInputs, dst Guarded)."""
    nblk = max(-(-7 // bs), -(-6 // bs))
    shape = ChunkShape((7, 6), (2, 0), (5, 6), bs, kv="fp8" if fp8 else "auto")
    c = context_gather.make_inputs(
        shape,
        dtype=dtype,
        device=DEVICE,
        seed=seed,
        fp8=fp8,
        k_scale=0.5,
        spare_pages=2,
        spare_cols=4 - nblk,
        unused="randn",
        guard=2 * bs * 576 + 64,
    )
    dst = Guarded((11, 576), dtype, device=DEVICE, fill="randn", pad_last=8, generator=generator(seed, "cpu"))
    return c, dst


def _kv_bytes(c):
    return c.kv_cache.view(torch.uint8).clone()


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn, "uint8"], ids=["cache=f32", "cache=fp8", "cache=uint8"])
def test_context_gather_bad_indices_nan_rows(backend, fp8):
    """A page outside the cache (-1, num_blocks, huge), a request outside the table and a
    position past the table row: that chunk row is NaN, nothing outside the tensors is read
    (a sentinel read would be finite) or written; other rows are gathered exactly. "uint8": the
    e4m3fn cache handed as its uint8 storage with kv_cache_dtype "fp8_e4m3fn"."""
    storage = fp8 == "uint8"
    c, dst = _gather_case(fp8=torch.float8_e4m3fn if storage else fp8)
    cache, cu, starts, t2s, ks = c.kv_cache, c.cu_seq_lens, c.starts, c.token_to_seq, c.k_scale
    given = dict(kv_cache_dtype="fp8_e4m3fn") if storage else {}
    arg = cache.view(torch.uint8) if storage else cache  # what the op is handed
    assert c.block_table.shape == (2, 4) and (ks is None) == (fp8 is None)
    snap = _kv_bytes(c)
    want = by_definition(c)
    bt = c.block_table.clone()
    bt[0, 1] = -1  # request 0, positions 4..7 -> chunk rows 2..4
    bt[1, 1] = cache.shape[0]  # request 1, positions 4..7 -> chunk rows 9, 10
    t2s_bad = t2s.clone()
    t2s_bad[0] = 2  # a request past the table
    t2s_bad[5] = -1
    bad = torch.zeros(11, dtype=torch.bool)
    bad[[0, 2, 3, 4, 5, 9, 10]] = True
    gather_context_chunk(arg, bt, cu, starts, t2s_bad, dst.view, backend=backend, k_scale=ks, **given)
    assert torch.isnan(dst.view[bad]).all(), "bad rows not NaN"
    raise_on(compare("dst", dst.view[~bad], want[~bad], EXACT).problem)
    ref = context_gather_ref(cache, bt, cu, starts, t2s_bad, 11, ks)
    assert torch.equal(torch.isnan(ref), torch.isnan(dst.view))
    # positions past the table row (starts too large) and huge pages
    dst2 = Guarded((11, 576), F32, device=DEVICE, fill="randn", generator=generator(1, "cpu"))
    bt2 = c.block_table.clone()
    bt2[1, 1], bt2[1, 3] = (1 << 31) - 1, -(1 << 31)
    st2 = torch.tensor([14, 0], dtype=torch.int32, device=DEVICE)
    gather_context_chunk(arg, bt2, cu, st2, t2s, dst2.view, backend=backend, k_scale=ks, **given)
    bad2 = torch.zeros(11, dtype=torch.bool)
    bad2[[2, 3, 4, 9, 10]] = True  # request 0 positions 16..18 (capacity 16); request 1 a huge page
    assert torch.isnan(dst2.view[bad2]).all()
    assert not torch.isnan(dst2.view[~bad2]).any()
    want2 = context_gather_ref(cache, bt2, cu, st2, t2s, 11, ks)
    raise_on(compare("dst", dst2.view, want2, EXACT).problem)  # NaN exactly where the reference has it
    c.paged.check_guards("kv_cache")
    for x in (dst, dst2):
        x.check("dst")
    assert torch.equal(_kv_bytes(c), snap), "kv_cache changed"


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("bs,nb", [(1, 30), (16, 3), (64, 3)])
def test_context_gather_every_bad_page_kind_per_block_size(backend, bs, nb):
    """Block sizes 1, 16, 64 (nb pages in all): each used table entry of request 1 replaced in
    turn by -1, num_blocks, num_blocks + 1, 2^31 - 1 and -2^31; request 1's rows on that page are
    NaN, request 0's rows exact, guards intact."""
    ctx = (13, 7)
    used = sum(-(-n // bs) for n in ctx)
    c = context_gather.make_inputs(
        ChunkShape(ctx, (0, 0), ctx, bs),
        dtype=F32,
        device=DEVICE,
        seed=bs,
        spare_pages=nb - used,
        unused="randn",
        guard=2 * bs * 576 + 64,
    )
    assert c.kv_cache.shape[0] == nb
    want = by_definition(c)
    for col in range(-(-ctx[1] // bs)):
        for page in (-1, nb, nb + 1, (1 << 31) - 1, -(1 << 31)):
            dst = Guarded(
                (sum(ctx), 576), F32, device=DEVICE, fill="randn", pad_last=3, generator=generator(col, "cpu")
            )
            bad_bt = c.block_table.clone()
            bad_bt[1, col] = page
            c.run(backend=backend, block_table=bad_bt, dst=dst.view)
            rows = torch.arange(sum(ctx))
            pos = rows - ctx[0]
            bad = (pos >= 0) & (pos // bs == col)
            assert torch.isnan(dst.view[bad]).all(), (col, page)
            raise_on(compare("dst", dst.view[~bad], want[~bad], EXACT).problem)
            dst.check("dst")
    c.paged.check_guards("kv_cache")


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
def test_context_gather_zero_sizes(backend):
    """T = 0 (an empty chunk), an empty table (R = 0: every row's request is outside), an empty
    cache (every page outside): nothing read outside, rows NaN where there are rows."""
    c, _ = _gather_case()
    cache, bt, cu, starts, t2s = c.kv_cache, c.block_table, c.cu_seq_lens, c.starts, c.token_to_seq
    gather_context_chunk(cache, bt, cu, starts, t2s, torch.empty(0, 576, device=DEVICE), backend=backend)
    no_req = Guarded((4, 576), F32, device=DEVICE, fill="randn", generator=generator(1, "cpu"))
    gather_context_chunk(
        cache,
        torch.empty(0, 3, dtype=torch.int32, device=DEVICE),
        torch.zeros(1, dtype=torch.int32, device=DEVICE),
        torch.empty(0, dtype=torch.int32, device=DEVICE),
        torch.zeros(4, dtype=torch.int32, device=DEVICE),
        no_req.view,
        backend=backend,
    )
    assert torch.isnan(no_req.view).all()
    no_cache = Guarded((11, 576), F32, device=DEVICE, fill="randn", generator=generator(2, "cpu"))
    gather_context_chunk(torch.empty(0, 4, 576, device=DEVICE), bt, cu, starts, t2s, no_cache.view, backend=backend)
    assert torch.isnan(no_cache.view).all()
    c.paged.check_guards("kv_cache")
    for x in (no_req, no_cache):
        x.check("dst")


def test_context_gather_overlap_and_shapes_named():
    c, dst = _gather_case()
    cache, bt, cu, starts, t2s = c.kv_cache, c.block_table, c.cu_seq_lens, c.starts, c.token_to_seq
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(cache, bt, cu, starts, t2s, cache.view(-1, 576)[:11]),
        "dst",
        "kv_cache",
    )
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(cache, bt, cu, starts, t2s[:5], dst.view),
        "token_to_seq",
        "11 rows",
    )
    raises_naming(
        ValueError, lambda: gather_context_chunk(cache, bt, cu[:2], starts, t2s, dst.view), "cu_seq_lens", "(3,)"
    )
    buf = torch.zeros(11 * 576 + 8, dtype=torch.int32, device=DEVICE)  # dst over the block table
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(
            cache, buf[:8].view(2, 4), cu, starts, t2s, buf.view(torch.float32)[: 11 * 576].view(11, 576)
        ),
        "dst",
        "block_table",
        "no memory in common",
    )
    raises_naming(
        ValueError,
        lambda: gather_context_chunk(  # stride 0: two rows on one element
            cache, bt, cu, starts, t2s, torch.zeros(1, 576, device=DEVICE).expand(11, 576)
        ),
        "dst",
        "overlap",
    )
    c.paged.check_guards("kv_cache")
    dst.check("dst")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, "fp8"], ids=str)
def test_gpu_context_gather_bad_indices(dtype):
    # fp8: the platform's kind (e4m3fnuz on gfx942, e4m3fn elsewhere)
    c, dst = _gather_case(bs=16, dtype=torch.bfloat16, fp8=platform_fp8(DEVICE) if dtype == "fp8" else None)
    bt = c.block_table.clone()
    bt[1, 0] = -1
    bt[0, 0] = (1 << 31) - 1
    c.run(backend="triton", block_table=bt, dst=dst.view)
    torch.cuda.synchronize()
    assert torch.isnan(dst.view.float()).all()  # every row of both requests reads a bad first page
    c.paged.check_guards("kv_cache")
    dst.check("dst")
    for backend in ("triton", "reference"):
        test_context_gather_every_bad_page_kind_per_block_size(backend, 16, 3)
        test_context_gather_zero_sizes(backend)


@pytest.mark.gpu
def test_gpu_context_gather_checks_no_sync_and_capturable():
    """gather_context_chunk with a caller-given dst (the overlap checks run): no host sync, capturable."""
    c, dst = _gather_case(bs=16, dtype=torch.bfloat16)
    assert_no_sync_and_capturable([lambda: c.run(backend="triton", dst=dst.view)], [dst])
    c.paged.check_guards("kv_cache")
