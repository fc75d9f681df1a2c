"""The shapes the tuner times: ``Shape`` (one op, its parameters and q's dtype), the named
``PRESETS`` (shape sets of ``rocm_mla.cases``: DeepSeek-V3, V3.2 and V4 serving, the lightning
indexer's and the op benches' shapes) and ``parse_shapes`` for ``--shapes``. ``Shape.case_shape``
is the ``rocm_mla.cases`` shape the timed inputs are built from; ``Shape.from_case`` the other
way."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rocm_mla.cases import decode, indexer_topk, merge, prefill, rope_kv_write, sparse, v4_attention

OP_KEYS = {
    "decode": "mla_decode",
    "prefill": "mla_prefill",
    "merge": "merge_attn_states",
    "rope_kv_write": "rope_kv_write",
    "sparse": "mla_sparse_attention",
    "indexer": "mla_indexer_topk",
    "v4": "mla_v4_attention",
}
ALL_OPS = tuple(OP_KEYS)
# "rope_kv" is accepted for rope_kv_write in --ops, shape specs, preset names and overlays' _meta.
OP_ALIASES = {"rope_kv": "rope_kv_write"}
CASE_MODULES = {
    "decode": decode,
    "prefill": prefill,
    "merge": merge,
    "rope_kv_write": rope_kv_write,
    "sparse": sparse,
    "indexer": indexer_topk,
    "v4": v4_attention,
}

# The parameters of a shape spec and their defaults. dt "auto": bf16 on a GPU, fp16 in the CPU
# interpreter (its bf16 dots are wrong: triton issue 11584).
PARAMS = {
    "decode": {"B": 128, "seq": 4096, "N": 16, "q": 1, "kv": "auto", "block": 64, "dt": "auto"},
    # geo: the head geometry by name (rocm_mla.cases.prefill.GEOMETRIES: deepseek, glm-lite, nope64, norope)
    "prefill": {"B": 4, "L": 4096, "N": 16, "geo": "deepseek", "dt": "auto"},
    "merge": {"T": 32768, "N": 128, "D": 128, "layout": "strided", "dt": "auto"},
    "rope_kv_write": {"T": 4096, "N": 16, "kv": "auto", "block": 64, "dt": "auto"},
    # B requests of ctx keys, q query rows each (decode 1, MTP 2..8, a prefill chunk more), K list
    # entries per row (rocm_mla.cases.sparse.SparseShape.decode); mode "paged" or "slots"
    "sparse": {
        "B": 128,
        "ctx": 8192,
        "N": 16,
        "q": 1,
        "K": 2048,
        "kv": "auto",
        "block": 64,
        "mode": "paged",
        "dt": "auto",
    },
    # B requests of ctx keys, q query rows each (decode 1, MTP 2, a prefill chunk many), H indexer
    # heads, topk kept (rocm_mla.cases.indexer_topk.IndexerShape.decode); q and the cache in the
    # platform's fp8 kind (no dt)
    "indexer": {"B": 128, "ctx": 32768, "H": 64, "q": 1, "topk": 2048, "block": 64},
    # B requests of ctx tokens, q query rows each, H heads, the layer kind (window, csa, hca: its
    # window list alone, plus topk compressed rows, plus all of them), kv "fp8" (fp8_ds_mla caches,
    # the kinds vLLM's writers use) or "auto" (q's dtype), window-cache pages of block tokens
    # (rocm_mla.cases.v4_attention.V4Shape.decode: window 128, the sink and the inverse RoPE on)
    "v4": {
        "B": 128,
        "ctx": 32768,
        "H": 16,
        "q": 1,
        "kind": "csa",
        "topk": 512,
        "kv": "fp8",
        "block": 64,
        "dt": "auto",
    },
}
# left out of labels when default
_HIDDEN_DEFAULTS = {"dt": "auto", "block": 64, "geo": "deepseek", "mode": "paged"}
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Shape:
    """One shape of one op: ``op`` (decode, prefill, merge, rope_kv_write, sparse, indexer, v4) and
    its parameters."""

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

    @staticmethod
    def from_case(op: str, cs) -> Shape:
        """The tuner's shape of a ``rocm_mla.cases`` shape (one the spec can say: uniform lengths,
        DeepSeek's q width, the merge layout's own lse layout, sparse, indexer and v4 requests of
        one length and one row count, v4's defaults beyond the spec's parameters); ValueError
        otherwise."""
        if op == "decode" and cs.lens is None:
            return Shape.make(op, B=cs.B, seq=cs.seq, N=cs.N, q=cs.q_len, kv=cs.kv, block=cs.block)
        geo = {d: k for k, d in prefill.GEOMETRIES.items()}.get(getattr(cs, "dims", None))
        if op == "prefill" and geo and cs.causal and cs.lq and cs.lk == cs.lq and len(set(cs.lq)) == 1:
            return Shape.make(op, B=len(cs.lq), L=cs.lq[0], N=cs.N, geo=geo)
        if op == "merge" and cs.lse is None:
            return Shape.make(op, T=cs.T, N=cs.N, D=cs.D, layout=cs.layout)
        if op == "rope_kv_write" and cs.q_width == 192:
            return Shape.make(op, T=cs.T, N=cs.N, kv=cs.kv, block=cs.block)
        if op == "sparse" and cs.lens and len(set(cs.lens)) == 1 and len(set(cs.rows)) == 1:
            s = Shape.make(
                op, B=len(cs.lens), ctx=cs.lens[0], N=cs.N, q=cs.rows[0], K=cs.K, kv=cs.kv, block=cs.block, mode=cs.mode
            )
            if s.case_shape == cs:  # not when the case carries a name (a spec has none)
                return s
        if op == "indexer" and cs.lens and len(set(cs.lens)) == 1 and len(set(cs.rows)) == 1:
            s = Shape.make(op, B=len(cs.lens), ctx=cs.lens[0], H=cs.H, q=cs.rows[0], topk=cs.topk, block=cs.block)
            if s.case_shape == cs:
                return s
        if op == "v4" and cs.lens and len(set(cs.lens)) == 1 and len(set(cs.rows)) == 1:
            s = Shape.make(
                op, B=len(cs.lens), ctx=cs.lens[0], H=cs.H, q=cs.rows[0], kind=cs.kind, topk=cs.topk, kv=cs.kv,
                block=cs.block,
            )  # fmt: skip
            if s.case_shape == cs:  # not when the case sets more (a ratio, ragged lists, holes, a name)
                return s
        raise ValueError(f"{op} shape {cs!r}: not expressible as a tuning shape")

    def __getitem__(self, k: str):
        return dict(self.items)[k]

    @property
    def case_shape(self):
        """The ``rocm_mla.cases`` shape of this one (DecodeShape, PrefillShape, MergeShape, RopeShape,
        SparseShape, IndexerShape, V4Shape)."""
        p = dict(self.items)
        if self.op == "decode":
            return decode.DecodeShape(p["B"], p["seq"], p["N"], p["q"], block=p["block"], kv=p["kv"])
        if self.op == "prefill":
            if p["geo"] not in prefill.GEOMETRIES:
                raise ValueError(f"{self.key}: geo must be one of {', '.join(prefill.GEOMETRIES)}")
            return prefill.PrefillShape.equal(p["B"], p["L"], p["N"], prefill.GEOMETRIES[p["geo"]])
        if self.op == "merge":
            return merge.MergeShape(p["T"], p["N"], p["D"], p["layout"])
        if self.op == "sparse":
            return sparse.SparseShape.decode(
                p["B"], p["ctx"], p["N"], p["q"], K=p["K"], kv=p["kv"], block=p["block"], mode=p["mode"]
            )
        if self.op == "indexer":
            return indexer_topk.IndexerShape.decode(p["B"], p["ctx"], p["H"], p["q"], topk=p["topk"], block=p["block"])
        if self.op == "v4":
            return v4_attention.V4Shape.decode(
                p["B"], p["ctx"], p["H"], p["q"], kind=p["kind"], topk=p["topk"], kv=p["kv"], block=p["block"]
            )
        return rope_kv_write.RopeShape(p["T"], p["N"], block=p["block"], kv=p["kv"])

    def dtype(self, dev: torch.device) -> torch.dtype:
        """q's dtype on ``dev`` (see PARAMS; the indexer's q is fp8, the platform's kind: no dt)."""
        dt = self["dt"]
        if dt == "auto":
            return torch.bfloat16 if dev.type == "cuda" else torch.float16
        if dt not in _DT:
            raise ValueError(f"{self.key}: dt must be auto, bf16, fp16 or fp32")
        return _DT[dt]

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.items if _HIDDEN_DEFAULTS.get(k, object()) != v)

    @property
    def key(self) -> str:
        return f"{self.op} {self.label}"


def _sets(*names: tuple[str, str]) -> list[Shape]:
    return [Shape.from_case(op, cs) for op, name in names for cs in CASE_MODULES[op].SHAPES[name]]


_SERVING = (("decode", "tp8"), ("decode", "dp"), ("decode", "mtp"))
_OPS = (("prefill", "tune"), ("merge", "tune"), ("rope_kv_write", "tune"))
# The CPU interpreter's sparse shape: rocm_mla.cases.sparse's "tiny" set has requests of uneven
# lengths, which a spec cannot say; this is its uniform counterpart (2 requests, K 32, block 16).
_SPARSE_TINY = Shape.make("sparse", B=2, ctx=64, N=16, K=32, block=16)
# The same for rocm_mla.cases.indexer_topk's "tiny" set: one request of 300 keys, one row (several
# splits on the interpreter's grid, so the merge runs too), topk 48.
_INDEXER_TINY = Shape.make("indexer", B=1, ctx=300, H=32, topk=48, block=16)
# And for rocm_mla.cases.v4_attention's "tiny" set: 2 requests of 150 tokens, a CSA layer (the
# window's 128 rows and 16 of the 37 compressed ones), 16 heads, window pages of 16 tokens.
_V4_TINY = Shape.make("v4", B=2, ctx=150, H=16, kind="csa", topk=16, block=16)
_TINY_OWN = {"sparse": _SPARSE_TINY, "indexer": _INDEXER_TINY, "v4": _V4_TINY}
# The ops whose --quick shapes are their tune set.
_TUNE_IS_QUICK = ("indexer", "v4")


def _tiny() -> list[Shape]:
    return [s for op in ALL_OPS for s in ([_TINY_OWN[op]] if op in _TINY_OWN else _sets((op, "tiny")))]


# Preset -> shapes, each a named set of rocm_mla.cases (<op>.SHAPES[name]).
PRESETS: dict[str, list[Shape]] = {
    # DeepSeek-V3 serving (decode.SHAPES): TP8 (16 heads per GPU), DP attention (128), MTP rows.
    "tp8": _sets(("decode", "tp8")),
    "dp": _sets(("decode", "dp")),
    "mtp": _sets(("decode", "mtp")),
    # The prefill chunks, the pad_v-strided D=128 merges prefill does, the RoPE+KV-write token counts.
    "prefill": _sets(("prefill", "tune")),
    # The other MLA head geometries' prefill (GLM-4.x-Lite 192/64/256, 64/64/128, 256/0/256), 4x4096 N=16/128.
    "prefill-geometry": _sets(("prefill", "tune-geometry")),
    "merge": _sets(("merge", "tune")),
    "rope_kv_write": _sets(("rope_kv_write", "tune")),
    # Sparse MLA: one shape per tier and cache kind that serving runs (decode, MTP, a prefill chunk).
    "sparse": _sets(("sparse", "tune")),
    # The lightning indexer (H 64): 128 x 32K decode rows, one 128K request, an 8192-row prefill chunk.
    "indexer": _sets(("indexer", "tune")),
    # DeepSeek-V4 attention: one decode shape per layer kind and tier that serving runs.
    "v4": _sets(("v4", "tune")),
    # --quick: one or two shapes per group that matters (fits 10 minutes on one GPU with compiles);
    # the indexer's one group: its tune set (its quick set is the bench's); v4: its tune set (one
    # or two shapes per tier)
    "quick": _sets(*((op, "tune" if op in _TUNE_IS_QUICK else "quick") for op in ALL_OPS)),
    # the CPU interpreter (tests of the tuner itself; sparse and indexer: _TINY_OWN)
    "tiny": _tiny(),
    "deepseek-v3": _sets(*_SERVING, *_OPS),
    # DeepSeek-V3.2 / GLM-5 serving (sparse.SHAPES["tune"]): TP8 (8 and 16 heads), DP (128), MTP
    # rows, an fp8 cache, a prefill chunk; and its lightning indexer (indexer_topk.SHAPES["tune"]).
    "deepseek-v3.2": _sets(("sparse", "tune"), ("indexer", "tune")),
    # DeepSeek-V4 serving (v4_attention.SHAPES["tune"]): CSA top-512 / top-1024, HCA and window
    # layers at 8, 16, 64 and 128 heads.
    "deepseek-v4": _sets(("v4", "tune")),
}


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
            out += PRESETS[name]
    return list(dict.fromkeys(out))
