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

Modules: ``rows`` (the Row model, per-arch limits), ``gfx942`` and ``sm90`` (parsers, occupancy),
``gate`` (pass/fail), ``triton_rows``, ``hip_rows`` and ``peers`` (a Row per compiled kernel, with
``triton_compile`` and ``hip_compile`` running the compilers), ``collect`` (all rows of one arch),
``output`` (table, summary, JSON), ``cli`` (the command).
"""

from .cli import main
from .collect import collect
from .gate import check, failures, notes
from .gfx942 import gfx942_occupancy, parse_amdgcn
from .output import format_table, summary, write_json
from .peers import decode_side_by_side
from .rows import ARCHS, ArchInfo, Row, error_digest, label
from .sm90 import local_memory_in_loops, parse_ptx_ptxas, sm90_blocks_per_sm

__all__ = [
    "ARCHS",
    "ArchInfo",
    "Row",
    "check",
    "collect",
    "decode_side_by_side",
    "error_digest",
    "failures",
    "format_table",
    "gfx942_occupancy",
    "label",
    "local_memory_in_loops",
    "main",
    "notes",
    "parse_amdgcn",
    "parse_ptx_ptxas",
    "sm90_blocks_per_sm",
    "summary",
    "write_json",
]
