"""perf/RESULTS.md's headline table: generated from perf/results.csv and the rows chosen in perf/readme_rows.json.

``python perf/report.py`` writes it at the top of perf/RESULTS.md (:func:`render`: the table and its
sources, each run's date, device, versions, commit, ceilings and perf/bench.py command); the README
links to it and carries no number itself. The spec (perf/readme_rows.json) is data: per row its
label, the kernel, shape and bench, the unit shown, our provider and its extras, our other modes
shown beside it, and the peers with the ratios to print. Every number comes from the CSV, per
provider the latest run that measured the shape (:func:`resultsfile.current_rows`, as in the rest of
perf/RESULTS.md); a row whose numbers are not in the CSV is left out with a warning.
tests/tools/test_readme_table.py checks that perf/RESULTS.md holds this module's output and that the
README carries no date or timing (:func:`findings`).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import resultsfile  # noqa: E402

SPEC_PATH = HERE / "readme_rows.json"
README_PATH = HERE.parent / "README.md"
HEADING = "## Headline rows"

# unit shown -> (the CSV metric, the factor from the metric to the unit)
UNITS = {"µs": ("time_us", 1.0), "ms": ("time_us", 1e-3), "GB/s": ("GB/s", 1.0), "TFLOP/s": ("TFLOP/s", 1.0)}
HIGHER_IS_BETTER = ("GB/s", "TFLOP/s")
# extra -> how one value is written beside the headline (pct_copy: the share of the copy ceiling)
EXTRAS = {
    "pct_copy": lambda v: f"{v:.0f}% of copy",
    "TFLOP/s": lambda v: f"{resultsfile.fmt(v)} TFLOP/s",
    "kernels": lambda v: f"{v:g} kernels",
    "copy_fill_kernels": lambda v: f"{v:g} copy/fill",
}

# What may not stand in README.md: a date, or a number next to a time or rate unit (the lab-note
# pattern of .ci/lint.sh). The numbers live in perf/RESULTS.md with their runs.
DATE = re.compile(r"\b[0-9]{4}-[0-9]{2}-[0-9]{2}\b")
TIMING = re.compile(r"(?<![\w.])[0-9][0-9.,]* ?(us|µs|μs|ms|ns|GB/s|TB/s|TFLOP/s)(?!\w)")


class Missing(LookupError):
    """A number the spec asks for that the CSV does not hold."""


def load_spec(path: str | os.PathLike = SPEC_PATH) -> dict:
    """The spec of the headline rows (perf/readme_rows.json): its device and rows."""
    return json.loads(Path(path).read_text())


def _pick(rs: list[dict], provider: str, metric: str, what: str) -> dict:
    """The row of ``provider``'s ``metric`` among one shape's current rows (a run's later row wins)."""
    found = [r for r in rs if r["provider"] == provider and r["metric"] == metric]
    if not found:
        raise Missing(f"no {provider} {metric} for {what}")
    return found[-1]


def _ceiling(rows: list[dict], bench: str, date: str, metric: str) -> float:
    shape = resultsfile.CEILING_OF[metric]
    found = [r for r in rows if r["kernel"] == "ceiling" and r["config"] == bench and r["date"] == date]
    found = [r for r in found if r["shape"] == shape]
    if not found:
        raise Missing(f"no {shape} ceiling of the {bench} run {date}")
    return float(found[-1]["value"])


def _cell(rows, rs, row, who: dict, what: str) -> tuple[str, float, dict]:
    """One provider's cell text, its headline value (in the metric's own unit) and its CSV row."""
    metric, factor = UNITS[row["unit"]]
    r = _pick(rs, who["provider"], metric, what)
    value = float(r["value"])
    extras = []
    for extra in who.get("extras", ()):
        if extra == "pct_copy" and metric == "GB/s":  # as perf/RESULTS.md: against the run's own ceiling
            v = 100 * value / _ceiling(rows, row["bench"], r["date"], metric)
        else:
            v = float(_pick(rs, who["provider"], extra, what)["value"])
        extras.append(EXTRAS[extra](v))
    label = f"{who['label']} " if who.get("label") else ""
    text = f"{label}{resultsfile.fmt(value * factor)} {row['unit']}" + (f" ({', '.join(extras)})" if extras else "")
    return text, value, r


def table_row(rows: list[dict], cur: dict, row: dict, runs: dict) -> str:
    """The Markdown line of one spec row; ``runs`` ((date, bench) -> CSV row) gains the runs it uses."""
    what = f"{row['kernel']} {row['shape']!r}"
    rs = cur.get(row["kernel"], {}).get(row["shape"])
    if not rs:
        raise Missing(f"no rows for {what}")
    ours, best, r_ours = _cell(rows, rs, row, row["ours"], what)
    used = [r_ours]
    beside = []
    for v in row.get("variants", ()):
        text, _, r = _cell(rows, rs, row, v, what)
        beside.append(text)
        used.append(r)
    if beside:
        ours += "; " + ", ".join(beside)
    peers, ratios = [], []
    higher = UNITS[row["unit"]][0] in HIGHER_IS_BETTER
    for p in row["peers"]:
        text, value, r = _cell(rows, rs, row, p, what)
        peers.append(text)
        used.append(r)
        if p.get("ratio"):
            ratio = best / value if higher else value / best
            ratios.append(f"{ratio:.2f}×" + (f" {p['label']}" if len(row["peers"]) > 1 else ""))
    numbers = []
    for r in used:
        key = (r["date"], row["bench"])
        runs.setdefault(key, r)
        numbers.append(str(list(runs).index(key) + 1))
    cells = [row["label"], ours, "; ".join(peers), ", ".join(ratios) or "–", ", ".join(dict.fromkeys(numbers))]
    return "| " + " | ".join(cells) + " |"


def source_line(rows: list[dict], n: int, key: tuple[str, str], r: dict) -> str:
    """The sources line of run ``n`` ((date, bench) ``key``, ``r`` one of its rows): date, device,
    versions, commit, the perf/bench.py command and the ceilings that run measured."""
    date, bench = key
    ceilings = [c for c in rows if c["kernel"] == "ceiling" and c["config"] == bench and c["date"] == date]
    ceil = ", ".join(f"{c['shape']} {resultsfile.fmt(float(c['value']))} {c['metric']}" for c in ceilings)
    commit = f", commit {r['commit']}" if r["commit"] else ""
    command = resultsfile.COMMAND.format(ops=bench)
    return (
        f"- run {n}, {date}: {r['device']}, {r['versions']}{commit}, `{command}`; "
        f"ceilings of the same run: {ceil or 'none recorded'}"
    )


INTRO = (
    "The rows [`readme_rows.json`](readme_rows.json) chooses, each number from the latest run of its provider"
    " that measured the shape; the runs column names the sources under the table. The peers, the shapes and"
    " what bounds each row: [docs/performance.md](../docs/performance.md#the-headline-rows)."
)


def render(rows: list[dict], spec: dict) -> tuple[str, list[str]]:
    """The headline section of perf/RESULTS.md ("" when no spec row is in ``rows``) and a warning per
    spec row left out."""
    device = [r for r in rows if r["device"] == spec["device"]]
    cur = {k: resultsfile.current_rows(device, k) for k in dict.fromkeys(row["kernel"] for row in spec["rows"])}
    lines, warnings, runs = [], [], {}
    for row in spec["rows"]:
        try:
            lines.append(table_row(device, cur, row, runs))  # raises before it adds a run
        except Missing as e:
            warnings.append(f"headline row {row['label']!r} left out: {e} on {spec['device']} in the results file")
    if not lines:
        return "", warnings
    head = "| op, shape | rocm_mla | peers | speed-up of rocm_mla (> 1: faster) | runs |"
    sources = [source_line(device, n, key, r) for n, (key, r) in enumerate(runs.items(), 1)]
    block = [
        f"{HEADING} ({spec['device']})",
        "",
        INTRO,
        "",
        head,
        "| --- | --- | --- | --- | --- |",
        *lines,
        "",
        "Sources: the runs of `results.csv` named in the runs column:",
        "",
        *sources,
    ]
    return "\n".join(block) + "\n", warnings


def findings(text: str) -> list[str]:
    """Lines of ``text`` (the README) that carry a date or a number next to a time or rate unit."""
    return [line for line in text.splitlines() if DATE.search(line) or TIMING.search(line)]
