"""``rocm-mla doctor``: what is installed, what the GPU is, which config overlay is active (and
what it changes), whether every op is right here (with that overlay), and the compile report of
each arch ``--arch`` names (gfx942 by default; ``--arch gfx942,gfx950`` for MI300 and MI350).

On a machine without a GPU (or with ``--no-gpu``) the Triton kernels run in the CPU interpreter;
the HIP kernels are then checked only by the gfx942/gfx950/sm90 compile report.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time


def _line(key: str, value: object) -> None:
    print(f"  {key:<22} {value}")


def _versions() -> None:
    import torch
    import triton

    import rocm_mla

    print("versions")
    _line("python", platform.python_version())
    _line("torch", torch.__version__)
    _line("triton", triton.__version__)
    _line("rocm-mla", rocm_mla.__version__)
    _line("ROCm (torch.version.hip)", torch.version.hip or "-")
    _line("CUDA (torch.version.cuda)", torch.version.cuda or "-")


def _device(use_gpu: bool):
    import torch

    from rocm_mla import _platform

    print("device")
    if not use_gpu:
        why = "disabled by --no-gpu" if torch.cuda.is_available() else "none visible to torch"
        _line("GPU", f"{why}: Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)")
        return torch.device("cpu")
    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    _line("GPU", f"{props.name} x{torch.cuda.device_count()}")
    _line("arch key", _platform.device_arch(dev))
    _line("compute units", props.multi_processor_count)
    _line("memory", f"{props.total_memory / 2**30:.0f} GiB")
    return dev


def _extension(dev, arches: list[str]) -> None:
    import torch

    from rocm_mla import _ext

    print("HIP extension")
    _line("sources", _ext.hip_src_dir())
    # One backend name for both builds of hip_src/: users meet "hip" in the rows below and in
    # ROCM_MLA_BACKEND, also on an NVIDIA GPU.
    build = (
        "hipcc (ROCm torch)"
        if torch.version.hip
        else "nvcc (CUDA torch: the same sources)"
        if torch.version.cuda
        else "hipcc on a ROCm torch, nvcc on a CUDA torch (neither here)"
    )
    _line("backend name", f"'hip' (ROCM_MLA_BACKEND=hip), built with {build}")
    if dev.type != "cuda":
        _line("status", f"not loaded (CPU run); compiled for {', '.join(arches)} by the ISA report below")
        return
    t0 = time.perf_counter()
    mod = _ext.load()
    if mod is None:
        _line("status", f"UNAVAILABLE: {_ext.unavailable_reason()}")
    else:
        _line("status", f"loaded {getattr(mod, '__file__', mod)} ({time.perf_counter() - t0:.1f} s)")


def _overlay(dev) -> None:
    """Which config overlay (``rocm-mla tune``) this device's ops use, and what it changes."""
    from rocm_mla import _platform
    from rocm_mla.configs import overlay_status
    from rocm_mla.tools.tune.overlay import describe_overlay

    print("config overlay (rocm-mla tune; ROCM_MLA_CONFIG_DIR)")
    for line in describe_overlay(overlay_status(_platform.device_arch(dev))):
        print(f"  {line.removeprefix('config overlay: ')}")


def _selfcheck(dev) -> bool:
    from rocm_mla.tools.selfcheck import run_all

    print(
        "self-check (random inputs vs the float32 reference; err = max |got-ref| / (1+|ref|); "
        "backend hip = the HIP extension, nvcc-built on a CUDA torch)"
    )
    rows = run_all(dev)
    width = max(len(r.case) for r in rows) if rows else 10
    print(f"  {'op':<20} {'backend':<10} {'dtype':<9} {'case':<{width}} {'max err':>9} {'tol':>8}  result")
    for r in rows:
        res = "PASS" if r.ok else f"FAIL {r.error}".rstrip()
        print(f"  {r.op:<20} {r.backend:<10} {r.dtype:<9} {r.case:<{width}} {r.max_err:9.2e} {r.tol:8.1e}  {res}")
    failed = sum(not r.ok for r in rows)
    print(f"  {len(rows) - failed} passed, {failed} failed")
    return failed == 0


def _isa(arch: str) -> bool:
    """The ISA report runs in a child process: it needs Triton's compiler, not the interpreter
    that this process may have switched on."""
    print(f"{arch} compile report (rocm-mla isa-report --arch {arch} for every row)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import sys; from rocm_mla.tools.isa_report import collect, summary; "
        f"rows = collect({arch!r}); print(summary(rows)); "
        "sys.exit(1 if any(getattr(r, 'failed', False) for r in rows) else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    for line in proc.stdout.strip().splitlines():
        print(f"  {line}")
    if proc.returncode != 0 and proc.stderr.strip():
        print("  " + proc.stderr.strip().splitlines()[-1])
    return proc.returncode == 0


def report_arches(value: str) -> list[str]:
    """The arches of ``--arch`` (comma-separated, e.g. ``gfx942,gfx950``), each one the ISA report
    knows; ValueError naming the unknown one otherwise."""
    from rocm_mla.tools.isa_report.rows import ARCHS

    arches = [a.strip() for a in value.split(",") if a.strip()]
    bad = [a for a in arches if a not in ARCHS]
    if bad or not arches:
        raise ValueError(f"--arch: expected a comma-separated list of {', '.join(sorted(ARCHS))}, got {value!r}")
    return arches


def main(args) -> int:
    """Run the doctor; exit status 0 only when every self-check and every compile report pass."""
    arches = report_arches(args.arch)
    _versions()
    import torch

    dev = _device(use_gpu=torch.cuda.is_available() and not args.no_gpu)
    _extension(dev, arches)
    _overlay(dev)
    ok = _selfcheck(dev)
    if dev.type == "cuda" and args.bench:
        from rocm_mla.tools.quickbench import run as quickbench

        quickbench(dev)
    if not args.skip_isa:
        for arch in arches:
            ok = _isa(arch) and ok
    print("doctor:", "all checks passed" if ok else "FAILED (see above)")
    return 0 if ok else 1
