"""mla_decode memory safety (the contract in tests/_util.py): bad lengths and block-table entries
(each guard form of the kernel), huge page ids, zero sizes, overlaps and scales named."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _util import (
    BAD_SCALES,
    DEVICE,
    F32,
    PAGE_GUARD_CFGS,
    Guarded,
    assert_close,
    assert_no_sync_and_capturable,
    backends,
    raises_naming,
    seeded_generator,
    seeded_randn,
)
from decode_case import BACKENDS, FP8

import rocm_mla
from rocm_mla.reference import mla_decode_ref

ROOT = Path(__file__).resolve().parents[2]


class DecodeCase:
    """A decode batch with a sentinel-guarded paged cache (random values; guards reach two pages
    past each end), a shuffled block table, and guarded out / lse that start random (finite), so
    that a request's NaN rows are the kernel's and an unwritten row fails the comparison."""

    def __init__(self, lens, N, q_len, bs, *, dtype=F32, spare_pages=2, spare_cols=1, seed=0):
        g = seeded_generator(seed)
        self.B, self.N, self.q_len, self.bs, self.dtype = len(lens), N, q_len, bs, dtype
        nblk = [max(0, math.ceil(L / bs)) for L in lens]
        self.nb = sum(nblk) + spare_pages
        self.kv = Guarded((self.nb, bs, 576), dtype, guard=2 * bs * 576 + 64, generator=g)
        perm = torch.randperm(self.nb, generator=g)
        self.max_blocks = max(nblk + [0]) + spare_cols
        bt = torch.empty(self.B, self.max_blocks, dtype=torch.int32)
        k = 0
        for b, n in enumerate(nblk):
            bt[b, :n] = perm[k : k + n].int()
            bt[b, n:] = perm[(sum(nblk) + b) % self.nb].int() if self.nb else 0
            k += n
        self.block_table = bt.to(DEVICE)
        self.seq_lens = torch.tensor(list(lens), dtype=torch.int32, device=DEVICE)
        rows = self.B * q_len
        self.q_nope = seeded_randn((rows, N, 512), dtype, seed + 1)
        self.q_pe = seeded_randn((rows, N, 192), dtype, seed + 2)[..., 128:]
        self.out = Guarded((rows, N, 512), dtype, fill="randn", pad_last=8, generator=g)
        self.lse = Guarded((rows, N), F32, fill="randn", pad_last=1, generator=g)
        self.sm_scale = 192**-0.5

    def run(self, backend, **kw):
        kw.setdefault("out", self.out.view)
        kw.setdefault("lse", self.lse.view)
        return rocm_mla.mla_decode(
            self.q_nope,
            self.q_pe,
            self.kv.view,
            self.block_table,
            self.seq_lens,
            sm_scale=self.sm_scale,
            backend=backend,
            **kw,
        )

    def ref(self, block_table=None, seq_lens=None):
        return mla_decode_ref(
            self.q_nope,
            self.q_pe,
            self.kv.view,
            self.block_table if block_table is None else block_table,
            self.seq_lens if seq_lens is None else seq_lens,
            self.sm_scale,
        )

    def check(self, want, *, nan_requests=(), tol=1e-4):
        """Requests in nan_requests: every row NaN in out and lse; the others as ``want``."""
        ro, rl = want
        out, lse = self.out.view.float(), self.lse.view
        for b in range(self.B):
            r = slice(b * self.q_len, (b + 1) * self.q_len)
            if b in nan_requests:
                assert torch.isnan(out[r]).all() and torch.isnan(lse[r]).all(), f"request {b}: not NaN"
            else:
                assert not torch.isnan(out[r]).any(), f"request {b}: NaN in out (leaked from another request)"
                assert_close(out[r], ro[r], rtol=tol, atol=tol)
                assert_close(lse[r], rl[r], rtol=0, atol=1e-3)
        self.out.check("out")
        self.lse.check("lse")
        self.kv.check("kv_cache")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("q_len,bs", [(1, 16), (2, 5), (1, 1)])
def test_decode_bad_lengths_and_unused_entries(backend, splits, q_len, bs):
    """seq_len past the table's capacity is clamped to it (not an error, not a read past the
    table); a negative seq_len sees no key; garbage in unused block-table entries is never read."""
    if backend == "reference" and splits is not None:
        pytest.skip("the reference has no splits")
    case = DecodeCase((9, 20, 7, 12), 3, q_len, bs, spare_cols=2, seed=bs)
    cap = case.max_blocks * bs
    clean_lens = case.seq_lens.clone()
    clean_lens[1] = cap  # request 1: length past the capacity -> clamped
    case.seq_lens[1] = cap + 1000
    case.seq_lens[2] = -5  # request 2: negative -> no key
    clean_lens[2] = 0
    used0 = math.ceil(9 / bs)  # request 0: garbage past its used entries
    garbage = [-1, 1 << 30, -(1 << 31), case.nb] * case.max_blocks
    case.block_table[0, used0:] = torch.tensor(garbage[: case.max_blocks - used0], dtype=torch.int32)
    clean_bt = case.block_table.clone()
    clean_bt[0, used0:] = 0
    want = case.ref(clean_bt, clean_lens)
    case.run(backend, num_kv_splits=splits)
    case.check(want)
    rows2 = slice(2 * q_len, 3 * q_len)
    assert bool((case.lse.view[rows2] == -math.inf).all()) and bool((case.out.view[rows2] == 0).all())


@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_reference_bad_page_makes_its_request_nan(q_len):
    """The spec: a used page outside [0, num_blocks) -- no wrap of -1 to the last page -- NaNs
    every row of its request and nothing else."""
    case = DecodeCase((17, 30, 5), 4, q_len, 8, seed=4)
    want = case.ref()
    case.block_table[1, 2] = -1
    case.block_table[2, 0] = case.nb
    case.run("reference")
    case.check(want, nan_requests=(1, 2))
    o, lse = case.ref()  # the reference function itself, too
    assert torch.isnan(o[q_len:]).all() and torch.isnan(lse[q_len:]).all()
    assert_close(o[:q_len], want[0][:q_len])


@pytest.mark.parametrize("cfg", PAGE_GUARD_CFGS)
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("q_len,bs,bad", [(1, 16, -1), (1, 16, "nb"), (2, 5, "nb+1"), (1, 1, -1), (3, 32, "nb")])
def test_decode_kernel_bad_page_makes_its_request_nan(cfg, splits, q_len, bs, bad):
    """Triton, either form of the page guard: a used block-table entry just outside the cache
    (within the guard) makes its request NaN -- every split and row block that reads it -- and
    reads nothing outside kv_cache (a read of the sentinel would give a finite result); other
    requests are unaffected."""
    if "triton" not in backends():
        pytest.skip("Triton unavailable")
    case = DecodeCase((21, 40, 6), 4, q_len, bs, seed=6)
    want = case.ref()
    page = {-1: -1, "nb": case.nb, "nb+1": case.nb + 1}[bad]
    case.block_table[1, 0] = page  # the first page: every row of the request sees it
    case.run("triton", num_kv_splits=splits, config=cfg)
    case.check(want, nan_requests=(1,))


_HUGE_PAGE_CHILD = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.getcwd())
import torch, rocm_mla
g = torch.Generator().manual_seed(0)
kv = torch.randn(4, 16, 576, generator=g)
bt = torch.tensor([[0, 1], [int(sys.argv[1]), 2]], dtype=torch.int32)
sl = torch.tensor([20, 20], dtype=torch.int32)
q, qp = torch.randn(2, 4, 512, generator=g), torch.randn(2, 4, 64, generator=g)
out, lse = rocm_mla.mla_decode(q, qp, kv, bt, sl, sm_scale=0.1, backend="triton", num_kv_splits=int(sys.argv[2]))
ok = bool(torch.isnan(out[1]).all() and torch.isnan(lse[1]).all() and not torch.isnan(out[0]).any())
sys.exit(0 if ok else 3)
"""


@pytest.mark.parametrize("page", [(1 << 31) - 1, -(1 << 31)])
def test_decode_kernel_huge_page_in_child(page):
    """A huge page id read unguarded is a segfault of the interpreter: run it in a child."""
    if DEVICE.type != "cpu":
        pytest.skip("the GPU version is test_gpu_decode_bad_pages")
    for splits in (1, 2):
        r = subprocess.run(
            [sys.executable, "-c", _HUGE_PAGE_CHILD, str(page), str(splits)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_zero_sizes(backend):
    """B = 0, N = 0, a table of 0 columns (every row sees no key) and a cache of 0 pages with
    zero lengths: with and without out / lse / workspace."""
    for lens, N, bs, spare_pages, spare_cols in (
        ((), 4, 16, 2, 1),
        ((5, 3), 0, 16, 2, 1),
        ((5, 3), 4, 16, 2, 0),
        ((0, 0), 4, 16, 0, 1),
    ):
        for given in (True, False):
            case = DecodeCase(lens, N, 1, bs, spare_pages=spare_pages, spare_cols=spare_cols)
            if spare_cols == 0:  # no columns at all: the lengths are clamped to capacity 0
                case.block_table = case.block_table[:, :0]
                assert case.block_table.shape[1] == 0
            kw = {} if given else {"out": None, "lse": None}
            ws = torch.empty(4096, device=DEVICE) if backend == "triton" else None
            out, lse = case.run(backend, workspace=ws, **kw)
            assert out.shape == (len(lens), N, 512) and lse.shape == (len(lens), N)
            if out.numel():
                assert bool((out == 0).all()) and bool((lse == -math.inf).all())
            case.out.check("out")
            case.lse.check("lse")


def test_decode_overlaps_rejected_naming_both():
    case = DecodeCase((9, 3), 4, 1, 16)
    rows, N = 2, 4
    kvflat = case.kv.view.view(-1)
    on_pages = kvflat[: rows * N * 512].view(rows, N, 512)  # out on cache pages a request reads
    raises_naming(ValueError, lambda: case.run("reference", out=on_pages), "out", "kv_cache", "no memory in common")
    raises_naming(ValueError, lambda: case.run("reference", out=case.q_nope), "out", "q_nope")
    lse_in_out = case.out.base[case.out.guard : case.out.guard + rows * N].view(rows, N)
    raises_naming(ValueError, lambda: case.run("reference", lse=lse_in_out), "out", "lse")
    raises_naming(ValueError, lambda: case.run("reference", lse=case.q_pe[:, :, 0]), "lse", "q_pe")
    bt_buf = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: rocm_mla.mla_decode(
            case.q_nope,
            case.q_pe,
            case.kv.view,
            bt_buf[: 2 * case.max_blocks].view(2, -1),
            case.seq_lens,
            sm_scale=0.1,
            lse=bt_buf[2:10].view(torch.float32).view(2, 4),
        ),
        "lse",
        "block_table",
    )
    raises_naming(
        ValueError, lambda: case.run("reference", workspace=case.out.base[case.out.guard :]), "out", "workspace"
    )
    raises_naming(ValueError, lambda: case.run("reference", workspace=kvflat), "workspace", "kv_cache")
    lse = torch.ones(rows, N, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: rocm_mla.mla_decode(
            case.q_nope,
            case.q_pe,
            case.kv.view.to(torch.float8_e4m3fn),
            case.block_table,
            case.seq_lens,
            sm_scale=0.1,
            k_scale=lse.view(-1)[3:4],
            lse=lse,
        ),
        "lse",
        "k_scale",
    )


@pytest.mark.parametrize("bad,exc,words", BAD_SCALES)
def test_decode_scale_validated(bad, exc, words):
    """sm_scale: one rule (Checker.scale) for decode and prefill, the same messages
    (tests/prefill/test_prefill_memory_safety.py: test_prefill_scale_validated)."""
    case = DecodeCase((5,), 2, 1, 16)

    def fn():
        return rocm_mla.mla_decode(case.q_nope, case.q_pe, case.kv.view, case.block_table, case.seq_lens, sm_scale=bad)

    raises_naming(exc, fn, "mla_decode: sm_scale", *words)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_gpu_decode_bad_pages(kv, bs):
    """The real decode kernel (its page guard) on bad pages, huge ones included, every split
    choice; run under compute-sanitizer memcheck."""
    for splits in (None, 1, 4):
        for page in ("-1", "nb", (1 << 31) - 1, -(1 << 31)):
            case = DecodeCase((300, 77, 1000, 5), 16, 1, bs, dtype=torch.bfloat16, seed=bs)
            want = case.ref()
            case.block_table[2, 3] = {"-1": -1, "nb": case.nb}.get(page, page)
            kw = {}
            if kv == "fp8":
                case.kv = Guarded((case.nb, bs, 576), FP8, fill=case.kv.view.float().to(FP8), guard=2 * bs * 576 + 64)
                want = case.ref()
                case.block_table[2, 3] = {"-1": -1, "nb": case.nb}.get(page, page)
                kw = {"k_scale": 1.0}
            case.run("triton", num_kv_splits=splits, **kw)
            case.check(want, nan_requests=(2,), tol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_gpu_decode_bad_lengths_zero_sizes(bs):
    """Clamped lengths, garbage in unused entries, zero sizes: on the real kernel (memcheck)."""
    for splits in (None, 1, 3):
        test_decode_bad_lengths_and_unused_entries("triton", splits, 1, bs)
    test_decode_zero_sizes("triton")


@pytest.mark.gpu
def test_gpu_decode_checks_no_sync_and_capturable():
    """mla_decode with caller-given out / lse (the overlap checks run): no host sync, capturable."""
    dec = DecodeCase((300, 70, 5), 16, 1, 64, dtype=torch.bfloat16)
    assert_no_sync_and_capturable([lambda: dec.run("triton", max_seq_len=300)], [dec.out, dec.lse, dec.kv])
