"""gather_context_chunk (context_gather): every backend against the float32 reference, the
reference against the chunk's definition (the keys the cache was filled with, never paged), block
sizes 1/16/64, fp8 caches, strided caches and destinations, empty chunks, bad input. Bad index
values: test_context_gather_memory_safety.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _util import DEVICE, DTYPES, HAS_GPU, backends, raises_naming
from gather_case import by_definition

from rocm_mla._platform import device_arch
from rocm_mla.cases import (
    SENTINEL,
    Guarded,
    compare,
    context_gather,
    generator,
    outside_untouched,
    platform_fp8,
    poisoned,
    raise_on,
)
from rocm_mla.cases.context_gather import ChunkShape
from rocm_mla.mla_dims import FP8_KV_CACHE_DTYPES
from rocm_mla.ops import gather_context_chunk

F32 = torch.float32
GATHER_BACKENDS = [b for b in backends() if b != "hip"]  # no HIP kernel
# e4m3fnuz is gfx942's kind: Triton converts it there only (neither the CPU interpreter nor
# NVIDIA's backend has it); the reference covers it everywhere.
FP8_KINDS = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]
FNUZ_TRITON = HAS_GPU and device_arch(torch.device(DEVICE)).startswith("gfx94")
NO_FNUZ = "Triton converts e4m3fnuz on gfx94x only"
# A request split over chunks (start > 0), one read to its end, a 1-token context, lengths that
# are not multiples of the block, an empty chunk.
SHAPES = {s.name: s for s in context_gather.SHAPES["odd"]}
SHAPE_PARAMS = [pytest.param(s, id=s.name) for s in context_gather.SHAPES["odd"]]


def _i32(x):
    return torch.tensor(x, dtype=torch.int32, device=DEVICE)


def chunk(shape: ChunkShape, bs=16, dtype=F32, *, fp8=None, seed=0, **kw) -> context_gather.ChunkInputs:
    """``shape`` with pages of ``bs`` tokens (an fp8 cache of kind ``fp8``), on DEVICE; ``kw``:
    make_inputs' keywords (dst_pad, page_pad, ...)."""
    shape = dataclasses.replace(shape, block=bs, kv="fp8" if fp8 else "auto")
    return context_gather.make_inputs(shape, dtype=dtype, device=DEVICE, seed=seed, fp8=fp8, **kw)


def exact(name, got, want):
    """A gather is a copy: ``got`` equals ``want`` rounded once to got's dtype (NaN where it has NaN)."""
    raise_on(compare(name, got, want.to(got.dtype), context_gather.TOLERANCE[got.dtype]["dst"]).problem)


def run_poisoned(c: context_gather.ChunkInputs, backend):
    """Gather into c's poisoned dst: the op returns dst, every row is written (no poison left, no NaN
    slot read), nothing past a row is written. Returns dst."""
    assert c.run(backend=backend) is c.dst
    assert not torch.isnan(c.dst.float()).any(), "a row was not written (or read a NaN slot)"
    assert outside_untouched(c.dst_base, c.dst), "wrote past a dst row"
    return c.dst


@pytest.mark.parametrize("shape", SHAPE_PARAMS)
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_reference_matches_definition(shape, bs):
    c = chunk(shape, bs, seed=bs)
    got = c.reference()
    assert not torch.isnan(got).any()
    exact("reference", got, by_definition(c))


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPE_PARAMS)
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_matches_reference(backend, dtype, shape, bs):
    c = chunk(shape, bs, dtype, seed=bs + 1, dst_pad=8)
    run_poisoned(c, backend)
    c.check()  # a gather: exact in the cache's own dtype


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_cache_dequantised(backend, fp8, dtype):
    if backend == "triton" and fp8 == torch.float8_e4m3fnuz and not FNUZ_TRITON:
        pytest.skip(NO_FNUZ)
    c = chunk(SHAPES["three_requests"], 16, dtype, fp8=fp8, seed=3, dst_pad=4)
    assert c.kv_cache.dtype == fp8 and c.k_scale.tolist() == [0.25]
    dst = run_poisoned(c, backend)
    want = by_definition(c)  # stored x k_scale in float32
    exact("reference", c.reference(), want)
    exact("dst", dst, want)  # rounded once to dst's dtype


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3", "fp8_e4m3fn", "fp8_e4m3fnuz"])
def test_fp8_cache_in_uint8_storage(backend, name):
    """vLLM's fp8 cache as it is allocated (uint8 storage) with an fp8 kv_cache_dtype: read as the
    kind the name gives (the platform's for "fp8" / "fp8_e4m3"): the same bytes give the same dst,
    bit for bit, as the float8 view, on every backend; the cache is not written."""
    kind = FP8_KV_CACHE_DTYPES[name] or platform_fp8(DEVICE)
    if backend == "triton" and kind == torch.float8_e4m3fnuz and not FNUZ_TRITON:
        pytest.skip(NO_FNUZ)
    c = chunk(SHAPES["three_requests"], 16, torch.bfloat16, fp8=kind, seed=13, dst_pad=4)
    as_float8 = run_poisoned(c, backend).clone()
    exact("dst", as_float8, by_definition(c))
    storage = c.kv_cache.view(torch.uint8)
    snap = storage.clone()
    _, dst = poisoned((c.shape.T, 576), torch.bfloat16, DEVICE)
    assert c.run(backend=backend, kv_cache=storage, kv_cache_dtype=name, dst=dst) is dst
    assert torch.equal(dst.view(torch.int16), as_float8.view(torch.int16))
    assert torch.equal(storage, snap)
    # The float8 view with its own name, or with "auto", reads the same.
    for same in (name, "auto"):
        _, dst = poisoned((c.shape.T, 576), torch.bfloat16, DEVICE)
        c.run(backend=backend, kv_cache_dtype=same, dst=dst)
        assert torch.equal(dst.view(torch.int16), as_float8.view(torch.int16)), same


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
def test_strided_cache_and_dst(backend):
    """A cache whose pages are not adjacent (block stride > block_size x 576) and dst rows of a
    wider buffer (the workspace may be a slice)."""
    c = chunk(SHAPES["three_requests"], 16, seed=5, page_pad=40, dst_pad=100)
    assert not c.kv_cache.is_contiguous() and c.kv_cache.stride(0) == 16 * 576 + 40
    exact("dst", run_poisoned(c, backend), by_definition(c))


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
def test_empty_chunk_and_empty_table(backend):
    """T = 0 writes nothing; R = 0 requests (an empty block table) with T = 0; an empty cache
    with rows whose pages are all outside it (every row NaN)."""
    c = chunk(SHAPES["one_request"], 16)
    dst = torch.empty(0, 576, device=DEVICE)
    assert c.run(backend=backend, dst=dst) is dst
    c.run(
        backend=backend,
        dst=torch.empty(0, 576, device=DEVICE),
        block_table=torch.empty(0, 4, dtype=torch.int32, device=DEVICE),
        cu_seq_lens=_i32([0]),
        starts=_i32([]),
        token_to_seq=_i32([]),
    )
    # finite: the rows must be written NaN, not left as they are
    dst = Guarded((c.shape.T, 576), F32, device=DEVICE, fill="randn", generator=generator(0, "cpu"))
    c.run(backend=backend, dst=dst.view, kv_cache=torch.empty(0, 16, 576, device=DEVICE))
    assert torch.isnan(dst.view).all()
    dst.check("dst")


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
def test_rows_read_only_from_their_slots(backend):
    """Overwrite every cache slot the chunk does not cover with a finite sentinel: the result is
    unchanged (nothing else is read), and the cache itself is unchanged (nothing is written)."""
    c = chunk(SHAPES["continued"], 16, seed=7)
    c.run(backend=backend)
    first = c.dst.clone()
    s, cache, table = c.shape, c.kv_cache, c.block_table
    covered = torch.zeros(cache.shape[:2], dtype=torch.bool, device=DEVICE)
    for i, n in enumerate(s.rows):
        pos = torch.arange(s.starts[i], s.starts[i] + n, device=DEVICE)
        covered[table[i, pos // s.block].long(), pos % s.block] = True
    cache[~covered] = SENTINEL
    snap = cache.clone()
    _, dst2 = poisoned((s.T, 576), F32, DEVICE)
    c.run(backend=backend, dst=dst2)
    assert torch.equal(dst2, first)
    assert torch.equal(cache, snap)


def test_default_dispatch_and_forced_backend(monkeypatch):
    from rocm_mla.ops._dispatch import select

    # GPU: the config's backend_order (Triton only); CPU: conftest turned the interpreter on.
    assert select("context_gather", DEVICE) == "triton"
    c = chunk(SHAPES["three_requests"], 16, seed=9)
    monkeypatch.setenv("ROCM_MLA_BACKEND_CONTEXT_GATHER", "reference")
    c.run()
    exact("dst", c.dst, by_definition(c))
    # There is no HIP kernel: forcing it raises (where the extension loads: "no HIP kernel";
    # elsewhere the dispatcher's "cannot run").
    with pytest.raises(RuntimeError, match="no HIP kernel for context_gather|'hip' was requested but cannot run"):
        c.run(backend="hip")


# ---------------------------------------------------------------- bad input
def _args():
    """gather_context_chunk's arguments by name: three requests, 57 chunk rows."""
    return chunk(SHAPES["three_requests"], 16, seed=11).kwargs()


def _on_device(x: torch.Tensor) -> torch.Tensor:
    """``x`` on DEVICE with its own strides (``.to`` makes a view with gaps contiguous)."""
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=DEVICE).copy_(x)


@pytest.mark.parametrize(
    "change,exc,words",
    [
        (dict(dst=torch.zeros(57, 512)), ValueError, ["dst", "[T, 576]", "(57, 512)"]),
        (dict(dst=torch.zeros(57, 576, dtype=torch.int32)), TypeError, ["dst", "int32"]),
        (dict(dst=torch.zeros(576, 57).t()), ValueError, ["dst", "stride 1", "(1, 57)"]),
        (dict(kv_cache=torch.zeros(4, 16, 512)), ValueError, ["kv_cache", "576", "(4, 16, 512)"]),
        (dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.uint8)), TypeError, ["kv_cache", "uint8"]),
        (
            dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.uint8), kv_cache_dtype="auto"),
            TypeError,
            ["kv_cache", "uint8", "fp8 kv_cache_dtype", "kv_cache_dtype='auto'"],
        ),
        (
            dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.uint8), kv_cache_dtype="bfloat16"),
            TypeError,
            ["kv_cache", "uint8", "kv_cache_dtype='bfloat16'"],
        ),
        (dict(kv_cache_dtype="fp16"), ValueError, ["kv_cache_dtype", "'fp8'", "'fp16'"]),
        (dict(kv_cache_dtype="fp8"), TypeError, ["kv_cache", "uint8", "kv_cache_dtype='fp8'", "float32"]),
        (dict(kv_cache_dtype="float16"), TypeError, ["kv_cache", "dtype float16", "float32"]),
        (
            dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.float8_e4m3fn), kv_cache_dtype="fp8_e4m3fnuz"),
            TypeError,
            ["kv_cache", "float8_e4m3fnuz", "float8_e4m3fn"],
        ),
        (
            dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.uint8), kv_cache_dtype="fp8"),
            TypeError,
            ["k_scale", "fp8", "None"],
        ),
        (dict(kv_cache=torch.zeros(4, 0, 576)), ValueError, ["kv_cache", "block_size >= 1"]),
        (dict(kv_cache=torch.zeros(4, 576, 16).transpose(1, 2)), ValueError, ["kv_cache", "stride 1"]),
        (dict(block_table=torch.zeros(3, 4)), TypeError, ["block_table", "int32 or int64", "float32"]),
        (dict(block_table=torch.zeros(4, 3, dtype=torch.int32).t()), ValueError, ["block_table", "stride 1"]),
        (dict(cu_seq_lens=torch.zeros(3, dtype=torch.int32)), ValueError, ["cu_seq_lens", "[R + 1]", "(4,)", "(3,)"]),
        (dict(starts=torch.zeros(2, dtype=torch.int32)), ValueError, ["starts", "[R]", "(3,)", "(2,)"]),
        (dict(token_to_seq=torch.zeros(50, dtype=torch.int32)), ValueError, ["token_to_seq", "57 rows", "(50,)"]),
        (dict(token_to_seq=torch.zeros(120, dtype=torch.int32)[::2]), ValueError, ["token_to_seq", "stride 1"]),
        (dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.float8_e4m3fn)), TypeError, ["k_scale", "fp8", "None"]),
        (
            dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.float8_e4m3fn), k_scale=torch.ones(2)),
            ValueError,
            ["k_scale", "1-element", "(2,)"],
        ),
        (dict(kv_cache=[1]), TypeError, ["kv_cache", "torch.Tensor", "list"]),
    ],
)
def test_bad_input_names_argument(change, exc, words):
    args = _args()
    args.update({k: _on_device(v) if isinstance(v, torch.Tensor) else v for k, v in change.items()})
    msg = raises_naming(exc, lambda: gather_context_chunk(**args), *words)
    assert msg.startswith("context_gather: ")


def test_overlap_and_devices_named():
    args = _args()
    with pytest.raises(ValueError, match="dst: expected no memory in common with kv_cache"):
        gather_context_chunk(**{**args, "dst": args["kv_cache"].view(-1, 576)[:57]})
    meta = torch.empty(args["starts"].shape, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="starts: expected device"):
        gather_context_chunk(**{**args, "starts": meta})
