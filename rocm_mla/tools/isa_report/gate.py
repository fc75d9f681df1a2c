"""The gate: why a row fails (scratch, spills, LDS over the arch's limit, fewer programs a CU than
its persistent grid places, missing matrix instructions), what it passes with (sm90 spills whose
traffic stays out of innermost loops), and which rows make the report exit non-zero. A peer's rows
are reported beside ours, never gated."""

from __future__ import annotations

from collections.abc import Iterable

from ...configs import is_amd_arch
from .rows import ARCHS, Row, error_digest


def check(row: Row) -> list[str]:
    """Why ``row`` fails the gate (empty list: it passes). Skipped rows never fail here, nor do a
    peer's rows (what would fail ours is noted on them by :func:`notes`)."""
    if row.peer:
        return []
    return gate_problems(row)


def gate_problems(row: Row) -> list[str]:
    """Why ``row`` would fail the gate, a peer's row included (``check`` drops those)."""
    if row.error:
        return [f"error: {error_digest(row.error)}"]
    if row.skipped:
        return []
    why = []
    if (row.scratch or row.spills) and not _spills_outside_hot_loops(row):  # those are notes(), not failures
        if row.scratch:
            why.append(f"scratch {row.scratch} B" + ("/lane" if is_amd_arch(row.arch) else " stack/thread"))
        if row.spills:
            why.append(f"{row.spills} spilled registers" if is_amd_arch(row.arch) else f"{row.spills} B spilled")
        if row.local_in_loops:
            why.append(f"{row.local_in_loops} local-memory instructions inside innermost loops")
    limit = ARCHS[row.arch].lds_limit
    if row.lds is not None and row.lds > limit:
        why.append(f"LDS {row.lds} B > {limit} B")
    if row.resident and row.programs is not None and row.programs < row.resident:
        unit = "a CU" if is_amd_arch(row.arch) else "an SM"
        why.append(f"{row.programs} programs {unit} at once; its grid places {row.resident}")
    if row.expects_mfma and not row.mfma:
        why.append(
            "expects MFMA but has no matrix instructions" + (" (v_mfma)" if is_amd_arch(row.arch) else " (mma/wgmma)")
        )
    return why


def _spills_outside_hot_loops(row: Row) -> bool:
    """sm90 with its SASS read: the row spills, and none of the spill traffic runs in an innermost
    loop (what runs in an outer loop's own body runs once an outer iteration)."""
    return bool(row.spills or row.scratch) and row.local_in_loops == 0 and not is_amd_arch(row.arch)


def notes(row: Row) -> list[str]:
    """What ``row`` passes the gate with but a reader should know."""
    if row.peer:
        return [f"peer, not gated: {'; '.join(gate_problems(row))}"] if not row.skipped and gate_problems(row) else []
    if not row.error and not row.skipped and _spills_outside_hot_loops(row):
        if row.local_in_outer_loops:
            where = (
                f"{row.local_in_outer_loops} local-memory instructions in outer loops' own bodies"
                " (once an outer iteration), none in an innermost loop"
            )
        else:
            where = "no local-memory access inside a loop"
        return [f"{row.spills} B spilled, {row.scratch} B stack; {where}"]
    return []


def failures(rows: Iterable[Row], strict: bool = False) -> list[tuple[Row, list[str]]]:
    """Rows that make the report exit non-zero, with reasons. ``strict``: skipped rows fail too
    (not a peer's: a missing peer folder is not a missing compiler)."""
    out = []
    for r in rows:
        if r.problems:
            out.append((r, r.problems))
        elif r.skipped and strict and not r.peer:
            out.append((r, [f"skipped ({r.skipped}) and --strict"]))
    return out
