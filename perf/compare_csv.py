#!/usr/bin/env python3
"""Side by side of two benchmark CSVs (the long format every perf/bench_*.py and perf/guard_cost.py
writes, and perf/results.csv extends): per kernel, provider and shape, the time of A, the time of B
and B / A. Shows what a change costs when both CSVs come from one GPU machine in one sitting (e.g.
the tree before and after a change, each run with --logs into its own folder).

    python perf/compare_csv.py A.csv B.csv [--metric time_us] [--label-a before] [--label-b after]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys


def load(path: str, metric: str) -> dict[tuple[str, str, str], float]:
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["metric"] == metric:
                out[(row["kernel"], row["provider"], row["shape"])] = float(row["value"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--metric", default="time_us")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    args = ap.parse_args()
    a, b = load(args.a, args.metric), load(args.b, args.metric)
    keys = [k for k in a if k in b]
    if not keys:
        print(f"no common (kernel, provider, shape) rows with metric {args.metric!r}")
        return 1
    w = max(len(f"{k[0]} {k[1]} {k[2]}") for k in keys)
    print(f"{'kernel provider shape'.ljust(w)}  {args.label_a:>10}  {args.label_b:>10}  {args.label_b}/{args.label_a}")
    ratios = []
    for k in keys:
        r = b[k] / a[k] if a[k] else math.nan
        ratios.append(r)
        print(f"{f'{k[0]} {k[1]} {k[2]}'.ljust(w)}  {a[k]:10.2f}  {b[k]:10.2f}  {r:.3f}")
    good = [r for r in ratios if r == r and r > 0]
    if good:
        geo = math.exp(sum(math.log(r) for r in good) / len(good))
        print(
            f"geometric mean {args.label_b}/{args.label_a}: {geo:.3f} over {len(good)} rows; "
            f"max {max(good):.3f}, min {min(good):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
