""".ci/install_vllm_cpu.sh and the vLLM tests' version gate name the same releases, the script's
default is the one CI tests, and a release outside them is refused naming the ones supported."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from vllm_harness import SUPPORTED_VLLM

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "install_vllm_cpu.sh"


def test_script_and_gate_name_the_same_releases():
    text = SCRIPT.read_text()
    (accepted,) = re.findall(r"^  ([0-9.]+ \| [0-9.| ]+)\) ;;$", text, flags=re.M)
    assert tuple(v.strip() for v in accepted.split("|")) == SUPPORTED_VLLM
    assert re.search(r"WANT=\$\{VLLM_VERSION:-([0-9.]+)\}", text).group(1) == SUPPORTED_VLLM[0]


def test_an_unsupported_release_is_refused_naming_the_supported():
    env = {**os.environ, "VLLM_VERSION": "0.35.0", "PYTHON": "false"}  # never reaches pip
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "VLLM_VERSION=0.35.0" in r.stderr and all(v in r.stderr for v in SUPPORTED_VLLM)
