"""The tuner's output: the overlay a run writes (``OverlayWriter``, ``write_json``, where it goes:
``target_path``), the default-vs-tuned table, and ``describe_overlay`` (what the active overlay
changes; ``rocm-mla doctor`` and ``tune --show`` print it)."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocm_mla import configs as C

from ..files import write_text_atomic
from .shapes import OP_KEYS


def _obj_diff(base: Any, new: Any) -> Any:
    """What an overlay must hold to turn ``base`` into ``new``: changed fields of objects, whole
    values otherwise (None when equal)."""
    if isinstance(base, dict) and isinstance(new, dict):
        out = {}
        for k, v in new.items():
            if k not in base:
                out[k] = v
            elif base[k] != v:
                out[k] = _obj_diff(base[k], v)
        return out or None
    return None if base == new else new


class OverlayWriter:
    """The Tuner's output: the overlay of what it accepted (only the fields that differ from the
    package), with the ``_meta`` of the run, stamped and written atomically."""

    def overlay(self) -> dict:
        data: dict[str, Any] = {}
        for op_key, obj in self.current.items():
            entry = _obj_diff(self.package[op_key], obj)
            if entry:
                data[op_key] = {self.arch: entry}
        v = C.software_versions()
        meta = {
            "schema": C.OVERLAY_SCHEMA_VERSION,
            "arch": self.arch,
            "cus": self.cus,
            "device": self.device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": v,
            "command": "rocm-mla tune " + " ".join(self.argv),
            "mode": "quick" if self.quick else "full",
            "complete": not self.stopped and all(g.status != "pending" for g in self.groups),
            "stopped": self.stopped,
            "seconds": round(time.monotonic() - self.t0, 1),
            "groups": [
                {
                    "op": g.op_key,
                    "name": g.name,
                    "shapes": [s.key for s in g.shapes],
                    "candidates_timed": len(g.results),
                    "status": g.status,
                    "winner": g.label(g.winner) if g.winner else None,
                }
                for g in self.groups
            ],
            "shapes": {
                k: {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in r.items()}
                for k, r in self.rows.items()
            },
        }
        if self.dev.type != "cuda":
            meta["note"] = "CPU interpreter run: times are meaningless"
        data["_meta"] = meta
        return C.stamp_overlay(data, by="rocm-mla tune")

    def write(self) -> dict:
        data = self.overlay()
        keep = self.kept_entries()
        for op_key, entry in keep.items():
            data.setdefault(op_key, entry)
        if keep:
            data = C.stamp_overlay(data, by="rocm-mla tune")
        write_json(self.out_path, data)
        return data

    def kept_entries(self) -> dict:
        """Entries of ops this run did not tune, kept from a valid overlay already at out_path."""
        if not hasattr(self, "_kept"):
            self._kept = {}
            tuned = {OP_KEYS[o] for o in self.ops}
            if self.out_path.is_file():
                try:
                    old = C.read_overlay(self.out_path)
                    if not C.validate_overlay(old, self.arch, self.cus):
                        self._kept = {k: v for k, v in old.items() if k in C.SCHEMAS and k not in tuned}
                        for k, r in (old.get("_meta", {}).get("shapes") or {}).items():
                            if r.get("op") in self._kept:
                                self.rows.setdefault(k, r)
                except C.OverlayError:
                    pass
        return self._kept


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (a reader never sees half)."""
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def print_result_table(rows: dict[str, dict], log: Callable[[str], None] = print, title: str = "") -> None:
    """default vs tuned per shape (times in us), the tuned config last."""
    order = list(OP_KEYS.values())
    body = []
    for r in sorted(rows.values(), key=lambda r: (order.index(r["op"]) if r["op"] in order else 9, r["shape"])):
        d, t = r["default_us"], r["tuned_us"]
        body.append(
            [r["shape"], f"{d:.1f}", f"{t:.1f}", f"{d / t:.3f}x" if t else "-", r.get("note", ""), r.get("config", "-")]
        )
    if title:
        log(title)
    head = ["shape", "default us", "tuned us", "speed-up", "note", "tuned config"]
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]

    def fmt(cells):
        return "  ".join(
            str(c).rjust(w) if 0 < i < 4 else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    log(fmt(head))
    log(fmt(["-" * w for w in widths]))
    for row in body:
        log(fmt(row))


def target_path(args, arch: str, cus: int | None) -> Path | None:
    """Where a run writes: ``--out`` (a folder gets the arch file name), else the config dir's file
    (None when overlays are off)."""
    if args.out:
        p = Path(args.out).expanduser()
        return p / C.overlay_filename(arch, cus) if p.is_dir() else p
    d = C.overlay_dir()
    if d is None:
        return None
    return d if d.suffix == ".json" else d / C.overlay_filename(arch, cus)


def describe_overlay(st: C.OverlayStatus) -> list[str]:
    """Lines for ``rocm-mla doctor`` and ``tune --show``: which overlay is active, what it changes."""
    d = C.overlay_dir()
    if d is None:
        return ["config overlay: off (ROCM_MLA_CONFIG_DIR is empty)"]
    if st.path is None:
        return [f"config overlay: none for {st.arch} ({st.cus or '-'} CUs) in {d} (rocm-mla tune writes one)"]
    if st.error is not None:
        return [f"config overlay: {st.path} IGNORED: {st.error.name}: {st.error}"]
    meta = st.data.get("_meta", {})
    lines = [
        f"config overlay: {st.path} ACTIVE (tuned {meta.get('date', '?')} on {meta.get('device', '?')}, "
        f"{meta.get('mode', '?')} mode{'' if meta.get('complete', True) else ', stopped early'})"
    ]
    changes = []
    for op_key, entry in st.data.items():
        if op_key in C.SCHEMAS:
            changes += C.overlay_changes(op_key, C.package_config(op_key, st.arch), entry[st.arch])
    lines += [f"  {c}" for c in changes] or ["  changes nothing (the package's configs were fastest)"]
    return lines
