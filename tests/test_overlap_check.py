"""The host-side overlap check every op runs on its destinations (rocm_mla/ops/_checks.py:
Checker.no_overlap): never blind to a real overlap, and the usual interleavings accepted."""

from __future__ import annotations

import pytest
import torch


def test_no_overlap_never_misses_an_overlap():
    """Random strided views (dtypes of 1, 2 and 4 bytes) of one byte buffer, against a
    byte-exact brute force: every real overlap is reported (the check may be conservative, never
    blind); interleaved views it proves disjoint are disjoint."""
    from rocm_mla.ops._checks import Checker

    g = torch.Generator().manual_seed(123)
    buf = torch.zeros(4096, dtype=torch.uint8)
    c = Checker("t")
    proved = 0
    for _ in range(600):
        views = []
        for _ in range(2):
            dt = [torch.uint8, torch.float16, torch.float32][int(torch.randint(0, 3, (1,), generator=g))]
            es = torch.empty(0, dtype=dt).element_size()
            nd = int(torch.randint(1, 4, (1,), generator=g))
            shape = [int(torch.randint(1, 6, (1,), generator=g)) for _ in range(nd)]
            stride = [int(torch.randint(0, 40, (1,), generator=g)) for _ in range(nd)]
            stride[-1] = int(torch.randint(1, 3, (1,), generator=g))
            ext = (1 + sum((n - 1) * st for n, st in zip(shape, stride))) * es
            off = int(torch.randint(0, 4096 - ext, (1,), generator=g)) // es * es
            views.append(buf[off:].view(dt)[: (4096 - off) // es].as_strided(shape, stride))
        a, b = views
        bytes_of = []
        for v in (a, b):
            idx = torch.zeros(4096, dtype=torch.bool)
            es = v.element_size()
            base = v.data_ptr() - buf.data_ptr()
            pos = torch.zeros((), dtype=torch.long)
            for n, st in zip(v.shape, v.stride()):
                pos = pos[..., None] + torch.arange(n) * st * es
            for k in range(es):
                idx[(base + pos.flatten() + k)] = True
            bytes_of.append(idx)
        real = bool((bytes_of[0] & bytes_of[1]).any())
        try:
            c.no_overlap({"a": a}, {"b": b})
            flagged = False
        except ValueError:
            flagged = True
        assert flagged or not real, (a.shape, a.stride(), b.shape, b.stride(), a.data_ptr() - b.data_ptr())
        ext_meet = not (
            a.data_ptr() + a.element_size() * (1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride())))
            <= b.data_ptr()
            or b.data_ptr() + b.element_size() * (1 + sum((n - 1) * s for n, s in zip(b.shape, b.stride())))
            <= a.data_ptr()
        )
        proved += int(ext_meet and not flagged)
    assert proved > 0  # the period test did accept some interleaved pairs


def test_no_overlap_accepts_the_usual_interleavings():
    from rocm_mla.ops._checks import Checker

    c = Checker("t")
    kv_a = torch.empty(7, 576)
    c.no_overlap({"k_pe": kv_a[:, 512:]}, {"kv_c": kv_a[:, :512]})  # vLLM's kv_a split
    q = torch.empty(5, 3, 192)
    c.no_overlap({"q_pe": q[..., 128:]}, {"q_nope": q[..., :128]})  # q's nope / rope parts
    kv = torch.empty(5, 3, 256)
    c.no_overlap({"out": kv[..., 128:]}, {"k_nope": kv[..., :128]})
    with pytest.raises(ValueError, match="a: expected no memory in common with b"):
        c.no_overlap({"a": q[..., 127:191]}, {"b": q[..., :128]})
