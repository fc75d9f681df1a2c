"""What the bound guards cost: the same kernels timed from several source trees, in one run.

    python perf/guard_cost.py --unguarded-copy .guard_off          # this tree with the guards cut out
    python perf/guard_cost.py --tree off=.guard_off --tree on=. [--rounds 3] [--out DIR] [--case TEXT ...]

Each ``--tree NAME=PATH`` is a checkout of this repository (e.g. ``git archive COMMIT | tar -x -C
.guard_base``: a tree before a change). Every (round, tree) runs in its own process with
``PYTHONPATH=PATH`` and its own extension and Triton caches (``$TMPDIR/rocm_mla_guard_cost/NAME``), so each tree's HIP
extension and Triton kernels are built from its own sources; the trees take turns within each round
(the order rotates), so clock and thermal drift fall on all of them alike. The timer is this
script's, identical for every tree; the inputs and their check are each tree's rocm_mla.cases
(decode and rope_kv_write ``SHAPES["guard"]``, ``make_inputs``, ``mismatch``: the same seeds, shapes
and layouts in every tree that has them), so a tree must hold rocm_mla.cases. Each timed output is
checked against the float32 reference before it is timed.

``--unguarded-copy DIR`` writes a copy of this checkout (tracked and untracked files, not ignored ones)
with the bound guards of the timed kernels removed by exact text edits (each must match, so a
changed kernel fails here instead of silently keeping its guard): the HIP and Triton RoPE + KV write
go back to "slot < 0 skips, any position is read" (with 64-bit cos/sin row offsets: nothing bounds the
row), mla_decode drops its block-table check. Timed beside this tree, that isolates the guards' cost
from every other change.

Cases: ``fused_rope_mla_kv_write`` at T=32768 (HIP: bf16 and FP8 caches, Triton: bf16) and
``mla_decode`` at B=128, seq 4096 (bf16 N=16 / N=128, FP8 N=16), in vLLM's layouts (q_pe a slice of
q [T, N, 192], k_pe of kv_a [T, 576]; decode's q as the W_UK bmm leaves it): the shapes large enough to read a
1% difference (smaller ones move more than that between runs of one tree). ``--ops prefill``:
``mla_prefill`` at ``cases.prefill.SHAPES["quick"]`` (bf16, 4 x 4096 causal, N=16 / N=128), whose
cu_seqlens check is timed against a tree from before it (``--tree base=...``: --unguarded-copy
does not cut it). Prints per-case medians
over the rounds and each tree's cost against the first; writes guard_cost.csv (long format).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROPE_IMPLS = {"hip": ("auto", "fp8"), "triton": ("auto",)}  # backend -> the cache kinds it is timed with
COPIES = 2  # input sets a graph rotates over (together larger than L2)


def _time_graph_us(torch, call, copies: int, calls_per_graph: int = 8, replays: int = 15) -> float:
    """Median per-call GPU time of a CUDA graph holding ``calls_per_graph`` calls that rotate over
    (this script's own timer, not benchutil's: it must be the same for every tree, old ones included)
    ``copies`` input sets (together larger than L2, so each call reads HBM)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(min(copies, 2)):
            call(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for k in range(calls_per_graph):
            call(k % copies)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls_per_graph)
    return statistics.median(times)


def worker(timed: bool, ops: list[str], cases: list[str]) -> dict:
    """Run the cases of ``ops`` whose label contains one of ``cases`` (all when empty) with the
    rocm_mla on sys.path; return {case: us} (0 when not timed)."""
    import torch

    import rocm_mla
    from rocm_mla.cases import decode, rope_kv_write

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: an untimed check only
    bf16 = torch.bfloat16
    out: dict[str, float] = {"_package": rocm_mla.__file__}

    def wanted(label: str) -> bool:
        return not cases or any(c in label for c in cases)

    for impl, kinds in ROPE_IMPLS.items() if "rope" in ops else []:
        for shape in rope_kv_write.SHAPES["guard"]:
            label = f"rope {impl} {shape.label(bf16)}"
            if shape.kv not in kinds or not wanted(label):
                continue
            sets = rope_kv_write.make_copies(shape, COPIES, dtype=bf16, device=dev)
            # Check first, on set 0's untouched inputs (the op works in place).
            sets[0].run(backend=impl)
            bad = sets[0].mismatch()
            if bad:
                raise SystemExit(f"{label}: {bad}")

            def call(i, sets=sets, impl=impl):
                sets[i].run(backend=impl)

            out[label] = _time_graph_us(torch, call, COPIES) if timed else 0.0
            del sets
            torch.cuda.empty_cache()

    for shape in decode.SHAPES["guard"] if "decode" in ops else []:
        label = f"decode B={shape.B} seq={shape.seq} N={shape.N} {'fp8' if shape.fp8 else 'bf16'}"
        if not wanted(label):
            continue
        case = decode.make_inputs(shape, dtype=bf16, device=dev, copies=COPIES, spare_cols=0)
        case.run(0, max_seq_len=shape.seq)
        bad = case.mismatch()
        if bad:
            raise SystemExit(f"{label}: {bad}")

        def call(i, case=case, seq=shape.seq):
            case.run(i, max_seq_len=seq)

        out[label] = _time_graph_us(torch, call, COPIES) if timed else 0.0
        del case
        torch.cuda.empty_cache()

    # mla_prefill's per-sequence cu_seqlens check (time it against a tree from before it: --tree).
    from rocm_mla.cases import prefill

    for shape in prefill.SHAPES["quick"] if "prefill" in ops else []:
        label = f"prefill {shape.label}"
        if not wanted(label):
            continue
        pcase = prefill.make_inputs(shape, dtype=bf16, device=dev)
        pcase.run()
        bad = pcase.mismatch()
        if bad:
            raise SystemExit(f"{label}: {bad}")

        def pcall(i, pcase=pcase):
            pcase.run()

        out[label] = _time_graph_us(torch, pcall, 1) if timed else 0.0
        del pcase
        torch.cuda.empty_cache()
    return out


# (file, old text, new text): the guards of the timed kernels, cut out (for measurement only).
UNGUARD = [
    ("hip_src/kernels/rope_kv_write.cuh", "if (!in_range(slot, p.num_slots)) continue;", "if (slot < 0) continue;"),
    (
        "hip_src/kernels/rope_kv_write.cuh",
        "const bool cached = in_range(slot, p.num_slots);",
        "const bool cached = slot >= 0;",
    ),
    ("hip_src/kernels/rope_kv_write.cuh", "const bool pos_ok = in_range(pos, p.max_pos);", "const bool pos_ok = true;"),
    (
        "hip_src/kernels/rope_kv_write.cuh",
        "const uint32_t cs_off = static_cast<uint32_t>(pos) * static_cast<uint32_t>(p.cs_sp);",
        "const int64_t cs_off = pos * p.cs_sp;",  # 64-bit: unguarded, nothing bounds the row
    ),
    ("rocm_mla/kernels/rope_kv_write.py", "smask = (slot >= 0) & (slot < num_slots)", "smask = slot >= 0"),
    ("rocm_mla/kernels/rope_kv_write.py", "pm = (rmask & pok)[:, None]", "pm = rmask[:, None]"),
    ("rocm_mla/kernels/rope_kv_write.py", "pm = (tmask & pok)[:, None]", "pm = km"),
    (
        "rocm_mla/kernels/rope_kv_write.py",
        "cs = cos_sin + _cs_offset(pos, pok, cs_sp, CS_I64)",
        "cs = cos_sin + pos * cs_sp",  # 64-bit: unguarded, nothing bounds the row
    ),
    # mla_decode: neither form of the page guard (no clamp in the loop, no check before or after it).
    (
        "rocm_mla/kernels/decode.py",
        "        LATE: tl.constexpr = CLAMP_PAGES and PAGE_MODE == 2\n",
        "        LATE: tl.constexpr = False\n",
    ),
    (
        "rocm_mla/kernels/decode.py",
        "            in_head = (first_blk == 0) & (head_blk <= last_blk)\n"
        "            head_bad = in_head & ((head_pages < 0) | (head_pages >= num_pages))\n"
        "            rest_blk = tl.where(first_blk == 0, BLOCK_N, first_blk)\n"
        "            bad_page = tl.max(head_bad.to(tl.int32), axis=0)\n"
        "            bad_page = bad_page | _pages_outside(bt_row, rest_blk, last_blk, num_pages, BLOCK_N)\n"
        "            end = tl.where(bad_page != 0, start, end)\n",
        "            pass\n",
    ),
]


def unguarded_copy(dest: Path) -> None:
    """Copy this checkout to ``dest`` and cut the guards out of it (UNGUARD)."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if dest.exists():
        shutil.rmtree(dest)
    for f in files:
        if (root / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / f, dest / f)
    for f, old, new in UNGUARD:
        text = (dest / f).read_text()
        if text.count(old) == 0:
            raise SystemExit(f"--unguarded-copy: {f} no longer holds {old[:60]!r}: update UNGUARD")
        (dest / f).write_text(text.replace(old, new))
    print(f"wrote {dest}: {len(files)} files, {len(UNGUARD)} guard edits")


def cache_dir(name: str) -> Path:
    """The extension and Triton caches of tree ``name`` (outside the tree: nothing lands in a checkout)."""
    return Path(tempfile.gettempdir()) / "rocm_mla_guard_cost" / name


def run_tree(name: str, path: Path, timed: bool, ops: str, cases: list[str]) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYTHONPATH=str(path.resolve()),
        ROCM_MLA_CACHE=str(cache_dir(name) / "ext"),
        TRITON_CACHE_DIR=str(cache_dir(name) / "triton"),
    )
    args = [sys.executable, str(Path(__file__).resolve()), "--worker", "--ops", ops]
    args += [f"--case={c}" for c in cases] + ([] if timed else ["--untimed"])
    return subprocess.Popen(args, env=env, cwd=str(path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(name: str, p: subprocess.Popen, path: Path) -> dict:
    so, se = p.communicate()
    if p.returncode:
        raise SystemExit(f"tree {name} ({path}) failed:\n{se[-4000:]}")
    res = json.loads(so.strip().splitlines()[-1])
    pkg = Path(res.pop("_package")).resolve()
    if path.resolve() not in pkg.parents:
        raise SystemExit(f"tree {name}: imported rocm_mla from {pkg}, not from {path}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH of a checkout (first = the baseline)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="folder for guard_cost.csv")
    ap.add_argument("--ops", default="rope,decode", help="ops to time: rope, decode, prefill")
    ap.add_argument(
        "--unguarded-copy",
        metavar="DIR",
        default=None,
        help="write this checkout with the guards cut out to DIR, then exit",
    )
    ap.add_argument(
        "--case",
        action="append",
        default=[],
        help="time only the cases whose label contains this text (repeatable), e.g. 'rope triton'",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--untimed", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    unknown = set(a.ops.split(",")) - {"rope", "decode", "prefill"}
    if unknown:
        ap.error(f"--ops: expected rope, decode and/or prefill, got {', '.join(sorted(unknown))}")
    if a.worker:
        print(json.dumps(worker(timed=not a.untimed, ops=a.ops.split(","), cases=a.case)))
        return 0
    if a.unguarded_copy:
        unguarded_copy(Path(a.unguarded_copy))
        return 0
    if len(a.tree) < 2:
        ap.error("give at least two --tree NAME=PATH")
    trees = [(n, Path(p)) for n, p in (t.split("=", 1) for t in a.tree)]
    t0 = time.time()
    # Build and check every tree at once (separate processes, separate caches), untimed.
    procs = [(n, p, run_tree(n, p, timed=False, ops=a.ops, cases=a.case)) for n, p in trees]
    for n, p, proc in procs:
        _result(n, proc, p)
    print(f"[guard_cost] built and checked {len(trees)} trees in {time.time() - t0:.0f} s", flush=True)
    times: dict[str, dict[str, list[float]]] = {n: {} for n, _ in trees}
    for r in range(a.rounds):
        order = trees[r % len(trees) :] + trees[: r % len(trees)]
        for n, p in order:
            for case, us in _result(n, run_tree(n, p, timed=True, ops=a.ops, cases=a.case), p).items():
                times[n].setdefault(case, []).append(us)
        print(f"[guard_cost] round {r + 1}/{a.rounds} done ({time.time() - t0:.0f} s)", flush=True)
    base = trees[0][0]
    names = [n for n, _ in trees]
    head = ["case"] + [f"{n} us (median; rounds)" for n in names] + [f"{n} vs {base}" for n in names[1:]]
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    rows = []
    for case in times[base]:
        med = {n: statistics.median(times[n][case]) for n in names}
        cells = [case] + [f"{med[n]:.1f} ({', '.join(f'{x:.1f}' for x in times[n][case])})" for n in names]
        cells += [f"{100 * (med[n] / med[base] - 1):+.1f}%" for n in names[1:]]
        print("| " + " | ".join(cells) + " |")
        rows += [(case, n, med[n]) for n in names]
    if a.out:
        import torch

        # This process is not timed; it imports this checkout (the trees ran with their own).
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from benchutil import Record, write_csv

        from rocm_mla.tools.timing import device_name

        dev = device_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        records = []
        for case, n, us in rows:
            kernel, shape = case.split(" ", 1)
            records.append(Record(kernel, n, shape, "time_us", us, dev, n))
        write_csv(Path(a.out) / "guard_cost.csv", records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
