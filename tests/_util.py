"""Helpers shared by the tests: devices, tolerances, poisoned strided buffers."""

from __future__ import annotations

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda") if HAS_GPU else torch.device("cpu")

# bf16 dots and adds are wrong in the Triton CPU interpreter (upstream triton issue 11584):
# bf16 is covered on the GPU only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_GPU else [])

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def backends() -> list[str]:
    """Implementations that can run here: reference always, Triton (GPU or interpreter), HIP on GPU."""
    from rocm_mla.ops._dispatch import unavailable

    return [b for b in ("hip", "triton", "reference") if unavailable(b, DEVICE) is None]


def poisoned_view(
    shape, dtype, *, pad_last: int = 0, token_pad: int = 0, transpose01: bool = False, inner_stride: int = 1
):
    """A NaN-filled buffer and a strided view of ``shape`` inside it.

    pad_last: extra elements after each row's last dim (the pad_v layout: [.., 192][..., :128]).
    token_pad: extra elements between tokens (a head slice of a wider buffer).
    transpose01: allocate as [dim1, dim0, ...] and transpose (e.g. lse [N, T] as a [T, N] buffer).
    inner_stride: step between consecutive elements of the last dim.
    Returns (base, view): check the view's every element and that base outside it stayed NaN.
    """
    shape = list(shape)
    if transpose01:
        shape[0], shape[1] = shape[1], shape[0]
    last = shape[-1] * inner_stride + pad_last
    alloc = shape[:-1] + [last]
    if len(alloc) >= 2 and token_pad:
        alloc[-2] += token_pad
    base = torch.full(alloc, float("nan"), dtype=dtype, device=DEVICE)
    view = base[..., : shape[-1] * inner_stride : inner_stride]
    if len(alloc) >= 2 and token_pad:
        view = view[..., : shape[-2], :]
    if transpose01:
        view = view.transpose(0, 1)
    return base, view


def raises_naming(exc, fn, *words) -> str:
    """``fn()`` raises ``exc`` whose message holds every one of ``words``; returns the message."""
    import pytest

    with pytest.raises(exc) as err:
        fn()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    return str(err.value)


def outside_untouched(base: torch.Tensor, view: torch.Tensor) -> bool:
    """True when every element of ``base`` not covered by ``view`` is still NaN."""
    mask = torch.ones(base.shape, dtype=torch.bool, device=base.device)
    marker = torch.zeros_like(mask)
    # Map the view's elements back onto base by writing through a same-strided view of the mask.
    mview = marker.as_strided(view.shape, view.stride(), view.storage_offset() - base.storage_offset())
    mview.fill_(True)
    outside = mask & ~marker
    return bool(torch.isnan(base[outside].float()).all())


def rand(shape, dtype, scale=1.0):
    return (torch.randn(shape, device=DEVICE) * scale).to(dtype)


# ---------------------------------------------------------------- sentinel guard regions
SENTINEL = 77.0  # finite in every float dtype (fp8 saturates it): a stray read shows as a wrong number


class Guarded:
    """A tensor view of ``shape`` inside a larger flat buffer whose other elements (``guard``
    elements before and after, plus ``pad_last`` elements after each row) hold a sentinel.

    ``fill``: "randn" (fresh random values), "nan" (poison: every element must be written), or a
    tensor to copy in. ``check()`` asserts that no byte outside the view changed (compared
    bitwise, so a NaN written into the guard is caught too).
    """

    def __init__(
        self,
        shape,
        dtype,
        *,
        fill="randn",
        guard: int = 1200,
        pad_last: int = 0,
        sentinel: float = SENTINEL,
        device=None,
        generator=None,
    ):
        device = DEVICE if device is None else device
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
            g = generator
            vals = (
                torch.randn(shape, generator=g)
                if dtype.is_floating_point
                else torch.randint(0, 1 << 20, shape, generator=g)
            )
            self.view.copy_(vals.to(dtype))
        elif fill == "nan":
            self.view.copy_(torch.full(shape, float("nan")).to(dtype))
        else:
            raise ValueError(fill)
        self._snap = self.base.clone()

    def outside_mask(self) -> torch.Tensor:
        marker = torch.zeros(self.base.shape, dtype=torch.bool, device=self.base.device)
        marker.as_strided(
            self.view.shape, self.view.stride(), self.view.storage_offset() - self.base.storage_offset()
        ).fill_(True)
        return ~marker

    def check(self, what: str = "buffer"):
        out = self.outside_mask()
        a = self._snap.view(torch.uint8).view(self.base.numel(), -1)[out]
        b = self.base.view(torch.uint8).view(self.base.numel(), -1)[out]
        changed = (a != b).any(-1).nonzero().flatten()
        assert changed.numel() == 0, (
            f"{what}: {changed.numel()} guard elements changed (first at flat index {int(changed[0])})"
        )


# mla_decode's CPU tile with each form of the page guard: a 16-row, 16-token tile in one stage,
# checking the block-table entries before the loop (CHECK_CFG) or clamping each tile's page into
# the cache in the loop and checking the entries after it (CLAMP_CFG; it acts where a tile lies in
# one page). The default is per arch (AMD clamps; sm90 clamps with fp8 caches at 16 rows).
CLAMP_CFG = {"BLOCK_H": 16, "BLOCK_N": 16, "D_SPLIT": 1, "num_warps": 4, "num_stages": 1, "CLAMP_PAGES": True}
CHECK_CFG = {**CLAMP_CFG, "CLAMP_PAGES": False}
PAGE_GUARD_CFGS = [pytest.param(CHECK_CFG, id="check_first"), pytest.param(CLAMP_CFG, id="clamp")]
