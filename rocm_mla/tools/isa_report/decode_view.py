"""The decode tiers side by side across AMD arches: per default stage-1 tier of
``configs/mla_decode.json`` (bf16 q and cache, one split, tiles inside one page), what its KV loop
costs per KV row on each arch, from the compiled ISA (``kv_loop``).

``rocm-mla isa-report --decode-tiers`` prints it (gfx942 and gfx950 by default); the decode
side-by-side with aiter (``peers.decode_side_by_side``) shows the same per-row columns.
"""

from __future__ import annotations

import sys
from typing import Any

from .gate import check, gate_problems
from .output import aligned
from .rows import Row, error_digest
from .triton_rows import triton_row

# Columns the loop figures add to a decode table (headers in order).
LOOP_HEADERS = ["instrs/KV row", "MFMA/KV row", "LDS B/KV row", "round trips/tile", "per 16 rows", "MFMA shapes"]


def loop_cells(row: Row, variant: Any) -> list[str]:
    """The ``LOOP_HEADERS`` cells of a decode row: the main loop's per-wave figures times the
    workgroup's waves, divided by the tile's KV rows (BLOCK_N); the serial global round trips
    (``kv_loop``: waits that drain every outstanding load) per tile and per 16 KV rows are per wave
    (each wave waits for its own loads). ``-`` where the row has no loop figures."""
    loop = row.loop
    bn = int(variant.constexprs.get("BLOCK_N", 0)) if variant is not None else 0
    if not loop or not bn:
        return ["-"] * len(LOOP_HEADERS)
    waves = int(variant.options.get("num_warps", 4))
    shapes = sorted({s.removeprefix("v_mfma_").removeprefix("f32_") for s in loop["mfma_shapes"]})
    return [
        f"{loop['instructions'] * waves / bn:.0f}",
        f"{loop['mfma'] * waves / bn:.1f}",
        f"{loop['lds_bytes'] * waves / bn:.0f}",
        str(loop["drains"]),
        f"{loop['drains'] * 16 / bn:.1f}",
        ",".join(shapes) or "-",
    ]


def default_tier_variants(arch: str, fp8: bool = False) -> list:
    """The stage-1 variants of ``arch``'s default tiers with bf16 q and cache, direct (one split),
    PAGE_MODE 2: one per tier, in tier order; ``fp8``: after each, the tier with bf16 q and the
    platform's fp8 cache (a number k_scale) in each fp8_dots mode ("none", "qk", "all")."""
    from rocm_mla.variants import all_triton_variants

    stage1 = [
        v
        for v in all_triton_variants(arch)
        if v.kernel == "mla_decode_stage1"
        and v.config.endswith("direct")
        and v.constexprs.get("PAGE_MODE", 2) == 2
        and not v.config.startswith("cand ")
        and not v.constexprs.get("SPLIT_TOKENS", 0)
    ]
    out = []
    for v in stage1:
        if not v.config.startswith("q=bf16 kv=bf16"):
            continue
        out.append(v)
        if fp8:
            h = v.constexprs["BLOCK_H"]
            # The tier's fp8 variants: "none" may change the tile (fp8 sub-objects), so they are
            # found by the tier's place, after this bf16 row and before the next tier's.
            out += [w for w in _tier_fp8(stage1, v, h)]
    return out


def _tier_fp8(stage1: list, bf16_row, block_h: int) -> list:
    """The bf16-q fp8-cache direct variants listed between ``bf16_row`` and the next tier's bf16
    row (all_triton_variants lists each tier's dtype combinations together), one per fp8_dots mode."""
    i = stage1.index(bf16_row)
    found, modes = [], set()
    for w in stage1[i + 1 :]:
        if w.config.startswith("q=bf16 kv=bf16"):
            break
        if w.config.startswith("q=bf16 kv=fp8"):
            mode = "all" if w.constexprs.get("FP8_PV") else "qk" if w.constexprs.get("FP8_QK") else "none"
            if mode not in modes:
                modes.add(mode)
                found.append(w)
    return found


def decode_tiers(
    arches: tuple[str, ...] = ("gfx942", "gfx950"), progress: bool = True, fp8: bool = False
) -> tuple[str, list[Row]]:
    """``(table text, gated rows)``: each default decode tier of each arch compiled, with the
    registers, LDS, occupancy and the KV loop per KV row. A tier whose tile waits for global
    memory with nothing in flight more than once per tile at one wave per SIMD is flagged
    ("serial"): no other wave on the SIMD hides those round trips (docs/notes/gfx950.md). ``fp8``:
    each tier's fp8-cache rows too, one per fp8_dots mode (docs/notes/fp8-decode.md)."""
    table = [["arch", "tier", "config", "VGPR", "spills", "LDS", "waves/SIMD", *LOOP_HEADERS, "status"]]
    rows: list[Row] = []
    for arch in arches:
        for v in default_tier_variants(arch, fp8=fp8):
            if progress:
                print(f"[decode tiers] {arch} {v.config} ...", file=sys.stderr, flush=True)
            r = triton_row(v, arch)
            r.problems = check(r)
            rows.append(r)
            status = "error: " + error_digest(r.error) if r.error else ("; ".join(gate_problems(r)) or "ok")
            if r.loop and r.occupancy == 1 and r.loop["drains"] > 1:
                status += f" (serial: {r.loop['drains']} round trips per tile at 1 wave/SIMD)"
            table.append(
                [
                    arch,
                    f"H{v.constexprs['BLOCK_H']}",
                    v.config,
                    *("-" if x is None else str(x) for x in (r.vgprs, r.spills, r.lds, r.occupancy)),
                    *loop_cells(r, v),
                    status,
                ]
            )
    text = "\n".join(
        [
            "decode tiers side by side (bf16 q and cache, one split; per KV row = per wave-iteration x waves"
            " / BLOCK_N)",
            aligned(table, {"arch", "tier", "config", "MFMA shapes", "status"}),
        ]
    )
    return text, rows
