"""Package layering: the runtime package does not import its test scaffolding (rocm_mla.testing
patches vLLM), and ``import rocm_mla`` / the vLLM plugin module load neither it nor vLLM."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "rocm_mla"


def test_runtime_modules_do_not_import_testing():
    pat = re.compile(
        r"^\s*(from\s+(rocm_mla\.testing|\.+testing)\b|import\s+rocm_mla\.testing\b)"
        r"|^\s*from\s+(rocm_mla|\.+)\s+import\s+.*\btesting\b",
        re.MULTILINE,
    )
    offenders = [
        str(p.relative_to(PKG.parent))
        for p in PKG.rglob("*.py")
        if "testing" not in p.relative_to(PKG).parts and pat.search(p.read_text())
    ]
    assert not offenders, f"runtime modules importing rocm_mla.testing: {offenders}"


def test_import_loads_no_scaffolding():
    code = (
        "import sys, rocm_mla, rocm_mla.ops, rocm_mla.vllm; "
        "print(sorted(m for m in sys.modules if m.startswith(('rocm_mla.testing', 'vllm'))))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent, timeout=300, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout
