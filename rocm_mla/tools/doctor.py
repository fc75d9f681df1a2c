"""``rocm-mla doctor``: what is installed, what the GPU is, the ROCM_MLA_* environment, the vLLM
side (version, plugin entry point, VLLM_PLUGINS, the registered backends, whether vLLM's selector
takes ROCM_MLA here, the fused RoPE + KV op, the DeepSeek-V3.2/GLM-5 layers), which config overlay
is active (and what it changes), whether every op is right here (with that overlay), and the
compile report of each arch ``--arch`` names (gfx942 by default; ``--arch gfx942,gfx950`` for
MI300 and MI350).

On a machine without a GPU (or with ``--no-gpu``) the Triton kernels run in the CPU interpreter;
the HIP kernels are then checked only by the gfx942/gfx950/sm90 compile report. ``--json``: the
same lines go to stderr and one JSON object (every section's values and the verdict) to stdout.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

OUT = sys.stdout  # where the human-readable lines go (stderr under --json)
REPORT: dict = {}  # section -> {key: value}, printed as JSON under --json
_section: dict = {}


def _head(title: str, key: str) -> None:
    """Start a section: its title line, and its entry in REPORT."""
    global _section
    _section = REPORT.setdefault(key, {})
    _print(title)


def _print(text: str) -> None:
    print(text, file=OUT, flush=True)


def _line(key: str, value: object, record: object = None) -> None:
    _print(f"  {key:<22} {value}")
    _section[key] = value if record is None else record


def _versions() -> None:
    import torch
    import triton

    import rocm_mla

    _head("versions", "versions")
    _line("python", platform.python_version())
    _line("torch", torch.__version__)
    _line("triton", triton.__version__)
    from rocm_mla.ops._launch import triton_launch_form_ok

    kept = "kept binaries (decode)" if triton_launch_form_ok() else "kernel[grid] (this Triton launches differently)"
    _line("triton launches", kept)
    _line("rocm-mla", rocm_mla.__version__)
    _line("ROCm (torch.version.hip)", torch.version.hip or "-")
    _line("CUDA (torch.version.cuda)", torch.version.cuda or "-")


def _device(use_gpu: bool):
    import torch

    from rocm_mla import _platform

    _head("device", "device")
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

    _head("HIP extension", "hip_extension")
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
    failed = _ext.failed_install_build()
    if failed:
        _line("install-time build", f"FAILED (the Triton kernels serve every op): {failed}")
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

    _head("config overlay (rocm-mla tune; ROCM_MLA_CONFIG_DIR)", "config_overlay")
    lines = [
        line.removeprefix("config overlay: ") for line in describe_overlay(overlay_status(_platform.device_arch(dev)))
    ]
    for line in lines:
        _print(f"  {line}")
    _section["lines"] = lines


def _selfcheck(dev) -> bool:
    from rocm_mla.tools.selfcheck import run_all

    _head(
        "self-check (random inputs vs the float32 reference; err = max |got-ref| / (1+|ref|); "
        "backend hip = the HIP extension, nvcc-built on a CUDA torch)",
        "self_check",
    )
    t0 = time.perf_counter()

    def progress(i: int, n: int, name: str) -> None:
        _print(f"  [{i + 1}/{n}] {name} ... ({time.perf_counter() - t0:.0f} s)")

    rows = run_all(dev, progress)
    width = max(len(r.case) for r in rows) if rows else 10
    _print(f"  {'op':<20} {'backend':<10} {'dtype':<9} {'case':<{width}} {'max err':>9} {'tol':>8}  result")
    for r in rows:
        res = "PASS" if r.ok else f"FAIL {r.error}".rstrip()
        _print(f"  {r.op:<20} {r.backend:<10} {r.dtype:<9} {r.case:<{width}} {r.max_err:9.2e} {r.tol:8.1e}  {res}")
    failed = sum(not r.ok for r in rows)
    _print(f"  {len(rows) - failed} passed, {failed} failed")
    _section.update(
        passed=len(rows) - failed,
        failed=[f"{r.op} {r.backend} {r.dtype} {r.case}: {r.error}" for r in rows if not r.ok],
    )
    return failed == 0


def _environment() -> bool:
    """The ROCM_MLA_* variables set here: each value checked as the package reads it; names the
    package does not read are reported (not a failure)."""
    from rocm_mla import env

    _head("environment (ROCM_MLA_*; docs/environment.md)", "environment")
    ok = True
    names = sorted(k for k in os.environ if k.startswith(env.PREFIX))
    if not names:
        _line("ROCM_MLA_*", "none set (defaults)")
    for name in names:
        if env.lookup(name) is None:
            _line(
                name,
                f"{os.environ[name]!r}: NOT READ by rocm_mla (misspelt?)",
                {"value": os.environ[name], "read": False},
            )
            continue
        try:
            env.get(name)
            _line(name, repr(os.environ[name]), {"value": os.environ[name], "read": True})
        except ValueError as e:
            ok = False
            _line(name, f"BAD VALUE: {e}", {"value": os.environ[name], "error": str(e)})
    return ok


def _vllm() -> bool:
    """The vLLM side, probed in a child process (rocm_mla.tools.vllm_probe). Fails only when vLLM
    is installed and the plugin is not usable with it; without vLLM the ops still work."""
    _head("vLLM (--attention-backend ROCM_MLA)", "vllm")
    _print("  probing in a child process ...")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "rocm_mla.tools.vllm_probe"], env=env, capture_output=True, text=True, timeout=600
    )
    try:
        p = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        _line("probe", f"FAILED: {err}")
        return False
    _section["probe"] = p
    if not p.get("installed"):
        _line("vLLM", f"not importable ({p.get('error')}): rocm-mla's ops work without it")
        return True
    from rocm_mla.vllm import SUPPORTED_VLLM

    ok = True
    supported = p["supported"]
    _line(
        "version",
        f"{p['version']}"
        + ("" if supported else f" (NOT SUPPORTED: rocm-mla is written for {', '.join(SUPPORTED_VLLM)})"),
    )
    ok &= supported
    ep = p.get("entry_point")
    _line("plugin entry point", ep or "MISSING: reinstall rocm-mla into vLLM's environment")
    ok &= ep == "rocm_mla.vllm:register"
    allowed = p.get("plugins_allowed")
    _line(
        "VLLM_PLUGINS", "allows rocm_mla" if allowed else f"{os.environ.get('VLLM_PLUGINS')!r} LACKS rocm_mla: add it"
    )
    ok &= bool(allowed)
    if not p.get("registered_ok"):
        _line("backends", f"NOT REGISTERED: {p.get('register_error') or p.get('registered')}")
        return False
    reg = p["registered"]
    _line("backends", f"ROCM_MLA -> {reg['ROCM_MLA']}; ROCM_MLA_SPARSE -> {reg['ROCM_MLA_SPARSE']}")
    _line("vLLM platform", p.get("platform"))
    sel = p.get("selectable")
    _line(
        "selectable",
        "yes (vLLM's ROCm selector takes ROCM_MLA for MLA layers)"
        if sel
        else f"{'NO' if sel is False else 'not checked'}: {p.get('selectable_reason')}",
    )
    ok &= sel is not False
    if p.get("sparse_layers") is not None:
        _line(
            "sparse layers",
            "DeepSeek-V3.2/GLM-5 layers run rocm-mla when ROCM_MLA is selected"
            if p["sparse_layers"]
            else "NOT HOOKED: vLLM's aiter sparse path stays",
        )
        ok &= bool(p["sparse_layers"])
    if p.get("v4_layers") is not None:
        hooked = p["v4_layers"]
        _line(
            "V4 layers",
            f"{' and '.join(hooked)} attention and CSA indexer run rocm-mla when ROCM_MLA is selected"
            if len(hooked) == 2
            else f"NOT ALL HOOKED: only {hooked or 'none'} of DeepSeek-V4, V4.1 (vLLM's path stays for the rest)",
        )
        ok &= len(hooked) == 2
    fused = p.get("fused_rope_kv")
    _line(
        "fused RoPE + KV write",
        "kernel registered; on when vLLM's fuse_rope_kvcache_cat_mla pass is (docker/serve.sh sets it; docs/vllm.md)"
        if fused
        else f"vLLM's own kernel ({p.get('fused_rope_kv_reason')})",
    )
    return ok


def _isa(arch: str) -> bool:
    """The ISA report runs in a child process: it needs Triton's compiler, not the interpreter
    that this process may have switched on."""
    _head(f"{arch} compile report (rocm-mla isa-report --arch {arch} for every row)", f"compile_report_{arch}")
    _print("  compiling ...")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import sys; from rocm_mla.tools.isa_report import collect, summary; "
        f"rows = collect({arch!r}); print(summary(rows)); "
        "sys.exit(1 if any(getattr(r, 'failed', False) for r in rows) else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    for line in lines:
        _print(f"  {line}")
    if proc.returncode != 0 and proc.stderr.strip():
        _print("  " + proc.stderr.strip().splitlines()[-1])
    _section.update(ok=proc.returncode == 0, summary=lines[-1] if lines else "")
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
    """Run the doctor; exit status 0 only when every self-check and every compile report pass, the
    environment's values are valid and, with vLLM installed, the plugin is usable with it."""
    global OUT
    OUT = sys.stderr if args.json else sys.stdout
    REPORT.clear()
    arches = args.arch
    _versions()
    import torch

    dev = _device(use_gpu=torch.cuda.is_available() and not args.no_gpu)
    _extension(dev, arches)
    ok = _environment()
    if args.vllm:
        ok = _vllm() and ok
    _overlay(dev)
    ok = _selfcheck(dev) and ok
    if dev.type == "cuda" and args.bench:
        from rocm_mla.tools.quickbench import run as quickbench

        quickbench(dev)
    if not args.skip_isa:
        for arch in arches:
            ok = _isa(arch) and ok
    _print("doctor: " + ("all checks passed" if ok else "FAILED (see above)"))
    REPORT["ok"] = ok
    if args.json:
        print(json.dumps(REPORT, default=str))
    return 0 if ok else 1
