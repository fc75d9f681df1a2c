"""mla_prefill and mla_prefill_with_context for every MLA head geometry (P, R, V) vLLM serves
(rocm_mla.cases.prefill.GEOMETRIES: DeepSeek 128/64/128, GLM-4.x-Lite 192/64/256, 64/64/128 and the
no-RoPE 256/0/256, k_pe None) and for dims that are no power of two at all: the kernel tiles each by
the next power of two and masks the columns past it (nothing padded in memory).

CPU: the interpreter, fp32/fp16, small odd sizes, the "default" config; the per-geometry launch data
(configs/mla_prefill.json ``geometries``) is checked through the plan. GPU (@pytest.mark.gpu): bf16 at
serving sizes with the arch's config for each geometry.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _util import DEVICE, DTYPES, raises_naming
from prefill_case import KERNEL_BACKENDS, cu

from rocm_mla.cases import generator, prefill, randn
from rocm_mla.cases.prefill import call_prefill
from rocm_mla.ops.prefill_plan import dim_tiles, launch_config, triton_meta

F32, F16 = torch.float32, torch.float16
GEOS = prefill.GEOMETRIES
# No dim a power of two (every column mask on, R's too), and R = 0 with P, V not powers of two either.
ODD_DIMS = [(40, 24, 72), (96, 0, 160)]


def _shape_ids(shapes):
    return [pytest.param(s, id=s.label.replace(" ", "_")) for s in shapes]


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", _shape_ids(prefill.SHAPES["geometry"]))
def test_geometry_matches_reference(backend, dtype, causal, shape):
    """Each geometry at odd sizes (ragged blocks, lq > lk, an empty sequence, one token), out the
    NaN-poisoned pad_v view, lse transposed, NaN key rows past the last sequence, sentinel guards
    around every buffer (nothing written outside out/lse)."""
    c = prefill.make_inputs(
        dataclasses.replace(shape, causal=causal),
        dtype=dtype,
        device=DEVICE,
        seed=2,
        out_layout="pad_v",
        lse_layout="transposed",
        key_tail=3,
        guard=16,
    )
    assert (c.k_pe is None) == (shape.dims[1] == 0)
    out, lse = c.run(backend=backend)
    assert out is c.out and out.shape == (shape.Tq, shape.N, shape.dims[2])
    c.check()
    c.check_guards()


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("kpe_layout", ["expand", "per_head_copy"])
@pytest.mark.parametrize("dims", ODD_DIMS, ids=lambda d: "/".join(map(str, d)))
def test_dims_without_power_of_two_are_masked(backend, kpe_layout, dims):
    """k_nope and v are the two halves of one [Tk, N, P + V] buffer and q's rope part follows its
    nope part: a k_nope tile read past P would take v's columns, a q tile past P its rope part,
    so only the masks make these match the reference."""
    shape = prefill.PrefillShape((21, 3, 40), 3, lk=(30, 3, 40), dims=dims)
    kpe_layout = "latent" if dims[1] == 0 else kpe_layout
    c = prefill.make_inputs(shape, dtype=F32, device=DEVICE, seed=3, kpe_layout=kpe_layout, guard=8)
    c.run(backend=backend)
    c.check()
    c.check_guards()


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dims", [GEOS["glm-lite"], (96, 0, 160), (40, 24, 72)], ids=lambda d: "/".join(map(str, d)))
def test_columns_past_a_dim_stay_out(backend, dims):
    """A NaN just past a tile's dim is read by a tile wider than the dim unless both operands of a
    dot are masked there (one zero side still makes 0 * NaN): NaN in head 1's q (past head 0's
    nope part when R = 0) and in v's first columns (past k_nope's, same kv_b_proj row) must not
    reach head 0's scores; the reference says where they do belong (v's column in out only)."""
    shape = prefill.PrefillShape((21, 3), 2, lk=(60, 3), dims=dims)  # keys 0..31 in the unmasked loop
    c = prefill.make_inputs(shape, dtype=F32, device=DEVICE, seed=6)
    c.q[4, 1, 0] = float("nan")  # head 1's first q column follows head 0's q row
    c.v[7, 0, 1] = float("nan")  # v's column 1 follows k_nope's last column in the kv row
    c.run(backend=backend)
    assert torch.isfinite(c.lse[0]).all()  # head 0's scores saw no NaN
    c.check()


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("shape", [pytest.param(s, id=s.name) for s in prefill.CONTEXT_SHAPES["geometry"]])
def test_context_chunks_every_geometry(backend, shape):
    """mla_prefill_with_context: the new tokens and two chunks (an empty sequence in each) equal
    one causal prefill over [context, new] keys, for every geometry other than DeepSeek's."""
    c = prefill.make_context_inputs(shape, dtype=F32, device=DEVICE, out_layout="pad_v")
    out, lse = c.run(backend=backend)
    assert out.shape[-1] == shape.dims[2]
    c.check()


@pytest.mark.parametrize("tma", [True, "host"], ids=["device_desc", "host_desc"])
@pytest.mark.parametrize("geo", ["glm-lite", "norope"])
def test_tma_paths_every_geometry(tma, geo):
    """Tensor descriptors with tiles wider than a dim (192 -> 256: a host descriptor would read the
    next head's columns, so the plan keeps per-program descriptors, whose zero fill masks them) and
    without k_pe (R = 0: no rope descriptors); NaN key rows past the last sequence stay out."""
    dims = GEOS[geo]
    cfg = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "tma": tma}
    padded = dims[0] != dim_tiles(dims)[0]
    want = 1 if tma is True or padded else 2
    assert triton_meta(cfg, "cpu", dims, True, False)[0]["USE_TMA"] == want
    shape = prefill.PrefillShape((37, 5, 0, 9), 2, lk=(50, 5, 3, 21), dims=dims)
    c = prefill.make_inputs(shape, dtype=F16, device=DEVICE, seed=4, key_tail=5)
    c.run(backend="triton", config=cfg)
    c.check()


def test_plan_tiles_and_launch_data_per_geometry():
    """Tiles are the next power of two (>= 16); the geometry's own tier of configs/mla_prefill.json
    is what plan_prefill launches, DeepSeek's and unlisted geometries take the first tier."""
    assert dim_tiles((128, 64, 128)) == (128, 64, 128)
    assert dim_tiles((192, 64, 256)) == (256, 64, 256)
    assert dim_tiles((256, 0, 256)) == (256, 16, 256)
    assert dim_tiles((1, 24, 72)) == (16, 32, 128)
    for arch in ("gfx942", "gfx950", "sm90"):
        for dtype in (torch.bfloat16, torch.float32):
            base = launch_config(arch, dtype)
            assert launch_config(arch, dtype, GEOS["deepseek"]) == base
            assert launch_config(arch, dtype, GEOS["nope64"]) == base
            for geo in ("glm-lite", "norope"):  # V = 256: its own (8-warp or smaller) tiles
                assert launch_config(arch, dtype, GEOS[geo]) != base
    consts, _ = triton_meta(
        launch_config("gfx942", torch.bfloat16, GEOS["glm-lite"]), "gfx942", GEOS["glm-lite"], True, False
    )
    assert (consts["D_NOPE"], consts["BLOCK_DN"], consts["D_V"], consts["BLOCK_DV"]) == (192, 256, 256, 256)


def _geometry_inputs(P, R, V, Tk=3, N=2):
    g = generator(0, DEVICE)
    q = randn((Tk, N, P + R), g, DEVICE)
    kn, v = randn((Tk, N, P), g, DEVICE), randn((Tk, N, V), g, DEVICE)
    kpe = randn((Tk, 1, R), g, DEVICE) if R else None
    return q, kn, kpe, v


def test_no_rope_and_dim_errors_name_the_argument():
    lq = [3]
    sc = prefill.SM_SCALE
    q, kn, _, v = _geometry_inputs(256, 0, 256)
    run = call_prefill
    # k_pe None means R = 0: q must then be [Tq, N, P]
    q192 = q[..., :192].contiguous()
    kn128 = kn[..., :128].contiguous()
    raises_naming(ValueError, lambda: run(q192, kn, None, v, cu(lq), cu(lq), sm_scale=sc), "q", "(*, 2, 256)", "R=0")
    # a zero-width k_pe is not "no RoPE": None is
    empty = kn.new_empty(3, 1, 0)
    raises_naming(ValueError, lambda: run(q, kn, empty, v, cu(lq), cu(lq), sm_scale=sc), "k_pe", "None", "0")
    # the Triton kernel tiles each dim in one register tile: up to 256
    qw, knw, kpe, vw = _geometry_inputs(300, 64, 128)
    words = ("k_nope", "<= 256", "(192, 64, 256)", "300")
    raises_naming(ValueError, lambda: run(qw, knw, kpe, vw, cu(lq), cu(lq), sm_scale=sc, backend="triton"), *words)
    out, _ = run(qw, knw, kpe, vw, cu(lq), cu(lq), sm_scale=sc, backend="reference")  # the reference: any
    assert out.shape == (3, 2, 128)
    # k_pe None with keys of another width than q's nope part
    raises_naming(ValueError, lambda: run(q, kn128, None, v, cu(lq), cu(lq), sm_scale=sc), "q", "P=128")


@pytest.mark.gpu
@pytest.mark.parametrize("geo", list(GEOS))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_geometry_serving_sizes_gpu(geo, causal):
    """bf16 at serving sizes with the arch's launch data for the geometry: ragged ends, an empty
    sequence, lq != lk, 16 heads; NaN-poisoned layer-output view, guards."""
    base = prefill.SHAPES["reference"][0]
    shape = dataclasses.replace(base, causal=causal, dims=GEOS[geo])
    c = prefill.make_inputs(shape, dtype=torch.bfloat16, device=DEVICE, seed=5, key_tail=64, guard=64)
    c.run()
    c.check()
    c.check_guards()


@pytest.mark.gpu
@pytest.mark.parametrize("geo", ["glm-lite", "norope"])
def test_geometry_context_gpu(geo):
    """The chunked-context path at serving sizes for the V = 256 geometries (bf16)."""
    shape = dataclasses.replace(prefill.CONTEXT_SHAPES["gpu"][0], dims=GEOS[geo])
    c = prefill.make_context_inputs(shape, dtype=torch.bfloat16, device=DEVICE)
    c.run()
    c.check()
