"""sm90 (H100/H200) figures from PTX (Triton's, or nvcc ``-ptx``) and its ``ptxas -v`` log: registers,
stack frame, spill bytes, static smem, MMA = ``mma.sync``/``wgmma.mma_async`` lines in the PTX; where
the loops of the SASS (``nvdisasm -c``) put the spill traffic; blocks per SM."""

from __future__ import annotations

import math
import re
from typing import NamedTuple

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
_SASS_EXIT_RE = re.compile(r"EXIT\b")  # unpredicated: a predicated one reads "@P0 EXIT"
_SASS_MMA_RE = re.compile(r"\b(?:HMMA|HGMMA|QGMMA|IMMA)\b")
_SASS_GLOBAL_LOAD_RE = re.compile(r"\bLDG(?:STS)?\b")
_SASS_PREDICATE_RE = re.compile(r"@!?U?P")


class LocalMemory(NamedTuple):
    """Where a kernel's local-memory instructions (``LDL``/``STL``: spill traffic) sit in its loops."""

    innermost: int  # in a loop that encloses no other loop: paid on every iteration of a hot loop
    outer: int  # in loops, but each one's nearest loop encloses others: paid once an outer iteration
    total: int


def _sass_loops(sass: str) -> tuple[list[tuple[int, str]], list[tuple[int, int]]]:
    """``(instructions, loops)`` of one kernel's SASS (``nvdisasm -c``): every instruction as
    ``(address, text)``, and every loop as the address range ``(lo, hi)`` from a branch target to
    a branch back to it, unless an unpredicated ``EXIT`` lies in between: ptxas places slow paths
    (``BRA.DIV``'s) past the kernel's exit and returns from them with a backward branch that
    repeats nothing."""
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
    exits = [a for a, t in insns if _SASS_EXIT_RE.match(t)]
    loops = []
    for addr, text in insns:
        b = _SASS_BRA_RE.search(text)
        if b and b.group(1) in labels and labels[b.group(1)] <= addr:
            lo = labels[b.group(1)]
            if not any(lo <= e < addr for e in exits):
                loops.append((lo, addr))
    return insns, loops


def _encloses_another(loop: tuple[int, int], loops: list[tuple[int, int]]) -> bool:
    return any(o != loop and loop[0] <= o[0] and o[1] <= loop[1] for o in loops)


def local_memory_in_loops(sass: str) -> LocalMemory:
    """Where the local-memory instructions of one kernel's SASS (``nvdisasm -c``) run, in the
    loops ``_sass_loops`` finds.

    Spilled registers cost their local-memory traffic where that traffic runs: a spill stored
    once before the main loop and reloaded after it is a few instructions per thread; one inside
    an innermost loop is paid on every iteration; one in an outer loop's own body (e.g. a
    persistent kernel's loop over work items, reloading a pointer once an item) once per outer
    iteration, beside the inner loops' whole trip.
    """
    insns, loops = _sass_loops(sass)
    innermost = outer = total = 0
    for a, t in insns:
        if not _SASS_LOCAL_RE.search(t):
            continue
        total += 1
        around = [lp for lp in loops if lp[0] <= a <= lp[1]]
        if around:
            nearest = min(around, key=lambda lp: lp[1] - lp[0])
            if _encloses_another(nearest, loops):
                outer += 1
            else:
                innermost += 1
    return LocalMemory(innermost, outer, total)


class SassLoop(NamedTuple):
    """One loop of a kernel's SASS, per warp and iteration (blocks counted as written, each once)."""

    instructions: int
    mma: int  # HMMA / HGMMA / QGMMA (fp8 wgmma) / IMMA
    global_loads: int  # LDG, and LDGSTS (cp.async into shared memory)
    predicated: int  # instructions under a predicate (@P / @!P): masked loads, selects, branches


def main_loop_sass(sass: str) -> SassLoop | None:
    """The main loop of one kernel's SASS: of the innermost loops ``_sass_loops`` finds (those that
    enclose no other), the one with the most MMA instructions, then the most instructions (None
    without a loop). A branch to itself is not one: ptxas ends a kernel with one past its exit."""
    insns, loops = _sass_loops(sass)
    best: SassLoop | None = None
    loops = [lp for lp in loops if lp[0] < lp[1]]
    for lo, hi in (lp for lp in loops if not _encloses_another(lp, loops)):
        body = [t for a, t in insns if lo <= a <= hi]
        loop = SassLoop(
            instructions=len(body),
            mma=sum(1 for t in body if _SASS_MMA_RE.search(t)),
            global_loads=sum(1 for t in body if _SASS_GLOBAL_LOAD_RE.search(t)),
            predicated=sum(1 for t in body if _SASS_PREDICATE_RE.match(t)),
        )
        if best is None or (loop.mma, loop.instructions) > (best.mma, best.instructions):
            best = loop
    return best


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
