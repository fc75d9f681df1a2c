"""rocm_mla.tools.selfcheck (the checks `rocm-mla doctor` runs): a case that raises is reported as a
failed row, and the other cases still run; the doctor's --arch list."""

from __future__ import annotations

import pytest
import torch

import rocm_mla.configs
from rocm_mla.tools.selfcheck import check_decode


def test_decode_check_reports_an_fp8_cache_it_cannot_make(monkeypatch):
    """A torch without the platform's fp8 kind: the fp8-cache rows fail with the error, named; the
    16-bit and float32 rows still run and pass."""
    monkeypatch.setattr(rocm_mla.configs, "platform_fp8_dtype", lambda arch: "no-such-fp8-kind")
    rows = check_decode(torch.device("cpu"), ["triton"])
    fp8_rows = [r for r in rows if "fp8 cache" in r.case]
    other = [r for r in rows if "fp8 cache" not in r.case]
    assert fp8_rows and all(not r.ok and "no-such-fp8-kind" in r.error for r in fp8_rows)
    assert other and all(r.ok for r in other)


def test_doctor_reports_each_arch_it_is_given():
    from rocm_mla.tools.doctor import report_arches

    assert report_arches("gfx942") == ["gfx942"]
    assert report_arches("gfx942, gfx950") == ["gfx942", "gfx950"]
    with pytest.raises(ValueError, match="gfx90a"):
        report_arches("gfx942,gfx90a")
