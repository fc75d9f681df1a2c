#!/usr/bin/env python3
"""Compile a grid of mla_prefill launch configs ahead of time (no GPU) and rank them by register
headroom: the gfx942 (or sm90) figures ``rocm-mla isa-report`` prints, for configs that are not
(yet) in configs/mla_prefill.json.

    python perf/isa_sweep_prefill.py [--arch gfx942] [--grid small|full] [--causal-only] [--json out.json]
    python perf/isa_sweep_prefill.py --config '{"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, ...}'

gfx942 register file: 512 registers per lane per SIMD (VGPRs + AGPRs, one unified file), shared by the
waves resident on the SIMD: 2 waves/SIMD -> 256 each, 1 -> 512. A 4-wave workgroup puts one wave
on each SIMD; two such workgroups per CU (LDS permitting) give 2 waves/SIMD. "headroom" below is
registers left under the limit of the occupancy the row reaches; a row at 254-256 has none (one
more live value spills). Rows that spill or use scratch are marked FAIL, as in the report.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # the compiler needs real @triton.jit functions

import torch

from rocm_mla.configs import is_amd_arch
from rocm_mla.tools.isa_report import collect
from rocm_mla.variants.prefill import config_label, triton_variant

GRIDS = {
    # rows per wave = BLOCK_M / num_warps: 32 keeps the LDS traffic per MFMA FLOP at half of 16's
    "small": dict(
        BLOCK_M=[64, 128, 256],
        BLOCK_N=[16, 32, 64],
        num_warps=[4, 8],
        num_stages=[1, 2],
        waves_per_eu=[2],
        matrix_instr_nonkdim=[16, 32],
        kpack=[1],
        schedule_hint=["none"],
    ),
    # 32 rows per wave, the masked loop unpipelined, the AMD backend's knobs
    "rows32": dict(
        BLOCK_M=[128, 256],
        BLOCK_N=[16, 32, 64],
        num_warps=[4, 8],
        num_stages=[1, 2],
        diag_stages=[1],
        waves_per_eu=[2],
        matrix_instr_nonkdim=[16, 32],
        kpack=[1, 2],
        schedule_hint=["none", "attention"],
    ),
    "full": dict(
        BLOCK_M=[64, 128, 256],
        BLOCK_N=[16, 32, 64],
        num_warps=[4, 8],
        num_stages=[1, 2],
        waves_per_eu=[0, 1, 2],
        matrix_instr_nonkdim=[16, 32],
        kpack=[1, 2],
        schedule_hint=["none", "attention"],
    ),
}


def grid_configs(grid: dict, arch: str) -> list[dict]:
    keys = list(grid)
    out = []
    for vals in itertools.product(*(grid[k] for k in keys)):
        cfg = dict(zip(keys, vals))
        rows_per_wave = cfg["BLOCK_M"] // cfg["num_warps"]
        if rows_per_wave not in (16, 32) or (grid is GRIDS["rows32"] and rows_per_wave != 32):
            continue  # fewer starves the MFMAs, more cannot hold acc + q
        if cfg.get("diag_stages", 0) > cfg["num_stages"]:
            continue
        if cfg["matrix_instr_nonkdim"] == 32 and rows_per_wave < 32:
            continue
        if not is_amd_arch(arch):
            cfg = {k: v for k, v in cfg.items() if k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
        if cfg.get("schedule_hint") == "none":
            cfg.pop("schedule_hint")
        if cfg not in out:
            out.append(cfg)
    return out


def register_limit(occupancy: int | None) -> int:
    """gfx942 registers per lane (VGPR + AGPR) a wave may hold at ``occupancy`` waves/SIMD."""
    if not occupancy:
        return 512
    return min(512, 512 // occupancy // 8 * 8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="gfx942", choices=["gfx942", "sm90"])
    ap.add_argument("--grid", default="small", choices=sorted(GRIDS))
    ap.add_argument("--config", type=json.loads, action="append", help="compile only these (repeatable)")
    ap.add_argument("--causal-only", action="store_true", help="skip the non-causal specialisation")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    cfgs = args.config or grid_configs(GRIDS[args.grid], args.arch)
    variants = [
        triton_variant(args.arch, dtype, cfg, causal)
        for cfg in cfgs
        for causal in ((True,) if args.causal_only else (True, False))
    ]
    rows = collect(args.arch, triton_variants=variants, hip_sources=[], peers=False, progress=True)
    table = []
    for cfg, r in zip([c for c in cfgs for _ in ((True,) if args.causal_only else (True, False))], rows):
        limit = register_limit(r.occupancy) if args.arch == "gfx942" else 255
        headroom = None if r.vgprs is None or r.problems else limit - r.vgprs
        table.append((r, cfg, headroom))
    ok = [t for t in table if not t[0].problems]
    ok.sort(key=lambda t: (-(t[0].occupancy or 0), -(t[2] or -999)))
    bad = [t for t in table if t[0].problems]
    reg = "VGPR" if args.arch == "gfx942" else "regs"
    occ = "waves/SIMD" if args.arch == "gfx942" else "blk/SM"
    print(
        f"\n{'config':58s} {reg:>5s} {'AGPR':>5s} {'spill':>5s} {'scr':>4s} {'LDS':>6s} {occ:>10s} "
        f"{'MFMA':>5s} {'headroom':>8s}  status"
    )
    for r, _cfg, head in ok + bad:
        status = "FAIL: " + "; ".join(r.problems) if r.problems else "ok"
        print(
            f"{r.config:58s} {r.vgprs if r.vgprs is not None else '-':>5} {r.agprs if r.agprs is not None else '-':>5} "
            f"{r.spills if r.spills is not None else '-':>5} {r.scratch if r.scratch is not None else '-':>4} "
            f"{r.lds if r.lds is not None else '-':>6} {r.occupancy if r.occupancy is not None else '-':>10} "
            f"{r.mfma if r.mfma is not None else '-':>5} {head if head is not None else '-':>8}  {status[:120]}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [
                    dict(
                        config=cfg,
                        label=config_label(cfg),
                        row=r.config,
                        vgprs=r.vgprs,
                        agprs=r.agprs,
                        spills=r.spills,
                        scratch=r.scratch,
                        lds=r.lds,
                        occupancy=r.occupancy,
                        mfma=r.mfma,
                        headroom=head,
                        problems=r.problems,
                        error=r.error[:500],
                    )
                    for r, cfg, head in table
                ],
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
