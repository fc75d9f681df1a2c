"""merge_attn_states: every backend against the float32 reference, the reference against
attention over the union of keys, strided layouts, the ±inf rules, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from _util import DEVICE, DTYPES, TOL, assert_close, backends, outside_untouched, poisoned_view, raises_naming, rand

import rocm_mla
from rocm_mla.reference import merge_attn_states_ref


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
    assert_close(out, full.float(), rtol=1e-5, atol=1e-5)
    assert_close(lse, lfull.float(), rtol=1e-5, atol=1e-5)


LAYOUTS = {
    # name: (kwargs for outputs, kwargs for lse)
    "contiguous": ({}, {}),
    "pad_v": ({"pad_last": 64}, {}),  # [T, N, 192][..., :128]-style rows
    "head_slice": ({"token_pad": 3}, {"transpose01": True}),  # token stride != N*D, lse [T, N].T
    "inner_stride2": ({"inner_stride": 2}, {"token_pad": 1}),  # scalar path
}


def _case(T, N, D, dtype, layout, with_lse=True):
    okw, lkw = LAYOUTS[layout]
    po_base, po = poisoned_view((T, N, D), dtype, **okw)
    so_base, so = poisoned_view((T, N, D), dtype, **okw)
    po.copy_(rand((T, N, D), dtype))
    so.copy_(rand((T, N, D), dtype))
    _, pl = poisoned_view((N, T), torch.float32, **lkw)
    _, sl = poisoned_view((N, T), torch.float32, **lkw)
    pl.copy_(rand((N, T), torch.float32, 3.0))
    sl.copy_(rand((N, T), torch.float32, 3.0))
    out_base, out = poisoned_view((T, N, D), dtype, **okw)
    ol_base, ol = poisoned_view((N, T), torch.float32, **lkw) if with_lse else (None, None)
    return po, pl, so, sl, out_base, out, ol_base, ol


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("T,N,D", [(1, 1, 128), (7, 8, 128), (5, 24, 512), (3, 3, 72), (4, 2, 13)])
def test_matches_reference(backend, dtype, layout, T, N, D):
    po, pl, so, sl, out_base, out, ol_base, ol = _case(T, N, D, dtype, layout)
    rocm_mla.merge_attn_states(out, po, pl, so, sl, ol, backend=backend)
    ref, ref_lse = merge_attn_states_ref(po, pl, so, sl)
    rtol, atol = TOL[dtype]
    assert not torch.isnan(out.float()).any(), "an output element was not written"
    assert_close(out.float(), ref, rtol=rtol, atol=atol)
    assert_close(ol, ref_lse, rtol=1e-5, atol=1e-5)
    assert outside_untouched(out_base, out), "wrote outside the output view"
    assert outside_untouched(ol_base, ol), "wrote outside the output_lse view"


@pytest.mark.parametrize("backend", backends())
def test_without_output_lse(backend):
    po, pl, so, sl, out_base, out, _, _ = _case(9, 16, 128, torch.float16, "pad_v", with_lse=False)
    rocm_mla.merge_attn_states(out, po, pl, so, sl, backend=backend)
    ref, _ = merge_attn_states_ref(po, pl, so, sl)
    assert_close(out.float(), ref, rtol=2e-3, atol=2e-3)
    assert outside_untouched(out_base, out)


@pytest.mark.parametrize("backend", backends())
def test_inf_rules(backend):
    """+inf reads as -inf; both empty -> 0 and -inf; a zero-weight side's NaN never leaks."""
    T, N, D = 4, 2, 32
    po = rand((T, N, D), torch.float32)
    so = rand((T, N, D), torch.float32)
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
    assert_close(out[0, 0], so[0, 0])  # only suffix saw keys
    assert_close(out[0, 1], po[0, 1])  # only prefix saw keys
    assert torch.equal(out[1, :], torch.zeros_like(out[1, :]))  # both empty -> 0
    assert ol[0, 1] == -inf and ol[1, 1] == -inf
    assert ol[0, 0].item() == pytest.approx(0.3, abs=1e-6)
    ref, ref_lse = merge_attn_states_ref(po, pl, so, sl)
    assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert_close(ol, ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("with_lse", [True, False], ids=["out_lse", "no_out_lse"])
def test_nan_lse_propagates(backend, with_lse):
    """A NaN lse (a partial attention that saw a NaN) poisons its row whatever the other side
    holds (-inf, +inf, finite, NaN): out and output_lse NaN, never read as "saw no key". Rows
    without a NaN are unaffected."""
    T, N, D = 5, 2, 24
    po = rand((T, N, D), torch.float32)
    so = rand((T, N, D), torch.float32)
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
    assert_close(out[ok], ref[ok], rtol=1e-5, atol=1e-5)
    if with_lse:
        assert torch.equal(torch.isnan(ol), bad)
        assert_close(ol[~bad], ref_lse[~bad], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", backends())
def test_large_lse_difference_is_stable(backend):
    T, N, D = 3, 4, 16
    po, so = rand((T, N, D), torch.float32), rand((T, N, D), torch.float32)
    pl = torch.full((N, T), 1000.0, device=DEVICE)
    sl = torch.full((N, T), -1000.0, device=DEVICE)
    out = torch.full_like(po, float("nan"))
    rocm_mla.merge_attn_states(out, po, pl, so, sl, backend=backend)
    assert_close(out, po)


@pytest.mark.parametrize("backend", backends())
def test_empty_batch(backend):
    z = torch.empty(0, 4, 128, device=DEVICE)
    lz = torch.empty(4, 0, device=DEVICE)
    rocm_mla.merge_attn_states(z, z.clone(), lz, z.clone(), lz.clone(), lz.clone(), backend=backend)


def test_in_place_over_prefix():
    """output may be the prefix buffer itself (each element is read before it is written)."""
    T, N, D = 5, 4, 64
    po, so = rand((T, N, D), torch.float32), rand((T, N, D), torch.float32)
    pl, sl = rand((N, T), torch.float32), rand((N, T), torch.float32)
    ref, _ = merge_attn_states_ref(po, pl, so, sl)
    for b in backends():
        buf = po.clone()
        rocm_mla.merge_attn_states(buf, buf, pl, so, sl, backend=b)
        assert_close(buf, ref, rtol=1e-5, atol=1e-5)


def test_aliasing_rules():
    """output may be an input itself; partial overlaps and an output_lse aliasing an input lse are
    rejected (threads of one row read the lse while one of them writes it)."""
    T, N, D = 4, 2, 16
    buf = rand((T + 1, N, D), torch.float32)
    pl, sl = rand((N, T), torch.float32), rand((N, T), torch.float32)
    so = rand((T, N, D), torch.float32)
    with pytest.raises(ValueError, match="output: expected no memory in common .*prefix_output"):
        rocm_mla.merge_attn_states(buf[1:], buf[:-1], pl, so, sl)
    with pytest.raises(ValueError, match="output_lse: expected no memory in common with prefix_lse"):
        rocm_mla.merge_attn_states(torch.empty_like(so), buf[:-1], pl, so, sl, pl)


# ---------------------------------------------------------------- bad input
def _good(T=3, N=2, D=8):
    o = rand((T, N, D), torch.float32)
    return dict(
        output=torch.empty_like(o),
        prefix_output=o,
        prefix_lse=rand((N, T), torch.float32),
        suffix_output=o.clone(),
        suffix_lse=rand((N, T), torch.float32),
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
    assert_close(args["output"], ref)
    monkeypatch.setenv("ROCM_MLA_BACKEND_MERGE_ATTN_STATES", "cuda-magic")
    with pytest.raises(ValueError, match="backend.*hip, triton, reference.*cuda-magic"):
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
    base = rand((T * N * D + 1,), dtype)
    po = base[1:].view(T, N, D)  # 2- or 4-byte offset
    so = rand((T, N, D), dtype)
    pl, sl = rand((N, T), torch.float32), rand((N, T), torch.float32)
    out = torch.full((T, N, D), float("nan"), dtype=dtype, device=DEVICE)
    rocm_mla.merge_attn_states(out, po, pl, so, sl, backend="hip")
    ref, _ = merge_attn_states_ref(po, pl, so, sl)
    rtol, atol = TOL[dtype]
    assert_close(out.float(), ref, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hip", "triton"])
def test_gpu_large_strided_bf16(backend):
    if backend not in backends():
        pytest.skip(f"{backend} unavailable")
    T, N, D = 4099, 128, 128
    po, pl, so, sl, out_base, out, ol_base, ol = _case(T, N, D, torch.bfloat16, "pad_v")
    rocm_mla.merge_attn_states(out, po, pl, so, sl, ol, backend=backend)
    ref, ref_lse = merge_attn_states_ref(po, pl, so, sl)
    assert_close(out.float(), ref, rtol=1.6e-2, atol=1.6e-2)
    assert_close(ol, ref_lse, rtol=1e-5, atol=1e-5)
    assert outside_untouched(out_base, out)


def test_default_dispatch_on_cpu():
    from rocm_mla.ops._dispatch import select

    if DEVICE.type == "cuda":
        assert select("merge_attn_states", DEVICE) in ("hip", "triton")
    else:
        assert select("merge_attn_states", DEVICE) == "triton"  # conftest turned the interpreter on
