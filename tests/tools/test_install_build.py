"""setup.py: a failed ahead-of-time HIP build leaves a working Triton-only install, with a warning
that says why and how to rebuild, and a marker the runtime and the doctor read."""

from __future__ import annotations

import runpy
from pathlib import Path
from unittest import mock

from rocm_mla import _ext

ROOT = Path(__file__).resolve().parents[2]


def _setup_module() -> dict:
    with mock.patch("setuptools.setup"):
        return runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")


def test_failed_build_leaves_a_marker_and_a_warning(tmp_path, capsys):
    mod = _setup_module()
    mod["record_failed_build"](str(tmp_path), RuntimeError("hipcc: error: unknown target 'gfx950'"))
    marker = tmp_path / "rocm_mla" / _ext.AOT_MARKER
    assert mod["FAILED_MARKER"] == _ext.AOT_MARKER and marker.is_file()
    err = capsys.readouterr().err
    assert "did not build (RuntimeError: hipcc: error: unknown target 'gfx950')" in err
    assert "Triton kernels serve every op" in err and "--force-reinstall" in err
    why = _ext.failed_install_build(tmp_path / "rocm_mla")
    assert "unknown target 'gfx950'" in why and "ROCM_MLA_SKIP_AOT=1" in why
    assert _ext.failed_install_build(tmp_path) is None  # no marker there


def test_the_builder_falls_back_instead_of_failing(tmp_path, monkeypatch, capsys):
    """With a GPU torch (simulated) the extension's builder is wrapped: its failure is recorded."""
    import torch
    import torch.utils.cpp_extension as cx

    monkeypatch.delenv("ROCM_MLA_SKIP_AOT", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(cx, "CUDA_HOME", "/usr/local/cuda")
    mod = _setup_module()
    (ext,), cmds = mod["_ext_modules"]()
    assert ext.name == "rocm_mla._C"
    builder = cmds["build_ext"]
    from setuptools import Distribution

    cmd = builder(Distribution({"name": "rocm-mla", "ext_modules": [ext]}))
    cmd.build_lib = str(tmp_path)
    with mock.patch.object(cx.BuildExtension, "run", side_effect=OSError("hipcc not found")):
        cmd.run()  # no exception: the install goes on
    assert (tmp_path / "rocm_mla" / _ext.AOT_MARKER).is_file()
    assert "hipcc not found" in capsys.readouterr().err
