"""gather_context_chunk (context_gather): every backend against the float32 reference, the
reference against a plain loop over vLLM's chunk indexing, block sizes 1/16/64, fp8 caches,
strided caches and destinations, empty chunks, bad input. Bad index values: test_context_gather_memory_safety.py."""

from __future__ import annotations

import pytest
import torch
from _util import (
    DEVICE,
    DTYPES,
    HAS_GPU,
    SENTINEL,
    assert_close,
    backends,
    outside_untouched,
    poisoned_view,
    raises_naming,
)

from rocm_mla.ops import gather_context_chunk
from rocm_mla.reference import context_gather_ref

F32 = torch.float32
NAN = float("nan")
GATHER_BACKENDS = [b for b in backends() if b != "hip"]  # no HIP kernel
# The Triton CPU interpreter has no e4m3fnuz (gfx942's kind): the reference covers it on CPU.
FP8_KINDS = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def _i32(x):
    return torch.tensor(x, dtype=torch.int32, device=DEVICE)


class Chunk:
    """One context chunk as vLLM plans it: request i has ``ctx[i]`` cached tokens, of which this
    chunk covers positions ``[starts[i], starts[i] + rows[i])``. Pages are handed out shuffled,
    ``spare`` extra pages (and every slot past a request's context) hold NaN; the block table has
    ``spare_cols`` extra columns pointing at a NaN page."""

    def __init__(self, ctx, starts, rows, bs, dtype=F32, *, fp8=None, spare=2, spare_cols=1, seed=0, block_pad=0):
        g = torch.Generator().manual_seed(seed)
        self.bs, self.R = bs, len(ctx)
        nblk = [-(-c // bs) for c in ctx]
        self.nb = sum(nblk) + spare
        # The cache: NaN everywhere, then each request's context rows (fresh random values).
        # block_pad: extra elements after each page (a non-contiguous block stride).
        base = torch.full((self.nb, bs * 576 + block_pad), NAN)
        cache32 = base[:, : bs * 576].view(self.nb, bs, 576)
        perm = torch.randperm(self.nb, generator=g)
        nan_page = int(perm[-1]) if spare else 0
        bt = torch.full((self.R, max(nblk + [0]) + spare_cols), nan_page, dtype=torch.int32)
        k = 0
        for i, c in enumerate(ctx):
            bt[i, : nblk[i]] = perm[k : k + nblk[i]].int()
            k += nblk[i]
            tok = torch.arange(c)
            cache32[bt[i, tok // bs].long(), tok % bs] = torch.randn(c, 576, generator=g) * 2
        kind = fp8 or dtype
        self.cache = base.to(kind).to(DEVICE)[:, : bs * 576].view(self.nb, bs, 576)
        self.block_table = bt.to(DEVICE)
        self.starts = _i32(list(starts))
        self.cu = _i32([sum(rows[:i]) for i in range(self.R + 1)])
        self.T = sum(rows)
        self.t2s = _i32([i for i, n in enumerate(rows) for _ in range(n)] + [0] * 3)  # vLLM pads it
        self.k_scale = torch.tensor([0.25], device=DEVICE) if fp8 else None
        self.ctx, self.rows, self.start_list = ctx, rows, starts

    def expected(self):
        """Row by row from the definition (independent of the reference's vectorised indexing)."""
        out = []
        cache = self.cache.view(torch.uint8) if self.cache.element_size() == 1 else self.cache
        for i, n in enumerate(self.rows):
            for j in range(n):
                pos = self.start_list[i] + j
                row = cache[int(self.block_table[i, pos // self.bs]), pos % self.bs]
                row = row.view(self.cache.dtype).float()
                out.append(row * (0.25 if self.k_scale is not None else 1.0))
        return torch.stack(out) if out else torch.empty(0, 576, device=DEVICE)

    def dst(self, dtype, pad=0):
        """(base, dst): dst is [T, 576] inside a NaN-filled base with ``pad`` extra elements per row."""
        return poisoned_view((self.T, 576), dtype, pad_last=pad)

    def args(self, dst):
        """gather_context_chunk's arguments for this chunk, by name."""
        return dict(
            kv_cache=self.cache,
            block_table=self.block_table,
            cu_seq_lens=self.cu,
            starts=self.starts,
            token_to_seq=self.t2s,
            dst=dst,
        )

    def run(self, dst, backend=None, **kw):
        """gather_context_chunk on this chunk into dst (k_scale: the chunk's); ``kw`` overrides any argument."""
        return gather_context_chunk(**{**self.args(dst), "k_scale": self.k_scale, **kw}, backend=backend)

    def run_poisoned(self, dtype, pad, backend):
        """Gather into a fresh poisoned dst (``pad`` elements past each row): the op returns dst, every
        row is written (no poison left, no NaN slot read), nothing past a row is written. Returns dst."""
        base, dst = self.dst(dtype, pad)
        assert self.run(dst, backend) is dst
        assert not torch.isnan(dst.float()).any(), "a row was not written (or read a NaN slot)"
        assert outside_untouched(base, dst), "wrote past a dst row"
        return dst

    def ref(self):
        return context_gather_ref(self.cache, self.block_table, self.cu, self.starts, self.t2s, self.T, self.k_scale)


# (context lengths, chunk starts, chunk rows): a request split over chunks (start > 0), one read
# to its end, a 1-token context, lengths that are not multiples of the block.
CASES = {
    "one_request": ([37], [0], [37]),
    "three_requests": ([50, 1, 23], [17, 0, 0], [33, 1, 23]),
    "continued": ([70, 9], [64, 0], [6, 5]),
    "single_token": ([1], [0], [1]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_reference_matches_definition(case, bs):
    ch = Chunk(*CASES[case], bs, seed=bs)
    want = ch.expected()
    got = ch.ref()
    assert not torch.isnan(got).any()
    assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_matches_reference(backend, dtype, case, bs):
    ch = Chunk(*CASES[case], bs, dtype=dtype, seed=bs + 1)
    dst = ch.run_poisoned(dtype, 8, backend)
    # A gather: exact in the cache's own dtype.
    assert_close(dst.float(), ch.ref(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_cache_dequantised(backend, fp8, dtype):
    if backend == "triton" and fp8 == torch.float8_e4m3fnuz and not HAS_GPU:
        pytest.skip("the Triton CPU interpreter has no e4m3fnuz")
    ch = Chunk(*CASES["three_requests"], 16, fp8=fp8, seed=3)
    dst = ch.run_poisoned(dtype, 4, backend)
    want = ch.expected()
    assert_close(ch.ref(), want, rtol=0, atol=0)
    # stored x k_scale in float32, rounded once to dst's dtype
    assert_close(dst, want.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
def test_strided_cache_and_dst(backend):
    """A cache whose pages are not adjacent (block stride > block_size x 576) and dst rows of a
    wider buffer (the workspace may be a slice)."""
    ch = Chunk(*CASES["three_requests"], 16, seed=5, block_pad=40)
    assert not ch.cache.is_contiguous()
    dst = ch.run_poisoned(F32, 100, backend)
    assert_close(dst, ch.expected(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
def test_empty_chunk_and_empty_table(backend):
    """T = 0 writes nothing; R = 0 requests (an empty block table) with T = 0; an empty cache
    with rows whose pages are all outside it (every row NaN)."""
    ch = Chunk(*CASES["one_request"], 16)
    dst = torch.empty(0, 576, device=DEVICE)
    assert ch.run(dst, backend) is dst
    ch.run(
        torch.empty(0, 576, device=DEVICE),
        backend,
        block_table=torch.empty(0, 4, dtype=torch.int32, device=DEVICE),
        cu_seq_lens=_i32([0]),
        starts=_i32([]),
        token_to_seq=_i32([]),
    )
    dst = torch.zeros(ch.T, 576, device=DEVICE)  # finite: the rows must be written NaN, not left as they are
    ch.run(dst, backend, kv_cache=torch.empty(0, 16, 576, device=DEVICE))
    assert torch.isnan(dst).all()


@pytest.mark.parametrize("backend", GATHER_BACKENDS)
def test_rows_read_only_from_their_slots(backend):
    """Overwrite every cache slot the chunk does not cover with a finite sentinel: the result is
    unchanged (nothing else is read), and the cache itself is unchanged (nothing is written)."""
    ch = Chunk(*CASES["continued"], 16, seed=7)
    _, dst = ch.dst(F32)
    ch.run(dst, backend)
    first = dst.clone()
    covered = torch.zeros(ch.nb, ch.bs, dtype=torch.bool, device=DEVICE)
    for i, n in enumerate(ch.rows):
        pos = torch.arange(ch.start_list[i], ch.start_list[i] + n, device=DEVICE)
        covered[ch.block_table[i, pos // ch.bs].long(), pos % ch.bs] = True
    ch.cache[~covered] = SENTINEL
    snap = ch.cache.clone()
    _, dst2 = ch.dst(F32)
    ch.run(dst2, backend)
    assert torch.equal(dst2, first)
    assert torch.equal(ch.cache, snap)


def test_default_dispatch_and_forced_backend(monkeypatch):
    from rocm_mla.ops._dispatch import select

    # GPU: the config's backend_order (Triton only); CPU: conftest turned the interpreter on.
    assert select("context_gather", DEVICE) == "triton"
    ch = Chunk(*CASES["three_requests"], 16, seed=9)
    monkeypatch.setenv("ROCM_MLA_BACKEND_CONTEXT_GATHER", "reference")
    _, dst = ch.dst(F32)
    ch.run(dst)
    assert_close(dst, ch.expected(), rtol=0, atol=0)
    # There is no HIP kernel: forcing it raises (where the extension loads: "no HIP kernel";
    # elsewhere the dispatcher's "cannot run").
    with pytest.raises(RuntimeError, match="no HIP kernel for context_gather|'hip' was requested but cannot run"):
        ch.run(dst, "hip")


# ---------------------------------------------------------------- bad input
def _args():
    ch = Chunk(*CASES["three_requests"], 16, seed=11)
    return ch.args(ch.dst(F32)[1])


@pytest.mark.parametrize(
    "change,exc,words",
    [
        (dict(dst=torch.zeros(57, 512)), ValueError, ["dst", "[T, 576]", "(57, 512)"]),
        (dict(dst=torch.zeros(57, 576, dtype=torch.int32)), TypeError, ["dst", "int32"]),
        (dict(dst=torch.zeros(576, 57).t()), ValueError, ["dst", "stride 1", "(1, 57)"]),
        (dict(kv_cache=torch.zeros(4, 16, 512)), ValueError, ["kv_cache", "576", "(4, 16, 512)"]),
        (dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.uint8)), TypeError, ["kv_cache", "uint8"]),
        (dict(kv_cache=torch.zeros(4, 0, 576)), ValueError, ["kv_cache", "block_size >= 1"]),
        (dict(kv_cache=torch.zeros(4, 576, 16).transpose(1, 2)), ValueError, ["kv_cache", "stride 1"]),
        (dict(block_table=torch.zeros(3, 4)), TypeError, ["block_table", "int32 or int64", "float32"]),
        (dict(block_table=torch.zeros(4, 3, dtype=torch.int32).t()), ValueError, ["block_table", "stride 1"]),
        (dict(cu_seq_lens=torch.zeros(3, dtype=torch.int32)), ValueError, ["cu_seq_lens", "[R + 1]", "(4,)", "(3,)"]),
        (dict(starts=torch.zeros(2, dtype=torch.int32)), ValueError, ["starts", "[R]", "(3,)", "(2,)"]),
        (dict(token_to_seq=torch.zeros(50, dtype=torch.int32)), ValueError, ["token_to_seq", "57 rows", "(50,)"]),
        (dict(token_to_seq=torch.zeros(120, dtype=torch.int32)[::2]), ValueError, ["token_to_seq", "stride 1"]),
        (dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.float8_e4m3fn)), TypeError, ["k_scale", "fp8", "None"]),
        (
            dict(kv_cache=torch.zeros(4, 16, 576, dtype=torch.float8_e4m3fn), k_scale=torch.ones(2)),
            ValueError,
            ["k_scale", "1-element", "(2,)"],
        ),
        (dict(kv_cache=[1]), TypeError, ["kv_cache", "torch.Tensor", "list"]),
    ],
)
def test_bad_input_names_argument(change, exc, words):
    args = _args()
    args.update({k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in change.items()})
    msg = raises_naming(exc, lambda: gather_context_chunk(**args), *words)
    assert msg.startswith("context_gather: ")


def test_overlap_and_devices_named():
    args = _args()
    with pytest.raises(ValueError, match="dst: expected no memory in common with kv_cache"):
        gather_context_chunk(**{**args, "dst": args["kv_cache"].view(-1, 576)[:57]})
    meta = torch.empty(args["starts"].shape, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="starts: expected device"):
        gather_context_chunk(**{**args, "starts": meta})
