"""Destination and input buffers of any strides, inside larger poisoned allocations.

:func:`poisoned` gives a NaN-filled allocation and a strided view of the wanted shape in it (the
layouts vLLM hands over: a pad_v row ``[.., 192][..., :128]``, a head slice with a token stride
wider than ``N * D``, an lse ``[N, T]`` seen through a ``[T, N]`` buffer's transpose, an inner
stride). A kernel must write every element of the view (NaN left = not written) and nothing
outside it (:func:`outside_untouched`). :class:`Guarded` puts a finite sentinel around a view
and checks, bitwise, that no byte outside it changed.
"""

from __future__ import annotations

import torch

# Finite in every float dtype (fp8 saturates it): a stray read shows as a wrong number.
SENTINEL = 77.0


def poisoned(
    shape,
    dtype: torch.dtype,
    device=None,
    *,
    pad_last: int = 0,
    token_pad: int = 0,
    transpose01: bool = False,
    inner_stride: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN-filled buffer and a strided view of ``shape`` inside it: ``(base, view)``.

    pad_last: extra elements after each row's last dim (the pad_v layout: ``[.., 192][..., :128]``).
    token_pad: extra rows in the second-to-last dim (a head slice of a wider buffer).
    transpose01: allocate as ``[dim1, dim0, ...]`` and transpose (lse ``[N, T]`` as a ``[T, N]`` buffer).
    inner_stride: step between consecutive elements of the last dim.
    """
    shape = list(shape)
    if transpose01:
        shape[0], shape[1] = shape[1], shape[0]
    alloc = shape[:-1] + [shape[-1] * inner_stride + pad_last]
    if len(alloc) >= 2 and token_pad:
        alloc[-2] += token_pad
    base = torch.full(alloc, float("nan"), dtype=dtype, device=device)
    view = base[..., : shape[-1] * inner_stride : inner_stride]
    if len(alloc) >= 2 and token_pad:
        view = view[..., : shape[-2], :]
    if transpose01:
        view = view.transpose(0, 1)
    return base, view


def _outside(base: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """A bool mask of ``base``'s shape: True on every element ``view`` (a view of base) does not cover."""
    marker = torch.zeros(base.shape, dtype=torch.bool, device=base.device)
    marker.as_strided(view.shape, view.stride(), view.storage_offset() - base.storage_offset()).fill_(True)
    return ~marker


def outside_untouched(base: torch.Tensor, view: torch.Tensor) -> bool:
    """True when every element of ``base`` not covered by ``view`` is still NaN."""
    return bool(torch.isnan(base[_outside(base, view)].float()).all())


class Guarded:
    """A view of ``shape`` inside a flat buffer whose other elements (``guard`` elements before and
    after, ``pad_last`` after each row) hold ``sentinel``.

    ``fill``: "randn" (fresh random values from ``generator``), "nan" (every element must be
    written), or a tensor to copy in. :meth:`check` raises AssertionError when a byte outside the
    view changed (compared bitwise: a NaN written into the guard is caught too).
    """

    def __init__(
        self,
        shape,
        dtype: torch.dtype,
        *,
        device=None,
        fill="randn",
        guard: int = 1200,
        pad_last: int = 0,
        sentinel: float = SENTINEL,
        generator: torch.Generator | None = None,
    ):
        shape = tuple(shape)
        rows = 1
        for n in shape[:-1]:
            rows *= n
        last = shape[-1] if shape else 1
        row_w = last + pad_last
        n_alloc = rows * row_w
        self.guard = guard
        if dtype.is_floating_point:
            base = torch.full((2 * guard + n_alloc,), sentinel, dtype=torch.float32).to(dtype)
        else:
            base = torch.full((2 * guard + n_alloc,), int(sentinel), dtype=dtype)
        self.base = base.to(device)
        inner = self.base[guard : guard + n_alloc]
        if shape:
            self.view = inner.view(*shape[:-1], row_w)[..., :last] if pad_last else inner.view(shape)
        else:
            self.view = inner[:1].view(())
        if isinstance(fill, torch.Tensor):
            self.view.copy_(fill)
        elif fill == "randn":
            vals = (
                torch.randn(shape, generator=generator)
                if dtype.is_floating_point
                else torch.randint(0, 1 << 20, shape, generator=generator)
            )
            self.view.copy_(vals.to(dtype))
        elif fill == "nan":
            self.view.copy_(torch.full(shape, float("nan")).to(dtype))
        else:
            raise ValueError(f"Guarded: fill: expected 'randn', 'nan' or a tensor, got {fill!r}")
        self._snap = self.base.clone()

    def check(self, what: str = "buffer") -> None:
        out = _outside(self.base, self.view)
        a = self._snap.view(torch.uint8).view(self.base.numel(), -1)[out]
        b = self.base.view(torch.uint8).view(self.base.numel(), -1)[out]
        changed = (a != b).any(-1).nonzero().flatten()
        if changed.numel():
            raise AssertionError(
                f"{what}: {changed.numel()} guard elements changed (first at flat index {int(changed[0])})"
            )
