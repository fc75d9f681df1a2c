"""Build glue: copies hip_src/ into the package (the JIT build and the ISA report read it there)
and, when a GPU torch is importable at build time, builds the HIP extension ahead of time as
``rocm_mla._C``.

The ahead-of-time build needs torch in the build environment, so use
``pip install --no-build-isolation --no-deps .`` on a ROCm (or CUDA) torch. Without it the package
installs pure-Python and compiles the extension on first use (rocm_mla/_ext.py).
``ROCM_MLA_SKIP_AOT=1`` skips the ahead-of-time build; ``PYTORCH_ROCM_ARCH`` (default
``gfx942;gfx950``) and ``MAX_JOBS`` are torch's (docs/install.md).

A failed ahead-of-time build does not fail the install: the Triton kernels serve every op. The
build prints why and how to rebuild, and leaves ``rocm_mla/AOT_BUILD_FAILED`` (the compiler's
last lines) in the package, which ``rocm_mla._ext`` and ``rocm-mla doctor`` report; no build is
then tried again at run time.
"""

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithHipSrc(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "rocm_mla" / "hip_src"
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(ROOT / "hip_src", dest)


def _ext_modules():
    if os.environ.get("ROCM_MLA_SKIP_AOT") == "1":
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, ROCM_HOME, BuildExtension, CUDAExtension
    except ImportError:
        return [], {}
    if torch.version.hip and ROCM_HOME:
        os.environ.setdefault("PYTORCH_ROCM_ARCH", "gfx942;gfx950")
    elif not (torch.version.cuda and CUDA_HOME):
        return [], {}
    import importlib.util

    spec = importlib.util.spec_from_file_location("_build_flags", ROOT / "rocm_mla" / "_build_flags.py")
    flags = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flags)
    srcs = ["hip_src/bindings.cpp", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "hip_src").glob("*.cu"))]
    ext = CUDAExtension(
        "rocm_mla._C", srcs, include_dirs=[str(ROOT / "hip_src")], extra_compile_args=flags.build_flags()
    )

    class BuildExtOrFallBack(BuildExtension):
        """torch's extension builder; a failure leaves a Triton-only install and says why."""

        def run(self):
            try:
                super().run()
            except Exception as exc:  # the compiler's error, or a missing toolchain piece
                record_failed_build(self.build_lib, exc)

    return [ext], {"build_ext": BuildExtOrFallBack}


FAILED_MARKER = "AOT_BUILD_FAILED"
REBUILD_HINT = (
    "fix the toolchain, then: pip install --no-build-isolation --no-deps --force-reinstall . "
    "(ROCM_MLA_SKIP_AOT=1 installs without trying)"
)


def record_failed_build(build_lib: str, exc: BaseException) -> None:
    """Leave the marker the runtime reads and print the warning (pip shows it with -v, and in
    its log; rocm-mla doctor shows the marker)."""
    text = f"{type(exc).__name__}: {str(exc).strip()[-2000:]}"
    dest = Path(build_lib) / "rocm_mla"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / FAILED_MARKER).write_text(text + "\n" + REBUILD_HINT + "\n")
    import sys

    print(
        f"WARNING: rocm-mla: the HIP extension did not build ({text.splitlines()[-1] if text else '?'}); "
        f"installing without it: the Triton kernels serve every op. To rebuild: {REBUILD_HINT}",
        file=sys.stderr,
    )


ext_modules, cmdclass = _ext_modules()
setup(ext_modules=ext_modules, cmdclass={"build_py": BuildPyWithHipSrc, **cmdclass})
