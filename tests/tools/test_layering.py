"""Package layering: the wheel's package imports none of the test scaffolding (tests/vllm_harness
patches vLLM), pytest or the perf scripts; ``rocm_mla.cases`` (shared by tests, doctor, tuner and
benches) stays below the tools; ``import rocm_mla`` / the vLLM plugin module load neither the
scaffolding nor vLLM; and an op's kernel file shares code with another op's only through the
latent-attention core (rocm_mla/kernels/latent_core.py)."""

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


# Kernel files every op's kernels may import: the latent-attention core (rocm_mla/kernels/latent_core.py)
# and the fp8 code helpers. Any other kernel file belongs to one op; a helper file of an op's own is
# listed with the kernel file that uses it.
SHARED_KERNEL_MODULES = ("latent_core", "fp8_codes")
OP_HELPER_MODULES = {"indexer_select": "indexer_topk"}


def _kernel_module(name: str) -> str | None:
    """The kernel file an import of a file in rocm_mla/kernels/ names (``.latent_core``,
    ``rocm_mla.kernels.decode``; ``from . import x`` gives ``"."``, which no rule allows), or
    None for a module outside rocm_mla/kernels/."""
    if name.startswith("rocm_mla.kernels."):
        return name.split(".")[2]
    if name.startswith(".") and not name.startswith(".."):
        return name[1:].split(".")[0] or "."
    return None


def test_kernel_files_share_only_the_core():
    """An op's kernel file imports the shared core and fp8_codes, and its own helper file, never another
    op's kernel file: what two ops' kernels share lives in latent_core.py once."""
    kernels = PKG / "kernels"
    offenders = {}
    for p in kernels.glob("*.py"):
        if p.stem == "__init__":
            continue
        allowed = set(SHARED_KERNEL_MODULES) | {h for h, owner in OP_HELPER_MODULES.items() if owner == p.stem}
        if p.stem in SHARED_KERNEL_MODULES:
            allowed = set(SHARED_KERNEL_MODULES)
        mods = {m for m in map(_kernel_module, _imports(p)) if m is not None}
        if bad := sorted(mods - allowed - {p.stem}):
            offenders[p.name] = bad
    assert not offenders, f"kernel files importing another op's kernel file: {offenders}"
    assert (kernels / "latent_core.py").is_file()
    for helper, owner in OP_HELPER_MODULES.items():
        assert (kernels / f"{helper}.py").is_file() and (kernels / f"{owner}.py").is_file()


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
