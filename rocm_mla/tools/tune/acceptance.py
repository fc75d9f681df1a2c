"""What a candidate must pass to be kept: at least MIN_GAIN faster than the default over its group
(geometric mean) with no shape more than IN_LOOP_SLACK slower while searching; then, timed again
back to back with the default (ROUNDS alternating rounds, median), slower on no shape; then every
config it changes compiles and matches the float32 reference (``verify``, also ``--check``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import triton

from rocm_mla import configs as C
from rocm_mla.cases import decode, indexer_topk, merge, prefill, rope_kv_write, sparse, v4_attention
from rocm_mla.ops.decode_plan import tier_config as decode_tier_config
from rocm_mla.ops.sparse_plan import tier_config
from rocm_mla.ops.v4_attention_plan import tier_config as v4_tier_config

from . import inputs
from .groups import COMBOS, Group, full_stage1, point_key
from .shapes import OP_KEYS, Shape

MIN_GAIN = 0.01  # a winner beats the default by >= 1% (geomean over its group's shapes)
IN_LOOP_SLACK = 0.02  # while searching: no shape more than 2% slower (noise); the re-time is strict
ROUNDS = 3  # back-to-back re-time: default and winner alternately, median of each


def geomean(vals) -> float:
    """Geometric mean (1.0 of nothing)."""
    vals = list(vals)
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else 1.0


def exc_text(exc: BaseException) -> str:
    """An exception in one line: its type, first and last lines of its message, 300 characters."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if len(lines) > 1:
        text += " ... " + lines[-1]
    return f"{type(exc).__name__}: {text[:300]}"


def sync_or_raise(dev: torch.device) -> None:
    """After a failed call: a sticky device error (the context is gone) ends the run."""
    if dev.type == "cuda":
        torch.cuda.synchronize()


# The indexer's verification set: its cases' "verify" shapes on a GPU (topk 2048, several splits,
# prefill rows, odd lengths, the prefiltered form); in the CPU interpreter, where those take about a minute a call, the
# "selfcheck" set (odd lengths, prefill rows, several splits of the interpreter's configs).
INDEXER_VERIFY = {"cuda": "verify", "cpu": "selfcheck"}
# mla_v4_attention's verification shape: the first CSA layer of its cases' "selfcheck" set on a GPU
# (two requests, MTP rows, top-512 with holes), of its "tiny" set in the interpreter; its H is
# the tier's BLOCK_H (one head block: the tier's own config).
V4_VERIFY = {"cuda": "selfcheck", "cpu": "tiny"}


def v4_verify_shape(dev: torch.device) -> v4_attention.V4Shape:
    """The CSA shape mla_v4_attention's changed configs are verified on, on ``dev`` (V4_VERIFY)."""
    return next(s for s in v4_attention.SHAPES[V4_VERIFY.get(dev.type, "selfcheck")] if s.kind == "csa")


def indexer_one_split(shape: indexer_topk.IndexerShape) -> indexer_topk.IndexerShape:
    """``shape`` with every request cut to its first topk_p2 keys (whole pages): one split under
    any config (split_keys >= topk_p2), the form whose split writes out itself (``direct``)."""
    cap = triton.next_power_of_2(shape.topk)
    cap = max(shape.block, cap // shape.block * shape.block)
    lens = tuple(min(n, cap) for n in shape.lens)
    return dataclasses.replace(shape, lens=lens, rows=tuple(min(r, n) for r, n in zip(shape.rows, lens)))


def _dtypes(dev) -> list[torch.dtype]:
    """The q dtypes verified on ``dev`` (bf16 only on a GPU: the interpreter's bf16 dots are wrong)."""
    return ([torch.bfloat16] if dev.type == "cuda" else []) + [torch.float16, torch.float32]


def verification_cases(
    op_key: str, arch: str, dev: torch.device, old: dict, new: dict
) -> list[tuple[str, Callable[[], str]]]:
    """(what, check) for every launch config of ``new`` that differs from ``old`` (both complete
    arch objects of ``op_key``): small calls through the public op on the ``verify`` shapes of
    ``rocm_mla.cases`` (uneven lengths, a short page, lq != lk, both merge head sizes) against the
    float32 reference (the indexer: a valid top-k of float64 logits, on ``INDEXER_VERIFY``'s set
    and its one-split form; mla_v4_attention: ``v4_verify_shape`` over fp8_ds_mla and q-dtype
    caches)."""
    from rocm_mla.ops._dispatch import unavailable

    where = f"{op_key}.{arch}"
    out: list[tuple[str, Callable[[], str]]] = []
    general = any(new.get(k) != old.get(k) for k in set(new) | set(old) if k not in ("candidates", "tiers"))
    if op_key == "mla_decode":
        fp8_kind = {"fp8": C.platform_fp8_dtype(arch)}
        base = decode.SHAPES["verify"][0]

        def check(qdt, fp8: bool, n: int, splits):
            # the tier's BLOCK_H as the head count: one head block, the tier's own config
            shape = dataclasses.replace(base, N=n, kv="fp8" if fp8 else "auto")
            return lambda: inputs.verify_call("decode", shape, dev, qdt, fp8_kind, num_splits=splits)

        tiers, old_tiers = new["tiers"], old.get("tiers", [])
        for ti, tier in enumerate(tiers):
            for qdt, fp8 in COMBOS:
                if qdt not in _dtypes(dev):
                    continue
                cfg = decode_tier_config(arch, 0, qdt, fp8, tier)
                same = (
                    ti < len(old_tiers)
                    and len(tiers) == len(old_tiers)
                    and full_stage1(decode_tier_config(arch, 0, qdt, fp8, old_tiers[ti])) == full_stage1(cfg)
                )
                if same and not general:
                    continue
                n = tier["BLOCK_H"]
                for splits in (1, 3):
                    what = f"{where}.tiers[{ti}] q={str(qdt)[6:]} cache={'fp8' if fp8 else 'q dtype'} N={n} S={splits}"
                    out.append((what, check(qdt, fp8, n, splits)))
        if general:
            for n, s in ((16, None), (128, None), (16, 40)):
                out.append((f"{where} N={n} S={s or 'auto'}", check(_dtypes(dev)[0], False, n, s)))
    elif op_key == "mla_sparse_attention":
        fp8_kind = {"fp8": C.platform_fp8_dtype(arch)}
        base = sparse.SHAPES["verify"][0]

        def sparse_check(qdt, fp8: bool, n: int, **run):
            # the tier's BLOCK_H as the head count: one head block, the tier's own config
            shape = dataclasses.replace(base, N=n, kv="fp8" if fp8 else "auto")
            return lambda: inputs.verify_call("sparse", shape, dev, qdt, fp8_kind, **run)

        def resolved(tier: dict, qdt, fp8: bool) -> dict | None:
            try:
                return tier_config(arch, 0, qdt, fp8, tier)
            except ValueError:  # a bad tier: its calls are checked (and fail, named) below
                return None

        tiers, old_tiers = new["tiers"], old.get("tiers", [])
        for ti, tier in enumerate(tiers):
            n = int(tier["BLOCK_H"])
            for qdt in _dtypes(dev):
                for fp8 in (False, True):
                    cfg = resolved(tier, qdt, fp8)
                    same = (
                        cfg is not None
                        and ti < len(old_tiers)
                        and len(tiers) == len(old_tiers)
                        and resolved(old_tiers[ti], qdt, fp8) == cfg
                    )
                    if same and not general:
                        continue
                    what = f"{where}.tiers[{ti}] q={str(qdt)[6:]} cache={'fp8' if fp8 else 'q dtype'} N={n}"
                    for splits in (1, 3):
                        out.append((f"{what} S={splits}", sparse_check(qdt, fp8, n, num_splits=splits)))
        if general:
            dt = _dtypes(dev)[0]
            for n, run in ((16, {}), (128, {}), (16, {"batch_invariant": True})):
                what = f"{where} N={n} {'batch_invariant' if run else 'S=auto'}"
                out.append((what, sparse_check(dt, False, n, **run)))
    elif op_key == "mla_v4_attention":
        v4_base = v4_verify_shape(dev)

        def v4_check(qdt, kv: str, h: int, **run):
            # the tier's BLOCK_H as the head count: one head block, the tier's own config
            shape = dataclasses.replace(v4_base, H=h, kv=kv)
            return lambda: inputs.verify_call("v4", shape, dev, qdt, **run)

        def v4_resolved(tier: dict, qdt) -> dict | None:
            try:
                return v4_tier_config(arch, 0, qdt, tier)
            except ValueError:  # a bad tier: its calls are checked (and fail, named) below
                return None

        tiers, old_tiers = new["tiers"], old.get("tiers", [])
        for ti, tier in enumerate(tiers):
            h = int(tier["BLOCK_H"])
            for qdt in _dtypes(dev):
                cfg = v4_resolved(tier, qdt)
                same = (
                    cfg is not None
                    and ti < len(old_tiers)
                    and len(tiers) == len(old_tiers)
                    and v4_resolved(old_tiers[ti], qdt) == cfg
                )
                if same and not general:
                    continue
                for kv, cache in (("fp8", "fp8_ds_mla"), ("auto", "q dtype")):
                    what = f"{where}.tiers[{ti}] q={str(qdt)[6:]} cache={cache} H={h}"
                    for splits in (1, 3):
                        out.append((f"{what} S={splits}", v4_check(qdt, kv, h, num_splits=splits)))
        if general:
            dt = _dtypes(dev)[0]
            for h, run in ((16, {}), (128, {}), (16, {"batch_invariant": True})):
                what = f"{where} H={h} {'batch_invariant' if run else 'S=auto'}"
                out.append((what, v4_check(dt, "fp8", h, **run)))
    elif op_key == "mla_indexer_topk":
        if new != old:
            make = {"fp8": C.platform_fp8_dtype(arch)}
            for shape in indexer_topk.SHAPES[INDEXER_VERIFY.get(dev.type, "verify")]:
                for s, tag in ((shape, ""), (indexer_one_split(shape), " (one split)")):
                    out.append(
                        (
                            f"{where} {s.label()}{tag}",
                            lambda s=s: inputs.verify_call("indexer", s, dev, None, make, backend="triton"),
                        )
                    )
    elif op_key == "mla_prefill":
        for tags, dts in (([], [d for d in _dtypes(dev) if d != torch.float32]), (["fp32"], [torch.float32])):
            resolved = [[C.resolve_tier(t, tags) for t in obj.get("tiers", [])] for obj in (new, old)]
            if resolved[0] == resolved[1] and new.get("backend_order") == old.get("backend_order"):
                continue
            for dt in dts:
                for shape in prefill.SHAPES["verify"]:
                    out.append(
                        (
                            f"{where}.tiers {str(dt)[6:]} {'causal' if shape.causal else 'full'}",
                            lambda dt=dt, shape=shape: inputs.verify_call("prefill", shape, dev, dt),
                        )
                    )
    elif op_key in ("merge_attn_states", "rope_kv_write"):
        launch = lambda obj, b: obj.get("hip", {}).get("tiers") if b == "hip" else obj.get("tiers")  # noqa: E731
        impls = [b for b in ("hip", "triton") if launch(new, b) != launch(old, b) and unavailable(b, dev) is None]
        if new.get("backend_order") != old.get("backend_order"):
            impls.append(None)
        # RoPE: the verify shapes in GPT-J style, and the first one in NeoX style as well
        ropes = [(shape, False) for shape in rope_kv_write.SHAPES["verify"]] + [
            (rope_kv_write.SHAPES["verify"][0], True)
        ]
        for b in impls:
            tag = f".{b}" if b else " (default dispatch)"
            for dt in _dtypes(dev):
                if op_key == "merge_attn_states":
                    for shape in merge.SHAPES["verify"]:
                        out.append(
                            (
                                f"{where}{tag} {str(dt)[6:]} D={shape.D}",
                                lambda dt=dt, shape=shape, b=b: inputs.verify_call("merge", shape, dev, dt, backend=b),
                            )
                        )
                elif dt != torch.float32:
                    for shape, neox in ropes:
                        make = {"fp8": C.platform_fp8_dtype(arch), "is_neox": neox}
                        out.append(
                            (
                                f"{where}{tag} {str(dt)[6:]} N={shape.N}{' fp8' if shape.fp8 else ''}"
                                f"{' neox' if neox else ''}",
                                lambda dt=dt, shape=shape, make=make, b=b: inputs.verify_call(
                                    "rope_kv_write", shape, dev, dt, make, backend=b
                                ),
                            )
                        )
    return out


def verify(op_key: str, arch: str, dev: torch.device, old: dict, new: dict) -> list[C.OverlayError]:
    """Compile-and-reference errors of ``new`` (what differs from ``old``), named."""
    errors: list[C.OverlayError] = []
    with C.override(op_key, arch, new):
        for what, check in verification_cases(op_key, arch, dev, old, new):
            try:
                bad = check()
            except Exception as exc:
                sync_or_raise(dev)
                errors.append(C.OverlayCompileError(what, exc_text(exc)))
                continue
            if bad:
                errors.append(C.OverlayReferenceError(what, bad))
    return errors


class Acceptance:
    """The Tuner's rules for a winner: its score against the default while searching, the
    back-to-back re-time, verification, and the final pass per op that reverts a group a shape
    came out slower under."""

    def score(self, g: Group, r: dict) -> float | None:
        """geomean time ratio to the default over the group's shapes; None when not eligible."""
        d0 = g.results[point_key(g.point0)]["times"]
        if r["error"] or len(r["times"]) != len(d0):
            return None
        ratios = [r["times"][k] / d0[k] for k in d0]
        if any(x > 1 + IN_LOOP_SLACK for x in ratios):
            return None
        return geomean(ratios)

    def best(self, g: Group) -> dict:
        best, best_s = g.point0, 1.0
        for r in g.results.values():
            sc = self.score(g, r)
            if sc is not None and sc < best_s - 1e-9:
                best, best_s = r["point"], sc
        return best

    def retime(self, op_key: str, shapes: list[Shape], old: dict, new: dict) -> tuple[dict, dict] | None:
        """Median of ROUNDS back-to-back timings of ``old`` and ``new`` per shape (alternating which
        goes first); None when a timing fails."""
        told: dict[str, list[float]] = {s.key: [] for s in shapes}
        tnew: dict[str, list[float]] = {s.key: [] for s in shapes}
        for rnd in range(ROUNDS):
            for s in shapes:
                order = [(old, told), (new, tnew)] if rnd % 2 == 0 else [(new, tnew), (old, told)]
                for obj, acc in order:
                    us, err = self.measure(op_key, obj, s, check=False)
                    if err:
                        self.log(f"  re-time failed at {s.key}: {err}")
                        return None
                    acc[s.key].append(us)
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        return {k: med(v) for k, v in told.items()}, {k: med(v) for k, v in tnew.items()}

    def accept(self, g: Group, ranked: list[dict]) -> None:
        old = self.current[g.op_key]
        d0 = g.results[point_key(g.point0)]["times"]
        if len(d0) != len(g.shapes):
            return
        for s in g.shapes:  # a shape an earlier group of the op tuned keeps that group's row
            self.rows.setdefault(
                s.key,
                {
                    "op": g.op_key,
                    "shape": s.key,
                    "default_us": d0[s.key],
                    "tuned_us": d0[s.key],
                    "config": "default",
                    "note": "",
                },
            )
        if not ranked:
            g.status = g.status if g.status != "pending" else "default kept (no candidate >= 1% faster)"
            return
        for p in ranked[:3]:
            if self.out_of_time(final=True):
                g.status = "default kept (--max-minutes reached before the re-time)"
                return
            new = g.build(p)
            rt = self.retime(g.op_key, g.shapes, old, new)
            if rt is None:
                continue
            t_old, t_new = rt
            ratios = {k: t_new[k] / t_old[k] for k in t_old}
            worse = [k for k, x in ratios.items() if x > 1.0]
            geo = geomean(ratios.values())
            if worse or geo > 1 - MIN_GAIN / 2:
                self.log(
                    f"  {g.label(p)}: rejected after the back-to-back re-time ({1 / geo:.3f}x"
                    f"{'; slower at ' + ', '.join(worse) if worse else ''})"
                )
                continue
            errs = verify(g.op_key, self.arch, self.dev, old, new)
            if errs:
                self.log(f"  {g.label(p)}: rejected: {errs[0].name}: {errs[0]}")
                continue
            self.current[g.op_key] = new
            self.accepted.append((g, p))
            g.status, g.winner = "accepted", p
            for s in g.shapes:
                row = self.rows[s.key]
                if row["config"] == "default":  # t_old is the package's default for this shape
                    row["default_us"] = t_old[s.key]
                row["tuned_us"] = t_new[s.key]
            self.relabel(g.op)
            self.log(
                f"  accepted {g.label(p)}: {1 / geo:.3f}x the default's speed over the group (back to back: "
                + ", ".join(f"{t_old[k]:.1f}->{t_new[k]:.1f}" for k in t_old)
                + " us)"
            )
            self.write()
            return
        g.status = "default kept (no candidate survived the re-time and checks)"

    def relabel(self, op: str) -> None:
        """Each row's config column: the accepted groups that cover the shape (else "default")."""
        for s in self.shapes:
            if s.op == op and s.key in self.rows:
                cover = [(g, p) for g, p in self.accepted if g.op == op and s in g.shapes]
                parts = [f"{g.name}: {g.label(p)}" if len(cover) > 1 else g.label(p) for g, p in cover]
                self.rows[s.key]["config"] = "; ".join(parts) or "default"

    def rebuild(self, op_key: str) -> None:
        self.current[op_key] = self.package[op_key]
        for g, p in self.accepted:
            if g.op_key == op_key:
                self.current[op_key] = g.build(p)

    def final_pass(self, op: str) -> None:
        """Per shape of ``op``: the package's config against the final one, back to back; a shape
        that comes out slower reverts the groups that cover it."""
        op_key = OP_KEYS[op]
        if self.current[op_key] == self.package[op_key]:
            return
        covered = {s.key for g, _ in self.accepted if g.op == op for s in g.shapes}
        shapes = [s for s in self.shapes if s.op == op and s.key in covered]
        if self.time_left() < 20 + 2 * len(shapes):
            self.log(f"{op}: no time left for the final back-to-back pass; the table shows the per-group re-times")
            return
        for attempt in range(2):
            rt = self.retime(op_key, shapes, self.package[op_key], self.current[op_key])
            if rt is None:
                return
            t_def, t_tun = rt
            slower = {k for k in t_def if t_tun[k] > t_def[k]}
            for k in t_def:
                if k in self.rows:
                    self.rows[k].update(default_us=t_def[k], tuned_us=t_tun[k], note="final pass")
            if not slower:
                return
            revert = [(g, p) for g, p in self.accepted if g.op == op and slower & {s.key for s in g.shapes}]
            for g, p in revert:
                self.accepted.remove((g, p))
                g.status = "reverted (slower in the final pass)"
                g.winner = None
            self.relabel(op)
            for g, _ in revert:
                for s in g.shapes:
                    row = self.rows[s.key]
                    row["note"] = "reverted"
                    if row["config"] == "default":  # the package's config again: its own time
                        row["tuned_us"] = row["default_us"]
            self.log(
                f"{op}: slower in the final pass at {', '.join(sorted(slower))}: reverted "
                + ", ".join(g.name for g, _ in revert)
            )
            self.rebuild(op_key)
            self.write()
            if self.current[op_key] == self.package[op_key] or attempt == 1:
                return
