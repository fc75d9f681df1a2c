"""Build glue: copies hip_src/ into the package (the JIT build and the ISA report read it there)
and, when a GPU torch is importable at build time, builds the HIP extension ahead of time as
``rocm_mla._C``.

The ahead-of-time build needs torch in the build environment, so use
``pip install --no-build-isolation .`` on a ROCm (or CUDA) torch. Without it the package installs
pure-Python and compiles the extension on first use (rocm_mla/_ext.py).
``ROCM_MLA_SKIP_AOT=1`` skips the ahead-of-time build.
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
        os.environ.setdefault("PYTORCH_ROCM_ARCH", "gfx942")
    elif not (torch.version.cuda and CUDA_HOME):
        return [], {}
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ext_flags", ROOT / "rocm_mla" / "_ext.py")
    flags = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flags)
    srcs = ["hip_src/bindings.cpp", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "hip_src").glob("*.cu"))]
    ext = CUDAExtension(
        "rocm_mla._C", srcs, include_dirs=[str(ROOT / "hip_src")], extra_compile_args=flags.build_flags()
    )
    return [ext], {"build_ext": BuildExtension}


ext_modules, cmdclass = _ext_modules()
setup(ext_modules=ext_modules, cmdclass={"build_py": BuildPyWithHipSrc, **cmdclass})
