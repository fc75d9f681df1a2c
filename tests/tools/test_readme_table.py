"""perf/RESULTS.md's headline table (perf/readme_table.py, written by perf/report.py) on the CPU.

perf/RESULTS.md must hold exactly the generator's headline section from the committed CSV and spec,
once, and the README carries no date and no number next to a time or rate unit: those live in
perf/RESULTS.md (with their runs) or in docs/notes; the README links to the page.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "perf"))

import bench  # noqa: E402
import readme_table  # noqa: E402
import report  # noqa: E402
import resultsfile  # noqa: E402

README = ROOT / "README.md"
RESULTS = ROOT / "perf" / "RESULTS.md"


def committed():
    return resultsfile.read(resultsfile.DEFAULT_PATH), readme_table.load_spec()


def check(results: str, readme: str) -> list[str]:
    """What is wrong with the pair: a headline section in RESULTS.md other than the generated one (or
    not once), a date or a timing in the README, or a README that does not link to RESULTS.md."""
    rows, spec = committed()
    block, _ = readme_table.render(rows, spec)
    problems = [] if results.count(block) == 1 else ["the headline section of RESULTS.md is not the generated one"]
    problems += [] if "(perf/RESULTS.md)" in readme else ["the README does not link to perf/RESULTS.md"]
    return problems + [f"in the README: {line}" for line in readme_table.findings(readme)]


def test_committed_headline_is_the_generated_one():
    assert check(RESULTS.read_text(), README.read_text()) == [], (
        "run: python perf/report.py (and keep timings and dates out of the README)"
    )
    assert readme_table.README_PATH == README


def test_every_spec_row_is_in_the_committed_csv():
    """A row left out would be a spec row the CSV does not hold (a typo in its kernel, shape or provider)."""
    rows, spec = committed()
    block, warnings = readme_table.render(rows, spec)
    assert warnings == []
    assert all(f"| {row['label']} |" in block for row in spec["rows"])
    for row in spec["rows"]:
        assert row["bench"] in bench.BENCHES and row["unit"] in readme_table.UNITS
        assert set(row["ours"].get("extras", ())) <= set(readme_table.EXTRAS)
    # Where a run recorded ceilings, one of them names the row's bench: the command shown is the run's.
    assert "\n- run " in block
    ceiling_dates = {r["date"] for r in rows if r["kernel"] == "ceiling"}
    for line in block.splitlines():
        if line.startswith("- run ") and line.split(", ")[1].split(":")[0] in ceiling_dates:
            assert "none recorded" not in line, line


@pytest.mark.parametrize(
    "name,old,new",
    [
        ("results", "| decode B=128 seq 4096 N=16 (TP8) | 156 µs", "| decode B=128 seq 4096 N=16 (TP8) | 150 µs"),
        ("readme", "## Support matrix", "## Support matrix (measured 2026-12-04)"),  # a date in the README
        ("readme", "## Support matrix", "## Support matrix, at 160 µs"),  # a timing in the README
        ("readme", "## Support matrix", "## Support matrix\n\nDecode: 1.44× slower, 234 µs."),
        ("readme", "(perf/RESULTS.md)", "(perf/)"),  # the link to the numbers gone
    ],
)
def test_the_check_catches_a_planted_edit(name, old, new):
    texts = {"results": RESULTS.read_text(), "readme": README.read_text()}
    assert old in texts[name]
    texts[name] = texts[name].replace(old, new)
    assert check(texts["results"], texts["readme"]) != []


def row(kernel, provider, shape, metric, value, date="2026-01-02T03:04+00:00", config="", device="GPU X"):
    return dict(
        kernel=kernel,
        provider=provider,
        shape=shape,
        metric=metric,
        value=str(value),
        device=device,
        versions="torch=1 triton=2",
        commit="abc",
        config=config,
        date=date,
    )


SPEC = {
    "device": "GPU X",
    "rows": [
        {
            "label": "decode B=1",
            "kernel": "mla_decode",
            "shape": "B=1",
            "bench": "decode",
            "unit": "µs",
            "ours": {"provider": "rocm_mla-triton", "extras": ["pct_copy"]},
            "variants": [{"label": "fp8", "provider": "rocm_mla-triton-fp8qk"}],
            "peers": [
                {"label": "FI", "provider": "flashinfer-fa3", "ratio": True},
                {"label": "vLLM", "provider": "vllm-0.33-triton"},
            ],
        },
        {
            "label": "merge T=1",
            "kernel": "merge_attn_states",
            "shape": "T=1",
            "bench": "merge",
            "unit": "GB/s",
            "ours": {"provider": "rocm_mla-triton", "extras": ["pct_copy"]},
            "peers": [{"label": "vLLM", "provider": "vllm-0.33-triton", "ratio": True}],
        },
        {
            "label": "not measured",
            "kernel": "mla_prefill",
            "shape": "4x4096",
            "bench": "prefill",
            "unit": "TFLOP/s",
            "ours": {"provider": "ours"},
            "peers": [],
        },
    ],
}


def test_render_takes_the_latest_run_and_leaves_out_what_is_missing():
    old, new = "2026-01-01", "2026-01-02T03:04+00:00"
    rows = [
        row("ceiling", "torch", "copy 2 GiB", "GB/s", 4000, new, "merge"),
        row("ceiling", "torch", "copy 2 GiB", "GB/s", 1000, old, "decode"),
        row("mla_decode", "rocm_mla-triton", "B=1", "time_us", 99, old),  # an older run of ours: not shown
        row("mla_decode", "rocm_mla-triton", "B=1", "time_us", 10, new),
        row("mla_decode", "rocm_mla-triton", "B=1", "pct_copy", 45.4, new),
        row("mla_decode", "rocm_mla-triton-fp8qk", "B=1", "time_us", 12.5, new),
        row("mla_decode", "flashinfer-fa3", "B=1", "time_us", 20, old),
        row("mla_decode", "vllm-0.33-triton", "B=1", "time_us", 1500, new),
        row("mla_decode", "vllm-0.33-triton", "B=1", "time_us", 5, new, device="GPU Y"),  # another device
        row("merge_attn_states", "rocm_mla-triton", "T=1", "GB/s", 2000, new),
        row("merge_attn_states", "vllm-0.33-triton", "T=1", "GB/s", 500, new),
    ]
    block, warnings = readme_table.render(rows, SPEC)
    assert block.startswith(readme_table.HEADING + " (GPU X)\n\n" + readme_table.INTRO + "\n")
    lines = block.splitlines()
    assert block.endswith("\n") and lines[-1].startswith("- run 3, ")
    # a time: the peer's over ours; ours from its latest run (with that run's own pct_copy), FI from its own
    assert "| decode B=1 | 10.0 µs (45% of copy); fp8 12.5 µs | FI 20.0 µs; vLLM 1500 µs | 2.00× FI | 1, 2 |" in lines
    # a rate: ours over the peer; % of copy against the ceiling of the run of the row's bench
    assert "| merge T=1 | 2000 GB/s (50% of copy) | vLLM 500 GB/s | 4.00× | 3 |" in lines
    left_out = "headline row 'not measured' left out: no rows for mla_prefill '4x4096'"
    assert warnings == [left_out + " on GPU X in the results file"]
    assert "not measured" not in block
    run1 = f"- run 1, {new}: GPU X, torch=1 triton=2, commit abc, `python perf/bench.py --ops decode`; "
    assert run1 + "ceilings of the same run: none recorded" in lines
    assert f"- run 2, {old}: GPU X, torch=1 triton=2, commit abc, `python perf/bench.py --ops decode`; " in block
    assert "ceilings of the same run: copy 2 GiB 1000 GB/s" in block
    # a missing peer leaves the row out too
    _, warnings = readme_table.render([r for r in rows if r["provider"] != "flashinfer-fa3"], SPEC)
    assert warnings[0].startswith("headline row 'decode B=1' left out: no flashinfer-fa3 time_us for mla_decode 'B=1'")


def test_report_opens_results_md_with_the_headline_and_leaves_the_readme_alone(tmp_path):
    rows = [
        row("merge_attn_states", "rocm_mla-triton", "T=1", "GB/s", 2000),
        row("merge_attn_states", "vllm-0.33-triton", "T=1", "GB/s", 500),
        row("ceiling", "torch", "copy 2 GiB", "GB/s", 4000, config="merge"),
    ]
    csv_path = tmp_path / "r.csv"
    resultsfile.append(csv_path, rows)
    assert b"\r" not in csv_path.read_bytes()  # rows end as the repository's file's do
    spec = {**SPEC, "rows": SPEC["rows"][1:2]}
    block, warnings = readme_table.render(resultsfile.read(csv_path), spec)
    assert warnings == [] and "| merge T=1 | 2000 GB/s (50% of copy) |" in block
    text, _ = report.render(resultsfile.read(csv_path), None, spec)
    assert text.count(block) == 1 and text.index(block) < text.index("## merge_attn_states")
    # no spec row in the rows (another device): no headline section, the rest of the page as before
    other, _ = report.render(resultsfile.read(csv_path), None, {**spec, "device": "GPU Y"})
    assert readme_table.HEADING not in other and other == text.replace(block + "\n", "")
    assert readme_table.render(rows, {**spec, "device": "GPU Y"})[0] == ""
    assert readme_table.findings("# x\n\nbefore\n\nafter 3 µs\non 2026-01-02\n") == ["after 3 µs", "on 2026-01-02"]
    # report.py writes the page it is given and never the README
    args = ["--csv", str(csv_path), "--out", str(tmp_path / "R.md"), "--plots", str(tmp_path / "plots"), "--no-plots"]
    before = README.read_text()
    assert report.main(args) == 0 and README.read_text() == before
    assert (tmp_path / "R.md").read_text() == report.render(resultsfile.read(csv_path), "plots")[0]
