"""mla_indexer_topk's cases: the shapes, the inputs as vLLM hands them over, the check.

Inputs (:func:`make_inputs`): an indexer key cache ``[num_pages, block_size, 132]`` uint8 of B
requests (shuffled block table; keys written by the reference quantiser,
rocm_mla.reference.indexer, in vLLM's ROCm layout; every byte no request covers -- page tails,
spare pages -- is 0xFF, a NaN scale, so a stray read turns its row into the bad-row sentinel);
each request owns ``rows[b]`` query rows, its last positions in order (decode 1, MTP 2, a prefill
chunk many), and row i of request b sees keys ``0 .. lens[b] - rows[b] + i``; q ``[T, H, 128]`` in
the platform's fp8 kind with a row stride wider than H x 128 (vLLM's q is a slice), the cache's
values in q's kind or another (``cache_kind``: e4m3fn under an e4m3fnuz q, as vLLM writes
DeepSeek-V4's compressed indexer cache), weights ``[T, H]`` float32 of both signs; out ``[T,
topk]`` int32 poisoned with -7. DeepSeek-V4.1's two-level indexer (:meth:`IndexerInputs.run_two_level`):
the candidate source's lists into a buffer poisoned with -9, then a masked call over them.

The check (:meth:`IndexerInputs.mismatch`): a valid top-k against float64 logits of the same fp8
values (rocm_mla.reference.indexer_topk.check_indexer_topk), or the sentinel where the reference
says the row is bad.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..reference.indexer import INDEX_HEAD_DIM, INDEX_ROW_BYTES, indexer_k_cache_write_ref
from ._compare import Checked
from ._paged import RequestRows, device_generator, platform_fp8, randn, row_requests

POISON_OUT = -7  # what out holds before a call: every entry must be written
POISON_LISTS = -9  # what a candidate source's lists hold before its call
# The tolerance of fp8 logits, of a row's largest: Triton's NVIDIA backend accumulates an fp8
# tl.dot's whole K in the tensor cores' reduced-precision accumulator on capability 9.0
# (max_num_imprecise_acc), so sm90's logits are not float32 sums; AMD and the interpreter sum in
# float32 (docs/notes/indexer.md, "fp8 logits on sm90 are not float32 sums").
SM90_FP8_DOT_RTOL = 1e-3
FP32_DOT_RTOL = 1e-4


def fp8_dot_rtol(device) -> float:
    """The tolerance (of the row's largest logit) for fp8 logits computed on ``device``:
    SM90_FP8_DOT_RTOL on an sm90 GPU, else FP32_DOT_RTOL."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(dev)[0] == 9:
        return SM90_FP8_DOT_RTOL
    return FP32_DOT_RTOL


# plan_indexer_topk's choices that IndexerInputs.run takes as keywords and plans with.
PLAN_KNOBS = ("backend", "config", "max_kv_len", "debug", "shuffled", "cache_kind", "group_rows")


@dataclass(frozen=True)
class IndexerShape(RequestRows):
    """B requests holding ``lens[b]`` keys each, ``rows[b]`` query rows each (an int: the same for
    every request), H indexer heads, ``topk`` kept, pages of ``block`` tokens. ``c4``: DeepSeek-V4's
    compressed (C4) indexer cache, a key for every 4 tokens, as vLLM's compressor writes it: flat
    rows of e4m3fn values whatever q's kind (``make_inputs``' defaults then)."""

    lens: tuple[int, ...]
    rows: tuple[int, ...] | int = 1
    H: int = 64
    topk: int = 2048
    block: int = 64
    name: str = ""
    c4: bool = False

    def label(self) -> str:
        if self.name:
            return self.name
        head, rows = self.label_parts()
        block = f" block={self.block}" if self.block != 64 else ""
        return f"{head} H={self.H} topk={self.topk}{rows}{block}" + (" c4" if self.c4 else "")

    def keys_read(self) -> int:
        """Cache rows the op must read: every row's visible keys."""
        return sum(self.kv_lens())

    def nbytes(self) -> float:
        """Bytes per call: 132 per visible key per row, q (T x H x 128), weights, the answer."""
        return self.keys_read() * INDEX_ROW_BYTES + self.T * (self.H * (INDEX_HEAD_DIM + 4) + 4 * self.topk)

    def set_bytes(self) -> int:
        """Bytes of one cache copy's pages (what cold-cache rotation must exceed)."""
        return sum(-(-n // self.block) for n in self.lens) * self.block * INDEX_ROW_BYTES

    def flops(self) -> float:
        """2 x H x 128 per visible key per row (q . k), plus the weighted sum (2 x H)."""
        return self.keys_read() * self.H * (2 * INDEX_HEAD_DIM + 2)


SHAPES: dict[str, list[IndexerShape]] = {
    # The benchmark: H 64 (DeepSeek-V3.2) and 32 (GLM-5.x), decode 1 / 32 / 128 requests x 1 and 2
    # rows at 8K, 32K and 128K keys, 256 requests at 8K and 32K, 32 requests x 4 MTP rows; a prefill
    # chunk of 8192 rows over 32K keys. DeepSeek-V4's CSA indexer (C4 caches, 64 heads): top-512
    # (V4-Flash) and top-1024 (V4-Pro) over 8K and 32K compressed keys (32K and 128K tokens).
    "bench": [
        IndexerShape.decode(B, ctx, H, q)
        for H in (64, 32)
        for q in (1, 2)
        for ctx in (8192, 32768, 131072)
        for B in (1, 32, 128)
    ]
    + [IndexerShape.decode(256, ctx, H) for H in (64, 32) for ctx in (8192, 32768)]
    + [IndexerShape.decode(32, ctx, 64, 4) for ctx in (32768, 131072)]
    + [IndexerShape((32768,), 8192, H) for H in (64, 32)]
    + [
        IndexerShape.decode(B, keys, 64, q, topk=topk, c4=True)
        for B, keys, q, topk in (
            (1, 32768, 1, 512),
            (32, 8192, 1, 512),
            (128, 8192, 1, 512),
            (128, 32768, 1, 512),
            (128, 8192, 2, 512),
            (32, 32768, 1, 1024),
            (128, 32768, 1, 1024),
        )
    ],
    "quick": [
        IndexerShape.decode(128, 32768, 64),
        IndexerShape.decode(128, 131072, 64),
        IndexerShape.decode(1, 131072, 64),
        IndexerShape.decode(32, 8192, 32, 2),
        IndexerShape((32768,), 8192, 64),
    ],
    # The tuner's groups.
    "tune": [IndexerShape.decode(128, 32768, 64), IndexerShape.decode(1, 131072, 64), IndexerShape((32768,), 8192, 64)],
    # The CPU interpreter: rows shorter than, equal to and longer than topk and one split.
    "tiny": [IndexerShape((70, 300), (1, 2), 32, topk=48, block=16)],
    "selfcheck": [IndexerShape((37, 200, 5), (2, 3, 1), 32, topk=40, block=16)],
    # A config's acceptance check: several splits (long rows), prefill rows, odd lengths; two MTP
    # rows of 40000 keys, whose few items take the prefiltered form where the config has one.
    "verify": [
        IndexerShape((9000, 70, 2100), (1, 2, 40), 64, topk=2048, block=64),
        IndexerShape((40000,), 2, 64, topk=2048, block=64),
    ],
    # Odd sizes: H 1/8/24/64, blocks 1/16/64, topk 1/8/2048, one key, prefill rows, empty.
    "odd": [
        IndexerShape((1, 37), 1, H=1, topk=8, block=1),
        IndexerShape((17, 1, 33), 1, H=8, topk=1, block=16),
        IndexerShape((65, 3, 130), (2, 1, 3), H=24, topk=40, block=64),
        IndexerShape((90,), 30, H=64, topk=24, block=16),
        IndexerShape((), 1, H=32, topk=16, block=16),
    ],
}


@dataclass
class IndexerInputs(Checked):
    """One mla_indexer_topk call's tensors. ``args(i)`` is the op's positional arguments with cache
    copy i; ``kwargs()`` the keywords (the plan included); ``out`` poisoned with POISON_OUT."""

    shape: IndexerShape
    fp8: torch.dtype
    q: torch.Tensor
    weights: torch.Tensor
    caches: list[torch.Tensor]
    tables: list[torch.Tensor]
    req_ids: torch.Tensor
    kv_lens: torch.Tensor
    out: torch.Tensor
    shuffled: bool
    cache_kind: torch.dtype | None = None  # the cache values' fp8 kind (None: q's)
    _logits: dict = field(default_factory=dict, repr=False)

    @property
    def index_cache(self) -> torch.Tensor:
        return self.caches[0]

    @property
    def block_table(self) -> torch.Tensor:
        return self.tables[0]

    @property
    def copies(self) -> int:
        return len(self.caches)

    def args(self, i: int = 0) -> tuple:
        return (self.q, self.weights, self.caches[i], self.tables[i], self.req_ids, self.kv_lens)

    def kwargs(self, **overrides) -> dict:
        """The op's keywords: topk, out, and the plan of the inputs' sizes and cache layout
        (:meth:`plan`) unless ``overrides`` give one."""
        kw = {"topk": self.shape.topk, "out": self.out, **overrides}
        if kw.get("plan") is None:
            kw["plan"] = self.plan()
        return kw

    def run(self, i: int = 0, **overrides):
        """mla_indexer_topk on copy i, writing ``out``. ``overrides``: the op's keywords (out=None,
        workspace, plan) or the plan's knobs (backend, config, max_kv_len, debug), planned here
        with the inputs' cache layout (:meth:`plan`); a call takes a plan or knobs, not both.
        Returns what the op returns."""
        from ..ops import mla_indexer_topk

        knobs = {k: overrides.pop(k) for k in PLAN_KNOBS if k in overrides}
        if overrides.get("plan") is None:
            overrides["plan"] = self.plan(**knobs)
        elif knobs:
            raise TypeError(f"IndexerInputs.run: a plan and plan knobs ({', '.join(knobs)}): the plan holds them")
        return mla_indexer_topk(*self.args(i), **self.kwargs(**overrides))

    def plan(self, device=None, **overrides):
        """The :class:`~rocm_mla.ops.IndexerTopkPlan` of :meth:`run`'s call (``overrides``:
        ``plan_indexer_topk``'s keywords; max_kv_len defaults to the table's capacity)."""
        from ..ops import plan_indexer_topk

        s = self.shape
        kw = dict(num_rows=s.T, num_heads=s.H, topk=s.topk, max_kv_len=self.tables[0].shape[1] * s.block)
        kw.update(block_size=s.block, q_dtype=self.fp8, shuffled=self.shuffled, cache_kind=self.cache_kind)
        kw["device"] = torch.device(device) if device is not None else self.q.device
        return plan_indexer_topk(**{**kw, **overrides})

    def _rows(self, rows) -> int:
        return self.shape.T if rows is None else min(rows, self.shape.T)

    def _ref_args(self, r: int, i: int) -> tuple:
        """The reference's positional arguments: the first ``r`` rows, cache copy i."""
        return self.q[:r], self.weights[:r], self.caches[i], self.tables[i], self.req_ids[:r], self.kv_lens[:r]

    def logits(self, rows=None, *, i: int = 0) -> list:
        """Float64 reference logits of the first ``rows`` rows (all: None) from copy i."""
        from ..reference.indexer_topk import mla_indexer_logits_ref

        key = (self._rows(rows), i)
        if key not in self._logits:
            self._logits[key] = mla_indexer_logits_ref(
                *self._ref_args(*key), shuffled=self.shuffled, cache_kind=self.cache_kind
            )
        return self._logits[key]

    def reference(self, rows=None, *, i: int = 0) -> torch.Tensor:
        """The reference answer ``[rows', topk]`` (ties by position) of the first ``rows`` rows."""
        from ..reference.indexer_topk import mla_indexer_topk_ref

        args = self._ref_args(self._rows(rows), i)
        return mla_indexer_topk_ref(*args, topk=self.shape.topk, shuffled=self.shuffled, cache_kind=self.cache_kind)

    def run_two_level(self, block_size: int, num_blocks: int, **knobs) -> tuple[torch.Tensor, ...]:
        """DeepSeek-V4.1's two-level indexer on these inputs: the candidate source's call
        (``candidate_mode="select"``: its own top-k, its lists into a ``[T + 2, num_blocks]``
        buffer poisoned with POISON_LISTS), then a later layer's call over those lists ("mask").
        ``knobs``: the plans' other knobs (backend, config). Returns (the source's answer, the
        buffer, the masked answer); ``two_level_mismatch`` checks them."""
        T = self.shape.T
        lists = torch.full((T + 2, num_blocks), POISON_LISTS, dtype=torch.int32, device=self.q.device)
        kw = dict(candidate_block_size=block_size, candidate_blocks=num_blocks, **knobs)
        self.out.fill_(POISON_OUT)
        self.run(plan=self.plan(candidate_mode="select", **kw), candidates_out=lists)
        own = self.out.clone()
        self.out.fill_(POISON_OUT)
        self.run(plan=self.plan(candidate_mode="mask", **kw), candidates=lists)
        return own, lists, self.out.clone()

    def two_level_mismatch(self, own, lists, masked, block_size: int) -> str:
        """``two_level_problem`` of ``run_two_level``'s outputs on these inputs."""
        return two_level_problem(own, lists, masked, self.logits(), self.kv_lens, self.shape.topk, block_size)

    def mismatch(self, out=None, *, rows=None, i: int = 0) -> str:
        """'' when the first ``rows`` rows of ``out`` (default: the buffer) are a valid top-k of
        copy i (see the module docstring), else what is wrong."""
        from ..reference.indexer_topk import check_indexer_topk

        r = self._rows(rows)
        return check_indexer_topk((self.out if out is None else out)[:r], self.logits(r, i=i), self.shape.topk)


def two_level_problem(own, lists, masked, logits, kv_lens, topk: int, block_size: int) -> str:
    """'' when a two-level pair's outputs are right for T rows of float64 ``logits`` (``[T', topk]``
    source answer ``own``, its lists buffer ``[>= T, C]``, the masked answer ``masked``; kv_lens
    ``[>= T]``): every entry written (no POISON_OUT / POISON_LISTS left; the buffer's rows past T
    untouched), the source's answer a valid top-k, its lists a valid top of the blocks by their
    largest logit with each row's newest block in, the masked answer a valid top-k of the listed
    blocks' keys; else what is wrong."""
    from ..reference.indexer_topk import candidate_keep_ref, check_candidate_blocks, check_indexer_topk

    T = len(logits)
    for name, x in (("out (source)", own[:T]), ("candidates_out", lists[:T]), ("out (mask)", masked[:T])):
        if bool(((x == POISON_OUT) | (x == POISON_LISTS)).any()):
            return f"an entry of {name} was not written"
    if not bool((lists[T:] == POISON_LISTS).all()):
        return "candidates_out written past T"
    lens = kv_lens[:T].cpu().long()
    for t in range(T):
        newest = (int(lens[t]) - 1) // block_size
        if lens[t] > 0 and newest not in lists[t].tolist():
            return f"row {t}: its newest block {newest} is not listed"
    return (
        check_indexer_topk(own[:T], logits, topk)
        or check_candidate_blocks(lists[:T], logits, block_size)
        or check_indexer_topk(masked[:T], logits, topk, keep=candidate_keep_ref(lists[:T], logits, block_size))
    )


def _one_copy(shape: IndexerShape, g: torch.Generator, device, fp8, shuffled: bool, spare_pages: int):
    """One (cache, block table) pair: fresh keys for every request, pages in shuffled order."""
    bs = shape.block
    need = [-(-n // bs) for n in shape.lens]
    num_pages = sum(need) + spare_pages
    cache = torch.full((num_pages, bs, INDEX_ROW_BYTES), 0xFF, dtype=torch.uint8, device=device)
    perm = torch.randperm(num_pages, generator=g, device=g.device).to(device)
    width = max(need, default=0) or 1
    table = torch.full((len(shape.lens), width), -1, dtype=torch.int32, device=device)
    for b, (n, pages) in enumerate(zip(shape.lens, perm[: sum(need)].split(need))):
        table[b, : need[b]] = pages.to(torch.int32)
        if n == 0:
            continue
        k = randn((n, INDEX_HEAD_DIM), g, device)
        pos = torch.arange(n, device=device)
        slots = pages[pos // bs].long() * bs + pos % bs
        indexer_k_cache_write_ref(k, cache, slots, fp8_dtype=fp8, shuffled=shuffled)
    # Unused table entries point at a real page: only kv_lens bounds what a row may read.
    table = torch.where(table < 0, perm[:1].to(torch.int32), table)
    return cache, table


def make_inputs(
    shape: IndexerShape,
    *,
    device="cpu",
    seed: int = 0,
    gen: torch.Generator | None = None,
    copies: int = 1,
    fp8: torch.dtype | None = None,
    shuffled: bool | None = None,
    spare_pages: int = 3,
    req_pad: int = 3,
    cache_kind: torch.dtype | None = None,
) -> IndexerInputs:
    """Fresh random inputs of ``shape`` (see the module docstring).

    fp8: q's e4m3 kind (default: the platform's). cache_kind: the kind the cache's values are
    written in, with that kind's scale range (default: q's; e4m3fn for a ``c4`` shape). shuffled:
    the cache layout (default: vLLM's ROCm rule, 16 x 16 tiles above block size 1; flat for c4).
    copies: R independent (cache, block table) pairs (cold-cache rotation). req_pad: entries past
    T in req_id_per_token and kv_lens (vLLM pads them).
    """
    from ..reference.indexer import vllm_rocm_shuffled

    device, g = device_generator(device, seed, gen)
    kind = fp8 or platform_fp8(device)
    if shuffled is None:
        shuffled = not shape.c4 and vllm_rocm_shuffled(shape.block)
    shuf = bool(shuffled)
    ckind = cache_kind or (torch.float8_e4m3fn if shape.c4 else kind)
    pairs = [_one_copy(shape, g, device, ckind, shuf, spare_pages) for _ in range(copies)]
    T, H = shape.T, shape.H
    # q a slice of a wider buffer: its head and row strides are not H x 128's.
    q = torch.empty((T, H, INDEX_HEAD_DIM + 16), dtype=kind, device=device)[:, :, :INDEX_HEAD_DIM]
    q.copy_(randn((T, H, INDEX_HEAD_DIM), g, device))
    weights = randn((T, H), g, device) * H**-0.5
    req_ids = row_requests(shape.rows, req_pad, device)
    kv_lens = torch.tensor(shape.kv_lens() + [0] * req_pad, dtype=torch.int32, device=device)
    out = torch.full((T, shape.topk), POISON_OUT, dtype=torch.int32, device=device)
    return IndexerInputs(
        shape, kind, q, weights, [c for c, _ in pairs], [t for _, t in pairs], req_ids, kv_lens, out, shuf, ckind
    )


__all__ = ["SHAPES", "POISON_OUT", "POISON_LISTS", "IndexerInputs", "IndexerShape", "make_inputs", "two_level_problem"]
