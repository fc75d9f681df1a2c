"""The shapes the tuner times: ``Shape`` (one op and its parameters), the named ``PRESETS``
(DeepSeek-V3 serving and the op benches' shapes) and ``parse_shapes`` for ``--shapes``."""

from __future__ import annotations

from dataclasses import dataclass

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
