"""The ROCM_MLA_* environment variables: one table (rocm_mla.env), shown as it is in
docs/environment.md, covering every variable the code, the build and the scripts read; values
checked when read; unknown names reported."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_mla import env

ROOT = Path(__file__).resolve().parents[2]

# Where a variable is read: os.environ / getenv / rocm_mla.env calls in Python, ${NAME...} and
# NAME= (assignments, exports, docker ENV lines) in shell and Dockerfiles.
READ_PATTERNS = (
    re.compile(r"""(?:environ(?:\.get)?\(|environ\[|getenv\(|env\.(?:get|flag)\()\s*f?["'](ROCM_MLA_[A-Z0-9_]+)"""),
    re.compile(r"\$\{?(ROCM_MLA_[A-Z0-9_]+)"),
    re.compile(r"(?:^|[\s;])(ROCM_MLA_[A-Z0-9_]+)="),
)
SOURCES = ["rocm_mla", "setup.py", "docker", "dev.sh", ".ci", "perf"]


def _files():
    for s in SOURCES:
        p = ROOT / s
        yield from ([p] if p.is_file() else (f for f in p.rglob("*") if f.is_file() and f.suffix in ("", ".py", ".sh")))


def test_every_variable_read_is_in_the_table():
    """Each ROCM_MLA_* name the repository reads (op switches as ROCM_MLA_BACKEND_<OP>) has a row."""
    found = {}
    for f in _files():
        text = f.read_text(errors="ignore")
        for pat in READ_PATTERNS:
            for m in pat.finditer(text):
                name = m.group(1)
                if not name.endswith("_"):  # f"ROCM_MLA_BACKEND_{op}": the <OP> row
                    found.setdefault(name, str(f.relative_to(ROOT)))
    assert "ROCM_MLA_DEBUG" in found and "ROCM_MLA_SKIP_AOT" in found  # the patterns see Python and setup.py
    missing = {n: f for n, f in found.items() if env.lookup(n) is None}
    assert not missing, f"read but not in rocm_mla.env.VARIABLES: {missing}"


def test_docs_show_the_table():
    text = (ROOT / "docs/environment.md").read_text()
    assert env.markdown_table() in text, "docs/environment.md: regenerate the table from rocm_mla.env.markdown_table()"


def test_values_are_checked_when_read(monkeypatch):
    monkeypatch.setenv("ROCM_MLA_BACKEND_MLA_DECODE", "Triton")
    assert env.get("ROCM_MLA_BACKEND_MLA_DECODE") == "triton"
    monkeypatch.setenv("ROCM_MLA_BACKEND", "fast")
    with pytest.raises(ValueError, match=r"ROCM_MLA_BACKEND='fast': expected one of hip, triton, reference"):
        env.get("ROCM_MLA_BACKEND")
    from rocm_mla.ops._dispatch import forced_backend

    with pytest.raises(ValueError, match="ROCM_MLA_BACKEND="):
        forced_backend("merge_attn_states")
    monkeypatch.setenv("ROCM_MLA_DEBUG", "yes")
    with pytest.raises(ValueError, match=r"ROCM_MLA_DEBUG='yes': expected one of 0, 1"):
        env.flag("ROCM_MLA_DEBUG")
    monkeypatch.setenv("ROCM_MLA_DEBUG", " ")
    assert env.flag("ROCM_MLA_DEBUG") is False  # empty: unset
    with pytest.raises(KeyError, match="ROCM_MLA_NOPE is not a rocm_mla environment variable"):
        env.get("ROCM_MLA_NOPE")


def test_unknown_names_warn_once(monkeypatch):
    monkeypatch.setenv("ROCM_MLA_BACKEND_MLA_DECOD", "triton")  # misspelt op
    monkeypatch.setenv("ROCM_MLA_BACKEND_MERGE_ATTN_STATES", "triton")  # a real one
    monkeypatch.setattr(env, "_warned", set())
    assert env.unknown_names() == ["ROCM_MLA_BACKEND_MLA_DECOD"]
    with pytest.warns(RuntimeWarning, match=r"ROCM_MLA_BACKEND_MLA_DECOD is set but .*ROCM_MLA_BACKEND_MLA_DECODE"):
        env.check_environment()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.check_environment()  # once per name


def test_import_reports_an_unknown_name():
    """At ``import rocm_mla``, in a fresh interpreter."""
    r = subprocess.run(
        [sys.executable, "-c", "import rocm_mla"],
        env={"ROCM_MLA_NO_JTI": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0 and "ROCM_MLA_NO_JTI is set but rocm_mla does not read it" in r.stderr
