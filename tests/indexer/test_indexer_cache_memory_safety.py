"""indexer_k_cache_write memory safety (the contract in tests/_util.py): slots that are -1, past the
cache or huge write nothing and read nothing, at block sizes 1/16/64 and in both layouts; the cache
inside a sentinel-guarded buffer reaching two blocks past each end; debug names the slot; zero
sizes; overlaps named."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, assert_no_sync_and_capturable, backends, raises_naming

import rocm_mla
from rocm_mla.cases import Guarded, generator
from rocm_mla.reference.indexer import indexer_k_cache_write_ref

CACHE_BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP kernel
F16 = torch.float16
ROW = 132


class CacheCase:
    """T keys (a [T, 128] view of a guarded [T, 192] buffer: row stride 192) and a 0xFF cache of
    ``nb`` blocks of ``bs`` inside a guarded uint8 buffer (sentinel 77 for two blocks past each
    end); slots without repeats. ``expect()`` is the reference's buffer for the slots given."""

    def __init__(self, T, bs, nb, *, dtype=F16, seed=0):
        g = generator(seed, "cpu")
        self.k = Guarded((T, 128), dtype, device=DEVICE, pad_last=64, generator=g)
        fill = torch.full((nb, bs, ROW), 0xFF, dtype=torch.uint8)
        self.cache = Guarded((nb, bs, ROW), torch.uint8, device=DEVICE, fill=fill, guard=2 * bs * ROW + 64)
        self.n = nb * bs
        self.slots = torch.randperm(self.n, generator=g)[:T].to(DEVICE)

    def run(self, slots, **kw):
        rocm_mla.indexer_k_cache_write(self.k.view, self.cache.view, slots, **kw)

    def expect(self, slots, *, shuffled) -> torch.Tensor:
        want = self.cache._snap.clone()
        view = want[self.cache.guard : self.cache.guard + self.cache.view.numel()].view(self.cache.view.shape)
        kind = torch.float8_e4m3fn  # the CPU platform's kind ("fp8")
        if DEVICE.type == "cuda":
            from rocm_mla.cases import platform_fp8

            kind = platform_fp8(DEVICE)
        indexer_k_cache_write_ref(self.k.view, view, slots, fp8_dtype=kind, shuffled=shuffled)
        return want

    def check(self, slots, *, shuffled):
        assert torch.equal(self.cache.base, self.expect(slots, shuffled=shuffled)), "cache bytes"
        self.cache.check("index_cache")
        self.k.check("k")


def _bad(n):
    return [-1, -(1 << 31), -(1 << 40), n, n + 1, (1 << 31) - 1, 1 << 40]


@pytest.mark.parametrize("backend", CACHE_BACKENDS)
@pytest.mark.parametrize("bs,nb,shuffled", [(1, 40, False), (16, 3, True), (16, 3, False), (64, 2, True)])
def test_bad_slots_write_nothing(backend, bs, nb, shuffled):
    """Each bad slot kind in turn on tokens 0, 3 and the last: those tokens write nothing; the rest
    exactly the reference's bytes; not a byte outside the cache (nor of k) changes."""
    c = CacheCase(11, bs, nb, seed=bs)
    for bad in _bad(c.n):
        slots = c.slots.clone()
        slots[[0, 3, 10]] = bad
        c.cache.base.copy_(c.cache._snap)
        c.run(slots, backend=backend, shuffled=shuffled)
        c.check(slots, shuffled=shuffled)
        good = c.expect(slots, shuffled=shuffled)
        none = c.cache._snap
        assert not torch.equal(good, none)  # the good tokens did write


@pytest.mark.parametrize("backend", CACHE_BACKENDS)
def test_every_slot_bad_and_zero_sizes(backend):
    """All slots bad; no tokens; a slot mapping of length 0 with tokens; an empty cache (every slot
    outside): nothing written anywhere."""
    c = CacheCase(7, 16, 2, seed=1)
    c.run(torch.tensor(_bad(c.n), device=DEVICE), backend=backend)
    c.check(torch.full((7,), -1, device=DEVICE), shuffled=True)
    assert torch.equal(c.cache.base, c.cache._snap)
    empty_k = torch.empty(0, 128, dtype=F16, device=DEVICE)
    no_slots = torch.empty(0, dtype=torch.int64, device=DEVICE)
    rocm_mla.indexer_k_cache_write(empty_k, c.cache.view, no_slots, backend=backend)
    c.run(no_slots, backend=backend)
    empty = Guarded((0, 16, ROW), torch.uint8, device=DEVICE, fill=torch.empty(0, 16, ROW, dtype=torch.uint8))
    rocm_mla.indexer_k_cache_write(c.k.view, empty.view, c.slots, backend=backend)
    empty.check("index_cache")
    assert torch.equal(c.cache.base, c.cache._snap)
    c.k.check("k")


@pytest.mark.parametrize("debug", ["kwarg", "env"])
def test_debug_names_slot_index_and_bound(monkeypatch, debug):
    c = CacheCase(9, 16, 2, seed=2)
    kw = {"debug": True} if debug == "kwarg" else {}
    if debug == "env":
        monkeypatch.setenv("ROCM_MLA_DEBUG", "1")
    slots = c.slots.clone()
    slots[4] = c.n + 3
    raises_naming(
        ValueError,
        lambda: c.run(slots, **kw),
        "slot_mapping",
        f"{c.n + 3} at index 4",
        f"< num_blocks x block_size = {c.n}",
    )
    dup = c.slots.clone()
    dup[5] = dup[1]
    raises_naming(ValueError, lambda: c.run(dup, **kw), "slot_mapping", "distinct", "1 repeated")
    assert torch.equal(c.cache.base, c.cache._snap), "debug raised after writing"
    slots[4] = -1
    c.run(slots, **kw)  # -1 is not an error
    c.run(torch.tensor([c.n] * 9, device=DEVICE), debug=False)  # debug off: skipped
    c.check(slots, shuffled=True)


def test_overlaps_named():
    """The cache may not share memory with k or slot_mapping (ValueError naming both)."""
    buf = torch.zeros(4 * 16 * ROW, dtype=torch.uint8, device=DEVICE)
    cache = buf.view(4, 16, ROW)
    k = buf[: 8 * 256].view(F16).view(8, 128)
    slots = torch.arange(8, device=DEVICE)
    raises_naming(ValueError, lambda: rocm_mla.indexer_k_cache_write(k, cache, slots), "index_cache", "k")
    s_in = buf[-64:].view(torch.int64)
    k2 = torch.zeros(8, 128, dtype=F16, device=DEVICE)
    raises_naming(ValueError, lambda: rocm_mla.indexer_k_cache_write(k2, cache, s_in), "index_cache", "slot_mapping")
    overlapping = torch.zeros(16 * ROW + 8, dtype=torch.uint8, device=DEVICE).as_strided((2, 16, ROW), (8, ROW, 1))
    raises_naming(
        ValueError, lambda: rocm_mla.indexer_k_cache_write(k2, overlapping, slots), "index_cache", "contiguous"
    )


@pytest.mark.gpu
def test_gpu_bad_slots_write_nothing():
    for bs, nb, shuffled in ((1, 40, False), (16, 3, True), (64, 2, True)):
        test_bad_slots_write_nothing("triton", bs, nb, shuffled)
    c = CacheCase(300, 64, 6, dtype=torch.bfloat16, seed=3)
    slots = c.slots.clone()
    slots[::7] = -1
    slots[1::7] = c.n + torch.arange(slots[1::7].numel(), device=DEVICE)
    c.run(slots, backend="triton")
    torch.cuda.synchronize()
    c.check(slots, shuffled=True)
    test_every_slot_bad_and_zero_sizes("triton")


@pytest.mark.gpu
def test_gpu_checks_no_sync_and_capturable():
    """indexer_k_cache_write (its overlap checks run): no host sync, capturable."""
    c = CacheCase(64, 64, 2, dtype=torch.bfloat16, seed=4)
    assert_no_sync_and_capturable([lambda: c.run(c.slots, backend="triton")], [c.cache, c.k])
