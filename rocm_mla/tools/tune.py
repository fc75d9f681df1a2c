"""``rocm-mla tune``: measure the launch configs of every op on this GPU and keep what is faster.

    rocm-mla tune [--ops decode,prefill,merge,rope_kv_write] [--shapes PRESET|LIST] [--quick]
                  [--max-minutes M] [--max-candidates K] [--out PATH]
    rocm-mla tune --check [--stamp] [--out PATH]      # validate (and accept) an overlay
    rocm-mla tune --show [--retime] [--out PATH]      # what the active overlay changes, its table
    rocm-mla tune --list-shapes [--shapes ...]

For each op the tuner splits the shapes into groups that one part of the op's config serves (a
decode stage-1 tier for 16-bit or fp8 caches, prefill's 16-bit config, the merge / RoPE+KV-write
implementation the op dispatches to), times the default and the candidates of each group on every
shape of the group, and keeps a winner only when

* its output matched the float32 reference on every shape (every candidate is checked before it
  is timed: a subset of rows of the timed call, against ``rocm_mla.reference``);
* it is at least 1% faster than the default over the group (geometric mean) and, timed again back
  to back with the default (alternating, median of 3), slower on no shape of the group: the
  default is always a candidate and wins ties;
* every config it changes compiles and passes the reference for the other dtypes it serves
  (small cases; the same check as ``--check``).

Candidates: the package's own tuning lists (``mla_decode``'s tiers and ``candidates``,
``mla_prefill``'s ``candidates``, the ``tune`` spaces of ``merge_attn_states`` and
``rope_kv_write``), then one coordinate-search pass over the arch's knobs (block sizes, warps,
stages, D_SPLIT, V_SPLIT, ctas_per_cu, CLAMP_PAGES, for fp8 caches RELOAD_K and, on NVIDIA with a
bf16 q, F16_DOT, and on gfx9 waves_per_eu, matrix_instr_nonkdim, kpack; the decode split cost model
and its reduce tile). ``--quick`` instead caps the candidates per group (the default included:
decode 3, prefill 4, merge 12, RoPE 33): listed ones first, then single-knob neighbours of the
default; on the ``quick`` shape preset.

Timing as perf/ does: decode as back-to-back replays of CUDA/HIP graphs of 8 calls rotating over
cache copies larger than the caches (each replay reads its KV from HBM); the others as one
captured call replayed under ``do_bench`` with L2 flushed before each replay. Ops are called
through their public entry points exactly as a serving process calls them; the candidate reaches
them through ``rocm_mla.configs.override`` (the same path an overlay takes).

The result is a config overlay (``rocm_mla/configs``: ``<arch>-<CUs>cu.json`` in
``$ROCM_MLA_CONFIG_DIR``, default ``~/.config/rocm_mla``; or ``--out PATH``), written after every
accepted group (``--max-minutes`` stops early and keeps what was accepted), with a ``_meta``
object: date, device, CU count, versions, and the default and tuned time of every shape. Processes
started afterwards use it; ``rocm-mla doctor`` shows what it changes.

On a machine without a GPU the tuner refuses to run unless ``--allow-cpu``: the Triton kernels
then run in the CPU interpreter and the "times" are interpreter wall times that say nothing about
any GPU (the mode exists to test the tuner itself, with ``--shapes tiny``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import configs as C
from ..ops.decode_plan import STAGE1_DEFAULTS, stage1_config, stage1_tier_index
from .bench_decode_inputs import SCALE as SCALE_DECODE  # the timed call's scale: its check uses it too
from .bench_decode_inputs import Setup, ours

OP_KEYS = {
    "decode": "mla_decode",
    "prefill": "mla_prefill",
    "merge": "merge_attn_states",
    "rope_kv_write": "rope_kv_write",
}
ALL_OPS = tuple(OP_KEYS)
# Former op names still accepted in --ops, shape specs and preset names (and read from older
# overlays' _meta): "rope_kv" is the rope_kv_write family's old short name.
OP_ALIASES = {"rope_kv": "rope_kv_write"}
MIN_GAIN = 0.01  # a winner beats the default by >= 1% (geomean over its group's shapes)
IN_LOOP_SLACK = 0.02  # while searching: no shape more than 2% slower (noise); the re-time is strict
ROUNDS = 3  # back-to-back re-time: default and winner alternately, median of each
QUICK_CAP = {"decode": 3, "prefill": 4, "merge": 12, "rope_kv_write": 33}  # candidates per group, default included
MAX_POS = 163840  # DeepSeek-V3: 4096 positions x YaRN factor 40

# --------------------------------------------------------------------------- shapes

PARAMS = {
    "decode": {"B": 128, "seq": 4096, "N": 16, "q": 1, "kv": "auto", "block": 64, "dt": "auto"},
    "prefill": {"B": 4, "L": 4096, "N": 16, "dt": "auto"},
    "merge": {"T": 32768, "N": 128, "D": 128, "layout": "strided", "dt": "auto"},
    "rope_kv_write": {"T": 4096, "N": 16, "kv": "auto", "block": 64, "dt": "auto"},
}
_HIDDEN_DEFAULTS = {"dt": "auto", "block": 64}  # left out of labels when default


@dataclass(frozen=True)
class Shape:
    """One shape of one op: ``op`` (decode, prefill, merge, rope_kv_write) and its parameters."""

    op: str
    items: tuple

    @staticmethod
    def make(op: str, **kw) -> Shape:
        op = OP_ALIASES.get(op, op)
        if op not in PARAMS:
            raise ValueError(f"unknown op {op!r} in a shape (ops: {', '.join(PARAMS)})")
        unknown = set(kw) - set(PARAMS[op])
        if unknown:
            raise ValueError(
                f"{op} shape: unknown parameter(s) {', '.join(sorted(unknown))} (known: {', '.join(PARAMS[op])})"
            )
        vals = dict(PARAMS[op])
        for k, v in kw.items():
            vals[k] = type(PARAMS[op][k])(v)
        return Shape(op, tuple(vals.items()))

    def __getitem__(self, k: str):
        return dict(self.items)[k]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.items if _HIDDEN_DEFAULTS.get(k, object()) != v)

    @property
    def key(self) -> str:
        return f"{self.op} {self.label}"


def _d(B, seq, N, q=1, kv="auto"):
    return f"decode:B={B},seq={seq},N={N},q={q},kv={kv}"


PRESETS: dict[str, list[str]] = {
    # DeepSeek-V3 serving. TP8: 128 heads / 8 = 16 per GPU; DP attention: all 128 heads per GPU.
    "tp8": [_d(B, 4096, 16, 1, kv) for kv in ("auto", "fp8") for B in (1, 32, 128)] + [_d(32, 16384, 16)],
    "dp": [_d(B, 4096, 128, 1, kv) for kv in ("auto", "fp8") for B in (1, 32, 128)],
    "mtp": [_d(128, 4096, 16, 2), _d(128, 4096, 16, 4), _d(32, 4096, 128, 2), _d(128, 4096, 16, 2, "fp8")],
    # perf/bench_prefill.py, bench_merge.py (the pad_v-strided D=128 merges prefill does), bench_rope_kv_write.py
    "prefill": [f"prefill:B={B},L={L},N={N}" for B, L in ((4, 4096), (1, 16384)) for N in (16, 128)],
    "merge": [f"merge:T={T},N={N},D=128,layout=strided" for T in (4096, 32768) for N in (16, 128)],
    "rope_kv_write": [
        f"rope_kv_write:T={T},N={N},kv={kv}"
        for T, N, kv in (
            (64, 16, "auto"),
            (64, 128, "auto"),
            (4096, 16, "auto"),
            (4096, 128, "auto"),
            (32768, 16, "auto"),
            (32768, 128, "auto"),
            (32768, 16, "fp8"),
        )
    ],
    # --quick: one or two shapes per group that matters (fits 10 minutes on one GPU with compiles)
    "quick": [
        _d(128, 4096, 16),
        _d(1, 4096, 16),
        _d(128, 4096, 16, 1, "fp8"),
        _d(128, 4096, 16, 2),
        _d(32, 4096, 128),
        _d(32, 4096, 128, 1, "fp8"),
        "prefill:B=4,L=4096,N=16",
        "prefill:B=4,L=4096,N=128",
        "merge:T=32768,N=128,D=128,layout=strided",
        "merge:T=4096,N=16,D=128,layout=strided",
        "rope_kv_write:T=4096,N=16",
        "rope_kv_write:T=32768,N=128",
        "rope_kv_write:T=4096,N=16,kv=fp8",
    ],
    # the CPU interpreter (tests of the tuner itself)
    "tiny": [
        "decode:B=2,seq=64,N=16,block=16",
        "prefill:B=1,L=48,N=2",
        "merge:T=40,N=4,D=128",
        "rope_kv_write:T=24,N=4,block=16",
    ],
}
PRESETS["deepseek-v3"] = (
    PRESETS["tp8"] + PRESETS["dp"] + PRESETS["mtp"] + PRESETS["prefill"] + PRESETS["merge"] + PRESETS["rope_kv_write"]
)


def parse_shapes(text: str) -> list[Shape]:
    """``PRESET[,PRESET...]`` and/or ``op:k=v,k=v`` specs, separated by ``;``."""
    out: list[Shape] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        if ":" in part:
            op, _, args = part.partition(":")
            kw = {}
            for a in (a.strip() for a in args.split(",")):
                if a:
                    k, eq, v = a.partition("=")
                    if not eq:
                        raise ValueError(f"shape {part!r}: expected k=v, got {a!r}")
                    kw[k.strip()] = v.strip()
            out.append(Shape.make(op.strip(), **kw))
            continue
        for name in (OP_ALIASES.get(n.strip(), n.strip()) for n in part.split(",")):
            if name not in PRESETS:
                raise ValueError(f"unknown shape preset {name!r} (presets: {', '.join(PRESETS)}; or op:k=v,...)")
            out += parse_shapes(";".join(PRESETS[name]))
    return list(dict.fromkeys(out))


# --------------------------------------------------------------------------- cases (inputs + checks)

_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def shape_dtype(s: Shape, dev: torch.device) -> torch.dtype:
    dt = s["dt"]
    if dt == "auto":  # bf16 dots are wrong in the Triton CPU interpreter (triton issue 11584)
        return torch.bfloat16 if dev.type == "cuda" else torch.float16
    if dt not in _DT:
        raise ValueError(f"{s.key}: dt must be auto, bf16, fp16 or fp32")
    return _DT[dt]


def rel_err(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float) -> str:
    """'' when max |got - ref| / (1 + |ref|) <= tol (equal infinities agree), else what failed."""
    got, ref = got.float(), ref.float()
    same_inf = torch.isinf(ref) & (got == ref)
    err = torch.where(same_inf, torch.zeros_like(ref), (got - ref).abs() / (1 + ref.abs()))
    e = float(err.max()) if err.numel() else 0.0
    return "" if e <= tol else f"{name} max err {e:.3g} > {tol:g}"


class Case:
    """Inputs of one shape; ``check()`` runs the op once and compares with the reference ('' = right);
    ``time_us()`` times it."""

    copies = 1

    def fn(self) -> None:
        raise NotImplementedError

    def call(self, i: int) -> None:
        self.fn()

    def check(self) -> str:
        raise NotImplementedError

    def time_us(self) -> float:
        from .benchutil import graph_ms, rotating_graph_us, wall_ms

        if self.dev.type != "cuda":
            return wall_ms(self.fn, reps=1) * 1e3
        if self.copies > 1:
            return rotating_graph_us(self.call, self.copies, min_ms=15, reps=3)
        return graph_ms(self.fn, warmup_ms=5, rep_ms=30) * 1e3


class DecodeCase(Case):
    """mla_decode as vLLM calls it, on perf/bench_decode.py's inputs (tools/bench_decode_inputs.Setup:
    ql_nope the [N, rows, 512] bmm output seen as [rows, N, 512], q_pe a slice of q [rows, N, 192],
    out/lse preallocated, shuffled pages, the same cold-cache copies); the fp8 cache handed over as
    uint8 with kv_cache_dtype "fp8", max_seq_len given."""

    def __init__(self, s: Shape, dev: torch.device):
        from .benchutil import cold_cache_bytes

        self.s, self.dev = s, dev
        dt = shape_dtype(s, dev)
        if s["kv"] not in ("auto", "fp8"):
            raise ValueError(f"{s.key}: kv must be auto or fp8")
        cold = cold_cache_bytes(dev) if dev.type == "cuda" else 0
        self.su = Setup(s["B"], s["seq"], s["N"], s["kv"], dev, cold, block=s["block"], q_len=s["q"], dtype=dt)
        self.copies, self.tol = self.su.R, _TOL[dt]
        self._call = ours(self.su)

    def call(self, i: int) -> None:
        self._call(i)

    def fn(self) -> None:
        self.call(0)

    def check(self) -> str:
        from ..reference import mla_decode_ref

        su = self.su
        self.call(0)
        nb = min(su.B, 2)
        r = nb * su.q_len
        ro, rl = mla_decode_ref(
            su.ql_nope[:r], su.q_pe[:r], su.caches[0], su.tables[0][:nb], su.seq_lens[:nb], SCALE_DECODE, su.k_scale
        )
        return rel_err("out", su.out[:r], ro, self.tol) or rel_err("lse", su.lse[:r], rl, 1e-3)


class PrefillCase(Case):
    """mla_prefill causal as the model lays it out: k_nope / v views of the [T, N, 256] kv_b_proj
    output, k_pe a slice of the [T, 576] latent buffer, out into a [T, N*128] buffer, lse [N, T]."""

    def __init__(self, s: Shape, dev: torch.device):
        self.s, self.dev = s, dev
        B, L, N = s["B"], s["L"], s["N"]
        dt = shape_dtype(s, dev)
        T = B * L
        self.L, self.tol = L, _TOL[dt]
        self.q = torch.randn(T, N, 192, device=dev, dtype=dt)
        kv = torch.randn(T, N, 256, device=dev, dtype=dt)
        self.k_nope, self.v = kv[..., :128], kv[..., 128:]
        self.k_pe = torch.randn(T, 576, device=dev, dtype=dt)[:, 512:].unsqueeze(1)
        self.cu = torch.arange(0, T + 1, L, dtype=torch.int32, device=dev)
        self.out = torch.empty(T, N * 128, device=dev, dtype=dt).view(T, N, 128)
        self.lse = torch.empty(N, T, device=dev, dtype=torch.float32)

    def fn(self) -> None:
        from ..ops import mla_prefill

        mla_prefill(
            self.q,
            self.k_nope,
            self.k_pe,
            self.v,
            self.cu,
            self.cu,
            sm_scale=192**-0.5,
            causal=True,
            out=self.out,
            lse=self.lse,
            max_seqlen_q=self.L,
            max_seqlen_k=self.L,
        )

    def check(self) -> str:
        # Causal with lq == lk: the first m queries of sequence 0 see only its first m keys.
        from ..reference import mla_prefill_ref

        self.fn()
        m = min(self.L, 128)
        cu = torch.tensor([0, m], dtype=torch.int32, device=self.dev)
        ro, rl = mla_prefill_ref(self.q[:m], self.k_nope[:m], self.k_pe[:m], self.v[:m], cu, cu, 192**-0.5, True)
        return rel_err("out", self.out[:m], ro, self.tol) or rel_err("lse", self.lse[:, :m], rl, 1e-3)


class MergeCase(Case):
    """merge_attn_states on [T, N, D] views ("strided": rows padded to D + 64, the pad_v layout),
    lse [N, T], output_lse written."""

    def __init__(self, s: Shape, dev: torch.device):
        self.s, self.dev = s, dev
        T, N, D = s["T"], s["N"], s["D"]
        dt = shape_dtype(s, dev)
        if s["layout"] not in ("strided", "contiguous"):
            raise ValueError(f"{s.key}: layout must be strided or contiguous")
        width = D + 64 if s["layout"] == "strided" else D
        mk = lambda: torch.randn(T, N, width, device=dev, dtype=dt)[..., :D]  # noqa: E731
        self.po, self.so, self.out = mk(), mk(), mk()
        self.pl, self.sl, self.ol = (torch.randn(N, T, device=dev) * 3 for _ in range(3))
        self.T, self.tol = T, _TOL[dt]

    def fn(self) -> None:
        from ..ops import merge_attn_states

        merge_attn_states(self.out, self.po, self.pl, self.so, self.sl, self.ol)

    def check(self) -> str:
        from ..reference import merge_attn_states_ref

        self.fn()
        r = min(self.T, 256)
        ro, rl = merge_attn_states_ref(self.po[:r], self.pl[:, :r], self.so[:r], self.sl[:, :r])
        return rel_err("output", self.out[:r], ro, self.tol) or rel_err("output_lse", self.ol[:, :r], rl, 1e-4)


class RopeCase(Case):
    """fused_rope_mla_kv_write on DeepSeek's layout (perf/bench_rope_kv_write.py): q_pe = q[..., 128:] of
    [T, N, 192], k_pe = kv_a[:, 512:] of [T, 576], cos_sin_cache in the model dtype, random
    positions, shuffled slots, cache [blocks, block, 576] (fp8: uint8 storage, k_scale 0.05)."""

    def __init__(self, s: Shape, dev: torch.device):
        from .. import _platform
        from ..reference.rope_kv_write import rope_cos_sin_cache

        self.s, self.dev = s, dev
        T, N, block = s["T"], s["N"], s["block"]
        dt = shape_dtype(s, dev)
        if s["kv"] not in ("auto", "fp8"):
            raise ValueError(f"{s.key}: kv must be auto or fp8")
        self.fp8 = C.platform_fp8_dtype(_platform.device_arch(dev)) if s["kv"] == "fp8" else None
        max_pos = MAX_POS if dev.type == "cuda" else 4096
        self.cos_sin = rope_cos_sin_cache(max_pos, dtype=dt, device=dev)
        self.q = torch.randn(T, N, 192, device=dev, dtype=dt)
        self.kv_a = torch.randn(T, 576, device=dev, dtype=dt)
        self.kv_c = torch.randn(T, 512, device=dev, dtype=dt)
        self.pos = torch.randint(0, max_pos, (T,), device=dev)
        nblk = (T * 5 // 4 + block - 1) // block + 1
        self.slots = torch.randperm(nblk * block, device=dev)[:T]
        self.cache = torch.zeros(nblk, block, 576, device=dev, dtype=dt)
        if self.fp8 is not None:
            self.cache = self.cache.to(self.fp8)
        self.k_scale = torch.tensor([0.05], device=dev)
        self.q_w, self.kv_w = self.q.clone(), self.kv_a.clone()  # the timed calls rotate these over and over
        self.T, self.block, self.tol = T, block, _TOL[dt]

    def _run(self, q, kv_a, cache) -> None:
        from ..ops import fused_rope_mla_kv_write

        fused_rope_mla_kv_write(
            self.pos,
            q[..., 128:],
            kv_a[:, 512:].unsqueeze(1),
            self.kv_c,
            self.cos_sin,
            cache.view(torch.uint8) if self.fp8 is not None else cache,
            self.slots,
            is_neox=False,
            kv_cache_dtype="fp8" if self.fp8 is not None else "auto",
            k_scale=self.k_scale,
        )

    def fn(self) -> None:
        self._run(self.q_w, self.kv_w, self.cache)

    def check(self) -> str:
        from ..reference.rope_kv_write import fused_rope_mla_kv_write_ref, quantize_fp8_ref

        qc, kc, cc = self.q.clone(), self.kv_a.clone(), self.cache.clone()
        self._run(qc, kc, cc)
        r = min(self.T, 256)
        q_ref, k_ref, rows = fused_rope_mla_kv_write_ref(
            self.pos[:r], self.q[:r, :, 128:], self.kv_a[:r, 512:], self.kv_c[:r], self.cos_sin, is_neox=False
        )
        sl = self.slots[:r]
        got = cc.view(torch.uint8)[sl // self.block, sl % self.block]
        if self.fp8 is not None:
            got = got.view(self.fp8).float() * self.k_scale
            want, tol = quantize_fp8_ref(rows, self.k_scale, self.fp8).float() * self.k_scale, 0.13
        else:
            got, want, tol = got.view(self.cache.dtype), rows, self.tol
        return (
            rel_err("q_pe", qc[:r, :, 128:], q_ref, self.tol)
            or rel_err("k_pe", kc[:r, 512:], k_ref, self.tol)
            or rel_err("cache rows", got, want, tol)
        )


CASES = {"decode": DecodeCase, "prefill": PrefillCase, "merge": MergeCase, "rope_kv_write": RopeCase}

# --------------------------------------------------------------------------- groups


def _key(p: dict) -> str:
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
    seen, out = {_key(p0)}, []
    for p in points:
        if _key(p) not in seen:
            seen.add(_key(p))
            out.append(p)
    diff = lambda p: sum(p.get(k) != p0.get(k) for k in set(p) | set(p0))  # noqa: E731
    return sorted(out, key=diff)


@dataclass
class Group:
    """Shapes one part of an op's config serves, and the candidate values of that part."""

    op: str  # decode, prefill, merge, rope_kv_write
    name: str
    shapes: list[Shape]
    point0: dict  # the package's value of the part (the default)
    listed: list[dict]  # the package's candidates for it
    knobs: list[tuple[str, list]]  # coordinate-search axes (full mode)
    build: Callable[[dict], dict | None]  # point -> complete arch object of the op (None: cannot express)
    label: Callable[[dict], str]
    results: dict[str, dict] = field(default_factory=dict)  # _key(point) -> {"point", "times", "error"}
    status: str = "pending"
    winner: dict | None = None
    impl_pending: bool = False  # merge / rope_kv_write: the implementation is chosen when the group is reached
    fix: Callable[[dict], dict] = lambda p: p  # makes a generated point consistent (e.g. V_SPLIT 2 needs D_SPLIT 2)

    @property
    def op_key(self) -> str:
        return OP_KEYS[self.op]


# decode: stage-1 tiers, per q dtype x cache kind combination
_COMBOS = (
    (torch.bfloat16, False),
    (torch.float16, False),
    (torch.float32, False),
    (torch.bfloat16, True),
    (torch.float16, True),
)


def _norm(d: dict) -> dict:
    return {**STAGE1_DEFAULTS, **d}


def _diff(target: dict, base: dict) -> dict | None:
    """Fields that turn ``base`` into ``target`` (None when a field of base cannot be removed)."""
    t, b = _norm(target), _norm(base)
    if set(b) - set(t):
        return None
    return {k: target.get(k, STAGE1_DEFAULTS.get(k)) for k in t if b.get(k) != t[k]}


def compose_tier(arch: str, tier: dict, combo: tuple, point: dict) -> dict | None:
    """A stage-1 tier whose resolved config for ``combo`` (q dtype, fp8 cache) is ``point`` while
    every other combination resolves as in ``tier`` (float16 q without fp8 shares the 16-bit
    top level); None when the tier schema cannot express that."""
    res = lambda t, c: stage1_config(arch, 0, c[0], c[1], t)  # noqa: E731
    want = {c: res(tier, c) for c in _COMBOS}
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
    if "fp8+qk" in tier:  # quantize_q's overrides: not tuned here, kept as they are
        new["fp8+qk"] = dict(tier["fp8+qk"])
    try:
        if any(_norm(res(new, c)) != _norm(want[c]) for c in _COMBOS):
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


def _decode_groups(t: Tuner, shapes: list[Shape]) -> list[Group]:
    from ..variants.decode import tuning_candidates

    arch, gfx = t.arch, C.is_amd_arch(t.arch)
    pkg = t.package["mla_decode"]
    tiers = pkg["stage1"]
    by: dict[tuple, list[Shape]] = {}
    for s in shapes:
        dt = shape_dtype(s, t.dev)
        m = s["q"] * s["N"]
        ti = stage1_tier_index(tiers, m)
        combo = (dt, s["kv"] == "fp8")
        if combo == (torch.float16, False):
            combo = (torch.bfloat16, False)  # the same 16-bit top level
        by.setdefault((ti, combo), []).append(s)
    cands = tuning_candidates(arch)
    groups = []
    for (ti, combo), ss in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1][1], str(kv[0][1][0]))):
        h = tiers[ti]["BLOCK_H"]
        p0 = stage1_config(arch, 0, combo[0], combo[1], tiers[ti])
        ok = (lambda p: 16 <= p["BLOCK_H"] <= h) if combo[1] else (lambda p: p["BLOCK_H"] == h)
        listed = _nearest_first(
            p0, [p for c in cands for p in [stage1_config(arch, 0, combo[0], combo[1], c)] if ok(p)]
        )
        # most promising first: --quick tries single-knob neighbours of the default in this order
        knobs = [("BLOCK_N", [16, 32, 64]), ("num_warps", [4, 8])]
        if gfx:
            knobs += [("waves_per_eu", [0, 1, 2])]
        knobs += [("num_stages", [1, 2] if gfx else [2, 3, 4, 5]), ("D_SPLIT", [1, 2])]
        if gfx:
            knobs += [("kpack", [1, 2]), ("matrix_instr_nonkdim", [16, 32])]
        knobs += [("ctas_per_cu", [1, 2]), ("V_SPLIT", [1, 2]), ("CLAMP_PAGES", [False, True])]
        if combo[1]:
            knobs += [("RELOAD_K", [False, True])]
            if not gfx and combo[0] == torch.bfloat16:
                knobs += [("F16_DOT", [False, True])]
        knobs = [(k, v) for k, v in knobs if k in p0 or k in STAGE1_DEFAULTS]

        def build(p, ti=ti, combo=combo):
            obj = t.current["mla_decode"]
            tier = compose_tier(arch, obj["stage1"][ti], combo, p)
            if tier is None:
                return None
            return {**obj, "stage1": [tier if i == ti else x for i, x in enumerate(obj["stage1"])]}

        qname = "" if combo[0] == torch.bfloat16 else f"{str(combo[0]).replace('torch.', '')} q, "
        name = f"stage1[{ti}] H{h} {qname}{'fp8' if combo[1] else '16-bit'} cache"
        groups.append(Group("decode", name, ss, p0, listed, knobs, build, decode_label, fix=_decode_fix))
    if not t.quick and shapes:
        for part, knobs in (
            (
                "split",
                [
                    ("max_splits", [16, 32, 64, 128]),
                    ("min_tokens_per_split", [32, 64, 128]),
                    ("fixed_tiles", [1, 2, 4]),
                    ("launch_tiles", [2, 3, 4, 6]),
                ],
            ),
            ("stage2", [("num_warps", [4, 8]), ("tile_elems", [2048, 4096, 8192]), ("max_block_s", [16, 32, 64])]),
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


def _prefill_groups(t: Tuner, shapes: list[Shape]) -> list[Group]:
    from ..variants.prefill import config_label

    gfx = C.is_amd_arch(t.arch)
    pkg = t.package["mla_prefill"]
    by: dict[str, list[Shape]] = {}
    for s in shapes:
        by.setdefault("triton_fp32" if shape_dtype(s, t.dev) == torch.float32 else "triton", []).append(s)
    groups = []
    for key, ss in by.items():
        p0 = dict(pkg[key])
        listed = _nearest_first(p0, [dict(c) for c in pkg.get("candidates", [])]) if key == "triton" else []
        knobs = [("BLOCK_N", [16, 32] if key == "triton_fp32" else [32, 64, 128]), ("num_warps", [4, 8])]
        if gfx:
            knobs += [("waves_per_eu", [0, 1, 2])]
        knobs += [
            ("num_stages", [1, 2] if gfx else [1, 2, 3, 4]),
            ("BLOCK_M", [16, 32, 64] if key == "triton_fp32" else [64, 128]),
        ]
        if gfx:
            knobs += [("matrix_instr_nonkdim", [16, 32]), ("kpack", [1, 2])]
        knobs = [(k, v) for k, v in knobs if k in p0 or k in ("num_stages",)]
        groups.append(
            Group(
                "prefill",
                key,
                ss,
                p0,
                listed,
                knobs,
                lambda p, key=key: {**t.current["mla_prefill"], key: p},
                config_label,
            )
        )
    return groups


def _impl_groups(t: Tuner, op: str, shapes: list[Shape]) -> list[Group]:
    """merge / rope_kv_write: the implementation the op dispatches to here, over the package's tune space."""
    from ..ops._dispatch import select

    op_key = OP_KEYS[op]
    impl = select(op_key, t.dev)
    if impl == "reference":
        t.log(f"{op}: only the reference runs here; nothing to tune")
        return []
    pkg = t.package[op_key]
    p0 = dict(pkg[impl])
    space = C.tune_space(op_key).get(impl, {})
    listed = [{**p0, **c} for c in C.tune_candidates(op_key).get(impl, [])] if space else []
    listed = _nearest_first(p0, listed)
    knobs = []
    if impl == "triton":
        knobs = [(k, v) for k, v in space.items()]
        if C.is_amd_arch(t.arch):
            knobs.append(("waves_per_eu", [0, 1, 2]))
        if op == "rope_kv_write":
            knobs.append(("max_tokens", [4, 8, 16]))
    else:
        knobs = [(k, v) for k, v in space.items()]
    return [
        Group(
            op,
            impl,
            list(shapes),
            p0,
            listed,
            knobs,
            lambda p: {**t.current[op_key], impl: p},
            lambda p: f"{impl} {_short(p, _SHORT)}",
        )
    ]


# --------------------------------------------------------------------------- verification of changed configs


def _small_decode(dev, arch, dt, fp8: bool, n: int, splits) -> str:
    """One small paged decode (3 requests, uneven lengths, block 64, q_len 1) against the reference."""
    from ..ops import mla_decode
    from ..reference import mla_decode_ref

    g = torch.Generator().manual_seed(7)
    lens, block = [150, 7, 64], 64
    nblk = [-(-L // block) for L in lens]
    pages = sum(nblk) + 1
    kv = torch.randn(pages, block, 576, generator=g)
    bt = torch.zeros(len(lens), max(nblk), dtype=torch.int32)
    perm = torch.randperm(pages, generator=g)
    k = 0
    for b, nb in enumerate(nblk):
        bt[b, :nb] = perm[k : k + nb].int()
        k += nb
    ks = None
    if fp8:
        kv = (kv / 0.05).clamp(-200, 200).to(C.platform_fp8_dtype(arch))
        ks = torch.tensor([0.05], device=dev)
    else:
        kv = kv.to(dt)
    kv, bt = kv.to(dev), bt.to(dev)
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    qn = torch.randn(len(lens), n, 512, generator=g).to(dt).to(dev)
    qp = torch.randn(len(lens), n, 64, generator=g).to(dt).to(dev)
    out, lse = mla_decode(
        qn,
        qp,
        kv.view(torch.uint8) if fp8 else kv,
        bt,
        sl,
        sm_scale=SCALE_DECODE,
        kv_cache_dtype="fp8" if fp8 else "auto",
        k_scale=ks,
        num_kv_splits=splits,
    )
    ro, rl = mla_decode_ref(qn, qp, kv, bt, sl, SCALE_DECODE, ks)
    return rel_err("out", out, ro, _TOL[dt]) or rel_err("lse", lse, rl, 1e-3)


def _small_prefill(dev, dt, causal: bool) -> str:
    from ..ops import mla_prefill
    from ..reference import mla_prefill_ref

    g = torch.Generator().manual_seed(7)
    lq, lk, N = [37, 0, 20, 5], [37, 6, 45, 5], 4
    cu = lambda ls: torch.tensor([sum(ls[:i]) for i in range(len(ls) + 1)], dtype=torch.int32, device=dev)  # noqa: E731
    q = torch.randn(sum(lq), N, 192, generator=g).to(dt).to(dev)
    kv = torch.randn(sum(lk), N, 256, generator=g).to(dt).to(dev)
    kpe = torch.randn(sum(lk), 576, generator=g).to(dt).to(dev)[:, 512:].unsqueeze(1)
    args = (q, kv[..., :128], kpe, kv[..., 128:], cu(lq), cu(lk))
    out, lse = mla_prefill(*args, sm_scale=192**-0.5, causal=causal)
    ro, rl = mla_prefill_ref(*args, 192**-0.5, causal)
    return rel_err("out", out, ro, _TOL[dt]) or rel_err("lse", lse, rl, 1e-3)


def _small_merge(dev, dt, d: int, backend: str | None) -> str:
    from ..ops import merge_attn_states
    from ..reference import merge_attn_states_ref

    g = torch.Generator().manual_seed(7)
    T, N = 37, 8
    po, so = (torch.randn(T, N, d + 64, generator=g).to(dt).to(dev)[..., :d] for _ in range(2))
    pl, sl = (torch.randn(N, T, generator=g).mul(3).to(dev) for _ in range(2))
    out = torch.empty(T, N, d, dtype=dt, device=dev)
    ol = torch.empty(N, T, device=dev)
    merge_attn_states(out, po, pl, so, sl, ol, backend=backend)
    ro, rl = merge_attn_states_ref(po, pl, so, sl)
    return rel_err("output", out, ro, _TOL[dt]) or rel_err("output_lse", ol, rl, 1e-4)


def _small_rope(dev, arch, dt, n: int, fp8: bool, neox: bool, backend: str | None) -> str:
    from ..ops import fused_rope_mla_kv_write
    from ..reference.rope_kv_write import fused_rope_mla_kv_write_ref, quantize_fp8_ref, rope_cos_sin_cache

    g = torch.Generator().manual_seed(7)
    T, block, max_pos = 37, 16, 4096
    q = torch.randn(T, n, 192, generator=g).to(dt).to(dev)
    kv_a = torch.randn(T, 576, generator=g).to(dt).to(dev)
    kv_c = torch.randn(T, 512, generator=g).to(dt).to(dev)
    pos = torch.randint(0, max_pos, (T,), generator=g).to(dev)
    cs = rope_cos_sin_cache(max_pos, device=dev)
    nblk = T // block + 2
    slots = torch.randperm(nblk * block, generator=g)[:T].to(dev)
    f8 = C.platform_fp8_dtype(arch) if fp8 else None
    cache = torch.zeros(nblk, block, 576, dtype=dt, device=dev)
    if f8 is not None:
        cache = cache.to(f8)
    ks = torch.tensor([0.5], device=dev)
    q_ref, k_ref, rows = fused_rope_mla_kv_write_ref(pos, q[..., 128:], kv_a[:, 512:], kv_c, cs, is_neox=neox)
    fused_rope_mla_kv_write(
        pos,
        q[..., 128:],
        kv_a[:, 512:].unsqueeze(1),
        kv_c,
        cs,
        cache.view(torch.uint8) if fp8 else cache,
        slots,
        is_neox=neox,
        kv_cache_dtype="fp8" if fp8 else "auto",
        k_scale=ks,
        backend=backend,
    )
    got = cache.view(torch.uint8)[slots // block, slots % block]
    if f8 is not None:
        got, want, tol = got.view(f8).float() * ks, quantize_fp8_ref(rows, ks, f8).float() * ks, 0.07
    else:
        got, want, tol = got.view(dt), rows, _TOL[dt]
    return (
        rel_err("q_pe", q[..., 128:], q_ref, _TOL[dt])
        or rel_err("k_pe", kv_a[:, 512:], k_ref, _TOL[dt])
        or rel_err("cache rows", got, want, tol)
    )


def _dtypes(dev) -> list[torch.dtype]:
    return ([torch.bfloat16] if dev.type == "cuda" else []) + [torch.float16, torch.float32]


def verification_cases(
    op_key: str, arch: str, dev: torch.device, old: dict, new: dict
) -> list[tuple[str, Callable[[], str]]]:
    """(what, check) for every launch config of ``new`` that differs from ``old`` (both complete
    arch objects of ``op_key``): small calls through the public op against the float32 reference."""
    from ..ops._dispatch import unavailable

    where = f"{op_key}.{arch}"
    out: list[tuple[str, Callable[[], str]]] = []
    general = any(new.get(k) != old.get(k) for k in set(new) | set(old) if k not in ("stage1", "candidates"))
    if op_key == "mla_decode":
        tiers, old_tiers = new["stage1"], old.get("stage1", [])
        for ti, tier in enumerate(tiers):
            for qdt, fp8 in _COMBOS:
                if qdt not in _dtypes(dev):
                    continue
                cfg = stage1_config(arch, 0, qdt, fp8, tier)
                same = (
                    ti < len(old_tiers)
                    and len(tiers) == len(old_tiers)
                    and _norm(stage1_config(arch, 0, qdt, fp8, old_tiers[ti])) == _norm(cfg)
                )
                if same and not general:
                    continue
                n = tier["BLOCK_H"]
                for splits in (1, 3):
                    what = f"{where}.stage1[{ti}] q={str(qdt)[6:]} cache={'fp8' if fp8 else 'q dtype'} N={n} S={splits}"
                    out.append((what, lambda qdt=qdt, fp8=fp8, n=n, s=splits: _small_decode(dev, arch, qdt, fp8, n, s)))
        if general:
            for n, s in ((16, None), (128, None), (16, 40)):
                out.append(
                    (
                        f"{where} N={n} S={s or 'auto'}",
                        lambda n=n, s=s: _small_decode(dev, arch, _dtypes(dev)[0], False, n, s),
                    )
                )
    elif op_key == "mla_prefill":
        for key, dts in (("triton", [d for d in _dtypes(dev) if d != torch.float32]), ("triton_fp32", [torch.float32])):
            if new.get(key) == old.get(key) and new.get("backend_order") == old.get("backend_order"):
                continue
            for dt in dts:
                for causal in (True, False):
                    out.append(
                        (
                            f"{where}.{key} {str(dt)[6:]} {'causal' if causal else 'full'}",
                            lambda dt=dt, c=causal: _small_prefill(dev, dt, c),
                        )
                    )
    elif op_key in ("merge_attn_states", "rope_kv_write"):
        impls = [b for b in ("hip", "triton") if new.get(b) != old.get(b) and unavailable(b, dev) is None]
        if new.get("backend_order") != old.get("backend_order"):
            impls.append(None)
        for b in impls:
            tag = f".{b}" if b else " (default dispatch)"
            for dt in _dtypes(dev):
                if op_key == "merge_attn_states":
                    for d in (128, 512):
                        out.append(
                            (f"{where}{tag} {str(dt)[6:]} D={d}", lambda dt=dt, d=d, b=b: _small_merge(dev, dt, d, b))
                        )
                elif dt != torch.float32:
                    for n, fp8, neox in ((16, False, False), (128, False, False), (16, True, False), (16, False, True)):
                        out.append(
                            (
                                f"{where}{tag} {str(dt)[6:]} N={n}{' fp8' if fp8 else ''}{' neox' if neox else ''}",
                                lambda dt=dt, n=n, f=fp8, x=neox, b=b: _small_rope(dev, arch, dt, n, f, x, b),
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
                _sync_or_raise(dev)
                errors.append(C.OverlayCompileError(what, _exc_text(exc)))
                continue
            if bad:
                errors.append(C.OverlayReferenceError(what, bad))
    return errors


def _exc_text(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if len(lines) > 1:
        text += " ... " + lines[-1]
    return f"{type(exc).__name__}: {text[:300]}"


def _sync_or_raise(dev: torch.device) -> None:
    """After a failed call: a sticky device error (the context is gone) ends the run."""
    if dev.type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- the tuner


def _geo(vals) -> float:
    vals = list(vals)
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else 1.0


def _obj_diff(base: Any, new: Any) -> Any:
    """What an overlay must hold to turn ``base`` into ``new``: changed fields of objects, whole
    values otherwise (None when equal)."""
    if isinstance(base, dict) and isinstance(new, dict):
        out = {}
        for k, v in new.items():
            if k not in base:
                out[k] = v
            elif base[k] != v:
                out[k] = _obj_diff(base[k], v)
        return out or None
    return None if base == new else new


def _fmt_s(sec: float) -> str:
    sec = max(0, int(sec))
    return f"{sec // 60}:{sec % 60:02d}"


class Tuner:
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
        from .. import _platform

        self.dev, self.ops, self.quick, self.out_path, self.argv, self.log = dev, ops, quick, out_path, argv, log
        self.arch = _platform.device_arch(dev)
        self.cus = C.device_compute_units(self.arch)
        self.shapes = [s for s in shapes if s.op in ops]
        self.max_candidates = max_candidates
        self.timer = timer or (lambda case: case.time_us())
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
            torch.manual_seed(0)
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
                _sync_or_raise(self.dev)
                return None, _exc_text(exc)

    # ---- groups
    def plan(self) -> None:
        by_op: dict[str, list[Shape]] = {}
        for s in self.shapes:
            by_op.setdefault(s.op, []).append(s)
        for op in ALL_OPS:
            if op not in self.ops or op not in by_op:
                continue
            if op == "decode":
                self.groups += _decode_groups(self, by_op[op])
            elif op == "prefill":
                self.groups += _prefill_groups(self, by_op[op])
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
            space = C.tune_space(g.op_key)
            order = self.package[g.op_key]["backend_order"] if self.dev.type == "cuda" else ["triton"]
            impl = next((b for b in order if b in space), "triton")
            n = 1 + math.prod(len(v) for v in space.get(impl, {}).values())
        return min(n, self.cap(g))

    @staticmethod
    def neighbours(g: Group) -> list[dict]:
        """Single-knob changes of the default, one value of each knob before the next value of any."""
        alts = [(k, [v for v in vs if v != g.point0.get(k, STAGE1_DEFAULTS.get(k))]) for k, vs in g.knobs]
        out = []
        for r in range(max((len(a) for _, a in alts), default=0)):
            out += [g.fix({**g.point0, k: a[r]}) for k, a in alts if r < len(a)]
        return out

    def evaluate(self, g: Group, p: dict, idx: int) -> dict:
        k = _key(p)
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
        d0 = g.results.get(_key(g.point0), {}).get("times", {})
        if r["error"]:
            res = f"FAILED {r['error'][:160]}"
        else:
            ts = "/".join(f"{v:.1f}" for v in r["times"].values())
            rel = ""
            if d0 and len(d0) == len(r["times"]) and _key(p) != _key(g.point0):
                rel = f" ({_geo(d0[k] / r['times'][k] for k in d0):.3f}x the default's speed)"
            res = f"{ts} us{rel}"
        tag = "default" if _key(p) == _key(g.point0) else f"#{idx}"
        self.log(
            f"[{self.done:3d}/{plan:3d} {bar} {_fmt_s(el)} elapsed, ETA {_fmt_s(eta)}] {g.op} {g.name} "
            f"{tag} {g.label(p)}: {res}"
        )

    def score(self, g: Group, r: dict) -> float | None:
        """geomean time ratio to the default over the group's shapes; None when not eligible."""
        d0 = g.results[_key(g.point0)]["times"]
        if r["error"] or len(r["times"]) != len(d0):
            return None
        ratios = [r["times"][k] / d0[k] for k in d0]
        if any(x > 1 + IN_LOOP_SLACK for x in ratios):
            return None
        return _geo(ratios)

    def best(self, g: Group) -> dict:
        best, best_s = g.point0, 1.0
        for r in g.results.values():
            sc = self.score(g, r)
            if sc is not None and sc < best_s - 1e-9:
                best, best_s = r["point"], sc
        return best

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
                if _key(p) not in g.results:
                    idx += 1
                    self.evaluate(g, p, idx)
        else:
            for knob, values in g.knobs:
                base = self.best(g)
                for v in values:
                    if len(g.results) >= cap or self.out_of_time():
                        break
                    p = g.fix({**base, knob: v})
                    if base.get(knob, STAGE1_DEFAULTS.get(knob)) == v or _key(p) in g.results:
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
        d0 = g.results[_key(g.point0)]["times"]
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
            geo = _geo(ratios.values())
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

    def resolve_impl_group(self, g: Group) -> list[Group]:
        if not g.impl_pending:
            return [g]
        new = _impl_groups(self, g.op, g.shapes)
        self.planned += sum(self.count(x) for x in new) - self.count(g)
        return new

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
        from .. import _ext

        if getattr(_ext, "is_loaded", lambda: False)():
            return None
        th = threading.Thread(target=_ext.load, name="hip-build", daemon=True)
        th.start()
        return th

    def device_name(self) -> str:
        from .benchutil import device_name

        return device_name(self.dev)

    # ---- the overlay
    def overlay(self) -> dict:
        data: dict[str, Any] = {}
        for op_key, obj in self.current.items():
            entry = _obj_diff(self.package[op_key], obj)
            if entry:
                data[op_key] = {self.arch: entry}
        v = C.software_versions()
        meta = {
            "schema": C.OVERLAY_SCHEMA_VERSION,
            "arch": self.arch,
            "cus": self.cus,
            "device": self.device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": v,
            "command": "rocm-mla tune " + " ".join(self.argv),
            "mode": "quick" if self.quick else "full",
            "complete": not self.stopped and all(g.status != "pending" for g in self.groups),
            "stopped": self.stopped,
            "seconds": round(time.monotonic() - self.t0, 1),
            "groups": [
                {
                    "op": g.op_key,
                    "name": g.name,
                    "shapes": [s.key for s in g.shapes],
                    "candidates_timed": len(g.results),
                    "status": g.status,
                    "winner": g.label(g.winner) if g.winner else None,
                }
                for g in self.groups
            ],
            "shapes": {
                k: {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in r.items()}
                for k, r in self.rows.items()
            },
        }
        if self.dev.type != "cuda":
            meta["note"] = "CPU interpreter run: times are meaningless"
        data["_meta"] = meta
        return C.stamp_overlay(data, by="rocm-mla tune")

    def write(self) -> dict:
        data = self.overlay()
        keep = self.kept_entries()
        for op_key, entry in keep.items():
            data.setdefault(op_key, entry)
        if keep:
            data = C.stamp_overlay(data, by="rocm-mla tune")
        write_json(self.out_path, data)
        return data

    def kept_entries(self) -> dict:
        """Entries of ops this run did not tune, kept from a valid overlay already at out_path."""
        if not hasattr(self, "_kept"):
            self._kept = {}
            tuned = {OP_KEYS[o] for o in self.ops}
            if self.out_path.is_file():
                try:
                    old = C.read_overlay(self.out_path)
                    if not C.validate_overlay(old, self.arch, self.cus):
                        self._kept = {k: v for k, v in old.items() if k in C.SCHEMAS and k not in tuned}
                        for k, r in (old.get("_meta", {}).get("shapes") or {}).items():
                            if r.get("op") in self._kept:
                                self.rows.setdefault(k, r)
                except C.OverlayError:
                    pass
        return self._kept


def write_json(path: Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def print_result_table(rows: dict[str, dict], log: Callable[[str], None] = print, title: str = "") -> None:
    """default vs tuned per shape (times in us), the tuned config last."""
    order = list(OP_KEYS.values())
    body = []
    for r in sorted(rows.values(), key=lambda r: (order.index(r["op"]) if r["op"] in order else 9, r["shape"])):
        d, t = r["default_us"], r["tuned_us"]
        body.append(
            [r["shape"], f"{d:.1f}", f"{t:.1f}", f"{d / t:.3f}x" if t else "-", r.get("note", ""), r.get("config", "-")]
        )
    if title:
        log(title)
    head = ["shape", "default us", "tuned us", "speed-up", "note", "tuned config"]
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]

    def fmt(cells):
        return "  ".join(
            str(c).rjust(w) if 0 < i < 4 else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    log(fmt(head))
    log(fmt(["-" * w for w in widths]))
    for row in body:
        log(fmt(row))


# --------------------------------------------------------------------------- --check / --show


def target_path(args, arch: str, cus: int | None) -> Path | None:
    if args.out:
        p = Path(args.out).expanduser()
        return p / C.overlay_filename(arch, cus) if p.is_dir() else p
    d = C.overlay_dir()
    if d is None:
        return None
    return d if d.suffix == ".json" else d / C.overlay_filename(arch, cus)


def check_main(args, dev: torch.device, log=print) -> int:
    from .. import _platform

    arch = _platform.device_arch(dev)
    cus = C.device_compute_units(arch)
    path = Path(args.out).expanduser() if args.out else C.find_overlay(arch, cus)[0]
    if path is None:
        searched = C.find_overlay(arch, cus)[1]
        log(
            f"no overlay for this device ({arch}, {cus or '-'} CUs); "
            f"searched: {', '.join(searched) or 'nothing (overlays off)'}"
        )
        return 0
    log(f"checking {path} for {arch} ({cus or '-'} CUs) on {dev}")
    try:
        data = C.read_overlay(path)
    except C.OverlayError as exc:
        log(f"  {exc.name}: {exc}")
        return 1
    errors = C.validate_overlay(data, arch, cus, check_stamp=False)
    if not errors:
        with C.overlays_disabled():
            for op_key, entry in data.items():
                if op_key in C.SCHEMAS:
                    base = C.package_config(op_key, arch)
                    new = C.merge_overlay(base, entry[arch])
                    n = len(verification_cases(op_key, arch, dev, base, new))
                    log(f"  {op_key}: {n} compile + reference case(s)")
                    errors += verify(op_key, arch, dev, base, new)
    stamp = C.stamp_problems(data)
    for e in errors:
        log(f"  {e.name}: {e}")
    if errors:
        log(f"FAILED: {len(errors)} problem(s); at run time this overlay is ignored (one OverlayWarning)")
        return 1
    if stamp and args.stamp:
        write_json(path, C.stamp_overlay(data, by="rocm-mla tune --check --stamp"))
        log("  every config compiles and matches the reference: stamped as verified; processes started now use it")
        return 0
    for e in stamp:
        log(f"  {e.name}: {e}")
    if stamp:
        log("the configs are good, but the overlay is not used until stamped (--check --stamp)")
        return 1
    log("OK: well formed, for this device, every changed config compiles and matches the reference, stamp valid")
    return 0


def show_main(args, dev: torch.device, log=print) -> int:
    """What the overlay the loader sees changes, and its table; --retime times default vs overlay in
    this process (the overlay reached through config_for, as a serving process reaches it)."""
    from .. import _platform

    arch = _platform.device_arch(dev)
    if args.out:
        os.environ[C.OVERLAY_ENV] = str(Path(args.out).expanduser())
        C.reload_overlays()
    st = C.overlay_status(arch)
    for line in describe_overlay(st):
        log(line)
    data = st.data
    if data is None:
        return 1 if st.error is not None else 0
    rows = dict((data.get("_meta") or {}).get("shapes") or {})
    if args.retime and rows:
        if dev.type != "cuda" and not args.allow_cpu:
            log("--retime needs a GPU (or --allow-cpu)")
            return 2
        t = Tuner(
            dev,
            list(ALL_OPS),
            [],
            quick=True,
            max_minutes=None,
            max_candidates=None,
            out_path=Path(os.devnull),
            argv=[],
            log=log,
        )
        shapes = {}
        for k in rows:
            op, _, rest = k.partition(" ")
            shapes[k] = Shape.make(op, **dict(kv.split("=", 1) for kv in rest.split()))
        new_rows = {}
        for k, s in shapes.items():
            op_key = OP_KEYS[s.op]
            with C.overlays_disabled():
                d = C.package_config(op_key, arch)
            tuned = C.config_for(op_key, arch)  # through the loader
            if tuned == d:
                continue
            told, tnew = [], []
            for rnd in range(ROUNDS):
                for which in (0, 1) if rnd % 2 == 0 else (1, 0):
                    if which == 0:
                        with C.overlays_disabled():
                            us, err = t.measure(op_key, d, s, check=False)
                        told.append(us)
                    else:
                        case = t.case(s)
                        us = case.time_us()  # no override: config_for reads the overlay
                        tnew.append(us)
            t.drop_cases()
            med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
            new_rows[k] = {**rows[k], "default_us": med(told), "tuned_us": med(tnew), "note": "re-timed now"}
        rows.update(new_rows)
        print_result_table(
            rows,
            log,
            f"\ndefault vs tuned, re-timed in this process ({len(new_rows)} shapes with a "
            f"changed config; the rest from the tuning run's _meta):",
        )
    elif rows:
        meta = data["_meta"]
        print_result_table(
            rows,
            log,
            f"\ndefault vs tuned per shape (tuning run of {meta.get('date')} on "
            f"{meta.get('device')}, {meta.get('mode')} mode):",
        )
    return 0


def describe_overlay(st: C.OverlayStatus) -> list[str]:
    """Lines for ``rocm-mla doctor`` and ``tune --show``: which overlay is active, what it changes."""
    d = C.overlay_dir()
    if d is None:
        return ["config overlay: off (ROCM_MLA_CONFIG_DIR is empty)"]
    if st.path is None:
        return [f"config overlay: none for {st.arch} ({st.cus or '-'} CUs) in {d} (rocm-mla tune writes one)"]
    if st.error is not None:
        return [f"config overlay: {st.path} IGNORED: {st.error.name}: {st.error}"]
    meta = st.data.get("_meta", {})
    lines = [
        f"config overlay: {st.path} ACTIVE (tuned {meta.get('date', '?')} on {meta.get('device', '?')}, "
        f"{meta.get('mode', '?')} mode{'' if meta.get('complete', True) else ', stopped early'})"
    ]
    changes = []
    for op_key, entry in st.data.items():
        if op_key in C.SCHEMAS:
            changes += C.overlay_changes(op_key, C.package_config(op_key, st.arch), entry[st.arch])
    lines += [f"  {c}" for c in changes] or ["  changes nothing (the package's configs were fastest)"]
    return lines


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rocm-mla tune", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--ops",
        default=",".join(ALL_OPS),
        help="comma-separated: decode, prefill, merge, rope_kv_write (rope_kv: the same)",
    )
    ap.add_argument(
        "--shapes",
        default=None,
        help="presets (" + ", ".join(PRESETS) + "; default: deepseek-v3, "
        "--quick: quick) and/or ';'-separated specs like 'decode:B=64,seq=8192,N=16,q=1,kv=fp8'",
    )
    ap.add_argument("--quick", action="store_true", help="listed candidates only, capped per group; the quick preset")
    ap.add_argument("--max-minutes", type=float, default=None, help="hard stop: keeps and writes what was accepted")
    ap.add_argument("--max-candidates", type=int, default=None, help="candidates per group, the default included")
    ap.add_argument(
        "--out", default=None, help="overlay file to write/check/show (default: the config dir's <arch>-<CUs>cu.json)"
    )
    ap.add_argument(
        "--allow-cpu", action="store_true", help="run without a GPU (Triton interpreter; times meaningless)"
    )
    ap.add_argument("--check", action="store_true", help="validate the overlay: schema, arch, compile, reference")
    ap.add_argument("--stamp", action="store_true", help="with --check: accept a valid overlay (write its stamp)")
    ap.add_argument("--show", action="store_true", help="which overlay is active, what it changes, its table")
    ap.add_argument("--retime", action="store_true", help="with --show: time default vs the overlay in this process")
    ap.add_argument("--list-shapes", action="store_true", help="print the shapes and exit")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    has_gpu = torch.cuda.is_available()
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    dev = torch.device("cuda", torch.cuda.current_device()) if has_gpu else torch.device("cpu")
    ops = [OP_ALIASES.get(o.strip(), o.strip()) for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OP_KEYS]
    if bad:
        print(f"rocm-mla tune: unknown op(s) {', '.join(bad)} (ops: {', '.join(ALL_OPS)})", file=sys.stderr)
        return 2
    try:
        shapes = parse_shapes(args.shapes or ("quick" if args.quick else ("deepseek-v3" if has_gpu else "tiny")))
    except ValueError as exc:
        print(f"rocm-mla tune: --shapes: {exc}", file=sys.stderr)
        return 2
    if args.list_shapes:
        for s in shapes:
            if s.op in ops:
                print(s.key)
        return 0
    if args.check:
        if not has_gpu and not args.allow_cpu:
            print("rocm-mla tune --check: no GPU; --allow-cpu checks in the Triton interpreter", file=sys.stderr)
            return 2
        return check_main(args, dev)
    if args.show:
        return show_main(args, dev)
    if not has_gpu and not args.allow_cpu:
        print(
            "rocm-mla tune: no GPU visible to torch. Tuning times kernels on the GPU it tunes for; "
            "--allow-cpu runs the Triton interpreter instead (its times mean nothing; for testing)",
            file=sys.stderr,
        )
        return 2
    from .. import _platform

    arch = _platform.device_arch(dev)
    cus = C.device_compute_units(arch)
    out = target_path(args, arch, cus)
    if out is None:
        print("rocm-mla tune: overlays are off (ROCM_MLA_CONFIG_DIR is empty): pass --out PATH", file=sys.stderr)
        return 2
    tuner = Tuner(
        dev,
        ops,
        shapes,
        quick=args.quick,
        max_minutes=args.max_minutes,
        max_candidates=args.max_candidates,
        out_path=out,
        argv=argv,
    )
    try:
        tuner.run()
    except Exception as exc:  # e.g. a sticky device error: the context is gone
        print(
            f"\nrocm-mla tune stopped: {_exc_text(exc)}\n{out} holds the groups accepted before it "
            "(each was checked and stamped when written)",
            file=sys.stderr,
        )
        raise
    print("\ngroups:")
    for g in tuner.groups:
        print(
            f"  {g.op:8s} {g.name:40s} {len(g.results):3d} timed  {g.status}"
            + (f": {g.label(g.winner)}" if g.winner else "")
        )
    print(
        f"\nwrote {out} ({time.monotonic() - tuner.t0:.0f} s{'; ' + tuner.stopped if tuner.stopped else ''}). "
        "Processes started from now on use it; `rocm-mla doctor` / `rocm-mla tune --show` show what it changes; "
        "ROCM_MLA_CONFIG_DIR= turns it off."
    )
    found = C.find_overlay(arch, cus)[0]
    if C.overlay_dir() is None:
        print("note: overlays are off in this environment (ROCM_MLA_CONFIG_DIR is empty)")
    elif found is None or found.resolve() != out.resolve():
        print(
            f"note: the loader reads {found or C.overlay_dir()}, not this file: set ROCM_MLA_CONFIG_DIR={out} "
            f"(a .json value names the file) or move it to {C.overlay_dir()}/{C.overlay_filename(arch, cus)}"
        )
    print_result_table(
        tuner.rows,
        print,
        "\ndefault vs tuned per shape (us; tuned is never slower: the default "
        "wins ties and every winner was re-timed back to back):",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
