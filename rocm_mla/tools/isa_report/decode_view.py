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


def decode_tiers(
    arches: tuple[str, ...] = ("gfx942", "gfx950"), progress: bool = True, fp8: bool = False
) -> tuple[str, list[Row]]:
    """``(table text, gated rows)``: each default decode tier of each arch compiled, with the
    registers, LDS, occupancy and the KV loop per KV row. A tier whose tile waits for global
    memory with nothing in flight more than once per tile at one wave per SIMD is flagged
    ("serial"): no other wave on the SIMD hides those round trips (docs/notes/gfx950.md). ``fp8``:
    each tier's fp8-cache rows too, one per fp8_dots mode (docs/notes/fp8-decode.md)."""
    # Imported here: the kernels must be imported after cli drops TRITON_INTERPRET.
    from rocm_mla.variants.decode import default_tier_variants

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
