"""The main loop of an AMDGCN kernel (gfx942, gfx950), read from the assembly text: what one wave
issues per iteration, and how many times per iteration it stops for global memory with nothing
else in flight.

For a decode kernel one iteration is one KV tile, so these are the figures the decode view
divides by BLOCK_N (per KV row) and multiplies by the workgroup's waves.

How the loop is found: LLVM's asm printer annotates every basic block of a loop, on its label
line (``.LBB0_40:`` or ``; %bb.41:``) and the comment lines right under it, with
``Loop Header: Depth=D`` (the header) or ``in Loop: Header=BB0_40`` / ``Parent Loop BB0_40``
(blocks inside it, nested loops included). A loop is its header's blocks; the main loop is the
one with the most MFMA (then the most instructions). Blocks are counted as written, each once:
a branch that skips a block (a masked-off load) is not modelled.

How the round trips are counted (``drains``): on gfx9 every global/buffer/flat load and store
of a wave increments its ``vmcnt`` counter and ``s_waitcnt vmcnt(N)`` stalls until at most N are
outstanding. A ``vmcnt(0)`` wait reached with at least one such access issued since the previous
``vmcnt(0)`` waits for the last of them to come back from memory and leaves nothing in flight: a
full memory latency this wave cannot overlap with a later load (only other waves on the SIMD can
hide it, and at one wave per SIMD nothing does). A ``vmcnt(N>0)`` wait keeps N accesses in
flight and is not counted; neither is a ``vmcnt(0)`` with nothing outstanding. Scalar loads
(``s_load``/``s_buffer_load``: a uniform address, e.g. a block-table entry) count on
``lgkmcnt`` instead; a ``lgkmcnt(0)`` reached with one outstanding is a round trip the same way
(one ``s_waitcnt`` that drains both kinds is one round trip). The loop is
walked twice, as a cycle, so that an access issued at the bottom and waited for at the top of
the next iteration (a rotated loop) counts once. ``drains`` is therefore the number of serial
global-memory round trips one iteration makes, a lower bound on its latency in round trips.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

_LABEL_RE = re.compile(r"^(?:\.L(BB\d+_\d+):|; %bb\.\d+:)(.*)$")
_HEADER_RE = re.compile(r"Loop Header: Depth=\d+")
_MEMBER_RE = re.compile(r"(?:in Loop: Header|Parent Loop)=?\s*(BB\d+_\d+)")
_INSN_RE = re.compile(r"^\s+([a-z_][a-z0-9_]*)\b(.*)$")
_VMCNT_RE = re.compile(r"\bvmcnt\((\d+)\)")
_VMEM_RE = re.compile(r"^(?:global|buffer|flat)_(?:load|store)")
_SMEM_RE = re.compile(r"^s_(?:buffer_)?load_")
_LGKMCNT_RE = re.compile(r"\blgkmcnt\((\d+)\)")
_LDS_RE = re.compile(r"^ds_(?:read|write|load|store)(2st64|2)?_[bui](\d+)")
WAVE = 64  # lanes per wave on CDNA


@dataclass
class LoopStats:
    """Per wave and per iteration of the main loop.

    instructions: machine instructions; mfma: ``v_mfma``/``v_smfmac``; mfma_shapes: their
    mnemonics (e.g. ``v_mfma_f32_16x16x32_bf16``); vmem: global/buffer/flat loads and stores
    (scalar loads are not counted here, only in ``drains``);
    lds_bytes: bytes the wave's ``ds_read``/``ds_write`` move (lane width x 64 lanes, pairs
    twice); drains: serial global round trips (the module docstring); barriers: ``s_barrier``.
    """

    instructions: int = 0
    mfma: int = 0
    vmem: int = 0
    lds_bytes: int = 0
    drains: int = 0
    barriers: int = 0
    mfma_shapes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The fields as a plain dict (what ``Row.loop`` holds)."""
        return asdict(self)


def _blocks(text: str) -> list[tuple[str | None, str, list[tuple[str, str]]]]:
    """``(label, annotation, instructions)`` per basic block in text order; ``label`` is the
    ``BBx_y`` name (None for an unnamed ``; %bb.N`` block), ``instructions`` (mnemonic, operands)."""
    out: list[tuple[str | None, str, list[tuple[str, str]]]] = []
    cur: tuple[str | None, str, list[tuple[str, str]]] | None = None
    in_header_comments = False
    for line in text.splitlines():
        m = _LABEL_RE.match(line)
        if m:
            cur = (m.group(1), m.group(2), [])
            out.append(cur)
            in_header_comments = True
            continue
        if cur is None:
            continue
        stripped = line.strip()
        if stripped.startswith(";"):
            if in_header_comments:  # the annotation continues on comment lines under the label
                cur = (cur[0], cur[1] + " " + stripped, cur[2])
                out[-1] = cur
            continue
        in_header_comments = False
        im = _INSN_RE.match(line)
        if im and not stripped.startswith("."):
            cur[2].append((im.group(1), im.group(2)))
        elif stripped.startswith(".end_amdhsa_kernel") or stripped.startswith(".Lfunc_end"):
            cur = None
    return out


def loops(text: str) -> dict[str, list[tuple[str, str]]]:
    """Every loop of the assembly text: header name (``BB0_40``) -> its instructions in text order."""
    blocks = _blocks(text)
    out: dict[str, list[tuple[str, str]]] = {}
    for label, note, _ in blocks:
        if label and _HEADER_RE.search(note):
            out[label] = []
    for label, note, insns in blocks:
        members = set(_MEMBER_RE.findall(note))
        if label in out:
            members.add(label)
        for h in members & set(out):
            out[h].extend(insns)
    return out


def loop_stats(insns: list[tuple[str, str]]) -> LoopStats:
    """The figures of one loop body (``loops()`` values), per wave and iteration."""
    st = LoopStats()
    shapes: set[str] = set()
    for mn, _ in insns:
        st.instructions += 1
        if mn.startswith(("v_mfma", "v_smfmac")):
            st.mfma += 1
            shapes.add(mn)
        elif _VMEM_RE.match(mn):
            st.vmem += 1
        elif mn == "s_barrier":
            st.barriers += 1
        lm = _LDS_RE.match(mn)
        if lm:
            st.lds_bytes += int(lm.group(2)) // 8 * (2 if lm.group(1) else 1) * WAVE
    vm = sm = 0  # vector / scalar loads outstanding since the last wait that drained them
    for lap in (0, 1):  # the first lap only carries what is outstanding at the bottom into the top
        for mn, ops in insns:
            if _VMEM_RE.match(mn):
                vm += 1
            elif _SMEM_RE.match(mn):
                sm += 1
            elif mn == "s_waitcnt":
                v, g = _VMCNT_RE.search(ops), _LGKMCNT_RE.search(ops)
                drained_v = bool(v and int(v.group(1)) == 0 and vm)
                drained_s = bool(g and int(g.group(1)) == 0 and sm)
                if lap and (drained_v or drained_s):
                    st.drains += 1
                vm = 0 if v and int(v.group(1)) == 0 else vm
                sm = 0 if g and int(g.group(1)) == 0 else sm
    st.mfma_shapes = sorted(shapes)
    return st


def main_loop_stats(text: str) -> LoopStats | None:
    """Figures of the main loop (most MFMA, then most instructions) of the first kernel in
    ``text``; None when it has no loop."""
    found = loops(text)
    if not found:
        return None
    stats = [loop_stats(body) for body in found.values()]
    return max(stats, key=lambda s: (s.mfma, s.instructions))
