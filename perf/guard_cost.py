"""What the bound guards cost: the same kernels timed from several source trees, in one run.

    python perf/guard_cost.py --unguarded-copy .guard_off          # this tree with the guards cut out
    python perf/guard_cost.py --tree off=.guard_off --tree on=. [--rounds 3] [--out DIR] [--case TEXT ...]

Each ``--tree NAME=PATH`` is a checkout of this repository (e.g. ``git archive COMMIT | tar -x -C
.guard_base``: a tree before a change). Every (round, tree) runs in its own process with
``PYTHONPATH=PATH`` and its own extension and Triton caches (``$TMPDIR/rocm_mla_guard_cost/NAME``), so each tree's HIP
extension and Triton kernels are built from its own sources; the trees take turns within each round
(the order rotates), so clock and thermal drift fall on all of them alike. The timer and the inputs
are this script's, identical for every tree; only the package differs. Each timed output is checked
against the tree's own reference backend (``backend="reference"``) on the same inputs.

``--unguarded-copy DIR`` writes a copy of this checkout (tracked and untracked files, not ignored ones)
with the bound guards of the timed kernels removed by exact text edits (each must match, so a
changed kernel fails here instead of silently keeping its guard): the HIP and Triton RoPE + KV write
go back to "slot < 0 skips, any position is read" (with 64-bit cos/sin row offsets: nothing bounds the
row), mla_decode drops its block-table check. Timed beside this tree, that isolates the guards' cost
from every other change.

Cases: ``fused_rope_mla_kv_write`` at T=32768 (HIP and Triton, bf16 and FP8 caches) and
``mla_decode`` at B=128, seq 4096 (bf16 N=16 / N=128, FP8 N=16): the shapes large enough to read a
1% difference (smaller ones move more than that between runs of one tree). Prints per-case medians
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

ROPE_CASES = [
    (32768, 16, "bf16", "hip"),
    (32768, 128, "bf16", "hip"),
    (32768, 16, "fp8", "hip"),
    (32768, 128, "fp8", "hip"),
    (32768, 16, "bf16", "triton"),
    (32768, 128, "bf16", "triton"),
]
DECODE_CASES = [(128, 4096, 16, "bf16"), (128, 4096, 128, "bf16"), (128, 4096, 16, "fp8")]
BLOCK = 64


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


def _close(torch, got, want, what: str, atol: float, rtol: float) -> None:
    got, want = got.float(), want.float()
    if not torch.allclose(got, want, atol=atol, rtol=rtol, equal_nan=True):
        err = (got - want).abs().nan_to_num(float("inf")).max().item()
        raise SystemExit(f"{what}: output differs from the tree's reference (max abs err {err:.3g})")


def worker(timed: bool, ops: list[str], cases: list[str]) -> dict:
    """Run the cases of ``ops`` whose label contains one of ``cases`` (all when empty) with the
    rocm_mla on sys.path; return {case: us} (0 when not timed)."""
    import torch

    import rocm_mla
    from rocm_mla.ops import fused_rope_mla_kv_write, mla_decode

    dev = "cuda"
    fp8 = torch.float8_e4m3fn
    out: dict[str, float] = {"_package": rocm_mla.__file__}
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=dev, generator=gen, dtype=torch.float32).to(dtype)

    def wanted(label: str) -> bool:
        return not cases or any(c in label for c in cases)

    for T, N, cache, impl in ROPE_CASES if "rope" in ops else []:
        label = f"rope {impl} T={T} N={N} {cache}"
        if not wanted(label):
            continue
        copies = 2
        blocks = T // BLOCK
        sets = []
        for _ in range(copies):
            qp, kp, kc = rnd(T, N, 64), rnd(T, 64), rnd(T, 512)
            pos = torch.randint(0, 8192, (T,), device=dev, generator=gen)
            slots = torch.randperm(blocks * BLOCK, device=dev, generator=gen)[:T]
            kv = torch.zeros(blocks, BLOCK, 576, device=dev, dtype=torch.uint8 if cache == "fp8" else torch.bfloat16)
            sets.append((pos, qp, kp, kc, kv, slots))
        cs = rnd(8192, 64, dtype=torch.float32)
        ks = torch.tensor([0.05], device=dev)
        kw = dict(is_neox=False, backend=impl)
        if cache == "fp8":
            kw.update(kv_cache_dtype="fp8", k_scale=ks)
        # Check first, on copies of set 0 (the op works in place).
        pos, qp, kp, kc, kv, slots = sets[0]
        got = [x.clone() for x in (qp, kp, kv)]
        fused_rope_mla_kv_write(pos, got[0], got[1], kc, cs, got[2], slots, **kw)
        ref = [x.clone() for x in (qp, kp, kv)]
        fused_rope_mla_kv_write(pos, ref[0], ref[1], kc, cs, ref[2], slots, **{**kw, "backend": "reference"})
        for g_, r_, name in zip(got[:2], ref[:2], ("q_pe", "k_pe")):
            _close(torch, g_, r_, f"{label} {name}", 2e-2, 2e-2)
        if cache == "fp8":
            _close(torch, got[2].view(fp8).float(), ref[2].view(fp8).float(), f"{label} kv_cache", 0.0625, 0.13)
        else:
            _close(torch, got[2], ref[2], f"{label} kv_cache", 2e-2, 2e-2)

        def call(i, sets=sets, kw=kw):
            p_, q_, k_, c_, kv_, s_ = sets[i]
            fused_rope_mla_kv_write(p_, q_, k_, c_, cs, kv_, s_, **kw)

        out[label] = _time_graph_us(torch, call, copies) if timed else 0.0
        del sets
        torch.cuda.empty_cache()

    for B, S, N, cache in DECODE_CASES if "decode" in ops else []:
        label = f"decode B={B} seq={S} N={N} {cache}"
        if not wanted(label):
            continue
        pages = B * S // BLOCK
        copies = 2
        sets = []
        for _ in range(copies):
            qn, qpe = rnd(B, N, 512), rnd(B, N, 64)
            kv = rnd(pages, BLOCK, 576)
            if cache == "fp8":
                kv = (kv * 4).to(fp8).view(torch.uint8)
            table = torch.randperm(pages, device=dev, generator=gen).view(B, S // BLOCK).to(torch.int32)
            seq = torch.full((B,), S, device=dev, dtype=torch.int32)
            o = torch.empty(B, N, 512, device=dev, dtype=torch.bfloat16)
            lse = torch.empty(B, N, device=dev, dtype=torch.float32)
            sets.append((qn, qpe, kv, table, seq, o, lse))
        kw = dict(sm_scale=576**-0.5, max_seq_len=S)
        if cache == "fp8":
            kw.update(kv_cache_dtype="fp8", k_scale=torch.tensor([0.25], device=dev))
        qn, qpe, kv, table, seq, o, lse = sets[0]
        mla_decode(qn, qpe, kv, table, seq, out=o, lse=lse, **kw)
        ro, rl = mla_decode(qn, qpe, kv, table, seq, backend="reference", **kw)
        _close(torch, o, ro, f"{label} out", 2e-2, 2e-2)
        _close(torch, lse, rl, f"{label} lse", 1e-3, 1e-3)

        def call(i, sets=sets, kw=kw):
            qn_, qpe_, kv_, t_, s_, o_, l_ = sets[i]
            mla_decode(qn_, qpe_, kv_, t_, s_, out=o_, lse=l_, **kw)

        out[label] = _time_graph_us(torch, call, copies) if timed else 0.0
        del sets
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
        "rocm_mla/kernels/mla_decode.py",
        "        LATE: tl.constexpr = CLAMP_PAGES and PAGE_MODE == 2\n",
        "        LATE: tl.constexpr = False\n",
    ),
    (
        "rocm_mla/kernels/mla_decode.py",
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
    ap.add_argument("--ops", default="rope,decode", help="which ops' cases to time (comma-separated: rope, decode)")
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
    unknown = set(a.ops.split(",")) - {"rope", "decode"}
    if unknown:
        ap.error(f"--ops: expected rope and/or decode, got {', '.join(sorted(unknown))}")
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
        from rocm_mla.tools.benchutil import Record, device_name, write_csv

        dev = device_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        records = []
        for case, n, us in rows:
            kernel, shape = case.split(" ", 1)
            records.append(Record(kernel, n, shape, "time_us", us, dev, n))
        write_csv(Path(a.out) / "guard_cost.csv", records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
