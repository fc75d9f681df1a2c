"""indexer_k_cache_write: every backend writes the reference's bytes exactly (values and scales) for
both fp8 kinds and both scale formats at block sizes 1/16/64; the reference against the formula
(float64) and vLLM 0.34's layout rebuilt here from its own definitions (the shuffled writer's
address arithmetic, its torch reader's unshuffle, the paged-logits reference's dequantisation);
UE8M0 scales are powers of two; the default layout is vLLM's ROCm rule; strided keys; a NaN row;
errors name the argument; calls of few keys take fewer rows a program. Bad slots and zero sizes:
test_indexer_cache_memory_safety.py."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from _util import DEVICE, DTYPES, HAS_GPU, backends, raises_naming

import rocm_mla
from rocm_mla.cases import indexer_cache as cases
from rocm_mla.configs import config_for
from rocm_mla.ops.indexer_cache import OP, launch_rows, triton_meta
from rocm_mla.reference.indexer import (
    INDEXER_FP8_MAX,
    index_cache_keys,
    indexer_k_quant_ref,
    indexer_value_offsets,
    round_up_pow2,
)

F16 = torch.float16
E4M3FN, E4M3FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
KINDS = {"fp8_e4m3fn": E4M3FN, "fp8_e4m3fnuz": E4M3FNUZ}
CACHE_BACKENDS = [b for b in backends() if b != "hip"]  # no HIP kernel
ODD = [pytest.param(s, id=s.label) for s in cases.SHAPES["odd"]]
FMTS = [pytest.param("ue8m0", id="ue8m0"), pytest.param(None, id="plain")]


def case(shape=None, *, kind="fp8_e4m3fn", scale_fmt="ue8m0", dtype=F16, seed=0, **kw) -> cases.IndexerCacheInputs:
    shape = shape or cases.IndexerCacheShape(37, 16)
    shape = dataclasses.replace(shape, kind=kind, scale_fmt=scale_fmt)
    return cases.make_inputs(shape, dtype=dtype, device=DEVICE, seed=seed, **kw)


@pytest.mark.parametrize("backend", CACHE_BACKENDS)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scale_fmt", FMTS)
@pytest.mark.parametrize("shape", ODD)
def test_bytes_equal_reference(backend, kind, scale_fmt, shape):
    """Values and scales at the good slots bit for bit, every other byte 0xFF as it was."""
    c = case(shape, kind=kind, scale_fmt=scale_fmt, seed=shape.T + shape.block, block_pad=1)
    assert c.run(backend=backend) is None
    c.check()


@pytest.mark.parametrize("backend", CACHE_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_key_dtypes(backend, dtype):
    for shape in cases.SHAPES["selfcheck"]:
        c = case(shape, dtype=dtype, seed=3)
        c.run(backend=backend)
        c.check()


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scale_fmt", FMTS)
def test_reference_quantiser_by_the_formula(kind, scale_fmt):
    """Scales from the formula (2^ceil(log2 s) in float64 for UE8M0, exact there); codes within half
    an e4m3 step of the float32 k / scale, and equal to torch's round-to-nearest-even conversion."""
    fp8 = KINDS[kind]
    c = case(cases.IndexerCacheShape(130, 16), kind=kind, scale_fmt=scale_fmt, seed=5)
    k = c.k.float()
    codes, scales = indexer_k_quant_ref(c.k, fp8, scale_fmt=scale_fmt)
    fp8_max = {E4M3FN: 448.0, E4M3FNUZ: 224.0}[fp8]
    assert INDEXER_FP8_MAX[fp8] == fp8_max
    for t in range(k.shape[0]):
        s = max(1e-4, float(k[t].abs().max())) / fp8_max
        s = float(torch.tensor(s, dtype=torch.float32))  # the float32 division, correctly rounded
        if scale_fmt == "ue8m0":
            s = 2.0 ** math.ceil(math.log2(s))
        assert float(scales[t]) == s, t
    vals = codes.view(fp8).double()
    want = (k / scales[:, None]).double()  # the float32 quotient is what gets rounded to e4m3
    assert (want.abs() <= fp8_max * (1 + 2.0**-22)).all()  # a plain scale is rounded: one ulp over
    # e4m3: 3 mantissa bits; the smallest normal 2^-6 (fn) / 2^-7 (fnuz), subnormal step 8x finer.
    step = torch.where(want.abs() >= 2.0**-7, 2.0 ** (torch.floor(torch.log2(want.abs())) - 3), 2.0**-10)
    assert ((vals - want).abs() <= step / 2 + 1e-12).all()
    assert torch.equal(codes, (k / scales[:, None]).to(fp8).view(torch.uint8))


def test_round_up_pow2():
    x = torch.tensor([1.0, 1.0000001, 0.75, 2.0**-20 * 1.5, 3.0e-7, float("inf"), float("nan")])
    want = torch.tensor([1.0, 2.0, 1.0, 2.0**-19, 2.0**-21, float("inf"), float("nan")])
    got = round_up_pow2(x)
    assert torch.equal(got[:-1], want[:-1]) and torch.isnan(got[-1])


@pytest.mark.parametrize("backend", CACHE_BACKENDS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_ue8m0_scales_are_powers_of_two(backend, kind):
    c = case(cases.IndexerCacheShape(130, 64), kind=kind, seed=7)
    c.run(backend=backend)
    slots = c.written()
    _, _, scales = index_cache_keys(c.index_cache, slots, fp8_dtype=c.fp8, shuffled=True)
    mant, _ = torch.frexp(scales)
    assert (mant == 0.5).all(), "a UE8M0 scale that is not a power of two"
    t = c.slot_mapping.clone()
    k = c.k.float()[(t >= 0) & (t < c.index_cache.shape[0] * 64)]
    amax = k.abs().amax(1).clamp(min=1e-4)
    lo = amax / INDEXER_FP8_MAX[c.fp8]
    assert ((scales >= lo) & (scales < 2 * lo)).all()


# ---------------------------------------------------------------- vLLM 0.34's layout, rebuilt


def vllm_shuffled_value_offset(block_size: int, o: int, d: int, head_dim: int = 128) -> int:
    """The byte offset of value d of block offset o, as vLLM 0.34's ``_indexer_k_quant_and_cache_kernel``
    (v1/attention/ops/rocm_aiter_mla_sparse.py) computes it with LAYOUT="SHUFFLE", BLOCK_TILE_SIZE 16
    and HEAD_TILE_SIZE = 16 bytes // element size 1: ``dst_ptr + tile_offset``."""
    block_tile, head_tile = 16, 16
    tile_block_id, tile_block_offset = o // block_tile, o % block_tile
    dst = tile_block_id * block_tile * head_dim + tile_block_offset * head_tile
    tile_offset = d // head_tile * block_tile * head_tile + d % head_tile
    return dst + tile_offset


def vllm_unshuffle(values: torch.Tensor, block_size: int, dim: int = 128) -> torch.Tensor:
    """vLLM 0.34's ``_unshuffle_indexer_k_values``: ``[..., block_size * dim]`` bytes in 16 x 16
    tile order -> flat rows."""
    lead = values.shape[:-1]
    values = values.reshape(*lead, block_size // 16, dim // 16, 16, 16)
    return values.transpose(-3, -2).reshape(*lead, block_size * dim)


@pytest.mark.parametrize("bs", [16, 64])
def test_shuffle_offsets_are_vllms(bs):
    off = indexer_value_offsets(bs, True)
    want = torch.tensor([[vllm_shuffled_value_offset(bs, o, d) for d in range(128)] for o in range(bs)])
    assert torch.equal(off, want)
    assert torch.equal(torch.sort(off.flatten()).values, torch.arange(bs * 128))  # a permutation
    flat = torch.arange(bs * 128, dtype=torch.int32)
    assert torch.equal(vllm_unshuffle(flat[off.flatten().argsort()], bs), flat)


@pytest.mark.parametrize("backend", CACHE_BACKENDS)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("bs", [16, 64])
def test_shuffled_cache_reads_as_vllm_reads_it(backend, kind, bs):
    """The op's default cache at block_size > 1, read the way vLLM's ``fp8_paged_mqa_logits_torch``
    reads a ``shuffled`` cache (values unshuffled per block, then ``[blk * 128]`` fp8 bytes, scales
    the float32s after them), gives the same keys as a flat write and as index_cache_keys."""
    c = case(cases.IndexerCacheShape(70, bs), kind=kind, seed=bs)
    c.run(backend=backend)
    flat = case(cases.IndexerCacheShape(70, bs, shuffled=False), kind=kind, seed=bs)
    flat.run(backend=backend)
    assert not torch.equal(c.index_cache, flat.index_cache)
    nb = c.index_cache.shape[0]
    blocks = c.index_cache.reshape(nb, -1)
    values = vllm_unshuffle(blocks[:, : bs * 128], bs).view(KINDS[kind]).float().view(nb * bs, 128)
    scales = blocks[:, bs * 128 :].contiguous().view(torch.float32).reshape(nb * bs)
    slots = c.written()
    keys = values[slots] * scales[slots, None]
    ref_keys, _, _ = index_cache_keys(c.index_cache, slots, fp8_dtype=KINDS[kind], shuffled=True)
    flat_keys, _, _ = index_cache_keys(flat.index_cache, slots, fp8_dtype=KINDS[kind], shuffled=False)
    assert torch.equal(keys, ref_keys) and torch.equal(keys, flat_keys)
    fb = flat.index_cache.reshape(nb, -1)
    assert torch.equal(fb[:, bs * 128 :], blocks[:, bs * 128 :]), "scales are not shuffled"
    assert torch.equal(vllm_unshuffle(blocks[:, : bs * 128], bs), fb[:, : bs * 128])


def test_default_layout_is_vllms_rocm_rule():
    """shuffled=None: flat at block_size 1, shuffled above; a block_size that is neither 1 nor a
    multiple of 16 cannot take vLLM's ROCm layout (ValueError naming index_cache) but may be flat."""
    for bs, shuffled in ((1, False), (16, True), (64, True)):
        a = case(cases.IndexerCacheShape(20, bs), seed=1)
        b = case(cases.IndexerCacheShape(20, bs, shuffled=shuffled), seed=1)
        a.run(backend="reference")
        b.run(backend="reference")
        assert torch.equal(a.index_cache, b.index_cache), bs
    c = case(cases.IndexerCacheShape(20, 8), seed=1)
    raises_naming(ValueError, lambda: c.run(), "index_cache", "multiple of 16", "vLLM's ROCm rule")
    raises_naming(ValueError, lambda: c.run(shuffled=True), "index_cache", "multiple of 16", "shuffled=True")
    for backend in CACHE_BACKENDS:
        flat = case(cases.IndexerCacheShape(20, 8, shuffled=False), seed=1)
        flat.run(backend=backend)
        flat.check()


# ---------------------------------------------------------------- layouts of k and the cache


@pytest.mark.parametrize("backend", CACHE_BACKENDS)
def test_strided_and_transposed_k(backend):
    """k with a column stride (every other column of a buffer) and k as a transposed [128, T]
    buffer: the same bytes as a contiguous copy."""
    base = case(cases.IndexerCacheShape(37, 16), seed=9)
    k = base.k.contiguous()
    variants = {
        "column stride 2": torch.stack((k, k + 1), dim=-1).flatten(1)[:, ::2],
        "transposed": k.t().contiguous().t(),
    }
    base.run(backend=backend, k=k)
    want = base.cache_base.clone()
    for name, kv in variants.items():
        assert torch.equal(kv, k), name
        base.restore()
        base.run(backend=backend, k=kv)
        assert torch.equal(base.cache_base, want), name


@pytest.mark.parametrize("backend", CACHE_BACKENDS)
def test_float8_cache_view_and_short_slot_mapping(backend):
    """A float8 view of the cache is its own kind; tokens past a shorter slot_mapping are not written."""
    c = case(cases.IndexerCacheShape(37, 16), kind="fp8_e4m3fnuz", seed=11)
    c.run(backend=backend, index_cache=c.index_cache.view(E4M3FNUZ), kv_cache_dtype="fp8")
    c.check()
    c.restore()
    short = c.slot_mapping[:20]
    c.run(backend=backend, slot_mapping=short)
    kept = c.slot_mapping.clone()
    kept[20:] = -1
    want = c.cache0.clone()
    rocm_mla.reference.indexer_k_cache_write_ref(
        c.k, want.view(c.index_cache.shape), kept, fp8_dtype=E4M3FNUZ, shuffled=True
    )
    assert torch.equal(c.cache_base, want)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf / inf in the interpreter
@pytest.mark.parametrize("backend", CACHE_BACKENDS)
def test_nan_and_inf_rows(backend):
    """A NaN in a row: NaN scale and NaN codes; an inf: infinite scale. Other rows exact."""
    c = case(cases.IndexerCacheShape(9, 16), seed=13, skip=(), outside=())
    c.k[0, 5] = float("nan")
    c.k[7, 100] = float("inf")
    c.run(backend=backend)
    keys, vals, scales = index_cache_keys(c.index_cache, c.slot_mapping, fp8_dtype=c.fp8, shuffled=True)
    assert torch.isnan(scales[0]) and torch.isnan(vals[0].float()).all()
    assert torch.isinf(scales[7]) and torch.isnan(keys[7, 100])
    rest = [1, 2, 3, 4, 5, 6, 8]
    _, want_v, want_s = index_cache_keys(c.reference().view(c.index_cache.shape), c.slot_mapping[rest],
                                         fp8_dtype=c.fp8, shuffled=True)  # fmt: skip
    assert torch.equal(vals[rest].view(torch.uint8), want_v.view(torch.uint8)) and torch.equal(scales[rest], want_s)


def test_platform_kind_is_the_default():
    """kv_cache_dtype="fp8" on a uint8 cache: the platform's kind (configs/platform.json)."""
    from rocm_mla.cases import platform_fp8

    c = case(cases.IndexerCacheShape(16, 16), kind="fp8", seed=2)
    assert c.fp8 == platform_fp8(DEVICE)
    c.run(backend="reference")
    c.check()


# ---------------------------------------------------------------- errors


def test_few_keys_take_fewer_rows_a_program():
    """A call whose grid at the config's rows would leave CUs idle halves the rows a program until
    it does not (a decode step's one key a request); the warps follow, one lane a value at most.
    The odd shapes above run the one-row, two-row and config forms on the interpreter's 4 CUs."""
    full = config_for(OP, "sm90")["tiers"][0]["rows_per_program"]
    assert full == 8  # the boundaries below: the first S whose grid at 2 / 4 / 8 rows covers 132 CUs
    assert [launch_rows("sm90", S, 132) for S in (1, 64, 262, 263, 525, 1048, 1049)] == [
        1, 1, 1, 2, 4, 4, full,
    ]  # fmt: skip
    assert launch_rows("gfx942", 304 * full, 304) == full
    assert {launch_rows("cpu", s.T, 4) for s in cases.SHAPES["odd"] if s.T} >= {1, 2, full}
    meta = functools.partial(triton_meta, fp8=E4M3FNUZ, scale_fmt="ue8m0", shuffled=True)
    assert meta("gfx942", rows=1)[1]["num_warps"] == 2  # 128 values on 64-lane waves
    assert meta("sm90", rows=1)[1]["num_warps"] == 4
    assert meta("gfx942")[0]["ROWS"] == full
    for bad in (0, 3, 2 * full, True, 1.0):
        raises_naming(ValueError, lambda: meta("gfx942", rows=bad), "rows", "power of two")


def test_errors_name_the_argument():
    c = case(cases.IndexerCacheShape(12, 16), seed=4)
    k, cache, slots = c.k, c.index_cache, c.slot_mapping
    op = rocm_mla.indexer_k_cache_write
    raises_naming(ValueError, lambda: op(k[:, :64], cache, slots), "k", "[T, 128]", "(12, 64)")
    raises_naming(TypeError, lambda: op(k.to(torch.int32), cache, slots), "k", "int32")
    raises_naming(TypeError, lambda: op(k.tolist(), cache, slots), "k", "torch.Tensor", "list")
    raises_naming(ValueError, lambda: op(k, cache[..., :128], slots), "index_cache", "132", "(*, *, 132)")
    raises_naming(TypeError, lambda: op(k, cache.view(torch.int8), slots), "index_cache", "uint8", "int8")
    raises_naming(TypeError, lambda: op(k, cache.view(F16), slots), "index_cache", "uint8", "float16")
    raises_naming(
        TypeError, lambda: op(k, cache.view(E4M3FN), slots, kv_cache_dtype="fp8_e4m3fnuz"), "index_cache", "e4m3fnuz"
    )
    raises_naming(ValueError, lambda: op(k, cache, slots, kv_cache_dtype="auto"), "kv_cache_dtype", "'auto'")
    raises_naming(ValueError, lambda: op(k, cache, slots, scale_fmt="e8m0"), "scale_fmt", "'ue8m0' or None")
    raises_naming(TypeError, lambda: op(k, cache, slots, shuffled=1), "shuffled", "True, False or None")
    raises_naming(TypeError, lambda: op(k, cache, slots.int()), "slot_mapping", "int64", "int32")
    raises_naming(ValueError, lambda: op(k[:5], cache, slots), "slot_mapping", "S <= T = 5")
    raises_naming(ValueError, lambda: op(k, cache, torch.stack((slots, slots), 1)[:, 0]), "slot_mapping", "stride 1")
    wide = torch.full((3, 16, 140), 0xFF, dtype=torch.uint8, device=DEVICE)[..., :132]
    raises_naming(ValueError, lambda: op(k, wide, slots), "index_cache", "contiguous", "strides (2240, 140, 1)")
    odd = torch.zeros(3 * 16 * 132 + 1, dtype=torch.uint8, device=DEVICE)[1:].view(3, 16, 132)
    raises_naming(ValueError, lambda: op(k, odd, slots), "index_cache", "4-byte aligned")
    raises_naming(ValueError, lambda: op(k, cache[:, :0], slots[:0]), "index_cache", "block_size >= 1")
    huge = torch.empty((2**24, 128, 132), dtype=torch.uint8, device="meta")  # 2^31 slots, no memory
    raises_naming(ValueError, lambda: op(k, huge, slots), "index_cache", "2^31 - 1 slots", "(16777216, 128, 132)")
    # The cache over k's own bytes.
    buf = torch.zeros(4 * 16 * 132 // 2, dtype=F16, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: op(buf[: 12 * 128].view(12, 128), buf.view(torch.uint8).view(4, 16, 132), slots),
        "index_cache",
        "k",
        "no memory in common",
    )
    if HAS_GPU:
        raises_naming(ValueError, lambda: op(k.cpu(), cache, slots), "k", "device")


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["fp8", *KINDS])
@pytest.mark.parametrize("scale_fmt", FMTS)
def test_gpu_bf16_bytes_equal_reference(kind, scale_fmt):
    for shape in cases.SHAPES["odd"] + cases.SHAPES["bench"][:3]:
        c = case(shape, kind=kind, scale_fmt=scale_fmt, dtype=torch.bfloat16, seed=shape.T, block_pad=1)
        c.run(backend="triton")
        torch.cuda.synchronize()
        c.check()
