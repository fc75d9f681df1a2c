"""Probe (session 6, H200, PYTHONPATH=<repo>): the rotated stage-1 loop (PIPE_QK: q.k^T of tile i+1
before the softmax and p.v of tile i) against the same tiles without it, bf16, block 64, seq 4096,
every output checked against the float32 reference of the same inputs.

Kept as it ran, only lint-formatted since. It ran with the PIPE_QK kernel variant in the working tree
(never committed); PIPE_QK was removed after this measurement (perf/RESULTS.md, mla_decode, sixth
session), so the PIPE rows no longer run as written.
"""

import torch

import rocm_mla
from rocm_mla.tools.benchutil import rotating_graph_us

dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
S, BLK = 4096, 64
H64 = {"BLOCK_H": 64, "D_SPLIT": 1, "num_warps": 8, "num_stages": 2}
H32 = {"BLOCK_H": 32, "D_SPLIT": 1, "num_warps": 8, "num_stages": 3}
CFGS = {
    64: [
        ("H64 N64 w8 s2 (default)", {**H64, "BLOCK_N": 64}),
        ("H64 N32 w8 s2", {**H64, "BLOCK_N": 32}),
        ("H64 N32 w8 s2 PIPE", {**H64, "BLOCK_N": 32, "PIPE_QK": True}),
    ],
    32: [
        ("H32 N64 w8 s3 (default)", {**H32, "BLOCK_N": 64}),
        ("H32 N64 w8 s3 PIPE", {**H32, "BLOCK_N": 64, "PIPE_QK": True}),
        ("H32 N32 w8 s3 PIPE", {**H32, "BLOCK_N": 32, "PIPE_QK": True}),
    ],
}
for B, N, q_len, tier in ((128, 128, 1, 64), (64, 16, 4, 64), (128, 16, 2, 32)):
    pages = B * S // BLK
    sets = []
    for _ in range(2):
        qn = torch.randn(B * q_len, N, 512, device=dev, generator=g).to(torch.bfloat16)
        qp = torch.randn(B * q_len, N, 64, device=dev, generator=g).to(torch.bfloat16)
        kv = torch.randn(pages, BLK, 576, device=dev, generator=g).to(torch.bfloat16)
        bt = torch.randperm(pages, device=dev, generator=g).view(B, S // BLK).int()
        sl = torch.full((B,), S, device=dev, dtype=torch.int32)
        sets.append((qn, qp, kv, bt, sl))
    kw = dict(sm_scale=192**-0.5, max_seq_len=S)
    qn, qp, kv, bt, sl = sets[0]
    ro, rl = rocm_mla.mla_decode(qn.float(), qp.float(), kv.float(), bt, sl, backend="reference", **kw)
    flops = 2 * B * q_len * N * S * (576 + 512)
    for name, cfg in CFGS[tier]:
        try:
            o, lse = rocm_mla.mla_decode(qn, qp, kv, bt, sl, config=cfg, **kw)
            rel = ((o.float() - ro).norm() / ro.norm()).item()
            dl = (lse - rl).abs().max().item()

            def call(i, cfg=cfg):
                a, b_, c, d, e = sets[i]
                rocm_mla.mla_decode(a, b_, c, d, e, config=cfg, **kw)

            us = rotating_graph_us(call, 2)
            tf = flops / us / 1e6
            print(f"B={B} N={N} q{q_len} {name:26s} {us:8.1f} us {tf:6.0f} TFLOP/s  rel err {rel:.4f} lse {dl:.4f}")
        except Exception as e:
            print(f"B={B} N={N} q{q_len} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
