"""The paged latent cache every paged op reads: ``[num_pages, block_size, 576]``, a block table
with shuffled page ids, NaN in every slot no request covers, fp8 storage with a per-tensor scale.

:func:`paged_cache` draws each request's keys (fresh normal values, never zeros) into pages handed
out in a random order; the last page's tail, ``spare_pages`` whole pages and the block table's
``spare_cols`` extra columns (pointing at the spare pages) are NaN, so one stray read poisons the
result. ``copies=R`` draws R independent (cache, table) pairs with their own page permutations: a
timing loop rotating over them finds its keys in HBM, not in L2 (:func:`cold_copies`).

The parts several ops' shapes share live here too: :class:`RequestRows` (requests whose last
positions are the query rows), :class:`CacheKind` (a cache "auto" or "fp8"), :class:`SlotWrite`
(a cache write's scattered slots).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..mla_dims import KV_ROW_DIM
from ..reference.rope_kv_write import FP8_MAX
from ._buffers import SENTINEL

# The NaN bit pattern of each fp8 kind (e4m3fnuz has one NaN: the negative zero code).
_FP8_NAN_CODE = {torch.float8_e4m3fn: 0x7F, torch.float8_e4m3fnuz: 0x80}
# Values kept for the independent (never paged) check up to this many elements per copy.
_KEEP_VALUES_NUMEL = 1 << 24


class RequestRows:
    """A frozen shape of requests holding ``lens[b]`` keys each, the last ``rows[b]`` of them query
    rows (one int: the same for every request); its first fields are ``lens, rows, heads``.
    __post_init__ normalises both to tuples of ints and checks them: one row count per request,
    none above its keys."""

    def __post_init__(self):
        name = type(self).__name__
        lens = tuple(int(n) for n in self.lens)
        rows = (int(self.rows),) * len(lens) if isinstance(self.rows, int) else tuple(int(n) for n in self.rows)
        object.__setattr__(self, "lens", lens)
        object.__setattr__(self, "rows", rows)
        if len(rows) != len(lens):
            raise ValueError(f"{name}: rows: expected one entry per request (or an int)")
        if any(r > n for r, n in zip(rows, lens)):
            raise ValueError(f"{name}: a request has more query rows than keys")

    @classmethod
    def decode(cls, B: int, ctx: int, heads: int, q_len: int = 1, **kw):
        """B requests of ``ctx`` keys, ``q_len`` rows each (decode 1, MTP more)."""
        return cls((ctx,) * B, q_len, heads, **kw)

    @property
    def T(self) -> int:
        return sum(self.rows)

    def kv_lens(self) -> list[int]:
        """Keys each row sees, rows in order."""
        return [n - r + 1 + i for n, r in zip(self.lens, self.rows) for i in range(r)]

    def label_parts(self) -> tuple[str, str]:
        """A label's requests (``"B=128 ctx=8192"``, uneven ones ``"lens=37,90,5"``) and rows
        (``" q2"`` or ``" T=8192"`` when every request has that many; '' for one, or uneven)."""
        if len(set(self.lens)) > 1 or len(set(self.rows)) > 1:
            return f"lens={','.join(map(str, self.lens))}", ""
        q = self.rows[0] if self.rows else 1
        rows = "" if q == 1 else (f" q{q}" if q <= 8 else f" T={self.T}")
        return f"B={len(self.lens)} ctx={max(self.lens, default=0)}", rows


class CacheKind:
    """A frozen shape's cache kind ``kv``: "auto" (q's dtype) or "fp8" (an e4m3 kind)."""

    def check_kv(self) -> None:
        if self.kv not in ("auto", "fp8"):
            raise ValueError(f"{type(self).__name__}: kv: expected 'auto' or 'fp8', got {self.kv!r}")

    @property
    def fp8(self) -> bool:
        return self.kv == "fp8"

    def kv_elem_bytes(self, dtype: torch.dtype) -> int:
        return 1 if self.fp8 else dtype.itemsize


class SlotWrite:
    """A cache write's frozen shape: ``T`` tokens into blocks of ``block`` slots."""

    def num_blocks(self) -> int:
        """A quarter more slots than tokens, and one block: the slots land scattered."""
        return (self.T * 5 // 4 + self.block - 1) // self.block + 1

    def draw_slots(self, gen: torch.Generator, device, skip=()) -> torch.Tensor:
        """``[T]`` int64 slots drawn without repeats from the ``num_blocks() x block`` slots; the
        tokens in ``skip`` get -1."""
        slots = torch.randperm(self.num_blocks() * self.block, generator=gen, device=gen.device)[: self.T].to(device)
        for i in skip:
            if i < self.T:
                slots[i] = -1
        return slots


def row_requests(rows, pad: int, device) -> torch.Tensor:
    """``[sum(rows) + pad]`` int32: the request of each query row (``rows[b]`` rows of request b),
    then ``pad`` zeros (vLLM pads its per-token request ids)."""
    req = [b for b, r in enumerate(rows) for _ in range(r)] + [0] * pad
    return torch.tensor(req, dtype=torch.int32, device=device)


def generator(seed: int, device) -> torch.Generator:
    """A generator on ``device`` (CPU values for a CPU device; the device's own for a GPU: building
    serving shapes on the host would take minutes). The same seed gives other values per device."""
    dev = torch.device(device)
    return torch.Generator(device=dev).manual_seed(seed)


def device_generator(device, seed: int, gen: torch.Generator | None) -> tuple[torch.device, torch.Generator]:
    """A builder's ``(device, generator)``: ``gen`` when given, else :func:`generator` of ``seed``."""
    device = torch.device(device)
    return device, gen if gen is not None else generator(seed, device)


def randn(shape, gen: torch.Generator, device, dtype=torch.float32, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Normal values from ``gen`` (drawn on its device), scaled (a number, or a tensor that
    broadcasts against the last dims, e.g. one standard deviation per channel), as ``dtype`` on
    ``device``."""
    x = torch.randn(tuple(shape), generator=gen, device=gen.device)
    if isinstance(scale, torch.Tensor):
        x = x * scale.to(x.device)
    elif scale != 1.0:
        x = x * scale
    return x.to(device=device, dtype=dtype)


def platform_fp8(device) -> torch.dtype:
    """The e4m3 kind a plain "fp8" cache holds on ``device``'s arch (configs/platform.json:
    e4m3fnuz on gfx942, e4m3fn elsewhere; vLLM's current_platform.fp8_dtype()). Looked up at call
    time, so a patched ``rocm_mla.configs.platform_fp8_dtype`` is seen."""
    from .. import _platform, configs

    kind = configs.platform_fp8_dtype(_platform.device_arch(torch.device(device)))
    if not isinstance(kind, torch.dtype) or kind not in FP8_MAX:
        raise TypeError(f"the platform's fp8 kind: expected torch.float8_e4m3fn or _e4m3fnuz, got {kind!r}")
    return kind


def to_fp8(x: torch.Tensor, k_scale: float, fp8: torch.dtype) -> torch.Tensor:
    """``x / k_scale`` saturated to ``fp8``'s range, as ``fp8`` (NaN stays NaN)."""
    m = FP8_MAX[fp8]
    return (x.float() / k_scale).clamp(-m, m).to(fp8)


def nan_filled(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A tensor of ``shape`` holding NaN in ``dtype`` (an fp8 kind included: its NaN code)."""
    if dtype in _FP8_NAN_CODE:
        return torch.full(tuple(shape), _FP8_NAN_CODE[dtype], dtype=torch.uint8, device=device).view(dtype)
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)


def cold_copies(set_bytes: int, cold_bytes: int, cap: int = 64) -> tuple[int, bool]:
    """(R, cold): R copies of a ``set_bytes`` input set, together over 3 x ``cold_bytes`` (the
    last-level cache, rocm_mla.tools.timing.cold_cache_bytes) up to ``cap`` copies; ``cold`` False when ``cap``
    copies are still short (small shapes against a 256 MB Infinity Cache). cold_bytes 0: (1, True)."""
    if cold_bytes <= 0:
        return 1, True
    r = max(1, min(cap, math.ceil(3 * cold_bytes / max(set_bytes, 1))))
    return r, r * set_bytes >= 3 * cold_bytes


@dataclass
class PagedCache:
    """R copies of one paged cache. ``caches[i]`` ``[num_pages, block_size, 576]`` in ``dtype`` or an
    fp8 kind (stored = value / k_scale); ``tables[i]`` ``[B, max_blocks]`` int32; ``lens`` the keys
    of each request; ``values[b]`` request b's keys as the cache holds them, float32 ``[lens[b], 576]``
    (copy 0, never paged: the independent check reads these), None for large caches."""

    caches: list[torch.Tensor]
    tables: list[torch.Tensor]
    lens: list[int]
    block_size: int
    fp8: torch.dtype | None
    k_scale: float | None
    values: list[torch.Tensor] | None = field(default=None, repr=False)
    # (flat buffer, guard length, snapshot of its guard bytes) per copy, when made with guard=
    guards: list = field(default_factory=list, repr=False)

    @property
    def cache(self) -> torch.Tensor:
        return self.caches[0]

    @property
    def table(self) -> torch.Tensor:
        return self.tables[0]

    @property
    def copies(self) -> int:
        return len(self.caches)

    def check_guards(self, what: str = "kv_cache") -> None:
        """Raise AssertionError when a byte of a guard region (``guard=``) changed."""
        for i, (flat, g, snap) in enumerate(self.guards):
            now = torch.cat([flat[:g], flat[-g:]]).view(torch.uint8)
            if not torch.equal(now, snap):
                raise AssertionError(f"{what} copy {i}: {int((now != snap).sum())} guard bytes changed")

    def stored(self, i: int = 0) -> torch.Tensor:
        """Copy i as vLLM hands it over: an fp8 cache as uint8 storage (kv_cache_dtype "fp8")."""
        return self.caches[i].view(torch.uint8) if self.fp8 is not None else self.caches[i]


class OnPagedCache:
    """An inputs object's view of its ``paged`` (:class:`PagedCache`): copy 0 and the copy count."""

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


def _one_copy(lens, block_size, gen, device, dtype, fp8, k_scale, opts: dict, keep: bool):
    spare_pages, spare_cols, scale = opts["spare_pages"], opts["spare_cols"], opts["scale"]
    nblk = [-(-n // block_size) for n in lens]
    used = sum(nblk)
    num_pages = used + spare_pages
    perm = torch.randperm(num_pages, generator=gen, device=gen.device).to(torch.int32).cpu()
    width = max(nblk + [1]) + spare_cols
    table = torch.empty(len(lens), width, dtype=torch.int32)
    for b, (nb, pages) in enumerate(zip(nblk, perm[:used].split(nblk))):
        table[b, :nb] = pages
        table[b, nb:] = perm[used + b % spare_pages] if spare_pages else perm[0] if num_pages else 0
    table = table.to(device)
    total = sum(lens)
    # Flat slot of every (request, token): page = table[b, t // bs], slot = page * bs + t % bs.
    req = torch.repeat_interleave(
        torch.arange(len(lens), device=device), torch.tensor(lens, dtype=torch.long, device=device)
    )
    start = torch.tensor([0] + list(lens), dtype=torch.long, device=device).cumsum(0)[:-1]
    tok = torch.arange(total, device=device) - start[req] if total else torch.zeros(0, dtype=torch.long, device=device)
    page, off = table[req, tok // block_size].long(), tok % block_size
    kind = fp8 or dtype
    # page_pad: extra elements after each page (a block stride wider than block_size * 576);
    # guard: sentinel elements before and after the whole cache (a read past it shows as 77).
    row = block_size * KV_ROW_DIM + opts["page_pad"]
    guard = opts["guard"]
    flat = nan_filled((2 * guard + num_pages * row,), kind, device)
    if guard:
        sentinel = torch.full((guard,), SENTINEL, device=device)
        for part in (flat[:guard], flat[guard + num_pages * row :]):
            part.view(torch.uint8).copy_(sentinel.to(kind).view(torch.uint8))
    cache = flat[guard : guard + num_pages * row].view(num_pages, row)[:, : block_size * KV_ROW_DIM]
    cache = cache.view(num_pages, block_size, KV_ROW_DIM)
    if opts["unused"] == "randn":  # every slot random; the covered ones are the requests' keys
        every = randn((num_pages, block_size, KV_ROW_DIM), gen, device, scale=scale)
        vals = every[page, off]
        _store(cache, every, fp8, k_scale, dtype)
    else:
        vals = randn((total, KV_ROW_DIM), gen, device, scale=scale)
    held = _store(cache, vals, fp8, k_scale, dtype, page, off)
    values = list(held.split(list(lens))) if keep and total * KV_ROW_DIM <= _KEEP_VALUES_NUMEL else None
    return cache, table, values, flat


def _store(cache, vals, fp8, k_scale, dtype, page=None, off=None) -> torch.Tensor:
    """Write ``vals`` at (page, off) (all of the cache: None), quantised for fp8; returns the values
    as the cache holds them, float32."""
    if fp8 is not None:
        codes = to_fp8(vals, k_scale, fp8)
        dst = cache.view(torch.uint8)  # float8 indexing is missing from some torch builds
        if page is None:
            dst.copy_(codes.view(torch.uint8))
        else:
            dst[page, off] = codes.view(torch.uint8)
        return codes.float() * k_scale
    if page is None:
        cache.copy_(vals)
    else:
        cache[page, off] = vals.to(dtype)
    return vals.to(dtype).float()


def paged_cache(
    lens,
    block_size: int,
    *,
    dtype: torch.dtype,
    device,
    gen: torch.Generator,
    fp8: torch.dtype | None = None,
    k_scale: float | None = None,
    spare_pages: int = 3,
    spare_cols: int = 1,
    copies: int = 1,
    scale: float | torch.Tensor = 1.0,
    page_pad: int = 0,
    unused: str = "nan",
    guard: int = 0,
) -> PagedCache:
    """R = ``copies`` paged caches of requests holding ``lens`` keys each (see the module docstring).

    ``dtype``: the 16/32-bit cache dtype; ``fp8``: an e4m3 kind instead (``k_scale`` required;
    values saturate at the kind's range). ``scale``: the keys' standard deviation (or ``[576]``, one
    per channel). ``page_pad``:
    extra (NaN) elements after each page, a non-contiguous block stride. ``unused``: "nan" (every
    slot no request covers: a stray read poisons the result) or "randn" (finite everywhere: a
    request's NaN is the kernel's verdict, not a read). ``guard``: that many sentinel elements
    (:data:`SENTINEL`) before and after each cache, checked by :meth:`PagedCache.check_guards`.
    """
    lens = [int(n) for n in lens]
    if fp8 is not None and k_scale is None:
        raise ValueError("paged_cache: an fp8 cache needs k_scale")
    if unused not in ("nan", "randn"):
        raise ValueError(f"paged_cache: unused: expected 'nan' or 'randn', got {unused!r}")
    opts = dict(
        spare_pages=spare_pages, spare_cols=spare_cols, scale=scale, page_pad=page_pad, unused=unused, guard=guard
    )
    parts = [_one_copy(lens, block_size, gen, device, dtype, fp8, k_scale, opts, keep=i == 0) for i in range(copies)]
    caches, tables, values, flats = ([p[j] for p in parts] for j in range(4))
    pc = PagedCache(caches, tables, lens, block_size, fp8, k_scale, values[0] if parts else None)
    if guard:
        pc.guards = [(f, guard, torch.cat([f[:guard], f[-guard:]]).view(torch.uint8).clone()) for f in flats]
    return pc


def case_paged_cache(lens, block_size: int, fp8: bool, *, kind, k_scale: float, dtype, device, gen, **kw):
    """An op case's :func:`paged_cache` of ``lens`` and the k_scale the op takes: ``(paged, k_scale)``.
    ``fp8`` False: in ``dtype``, k_scale None; True: in ``kind`` (None: the platform's e4m3 kind),
    stored as value / ``k_scale``, and k_scale ``[1]`` float32. ``kw``: paged_cache's other keywords."""
    kind = (kind or platform_fp8(device)) if fp8 else None
    scale = k_scale if kind is not None else None
    paged = paged_cache(lens, block_size, dtype=dtype, device=device, gen=gen, fp8=kind, k_scale=scale, **kw)
    return paged, None if scale is None else torch.tensor([scale], device=device)
