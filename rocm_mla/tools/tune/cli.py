"""``rocm-mla tune``: the command line (``build_parser``, ``main``) and its ``--check`` and
``--show`` modes."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from rocm_mla import configs as C

from . import __doc__ as _TUNE_DOC
from .acceptance import ROUNDS, exc_text, verification_cases, verify
from .overlay import describe_overlay, print_result_table, target_path, write_json
from .shapes import ALL_OPS, OP_ALIASES, OP_KEYS, PRESETS, Shape, parse_shapes
from .timing import time_case_us
from .tuner import Tuner


def check_main(args, dev: torch.device, log=print) -> int:
    """``--check``: the overlay is well formed, for this device, and every changed config compiles
    and matches the reference; ``--stamp`` then accepts it. 0 when it is usable as it is."""
    from rocm_mla import _platform

    arch = _platform.device_arch(dev)
    cus = C.device_compute_units(arch)
    path = Path(args.out).expanduser() if args.out else C.find_overlay(arch, cus)[0]
    if path is None:
        searched = C.find_overlay(arch, cus)[1]
        log(
            f"no overlay for this device ({arch}, {cus or '-'} CUs); "
            f"searched: {', '.join(searched) or 'nothing (overlays off)'}"
        )
        return 0
    log(f"checking {path} for {arch} ({cus or '-'} CUs) on {dev}")
    try:
        data = C.read_overlay(path)
    except C.OverlayError as exc:
        log(f"  {exc.name}: {exc}")
        return 1
    errors = C.validate_overlay(data, arch, cus, check_stamp=False)
    if not errors:
        with C.overlays_disabled():
            for op_key, entry in data.items():
                if op_key in C.SCHEMAS:
                    base = C.package_config(op_key, arch)
                    new = C.merge_overlay(base, entry[arch])
                    n = len(verification_cases(op_key, arch, dev, base, new))
                    log(f"  {op_key}: {n} compile + reference case(s)")
                    errors += verify(op_key, arch, dev, base, new)
    stamp = C.stamp_problems(data)
    for e in errors:
        log(f"  {e.name}: {e}")
    if errors:
        log(f"FAILED: {len(errors)} problem(s); at run time this overlay is ignored (one OverlayWarning)")
        return 1
    if stamp and args.stamp:
        write_json(path, C.stamp_overlay(data, by="rocm-mla tune --check --stamp"))
        log("  every config compiles and matches the reference: stamped as verified; processes started now use it")
        return 0
    for e in stamp:
        log(f"  {e.name}: {e}")
    if stamp:
        log("the configs are good, but the overlay is not used until stamped (--check --stamp)")
        return 1
    log("OK: well formed, for this device, every changed config compiles and matches the reference, stamp valid")
    return 0


def show_main(args, dev: torch.device, log=print) -> int:
    """What the overlay the loader sees changes, and its table; --retime times default vs overlay in
    this process (the overlay reached through config_for, as a serving process reaches it)."""
    from rocm_mla import _platform

    arch = _platform.device_arch(dev)
    if args.out:
        os.environ[C.OVERLAY_ENV] = str(Path(args.out).expanduser())
        C.reload_overlays()
    st = C.overlay_status(arch)
    for line in describe_overlay(st):
        log(line)
    data = st.data
    if data is None:
        return 1 if st.error is not None else 0
    rows = dict((data.get("_meta") or {}).get("shapes") or {})
    if args.retime and rows:
        if dev.type != "cuda" and not args.allow_cpu:
            log("--retime needs a GPU (or --allow-cpu)")
            return 2
        t = Tuner(
            dev,
            list(ALL_OPS),
            [],
            quick=True,
            max_minutes=None,
            max_candidates=None,
            out_path=Path(os.devnull),
            argv=[],
            log=log,
        )
        shapes = {}
        for k in rows:
            op, _, rest = k.partition(" ")
            shapes[k] = Shape.make(op, **dict(kv.split("=", 1) for kv in rest.split()))
        new_rows = {}
        for k, s in shapes.items():
            op_key = OP_KEYS[s.op]
            with C.overlays_disabled():
                d = C.package_config(op_key, arch)
            tuned = C.config_for(op_key, arch)  # through the loader
            if tuned == d:
                continue
            told, tnew = [], []
            for rnd in range(ROUNDS):
                for which in (0, 1) if rnd % 2 == 0 else (1, 0):
                    if which == 0:
                        with C.overlays_disabled():
                            us, err = t.measure(op_key, d, s, check=False)
                        told.append(us)
                    else:
                        case = t.case(s)
                        us = time_case_us(case)  # no override: config_for reads the overlay
                        tnew.append(us)
            t.drop_cases()
            med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
            new_rows[k] = {**rows[k], "default_us": med(told), "tuned_us": med(tnew), "note": "re-timed now"}
        rows.update(new_rows)
        print_result_table(
            rows,
            log,
            f"\ndefault vs tuned, re-timed in this process ({len(new_rows)} shapes with a "
            f"changed config; the rest from the tuning run's _meta):",
        )
    elif rows:
        meta = data["_meta"]
        print_result_table(
            rows,
            log,
            f"\ndefault vs tuned per shape (tuning run of {meta.get('date')} on "
            f"{meta.get('device')}, {meta.get('mode')} mode):",
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="rocm-mla tune",
        description=_TUNE_DOC.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--ops",
        default=",".join(ALL_OPS),
        help="comma-separated: decode, prefill, merge, rope_kv_write (rope_kv: the same), sparse, indexer, v4",
    )
    ap.add_argument(
        "--shapes",
        default=None,
        help="presets (" + ", ".join(PRESETS) + "; default: deepseek-v3, "
        "--quick: quick) and/or ';'-separated specs like 'decode:B=64,seq=8192,N=16,q=1,kv=fp8' or "
        "'sparse:B=128,ctx=8192,N=16,q=1,K=2048,kv=fp8' or 'indexer:B=128,ctx=32768,H=64,q=1,topk=2048' or "
        "'v4:B=128,ctx=32768,H=16,q=1,kind=csa,topk=512,kv=fp8'",
    )
    ap.add_argument("--quick", action="store_true", help="listed candidates only, capped per group; the quick preset")
    ap.add_argument("--max-minutes", type=float, default=None, help="hard stop: keeps and writes what was accepted")
    ap.add_argument("--max-candidates", type=int, default=None, help="candidates per group, the default included")
    ap.add_argument(
        "--out", default=None, help="overlay file to write/check/show (default: the config dir's <arch>-<CUs>cu.json)"
    )
    ap.add_argument(
        "--allow-cpu", action="store_true", help="run without a GPU (Triton interpreter; times meaningless)"
    )
    ap.add_argument("--check", action="store_true", help="validate the overlay: schema, arch, compile, reference")
    ap.add_argument("--stamp", action="store_true", help="with --check: accept a valid overlay (write its stamp)")
    ap.add_argument("--show", action="store_true", help="which overlay is active, what it changes, its table")
    ap.add_argument("--retime", action="store_true", help="with --show: time default vs the overlay in this process")
    ap.add_argument("--list-shapes", action="store_true", help="print the shapes and exit")
    return ap


def main(argv: list[str] | None = None) -> int:
    """``rocm-mla tune ARGS``: tune (the default), ``--check``, ``--show`` or ``--list-shapes``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    has_gpu = torch.cuda.is_available()
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    dev = torch.device("cuda", torch.cuda.current_device()) if has_gpu else torch.device("cpu")
    ops = [OP_ALIASES.get(o.strip(), o.strip()) for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OP_KEYS]
    if bad:
        print(f"rocm-mla tune: unknown op(s) {', '.join(bad)} (ops: {', '.join(ALL_OPS)})", file=sys.stderr)
        return 2
    try:
        shapes = parse_shapes(args.shapes or ("quick" if args.quick else ("deepseek-v3" if has_gpu else "tiny")))
    except ValueError as exc:
        print(f"rocm-mla tune: --shapes: {exc}", file=sys.stderr)
        return 2
    if args.list_shapes:
        for s in shapes:
            if s.op in ops:
                print(s.key)
        return 0
    if args.check:
        if not has_gpu and not args.allow_cpu:
            print("rocm-mla tune --check: no GPU; --allow-cpu checks in the Triton interpreter", file=sys.stderr)
            return 2
        return check_main(args, dev)
    if args.show:
        return show_main(args, dev)
    if not has_gpu and not args.allow_cpu:
        print(
            "rocm-mla tune: no GPU visible to torch. Tuning times kernels on the GPU it tunes for; "
            "--allow-cpu runs the Triton interpreter instead (its times mean nothing; for testing)",
            file=sys.stderr,
        )
        return 2
    from rocm_mla import _platform

    arch = _platform.device_arch(dev)
    cus = C.device_compute_units(arch)
    out = target_path(args, arch, cus)
    if out is None:
        print("rocm-mla tune: overlays are off (ROCM_MLA_CONFIG_DIR is empty): pass --out PATH", file=sys.stderr)
        return 2
    tuner = Tuner(
        dev,
        ops,
        shapes,
        quick=args.quick,
        max_minutes=args.max_minutes,
        max_candidates=args.max_candidates,
        out_path=out,
        argv=argv,
    )
    try:
        tuner.run()
    except Exception as exc:  # e.g. a sticky device error: the context is gone
        print(
            f"\nrocm-mla tune stopped: {exc_text(exc)}\n{out} holds the groups accepted before it "
            "(each was checked and stamped when written)",
            file=sys.stderr,
        )
        raise
    print("\ngroups:")
    for g in tuner.groups:
        print(
            f"  {g.op:8s} {g.name:40s} {len(g.results):3d} timed  {g.status}"
            + (f": {g.label(g.winner)}" if g.winner else "")
        )
    print(
        f"\nwrote {out} ({time.monotonic() - tuner.t0:.0f} s{'; ' + tuner.stopped if tuner.stopped else ''}). "
        "Processes started from now on use it; `rocm-mla doctor` / `rocm-mla tune --show` show what it changes; "
        "ROCM_MLA_CONFIG_DIR= turns it off."
    )
    found = C.find_overlay(arch, cus)[0]
    if C.overlay_dir() is None:
        print("note: overlays are off in this environment (ROCM_MLA_CONFIG_DIR is empty)")
    elif found is None or found.resolve() != out.resolve():
        print(
            f"note: the loader reads {found or C.overlay_dir()}, not this file: set ROCM_MLA_CONFIG_DIR={out} "
            f"(a .json value names the file) or move it to {C.overlay_dir()}/{C.overlay_filename(arch, cus)}"
        )
    print_result_table(
        tuner.rows,
        print,
        "\ndefault vs tuned per shape (us; tuned is never slower: the default "
        "wins ties and every winner was re-timed back to back):",
    )
    return 0
