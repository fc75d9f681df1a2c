"""indexer_k_cache_write's cases: the lightning indexer's key-cache write, the tolerance (exact), the check.

Inputs (:func:`make_inputs`): ``k [T, 128]`` a column slice of a wider ``[T, 128 + k_pad]`` buffer
(as vLLM slices it out of the ``wk_weights_proj`` output) holding fresh normal values, with a row of
zeros (amax 0), a row of tiny values (amax below the 1e-4 floor) and a row of large ones where T
allows; slots drawn without repeats from a cache of ``num_blocks x block`` slots, ``skip`` of them
-1 and ``outside`` of them past the cache; the cache uint8 ``[num_blocks, block, 132]``, every
byte 0xFF (a NaN code in e4m3fn; a byte no write leaves behind in a scale), optionally every
other block of a larger buffer (``block_pad``: a block stride past the block). The op must write
exactly the reference's bytes at the good slots and leave every other byte as it was
(:meth:`IndexerCacheInputs.compare`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..reference.indexer import (
    INDEX_HEAD_DIM,
    INDEX_ROW_BYTES,
    index_cache_keys,
    indexer_k_cache_write_ref,
)
from ._compare import Bound, Checked, Comparison, compare
from ._paged import SlotWrite, device_generator, platform_fp8, randn

POISON = 0xFF  # the untouched cache bytes
_KINDS = {"fp8": None, "fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e4m3fnuz": torch.float8_e4m3fnuz}

# The write is exact on every backend: the same codes and scales as the reference, bit for bit.
TOLERANCE: dict[torch.dtype, dict[str, Bound]] = {
    dt: {"values": Bound(0.0, 0.0), "scales": Bound(0.0, 0.0)} for dt in (torch.float32, torch.float16, torch.bfloat16)
}


@dataclass(frozen=True)
class IndexerCacheShape(SlotWrite):
    """T keys into a cache of ``block``-token blocks; ``kind`` the cache's fp8 name (``"fp8"`` = the
    platform's, ``"fp8_e4m3fn"``, ``"fp8_e4m3fnuz"``), ``scale_fmt`` "ue8m0" or None, ``shuffled``
    the value layout (None: vLLM's ROCm rule, block > 1)."""

    T: int
    block: int = 64
    kind: str = "fp8"
    scale_fmt: str | None = "ue8m0"
    shuffled: bool | None = None
    name: str = ""

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"IndexerCacheShape: kind: expected one of {', '.join(_KINDS)}, got {self.kind!r}")
        if self.scale_fmt not in ("ue8m0", None):
            raise ValueError(f"IndexerCacheShape: scale_fmt: expected 'ue8m0' or None, got {self.scale_fmt!r}")

    @property
    def label(self) -> str:
        fmt = self.scale_fmt or "plain"
        lay = {None: "", True: " shuffled", False: " flat"}[self.shuffled]
        return self.name or f"T={self.T} block={self.block} {self.kind} {fmt}{lay}"

    def nbytes(self, dtype: torch.dtype) -> int:
        """The op's traffic: keys read, 132 bytes and a slot per token."""
        return self.T * (INDEX_HEAD_DIM * dtype.itemsize + INDEX_ROW_BYTES + 8)


SHAPES: dict[str, list[IndexerCacheShape]] = {
    "selfcheck": [IndexerCacheShape(37, 16), IndexerCacheShape(37, 1), IndexerCacheShape(37, 64, scale_fmt=None)],
    # Odd sizes: no keys, one, fewer than a tile, more than two blocks of 64; blocks 1, 16, 64.
    "odd": [IndexerCacheShape(T, b) for T in (0, 1, 7, 130) for b in (1, 16, 64)],
    "bench": [IndexerCacheShape(T, 64) for T in (1, 64, 4096, 32768)],
}


@dataclass
class IndexerCacheInputs(Checked):
    """One indexer_k_cache_write call's tensors: ``kwargs()`` its arguments by name."""

    shape: IndexerCacheShape
    dtype: torch.dtype
    k: torch.Tensor
    index_cache: torch.Tensor
    slot_mapping: torch.Tensor
    fp8: torch.dtype
    cache_base: torch.Tensor = field(repr=False)
    cache0: torch.Tensor = field(repr=False)

    @property
    def shuffled(self) -> bool:
        s = self.shape
        return s.block > 1 if s.shuffled is None else s.shuffled

    def kwargs(self, **overrides) -> dict:
        kw = dict(
            k=self.k,
            index_cache=self.index_cache,
            slot_mapping=self.slot_mapping,
            scale_fmt=self.shape.scale_fmt,
            shuffled=self.shape.shuffled,
            kv_cache_dtype=self.shape.kind,
        )
        kw.update(overrides)
        return kw

    def run(self, **overrides):
        from ..ops import indexer_k_cache_write

        return indexer_k_cache_write(**self.kwargs(**overrides))

    def restore(self) -> None:
        """Put the poisoned cache back (for another checked call)."""
        self.cache_base.copy_(self.cache0)

    def written(self) -> torch.Tensor:
        """``[n]`` the slots the op writes (``0 <= slot < num_blocks x block``), in token order."""
        s = self.slot_mapping
        return s[(s >= 0) & (s < self.index_cache.shape[0] * self.index_cache.shape[1])]

    def reference(self) -> torch.Tensor:
        """The whole cache buffer (``cache_base``'s shape, uint8) as the reference leaves it."""
        want = self.cache0.clone()
        off = self.index_cache.storage_offset() - self.cache_base.storage_offset()
        view = want.as_strided(self.index_cache.shape, self.index_cache.stride(), off)
        indexer_k_cache_write_ref(
            self.k, view, self.slot_mapping, fp8_dtype=self.fp8, scale_fmt=self.shape.scale_fmt, shuffled=self.shuffled
        )
        return want

    def compare(self, *, ref: torch.Tensor | None = None) -> list[Comparison]:
        """The written slots' values (codes) and scales against the reference's, exactly, then every
        byte of the buffer (``untouched``: bytes no slot owns are still 0xFF)."""
        want = self.reference() if ref is None else ref
        off = self.index_cache.storage_offset() - self.cache_base.storage_offset()
        want_view = want.as_strided(self.index_cache.shape, self.index_cache.stride(), off)
        slots = self.written()
        _, gv, gs = index_cache_keys(self.index_cache, slots, fp8_dtype=self.fp8, shuffled=self.shuffled)
        _, wv, ws = index_cache_keys(want_view, slots, fp8_dtype=self.fp8, shuffled=self.shuffled)
        tol = TOLERANCE[self.dtype]
        same = torch.equal(self.cache_base, want)
        changed = int((self.cache_base != want).sum())
        return [
            compare("values", gv.view(torch.uint8).float(), wv.view(torch.uint8).float(), tol["values"]),
            compare("scales", gs, ws, tol["scales"]),
            Comparison("bytes", 0.0 if same else float("nan"), 0.0, "" if same else f"bytes: {changed} differ"),
        ]


def make_inputs(
    shape: IndexerCacheShape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int = 0,
    gen: torch.Generator | None = None,
    skip=(2,),
    outside=(5, 6),
    special_rows: bool = True,
    k_pad: int = 64,
    block_pad: int = 0,
    scale: float = 3.0,
) -> IndexerCacheInputs:
    """Fresh random inputs of ``shape`` (see the module docstring). skip / outside: token indices
    whose slot is -1 / past the cache (num_slots + i, and 2^40 for the second). special_rows:
    rows 1, 3 and 4 (where T has them) zeros, tiny (x 1e-7) and large (x 1e3: finite in
    float16). k_pad: extra columns of k's buffer (k's row stride is 128 + k_pad). block_pad: extra
    blocks between the ones the cache view shows. scale: the keys' standard deviation."""
    device, g = device_generator(device, seed, gen)
    T, bs = shape.T, shape.block
    buf = randn((T, INDEX_HEAD_DIM + k_pad), g, device, torch.float32, scale)
    if special_rows:
        for i, f in ((1, 0.0), (3, 1e-7), (4, 1e3)):
            if i < T:
                buf[i] *= f
    k = buf.to(dtype)[:, :INDEX_HEAD_DIM]
    slots = shape.draw_slots(g, device, skip)
    nb = shape.num_blocks()
    n = nb * bs
    for j, i in enumerate(outside):
        if i < T:
            slots[i] = n + i if j == 0 else 1 << 40
    kind = _KINDS[shape.kind] or platform_fp8(device)
    base = torch.full((nb * (1 + block_pad), bs, INDEX_ROW_BYTES), POISON, dtype=torch.uint8, device=device)
    cache = base[:: 1 + block_pad]
    return IndexerCacheInputs(shape, dtype, k, cache, slots, kind, base, base.clone())
