"""The peers' rows: aiter's kernels (``rocm_mla.tools.peer_variants``: its MHA forward beside
mla_prefill, its MLA decode beside mla_decode) compiled with their MI300X configs as ungated rows,
and the decode side-by-side table. A peer that cannot be loaded is a skipped row, never a failure."""

from __future__ import annotations

from ...configs import is_amd_arch
from .decode_view import LOOP_HEADERS, loop_cells
from .gate import gate_problems
from .output import aligned
from .rows import Row, error_digest, error_text, matches


def list_peer_variants(arch: str, filter: str | None) -> tuple[list, list[Row]]:
    """``(variants, skipped rows)``: the peers' ``TritonVariant``s for ``arch`` that ``filter`` keeps,
    and one skipped row per peer whose tree is missing or fails to import."""
    from ..peer_variants import (
        AITER_DECODE_KERNEL,
        AITER_KERNEL,
        aiter_decode_variants,
        aiter_mha_variants,
        aiter_peers_dir,
    )

    variants: list = []
    skipped: list[Row] = []
    for kernel, what, make in (
        (AITER_KERNEL, "mla_prefill peer", aiter_mha_variants),
        (AITER_DECODE_KERNEL, "mla_decode peer", aiter_decode_variants),
    ):
        if not matches(filter, kernel, what, "aiter"):
            continue
        try:
            variants += [v for v in make(arch) if matches(filter, v.kernel, v.config, "aiter")]
        except Exception as e:  # no peer folder, or aiter's tree fails to import: say so, do not fail
            skipped.append(
                Row(
                    kernel=kernel,
                    config=what,
                    backend="aiter",
                    arch=arch,
                    peer=True,
                    skipped=f"aiter unavailable ({aiter_peers_dir()}): {error_text(e)[:300]}",
                )
            )
    return variants, skipped


def side_by_side_variants(arch: str) -> list:
    """The variants :func:`decode_side_by_side` reads tile shapes from: ours, and aiter's decode
    when its tree loads (when it does not, the peer rows say why)."""
    from rocm_mla.variants import all_triton_variants

    from ..peer_variants import aiter_decode_variants

    variants = all_triton_variants(arch)
    try:
        variants += aiter_decode_variants(arch)
    except Exception:  # the peer rows say why
        pass
    return variants


# MACs of one MLA decode row and key (q.k over 576 columns, p.v over 512), per 16x16x16 MFMA.
_MFMA_PER_16X16 = 16 * 16 * (576 + 512) / (16 * 16 * 16)


def decode_side_by_side(arch: str, rows: list[Row], variants: list) -> str:
    """Our decode stage-1 tiers (bf16 q and cache, one split) beside aiter's decode (the peer rows
    of ``rows``), with the matrix instructions one KV tile issues per 16 rows x 16 keys, summed over
    the workgroup's waves (the ideal is 68 MFMA 16x16x16: 36 for q.k over 576 columns, 32 for p.v
    over 512; more means waves repeat work, e.g. every wave computing the same 16-row scores; a
    gfx950 16x16x32 instruction does the work of two); on AMD arches also the KV loop per KV row
    (``decode_view.loop_cells``).
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
        *(LOOP_HEADERS if is_amd_arch(arch) else []),
        "status",
    ]
    table = [head]
    for v, r in picked:
        bh, bn = int(v.constexprs.get("BLOCK_H", 0)), int(v.constexprs.get("BLOCK_N", 0))
        waves = int(v.options.get("num_warps", 4))  # the count is per wave: a tile's total is waves x it
        per = "-" if not (r.mfma and bh and bn) else f"{r.mfma * waves / (bh / 16) / (bn / 16):.0f}"
        status = "error: " + error_digest(r.error) if r.error else ("; ".join(gate_problems(r)) or "ok")
        table.append(
            [
                r.kernel,
                r.config,
                f"{bh} x {bn}",
                *(("-" if x is None else str(x)) for x in (r.vgprs, r.spills, r.scratch, r.lds, r.occupancy, r.mfma)),
                per,
                *(loop_cells(r, v) if is_amd_arch(arch) else []),
                status,
            ]
        )
    lines.append(aligned(table, {"kernel", "config", "rows x keys", "MFMA shapes", "status"}))
    lines.append(f"ideal MFMA per 16 rows x 16 keys (16x16x16 instructions): {_MFMA_PER_16X16:.0f}")
    return "\n".join(lines)
