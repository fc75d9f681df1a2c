"""``TritonVariant``: one launchable Triton configuration, described for ahead-of-time compilation.

Imports no op and no kernel: the op modules never import this package; the per-op variant
modules (``rocm_mla.variants.<op>``) import the op's meta builder and this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TritonVariant:
    """One launchable Triton configuration.

    kernel: op-level kernel name, e.g. ``"merge_attn_states"``.
    config: short human label of the specialisation, e.g. ``"bf16 D=128 rows=16 w4"``.
    fn: the ``@triton.jit`` function.
    signature: argument name -> Triton type (``"*bf16"``, ``"i32"``, ``"fp32"``, ``"constexpr"``).
    constexprs: values of the constexpr arguments.
    options: compile options (``num_warps``, ``num_stages``; on AMD ``waves_per_eu``,
        ``matrix_instr_nonkdim``, ``kpack``).
    divisible_by_16: argument names the launcher sees 16-divisible on real tensors (aligned pointers,
        strides that are multiples of 16); the AOT compile gets the same hint.
    expects_mfma: True when the kernel contains a ``tl.dot`` (the report fails a variant without
        matrix instructions).
    resident: programs (workgroups, blocks) a persistent launch places on each CU / SM at once, its
        config's ``programs_per_cu``: the report fails a variant whose registers and LDS hold fewer
        at once (0: no such launch).
    """

    kernel: str
    config: str
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    divisible_by_16: tuple[str, ...] = ()
    expects_mfma: bool = False
    resident: int = 0
