"""Helpers shared by the tests: devices, the one comparison (``assert_close``), poisoned strided
buffers, sentinel-guarded buffers and seeded inputs.

The memory-safety contract that each op's ``tests/<op>/test_<op>_memory_safety.py`` checks
(README "Bad input"):

1. No op reads or writes outside the tensors it was given, whatever the values in slot_mapping,
   positions, block_table, seq_lens and cu_seqlens, debug off. Every destination and cache there
   lives inside a larger buffer whose other elements hold a sentinel (``Guarded``): a guard byte
   that changes fails the test, and a stray *read* of a (finite) sentinel shows up as a finite
   result where NaN is required.
2. Debug mode names the argument, the index and the bound.
3. A destination that overlaps an input, a cache it reads or the other destination is a
   ValueError naming both (host pointer arithmetic), except the documented in-place aliases.
4. The reference backend follows the same contract.
5. Zero sizes work with every optional output; scales are validated alike.

Inputs are fresh random values, destinations are poisoned with NaN (every element must be
written) and sizes are odd. CPU: Triton in the interpreter, the reference, and the HIP kernels
compiled for the host (tests/_hip_cpu.py). ``@pytest.mark.gpu`` tests run the real HIP and
Triton kernels; on a GPU run those files under ``compute-sanitizer --tool memcheck``.
"""

from __future__ import annotations

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda") if HAS_GPU else torch.device("cpu")

# bf16 dots and adds are wrong in the Triton CPU interpreter (upstream triton issue 11584):
# bf16 is covered on the GPU only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_GPU else [])

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
F32 = torch.float32
NAN = float("nan")


def assert_close(actual, expected, *, rtol=None, atol=None, equal_nan=False, what="tensor"):
    """The comparison of the op tests: ``|actual - expected| <= atol + rtol * |expected|`` per
    element, shapes, dtypes and devices equal (torch.testing.assert_close's rule and its default
    tolerances when rtol/atol are None).

    NaN placement: with ``equal_nan`` a NaN must stand exactly where ``expected`` has one; without
    it any NaN fails. The failure names ``what``, how many elements are off, where the NaN
    placement first differs, and the worst element: its index, both values and its bound.
    """
    __tracebackhide__ = True
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    nan_a = torch.isnan(actual) if actual.is_floating_point() else torch.zeros(actual.shape, dtype=torch.bool)
    nan_e = torch.isnan(expected) if expected.is_floating_point() else torch.zeros(expected.shape, dtype=torch.bool)
    nan_a, nan_e = nan_a.cpu(), nan_e.cpu()
    bad_nan = (nan_a != nan_e) if equal_nan else (nan_a | nan_e)
    if bad_nan.any():
        i = tuple(int(x) for x in bad_nan.nonzero()[0])
        side = "actual" if nan_a[i] else "expected"
        raise AssertionError(
            f"{what}: NaN placement differs at {int(bad_nan.sum())} of {actual.numel()} elements; first at "
            f"index {i}: actual {actual[i].item()}, expected {expected[i].item()} (NaN in {side}"
            f"{'' if equal_nan else '; equal_nan=False allows none'})"
        )
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan)
    except AssertionError as e:
        if actual.shape != expected.shape or actual.dtype != expected.dtype or actual.device != expected.device:
            raise AssertionError(f"{what}: {e}") from None
        a, x = actual.detach().cpu().double(), expected.detach().cpu().double()
        if rtol is None:
            rtol, atol = _TORCH_DEFAULT_TOL.get(actual.dtype, (0.0, 0.0))
        fin = ~(torch.isnan(a) | torch.isnan(x))
        excess = torch.where(fin, (a - x).abs() - (atol + rtol * x.abs()), torch.zeros_like(a))
        excess = torch.nan_to_num(excess, nan=float("inf"))
        i = tuple(int(v) for v in torch.unravel_index(excess.argmax(), excess.shape)) if a.dim() else ()
        off = int((excess > 0).sum())
        raise AssertionError(
            f"{what}: {off} of {a.numel()} elements outside |a - e| <= {atol} + {rtol} * |e|; worst at index {i}: "
            f"actual {a[i].item()!r}, expected {x[i].item()!r}, |diff| {abs(a[i] - x[i]).item():.3g} "
            f"> bound {atol + rtol * abs(x[i].item()):.3g}"
        ) from None


# torch.testing.assert_close's defaults (rtol, atol), used only to word a failure.
_TORCH_DEFAULT_TOL = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


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


def seeded_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def seeded_randn(shape, dtype=F32, seed=0, scale=1.0):
    """Random values drawn on the CPU from ``seed`` (the same on every device), then moved to DEVICE."""
    return (torch.randn(shape, generator=seeded_generator(seed)) * scale).to(dtype).to(DEVICE)


# Bad sm_scale values with the error each op raises and the words the message holds
# (one rule, Checker.scale, for decode and prefill).
BAD_SCALES = [
    ("x", TypeError, ["a float", "str"]),
    (True, TypeError, ["a float", "bool"]),
    (0.0, ValueError, ["finite number > 0", "0.0"]),
    (-1, ValueError, ["finite number > 0", "-1"]),
    (float("nan"), ValueError, ["finite number > 0", "nan"]),
    (float("inf"), ValueError, ["finite number > 0", "inf"]),
]


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


def assert_no_sync_and_capturable(ops, guarded):
    """Each of ``ops`` (callables that run an op with caller-given destinations, so its overlap
    checks run) runs under torch's sync debug mode (raises on a synchronising call), on a side
    stream and inside a CUDA graph capture that is then replayed; the ``Guarded`` buffers in
    ``guarded`` keep their guards. GPU only."""
    for op in ops:
        op()  # compile / build outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for op in ops:
            op()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for op in ops:
            op()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for op in ops:
            op()
    g.replay()
    torch.cuda.synchronize()
    for x in guarded:
        x.check()


# mla_decode's CPU tile with each form of the page guard: a 16-row, 16-token tile in one stage,
# checking the block-table entries before the loop (CHECK_CFG) or clamping each tile's page into
# the cache in the loop and checking the entries after it (CLAMP_CFG; it acts where a tile lies in
# one page). The default is per arch (AMD clamps; sm90 clamps with fp8 caches at 16 rows).
CLAMP_CFG = {"BLOCK_H": 16, "BLOCK_N": 16, "D_SPLIT": 1, "num_warps": 4, "num_stages": 1, "CLAMP_PAGES": True}
CHECK_CFG = {**CLAMP_CFG, "CLAMP_PAGES": False}
PAGE_GUARD_CFGS = [pytest.param(CHECK_CFG, id="check_first"), pytest.param(CLAMP_CFG, id="clamp")]
