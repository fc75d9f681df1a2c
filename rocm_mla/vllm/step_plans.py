"""How every op of a vLLM step reuses the plan its metadata carries (one rule for the dense decode,
the prefill passes, the sparse attention and the indexer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def kept_plan(holder: Any, fits: Callable[[Any], bool], make: Callable[[], Any], attr: str = "rocm_mla_plan"):
    """``getattr(holder, attr)`` when there is one and ``fits(plan)`` (it was made for this call's
    tensors: the metadata builder's, or the one the step's first layer left), else ``make()``,
    left on ``holder`` for the step's other layers. Never raises for a plan that does not fit:
    a call the stored plan was not made for (other rows, a narrowed or gathered query) plans
    from its own tensors."""
    plan = getattr(holder, attr, None)
    if plan is None or not fits(plan):
        plan = make()
        setattr(holder, attr, plan)
    return plan


__all__ = ["kept_plan"]
