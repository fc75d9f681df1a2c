"""mla_decode's cases: the shapes, the inputs as vLLM hands them over, the tolerance, the check.

Inputs (:func:`make_inputs`, built by :func:`latent_tensors`): a paged latent cache ``[num_pages,
block_size, 576]`` (rocm_mla.cases.paged_cache: shuffled pages, NaN where no request is), in q's
dtype or fp8; ``q_nope [rows, N, 512]`` and ``q_pe [rows, N, 64]`` as the model produces them; out
``[rows, N, 512]`` and lse ``[rows, N]`` NaN-poisoned. rows = B x q_len: request b's rows are its
last q_len tokens (MTP), causal among themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..mla_dims import KV_LORA_RANK, KV_ROW_DIM
from ._buffers import poisoned
from ._compare import NORM, Bound, Checked, Comparison, compare, dtype_name, with_plan
from ._paged import CacheKind, OnPagedCache, PagedCache, case_paged_cache, device_generator, platform_fp8, randn

SM_SCALE = 1.0 / math.sqrt(192)  # DeepSeek: 1/sqrt(qk_nope + qk_rope) before yarn mscale

# One table (the rule: rocm_mla.cases._compare). Element-wise: out rounded once plus p and V in
# 16 bits (fp32: float32 sums over up to 16k keys). Norm-wise: NORM. lse: 1e-3 absolute (float32
# sums of exact products; the natural log of ~seq).
TOLERANCE: dict[torch.dtype, dict[str, Bound]] = {
    torch.float32: {"out": Bound(1e-4, 1e-4, norm=NORM[torch.float32]), "lse": Bound(1e-3, 0.0)},
    torch.float16: {"out": Bound(4e-3, 4e-3, norm=NORM[torch.float16]), "lse": Bound(1e-3, 0.0)},
    torch.bfloat16: {"out": Bound(2e-2, 2e-2, norm=NORM[torch.bfloat16]), "lse": Bound(1e-3, 0.0)},
}

# Named bounds of the comparisons that are not "the op against its float32 reference" (the tests;
# pass one as ``tol=`` to DecodeInputs.compare / check, or to rocm_mla.cases.compare).
# The float32 reference against a float64 dense formula (SDPA with an explicit causal mask): only
# the reference's float32 roundings differ.
DENSE_F64 = Bound(1e-5, 1e-5)
# float32 q and cache, S splits against one split of the same kernel: the same products, the
# partials merged in another order.
SPLIT_ORDER = {"out": Bound(1e-5, 1e-5), "lse": Bound(1e-5, 0.0)}
# float32 over a few dozen keys: lse is the log of a short float32 sum, well inside 1e-4.
FP32_SHORT = {"out": TOLERANCE[torch.float32]["out"], "lse": Bound(1e-4, 0.0)}
# quantize_q=True against reference(quantize_q=True), the float32 reference of the q that FP8_QK
# rounds to: exact up to summation order and the 16-bit p and V, except that on a GPU q / scale on
# a rounding boundary now and then lands on the neighbouring e4m3 code (that row's scores move), so
# lse gets out's element-wise bound. _SERVING: thousands of keys (bf16 on the GPU).
# _REFERENCE: the reference backend's quantize_q, whose out is the float32 result rounded once.
QUANTIZED_Q: dict[torch.dtype, dict[str, Bound]] = {
    torch.float16: {"out": Bound(4e-3, 4e-3), "lse": Bound(4e-3, 0.0)},
    torch.bfloat16: {"out": Bound(2e-2, 2e-2), "lse": Bound(2e-2, 0.0)},
}
QUANTIZED_Q_SERVING = {"out": Bound(3e-2, 3e-2), "lse": Bound(3e-2, 0.0)}
QUANTIZED_Q_REFERENCE = {"out": Bound(1e-2, 1e-2), "lse": Bound(1e-3, 0.0)}


def quantize_q_bound(dtype: torch.dtype, device) -> dict[str, Bound]:
    """The bound of ``quantize_q=True`` against ``reference(quantize_q=True)`` on ``device``:
    QUANTIZED_Q[dtype] in the CPU interpreter, QUANTIZED_Q_SERVING on a GPU (see QUANTIZED_Q)."""
    return QUANTIZED_Q_SERVING if torch.device(device).type != "cpu" else QUANTIZED_Q[dtype]


# fp8_dots (mla_decode) against the reference of the values that mode rounds
# (DecodeInputs.reference(fp8_dots=)): "qk" is quantize_q_bound (the same q codes); "all" also
# rounds p, which the kernel scales by its running row max and the reference by the global one
# (they agree on later tiles; on early ones a weight's e4m3 rounding, 2^-4 relative, differs).
# The bound is about twice what the kernel reaches against that reference
# (docs/notes/fp8-decode.md#accuracy).
# lse is exactly "qk"'s: the normaliser sums the unrounded p.
FP8_ALL_OUT = Bound(6e-2, 6e-2, norm=3e-2)

# Each fp8_dots mode against the float32 reference of the unrounded q (the accuracy the mode
# trades; that reference agrees with float64 attention within DENSE_F64). The norm-wise part is
# the statement: "none" rounds only out; "qk" and "all" <= 7% relative (Frobenius), lse <= 0.1 on
# random data, about twice the error the rounded modes reach there, in the CPU interpreter and on
# a GPU (docs/notes/fp8-decode.md#accuracy). The element-wise part only catches gross errors: a q
# rounding moves single scores by up to 2^-4 of |q||k|.
FP8_DOTS_ACCURACY: dict[str, dict[str, Bound]] = {
    "none": {"out": Bound(2e-2, 2e-2, norm=NORM[torch.bfloat16]), "lse": Bound(1e-3, 0.0)},
    "qk": {"out": Bound(0.3, 0.3, norm=0.07), "lse": Bound(0.1, 0.0)},
    "all": {"out": Bound(0.3, 0.3, norm=0.07), "lse": Bound(0.1, 0.0)},
}

# Data shaped like a model's latent cache (make_inputs(outliers=)): a few channels of the cache
# and of q have this many times the others' standard deviation.
OUTLIER_GAIN = 16.0
# "qk" and "all" on such data (8 large channels in the cache, 8 in q, rows of norms 0.01..1),
# against the unrounded q: the scores are larger, so the same relative q rounding moves them
# more. The norm bound is the random-data one; lse and the element-wise part are sized to what
# these data reach (docs/notes/fp8-decode.md#accuracy).
FP8_DOTS_OUTLIERS = {"out": Bound(2.0, 2.0, norm=0.07), "lse": Bound(0.35, 0.0)}


def fp8_dots_bound(fp8_dots: str, dtype: torch.dtype, device) -> dict[str, Bound]:
    """The bound of ``mla_decode(fp8_dots=mode)`` against ``reference(fp8_dots=mode)`` on
    ``device`` (see FP8_ALL_OUT and quantize_q_bound)."""
    qk = quantize_q_bound(dtype, device)
    if fp8_dots == "qk":
        return qk
    if fp8_dots == "all":
        return {"out": FP8_ALL_OUT, "lse": qk["lse"]}
    raise ValueError(f"fp8_dots_bound: expected 'qk' or 'all', got {fp8_dots!r}")


@dataclass(frozen=True)
class DecodeShape(CacheKind):
    """One decode batch: B requests of ``seq`` keys each (or ``lens``, one per request, overriding
    B and seq), N heads, q_len rows per request, cache pages of ``block`` tokens, ``kv`` "auto" (q's
    dtype) or "fp8"."""

    B: int = 1
    seq: int = 4096
    N: int = 16
    q_len: int = 1
    block: int = 64
    kv: str = "auto"
    lens: tuple[int, ...] | None = None

    def __post_init__(self):
        self.check_kv()
        if self.lens is not None:
            object.__setattr__(self, "lens", tuple(int(n) for n in self.lens))
            object.__setattr__(self, "B", len(self.lens))
            object.__setattr__(self, "seq", max(self.lens, default=0))

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return self.lens if self.lens is not None else (self.seq,) * self.B

    @property
    def rows(self) -> int:
        return self.B * self.q_len

    def label(self, dtype: torch.dtype = torch.bfloat16) -> str:
        """``"bf16 B=128 seq=4096 N=16"`` (+ `` q2`` for MTP rows; ``fp8`` for an fp8 cache)."""
        kind = "fp8" if self.fp8 else dtype_name(dtype)
        head = f"{kind} B={self.B} seq={self.seq} N={self.N}"
        if self.lens is not None and len(set(self.lens)) > 1:
            head = f"{kind} lens={','.join(map(str, self.lens))} N={self.N}"
        return (
            head + (f" q{self.q_len}" if self.q_len > 1 else "") + (f" block={self.block}" if self.block != 64 else "")
        )

    def set_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one (cache, table) copy's pages (what cold-cache rotation must exceed)."""
        pages = sum(-(-n // self.block) for n in self.seq_lens)
        return pages * self.block * KV_ROW_DIM * self.kv_elem_bytes(dtype)

    def keys_seen(self) -> int:
        """Keys summed over every row (row t of q_len sees seq - q_len + 1 + t: causal MTP)."""
        return sum(max(0, L - self.q_len + 1 + t) for L in self.seq_lens for t in range(self.q_len))

    def nbytes(self, dtype: torch.dtype) -> float:
        """The bytes one call must move: every key once, q in, out back."""
        qb = dtype.itemsize
        keys = sum(self.seq_lens) * KV_ROW_DIM * self.kv_elem_bytes(dtype)
        return keys + self.rows * self.N * KV_ROW_DIM * qb + self.rows * self.N * KV_LORA_RANK * qb

    def flops(self) -> float:
        return 2.0 * self.N * self.keys_seen() * (KV_ROW_DIM + KV_LORA_RANK)


def _sweep(Bs, seqs, kinds=("auto", "fp8")) -> list[DecodeShape]:
    return [DecodeShape(B, s, N, 1, kv=k) for k in kinds for N in (16, 128) for B in Bs for s in seqs]


# Named sets. DeepSeek-V3 serving: TP8 shards 128 heads to 16 per GPU; DP attention keeps all 128.
SHAPES: dict[str, list[DecodeShape]] = {
    "tp8": [DecodeShape(B, 4096, 16, 1, kv=kv) for kv in ("auto", "fp8") for B in (1, 32, 128)]
    + [DecodeShape(32, 16384, 16)],
    "dp": [DecodeShape(B, 4096, 128, 1, kv=kv) for kv in ("auto", "fp8") for B in (1, 32, 128)],
    "mtp": [
        DecodeShape(128, 4096, 16, 2),
        DecodeShape(128, 4096, 16, 4),
        DecodeShape(32, 4096, 128, 2),
        DecodeShape(128, 4096, 16, 2, kv="fp8"),
    ],
    # The benchmark's serving table: TP8, DP, MTP rows, fp8 cache, one request alone.
    "serving": [
        DecodeShape(128, 4096, 16),
        DecodeShape(128, 4096, 128),
        DecodeShape(32, 16384, 128),
        DecodeShape(128, 4096, 16, 2),
        DecodeShape(64, 4096, 16, 4),
        DecodeShape(64, 4096, 128, 2),
        DecodeShape(128, 4096, 16, kv="fp8"),
        DecodeShape(128, 4096, 128, kv="fp8"),
        DecodeShape(128, 4096, 16, 2, kv="fp8"),
        DecodeShape(64, 4096, 128, 2, kv="fp8"),
        DecodeShape(1, 4096, 16),
        DecodeShape(1, 4096, 16, kv="fp8"),
    ],
    # The bound-guard cost measurement (perf/guard_cost.py): TP8, DP, and TP8 with an fp8 cache.
    "guard": [DecodeShape(128, 4096, 16), DecodeShape(128, 4096, 128), DecodeShape(128, 4096, 16, kv="fp8")],
    "sweep": _sweep((1, 32, 128), (1024, 4096, 16384)),
    "sweep-quick": _sweep((1, 128), (4096,)),
    # One or two shapes per tuning group that matters (a ten-minute tuning run).
    "quick": [
        DecodeShape(128, 4096, 16),
        DecodeShape(1, 4096, 16),
        DecodeShape(128, 4096, 16, kv="fp8"),
        DecodeShape(128, 4096, 16, 2),
        DecodeShape(32, 4096, 128),
        DecodeShape(32, 4096, 128, kv="fp8"),
    ],
    # The CPU interpreter.
    "tiny": [DecodeShape(2, 64, 16, block=16)],
    "selfcheck": [DecodeShape(N=16, q_len=2, block=16, lens=(37, 5, 70))],
    # A config's acceptance check (replace N with the tier's BLOCK_H): uneven lengths, one page short.
    "verify": [DecodeShape(N=16, block=64, lens=(150, 7, 64))],
    # Odd sizes: N 1/8/24/128, blocks 1/16/64, one key, lengths off the block, MTP, an empty batch.
    "odd": [
        DecodeShape(N=1, block=1, lens=(1, 37)),
        DecodeShape(N=8, block=16, lens=(17, 1, 33)),
        DecodeShape(N=24, block=64, lens=(65, 1, 130)),
        DecodeShape(N=128, block=16, lens=(5, 40)),
        DecodeShape(N=8, q_len=3, block=4, lens=(9, 3)),
        DecodeShape(N=16, block=16, lens=()),
    ],
}

Q_LAYOUTS = ("vllm", "one_buffer", "separate")
OUT_LAYOUTS = ("contiguous", "padded", "token_pad")
LSE_LAYOUTS = ("contiguous", "transposed")
# mla_decode's own keywords (mla_sparse_attention's too); every other keyword a case call takes is a
# plan knob.
CALL_KEYS = ("sm_scale", "plan", "out", "lse", "k_scale", "workspace")


def call_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, **kw):
    """``mla_decode`` with its plan's knobs given as keywords beside the call's own (``CALL_KEYS``):
    the plan is ``plan_decode_for`` of the tensors and those knobs (kv_cache_dtype,
    num_splits, max_seq_len, config, fp8_dots, batch_invariant, backend, debug). How tests and
    benchmarks state a one-off call; a serving step makes its plan once instead."""
    from ..ops import mla_decode, plan_decode_for

    def make(call, **knobs):
        ws = call.get("workspace")
        return plan_decode_for(q_nope, kv_cache, block_table, k_scale=call.get("k_scale"), workspace=ws, **knobs)

    return mla_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, **with_plan(kw, CALL_KEYS, make, "call_decode"))


@dataclass
class LatentInputs(OnPagedCache, Checked):
    """What :class:`DecodeInputs` and ``sparse.SparseInputs`` share: these fields (``shape`` the op's
    shape; ``out`` / ``lse`` NaN-poisoned views inside ``out_base`` / ``lse_base``), the cache
    copies, the op's keywords and call (``args(i)`` and ``plan`` are each op's) and the check of out
    and lse against ``reference``."""

    shape: object
    dtype: torch.dtype
    q_nope: torch.Tensor
    q_pe: torch.Tensor
    paged: PagedCache
    out: torch.Tensor
    lse: torch.Tensor
    out_base: torch.Tensor = field(repr=False)
    lse_base: torch.Tensor = field(repr=False)
    k_scale: torch.Tensor | None = None
    sm_scale: float = SM_SCALE

    OP = ""  # the op's name in rocm_mla.ops
    PLAN_DEFAULTS = ()  # (knob, value) pairs a plan made here has unless the call names them

    @property
    def kv_cache_dtype(self) -> str:
        return "fp8" if self.paged.fp8 is not None else "auto"

    def kwargs(self, **overrides) -> dict:
        """The op's keywords (``overrides`` replace them; a ``plan=`` among them is used as given).
        Without a plan, one is made (:meth:`plan`) from the call's own plan knobs (every keyword
        outside ``CALL_KEYS``)."""
        kw = {**dict(sm_scale=self.sm_scale, out=self.out, lse=self.lse, k_scale=self.k_scale), **overrides}

        def make(call, **knobs):
            ws = call.get("workspace")
            base = dict(
                self.PLAN_DEFAULTS,
                workspace_numel=ws.numel() if isinstance(ws, torch.Tensor) else None,
                k_scale_on_device=isinstance(call["k_scale"], torch.Tensor),
            )
            return self.plan(**{**base, **knobs})

        return with_plan(kw, CALL_KEYS, make, f"{type(self).__name__}.kwargs")

    def run(self, i: int = 0, **overrides):
        """The op on cache copy i, writing ``out`` / ``lse``. ``overrides``: the call's own keywords
        (``CALL_KEYS``: plan, out=None, workspace, ...) and plan knobs (backend, config,
        num_splits, batch_invariant, debug, ... as the op's plan takes them) for the plan made here
        when none is given. Returns what the op returns."""
        from .. import ops

        return getattr(ops, self.OP)(*self.args(i), **self.kwargs(**overrides))

    def _plan_kw(self, device, sizes: dict, overrides: dict) -> dict:
        """The plan's keywords: those both ops' plans take alike (the cache as :meth:`args` passes
        it, an fp8 one as uint8 storage; k_scale on the device as the case holds it; ``device`` or
        q's), then the op's ``sizes``, then ``overrides``."""
        common = dict(
            num_heads=self.shape.N,
            block_size=self.shape.block,
            q_dtype=self.dtype,
            kv_dtype=self.paged.stored(0).dtype,
            kv_cache_dtype=self.kv_cache_dtype,
            device=torch.device(device) if device is not None else self.q_nope.device,
            k_scale_on_device=self.k_scale is not None,
        )
        return {**common, **sizes, **overrides}

    def compare(self, out=None, lse=None, *, ref=None, tol=None, **which) -> list[Comparison]:
        """out and lse (default: the buffers) against the reference of the rows ``which`` selects
        (:meth:`reference`'s keywords) or ``ref`` ((out, lse) of as many rows as compared), under
        ``tol`` ({"out": Bound, "lse": Bound}; default TOLERANCE[dtype], else a named bound)."""
        ro, rl = ref if ref is not None else self.reference(**which)
        r, tol = ro.shape[0], TOLERANCE[self.dtype] if tol is None else tol
        out, lse = (self.out if out is None else out)[:r], (self.lse if lse is None else lse)[:r]
        return [compare("out", out, ro, tol["out"]), compare("lse", lse, rl, tol["lse"])]


@dataclass(kw_only=True)
class DecodeInputs(LatentInputs):
    """One decode call's tensors (``shape`` a :class:`DecodeShape`). ``args(i)`` is mla_decode's
    positional arguments with cache copy i (an fp8 cache as uint8 storage, as vLLM passes it);
    ``kwargs()`` the keywords (a plan made without max_seq_len unless the call gives one)."""

    seq_lens: torch.Tensor  # [B] int32

    OP = "mla_decode"
    PLAN_DEFAULTS = (("max_seq_len", None),)

    def args(self, i: int = 0) -> tuple:
        return (self.q_nope, self.q_pe, self.paged.stored(i), self.paged.tables[i], self.seq_lens)

    def plan(self, device=None, **overrides):
        """The :class:`~rocm_mla.ops.DecodePlan` of :meth:`run`'s call (``overrides``: config,
        num_splits, max_seq_len, fp8_dots, ... as :func:`~rocm_mla.ops.plan_decode` takes them;
        max_seq_len defaults to the longest request, as a benchmark passes it)."""
        from ..ops import plan_decode

        s = self.shape
        sizes = dict(batch=s.B, q_len=s.q_len, max_blocks=self.paged.table.shape[1], max_seq_len=s.seq)
        return plan_decode(**self._plan_kw(device, sizes, overrides))

    def reference(self, requests: int | None = None, *, fp8_dots: str = "none", i: int = 0):
        """(out [rows', N, 512], lse [rows', N]) float32 of the first ``requests`` requests (all:
        None), from cache copy i; ``fp8_dots`` ("qk", "all"): of q (and p) rounded as that
        mla_decode mode rounds them (``reference.decode``: quantize_q_fp8, mla_decode_ref(p_fp8=))."""
        from ..reference import mla_decode_ref
        from ..reference.decode import quantize_q_fp8

        n = self.shape.B if requests is None else min(requests, self.shape.B)
        r = n * self.shape.q_len
        qn, qp = self.q_nope[:r], self.q_pe[:r]
        kind = (self.paged.fp8 or platform_fp8(qn.device)) if fp8_dots != "none" else None
        if kind is not None:
            qn, qp = quantize_q_fp8(qn, qp, kind)
        cache, table, lens = self.paged.caches[i], self.paged.tables[i][:n], self.seq_lens[:n]
        p_fp8 = kind if fp8_dots == "all" else None
        return mla_decode_ref(qn, qp, cache, table, lens, self.sm_scale, self.k_scale, p_fp8=p_fp8)


def latent_tensors(
    lens,
    block: int,
    fp8_cache: bool,
    rows: int,
    N: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    copies: int = 1,
    k_scale: float = 0.05,
    fp8: torch.dtype | None = None,
    q_layout: str = "vllm",
    out_layout: str = "contiguous",
    lse_layout: str = "contiguous",
    spare_pages: int = 3,
    spare_cols: int = 1,
    unused: str = "nan",
    guard: int = 0,
    outliers: int = 0,
) -> dict:
    """The fields of :class:`LatentInputs` that mla_decode's and mla_sparse_attention's cases build
    alike (their ``make_inputs`` keywords), drawn in this order from ``gen``: ``paged`` (requests of
    ``lens`` keys in pages of ``block``) and its ``k_scale``, ``q_nope [rows, N, 512]`` and ``q_pe
    [rows, N, 64]``; ``out [rows, N, 512]`` and ``lse [rows, N]`` NaN-poisoned views of
    ``out_base`` / ``lse_base``.

    dtype: q's and out's dtype (and the cache's unless ``fp8_cache``). fp8: the e4m3 kind of an fp8
    cache (default: the platform's). k_scale: the fp8 cache's per-tensor scale. copies: R
    independent (cache, block table) pairs (cold-cache rotation; :func:`cold_copies`).
    q_layout (``Q_LAYOUTS``): "vllm" (ql_nope the ``[N, rows, 512]`` W_UK bmm output read as
    ``[rows, N, 512]``, q_pe a slice ``q[..., 128:]`` of ``[rows, N, 192]``), "one_buffer" (slices
    of one ``[rows, N, 584]``), "separate" (contiguous q_nope; q_pe ``[rows + 1, N, 192][1:, :,
    128:]``). out_layout (``OUT_LAYOUTS``): "contiguous", "padded" (``[rows, N, 520][..., :512]``),
    "token_pad" (token stride N*512 + 512). lse_layout (``LSE_LAYOUTS``): "contiguous" or
    "transposed" (an ``[N, rows]`` buffer's transpose).
    spare_pages / spare_cols: NaN pages and the table columns pointing at them (benches and the
    tuner pass spare_cols=0: a table as wide as the longest request, the width the plan sees).
    unused / guard: see :func:`rocm_mla.cases.paged_cache` (the bad-input tests: finite unused slots
    inside sentinel guards). outliers: that many latent channels of the cache, and as many others
    of q_nope, drawn OUTLIER_GAIN times wider (a model's latent cache has a few large channels);
    an fp8 cache's k_scale is then OUTLIER_GAIN times larger, so that they fit the kind's range.
    """
    for name, v, ok in (("q_layout", q_layout, Q_LAYOUTS), ("out_layout", out_layout, OUT_LAYOUTS),
                        ("lse_layout", lse_layout, LSE_LAYOUTS)):  # fmt: skip
        if v not in ok:
            raise ValueError(f"make_inputs: {name}: expected one of {ok}, got {v!r}")
    L, g = KV_LORA_RANK, gen
    k_std, q_std = 1.0, None
    if outliers:
        k_std, q_std = torch.ones(KV_ROW_DIM), torch.ones(L)
        step = L // (2 * outliers)
        k_std[torch.arange(outliers) * 2 * step] = OUTLIER_GAIN  # even slots for the cache,
        q_std[torch.arange(outliers) * 2 * step + step] = OUTLIER_GAIN  # odd ones for q
        k_scale = k_scale * OUTLIER_GAIN
    paged, ks = case_paged_cache(
        lens, block, fp8_cache, kind=fp8, k_scale=k_scale, dtype=dtype, device=device, gen=g, copies=copies,
        spare_pages=spare_pages, spare_cols=spare_cols, unused=unused, guard=guard, scale=k_std,
    )  # fmt: skip
    if q_layout == "vllm":
        # ql_nope = bmm(q_nope^T [N, rows, 128], W_UK_T [N, 128, 512]) -> [N, rows, 512], read as [rows, N, 512].
        q_nope = randn((N, rows, L), g, device, dtype).transpose(0, 1)
        q_pe = randn((rows, N, 192), g, device, dtype)[..., 128:]
    elif q_layout == "one_buffer":
        base = randn((rows, N, KV_ROW_DIM + 8), g, device, dtype)
        q_nope, q_pe = base[..., :L], base[..., L:KV_ROW_DIM]
    else:
        q_nope = randn((rows, N, L), g, device, dtype)
        q_pe = randn((rows + 1, N, 192), g, device, dtype)[1:, :, 128:]
    if q_std is not None:
        q_nope.mul_(q_std.to(device=device, dtype=dtype))
    okw = {"contiguous": {}, "padded": {"pad_last": 8}, "token_pad": {"token_pad": 1}}[out_layout]
    out_base, out = poisoned((rows, N, L), dtype, device, **okw)
    lse_base, lse = poisoned((rows, N), torch.float32, device, transpose01=lse_layout == "transposed")
    return dict(paged=paged, k_scale=ks, q_nope=q_nope, q_pe=q_pe, out=out, lse=lse, out_base=out_base,
                lse_base=lse_base)  # fmt: skip


def make_inputs(
    shape: DecodeShape, *, dtype: torch.dtype = torch.bfloat16, device="cpu", seed: int = 0, gen=None, **kw
) -> DecodeInputs:
    """Fresh random inputs of ``shape`` (see the module docstring), from ``gen`` or a generator of
    ``seed`` on ``device``. ``kw``: :func:`latent_tensors`'s keywords (copies, k_scale, fp8, the q /
    out / lse layouts, spare_pages, spare_cols, unused, guard, outliers)."""
    device, g = device_generator(device, seed, gen)
    parts = latent_tensors(
        shape.seq_lens, shape.block, shape.fp8, shape.rows, shape.N, dtype=dtype, device=device, gen=g, **kw
    )
    seq_lens = torch.tensor(shape.seq_lens, dtype=torch.int32, device=device)
    return DecodeInputs(shape, dtype, seq_lens=seq_lens, **parts)
