"""Test set-up: on a machine without a GPU, Triton kernels run in the CPU interpreter.

TRITON_INTERPRET must be set before any @triton.jit decorator runs, so it is set here, before
rocm_mla is imported. GPU-only tests carry the ``gpu`` marker and skip cleanly without a GPU.

Layout: one folder per op (tests/<op>/: correctness and memory safety side by side), the shared
input builders (tests/cases/), the vLLM backend's tests (tests/vllm_backend/, marker ``vllm``; a
folder named ``vllm`` would shadow the package where vLLM is not installed) and the tests of the
tools, bench scripts and package layout (tests/tools/, marker ``tools``). Select with
``-m "not vllm and not tools"`` and the like; the markers are registered in pyproject.toml.

perf/ is on ``sys.path`` (at its end): the benches' helpers that are not part of the wheel
(``benchutil``: peer loaders, vLLM's paths, the CSV; ``peer_variants``) and the bench scripts are
imported by module name, as the scripts import each other.
"""

import os
import sys
from pathlib import Path

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests check the package's own launch data: a tuned overlay of the machine's user
# (`rocm-mla tune`, ~/.config/rocm_mla) must not change it. tests/tools/test_tune.py uses its own folders.
os.environ["ROCM_MLA_CONFIG_DIR"] = ""

import pytest  # noqa: E402

TESTS = Path(__file__).resolve().parent
sys.path.append(str(TESTS.parent / "perf"))


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a GPU (CUDA or ROCm); none visible to torch")
    for item in items:
        path = Path(str(item.path)).resolve()
        if path.parent == TESTS / "vllm_backend":
            item.add_marker(pytest.mark.vllm)
        if path.parent == TESTS / "tools":
            item.add_marker(pytest.mark.tools)
        if not HAS_GPU and "gpu" in item.keywords:
            item.add_marker(skip)
