"""The rows of one HIP translation unit (``hip_src/isa/*.cu``): one per kernel instantiation,
named by its demangled template arguments, compiled by ``hip_compile``. A kernel is held to the
MFMA gate when the source marks it ``// isa-report: expects-mfma SUBSTR``."""

from __future__ import annotations

from pathlib import Path

from ...configs import is_amd_arch
from . import hip_compile as hipc
from .amdgcn import amd_occupancy, parse_amdgcn
from .rows import Row
from .sm90 import parse_ptx_ptxas


def hip_rows(src: Path, arch: str, tool: str) -> list[Row]:
    """Ungated rows of ``src`` for ``arch``, compiled with ``tool`` (``hip_compile.find_clang(arch)``
    for gfx942/gfx950, nvcc for sm90), sorted by demangled name. Raises when the compiler fails."""
    markers = hipc.mfma_markers(src)
    if is_amd_arch(arch):
        res = parse_amdgcn(hipc.compile_amdgcn(src, tool, arch))
    else:
        ptx, log = hipc.compile_sm90(src, tool)
        res = parse_ptx_ptxas(ptx, log)
    names = hipc.demangle(sorted(res))
    rows = []
    for sym in sorted(res, key=lambda s: names[s]):
        r = res[sym]
        kernel, config = hipc.short_name(names[sym])
        full = f"{kernel}{config}"
        occ = None
        if is_amd_arch(arch):
            # clang's Occupancy already counts static LDS for the declared workgroup size; the
            # same rule again is a no-op there and keeps Triton and HIP rows comparable.
            occ = amd_occupancy(r["occupancy"], r["lds"], max(1, r["workgroup"] // 64), arch)
        rows.append(
            Row(
                kernel=kernel,
                config=config,
                backend="hip",
                arch=arch,
                vgprs=r["vgprs"],
                agprs=r.get("agprs"),
                sgprs=r.get("sgprs"),
                spills=r["spills"],
                scratch=r["scratch"],
                lds=r["lds"],
                occupancy=occ,
                mfma=r["mfma"],
                expects_mfma=any(m in full or m in names[sym] for m in markers),
                source=str(src),
            )
        )
    return rows
