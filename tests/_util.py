"""Helpers shared by the tests: devices, tolerances, poisoned strided buffers."""

from __future__ import annotations

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


def poisoned_view(shape, dtype, *, pad_last: int = 0, token_pad: int = 0, transpose01: bool = False,
                  inner_stride: int = 1):
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
