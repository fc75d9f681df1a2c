"""mla_v4_attention's cases: the shapes, the inputs as vLLM's DeepSeek-V4 layer holds them, the
fp8_ds_mla encoder, the tolerance, the check.

Inputs (:func:`make_inputs`): B requests holding ``lens[b]`` tokens, the last ``rows[b]`` of them
query rows (decode 1, MTP 2 / 4, a prefill chunk many). Row t of request b stands at position p and
sees the window positions ``max(0, p - window + 1) .. p`` (in order, a dense ``[T, window]`` list
padded with -1) and, by the layer's kind, the compressed rows ``0 .. (p + 1) // ratio - 1``: CSA
``topk`` distinct ones in random order (all of them when fewer), HCA all of them in order (dense
width the most any row has), -1 padded. Each cache has its own shuffled block table (page ids
handed out at random) and the lists hold GLOBAL slots of their cache (page x block_size + offset),
as vLLM hands them over; ``ragged``: ``indices [nnz]`` + ``indptr [T + 1]`` instead (padding
dropped). ``holes`` / ``dups``: that fraction of a row's entries set to -1 / to a copy of another of
its entries (a repeat counts twice), also in the middle of a list.

Caches: fp8_ds_mla (``kv="fp8"``; uint8 ``[num_pages, block_size, 584]``, the layout of
rocm_mla.reference.v4_attention, written by :func:`fp8_ds_mla_write`, vLLM's writer byte for byte)
of their own e4m3 kinds, or ``[num_pages, block_size, 512]`` in q's dtype (``kv="auto"``). A window
cache holds the pages the rows' windows reach (older pages are vLLM's freed ones); every slot no
list can name (page tails, positions before the first window, spare pages, a wider page's pad) is
poisoned: NaN codes in the e4m3 bytes (0x7F e4m3fn, 0x80 e4m3fnuz), bf16 NaN in the RoPE bytes,
0xFF scales, NaN in a 16-bit cache. Cache rows are fresh normal values rounded to bf16 (RoPE part
too); q fresh normal values scaled so that the scores are O(1..5); attn_sink per ``sink``;
positions the rows' positions with a real-angle ``cos_sin_cache [P, 64]`` (cos | sin, P past the
last position) when ``rope``; out ``[T, H, 512]`` and lse ``[T, H]`` NaN-poisoned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..reference.rope_kv_write import rope_cos_sin_cache
from ..reference.v4_attention import V4_DATA_BYTES, V4_DIM, V4_NOPE, V4_ROW_BYTES, V4_SCALE_BYTES
from ._buffers import SENTINEL, poisoned
from ._compare import NORM, Bound, Checked, Comparison, compare, dtype_name, with_plan
from ._paged import RequestRows, device_generator, platform_fp8, randn, row_requests

SM_SCALE = 1.0 / math.sqrt(V4_DIM)  # DeepSeek-V4: head_dim ** -0.5
# q's standard deviation: the scores sm_scale x q . k (k ~ N(0, 1) over 512 values) then have this one.
Q_STD = 1.5

# The arithmetic of mla_decode over other rows (fp8 rows decode exactly in q's dtype: e4m3 x a
# power of two, bf16 RoPE; the same dots, online softmax and roundings of p, V and out; the sink
# and the rotation in float32 before out's one rounding), so decode's bounds (the rule:
# rocm_mla.cases._compare). lse: 1e-3 absolute (float32 sums of exact products).
TOLERANCE: dict[torch.dtype, dict[str, Bound]] = {
    torch.float32: {"out": Bound(1e-4, 1e-4, norm=NORM[torch.float32]), "lse": Bound(1e-3, 0.0)},
    torch.float16: {"out": Bound(4e-3, 4e-3, norm=NORM[torch.float16]), "lse": Bound(1e-3, 0.0)},
    torch.bfloat16: {"out": Bound(2e-2, 2e-2, norm=NORM[torch.bfloat16]), "lse": Bound(1e-3, 0.0)},
}
# The float64 reference (rounded once to float32) against a float64 formula of the tests.
DENSE_F64 = Bound(1e-6, 1e-6)

KINDS = ("window", "csa", "hca")
SINKS = ("none", "finite", "large", "neginf")
FP8_KINDS = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
# The largest magnitude vLLM's fp8_ds_mla writer stores per kind (e4m3fnuz: 224, not 240).
FP8_DS_MLA_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 224.0}
# The NaN code of each kind (e4m3fnuz has one NaN: the negative-zero code).
FP8_NAN_CODE = {torch.float8_e4m3fn: 0x7F, torch.float8_e4m3fnuz: 0x80}
BF16_NAN_BYTES = (0xC0, 0x7F)  # 0x7FC0, little-endian
SCALE_POISON = 0xFF  # a poisoned slot's scale bytes (2^128: inf)
AMAX_FLOOR = 1e-4  # the writer's floor of a 64-value block's absmax
_DEFAULT_RATIO = {"window": 0, "csa": 4, "hca": 128}
_DEFAULT_CBLOCK = {"window": 0, "csa": 64, "hca": 2}  # compressed rows per page: 256 tokens

Q_LAYOUTS = ("contiguous", "padded", "heads_major")
OUT_LAYOUTS = ("contiguous", "padded", "token_pad")
LSE_LAYOUTS = ("contiguous", "transposed")
# mla_v4_attention's own keywords; every other keyword a case call takes is a plan knob.
CALL_KEYS = ("sm_scale", "plan", "out", "lse", "workspace")
# Rows per step when drawing lists / values (bounds the temporaries of serving shapes).
_ROW_STEP = 256
_VALUE_STEP = 1 << 18


# ---------------------------------------------------------------- the fp8_ds_mla encoder
def fp8_ds_mla_encode(rows: torch.Tensor, kind: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's fp8_ds_mla row encoding of ``rows [n, 512]`` (rounded to bf16 first, as the writer
    takes them): ``(data [n, 576] uint8, scales [n, 8] uint8)``.

    Per 64-value NoPE block i (values ``[64i, 64i + 64)`` of the first 448): ``amax = max(absmax,
    1e-4)``, ``e = ceil(log2(amax / fmax))`` (float32; fmax 448 for e4m3fn, 224 for e4m3fnuz), the
    codes ``(x / 2^e)`` clamped to +-fmax and cast to ``kind`` (round to nearest even; e4m3fnuz
    never gets 0x80, its NaN, for a zero), scale byte i ``clamp(e + 127, 0, 255)``; byte 7 is 0. Then
    the 64 bf16 RoPE values as 128 little-endian bytes. ``rows`` should be finite.
    """
    if kind not in FP8_DS_MLA_MAX:
        raise TypeError(f"fp8_ds_mla_encode: kind: expected torch.float8_e4m3fn or _e4m3fnuz, got {kind}")
    if rows.dim() != 2 or rows.shape[1] != V4_DIM:
        raise ValueError(f"fp8_ds_mla_encode: rows: expected [n, 512], got {list(rows.shape)}")
    n, fmax = rows.shape[0], FP8_DS_MLA_MAX[kind]
    x = rows.to(torch.bfloat16)
    nope = x[:, :V4_NOPE].float().view(n, V4_NOPE // 64, 64)
    amax = nope.abs().amax(dim=-1).clamp_min(AMAX_FLOOR) if n else torch.zeros(0, V4_NOPE // 64, device=x.device)
    exponent = torch.ceil(torch.log2(amax / fmax))
    codes = (nope / torch.exp2(exponent)[..., None]).clamp(-fmax, fmax).to(kind).view(torch.uint8)
    if kind == torch.float8_e4m3fnuz:  # a negative zero: the one code that is not a number
        codes = torch.where(codes == 0x80, torch.zeros_like(codes), codes)
    data = torch.cat([codes.view(n, V4_NOPE), x[:, V4_NOPE:].contiguous().view(torch.uint8)], dim=1)
    scales = torch.zeros(n, V4_SCALE_BYTES, dtype=torch.uint8, device=x.device)
    scales[:, : V4_NOPE // 64] = (exponent + 127).clamp(0, 255).to(torch.uint8)
    return data, scales


def fp8_ds_mla_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data [num_blocks, block_size, 576], scales [num_blocks, block_size, 8])``: views of an
    fp8_ds_mla cache's bytes (uint8 ``[num_blocks, block_size, 584]``, strides ``(>= block_size x
    584, 584, 1)``): token p of page b has its data at ``b x stride(0) + p x 576``, its scales at
    ``b x stride(0) + block_size x 576 + p x 8``."""
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != V4_ROW_BYTES:
        raise ValueError(f"fp8_ds_mla_views: cache: expected uint8 [num_blocks, block_size, 584], got "
                         f"{cache.dtype} {list(cache.shape)}")  # fmt: skip
    nb, bs, _ = cache.shape
    if nb * bs and (cache.stride(2) != 1 or cache.stride(1) != V4_ROW_BYTES):
        raise ValueError(f"fp8_ds_mla_views: cache: expected strides (s, 584, 1), got {cache.stride()}")
    pages = cache.flatten(1)
    data = pages[:, : bs * V4_DATA_BYTES].unflatten(1, (bs, V4_DATA_BYTES))
    scales = pages[:, bs * V4_DATA_BYTES : bs * V4_ROW_BYTES].unflatten(1, (bs, V4_SCALE_BYTES))
    return data, scales


def fp8_ds_mla_write(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, kind: torch.dtype) -> None:
    """Write ``rows [n, 512]`` (rounded to bf16) into the global ``slots [n]`` (page x block_size +
    offset; < 0 skipped) of an fp8_ds_mla ``cache`` in the e4m3 ``kind``, as vLLM 0.34's writer does
    (:func:`fp8_ds_mla_encode`; the layout: :func:`fp8_ds_mla_views`). Raises ValueError for a
    slot past the cache."""
    data, scales = fp8_ds_mla_views(cache)
    nb, bs, _ = cache.shape
    slots = slots.reshape(-1).long().to(cache.device)
    if rows.shape[0] != slots.shape[0]:
        raise ValueError(f"fp8_ds_mla_write: slots: expected {rows.shape[0]} (one per row), got {slots.shape[0]}")
    keep = slots >= 0
    if bool((slots[keep] >= nb * bs).any()):
        raise ValueError(f"fp8_ds_mla_write: slots: expected < num_blocks x block_size = {nb * bs}")
    s = slots[keep]
    d, sc = fp8_ds_mla_encode(rows.to(cache.device)[keep], kind)
    data[s // bs, s % bs] = d
    scales[s // bs, s % bs] = sc


def fp8_ds_mla_poison(cache: torch.Tensor, kind: torch.dtype) -> None:
    """Fill every slot of an fp8_ds_mla cache with NaN: the kind's NaN code in the e4m3 bytes, bf16
    NaN in the RoPE bytes, 0xFF scales."""
    data, scales = fp8_ds_mla_views(cache)
    data[..., :V4_NOPE] = FP8_NAN_CODE[kind]
    data[..., V4_NOPE::2] = BF16_NAN_BYTES[0]
    data[..., V4_NOPE + 1 :: 2] = BF16_NAN_BYTES[1]
    scales.fill_(SCALE_POISON)


# ---------------------------------------------------------------- shapes
@dataclass(frozen=True)
class V4Shape(RequestRows):
    """B requests holding ``lens[b]`` tokens, ``rows[b]`` query rows each (an int: the same for every
    request), H heads, a layer ``kind`` ("window": the window list alone; "csa": plus ``topk`` of the
    rows compressed ``ratio``:1 (default 4); "hca": plus all of them, ratio default 128), a ``window``
    of 128 positions, window-cache pages of ``block`` tokens, compressed-cache pages of ``cblock``
    compressed rows (default 256 tokens: 64 for CSA, 2 for HCA), ``kv`` "fp8" (fp8_ds_mla caches of
    the kinds ``window_fp8`` / ``compressed_fp8``, "e4m3fn" / "e4m3fnuz"; None: the platform's kind
    for the window cache, e4m3fn for the compressed one, as vLLM's writers) or "auto" (q's dtype),
    ``ragged`` (True, "window" or "compressed": those lists as indices + indptr), ``holes`` / ``dups``
    (fractions of a row's entries -1 / repeated), ``sink`` ("none": no attn_sink; "finite"; "large":
    6..12 above the scores, head 0 at 200; "neginf": all -inf) and ``rope`` (positions and
    cos_sin_cache given)."""

    lens: tuple[int, ...]
    rows: tuple[int, ...] | int = 1
    H: int = 16
    kind: str = "csa"
    topk: int = 512
    ratio: int = 0
    window: int = 128
    block: int = 64
    cblock: int = 0
    kv: str = "fp8"
    window_fp8: str | None = None
    compressed_fp8: str | None = None
    ragged: bool | str = False
    holes: float = 0.0
    dups: float = 0.0
    sink: str = "finite"
    rope: bool = True
    name: str = ""

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        for arg, v, ok in (("kind", self.kind, KINDS), ("kv", self.kv, ("auto", "fp8")), ("sink", self.sink, SINKS),
                           ("window_fp8", self.window_fp8, (None, *FP8_KINDS)),
                           ("compressed_fp8", self.compressed_fp8, (None, *FP8_KINDS)),
                           ("ragged", self.ragged, (False, True, "window", "compressed"))):  # fmt: skip
            if v not in ok or (arg == "ragged" and not isinstance(v, (bool, str))):
                raise ValueError(f"{name}: {arg}: expected one of {ok}, got {v!r}")
        if self.ratio == 0:
            object.__setattr__(self, "ratio", _DEFAULT_RATIO[self.kind])
        if self.cblock == 0:
            object.__setattr__(self, "cblock", _DEFAULT_CBLOCK[self.kind])
        for arg, v, lo in (("H", self.H, 1), ("window", self.window, 1), ("block", self.block, 1),
                           ("topk", self.topk, 0)):  # fmt: skip
            if not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}: {arg}: expected an int >= {lo}, got {v!r}")
        if self.compressed and (self.ratio < 1 or self.cblock < 1):
            raise ValueError(f"{name}: ratio and cblock: expected >= 1 for a {self.kind} layer")
        if not (0.0 <= self.holes and 0.0 <= self.dups and self.holes + self.dups <= 1.0):
            raise ValueError(f"{name}: holes, dups: expected fractions summing to <= 1")

    @property
    def compressed(self) -> bool:
        """Whether the layer reads a compressed cache (CSA, HCA)."""
        return self.kind != "window"

    @property
    def fp8(self) -> bool:
        return self.kv == "fp8"

    @property
    def window_ragged(self) -> bool:
        return self.ragged in (True, "window")

    @property
    def compressed_ragged(self) -> bool:
        return self.compressed and self.ragged in (True, "compressed")

    def positions(self) -> list[int]:
        """Each row's position, rows in order."""
        return [n - r + i for n, r in zip(self.lens, self.rows) for i in range(r)]

    def window_counts(self) -> list[int]:
        """Window entries each row names (before holes)."""
        return [min(p + 1, self.window) for p in self.positions()]

    def compressed_counts(self) -> list[int]:
        """Compressed entries each row names (before holes): CSA at most topk of its visible rows."""
        if not self.compressed:
            return [0] * self.T
        vis = [(p + 1) // self.ratio for p in self.positions()]
        return [min(v, self.topk) for v in vis] if self.kind == "csa" else vis

    def compressed_width(self) -> int:
        """Dense compressed lists' width: topk (CSA), the most rows a row sees (HCA), 0 (window)."""
        if self.kind == "csa":
            return self.topk
        return max(self.compressed_counts(), default=0) if self.kind == "hca" else 0

    def entries(self) -> int:
        """Entries named summed over every row (before holes)."""
        return sum(self.window_counts()) + sum(self.compressed_counts())

    def label(self, dtype: torch.dtype = torch.bfloat16) -> str:
        """``"fp8 csa512 B=128 ctx=32768 H=16"`` (+ ``q2`` for MTP rows, ``T=`` for a prefill chunk,
        then what differs from the defaults)."""
        if self.name:
            return self.name
        head, rows = self.label_parts()
        kind = f"csa{self.topk}" if self.kind == "csa" else self.kind
        tail = f" block={self.block}" if self.block != 64 else ""
        tail += f" cblock={self.cblock}" if self.compressed and self.cblock != _DEFAULT_CBLOCK[self.kind] else ""
        tail += f" ratio={self.ratio}" if self.compressed and self.ratio != _DEFAULT_RATIO[self.kind] else ""
        tail += f" window={self.window}" if self.window != 128 else ""
        tail += {False: "", True: " ragged", "window": " ragged-window", "compressed": " ragged-compressed"}[
            self.ragged
        ]
        tail += f" sink={self.sink}" if self.sink != "finite" else ""
        tail += "" if self.rope else " norope"
        return f"{'fp8' if self.fp8 else dtype_name(dtype)} {kind} {head} H={self.H}{rows}{tail}"

    def row_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one cache row: 584 (fp8_ds_mla) or 512 values of q's dtype."""
        return V4_ROW_BYTES if self.fp8 else V4_DIM * dtype.itemsize

    def set_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one copy's used pages, both caches (what cold-cache rotation must exceed)."""
        pages = 0
        for n, r in zip(self.lens, self.rows):
            first = max(0, n - r - self.window + 1)
            pages += (n - 1) // self.block - first // self.block + 1 if n else 0
        slots = pages * self.block
        if self.compressed:
            slots += sum(-(-(n // self.ratio) // self.cblock) for n in self.lens) * self.cblock
        return slots * self.row_bytes(dtype)

    def nbytes(self, dtype: torch.dtype) -> float:
        """Bytes one call must move: every named cache row once per row that names it, the lists, q
        in, out and lse back (rows of one request share window rows, which L2 serves)."""
        qb = dtype.itemsize
        lists = self.T * (self.window + self.compressed_width()) * 4
        return self.entries() * self.row_bytes(dtype) + lists + self.T * self.H * (2 * V4_DIM * qb + 4)

    def flops(self) -> float:
        return 2.0 * self.H * self.entries() * (V4_DIM + V4_DIM)


def _decode(B: int, ctx: int, H: int, kind: str, rows: int = 1, **kw) -> V4Shape:
    return V4Shape.decode(B, ctx, H, rows, kind=kind, **kw)


# Contexts of the serving shapes: CSA sees 8192 compressed rows of 32K tokens (topk of them), HCA
# 8192 rows of 1M tokens (8192 x 128), the window layer 128 positions of 32K.
CTX_CSA = 32768
CTX_HCA = 8192 * 128
_BENCH_LAYERS = (("window", {}), ("csa", {"topk": 512}), ("csa", {"topk": 1024}), ("hca", {}))


def _ctx(kind: str) -> int:
    return CTX_HCA if kind == "hca" else CTX_CSA


# Named sets (DeepSeek-V4: 64 heads (Flash) / 128 (Pro), TP8 -> 8 / 16).
SHAPES: dict[str, list[V4Shape]] = {
    # A prefill chunk of 8192 rows after 24K cached tokens (32K context), CSA top-512, H 64 and 128;
    # decode: batches of 1..256 rows x every layer kind x H 8 / 16 / 64 / 128.
    "bench": [V4Shape((CTX_CSA,), 8192, H, kind="csa", topk=512) for H in (64, 128)]
    + [
        _decode(B, _ctx(kind), H, kind, **kw)
        for H in (8, 16, 64, 128)
        for kind, kw in _BENCH_LAYERS
        for B in (1, 8, 32, 64, 128, 256)
    ],
    # The tuner's groups: one decode shape per layer kind and tier that serving runs.
    "tune": [
        _decode(128, CTX_CSA, 16, "csa", topk=512),
        _decode(32, CTX_CSA, 64, "csa", topk=512),
        _decode(128, CTX_CSA, 8, "csa", topk=1024),
        _decode(64, CTX_HCA, 128, "hca"),
        _decode(256, CTX_CSA, 16, "window"),
    ],
    # The CPU interpreter: few rows, every kind, dense and ragged lists.
    "tiny": [
        V4Shape((40, 150), (1, 2), H=8, kind="window", block=16),
        V4Shape((150, 70), (2, 1), H=16, kind="csa", topk=16, block=16, cblock=8, holes=0.1),
        V4Shape((300, 140), (1, 2), H=1, kind="hca", block=16, dups=0.1),
        V4Shape((150, 70), (1, 2), H=8, kind="csa", topk=24, block=16, cblock=4, ragged=True, holes=0.1, dups=0.1),
        V4Shape((400, 20), (2, 1), H=16, kind="hca", ratio=16, block=16, ragged=True, sink="none", rope=False),
        V4Shape((60,), 2, H=8, kind="window", block=16, ragged="window", sink="neginf", kv="auto"),
    ],
    # doctor's self-check on a GPU: H 8 / 64 / 128, every kind, fp8_ds_mla caches.
    "selfcheck": [
        V4Shape((700, 300, 1200), (1, 2, 1), H=8, kind="window"),
        V4Shape((3000, 900), (1, 2), H=64, kind="csa", topk=512, holes=0.02),
        V4Shape((20000, 5000, 700), (1, 1, 2), H=128, kind="hca"),
        V4Shape((3000, 900), (2, 1), H=16, kind="csa", topk=512, ragged=True, sink="large"),
    ],
    # Odd sizes: H 1 / 24, blocks 1 / 16 and not dividing the lengths, one token, rows at the start of
    # a sequence (short windows), HCA rows with no compressed row (width 0), an empty batch.
    "odd": [
        V4Shape((1, 37), 1, H=1, kind="window", block=1),
        V4Shape((17, 200, 5), 1, H=24, kind="csa", topk=8, block=16, cblock=3, holes=0.2),
        V4Shape((6,), 6, H=8, kind="window", block=16, dups=0.2),
        V4Shape((300, 129, 7), 1, H=24, kind="hca", block=16, cblock=1),
        V4Shape((5, 3), 1, H=1, kind="hca", block=1),
        V4Shape((50, 1), (3, 1), H=16, kind="csa", topk=6, ratio=4, block=1, cblock=1, ragged="compressed"),
        V4Shape((), 1, H=16, kind="csa", topk=16, block=16),
    ],
}

__all__ = ["CALL_KEYS", "DENSE_F64", "FP8_DS_MLA_MAX", "FP8_KINDS", "KINDS", "LSE_LAYOUTS", "OUT_LAYOUTS",
           "Q_LAYOUTS", "SHAPES", "SINKS", "SM_SCALE", "TOLERANCE", "V4Cache", "V4Inputs", "V4Shape", "call_v4",
           "fp8_ds_mla_encode", "fp8_ds_mla_poison", "fp8_ds_mla_views", "fp8_ds_mla_write",
           "make_inputs", "v4_cache"]  # fmt: skip


def call_v4(q, window_cache, window_indices, window_indptr=None, compressed_cache=None, compressed_indices=None,
            compressed_indptr=None, attn_sink=None, positions=None, cos_sin_cache=None, **kw):  # fmt: skip
    """``mla_v4_attention`` with its plan's knobs given as keywords beside the call's own
    (``CALL_KEYS``): the plan is ``plan_v4_attention_for`` of the tensors and those knobs (the
    kv_cache_dtype names, num_splits, batch_invariant, config, backend, debug). How tests and
    benchmarks state a one-off call; a serving step makes its plan once instead."""
    from ..ops import mla_v4_attention, plan_v4_attention_for

    args = (q, window_cache, window_indices, window_indptr, compressed_cache, compressed_indices, compressed_indptr,
            attn_sink, positions, cos_sin_cache)  # fmt: skip

    def make(call, **knobs):
        return plan_v4_attention_for(*args, workspace=call.get("workspace"), **knobs)

    return mla_v4_attention(*args, **with_plan(kw, CALL_KEYS, make, "call_v4"))


# ---------------------------------------------------------------- caches
@dataclass
class V4Cache:
    """R copies of one V4 cache: ``caches[i]`` uint8 fp8_ds_mla ``[num_pages, block_size, 584]``
    (``kind`` an e4m3 dtype) or ``[num_pages, block_size, 512]`` (``kind`` its dtype); ``tables[i]``
    ``[B, max_blocks]`` int32 (-1: a page the requests do not hold); ``held[b]`` the slots request b
    holds (positions ``0 .. held[b] - 1``; those before ``first[b]`` are never named, and poisoned)."""

    caches: list[torch.Tensor]
    tables: list[torch.Tensor]
    block_size: int
    kind: torch.dtype
    held: list[int]
    first: list[int]
    # (flat buffer, guard length, snapshot of its guard bytes) per copy, when made with guard=
    guards: list = field(default_factory=list, repr=False)

    @property
    def cache(self) -> torch.Tensor:
        return self.caches[0]

    @property
    def table(self) -> torch.Tensor:
        return self.tables[0]

    @property
    def fp8(self) -> bool:
        return self.kind in FP8_DS_MLA_MAX

    @property
    def kv_cache_dtype(self) -> str:
        """The plan's name of this cache: "fp8_ds_mla_e4m3fn" / "_e4m3fnuz", or "auto"."""
        return f"fp8_ds_mla_{str(self.kind).removeprefix('torch.float8_')}" if self.fp8 else "auto"

    def check_guards(self, what: str) -> None:
        """Raise AssertionError when a byte of a guard region (``guard=``) changed."""
        for i, (flat, g, snap) in enumerate(self.guards):
            now = torch.cat([flat[:g], flat[-g:]]).view(torch.uint8)
            if not torch.equal(now, snap):
                raise AssertionError(f"{what} copy {i}: {int((now != snap).sum())} guard bytes changed")

    def slots(self, positions: torch.Tensor, req: torch.Tensor, i: int = 0) -> torch.Tensor:
        """Global slots (int32, -1 stays -1) of request-local ``positions [T, W]`` of the rows'
        requests ``req [T]``, through copy i's table."""
        pos = positions.long()
        ok = pos >= 0
        p = torch.where(ok, pos, 0)
        r = req.long()[:, None].expand_as(pos)
        page = self.tables[i].long()[r, p // self.block_size] if pos.numel() else torch.zeros_like(pos)
        return torch.where(ok, page * self.block_size + p % self.block_size, -1).to(torch.int32)


def _rows_bf16(n: int, gen: torch.Generator, device) -> torch.Tensor:
    """``[n, 512]`` fresh normal values rounded to bf16, as float32."""
    return randn((n, V4_DIM), gen, device).to(torch.bfloat16).float()


def _store(cache: torch.Tensor, kind: torch.dtype, vals: torch.Tensor, slots: torch.Tensor) -> None:
    bs = cache.shape[1]
    if kind in FP8_DS_MLA_MAX:
        fp8_ds_mla_write(cache, vals, slots, kind)
    else:
        cache[slots // bs, slots % bs] = vals.to(kind)


def _one_cache(held, first, bs, kind, gen, device, opts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One copy: ``(cache, table, flat buffer)``; pages for the positions ``first[b] .. held[b] - 1``
    of each request in a random order, every other slot poisoned (see the module docstring)."""
    fp8 = kind in FP8_DS_MLA_MAX
    cols = [(f // bs, (n - 1) // bs) if n > f else (0, -1) for n, f in zip(held, first)]
    counts = [c1 - c0 + 1 for c0, c1 in cols]
    used = sum(counts)
    num_pages = used + opts["spare_pages"]
    perm = torch.randperm(num_pages, generator=gen, device=gen.device).to(torch.int32).cpu()
    width = max([-(-n // bs) for n in held] + [1])
    table = torch.full((len(held), width), -1, dtype=torch.int32)
    for b, ((c0, c1), pages) in enumerate(zip(cols, perm[:used].split(counts))):
        table[b, c0 : c1 + 1] = pages
    table = table.to(device)
    row = bs * (V4_ROW_BYTES if fp8 else V4_DIM) + opts["page_pad"]
    guard = opts["guard"]
    if fp8:
        flat = torch.full((2 * guard + num_pages * row,), FP8_NAN_CODE[kind], dtype=torch.uint8, device=device)
        if guard:
            flat[:guard] = int(SENTINEL)
            flat[guard + num_pages * row :] = int(SENTINEL)
        cache = flat[guard : guard + num_pages * row].view(num_pages, row)[:, : bs * V4_ROW_BYTES]
        cache = cache.view(num_pages, bs, V4_ROW_BYTES)
        fp8_ds_mla_poison(cache, kind)
    else:
        flat = torch.full((2 * guard + num_pages * row,), math.nan, dtype=kind, device=device)
        if guard:
            flat[:guard] = SENTINEL
            flat[guard + num_pages * row :] = SENTINEL
        cache = flat[guard : guard + num_pages * row].view(num_pages, row)[:, : bs * V4_DIM]
        cache = cache.view(num_pages, bs, V4_DIM)
    if opts["unused"] == "randn":  # every slot finite; the held ones then get the requests' rows
        every = torch.arange(num_pages * bs, device=device)
        for s0 in range(0, every.numel(), _VALUE_STEP):
            s = every[s0 : s0 + _VALUE_STEP]
            _store(cache, kind, _rows_bf16(s.numel(), gen, device), s)
    n_b = [max(0, n - f) for n, f in zip(held, first)]
    total = sum(n_b)
    if total:
        req = torch.repeat_interleave(torch.arange(len(held), device=device), torch.tensor(n_b, device=device))
        start = torch.tensor([0] + n_b, device=device).cumsum(0)[:-1]
        pos = torch.arange(total, device=device) - start[req] + torch.tensor(first, device=device)[req]
        slots = table.long()[req, pos // bs] * bs + pos % bs
        for s0 in range(0, total, _VALUE_STEP):
            s = slots[s0 : s0 + _VALUE_STEP]
            _store(cache, kind, _rows_bf16(s.numel(), gen, device), s)
    return cache, table, flat


def v4_cache(held, first, block_size: int, kind: torch.dtype, *, device, gen: torch.Generator, copies: int = 1,
             spare_pages: int = 2, page_pad: int = 0, unused: str = "nan", guard: int = 0) -> V4Cache:  # fmt: skip
    """R = ``copies`` caches whose request b holds the positions ``first[b] .. held[b] - 1`` (fresh
    normal rows rounded to bf16) in pages of ``block_size`` handed out in a random order.

    kind: an e4m3 dtype (an fp8_ds_mla cache of that kind, :func:`fp8_ds_mla_write`) or the float
    dtype of a ``[.., .., 512]`` cache. spare_pages: pages no request holds. page_pad: extra bytes
    (fp8) / elements after each page (a page stride wider than its rows). unused: "nan" (every slot
    no request holds poisoned: a stray read poisons the result) or "randn" (finite everywhere: a
    row's NaN is the kernel's verdict, not a read). guard: that many sentinel bytes / elements
    (:data:`SENTINEL`) before and after each cache, checked by :meth:`V4Cache.check_guards`.
    """
    if unused not in ("nan", "randn"):
        raise ValueError(f"v4_cache: unused: expected 'nan' or 'randn', got {unused!r}")
    held, first = [int(n) for n in held], [int(f) for f in first]
    opts = dict(spare_pages=spare_pages, page_pad=page_pad, unused=unused, guard=guard)
    parts = [_one_cache(held, first, block_size, kind, gen, device, opts) for _ in range(copies)]
    vc = V4Cache([p[0] for p in parts], [p[1] for p in parts], block_size, kind, held, first)
    if guard:
        vc.guards = [(f, guard, torch.cat([f[:guard], f[-guard:]]).view(torch.uint8).clone()) for _, _, f in parts]
    return vc


# ---------------------------------------------------------------- lists
def _window_lists(shape: V4Shape, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``([T, window] int32 positions, in order, -1 padded; [T] int64 counts)``."""
    pos = torch.tensor(shape.positions(), dtype=torch.long, device=device)
    count = torch.clamp(pos + 1, max=shape.window)
    col = torch.arange(shape.window, device=device)
    lists = torch.where(col[None, :] < count[:, None], pos[:, None] - count[:, None] + 1 + col[None, :], -1)
    return lists.to(torch.int32), count


def _compressed_lists(shape: V4Shape, g: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``([T, width] int32 compressed-row indices, -1 padded; [T] int64 counts)``: CSA ``topk``
    distinct visible rows in random order, HCA every visible row in order."""
    vis = torch.tensor([(p + 1) // shape.ratio for p in shape.positions()], dtype=torch.long, device=device)
    count = torch.tensor(shape.compressed_counts(), dtype=torch.long, device=device)
    width = shape.compressed_width()
    col = torch.arange(width, device=device)
    if shape.kind == "hca":
        return torch.where(col[None, :] < count[:, None], col[None, :], -1).to(torch.int32), count
    out = torch.full((shape.T, width), -1, dtype=torch.int32, device=device)
    most = int(vis.max()) if vis.numel() else 0
    for t0 in range(0, shape.T, _ROW_STEP):  # rows in steps: [rows, most] random keys
        t1 = min(shape.T, t0 + _ROW_STEP)
        keys = torch.rand((t1 - t0, most), generator=g, device=g.device).to(device)
        keys = keys.masked_fill(torch.arange(most, device=device)[None, :] >= vis[t0:t1, None], 2.0)
        take = min(width, most)
        pick = keys.argsort(dim=1)[:, :take]
        pick = torch.where(col[None, :take] < count[t0:t1, None], pick, -1)
        out[t0:t1, :take] = pick.to(torch.int32)
    return out, count


def _holes_and_dups(lists: torch.Tensor, count: torch.Tensor, holes: float, dups: float, g) -> torch.Tensor:
    """``holes`` / ``dups`` of each row's first ``count`` entries set to -1 / to a copy of another of
    them (the padding stays -1)."""
    T, W = lists.shape
    if not (T and W and (holes or dups)):
        return lists
    dev = lists.device
    u = torch.rand((T, W), generator=g, device=g.device).to(dev)
    src = (torch.rand((T, W), generator=g, device=g.device).to(dev) * count[:, None]).long().clamp(max=W - 1)
    inside = torch.arange(W, device=dev)[None, :] < count[:, None]
    rep = lists.gather(1, src)
    lists = torch.where(inside & (u < dups), rep, lists)
    return torch.where(inside & (u >= dups) & (u < dups + holes), torch.full_like(lists, -1), lists)


# ---------------------------------------------------------------- inputs
@dataclass
class V4Inputs(Checked):
    """One mla_v4_attention call's tensors (``shape`` a :class:`V4Shape`). ``args(i)`` is the op's
    positional arguments with cache copy i (lists as global slots of that copy's tables);
    ``kwargs()`` the keywords (a plan made from the shape's sizes unless one is given)."""

    shape: V4Shape
    dtype: torch.dtype
    q: torch.Tensor  # [T, H, 512]
    window: V4Cache
    compressed: V4Cache | None
    window_positions: torch.Tensor  # [T, window] int32 request-local positions (-1: none)
    window_count: torch.Tensor  # [T] int64: a row's entries (padding excluded)
    compressed_positions: torch.Tensor | None  # [T, width] int32 compressed-row indices (-1: none)
    compressed_count: torch.Tensor | None
    req: torch.Tensor  # [T] int32: each row's request
    attn_sink: torch.Tensor | None  # [H + pad] float32
    positions: torch.Tensor | None  # [T] int64 (or int32)
    cos_sin_cache: torch.Tensor | None  # [P, 64] float32
    out: torch.Tensor
    lse: torch.Tensor
    out_base: torch.Tensor = field(repr=False)
    lse_base: torch.Tensor = field(repr=False)
    sm_scale: float = SM_SCALE
    _lists: dict = field(default_factory=dict, repr=False)

    @property
    def copies(self) -> int:
        return len(self.window.caches)

    @property
    def window_cache(self) -> torch.Tensor:
        return self.window.cache

    @property
    def compressed_cache(self) -> torch.Tensor | None:
        return None if self.compressed is None else self.compressed.cache

    @property
    def window_kind(self) -> torch.dtype:
        """The window cache's kind as read (an e4m3 dtype or the float dtype)."""
        return self.window.kind

    @property
    def compressed_kind(self) -> torch.dtype | None:
        return None if self.compressed is None else self.compressed.kind

    def _list(self, which: str, i: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = (which, i)
        if key not in self._lists:
            cache = self.window if which == "window" else self.compressed
            pos = self.window_positions if which == "window" else self.compressed_positions
            count = self.window_count if which == "window" else self.compressed_count
            slots = cache.slots(pos, self.req, i)
            ragged = self.shape.window_ragged if which == "window" else self.shape.compressed_ragged
            if ragged:
                take = torch.arange(slots.shape[1], device=slots.device)[None, :] < count[:, None]
                indptr = torch.zeros(self.shape.T + 1, dtype=torch.int32, device=slots.device)
                indptr[1:] = count.cumsum(0).to(torch.int32)
                self._lists[key] = (slots[take].contiguous(), indptr)
            else:
                self._lists[key] = (slots, None)
        return self._lists[key]

    def window_indices(self, i: int = 0) -> torch.Tensor:
        """The window list the op reads with copy i: dense ``[T, window]`` or ragged ``[nnz]`` int32
        global slots (the same tensor on every call: edit it in place to plant values)."""
        return self._list("window", i)[0]

    def window_indptr(self, i: int = 0) -> torch.Tensor | None:
        """``[T + 1]`` int32 (ragged), or None."""
        return self._list("window", i)[1]

    def compressed_indices(self, i: int = 0) -> torch.Tensor | None:
        return None if self.compressed is None else self._list("compressed", i)[0]

    def compressed_indptr(self, i: int = 0) -> torch.Tensor | None:
        return None if self.compressed is None else self._list("compressed", i)[1]

    def args(self, i: int = 0) -> tuple:
        c = self.compressed
        return (
            self.q,
            self.window.caches[i],
            self.window_indices(i),
            self.window_indptr(i),
            None if c is None else c.caches[i],
            self.compressed_indices(i),
            self.compressed_indptr(i),
            self.attn_sink,
            self.positions,
            self.cos_sin_cache,
        )

    def kwargs(self, **overrides) -> dict:
        """The op's keywords (``overrides`` replace them; a ``plan=`` among them is used as given).
        Without a plan, one is made (:meth:`plan`) from the call's plan knobs (every keyword outside
        ``CALL_KEYS``)."""
        kw = {**dict(sm_scale=self.sm_scale, out=self.out, lse=self.lse), **overrides}

        def make(call, **knobs):
            ws = call.get("workspace")
            return self.plan(**{"workspace_numel": ws.numel() if isinstance(ws, torch.Tensor) else None, **knobs})

        return with_plan(kw, CALL_KEYS, make, f"{type(self).__name__}.kwargs")

    def run(self, i: int = 0, **overrides):
        """The op on cache copy i, writing ``out`` / ``lse``. ``overrides``: the call's own keywords
        (``CALL_KEYS``: plan, out=None, workspace, ...) and plan knobs (backend, config,
        num_splits, batch_invariant, debug, ...). Returns what the op returns."""
        from ..ops import mla_v4_attention

        return mla_v4_attention(*self.args(i), **self.kwargs(**overrides))

    def list_lens(self) -> tuple[int, int]:
        """The plan's (window_len, compressed_len): a dense list's width, a ragged one's most
        entries per row."""
        s = self.shape
        w = max(s.window_counts(), default=0) if s.window_ragged else s.window
        c = 0
        if s.compressed:
            c = max(s.compressed_counts(), default=0) if s.compressed_ragged else s.compressed_width()
        return w, c

    def plan(self, device=None, **overrides):
        """The :class:`~rocm_mla.ops.V4Plan` of :meth:`run`'s call (``overrides``: num_splits,
        batch_invariant, config, backend, debug, ... as :func:`~rocm_mla.ops.plan_v4_attention`
        takes them)."""
        from ..ops import plan_v4_attention

        s, c = self.shape, self.compressed
        w_len, c_len = self.list_lens()
        kw = dict(
            num_rows=s.T,
            num_heads=s.H,
            q_dtype=self.dtype,
            device=torch.device(device) if device is not None else self.q.device,
            window_dtype=self.window.cache.dtype,
            window_block_size=self.window.block_size,
            window_len=w_len,
            window_ragged=s.window_ragged,
            window_kv_cache_dtype=self.window.kv_cache_dtype,
            has_sink=self.attn_sink is not None,
            inverse_rope=self.positions is not None,
        )
        if c is not None:
            kw.update(compressed_dtype=c.cache.dtype, compressed_block_size=c.block_size, compressed_len=c_len,
                      compressed_ragged=s.compressed_ragged, compressed_kv_cache_dtype=c.kv_cache_dtype)  # fmt: skip
        return plan_v4_attention(**{**kw, **overrides})

    def reference(self, rows: int | None = None, *, i: int = 0):
        """(out [rows', H, 512], lse [rows', H]) float32 (computed in float64) of the first ``rows``
        rows (all: None), from cache copy i."""
        from ..reference.v4_attention import mla_v4_attention_ref

        r = self.shape.T if rows is None else min(rows, self.shape.T)
        q, w_cache, w_idx, w_ptr, c_cache, c_idx, c_ptr, sink, pos, cos_sin = self.args(i)

        def first(idx, ptr):  # a dense list's first r rows; a ragged one's first r + 1 offsets
            if idx is None:
                return None, None
            return (idx, ptr[: r + 1]) if ptr is not None else (idx[:r], None)

        fp8 = [c is not None and c.fp8 for c in (self.window, self.compressed)]
        return mla_v4_attention_ref(
            q[:r], w_cache, *first(w_idx, w_ptr), c_cache, *first(c_idx, c_ptr), sink,
            None if pos is None else pos[:r], cos_sin, self.sm_scale,
            window_kind=self.window.kind if fp8[0] else None,
            compressed_kind=self.compressed.kind if fp8[1] else None,
        )  # fmt: skip

    def compare(self, out=None, lse=None, *, ref=None, tol=None, **which) -> list[Comparison]:
        """out and lse (default: the buffers) against the reference of the rows ``which`` selects
        (:meth:`reference`'s keywords) or ``ref`` ((out, lse) of as many rows as compared), under
        ``tol`` ({"out": Bound, "lse": Bound}; default TOLERANCE[dtype])."""
        ro, rl = ref if ref is not None else self.reference(**which)
        r, tol = ro.shape[0], TOLERANCE[self.dtype] if tol is None else tol
        out, lse = (self.out if out is None else out)[:r], (self.lse if lse is None else lse)[:r]
        return [compare("out", out, ro, tol["out"]), compare("lse", lse, rl, tol["lse"])]

    def check_guards(self) -> None:
        """No guard byte of either cache changed (``guard=``)."""
        self.window.check_guards("window_cache")
        if self.compressed is not None:
            self.compressed.check_guards("compressed_cache")


def _sink(shape: V4Shape, g: torch.Generator, device, pad: int) -> torch.Tensor | None:
    """attn_sink ``[H + pad]`` float32 per ``shape.sink`` (see :class:`V4Shape`)."""
    n = shape.H + pad
    if shape.sink == "none":
        return None
    if shape.sink == "neginf":
        return torch.full((n,), -math.inf, dtype=torch.float32, device=device)
    if shape.sink == "finite":
        return randn((n,), g, device, scale=2.0)
    # "large": a few units above the scores' log-sum-exp (~6..8), so that out shrinks 2..600 fold;
    # head 0 far above anything (out ~0: the sink must enter the running max).
    sink = 6.0 + 6.0 * torch.rand((n,), generator=g, device=g.device).to(device)
    sink[0] = 200.0
    return sink


def _q(shape: V4Shape, g, device, dtype, layout: str) -> torch.Tensor:
    T, H = shape.T, shape.H
    if layout == "contiguous":
        return randn((T, H, V4_DIM), g, device, dtype, scale=Q_STD)
    if layout == "padded":
        return randn((T, H, V4_DIM + 64), g, device, dtype, scale=Q_STD)[..., :V4_DIM]
    return randn((H, T, V4_DIM), g, device, dtype, scale=Q_STD).transpose(0, 1)


def make_inputs(
    shape: V4Shape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int = 0,
    gen: torch.Generator | None = None,
    copies: int = 1,
    q_layout: str = "contiguous",
    out_layout: str = "contiguous",
    lse_layout: str = "contiguous",
    spare_pages: int = 2,
    page_pad: int = 0,
    unused: str = "nan",
    guard: int = 0,
    sink_pad: int = 0,
    positions_dtype: torch.dtype = torch.int64,
) -> V4Inputs:
    """Fresh random inputs of ``shape`` (see the module docstring), from ``gen`` or a generator of
    ``seed`` on ``device``.

    dtype: q's and out's dtype (and the caches' when ``shape.kv == "auto"``). copies: R independent
    (window cache, compressed cache) pairs with their own page orders (cold-cache rotation); the
    lists hold positions, turned into each copy's slots. q_layout (``Q_LAYOUTS``): "contiguous",
    "padded" (``[T, H, 576][..., :512]``), "heads_major" (an ``[H, T, 512]`` buffer transposed).
    out_layout (``OUT_LAYOUTS``): "contiguous", "padded" (``[T, H, 520][..., :512]``), "token_pad"
    (token stride H x 512 + 512). lse_layout (``LSE_LAYOUTS``): "contiguous" or "transposed" (an
    ``[H, T]`` buffer's transpose). spare_pages / page_pad / unused / guard: :func:`v4_cache`'s,
    for both caches. sink_pad: attn_sink entries past H. positions_dtype: int64 (vLLM's) or int32.
    """
    for arg, v, ok in (("q_layout", q_layout, Q_LAYOUTS), ("out_layout", out_layout, OUT_LAYOUTS),
                       ("lse_layout", lse_layout, LSE_LAYOUTS)):  # fmt: skip
        if v not in ok:
            raise ValueError(f"make_inputs: {arg}: expected one of {ok}, got {v!r}")
    device, g = device_generator(device, seed, gen)
    s = shape
    cache_kw = dict(device=device, gen=g, copies=copies, spare_pages=spare_pages, page_pad=page_pad, unused=unused,
                    guard=guard)  # fmt: skip
    if s.fp8:
        w_kind = FP8_KINDS[s.window_fp8] if s.window_fp8 else platform_fp8(device)
        c_kind = FP8_KINDS[s.compressed_fp8 or "e4m3fn"]
    else:
        w_kind = c_kind = dtype
    first = [max(0, n - r - s.window + 1) for n, r in zip(s.lens, s.rows)]
    window = v4_cache(s.lens, first, s.block, w_kind, **cache_kw)
    compressed = None
    if s.compressed:
        compressed = v4_cache([n // s.ratio for n in s.lens], [0] * len(s.lens), s.cblock, c_kind, **cache_kw)
    w_pos, w_count = _window_lists(s, device)
    w_pos = _holes_and_dups(w_pos, w_count, s.holes, s.dups, g)
    c_pos = c_count = None
    if s.compressed:
        c_pos, c_count = _compressed_lists(s, g, device)
        c_pos = _holes_and_dups(c_pos, c_count, s.holes, s.dups, g)
    q = _q(s, g, device, dtype, q_layout)
    sink = _sink(s, g, device, sink_pad)
    positions = cos_sin = None
    if s.rope:
        positions = torch.tensor(s.positions(), dtype=positions_dtype, device=device)
        cos_sin = rope_cos_sin_cache(max(s.lens, default=0) + 5, device=device)
    okw = {"contiguous": {}, "padded": {"pad_last": 8}, "token_pad": {"token_pad": 1}}[out_layout]
    out_base, out = poisoned((s.T, s.H, V4_DIM), dtype, device, **okw)
    lse_base, lse = poisoned((s.T, s.H), torch.float32, device, transpose01=lse_layout == "transposed")
    return V4Inputs(
        s, dtype, q, window, compressed, w_pos, w_count, c_pos, c_count, row_requests(s.rows, 0, device), sink,
        positions, cos_sin, out, lse, out_base, lse_base,
    )  # fmt: skip
