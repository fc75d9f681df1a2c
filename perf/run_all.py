#!/usr/bin/env python3
"""Run every micro-benchmark (and the layer-step benchmark) into one results folder.

    python perf/run_all.py [--out results/YYYY-MM-DD] [--quick] [--only merge,decode] [--timeout 600]

Each benchmark writes its table to <out>/<name>.log and its long-format CSV and PNG plots to <out>;
a progress line is printed per benchmark (with elapsed time), then a summary. Needs a GPU; vLLM's
Triton kernels as peers come from ../shared/peers/get_vllm_peers.sh .peers. FlashInfer (the decode
peer) must be importable: on the lent GPU machine run this script through `perf/device_run.sh`,
which unpacks the carried copy first:
    BENCH_TIMEOUT=900 bash perf/device_run.sh --no-tests run_all[:--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = {  # name: (script, extra args in --quick mode)
    "merge": ("bench_merge.py", ["--quick"]),
    "rope_kv_write": ("bench_rope_kv_write.py", ["--quick"]),
    "decode": ("bench_decode.py", ["--quick"]),
    "prefill": ("bench_prefill.py", ["--quick"]),
    "layer": ("bench_layer.py", ["--quick"]),
}
ALIASES = {"rope_kv": "rope_kv_write"}  # --only: the former name of the rope_kv_write benchmark


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=f"results/{dt.date.today().isoformat()}", help="results folder")
    ap.add_argument("--quick", action="store_true", help="each benchmark's --quick shapes")
    ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(BENCHES))
    ap.add_argument("--timeout", type=int, default=900, help="seconds per benchmark")
    args = ap.parse_args(argv)
    names = [ALIASES.get(n, n) for n in args.only.split(",") if n] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        ap.error(f"--only: expected names from {', '.join(BENCHES)}, got {', '.join(unknown)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    status = {}
    t_all = time.perf_counter()
    for i, name in enumerate(names, 1):
        script, quick = BENCHES[name]
        cmd = [sys.executable, str(HERE / script), "--out", str(out), *(quick if args.quick else [])]
        print(f"[{i}/{len(names)}] {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        with open(out / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        status[name] = rc
        print(
            f"      {'ok' if rc == 0 else f'FAILED ({rc})'} in {time.perf_counter() - t0:.0f} s; "
            f"table in {out / (name + '.log')}",
            flush=True,
        )
    print(
        f"\n{sum(v == 0 for v in status.values())}/{len(status)} benchmarks ok in "
        f"{time.perf_counter() - t_all:.0f} s; results in {out}"
    )
    for name, rc in status.items():
        if rc != 0:
            print(f"  {name}: {rc} (see {out / (name + '.log')})")
    return 0 if all(v == 0 for v in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
