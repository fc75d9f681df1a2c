"""Argument validation shared by every op: one helper, errors that name the argument, what was
expected and what came.

    c = Checker("merge_attn_states")
    c.tensor("output", output, ndim=3, layout="[T, N, D]", dtypes=FLOAT_DTYPES)

Shape/stride problems raise ValueError; wrong types and dtypes raise TypeError.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import NoReturn

import torch

from .. import env
from .._platform import device_arch
from ..configs import platform_fp8_dtype
from ..mla_dims import FP8_DTYPES, FP8_KV_CACHE_DTYPES
from ..reference.indexer import INDEX_ROW_BYTES, SHUFFLE_TILE, vllm_rocm_shuffled

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def debug_enabled(debug: bool | None) -> bool:
    """An op's ``debug=`` argument, or when None ``ROCM_MLA_DEBUG=1`` in the environment: check index
    values on the host (a sync, not capturable) and name the bad one."""
    return debug if debug is not None else env.flag("ROCM_MLA_DEBUG")


def plan_device(device: torch.device | str) -> torch.device:
    """A plan's device with its index: a "cuda" plan serves the current device's tensors, whose
    ``.device`` names the index (``cuda:0``), so plans compare devices in that form."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


class Checker:
    """Validation for one op call; every message starts with the op's name."""

    def __init__(self, op: str):
        self.op = op

    def fail(self, name: str, expected: str, got: object, exc: type[Exception] = ValueError):
        """Raise ``exc`` naming the argument, what was expected and what came."""
        raise exc(f"{self.op}: {name}: expected {expected}, got {got}")

    def count(self, name: str, v: object, low: int = 0, *, optional: bool = False) -> None:
        """A size or count argument: an int >= ``low`` (``optional``: or None)."""
        if optional and v is None:
            return
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            self.fail(name, f"{'None or ' if optional else ''}an int >= {low}", repr(v))

    def workspace(self, workspace: torch.Tensor, numel: int, holds: str) -> None:
        """A caller's ``workspace=``: a contiguous float32 tensor of at least ``numel`` elements
        (``holds``: what they hold, for the message)."""
        self.tensor("workspace", workspace, layout="(float32, contiguous)", dtypes=(torch.float32,))
        if not workspace.is_contiguous():
            self.fail("workspace", "a contiguous tensor", f"strides {tuple(workspace.stride())}")
        if workspace.numel() < numel:
            self.fail("workspace", f"a contiguous float32 tensor of >= {numel} elements ({holds})",
                      f"{workspace.numel()} elements")  # fmt: skip

    def fp8_scale(self, name: str, k_scale) -> None:
        """An fp8 cache's scale: a 1-element float32 tensor (its device is checked with the rest)."""
        if k_scale is None:
            self.fail(name, "a 1-element float32 tensor (an fp8 cache needs its scale)", "None", TypeError)
        self.tensor(name, k_scale, layout="(1 element)", dtypes=(torch.float32,))
        if k_scale.numel() != 1:
            self.fail(name, "a 1-element float32 tensor", f"shape {tuple(k_scale.shape)}")

    def fp8_cache_kind(self, kv_cache: torch.Tensor, kv_cache_dtype: str, *, name: str = "kv_cache") -> torch.dtype:
        """The FP8 E4M3 kind an fp8 cache holds, for a ``kv_cache_dtype`` of
        ``rocm_mla.mla_dims.FP8_KV_CACHE_DTYPES``: a float8 cache's own dtype (it must be the kind
        the name fixes, if any); for uint8 storage the named kind, else the platform's
        (configs/platform.json for the cache's device). ``name``: the cache argument's name."""
        return self.fp8_kind_of(kv_cache.dtype, device_arch(kv_cache.device), kv_cache_dtype, name=name)

    def fp8_kind_of(self, dt: torch.dtype, arch: str, kv_cache_dtype: str, *, name: str = "kv_cache") -> torch.dtype:
        """:meth:`fp8_cache_kind` from the cache's dtype ``dt`` and its device's ``arch`` (a plan
        made before the tensor exists)."""
        named = FP8_KV_CACHE_DTYPES[kv_cache_dtype]  # None: the platform's kind
        got = str(dt).replace("torch.", "")
        if dt in FP8_DTYPES:
            if named is not None and named != dt:
                want = str(named).replace("torch.", "")
                self.fail(name, f"dtype {want} (kv_cache_dtype={kv_cache_dtype!r})", got, TypeError)
            return dt
        if dt == torch.uint8:
            return named if named is not None else platform_fp8_dtype(arch)
        self.fail(
            name,
            f"dtype float8_e4m3fn, float8_e4m3fnuz or uint8 (kv_cache_dtype={kv_cache_dtype!r})",
            got,
            TypeError,
        )

    def tensor(
        self,
        name: str,
        x: object,
        *,
        ndim: int | None = None,
        layout: str = "",
        shape: Sequence[int | None] | None = None,
        dtypes: Sequence[torch.dtype] | None = None,
        like: str = "",
    ) -> torch.Tensor:
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
                self.fail(
                    name,
                    f"dtype {_dtype_names([ref.dtype])} (like {ref_name})",
                    str(x.dtype).replace("torch.", ""),
                    TypeError,
                )

    def same_device(self, **tensors: torch.Tensor | None):
        items = [(n, t) for n, t in tensors.items() if t is not None]
        ref_name, ref = items[0]
        for name, x in items[1:]:
            if x.device != ref.device:
                self.fail(name, f"device {ref.device} (like {ref_name})", str(x.device))

    def plan_for(self, plan: object, kind: type, maker: str, want: dict) -> NoReturn:
        """Raise for a caller's ``plan=`` that its ``matches`` refused: not a ``kind`` (made by
        ``maker``), or the first field that differs from ``want`` (this call's sizes, dtypes,
        arch, ...)."""
        if not isinstance(plan, kind):
            self.fail("plan", f"a plan from {maker} ({kind.__name__})", type(plan).__name__, TypeError)
        name = plan_mismatch(plan, want)
        if name:
            self.fail("plan", f"a plan made for this call ({name}={want[name]})", f"{name}={getattr(plan, name)}")
        self.fail("plan", "tensors matching the plan", "a mismatch the checks did not name")

    def index_cache(self, index_cache, shuffled) -> bool:
        """Validate an indexer cache's shape ``[num_blocks, block_size, 132]``, its strides (each block's
        bytes contiguous, the block stride a multiple of 4 past them, a 4-byte aligned start) and its
        value layout ``shuffled`` (None: vLLM's ROCm rule; shuffled needs block_size % 16 == 0), and
        that it is uint8 or float8 (which fp8 kind: ``Checker.fp8_cache_kind``). Returns whether the
        values are shuffled. Every op that reads or writes the cache validates it here."""
        self.tensor("index_cache", index_cache, ndim=3, layout="[num_blocks, block_size, 132]")
        if index_cache.dtype not in (torch.uint8, *FP8_DTYPES):
            got = str(index_cache.dtype).replace("torch.", "")
            self.fail("index_cache", "dtype uint8 (or a float8 view of it)", got, TypeError)
        nb, bs, row = index_cache.shape
        if row != INDEX_ROW_BYTES:
            self.fail(
                "index_cache",
                f"shape [num_blocks, block_size, 132] = (*, *, {INDEX_ROW_BYTES})",
                tuple(index_cache.shape),
            )
        if bs < 1:
            self.fail("index_cache", "block_size >= 1", tuple(index_cache.shape))
        st = index_cache.stride()
        if st[2] != 1 or (bs > 1 and st[1] != INDEX_ROW_BYTES) or (nb > 1 and st[0] < bs * INDEX_ROW_BYTES):
            self.fail(
                "index_cache",
                f"each block's {bs} x 132 bytes contiguous (strides (>= {bs * INDEX_ROW_BYTES}, 132, 1))",
                f"strides {st}",
            )
        if (nb > 1 and st[0] % 4) or index_cache.data_ptr() % 4:
            self.fail(
                "index_cache",
                "a 4-byte aligned start and a block stride that is a multiple of 4 bytes (float32 scales)",
                f"strides {st}, start at byte {index_cache.data_ptr() % 4} mod 4",
            )
        if shuffled is None:
            shuffle = vllm_rocm_shuffled(bs)
        elif isinstance(shuffled, bool):
            shuffle = shuffled
        else:
            self.fail("shuffled", "True, False or None (vLLM's ROCm rule)", repr(shuffled), TypeError)
        if shuffle and bs % SHUFFLE_TILE:
            why = "vLLM's ROCm rule shuffles every block_size > 1" if shuffled is None else "shuffled=True"
            self.fail(
                "index_cache", f"block_size 1 or a multiple of 16 ({why}; 16 x 16 tiles)", tuple(index_cache.shape)
            )
        return shuffle

    def scale(self, name: str, x: object) -> float:
        """A softmax / quantisation scale given as a number: a real, finite and > 0 (every op
        validates its scale arguments through here, so they fail alike). Returns it as a float."""
        if type(x) is float:  # the common case, without the numbers.Real ABC check
            if not (math.isfinite(x) and x > 0):
                self.fail(name, "a finite number > 0", repr(x))
            return x
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            self.fail(name, "a float", type(x).__name__, TypeError)
        v = float(x)  # type: ignore[arg-type]
        if not (math.isfinite(v) and v > 0):
            self.fail(name, "a finite number > 0", repr(x))
        return v

    def writable(self, name: str, x: torch.Tensor):
        """A destination must not have two indices on one element (a kernel would race on it)."""
        if x.is_contiguous():  # contiguous strides never alias
            return
        overlap = any(s == 0 and n > 1 for s, n in zip(x.stride(), x.shape))
        if not overlap and x.numel() > 1:
            overlap = torch._debug_has_internal_overlap(x) == 1
        if overlap:
            self.fail(
                name,
                "a destination whose elements do not overlap (no stride 0 in a dimension of size > 1)",
                f"shape {tuple(x.shape)} strides {x.stride()}",
            )

    def no_overlap(
        self,
        dests: dict[str, torch.Tensor | None],
        srcs: dict[str, torch.Tensor | None],
        *,
        identical_ok: Sequence[tuple[str, str]] = (),
    ):
        """Every destination shares no memory with any other destination nor with any source.

        Host-side pointer arithmetic only (no device access: no sync, capturable in a CUDA graph):
        the byte ranges ``[data_ptr, data_ptr + extent)`` of two views are compared, and when they
        intersect, the views are still accepted if a common period (a stride of both, every larger
        stride a multiple of it) puts them in disjoint residue windows -- e.g. ``kv_a[:, :512]``
        and ``kv_a[:, 512:]``, or ``q[..., :128]`` and ``q[..., 128:]``. Other interleavings whose
        extents intersect are reported as overlapping (conservative). ``identical_ok`` lists
        (destination, source) pairs allowed to be the very same view (same pointer, shape,
        strides and dtype): the op's documented in-place aliases. None and empty tensors are
        skipped. Raises ValueError naming both arguments.
        """
        # First the storages' byte ranges (cheap; distinct allocations never intersect), then,
        # only for views of one allocation, the views' own extents and the period test.
        d_items = [(n, t, _storage_range(t)) for n, t in dests.items() if t is not None and t.numel()]
        if not d_items:
            return
        s_items = [(n, t, _storage_range(t)) for n, t in srcs.items() if t is not None and t.numel()]
        for i, (dn, d, (da0, da1)) in enumerate(d_items):
            for sn, s, (sb0, sb1) in d_items[i + 1 :] + s_items:
                if da1 <= sb0 or sb1 <= da0 or s.device != d.device:
                    continue
                a0, b0 = d.data_ptr(), s.data_ptr()
                a1 = a0 + _extent(d.shape, d.stride(), d.element_size())
                b1 = b0 + _extent(s.shape, s.stride(), s.element_size())
                if a1 <= b0 or b1 <= a0:
                    continue
                allowed = (dn, sn) in identical_ok
                if allowed and _identical(d, s):
                    continue
                if _disjoint_by_period(
                    d.shape, d.stride(), d.element_size(), s.shape, s.stride(), s.element_size(), b0 - a0
                ):
                    continue
                what = "no memory in common (or the very same view)" if allowed else "no memory in common"
                self.fail(
                    dn,
                    f"{what} with {sn}",
                    f"overlapping views of one buffer ({dn}: bytes [{a0:#x}, {a1:#x}), {sn}: bytes [{b0:#x}, {b1:#x}))",
                )

    def arguments(
        self,
        dests: dict[str, torch.Tensor | None],
        srcs: dict[str, torch.Tensor | None],
        *,
        identical_ok: Sequence[tuple[str, str]] = (),
        like: str = "",
    ) -> None:
        """The checks of an op's shaped tensors taken together: all on one device (a device error
        names ``like``, by default the first destination, as the one the others must match), each
        destination :meth:`writable`, and :meth:`no_overlap` (``identical_ok`` as there). None
        entries (optional tensors, a k_scale that is not read) are skipped."""
        tensors = {**dests, **srcs}
        if like:
            tensors = {like: tensors.pop(like), **tensors}
        self.same_device(**tensors)
        for name, x in dests.items():
            if x is not None:
                self.writable(name, x)
        self.no_overlap(dests, srcs, identical_ok=identical_ok)


def plan_mismatch(plan: object, want: dict) -> str:
    """The first field of ``want`` that ``plan`` holds another value of ('' when none, and the
    field's name when plan lacks it): how an op checks a caller's plan (``Checker.plan_for``) and
    how a caller asks whether a kept plan fits a call, without raising."""
    for name, v in want.items():
        if getattr(plan, name, _MISSING) != v:
            return name
    return ""


_MISSING = object()


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    """Byte range of the allocation under a view: a superset of the view's bytes."""
    st = t.untyped_storage()
    lo = st.data_ptr()
    return lo, lo + st.nbytes()


@functools.lru_cache(maxsize=4096)
def _extent(shape: tuple[int, ...], stride: tuple[int, ...], es: int) -> int:
    """Bytes from a view's first element to the end of its last (0 when empty); torch strides
    are never negative. Cached: a layer calls an op with the same layouts again and again."""
    ext = 1
    for n, st in zip(shape, stride):
        if n == 0:
            return 0
        if n > 1:
            ext += (n - 1) * st
    return ext * es


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()


@functools.lru_cache(maxsize=4096)
def _disjoint_by_period(
    shape_a: tuple[int, ...],
    stride_a: tuple[int, ...],
    es_a: int,
    shape_b: tuple[int, ...],
    stride_b: tuple[int, ...],
    es_b: int,
    offset: int,
) -> bool:
    """True when some byte period P proves that views a and b (b starting ``offset`` bytes after
    a) share no byte.

    P must be a byte stride of a or b such that, for both views, every dim of stride >= P has a
    stride that is a multiple of P and the dims of stride < P span a window ``w <= P`` bytes: each
    view's bytes then lie, modulo P, in the circular window ``[start mod P, + w)``; disjoint
    windows mean disjoint views. Depends on the layouts and the offset only (cached).
    """
    dims = [
        [(n, st * es) for n, st in zip(shape, stride) if n > 1]
        for shape, stride, es in ((shape_a, stride_a, es_a), (shape_b, stride_b, es_b))
    ]
    for period in sorted({st for d in dims for _, st in d}):
        if period <= 0:
            continue
        widths = []
        for es, d in zip((es_a, es_b), dims):
            w = es
            for n, st in d:
                if st < period:
                    w += (n - 1) * st
                elif st % period:
                    w = period + 1  # not a lattice of this period
                    break
            widths.append(w)
        if widths[0] > period or widths[1] > period:
            continue
        rb = offset % period  # b's window start, relative to a's
        if rb >= widths[0] and (period - rb) % period >= widths[1]:
            return True
    return False
