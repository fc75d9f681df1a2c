"""A one-shape GPU benchmark for ``rocm-mla doctor``: merge_attn_states at T=8192, N=128, D=128,
bf16, pad_v-strided, every backend, as GB/s and % of the copy bandwidth measured here.
The full benchmarks live in perf/."""

from __future__ import annotations

import torch


def run(device: torch.device) -> None:
    from rocm_mla.ops import merge_attn_states
    from rocm_mla.ops._dispatch import BACKENDS, unavailable
    from rocm_mla.tools.benchutil import copy_bandwidth_gbs, time_ms

    print("quick benchmark (merge_attn_states, bf16, T=8192 N=128 D=128, pad_v strided)")
    copy = copy_bandwidth_gbs(device, 1 << 30)
    print(f"  copy ceiling: {copy:.0f} GB/s")
    T, N, D = 8192, 128, 128
    mk = lambda: torch.randn(T, N, 192, device=device, dtype=torch.bfloat16)[..., :D]  # noqa: E731
    po, so, out = mk(), mk(), mk()
    pl, sl, ol = (torch.randn(N, T, device=device) for _ in range(3))
    nbytes = 3 * T * N * D * 2 + 3 * N * T * 4
    for b in BACKENDS:
        if b == "reference" or unavailable(b, device):
            continue
        ms = time_ms(lambda: merge_attn_states(out, po, pl, so, sl, ol, backend=b))
        gbs = nbytes / ms / 1e6
        print(f"  {b:<8} {ms * 1e3:8.1f} us  {gbs:7.0f} GB/s  {100 * gbs / copy:5.1f}% of copy")
