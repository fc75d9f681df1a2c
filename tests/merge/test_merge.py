"""merge_attn_states: every backend against the float32 reference, the reference against
attention over the union of keys, strided layouts, the ±inf rules, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from _util import DEVICE, DTYPES, backends, raises_naming

import rocm_mla
from rocm_mla.cases import compare, generator, outside_untouched, raise_on, randn
from rocm_mla.cases import merge as cases
from rocm_mla.cases.merge import ONE_SIDE, MergeShape
from rocm_mla.reference import merge_attn_states_ref

F32_TOL = cases.TOLERANCE[torch.float32]


def _expect(name, got, ref, bound):
    raise_on(compare(name, got, ref, bound).problem)


def _rand(shape, seed):
    return randn(shape, generator(seed, DEVICE), DEVICE)


def _attn_with_lse(q, k, v):
    """Dense softmax attention of q [T, N, D] over k, v [S, N, D]; returns out [T,N,D], lse [N,T]."""
    s = torch.einsum("tnd,snd->nts", q, k) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(s, dim=-1)  # [N, T]
    p = torch.softmax(s, dim=-1)
    return torch.einsum("nts,snd->tnd", p, v), lse


def test_reference_equals_attention_over_all_keys():
    """Independent check of the reference: merging attention over two key sets equals
    attention over their union (float64)."""
    g = torch.Generator().manual_seed(0)
    T, N, D, S1, S2 = 6, 4, 16, 9, 5
    q = torch.randn(T, N, D, generator=g, dtype=torch.float64)
    k = torch.randn(S1 + S2, N, D, generator=g, dtype=torch.float64)
    v = torch.randn(S1 + S2, N, D, generator=g, dtype=torch.float64)
    o1, l1 = _attn_with_lse(q, k[:S1], v[:S1])
    o2, l2 = _attn_with_lse(q, k[S1:], v[S1:])
    full, lfull = _attn_with_lse(q, k, v)
    out, lse = merge_attn_states_ref(o1, l1.float(), o2, l2.float())
    _expect("output", out, full.float(), F32_TOL["output"])
    _expect("output_lse", lse, lfull.float(), F32_TOL["output_lse"])


# The cases' layouts; "strided" (the pad_v rows prefill writes) keeps its test id "pad_v".
LAYOUT_IDS = {"strided": "pad_v"}


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(cases.LAYOUTS), ids=lambda x: LAYOUT_IDS.get(x, x))
@pytest.mark.parametrize("T,N,D", [(1, 1, 128), (7, 8, 128), (5, 24, 512), (3, 3, 72), (4, 2, 13)])
def test_matches_reference(backend, dtype, layout, T, N, D):
    """Every output element written (NaN-poisoned views), within the op's bound, nothing written
    outside the output and output_lse views."""
    case = cases.make_inputs(MergeShape(T, N, D, layout), dtype=dtype, device=DEVICE)
    case.run(backend=backend)
    case.check()
    assert outside_untouched(case.output_base, case.output), "wrote outside the output view"
    assert outside_untouched(case.output_lse_base, case.output_lse), "wrote outside the output_lse view"


@pytest.mark.parametrize("backend", backends())
def test_without_output_lse(backend):
    case = cases.make_inputs(MergeShape(9, 16, 128, "strided"), dtype=torch.float16, device=DEVICE, with_lse=False)
    case.run(backend=backend)
    case.check()
    assert outside_untouched(case.output_base, case.output)


@pytest.mark.parametrize("backend", backends())
def test_inf_rules(backend):
    """+inf reads as -inf; both empty -> 0 and -inf; a zero-weight side's NaN never leaks."""
    T, N, D = 4, 2, 32
    po = _rand((T, N, D), 1)
    so = _rand((T, N, D), 2)
    inf = float("inf")
    pl = torch.tensor([[inf, -inf, -inf, 1.0], [2.0, inf, 0.5, -inf]], device=DEVICE)
    sl = torch.tensor([[0.3, inf, 2.0, -inf], [-inf, -inf, 0.7, 1.5]], device=DEVICE)
    # NaN payload exactly where a side has weight 0: must not reach the output.
    po[0, 0] = float("nan")  # prefix lse +inf (empty)
    po[2, 0] = float("nan")  # prefix lse -inf
    so[0, 1] = float("nan")  # suffix lse -inf
    out = torch.full((T, N, D), float("nan"), device=DEVICE)
    ol = torch.full((N, T), float("nan"), device=DEVICE)
    rocm_mla.merge_attn_states(out, po, pl, so, sl, ol, backend=backend)
    assert not torch.isnan(out).any() and not torch.isnan(ol).any()
    _expect("output[0, 0]", out[0, 0], so[0, 0], ONE_SIDE)  # only suffix saw keys
    _expect("output[0, 1]", out[0, 1], po[0, 1], ONE_SIDE)  # only prefix saw keys
    assert torch.equal(out[1, :], torch.zeros_like(out[1, :]))  # both empty -> 0
    assert ol[0, 1] == -inf and ol[1, 1] == -inf
    assert ol[0, 0].item() == pytest.approx(0.3, abs=1e-6)
    ref, ref_lse = merge_attn_states_ref(po, pl, so, sl)
    _expect("output", out, ref, F32_TOL["output"])
    _expect("output_lse", ol, ref_lse, F32_TOL["output_lse"])


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("with_lse", [True, False], ids=["out_lse", "no_out_lse"])
def test_nan_lse_propagates(backend, with_lse):
    """A NaN lse (a partial attention that saw a NaN) poisons its row whatever the other side
    holds (-inf, +inf, finite, NaN): out and output_lse NaN, never read as "saw no key". Rows
    without a NaN are unaffected."""
    T, N, D = 5, 2, 24
    po = _rand((T, N, D), 3)
    so = _rand((T, N, D), 4)
    inf, nan = float("inf"), float("nan")
    pl = torch.tensor([[nan, nan, nan, nan, 0.5], [-inf, inf, 1.0, 0.2, 0.1]], device=DEVICE)
    sl = torch.tensor([[-inf, inf, 1.0, nan, 0.3], [nan, nan, nan, -inf, 0.4]], device=DEVICE)
    out = torch.full((T, N, D), 7.0, device=DEVICE)
    ol = torch.full((N, T), 7.0, device=DEVICE) if with_lse else None
    rocm_mla.merge_attn_states(out, po, pl, so, sl, ol, backend=backend)
    bad = torch.isnan(pl) | torch.isnan(sl)  # [N, T]
    assert bool(torch.isnan(out[bad.transpose(0, 1)]).all()), "a NaN lse did not reach the output"
    assert not torch.isnan(out[~bad.transpose(0, 1)]).any()
    ref, ref_lse = merge_attn_states_ref(po, pl, so, sl)
    assert torch.equal(torch.isnan(ref), torch.isnan(out)) and torch.equal(torch.isnan(ref_lse), bad)
    ok = ~bad.transpose(0, 1)
    _expect("output", out[ok], ref[ok], F32_TOL["output"])
    if with_lse:
        assert torch.equal(torch.isnan(ol), bad)
        _expect("output_lse", ol[~bad], ref_lse[~bad], F32_TOL["output_lse"])


@pytest.mark.parametrize("backend", backends())
def test_large_lse_difference_is_stable(backend):
    T, N, D = 3, 4, 16
    case = cases.make_inputs(MergeShape(T, N, D, "contiguous"), dtype=torch.float32, device=DEVICE, with_lse=False)
    case.prefix_lse.fill_(1000.0)
    case.suffix_lse.fill_(-1000.0)
    case.run(backend=backend)
    _expect("output", case.output, case.prefix_output, ONE_SIDE)


@pytest.mark.parametrize("backend", backends())
def test_empty_batch(backend):
    cases.make_inputs(MergeShape(0, 4, 128, "contiguous"), dtype=torch.float32, device=DEVICE).run(backend=backend)


def test_in_place_over_prefix():
    """output may be the prefix buffer itself (each element is read before it is written)."""
    shape = MergeShape(5, 4, 64, "contiguous")
    case = cases.make_inputs(shape, dtype=torch.float32, device=DEVICE, lse_scale=1.0, with_lse=False)
    ref = case.reference()
    for b in backends():
        buf = case.prefix_output.clone()
        rocm_mla.merge_attn_states(buf, buf, case.prefix_lse, case.suffix_output, case.suffix_lse, backend=b)
        case.check(buf, ref=ref)


def test_aliasing_rules():
    """output may be an input itself; partial overlaps and an output_lse aliasing an input lse are
    rejected (threads of one row read the lse while one of them writes it)."""
    T, N, D = 4, 2, 16
    buf = _rand((T + 1, N, D), 5)
    pl, sl = _rand((N, T), 6), _rand((N, T), 7)
    so = _rand((T, N, D), 8)
    with pytest.raises(ValueError, match="output: expected no memory in common .*prefix_output"):
        rocm_mla.merge_attn_states(buf[1:], buf[:-1], pl, so, sl)
    with pytest.raises(ValueError, match="output_lse: expected no memory in common with prefix_lse"):
        rocm_mla.merge_attn_states(torch.empty_like(so), buf[:-1], pl, so, sl, pl)


# ---------------------------------------------------------------- bad input
def _good(T=3, N=2, D=8):
    o = _rand((T, N, D), 9)
    return dict(
        output=torch.empty_like(o),
        prefix_output=o,
        prefix_lse=_rand((N, T), 10),
        suffix_output=o.clone(),
        suffix_lse=_rand((N, T), 11),
    )


@pytest.mark.parametrize(
    "change,exc,words",
    [
        (dict(prefix_output=torch.zeros(3, 2, 9)), ValueError, ["prefix_output", "(3, 2, 8)", "(3, 2, 9)"]),
        (
            dict(suffix_output=torch.zeros(3, 2, 8, dtype=torch.float16)),
            TypeError,
            ["suffix_output", "float32", "float16"],
        ),
        (dict(prefix_lse=torch.zeros(3, 2)), ValueError, ["prefix_lse", "[N, T]", "(2, 3)", "(3, 2)"]),
        (dict(suffix_lse=torch.zeros(2, 3, dtype=torch.float16)), TypeError, ["suffix_lse", "float32", "float16"]),
        (dict(output=torch.zeros(3, 2, 8, dtype=torch.int32)), TypeError, ["output", "int32"]),
        (dict(output=torch.zeros(3, 16)), ValueError, ["output", "3-D", "(3, 16)"]),
        (dict(output_lse=torch.zeros(2, 4)), ValueError, ["output_lse", "(2, 3)", "(2, 4)"]),
        ("expanded_output", ValueError, ["output", "overlap", "stride"]),
        (dict(prefix_output=[1, 2]), TypeError, ["prefix_output", "torch.Tensor", "list"]),
    ],
)
def test_bad_input_names_argument(change, exc, words):
    args = _good()
    args = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    if change == "expanded_output":  # built on the device: .to() would materialise the expand
        change = dict(output=torch.zeros(3, 2, 1, device=DEVICE).expand(3, 2, 8))
    args.update({k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in change.items()})
    raises_naming(exc, lambda: rocm_mla.merge_attn_states(**args), *words)


@pytest.mark.gpu
def test_mixed_devices_rejected():
    args = _good()
    args = {k: v.to("cuda") for k, v in args.items()}
    args["suffix_lse"] = args["suffix_lse"].cpu()
    with pytest.raises(ValueError, match="suffix_lse.*device"):
        rocm_mla.merge_attn_states(**args)


def test_mixed_devices_message_without_gpu():
    """The device check itself, exercised on CPU with a meta tensor as the odd one out."""
    args = _good()
    args = {k: v.to(DEVICE) for k, v in args.items()}
    args["prefix_lse"] = torch.empty(args["prefix_lse"].shape, device="meta")
    with pytest.raises(ValueError, match="prefix_lse.*device"):
        rocm_mla.merge_attn_states(**args)


def test_forced_backend(monkeypatch):
    args = {k: v.to(DEVICE) for k, v in _good().items()}
    monkeypatch.setenv("ROCM_MLA_BACKEND_MERGE_ATTN_STATES", "reference")
    rocm_mla.merge_attn_states(**args)
    ref, _ = merge_attn_states_ref(args["prefix_output"], args["prefix_lse"], args["suffix_output"], args["suffix_lse"])
    assert torch.equal(args["output"], ref), "the forced reference backend is the reference"
    monkeypatch.setenv("ROCM_MLA_BACKEND_MERGE_ATTN_STATES", "cuda-magic")
    with pytest.raises(
        ValueError, match="ROCM_MLA_BACKEND_MERGE_ATTN_STATES='cuda-magic': expected one of hip, triton, reference"
    ):
        rocm_mla.merge_attn_states(**args)


def test_forced_unavailable_backend_raises():
    if DEVICE.type == "cuda":
        pytest.skip("HIP can run here")
    args = _good()
    with pytest.raises(RuntimeError, match="'hip' was requested but cannot run"):
        rocm_mla.merge_attn_states(**args, backend="hip")


# ---------------------------------------------------------------- GPU-only paths
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_hip_misaligned_falls_back_to_scalar(dtype):
    """Pointers off 16-byte alignment take the scalar path and stay right."""
    if "hip" not in backends():
        pytest.skip("HIP extension unavailable")
    T, N, D = 33, 16, 128
    shape = MergeShape(T, N, D, "contiguous")
    case = cases.make_inputs(shape, dtype=dtype, device=DEVICE, lse_scale=1.0, with_lse=False)
    base = torch.empty(T * N * D + 1, dtype=dtype, device=DEVICE)
    case.prefix_output = base[1:].view(T, N, D).copy_(case.prefix_output)  # 2- or 4-byte offset
    case.run(backend="hip")
    case.check()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hip", "triton"])
def test_gpu_large_strided_bf16(backend):
    if backend not in backends():
        pytest.skip(f"{backend} unavailable")
    case = cases.make_inputs(MergeShape(4099, 128, 128, "strided"), dtype=torch.bfloat16, device=DEVICE)
    case.run(backend=backend)
    case.check()
    assert outside_untouched(case.output_base, case.output)


def test_default_dispatch_on_cpu():
    from rocm_mla.ops._dispatch import select

    if DEVICE.type == "cuda":
        assert select("merge_attn_states", DEVICE) in ("hip", "triton")
    else:
        assert select("merge_attn_states", DEVICE) == "triton"  # conftest turned the interpreter on
