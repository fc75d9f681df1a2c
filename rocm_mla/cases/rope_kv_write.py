"""fused_rope_mla_kv_write's cases: DeepSeek's layout, the tolerance, the check.

Inputs (:func:`make_inputs`): ``q [T, N, q_width]`` with ``q_pe = q[..., -64:]`` (DeepSeek: width
192, a strided slice; 64: contiguous); ``kv_a [T, 576]`` with ``k_pe = kv_a[:, 512:]`` viewed
``[T, 1, 64]``; ``kv_c [T, 512]``; random positions below ``max_pos``; ``cos_sin_cache
[max_pos, 64]`` = cat(cos, sin) x mscale; slots drawn without repeats from a cache of
``[num_blocks, block, 576]`` (NaN-poisoned, q's dtype or fp8 with k_scale), ``skip`` of them -1.
q_pe and k_pe are rotated in place: the originals are kept (``q0``, ``kv_a0``, ``cache0``) for the
reference and for :meth:`RopeInputs.untouched`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..mla_dims import KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM
from ..reference.rope_kv_write import rope_cos_sin_cache
from ._buffers import poisoned
from ._compare import NORM, Bound, Checked, Comparison, compare, dtype_name, first_problem
from ._paged import CacheKind, SlotWrite, device_generator, nan_filled, platform_fp8, randn

MAX_POS = 163840  # DeepSeek-V3: 4096 positions x YaRN factor 40


def _table(dtype: torch.dtype, t: float, unfused: float) -> dict[str, Bound]:
    norm = NORM[dtype]
    return {
        "q_pe": Bound(t, t, norm=norm),
        "k_pe": Bound(t, t, norm=norm),
        "rows": Bound(t, t, norm=norm),
        # fp8 cache rows, in code units (stored value / k_scale) against the reference's codes: one
        # code step (2^-3 relative, or the smallest subnormal) apart where float32 math rounds
        # differently (fma); the codes are equal almost everywhere.
        "rows_fp8": Bound(2.0**-9, 2.0**-3),
        # vLLM's unfused path rounds after every torch op in the model dtype: looser, same answer.
        "unfused": Bound(unfused, unfused),
        # Its fp8 rows, dequantized (code x k_scale): that rounding (absolute: rotated k_pe near zero
        # cancels in 16 bits) plus one code step (2^-3 relative).
        "rows_fp8_unfused": Bound(unfused, 2.0**-3),
    }


# One table (the rule: rocm_mla.cases._compare). Element-wise: float32 rotation rounded once on
# store, for the rotated q_pe/k_pe and the written rows. Norm-wise: NORM.
TOLERANCE: dict[torch.dtype, dict[str, Bound]] = {
    torch.float32: _table(torch.float32, 1e-5, 1e-5),
    torch.float16: _table(torch.float16, 2e-3, 4e-3),
    torch.bfloat16: _table(torch.bfloat16, 1.6e-2, 3.2e-2),
}

# fp8 cache rows in code units, for the memory-safety checks: the reference's codes, but for one
# step of the smallest e4m3fn subnormal. The latent part is a pure conversion; the rope part is the
# reference's float32 math (the CPU interpreter and the HIP kernel compiled for the host: the same
# operations; a GPU: the same but for an fma landing on a rounding boundary, which random values
# hardly ever reach). Tighter than TOLERANCE's "rows_fp8" (one code step anywhere).
FP8_SAME_CODES = Bound(2.0**-9, 0.0)

# The stored codes against the unrounded x / k_scale (saturated to the kind's range), in code
# units: half a code step (2^-4 relative, or half the kind's smallest subnormal), with 1% slack
# for the float32 division.
FP8_ROUND_TRIP: dict[torch.dtype, Bound] = {
    torch.float8_e4m3fn: Bound(1.01 * 2.0**-10, 1.01 * 2.0**-4),
    torch.float8_e4m3fnuz: Bound(1.01 * 2.0**-11, 1.01 * 2.0**-4),
}

# The op inside vLLM's compiled graph (the fused-op override) against vLLM's own forward_static
# RoPE on the same tokens: that path rounds each product and sum once in the model dtype, ours
# rotates in float32 and rounds once, so one rounding of the model dtype apart.
ONE_MODEL_ROUNDING: dict[torch.dtype, Bound] = {
    torch.float32: Bound(1e-6, 1e-6),
    torch.float16: Bound(2e-3, 2e-3),
    torch.bfloat16: Bound(1.6e-2, 1.6e-2),
}


def fp8_rows_vs_model_rounding(dtype: torch.dtype, k_scale: float) -> Bound:
    """fp8 cache rows (dequantized) of the fused write against vLLM's unfused path: one e4m3 step
    (|want| / 8, or the scaled subnormal step k_scale x 2^-9) plus that path's own rounding in the
    model dtype (ONE_MODEL_ROUNDING). In bf16, where x cos - y sin cancels, vLLM's 16-bit rotation
    is off by several e4m3 steps of the small result; ours rotates in float32."""
    b = ONE_MODEL_ROUNDING[dtype]
    return Bound(k_scale * 2.0**-9 + b.atol, 2.0**-3 + b.rtol)


@dataclass(frozen=True)
class RopeShape(SlotWrite, CacheKind):
    """T tokens, N heads, cache pages of ``block`` tokens, ``kv`` "auto" (q's dtype) or "fp8",
    q rows ``q_width`` wide (q_pe its last 64)."""

    T: int
    N: int = 16
    block: int = 64
    kv: str = "auto"
    q_width: int = 192

    def __post_init__(self):
        self.check_kv()
        if self.q_width < QK_ROPE_HEAD_DIM:
            raise ValueError(f"RopeShape: q_width: expected >= 64, got {self.q_width}")

    def label(self, dtype: torch.dtype = torch.bfloat16) -> str:
        """``"T=4096 N=16 bf16"`` (the cache's kind last)."""
        kind = "fp8" if self.fp8 else dtype_name(dtype)
        extra = (f" block={self.block}" if self.block != 64 else "") + (
            f" q_width={self.q_width}" if self.q_width != 192 else ""
        )
        return f"T={self.T} N={self.N} {kind}{extra}"

    def nbytes(self, dtype: torch.dtype) -> int:
        """The op's work (the same for every provider): q_pe and k_pe read and written, kv_c read, the
        cache rows written, positions and slots, the cos/sin rows."""
        e, c = dtype.itemsize, self.kv_elem_bytes(dtype)
        T, N, R = self.T, self.N, QK_ROPE_HEAD_DIM
        return 2 * T * N * R * e + 2 * T * R * e + T * KV_LORA_RANK * e + T * KV_ROW_DIM * c + 2 * T * 8 + T * R * e


SHAPES: dict[str, list[RopeShape]] = {
    "bench": [RopeShape(T, N, kv=kv) for kv in ("auto", "fp8") for T in (1, 64, 4096, 32768) for N in (16, 128)],
    "bench-quick": [RopeShape(4096, N, kv=kv) for kv in ("auto", "fp8") for N in (16, 128)],
    "tune": [
        RopeShape(64, 16),
        RopeShape(64, 128),
        RopeShape(4096, 16),
        RopeShape(4096, 128),
        RopeShape(32768, 16),
        RopeShape(32768, 128),
        RopeShape(32768, 16, kv="fp8"),
    ],
    "quick": [RopeShape(4096, 16), RopeShape(32768, 128), RopeShape(4096, 16, kv="fp8")],
    # The bound-guard cost measurement (perf/guard_cost.py): a prefill chunk of tokens.
    "guard": [RopeShape(32768, N, kv=kv) for kv in ("auto", "fp8") for N in (16, 128)],
    "tiny": [RopeShape(24, 4, block=16)],
    "selfcheck": [RopeShape(37, 16, block=16), RopeShape(37, 16, block=16, kv="fp8")],
    "verify": [RopeShape(37, 16, block=16), RopeShape(37, 128, block=16), RopeShape(37, 16, block=16, kv="fp8")],
    # Odd sizes: q_pe contiguous (width 64) and other head strides, N 1/8/16/24/128, blocks 1/16/64,
    # one token, no tokens.
    "odd": [
        RopeShape(7, 1, block=16, q_width=64),
        RopeShape(37, 8, block=1),
        RopeShape(37, 16, block=16, q_width=136),
        RopeShape(33, 24, block=64, q_width=256),
        RopeShape(5, 128, block=16),
        RopeShape(1, 16, block=16),
        RopeShape(0, 16, block=16),
    ],
}


@dataclass
class RopeInputs(Checked):
    """One fused_rope_mla_kv_write call's tensors; ``args()`` in its order (positions, q_pe, k_pe,
    kv_c, cos_sin_cache, kv_cache, slot_mapping; an fp8 cache as uint8 storage), ``kwargs()``."""

    shape: RopeShape
    dtype: torch.dtype
    q: torch.Tensor
    kv_a: torch.Tensor
    kv_c: torch.Tensor
    positions: torch.Tensor
    cos_sin: torch.Tensor
    cache: torch.Tensor
    slots: torch.Tensor
    k_scale: torch.Tensor
    fp8: torch.dtype | None
    is_neox: bool = False
    cache_base: torch.Tensor = field(default=None, repr=False)
    q0: torch.Tensor = field(default=None, repr=False)
    kv_a0: torch.Tensor = field(default=None, repr=False)
    cache0: torch.Tensor = field(default=None, repr=False)

    @property
    def q_pe(self) -> torch.Tensor:
        return self.q[..., -QK_ROPE_HEAD_DIM:]

    @property
    def k_pe(self) -> torch.Tensor:
        return self.kv_a[:, KV_LORA_RANK:].unsqueeze(1)

    @property
    def kv_cache_dtype(self) -> str:
        return "fp8" if self.fp8 is not None else "auto"

    def stored_cache(self) -> torch.Tensor:
        return self.cache.view(torch.uint8) if self.fp8 is not None else self.cache

    def args(self) -> tuple:
        return (self.positions, self.q_pe, self.k_pe, self.kv_c, self.cos_sin, self.stored_cache(), self.slots)

    def kwargs(self, **overrides) -> dict:
        return {**dict(is_neox=self.is_neox, kv_cache_dtype=self.kv_cache_dtype, k_scale=self.k_scale), **overrides}

    def run(self, **overrides):
        """The op on the working tensors (q_pe/k_pe rotated in place; ``overrides``: backend, ...)."""
        from ..ops import fused_rope_mla_kv_write

        return fused_rope_mla_kv_write(*self.args(), **self.kwargs(**overrides))

    def restore(self) -> None:
        """Put the originals back into q, kv_a and the cache (for another checked call)."""
        self.q.copy_(self.q0)
        self.kv_a.copy_(self.kv_a0)
        self.cache_base.copy_(self.cache0)

    def reference(self, rows: int | None = None):
        """(q_pe [T', N, 64], k_pe [T', 1, 64], cache rows [T', 576]) float32 of the first ``rows``
        tokens, from the originals."""
        from ..reference.rope_kv_write import fused_rope_mla_kv_write_ref

        r = self.shape.T if rows is None else min(rows, self.shape.T)
        return fused_rope_mla_kv_write_ref(
            self.positions[:r],
            self.q0[:r, :, -QK_ROPE_HEAD_DIM:],
            self.kv_a0[:r, KV_LORA_RANK:].unsqueeze(1),
            self.kv_c[:r],
            self.cos_sin,
            is_neox=self.is_neox,
        )

    def cached(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        """Which of ``slots`` (default: all of them) the op writes: ``0 <= slot < num_blocks x block``
        (a negative slot or one outside the cache is skipped)."""
        slots = self.slots if slots is None else slots
        return (slots >= 0) & (slots < self.cache.shape[0] * self.cache.shape[1])

    def _pages(self, slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(page, offset) of each written (:meth:`cached`) slot of ``slots`` (default: all), in token order."""
        slots = self.slots if slots is None else slots
        valid = slots[self.cached(slots)]
        return valid // self.shape.block, valid % self.shape.block

    def written_rows(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        """The cache rows at the written (:meth:`cached`) ``slots`` (default: all of them), in token
        order, as stored."""
        if self.cache.element_size() > 1:
            return self.cache[self._pages(slots)]
        # Gather bytes: float8 indexing is missing from some torch builds.
        return self.cache.view(torch.uint8)[self._pages(slots)].view(self.cache.dtype)

    def _rows(self, row_ref: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(written rows, reference rows ``row_ref`` (one per slot) at them): fp8 both as float32 codes."""
        got, want = self.written_rows(slots), row_ref[self.cached(slots)]
        if self.fp8 is None:
            return got, want
        from ..reference.rope_kv_write import quantize_fp8_ref

        return got.float(), quantize_fp8_ref(want, self.k_scale, self.fp8).float()

    def compare(self, *, rows: int | None = None, ref=None, fp8_bound: Bound | None = None) -> list[Comparison]:
        """q_pe, k_pe and the written cache rows of the first ``rows`` tokens against the reference
        (a NaN rotation where a position lies outside the cos/sin cache). ``fp8_bound``: the bound of
        fp8 cache rows in code units (default ``TOLERANCE[dtype]["rows_fp8"]``; :data:`FP8_SAME_CODES`)."""
        q_ref, k_ref, row_ref = ref if ref is not None else self.reference(rows)
        r = q_ref.shape[0]
        tol = TOLERANCE[self.dtype]
        sl = self.slots[:r]  # a slot mapping shorter than the batch: its tokens only
        got, want = self._rows(row_ref[: sl.shape[0]], sl)
        if self.fp8 is not None:
            rows_cmp = compare("cache rows (fp8 codes)", got, want, fp8_bound or tol["rows_fp8"])
        else:
            rows_cmp = compare("cache rows", got, want, tol["rows"])
        return [
            compare("q_pe", self.q_pe[:r], q_ref, tol["q_pe"]),
            compare("k_pe", self.k_pe[:r], k_ref, tol["k_pe"]),
            rows_cmp,
        ]

    def compare_unfused(self, *, ref=None) -> list[Comparison]:
        """vLLM's unfused two-step path (torch RoPE, then a torch cache write) against the reference:
        q_pe and the written cache rows under the "unfused" bound (fp8 rows dequantized:
        "rows_fp8_unfused"). That path leaves k_pe unrotated in kv_a, so k_pe is not compared."""
        q_ref, _, row_ref = ref if ref is not None else self.reference()
        tol = TOLERANCE[self.dtype]
        got, want = self._rows(row_ref, self.slots)
        if self.fp8 is not None:
            ks = self.k_scale.float()
            rows_cmp = compare("cache rows (fp8, dequantized)", got * ks, want * ks, tol["rows_fp8_unfused"])
        else:
            rows_cmp = compare("cache rows", got, want, tol["unfused"])
        return [compare("q_pe", self.q_pe, q_ref, tol["unfused"]), rows_cmp]

    def untouched(self) -> str:
        """'' when every cache row without a slot, q outside q_pe and kv_a outside k_pe are bitwise
        what they were (NaN stays NaN: compared as bytes), else what changed."""
        # The elements of the written rows, mapped onto cache_base through the view's strides (pages
        # between the shown ones, elements between strided ones: untouched too).
        written = torch.zeros(self.cache_base.shape, dtype=torch.bool, device=self.cache.device)
        offset = self.cache.storage_offset() - self.cache_base.storage_offset()
        written.as_strided(self.cache.shape, self.cache.stride(), offset)[self._pages()] = True

        def as_bytes(x):
            return x.view(torch.uint8).view(*x.shape, -1)

        if not torch.equal(as_bytes(self.cache_base)[~written], as_bytes(self.cache0)[~written]):
            return "kv_cache: a row without a slot was written"
        nope = self.q.shape[-1] - QK_ROPE_HEAD_DIM
        if not torch.equal(self.q[..., :nope], self.q0[..., :nope]):
            return "q: changed outside q_pe"
        if not torch.equal(self.kv_a[:, :KV_LORA_RANK], self.kv_a0[:, :KV_LORA_RANK]):
            return "kv_a: changed outside k_pe"
        return ""

    def mismatch(self, **kw) -> str:
        """'' when :meth:`compare` holds and :meth:`untouched` finds nothing, else the first problem."""
        return first_problem(*self.compare(**kw)) or self.untouched()


def make_inputs(
    shape: RopeShape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int = 0,
    gen: torch.Generator | None = None,
    is_neox: bool = False,
    max_pos: int = 8192,
    cos_sin: torch.Tensor | None = None,
    cs_dtype: torch.dtype = torch.float32,
    mscale: float = 1.0,
    k_scale: float = 0.05,
    fp8: torch.dtype | None = None,
    skip=(),
    block_pad: int = 0,
    scale: float = 1.0,
    inner_stride: int = 1,
) -> RopeInputs:
    """Fresh random inputs of ``shape`` (see the module docstring).

    cos_sin: a ``[max_pos, 64]`` table to share between shapes (default: ``rope_cos_sin_cache(max_pos,
    mscale=mscale, dtype=cs_dtype)``; a table in the model dtype is what vLLM keeps). skip: token
    indices whose slot is -1. block_pad: extra pages between the ones the cache view shows (a
    non-contiguous block stride). fp8: the e4m3 kind of an fp8 cache (default: the platform's).
    scale: the standard deviation of q, kv_a and kv_c. inner_stride: the element stride of the last
    dim of q, kv_a, kv_c and the cache (each a view of a NaN buffer ``inner_stride`` times as wide:
    the kernels' scalar path); ``cache_base`` is then ``[.., block, 576 * inner_stride]``.
    """
    device, g = device_generator(device, seed, gen)
    T, N = shape.T, shape.N
    if cos_sin is None:
        cos_sin = rope_cos_sin_cache(max_pos, mscale=mscale, dtype=cs_dtype, device=device)
    max_pos = cos_sin.shape[0]

    def values(shape_):
        x = randn(shape_, g, device, dtype, scale)
        if inner_stride == 1:
            return x
        return poisoned(shape_, dtype, device, inner_stride=inner_stride)[1].copy_(x)

    q = values((T, N, shape.q_width))
    kv_a = values((T, KV_ROW_DIM))
    kv_c = values((T, KV_LORA_RANK))
    positions = torch.randint(0, max_pos, (T,), generator=g, device=g.device).to(device)
    slots = shape.draw_slots(g, device, skip)
    nb = shape.num_blocks()
    kind = (fp8 or platform_fp8(device)) if shape.fp8 else None
    cache_base = nan_filled((nb * (1 + block_pad), shape.block, KV_ROW_DIM * inner_stride), kind or dtype, device)
    cache = cache_base[:: 1 + block_pad, :, ::inner_stride]
    ks = torch.tensor([k_scale], device=device)
    tensors = (q, kv_a, kv_c, positions, cos_sin, cache, slots, ks)
    return RopeInputs(shape, dtype, *tensors, kind, is_neox, cache_base, q.clone(), kv_a.clone(), cache_base.clone())


def make_copies(shape: RopeShape, copies: int, *, seed: int = 0, **kw) -> list[RopeInputs]:
    """``copies`` independent input sets of ``shape`` (seeds seed, seed + 1, ...; fresh slots and
    caches each) sharing one cos/sin table: a timing loop rotating over them writes caches that
    are not in L2. ``kw``: :func:`make_inputs`'s keywords."""
    first = make_inputs(shape, seed=seed, **kw)
    kw["cos_sin"] = first.cos_sin
    return [first] + [make_inputs(shape, seed=seed + i, **kw) for i in range(1, copies)]
