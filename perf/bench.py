#!/usr/bin/env python3
"""Run any subset of the op benchmarks, each in its own process, and append their rows to perf/results.csv.

    python perf/bench.py [--ops merge,rope_kv_write,decode,decode_matrix,decode_invariant,prefill,
                                prefill_geometry,layer,sparse,indexer,sparse_layer,v4_attention,
                                v4_layer] [--quick]
                         [--peers .peers] [--out perf/results.csv] [--logs DIR] [--timeout 900] [--list]

Each benchmark times our kernels with its peers beside them (vLLM 0.33's Triton kernels, FlashInfer,
aiter, cuDNN/FLASH SDPA, the torch references: whichever are importable, see perf/peers/) and checks
every output it times against the float32 reference or the peer; a benchmark that exits non-zero or
prints WRONG (or DISAGREE: two providers' outputs differ) is reported as failed and its rows are not
appended. Each also measures the ceilings (copy GB/s, bf16 matmul TFLOP/s) in its own process; they
are appended beside its rows as kernel "ceiling". Rows carry the device, torch/triton and peer
versions, the git commit and the start time (columns: perf/resultsfile.py). A progress line per
benchmark, then a short table of this run.
``python perf/report.py`` turns the CSV into perf/RESULTS.md and perf/plots/.

Needs a GPU: without one it says so and exits 2 (``--list`` and ``--merge`` work anywhere). The peers folder is made
by perf/peers/get_vllm_peers.sh, get_vllm_sparse_peers.sh (into PEERS/vllm_sparse), get_aiter_peers.sh (into
PEERS/aiter) and get_flashinfer_peer.sh;
on a GPU machine without network access, copy the folder there, run through perf/device_run.sh
(``--ops``), bring its results.csv back and fold it in with ``--merge FILE``. ``v4_layer`` runs vLLM
0.34's own DeepSeek-V4 layer code and needs vLLM importable (there: ``source perf/vllm_on_device.sh``).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
import resultsfile  # noqa: E402


@dataclass(frozen=True)
class Bench:
    """One op benchmark: its script, the CSV it writes into its --out folder, its arguments (full and
    --quick), and how it is told where the peers are."""

    script: str
    csv: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)
    peer_args: tuple[str, ...] = ("--peers", "{peers}")


BENCHES = {
    "merge": Bench("bench_merge.py", "merge.csv"),
    "rope_kv_write": Bench("bench_rope_kv_write.py", "rope_kv_write.csv", peer_args=()),
    "decode": Bench("bench_decode.py", "decode.csv", ("--preset", "serving"), ("--preset", "quick")),
    "decode_matrix": Bench("bench_decode.py", "decode.csv", ("--preset", "flashmla"), ("--preset", "quick")),
    "prefill": Bench(
        "bench_prefill.py",
        "prefill.csv",
        ("--context",),
        ("--quick", "--context"),
        ("--vllm-peers", "{peers}", "--aiter-peers", "{peers}/aiter"),
    ),
    # The other MLA head geometries (192/64/256 GLM-4.x-Lite, 64/64/128, 256/0/256) beside the same peers.
    "prefill_geometry": Bench(
        "bench_prefill.py",
        "prefill.csv",
        ("--geometry",),
        ("--quick", "--geometry"),
        ("--vllm-peers", "{peers}", "--aiter-peers", "{peers}/aiter"),
    ),
    "layer": Bench("bench_layer.py", "layer.csv"),
    "decode_invariant": Bench("bench_decode_invariant.py", "decode_invariant.csv", ("--split-tokens", "256,512,1024")),
    # Sparse MLA (DeepSeek-V3.2, GLM-5.x) beside vLLM 0.34's Triton kernels (PEERS/vllm_sparse) and FlashInfer.
    "sparse": Bench("bench_sparse.py", "sparse.csv", ("--preset", "bench"), ("--preset", "quick")),
    # The lightning indexer (mla_indexer_topk, indexer_k_cache_write) beside vLLM 0.34's ROCm path (PEERS/vllm_sparse).
    "indexer": Bench("bench_indexer.py", "indexer.csv", ("--preset", "bench"), ("--preset", "quick")),
    # A sparse layer's attention path (indexer top-k + sparse attention) beside vLLM 0.34's ROCm Triton composition.
    "sparse_layer": Bench("bench_sparse_layer.py", "sparse_layer.csv", (), ()),
    # DeepSeek-V4 attention (mla_v4_attention) beside vLLM 0.34's ROCm decode and prefill path (PEERS/vllm_sparse).
    "v4_attention": Bench("bench_v4.py", "v4.csv", ("--preset", "bench"), ("--quick",)),
    # A DeepSeek-V4 layer step's attention path (indexer + forward_mqa) on rocm_mla beside vLLM 0.34's own
    # V4 ROCm layer code without aiter (vLLM importable: perf/vllm_on_device.sh on a GPU machine without it).
    "v4_layer": Bench("bench_v4_layer.py", "v4_layer.csv", peer_args=()),
}
CEILING_SHAPES = {"copy": "copy 2 GiB", "matmul": "matmul 8192^3 bf16"}


def command(name: str, out_dir: Path, peers: str, quick: bool) -> list[str]:
    """The child process's command line for benchmark ``name``."""
    b = BENCHES[name]
    extra = [a.format(peers=peers) for a in b.peer_args]
    return [sys.executable, str(HERE / b.script), "--out", str(out_dir), *extra, *(b.quick if quick else b.args)]


def versions(peers: str) -> str:
    """torch/triton versions of this interpreter and those of the peers it can see."""
    import importlib.metadata as md

    import torch
    import triton

    parts = [f"torch={torch.__version__}", f"triton={triton.__version__}"]
    if Path(peers, "vllm").is_dir():  # get_vllm_peers.sh records its version; older folders hold its pin
        recorded = Path(peers, "VLLM_VERSION")
        parts.append(f"vllm={recorded.read_text().strip() if recorded.is_file() else '0.33.0'}")
    try:
        parts.append(f"flashinfer={md.version('flashinfer-python')}")
    except md.PackageNotFoundError:
        pass
    sparse = Path(peers, "vllm_sparse", "VLLM_VERSION")  # get_vllm_sparse_peers.sh
    if sparse.is_file():
        parts.append(f"vllm-sparse={sparse.read_text().strip()}")
    aiter = Path(peers, "aiter", "AITER_VERSION")
    if aiter.is_file():
        parts.append(f"aiter={aiter.read_text().strip()}")
    return " ".join(parts)


def git_commit() -> str:
    """Short commit of the tree the benchmarks ran from, "-dirty" when it has local changes; "" outside git."""
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True, check=True).stdout  # noqa: E731
        sha = run("rev-parse", "--short=12", "HEAD").strip()
        return sha + ("-dirty" if run("status", "--porcelain", "--untracked-files=no").strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return ""


def convert(bench_csv: Path, name: str, date: str, vers: str, commit: str) -> list[dict]:
    """A benchmark's own CSV (kernel, provider, shape, metric, value, device, version[, config]) as
    results-file rows; its copy/matmul rows become kernel "ceiling" with ``config`` = ``name``."""
    rows = []
    with bench_csv.open(newline="") as f:
        for r in csv.DictReader(f):
            kernel, shape, config = r["kernel"], r["shape"], r.get("config", "")
            if kernel in CEILING_SHAPES:
                kernel, shape, config = "ceiling", CEILING_SHAPES[kernel], name
            rows.append(
                dict(
                    kernel=kernel,
                    provider=r["provider"],
                    shape=shape,
                    metric=r["metric"],
                    value=r["value"],
                    device=r["device"],
                    versions=vers,
                    commit=commit,
                    config=config,
                    date=date,
                )
            )
    return rows


def run_one(name: str, i: int, n: int, args, logs: Path, vers: str, commit: str) -> tuple[str, list[dict]]:
    """Run one benchmark; its status ("ok", "FAILED (rc)", "timeout", "WRONG output") and its rows."""
    out_dir = logs / name
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = command(name, out_dir, args.peers, args.quick)
    log = logs / f"{name}.log"
    print(f"[{i}/{n}] {name}: {' '.join(cmd[1:])}", flush=True)
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes")
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
    text = log.read_text(errors="replace")
    wrong = [line.strip() for line in text.splitlines() if "WRONG" in line or "DISAGREE" in line]
    status = "timeout" if rc is None else (f"FAILED ({rc})" if rc else ("WRONG output" if wrong else "ok"))
    rows = []
    if status == "ok":
        produced = out_dir / BENCHES[name].csv
        if produced.is_file():
            rows = convert(produced, name, date, vers, commit)
        else:
            status = f"FAILED (no {produced.name})"
    print(f"      {status} in {time.perf_counter() - t0:.0f} s, {len(rows)} rows; log {log}", flush=True)
    for line in wrong[:5]:
        print(f"      {line}")
    if status not in ("ok", "WRONG output"):
        print("      " + "\n      ".join(text.splitlines()[-5:]))
    return status, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(BENCHES), help="comma-separated subset of " + ",".join(BENCHES))
    ap.add_argument("--quick", action="store_true", help="each benchmark's quick shape set")
    ap.add_argument("--peers", default=".peers", help="the peers folder (perf/peers/*.sh make it)")
    ap.add_argument("--out", default=str(resultsfile.DEFAULT_PATH), help="the results CSV to append to")
    ap.add_argument("--logs", default="", help="folder for each benchmark's log and own CSV (default: a temp dir)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per benchmark")
    ap.add_argument("--list", action="store_true", help="print each benchmark's command and exit")
    ap.add_argument(
        "--commit",
        default="",
        help="the commit to record (default: the tree's own, from git); name it where the tree is a "
        "copy whose .git does not follow its files (a GPU machine's working-tree copy)",
    )
    ap.add_argument(
        "--merge", metavar="FILE", help="append the rows of another results file (a GPU machine's) to --out and exit"
    )
    args = ap.parse_args(argv)
    if args.merge:
        rows = resultsfile.read(args.merge)
        resultsfile.append(args.out, rows)
        print(f"appended {len(rows)} rows of {args.merge} to {args.out}")
        return 0
    names = [n.strip() for n in args.ops.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHES]
    if unknown or not names:
        ap.error(f"--ops: expected names from {', '.join(BENCHES)}, got {', '.join(unknown) or 'none'}")
    if args.list:
        for n in names:
            print(f"{n}: {' '.join(command(n, Path(args.logs or 'LOGS') / n, args.peers, args.quick)[1:])}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("perf/bench.py: needs a GPU (torch sees none); nothing was run")
        return 2
    logs = Path(args.logs or tempfile.mkdtemp(prefix="rocm_mla_bench_"))
    vers, commit = versions(args.peers), args.commit or git_commit()
    print(f"{torch.cuda.get_device_name()}; {vers}; commit {commit or '?'}; logs in {logs}", flush=True)
    t_all = time.perf_counter()
    status, new_rows = {}, []
    for i, name in enumerate(names, 1):
        status[name], rows = run_one(name, i, len(names), args, logs, vers, commit)
        if rows:
            resultsfile.append(args.out, rows)
            new_rows += rows
    ok = sum(s == "ok" for s in status.values())
    took = time.perf_counter() - t_all
    print(f"\n{ok}/{len(status)} benchmarks ok in {took:.0f} s; {len(new_rows)} rows -> {args.out}")
    for name, s in status.items():
        if s != "ok":
            print(f"  {name}: {s} (see {logs / (name + '.log')})")
    for view in report.VIEWS:
        lines, _ = report.op_section(new_rows, view)
        print("\n".join(line for line in lines if line.startswith(("##", "|", "- run"))), end="\n\n" if lines else "")
    return 0 if ok == len(status) else 1


if __name__ == "__main__":
    sys.exit(main())
