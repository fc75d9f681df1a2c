"""The package's launch data: one JSON file per op (``rocm_mla/configs/<op>.json``) keyed by arch
(gfx942, gfx950, sm90, default), and the one function per vendor that picks an arch's object: an
AMD part without its own entry takes the entry of the first ``AMD_FALLBACK`` prefix it matches
(another CDNA4 part gfx950's, any other gfx9 part gfx942's), an unknown Hopper-or-newer part
takes sm90's. No code outside this package inspects arch strings.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from importlib import resources
from typing import Any


@functools.cache
def _table(op: str) -> dict[str, Any]:
    table = json.loads(resources.files(__package__).joinpath(f"{op}.json").read_text())
    for key, obj in table.items():
        if not key.startswith("_") and isinstance(obj, dict):
            for part in (obj, obj.get("hip")):
                if isinstance(part, dict) and "candidates" in part:
                    part["candidates"] = expand_candidates(part["candidates"], part.get("tiers", []))
    return table


def expand_candidates(candidates: list[dict[str, Any]], tiers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An arch's ``candidates`` as the tuner reads them: a candidate whose fields hold lists stands
    for every combination of their values (a grid, fields varied last-first in the order written),
    less any combination that is one of the ``tiers``; the others stand for themselves."""
    out = []
    for cand in candidates:
        axes = [v if isinstance(v, list) else [v] for v in cand.values()]
        for values in itertools.product(*axes):
            c = dict(zip(cand, values))
            if c not in tiers and c not in out:
                out.append(c)
    return out


# (arch prefix, entry) in order: an AMD arch without its own entry takes the first match's. gfx95x
# parts share gfx950's 160 KiB LDS and its MFMA shapes; every gfx9 part is wave64 with the MFMA
# shapes gfx942's entries name, and 64 KiB of LDS fits all of them.
AMD_FALLBACK = (("gfx95", "gfx950"), ("gfx9", "gfx942"))


def amd_entry_key(table: dict[str, Any], arch: str) -> str:
    """The key of ``table`` whose object an AMD ``arch`` uses: its own, the ``AMD_FALLBACK``
    match present in the table, else ``default``."""
    if arch in table:
        return arch
    for prefix, key in AMD_FALLBACK:
        if arch.startswith(prefix) and key in table:
            return key
    return "default"


def is_amd_arch(arch: str) -> bool:
    """True for an AMD GPU arch key (``gfx942``, ``gfx950``, ...): where the AMD backend's compile
    options apply. With ``is_nvidia_arch`` and ``nvidia_sm``, the one place outside ``_platform``
    that reads a vendor or a generation from an arch name."""
    return arch.startswith("gfx")


def wave_size(arch: str) -> int:
    """Lanes a wave (AMD gfx9: 64) or a warp (NVIDIA, and the CPU interpreter's Triton: 32) runs
    together: what a Triton layout spreads a tensor's elements over, ``num_warps`` at a time."""
    return 64 if is_amd_arch(arch) else 32


def is_nvidia_arch(arch: str) -> bool:
    """True for an NVIDIA GPU arch key (``sm90``, ...)."""
    return arch.startswith("sm")


def nvidia_sm(arch: str) -> int | None:
    """The compute capability of an NVIDIA arch key as a number (``sm90`` / ``sm90a`` -> 90), else None."""
    m = re.fullmatch(r"sm(\d+)\w*", arch)
    return int(m.group(1)) if m else None


def package_config(op: str, arch: str) -> dict[str, Any]:
    """The package's own launch data of ``op`` on ``arch`` (no overlay): what ``config_for``
    returns when overlays are off."""
    table = _table(op)
    if is_amd_arch(arch):
        return table[amd_entry_key(table, arch)]
    if is_nvidia_arch(arch) and arch in table:
        return table[arch]
    # a CPU or other non-NVIDIA arch has no nvidia_sm, so it takes default
    return table["sm90" if (nvidia_sm(arch) or 0) >= 90 and "sm90" in table else "default"]


def arch_objects(op: str) -> list[dict[str, Any]]:
    """The arch objects of ``op``'s JSON (every key but ``_doc`` and the like)."""
    return [obj for key, obj in _table(op).items() if not key.startswith("_")]
