"""plan_prefill: what an mla_prefill call launches, from its sizes, dtype and device (made once
per step, or by plan_prefill_for from a call's tensors); the call checks its tensors against it and
decides the TMA alignment from them. plan_prefill_with_context: the same for
mla_prefill_with_context (the new tokens' plan, each chunk's planned from it). Most tests run no
kernel (the launches themselves are the other prefill tests); the reuse tests run the kernels."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, raises_naming
from prefill_case import KERNEL_BACKENDS, case, cu

import rocm_mla
from rocm_mla._platform import device_arch
from rocm_mla.cases import generator, prefill, randn
from rocm_mla.cases.prefill import P, V, call_prefill, call_prefill_with_context
from rocm_mla.ops import (
    PrefillContextPlan,
    PrefillPlan,
    mla_prefill_with_context,
    plan_prefill,
    plan_prefill_for,
    plan_prefill_with_context,
    plan_prefill_with_context_for,
)
from rocm_mla.ops._checks import Checker
from rocm_mla.ops.prefill_plan import _tma_arch, grid_slots, head_group, kpe_head_stride, launch_config

F32, F16 = torch.float32, torch.float16
SMALL = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


def _qkv(c):
    return c.args()[:4]


def test_plan_is_the_config_head_group_and_grid():
    """Tq=45+70 rows of B=2 sequences, N=4 heads: ``grid_slots`` slots x N programs on one axis,
    the head group and constexprs of the arch's launch data (the config= override when given)."""
    c = case([45, 70], [58, 70], 4, F32)
    q, kn, kpe, v = _qkv(c)
    plan = plan_prefill_for(*c.args(), causal=True)
    cfg = launch_config(plan.arch, F32)
    assert plan.config == cfg
    slots = grid_slots(q.shape[0], 2, 4, int(cfg["BLOCK_M"]))
    assert (plan.num_slots, plan.grid) == (slots, (slots * 4,))
    assert plan.head_group == head_group(cfg, 4, kn.shape[0], (P + V) * 4)
    assert plan.constexprs["CAUSAL"] and plan.constexprs["DOT_PREC"] == "ieee" and plan.use_tma == 0
    plan = plan_prefill_for(*c.args(), causal=False, config={**SMALL, "head_group": 3})
    assert plan.config["head_group"] == 3 and plan.head_group == 2  # the largest divisor of N=4 not above 3
    assert plan.grid == (grid_slots(q.shape[0], 2, 4, 32) * 4,) and not plan.constexprs["CAUSAL"]


def test_plan_from_sizes_is_the_plan_from_the_tensors():
    """plan_prefill from B, N, Tq, Tk, head dims, dtype and device equals plan_prefill_for of a
    call's tensors (what a serving step makes once, and what a call with plan=None makes); the
    hints and knobs are kept as given; a float32 plan has no TMA."""
    c = case([45, 0, 70], [58, 3, 70], 4, F16)
    kw = dict(causal=False, max_seqlen_q=70, max_seqlen_k=70, config={**SMALL, "tma": True})
    sizes = dict(batch=3, num_heads=4, q_rows=115, k_rows=131, q_dtype=F16, device=DEVICE)
    plan = plan_prefill(**sizes, **kw)
    assert plan == plan_prefill_for(*c.args(), **kw)
    assert isinstance(plan, PrefillPlan) and plan.matches(*c.args())
    assert (plan.batch, plan.num_heads, plan.q_rows, plan.k_rows, plan.head_dims) == (3, 4, 115, 131, (128, 64, 128))
    assert (plan.causal, plan.max_seqlen_q, plan.max_seqlen_k) == (False, 70, 70)
    assert plan.backend == "triton" and not plan.batch_invariant and not plan.debug
    assert plan.use_tma == (1 if _tma_arch(device_arch(DEVICE)) else 0)
    assert plan_prefill(**{**sizes, "q_dtype": F32}, **kw).use_tma == 0
    assert plan_prefill(**sizes, debug=True).debug and plan_prefill(**sizes, backend="reference").backend == "reference"


def test_plan_kpe_head_stride():
    """One rope head broadcast over N: head stride 0; a real ``[Tk, N, R]`` k_pe keeps its own.
    The stride is the tensor's, read at the call: one plan serves both forms."""
    c = case([9], [9], 2, F32)
    q, kn, kpe, v = _qkv(c)
    per_head = kpe.expand(-1, 2, -1).contiguous()
    assert kpe_head_stride(kpe) == 0 and kpe_head_stride(per_head) == per_head.stride(1) and kpe_head_stride(None) == 0
    plan = plan_prefill_for(*c.args())
    cq, ck = c.cu_seqlens_q, c.cu_seqlens_k
    assert plan.matches(q, kn, kpe, v, cq, ck) and plan.matches(q, kn, per_head, v, cq, ck)
    assert plan == plan_prefill_for(q, kn, per_head, v, cq, ck)


TMA_ARCH = _tma_arch(device_arch(DEVICE))


@pytest.mark.skipif(not TMA_ARCH, reason="TMA descriptors need an NVIDIA sm90+ GPU or the interpreter")
@pytest.mark.parametrize("tma, mode", [(False, 0), (True, 1), ("host", 2)])
def test_plan_tma_mode_needs_16_bit_aligned_tensors(tma, mode):
    """The config's tma becomes USE_TMA for aligned 16-bit tensors, 0 for a misaligned k_nope
    (decided per call from the tensors: the plan's pointer constexprs) or fp32 inputs; an unknown
    tma value raises, whatever the tensors."""
    cfg = {**SMALL, "tma": tma}
    c = case([4], [4], 2, F16)
    q, kn, kpe, v = _qkv(c)
    plan = plan_prefill_for(*c.args(), config=cfg)
    assert plan.use_tma == mode and plan.launch_constexprs(q, kn, kpe, v)["USE_TMA"] == mode
    odd = randn((4, 2, 2 * P), generator(0, DEVICE), DEVICE, F16)[..., 1 : P + 1]  # base 2 bytes off 16
    assert plan.matches(q, odd, kpe, v, c.cu_seqlens_q, c.cu_seqlens_k)
    unaligned = plan.launch_constexprs(q, odd, kpe, v)
    assert unaligned["USE_TMA"] == 0 and unaligned is plan.pointer_constexprs
    assert {k: x for k, x in unaligned.items() if k != "USE_TMA"} == {
        k: x for k, x in plan.constexprs.items() if k != "USE_TMA"
    }
    c32 = case([4], [4], 2, F32)
    assert plan_prefill_for(*c32.args(), config=cfg).use_tma == 0
    with pytest.raises(ValueError, match='mla_prefill: config: expected a "tma" of false, true or "host", got \'yes\''):
        plan_prefill_for(*c32.args(), config={**SMALL, "tma": "yes"})


@pytest.mark.parametrize("backend", KERNEL_BACKENDS + ["reference"])
def test_a_plan_reused_across_calls_gives_the_bits_of_per_call_planning(backend):
    """One plan (made once from the sizes, as a step makes it) run by several calls -- other
    tensors of the same sizes, other out/lse layouts, other sm_scale, as a model's layers call --
    gives bit for bit what each call planning from its own tensors gives."""
    cfg = {**SMALL, "head_group": 2}
    lq, lk = [37, 0, 20, 5], [37, 6, 45, 5]
    plan = plan_prefill(
        batch=4, num_heads=4, q_rows=62, k_rows=93, q_dtype=F32, device=DEVICE, config=cfg, backend=backend
    )
    for seed, scale, layout in ((1, 0.1, "flat"), (2, 0.07, "contiguous"), (3, 0.1, "pad_v")):
        c = case(lq, lk, 4, F32, seed=seed, out_layout=layout, lse_layout="transposed")
        planned = [t.clone() for t in rocm_mla.mla_prefill(*c.args(), sm_scale=scale, plan=plan, out=c.out, lse=c.lse)]
        c.out.fill_(float("nan"))
        c.lse.fill_(float("nan"))
        call_prefill(*c.args(), sm_scale=scale, out=c.out, lse=c.lse, config=cfg, backend=backend)
        assert torch.equal(planned[0], c.out) and torch.equal(planned[1], c.lse), (seed, layout)
        if scale == c.sm_scale:
            c.check()


def test_a_mismatched_plan_raises_naming_the_field():
    """A plan made for other sizes, dtype or device: ValueError naming the first field that differs,
    after the tensors' own rules; not a plan: TypeError."""
    c = case([3, 2], [4, 2], 2, F32)
    args = c.args()

    def call(plan):
        return lambda: rocm_mla.mla_prefill(*args, sm_scale=0.1, plan=plan)

    sizes = dict(batch=2, num_heads=2, q_rows=5, k_rows=6, q_dtype=F32, device=DEVICE)
    rocm_mla.mla_prefill(*args, sm_scale=0.1, plan=plan_prefill(**sizes))  # the right one runs
    for field, value, words in (
        ("batch", 3, ["batch=2", "batch=3"]),
        ("num_heads", 4, ["num_heads=2", "num_heads=4"]),
        ("q_rows", 6, ["q_rows=5", "q_rows=6"]),
        ("k_rows", 9, ["k_rows=6", "k_rows=9"]),
        ("head_dims", (128, 64, 256), ["head_dims=(128, 64, 128)", "head_dims=(128, 64, 256)"]),
        ("q_dtype", F16, ["q_dtype=torch.float32", "q_dtype=torch.float16"]),
        ("device", "meta", ["device=", "meta"]),
    ):
        other = plan_prefill(**{**sizes, field: value}, backend="reference")
        msg = raises_naming(ValueError, call(other), "mla_prefill: plan", "a plan made for this call", *words)
        assert field in msg
    no_rope = plan_prefill(**{**sizes, "head_dims": (192, 0, 128)}, backend="reference")
    raises_naming(ValueError, call(no_rope), "plan", "head_dims=(128, 64, 128)")
    raises_naming(TypeError, call("plan"), "plan", "PrefillPlan", "str")
    # the tensors' own rules come first: a bad tensor is named as without a plan
    plan = plan_prefill(**sizes)
    bad = (args[0], args[1], args[2], args[3], cu([3, 2]).long(), args[5])
    raises_naming(TypeError, lambda: rocm_mla.mla_prefill(*bad, sm_scale=0.1, plan=plan), "cu_seqlens_q", "int64")


@pytest.mark.parametrize(
    "change,exc,words",
    [
        (dict(batch=-1), ValueError, ["batch", "int >= 0", "-1"]),
        (dict(num_heads=2.0), ValueError, ["num_heads", "int >= 0", "2.0"]),
        (dict(q_rows=True), ValueError, ["q_rows", "int >= 0", "True"]),
        (dict(head_dims=(128, 64)), ValueError, ["head_dims", "(P, R, V)", "(128, 64)"]),
        (dict(head_dims=(0, 64, 128)), ValueError, ["head_dims", "P, V >= 1", "(0, 64, 128)"]),
        (dict(head_dims=(128, 64, 512)), ValueError, ["head_dims", "V <= 256 for the Triton kernel", "512"]),
        (dict(q_dtype=torch.float64), TypeError, ["q_dtype", "float16, bfloat16 or float32", "float64"]),
        (dict(backend="hip"), RuntimeError, ["'hip'", "no HIP kernel"]),
        (dict(config={**SMALL, "head_group": 0}), ValueError, ["config", '"head_group" >= 1', "got 0"]),
        (dict(config=[1]), TypeError, ["config", "a dict", "[1]"]),
        (dict(batch=2**24, num_heads=128), ValueError, ["q_rows, batch, num_heads", "< 2**31", "got 2147483648"]),
    ],
)
def test_bad_sizes_name_the_argument(change, exc, words):
    sizes = dict(batch=2, num_heads=2, q_rows=5, k_rows=6, q_dtype=F32, device=DEVICE, backend="triton")
    raises_naming(exc, lambda: plan_prefill(**{**sizes, **change}), "mla_prefill", *words)


def test_wide_dims_are_the_reference_backends():
    """Head dims past a Triton tile plan (and run) on the reference backend."""
    plan = plan_prefill(
        batch=1,
        num_heads=2,
        q_rows=3,
        k_rows=3,
        q_dtype=F32,
        device=DEVICE,
        head_dims=(300, 64, 512),
        backend="reference",
    )
    assert plan.backend == "reference" and plan.head_dims == (300, 64, 512)


# ---------------------------------------------------------------- prefill with context


def _context_case(seed=0, lq=(3, 4), chunks=((2, 5), (0, 3), (4, 1)), N=2, **layouts):
    return prefill.make_context_inputs(
        prefill.ContextShape(lq, chunks, N), dtype=F32, device=DEVICE, seed=seed, **layouts
    )


def test_context_plan_from_sizes_is_the_plan_from_the_tensors():
    """plan_prefill_with_context from the new tokens' sizes equals plan_prefill_with_context_for of
    a call's tensors; its new-token pass is plan_prefill's causal plan with the same knobs, and a
    chunk's pass is plan_prefill's non-causal plan of the chunk's keys (the chunk's own
    max_seqlen_k hint), with the knobs resolved once (backend, debug, config), made once per size."""
    c = _context_case(lq=(45, 0, 70), chunks=((5, 3, 0), (0, 1, 9)), N=4)
    kw = dict(max_seqlen_q=70, max_seqlen_k=70, config={**SMALL, "head_group": 2}, batch_invariant=True)
    sizes = dict(batch=3, num_heads=4, q_rows=115, k_rows=115, q_dtype=F32, device=DEVICE)
    plan = plan_prefill_with_context(**sizes, **kw)
    assert isinstance(plan, PrefillContextPlan) and plan == plan_prefill_with_context_for(*c.args(), **kw)
    assert plan.matches(*c.args()) and plan.merge_backend is None
    assert plan.new_tokens == plan_prefill(**sizes, causal=True, **kw)
    ck = plan.chunk_plan(Checker("t"), 10, 9)
    assert ck == plan_prefill(**{**sizes, "k_rows": 10}, causal=False, **{**kw, "max_seqlen_k": 9}, backend="triton")
    assert ck is plan.chunk_plan(Checker("t"), 10, 9) and plan.chunk_plan(Checker("t"), 10) is not ck
    assert not ck.causal and ck.max_seqlen_q == 70 and ck.batch_invariant and ck.config == plan.new_tokens.config
    forced = plan_prefill_with_context(**sizes, backend="reference", debug=True)
    assert forced.merge_backend == "reference" and forced.new_tokens.backend == "reference"
    assert forced.chunk_plan(Checker("t"), 3).backend == "reference" and forced.chunk_plan(Checker("t"), 3).debug
    # A bad chunk hint is named by the checker given (the op names the chunk).
    with pytest.raises(ValueError, match="t: max_seqlen_k: expected None or an int >= 0, got -2"):
        plan.chunk_plan(Checker("t"), 10, -2)
    with pytest.raises(TypeError, match="causal"):
        plan_prefill_with_context(**sizes, causal=False)  # the new tokens are causal, the chunks not


@pytest.mark.parametrize("backend", KERNEL_BACKENDS + ["reference"])
def test_a_context_plan_reused_across_calls_gives_the_bits_of_per_call_planning(backend):
    """One context plan (made once from the new tokens' sizes) run by several calls with other
    tensors, chunks, layouts and sm_scale gives bit for bit what each call planning from its own
    tensors gives, and the case's reference."""
    cfg = {**SMALL, "head_group": 2}
    sizes = dict(batch=2, num_heads=2, q_rows=7, k_rows=7, q_dtype=F32, device=DEVICE)
    plan = plan_prefill_with_context(**sizes, config=cfg, backend=backend)
    for seed, scale, layout in ((1, 0.1, "flat"), (2, 0.07, "pad_v")):
        c = _context_case(seed, out_layout=layout, lse_layout="transposed")
        got = [t.clone() for t in c.run(sm_scale=scale, plan=plan)]
        c.out.fill_(float("nan"))
        c.lse.fill_(float("nan"))
        call_prefill_with_context(
            *c.args(), c.chunks, sm_scale=scale, out=c.out, lse=c.lse, config=cfg, backend=backend
        )
        assert torch.equal(got[0], c.out) and torch.equal(got[1], c.lse), (seed, layout)
    c.run(plan=plan)
    c.check()


def test_a_mismatched_context_plan_raises_before_any_backend_runs(monkeypatch):
    """A context plan made for other sizes, dtype or device: ValueError naming the first field that
    differs; an mla_prefill plan, or anything else: TypeError naming PrefillContextPlan; knobs on
    the call: TypeError. Nothing runs (no pass, no merge) and out/lse keep their poison."""
    from rocm_mla.ops import prefill_context

    c = _context_case(3)
    ran = []
    monkeypatch.setattr(prefill_context, "_run", lambda *a: ran.append("pass"))
    monkeypatch.setattr(prefill_context, "merge_attn_states", lambda *a, **k: ran.append("merge"))

    def call(plan, **kw):
        return lambda: mla_prefill_with_context(
            *c.args(), c.chunks, sm_scale=0.1, out=c.out, lse=c.lse, plan=plan, **kw
        )

    sizes = dict(batch=2, num_heads=2, q_rows=7, k_rows=7, q_dtype=F32, device=DEVICE)
    for field, value, words in (
        ("batch", 3, ["batch=2", "batch=3"]),
        ("q_rows", 8, ["q_rows=7", "q_rows=8"]),
        ("k_rows", 9, ["k_rows=7", "k_rows=9"]),
        ("head_dims", (128, 64, 256), ["head_dims=(128, 64, 128)", "head_dims=(128, 64, 256)"]),
        ("q_dtype", F16, ["q_dtype=torch.float32", "q_dtype=torch.float16"]),
        ("device", "meta", ["device=", "meta"]),
    ):
        other = plan_prefill_with_context(**{**sizes, field: value}, backend="reference")
        assert not other.matches(*c.args())
        words = ("mla_prefill_with_context: plan", "a plan made for this call", *words)
        assert field in raises_naming(ValueError, call(other), *words)
    raises_naming(TypeError, call(plan_prefill(**sizes)), "plan", "PrefillContextPlan", "PrefillPlan")
    raises_naming(TypeError, call("plan"), "plan", "PrefillContextPlan", "str")
    with pytest.raises(TypeError, match="unexpected keyword"):
        call(None, backend="reference")()
    assert not ran and torch.isnan(c.out).all() and torch.isnan(c.lse).all()
    mla_prefill_with_context(
        *c.args(), c.chunks, sm_scale=0.1, out=c.out, lse=c.lse, plan=plan_prefill_with_context(**sizes)
    )
    assert ran == ["pass"] + ["pass", "merge"] * 3  # the right plan runs: the new tokens, then each chunk and its merge
