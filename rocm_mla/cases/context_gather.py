"""gather_context_chunk's cases: one context chunk as vLLM plans it, the tolerance (exact), the check.

Inputs (:func:`make_inputs`): request i has ``ctx[i]`` cached tokens in a paged cache (shuffled
pages, NaN in every slot outside the contexts, spare NaN pages the table's spare columns point at;
q's dtype or fp8 with k_scale); the chunk covers positions ``[starts[i], starts[i] + rows[i])`` of
each; ``cu_seq_lens`` the chunk rows per request (cumulative), ``token_to_seq`` the request of each
row (padded by three entries, as vLLM pads it); dst ``[T, 576]`` a NaN-poisoned view of a wider buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..mla_dims import KV_ROW_DIM
from ._buffers import poisoned
from ._compare import Bound, Checked, Comparison, compare
from ._paged import OnPagedCache, PagedCache, case_paged_cache, device_generator, platform_fp8, row_requests

# The kv_cache_dtype naming each float8 kind (a "uint8" shape's cache of another kind than the platform's).
FP8_NAMES = {torch.float8_e4m3fn: "fp8_e4m3fn", torch.float8_e4m3fnuz: "fp8_e4m3fnuz"}
# A gather is a copy: exact in dst's dtype (an fp8 cache: the reference's dequantised value rounded once).
TOLERANCE: dict[torch.dtype, dict[str, Bound]] = {
    dt: {"dst": Bound(0.0, 0.0)} for dt in (torch.float32, torch.float16, torch.bfloat16)
}


@dataclass(frozen=True)
class ChunkShape:
    """Per request: context length ``ctx``, the chunk's first position ``starts`` and row count
    ``rows``; cache pages of ``block`` tokens; ``kv`` "auto", "fp8" (a float8 cache) or "uint8"
    (the same fp8 cache handed as vLLM allocates it: uint8 storage with an fp8 kv_cache_dtype)."""

    ctx: tuple[int, ...]
    starts: tuple[int, ...]
    rows: tuple[int, ...]
    block: int = 16
    kv: str = "auto"
    name: str = ""

    def __post_init__(self):
        for k in ("ctx", "starts", "rows"):
            object.__setattr__(self, k, tuple(int(n) for n in getattr(self, k)))
        if not len(self.ctx) == len(self.starts) == len(self.rows):
            raise ValueError("ChunkShape: ctx, starts and rows: expected one entry per request each")
        if any(s + r > c for c, s, r in zip(self.ctx, self.starts, self.rows)):
            raise ValueError("ChunkShape: a chunk reaches past its request's context")
        if self.kv not in ("auto", "fp8", "uint8"):
            raise ValueError(f"ChunkShape: kv: expected 'auto', 'fp8' or 'uint8', got {self.kv!r}")

    @property
    def T(self) -> int:
        return sum(self.rows)

    @property
    def label(self) -> str:
        return self.name or f"R={len(self.ctx)} T={self.T} block={self.block}" + (
            "" if self.kv == "auto" else f" {self.kv}"
        )


SHAPES: dict[str, list[ChunkShape]] = {
    # A request split over chunks (start > 0), one read to its end, a 1-token context, lengths
    # that are not multiples of the block.
    "selfcheck": [ChunkShape((50, 1, 23), (17, 0, 0), (33, 1, 23), 16)],
    "odd": [
        ChunkShape((37,), (0,), (37,), name="one_request"),
        ChunkShape((50, 1, 23), (17, 0, 0), (33, 1, 23), name="three_requests"),
        ChunkShape((70, 9), (64, 0), (6, 5), name="continued"),
        ChunkShape((1,), (0,), (1,), name="single_token"),
        ChunkShape((), (), (), name="empty"),
    ],
}


@dataclass
class ChunkInputs(OnPagedCache, Checked):
    """One gather_context_chunk call: ``kwargs()`` its arguments by name (k_scale the chunk's)."""

    shape: ChunkShape
    dtype: torch.dtype
    paged: PagedCache
    cu_seq_lens: torch.Tensor
    starts: torch.Tensor
    token_to_seq: torch.Tensor
    dst: torch.Tensor
    dst_base: torch.Tensor = field(repr=False)
    k_scale: torch.Tensor | None = None

    def kwargs(self, i: int = 0, **overrides) -> dict:
        """gather_context_chunk's arguments by name, from cache copy i (``overrides`` replace them);
        a "uint8" shape's cache is its uint8 storage with the kv_cache_dtype naming its kind."""
        kw = dict(
            kv_cache=self.paged.caches[i],
            block_table=self.paged.tables[i],
            cu_seq_lens=self.cu_seq_lens,
            starts=self.starts,
            token_to_seq=self.token_to_seq,
            dst=self.dst,
            k_scale=self.k_scale,
        )
        if self.shape.kv == "uint8":
            kind = kw["kv_cache"].dtype
            name = "fp8" if kind == platform_fp8(kw["kv_cache"].device) else FP8_NAMES[kind]
            kw.update(kv_cache=kw["kv_cache"].view(torch.uint8), kv_cache_dtype=name)
        kw.update(overrides)
        return kw

    def run(self, i: int = 0, **overrides):
        from ..ops import gather_context_chunk

        return gather_context_chunk(**self.kwargs(i, **overrides))

    def reference(self, i: int = 0) -> torch.Tensor:
        """``[T, 576]`` float32, from cache copy i."""
        from ..reference import context_gather_ref

        return context_gather_ref(
            self.paged.caches[i],
            self.paged.tables[i],
            self.cu_seq_lens,
            self.starts,
            self.token_to_seq,
            self.shape.T,
            self.k_scale,
        )

    def compare(self, dst=None, *, ref=None) -> list[Comparison]:
        dst = self.dst if dst is None else dst
        ref = self.reference() if ref is None else ref
        return [compare("dst", dst, ref.to(dst.dtype), TOLERANCE[self.dtype]["dst"])]


def make_inputs(
    shape: ChunkShape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int = 0,
    gen: torch.Generator | None = None,
    copies: int = 1,
    k_scale: float = 0.25,
    fp8: torch.dtype | None = None,
    dst_pad: int = 8,
    spare_pages: int = 2,
    spare_cols: int = 1,
    page_pad: int = 0,
    unused: str = "nan",
    guard: int = 0,
) -> ChunkInputs:
    """Fresh random inputs of ``shape`` (see the module docstring); the context keys have standard
    deviation 2. dtype: the cache's (unless fp8) and dst's. dst_pad: elements past each dst row.
    page_pad / unused / guard: see :func:`rocm_mla.cases.paged_cache`."""
    device, g = device_generator(device, seed, gen)
    paged, ks = case_paged_cache(
        shape.ctx, shape.block, shape.kv != "auto", kind=fp8, k_scale=k_scale, dtype=dtype, device=device, gen=g,
        spare_pages=spare_pages, spare_cols=spare_cols, copies=copies, unused=unused, guard=guard, scale=2.0,
        page_pad=page_pad,
    )  # fmt: skip
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    cu = i32([sum(shape.rows[:i]) for i in range(len(shape.rows) + 1)])
    dst_base, dst = poisoned((shape.T, KV_ROW_DIM), dtype, device, pad_last=dst_pad)
    t2s = row_requests(shape.rows, 3, device)  # padded by three entries, as vLLM pads it
    return ChunkInputs(shape, dtype, paged, cu, i32(list(shape.starts)), t2s, dst, dst_base, ks)
