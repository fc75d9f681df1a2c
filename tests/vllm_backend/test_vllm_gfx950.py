"""vLLM's ROCm platform on a simulated MI350X/MI355X (gfx950): its selector picks ROCM_MLA, and
the fp8 kind vLLM uses there (``current_platform.fp8_dtype()``) is the one rocm_mla's configs
give gfx950 (e4m3fn, OCP), as e4m3fnuz is gfx942's.

vLLM reads the GPU arch once, when ``vllm.platforms.rocm`` is imported, and this test process
already has a platform (the other vLLM tests simulate gfx942): each check runs in a fresh
interpreter that reports the arch to that import (torch's device properties patched for the
import only) and makes vLLM's own ``RocmPlatform`` the current platform. Nothing else of the
platform is patched: its device capability (9.5) and fp8 kind come from the arch, as on the part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_harness import require_vllm

require_vllm()

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, sys, types
from unittest import mock
import torch

arch = sys.argv[1]
with mock.patch.object(
    torch.cuda, "get_device_properties", lambda *a, **k: types.SimpleNamespace(gcnArchName=arch + ":sramecc+:xnack-")
):
    import vllm.platforms.rocm as rocm
import vllm.platforms as platforms

platforms._current_platform = rocm.RocmPlatform()
from vllm.platforms import current_platform
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

import rocm_mla.vllm as rocm_vllm
from rocm_mla.configs import platform_fp8_dtype

rocm_vllm.register()
picked, refused = {}, {}
for dtype in (torch.bfloat16, torch.float16):
    for kv in ("auto", "fp8", "fp8_e4m3"):
        for block in (1, 16, 64):
            for heads in (8, 16, 24, 128):
                sel = AttentionSelectorConfig(
                    head_size=576, dtype=dtype, kv_cache_dtype=kv, block_size=block, use_mla=True
                )
                picked[f"{dtype} {kv} {block} {heads}"] = current_platform.get_attn_backend_cls(
                    AttentionBackendEnum["ROCM_MLA"], sel, num_heads=heads
                )
sel = AttentionSelectorConfig(head_size=320, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=True)
try:
    current_platform.get_attn_backend_cls(AttentionBackendEnum["ROCM_MLA"], sel, num_heads=16)
except ValueError as e:
    refused["head_size 320"] = str(e)
cap = current_platform.get_device_capability()
print(json.dumps({
    "gcn_arch": rocm._GCN_ARCH,
    "capability": [cap.major, cap.minor],
    "vllm_fp8": str(current_platform.fp8_dtype()),
    "rocm_mla_fp8": str(platform_fp8_dtype(arch)),
    "backend_class": rocm_vllm.BACKEND_CLASS,
    "picked": picked,
    "refused": refused,
}))
"""


def _simulated(arch: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, arch], capture_output=True, text=True, env=env, timeout=600, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gfx950():
    return _simulated("gfx950")


def test_rocm_selector_picks_rocm_mla_on_gfx950(gfx950):
    assert gfx950["gcn_arch"].startswith("gfx950") and gfx950["capability"] == [9, 5]
    assert gfx950["picked"] and set(gfx950["picked"].values()) == {gfx950["backend_class"]}, gfx950["picked"]
    assert "head_size" in gfx950["refused"]["head_size 320"]  # the backend's own validation still runs


def test_gfx950_fp8_kind_is_ocp_e4m3fn_on_both_sides(gfx950):
    assert gfx950["vllm_fp8"] == "torch.float8_e4m3fn"
    assert gfx950["rocm_mla_fp8"] == gfx950["vllm_fp8"]


def test_gfx942_fp8_kind_is_fnuz_on_both_sides():
    """The same check for MI300: vLLM's e4m3fnuz is what rocm_mla's gfx942 entry says."""
    gfx942 = _simulated("gfx942")
    assert gfx942["capability"] == [9, 4]
    assert gfx942["vllm_fp8"] == "torch.float8_e4m3fnuz" == gfx942["rocm_mla_fp8"]
