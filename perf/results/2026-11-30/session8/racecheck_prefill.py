"""A prefill call small enough for compute-sanitizer racecheck (the GPU tests' serving sizes did not
finish in 300 s): the arch's default config (sm90: host TMA descriptors, head groups), bf16, causal,
two sequences with ragged ends (lq 200 / 70, lk 200 / 130), N=2, checked against the float32 reference.

    compute-sanitizer --tool racecheck python3 perf/results/2026-11-30/session8/racecheck_prefill.py
"""

import torch

import rocm_mla
from rocm_mla.reference import mla_prefill_ref

dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: the interpreter, to check the script
g = torch.Generator(device=dev).manual_seed(0)
lq, lk, N = [200, 70], [200, 130], 2


def rnd(*s):
    return torch.randn(*s, device=dev, generator=g).to(torch.bfloat16)


def cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=dev, dtype=torch.int32)


q, kv, lat = rnd(sum(lq), N, 192), rnd(sum(lk), N, 256), rnd(sum(lk), 576)
kn, v, kpe = kv[..., :128], kv[..., 128:], lat[:, 512:].unsqueeze(1)
out, lse = rocm_mla.mla_prefill(q, kn, kpe, v, cu(lq), cu(lk), sm_scale=0.07, causal=True)
ref, ref_lse = mla_prefill_ref(q, kn, kpe, v, cu(lq), cu(lk), 0.07, True)
err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
print(f"max rel err {err:.2e}; NaN in out: {bool(out.isnan().any())}")
assert err < 2e-2 and not out.isnan().any()
