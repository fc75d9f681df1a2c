"""Groups: the shapes one part of an op's config serves (a decode tier for one q dtype and cache
kind, decode's split and reduce parts, a sparse tier for one cache kind and its split part,
prefill's first tier for 16-bit or float32 inputs, the merge or RoPE+KV-write implementation the op
dispatches to, the indexer's tier, an mla_v4_attention tier for 16-bit or float32 q and its split
part) with that part's default, its listed candidates (the op's ``tiers`` and ``candidates`` in
configs/<op>.json) and the knobs of the coordinate search; ``compose_tier`` /
``compose_sparse_tier`` / ``compose_v4_tier`` / ``compose_prefill_tier`` write a point back into
the tier schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rocm_mla import configs as C
from rocm_mla.ops.decode_plan import TIER_DEFAULTS as DECODE_TIER_DEFAULTS
from rocm_mla.ops.decode_plan import tier_config as decode_tier_config
from rocm_mla.ops.sparse_plan import TIER_DEFAULTS, tier_config
from rocm_mla.ops.v4_attention_plan import TIER_DEFAULTS as V4_TIER_DEFAULTS
from rocm_mla.ops.v4_attention_plan import tier_config as v4_tier_config

from .shapes import OP_KEYS, Shape


class TunerState(Protocol):
    """What the group builders read of the tuner (tuner.Tuner is one): the arch and device, the
    shipped configs by op key, the configs as tuned so far, the quick mode and the log. A protocol,
    so that this module does not import the tuner, which imports it."""

    arch: str
    dev: torch.device
    package: dict[str, Any]
    current: dict[str, Any]
    quick: bool
    log: Callable[[str], None]


def point_key(p: dict) -> str:
    """A candidate point's identity (its JSON, keys sorted)."""
    return json.dumps(p, sort_keys=True)


_SHORT = {
    "waves_per_block": "w",
    "vecs_per_thread": "v",
    "units_per_thread": "u",
    "min_blocks_per_cu": "m",
    "rows_per_program": "r",
    "block_rows": "b",
    "num_warps": "nw",
    "tile_elems": "t",
    "max_tokens": "mt",
    "waves_per_eu": "wpe",
    "min_tokens_per_split": "mt",
    "max_splits": "ms",
    "fixed_tiles": "ft",
    "launch_tiles": "lt",
    "max_block_s": "bs",
}


def _short(p: dict, names: dict[str, str] | None = None) -> str:
    names = names or {}
    return " ".join(f"{names.get(k, k)}{'=' if k not in names else ''}{json.dumps(v)}" for k, v in p.items())


def _nearest_first(p0: dict, points: list[dict]) -> list[dict]:
    """Distinct points other than p0, fewest differing fields first (the cap keeps neighbours)."""
    seen, out = {point_key(p0)}, []
    for p in points:
        if point_key(p) not in seen:
            seen.add(point_key(p))
            out.append(p)
    diff = lambda p: sum(p.get(k) != p0.get(k) for k in set(p) | set(p0))  # noqa: E731
    return sorted(out, key=diff)


@dataclass
class Group:
    """Shapes one part of an op's config serves, and the candidate values of that part."""

    op: str  # decode, prefill, merge, rope_kv_write, sparse, indexer, v4
    name: str
    shapes: list[Shape]
    point0: dict  # the package's value of the part (the default)
    listed: list[dict]  # the package's candidates for it
    knobs: list[tuple[str, list]]  # coordinate-search axes (full mode)
    build: Callable[[dict], dict | None]  # point -> complete arch object of the op (None: cannot express)
    label: Callable[[dict], str]
    results: dict[str, dict] = field(default_factory=dict)  # point_key(point) -> {"point", "times", "error"}
    status: str = "pending"
    winner: dict | None = None
    impl_pending: bool = False  # merge / rope_kv_write: the implementation is chosen when the group is reached
    fix: Callable[[dict], dict] = lambda p: p  # makes a generated point consistent (e.g. V_SPLIT 2 needs D_SPLIT 2)

    @property
    def op_key(self) -> str:
        return OP_KEYS[self.op]


def _listed(obj: dict) -> list[dict]:
    """An op's tiers, then its candidates, each once: the configs a tier group may try."""
    out: list[dict] = []
    for c in [*obj["tiers"], *obj["candidates"]]:
        if c not in out:
            out.append(c)
    return out


# decode: the tiers, per q dtype x cache kind combination
COMBOS = (
    (torch.bfloat16, False),
    (torch.float16, False),
    (torch.float32, False),
    (torch.bfloat16, True),
    (torch.float16, True),
)


def full_stage1(d: dict) -> dict:
    """``d`` with the stage-1 defaults filled in: a field left out equals its default spelled out."""
    return {**DECODE_TIER_DEFAULTS, **d}


def _diff(target: dict, base: dict) -> dict | None:
    """Fields that turn ``base`` into ``target`` (None when a field of base cannot be removed)."""
    t, b = full_stage1(target), full_stage1(base)
    if set(b) - set(t):
        return None
    return {k: target.get(k, DECODE_TIER_DEFAULTS.get(k)) for k in t if b.get(k) != t[k]}


# The batch-invariant mode's tier fields: the tier's choice, not the tuner's (it times the default
# mode, and a candidate's own would move another tier's rule), so a composed tier keeps its own.
INVARIANT_FIELDS = ("SPLIT_RUNS", "invariant_split_tokens")


def tier_invariant_fields(arch: str, tier: dict, combo: tuple, point: dict) -> dict:
    """``point`` with the ``INVARIANT_FIELDS`` of ``tier`` resolved for ``combo`` in place of its own."""
    own = decode_tier_config(arch, 0, combo[0], combo[1], tier)
    return {
        **{k: v for k, v in point.items() if k not in INVARIANT_FIELDS},
        **{k: own[k] for k in INVARIANT_FIELDS if k in own},
    }


def compose_tier(arch: str, tier: dict, combo: tuple, point: dict) -> dict | None:
    """A stage-1 tier whose resolved config for ``combo`` (q dtype, fp8 cache) is ``point`` while
    every other combination resolves as in ``tier`` (float16 q without fp8 shares the 16-bit
    top level); None when the tier schema cannot express that. The ``INVARIANT_FIELDS`` stay the
    tier's, whatever the point says."""
    res = lambda t, c: decode_tier_config(arch, 0, c[0], c[1], t)  # noqa: E731
    point = tier_invariant_fields(arch, tier, combo, point)
    want = {c: res(tier, c) for c in COMBOS}
    for c in [combo, (torch.float16, False)] if combo == (torch.bfloat16, False) else [combo]:
        want[c] = dict(point)
    top = dict(want[(torch.bfloat16, False)])
    new = dict(top)
    fp8 = _diff(want[(torch.bfloat16, True)], top)
    fp32 = _diff(want[(torch.float32, False)], top)
    if fp8 is None or fp32 is None:
        return None
    f16f8 = _diff(want[(torch.float16, True)], {**top, **fp8})
    if f16f8 is None:
        return None
    for tag, sub in (("fp8", fp8), ("fp32", fp32), ("fp16+fp8", f16f8)):
        if sub:
            new[tag] = sub
    for tag in ("fp8+qk", "fp8+all"):  # fp8_dots' overrides: not tuned here, kept as they are
        if tag in tier:
            new[tag] = dict(tier[tag])
    try:
        if any(full_stage1(res(new, c)) != full_stage1(want[c]) for c in COMBOS):
            return None
    except ValueError:
        return None
    return new


def _decode_fix(p: dict) -> dict:
    """V_SPLIT 2 needs D_SPLIT 2 (the kernel asserts it)."""
    return {**p, "D_SPLIT": 2} if p.get("V_SPLIT", 1) == 2 else p


def decode_label(p: dict) -> str:
    s = (
        f"H{p['BLOCK_H']} N{p['BLOCK_N']} d{p.get('D_SPLIT', 1)}{'v2' if p.get('V_SPLIT', 1) == 2 else ''}"
        f"{'r' if p.get('RELOAD_K') else ''}"
        f"{'h' if p.get('F16_DOT') else ''}{'g' if p.get('CLAMP_PAGES') else ''}"
        f" w{p['num_warps']} s{p['num_stages']} c{p.get('ctas_per_cu', 1)}"
    )
    for k, tag in (("waves_per_eu", "wpe"), ("matrix_instr_nonkdim", "mi"), ("kpack", "kp")):
        if k in p:
            s += f" {tag}{p[k]}"
    return s


def kpack_values(arch: str) -> list[int]:
    """The kpack values worth sweeping on an AMD ``arch`` (configs/platform.json: [1] where the
    compiler ignores 2, as on gfx950)."""
    return list(C.config_for("platform", arch).get("kpack_values", [1, 2]))


# The split-count cost model's knobs (mla_decode's and mla_sparse_attention's "split").
SPLIT_KNOBS = [
    ("max_splits", [16, 32, 64, 128]),
    ("min_tokens_per_split", [32, 64, 128]),
    ("fixed_tiles", [1, 2, 4]),
    ("launch_tiles", [2, 3, 4, 6]),
]


def decode_groups(t: TunerState, shapes: list[Shape]) -> list[Group]:
    arch, gfx = t.arch, C.is_amd_arch(t.arch)
    pkg = t.package["mla_decode"]
    tiers = pkg["tiers"]
    by: dict[tuple, list[Shape]] = {}
    for s in shapes:
        dt = s.dtype(t.dev)
        m = s["q"] * s["N"]
        ti = C.tier_index(tiers, m)
        combo = (dt, s["kv"] == "fp8")
        if combo == (torch.float16, False):
            combo = (torch.bfloat16, False)  # the same 16-bit top level
        by.setdefault((ti, combo), []).append(s)
    cands = _listed(pkg)
    groups = []
    for (ti, combo), ss in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1][1], str(kv[0][1][0]))):
        h = tiers[ti]["BLOCK_H"]
        p0 = decode_tier_config(arch, 0, combo[0], combo[1], tiers[ti])
        ok = (lambda p: 16 <= p["BLOCK_H"] <= h) if combo[1] else (lambda p: p["BLOCK_H"] == h)
        listed = _nearest_first(
            p0, [p for c in cands for p in [decode_tier_config(arch, 0, combo[0], combo[1], c)] if ok(p)]
        )
        # most promising first: --quick tries single-knob neighbours of the default in this order
        knobs = [("BLOCK_N", [16, 32, 64]), ("num_warps", [4, 8])]
        if gfx:
            knobs += [("waves_per_eu", [0, 1, 2])]
        knobs += [("num_stages", [1, 2] if gfx else [2, 3, 4, 5]), ("D_SPLIT", [1, 2])]
        if gfx:
            knobs += [("kpack", kpack_values(arch)), ("matrix_instr_nonkdim", [16, 32])]
        knobs += [("ctas_per_cu", [1, 2]), ("V_SPLIT", [1, 2]), ("CLAMP_PAGES", [False, True])]
        if combo[1]:
            knobs += [("RELOAD_K", [False, True])]
            if not gfx and combo[0] == torch.bfloat16:
                knobs += [("F16_DOT", [False, True])]
        knobs = [(k, v) for k, v in knobs if k in p0 or k in DECODE_TIER_DEFAULTS]

        def build(p, ti=ti, combo=combo):
            obj = t.current["mla_decode"]
            tier = compose_tier(arch, obj["tiers"][ti], combo, p)
            if tier is None:
                return None
            return {**obj, "tiers": [tier if i == ti else x for i, x in enumerate(obj["tiers"])]}

        qname = "" if combo[0] == torch.bfloat16 else f"{str(combo[0]).replace('torch.', '')} q, "
        name = f"tiers[{ti}] H{h} {qname}{'fp8' if combo[1] else '16-bit'} cache"
        groups.append(Group("decode", name, ss, p0, listed, knobs, build, decode_label, fix=_decode_fix))
    if not t.quick and shapes:
        for part, knobs in (
            ("split", SPLIT_KNOBS),
            ("reduce", [("num_warps", [4, 8]), ("tile_elems", [2048, 4096, 8192]), ("max_block_s", [16, 32, 64])]),
        ):
            p0 = dict(pkg[part])
            groups.append(
                Group(
                    "decode",
                    part,
                    list(shapes),
                    p0,
                    [],
                    [(k, v) for k, v in knobs if k in p0],
                    lambda p, part=part: {**t.current["mla_decode"], part: p},
                    lambda p, part=part: f"{part} " + _short(p, _SHORT),
                )
            )
    return groups


# sparse: a tier's kinds of call, each resolved through its own override objects (tier_config):
# (q dtype, fp8 cache). The 16-bit one is the tier's top level (float16 and bfloat16 q resolve alike).
SPARSE_KINDS = {
    "16-bit": (torch.bfloat16, False),
    "fp8": (torch.bfloat16, True),
    "fp32": (torch.float32, False),
    "fp32+fp8": (torch.float32, True),
}


def sparse_kind(dtype: torch.dtype, fp8: bool) -> str:
    """The SPARSE_KINDS key of a call with q ``dtype`` over a 16-bit (or fp32) or fp8 cache."""
    if dtype == torch.float32:
        return "fp32+fp8" if fp8 else "fp32"
    return "fp8" if fp8 else "16-bit"


def _sparse_resolve(arch: str, tier: dict, kind: str) -> dict:
    """``tier``'s launch config for ``kind`` (its override objects applied, the defaults filled in)."""
    qdt, fp8 = SPARSE_KINDS[kind]
    return tier_config(arch, int(tier["BLOCK_H"]), qdt, fp8, tier)


def compose_sparse_tier(arch: str, tier: dict, kind: str, point: dict) -> dict | None:
    """A sparse tier whose resolved config for ``kind`` ("16-bit", "fp8" or "fp32") is ``point``
    while the other two resolve as in ``tier``: the 16-bit point is the top level (its BLOCK_H,
    which selects the tier, unchanged), the "fp8" / "fp32" objects hold what differs from it. A
    float32 q over an fp8 cache (the top level, then "fp8", then "fp32"; not a kind the tuner
    times) keeps its config too where the schema can say it. None when it cannot say the rest."""
    point = {k: v for k, v in point.items() if k not in C.DTYPE_TAGS}
    if kind == "16-bit" and int(point.get("BLOCK_H", -1)) != int(tier["BLOCK_H"]):
        return None
    try:
        want = {k: _sparse_resolve(arch, tier, k) for k in SPARSE_KINDS}
        want[kind] = _sparse_resolve(arch, point, "16-bit")  # the point with the defaults filled in
    except ValueError:
        return None
    top = want["16-bit"]
    if set(top) - set(want["fp8"]) or set(top) - set(want["fp32"]):
        return None  # a top-level field another kind must not have
    fp8 = {k: v for k, v in want["fp8"].items() if top.get(k) != v}
    both = want["fp32+fp8"]
    # "fp32" also restates a field "fp8" changes where float32 q over an fp8 cache had fp32's value
    fp32 = {
        k: v for k, v in want["fp32"].items() if top.get(k) != v or (v == both.get(k) and fp8.get(k, top.get(k)) != v)
    }
    # the top level in the tier's field order, without the defaults it leaves out (absent: the default)
    keys = [k for k in tier if k in top] + [k for k in top if k not in tier]
    new = {k: top[k] for k in keys if k in tier or k not in TIER_DEFAULTS or TIER_DEFAULTS[k] != top[k]}
    for tag, sub in (("fp8", fp8), ("fp32", fp32)):
        if sub:
            new[tag] = sub
    try:
        if any(_sparse_resolve(arch, new, k) != want[k] for k in ("16-bit", "fp8", "fp32")):
            return None
    except ValueError:
        return None
    return new


def sparse_label(p: dict) -> str:
    s = (
        f"H{p['BLOCK_H']} N{p['BLOCK_N']} d{p.get('D_SPLIT', 1)}"
        f"{'r' if p.get('RELOAD_K') else ''}{'h' if p.get('F16_DOT') else ''}"
        f" w{p['num_warps']} s{p['num_stages']} c{p.get('ctas_per_cu', 1)}"
    )
    for k, tag in (("waves_per_eu", "wpe"), ("matrix_instr_nonkdim", "mi"), ("kpack", "kp")):
        if k in p:
            s += f" {tag}{p[k]}"
    return s


def sparse_groups(t: TunerState, shapes: list[Shape]) -> list[Group]:
    """mla_sparse_attention: one group per (tier, kind of call) of the shapes (the tier serves N
    heads: ``tier_index``), each searching the tier's resolved config for that kind; in full mode
    then the split cost model over every shape."""
    arch, gfx = t.arch, C.is_amd_arch(t.arch)
    op_key = OP_KEYS["sparse"]
    pkg = t.package[op_key]
    tiers = pkg["tiers"]
    by: dict[tuple[int, str], list[Shape]] = {}
    for s in shapes:
        kind = sparse_kind(s.dtype(t.dev), s["kv"] == "fp8")
        if kind == "fp32+fp8":
            t.log(f"{s.key}: float32 q over an fp8 cache resolves through both override objects; not tuned")
            continue
        by.setdefault((C.tier_index(tiers, s["N"]), kind), []).append(s)
    cands = _listed(pkg)
    groups = []
    for (ti, kind), ss in sorted(by.items(), key=lambda kv: (kv[0][0], list(SPARSE_KINDS).index(kv[0][1]))):
        h = int(tiers[ti]["BLOCK_H"])
        p0 = _sparse_resolve(arch, tiers[ti], kind)
        # the 16-bit top level keeps the tier's BLOCK_H (it selects the tier); an override object
        # may take fewer heads per program (more head blocks), as the package's do
        ok = (lambda p: p["BLOCK_H"] == h) if kind == "16-bit" else (lambda p: 16 <= p["BLOCK_H"] <= h)
        listed = _nearest_first(p0, [p for c in cands for p in [_sparse_resolve(arch, c, kind)] if ok(p)])
        # most promising first: --quick tries single-knob neighbours of the default in this order
        knobs = [("BLOCK_N", [16, 32, 64]), ("num_warps", [4, 8])]
        if gfx:
            knobs += [("waves_per_eu", [0, 1, 2])]
        knobs += [("num_stages", [1, 2] if gfx else [2, 3, 4, 5]), ("D_SPLIT", [1, 2])]
        if gfx:
            knobs += [("kpack", kpack_values(arch)), ("matrix_instr_nonkdim", [16, 32])]
        knobs += [("ctas_per_cu", [1, 2])]
        if kind == "fp8":
            knobs += [("RELOAD_K", [False, True])]
            if not gfx and any(s.dtype(t.dev) == torch.bfloat16 for s in ss):
                knobs += [("F16_DOT", [False, True])]  # dots in float16: fp8 cache with a bf16 q only
        knobs = [(k, v) for k, v in knobs if k in p0]

        def build(p, ti=ti, kind=kind):
            obj = t.current[op_key]
            tier = compose_sparse_tier(arch, obj["tiers"][ti], kind, p)
            if tier is None:
                return None
            return {**obj, "tiers": [tier if i == ti else x for i, x in enumerate(obj["tiers"])]}

        name = f"tiers[{ti}] H{h} {kind} {'q' if kind == 'fp32' else 'cache'}"
        groups.append(Group("sparse", name, ss, p0, listed, knobs, build, sparse_label))
    if not t.quick and shapes:
        p0 = dict(pkg["split"])
        groups.append(
            Group(
                "sparse",
                "split",
                list(shapes),
                p0,
                [],
                [(k, v) for k, v in SPLIT_KNOBS if k in p0],
                lambda p: {**t.current[op_key], "split": p},
                lambda p: "split " + _short(p, _SHORT),
            )
        )
    return groups


# v4: a tier's kinds of call, each resolved through its own override objects (v4 tier_config): the
# tier's top level serves 16-bit q (float16 and bfloat16 alike, over any cache), "fp32" float32 q.
V4_KINDS = {"16-bit": torch.bfloat16, "fp32": torch.float32}


def v4_kind(dtype: torch.dtype) -> str:
    """The V4_KINDS key of a call with q ``dtype``."""
    return "fp32" if dtype == torch.float32 else "16-bit"


def _v4_resolve(arch: str, tier: dict, kind: str) -> dict:
    """``tier``'s launch config for ``kind`` (its ``fp32`` object applied, the defaults filled in)."""
    return v4_tier_config(arch, int(tier["BLOCK_H"]), V4_KINDS[kind], tier)


def compose_v4_tier(arch: str, tier: dict, kind: str, point: dict) -> dict | None:
    """An mla_v4_attention tier whose resolved config for ``kind`` ("16-bit" or "fp32") is
    ``point`` while the other resolves as in ``tier``: the 16-bit point is the top level (its
    BLOCK_H, which selects the tier, unchanged), the ``fp32`` object holds what float32 q launches
    differently. None when the schema cannot say it."""
    point = {k: v for k, v in point.items() if k not in C.DTYPE_TAGS}
    if kind == "16-bit" and int(point.get("BLOCK_H", -1)) != int(tier["BLOCK_H"]):
        return None
    try:
        want = {k: _v4_resolve(arch, tier, k) for k in V4_KINDS}
        want[kind] = _v4_resolve(arch, point, "16-bit")  # the point with the defaults filled in
    except ValueError:
        return None
    top = want["16-bit"]
    if set(top) - set(want["fp32"]):
        return None  # a top-level field float32 q must not have
    fp32 = {k: v for k, v in want["fp32"].items() if top.get(k) != v}
    # the top level in the tier's field order, without the defaults it leaves out (absent: the default)
    keys = [k for k in tier if k in top] + [k for k in top if k not in tier]
    new = {k: top[k] for k in keys if k in tier or k not in V4_TIER_DEFAULTS or V4_TIER_DEFAULTS[k] != top[k]}
    if fp32:
        new["fp32"] = fp32
    try:
        if any(_v4_resolve(arch, new, k) != want[k] for k in V4_KINDS):
            return None
    except ValueError:
        return None
    return new


def v4_label(p: dict) -> str:
    s = f"H{p['BLOCK_H']} N{p['BLOCK_N']} w{p['num_warps']} s{p['num_stages']} c{p.get('ctas_per_cu', 1)}"
    for k, tag in (("waves_per_eu", "wpe"), ("matrix_instr_nonkdim", "mi"), ("kpack", "kp")):
        if k in p:
            s += f" {tag}{p[k]}"
    return s


def v4_groups(t: TunerState, shapes: list[Shape]) -> list[Group]:
    """mla_v4_attention: one group per (tier, kind of q) of the shapes (the tier serves H heads:
    ``tier_index``; one config serves every cache kind), each searching the tier's resolved config
    for that kind over the configs' tiers and ``candidates`` whose BLOCK_H fits; in full mode then
    the split cost model over every shape."""
    arch, gfx = t.arch, C.is_amd_arch(t.arch)
    op_key = OP_KEYS["v4"]
    pkg = t.package[op_key]
    tiers = pkg["tiers"]
    by: dict[tuple[int, str], list[Shape]] = {}
    for s in shapes:
        by.setdefault((C.tier_index(tiers, s["H"]), v4_kind(s.dtype(t.dev))), []).append(s)
    cands = _listed(pkg)
    groups = []
    for (ti, kind), ss in sorted(by.items(), key=lambda kv: (kv[0][0], list(V4_KINDS).index(kv[0][1]))):
        h = int(tiers[ti]["BLOCK_H"])
        p0 = _v4_resolve(arch, tiers[ti], kind)
        # the 16-bit top level keeps the tier's BLOCK_H (it selects the tier); float32 q may take
        # fewer heads per program (more head blocks), as the package's fp32 objects do
        ok = (lambda p: p["BLOCK_H"] == h) if kind == "16-bit" else (lambda p: 16 <= p["BLOCK_H"] <= h)
        listed = _nearest_first(p0, [p for c in cands for p in [_v4_resolve(arch, c, kind)] if ok(p)])
        # most promising first: --quick tries single-knob neighbours of the default in this order
        knobs = [("BLOCK_N", [16, 32, 64]), ("num_warps", [4, 8])]
        if gfx:
            knobs += [("waves_per_eu", [0, 1, 2])]
        knobs += [("num_stages", [1, 2] if gfx else [1, 2, 3, 4])]
        if gfx:
            knobs += [("kpack", kpack_values(arch)), ("matrix_instr_nonkdim", [16, 32])]
        knobs += [("ctas_per_cu", [1, 2])]
        knobs = [(k, v) for k, v in knobs if k in p0]

        def build(p, ti=ti, kind=kind):
            obj = t.current[op_key]
            tier = compose_v4_tier(arch, obj["tiers"][ti], kind, p)
            if tier is None:
                return None
            return {**obj, "tiers": [tier if i == ti else x for i, x in enumerate(obj["tiers"])]}

        groups.append(Group("v4", f"tiers[{ti}] H{h} {kind} q", ss, p0, listed, knobs, build, v4_label))
    if not t.quick and shapes:
        p0 = dict(pkg["split"])
        groups.append(
            Group(
                "v4",
                "split",
                list(shapes),
                p0,
                [],
                [(k, v) for k, v in SPLIT_KNOBS if k in p0],
                lambda p: {**t.current[op_key], "split": p},
                lambda p: "split " + _short(p, _SHORT),
            )
        )
    return groups


def indexer_launch(arch: str, p: dict, topk_p2: int) -> dict:
    """``p`` as the plan launches it for a top-k of ``topk_p2`` (a power of two): split_keys and
    the merge's chunk raised as ``plan_indexer_topk`` raises them (a power of two, at least one
    element a thread; split_keys at least topk_p2 and BLOCK_N). Two points that launch alike are
    one candidate."""
    from triton import next_power_of_2

    wave = C.wave_size(arch)
    split = max(next_power_of_2(int(p["split_keys"])), topk_p2, int(p["BLOCK_N"]), int(p["num_warps"]) * wave)
    m = p["merge"]
    chunk = max(next_power_of_2(int(m["chunk"])), int(m["num_warps"]) * wave)
    return {**p, "split_keys": split, "merge": {**m, "chunk": chunk}}


def indexer_label(p: dict) -> str:
    m = p.get("merge", {})
    s = (
        f"S{p['split_keys']} N{p['BLOCK_N']} w{p['num_warps']} s{p['num_stages']}"
        f" m{m.get('chunk')}/w{m.get('num_warps')}{' d0' if p.get('direct', True) is False else ''}"
    )
    if p.get("key_streams", 1) != 1:
        s += f" x{p['key_streams']}"
    s += f" p{p.get('programs_per_cu', 1)}"
    if "programs_per_cu" in p.get("many_items", {}):
        s += f"/{p['many_items']['programs_per_cu']}"
    for k, tag in (("waves_per_eu", "wpe"), ("matrix_instr_nonkdim", "mi"), ("kpack", "kp")):
        if k in p:
            s += f" {tag}{p[k]}"
    return s


def indexer_groups(t: TunerState, shapes: list[Shape]) -> list[Group]:
    """mla_indexer_topk: one group over every shape, its point the arch's one tier (split_keys,
    BLOCK_N, num_warps, num_stages, direct, merge, gfx9 options), its candidates the configs'
    ``candidates`` but those the plan launches like the tier or an earlier one at the shapes'
    top-k (``indexer_launch``); no coordinate pass (the list is the search)."""
    from triton import next_power_of_2

    op_key = OP_KEYS["indexer"]
    if not shapes:
        return []
    pkg = t.package[op_key]
    p0 = json.loads(json.dumps(pkg["tiers"][0]))
    topk_p2 = min(next_power_of_2(s["topk"]) for s in shapes)
    seen, listed = {point_key(indexer_launch(t.arch, p0, topk_p2))}, []
    for p in pkg["candidates"]:
        key = point_key(indexer_launch(t.arch, p, topk_p2))
        if key not in seen:
            seen.add(key)
            listed.append(p)
    build = lambda p: {**t.current[op_key], "tiers": [p]}  # noqa: E731
    return [Group("indexer", "launch data", list(shapes), p0, listed, [], build, indexer_label)]


def compose_prefill_tier(tier: dict, kind: str, point: dict) -> dict | None:
    """mla_prefill's first tier with ``point`` as its ``kind`` ("16-bit" or "fp32") launch while
    the other kind's stays: the 16-bit point is the top level, the ``fp32`` object holds what
    float32 inputs launch differently; None when the schema cannot say it (a top-level field the
    float32 launch does not have)."""
    top, f32 = C.resolve_tier(tier, []), C.resolve_tier(tier, ["fp32"])
    point = {k: v for k, v in point.items() if k not in C.DTYPE_TAGS}
    if kind == "16-bit":
        top = point
    else:
        f32 = point
    if set(top) - set(f32):
        return None
    fp32 = {k: v for k, v in f32.items() if top.get(k) != v}
    return {**top, "fp32": fp32} if fp32 else dict(top)


def prefill_groups(t: TunerState, shapes: list[Shape]) -> list[Group]:
    """mla_prefill: one group per kind of input (16-bit, float32) of the first tier, its listed
    candidates (16-bit) the configs' ``candidates``."""
    from rocm_mla.variants.prefill import config_label

    gfx = C.is_amd_arch(t.arch)
    pkg = t.package["mla_prefill"]
    by: dict[str, list[Shape]] = {}
    for s in shapes:
        by.setdefault("fp32" if s.dtype(t.dev) == torch.float32 else "16-bit", []).append(s)
    groups = []
    for kind, ss in by.items():
        fp32 = kind == "fp32"
        p0 = C.resolve_tier(pkg["tiers"][0], ["fp32"] if fp32 else [])
        listed = [] if fp32 else _nearest_first(p0, [dict(c) for c in pkg["candidates"]])
        knobs = [("BLOCK_N", [16, 32] if fp32 else [32, 64, 128]), ("num_warps", [4, 8])]
        if gfx:
            knobs += [("waves_per_eu", [0, 1, 2])]
        knobs += [("num_stages", [1, 2] if gfx else [1, 2, 3, 4]), ("BLOCK_M", [16, 32, 64] if fp32 else [64, 128])]
        if gfx:
            knobs += [("matrix_instr_nonkdim", [16, 32]), ("kpack", kpack_values(t.arch))]
        knobs = [(k, v) for k, v in knobs if k in p0 or k in ("num_stages",)]

        def build(p, kind=kind):
            obj = t.current["mla_prefill"]
            tier = compose_prefill_tier(obj["tiers"][0], kind, p)
            return None if tier is None else {**obj, "tiers": [tier, *obj["tiers"][1:]]}

        groups.append(Group("prefill", kind, ss, p0, listed, knobs, build, config_label))
    return groups


def impl_groups(t: TunerState, op: str, shapes: list[Shape]) -> list[Group]:
    """merge / rope_kv_write: the implementation the op dispatches to here (its ``tiers``: Triton's,
    ``hip.tiers``: HIP's), over its ``candidates``."""
    from rocm_mla.ops._dispatch import select

    op_key = OP_KEYS[op]
    impl = select(op_key, t.dev)
    if impl == "reference":
        t.log(f"{op}: only the reference runs here; nothing to tune")
        return []
    pkg = t.package[op_key]
    obj = pkg["hip"] if impl == "hip" else pkg
    p0 = dict(obj["tiers"][0])
    listed = _nearest_first(p0, obj["candidates"])
    # the coordinate search's axes: each field the candidates vary, over the values they take
    knobs = [(k, sorted({c[k] for c in listed})) for k in p0 if len({c[k] for c in listed}) > 1]
    if impl == "triton":
        if C.is_amd_arch(t.arch):
            knobs.append(("waves_per_eu", [0, 1, 2]))
        if op == "rope_kv_write":
            knobs.append(("max_tokens", [4, 8, 16]))

    def build(p):
        cur = t.current[op_key]
        return {**cur, "hip": {**cur["hip"], "tiers": [p]}} if impl == "hip" else {**cur, "tiers": [p]}

    return [Group(op, impl, list(shapes), p0, listed, knobs, build, lambda p: f"{impl} {_short(p, _SHORT)}")]
