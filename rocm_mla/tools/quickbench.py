"""A one-shape GPU benchmark for ``rocm-mla doctor``: merge_attn_states at T=8192, N=128, D=128,
bf16, pad_v-strided (rocm_mla.cases.merge's inputs), every backend checked against float32 then
timed, as GB/s and % of the copy bandwidth measured here. The full benchmarks live in perf/."""

from __future__ import annotations

import torch

from ..cases import merge

SHAPE = merge.MergeShape(8192, 128, 128, "strided")


def run(device: torch.device) -> None:
    from rocm_mla.ops import merge_attn_states
    from rocm_mla.ops._dispatch import BACKENDS, unavailable
    from rocm_mla.tools.timing import copy_bandwidth_gbs, time_ms

    print(f"quick benchmark (merge_attn_states, bf16, {SHAPE.label.replace('strided', 'pad_v strided')})")
    copy = copy_bandwidth_gbs(device, 1 << 30)
    print(f"  copy ceiling: {copy:.0f} GB/s")
    case = merge.make_inputs(SHAPE, dtype=torch.bfloat16, device=device)
    ref = case.reference()
    args = case.args()
    nbytes = SHAPE.nbytes(torch.bfloat16)
    for b in BACKENDS:
        if b == "reference" or unavailable(b, device):
            continue
        case.output.fill_(float("nan"))
        case.output_lse.fill_(float("nan"))
        merge_attn_states(*args, backend=b)
        problem = case.mismatch(ref=ref)
        ms = time_ms(lambda b=b: merge_attn_states(*args, backend=b))
        gbs = nbytes / ms / 1e6
        print(
            f"  {b:<8} {ms * 1e3:8.1f} us  {gbs:7.0f} GB/s  {100 * gbs / copy:5.1f}% of copy"
            + (f"  WRONG ({problem})" if problem else "")
        )
