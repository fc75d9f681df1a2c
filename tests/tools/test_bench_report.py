"""perf/bench.py (the benchmark runner) and perf/report.py (RESULTS.md from perf/results.csv) on the CPU.

The runner is exercised with stand-in benchmark scripts (the real ones need a GPU); the report with a
small CSV, and on the committed CSV: the committed perf/RESULTS.md must be exactly its output.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "perf"))

import bench  # noqa: E402
import report  # noqa: E402
import resultsfile  # noqa: E402


def row(kernel, provider, shape, metric, value, date="2026-01-02T03:04+00:00", config=""):
    return dict(
        kernel=kernel,
        provider=provider,
        shape=shape,
        metric=metric,
        value=str(value),
        device="GPU X",
        versions="torch=1 triton=2",
        commit="abc",
        config=config,
        date=date,
    )


def test_committed_results_md_is_the_generated_page():
    text, plotted = report.render(resultsfile.read(ROOT / "perf" / "results.csv"))
    assert (ROOT / "perf" / "RESULTS.md").read_text() == text, "run: python perf/report.py"
    for view in report.VIEWS:
        name = view.name or view.kernel  # an op measured on several devices: a plot and a title a device
        assert any(k == name or k.startswith(f"{name}-") for k in plotted) and f"## {view.title}" in text


def test_report_latest_run_per_shape_ratios_and_ceilings(tmp_path):
    old, new = "2026-01-01", "2026-01-02T03:04+00:00"
    rows = [
        row("ceiling", "torch", "copy 2 GiB", "GB/s", 4000, old, "merge"),
        row("ceiling", "torch", "copy 2 GiB", "GB/s", 4200, new, "merge"),
        row("ceiling", "torch", "copy 2 GiB", "GB/s", 1, new, "decode"),  # another bench's: not shown
        row("merge_attn_states", "rocm_mla-triton", "T=1", "GB/s", 1000, old),
        row("merge_attn_states", "vllm-0.33-triton", "T=1", "GB/s", 500, old),
        row("merge_attn_states", "torch-reference", "T=1", "GB/s", 120, old),  # measured in the old run alone
        row("merge_attn_states", "rocm_mla-triton", "T=1", "GB/s", 2100, new, "tile 4096"),
        row("merge_attn_states", "rocm_mla-hip", "T=1", "GB/s", 1050, new),
        row("merge_attn_states", "vllm-0.33-triton", "T=1", "GB/s", 700, new),
        row("merge_attn_states", "rocm_mla-triton", "T=2", "GB/s", 300, old),
        row("mla_decode", "rocm_mla-triton", "B=1", "time_us", 10, new),
        row("mla_decode", "flashinfer-fa3", "B=1", "time_us", 20, new),
        row("mla_decode", "rocm_mla-triton", "B=1", "GB/s", 5, new),
    ]
    csv_path = tmp_path / "r.csv"
    resultsfile.append(csv_path, rows)
    assert resultsfile.read(csv_path) == rows
    text, _ = report.render(resultsfile.read(csv_path), None)
    merge = text.split("## merge_attn_states")[1].split("##")[0]
    # T=1: each provider from the latest run that measured it, against that run's ceiling (2100 / 4200 = 50%,
    # 120 / 4000 = 3%); the best of ours over each peer (2100 / 700 = 3.00x); both runs named, by their
    # numbers in the list under the table
    head = "| shape | run | rocm_mla-triton | rocm_mla-hip | torch-reference | vllm-0.33-triton | best ours vs torch"
    assert head + "-reference | best ours vs vllm-0.33-triton | rocm_mla-triton config |\n" in merge
    t1 = "| T=1 | 1 + 2 | 2100 (50%) | 1050 (25%) | 120 (3%) | 700 (17%) | 17.50× | 3.00×"
    assert t1 + " | tile 4096 |" in merge
    assert "| T=2 | 1 | 300 (8%) |  |  |  |  |  |  |" in merge
    assert f"- run 1, {old}: GPU X" in merge and f"- run 2, {new}: GPU X" in merge
    assert "copy 2 GiB 4200" in merge and "copy 2 GiB 4000" in merge and "copy 2 GiB 1.00" not in merge
    assert "Command: `python perf/bench.py --ops merge`" in merge
    decode = text.split("## mla_decode")[1]
    assert "| B=1 | 10.0 | 20.0 | 2.00× |" in decode  # a time: the peer's over ours
    assert "ceilings of the same run: copy 2 GiB 1.00" in decode  # the decode bench's own
    args = ["--csv", str(csv_path), "--out", str(tmp_path / "R.md"), "--plots", str(tmp_path / "plots"), "--no-plots"]
    assert report.main(args) == 0
    assert (tmp_path / "R.md").read_text() == report.render(rows, "plots")[0]


def test_report_never_ranks_rows_of_different_devices_together(tmp_path):
    """An op measured on two devices: one table per device, each with its own run and ceiling; a
    synthetic row of another device is not ranked against the first one's peers; --device filters."""
    new = "2026-01-02T03:04+00:00"
    rows = [
        row("ceiling", "torch", "copy 2 GiB", "GB/s", 4000, new, "merge"),
        row("merge_attn_states", "rocm_mla-triton", "T=1", "GB/s", 2000, new),
        row("merge_attn_states", "vllm-0.33-triton", "T=1", "GB/s", 1000, new),
        {**row("merge_attn_states", "rocm_mla-hip", "T=1", "GB/s", 9000, new), "device": "AMD MI300X"},
    ]
    text, plotted = report.render(rows, "plots")
    assert "## merge_attn_states — GPU X" in text and "## merge_attn_states — AMD MI300X" in text
    mi300 = text.split("— AMD MI300X")[1]
    assert "| T=1 | 9000 |" in mi300 and "vllm" not in mi300.split("- run")[0]  # no peer of another device
    gpu_x = text.split("— GPU X")[1].split("##")[0]
    assert "| T=1 | 2000 (50%) | 1000 (25%) | 2.00× |" in gpu_x and "9000" not in gpu_x
    assert set(plotted) == {"merge_attn_states-gpu_x", "merge_attn_states-amd_mi300x"}
    csv_path = tmp_path / "r.csv"
    resultsfile.append(csv_path, rows)
    out = tmp_path / "R.md"
    assert report.main(["--csv", str(csv_path), "--out", str(out), "--no-plots", "--device", "mi300x"]) == 0
    only = out.read_text()
    assert "GPU X" not in only and "9000" in only and "## merge_attn_states\n" in only
    assert report.main(["--csv", str(csv_path), "--out", str(out), "--no-plots", "--device", "H100"]) == 2


def test_results_file_rejects_other_columns(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("kernel,provider\nk,p\n")
    with pytest.raises(ValueError, match="columns"):
        resultsfile.read(p)
    with pytest.raises(ValueError, match="lacks"):
        resultsfile.append(p.with_name("y.csv"), [{"kernel": "k"}])


def test_runner_lists_and_needs_a_gpu(capsys, monkeypatch):
    assert bench.main(["--list", "--ops", "decode,prefill", "--quick", "--peers", "P"]) == 0
    out = capsys.readouterr().out
    assert "bench_decode.py" in out and "--preset quick" in out and "--aiter-peers P/aiter" in out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--ops", "merge"]) == 2
    assert "needs a GPU" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--ops", "nope"])


FAKE = """
import argparse, sys
from pathlib import Path
sys.path[:0] = [{root!r}, str(Path({root!r}, "perf"))]
from benchutil import Record, write_csv
ap = argparse.ArgumentParser()
ap.add_argument("--out")
ap.add_argument("--peers")
ap.add_argument("--quick", action="store_true")
a = ap.parse_args()
print("{line}")
write_csv(Path(a.out) / "fake.csv", [
    Record("copy", "torch", "2 GiB", "GB/s", 4000.0, "GPU X", "1"),
    Record("merge_attn_states", "rocm_mla-triton", "T=9", "GB/s", 123.0, "GPU X", "0.1", "tile 64"),
])
sys.exit({rc})
"""


@pytest.mark.parametrize(
    "line,rc,status,appended",
    [("all outputs checked", 0, "ok", 2), ("  x T=9: WRONG (max err 1)", 0, "WRONG output", 0), ("", 3, "FAILED", 0)],
)
def test_runner_appends_checked_rows_with_their_run(tmp_path, monkeypatch, capsys, line, rc, status, appended):
    script = tmp_path / "fake_bench.py"
    script.write_text(textwrap.dedent(FAKE.format(root=str(ROOT), line=line, rc=rc)))
    monkeypatch.setitem(bench.BENCHES, "fake", bench.Bench(str(script), "fake.csv"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "GPU X")
    out = tmp_path / "results.csv"
    got = bench.main(["--ops", "fake", "--out", str(out), "--logs", str(tmp_path / "logs"), "--peers", "P"])
    printed = capsys.readouterr().out
    assert got == (0 if status == "ok" else 1) and status in printed
    rows = resultsfile.read(out) if out.exists() else []
    assert len(rows) == appended
    if appended:
        ceiling, merge = rows
        assert (ceiling["kernel"], ceiling["shape"], ceiling["config"]) == ("ceiling", "copy 2 GiB", "fake")
        assert (merge["config"], merge["value"]) == ("tile 64", "123")
        assert merge["versions"].startswith(f"torch={torch.__version__} triton=") and merge["date"] == ceiling["date"]
        assert "| T=9 | 123 | tile 64 |" in printed  # the run's own table
        home = tmp_path / "home.csv"
        assert bench.main(["--merge", str(out), "--out", str(home)]) == 0
        assert bench.main(["--merge", str(out), "--out", str(home)]) == 0
        assert resultsfile.read(home) == rows + rows


def test_runner_records_the_commit_it_is_given(tmp_path, monkeypatch, capsys):
    """--commit names the commit of a tree copied without its history (a GPU machine's copy);
    without it the runner asks git."""
    script = tmp_path / "fake_bench.py"
    script.write_text(textwrap.dedent(FAKE.format(root=str(ROOT), line="all outputs checked", rc=0)))
    monkeypatch.setitem(bench.BENCHES, "fake", bench.Bench(str(script), "fake.csv"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "GPU X")
    monkeypatch.setattr(bench, "git_commit", lambda: "from-git")
    for given, want in (("abc1234", "abc1234"), ("", "from-git")):
        out = tmp_path / f"results-{want}.csv"
        argv = ["--ops", "fake", "--out", str(out), "--logs", str(tmp_path / "logs"), "--peers", "P"]
        assert bench.main(argv + (["--commit", given] if given else [])) == 0
        assert {r["commit"] for r in resultsfile.read(out)} == {want}
        assert f"commit {want}" in capsys.readouterr().out


def test_providers_of_a_view_of_their_own_leave_the_kernels_other_table():
    """mla_decode's batch-invariant bench (default, invariant, vLLM with one split) has its own table:
    its shapes and columns never enter the main decode table, nor the main table's peers its own."""
    rows = [
        row("mla_decode", "rocm_mla-triton", "B=1", "time_us", 10),
        row("mla_decode", "flashinfer-fa3", "B=1", "time_us", 20),
        row("mla_decode", "rocm_mla-default", "B=1", "time_us", 11),
        row("mla_decode", "rocm_mla-invariant", "B=1", "time_us", 12, config="split_tokens=256"),
        row("mla_decode", "vllm-0.33-triton-1split", "B=1", "time_us", 600),
        row("mla_decode", "rocm_mla-invariant", "B=8", "time_us", 13, config="split_tokens=256"),
    ]
    text, plotted = report.render(rows, "plots")
    main = text.split("## mla_decode\n")[1].split("\n## ")[0]
    own = text.split("## mla_decode, batch-invariant mode\n")[1]
    assert "| B=1 | 10.0 | 20.0 | 2.00× |" in main
    assert "invariant" not in main and "1split" not in main and "B=8" not in main
    head = "| shape | rocm_mla-default | rocm_mla-invariant | vllm-0.33-triton-1split | best ours vs vllm-0.33-triton"
    assert head + "-1split | rocm_mla-invariant config |" in own
    assert "| B=1 | 11.0 | 12.0 | 600 | 54.55× | split_tokens=256 |" in own  # the best of ours: 600 / 11
    assert "| B=8 |  | 13.0 |  |  | split_tokens=256 |" in own and "flashinfer" not in own
    assert "Command: `python perf/bench.py --ops decode_invariant`" in own
    assert set(plotted) == {"mla_decode", "mla_decode_batch_invariant"}


def test_a_views_share_metric_shows_beside_each_value_from_the_same_run():
    """The indexer's table shows each provider's time with its % of copy (pct_copy) of the same run; a
    provider without that metric shows its time alone, and an older run's percentage is never borrowed.
    The shape cells leave out what the note states (topk=2048, H=64), and keep what differs (H=32)."""
    old, new = "2026-01-01", "2026-01-02T03:04+00:00"
    k, shape = "mla_indexer_topk", "B=128 ctx=131072 H=64 topk=2048"
    rows = [
        row(k, "rocm_mla-triton", shape, "pct_copy", 10.0, old),
        row(k, "rocm_mla-triton", shape, "time_us", 1000, new),
        row(k, "rocm_mla-triton", shape, "pct_copy", 51.4, new),
        row(k, "vllm-0.34-triton+topk", shape, "time_us", 870, new),
        row(k, "vllm-0.34-triton+topk", shape, "pct_copy", 59.6, old),
        row(k, "rocm_mla-triton", "B=1 ctx=8192 H=32 topk=512 c4", "time_us", 40, new),
    ]
    text, _ = report.render(rows, None)
    section = text.split("## mla_indexer_topk")[1]
    assert "| B=128 ctx=131072 | 1000 (51%) | 870 | 0.87× |" in section  # topk=2048, H=64: in the note
    assert "| B=1 ctx=8192 H=32 topk=512 c4 | 40.0 |" in section
    assert "(10%)" not in section and "(60%)" not in section
