"""Triton launches that keep the compiled kernel: the host side of a layer call.

``kernel[grid](*args, **constexprs, **options)`` runs Triton's argument binder (its
specialisation of every argument) and builds its cache key at every call, although a layer's
call passes the same constexprs and options every time; that host work is larger than the
compiled kernel's own launch. A ``KernelLaunch`` holds one kernel with fixed constexprs and
options and keeps the compiled kernels ``kernel[grid]`` returned, keyed by a specialisation key
finer than Triton's own:

* a tensor: its dtype and whether its address is a multiple of 16 (Triton's two facts about a
  pointer argument);
* an integer: its value (Triton keeps whether it is 1, whether it divides by 16 and its width:
  all functions of the value);
* anything else: its type (Triton types a float as fp32 whatever its value).

Two calls with one key therefore get the same binary from Triton, so the kept binary is launched
directly, with the argument list Triton's own launch passes (every parameter in order, the
constexprs and defaults included). A key not seen yet goes through ``kernel[grid]``, which
compiles or finds the binary, and keeps what it returns.

Every launch goes through ``kernel[grid]`` instead when the form it reproduces may not hold:
the kernel is not a compiled Triton kernel (the Triton interpreter is active), Triton's
``JITFunction.run`` does not contain the launch this module repeats (read once from its source),
a launch hook is set (profilers read the ``launch_metadata`` that only Triton's path builds; an
empty hook chain, Triton's default, does nothing and is skipped), or the kernel has pre-run
hooks.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .. import _platform

# What Triton's JITFunction.run must contain for a kept binary to be launched as it would be:
# the binder's bound arguments (all parameters, in order) passed after the hooks.
_TRITON_LAUNCH_FORM = (
    "bound_args, specialization, options = binder(*args, **kwargs)",
    "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata,",
    "knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound_args.values())",
)
_form_ok: bool | None = None


def triton_launch_form_ok() -> bool:
    """Whether the installed Triton launches a compiled kernel in the form ``KernelLaunch``
    repeats (checked once, from ``JITFunction.run``'s source)."""
    global _form_ok
    if _form_ok is None:
        try:
            from triton.runtime.jit import JITFunction

            src = " ".join(inspect.getsource(JITFunction.run).split())
            _form_ok = all(" ".join(s.split()) in src for s in _TRITON_LAUNCH_FORM)
        except (ImportError, OSError, TypeError):
            _form_ok = False
    return _form_ok


def _is_jit_function(kernel) -> bool:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    return isinstance(kernel, JITFunction)


def _idle(hook) -> bool:
    """Whether a Triton launch hook knob does nothing: None, or a hook chain with no calls
    (Triton's default is an empty chain, which it still calls with the launch's metadata)."""
    return hook is None or (type(hook).__name__ == "HookChain" and not getattr(hook, "calls", True))


def specialization_key(args) -> tuple:
    """The key ``KernelLaunch`` keeps binaries under: finer than Triton's specialisation of the
    same runtime arguments (module docstring)."""
    key = []
    for a in args:
        t = type(a)
        if t is int:
            key.append(a)
        elif isinstance(a, torch.Tensor):
            key.append((a.dtype, (a.data_ptr() & 15) == 0))
        else:
            key.append(t)
    return tuple(key)


class KernelLaunch:
    """One Triton kernel with fixed constexprs and compile options, launched on runtime
    arguments: ``KernelLaunch(kernel, constexprs, options)(grid, args)`` is
    ``kernel[grid](*args, **constexprs, **options)``.

    ``args`` are the kernel's leading runtime parameters in order; every later parameter must be
    a constexpr given in ``constexprs`` or have a default. ``kept`` counts the binaries kept,
    ``direct`` the launches that skipped ``kernel[grid]``, and ``via_triton`` says why the last
    launch that kept nothing went through ``kernel[grid]``.
    """

    def __init__(self, kernel, constexprs: dict[str, Any], options: dict[str, Any]):
        self.kernel = kernel
        self.constexprs = dict(constexprs)
        self.options = dict(options)
        self._binaries: dict[tuple, tuple] = {}
        self._tail: tuple | None = None
        self._n_args = -1
        self.direct = 0
        # Why the last launch went through kernel[grid] instead of a kept binary ("" when it
        # kept one), for the tests and for a caller asking why.
        self.via_triton = ""
        # Only a Triton JITFunction has binaries to keep (under TRITON_INTERPRET, read when
        # rocm_mla is imported, kernels are interpreted functions; tests pass recorders).
        self._not_compiled = _platform.interpreter_active() or not _is_jit_function(kernel)

    @property
    def kept(self) -> int:
        """Binaries kept (one per specialisation key seen)."""
        return len(self._binaries)

    def _tail_for(self, n_args: int) -> tuple | None:
        """The parameters after the ``n_args`` runtime ones, as Triton's binder fills them
        (given constexprs, else defaults); None when that list cannot be made."""
        params = getattr(self.kernel, "params", None)
        if params is None or getattr(self.kernel, "pre_run_hooks", None):
            return None
        tail = []
        for p in params[n_args:]:
            if p.name in self.constexprs:
                tail.append(self.constexprs[p.name])
            elif p.has_default:
                tail.append(p.default)
            else:
                return None
        if any(p.is_constexpr for p in params[:n_args]) or not set(self.constexprs) <= {p.name for p in params}:
            return None
        return tuple(tail)

    def __call__(self, grid: tuple, args: list | tuple) -> None:
        if self._not_compiled or not triton_launch_form_ok():
            self.via_triton = "not a compiled Triton kernel" if self._not_compiled else "Triton's launch form"
            self.kernel[grid](*args, **self.constexprs, **self.options)
            return
        from triton import knobs
        from triton.runtime import driver

        if not (_idle(knobs.runtime.launch_enter_hook) and _idle(knobs.runtime.launch_exit_hook)):
            self.via_triton = "a launch hook"
            self.kernel[grid](*args, **self.constexprs, **self.options)
            return
        device = driver.active.get_current_device()
        key = (device, specialization_key(args))
        hit = self._binaries.get(key)
        if hit is None:
            compiled = self.kernel[grid](*args, **self.constexprs, **self.options)
            if self._n_args != len(args):
                self._tail, self._n_args = self._tail_for(len(args)), len(args)
            if self._tail is None:
                self.via_triton = "the kernel's parameters (pre-run hooks, or a parameter without a value)"
            elif not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
                self.via_triton = f"kernel[grid] returned {type(compiled).__name__}"
            else:
                self.via_triton = ""
                self._binaries[key] = (compiled.run, compiled.function, compiled.packed_metadata)
            return
        run, function, packed = hit
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        stream = driver.active.get_current_stream(device)
        run(grid[0], g1, g2, stream, function, packed, None, None, None, *args, *self._tail)
        self.direct += 1


_LAUNCHES: dict[tuple, KernelLaunch] = {}


def kernel_launch(kernel, constexprs: dict[str, Any], options: dict[str, Any]) -> KernelLaunch:
    """The process's ``KernelLaunch`` for (kernel, constexprs, options): one per distinct
    launch form, so plans made at every step share the binaries kept by earlier ones."""
    key = (kernel, tuple(sorted(constexprs.items())), tuple(sorted(options.items())))
    launch = _LAUNCHES.get(key)
    if launch is None:
        launch = _LAUNCHES[key] = KernelLaunch(kernel, constexprs, options)
    return launch


__all__ = ["KernelLaunch", "kernel_launch", "specialization_key", "triton_launch_form_ok"]
