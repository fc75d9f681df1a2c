"""Package layering: the wheel's package imports none of the test scaffolding (tests/vllm_harness
patches vLLM), pytest or the perf scripts; ``rocm_mla.cases`` (shared by tests, doctor, tuner and
benches) stays below the tools; and ``import rocm_mla`` / the vLLM plugin module load neither the
scaffolding nor vLLM."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "rocm_mla"

# Module names a runtime file must never import: the test scaffolding, the test runner, the benches
# and their helpers (perf/benchutil.py, perf/peer_variants.py; the ISA report loads the latter from a
# checkout at run time, never by an import statement).
FORBIDDEN = ("vllm_harness", "pytest", "perf", "tests", "_util", "benchutil", "peer_variants")
IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.MULTILINE)


def _imports(path: Path) -> set[str]:
    return {m.group(1) or m.group(2) for m in IMPORT.finditer(path.read_text())}


def test_runtime_modules_import_no_scaffolding():
    offenders = {
        str(p.relative_to(PKG.parent)): sorted(mods)
        for p in PKG.rglob("*.py")
        if (mods := {m for m in _imports(p) if m.split(".")[0] in FORBIDDEN})
    }
    assert not offenders, f"runtime modules importing test or bench code: {offenders}"


def test_cases_stay_below_the_tools():
    """rocm_mla.cases builds inputs for tests, doctor, the tuner and the benches: it may use the
    ops, references and configs, never the tools that use it."""
    offenders = {
        str(p.relative_to(PKG.parent)): sorted(mods)
        for p in (PKG / "cases").glob("*.py")
        if (mods := {m for m in _imports(p) if m.startswith(("rocm_mla.tools", "..tools", "rocm_mla.vllm", "..vllm"))})
    }
    assert not offenders, offenders


def test_scaffolding_lives_outside_the_package():
    assert not (PKG / "testing").exists(), "rocm_mla/testing is back inside the wheel"
    assert (PKG.parent / "tests" / "vllm_harness" / "__init__.py").is_file()


def test_import_loads_no_scaffolding():
    code = (
        "import sys, rocm_mla, rocm_mla.ops, rocm_mla.vllm, rocm_mla.cases; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'vllm_harness', 'pytest')))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, timeout=300, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout
