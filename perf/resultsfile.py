"""perf/results.csv: the one results file of the op benchmarks, in long format.

One row per measured value: ``kernel, provider, shape, metric, value, device, versions, commit,
config, date``. ``versions`` holds torch/triton and the peers' versions of the run ("torch=2.11.0+cu130
triton=3.6.0 vllm=0.33.0"), ``commit`` the package's git commit ("" when not recorded), ``config`` the
launch config of our kernel for that shape ("" for peers); ``date`` is when the bench process started
(ISO 8601, UTC; a day alone where only the day is known). The ceilings a bench measured in its own
process (device-to-device copy GB/s, bf16 matmul TFLOP/s) are rows of kernel ``ceiling``, whose
``config`` names that bench. perf/bench.py appends to the file, perf/report.py reads it.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

COLUMNS = ("kernel", "provider", "shape", "metric", "value", "device", "versions", "commit", "config", "date")
DEFAULT_PATH = Path(__file__).resolve().parent / "results.csv"


def read(path: str | os.PathLike = DEFAULT_PATH) -> list[dict[str, str]]:
    """Every row of the results file, as dicts keyed by :data:`COLUMNS` (value kept as text)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: expected the columns {', '.join(COLUMNS)}, got {reader.fieldnames}")
        return list(reader)


def append(path: str | os.PathLike, rows: list[dict[str, object]]) -> None:
    """Append ``rows`` (dicts with every column of :data:`COLUMNS`) to ``path``, writing the header
    first when the file is new."""
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        # "\n" as the file's own rows end (csv's default "\r\n" would mix the two)
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        if new:
            w.writeheader()
        for r in rows:
            missing = [c for c in COLUMNS if c not in r]
            if missing:
                raise ValueError(f"append: row {r} lacks {', '.join(missing)}")
            w.writerow({c: r[c] for c in COLUMNS})


# How a row's ceiling and command are named, shared by perf/report.py and perf/readme_table.py.
CEILING_OF = {"GB/s": "copy 2 GiB", "TFLOP/s": "matmul 8192^3 bf16"}
COMMAND = "python perf/bench.py --ops {ops}"


def current_rows(rows: list[dict], kernel: str) -> dict[str, list[dict]]:
    """The rows of ``kernel`` by shape (in the order the shapes first appear in the file), each
    provider's from the latest run (largest date) that measured it at that shape."""
    by_shape: dict[str, list[dict]] = {}
    for r in rows:
        if r["kernel"] == kernel:
            by_shape.setdefault(r["shape"], []).append(r)
    out = {}
    for shape, rs in by_shape.items():
        latest: dict[str, str] = {}
        for r in rs:
            latest[r["provider"]] = max(latest.get(r["provider"], ""), r["date"])
        out[shape] = [r for r in rs if r["date"] == latest[r["provider"]]]
    return out


def fmt(v: float) -> str:
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"
