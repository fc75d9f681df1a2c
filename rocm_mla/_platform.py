"""Which accelerator a tensor lives on, named the way the per-arch configs are keyed.

``gfx942`` (MI300), ``gfx950`` (MI350), ``sm90`` (H100/H200), ``cpu``. One place derives it so
that no other module branches on product names.
"""

from __future__ import annotations

import functools

import torch


def is_rocm() -> bool:
    """True on a ROCm build of torch (HIP devices appear as ``cuda`` devices)."""
    return torch.version.hip is not None


def vendor(device: torch.device) -> str:
    """``"amd"``, ``"nvidia"`` or ``"cpu"`` for a torch device."""
    if device.type != "cuda":
        return "cpu"
    return "amd" if is_rocm() else "nvidia"


@functools.cache
def cuda_arch(index: int) -> str:
    """Arch key of visible GPU ``index`` (``gfx942``, ``sm90``, ...)."""
    props = torch.cuda.get_device_properties(index)
    if is_rocm():
        # gcnArchName looks like "gfx942:sramecc+:xnack-": the target features are not part of the key.
        return props.gcnArchName.split(":")[0]
    return f"sm{props.major}{props.minor}"


def device_arch(device: torch.device) -> str:
    """Arch key of ``device``: ``gfx942``, ``sm90``, ... or ``cpu``."""
    if device.type != "cuda":
        return "cpu"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return cuda_arch(index)


def interpreter_active() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"
