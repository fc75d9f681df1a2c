"""mla_prefill's kernel with cu_seqlens nobody validated (a GPU call without debug): every row that
a sequence with invalid bounds owns gets NaN out and NaN lse, detected in the kernel (no sync);
sequences with valid bounds keep their result; nothing outside the tensors is written.

The rule (docs/bad-input.md): rows are dealt in order, sequence b owning q rows
[lo(b), lo(b+1)) with lo(b) = max(cu_q[0..b]) clamped to [0, Tq] (its own rows when the offsets are
valid). Its bounds are invalid when cu_q[b+1] < cu_q[b], cu_q[b+1] > Tq, lo(b) != cu_q[b] (a negative
start, or rows overlapping an earlier sequence), cu_k[b] < 0, cu_k[b+1] < cu_k[b] or cu_k[b+1] > Tk.
On the CPU the wrapper validates cu_seqlens, so the launcher is called directly here.
"""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, backends
from prefill_case import case

from rocm_mla.cases.prefill import call_prefill
from rocm_mla.ops.prefill import launch_triton, plan_prefill_for
from rocm_mla.reference import mla_prefill_ref

TQ, TK = 13, 9
CASES = {  # (cu_seqlens_q, cu_seqlens_k), B = 3
    "past_the_end": ([0, 5, 9, 40], [0, 3, 6, 30]),
    "negative_start": ([-7, 4, 9, 13], [-3, 2, 5, 9]),
    "decreasing_q": ([0, 9, 4, 13], [0, 3, 6, 9]),
    "overlapping_q": ([0, 8, 5, 13], [0, 3, 6, 9]),
    "decreasing_k": ([0, 5, 9, 13], [0, 7, 2, 9]),
    "huge": ([0, (1 << 31) - 1, -(1 << 31), 13], [(1 << 31) - 1, 0, -(1 << 31), 9]),
    "valid": ([0, 5, 5, 13], [0, 3, 6, 9]),
    # Tq = 70 (several 16-row blocks): sequence 2 starts inside sequence 0, whose blocks past it
    # must still be its own (the slots follow the running maximum of the starts).
    "overlapping_long": ([0, 50, 10, 70], [0, 3, 6, 9], 70),
}


def owned_rows(cq, ck, tq=TQ):
    """[(lo, hi, bad)] per sequence, by the rule of the module docstring."""
    lo = [min(max(max(cq[: b + 1]), 0), tq) for b in range(len(cq) - 1)]
    res = []
    for b in range(len(cq) - 1):
        hi = min(max(cq[b + 1], lo[b]), tq)
        bad = cq[b + 1] < cq[b] or cq[b + 1] > tq or lo[b] != cq[b]
        bad = bad or ck[b] < 0 or ck[b + 1] < ck[b] or ck[b + 1] > TK
        res.append((lo[b], hi, bad))
    return res


@pytest.mark.skipif("triton" not in backends(), reason="Triton unavailable")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("bad", list(CASES))
def test_invalid_sequences_get_nan_rows(bad, causal):
    cq_l, ck_l, *more = CASES[bad]
    tq = more[0] if more else TQ
    c = case([tq], [TK], 2, torch.float32, seed=4, guard=1200, out_layout="pad_v", lse_layout="transposed_padded")
    g = torch.Generator(device="cpu").manual_seed(1)
    c.out.copy_(torch.randn(c.out.shape, generator=g))  # finite: a row left unwritten fails
    c.lse.copy_(torch.randn(c.lse.shape, generator=g))
    before_out, before_lse = c.out.clone(), c.lse.clone()
    cq, ck = (torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in (cq_l, ck_l))
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    plan = plan_prefill_for(*c.args()[:4], cq, ck, causal=causal, config=cfg, backend="triton")  # reads no offset
    launch_triton(plan, *c.args()[:4], cq, ck, c.out, c.lse, sm_scale=0.1)
    c.check_guards()
    written = torch.zeros(tq, dtype=torch.bool)
    for b, (lo, hi, is_bad) in enumerate(owned_rows(cq_l, ck_l, tq)):
        if hi <= lo:
            continue
        written[lo:hi] = True
        o, lse = c.out[lo:hi], c.lse[:, lo:hi]
        if is_bad:
            assert torch.isnan(o).all() and torch.isnan(lse).all(), f"sequence {b}: rows {lo}..{hi} not NaN"
            continue
        k0, k1 = ck_l[b], ck_l[b + 1]
        one_q = torch.tensor([0, hi - lo], dtype=torch.int32, device=DEVICE)
        one_k = torch.tensor([0, k1 - k0], dtype=torch.int32, device=DEVICE)
        q, kn, kp, v = c.args()[:4]
        ref = mla_prefill_ref(q[lo:hi], kn[k0:k1], kp[k0:k1], v[k0:k1], one_q, one_k, 0.1, causal)
        c.check(o, lse, ref=ref)
    assert torch.equal(c.out[~written], before_out[~written]), "a row no sequence owns was written"
    assert torch.equal(c.lse[:, ~written], before_lse[:, ~written])
    if bad == "valid":
        assert written.sum() == tq


def test_rule_marks_what_the_issue_lists():
    """Decreasing, negative first entry and last past the tensor each leave NaN rows."""
    for name in ("past_the_end", "negative_start", "decreasing_k", "overlapping_q", "huge", "overlapping_long"):
        cq, ck, *more = CASES[name]
        assert any(bad and hi > lo for lo, hi, bad in owned_rows(cq, ck, *more)), name


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [k for k in CASES if k != "valid"])
def test_gpu_bad_offsets_nan_rows_no_sync(bad):
    """Through mla_prefill on a GPU (bf16, the default launch data, TMA where the arch has it)."""
    cq_l, ck_l, *more = CASES[bad]
    tq = more[0] if more else TQ
    c = case([tq], [TK], 16, torch.bfloat16, seed=4, guard=1200, out_layout="pad_v", lse_layout="transposed_padded")
    c.out.normal_()
    c.lse.normal_()
    cq, ck = (torch.tensor(x, dtype=torch.int32, device=DEVICE) for x in (cq_l, ck_l))
    call_prefill(*c.args()[:4], cq, ck, sm_scale=0.1, out=c.out, lse=c.lse, backend="triton")
    torch.cuda.synchronize()
    c.check_guards()
    for lo, hi, is_bad in owned_rows(cq_l, ck_l, tq):
        if is_bad and hi > lo:
            assert torch.isnan(c.out[lo:hi].float()).all() and torch.isnan(c.lse[:, lo:hi]).all()
