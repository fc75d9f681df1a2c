"""The report's row model: one ``Row`` per kernel/config, the per-architecture limits the gate
uses, and the helpers that turn compiler errors and filters into row text."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ArchInfo:
    """Per-architecture limits the gate and the occupancy estimate use."""

    lds_limit: int  # bytes of LDS / shared memory one workgroup may use
    simds_per_cu: int = 4


ARCHS = {
    # MI300 (CDNA3): 64 KiB LDS per CU, 4 SIMDs per CU, 8 waves per SIMD at most.
    "gfx942": ArchInfo(lds_limit=64 * 1024),
    # MI350X/MI355X (CDNA4): 160 KiB LDS per CU (one workgroup may take all of it), the same
    # register file and wave limits, and MFMA with twice the K per instruction for 16-bit and fp8.
    "gfx950": ArchInfo(lds_limit=160 * 1024),
    # H100/H200: up to 227 KiB of shared memory per block (opt-in). The 64 KiB rule is MI300's,
    # so failing sm90 rows above 64 KiB would reject legal sm90-only configs.
    "sm90": ArchInfo(lds_limit=227 * 1024),
}


@dataclass
class Row:
    """One kernel/config of the report. ``None`` figures were not available (shown as ``-``).

    vgprs: gfx942/gfx950: VGPRs incl. AGPRs (one unified 512-register file per lane on CDNA3/4);
        sm90: registers per thread.
    spills: gfx942/gfx950: spilled VGPRs + SGPRs (count); sm90: spill store + load bytes.
    scratch: gfx942/gfx950: ScratchSize (bytes per lane); sm90: stack frame (bytes per thread).
    lds: bytes of LDS / shared memory per workgroup.
    occupancy: gfx942/gfx950: waves per SIMD, LDS-aware; sm90: blocks per SM (Triton rows only).
    programs: workgroups (blocks) a CU (SM) holds at once: gfx942/gfx950 waves per SIMD x 4 SIMDs
        over the workgroup's waves; sm90 blocks per SM (Triton rows only).
    resident: the programs a CU (SM) the variant's persistent grid places at once (0: none
        claimed); a row holding fewer fails the gate.
    mfma: matrix instructions in the code: ``v_mfma`` (gfx942/gfx950), ``mma``/``wgmma`` (sm90 PTX).
    local_in_loops: sm90: local-memory instructions (``LDL``/``STL``: spill traffic) inside an
        innermost loop of the SASS (paid every iteration), or None when the SASS was not available.
    local_in_outer_loops: sm90: those in loops but only in the own body of loops that enclose
        others (paid once an outer iteration, e.g. once a persistent kernel's work item).
    loop: gfx942/gfx950 Triton rows: figures of the kernel's main loop (``kv_loop.LoopStats``
        as a dict), None when it has none.
    sass_loop: sm90 Triton rows whose SASS was read: its main loop (``sm90.SassLoop`` as a dict),
        None when it has none.
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
    programs: int | None = None
    resident: int = 0
    mfma: int | None = None
    expects_mfma: bool = False
    source: str = ""
    skipped: str = ""
    error: str = ""
    local_in_loops: int | None = None
    local_in_outer_loops: int | None = None
    loop: dict | None = None
    sass_loop: dict | None = None
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


def label(r: Row) -> str:
    """``backend kernel config`` for messages (no trailing ``-`` for untemplated kernels)."""
    return " ".join(x for x in (r.backend, r.kernel, r.config) if x and x != "-")


def matches(filt: str | None, *parts: str) -> bool:
    """Whether ``--filter filt`` keeps a row described by ``parts`` (case-insensitive substring)."""
    return filt is None or filt.lower() in " ".join(parts).lower()


def error_text(e: BaseException) -> str:
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
