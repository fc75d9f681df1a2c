"""The tuning loop: ``Tuner`` plans the groups, times the candidates of each group (with a
progress line and an ETA per candidate), hands the ranked ones to the acceptance rules and stops
at ``--max-minutes`` keeping what was accepted."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rocm_mla import configs as C
from rocm_mla.ops.decode_plan import TIER_DEFAULTS as DECODE_TIER_DEFAULTS

from .acceptance import MIN_GAIN, Acceptance, exc_text, geomean, sync_or_raise
from .groups import (
    Group,
    decode_groups,
    impl_groups,
    indexer_groups,
    point_key,
    prefill_groups,
    sparse_groups,
    v4_groups,
)
from .inputs import CASES, Case
from .overlay import OverlayWriter
from .shapes import ALL_OPS, OP_KEYS, Shape
from .timing import time_case_us

# candidates per group, default included
QUICK_CAP = {"decode": 3, "prefill": 4, "merge": 12, "rope_kv_write": 33, "sparse": 3, "indexer": 4, "v4": 3}


def _fmt_s(sec: float) -> str:
    sec = max(0, int(sec))
    return f"{sec // 60}:{sec % 60:02d}"


class Tuner(Acceptance, OverlayWriter):
    """One tuning run on ``dev``: plans the groups of ``ops`` over ``shapes``, searches each (the
    default, the listed candidates, then neighbours (quick) or one coordinate pass (full)), keeps
    what the acceptance rules pass, and writes the overlay to ``out_path`` after every accepted
    group. ``timer`` (default ``time_case_us``) times one case; ``log`` gets every progress line."""

    def __init__(
        self,
        dev: torch.device,
        ops: list[str],
        shapes: list[Shape],
        *,
        quick: bool,
        max_minutes: float | None,
        max_candidates: int | None,
        out_path: Path,
        argv: list[str],
        log: Callable[[str], None] = lambda s: print(s, flush=True),
        timer: Callable[[Case], float] | None = None,
    ):
        from rocm_mla import _platform

        self.dev, self.ops, self.quick, self.out_path, self.argv, self.log = dev, ops, quick, out_path, argv, log
        self.arch = _platform.device_arch(dev)
        self.cus = C.device_compute_units(self.arch)
        self.shapes = [s for s in shapes if s.op in ops]
        self.max_candidates = max_candidates
        self.timer = timer or time_case_us
        self.t0 = time.monotonic()
        budget = None if max_minutes is None else max_minutes * 60
        self.deadline = None if budget is None else self.t0 + budget
        self.cand_deadline = None if budget is None else self.t0 + budget - min(90.0, max(20.0, 0.15 * budget))
        self.package = {OP_KEYS[o]: C.package_config(OP_KEYS[o], self.arch) for o in ALL_OPS}
        self.current = dict(self.package)
        self.accepted: list[tuple[Group, dict]] = []
        self.rows: dict[str, dict] = {}
        self.groups: list[Group] = []
        self.done = 0
        self.planned = 0
        self._cases: dict[str, Case] = {}
        self.stopped = ""

    # ---- time
    def time_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def out_of_time(self, final: bool = False) -> bool:
        limit = self.deadline if final else self.cand_deadline
        return limit is not None and time.monotonic() >= limit

    # ---- cases
    def case(self, s: Shape) -> Case:
        if s.key not in self._cases:
            self._cases[s.key] = CASES[s.op](s, self.dev)
        return self._cases[s.key]

    def drop_cases(self) -> None:
        self._cases.clear()
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()

    def measure(self, op_key: str, obj: dict, s: Shape, check: bool = True) -> tuple[float | None, str]:
        with C.override(op_key, self.arch, obj):
            try:
                case = self.case(s)
                if check:
                    bad = case.check()
                    if bad:
                        return None, f"WRONG ({bad})"
                return self.timer(case), ""
            except Exception as exc:
                sync_or_raise(self.dev)
                return None, exc_text(exc)

    # ---- groups
    def plan(self) -> None:
        by_op: dict[str, list[Shape]] = {}
        for s in self.shapes:
            by_op.setdefault(s.op, []).append(s)
        for op in ALL_OPS:
            if op not in self.ops or op not in by_op:
                continue
            if op == "decode":
                self.groups += decode_groups(self, by_op[op])
            elif op == "prefill":
                self.groups += prefill_groups(self, by_op[op])
            elif op == "sparse":
                self.groups += sparse_groups(self, by_op[op])
            elif op == "indexer":
                self.groups += indexer_groups(self, by_op[op])
            elif op == "v4":
                self.groups += v4_groups(self, by_op[op])
            else:
                self.groups.append(
                    Group(
                        op,
                        "(implementation chosen when reached)",
                        by_op[op],
                        {},
                        [],
                        [],
                        lambda p: None,
                        str,
                        impl_pending=True,
                    )
                )
        self.planned = sum(self.count(g) for g in self.groups)

    def cap(self, g: Group) -> int:
        if self.max_candidates:
            return self.max_candidates
        return QUICK_CAP[g.op] if self.quick else 10**9

    def count(self, g: Group) -> int:
        n = 1 + len(g.listed) + sum(len(v) - 1 for _, v in g.knobs)
        if g.impl_pending:  # not known before the implementation is chosen: a guess for the ETA
            obj = self.package[g.op_key]
            order = obj["backend_order"] if self.dev.type == "cuda" else ["triton"]
            n = 1 + len((obj["hip"] if order[0] == "hip" else obj)["candidates"])
        return min(n, self.cap(g))

    @staticmethod
    def neighbours(g: Group) -> list[dict]:
        """Single-knob changes of the default, one value of each knob before the next value of any."""
        alts = [(k, [v for v in vs if v != g.point0.get(k, DECODE_TIER_DEFAULTS.get(k))]) for k, vs in g.knobs]
        out = []
        for r in range(max((len(a) for _, a in alts), default=0)):
            out += [g.fix({**g.point0, k: a[r]}) for k, a in alts if r < len(a)]
        return out

    def evaluate(self, g: Group, p: dict, idx: int) -> dict:
        k = point_key(p)
        if k in g.results:
            return g.results[k]
        r = {"point": p, "times": {}, "error": ""}
        g.results[k] = r
        obj = g.build(p)
        if obj is None:
            r["error"] = "not expressible in the tier schema"
        else:
            for s in g.shapes:
                us, err = self.measure(g.op_key, obj, s)
                if err:
                    r["error"] = f"{s.label}: {err}"
                    break
                r["times"][s.key] = us
        self.done += 1
        self.progress(g, p, r, idx)
        return r

    def progress(self, g: Group, p: dict, r: dict, idx: int) -> None:
        el = time.monotonic() - self.t0
        plan = max(self.planned, self.done)
        eta = el / self.done * (plan - self.done) if self.done else 0.0
        if self.deadline is not None:
            eta = min(eta, max(0.0, self.deadline - time.monotonic()))
        width = 20
        fill = int(width * self.done / plan) if plan else width
        bar = "#" * fill + "." * (width - fill)
        d0 = g.results.get(point_key(g.point0), {}).get("times", {})
        if r["error"]:
            res = f"FAILED {r['error'][:160]}"
        else:
            ts = "/".join(f"{v:.1f}" for v in r["times"].values())
            rel = ""
            if d0 and len(d0) == len(r["times"]) and point_key(p) != point_key(g.point0):
                rel = f" ({geomean(d0[k] / r['times'][k] for k in d0):.3f}x the default's speed)"
            res = f"{ts} us{rel}"
        tag = "default" if point_key(p) == point_key(g.point0) else f"#{idx}"
        self.log(
            f"[{self.done:3d}/{plan:3d} {bar} {_fmt_s(el)} elapsed, ETA {_fmt_s(eta)}] {g.op} {g.name} "
            f"{tag} {g.label(p)}: {res}"
        )

    def search(self, g: Group) -> list[dict]:
        """Time the default, the listed candidates and (full mode) one coordinate pass; the points
        that beat the default by MIN_GAIN, best first."""
        r0 = self.evaluate(g, g.point0, 0)
        if r0["error"]:
            g.status = f"not tuned: the default fails ({r0['error'][:200]})"
            for s in g.shapes:
                self.rows.setdefault(
                    s.key,
                    {
                        "op": g.op_key,
                        "shape": s.key,
                        "default_us": 0.0,
                        "tuned_us": 0.0,
                        "config": "default",
                        "note": "default failed",
                    },
                )
            return []
        cap = self.cap(g)
        idx = 0
        for p in g.listed:
            if len(g.results) >= cap or self.out_of_time():
                break
            idx += 1
            self.evaluate(g, p, idx)
        if self.quick:  # then single-knob neighbours of the default, while the cap allows
            for p in self.neighbours(g):
                if len(g.results) >= cap or self.out_of_time():
                    break
                if point_key(p) not in g.results:
                    idx += 1
                    self.evaluate(g, p, idx)
        else:
            for knob, values in g.knobs:
                base = self.best(g)
                for v in values:
                    if len(g.results) >= cap or self.out_of_time():
                        break
                    p = g.fix({**base, knob: v})
                    if base.get(knob, DECODE_TIER_DEFAULTS.get(knob)) == v or point_key(p) in g.results:
                        continue
                    idx += 1
                    self.evaluate(g, p, idx)
        ranked = sorted(
            (
                (sc, i, r["point"])
                for i, r in enumerate(g.results.values())
                for sc in [self.score(g, r)]
                if sc is not None and sc <= 1 - MIN_GAIN
            ),
            key=lambda x: (x[0], x[1]),
        )
        return [p for _, _, p in ranked]

    def resolve_impl_group(self, g: Group) -> list[Group]:
        if not g.impl_pending:
            return [g]
        new = impl_groups(self, g.op, g.shapes)
        self.planned += sum(self.count(x) for x in new) - self.count(g)
        return new

    def run(self) -> dict:
        self.log(
            f"rocm-mla tune on {self.device_name()} ({self.arch}, {self.cus or '-'} CUs/SMs), "
            f"{'quick' if self.quick else 'full'} mode, {len(self.shapes)} shapes; overlay -> {self.out_path}"
        )
        if self.dev.type != "cuda":
            self.log(
                "CPU run (Triton interpreter): the times below are interpreter wall times and mean nothing "
                "about any GPU; this mode tests the tuner"
            )
        build = self.start_hip_build()
        self.plan()
        self.log(
            f"{len(self.groups)} groups, about {self.planned} candidates"
            + (f"; stops at {self.deadline - self.t0:.0f} s" if self.deadline else "")
        )
        with C.overlays_disabled():
            queue = list(self.groups)
            self.groups = []
            op_done: set[str] = set()
            while queue:
                head = queue.pop(0)
                if head.impl_pending and build is not None:
                    t = time.monotonic()
                    build.join()
                    build = None
                    if time.monotonic() - t > 1:
                        self.log(f"(waited {time.monotonic() - t:.0f} s for the HIP extension build)")
                for g in [head] if self.out_of_time() else self.resolve_impl_group(head):
                    self.groups.append(g)
                    if self.out_of_time():
                        g.status = "not tuned (--max-minutes)"
                        self.stopped = "--max-minutes reached"
                        continue
                    self.log(f"== {g.op} {g.name}: {len(g.shapes)} shape(s): {'; '.join(s.label for s in g.shapes)}")
                    ranked = self.search(g)
                    self.accept(g, ranked)
                    self.drop_cases()
                if not any(x.op == head.op for x in queue) and head.op not in op_done:
                    op_done.add(head.op)
                    self.final_pass(head.op)
                    self.drop_cases()
        data = self.write()
        C.reload_overlays()
        return data

    def start_hip_build(self):
        if self.dev.type != "cuda" or not ({"merge", "rope_kv_write"} & set(self.ops)):
            return None
        from rocm_mla import _ext

        if getattr(_ext, "is_loaded", lambda: False)():
            return None
        th = threading.Thread(target=_ext.load, name="hip-build", daemon=True)
        th.start()
        return th

    def device_name(self) -> str:
        from rocm_mla.tools.timing import device_name

        return device_name(self.dev)
