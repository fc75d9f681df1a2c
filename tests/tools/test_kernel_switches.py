"""docs/notes/kernel-switches.md names every compile-time switch of the decode and prefill kernels with
the reason it exists: a kernel that gains a switch the page does not list fails here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from rocm_mla.kernels.decode import mla_decode_reduce_kernel, mla_decode_stage1_kernel
from rocm_mla.kernels.prefill import mla_prefill_kernel

NOTE = Path(__file__).resolve().parents[2] / "docs" / "notes" / "kernel-switches.md"


def _constexprs(kernel) -> list[str]:
    fn = getattr(kernel, "fn", kernel)
    return [n for n, p in inspect.signature(fn).parameters.items() if "constexpr" in str(p.annotation)]


def _section(title: str) -> str:
    text = NOTE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


@pytest.mark.parametrize(
    "kernel,title",
    [
        (mla_decode_stage1_kernel, "mla_decode stage 1"),
        (mla_decode_reduce_kernel, "mla_decode stage 2 (the reduce)"),
        (mla_prefill_kernel, "mla_prefill"),
    ],
    ids=["decode_stage1", "decode_reduce", "prefill"],
)
def test_every_switch_has_its_reason(kernel, title):
    names = _constexprs(kernel)
    assert len(names) >= 4  # the signature was read (constexpr annotations found)
    section = _section(title)
    # The first cell of each table row names switches; the page lists each kernel's, no more.
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = {n for cell in rows for n in re.findall(r"`([A-Za-z0-9_]+)`", cell)}
    assert sorted(set(names) - listed) == [], f"switches of {title} not in {NOTE.name}"
    assert sorted(listed - set(names)) == [], f"{NOTE.name} lists switches {title} does not have"
