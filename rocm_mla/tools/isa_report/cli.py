"""``rocm-mla isa-report`` (also ``python -m rocm_mla.tools.isa_report``): the flags, the printed
table and failure list, the exit status."""

from __future__ import annotations

import argparse
import os
import sys

from .collect import collect
from .decode_view import decode_tiers
from .gate import failures
from .output import format_table, write_json
from .peers import decode_side_by_side, side_by_side_variants
from .rows import ARCHS, label


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
        "or .peers/aiter, made by perf/peers/get_aiter_peers.sh, described by the repository's "
        "perf/peer_variants.py); they are reported beside ours, never gated",
    )
    ap.add_argument(
        "--decode-tiers",
        action="store_true",
        help="only the default decode tiers of gfx942 and gfx950 side by side (registers, LDS, occupancy, "
        "instructions/MFMA/LDS bytes per KV row, serial global round trips per tile); exit 1 when one fails",
    )
    ap.add_argument(
        "--fp8",
        action="store_true",
        help="with --decode-tiers: also each tier with the platform's fp8 cache in every fp8_dots mode",
    )
    args = ap.parse_args(argv)
    # The report needs Triton's compiler; an interpreter switch leaked from the shell (or the CPU
    # test set-up) would make every kernel imported from here on an InterpretedFunction.
    os.environ.pop("TRITON_INTERPRET", None)
    if args.decode_tiers:
        text, tier_rows = decode_tiers(progress=not args.quiet, fp8=args.fp8)
        print(text)
        return 1 if failures(tier_rows) else 0

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
        print()
        print(decode_side_by_side(args.arch, rows, side_by_side_variants(args.arch)))
    if args.json:
        write_json(rows, args.json)
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
