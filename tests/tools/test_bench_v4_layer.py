"""perf/bench_v4_layer.py without a GPU: its command line, its steps, its registration in
perf/bench.py, and a CPU run of the whole script (--cpu-smoke: tiny decode, MTP and prefill steps
of a CSA layer, both providers through the Triton interpreter on vLLM 0.34's own V4 layer code,
each output checked, the CSV written), then the same run with a wrong output and a wrong top-k
planted, which its checks must name.

The run needs vLLM 0.34 (.ci/install_vllm_cpu.sh) and happens in a subprocess: vLLM's Triton
kernels run interpreted only when the platform's visible-devices variable is set and empty at
vLLM's first import (tests/vllm_harness/dcp.py cpu_env), and the harness patches vLLM's platform.
"""

from __future__ import annotations

import csv
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "perf"))

import bench  # noqa: E402
import bench_v4_layer as b  # noqa: E402


def _vllm_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return ""


needs_vllm_034 = pytest.mark.skipif(
    not _vllm_version().startswith("0.34."), reason="vLLM 0.34 is not installed (.ci/install_vllm_cpu.sh)"
)


def test_help_names_the_options():
    proc = subprocess.run(
        [sys.executable, "perf/bench_v4_layer.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    for opt in ("--out", "--quick", "--steps", "--cpu-smoke", "--peers"):
        assert opt in proc.stdout


def test_steps():
    """The full set: decode and MTP of 64 requests at 32K through CSA / HCA / window layers at 64
    and 8 heads, an 8K prefill after 8K cached tokens of a CSA and an HCA layer; quick and
    cpu-smoke smaller; every CSA request past topk x 4 tokens (vLLM runs its indexer only then)."""
    full = {s.label for s in b.STEPS["full"]}
    for want in (
        "decode csa B=64 ctx=32768 H=64 topk=512",
        "decode hca B=64 ctx=32768 H=8",
        "decode window B=64 ctx=32768 H=64",
        "mtp csa B=64 ctx=32768 q2 H=8 topk=512",
        "prefill csa B=1 ctx=8192 T=8192 H=64 topk=512",
        "prefill hca B=1 ctx=8192 T=8192 H=8",
    ):
        assert want in full
    assert len(full) == len(b.STEPS["full"]) == 16
    for preset, steps in b.STEPS.items():
        assert len({s.label for s in steps}) == len(steps), preset
        assert all((s.context + s.rows) // 4 > s.topk for s in steps if s.kind == "csa"), preset
        assert all(s.num_decodes == (0 if s.phase == "prefill" else s.requests) for s in steps), preset
    quick = b.STEPS["quick"]

    def tokens(s):
        return s.requests * (s.context + s.rows)

    for phase in ("decode", "mtp", "prefill"):
        most = max(tokens(s) for s in b.STEPS["full"] if s.phase == phase)
        assert all(tokens(s) < most for s in quick if s.phase == phase), phase
    assert {s.phase for s in quick} == {s.phase for s in b.STEPS["cpu-smoke"]} == {"decode", "mtp", "prefill"}


def test_sorted_positions_by_hand():
    """vLLM's top-k as a set: the valid positions ascending, then -1."""
    buf = torch.tensor([[7, 2, -1, 5], [-1, -1, 3, 0]], dtype=torch.int32)
    assert b.sorted_positions(buf).tolist() == [[2, 5, 7, -1], [0, 3, -1, -1]]


def test_registered_in_bench_py():
    reg = bench.BENCHES["v4_layer"]
    assert (reg.script, reg.csv) == ("bench_v4_layer.py", "v4_layer.csv")
    assert (ROOT / "perf" / reg.script).is_file()
    cmd = bench.command("v4_layer", Path("out"), ".peers", quick=True)
    assert cmd[1].endswith("bench_v4_layer.py") and "--quick" in cmd
    assert "--quick" not in bench.command("v4_layer", Path("out"), ".peers", quick=False)
    assert "v4_layer" in bench.__doc__


SMOKE = """
    import sys
    sys.path.insert(0, "perf")
    import bench_v4_layer as b

    out = sys.argv[1]
    sys.argv = ["bench_v4_layer.py", "--cpu-smoke", "--out", out + "/ok"]
    rc = b.main()
    print(f"SMOKE rc={rc}", flush=True)
    # A wrong output of ours and a repeated position in vLLM's top-k: each check must name it.
    real = b.Provider.call

    def broken(self, i=0):
        got = real(self, i)
        if self.hooked:
            self.out[0, 0, :64] += 1.0
        else:
            self.s.topk_buffer[0, 1] = self.s.topk_buffer[0, 0]
        return got

    b.Provider.call = broken
    sys.argv = ["bench_v4_layer.py", "--cpu-smoke", "--steps", "decode", "--out", out + "/broken"]
    print(f"BROKEN rc={b.main()}", flush=True)
"""


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@needs_vllm_034
def test_cpu_smoke_checks_every_provider_and_writes_the_csv(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.update(TRITON_INTERPRET="1", HIP_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SMOKE), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SMOKE rc=0" in log and "BROKEN rc=1" in log, log[-6000:]
    ok, broken = log.split("SMOKE rc=0")
    assert "WRONG" not in ok and "failed" not in ok, ok[-6000:]
    assert ok.count(f"{b.OURS}: checked") == ok.count(f"{b.PEER}: checked") == 3, ok[-6000:]
    rows = _rows(tmp_path / "ok" / "v4_layer.csv")
    labels = [s.label for s in b.STEPS["cpu-smoke"]]
    got = {(r["provider"], r["shape"], r["metric"]) for r in rows}
    for label in labels:
        for provider in b.PROVIDERS:
            for metric in ("time_us", "kernels", "copy_fill_kernels"):
                assert (provider, label, metric) in got, (provider, label, metric)
        assert (b.OURS, label, f"speed_vs_{b.PEER}") in got
        for metric in ("attention_us", "attention_kernels", "attention_copy_fill_kernels"):  # CSA: forward_mqa alone
            assert all((provider, label, metric) in got for provider in b.PROVIDERS), metric
    assert all(r["kernel"] == b.KERNEL for r in rows) and not any(r["metric"] == "wrong" for r in rows)
    assert all(float(r["value"]) > 0 for r in rows if r["metric"] in ("time_us", "kernels"))
    # The planted faults: ours' output and vLLM's top-k are named WRONG, and the rows say so.
    assert f"{b.OURS}: WRONG (out:" in broken, broken[-6000:]
    assert f"{b.PEER}: WRONG (indexer: row 0: expected 32 distinct positions" in broken, broken[-6000:]
    wrong = {r["provider"] for r in _rows(tmp_path / "broken" / "v4_layer.csv") if r["metric"] == "wrong"}
    assert wrong == set(b.PROVIDERS)
