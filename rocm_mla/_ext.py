"""Build and load the HIP extension from ``hip_src/``.

One set of sources serves both vendors: on a ROCm torch, torch's cpp_extension hipifies them
(torch.utils.hipify) and builds with hipcc for ``--offload-arch=gfx942`` (override with
``PYTORCH_ROCM_ARCH``, e.g. ``gfx942;gfx950``); on a CUDA torch it builds with nvcc for the
present GPU (override with ``TORCH_CUDA_ARCH_LIST``). An ahead-of-time build from ``pip install``
(``rocm_mla._C``) is used when present; otherwise the extension is compiled on first use (cached
under ``ROCM_MLA_CACHE`` or ``~/.cache/rocm_mla``; torch's file lock makes concurrent first uses
safe). ``ROCM_MLA_NO_JIT=1`` disables the JIT build.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch

from . import _platform, env
from ._build_flags import build_flags

_lock = threading.Lock()
_module: ModuleType | None = None
_reason: str | None = None  # why the extension is unavailable (None: not tried yet or loaded)
_tried = False


def hip_src_dir() -> Path:
    """Folder holding the HIP sources: the installed copy, else the source checkout's."""
    here = Path(__file__).resolve().parent
    for cand in (here / "hip_src", here.parent / "hip_src"):
        if (cand / "bindings.cpp").is_file():
            return cand
    raise FileNotFoundError(f"rocm_mla: hip_src/ not found next to {here}")


def sources() -> list[Path]:
    """Translation units of the extension: the bindings and every op's launcher."""
    src = hip_src_dir()
    return [src / "bindings.cpp", *sorted(src.glob("*.cu"))]


def cache_dir() -> Path:
    root = Path(env.get("ROCM_MLA_CACHE") or Path.home() / ".cache" / "rocm_mla")
    flavour = f"hip{torch.version.hip}" if torch.version.hip else f"cu{torch.version.cuda}"
    return root / f"ext-torch{torch.__version__.split('+')[0]}-{flavour}"


def _jit_build() -> ModuleType:
    from torch.utils.cpp_extension import load

    if torch.version.hip and not os.environ.get("PYTORCH_ROCM_ARCH"):
        # The visible GPUs' targets (gfx942 on MI300, gfx950 on MI350: a gfx942-only build would not
        # load on the latter); gfx942 when none is visible.
        archs = {_platform.cuda_arch(i) for i in range(torch.cuda.device_count())}
        os.environ["PYTORCH_ROCM_ARCH"] = ";".join(sorted(archs)) or "gfx942"
    build = cache_dir()
    build.mkdir(parents=True, exist_ok=True)
    if not (build / "rocm_mla_hip.so").exists():
        target = os.environ.get("PYTORCH_ROCM_ARCH") if torch.version.hip else "the present GPU"
        print(
            f"rocm-mla: compiling the HIP extension for {target} (first use, about a minute; cached in {build})",
            file=sys.stderr,
            flush=True,
        )
    flags = build_flags()
    return load(
        name="rocm_mla_hip",
        sources=[str(s) for s in sources()],
        extra_include_paths=[str(hip_src_dir())],
        extra_cflags=flags["cxx"],
        extra_cuda_cflags=flags["nvcc"],
        build_directory=str(build),
        verbose=False,
    )


def load() -> ModuleType | None:
    """The extension module, building it on first use; None when it cannot exist here.

    ``unavailable_reason()`` tells why it is None.
    """
    global _module, _reason, _tried
    if _tried:
        return _module
    with _lock:
        if _tried:
            return _module
        try:
            from . import _C  # type: ignore[attr-defined]  # built by setup.py

            _module = _C
        except ImportError:
            if not (torch.version.cuda or torch.version.hip):
                _reason = "torch is a CPU build (no CUDA/ROCm)"
            elif not torch.cuda.is_available():
                _reason = "no GPU visible to torch"
            elif failed_install_build() is not None:
                # The same toolchain failed at install time: do not spend a build in every process.
                _reason = f"the build at install time failed ({AOT_MARKER}): {failed_install_build()}"
            elif env.flag("ROCM_MLA_NO_JIT"):
                _reason = "not built ahead of time and ROCM_MLA_NO_JIT=1"
            else:
                try:
                    _module = _jit_build()
                except Exception as exc:  # a failed build must not take the Triton path down
                    _reason = f"JIT build failed: {type(exc).__name__}: {str(exc).strip()[-800:]}"
        _tried = True
        return _module


AOT_MARKER = "AOT_BUILD_FAILED"  # setup.py leaves it in the package when the install-time build fails


def failed_install_build(package_dir: Path | None = None) -> str | None:
    """The install-time build's failure (its last line and the rebuild hint), if setup.py recorded
    one in the package (``package_dir``: default this installed package)."""
    marker = (package_dir or Path(__file__).parent) / AOT_MARKER
    if not marker.is_file():
        return None
    lines = [x for x in marker.read_text().splitlines() if x.strip()]
    return " / ".join(lines[-2:]) if lines else "no details"


def unavailable_reason() -> str | None:
    """Why ``load()`` returned None (None when it loaded or was not tried)."""
    return _reason


def is_loaded() -> bool:
    return _module is not None
