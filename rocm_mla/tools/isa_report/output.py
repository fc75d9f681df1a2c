"""What the report prints and writes: the aligned table (one line per row, the columns per arch),
the few summary lines ``rocm-mla doctor`` shows, and the rows as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...configs import is_amd_arch
from .rows import Row, error_digest, label


def _columns(arch: str) -> list[tuple[str, Any]]:
    def num(attr):
        return lambda r: "-" if getattr(r, attr) is None else str(getattr(r, attr))

    def status(r: Row) -> str:
        if r.error:
            return "error: " + error_digest(r.error)
        if r.skipped:
            return "skipped: " + r.skipped
        if r.problems:
            return "FAIL: " + "; ".join(r.problems)
        if r.peer:
            return "; ".join(r.notes) or "peer, not gated: clean"
        return "ok" + (f" ({'; '.join(r.notes)})" if r.notes else "")

    cols: list[tuple[str, Any]] = [
        ("kernel", lambda r: r.kernel),
        ("config", lambda r: r.config),
        ("backend", lambda r: r.backend),
    ]
    if is_amd_arch(arch):
        cols += [
            ("VGPR", num("vgprs")),
            ("AGPR", num("agprs")),
            ("SGPR", num("sgprs")),
            ("spills", num("spills")),
            ("scratch", num("scratch")),
            ("LDS", num("lds")),
            ("waves/SIMD", num("occupancy")),
            ("MFMA", num("mfma")),
        ]
    else:
        cols += [
            ("regs", num("vgprs")),
            ("spill B", num("spills")),
            ("stack", num("scratch")),
            ("smem", num("lds")),
            ("blk/SM", num("occupancy")),
            ("MMA", num("mfma")),
        ]
    mm = "MFMA" if is_amd_arch(arch) else "MMA"
    cols += [("expects", lambda r: mm if r.expects_mfma else "-"), ("status", status)]
    return cols


def aligned(cells: list[list[str]], left: set[str]) -> str:
    """Plain-text table of ``cells`` (first row the headers): columns named in ``left`` are
    left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    heads = cells[0]
    return "\n".join(
        "  ".join(
            c[i].ljust(widths[i]) if heads[i] in left else c[i].rjust(widths[i]) for i in range(len(heads))
        ).rstrip()
        for c in cells
    )


def format_table(rows: list[Row], arch: str) -> str:
    """Aligned plain-text table, one line per row (text columns left, numbers right)."""
    cols = _columns(arch)
    cells = [[h for h, _ in cols]] + [[f(r) for _, f in cols] for r in rows]
    return aligned(cells, {"kernel", "config", "backend", "expects", "status"})


def summary(rows: list[Row]) -> str:
    """A few lines for ``rocm-mla doctor``: counts, failures, and the worst figures."""
    if not rows:
        return "isa-report: no kernels"
    arch = rows[0].arch
    peer_rows = [r for r in rows if r.peer]
    rows = [r for r in rows if not r.peer]
    built = [r for r in rows if not (r.error or r.skipped)]
    by_backend = {b: sum(1 for r in rows if r.backend == b) for b in ("triton", "hip")}
    failed = [r for r in rows if r.problems]
    lines = [
        f"isa-report {arch}: {len(rows)} kernel configs ({by_backend['triton']} triton, "
        f"{by_backend['hip']} hip); {len(built)} compiled, {len(failed)} failing, "
        f"{sum(1 for r in rows if r.error)} errors, {sum(1 for r in rows if r.skipped)} skipped"
    ]
    for r in peer_rows:
        figs = (
            "skipped: " + r.skipped
            if r.skipped
            else "error: " + error_digest(r.error)
            if r.error
            else f"{r.vgprs} VGPRs, {r.spills} spills, {r.scratch} B scratch, LDS {r.lds}, occupancy {r.occupancy}"
        )
        lines.append(f"  peer {label(r)}: {figs}")

    def worst(attr: str, pick=max) -> str:
        vals = [r for r in built if getattr(r, attr) is not None]
        if not vals:
            return "-"
        r = pick(vals, key=lambda x: getattr(x, attr))
        return f"{getattr(r, attr)} ({label(r)})"

    reg = "VGPRs" if is_amd_arch(arch) else "registers"
    occ = "waves/SIMD" if is_amd_arch(arch) else "blocks/SM"
    lines.append(f"  max {reg}: {worst('vgprs')}; max LDS bytes: {worst('lds')}")
    lines.append(f"  min occupancy ({occ}): {worst('occupancy', min)}")
    lines.append(
        f"  with matrix instructions: {sum(1 for r in built if r.mfma)} "
        f"(expected in {sum(1 for r in rows if r.expects_mfma)})"
    )
    noted = [r for r in rows if r.notes and not r.problems]
    if noted:
        lines.append(f"  passing with a note: {len(noted)} (e.g. {label(noted[0])}: {noted[0].notes[0]})")
    for r in failed[:5]:
        lines.append(f"  FAIL {label(r)}: {'; '.join(r.problems)}")
    if len(failed) > 5:
        lines.append(f"  ... and {len(failed) - 5} more")
    return "\n".join(lines)


def write_json(rows: list[Row], path: str | Path) -> None:
    """``rows`` as a JSON list of their fields plus ``status``, one object per row."""
    Path(path).write_text(json.dumps([dict(asdict(r), status=r.status) for r in rows], indent=1) + "\n")
