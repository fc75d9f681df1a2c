"""rocm_mla.cases.prefill's layouts and builders beyond the one-shot defaults: cu_seqlens from a
start row, q as a head slice, lse as a padded transpose, NaN key rows past the last sequence,
sentinel guards, and the chunked-context inputs (shape, one-shot equivalent, reference against a
float64 formula, the call)."""

from __future__ import annotations

import math

import pytest
import torch
from _util import DEVICE

from rocm_mla.cases import SENTINEL, compare, first_problem, prefill, raise_on
from rocm_mla.cases.prefill import ContextShape, PrefillShape
from rocm_mla.ops import PrefillContextPlan

F32, F16 = torch.float32, torch.float16


def test_cu_seqlens_from_a_start_row():
    assert prefill.cu_seqlens([4, 0, 5], "cpu").tolist() == [0, 4, 4, 9]
    cu = prefill.cu_seqlens([4, 0, 5], "cpu", start=2)
    assert cu.tolist() == [2, 6, 6, 11] and cu.dtype == torch.int32
    assert prefill.cu_seqlens([], "cpu", start=3).tolist() == [3]


def test_q_head_slice_and_padded_lse_layouts():
    s = PrefillShape((5, 4), 3, lk=(6, 4))
    c = prefill.make_inputs(s, dtype=F16, q_layout="head_slice", lse_layout="transposed_padded")
    assert c.q.shape == (9, 3, 192) and c.q.stride() == (5 * 200, 200, 1)
    assert c.lse.shape == (3, 9) and c.lse.stride() == (1, 4) and torch.isnan(c.lse_base).all()
    base = prefill.make_inputs(s, dtype=F16)
    assert base.q.is_contiguous() and base.lse.is_contiguous()
    with pytest.raises(ValueError, match="q in"):
        prefill.make_inputs(s, dtype=F16, q_layout="sliced")


@pytest.mark.parametrize("kpe_layout", prefill.KPE_LAYOUTS)
def test_key_tail_rows_are_nan_and_owned_by_no_sequence(kpe_layout):
    s = PrefillShape((3, 5), 2, lk=(4, 6))
    c = prefill.make_inputs(s, dtype=F32, kpe_layout=kpe_layout, key_tail=7)
    assert c.k_nope.shape[0] == c.k_pe.shape[0] == c.v.shape[0] == 17
    assert c.cu_seqlens_k.tolist() == [0, 4, 10]
    for x in (c.k_nope, c.k_pe, c.v):
        assert torch.isnan(x[10:]).all() and torch.isfinite(x[:10]).all()
    ro, rl = c.reference()  # the reference reads the sequences' keys only
    assert torch.isfinite(ro).all() and torch.isfinite(rl).all()


def test_guarded_buffers_keep_layouts_and_catch_a_stray_write():
    s = PrefillShape((6,), 2, lk=(5,))
    c = prefill.make_inputs(s, dtype=F32, guard=64, out_layout="pad_v", lse_layout="transposed_padded")
    assert set(c.guards) == {"q", "kv", "latent", "out", "lse"}
    assert c.out.stride() == (2 * 192, 192, 1) and c.lse.stride() == (1, 3)
    assert torch.isnan(c.out).all() and torch.isnan(c.lse).all()
    assert c.k_nope.data_ptr() == c.guards["kv"].view.data_ptr()  # views of the guarded buffers
    g = c.guards["out"]
    assert bool((g.base[:64] == SENTINEL).all()) and bool((g.base[-64:] == SENTINEL).all())
    c.run(backend="reference")
    c.check()
    c.check_guards()
    c.out.as_strided((1,), (1,), c.out.storage_offset() + 128).fill_(0.0)  # the pad after row 0's 128
    with pytest.raises(AssertionError, match="out: 1 guard elements changed"):
        c.check_guards()
    # unguarded inputs carry no guards
    assert prefill.make_inputs(s, dtype=F32).guards == {}


def test_context_shape_and_its_one_shot_equivalent():
    s = ContextShape((7, 0, 20), ((20, 5, 0), (10, 7, 0)), 4, name="two")
    assert s.new == PrefillShape((7, 0, 20), 4, name="two")
    assert s.one_shot.lk == (37, 12, 20) and s.one_shot.lq == (7, 0, 20)
    assert ContextShape((2, 3), (), 2).label == "lq=2,3 chunks=0 N=2"
    with pytest.raises(ValueError, match="one key count per sequence"):
        ContextShape((2, 3), ((1,),))
    assert {x.name for x in prefill.CONTEXT_SHAPES["odd"]} == {"two_chunks", "three_chunks_odd", "no_context"}


def test_context_inputs_one_shot_keys_in_order():
    s = ContextShape((2, 3), ((1, 4), (0, 2)), 2)
    c = prefill.make_context_inputs(s, dtype=F32, seed=3)
    assert len(c.chunks) == 2 and [ch.cu_seqlens_k.tolist() for ch in c.chunks] == [[0, 1, 5], [0, 0, 2]]
    assert c.chunks[0].k_nope.stride(0) == 2 * 256 and c.chunks[0].k_pe.shape == (5, 1, 64)
    q, kn, kpe, v, cq, ck = c.one_shot()
    assert q is c.q and cq is c.cu_seqlens_q and ck.tolist() == [0, 3, 12]
    ch0, ch1 = c.chunks
    # sequence 1's keys: chunk 0 rows 1..4, chunk 1 rows 0..1, then its new keys 2..4
    want = torch.cat([ch0.k_nope[1:5], ch1.k_nope[0:2], c.k_nope[2:5]])
    assert torch.equal(kn[3:12], want)
    assert torch.equal(v[:3], torch.cat([ch0.v[0:1], c.v[0:2]])) and torch.equal(kpe[:1], ch0.k_pe[:1])
    assert "causal" not in c.kwargs() and c.kwargs()["out"] is c.out
    # The call's plan: the new tokens' pass is causal, its hints the shape's longest sequences.
    plan = c.kwargs()["plan"]
    assert isinstance(plan, PrefillContextPlan) and plan.new_tokens.causal and plan.matches(*c.args())
    assert (plan.new_tokens.max_seqlen_q, plan.new_tokens.max_seqlen_k) == (3, 3)
    assert c.kwargs(backend="reference")["plan"].new_tokens.backend == "reference"
    with pytest.raises(TypeError, match="plan knobs"):
        c.kwargs(plan=plan, backend="reference")
    with pytest.raises(ValueError, match="one-shot call only"):
        c.reference(first_rows=4)


def test_context_reference_equals_dense_attention():
    """Each sequence: every context key visible, its new keys causal (bottom-right): float64."""
    s = ContextShape((3, 0, 4), ((2, 5, 0), (0, 1, 3)), 2)
    c = prefill.make_context_inputs(s, dtype=F32, seed=4)
    ro, rl = c.reference()
    chunks = [(ch.k_nope, ch.k_pe, ch.v, ch.cu_seqlens_k.tolist()) for ch in c.chunks]
    new = (c.k_nope, c.k_pe, c.v, c.cu_seqlens_k.tolist())
    q0 = 0
    for b, lq in enumerate(s.lq):
        parts = [(kn[o[b] : o[b + 1]], kp[o[b] : o[b + 1]], v[o[b] : o[b + 1]]) for kn, kp, v, o in [*chunks, new]]
        kn, kp, v = (torch.cat([p[i] for p in parts]).double() for i in range(3))
        k = torch.cat([kn, kp.expand(-1, 2, -1)], -1)  # [S, N, 192]
        ctx = k.shape[0] - lq
        mask = torch.arange(k.shape[0])[None, :] <= torch.arange(lq)[:, None] + ctx
        for h in range(2):
            sc = (c.q[q0 : q0 + lq, h].double() @ k[:, h].T) * c.sm_scale
            sc = sc.masked_fill(~mask, -math.inf)
            o, lse = torch.softmax(sc, -1) @ v[:, h], torch.logsumexp(sc, -1)
            bound = prefill.REFERENCE_VS_F64
            raise_on(
                first_problem(
                    compare("out", ro[q0 : q0 + lq, h], o, bound), compare("lse", rl[h, q0 : q0 + lq], lse, bound)
                )
            )
        q0 += lq


def test_context_inputs_run_and_check():
    c = prefill.make_context_inputs(prefill.CONTEXT_SHAPES["odd"][1], dtype=F32, device=DEVICE, seed=5)
    out, lse = c.run(backend="reference")
    assert out is c.out and lse is c.lse
    c.check()
    assert c.mismatch() == ""
    c.out[3, 1, 7] += 0.5
    assert "out: 1 of" in c.mismatch()
    c.run((ch for ch in c.chunks), backend="reference")  # any iterable of chunks
    c.check()


def test_named_bounds_are_tighter_than_the_float32_table():
    out32 = prefill.TOLERANCE[F32]["out"]
    for b in (prefill.REFERENCE_VS_F64, prefill.ONE_KEY):
        assert b.atol <= out32.atol and b.rtol <= out32.rtol


def test_case_calls_split_call_keywords_and_plan_knobs():
    """kwargs()/run() and call_prefill take mla_prefill's own keywords (CALL_KEYS) and plan the
    call with the rest (plan_prefill's knobs); a plan beside knobs is a TypeError."""
    s = PrefillShape((5, 0, 9), 2, lk=(7, 4, 9), causal=False)
    c = prefill.make_inputs(s, dtype=F32, device=DEVICE)
    kw = c.kwargs(backend="reference", max_seqlen_k=None, out=None)
    assert set(kw) == {"sm_scale", "out", "lse", "plan"} and kw["out"] is None and kw["lse"] is c.lse
    plan = kw["plan"]
    assert plan.backend == "reference" and not plan.causal and plan.max_seqlen_k is None and plan.max_seqlen_q == 9
    assert plan == c.plan(backend="reference", max_seqlen_k=None)
    assert c.kwargs(plan=plan)["plan"] is plan
    with pytest.raises(TypeError, match="plan knobs \\['causal'\\] beside a plan"):
        c.kwargs(plan=plan, causal=True)
    out, lse = c.run(backend="reference")
    c.check(out, lse)
    o2, l2 = prefill.call_prefill(*c.args(), sm_scale=c.sm_scale, causal=False, backend="reference")
    assert torch.equal(o2, out) and torch.equal(l2, lse)
    with pytest.raises(TypeError, match="call_prefill: plan knobs"):
        prefill.call_prefill(*c.args(), sm_scale=c.sm_scale, plan=plan, backend="reference")
