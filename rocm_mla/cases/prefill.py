"""mla_prefill's cases: varlen batches laid out as the model produces them, the tolerance, the check.

Inputs (:func:`make_inputs`), for a head geometry ``shape.dims`` = (P, R, V) (:data:`GEOMETRIES`;
DeepSeek's (128, 64, 128) by default): ``q [Tq, N, P + R]`` (nope then rope); ``k_nope`` and ``v``
the two halves of one ``[Tk, N, P + V]`` kv_b_proj output (strided views); ``k_pe`` ``[Tk, 1, R]``
the rope slice of the ``[Tk, 512 + R]`` latent buffer (None when R = 0); ``cu_seqlens_q/k`` int32
offsets; out ``[Tq, N, V]`` and lse ``[N, Tq]`` NaN-poisoned, each in one of make_inputs' layouts.
Causal is bottom-right aligned: query i of a sequence with lq queries and lk keys sees keys
j <= i + lk - lq; a query that sees no key gets out 0, lse -inf.

Chunked context (:func:`make_context_inputs`, mla_prefill_with_context): the new tokens as above
(causal among themselves) and context chunks of keys laid out the same way; the check compares
with one causal mla_prefill over each sequence's [chunk 0, chunk 1, ..., new] keys.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch

from ..mla_dims import KV_LORA_RANK, PREFILL_DIMS, PREFILL_GEOMETRIES
from ._buffers import Guarded, poisoned
from ._compare import NORM, Bound, Checked, Comparison, compare, with_plan
from ._paged import device_generator, randn

P, R, V = PREFILL_DIMS  # DeepSeek's 128, 64, 128: the default geometry
SM_SCALE = 1.0 / math.sqrt(P + R)
# Every MLA head geometry (P, R, V) vLLM serves, by name (rocm_mla.mla_dims.PREFILL_GEOMETRIES).
GEOMETRIES: dict[str, tuple[int, int, int]] = PREFILL_GEOMETRIES

# One table (the rule: rocm_mla.cases._compare). Element-wise: fp16 output error is a few ulps of
# the largest |v| ~ 4 (p and V in 16 bits). Norm-wise: NORM. lse: -inf exactly where the
# reference has it, close elsewhere.
TOLERANCE: dict[torch.dtype, dict[str, Bound]] = {
    torch.float32: {"out": Bound(2e-5, 2e-5, norm=NORM[torch.float32]), "lse": Bound(1e-5, 1e-5)},
    torch.float16: {"out": Bound(4e-3, 4e-3, norm=NORM[torch.float16]), "lse": Bound(1e-4, 1e-4)},
    torch.bfloat16: {"out": Bound(2e-2, 2e-2, norm=NORM[torch.bfloat16]), "lse": Bound(1e-4, 1e-4)},
}
# The float32 reference against an independent float64 formula (dense softmax attention over an
# explicitly concatenated k): both sides see the same float32 inputs, so only the reference's
# float32 roundings (dots of 192, a softmax) separate them.
REFERENCE_VS_F64 = Bound(1e-5, 1e-5)
# A row that sees exactly one key: its weight is exp(0) / 1 = 1, so out is that key's v up to
# float32 rounding of p * v / l (a few ulps of |v| ~ 4), much tighter than a softmax over many keys.
ONE_KEY = Bound(1e-6, 1e-6)


@dataclass(frozen=True)
class PrefillShape:
    """A varlen batch: ``lq[i]`` queries and ``lk[i]`` keys in sequence i (``lk`` None: = lq), N heads,
    head geometry ``dims`` = (P, R, V)."""

    lq: tuple[int, ...]
    N: int = 16
    lk: tuple[int, ...] | None = None
    causal: bool = True
    name: str = ""
    dims: tuple[int, int, int] = PREFILL_DIMS

    def __post_init__(self):
        object.__setattr__(self, "lq", tuple(int(n) for n in self.lq))
        lk = self.lq if self.lk is None else tuple(int(n) for n in self.lk)
        if len(lk) != len(self.lq):
            raise ValueError(f"PrefillShape: lq and lk: expected equal counts, got {len(self.lq)} and {len(lk)}")
        object.__setattr__(self, "lk", lk)
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))

    @staticmethod
    def equal(B: int, L: int, N: int, dims: tuple[int, int, int] = PREFILL_DIMS) -> PrefillShape:
        """B sequences of L queries over their own L keys: ``"4x4096 N=16"`` (other geometries:
        ``"4x4096 N=16 192/64/256"``)."""
        tag = "" if tuple(dims) == PREFILL_DIMS else " " + "/".join(map(str, dims))
        return PrefillShape((L,) * B, N, name=f"{B}x{L} N={N}{tag}", dims=tuple(dims))

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        lk = "" if self.lk == self.lq else f" lk={','.join(map(str, self.lk))}"
        geo = "" if self.dims == PREFILL_DIMS else " " + "/".join(map(str, self.dims))
        return f"lq={','.join(map(str, self.lq))}{lk} N={self.N}" + ("" if self.causal else " full") + geo

    @property
    def Tq(self) -> int:
        return sum(self.lq)

    @property
    def Tk(self) -> int:
        return sum(self.lk)

    def flops(self) -> float:
        """2 dots (Dqk P + R, Dv V) over the (query, key) pairs each query sees."""
        pairs = sum(_causal_pairs(q, k) if self.causal else q * k for q, k in zip(self.lq, self.lk))
        return 2.0 * self.N * pairs * sum(self.dims)


def _causal_pairs(q: int, k: int) -> int:
    # sum over i < q of clamp(i + k - q + 1, 0, k), in closed form.
    first = max(0, q - k)  # rows before this see no key
    n = q - first
    lo = first + k - q + 1
    return n * lo + n * (n - 1) // 2


def _varlen_lengths() -> tuple[int, ...]:
    """Eight log-uniform draws from [128, 8192] (torch seed 13) and one 8192: unequal lengths."""
    g = torch.Generator().manual_seed(13)
    return tuple(int(round(2 ** (7 + 6 * u))) for u in torch.rand(8, generator=g).tolist()) + (8192,)


VARLEN = _varlen_lengths()
_E = PrefillShape.equal
_GLM = GEOMETRIES["glm-lite"]

SHAPES: dict[str, list[PrefillShape]] = {
    # The benchmark: DeepSeek-V3 prefill chunks at TP8 (16 heads) and DP (128), and a varlen batch.
    "bench": [
        _E(4, 4096, 16),
        _E(4, 4096, 128),
        _E(16, 1024, 16),
        _E(1, 16384, 16),
        _E(1, 16384, 128),
        PrefillShape(VARLEN, 16, name="varlen N=16"),
        PrefillShape(VARLEN, 128, name="varlen N=128"),
    ],
    "bench-quick": [_E(4, 4096, 16), _E(4, 4096, 128), _E(16, 1024, 16), PrefillShape(VARLEN, 16, name="varlen N=16")],
    # The tuner's DeepSeek-V3 set, and its ten-minute subset.
    "tune": [_E(B, L, N) for B, L in ((4, 4096), (1, 16384)) for N in (16, 128)],
    "quick": [_E(4, 4096, 16), _E(4, 4096, 128)],
    "tiny": [_E(1, 48, 2)],
    # Uneven lengths, lq != lk, an empty sequence: the doctor's self-check and a config's acceptance.
    "selfcheck": [PrefillShape((37, 0, 20, 5), 16, lk=(37, 6, 45, 5))],
    "verify": [
        PrefillShape((37, 0, 20, 5), 4, lk=(37, 6, 45, 5)),
        PrefillShape((37, 0, 20, 5), 4, (37, 6, 45, 5), False),
    ],
    # Ragged ends, an empty sequence, lq != lk at bench scale (bf16 on a GPU).
    "reference": [PrefillShape((300, 1029, 0, 77, 513), 16, lk=(300, 1100, 12, 77, 700))],
    # Odd sizes: self-attention crossing blocks raggedly, new tokens after a prefix, causal rows that
    # see nothing (lq > lk, lk = 0), lq = 0 with keys, one token, N = 128 and N = 1.
    "odd": [
        PrefillShape((37, 5, 70), 16, name="uneven"),
        PrefillShape((10, 33, 4), 4, lk=(50, 33, 17), name="lq_lt_lk"),
        PrefillShape((40, 7, 3), 4, lk=(9, 0, 3), name="lq_gt_lk"),
        PrefillShape((0, 12, 0, 1), 2, lk=(5, 12, 0, 1), name="empty_seqs"),
        PrefillShape((20, 9), 128, name="N128"),
        PrefillShape((100, 37), 1, name="N1"),
        PrefillShape((), 16, name="no_sequences"),
    ],
    # Every other head geometry (GEOMETRIES): the GLM-4.x-Lite bench beside DeepSeek's, the others' 4x4096.
    "bench-geometry": [
        *(_E(B, L, N, _GLM) for B, L, N in ((4, 4096, 16), (4, 4096, 128), (16, 1024, 16), (1, 16384, 16))),
        PrefillShape(VARLEN, 16, name="varlen N=16 192/64/256", dims=_GLM),
        *(_E(4, 4096, N, d) for d in (GEOMETRIES["nope64"], GEOMETRIES["norope"]) for N in (16, 128)),
    ],
    "tune-geometry": [_E(4, 4096, N, d) for k, d in GEOMETRIES.items() if k != "deepseek" for N in (16, 128)],
    # The interpreter's per-geometry set: ragged blocks, lq != lk both ways, an empty sequence, one token.
    "geometry": [
        s
        for k, d in GEOMETRIES.items()
        for s in (
            PrefillShape((37, 5, 1), 2, lk=(37, 20, 1), name=f"{k} uneven", dims=d),
            PrefillShape((9, 0, 4), 1, lk=(3, 6, 4), name=f"{k} lq_gt_lk", dims=d),
        )
    ],
}

KPE_LAYOUTS = ("latent", "expand", "per_head_copy")
OUT_LAYOUTS = ("flat", "contiguous", "pad_v")
LSE_LAYOUTS = ("contiguous", "transposed", "transposed_padded")
Q_LAYOUTS = ("contiguous", "head_slice")


def cu_seqlens(lengths, device, start: int = 0) -> torch.Tensor:
    """``[start, start + l0, start + l0 + l1, ...]`` int32 (rows before ``start`` belong to no sequence)."""
    offs = itertools.accumulate((int(n) for n in lengths), initial=int(start))
    return torch.tensor(list(offs), dtype=torch.int32, device=device)


# The calls' own keywords (workspace: mla_prefill_with_context's); every other keyword a case
# call takes is a plan knob.
CALL_KEYS = ("sm_scale", "plan", "out", "lse", "workspace")


def call_prefill(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, **kw):
    """``mla_prefill`` with its plan's knobs given as keywords beside the call's own (``CALL_KEYS``):
    the plan is ``plan_prefill_for`` of the tensors and those knobs (causal, max_seqlen_q,
    max_seqlen_k, config, batch_invariant, backend, debug). How tests and benchmarks state a
    one-off call; a serving step makes its plan once instead."""
    return _call("prefill", (q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k), (), kw)


def call_prefill_with_context(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k, context_chunks=(), **kw):
    """``mla_prefill_with_context`` stated as :func:`call_prefill` states ``mla_prefill``: the plan is
    ``plan_prefill_with_context_for`` of the new tokens' tensors and the knobs (no causal)."""
    return _call("prefill_with_context", (q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k), (context_chunks,), kw)


def _call(op: str, tensors: tuple, extra: tuple, kw: dict):
    """``mla_<op>(*tensors, *extra, **call)`` with the plan ``plan_<op>_for(*tensors, **knobs)``."""
    from .. import ops

    plan_for = getattr(ops, f"plan_{op}_for")
    call = with_plan(kw, CALL_KEYS, lambda _, **knobs: plan_for(*tensors, **knobs), f"call_{op}")
    return getattr(ops, f"mla_{op}")(*tensors, *extra, **call)


@dataclass
class PrefillInputs(Checked):
    """One mla_prefill call's tensors: ``args()`` its positional arguments, ``kwargs()`` its keywords
    (out/lse the NaN-poisoned views inside ``out_base`` / ``lse_base``; the plan ``plan()``)."""

    shape: PrefillShape
    dtype: torch.dtype
    q: torch.Tensor
    k_nope: torch.Tensor
    k_pe: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    out_base: torch.Tensor = field(repr=False)
    lse_base: torch.Tensor = field(repr=False)
    sm_scale: float = SM_SCALE
    # name -> Guarded, when made with guard= (q, kv: the [Tk, N, 256] buffer, latent, out, lse)
    guards: dict = field(default_factory=dict, repr=False)

    def check_guards(self) -> None:
        """Raise AssertionError naming the buffer when a byte of a guard region (``guard=``) changed."""
        for name, g in self.guards.items():
            g.check(name)

    def args(self) -> tuple:
        return (self.q, self.k_nope, self.k_pe, self.v, self.cu_seqlens_q, self.cu_seqlens_k)

    def kwargs(self, **overrides) -> dict:
        """The op's keywords (``overrides`` replace them; a ``plan=`` among them is used as
        given). Without a plan, one is made (:meth:`plan`) from the other overrides: plan knobs
        (backend, config, causal, max_seqlen_q, ...)."""
        kw = {**dict(sm_scale=self.sm_scale, out=self.out, lse=self.lse), **overrides}
        return with_plan(kw, CALL_KEYS, lambda _, **k: self.plan(**k), f"{type(self).__name__}.kwargs")

    def run(self, **overrides):
        """mla_prefill writing ``out`` / ``lse``. ``overrides``: the call's own keywords
        (``CALL_KEYS``: plan, out=None, ...) and plan knobs (backend, config, causal, max_seqlen_q,
        max_seqlen_k, batch_invariant, debug, as ``plan_prefill`` takes them) for the plan made
        here when none is given. Returns what the op returns."""
        from ..ops import mla_prefill

        return mla_prefill(*self.args(), **self.kwargs(**overrides))

    def plan(self, device=None, **overrides):
        """The :class:`~rocm_mla.ops.PrefillPlan` of :meth:`run`'s call (``overrides``: causal,
        config, backend, max_seqlen_q, ... as :func:`~rocm_mla.ops.plan_prefill` takes them; the
        sizes are the tensors', causal the shape's, the max_seqlen hints its longest sequences,
        as a benchmark passes them)."""
        from ..ops import plan_prefill

        return plan_prefill(**{**self._plan_sizes(device), "causal": self.shape.causal, **overrides})

    def _plan_sizes(self, device=None) -> dict:
        """A plan's sizes (the tensors'), dtype, device (``device`` or q's) and the max_seqlen
        hints (the shape's longest sequences, as a benchmark passes them), by keyword."""
        return dict(
            batch=self.cu_seqlens_q.shape[0] - 1,
            num_heads=self.q.shape[1],
            q_rows=self.q.shape[0],
            k_rows=self.k_nope.shape[0],
            q_dtype=self.dtype,
            device=torch.device(device) if device is not None else self.q.device,
            head_dims=(self.k_nope.shape[2], 0 if self.k_pe is None else self.k_pe.shape[2], self.v.shape[2]),
            max_seqlen_q=max(self.shape.lq, default=0),
            max_seqlen_k=max(self.shape.lk, default=0),
        )

    def reference(self, first_rows: int | None = None):
        """(out [Tq, N, V], lse [N, Tq]) float32; ``first_rows=m``: only the first m queries of
        sequence 0 (a long causal self-attention: those see only its first m keys)."""
        from ..reference import mla_prefill_ref

        if first_rows is None:
            return mla_prefill_ref(*self.args(), self.sm_scale, self.shape.causal)
        s = self.shape
        if not (s.causal and s.lq and s.lq[0] == s.lk[0]):
            raise ValueError("PrefillInputs.reference: first_rows needs a causal sequence 0 with lq == lk")
        m = min(first_rows, s.lq[0])
        cu = torch.tensor([0, m], dtype=torch.int32, device=self.q.device)
        kpe = None if self.k_pe is None else self.k_pe[:m]
        return mla_prefill_ref(self.q[:m], self.k_nope[:m], kpe, self.v[:m], cu, cu, self.sm_scale, True)

    def compare(self, out=None, lse=None, *, first_rows=None, ref=None) -> list[Comparison]:
        ro, rl = ref if ref is not None else self.reference(first_rows)
        m, tol = ro.shape[0], TOLERANCE[self.dtype]
        out, lse = (self.out if out is None else out)[:m], (self.lse if lse is None else lse)[:, :m]
        return [compare("out", out, ro, tol["out"]), compare("lse", lse, rl, tol["lse"])]


def make_inputs(
    shape: PrefillShape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int = 0,
    gen: torch.Generator | None = None,
    kpe_layout: str = "latent",
    out_layout: str = "flat",
    lse_layout: str = "contiguous",
    q_layout: str = "contiguous",
    key_tail: int = 0,
    guard: int = 0,
) -> PrefillInputs:
    """Fresh random inputs of ``shape`` (see the module docstring).

    kpe_layout: "latent" (``[Tk, 576][:, 512:]`` unsqueezed), "expand" (``.expand(Tk, N, 64)``: head
    stride 0), "per_head_copy" (a real ``[Tk, N, 64]``, every head equal). out_layout: "flat" (a
    ``[Tq, N * 128]`` buffer viewed ``[Tq, N, 128]``: the layer's output), "contiguous", "pad_v"
    (``[Tq, N, 192][..., :128]``). lse_layout: "contiguous" ``[N, Tq]``, "transposed" (a
    ``[Tq, N]`` buffer's transpose) or "transposed_padded" (``[Tq, N + 1][:, :N]`` transposed: the
    lse column of a wider per-token row). q_layout: "contiguous" or "head_slice" (``[Tq, N + 2,
    200][:, 1:N + 1, :192]``: token and head strides wider than the data).

    key_tail: that many extra rows of k_nope, k_pe and v after the last sequence's keys, NaN (no
    sequence owns them: a kernel that reads past a sequence's end, or a descriptor that does not
    clip there, poisons the result). guard: that many sentinel elements (:data:`SENTINEL
    <rocm_mla.cases.SENTINEL>`) before and after each of q, the kv_b_proj buffer, the latent
    buffer, out and lse (no other padding between them; out/lse keep their layout's pads as
    sentinel); :meth:`PrefillInputs.check_guards` checks them bitwise.
    """
    layouts = (kpe_layout, out_layout, lse_layout, q_layout)
    if any(x not in ok for x, ok in zip(layouts, (KPE_LAYOUTS, OUT_LAYOUTS, LSE_LAYOUTS, Q_LAYOUTS))):
        raise ValueError(
            f"prefill make_inputs: layouts: expected kpe in {KPE_LAYOUTS}, out in {OUT_LAYOUTS}, "
            f"lse in {LSE_LAYOUTS}, q in {Q_LAYOUTS}; got {', '.join(map(repr, layouts))}"
        )
    device, g = device_generator(device, seed, gen)
    N, Tq = shape.N, shape.Tq
    P, R, V = shape.dims
    bufs = _Buffers(device, dtype, guard)
    if q_layout == "head_slice":
        q = bufs.randn("q", (Tq, N + 2, P + R + 8), g)[:, 1 : N + 1, : P + R]
    else:
        q = bufs.randn("q", (Tq, N, P + R), g)
    k_nope, k_pe, v = _keys(shape.Tk, N, g, bufs, kpe_layout, key_tail, shape.dims)
    if out_layout == "flat":
        out_base, flat = bufs.dest("out", (Tq, N * V), dtype)
        out = flat.view(Tq, N, V)
    else:
        pad = max(0, P + R - V) if out_layout == "pad_v" else 0  # upstream pads v to P + R when wider
        out_base, out = bufs.dest("out", (Tq, N, V), dtype, pad_last=pad)
    lse_base, lse = bufs.dest(
        "lse",
        (N, Tq),
        torch.float32,
        transpose01=lse_layout != "contiguous",
        pad_last=1 if lse_layout == "transposed_padded" else 0,
    )
    cu_q, cu_k = cu_seqlens(shape.lq, device), cu_seqlens(shape.lk, device)
    tensors = (q, k_nope, k_pe, v, cu_q, cu_k, out, lse, out_base, lse_base)
    return PrefillInputs(shape, dtype, *tensors, sm_scale=1.0 / math.sqrt(P + R), guards=bufs.guards)


class _Buffers:
    """Allocations of one input set: plain tensors, or (``guard`` > 0) views inside
    :class:`Guarded` buffers, kept by name for :meth:`PrefillInputs.check_guards`."""

    def __init__(self, device, dtype, guard: int):
        self.device, self.dtype, self.guard = device, dtype, guard
        self.guards: dict[str, Guarded] = {}

    def randn(self, name: str, shape, g: torch.Generator) -> torch.Tensor:
        x = randn(shape, g, self.device, self.dtype)
        if not self.guard:
            return x
        self.guards[name] = Guarded(shape, self.dtype, device=self.device, fill=x, guard=self.guard)
        return self.guards[name].view

    def dest(self, name: str, shape, dtype, *, pad_last: int = 0, transpose01: bool = False):
        """(base, view): NaN-poisoned; with a guard the base holds the sentinel outside the view."""
        if not self.guard:
            return poisoned(shape, dtype, self.device, pad_last=pad_last, transpose01=transpose01)
        alloc = (shape[1], shape[0], *shape[2:]) if transpose01 else tuple(shape)
        gd = Guarded(alloc, dtype, device=self.device, fill="nan", guard=self.guard, pad_last=pad_last)
        self.guards[name] = gd
        return gd.base, gd.view.transpose(0, 1) if transpose01 else gd.view


def _keys(Tk: int, N: int, g, bufs: _Buffers, kpe_layout: str, tail: int = 0, dims=PREFILL_DIMS):
    """(k_nope, k_pe, v) of Tk keys (+ ``tail`` NaN rows): k_nope / v the halves of one kv_b_proj
    output ``[Tk, N, P + V]``, k_pe the rope slice of the ``[Tk, 512 + R]`` latent buffer in
    ``kpe_layout`` (None when R = 0)."""
    P, R, V = dims
    kv = bufs.randn("kv", (Tk + tail, N, P + V), g)  # kv_b_proj output
    latent = bufs.randn("latent", (Tk + tail, KV_LORA_RANK + R), g)  # [kv_c | k_pe]
    if tail:
        kv[Tk:] = float("nan")
        latent[Tk:] = float("nan")
    if R == 0:
        return kv[..., :P], None, kv[..., P:]
    k_pe = latent[:, KV_LORA_RANK:].unsqueeze(1)
    if kpe_layout == "expand":
        k_pe = k_pe.expand(Tk + tail, N, R)
    elif kpe_layout == "per_head_copy":
        k_pe = k_pe.expand(Tk + tail, N, R).contiguous()
    return kv[..., :P], k_pe, kv[..., P:]


# ---------------------------------------------------------------- chunked context


@dataclass(frozen=True)
class ContextShape:
    """New tokens ``lq[i]`` of sequence i (causal among themselves) after its cached context, in
    chunks: ``chunks[c][i]`` keys of sequence i in chunk c (any may be 0); N heads."""

    lq: tuple[int, ...]
    chunks: tuple[tuple[int, ...], ...] = ()
    N: int = 16
    name: str = ""
    dims: tuple[int, int, int] = PREFILL_DIMS

    def __post_init__(self):
        object.__setattr__(self, "lq", tuple(int(n) for n in self.lq))
        chunks = tuple(tuple(int(n) for n in c) for c in self.chunks)
        if any(len(c) != len(self.lq) for c in chunks):
            raise ValueError("ContextShape: chunks: expected one key count per sequence in every chunk")
        object.__setattr__(self, "chunks", chunks)

    @property
    def new(self) -> PrefillShape:
        """The new tokens' causal self-attention."""
        return PrefillShape(self.lq, self.N, name=self.name, dims=self.dims)

    @property
    def one_shot(self) -> PrefillShape:
        """The equal one-shot call: each sequence's keys = its context, then its new tokens."""
        lk = tuple(q + sum(c[i] for c in self.chunks) for i, q in enumerate(self.lq))
        return PrefillShape(self.lq, self.N, lk=lk, name=self.name, dims=self.dims)

    @property
    def label(self) -> str:
        return self.name or f"lq={','.join(map(str, self.lq))} chunks={len(self.chunks)} N={self.N}"


CONTEXT_SHAPES: dict[str, list[ContextShape]] = {
    # Two chunks with an empty sequence, per head geometry other than DeepSeek's.
    "geometry": [
        ContextShape((7, 0, 3), ((20, 5, 0), (9, 7, 1)), 2, name=k, dims=d)
        for k, d in GEOMETRIES.items()
        if k != "deepseek"
    ],
    # Chunks with empty sequences, a sequence without new tokens, uneven chunk sizes, no chunk at all.
    "odd": [
        ContextShape((7, 0, 20), ((20, 5, 0), (10, 7, 0)), 4, name="two_chunks"),
        ContextShape((5, 16), ((3, 0), (0, 30), (11, 2)), 2, name="three_chunks_odd"),
        ContextShape((9, 4), (), 2, name="no_context"),
    ],
    # Serving-sized chunks (bf16 on a GPU): long context, a sequence without new tokens, 16 heads.
    "gpu": [ContextShape((300, 0, 1024), ((2000, 64, 0), (512, 700, 0), (5, 0, 0)), 16, name="long")],
}


@dataclass
class ContextInputs(PrefillInputs):
    """One mla_prefill_with_context call: the new tokens' tensors (as :class:`PrefillInputs`) and
    ``chunks``, a list of :class:`rocm_mla.ops.prefill_context.ContextChunk`; ``reference`` is one causal
    attention over each sequence's [context, new] keys, built from the tensors as they are now."""

    context: ContextShape | None = None
    chunks: list = field(default_factory=list)

    def run(self, chunks=None, **overrides):
        """mla_prefill_with_context over ``chunks`` (default: ``self.chunks``; any iterable);
        ``overrides`` as :meth:`PrefillInputs.run` takes them, but no causal."""
        from ..ops import mla_prefill_with_context

        chunks = self.chunks if chunks is None else chunks
        return mla_prefill_with_context(*self.args(), chunks, **self.kwargs(**overrides))

    def plan(self, device=None, **overrides):
        """The :class:`~rocm_mla.ops.PrefillContextPlan` of :meth:`run`'s call, made as
        :meth:`PrefillInputs.plan` makes its plan (of the new tokens' tensors; no causal)."""
        from ..ops import plan_prefill_with_context

        return plan_prefill_with_context(**{**self._plan_sizes(device), **overrides})

    def one_shot(self) -> tuple:
        """mla_prefill's positional arguments equal to this call: q and cu_seqlens_q as they are,
        each sequence's keys = [its keys of chunk 0, chunk 1, ..., its new keys] (copies)."""
        sets = [(c[:3], c[3].tolist()) for c in self.chunks] + [(self.args()[1:4], self.cu_seqlens_k.tolist())]
        B = range(len(self.shape.lq))

        def cat(i):  # tensor i of every set, sequence by sequence
            return torch.cat([t[i][offs[b] : offs[b + 1]] for b in B for t, offs in sets])

        total = [sum(offs[b + 1] - offs[b] for _, offs in sets) for b in B]
        kpe = None if self.k_pe is None else cat(1)  # R = 0: no rope part
        return (self.q, cat(0), kpe, cat(2), self.cu_seqlens_q, cu_seqlens(total, self.q.device))

    def reference(self, first_rows: int | None = None):
        """(out [Tq, N, V], lse [N, Tq]) float32 of :meth:`one_shot`."""
        from ..reference import mla_prefill_ref

        if first_rows is not None:
            raise ValueError("ContextInputs.reference: first_rows applies to a one-shot call only")
        return mla_prefill_ref(*self.one_shot(), self.sm_scale, True)


def make_context_inputs(
    shape: ContextShape, *, dtype=torch.bfloat16, device="cpu", seed: int = 0, gen=None, kpe_layout="latent", **kw
) -> ContextInputs:
    """Fresh random inputs of ``shape``: the new tokens as :func:`make_inputs` makes them (``kw``:
    its layouts and ``guard``; the chunks are not guarded), then each chunk's k_nope / v (views of
    its own ``[Tc, N, P + V]`` buffer), k_pe (in ``kpe_layout``) and cu_seqlens_k."""
    from ..ops.prefill_context import ContextChunk

    device, g = device_generator(device, seed, gen)
    new = make_inputs(shape.new, dtype=dtype, device=device, gen=g, kpe_layout=kpe_layout, **kw)
    bufs = _Buffers(device, dtype, 0)
    chunks = []
    for lens in shape.chunks:
        kn, kpe, v = _keys(sum(lens), shape.N, g, bufs, kpe_layout, dims=shape.dims)
        chunks.append(ContextChunk(kn, kpe, v, cu_seqlens(lens, device)))
    fields = {f: getattr(new, f) for f in PrefillInputs.__dataclass_fields__}
    return ContextInputs(**fields, context=shape, chunks=chunks)
