"""Which implementation runs an op: HIP extension, Triton, or the float32 reference.

``hip`` names the compiled extension built from ``hip_src/``, whatever compiled it: hipcc on a ROCm
torch (MI300), nvcc on a CUDA torch (the very same sources, e.g. on an H100/H200). There is no
separate "cuda" backend name.

Default: on a GPU, the first available of the arch's ``backend_order`` (configs/<op>.json, ordered
by measured speed), then the reference; on CPU, Triton when ``TRITON_INTERPRET=1`` else the
reference. Force one with ``ROCM_MLA_BACKEND=hip|triton|reference`` (all ops) or
``ROCM_MLA_BACKEND_<OP>=...`` (one op, e.g. ``ROCM_MLA_BACKEND_MERGE_ATTN_STATES``), or the op's
``backend=`` argument. A forced backend that cannot run raises instead of falling back.
"""

from __future__ import annotations

import torch

from .. import _ext, _platform, env
from ..configs import BACKENDS, config_for


def unavailable(backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot run on ``device`` (None when it can)."""
    if backend == "reference":
        return None
    if backend == "triton":
        if device.type == "cuda" or _platform.interpreter_active():
            return None
        return "Triton needs a GPU, or TRITON_INTERPRET=1 (set before importing rocm_mla) on CPU"
    if backend == "hip":
        if device.type != "cuda":
            return "the HIP extension runs on GPU tensors only"
        if _ext.load() is None:
            return f"the HIP extension is unavailable: {_ext.unavailable_reason()}"
        return None
    raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")


def forced_backend(op: str) -> str | None:
    """The backend named by the environment for ``op``, if any."""
    return env.get(f"ROCM_MLA_BACKEND_{op.upper()}") or env.get("ROCM_MLA_BACKEND")


def select(op: str, device: torch.device, backend: str | None = None, *, has_hip: bool = True) -> str:
    """The backend that runs ``op`` on ``device``; ``backend`` (or the environment) forces one.
    ``has_hip``: whether the op has a HIP kernel (forcing "hip" on one without raises)."""
    forced = backend or forced_backend(op)
    if forced:
        forced = forced.lower()
        why = f"{op} has no HIP kernel (use 'triton' or 'reference')" if forced == "hip" and not has_hip else None
        why = why or unavailable(forced, device)
        if why:
            raise RuntimeError(f"{op}: backend {forced!r} was requested but cannot run: {why}")
        return forced
    if device.type == "cuda":
        order = config_for(op, _platform.device_arch(device))["backend_order"]
        for b in order:
            if unavailable(b, device) is None:
                return b
        return "reference"
    return "triton" if _platform.interpreter_active() else "reference"
