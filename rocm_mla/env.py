"""Every ``ROCM_MLA_*`` environment variable: one table (:data:`VARIABLES`), values read through
:func:`get` (which checks them against the table), and :func:`check_environment`, which warns once
about a ``ROCM_MLA_*`` name that is not in the table (so that a misspelt ``ROCM_MLA_BACKEND_<OP>``
is not silently ignored). docs/environment.md shows the same table (:func:`markdown_table`; a test
keeps the two equal).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

PREFIX = "ROCM_MLA_"
BACKEND_VALUES = ("hip", "triton", "reference")
FLAG = ("0", "1")


@dataclass(frozen=True)
class Var:
    """One variable: ``values`` the accepted values (None: free text, a path or a command; an
    empty value means unset unless the variable says otherwise), ``default`` as shown to users,
    ``reader`` who reads it (the package at run time, the build, a script), ``meaning``."""

    name: str
    values: tuple[str, ...] | None
    default: str
    reader: str
    meaning: str


def _op_names() -> tuple[str, ...]:
    """The ops with a backend switch: one configs/<op>.json each (platform.json is not an op)."""
    folder = Path(__file__).parent / "configs"
    return tuple(sorted(p.stem for p in folder.glob("*.json") if p.stem != "platform"))


OPS = _op_names()

VARIABLES: tuple[Var, ...] = (
    Var("ROCM_MLA_BACKEND", BACKEND_VALUES, "unset", "ops",
        "force one implementation for every op (one that cannot run raises)"),
    Var("ROCM_MLA_BACKEND_<OP>", BACKEND_VALUES, "unset", "ops",
        "the same for one op; `<OP>` one of " + ", ".join(o.upper() for o in OPS)),
    Var("ROCM_MLA_DEBUG", FLAG, "0", "ops",
        "1: host-side checks of index values, naming the first bad one (a sync per call: not capturable)"),
    Var("ROCM_MLA_CONFIG_DIR", None, "~/.config/rocm_mla", "ops",
        "where tuned overlays are read and `rocm-mla tune` writes them; set but empty: no overlay"),
    Var("ROCM_MLA_CACHE", None, "~/.cache/rocm_mla", "ops", "where the HIP extension is built on first use"),
    Var("ROCM_MLA_NO_JIT", FLAG, "0", "ops", "1: never build the HIP extension at run time (Triton serves the ops)"),
    Var("ROCM_MLA_FP8_DOTS", ("none", "qk", "all"), "none", "vLLM backend",
        "fp8 caches: the decode plan's fp8_dots (q, and p, rounded to e4m3: faster on gfx942, less exact)"),
    Var("ROCM_MLA_BATCH_INVARIANT", FLAG, "0", "vLLM backend",
        "1: every op runs batch-invariant (as VLLM_BATCH_INVARIANT=1 does)"),
    Var("ROCM_MLA_SKIP_AOT", FLAG, "0", "pip install",
        "1: do not compile the HIP extension at install time (it is then built on first use)"),
    Var("ROCM_MLA_CLANG", None, "clang++ on PATH", "isa-report", "the clang++ that compiles HIP for gfx942/gfx950"),
    Var("ROCM_MLA_DEVICE_LIBS", None, "found next to clang", "isa-report", "ROCm's device bitcode folder"),
    Var("ROCM_MLA_NVCC", None, "nvcc", "isa-report", "nvcc for the sm90 rows"),
    Var(
        "ROCM_MLA_CACHE_DIR",
        None,
        "~/.cache/rocm_mla",
        "isa-report",
        "where toolchain-derived files are kept (device bitcode, compiled HIP ISA)",
    ),
    Var("ROCM_MLA_AITER_PEERS", None, ".peers/aiter", "isa-report, perf", "aiter's Triton files for the peer rows"),
    Var("ROCM_MLA_PLUGIN", None, "rocm_mla", "docker/serve.sh", "rocm-mla's entry-point name, added to VLLM_PLUGINS"),
    Var("ROCM_MLA_FUSE_ROPE_KV", FLAG, "1", "docker/serve.sh",
        "1: with ROCM_MLA, turn on vLLM's fused RoPE + KV-cache write pass"),
    Var("ROCM_MLA_EXPECT_VLLM", None, "0.34.,0.33.", "docker/serve.sh",
        "vLLM version prefixes (comma-separated) the start-up check accepts; empty: any"),
    Var("ROCM_MLA_SERVE_CHECK_ONLY", FLAG, "0", "docker/serve.sh", "1: run the start-up checks and exit"),
    Var("ROCM_MLA_TEST_WORKERS", None, "2", "dev.sh", "pytest processes of ./dev.sh test"),
)  # fmt: skip

_BY_NAME = {v.name: v for v in VARIABLES}


def lookup(name: str) -> Var | None:
    """The table's entry for ``name`` (``ROCM_MLA_BACKEND_<OP>`` for a known op's switch)."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name.startswith("ROCM_MLA_BACKEND_") and name[len("ROCM_MLA_BACKEND_") :].lower() in OPS:
        return _BY_NAME["ROCM_MLA_BACKEND_<OP>"]
    return None


def get(name: str) -> str | None:
    """The value of variable ``name`` (stripped; None when unset or empty), checked: a value the
    table does not accept raises ValueError naming the variable and the accepted values. Choice
    values compare case-insensitively and come back in lower case."""
    var = lookup(name)
    if var is None:
        raise KeyError(f"{name} is not a rocm_mla environment variable (rocm_mla.env.VARIABLES)")
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    value = raw.strip()
    if var.values is not None:
        value = value.lower()
        if value not in var.values:
            raise ValueError(f"{name}={raw!r}: expected one of {', '.join(var.values)} (or unset)")
    return value


def flag(name: str) -> bool:
    """Whether the 0/1 variable ``name`` is 1 (checked by :func:`get`)."""
    return get(name) == "1"


def unknown_names(environ=None) -> list[str]:
    """``ROCM_MLA_*`` names set in ``environ`` (default os.environ) that are not in the table."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith(PREFIX) and lookup(k) is None)


_warned: set[str] = set()


def check_environment() -> None:
    """Warn (once per name and process) about ``ROCM_MLA_*`` variables rocm_mla does not read,
    naming the ones it does; a value the table does not accept is reported when read."""
    for name in unknown_names():
        if name in _warned:
            continue
        _warned.add(name)
        hint = ""
        if name.startswith("ROCM_MLA_BACKEND_"):
            hint = f" (op switches: {', '.join('ROCM_MLA_BACKEND_' + o.upper() for o in OPS)})"
        warnings.warn(
            f"{name} is set but rocm_mla does not read it{hint}; the variables are listed in "
            "docs/environment.md (rocm_mla.env.VARIABLES)",
            RuntimeWarning,
            stacklevel=2,
        )


def markdown_table() -> str:
    """The table as docs/environment.md shows it."""
    lines = ["| variable | values | default | read by | meaning |", "| --- | --- | --- | --- | --- |"]
    for v in VARIABLES:
        values = " / ".join(f"`{x}`" for x in v.values) if v.values else "text"
        lines.append(f"| `{v.name}` | {values} | {v.default} | {v.reader} | {v.meaning} |")
    return "\n".join(lines)


__all__ = ["VARIABLES", "Var", "OPS", "lookup", "get", "flag", "unknown_names", "check_environment", "markdown_table"]
