#!/usr/bin/env python3
"""Generate perf/RESULTS.md and perf/plots/*.png from perf/results.csv.

    python perf/report.py [--csv perf/results.csv] [--out perf/RESULTS.md] [--plots perf/plots] [--no-plots]
                          [--device SUBSTRING]

Rows of different devices are never put in one table or ranked against each other: an op measured
on several devices gets one table per device. ``--device`` keeps only the rows whose device name
contains SUBSTRING (case-insensitive), e.g. ``--device MI300X``.

The page opens with the headline rows that perf/readme_rows.json chooses (perf/readme_table.py), the
table the README links to. Then per op: the current numbers (for each shape and provider, the row of
the latest run that measured it) with the peers beside ours and the speed-up of our best
implementation over each peer, the ceilings that run measured in its own process, the numbered runs
(device, versions, commit, date) that each row names, and the perf/bench.py command that measures
them again. Older runs drop out of the page as newer ones measure the same shapes; every row stays in
the CSV. Needs no GPU. The page is a function of the CSV and the spec alone:
tests/tools/test_bench_report.py checks that the committed page equals this script's output.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import readme_table  # noqa: E402
import resultsfile  # noqa: E402
from resultsfile import CEILING_OF, COMMAND, current_rows, fmt  # noqa: E402


@dataclass(frozen=True)
class OpView:
    """How one kernel's rows become a table: its headline metric, whether larger is better, the
    perf/bench.py benches that measure it, and metrics shown joined beside the headline. ``providers``
    gives a view of its own to the providers one bench alone measures (its shapes and columns apart
    from the kernel's other table, ``name`` the plot's); the kernel's view without ``providers``
    shows every other provider. ``configs`` False leaves our config columns to results.csv. ``pivot`` maps a
    shape to its (row, column) in a grid that holds only the speed-up over the peer measured at that
    shape: many shapes in a short table (their times stay in results.csv and the plot). ``share`` names a
    percentage metric (pct_copy: % of the copy ceiling) shown in parentheses beside each provider's
    headline value, from the same run's row; ``implied`` parts of the shape labels (" topk=2048") that the
    note states, left out of the table's shape cells (the CSV and the plot keep the whole label)."""

    kernel: str
    title: str
    metric: str
    higher_is_better: bool
    benches: tuple[str, ...]
    note: str = ""
    counts: tuple[str, ...] = field(default_factory=tuple)
    providers: tuple[str, ...] = ()
    name: str = ""
    pivot: Callable[[str], tuple[str, str]] | None = None
    configs: bool = True  # our config columns on the page (False: results.csv alone keeps them)
    share: str = ""  # a percentage metric of the same run shown beside each headline value, e.g. pct_copy
    implied: tuple[str, ...] = ()  # parts of the shape labels the note states, left out of the shape cells

    def shows(self, row: dict) -> bool:
        """Whether ``row`` (of this view's kernel) belongs in this view's table."""
        if self.providers:
            return row["provider"] in self.providers
        return row["provider"] not in _OWN_VIEW.get(self.kernel, ())


def _v4_cell(shape: str) -> tuple[str, str]:
    """``"fp8 csa512 B=8 ctx=32768 H=64"`` -> ("csa512 H=64", "B=8"); a prefill chunk's ``T=8192``
    -> its column "prefill"."""
    m = re.match(r"\S+ (\S+) B=(\d+) \S+ (H=\d+)(?: T=(\d+))?$", shape)
    if not m:
        return shape, ""
    return f"{m[1]} {m[3]}", "prefill" if m[4] else f"B={m[2]}"


VIEWS = (
    OpView(
        "merge_attn_states",
        "merge_attn_states",
        "GB/s",
        True,
        ("merge",),
        "bf16; bytes = prefix + suffix read + output written + 3 lse; % of the copy ceiling of the same run.",
    ),
    OpView(
        "fused_rope_mla_kv_write",
        "fused_rope_mla_kv_write",
        "GB/s",
        True,
        ("rope_kv_write",),
        "GPT-J RoPE, block-64 cache; unfused-torch = vLLM 0.33's torch RoPE + cat + index_copy_ cache write.",
    ),
    OpView(
        "mla_decode",
        "mla_decode",
        "time_us",
        False,
        ("decode", "decode_matrix"),
        "µs per call, q bf16, block 64, CUDA graphs of 8 calls, KV cold in L2; every output checked; configs: "
        "results.csv.",
        configs=False,
    ),
    OpView(
        "mla_decode",
        "mla_decode, batch-invariant mode",
        "time_us",
        False,
        ("decode_invariant",),
        "µs per call, as mla_decode above; default = the split count vLLM's call gets, invariant ="
        " batch_invariant=True (config: its split rule), vllm-0.33-triton-1split = TRITON_MLA with one KV split"
        " (its batch-invariant mode).",
        providers=("rocm_mla-default", "rocm_mla-invariant", "vllm-0.33-triton-1split"),
        name="mla_decode_batch_invariant",
    ),
    OpView(
        "mla_prefill",
        "mla_prefill",
        "TFLOP/s",
        True,
        ("prefill", "prefill_geometry"),
        "causal bf16, Dqk 192 / Dv 128, CUDA graphs; % of the bf16 matmul ceiling of the same run.",
    ),
    OpView(
        "mla_prefill_with_context",
        "mla_prefill_with_context",
        "time_us",
        False,
        ("prefill",),
        "µs per call; upstream = the vLLM-shaped composition with vLLM 0.33's Triton merge.",
    ),
    OpView(
        "layer_step",
        "One MLA layer step",
        "time_us",
        False,
        ("layer",),
        "µs per step (events, L2 flushed); kernels = device kernels named cat/pad/copy/fill (torch.profiler).",
        ("cat_kernels", "pad_kernels", "copy_kernels", "fill_kernels"),
    ),
    OpView(
        "mla_sparse_attention",
        "mla_sparse_attention (sparse MLA: DeepSeek-V3.2, GLM-5.x)",
        "time_us",
        False,
        ("sparse",),
        "µs per call, K 2048, q bf16, block 64, CUDA graphs of 8 calls, cache cold in L2; every output checked; "
        "-inv = batch_invariant=True; configs: results.csv.",
        configs=False,
    ),
    OpView(
        "mla_indexer_topk",
        "mla_indexer_topk (the lightning indexer's top-k: DeepSeek-V3.2, GLM-5.x)",
        "time_us",
        False,
        ("indexer",),
        "µs (% of copy: 132 B a key a row); H 64 and topk 2048 unless named (c4: V4's CSA top-k over ctx compressed "
        "keys); q fp8, block 64, CUDA graphs, cold L2, outputs checked; vLLM = its logits + torch.topk.",
        configs=False,
        share="pct_copy",
        implied=(" topk=2048", " H=64"),
    ),
    OpView(
        "sparse_layer_attention",
        "a sparse MLA layer's attention path (indexer top-k + sparse attention: DeepSeek-V3.2, GLM-5.x)",
        "time_us",
        False,
        ("sparse_layer",),
        "µs per step, N 16, topk 2048, bf16 latent cache, block 64; outputs checked; vLLM = its ROCm Triton "
        "composition (logits, top-k, slots, q concat, sparse attention); kernels per step.",
        ("kernels", "copy_fill_kernels"),
    ),
    OpView(
        "mla_v4_attention",
        "mla_v4_attention (DeepSeek-V4 attention)",
        "time_us",
        False,
        ("v4_attention",),
        "Speed-up over vLLM 0.34's V4 ROCm kernels (decode: `rocm_sparse_attn_decode`; prefill, 8192 rows over "
        "32K: its composition without aiter); outputs checked; µs, % of copy: results.csv.",
        pivot=_v4_cell,
    ),
    OpView(
        "v4_layer_step",
        "a DeepSeek-V4 layer's attention path (CSA indexer + attention, in vLLM 0.34's own layer)",
        "time_us",
        False,
        ("v4_layer",),
        "µs per step (decode, MTP: CUDA graphs; prefill: eager, L2 flushed), V4-Flash layer, window 128, "
        "top-512, fp8_ds_mla caches; outputs checked; vLLM = its V4 ROCm layer without aiter (Triton "
        "attention, indexer logits + torch.topk); kernels per step.",
        ("kernels", "copy_fill_kernels"),
        configs=False,
    ),
    OpView(
        "indexer_k_cache_write",
        "indexer_k_cache_write (the lightning indexer's fp8 key-cache write)",
        "GB/s",
        True,
        ("indexer",),
        "bf16 k, block 64, UE8M0 scales, vLLM's ROCm layout; bytes = k read + 132 written + the slot per key; "
        "% of the copy ceiling of the same run; our bytes checked equal to the reference.",
    ),
)


# The count metrics' names in a table's header (OpView.counts).
COUNT_LABELS = {
    "cat_kernels": "cat",
    "pad_kernels": "pad",
    "copy_kernels": "copy",
    "fill_kernels": "fill",
    "kernels": "kernels",
    "copy_fill_kernels": "copy+fill",
}

# kernel -> the providers a view of their own shows (OpView.providers)
_OWN_VIEW = {v.kernel: v.providers for v in VIEWS if v.providers}

# Our kernels in another mode: inputs rounded on purpose (mla_decode(fp8_dots="qk" / "all"; quantize_q=True
# is "qk"), an accuracy trade, and batch-invariant splits (plan_sparse_attention(batch_invariant=True)):
# shown beside the others, left out of the speed-up columns.
LOSSY = ("rocm_mla-triton-quantize_q", "rocm_mla-triton-fp8qk", "rocm_mla-triton-fp8all", "rocm_mla-triton-inv")


def is_ours(provider: str) -> bool:
    return provider == "ours" or provider == "rocm_mla" or provider.startswith("rocm_mla-")


def ceilings(rows: list[dict], benches: tuple[str, ...], dates: set[str]) -> dict[tuple[str, str], float]:
    """(date, ceiling shape) -> value for the ceilings the given benches measured on those dates."""
    return {
        (r["date"], r["shape"]): float(r["value"])
        for r in rows
        if r["kernel"] == "ceiling" and r["config"] in benches and r["date"] in dates
    }


def op_section(rows: list[dict], view: OpView) -> tuple[list[str], dict[str, dict[str, float]]]:
    """The Markdown lines of one op and its plotted series (provider -> shape -> headline value)."""
    cur = current_rows([r for r in rows if r["kernel"] != view.kernel or view.shows(r)], view.kernel)
    if not cur:
        return [], {}
    providers: list[str] = []
    for rs in cur.values():
        for r in rs:
            if r["metric"] == view.metric and r["provider"] not in providers:
                providers.append(r["provider"])
    providers.sort(key=lambda p: not is_ours(p))  # stable: ours first, then the file's order
    ours = [p for p in providers if is_ours(p)]
    peers = [p for p in providers if not is_ours(p)]
    dates = {r["date"] for rs in cur.values() for r in rs if r["metric"] == view.metric}
    ceil = ceilings(rows, view.benches, dates)
    ceil_shape = CEILING_OF.get(view.metric)
    many_runs = len(dates) > 1
    # one config column per provider of ours that records one (one column, "our config", when ours is alone)
    configured = [p for p in ours if any(r["config"] for rs in cur.values() for r in rs if r["provider"] == p)]
    configured = configured if view.configs else []
    runs = sorted(dates)

    head = ["shape"] + (["run"] if many_runs else []) + providers
    exact = [p for p in ours if p not in LOSSY]
    head += [f"{'best ours' if len(exact) > 1 else exact[0]} vs {p}" for p in peers] if exact else []
    counted = "/".join(COUNT_LABELS.get(m, m) for m in view.counts)
    head += [f"{p} {counted}" for p in providers] if view.counts else []
    head += ["our config"] if configured and len(ours) == 1 else [f"{p} config" for p in configured]
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    series: dict[str, dict[str, float]] = {p: {} for p in providers}
    grid: dict[str, dict[str, str]] = {}
    for shape, rs in cur.items():
        chosen = {r["provider"]: r for r in rs if r["metric"] == view.metric}  # a run's later row wins
        if not chosen:
            continue
        val = {p: float(r["value"]) for p, r in chosen.items()}
        # the run numbers of the list under the table (dates would repeat on every row)
        numbers = sorted({runs.index(r["date"]) + 1 for r in chosen.values()})
        label = shape
        for part in view.implied:
            label = label.replace(part, "")
        cells = [label] + ([" + ".join(map(str, numbers))] if many_runs else [])
        for p in providers:
            if p not in val:
                cells.append("")  # not measured: a blank cell
                continue
            series[p][shape] = val[p]
            ref = ceil.get((chosen[p]["date"], ceil_shape)) if ceil_shape else None
            same_run = [r for r in rs if r["provider"] == p and r["date"] == chosen[p]["date"]]
            pct = next((float(r["value"]) for r in same_run if view.share and r["metric"] == view.share), None)
            pct = 100 * val[p] / ref if ref else pct
            cells.append(fmt(val[p]) + (f" ({pct:.0f}%)" if pct is not None else ""))
        mine = [val[p] for p in ours if p in val and p not in LOSSY]
        best = (max(mine) if view.higher_is_better else min(mine)) if mine else None
        for p in peers if exact else []:
            if best is None or p not in val or val[p] == 0 or best == 0:
                cells.append("")
            else:
                cells.append(f"{(best / val[p] if view.higher_is_better else val[p] / best):.2f}×")
        if view.counts:
            for p in providers:
                n = {r["metric"]: r["value"] for r in rs if r["provider"] == p}
                cells.append("/".join(f"{float(n[m]):g}" if m in n else "–" for m in view.counts))
        cells += [chosen[p]["config"] if p in chosen else "" for p in configured]
        table.append("| " + " | ".join(cells) + " |")
        if view.pivot:
            at = 1 + many_runs + len(providers)
            ratio = next((c for c in cells[at : at + (len(peers) if exact else 0)] if c), "")
            row, col = view.pivot(shape)
            grid.setdefault(row, {})[col] = ratio.rstrip("×")
    if view.pivot:
        cols = list(dict.fromkeys(c for cs in grid.values() for c in cs))
        table = ["| | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
        table += ["| " + " | ".join([row] + [cs.get(c, "") for c in cols]) + " |" for row, cs in grid.items()]

    unit = {"time_us": "µs"}.get(view.metric, view.metric)
    speed = "larger is faster" if view.higher_is_better else "smaller is faster"
    intro = view.note if view.pivot else f"{unit} ({speed}). {view.note}"
    lines = [f"## {view.title}", "", intro]
    lines += ["", f"Command: `{COMMAND.format(ops=','.join(view.benches))}`", "", *table, ""]
    for n, d in enumerate(runs, 1):
        r = next(r for rs in cur.values() for r in rs if r["date"] == d)
        c = "; ".join(f"{s} {fmt(v)}" for (dd, s), v in sorted(ceil.items()) if dd == d)
        commit = f", commit {r['commit']}" if r["commit"] else ""
        lines.append(
            f"- run {n}, {d}: {r['device']}, {r['versions']}{commit}; ceilings of the same run: {c or 'none recorded'}"
        )
    return lines + [""], series


def render(
    rows: list[dict], plots_rel: str | None = "plots", spec: dict | None = None
) -> tuple[str, dict[str, dict[str, dict[str, float]]]]:
    """RESULTS.md's text and, per kernel, the series to plot (links point into ``plots_rel``).

    The page opens with the headline rows of ``spec`` (perf/readme_rows.json when None; left out when
    ``rows`` hold none of them), then one section per op and device.
    """
    out = [
        "# Measured results",
        "",
        "Generated by `python perf/report.py` from [`results.csv`](results.csv); do not edit. Per shape and"
        " provider the latest run (runs listed under each table); speed-ups > 1 where ours is faster. Older"
        " runs: git history.",
        "",
    ]
    headline, _ = readme_table.render(rows, spec or readme_table.load_spec())
    out += [headline] if headline else []
    plotted = {}
    known = {v.kernel for v in VIEWS}
    extra = sorted({r["kernel"] for r in rows} - known - {"ceiling"})
    views = list(VIEWS) + [OpView(k, k, rows_metric(rows, k), False, (k,)) for k in extra]
    for view in views:
        devices = list(dict.fromkeys(r["device"] for r in rows if r["kernel"] == view.kernel))
        for device in devices:
            # Each device's rows alone: ceilings, runs and ranking never mix devices.
            mine = [r for r in rows if r["device"] == device]
            lines, series = op_section(mine, view)
            if not lines:
                continue
            name = view.name or view.kernel
            name = name if len(devices) == 1 else f"{name}-{_slug(device)}"
            if len(devices) > 1:
                lines[0] += f" — {device}"
            if plots_rel and any(series.values()):
                lines += [f"![{name}]({plots_rel}/{name}.png)", ""]
                plotted[name] = series
            out += lines
    return "\n".join(out).rstrip() + "\n", plotted


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower()


def for_device(rows: list[dict], device: str | None) -> list[dict]:
    """The rows whose device contains ``device`` (case-insensitive); all when None."""
    if not device:
        return rows
    return [r for r in rows if device.lower() in r["device"].lower()]


def rows_metric(rows: list[dict], kernel: str) -> str:
    """The headline metric of a kernel without a view: time_us when measured, else its first metric."""
    metrics = [r["metric"] for r in rows if r["kernel"] == kernel]
    return "time_us" if "time_us" in metrics else metrics[0]


def write_plots(plotted: dict, folder: Path) -> None:
    from benchutil import bar_plot

    view_of = {v.name or v.kernel: v for v in VIEWS}
    for kernel, series in plotted.items():
        shapes = list(dict.fromkeys(s for ser in series.values() for s in ser))
        base = next((k for k in view_of if kernel == k or kernel.startswith(k + "-")), None)
        metric = view_of[base].metric if base else "value"
        bar_plot(
            folder / f"{kernel}.png",
            f"{kernel} ({metric})",
            shapes,
            {p: [ser.get(s, 0.0) for s in shapes] for p, ser in series.items()},
            metric,
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(resultsfile.DEFAULT_PATH), help="the results file")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"), help="the page to write")
    ap.add_argument("--plots", default=str(HERE / "plots"), help="folder for <kernel>.png")
    ap.add_argument("--no-plots", action="store_true", help="write the page alone")
    ap.add_argument("--device", default=None, help="only rows whose device name contains this (case-insensitive)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    plots = Path(args.plots)
    rel = Path(os.path.relpath(plots.resolve(), out.resolve().parent)).as_posix()
    rows = for_device(resultsfile.read(args.csv), args.device)
    if not rows:
        print(f"no rows of a device matching {args.device!r} in {args.csv}", file=sys.stderr)
        return 2
    text, plotted = render(rows, rel)
    out.write_text(text)
    print(f"wrote {out}")
    headline, warnings = readme_table.render(rows, readme_table.load_spec())
    for warning in warnings if headline else ():
        print(f"warning: {warning}", file=sys.stderr)
    if not args.no_plots:
        write_plots(plotted, plots)
        print(f"wrote {len(plotted)} plots to {plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
