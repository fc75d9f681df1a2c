"""Time bf16 N=16 B=128 seq 4096 decode at several stage-1 configs with the rocm_mla on PYTHONPATH; JSON out."""

import json
import sys

import torch

import rocm_mla
from rocm_mla.ops import mla_decode
from rocm_mla.tools.benchutil import rotating_graph_us

CFGS = json.loads(open(sys.argv[1]).read())
dev = "cuda"
gen = torch.Generator(device=dev).manual_seed(0)
B, S, N, BLOCK = 128, 4096, 16, 64
pages = B * S // BLOCK
sets = []
for _ in range(2):
    qn = torch.randn(B, N, 512, device=dev, generator=gen).bfloat16()
    qpe = torch.randn(B, N, 64, device=dev, generator=gen).bfloat16()
    kv = torch.randn(pages, BLOCK, 576, device=dev, generator=gen).bfloat16()
    table = torch.randperm(pages, device=dev, generator=gen).view(B, S // BLOCK).to(torch.int32)
    seq = torch.full((B,), S, device=dev, dtype=torch.int32)
    o = torch.empty(B, N, 512, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(B, N, device=dev)
    sets.append((qn, qpe, kv, table, seq, o, lse))
kw = dict(sm_scale=576**-0.5, max_seq_len=S)
ro, rl = mla_decode(*sets[0][:5], backend="reference", **kw)
res = {"_pkg": rocm_mla.__file__}
for name, cfg in CFGS.items():
    qn, qpe, kv, t, s, o, lse = sets[0]
    mla_decode(qn, qpe, kv, t, s, out=o, lse=lse, config=cfg, **kw)
    err = ((o.float() - ro).norm() / ro.norm()).item()
    assert err < 1e-2, (name, err)

    def call(i, cfg=cfg):
        a, b, c, d, e, f, g = sets[i]
        mla_decode(a, b, c, d, e, out=f, lse=g, config=cfg, **kw)

    res[name] = rotating_graph_us(call, 2)
print(json.dumps(res))
