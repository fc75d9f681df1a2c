"""mla_sparse_attention against its float32 reference (and the reference against a float64 formula):
odd sizes, every layout, fp8 caches, lists with -1 and repeated entries, global slots, splits, batch
invariance, plans, and named errors. CPU: Triton in the interpreter (float32 and float16; bf16 on the
GPU); the GPU-only cases are in test_sparse_gpu.py."""

from __future__ import annotations

import math

import pytest
import torch
from _util import BAD_SCALES, DEVICE, DTYPES, raises_naming
from sparse_case import BACKENDS, make_case

import rocm_mla
from rocm_mla.cases import platform_fp8, sparse
from rocm_mla.cases.decode import DENSE_F64
from rocm_mla.reference import mla_sparse_attention_ref

ODD = sparse.SHAPES["odd"]


def _dense_f64(case) -> tuple[torch.Tensor, torch.Tensor]:
    """The independent formula: per row, the selected rows looked up one by one (block table and
    request, or the slot), then softmax attention in float64 over that multiset."""
    q = torch.cat([case.q_nope, case.q_pe], -1).double().cpu()
    kv = case.kv_cache.double().cpu() * (float(case.k_scale) if case.k_scale is not None else 1.0)
    bs = case.shape.block
    idx = case.topk_indices().cpu().tolist()
    bt, req = case.block_table.cpu(), case.req_ids.cpu()
    T, N = q.shape[:2]
    out = torch.zeros(T, N, 512, dtype=torch.float64)
    lse = torch.full((T, N), -math.inf, dtype=torch.float64)
    for t in range(T):
        rows = []
        for p in idx[t]:
            if p < 0:
                continue
            if case.shape.mode == "paged":
                rows.append(kv[int(bt[int(req[t]), p // bs]), p % bs])
            else:
                rows.append(kv[p // bs, p % bs])
        if not rows:
            continue
        k = torch.stack(rows)
        s = q[t] @ k.T * case.sm_scale
        lse[t] = torch.logsumexp(s, -1)
        out[t] = torch.softmax(s, -1) @ k[:, :512]
    return out, lse


@pytest.mark.parametrize("shape", ODD, ids=lambda s: s.label(torch.float32))
def test_reference_against_float64_formula(shape):
    case = sparse.make_inputs(shape, dtype=torch.float32, device=DEVICE, holes=0.1, dups=0.2, seed=1)
    got = case.reference()
    want = _dense_f64(case)
    case.check(*got, ref=want, tol={"out": DENSE_F64, "lse": DENSE_F64})


def test_reference_nan_reaches_only_selecting_rows():
    """A NaN in one cache row: the rows that select it get NaN out (and lse), the others do not."""
    case = make_case((60, 40), (3, 2), N=4, K=16, block=16, seed=5)
    pos = case.positions.clone()
    t_sel = 1
    p = int(pos[t_sel, 0])
    req = int(case.req_ids[t_sel])
    page = int(case.block_table[req, p // 16])
    case.kv_cache[page, p % 16, 7] = float("nan")
    o, lse = mla_sparse_attention_ref(
        case.q_nope, case.q_pe, case.kv_cache, pos, case.block_table, case.req_ids, case.sm_scale
    )
    hit = ((pos == p) & (case.req_ids[: pos.shape[0], None] == req)).any(1)
    assert bool(hit[t_sel])
    for t in range(pos.shape[0]):
        assert bool(torch.isnan(o[t]).all()) == bool(hit[t]), t
        assert bool(torch.isnan(o[t]).any()) == bool(hit[t]), t


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ODD, ids=lambda s: s.label(torch.float32))
def test_odd_sizes(shape, dtype, backend):
    """N 1/8/24/128, blocks 1/4/16/64, K 1..200, MTP and prefill rows, slots, an empty batch; -1
    and repeated entries among the lists; the plan's split count and a forced one."""
    case = sparse.make_inputs(
        shape, dtype=dtype, device=DEVICE, holes=0.1, dups=0.1, q_layout="one_buffer", out_layout="padded", seed=2
    )
    for splits in (None, 3) if backend == "triton" else (None,):
        case.out.fill_(float("nan"))
        case.lse.fill_(float("nan"))
        case.run(backend=backend, num_splits=splits)
        case.check()


@pytest.mark.parametrize("q_layout", sparse.Q_LAYOUTS)
@pytest.mark.parametrize("out_layout,lse_layout", [("contiguous", "transposed"), ("token_pad", "contiguous")])
def test_layouts(q_layout, out_layout, lse_layout):
    """q as vLLM hands it over (bmm output seen transposed, a slice of q), slices of one buffer, or
    apart; out padded per head or per token, lse a [N, T] buffer's transpose; nothing outside the
    views written."""
    from rocm_mla.cases import outside_untouched

    case = make_case((40, 70), (2, 1), N=16, K=32, dtype=torch.float16, q_layout=q_layout,
                     out_layout=out_layout, lse_layout=lse_layout, holes=0.1)  # fmt: skip
    case.run(backend=BACKENDS[0])
    case.check()
    assert outside_untouched(case.out_base, case.out) and outside_untouched(case.lse_base, case.lse)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=str)
def test_fp8_cache(kind, backend):
    """An fp8 cache of either e4m3 kind (as uint8 storage, "fp8_e4m3fn"/"fp8_e4m3fnuz", or typed),
    k_scale a number or a device tensor, against the reference of the dequantised values. The
    kernel runs the platform's kind (e4m3fnuz is gfx942's: compiled there by the ISA report; neither
    NVIDIA's Triton nor the interpreter converts it)."""
    if backend == "triton" and kind != platform_fp8(DEVICE):
        pytest.skip(f"Triton converts {kind} on the arch whose kind it is only")
    name = "fp8_e4m3fn" if kind == torch.float8_e4m3fn else "fp8_e4m3fnuz"
    for splits in (None, 2):
        case = make_case((50, 33), (2, 1), N=8, K=40, kv="fp8", dtype=torch.float16, fp8=kind, k_scale=0.5, holes=0.1)
        want = case.reference()
        case.run(backend=backend, num_splits=splits, kv_cache_dtype=name)
        case.check(ref=want)
        case.out.fill_(float("nan"))
        args = list(case.args())
        args[2] = case.kv_cache  # typed float8
        sparse.call_sparse(*args, sm_scale=case.sm_scale, out=case.out, lse=case.lse, k_scale=0.5,
                           kv_cache_dtype="auto", backend=backend, num_splits=splits)  # fmt: skip
        case.check(ref=want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_lists_and_rows_without_tokens(backend):
    """K = 0, and rows whose lists are all -1: out 0 and lse -inf; the request of such a row is never
    read (it may be anything)."""
    case = make_case((30, 20), (1, 2), N=4, K=8)
    case.positions[1] = -1
    case.req_ids[1] = 1 << 20
    case.run(backend=backend)
    case.check()
    assert bool((case.out[1] == 0).all()) and bool((case.lse[1] == -math.inf).all())
    case0 = make_case((30, 20), (1, 2), N=4, K=0)
    case0.run(backend=backend)
    assert bool((case0.out == 0).all()) and bool((case0.lse == -math.inf).all())


def test_batch_invariant_row_alone_equals_row_in_batch():
    """batch_invariant=True: each row alone (a batch of one) gives the bits it gives in the batch,
    whatever the batch's size (decode, MTP and prefill rows of several requests)."""
    if "triton" not in BACKENDS:
        pytest.skip("Triton unavailable")
    # K past every arch's split_tokens (256 on the GPUs): the rule cuts the lists into several splits
    case = make_case((200, 90, 150), (1, 3, 2), N=16, K=320, block=16, dtype=torch.float16, holes=0.05)
    o, lse = case.run(backend="triton", batch_invariant=True, out=None, lse=None)
    case.check(o, lse)
    plan = case.plan(batch_invariant=True)
    assert plan.num_splits > 1  # the rule splits these lists: the reduce is exercised
    for t in range(case.shape.T):
        oa, la = sparse.call_sparse(
            case.q_nope[t : t + 1], case.q_pe[t : t + 1], case.kv_cache, case.positions[t : t + 1],
            case.block_table, case.req_ids[t : t + 1], sm_scale=case.sm_scale, batch_invariant=True,
        )  # fmt: skip
        assert torch.equal(oa, o[t : t + 1]) and torch.equal(la, lse[t : t + 1]), t
    # the split count depends on K alone
    assert (
        case.plan(batch_invariant=True).num_splits
        == make_case((200,), 1, N=16, K=320).plan(batch_invariant=True).num_splits
    )


def test_plan_reuse_and_mismatch():
    """A plan made once serves every call of its sizes (as vLLM's layers share one); a plan of other
    sizes or another table kind is a ValueError naming what differs."""
    case = make_case((60, 30), (2, 1), N=8, K=64, dtype=torch.float16)  # two tiles of 32 (sm90) or more
    plan = case.plan(num_splits=2, backend=BACKENDS[0])
    assert plan.num_splits == 2 and plan.launches == 2 and plan.backend == BACKENDS[0]
    for _ in range(2):
        case.out.fill_(float("nan"))
        case.run(plan=plan)
        case.check()
    other = make_case((60, 30), (2, 1), N=16, K=64, dtype=torch.float16).plan(backend=BACKENDS[0])
    raises_naming(ValueError, lambda: case.run(plan=other), "plan", "num_heads=8")
    slots = make_case((60, 30), (2, 1), N=8, K=64, dtype=torch.float16, mode="slots").plan(backend=BACKENDS[0])
    raises_naming(ValueError, lambda: case.run(plan=slots), "plan", "paged=True")
    raises_naming(TypeError, lambda: case.run(plan="x"), "plan", "SparsePlan")


@pytest.mark.parametrize("backend", BACKENDS)
def test_plan_of_other_sizes_refused_by_every_backend(backend):
    """The plan is checked before any backend runs: the reference backend refuses a plan made for
    other sizes with the very error Triton gives, and writes nothing."""
    case = make_case((60, 30), (2, 1), N=8, K=24, dtype=torch.float16)
    msgs = []
    for b in BACKENDS:
        other = make_case((60, 30), (2, 1), N=16, K=24, dtype=torch.float16).plan(backend=b)
        assert other.backend == b
        msgs.append(raises_naming(ValueError, lambda: case.run(plan=other), "plan", "num_heads=8", "num_heads=16"))
        assert bool(torch.isnan(case.out).all()) and bool(torch.isnan(case.lse).all())
    assert len(set(msgs)) == 1, msgs
    fewer = make_case((60, 30), (1, 1), N=8, K=24, dtype=torch.float16).plan(backend=backend)
    raises_naming(ValueError, lambda: case.run(plan=fewer), "plan", "num_rows=3", "num_rows=2")
    wider = make_case((60, 30), (2, 1), N=8, K=32, dtype=torch.float16).plan(backend=backend)
    raises_naming(ValueError, lambda: case.run(plan=wider), "plan", "topk=24", "topk=32")


def test_plan_matches():
    """``SparsePlan.matches``: True for the tensors the plan was made for, False (never raising) for
    another dtype, size, block size, table kind, device, cache storage or kind of k_scale."""
    from rocm_mla.ops import plan_sparse_attention_for

    case = make_case((60, 30), (2, 1), N=8, K=24, dtype=torch.float16)
    a = case.args()
    plan = plan_sparse_attention_for(*a)
    assert plan.matches(*a) and plan.matches(*a, k_scale=0.5) and plan.matches(*a, k_scale=torch.ones(1))
    assert plan.kv_dtype == plan.kv_kind == torch.float16 and plan.kv_cache_dtype == "auto"
    assert not plan.matches(a[0].float(), a[1].float(), *a[2:])  # q dtype
    assert not plan.matches(a[0][:2], a[1][:2], a[2], a[3][:2], *a[4:])  # T
    assert not plan.matches(*a[:3], a[3][:, :16], *a[4:])  # K
    assert not plan.matches(*a[:2], a[2][:, :8], *a[3:])  # block size
    assert not plan.matches(*a[:2], a[2].float(), *a[3:])  # cache dtype
    assert not plan.matches(*a[:4], None, None)  # table kind
    assert not plan.matches(a[0].to("meta"), *a[1:])  # device
    assert not plan.matches("q", *a[1:]) and not plan.matches(*a[:4], a[4], "r")  # not tensors
    fp8 = make_case((60, 30), (2, 1), N=8, K=24, kv="fp8", dtype=torch.float16, k_scale=0.5)
    f = fp8.args()  # uint8 storage, k_scale a device tensor
    on_dev = plan_sparse_attention_for(*f, k_scale=fp8.k_scale, kv_cache_dtype="fp8")
    assert on_dev.k_scale_on_device and on_dev.kv_dtype == torch.uint8 and on_dev.kv_kind == platform_fp8(DEVICE)
    assert on_dev.matches(*f, k_scale=fp8.k_scale)
    assert not on_dev.matches(*f, k_scale=0.5) and not on_dev.matches(*f)  # a number / None for a device scale
    as_float = plan_sparse_attention_for(*f, k_scale=0.5, kv_cache_dtype="fp8")
    assert as_float.matches(*f, k_scale=0.5) and as_float.matches(*f) and not as_float.matches(*f, k_scale=fp8.k_scale)
    assert not as_float.matches(*f[:2], fp8.kv_cache, *f[3:], k_scale=0.5)  # the float8 view: another storage
    raises_naming(ValueError, lambda: fp8.run(plan=on_dev, k_scale=0.5), "plan", "k_scale_on_device=False")


@pytest.mark.parametrize("backend", BACKENDS)
def test_uint8_storage_through_the_plan(backend):
    """uint8 storage with kv_cache_dtype "fp8" (the plan names the kind) gives the bits of the float8
    view with "auto"; a uint8 cache without a plan, or with "auto", is refused naming what to pass."""
    from rocm_mla.ops import plan_sparse_attention_for

    case = make_case((50, 33), (2, 1), N=8, K=40, kv="fp8", dtype=torch.float16, k_scale=0.5, holes=0.1)
    stored = case.args()
    typed = (*stored[:2], case.kv_cache, *stored[3:])
    assert stored[2].dtype == torch.uint8 and case.kv_cache.dtype == platform_fp8(DEVICE)
    for splits in (None, 2) if backend == "triton" else (None,):
        results = []
        for args, name in ((stored, "fp8"), (typed, "auto")):
            plan = plan_sparse_attention_for(
                *args, k_scale=case.k_scale, kv_cache_dtype=name, backend=backend, num_splits=splits
            )
            assert plan.kv_kind == case.kv_cache.dtype and plan.kv_fp8
            results.append(rocm_mla.mla_sparse_attention(*args, **case.kwargs(out=None, lse=None, plan=plan)))
        case.check(*results[0])
        assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    raises_naming(
        ValueError, lambda: rocm_mla.mla_sparse_attention(*stored, sm_scale=0.1), "plan", "kv_cache_dtype='fp8'"
    )
    raises_naming(ValueError, lambda: plan_sparse_attention_for(*stored), "kv_cache_dtype", "uint8")


def test_plan_knobs_take_effect():
    """Every knob lives in the plan and the call does what it says: the split count, batch invariance,
    the backend and debug; the plan of the tensors equals the plan of the sizes, and the bits do too."""
    from rocm_mla.ops import plan_sparse_attention_for

    case = make_case((200, 90, 150), (1, 3, 2), N=16, K=96, block=16, dtype=torch.float16, holes=0.05)
    a = case.args()
    for b in BACKENDS:
        assert plan_sparse_attention_for(*a, backend=b).backend == b
    three = plan_sparse_attention_for(*a, num_splits=3, backend=BACKENDS[0])
    assert three == case.plan(num_splits=3, backend=BACKENDS[0])
    assert three.num_splits == 3 and three.launches == 2 and not three.batch_invariant
    inv = plan_sparse_attention_for(*a, batch_invariant=True, backend=BACKENDS[0])
    assert inv.batch_invariant and inv.num_splits == 1 + (96 - 1) // inv.split_len
    for plan in (three, inv):
        o1, l1 = case.run(plan=plan, out=None, lse=None)
        case.check(o1, l1)
        o2, l2 = case.run(plan=case.plan(num_splits=plan.num_splits if not plan.batch_invariant else None,
                                         batch_invariant=plan.batch_invariant, backend=BACKENDS[0]),
                          out=None, lse=None)  # fmt: skip
        assert torch.equal(o1, o2) and torch.equal(l1, l2)
    case.positions[1, 0] = 1 << 20
    debug = case.plan(debug=True, backend=BACKENDS[0])
    assert debug.debug and not case.plan(debug=False).debug
    raises_naming(ValueError, lambda: case.run(plan=debug), "topk_indices[1, 0]")
    o, _ = case.run(plan=case.plan(debug=False, backend=BACKENDS[0]), out=None, lse=None)
    assert bool(torch.isnan(o[1]).all()) and not bool(torch.isnan(o[0]).any())  # no check: the row is NaN


def test_plan_arguments_named():
    """plan_sparse_attention's own errors name the argument, what was expected and what came."""
    from rocm_mla.ops import plan_sparse_attention

    kw = dict(num_rows=2, num_heads=8, topk=16, block_size=16, q_dtype=torch.float16, kv_dtype=torch.float16,
              device=DEVICE)  # fmt: skip
    p = plan_sparse_attention
    raises_naming(ValueError, lambda: p(**{**kw, "num_rows": -1}), "num_rows", "an int >= 0", "-1")
    raises_naming(ValueError, lambda: p(**{**kw, "block_size": 0}), "block_size", "an int >= 1")
    raises_naming(TypeError, lambda: p(**{**kw, "q_dtype": torch.int32}), "q_dtype", "int32")
    raises_naming(TypeError, lambda: p(**kw, paged=1), "paged", "a bool")
    raises_naming(ValueError, lambda: p(**kw, workspace_numel=-4), "workspace_numel", "-4")
    raises_naming(TypeError, lambda: p(**kw, config=[16]), "config", "list")
    raises_naming(ValueError, lambda: p(**{**kw, "kv_dtype": torch.uint8}), "kv_cache_dtype", "uint8")
    raises_naming(TypeError, lambda: p(**kw, kv_cache_dtype="float32"), "kv_cache", "float32")
    bad = {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "D_SPLIT": 3}
    raises_naming(ValueError, lambda: p(**kw, config=bad), "mla_sparse_attention: config: expected D_SPLIT 1 or 2")
    assert p(**{**kw, "kv_dtype": torch.uint8}, kv_cache_dtype="fp8").kv_kind == platform_fp8(DEVICE)


def test_plan_split_rule():
    """The default plan fills the GPU from rows x head blocks: one split for many rows, several for
    one row; batch-invariant mode cuts lists of K entries the same way whatever the rows."""
    from rocm_mla.ops import plan_sparse_attention

    kw = dict(topk=2048, block_size=64, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, device=torch.device("cpu"))
    one = plan_sparse_attention(num_rows=1, num_heads=16, **kw)
    many = plan_sparse_attention(num_rows=512, num_heads=16, **kw)
    assert one.num_splits > 1 and many.num_splits == 1
    assert one.split_len % one.config["BLOCK_N"] == 0 and one.num_splits * one.split_len >= 2048
    inv = [plan_sparse_attention(num_rows=r, num_heads=16, batch_invariant=True, **kw) for r in (1, 7, 512)]
    assert len({(p.num_splits, p.split_len) for p in inv}) == 1
    wide = plan_sparse_attention(num_rows=4, num_heads=128, **kw)
    assert wide.head_blocks * wide.config["BLOCK_H"] >= 128
    raises_naming(ValueError, lambda: plan_sparse_attention(num_rows=1, num_heads=16, num_splits=0, **kw), "num_splits")
    raises_naming(
        ValueError,
        lambda: plan_sparse_attention(num_rows=1, num_heads=16, num_splits=2, batch_invariant=True, **kw),
        "num_splits",
        "batch_invariant",
    )


def test_workspace():
    """A caller's workspace holds the partials (no allocation); too small is a ValueError naming
    the size."""
    from rocm_mla.ops import mla_decode_workspace_numel

    case = make_case((60, 30), (2, 1), N=8, K=96, dtype=torch.float16)  # three tiles of 32 (sm90) or more
    need = case.plan(num_splits=3).workspace_numel
    assert need == mla_decode_workspace_numel(3, 8, 3)
    ws = torch.empty(need, device=DEVICE)
    case.run(backend=BACKENDS[0], num_splits=3, workspace=ws)
    case.check()
    if "triton" in BACKENDS:
        raises_naming(
            ValueError, lambda: case.run(backend="triton", num_splits=3, workspace=ws[:-1]), "workspace", f">= {need}"
        )


def test_errors_name_the_argument():
    case = make_case((30, 20), (1, 1), N=4, K=8)
    a = case.args()
    kw = dict(sm_scale=0.1)
    f = rocm_mla.mla_sparse_attention
    g = sparse.call_sparse  # the plan's knobs beside the call: planned from the tensors
    raises_naming(ValueError, lambda: f(a[0][..., :256], *a[1:], **kw), "q_nope", "512")
    raises_naming(ValueError, lambda: f(a[0], a[1][:1], *a[2:], **kw), "q_pe", "[T, N, 64]")
    raises_naming(TypeError, lambda: f(a[0], a[1].half(), *a[2:], **kw), "q_pe", "float32")
    raises_naming(ValueError, lambda: f(*a[:2], a[2][..., :512], *a[3:], **kw), "kv_cache", "576")
    raises_naming(TypeError, lambda: f(*a[:2], a[2].half(), *a[3:], **kw), "kv_cache", "float32")
    raises_naming(TypeError, lambda: f(*a[:3], a[3].long(), *a[4:], **kw), "topk_indices", "int32")
    raises_naming(ValueError, lambda: f(*a[:3], a[3][:1], *a[4:], **kw), "topk_indices", "q_nope's T")
    raises_naming(ValueError, lambda: f(*a[:3], a[3].t().contiguous().t(), *a[4:], **kw), "topk_indices", "stride")
    raises_naming(ValueError, lambda: f(*a[:4], None, a[5], **kw), "block_table", "req_id_per_token")
    raises_naming(ValueError, lambda: f(*a[:5], None, **kw), "req_id_per_token")
    raises_naming(ValueError, lambda: f(*a[:5], a[5][:1], **kw), "req_id_per_token", "at least")
    raises_naming(TypeError, lambda: f(*a[:4], a[4].long(), a[5], **kw), "block_table", "int32")
    raises_naming(ValueError, lambda: f(*a, sm_scale=0.1, out=torch.empty(2, 4, 256)), "out", "[T, N, 512]")
    raises_naming(TypeError, lambda: f(*a, sm_scale=0.1, lse=torch.empty(2, 4, dtype=torch.float16)), "lse", "float32")
    raises_naming(ValueError, lambda: g(*a, sm_scale=0.1, num_splits=0), "num_splits")
    raises_naming(ValueError, lambda: g(*a, sm_scale=0.1, num_splits=2, batch_invariant=True), "num_splits")
    raises_naming(TypeError, lambda: g(*a, sm_scale=0.1, batch_invariant=1), "batch_invariant", "a bool")
    raises_naming(ValueError, lambda: g(*a, sm_scale=0.1, kv_cache_dtype="int8"), "kv_cache_dtype")
    raises_naming(ValueError, lambda: g(*a, sm_scale=0.1, config={"BLOCK_H": 12, "BLOCK_N": 16, "num_warps": 4,
                                                                  "num_stages": 1}), "BLOCK_H")  # fmt: skip
    raises_naming(RuntimeError, lambda: g(*a, sm_scale=0.1, backend="hip"), "no HIP kernel")


@pytest.mark.parametrize("bad,exc,words", BAD_SCALES)
def test_scale_validated(bad, exc, words):
    case = make_case((30,), 1, N=2, K=8)
    raises_naming(exc, lambda: rocm_mla.mla_sparse_attention(*case.args(), sm_scale=bad), "sm_scale", *words)
