"""Per-arch launch data: one JSON file per op, keyed by arch (gfx942, gfx950, sm90, default).

``config_for(op, arch)`` is the single entry point; it hands the lookup to one function per vendor,
which knows how that vendor's arch names fall back (an unknown CDNA part takes gfx942's data, an
unknown Hopper-or-newer part takes sm90's). No code outside this module inspects arch strings.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.lru_cache(maxsize=None)
def _table(op: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(f"{op}.json").read_text()
    return json.loads(text)


def _amd(table: dict[str, Any], arch: str) -> dict[str, Any]:
    if arch in table:
        return table[arch]
    # CDNA3/4 share wave64, 64 KiB LDS per CU and the MFMA shapes the configs name.
    if arch.startswith("gfx9") and "gfx942" in table:
        return table["gfx942"]
    return table["default"]


def _nvidia(table: dict[str, Any], arch: str) -> dict[str, Any]:
    if arch in table:
        return table[arch]
    major = int(arch[2:-1]) if arch.startswith("sm") and len(arch) > 3 else 0
    if major >= 9 and "sm90" in table:
        return table["sm90"]
    return table["default"]


def config_for(op: str, arch: str) -> dict[str, Any]:
    """Launch data of ``op`` on ``arch`` (``gfx942``, ``sm90``, ``cpu``, ...).

    Returns the JSON object for that arch; see ``rocm_mla/configs/<op>.json`` for the fields.
    """
    table = _table(op)
    if arch.startswith("gfx"):
        return _amd(table, arch)
    if arch.startswith("sm"):
        return _nvidia(table, arch)
    return table["default"]


def known_arches(op: str) -> list[str]:
    """Arch keys with explicit data for ``op`` (for the ISA report)."""
    return [k for k in _table(op) if k.startswith(("gfx", "sm"))]


def tune_space(op: str) -> dict[str, Any]:
    """Candidate launch values per implementation that ``perf/bench_<op> --tune`` sweeps."""
    return _table(op).get("tune", {})


def platform_fp8_dtype(arch: str):
    """The torch FP8 E4M3 dtype a plain "fp8" cache holds on ``arch`` (``platform.json``)."""
    import torch

    return getattr(torch, config_for("platform", arch)["fp8_dtype"])
