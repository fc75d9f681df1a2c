"""ncu driver: one B=128 seq 4096 N=16 decode (bf16 or fp8 cache), config from argv[2] (JSON) or the default."""

import json
import sys

import torch

import rocm_mla
from rocm_mla.ops import mla_decode

cache = sys.argv[1]
cfg = json.loads(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "default" else None
dev = "cuda"
gen = torch.Generator(device=dev).manual_seed(0)
B, S, N, BLOCK = 128, 4096, 16, 64
pages = B * S // BLOCK
qn = torch.randn(B, N, 512, device=dev, generator=gen).bfloat16()
qpe = torch.randn(B, N, 64, device=dev, generator=gen).bfloat16()
kv = torch.randn(pages, BLOCK, 576, device=dev, generator=gen).bfloat16()
kw = dict(sm_scale=576**-0.5, max_seq_len=S)
if cache == "fp8":
    kv = (kv.float() * 4).to(torch.float8_e4m3fn).view(torch.uint8)
    kw.update(kv_cache_dtype="fp8", k_scale=torch.tensor([0.25], device=dev))
table = torch.randperm(pages, device=dev, generator=gen).view(B, S // BLOCK).to(torch.int32)
seq = torch.full((B,), S, device=dev, dtype=torch.int32)
for _ in range(3):
    o, lse = mla_decode(qn, qpe, kv, table, seq, config=cfg, **kw)
torch.cuda.synchronize()
print(rocm_mla.__file__, "ok", float(o.float().abs().mean()))
