"""The ``rocm-mla`` command: ``doctor`` (the main job), ``tune`` and ``isa-report``."""

from __future__ import annotations

import argparse
import os
import sys


def _use_interpreter_if_no_gpu(no_gpu: bool) -> None:
    # Must happen before any rocm_mla kernel module is imported (Triton reads it at decoration).
    import torch

    if no_gpu or not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _report_arches(value: str) -> list[str]:
    from rocm_mla.tools.doctor import report_arches

    try:
        return report_arches(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--arch: ")) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rocm-mla`` console script."""
    parser = argparse.ArgumentParser(prog="rocm-mla", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    doc = sub.add_parser(
        "doctor",
        help="versions, device, HIP extension, self-check of every op, "
        "compile report per arch (and a quick benchmark on a GPU)",
    )
    doc.add_argument("--no-gpu", action="store_true", help="check on the CPU (Triton interpreter) even with a GPU")
    doc.add_argument(
        "--arch",
        default="gfx942",
        type=_report_arches,
        help="arches of the compile report, comma-separated (gfx942, gfx950, sm90)",
    )
    doc.add_argument("--json", action="store_true", help="lines to stderr, one JSON report to stdout")
    doc.add_argument("--no-vllm", dest="vllm", action="store_false", help="skip the vLLM checks")
    doc.add_argument("--skip-isa", action="store_true", help="skip the compile report")
    doc.add_argument("--no-bench", dest="bench", action="store_false", help="skip the quick GPU benchmark")
    sub.add_parser(
        "isa-report",
        add_help=False,
        help="compile every kernel config ahead of time and report registers/spills/LDS/MFMA",
    )
    sub.add_parser(
        "tune",
        add_help=False,
        help="time launch-config candidates of every op on this GPU and save the winners as a "
        "config overlay the package uses (--check, --show; rocm-mla tune --help)",
    )
    args, rest = parser.parse_known_args(argv)
    if args.cmd == "tune":
        _use_interpreter_if_no_gpu(False)
        from rocm_mla.tools.tune.cli import main as tune_main

        return tune_main(rest)
    if args.cmd == "isa-report":
        from rocm_mla.tools.isa_report import main as isa_main

        return isa_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    _use_interpreter_if_no_gpu(args.no_gpu)
    from rocm_mla.tools.doctor import main as doctor_main

    return doctor_main(args)


if __name__ == "__main__":
    sys.exit(main())
