"""perf/bench_indexer.py without a GPU: its command line, shapes and memory plan, the conversion of
vLLM's top-k columns to mla_indexer_topk's positions, and a CPU run of the whole script (the Triton
interpreter, tiny shapes, the GPU timers stood in for) through every provider, each output checked.

The providers' run needs the vLLM peer folder (bash perf/peers/get_vllm_sparse_peers.sh .peers) and
runs in a subprocess (it patches the bench's timers). In the interpreter vLLM's key-cache insert
writes some fp8 codes one binade low (the interpreter's float32 -> e4m3 conversion drops the carry
when a mantissa rounds up to the next power of two): its bytes are noted as differing, which the
run reports without failing; on a GPU the conversion rounds to nearest even and the bytes match.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "perf"))

import bench_indexer as bench  # noqa: E402

from rocm_mla.cases import indexer_topk as topk_cases  # noqa: E402

HAS_PEER = (ROOT / ".peers" / "vllm_sparse" / "rocm_indexer.py").is_file()
needs_peer = pytest.mark.skipif(
    not HAS_PEER, reason="no .peers/vllm_sparse/rocm_indexer.py (bash perf/peers/get_vllm_sparse_peers.sh .peers)"
)


def test_help_names_the_options():
    proc = subprocess.run(
        [sys.executable, "perf/bench_indexer.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    for opt in ("--preset", "--shapes", "--configs", "--no-vllm", "--peers", "--out"):
        assert opt in proc.stdout


def test_shapes_labels_and_which_peer_takes_them():
    labels = [s.label() for s in topk_cases.SHAPES["bench"]]
    for want in (
        "B=128 ctx=131072 H=64 topk=2048",
        "B=1 ctx=131072 H=64 topk=2048",
        "B=32 ctx=8192 H=32 topk=2048 q2",
        "B=1 ctx=32768 H=64 topk=2048 T=8192",
    ):
        assert want in labels
    assert len(set(labels)) == len(labels)
    by_label = {s.label(): s for s in topk_cases.SHAPES["bench"]}
    assert bench.is_decode(by_label["B=32 ctx=8192 H=32 topk=2048 q2"])
    assert not bench.is_decode(by_label["B=1 ctx=32768 H=64 topk=2048 T=8192"])
    assert [s.label() for s in topk_cases.SHAPES["quick"]][:3] == [
        "B=128 ctx=32768 H=64 topk=2048",
        "B=128 ctx=131072 H=64 topk=2048",
        "B=1 ctx=131072 H=64 topk=2048",
    ]
    assert [s.T for s in bench.write_shapes("bench")] == [1, 64, 4096, 32768]
    assert [s.T for s in bench.write_shapes("quick")] == [64, 32768]
    assert all("block=64" in s.label for s in bench.write_shapes("bench"))


def test_memory_plan_stays_under_60_gb():
    """Per shape the copies (and the decode peer's block-flat ones) stay under COPIES_BYTES; the
    largest shape (128 x 128K keys, 2.2 GB a copy) gets one copy, cold by itself; the torch prefill
    peer's pieces stay under PREFILL_TORCH_BYTES."""
    cold = 50 << 20  # the H200's L2
    big = topk_cases.IndexerShape.decode(128, 131072, 64)
    assert 2.1e9 < big.set_bytes() < 2.3e9 and bench.copies_for(big, cold, True) == (1, True)
    for s in topk_cases.SHAPES["bench"]:
        R, _ = bench.copies_for(s, cold, bench.is_decode(s))
        assert 1 <= R <= bench.COPIES_CAP
        assert R * s.set_bytes() * 2 <= bench.COPIES_BYTES < 60 << 30
        if not bench.is_decode(s):
            keys = sum(s.lens)
            m = bench.prefill_rows(s, keys)
            assert m * keys * s.H * bench.PREFILL_TORCH_ELEM <= bench.PREFILL_TORCH_BYTES
            assert m * keys * 4 <= bench.VLLM_LOGITS_BYTES
    small = topk_cases.IndexerShape.decode(1, 8192, 64)
    assert bench.copies_for(small, cold, True) == (bench.COPIES_CAP, False)  # noted as partly from L2
    assert bench.copies_for(small, 0, True) == (1, True)


def test_vllm_positions_by_hand():
    """torch.topk's columns -> request-local positions, -1 for columns past the row's keys (taken
    where kv_len < k: -inf logits), valid ones first in ascending order, padded to topk."""
    idx = torch.tensor([[2, 0, 1, 7, 3], [5, 6, 2, 9, 4], [7, 1, 8, 0, 2]])
    kv = torch.tensor([3, 10, 2], dtype=torch.int32)
    got = bench.vllm_positions(idx, kv, 6)
    assert got.dtype == torch.int32
    assert got.tolist() == [[0, 1, 2, -1, -1, -1], [2, 4, 5, 6, 9, -1], [0, 1, -1, -1, -1, -1]]
    # prefill: columns of the gathered keys, a row's request starting at starts[t]
    idx = torch.tensor([[12, 10, 11, 15], [2, 0, 1, 3]])
    got = bench.vllm_positions(idx, torch.tensor([3, 4]), 4, starts=torch.tensor([10, 0]))
    assert got.tolist() == [[0, 1, 2, -1], [0, 1, 2, 3]]
    # what the check then says of it: a duplicate is caught
    case = topk_cases.make_inputs(topk_cases.IndexerShape((5,), 1, 8, topk=4, block=16), copies=1)
    good = case.reference()
    assert case.mismatch(bench.vllm_positions(good.long(), case.kv_lens[:1], 4)) == ""
    bad = good.clone()
    bad[0, 1] = bad[0, 0]
    assert "distinct" in case.mismatch(bench.vllm_positions(bad.long(), case.kv_lens[:1], 4))


def test_missing_peer_folder_is_a_reason_not_a_crash(tmp_path, capsys):
    assert bench.load_vllm_indexer(str(tmp_path)) is None
    assert "get_vllm_sparse_peers.sh" in capsys.readouterr().out


SMOKE = """
    import sys, torch
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.empty_cache = lambda: None
    sys.path.insert(0, "perf")
    import bench_indexer as b
    from benchutil import BenchGPU
    from rocm_mla.cases.indexer_topk import IndexerShape as S
    from rocm_mla.cases.indexer_cache import IndexerCacheShape as W

    # The GPU-only pieces, stood in for on the CPU: the device, the ceiling, the timers.
    b.start_bench = lambda name, **kw: BenchGPU(torch.device("cpu"), "cpu", 100.0, None)
    b.cold_cache_bytes = lambda dev: 0
    b.rotating_graph_us = lambda fn, R: (fn(0), 1.0)[1]
    b.time_ms = lambda fn, *a, **k: (fn(), 0.002)[1]
    # decode q2 (one split), decode q1 (two splits + merge), a prefill chunk of two requests
    b.topk_cases.SHAPES["quick"] = [
        S.decode(2, 200, 16, 2, topk=48, block=64),
        S.decode(1, 300, 16, 1, topk=48, block=64),
        S((200, 90), (30, 5), 16, topk=48, block=64),
    ]
    b.write_shapes = lambda preset: [W(100, 64)]
    if "--break" in sys.argv:  # ours repeats its first entry: every check of ours must fail
        real = b.ours
        def broken(s, config=None):
            call, plan = real(s, config)
            return (lambda i: call(i).__setitem__((0, 1), s.case.out[0, 0]) or s.case.out), plan
        b.ours = broken
    extra = ["--no-vllm"] if "--no-vllm" in sys.argv else []
    sys.argv = ["bench_indexer.py", "--quick", "--out", sys.argv[1], "--peers", ".peers", *extra]
    sys.exit(b.main())
"""


def _smoke(out: Path, *flags: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SMOKE), str(out), *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    return log


@needs_peer
def test_cpu_run_of_every_provider_checked(tmp_path):
    """Every provider runs and passes its check (the vLLM insert's bytes aside: see the module
    docstring); the CSV holds both kernels' rows, ours with its plan, and the speed-ups."""
    log = _smoke(tmp_path / "out")
    assert "WRONG" not in log and "Error" not in log, log
    differs = [line for line in log.splitlines() if "differs from the reference" in line]
    assert all(bench.WRITE_PEER + " " in line for line in differs), log
    with (tmp_path / "out" / "indexer.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    timed = {(r["kernel"], r["provider"], r["shape"]) for r in rows if r["metric"] == "time_us"}
    q2, q1, pre = "B=2 ctx=200 H=16 topk=48 q2", "B=1 ctx=300 H=16 topk=48", "lens=200,90 H=16 topk=48"
    for shape in (q2, q1, pre):
        assert (bench.KERNEL, bench.OURS, shape) in timed
    assert (bench.KERNEL, bench.DECODE_PEER, q2) in timed and (bench.KERNEL, bench.DECODE_PEER, q1) in timed
    assert (bench.KERNEL, bench.PREFILL_PEER, pre) in timed and (bench.KERNEL, bench.DECODE_PEER, pre) not in timed
    w = "T=100 block=64 fp8 ue8m0"
    assert (bench.WRITE_KERNEL, bench.OURS, w) in timed and (bench.WRITE_KERNEL, bench.WRITE_PEER, w) in timed
    ours = [r for r in rows if r["kernel"] == bench.KERNEL and r["provider"] == bench.OURS and r["metric"] == "time_us"]
    assert all(r["config"].startswith("S=") for r in ours)
    assert {r["metric"] for r in rows} >= {"time_us", "GB/s", "pct_copy", f"speed_vs_{bench.DECODE_PEER}"}
    assert "targets:" in log and "vLLM/ours" in log


@needs_peer
def test_cpu_run_names_a_wrong_kernel(tmp_path):
    log = _smoke(tmp_path / "out", "--break")
    wrong = [line.strip() for line in log.splitlines() if "WRONG" in line]
    assert len(wrong) == 3 and all(line.startswith(bench.OURS + " ") for line in wrong), log
    assert all("WRONG (row 0: expected 48 distinct" in line for line in wrong), log


def test_cpu_run_without_peers(tmp_path):
    log = _smoke(tmp_path / "out", "--no-vllm")
    assert "WRONG" not in log and "Error" not in log, log
    with (tmp_path / "out" / "indexer.csv").open(newline="") as f:
        providers = {r["provider"] for r in csv.DictReader(f)}
    assert providers == {"torch", bench.OURS}


@pytest.mark.gpu
def test_gpu_quick_shapes(tmp_path):
    """On a GPU: two small shapes of the real run (MTP decode and a key-cache write), every check
    passing."""
    proc = subprocess.run(
        [
            sys.executable,
            "perf/bench_indexer.py",
            "--preset",
            "quick",
            "--shapes",
            "B=32 ctx=8192 H=32 topk=2048 q2;T=64 block",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "WRONG" not in log, log
    assert (tmp_path / "indexer.csv").is_file()
