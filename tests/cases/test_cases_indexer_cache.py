"""rocm_mla.cases.indexer_cache: the inputs (k a column slice, special rows, bad slots, a 0xFF
cache with a padded block stride), the tolerance table, and a check that catches a wrong code, a
wrong scale and a stray byte."""

from __future__ import annotations

import pytest
import torch

from rocm_mla.cases import Bound, CaseMismatch, indexer_cache

F16, F32 = torch.float16, torch.float32


def test_inputs():
    s = indexer_cache.IndexerCacheShape(37, 16, kind="fp8_e4m3fnuz")
    c = indexer_cache.make_inputs(s, dtype=F16, seed=1, block_pad=1)
    assert c.k.shape == (37, 128) and c.k.stride() == (192, 1) and c.fp8 == torch.float8_e4m3fnuz
    assert (c.k[1] == 0).all() and c.k[3].abs().max() < 1e-4 and c.k[4].abs().max() > 100
    assert torch.isfinite(c.k.float()).all() and (c.k[0] != 0).all()
    n = s.num_blocks() * 16
    assert int(c.slot_mapping[2]) == -1 and int(c.slot_mapping[5]) == n + 5 and int(c.slot_mapping[6]) == 1 << 40
    assert c.written().numel() == 34 and c.written().unique().numel() == 34
    assert c.index_cache.stride(0) == 2 * 16 * 132 and (c.cache_base == 0xFF).all()
    assert c.shuffled and not indexer_cache.make_inputs(indexer_cache.IndexerCacheShape(5, 1), dtype=F32).shuffled
    with pytest.raises(ValueError, match="kind"):
        indexer_cache.IndexerCacheShape(3, kind="fp8_e5m2")
    with pytest.raises(ValueError, match="scale_fmt"):
        indexer_cache.IndexerCacheShape(3, scale_fmt="e8m0")


def test_tolerance_is_exact_for_every_dtype():
    assert set(indexer_cache.TOLERANCE) == {F32, F16, torch.bfloat16}
    for table in indexer_cache.TOLERANCE.values():
        assert table == {"values": Bound(0.0, 0.0), "scales": Bound(0.0, 0.0)}


def test_check_catches_a_wrong_code_scale_or_stray_byte():
    c = indexer_cache.make_inputs(indexer_cache.IndexerCacheShape(20, 16), dtype=F32, seed=2)
    c.run(backend="reference")
    c.check()
    blk, off = divmod(int(c.written()[0]), 16)
    flat = c.index_cache.view(c.index_cache.shape[0], -1)
    for where, what in ((off * 16, "values"), (16 * 128 + 4 * off + 3, "scales")):
        flat[blk, where] ^= 0x01
        with pytest.raises(CaseMismatch, match=what):
            c.check()
        flat[blk, where] ^= 0x01
    free = sorted(set(range(c.index_cache.shape[0] * 16)) - set(c.written().tolist()))[0]
    flat[free // 16, 16 * 128 + 4 * (free % 16)] = 0  # a scale byte no slot owns
    with pytest.raises(CaseMismatch, match="bytes: 1 differ"):
        c.check()
