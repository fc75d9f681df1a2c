"""Test set-up: on a machine without a GPU, Triton kernels run in the CPU interpreter.

TRITON_INTERPRET must be set before any @triton.jit decorator runs, so it is set here, before
rocm_mla is imported. GPU-only tests carry the ``gpu`` marker and skip cleanly without a GPU.
"""

import os

import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests check the package's own launch data: a tuned overlay of the machine's user
# (`rocm-mla tune`, ~/.config/rocm_mla) must not change it. tests/test_tune.py uses its own folders.
os.environ["ROCM_MLA_CONFIG_DIR"] = ""

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA or ROCm GPU (skipped on CPU)")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU (CUDA or ROCm); none visible to torch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
