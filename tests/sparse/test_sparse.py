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
        kw = {"kv_cache_dtype": "auto", "k_scale": 0.5}
        args = list(case.args())
        args[2] = case.kv_cache  # typed float8
        rocm_mla.mla_sparse_attention(*args, **case.kwargs(**kw), backend=backend, num_splits=splits)
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
    case = make_case((200, 90, 150), (1, 3, 2), N=16, K=96, block=16, dtype=torch.float16, holes=0.05)
    o, lse = case.run(backend="triton", batch_invariant=True, out=None, lse=None)
    case.check(o, lse)
    plan = case.plan(batch_invariant=True)
    assert plan.num_splits > 1  # the rule splits these lists: the reduce is exercised
    for t in range(case.shape.T):
        oa, la = rocm_mla.mla_sparse_attention(
            case.q_nope[t : t + 1], case.q_pe[t : t + 1], case.kv_cache, case.positions[t : t + 1],
            case.block_table, case.req_ids[t : t + 1], sm_scale=case.sm_scale, batch_invariant=True,
        )  # fmt: skip
        assert torch.equal(oa, o[t : t + 1]) and torch.equal(la, lse[t : t + 1]), t
    # the split count depends on K alone
    assert (
        case.plan(batch_invariant=True).num_splits
        == make_case((200,), 1, N=16, K=96).plan(batch_invariant=True).num_splits
    )


def test_plan_reuse_and_mismatch():
    """A plan made once serves every call of its sizes (as vLLM's layers share one); a plan of other
    sizes or another table kind is a ValueError naming what differs."""
    case = make_case((60, 30), (2, 1), N=8, K=24, dtype=torch.float16)
    plan = case.plan(num_splits=2)
    assert plan.num_splits == 2 and plan.launches == 2
    for _ in range(2):
        case.out.fill_(float("nan"))
        case.run(backend=BACKENDS[0], plan=plan)
        case.check()
    other = make_case((60, 30), (2, 1), N=16, K=24, dtype=torch.float16).plan()
    raises_naming(ValueError, lambda: case.run(backend="triton", plan=other), "plan", "num_heads=8")
    slots = make_case((60, 30), (2, 1), N=8, K=24, dtype=torch.float16, mode="slots").plan()
    raises_naming(ValueError, lambda: case.run(backend="triton", plan=slots), "plan", "paged=True")
    raises_naming(TypeError, lambda: case.run(backend="triton", plan="x"), "plan", "SparsePlan")


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

    case = make_case((60, 30), (2, 1), N=8, K=48, dtype=torch.float16)
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
    raises_naming(ValueError, lambda: f(*a, sm_scale=0.1, num_splits=0), "num_splits")
    raises_naming(ValueError, lambda: f(*a, sm_scale=0.1, num_splits=2, batch_invariant=True), "num_splits")
    raises_naming(TypeError, lambda: f(*a, sm_scale=0.1, batch_invariant=1), "batch_invariant", "a bool")
    raises_naming(ValueError, lambda: f(*a, sm_scale=0.1, kv_cache_dtype="int8"), "kv_cache_dtype")
    raises_naming(ValueError, lambda: f(*a, sm_scale=0.1, config={"BLOCK_H": 12, "BLOCK_N": 16, "num_warps": 4,
                                                                  "num_stages": 1}), "BLOCK_H")  # fmt: skip
    raises_naming(RuntimeError, lambda: f(*a, sm_scale=0.1, backend="hip"), "no HIP kernel")


@pytest.mark.parametrize("bad,exc,words", BAD_SCALES)
def test_scale_validated(bad, exc, words):
    case = make_case((30,), 1, N=2, K=8)
    raises_naming(exc, lambda: rocm_mla.mla_sparse_attention(*case.args(), sm_scale=bad), "sm_scale", *words)
