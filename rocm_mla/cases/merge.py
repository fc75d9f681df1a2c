"""merge_attn_states's cases: two partial attentions in vLLM's layouts, the tolerance, the check.

Inputs (:func:`make_inputs`): prefix/suffix outputs ``[T, N, D]`` (fresh normal values) and their
lse ``[N, T]`` (normal x 3: the sides' weights differ widely), output and output_lse NaN-poisoned,
each a view of the layout's buffer ("strided" is the pad_v layout prefill produces:
``[T, N, D + 64][..., :D]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._buffers import poisoned
from ._compare import NORM, Bound, Checked, Comparison, compare
from ._paged import device_generator, randn

# One table (the rule: rocm_mla.cases._compare). Element-wise: one rounding of the output plus
# float32 math; lse 1e-5 (a float32 logaddexp). Norm-wise: NORM.
TOLERANCE: dict[torch.dtype, dict[str, Bound]] = {
    dt: {"output": Bound(t, t, norm=NORM[dt]), "output_lse": Bound(1e-5, 1e-5)}
    for dt, t in ((torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2))
}

# A row whose other side has weight 0 (lse -inf, or +inf read as -inf) is this side's row up to
# the float32 rounding of w * x with w = exp(0) / 1 (or exp(-2000) = 0 beside it): torch.testing's
# float32 bound, tighter than the output bound, for the tests of that rule.
ONE_SIDE = Bound(1e-5, 1.3e-6)

# layout -> (poisoned() keywords of the [T, N, D] tensors, of the [N, T] lse tensors)
LAYOUTS: dict[str, tuple[dict, dict]] = {
    "contiguous": ({}, {}),
    "strided": ({"pad_last": 64}, {}),  # pad_v rows: [T, N, D + 64][..., :D]
    "head_slice": ({"token_pad": 3}, {"transpose01": True}),  # token stride != N * D; lse [T, N].T
    "inner_stride2": ({"inner_stride": 2}, {"token_pad": 1}),  # element stride 2 (the scalar path)
}


@dataclass(frozen=True)
class MergeShape:
    """T tokens, N heads, head size D, one of :data:`LAYOUTS`; ``lse``: override the layout's lse
    layout ("contiguous" or "transposed")."""

    T: int
    N: int
    D: int = 128
    layout: str = "strided"
    lse: str | None = None

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"MergeShape: layout: expected one of {tuple(LAYOUTS)}, got {self.layout!r}")
        if self.lse not in (None, "contiguous", "transposed"):
            raise ValueError(f"MergeShape: lse: expected None, 'contiguous' or 'transposed', got {self.lse!r}")

    @property
    def label(self) -> str:
        return f"T={self.T} N={self.N} D={self.D} {self.layout}" + (f" lse={self.lse}" if self.lse else "")

    def nbytes(self, dtype: torch.dtype) -> int:
        """Two sides read, the output written, and three lse rows."""
        return 3 * self.T * self.N * self.D * dtype.itemsize + 3 * self.T * self.N * 4


SHAPES: dict[str, list[MergeShape]] = {
    "bench": [
        MergeShape(T, N, D, layout)
        for T in (4096, 32768)
        for N in (16, 128)
        for D in (128, 512)
        for layout in ("contiguous", "strided")
    ],
    "bench-quick": [
        MergeShape(4096, N, D, layout) for N in (16, 128) for D in (128, 512) for layout in ("contiguous", "strided")
    ],
    # The merges prefill does (pad_v-strided D = 128), for the tuner, and its ten-minute subset.
    "tune": [MergeShape(T, N, 128, "strided") for T in (4096, 32768) for N in (16, 128)],
    "quick": [MergeShape(32768, 128, 128, "strided"), MergeShape(4096, 16, 128, "strided")],
    "tiny": [MergeShape(40, 4, 128)],
    "selfcheck": [MergeShape(37, 16, 128, "strided", lse="transposed")],
    "verify": [MergeShape(37, 8, 128), MergeShape(37, 8, 512)],
    # Odd sizes: one token and head, 8 and 24 heads, head sizes 72 and 13 (not multiples of 8), T = 0.
    "odd": [
        MergeShape(1, 1, 128),
        MergeShape(7, 8, 128),
        MergeShape(5, 24, 512),
        MergeShape(3, 3, 72),
        MergeShape(4, 2, 13),
        MergeShape(0, 8, 128),
    ],
}


@dataclass
class MergeInputs(Checked):
    """One merge_attn_states call: ``args()`` in its order (output, prefix_output, prefix_lse,
    suffix_output, suffix_lse, output_lse); ``output`` / ``output_lse`` NaN-poisoned views inside
    ``output_base`` / ``output_lse_base``."""

    shape: MergeShape
    dtype: torch.dtype
    output: torch.Tensor
    prefix_output: torch.Tensor
    prefix_lse: torch.Tensor
    suffix_output: torch.Tensor
    suffix_lse: torch.Tensor
    output_lse: torch.Tensor | None
    output_base: torch.Tensor = field(repr=False)
    output_lse_base: torch.Tensor | None = field(default=None, repr=False)

    def args(self) -> tuple:
        return (
            self.output,
            self.prefix_output,
            self.prefix_lse,
            self.suffix_output,
            self.suffix_lse,
            self.output_lse,
        )

    def run(self, **kw):
        """merge_attn_states into ``output`` / ``output_lse`` (``kw``: backend=...)."""
        from ..ops import merge_attn_states

        return merge_attn_states(*self.args(), **kw)

    def reference(self, rows: int | None = None):
        """(output [T', N, D], output_lse [N, T']) float32 of the first ``rows`` tokens (all: None)."""
        from ..reference import merge_attn_states_ref

        r = self.shape.T if rows is None else min(rows, self.shape.T)
        return merge_attn_states_ref(
            self.prefix_output[:r], self.prefix_lse[:, :r], self.suffix_output[:r], self.suffix_lse[:, :r]
        )

    def compare(self, output=None, output_lse=None, *, rows=None, ref=None) -> list[Comparison]:
        output = self.output if output is None else output
        output_lse = self.output_lse if output_lse is None else output_lse
        ro, rl = ref if ref is not None else self.reference(rows)
        r = ro.shape[0]
        tol = TOLERANCE[self.dtype]
        res = [compare("output", output[:r], ro, tol["output"])]
        if output_lse is not None:
            res.append(compare("output_lse", output_lse[:, :r], rl, tol["output_lse"]))
        return res


def make_inputs(
    shape: MergeShape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int = 0,
    gen: torch.Generator | None = None,
    with_lse: bool = True,
    lse_scale: float = 3.0,
) -> MergeInputs:
    """Fresh random inputs of ``shape``; ``with_lse=False``: no output_lse (None)."""
    device, g = device_generator(device, seed, gen)
    okw, lkw = LAYOUTS[shape.layout]
    if shape.lse is not None:
        lkw = {"transpose01": True} if shape.lse == "transposed" else {}
    T, N, D = shape.T, shape.N, shape.D

    def side():
        _, x = poisoned((T, N, D), dtype, device, **okw)
        x.copy_(randn((T, N, D), g, device, dtype))
        _, lse = poisoned((N, T), torch.float32, device, **lkw)
        lse.copy_(randn((N, T), g, device, scale=lse_scale))
        return x, lse

    po, pl = side()
    so, sl = side()
    out_base, out = poisoned((T, N, D), dtype, device, **okw)
    ol_base, ol = poisoned((N, T), torch.float32, device, **lkw) if with_lse else (None, None)
    return MergeInputs(shape, dtype, out, po, pl, so, sl, ol, out_base, ol_base)
