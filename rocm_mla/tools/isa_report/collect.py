"""``collect``: compile every kernel configuration for one arch -- our Triton variants, the peers',
the HIP translation units -- and gate each row."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ...configs import is_amd_arch
from . import hip_compile as hipc
from .gate import check, notes
from .hip_rows import hip_rows
from .peers import list_peer_variants
from .rows import ARCHS, Row, error_text, matches
from .triton_rows import triton_row


class _Progress:
    """``[i/N] what ... 0.8 s`` lines on stderr, one per compile (they take ~1 s each)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.i = total, enabled, 0

    def start(self, what: str) -> float:
        self.i += 1
        if self.enabled:
            print(f"[{self.i}/{self.total}] {what} ...", end="", file=sys.stderr, flush=True)
        return time.monotonic()

    def done(self, t0: float, note: str = "") -> None:
        if self.enabled:
            print(f" {time.monotonic() - t0:.1f} s{note}", file=sys.stderr, flush=True)


def collect(
    arch: str,
    filter: str | None = None,
    *,
    triton_variants: list | None = None,
    hip_sources: list[Path] | None = None,
    progress: bool = True,
    peers: bool | None = None,
) -> list[Row]:
    """Compile every kernel configuration for ``arch`` and return one gated ``Row`` each.

    filter: keep rows whose "kernel config backend" contains this (case-insensitive).
    triton_variants / hip_sources: override what is compiled (tests); by default the package's
    ``all_triton_variants(arch)`` and ``hip_src/isa/*.cu``.
    progress: print one line per compile on stderr.
    peers: also compile the peers' kernels (perf/peer_variants.py, loaded from the repository:
        aiter's MHA forward with its MI300X config, beside mla_prefill) as ungated rows; a peer that
        cannot be loaded is a skipped row that never fails the report. Default: only for the
        package's own list (``triton_variants`` None).
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHS)}")
    rows: list[Row] = []
    triton_variants_given = triton_variants is not None
    if triton_variants is None:
        try:
            from rocm_mla.variants import all_triton_variants

            triton_variants = all_triton_variants(arch)
        except Exception as e:  # a broken op module is a failure to report, not a crash
            triton_variants = []
            if matches(filter, "triton"):
                rows.append(
                    Row(
                        kernel="(triton variants)",
                        config="-",
                        backend="triton",
                        arch=arch,
                        error=f"cannot list Triton variants: {error_text(e)}",
                    )
                )
    variants = [v for v in triton_variants if matches(filter, v.kernel, v.config, "triton")]
    peer_variants: list = []
    if peers if peers is not None else triton_variants_given is False:
        peer_variants, skipped = list_peer_variants(arch, filter)
        rows.extend(skipped)
    sources = list(hipc.isa_sources() if hip_sources is None else hip_sources)

    if is_amd_arch(arch):
        tool = hipc.find_clang(arch)
        missing = None if tool else f"{' or '.join(hipc.CLANGS[arch])} not found ({hipc.INSTALL_HINT})"
    else:
        tool = hipc.find_nvcc()
        missing = None if tool else "nvcc not found"

    prog = _Progress(len(variants) + len(peer_variants) + len(sources), progress)
    for v in variants:
        t0 = prog.start(f"triton {v.kernel} {v.config}")
        rows.append(triton_row(v, arch))
        prog.done(t0, "" if not rows[-1].error else " (error)")
    for v in peer_variants:
        t0 = prog.start(f"aiter {v.kernel} {v.config}")
        rows.append(triton_row(v, arch))
        rows[-1].backend, rows[-1].peer = "aiter", True
        prog.done(t0, "" if not rows[-1].error else " (error)")
    for src in sources:
        if missing:
            if matches(filter, src.stem, "hip"):
                rows.append(
                    Row(kernel=src.stem, config="-", backend="hip", arch=arch, source=str(src), skipped=missing)
                )
            continue
        t0 = prog.start(f"hip {src.name} ({arch})")
        try:
            new = hip_rows(src, arch, tool)
            note = ""
        except Exception as e:
            new = [Row(kernel=src.stem, config="-", backend="hip", arch=arch, source=str(src), error=error_text(e))]
            note = " (error)"
        prog.done(t0, note)
        rows.extend(r for r in new if matches(filter, r.kernel, r.config, "hip", src.stem))
    for r in rows:
        r.problems, r.notes = check(r), notes(r)
    return rows
