"""The peers' rows: aiter's kernels (perf/peer_variants.py: its MHA forward beside mla_prefill, its
MLA decode beside mla_decode) compiled with their MI300X configs as ungated rows, and the decode
side-by-side table. A peer that cannot be loaded is a skipped row, never a failure.

The peers' variants are a development tool and stay out of the wheel: they are loaded from the
repository's perf/ folder (beside this package in a checkout or an editable install, else in the
working directory). Without one, a single skipped row says where they come from."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from ...configs import is_amd_arch
from .decode_view import LOOP_HEADERS, loop_cells
from .gate import gate_problems
from .output import aligned
from .rows import Row, error_digest, error_text, matches

AITER_KERNEL = "aiter_mha_fwd"
AITER_DECODE_KERNEL = "aiter_mla_decode_stage1"
# The one row that stands for every peer when perf/peer_variants.py cannot be loaded.
PEERS_ROW = "aiter_peers"
PEERS_NEED_PERF = (
    "the peers' variants come with the repository's perf/ folder (perf/peer_variants.py), not with "
    "the wheel: run from a checkout, or pass --no-peers"
)


class PeerVariantsMissing(RuntimeError):
    """No perf/peer_variants.py beside the package or in the working directory."""


def perf_dir() -> Path | None:
    """The repository's perf/ folder holding peer_variants.py: the one beside this package's source
    tree (a checkout, an editable install), else the working directory's; None when neither has
    one (an installed wheel run outside a checkout)."""
    for root in (Path(__file__).resolve().parents[3], Path.cwd()):
        if (root / "perf" / "peer_variants.py").is_file():
            return root / "perf"
    return None


def load_peer_variants():
    """perf/peer_variants.py, imported as ``peer_variants`` with perf/ appended to ``sys.path`` (where
    it finds ``benchutil``, as the perf scripts do). Raises :class:`PeerVariantsMissing`
    (:data:`PEERS_NEED_PERF`) without a perf/ folder."""
    perf = perf_dir()
    if perf is None:
        raise PeerVariantsMissing(PEERS_NEED_PERF)
    if str(perf) not in sys.path:
        sys.path.append(str(perf))
    return importlib.import_module("peer_variants")


def list_peer_variants(arch: str, filter: str | None) -> tuple[list, list[Row]]:
    """``(variants, skipped rows)``: the peers' ``TritonVariant``s for ``arch`` that ``filter`` keeps,
    and one skipped row per peer whose tree is missing or fails to import (one row for all of them
    when perf/peer_variants.py cannot be loaded)."""
    wanted = [
        (kernel, what, make)
        for kernel, what, make in (
            (AITER_KERNEL, "mla_prefill peer", "aiter_mha_variants"),
            (AITER_DECODE_KERNEL, "mla_decode peer", "aiter_decode_variants"),
        )
        if matches(filter, kernel, what, "aiter")
    ]
    if not wanted:
        return [], []
    try:
        pv = load_peer_variants()
    except Exception as e:  # no perf/ folder, or it fails to import: one row says so
        why = str(e) if isinstance(e, PeerVariantsMissing) else f"perf/peer_variants.py: {error_text(e)[:300]}"
        row = Row(
            kernel=PEERS_ROW,
            config=", ".join(what for _, what, _ in wanted),
            backend="aiter",
            arch=arch,
            peer=True,
            skipped=why,
        )
        return [], [row]
    variants: list = []
    skipped: list[Row] = []
    for kernel, what, make in wanted:
        try:
            variants += [v for v in getattr(pv, make)(arch) if matches(filter, v.kernel, v.config, "aiter")]
        except Exception as e:  # no peer folder, or aiter's tree fails to import: say so, do not fail
            skipped.append(
                Row(
                    kernel=kernel,
                    config=what,
                    backend="aiter",
                    arch=arch,
                    peer=True,
                    skipped=f"aiter unavailable ({pv.aiter_peers_dir()}): {error_text(e)[:300]}",
                )
            )
    return variants, skipped


def side_by_side_variants(arch: str) -> list:
    """The variants :func:`decode_side_by_side` reads tile shapes from: ours, and aiter's decode
    when its tree loads (when it does not, the peer rows say why)."""
    from rocm_mla.variants import all_triton_variants

    variants = all_triton_variants(arch)
    try:
        variants += load_peer_variants().aiter_decode_variants(arch)
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
        if ours or r.kernel == AITER_DECODE_KERNEL:
            picked.append((v, r))
    lines = [f"decode side by side on {arch} (bf16 q and cache, one split; the aiter rows are not gated)"]
    if not any(r.peer for _, r in picked):
        skipped = [r for r in rows if r.kernel in (AITER_DECODE_KERNEL, PEERS_ROW) and r.skipped]
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
