"""The wheel ships the product and the commands users run, and nothing else: built from the files
git knows (no GPU, no ROCm: ``ROCM_MLA_SKIP_AOT=1``), its file list is the package's modules, launch
data and HIP sources, with none of perf/'s modules (benchutil's peer loaders and plots,
peer_variants); installed into a fresh virtual environment outside the repository, ``rocm-mla``,
its ``tune`` and ``isa-report`` load from it, and the ISA report's peer rows say in one line where
the peers' variants come from."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST_INFO = "rocm_mla-0.1.0.dist-info/"


def _repo_files() -> list[str]:
    """The files of the checkout a clean clone would have: tracked or untracked but not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout (setuptools writes build/ and *.egg-info into
    the source folder: the repository stays untouched, and parallel tests do not share them)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the files a clean clone has)")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for f in _repo_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    env = {**os.environ, "ROCM_MLA_SKIP_AOT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # An absolute path: a bare folder name would be looked up on the index as a project.
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    r = subprocess.run(
        [*cmd, "-w", str(tmp / "dist"), str(src.resolve())], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("rocm_mla-*.whl")
    return whl


def test_wheel_holds_the_package_and_nothing_else(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    stray = [n for n in names if not n.startswith(("rocm_mla/", DIST_INFO))]
    assert not stray, f"outside the package: {stray}"
    files = _repo_files()
    # Every module of the package (the tools users run among them), and no other module.
    modules = {f for f in files if f.startswith("rocm_mla/") and f.endswith(".py")}
    assert {n for n in names if n.endswith(".py")} == modules
    for tool in ("cli", "doctor", "selfcheck", "quickbench", "timing", "tune/tuner", "isa_report/peers"):
        assert f"rocm_mla/tools/{tool}.py" in names, tool
    # The launch data and the HIP sources (the run-time build and the ISA report read them there).
    configs = {f for f in files if f.startswith("rocm_mla/configs/") and f.endswith(".json")}
    assert configs and configs <= set(names)
    hip = {"rocm_mla/" + f for f in files if f.startswith("hip_src/")}
    assert any(h.endswith(".cu") for h in hip) and hip <= set(names), sorted(hip - set(names))
    # No development tool: none of perf/'s modules, none of their peer loaders or plots.
    perf_modules = {Path(f).name for f in files if f.startswith("perf/") and f.endswith(".py")}
    assert {"benchutil.py", "peer_variants.py"} <= perf_modules
    assert not perf_modules & {Path(n).name for n in names}
    z = zipfile.ZipFile(wheel)
    for n in names:
        if n.endswith(".py"):
            text = z.read(n).decode()
            for dev_only in ("def load_aiter_peer", "def load_vllm_peer", "import matplotlib"):
                assert dev_only not in text, f"{n}: {dev_only}"
    entry_points = z.read(DIST_INFO + "entry_points.txt").decode()
    assert "rocm-mla = rocm_mla.tools.cli:main" in entry_points
    assert "rocm_mla = rocm_mla.vllm:register" in entry_points


def _venv(tmp: Path) -> Path:
    """A fresh virtual environment that sees the interpreter's packages (torch, triton) but not the
    repository: the editable install's finder is a .pth file of the system site-packages, so the
    wheel's copy, first on sys.path, must be the one imported (checked by the caller)."""
    venv = tmp / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True, timeout=120
    )
    py = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        # These tests run in a virtual environment: torch is in its site-packages, not in the base
        # interpreter's. Listed as plain paths, whose .pth files (the editable finder) are not run.
        purelib = subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        Path(purelib, "outer_site_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


def test_installed_wheel_runs_its_commands(wheel, tmp_path):
    venv = _venv(tmp_path)
    py, cli = venv / "bin" / "python", venv / "bin" / "rocm-mla"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET", "ROCM_MLA_AITER_PEERS")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index"]
    r = subprocess.run([*pip, str(wheel)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    work = tmp_path / "elsewhere"  # outside the checkout: no perf/, no rocm_mla/ beside the cwd
    work.mkdir()

    def run(*args: str | Path, timeout: int = 300) -> subprocess.CompletedProcess:
        p = subprocess.run([str(a) for a in args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0 and "Traceback" not in p.stderr, f"{args}: {p.stdout[-3000:]}{p.stderr[-3000:]}"
        return p

    code = (
        "import importlib.util, rocm_mla, rocm_mla.tools.tune, rocm_mla.tools.isa_report; "
        "print(rocm_mla.__file__); "
        "print([m for m in ('rocm_mla.tools.benchutil', 'rocm_mla.tools.peer_variants', 'benchutil', "
        "'peer_variants') if importlib.util.find_spec(m)])"
    )
    where, dev_modules = run(py, "-c", code).stdout.split()[-2:]
    assert Path(where).resolve().is_relative_to(venv.resolve()), f"imported {where}, not the wheel in {venv}"
    assert dev_modules == "[]", dev_modules
    assert "isa-report" in run(cli, "--help").stdout
    assert "--no-peers" in run(cli, "isa-report", "--help").stdout
    assert "--check" in run(cli, "tune", "--help").stdout
    # The peers' variants live in the repository's perf/: one skipped row says so, nothing fails.
    report = run(cli, "isa-report", "--arch", "gfx942", "--filter", "aiter", "-q").stdout
    said = [ln for ln in report.splitlines() if "perf/" in ln]
    assert len(said) == 1 and "the peers' variants come with the repository's perf/ folder" in said[0], report
    assert "Traceback" not in report
