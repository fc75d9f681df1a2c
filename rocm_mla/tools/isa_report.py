"""``rocm-mla isa-report``: register, spill, LDS, occupancy and MFMA figures of every kernel.

Compiles ahead of time, on a machine without a GPU, every kernel configuration the package can
launch -- the Triton variants listed by ``rocm_mla.variants.all_triton_variants`` and every
HIP kernel instantiated by ``hip_src/isa/*.cu`` -- for gfx942 (MI300) or sm90 (H100/H200), and
prints one row per kernel/config. A row fails when the kernel uses scratch or spills registers,
needs more LDS than the chip has, or should use matrix instructions (``tl.dot``, or a HIP kernel
marked ``// isa-report: expects-mfma SUBSTR``) and has none. Exit status 1 when any row fails.
One exception, sm90 Triton rows only: when the SASS (``nvdisasm``) shows every local-memory
access outside the kernel's loops, the spill is noted in the status column ("ok (... spilled ...;
no local-memory access inside a loop)") instead of failing the row.

Where the figures come from:
  gfx942  the AMDGCN text (Triton's ``asm["amdgcn"]``, clang-19 ``-S`` for HIP): the per-kernel
          "; Kernel info:" comments (VGPR/AGPR/SGPR, ScratchSize, Occupancy, LDSByteSize) and the
          ``.amdgpu_metadata`` YAML (spill counts, workgroup size); MFMA = ``v_mfma`` lines.
          Triton allocates LDS dynamically, so the text says 0 and LDS comes from
          ``metadata.shared``; the asm's Occupancy then ignores LDS and is combined with it here.
  sm90    PTX (Triton's, or nvcc ``-ptx``) run through ``ptxas -v``: registers, stack frame,
          spill bytes, static smem; MMA = ``mma.sync``/``wgmma.mma_async`` lines in the PTX.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..configs import is_amd_arch
from . import _hip_compile as hipc


@dataclass(frozen=True)
class ArchInfo:
    """Per-architecture limits the gate and the occupancy estimate use."""

    lds_limit: int  # bytes of LDS / shared memory one workgroup may use
    simds_per_cu: int = 4


ARCHS = {
    # MI300 (CDNA3): 64 KiB LDS per CU, 4 SIMDs per CU, 8 waves per SIMD at most.
    "gfx942": ArchInfo(lds_limit=64 * 1024),
    # H100/H200: up to 227 KiB of shared memory per block (opt-in). The 64 KiB rule is MI300's,
    # so failing sm90 rows above 64 KiB would reject legal sm90-only configs.
    "sm90": ArchInfo(lds_limit=227 * 1024),
}


@dataclass
class Row:
    """One kernel/config of the report. ``None`` figures were not available (shown as ``-``).

    vgprs: gfx942: VGPRs incl. AGPRs (one unified 512-register file per lane on CDNA3);
        sm90: registers per thread.
    spills: gfx942: spilled VGPRs + SGPRs (count); sm90: spill store + load bytes.
    scratch: gfx942: ScratchSize (bytes per lane); sm90: stack frame (bytes per thread).
    lds: bytes of LDS / shared memory per workgroup.
    occupancy: gfx942: waves per SIMD, LDS-aware; sm90: blocks per SM (Triton rows only).
    mfma: matrix instructions in the code: ``v_mfma`` (gfx942), ``mma``/``wgmma`` (sm90 PTX).
    local_in_loops: sm90: local-memory instructions (``LDL``/``STL``: spill traffic) inside a loop
        of the SASS, or None when the SASS was not available.
    problems: why the row fails the gate (empty: it passes).
    notes: what the row passes with but a reader should know (e.g. spills outside loops).
    """

    kernel: str
    config: str
    backend: str  # "triton" | "hip"
    arch: str
    vgprs: int | None = None
    agprs: int | None = None
    sgprs: int | None = None
    spills: int | None = None
    scratch: int | None = None
    lds: int | None = None
    occupancy: int | None = None
    mfma: int | None = None
    expects_mfma: bool = False
    source: str = ""
    skipped: str = ""
    error: str = ""
    local_in_loops: int | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    peer: bool = False  # a peer's kernel (e.g. aiter's), compiled for comparison: reported, never gated

    @property
    def status(self) -> str:
        """``ok``, ``FAIL``, ``error`` or ``skipped``."""
        if self.error:
            return "error"
        if self.skipped:
            return "skipped"
        return "FAIL" if self.problems else "ok"

    @property
    def failed(self) -> bool:
        """True when the row fails the gate (a compile error included; skipped rows do not)."""
        return bool(self.problems)


# --------------------------------------------------------------------------- parsing: gfx942

_FUNC_RE = re.compile(r"^\s*\.type\s+([^\s,]+)\s*,\s*@function", re.MULTILINE)
_INFO_RE = re.compile(r"^;\s*([A-Za-z]+)\s*[:=]\s*(\d+)", re.MULTILINE)
_MFMA_RE = re.compile(r"^\s*v_s?mfma", re.MULTILINE)  # dense and sparse (v_smfmac) MFMA
_META_RE = re.compile(r"^\s*\.amdgpu_metadata\s*$(.*?)^\s*\.end_amdgpu_metadata", re.MULTILINE | re.DOTALL)
_META_KEY_RE = re.compile(r"^(?:  - |    )\.(\w+):[ \t]*(\S*)[ \t]*$", re.MULTILINE)


def parse_amdgcn(text: str) -> dict[str, dict[str, int]]:
    """Per-kernel resources from AMDGCN assembly text (Triton's or clang's), by symbol name.

    Keys: vgprs (incl. AGPRs), agprs, sgprs, scratch, occupancy, lds, spills, mfma,
    workgroup (max flat workgroup size). Only kernels (functions with a "; Kernel info:" block).
    """
    meta = _parse_kernel_metadata(text)
    funcs = list(_FUNC_RE.finditer(text))
    meta_start = text.find(".amdgpu_metadata")
    out: dict[str, dict[str, int]] = {}
    for i, m in enumerate(funcs):
        end = funcs[i + 1].start() if i + 1 < len(funcs) else (meta_start if meta_start > 0 else len(text))
        seg = text[m.end() : end]
        at = seg.find("; Kernel info:")
        if at < 0:
            continue  # a device function, not a kernel
        body, info_text = seg[:at], seg[at:]
        info = {k: int(v) for k, v in _INFO_RE.findall(info_text.split("\n\t.")[0])}
        md = meta.get(m.group(1), {})
        agprs = info.get("NumAgprs", md.get("agpr_count", 0))
        # TotalNumVgprs counts the unified file (VGPRs, alignment, AGPRs); older text lacks it.
        vgprs = info.get("TotalNumVgprs", info.get("NumVgprs", md.get("vgpr_count", 0)) + agprs)
        out[m.group(1)] = {
            "vgprs": vgprs,
            "agprs": agprs,
            # Triton's newer LLVM says TotalNumSgprs, clang-19 says NumSgprs.
            "sgprs": info.get("TotalNumSgprs", info.get("NumSgprs", md.get("sgpr_count", 0))),
            "scratch": info.get("ScratchSize", md.get("private_segment_fixed_size", 0)),
            "occupancy": info.get("Occupancy", 0),
            "lds": info.get("LDSByteSize", md.get("group_segment_fixed_size", 0)),
            "spills": md.get("vgpr_spill_count", 0) + md.get("sgpr_spill_count", 0),
            "mfma": len(_MFMA_RE.findall(body)),
            "workgroup": md.get("max_flat_workgroup_size", 1024),
        }
    return out


def _parse_kernel_metadata(text: str) -> dict[str, dict[str, int]]:
    """Integer fields of each ``amdhsa.kernels`` entry of the ``.amdgpu_metadata`` YAML.

    A small line parser instead of PyYAML: the entries' top-level keys sit at a fixed indent
    ("  - ." for the first, "    ." for the rest) and nested ``.args`` are deeper, so this
    avoids a dependency for a dozen integers.
    """
    m = _META_RE.search(text)
    if not m:
        return {}
    out: dict[str, dict[str, int]] = {}
    for entry in re.split(r"^(?=  - \.)", m.group(1), flags=re.MULTILINE):
        fields = dict(_META_KEY_RE.findall(entry))
        name = fields.get("name")
        if name:
            out[name] = {k: int(v) for k, v in fields.items() if v.isdigit()}
    return out


def gfx942_occupancy(asm_occupancy: int, lds: int, waves_per_workgroup: int) -> int:
    """Waves per SIMD given the asm's register-limited Occupancy and the LDS per workgroup.

    Same rule as LLVM's occupancy-with-LDS: workgroups per CU = 64 KiB // LDS, their waves
    spread over the CU's 4 SIMDs (rounded up), capped by the register limit.
    """
    limit = ARCHS["gfx942"].lds_limit
    if lds <= 0:
        return asm_occupancy
    if lds > limit:
        return 0
    groups = limit // lds
    return min(asm_occupancy, math.ceil(groups * waves_per_workgroup / ARCHS["gfx942"].simds_per_cu))


# --------------------------------------------------------------------------- parsing: sm90

_ENTRY_RE = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)\s*\(", re.MULTILINE)
_MMA_RE = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:wgmma\.mma_async|mma\.sync)\b", re.MULTILINE)


def parse_ptx_ptxas(ptx: str, log: str) -> dict[str, dict[str, int]]:
    """Per-entry resources from PTX text plus its ``ptxas -v`` log, by symbol name.

    Keys: vgprs (registers/thread), scratch (stack frame bytes), spills (store + load bytes),
    lds (static smem bytes), mfma (``mma.sync`` + ``wgmma.mma_async`` in the PTX).
    """
    entries = list(_ENTRY_RE.finditer(ptx))
    mma = {
        m.group(1): len(_MMA_RE.findall(ptx[m.end() : entries[i + 1].start() if i + 1 < len(entries) else len(ptx)]))
        for i, m in enumerate(entries)
    }
    out: dict[str, dict[str, int]] = {}
    for block in re.split(r"(?=ptxas info\s*: Compiling entry function)", log):
        head = re.match(r"ptxas info\s*: Compiling entry function '([^']+)'", block)
        if not head:
            continue
        name = head.group(1)
        props = re.search(
            re.escape(name) + r"\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
            r"(\d+) bytes spill loads",
            block,
        )
        regs = re.search(r"Used (\d+) registers", block)
        smem = re.search(r"(\d+) bytes smem", block)
        out[name] = {
            "vgprs": int(regs.group(1)) if regs else 0,
            "scratch": int(props.group(1)) if props else 0,
            "spills": int(props.group(2)) + int(props.group(3)) if props else 0,
            "lds": int(smem.group(1)) if smem else 0,
            "mfma": mma.get(name, 0),
        }
    return out


_SASS_INSN_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_SASS_LABEL_RE = re.compile(r"^\s*(\.L_\w+):")
_SASS_BRA_RE = re.compile(r"\bBRA\b[^`]*`\((\.L_\w+)\)")
_SASS_LOCAL_RE = re.compile(r"\b(?:LDL|STL)\b")


def local_memory_in_loops(sass: str) -> tuple[int, int]:
    """``(inside loops, total)`` local-memory instructions (``LDL``/``STL``) of one kernel's SASS
    (``nvdisasm -c``). A loop is the address range from a branch target to a branch back to it.

    Spilled registers cost their local-memory traffic where that traffic runs: a spill stored
    once before the main loop and reloaded after it is a few instructions per thread, one inside
    the loop is paid on every iteration.
    """
    labels: dict[str, int] = {}
    pending: list[str] = []
    insns: list[tuple[int, str]] = []
    for line in sass.splitlines():
        lab = _SASS_LABEL_RE.match(line)
        if lab:
            pending.append(lab.group(1))
            continue
        m = _SASS_INSN_RE.search(line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for name in pending:
            labels[name] = addr
        pending = []
        insns.append((addr, m.group(2)))
    loops = []
    for addr, text in insns:
        b = _SASS_BRA_RE.search(text)
        if b and b.group(1) in labels and labels[b.group(1)] <= addr:
            loops.append((labels[b.group(1)], addr))
    local = [a for a, t in insns if _SASS_LOCAL_RE.search(t)]
    return sum(any(lo <= a <= hi for lo, hi in loops) for a in local), len(local)


def sm90_blocks_per_sm(regs: int, smem: int, threads: int) -> int:
    """Resident blocks per SM on H100/H200, as CUDA's occupancy calculator counts them.

    Limits: 32 blocks, 64 warps, 64K registers (allocated per warp in 256-register units),
    228 KiB shared memory with 1 KiB reserved per block.
    """
    warps = max(1, math.ceil(threads / 32))
    regs_per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256
    by_regs = (65536 // regs_per_warp) // warps
    by_warps = 64 // warps
    by_smem = (228 * 1024) // (smem + 1024)
    return min(32, by_warps, by_regs, by_smem)


# --------------------------------------------------------------------------- the gate


def check(row: Row) -> list[str]:
    """Why ``row`` fails the gate (empty list: it passes). Skipped rows never fail here, nor do a
    peer's rows (what would fail ours is noted on them by :func:`notes`)."""
    if row.peer:
        return []
    return _gate(row)


def _gate(row: Row) -> list[str]:
    if row.error:
        return [f"error: {error_digest(row.error)}"]
    if row.skipped:
        return []
    why = []
    if (row.scratch or row.spills) and not _spills_outside_loops(row):  # those are notes(), not failures
        if row.scratch:
            why.append(f"scratch {row.scratch} B" + ("/lane" if is_amd_arch(row.arch) else " stack/thread"))
        if row.spills:
            why.append(f"{row.spills} spilled registers" if is_amd_arch(row.arch) else f"{row.spills} B spilled")
        if row.local_in_loops:
            why.append(f"{row.local_in_loops} local-memory instructions inside loops")
    limit = ARCHS[row.arch].lds_limit
    if row.lds is not None and row.lds > limit:
        why.append(f"LDS {row.lds} B > {limit} B")
    if row.expects_mfma and not row.mfma:
        why.append(
            "expects MFMA but has no matrix instructions" + (" (v_mfma)" if is_amd_arch(row.arch) else " (mma/wgmma)")
        )
    return why


def _spills_outside_loops(row: Row) -> bool:
    """sm90 with its SASS read: the row spills, and none of the spill traffic runs in a loop."""
    return bool(row.spills or row.scratch) and row.local_in_loops == 0 and not is_amd_arch(row.arch)


def notes(row: Row) -> list[str]:
    """What ``row`` passes the gate with but a reader should know."""
    if row.peer:
        return [f"peer, not gated: {'; '.join(_gate(row))}"] if not row.skipped and _gate(row) else []
    if not row.error and not row.skipped and _spills_outside_loops(row):
        return [f"{row.spills} B spilled, {row.scratch} B stack; no local-memory access inside a loop"]
    return []


def failures(rows: Iterable[Row], strict: bool = False) -> list[tuple[Row, list[str]]]:
    """Rows that make the report exit non-zero, with reasons. ``strict``: skipped rows fail too
    (not a peer's: a missing peer folder is not a missing compiler)."""
    out = []
    for r in rows:
        if r.problems:
            out.append((r, r.problems))
        elif r.skipped and strict and not r.peer:
            out.append((r, [f"skipped ({r.skipped}) and --strict"]))
    return out


# --------------------------------------------------------------------------- collecting


def label(r: Row) -> str:
    """``backend kernel config`` for messages (no trailing ``-`` for untemplated kernels)."""
    return " ".join(x for x in (r.backend, r.kernel, r.config) if x and x != "-")


def _matches(filt: str | None, *parts: str) -> bool:
    return filt is None or filt.lower() in " ".join(parts).lower()


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


def _error_text(e: BaseException) -> str:
    """The whole message (capped): the table shows its digest, the failure list all of it."""
    return f"{type(e).__name__}: {str(e).strip()}"[:3000]


def error_digest(msg: str) -> str:
    """One line of a compiler error: the first ``error:`` line (clang/nvcc), else the last line
    (Triton's CompilationError ends with the cause, after the source excerpt)."""
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    if not lines:
        return ""
    for ln in lines[1:]:
        if " error: " in ln or ln.startswith("error: "):
            return ln[:300]
    return (lines[0] if len(lines) == 1 else f"{lines[0].split(':')[0]}: {lines[-1]}")[:300]


def _triton_row(v: Any, arch: str) -> Row:
    from . import _triton_compile as tc

    row = Row(
        kernel=v.kernel,
        config=v.config,
        backend="triton",
        arch=arch,
        expects_mfma=bool(v.expects_mfma),
        source=f"{getattr(getattr(v.fn, 'fn', v.fn), '__module__', '?')}.{getattr(v.fn, '__name__', '?')}",
    )
    try:
        art = tc.compile_variant(v, arch)
        if arch == "gfx942":
            res = next(iter(parse_amdgcn(art.isa).values()))
            row.vgprs, row.agprs, row.sgprs = res["vgprs"], res["agprs"], res["sgprs"]
            row.spills, row.scratch, row.mfma = res["spills"], res["scratch"], res["mfma"]
            row.lds = max(art.shared, res["lds"])
            row.occupancy = gfx942_occupancy(res["occupancy"], row.lds, art.num_warps)
        else:
            res = next(iter(parse_ptx_ptxas(art.isa, art.ptxas_log).values()))
            row.vgprs, row.spills, row.scratch, row.mfma = res["vgprs"], res["spills"], res["scratch"], res["mfma"]
            row.lds = max(art.shared, res["lds"])  # Triton's smem is dynamic: ptxas sees 0
            row.occupancy = sm90_blocks_per_sm(row.vgprs, row.lds, art.num_warps * 32)
            if art.sass:
                row.local_in_loops = local_memory_in_loops(art.sass)[0]
    except StopIteration:
        row.error = "compiler output has no kernel resource information"
    except Exception as e:  # one bad variant must not hide the others
        row.error = _error_text(e)
    return row


def _hip_rows(src: Path, arch: str, tool: str) -> list[Row]:
    markers = hipc.mfma_markers(src)
    if arch == "gfx942":
        res = parse_amdgcn(hipc.compile_gfx942(src, tool))
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
        if arch == "gfx942":
            # clang's Occupancy already counts static LDS for the declared workgroup size; the
            # same rule again is a no-op there and keeps Triton and HIP rows comparable.
            occ = gfx942_occupancy(r["occupancy"], r["lds"], max(1, r["workgroup"] // 64))
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
    peers: also compile the peers' kernels (``rocm_mla.tools.peer_variants``: aiter's MHA forward
        with its MI300X config, beside mla_prefill) as ungated rows; a peer that cannot be loaded
        is a skipped row that never fails the report. Default: only for the package's own list
        (``triton_variants`` None).
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
            if _matches(filter, "triton"):
                rows.append(
                    Row(
                        kernel="(triton variants)",
                        config="-",
                        backend="triton",
                        arch=arch,
                        error=f"cannot list Triton variants: {_error_text(e)}",
                    )
                )
    variants = [v for v in triton_variants if _matches(filter, v.kernel, v.config, "triton")]
    peer_variants: list = []
    if peers if peers is not None else triton_variants_given is False:
        from .peer_variants import (
            AITER_DECODE_KERNEL,
            AITER_KERNEL,
            aiter_decode_variants,
            aiter_mha_variants,
            aiter_peers_dir,
        )

        for kernel, what, make in (
            (AITER_KERNEL, "mla_prefill peer", aiter_mha_variants),
            (AITER_DECODE_KERNEL, "mla_decode peer", aiter_decode_variants),
        ):
            if not _matches(filter, kernel, what, "aiter"):
                continue
            try:
                peer_variants += [v for v in make(arch) if _matches(filter, v.kernel, v.config, "aiter")]
            except Exception as e:  # no peer folder, or aiter's tree fails to import: say so, do not fail
                rows.append(
                    Row(
                        kernel=kernel,
                        config=what,
                        backend="aiter",
                        arch=arch,
                        peer=True,
                        skipped=f"aiter unavailable ({aiter_peers_dir()}): {_error_text(e)[:300]}",
                    )
                )
    sources = list(hipc.isa_sources() if hip_sources is None else hip_sources)

    if arch == "gfx942":
        tool = hipc.find_clang()
        missing = None if tool else f"clang-19 not found ({hipc.INSTALL_HINT})"
    else:
        tool = hipc.find_nvcc()
        missing = None if tool else "nvcc not found"

    prog = _Progress(len(variants) + len(peer_variants) + len(sources), progress)
    for v in variants:
        t0 = prog.start(f"triton {v.kernel} {v.config}")
        rows.append(_triton_row(v, arch))
        prog.done(t0, "" if not rows[-1].error else " (error)")
    for v in peer_variants:
        t0 = prog.start(f"aiter {v.kernel} {v.config}")
        rows.append(_triton_row(v, arch))
        rows[-1].backend, rows[-1].peer = "aiter", True
        prog.done(t0, "" if not rows[-1].error else " (error)")
    for src in sources:
        if missing:
            if _matches(filter, src.stem, "hip"):
                rows.append(
                    Row(kernel=src.stem, config="-", backend="hip", arch=arch, source=str(src), skipped=missing)
                )
            continue
        t0 = prog.start(f"hip {src.name} ({arch})")
        try:
            new = _hip_rows(src, arch, tool)
            note = ""
        except Exception as e:
            new = [Row(kernel=src.stem, config="-", backend="hip", arch=arch, source=str(src), error=_error_text(e))]
            note = " (error)"
        prog.done(t0, note)
        rows.extend(r for r in new if _matches(filter, r.kernel, r.config, "hip", src.stem))
    for r in rows:
        r.problems, r.notes = check(r), notes(r)
    return rows


# --------------------------------------------------------------------------- output


def _columns(arch: str) -> list[tuple[str, Any]]:
    def num(attr):
        return lambda r: "-" if getattr(r, attr) is None else str(getattr(r, attr))

    def status(r: Row) -> str:
        if r.error:
            return "error: " + error_digest(r.error)
        if r.skipped:
            return "skipped: " + r.skipped
        if r.problems:
            return "FAIL: " + "; ".join(r.problems)
        if r.peer:
            return "; ".join(r.notes) or "peer, not gated: clean"
        return "ok" + (f" ({'; '.join(r.notes)})" if r.notes else "")

    cols: list[tuple[str, Any]] = [
        ("kernel", lambda r: r.kernel),
        ("config", lambda r: r.config),
        ("backend", lambda r: r.backend),
    ]
    if is_amd_arch(arch):
        cols += [
            ("VGPR", num("vgprs")),
            ("AGPR", num("agprs")),
            ("SGPR", num("sgprs")),
            ("spills", num("spills")),
            ("scratch", num("scratch")),
            ("LDS", num("lds")),
            ("waves/SIMD", num("occupancy")),
            ("MFMA", num("mfma")),
        ]
    else:
        cols += [
            ("regs", num("vgprs")),
            ("spill B", num("spills")),
            ("stack", num("scratch")),
            ("smem", num("lds")),
            ("blk/SM", num("occupancy")),
            ("MMA", num("mfma")),
        ]
    mm = "MFMA" if is_amd_arch(arch) else "MMA"
    cols += [("expects", lambda r: mm if r.expects_mfma else "-"), ("status", status)]
    return cols


def _aligned(cells: list[list[str]], left: set[str]) -> str:
    """Plain-text table of ``cells`` (first row the headers): columns named in ``left`` are
    left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    heads = cells[0]
    return "\n".join(
        "  ".join(
            c[i].ljust(widths[i]) if heads[i] in left else c[i].rjust(widths[i]) for i in range(len(heads))
        ).rstrip()
        for c in cells
    )


def format_table(rows: list[Row], arch: str) -> str:
    """Aligned plain-text table, one line per row (text columns left, numbers right)."""
    cols = _columns(arch)
    cells = [[h for h, _ in cols]] + [[f(r) for _, f in cols] for r in rows]
    return _aligned(cells, {"kernel", "config", "backend", "expects", "status"})


def summary(rows: list[Row]) -> str:
    """A few lines for ``rocm-mla doctor``: counts, failures, and the worst figures."""
    if not rows:
        return "isa-report: no kernels"
    arch = rows[0].arch
    peer_rows = [r for r in rows if r.peer]
    rows = [r for r in rows if not r.peer]
    built = [r for r in rows if not (r.error or r.skipped)]
    by_backend = {b: sum(1 for r in rows if r.backend == b) for b in ("triton", "hip")}
    failed = [r for r in rows if r.problems]
    lines = [
        f"isa-report {arch}: {len(rows)} kernel configs ({by_backend['triton']} triton, "
        f"{by_backend['hip']} hip); {len(built)} compiled, {len(failed)} failing, "
        f"{sum(1 for r in rows if r.error)} errors, {sum(1 for r in rows if r.skipped)} skipped"
    ]
    for r in peer_rows:
        figs = (
            "skipped: " + r.skipped
            if r.skipped
            else "error: " + error_digest(r.error)
            if r.error
            else f"{r.vgprs} VGPRs, {r.spills} spills, {r.scratch} B scratch, LDS {r.lds}, occupancy {r.occupancy}"
        )
        lines.append(f"  peer {label(r)}: {figs}")

    def worst(attr: str, pick=max) -> str:
        vals = [r for r in built if getattr(r, attr) is not None]
        if not vals:
            return "-"
        r = pick(vals, key=lambda x: getattr(x, attr))
        return f"{getattr(r, attr)} ({label(r)})"

    reg = "VGPRs" if is_amd_arch(arch) else "registers"
    occ = "waves/SIMD" if is_amd_arch(arch) else "blocks/SM"
    lines.append(f"  max {reg}: {worst('vgprs')}; max LDS bytes: {worst('lds')}")
    lines.append(f"  min occupancy ({occ}): {worst('occupancy', min)}")
    lines.append(
        f"  with matrix instructions: {sum(1 for r in built if r.mfma)} "
        f"(expected in {sum(1 for r in rows if r.expects_mfma)})"
    )
    noted = [r for r in rows if r.notes and not r.problems]
    if noted:
        lines.append(f"  passing with a note: {len(noted)} (e.g. {label(noted[0])}: {noted[0].notes[0]})")
    for r in failed[:5]:
        lines.append(f"  FAIL {label(r)}: {'; '.join(r.problems)}")
    if len(failed) > 5:
        lines.append(f"  ... and {len(failed) - 5} more")
    return "\n".join(lines)


# MACs of one MLA decode row and key (q.k over 576 columns, p.v over 512), per 16x16x16 MFMA.
_MFMA_PER_16X16 = 16 * 16 * (576 + 512) / (16 * 16 * 16)


def decode_side_by_side(arch: str, rows: list[Row], variants: list) -> str:
    """Our decode stage-1 tiers (bf16 q and cache, one split) beside aiter's decode (the peer rows
    of ``rows``), with the matrix instructions one KV tile issues per 16 rows x 16 keys, summed over
    the workgroup's waves (the ideal is 68 MFMA 16x16x16: 36 for q.k over 576 columns, 32 for p.v
    over 512; more means waves repeat work, e.g. every wave computing the same 16-row scores).
    ``variants``: the TritonVariants the rows were compiled from (tile shapes, warps)."""
    by_config = {v.config: v for v in variants}
    picked = []
    for r in rows:
        v = by_config.get(r.config)
        if v is None:
            continue
        ours = r.kernel == "mla_decode_stage1" and r.config.startswith("q=bf16 kv=bf16") and r.config.endswith("direct")
        if ours or r.kernel == "aiter_mla_decode_stage1":
            picked.append((v, r))
    lines = [f"decode side by side on {arch} (bf16 q and cache, one split; the aiter rows are not gated)"]
    if not any(r.peer for _, r in picked):
        skipped = [r for r in rows if r.kernel == "aiter_mla_decode_stage1" and r.skipped]
        lines.append(
            "aiter's decode not compiled: "
            + (
                skipped[0].skipped
                if skipped
                else "no peer rows (perf/peers/get_aiter_peers.sh .peers/aiter, or --no-peers was given)"
            )
        )
    head = [
        "kernel",
        "config",
        "rows x keys",
        "VGPR" if is_amd_arch(arch) else "regs",
        "spills",
        "scratch",
        "LDS",
        "occupancy",
        "MFMA/wave/tile",
        "MFMA per 16x16",
        "status",
    ]
    table = [head]
    for v, r in picked:
        bh, bn = int(v.constexprs.get("BLOCK_H", 0)), int(v.constexprs.get("BLOCK_N", 0))
        waves = int(v.options.get("num_warps", 4))  # the count is per wave: a tile's total is waves x it
        per = "-" if not (r.mfma and bh and bn) else f"{r.mfma * waves / (bh / 16) / (bn / 16):.0f}"
        status = "error: " + error_digest(r.error) if r.error else ("; ".join(_gate(r)) or "ok")
        table.append(
            [
                r.kernel,
                r.config,
                f"{bh} x {bn}",
                *(("-" if x is None else str(x)) for x in (r.vgprs, r.spills, r.scratch, r.lds, r.occupancy, r.mfma)),
                per,
                status,
            ]
        )
    lines.append(_aligned(table, {"kernel", "config", "rows x keys", "status"}))
    lines.append(f"ideal MFMA per 16 rows x 16 keys (16x16x16 instructions): {_MFMA_PER_16X16:.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rocm-mla isa-report``; returns the exit status (0 ok, 1 a row failed)."""
    ap = argparse.ArgumentParser(
        prog="rocm-mla isa-report",
        description="Compile every kernel configuration ahead of time (no GPU needed) and report registers, "
        "spills, scratch, LDS, occupancy and MFMA use; exit 1 when a row fails.",
    )
    ap.add_argument("--arch", choices=sorted(ARCHS), default="gfx942", help="target (default gfx942)")
    ap.add_argument("--filter", metavar="SUBSTR", help="only rows whose kernel/config/backend contain SUBSTR")
    ap.add_argument("--json", metavar="PATH", help="also write the rows to PATH as JSON")
    ap.add_argument(
        "--strict", action="store_true", help="fail when a compiler is missing (rows skipped); CI passes this"
    )
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-compile progress on stderr")
    ap.add_argument(
        "--no-peers",
        action="store_true",
        help="skip the peers' kernels (aiter's MHA forward and MLA decode, from $ROCM_MLA_AITER_PEERS "
        "or .peers/aiter, made by perf/peers/get_aiter_peers.sh); they are reported beside ours, "
        "never gated",
    )
    args = ap.parse_args(argv)
    # The report needs Triton's compiler; an interpreter switch leaked from the shell (or the CPU
    # test set-up) would make every kernel imported from here on an InterpretedFunction.
    os.environ.pop("TRITON_INTERPRET", None)

    rows = collect(args.arch, args.filter, progress=not args.quiet, peers=not args.no_peers)
    if not rows:
        print(
            f"isa-report: no kernel matches filter {args.filter!r}"
            if args.filter
            else "isa-report: found no kernels to compile",
            file=sys.stderr,
        )
        return 1
    print(format_table(rows, args.arch))
    if not args.no_peers and any(r.kernel == "mla_decode_stage1" for r in rows):
        from rocm_mla.variants import all_triton_variants

        from .peer_variants import aiter_decode_variants

        variants = all_triton_variants(args.arch)
        try:
            variants += aiter_decode_variants(args.arch)
        except Exception:  # the peer rows say why
            pass
        print()
        print(decode_side_by_side(args.arch, rows, variants))
    if args.json:
        Path(args.json).write_text(json.dumps([dict(asdict(r), status=r.status) for r in rows], indent=1) + "\n")
    bad = failures(rows, strict=args.strict)
    skipped = [r for r in rows if r.skipped and not r.peer]
    print()
    if bad:
        print(f"{len(bad)} of {len(rows)} rows failed:")
        for r, why in bad:
            print(f"  {label(r)}: {'; '.join(why)}")
            if r.error and "\n" in r.error:  # the digest above hides context; show it all
                print("    " + r.error.replace("\n", "\n    "))
        return 1
    note = f" ({len(skipped)} skipped; pass --strict to fail on that)" if skipped else ""
    own = [r for r in rows if not r.peer]
    peer_note = f"; {len(rows) - len(own)} peer rows reported, not gated" if len(own) < len(rows) else ""
    print(f"all {len(own) - len(skipped)} compiled rows pass{note}{peer_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
