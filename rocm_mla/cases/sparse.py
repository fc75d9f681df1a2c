"""mla_sparse_attention's cases: the shapes, the inputs as vLLM hands them over, the tolerance, the check.

Inputs (:func:`make_inputs`): a paged latent cache ``[num_pages, block_size, 576]`` of B requests
(shuffled block table, NaN in every slot no request covers: page tails, spare pages), in q's dtype
or fp8 (the platform's e4m3 kind, stored = value / k_scale); each request owns ``rows[b]`` query
rows, its last tokens in order (decode 1, MTP 2, a prefill chunk many), and row i of request b sees
its keys ``0 .. lens[b] - rows[b] + i``. A row's list ``topk_indices[t]`` is what an indexer's
top-k gives: K distinct visible positions in random order, all of them and -1 padding when fewer
than K are visible. ``holes`` / ``dups``: that fraction of the entries set to -1 / to a copy of
another entry of the row (a repeated entry counts twice). ``mode="slots"``: the entries are global
cache slots (``block_table=None, req_id_per_token=None``). q as the model produces it
(``q_layout="vllm"``: ``ql_nope`` the ``[N, T, 512]`` W_UK bmm output read as ``[T, N, 512]``,
``q_pe = q[..., 128:]`` of ``[T, N, 192]``); out ``[T, N, 512]`` and lse ``[T, N]`` NaN-poisoned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..mla_dims import KV_LORA_RANK, KV_ROW_DIM
from ._compare import Bound, dtype_name, with_plan
from ._paged import CacheKind, RequestRows, device_generator, row_requests
from .decode import CALL_KEYS, LSE_LAYOUTS, OUT_LAYOUTS, Q_LAYOUTS, LatentInputs, latent_tensors
from .decode import TOLERANCE as DECODE_TOLERANCE

# The arithmetic of mla_decode over other rows (the same online softmax, dots and roundings), so
# the same bounds (the rule: rocm_mla.cases._compare).
TOLERANCE: dict[torch.dtype, dict[str, Bound]] = DECODE_TOLERANCE

MODES = ("paged", "slots")


@dataclass(frozen=True)
class SparseShape(RequestRows, CacheKind):
    """B requests holding ``lens[b]`` keys each, ``rows[b]`` query rows each (an int: the same for
    every request), N heads, K entries per row, cache pages of ``block`` tokens, ``kv`` "auto"
    (q's dtype) or "fp8", ``mode`` "paged" (request-local positions through the block table) or
    "slots" (global cache slots)."""

    lens: tuple[int, ...]
    rows: tuple[int, ...] | int = 1
    N: int = 16
    K: int = 2048
    block: int = 64
    kv: str = "auto"
    mode: str = "paged"
    name: str = ""

    def __post_init__(self):
        super().__post_init__()
        self.check_kv()
        if self.mode not in MODES:
            raise ValueError(f"SparseShape: mode: expected one of {MODES}, got {self.mode!r}")

    def label(self, dtype: torch.dtype = torch.bfloat16) -> str:
        """``"bf16 B=128 ctx=8192 N=16 K=2048"`` (+ ``q2`` for MTP rows, ``T=`` for prefill chunks)."""
        if self.name:
            return self.name
        head, rows = self.label_parts()
        tail = (f" block={self.block}" if self.block != 64 else "") + (" slots" if self.mode == "slots" else "")
        return f"{'fp8' if self.fp8 else dtype_name(dtype)} {head} N={self.N} K={self.K}{rows}{tail}"

    def set_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one cache copy's pages (what cold-cache rotation must exceed)."""
        pages = sum(-(-n // self.block) for n in self.lens)
        return pages * self.block * KV_ROW_DIM * self.kv_elem_bytes(dtype)

    def entries(self) -> int:
        """Selected tokens summed over every row (rows see fewer than K keys early in a prefill)."""
        return sum(min(self.K, n) for n in self.kv_lens())

    def nbytes(self, dtype: torch.dtype) -> float:
        """Bytes one call must move: every selected cache row once per row that selects it, the
        lists, q in, out back (rows of different query rows are counted apart: decode rows share
        few; a prefill chunk's rows share many, which L2 serves)."""
        qb = dtype.itemsize
        keys = self.entries() * KV_ROW_DIM * self.kv_elem_bytes(dtype)
        return keys + self.T * self.K * 4 + self.T * self.N * (KV_ROW_DIM + KV_LORA_RANK) * qb

    def flops(self) -> float:
        return 2.0 * self.N * self.entries() * (KV_ROW_DIM + KV_LORA_RANK)


# Named sets (DeepSeek-V3.2: 128 heads, TP8 -> 16, DP -> 128; GLM-5: 64 heads, TP8 -> 8; K 2048).
SHAPES: dict[str, list[SparseShape]] = {
    # The benchmark: decode 1, 32, 128 requests x N 8 / 16 / 128 x 1 and 2 rows, bf16 and fp8
    # caches; prefill chunks of 8192 rows after 8192 cached tokens at N 16 and 128.
    "bench": [
        SparseShape.decode(B, 8192, N, q, kv=kv)
        for kv in ("auto", "fp8")
        for q in (1, 2)
        for N in (8, 16, 128)
        for B in (1, 32, 128)
    ]
    + [SparseShape((16384,), 8192, N, kv=kv) for kv in ("auto", "fp8") for N in (16, 128)],
    "quick": [
        SparseShape.decode(128, 8192, 16),
        SparseShape.decode(1, 8192, 16),
        SparseShape.decode(128, 8192, 128),
        SparseShape.decode(128, 8192, 16, kv="fp8"),
        SparseShape((16384,), 8192, 16),
    ],
    # The tuner's groups: one shape per tier and cache kind that serving runs.
    "tune": [
        SparseShape.decode(128, 8192, 8),
        SparseShape.decode(128, 8192, 16),
        SparseShape.decode(32, 8192, 16),
        SparseShape.decode(128, 8192, 16, kv="fp8"),
        SparseShape.decode(128, 8192, 128),
        SparseShape.decode(64, 8192, 128, 2),
        SparseShape((16384,), 8192, 16),
    ],
    # The CPU interpreter.
    "tiny": [SparseShape((70, 40), (1, 2), 16, K=32, block=16)],
    "selfcheck": [SparseShape((37, 90, 5), (2, 3, 1), 16, K=48, block=16)],
    # A config's acceptance check (replace N with the tier's BLOCK_H): lists shorter than K, odd lengths.
    "verify": [SparseShape((150, 7, 64), (1, 2, 3), 16, K=64, block=64)],
    # Odd sizes: N 1/8/24/128, blocks 1/16/64, K 1/24/200, one key, MTP and prefill rows, slots, empty.
    "odd": [
        SparseShape((1, 37), 1, N=1, K=24, block=1),
        SparseShape((17, 1, 33), 1, N=8, K=16, block=16),
        SparseShape((65, 3, 130), (2, 1, 3), N=24, K=40, block=64),
        SparseShape((40, 9), (1, 2), N=128, K=24, block=16),
        SparseShape((50,), 20, N=8, K=200, block=4),
        SparseShape((30, 12), (1, 1), N=16, K=1, block=16),
        SparseShape((70, 33), (2, 1), N=16, K=24, block=16, mode="slots"),
        SparseShape((), 1, N=16, K=16, block=16),
    ],
}

__all__ = ["CALL_KEYS", "LSE_LAYOUTS", "OUT_LAYOUTS", "Q_LAYOUTS", "SHAPES", "TOLERANCE", "SparseInputs",
           "SparseShape", "call_sparse", "make_inputs", "positions_to_slots"]  # fmt: skip


def call_sparse(q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token, **kw):
    """``mla_sparse_attention`` with its plan's knobs given as keywords beside the call's own
    (``CALL_KEYS``): the plan is ``plan_sparse_attention_for`` of the tensors and those knobs
    (kv_cache_dtype, num_splits, batch_invariant, config, backend, debug). How tests and benchmarks
    state a one-off call on tensors of their own; a serving step makes its plan once instead."""
    from ..ops import mla_sparse_attention, plan_sparse_attention_for

    args = (q_nope, q_pe, kv_cache, topk_indices, block_table, req_id_per_token)

    def make(call, **knobs):
        return plan_sparse_attention_for(*args, k_scale=call.get("k_scale"), workspace=call.get("workspace"), **knobs)

    return mla_sparse_attention(*args, **with_plan(kw, CALL_KEYS, make, "call_sparse"))


@dataclass(kw_only=True)
class SparseInputs(LatentInputs):
    """One mla_sparse_attention call's tensors (``shape`` a :class:`SparseShape`). ``args(i)`` is the
    op's positional arguments with cache copy i (an fp8 cache as uint8 storage, as vLLM passes it);
    ``kwargs()`` the keywords."""

    positions: torch.Tensor  # [T, K] int32 request-local positions (-1: none), whatever the mode
    req_ids: torch.Tensor  # [T + pad] int32: the request of each row (vLLM pads it)
    _slots: dict = field(default_factory=dict, repr=False)

    OP = "mla_sparse_attention"

    def topk_indices(self, i: int = 0) -> torch.Tensor:
        """The lists as the op reads them for copy i: positions ("paged"), or the global slots of
        copy i's table ("slots"; -1 stays -1)."""
        if self.shape.mode == "paged":
            return self.positions
        if i not in self._slots:
            self._slots[i] = positions_to_slots(self.positions, self.paged.tables[i], self.req_ids, self.shape.block)
        return self._slots[i]

    def args(self, i: int = 0) -> tuple:
        paged = self.shape.mode == "paged"
        return (
            self.q_nope,
            self.q_pe,
            self.paged.stored(i),
            self.topk_indices(i),
            self.paged.tables[i] if paged else None,
            self.req_ids if paged else None,
        )

    def plan(self, device=None, **overrides):
        """The :class:`~rocm_mla.ops.SparsePlan` of :meth:`run`'s call (``overrides``: num_splits,
        config, batch_invariant, kv_cache_dtype, backend, ... as
        :func:`~rocm_mla.ops.plan_sparse_attention` takes them)."""
        from ..ops import plan_sparse_attention

        sizes = dict(num_rows=self.shape.T, topk=self.shape.K, paged=self.shape.mode == "paged")
        return plan_sparse_attention(**self._plan_kw(device, sizes, overrides))

    def reference(self, rows: int | None = None, *, i: int = 0):
        """(out [rows', N, 512], lse [rows', N]) float32 of the first ``rows`` rows (all: None),
        from cache copy i."""
        from ..reference import mla_sparse_attention_ref

        r = self.shape.T if rows is None else min(rows, self.shape.T)
        paged = self.shape.mode == "paged"
        return mla_sparse_attention_ref(
            self.q_nope[:r],
            self.q_pe[:r],
            self.paged.caches[i],
            self.topk_indices(i)[:r],
            self.paged.tables[i] if paged else None,
            self.req_ids[:r] if paged else None,
            self.sm_scale,
            self.k_scale,
        )


def positions_to_slots(positions, block_table, req_ids, block_size: int) -> torch.Tensor:
    """``[T, K]`` int32 global slots (page x block_size + offset) of request-local positions; -1
    stays -1 (what vLLM's convert kernel makes, for the slot mode)."""
    pos = positions.long()
    T = pos.shape[0]
    req = req_ids[:T].long()[:, None].expand_as(pos)
    ok = pos >= 0
    p = torch.where(ok, pos, 0)
    page = block_table.long()[req, p // block_size] if pos.numel() else torch.zeros_like(pos)
    return torch.where(ok, page * block_size + p % block_size, -1).to(torch.int32)


def _lists(shape: SparseShape, g: torch.Generator, device, holes: float, dups: float) -> torch.Tensor:
    """``[T, K]`` int32: each row's K distinct visible positions in random order (all of them, then
    -1, when fewer are visible), then ``holes`` / ``dups`` of the entries -1 / repeats."""
    K = shape.K
    out = torch.full((shape.T, K), -1, dtype=torch.int32, device=device)
    t0 = 0
    for n, r in zip(shape.lens, shape.rows):
        for c0 in range(0, r, 256):  # rows in chunks: [rows, n] random keys
            c1 = min(r, c0 + 256)
            vis = n - r + 1 + torch.arange(c0, c1, device=g.device)  # keys each row sees
            keys = torch.rand((c1 - c0, n), generator=g, device=g.device)
            keys = keys.masked_fill(torch.arange(n, device=g.device)[None, :] >= vis[:, None], 2.0)
            take = min(K, n)
            pos = keys.argsort(dim=1)[:, :take]
            pos = torch.where(torch.arange(take, device=g.device)[None, :] < vis[:, None], pos, -1)
            out[t0 + c0 : t0 + c1, :take] = pos.to(device=device, dtype=torch.int32)
        t0 += r
    if K and shape.T and (holes or dups):
        u = torch.rand((shape.T, K), generator=g, device=g.device).to(device)
        src = torch.randint(0, K, (shape.T, K), generator=g, device=g.device).to(device)
        rep = out.gather(1, src.long())
        out = torch.where(u < dups, rep, out)
        out = torch.where((u >= dups) & (u < dups + holes), torch.full_like(out, -1), out)
    return out


def make_inputs(
    shape: SparseShape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int = 0,
    gen: torch.Generator | None = None,
    holes: float = 0.0,
    dups: float = 0.0,
    req_pad: int = 3,
    **kw,
) -> SparseInputs:
    """Fresh random inputs of ``shape`` (see the module docstring), from ``gen`` or a generator of
    ``seed`` on ``device``.

    holes / dups: fractions of the entries set to -1 / to a repeat of another entry of the row.
    req_pad: entries past T in req_id_per_token (vLLM pads it). ``kw``: the keywords of
    :func:`rocm_mla.cases.decode.latent_tensors` (copies, k_scale, fp8, the q / out / lse layouts,
    spare_pages, spare_cols, unused, guard, outliers), as decode's make_inputs takes them; copies
    share the lists (positions, so they hold for every copy).
    """
    device, g = device_generator(device, seed, gen)
    parts = latent_tensors(
        shape.lens, shape.block, shape.fp8, shape.T, shape.N, dtype=dtype, device=device, gen=g, **kw
    )
    positions = _lists(shape, g, device, holes, dups)
    return SparseInputs(shape, dtype, positions=positions, req_ids=row_requests(shape.rows, req_pad, device), **parts)
