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
    PAGE_GUARD_CFGS,
    assert_no_sync_and_capturable,
    backends,
    raises_naming,
)
from decode_case import BACKENDS, GuardedCase

from rocm_mla.cases import decode
from rocm_mla.cases.decode import call_decode

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("q_len,bs", [(1, 16), (2, 5), (1, 1)])
def test_decode_bad_lengths_and_unused_entries(backend, splits, q_len, bs):
    """seq_len past the table's capacity is clamped to it (not an error, not a read past the
    table); a negative seq_len sees no key; garbage in unused block-table entries is never read."""
    if backend == "reference" and splits is not None:
        pytest.skip("the reference has no splits")
    case = GuardedCase((9, 20, 7, 12), 3, q_len, bs, spare_cols=2, seed=bs)
    max_blocks = case.block_table.shape[1]
    cap = max_blocks * bs
    used0 = math.ceil(9 / bs)  # request 0: garbage past its used entries
    case.seq_lens[1] = cap  # the reference of the clamped length and of clean unused entries
    case.seq_lens[2] = 0
    case.block_table[0, used0:] = 0
    want = case.reference()
    case.seq_lens[1] = cap + 1000  # request 1: length past the capacity -> clamped
    case.seq_lens[2] = -5  # request 2: negative -> no key
    garbage = [-1, 1 << 30, -(1 << 31), case.nb] * max_blocks
    case.block_table[0, used0:] = torch.tensor(garbage[: max_blocks - used0], dtype=torch.int32)
    case.run(backend, num_splits=splits)
    case.check(want)
    rows2 = slice(2 * q_len, 3 * q_len)
    assert bool((case.lse.view[rows2] == -math.inf).all()) and bool((case.out.view[rows2] == 0).all())


@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_reference_bad_page_makes_its_request_nan(q_len):
    """The spec: a used page outside [0, num_blocks) -- no wrap of -1 to the last page -- NaNs
    every row of its request and nothing else."""
    case = GuardedCase((17, 30, 5), 4, q_len, 8, seed=4)
    want = case.reference()
    case.block_table[1, 2] = -1
    case.block_table[2, 0] = case.nb
    case.run("reference")
    case.check(want, nan_requests=(1, 2))
    o, lse = case.reference()  # the reference function itself, too
    assert torch.isnan(o[q_len:]).all() and torch.isnan(lse[q_len:]).all()
    # request 0 alone, as before: bitwise (the reference computes each request on its own)
    assert torch.equal(o[:q_len], want[0][:q_len]) and torch.equal(lse[:q_len], want[1][:q_len])


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
    case = GuardedCase((21, 40, 6), 4, q_len, bs, seed=6)
    want = case.reference()
    page = {-1: -1, "nb": case.nb, "nb+1": case.nb + 1}[bad]
    case.block_table[1, 0] = page  # the first page: every row of the request sees it
    case.run("triton", num_splits=splits, config=cfg)
    case.check(want, nan_requests=(1,))


_HUGE_PAGE_CHILD = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.getcwd())
import torch
from rocm_mla.cases import decode
case = decode.make_inputs(
    decode.DecodeShape(N=4, block=16, lens=(20, 20)), dtype=torch.float32, unused="randn", q_layout="separate"
)
case.block_table[1, 0] = int(sys.argv[1])
out, lse = case.run(backend="triton", num_splits=int(sys.argv[2]), out=None, lse=None)
nan1 = bool(torch.isnan(out[1]).all() and torch.isnan(lse[1]).all())
bad0 = case.mismatch(out[:1], lse[:1], requests=1)
print(bad0)
sys.exit(0 if nan1 and not bad0 else 3)
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
        assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])


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
            case = GuardedCase(lens, N, 1, bs, spare_pages=spare_pages, spare_cols=spare_cols)
            if spare_cols == 0:  # no columns at all: the lengths are clamped to capacity 0
                case.paged.tables[0] = case.block_table[:, :0]
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
    case = GuardedCase((9, 3), 4, 1, 16)
    rows, N = 2, 4
    kvflat = case.kv.view(-1)
    on_pages = kvflat[: rows * N * 512].view(rows, N, 512)  # out on cache pages a request reads
    raises_naming(ValueError, lambda: case.run("reference", out=on_pages), "out", "kv_cache", "no memory in common")
    raises_naming(ValueError, lambda: case.run("reference", out=case.q_nope), "out", "q_nope")
    lse_in_out = case.out.base[case.out.guard : case.out.guard + rows * N].view(rows, N)
    raises_naming(ValueError, lambda: case.run("reference", lse=lse_in_out), "out", "lse")
    raises_naming(ValueError, lambda: case.run("reference", lse=case.q_pe[:, :, 0]), "lse", "q_pe")
    bt_buf = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    raises_naming(
        ValueError,
        lambda: call_decode(
            case.q_nope,
            case.q_pe,
            case.kv,
            bt_buf[: 2 * case.block_table.shape[1]].view(2, -1),
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
        lambda: call_decode(
            case.q_nope,
            case.q_pe,
            case.kv.to(torch.float8_e4m3fn),
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
    case = GuardedCase((5,), 2, 1, 16)

    def fn():
        return call_decode(case.q_nope, case.q_pe, case.kv, case.block_table, case.seq_lens, sm_scale=bad)

    raises_naming(exc, fn, "mla_decode: sm_scale", *words)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_gpu_decode_bad_pages(kv, bs):
    """The real decode kernel (its page guard) on bad pages, huge ones included, every split
    choice; run under compute-sanitizer memcheck."""
    for splits in (None, 1, 4):
        for page in ("-1", "nb", (1 << 31) - 1, -(1 << 31)):
            case = GuardedCase((300, 77, 1000, 5), 16, 1, bs, dtype=torch.bfloat16, fp8=kv == "fp8", seed=bs)
            want = case.reference()
            case.block_table[2, 3] = {"-1": -1, "nb": case.nb}.get(page, page)
            case.run("triton", num_splits=splits)
            case.check(want, nan_requests=(2,))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["qk", "all"])
@pytest.mark.parametrize("N", [16, 128])
def test_gpu_decode_fp8_dots_bad_pages(mode, N):
    """The fp8_dots modes' tiers on bad pages (the guard and the fp8 loads of both dots), one
    split and several: the bad request NaN, the others their rounded reference, no guard byte
    touched; run under compute-sanitizer memcheck."""
    for splits in (None, 4):
        for page in ("nb", -(1 << 31)):
            case = GuardedCase((300, 77, 1000, 5), N, 1, 64, dtype=torch.bfloat16, fp8=True, seed=N)
            want = case.reference(fp8_dots=mode)
            case.block_table[2, 3] = case.nb if page == "nb" else page
            case.run("triton", num_splits=splits, fp8_dots=mode)
            case.check(want, nan_requests=(2,), tol=decode.fp8_dots_bound(mode, torch.bfloat16, "cuda"))


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
    dec = GuardedCase((300, 70, 5), 16, 1, 64, dtype=torch.bfloat16)
    assert_no_sync_and_capturable([lambda: dec.run("triton", max_seq_len=300)], [dec.out, dec.lse])
    dec.paged.check_guards("kv_cache")
