"""``rocm-mla isa-report``: register, spill, LDS, occupancy and MFMA figures of every kernel.

Compiles ahead of time, on a machine without a GPU, every kernel configuration the package can
launch -- the Triton variants listed by ``rocm_mla.variants.all_triton_variants`` and every
HIP kernel instantiated by ``hip_src/isa/*.cu`` -- for gfx942 (MI300), gfx950 (MI350) or sm90
(H100/H200), and
prints one row per kernel/config. A row fails when the kernel uses scratch or spills registers,
needs more LDS than the chip has, or should use matrix instructions (``tl.dot``, or a HIP kernel
marked ``// isa-report: expects-mfma SUBSTR``) and has none. Exit status 1 when any row fails.
One exception, sm90 Triton rows only: when the SASS (``nvdisasm``) shows no local-memory access
inside an innermost loop (all outside loops, or in an outer loop's own body: once an outer
iteration, e.g. once a persistent kernel's work item), the spill is noted in the status column
("ok (... spilled ...; no local-memory access inside a loop)", or how many sit in outer loops)
instead of failing the row.

Where the figures come from:
  gfx942, gfx950  the AMDGCN text (Triton's ``asm["amdgcn"]``; for HIP ``-S`` of clang-19 on gfx942,
          clang-22 on gfx950, which clang-19 does not know): the per-kernel
          "; Kernel info:" comments (VGPR/AGPR/SGPR, ScratchSize, Occupancy, LDSByteSize) and the
          ``.amdgpu_metadata`` YAML (spill counts, workgroup size); MFMA = ``v_mfma`` lines.
          Triton allocates LDS dynamically, so the text says 0 and LDS comes from
          ``metadata.shared``; the asm's Occupancy then ignores LDS and is combined with it here
          (64 KiB per CU on gfx942, 160 KiB on gfx950). The main loop's figures per iteration
          (instructions, MFMA, LDS bytes, serial global round trips) come from ``kv_loop``.
  sm90    PTX (Triton's, or nvcc ``-ptx``) run through ``ptxas -v``: registers, stack frame,
          spill bytes, static smem; MMA = ``mma.sync``/``wgmma.mma_async`` lines in the PTX.

Modules: ``rows`` (the Row model, per-arch limits), ``amdgcn`` (AMDGCN text: gfx942, gfx950) and
``sm90`` (parsers, occupancy), ``kv_loop`` (the main loop of AMDGCN text), ``decode_view`` (the
decode tiers of gfx942 and gfx950 side by side),
``gate`` (pass/fail), ``triton_rows``, ``hip_rows`` and ``peers`` (a Row per compiled kernel, with
``triton_compile`` and ``hip_compile`` running the compilers), ``collect`` (all rows of one arch),
``output`` (table, summary, JSON), ``cli`` (the command).
"""

from .amdgcn import amd_occupancy, parse_amdgcn
from .cli import main
from .collect import collect
from .decode_view import decode_tiers
from .gate import check, failures, notes
from .kv_loop import LoopStats, main_loop_stats
from .output import format_table, summary, write_json
from .peers import decode_side_by_side
from .rows import ARCHS, ArchInfo, Row, error_digest, label
from .sm90 import local_memory_in_loops, parse_ptx_ptxas, sm90_blocks_per_sm

__all__ = [
    "ARCHS",
    "ArchInfo",
    "LoopStats",
    "Row",
    "check",
    "collect",
    "amd_occupancy",
    "decode_side_by_side",
    "decode_tiers",
    "error_digest",
    "failures",
    "format_table",
    "label",
    "local_memory_in_loops",
    "main",
    "main_loop_stats",
    "notes",
    "parse_amdgcn",
    "parse_ptx_ptxas",
    "sm90_blocks_per_sm",
    "summary",
    "write_json",
]
