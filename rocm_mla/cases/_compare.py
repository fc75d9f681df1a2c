"""The one comparison rule of every op's check: :class:`Bound` and :func:`compare`.

A result agrees with its float32 reference when

* it is NaN exactly where the reference is NaN, and infinite (same sign) exactly where the
  reference is (a NaN where the reference is finite is an element not written, or a poisoned
  cache slot read);
* every finite element satisfies ``|got - ref| <= atol + rtol * |ref|`` (``torch.allclose``'s
  form; with ``atol == rtol == t`` it is ``|got - ref| / (1 + |ref|) <= t``); and
* when the bound has a ``norm``: ``||got - ref|| <= norm * ||ref||`` over the finite elements
  (relative Frobenius error). Attention over thousands of keys gives outputs of a few hundredths,
  where an element-wise ``atol`` of 1e-2 says little; the norm-wise part keeps such a check tight.

The rule is the same for tests, the doctor's self-check, the tuner and the benches; each op's
module holds its bounds in one table (``TOLERANCE[dtype][output]``). The element-wise part of
an op's bound is sized to one rounding of the output plus the op's own roundings (fp16/bf16 p
and V in the attention ops: a few ulps of the largest |v|); the norm-wise part is :data:`NORM` for every float op:
fp32 1e-5 and fp16 2e-3 (an order of magnitude above what the Triton kernels reach on the odd,
selfcheck and verify sets), bf16 1e-2 (what the benchmarks' checks hold at serving lengths); the
figures behind them: docs/notes/check-bounds.md. A check at serving lengths that compares only a
few requests or rows (the tuner, the benches) uses the same bounds.

Inputs objects take ``check`` (and, where ``compare`` says it all, ``mismatch``) from
:class:`Checked`; those whose op has a plan with knobs make it with :func:`with_plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Relative Frobenius bound per dtype, shared by every float op's table.
NORM = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def dtype_name(dtype: torch.dtype) -> str:
    """``bf16``, ``fp16``, ``fp32`` (other dtypes: torch's name without the prefix)."""
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    return names.get(dtype, str(dtype).removeprefix("torch."))


class CaseMismatch(AssertionError):
    """A result that disagrees with its reference; the message names the output and the error."""


@dataclass(frozen=True)
class Bound:
    """Element-wise ``|got - ref| <= atol + rtol * |ref|``, plus ``||got - ref|| <= norm * ||ref||``
    (relative Frobenius error over the finite elements) when ``norm`` is set."""

    atol: float
    rtol: float
    norm: float | None = None

    def __str__(self) -> str:
        s = f"atol {self.atol:g} rtol {self.rtol:g}"
        return s + (f" norm {self.norm:g}" if self.norm is not None else "")


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` found: ``max_err`` is ``max |got - ref| / (1 + |ref|)`` over the finite
    elements (the doctor's column), ``norm_err`` the relative Frobenius error, ``problem`` '' when
    the bound holds, else a readable sentence."""

    name: str
    max_err: float
    norm_err: float
    problem: str

    @property
    def ok(self) -> bool:
        return not self.problem


def compare(name: str, got: torch.Tensor, ref: torch.Tensor, bound: Bound) -> Comparison:
    """Compare ``got`` (any dtype, converted to float32) with ``ref`` under ``bound``."""
    got, ref = got.detach().float(), ref.detach().float().to(got.device)
    if got.shape != ref.shape:
        return Comparison(name, math.nan, math.nan, f"{name}: shape {tuple(got.shape)}, reference {tuple(ref.shape)}")
    if got.numel() == 0:
        return Comparison(name, 0.0, 0.0, "")
    gnan, rnan = torch.isnan(got), torch.isnan(ref)
    if not torch.equal(gnan, rnan):
        extra, missing = int((gnan & ~rnan).sum()), int((rnan & ~gnan).sum())
        where = []
        if extra:
            first = tuple(int(i) for i in (gnan & ~rnan).nonzero()[0])
            where.append(f"{extra} NaN where the reference is finite (first at {first}: an element not written?)")
        if missing:
            where.append(f"{missing} finite where the reference is NaN")
        return Comparison(name, math.nan, math.nan, f"{name}: " + "; ".join(where))
    ginf, rinf = torch.isinf(got), torch.isinf(ref)
    if not torch.equal(ginf, rinf) or not torch.equal(got[rinf], ref[rinf]):
        n = int((ginf != rinf).sum() + (got[rinf] != ref[rinf]).sum())
        return Comparison(name, math.nan, math.nan, f"{name}: {n} elements differ in their infinities")
    fin = torch.isfinite(ref)
    g, r = got[fin], ref[fin]
    if g.numel() == 0:
        return Comparison(name, 0.0, 0.0, "")
    diff = (g - r).abs()
    max_err = float((diff / (1.0 + r.abs())).max())
    rnorm = float(r.norm())
    dnorm = float(diff.norm())
    norm_err = dnorm / rnorm if rnorm > 0 else (0.0 if dnorm == 0 else math.inf)
    over = diff > bound.atol + bound.rtol * r.abs()
    if bool(over.any()):
        i = int(torch.argmax((diff - bound.atol - bound.rtol * r.abs()).masked_fill(~over, -math.inf)))
        first = tuple(int(j) for j in fin.nonzero()[i])
        return Comparison(
            name,
            max_err,
            norm_err,
            f"{name}: {int(over.sum())} of {g.numel()} elements outside {bound} "
            f"(worst at {first}: got {float(g[i]):.6g}, reference {float(r[i]):.6g})",
        )
    if bound.norm is not None and not norm_err <= bound.norm:
        return Comparison(name, max_err, norm_err, f"{name}: relative norm error {norm_err:.3g} > {bound.norm:g}")
    return Comparison(name, max_err, norm_err, "")


def first_problem(*comparisons: Comparison) -> str:
    """'' when every comparison holds, else the first problem."""
    return next((c.problem for c in comparisons if c.problem), "")


def raise_on(problem: str) -> None:
    """Raise :class:`CaseMismatch` with ``problem`` unless it is ''."""
    if problem:
        raise CaseMismatch(problem)


class Checked:
    """``mismatch`` and ``check`` of an inputs object, from its ``compare`` (a list of
    :class:`Comparison`) called with the same arguments."""

    def mismatch(self, *args, **kw) -> str:
        """'' when every comparison of ``compare(*args, **kw)`` holds, else the first problem."""
        return first_problem(*self.compare(*args, **kw))

    def check(self, *args, **kw) -> None:
        """Raise :class:`CaseMismatch` (an AssertionError) naming what :meth:`mismatch` finds."""
        raise_on(self.mismatch(*args, **kw))


def with_plan(kw: dict, call_keys, make_plan, who: str) -> dict:
    """The op's own keywords of ``kw`` (those in ``call_keys``) with ``plan``: the one given, else
    ``make_plan(call, **knobs)`` of those keywords and every other one (the plan's knobs). Knobs
    beside a given plan raise TypeError naming ``who``."""
    call = {k: v for k, v in kw.items() if k in call_keys}
    knobs = {k: v for k, v in kw.items() if k not in call_keys}
    if call.get("plan") is None:
        call["plan"] = make_plan(call, **knobs)
    elif knobs:
        raise TypeError(f"{who}: plan knobs {sorted(knobs)} beside a plan")
    return call
