"""Probe (session 5, run on the H200 with PYTHONPATH=<repo>): FP8_QK (q quantised to e4m3 per row, q.k^T on fp8 operands) against the default fp8 path.

Kept as it ran, at commit f7a224d, when config= could carry FP8_QK. Since then mla_decode rejects an
FP8_QK entry in config= and mla_decode(quantize_q=True) reaches the same configs (the 'fp8+qk' tier
overrides), so this script no longer runs as written.
"""

import torch

import rocm_mla
from rocm_mla.configs import config_for
from rocm_mla.ops.decode import stage1_config
from rocm_mla.tools.benchutil import rotating_graph_us

dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
B, S, BLK = 128, 4096, 64
fp8 = torch.float8_e4m3fn
for N, q_len in ((16, 1), (128, 1), (128, 2)):
    pages = B * S // BLK
    sets = []
    for _ in range(2):
        qn = torch.randn(B * q_len, N, 512, device=dev, generator=g).to(torch.bfloat16)
        qp = torch.randn(B * q_len, N, 64, device=dev, generator=g).to(torch.bfloat16)
        kv = (torch.randn(pages, BLK, 576, device=dev, generator=g) * 4).to(fp8)
        bt = torch.randperm(pages, device=dev, generator=g).view(B, S // BLK).int()
        sl = torch.full((B,), S, device=dev, dtype=torch.int32)
        sets.append((qn, qp, kv, bt, sl))
    ks = torch.tensor([0.25], device=dev)
    kw = dict(sm_scale=192**-0.5, k_scale=ks, max_seq_len=S)
    qn, qp, kv, bt, sl = sets[0]
    ro, rl = rocm_mla.mla_decode(qn.float(), qp.float(), kv, bt, sl, backend="reference", **kw)
    tiers = config_for("mla_decode", "sm90")["stage1"]
    m = N * q_len
    tier = next((t for t in tiers if t["BLOCK_H"] >= m), tiers[-1])
    base = stage1_config("sm90", m, torch.bfloat16, True, tier)
    qk = {**base, "FP8_QK": True, "D_SPLIT": 1, "V_SPLIT": 1}
    if base["BLOCK_H"] > 64:  # the fp8 64-row tier is H128 V_SPLIT: take the bf16 64-row tile instead
        qk = {**stage1_config("sm90", m, torch.bfloat16, False, tier), "FP8_QK": True, "F16_DOT": True}
    for name, cfg in (("default", base), ("fp8qk", qk)):
        try:
            o, lse = rocm_mla.mla_decode(qn, qp, kv, bt, sl, config=cfg, **kw)
            rel = ((o.float() - ro).norm() / ro.norm()).item()
            mx = (o.float() - ro).abs().max().item()
            dl = (lse - rl).abs().max().item()

            def call(i, cfg=cfg):
                a, b_, c, d, e = sets[i]
                rocm_mla.mla_decode(a, b_, c, d, e, config=cfg, **kw)

            us = rotating_graph_us(call, 2)
            print(
                f"N={N} q{q_len} {name:15s} {us:8.1f} us  rel err {rel:.4f} max abs {mx:.4f} lse {dl:.4f}"
                f"  cfg H{cfg['BLOCK_H']} N{cfg['BLOCK_N']}",
                flush=True,
            )
        except Exception as e:
            print(f"N={N} q{q_len} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
