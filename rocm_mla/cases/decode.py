"""mla_decode's cases: the shapes, the inputs as vLLM hands them over, the tolerance, the check.

Inputs (:func:`make_inputs`): a paged latent cache ``[num_pages, block_size, 576]`` with a
shuffled block table, NaN in every slot no request covers (page tails, spare pages the table's
spare columns point at), in q's dtype or fp8 (the platform's e4m3 kind, stored = value / k_scale);
q as the model produces it (``q_layout="vllm"``: ``ql_nope`` the ``[N, rows, 512]`` W_UK bmm output
read as ``[rows, N, 512]``, ``q_pe = q[..., 128:]`` of ``[rows, N, 192]``); out ``[rows, N, 512]``
and lse ``[rows, N]`` NaN-poisoned, any of the layouts below. rows = B x q_len: request b's rows are
its last q_len tokens (MTP), causal among themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..mla_dims import KV_LORA_RANK, KV_ROW_DIM
from ._buffers import poisoned
from ._compare import NORM, Bound, Comparison, compare, dtype_name, first_problem, raise_on
from ._paged import PagedCache, generator, paged_cache, platform_fp8, randn

SM_SCALE = 1.0 / math.sqrt(192)  # DeepSeek: 1/sqrt(qk_nope + qk_rope) before yarn mscale

# One table (the rule: rocm_mla.cases._compare). Element-wise: out rounded once plus p and V in
# 16 bits (fp32: float32 sums over up to 16k keys).
# Norm-wise: fp32 1e-5, fp16 2e-3, bf16 1e-2 (NORM). lse: 1e-3 absolute (float32 sums of exact
# products; the natural log of ~seq).
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
    QUANTIZED_Q[dtype] in the CPU interpreter (q / scale rounds exactly as the reference rounds it);
    QUANTIZED_Q_SERVING on a GPU, where q / scale on a rounding boundary now and then takes the
    neighbouring e4m3 code and moves that row's scores (docs/notes/fp8-decode.md)."""
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
class DecodeShape:
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
        if self.kv not in ("auto", "fp8"):
            raise ValueError(f"DecodeShape: kv: expected 'auto' or 'fp8', got {self.kv!r}")
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

    @property
    def fp8(self) -> bool:
        return self.kv == "fp8"

    def label(self, dtype: torch.dtype = torch.bfloat16) -> str:
        """``"bf16 B=128 seq=4096 N=16"`` (+ `` q2`` for MTP rows; ``fp8`` for an fp8 cache)."""
        kind = "fp8" if self.fp8 else dtype_name(dtype)
        head = f"{kind} B={self.B} seq={self.seq} N={self.N}"
        if self.lens is not None and len(set(self.lens)) > 1:
            head = f"{kind} lens={','.join(map(str, self.lens))} N={self.N}"
        return (
            head + (f" q{self.q_len}" if self.q_len > 1 else "") + (f" block={self.block}" if self.block != 64 else "")
        )

    def kv_elem_bytes(self, dtype: torch.dtype) -> int:
        return 1 if self.fp8 else dtype.itemsize

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
# mla_decode's own keywords; every other keyword a case call takes is a plan_decode knob.
CALL_KEYS = ("sm_scale", "plan", "out", "lse", "k_scale", "workspace")
LSE_LAYOUTS = ("contiguous", "transposed")


def call_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, **kw):
    """``mla_decode`` with its plan's knobs given as keywords beside the call's own (``CALL_KEYS``):
    the plan is ``plan_decode_for`` of the tensors and those knobs (kv_cache_dtype,
    num_splits, max_seq_len, config, fp8_dots, batch_invariant, backend, debug). How tests and
    benchmarks state a one-off call; a serving step makes its plan once instead."""
    from ..ops import mla_decode, plan_decode_for

    call = {k: kw.pop(k) for k in list(kw) if k in CALL_KEYS}
    if call.get("plan") is None:
        call["plan"] = plan_decode_for(
            q_nope, kv_cache, block_table, k_scale=call.get("k_scale"), workspace=call.get("workspace"), **kw
        )
    elif kw:
        raise TypeError(f"call_decode: plan knobs {sorted(kw)} beside a plan")
    return mla_decode(q_nope, q_pe, kv_cache, block_table, seq_lens, **call)


@dataclass
class DecodeInputs:
    """One decode call's tensors. ``args(i)`` is mla_decode's positional arguments with cache copy i
    (an fp8 cache as uint8 storage, as vLLM passes it); ``kwargs()`` the keywords; ``out`` / ``lse``
    NaN-poisoned views inside ``out_base`` / ``lse_base``."""

    shape: DecodeShape
    dtype: torch.dtype
    q_nope: torch.Tensor
    q_pe: torch.Tensor
    paged: PagedCache
    seq_lens: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    out_base: torch.Tensor = field(repr=False)
    lse_base: torch.Tensor = field(repr=False)
    k_scale: torch.Tensor | None = None
    sm_scale: float = SM_SCALE

    @property
    def kv_cache(self) -> torch.Tensor:
        """Cache copy 0 as a typed tensor (fp8: the e4m3 kind), the way the reference reads it."""
        return self.paged.cache

    @property
    def block_table(self) -> torch.Tensor:
        return self.paged.table

    @property
    def copies(self) -> int:
        return self.paged.copies

    @property
    def kv_cache_dtype(self) -> str:
        return "fp8" if self.paged.fp8 is not None else "auto"

    def args(self, i: int = 0) -> tuple:
        return (self.q_nope, self.q_pe, self.paged.stored(i), self.paged.tables[i], self.seq_lens)

    def kwargs(self, **overrides) -> dict:
        """mla_decode's keywords (``overrides`` replace them; a ``plan=`` among them is used as
        given). Without a plan, one is made from the call's own knobs (``plan_keys``)."""
        kw = dict(sm_scale=self.sm_scale, out=self.out, lse=self.lse, k_scale=self.k_scale)
        knobs = {k: overrides.pop(k) for k in list(overrides) if k not in CALL_KEYS}
        kw.update(overrides)
        if kw.get("plan") is None:
            ws = kw.get("workspace")
            base = dict(
                max_seq_len=None,
                workspace_numel=ws.numel() if isinstance(ws, torch.Tensor) else None,
                k_scale_on_device=isinstance(kw["k_scale"], torch.Tensor),
            )
            kw["plan"] = self.plan(**{**base, **knobs})
        elif knobs:
            raise TypeError(f"DecodeInputs.kwargs: plan knobs {sorted(knobs)} beside a plan")
        return kw

    def run(self, i: int = 0, **overrides):
        """mla_decode on copy i, writing ``out`` / ``lse``. ``overrides``: the call's own keywords
        (``CALL_KEYS``: plan, out=None, workspace, ...) and plan knobs (backend, config,
        num_splits, max_seq_len, fp8_dots, batch_invariant, debug, as ``plan_decode`` takes
        them) for the plan made here when none is given. Returns what the op returns."""
        from ..ops import mla_decode

        return mla_decode(*self.args(i), **self.kwargs(**overrides))

    def plan(self, device=None, **overrides):
        """The :class:`~rocm_mla.ops.DecodePlan` of :meth:`run`'s call (``overrides``: config,
        num_splits, max_seq_len, fp8_dots, ... as :func:`~rocm_mla.ops.plan_decode` takes them;
        max_seq_len defaults to the longest request, as a benchmark passes it; k_scale on the
        device as the case holds it)."""
        from ..ops import plan_decode

        kw = dict(
            batch=self.shape.B,
            num_heads=self.shape.N,
            q_len=self.shape.q_len,
            max_blocks=self.paged.table.shape[1],
            block_size=self.shape.block,
            q_dtype=self.dtype,
            kv_dtype=self.paged.stored(0).dtype,
            kv_cache_dtype=self.kv_cache_dtype,
            device=torch.device(device) if device is not None else self.q_nope.device,
            max_seq_len=self.shape.seq,
            k_scale_on_device=self.k_scale is not None,
        )
        kw.update(overrides)
        return plan_decode(**kw)

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
        ks = self.k_scale
        return mla_decode_ref(
            qn,
            qp,
            self.paged.caches[i],
            self.paged.tables[i][:n],
            self.seq_lens[:n],
            self.sm_scale,
            ks,
            p_fp8=kind if fp8_dots == "all" else None,
        )

    def compare(self, out=None, lse=None, *, requests=None, fp8_dots="none", ref=None, tol=None) -> list[Comparison]:
        """out and lse (default: the buffers) against the reference of the first ``requests`` (or
        ``ref``: (out, lse) of as many rows as compared), under ``tol`` ({"out": Bound, "lse":
        Bound}; default TOLERANCE[dtype], else one of the named bounds above)."""
        out = self.out if out is None else out
        lse = self.lse if lse is None else lse
        ro, rl = ref if ref is not None else self.reference(requests, fp8_dots=fp8_dots)
        r = ro.shape[0]
        tol = TOLERANCE[self.dtype] if tol is None else tol
        return [compare("out", out[:r], ro, tol["out"]), compare("lse", lse[:r], rl, tol["lse"])]

    def mismatch(self, out=None, lse=None, **kw) -> str:
        """'' when out and lse agree with the reference (see :meth:`compare`), else what differs."""
        return first_problem(*self.compare(out, lse, **kw))

    def check(self, out=None, lse=None, **kw) -> None:
        """Raise CaseMismatch (an AssertionError) naming what differs."""
        raise_on(self.mismatch(out, lse, **kw))


def latent_queries(rows: int, N: int, q_layout: str, g: torch.Generator, device, dtype: torch.dtype):
    """``(q_nope [rows, N, 512], q_pe [rows, N, 64])``, fresh normal values in one of ``Q_LAYOUTS``:
    "vllm" (ql_nope the ``[N, rows, 512]`` W_UK bmm output read as ``[rows, N, 512]``, q_pe a slice
    ``q[..., 128:]`` of ``[rows, N, 192]``), "one_buffer" (slices of one ``[rows, N, 584]``), "separate"
    (contiguous q_nope; q_pe ``[rows + 1, N, 192][1:, :, 128:]``). mla_decode's and
    mla_sparse_attention's cases share it."""
    if q_layout not in Q_LAYOUTS:
        raise ValueError(f"make_inputs: q_layout: expected one of {Q_LAYOUTS}, got {q_layout!r}")
    L = KV_LORA_RANK
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
    return q_nope, q_pe


def latent_destinations(rows: int, N: int, dtype: torch.dtype, device, out_layout: str, lse_layout: str):
    """``(out_base, out [rows, N, 512], lse_base, lse [rows, N])``: NaN-poisoned views in one of
    ``OUT_LAYOUTS`` ("contiguous", "padded" ``[rows, N, 520][..., :512]``, "token_pad": token stride
    N*512 + 512) and ``LSE_LAYOUTS`` ("contiguous", "transposed": an ``[N, rows]`` buffer's transpose)."""
    if out_layout not in OUT_LAYOUTS:
        raise ValueError(f"make_inputs: out_layout: expected one of {OUT_LAYOUTS}, got {out_layout!r}")
    if lse_layout not in LSE_LAYOUTS:
        raise ValueError(f"make_inputs: lse_layout: expected one of {LSE_LAYOUTS}, got {lse_layout!r}")
    okw = {"contiguous": {}, "padded": {"pad_last": 8}, "token_pad": {"token_pad": 1}}[out_layout]
    out_base, out = poisoned((rows, N, KV_LORA_RANK), dtype, device, **okw)
    lse_base, lse = poisoned((rows, N), torch.float32, device, transpose01=lse_layout == "transposed")
    return out_base, out, lse_base, lse


def make_inputs(
    shape: DecodeShape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int = 0,
    gen: torch.Generator | None = None,
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
) -> DecodeInputs:
    """Fresh random inputs of ``shape`` (see the module docstring).

    dtype: q's and out's dtype (and the cache's unless shape.kv is "fp8"). fp8: the e4m3 kind of an
    fp8 cache (default: the platform's). k_scale: the fp8 cache's per-tensor scale. copies: R
    independent (cache, block table) pairs (cold-cache rotation; :func:`cold_copies`).
    q_layout: "vllm" (bmm output + slice of q), "one_buffer" (slices of one ``[rows, N, 584]``),
    "separate" (contiguous q_nope; q_pe ``[rows + 1, N, 192][1:, :, 128:]``). out_layout:
    "contiguous", "padded" (``[rows, N, 520][..., :512]``), "token_pad" (token stride N*512 + 512).
    lse_layout: "contiguous" ``[rows, N]`` or "transposed" (``[N, rows]`` buffer's transpose).
    spare_pages / spare_cols: NaN pages and the table columns pointing at them (benches and the
    tuner pass spare_cols=0: a table as wide as the longest request, the width the plan sees).
    unused / guard: see :func:`rocm_mla.cases.paged_cache` (the bad-input tests: finite unused slots
    inside sentinel guards). outliers: that many latent channels of the cache, and as many others
    of q_nope, drawn OUTLIER_GAIN times wider (a model's latent cache has a few large channels);
    an fp8 cache's k_scale is then OUTLIER_GAIN times larger, so that they fit the kind's range.
    """
    for name, v, ok in (("q_layout", q_layout, Q_LAYOUTS), ("out_layout", out_layout, OUT_LAYOUTS)):
        if v not in ok:
            raise ValueError(f"decode make_inputs: {name}: expected one of {ok}, got {v!r}")
    if lse_layout not in LSE_LAYOUTS:
        raise ValueError(f"decode make_inputs: lse_layout: expected one of {LSE_LAYOUTS}, got {lse_layout!r}")
    device = torch.device(device)
    g = gen if gen is not None else generator(seed, device)
    kind = (fp8 or platform_fp8(device)) if shape.fp8 else None
    k_std, q_std = 1.0, None
    if outliers:
        k_std, q_std = torch.ones(KV_ROW_DIM), torch.ones(KV_LORA_RANK)
        step = KV_LORA_RANK // (2 * outliers)
        k_std[torch.arange(outliers) * 2 * step] = OUTLIER_GAIN  # even slots for the cache,
        q_std[torch.arange(outliers) * 2 * step + step] = OUTLIER_GAIN  # odd ones for q
        k_scale = k_scale * OUTLIER_GAIN
    paged = paged_cache(
        shape.seq_lens,
        shape.block,
        dtype=dtype,
        device=device,
        gen=g,
        fp8=kind,
        k_scale=k_scale if kind is not None else None,
        spare_pages=spare_pages,
        spare_cols=spare_cols,
        copies=copies,
        unused=unused,
        guard=guard,
        scale=k_std,
    )
    q_nope, q_pe = latent_queries(shape.rows, shape.N, q_layout, g, device, dtype)
    if q_std is not None:
        q_nope.mul_(q_std.to(device=device, dtype=dtype))
    out_base, out, lse_base, lse = latent_destinations(shape.rows, shape.N, dtype, device, out_layout, lse_layout)
    seq_lens = torch.tensor(shape.seq_lens, dtype=torch.int32, device=device)
    ks = torch.tensor([k_scale], device=device) if kind is not None else None
    return DecodeInputs(shape, dtype, q_nope, q_pe, paged, seq_lens, out, lse, out_base, lse_base, ks)
