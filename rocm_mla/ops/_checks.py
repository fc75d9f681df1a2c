"""Argument validation shared by every op: one helper, errors that name the argument, what was
expected and what came.

    c = Checker("merge_attn_states")
    c.tensor("output", output, ndim=3, layout="[T, N, D]", dtypes=FLOAT_DTYPES)

Shape/stride problems raise ValueError; wrong types and dtypes raise TypeError.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


class Checker:
    """Validation for one op call; every message starts with the op's name."""

    def __init__(self, op: str):
        self.op = op

    def fail(self, name: str, expected: str, got: object, exc: type[Exception] = ValueError):
        raise exc(f"{self.op}: {name}: expected {expected}, got {got}")

    def tensor(self, name: str, x: object, *, ndim: int | None = None, layout: str = "",
               shape: Sequence[int | None] | None = None, dtypes: Sequence[torch.dtype] | None = None,
               like: str = "") -> torch.Tensor:
        """Check that ``x`` is a tensor of the given rank, shape (None = any) and dtype."""
        if not isinstance(x, torch.Tensor):
            self.fail(name, f"a torch.Tensor {layout}".rstrip(), type(x).__name__, TypeError)
        assert isinstance(x, torch.Tensor)
        want_ndim = len(shape) if shape is not None else ndim
        if want_ndim is not None and x.dim() != want_ndim:
            self.fail(name, f"a {want_ndim}-D tensor {layout}".rstrip(), f"shape {tuple(x.shape)}")
        if shape is not None and any(w is not None and w != g for w, g in zip(shape, x.shape)):
            want = tuple("*" if w is None else w for w in shape)
            src = f" ({like})" if like else ""
            self.fail(name, f"shape {layout} = {want}{src}".replace("  ", " "), tuple(x.shape))
        if dtypes is not None and x.dtype not in dtypes:
            self.fail(name, f"dtype {_dtype_names(dtypes)}", str(x.dtype).replace("torch.", ""), TypeError)
        return x

    def same_dtype(self, ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None):
        for name, x in others.items():
            if x is not None and x.dtype != ref.dtype:
                self.fail(name, f"dtype {_dtype_names([ref.dtype])} (like {ref_name})",
                          str(x.dtype).replace("torch.", ""), TypeError)

    def same_device(self, **tensors: torch.Tensor | None):
        items = [(n, t) for n, t in tensors.items() if t is not None]
        ref_name, ref = items[0]
        for name, x in items[1:]:
            if x.device != ref.device:
                self.fail(name, f"device {ref.device} (like {ref_name})", str(x.device))

    def writable(self, name: str, x: torch.Tensor):
        """A destination must not have two indices on one element (a kernel would race on it)."""
        overlap = any(s == 0 and n > 1 for s, n in zip(x.stride(), x.shape))
        if not overlap and x.numel() > 1:
            overlap = torch._debug_has_internal_overlap(x) == 1
        if overlap:
            self.fail(name, "a destination whose elements do not overlap (no stride 0 in a "
                      "dimension of size > 1)", f"shape {tuple(x.shape)} strides {x.stride()}")

    def disjoint(self, name: str, x: torch.Tensor, other_name: str, other: torch.Tensor | None, *,
                 allow_identical: bool = False):
        """A destination may not share memory with an input that other threads still read:
        either no byte in common or, when ``allow_identical``, exactly the same view (each element
        is then read and written by the same thread)."""
        if other is None or x.numel() == 0 or other.numel() == 0:
            return
        if x.untyped_storage().data_ptr() != other.untyped_storage().data_ptr():
            return
        if (allow_identical and x.data_ptr() == other.data_ptr() and x.stride() == other.stride()
                and x.shape == other.shape):
            return

        def span(t: torch.Tensor) -> tuple[int, int]:
            lo = t.data_ptr()
            hi = lo + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0) * t.element_size()
            return lo, hi + t.element_size()

        (a0, a1), (b0, b1) = span(x), span(other)
        if a0 < b1 and b0 < a1:
            what = "no memory in common (or the very same view)" if allow_identical else "no memory in common"
            self.fail(name, f"{what} with {other_name}", "overlapping views of one buffer")
