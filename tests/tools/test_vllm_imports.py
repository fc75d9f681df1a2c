"""What the vLLM backends (rocm_mla/vllm/) may import of the package: the public ops (the package
``rocm_mla.ops``, names of its ``__all__``), the leaf modules (mla_dims, env, configs, _platform) and
their own modules. Never an op module (``rocm_mla.ops.sparse``), a private one
(``rocm_mla.ops._checks``) or a private name: a backend asks a kept plan ``plan.matches(...)``
rather than re-deriving the op's checks, so an op's internals can change without breaking vLLM.
The files are parsed (``ast``), not imported: vLLM need not be installed."""

from __future__ import annotations

import ast
from pathlib import Path

import rocm_mla.ops

PKG = Path(__file__).resolve().parents[2] / "rocm_mla"
VLLM_DIR = PKG / "vllm"
# Modules of the package whose every name a backend may import (leaves: they import no op).
LEAF_MODULES = ("rocm_mla.mla_dims", "rocm_mla.env", "rocm_mla.configs", "rocm_mla._platform")
OPS = "rocm_mla.ops"


def _imports(source: str, package: str) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` of every import in ``source`` (a module of ``package``): ``name``
    None for ``import module``; relative imports resolved; ``importlib.import_module("...")``
    with a literal name counted as an import."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            found += [(node.lineno, module, a.name) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value, None))
    return found


def _problems(source: str, package: str = "rocm_mla.vllm") -> list[str]:
    """Each import of ``source`` that reaches past rocm_mla's public ops and leaf modules."""
    public_ops = set(rocm_mla.ops.__all__)
    leaf_names = {m.rsplit(".", 1)[1] for m in (*LEAF_MODULES, OPS)}
    bad = []
    for line, module, name in _imports(source, package):
        what = f"line {line}: from {module} import {name}" if name else f"line {line}: import {module}"
        if module != "rocm_mla" and not module.startswith("rocm_mla."):
            continue  # vLLM, torch, the standard library
        if module == package or module.startswith(f"{package}."):
            continue  # the backends' own modules
        if module == OPS:
            if name is not None and (name.startswith("_") or name not in public_ops):
                bad.append(f"{what} (not in rocm_mla.ops.__all__)")
        elif module in LEAF_MODULES:
            continue
        elif module == "rocm_mla":
            if name is not None and name not in leaf_names:
                bad.append(f"{what} (import the op from rocm_mla.ops)")
        else:
            bad.append(f"{what} (an op module or a private module: import from rocm_mla.ops)")
    return bad


def test_vllm_backends_import_only_public_ops():
    files = sorted(VLLM_DIR.rglob("*.py"))
    assert files
    offenders = {}
    for path in files:
        package = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
        if bad := _problems(path.read_text(), package):
            offenders[str(path.relative_to(PKG.parent))] = bad
    assert not offenders, f"rocm_mla/vllm/ imports private or op-module names of rocm_mla.ops: {offenders}"


def test_the_check_sees_every_private_form():
    """The check itself: each way of reaching past the public ops is reported, the allowed forms
    are not."""
    private = [
        "from rocm_mla.ops._checks import plan_mismatch",
        "from rocm_mla.ops.sparse import plan_fields",
        "import rocm_mla.ops.indexer_topk as op",
        "from ..ops._checks import Checker",
        "from ..ops import _destinations",
        "from rocm_mla.ops import not_an_op_name",
        "from rocm_mla import mla_decode",
        "from rocm_mla.reference import mla_sparse_attention_ref",
        "import importlib\nimportlib.import_module('rocm_mla.ops._dispatch')",
    ]
    for src in private:
        assert _problems(src), src
    allowed = [
        "from rocm_mla.ops import mla_sparse_attention, plan_sparse_attention, SparsePlan",
        "from ..ops import gather_context_chunk",
        "import rocm_mla.ops",
        "from rocm_mla import env",
        "from rocm_mla.mla_dims import KV_ROW_DIM",
        "from rocm_mla.configs import platform_fp8_dtype",
        "from rocm_mla._platform import device_arch",
        "from .backend import RocmMLAImpl",
        "from rocm_mla.vllm.step_plans import kept_plan",
        "import torch\nfrom vllm.platforms import current_platform",
    ]
    for src in allowed:
        assert not _problems(src), src
