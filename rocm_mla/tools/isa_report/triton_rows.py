"""A ``Row`` from one ``TritonVariant``: compiled ahead of time by ``triton_compile`` and read by the
target's parser. Triton allocates LDS dynamically, so the asm says 0 and LDS comes from
``metadata.shared``; the AMD asm's Occupancy then ignores LDS and is combined with it here."""

from __future__ import annotations

from typing import Any

from ...configs import is_amd_arch
from . import triton_compile as tc
from .amdgcn import amd_occupancy, parse_amdgcn
from .kv_loop import main_loop_stats
from .rows import ARCHS, Row, error_text
from .sm90 import local_memory_in_loops, main_loop_sass, parse_ptx_ptxas, sm90_blocks_per_sm


def triton_row(v: Any, arch: str) -> Row:
    """The ungated row of variant ``v`` for ``arch``; a compile failure is the row's ``error``."""
    row = Row(
        kernel=v.kernel,
        config=v.config,
        backend="triton",
        arch=arch,
        expects_mfma=bool(v.expects_mfma),
        resident=int(getattr(v, "resident", 0)),
        source=f"{getattr(getattr(v.fn, 'fn', v.fn), '__module__', '?')}.{getattr(v.fn, '__name__', '?')}",
    )
    try:
        art = tc.compile_variant(v, arch)
        if is_amd_arch(arch):
            res = next(iter(parse_amdgcn(art.isa).values()))
            row.vgprs, row.agprs, row.sgprs = res["vgprs"], res["agprs"], res["sgprs"]
            row.spills, row.scratch, row.mfma = res["spills"], res["scratch"], res["mfma"]
            row.lds = max(art.shared, res["lds"])
            row.occupancy = amd_occupancy(res["occupancy"], row.lds, art.num_warps, arch)
            # a workgroup's waves spread over the CU's SIMDs: waves a SIMD x SIMDs / its waves
            row.programs = row.occupancy * ARCHS[arch].simds_per_cu // art.num_warps
            loop = main_loop_stats(art.isa)
            row.loop = loop.as_dict() if loop else None
        else:
            res = next(iter(parse_ptx_ptxas(art.isa, art.ptxas_log).values()))
            row.vgprs, row.spills, row.scratch, row.mfma = res["vgprs"], res["spills"], res["scratch"], res["mfma"]
            row.lds = max(art.shared, res["lds"])  # Triton's smem is dynamic: ptxas sees 0
            row.occupancy = row.programs = sm90_blocks_per_sm(row.vgprs, row.lds, art.num_warps * 32)
            if art.sass:
                placed = local_memory_in_loops(art.sass)
                row.local_in_loops, row.local_in_outer_loops = placed.innermost, placed.outer
                sass_loop = main_loop_sass(art.sass)
                row.sass_loop = sass_loop._asdict() if sass_loop else None
    except StopIteration:
        row.error = "compiler output has no kernel resource information"
    except Exception as e:  # one bad variant must not hide the others
        row.error = error_text(e)
    return row
