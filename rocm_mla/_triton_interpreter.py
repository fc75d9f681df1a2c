"""Keep Triton's CPU interpreter (``TRITON_INTERPRET=1``) from breaking later compiles in the process.

The interpreter runs a kernel by swapping the builtins of ``triton.language`` (``tl.arange``,
``tl.core.store``, ``tensor.__add__``, ...) for numpy-backed versions, and swapping them back when
the kernel returns. In triton 3.6/3.7 that swap-back covers only the launched kernel: a
``@triton.jit`` function *called from* an interpreted kernel (``tl.cdiv``, ``tl.max``, ``tl.sum``
of ``triton.language.standard``, or a helper of ours) is entered through
``InterpretedFunction.__call__``, which patches the modules its globals name and never restores
them. ``triton.language.standard`` names ``core``, so after the first such call every builtin of
``triton.language.core`` stays an interpreter lambda for the life of the process. An
ahead-of-time ``triton.compile`` (``rocm-mla isa-report``) in the same process then feeds IR values
to those lambdas and fails with ``AttributeError: 'ir.value' object has no attribute 'dtype'``.
A warm Triton cache hides it (the compile is skipped), which is how CI stayed green for a while.

``install()`` gives the device-function call the same scoped patch the kernel launch has: the
patches it makes are undone when it returns (innermost first, so an enclosing kernel's own
patches stay until that kernel ends). It also makes the patch happen once a kernel launch rather
than once a device-function call (``_patch_each_language_once``). It replaces the method only when
the installed Triton has the leaking form (checked on its source), so a fixed Triton is left alone. ``leaked_patches()``
lists builtins that are still patched, for a clear error before an AOT compile.
"""

from __future__ import annotations

import functools
import inspect

_MARK = "_rocm_mla_scoped_patch"


def _leaky(call) -> bool:
    """True when ``InterpretedFunction.__call__`` patches the language without restoring it."""
    try:
        src = inspect.getsource(call)
    except (OSError, TypeError):
        return False
    return "_patch_lang(self.fn)" in src and "restore" not in src


def install() -> bool:
    """Make interpreted device-function calls restore ``triton.language`` on return.

    Idempotent; returns True when the scoped call is in place (installed now or before), False
    when this Triton needs no fix or has an interpreter layout this module does not know.
    """
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    cls = getattr(interp, "InterpretedFunction", None)
    call = getattr(cls, "__call__", None)  # noqa: B004 - the method itself (its source is inspected)
    if call is None:
        return False
    if getattr(call, _MARK, False):
        return True
    needed = ("_patch_lang", "InterpreterError")
    if not all(hasattr(interp, n) for n in needed) or not hasattr(cls, "rewrite") or not _leaky(call):
        return False

    def __call__(self, *args, **kwargs):
        # A device function call, as upstream's, with the patch scope restored on the way out.
        scope = interp._patch_lang(self.fn)
        try:
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                raise interp.InterpreterError(repr(e)) from e
        finally:
            restore = getattr(scope, "restore", None)
            if restore is not None:
                restore()

    setattr(__call__, _MARK, True)
    __call__.__doc__ = call.__doc__
    cls.__call__ = __call__
    _patch_each_language_once(interp)
    _remember_np_dtypes(interp)
    return True


def _remember_np_dtypes(interp) -> None:
    """Make ``_get_np_dtype`` look its answer up instead of rebuilding its table of 17 numpy dtypes
    on every call (it runs for nearly every interpreted operation; docs/notes/gfx942-without-a-gpu.md).
    Same answers: each type's is the upstream function's, computed once."""
    original = getattr(interp, "_get_np_dtype", None)
    if original is None or getattr(original, _MARK, False):
        return
    known: dict = {}

    def _get_np_dtype(tt_dtype):
        try:
            return known[tt_dtype]
        except KeyError:
            res = known[tt_dtype] = original(tt_dtype)
            return res
        except TypeError:  # an unhashable type: no memory
            return original(tt_dtype)

    setattr(_get_np_dtype, _MARK, True)
    interp._get_np_dtype = _get_np_dtype


def _patch_each_language_once(interp) -> None:
    """Make ``_patch_lang`` patch only what is not patched yet.

    Upstream patches every builtin of the modules a function's globals name on every call of every
    ``@triton.jit`` function, through ``inspect.getmembers`` of each module, which dominates kernels
    that call helpers per tile (docs/notes/gfx942-without-a-gpu.md). Here a kernel launch patches both
    ``triton.language`` and ``triton.language.core`` (the two a kernel or a helper can name), and a
    device-function call finds them patched and patches nothing; each scope still restores exactly
    what it patched, innermost first. Left as it is when ``_patch_lang`` does not have the form
    this relies on (it reads ``fn.__globals__`` and patches the modules named there).
    """
    import types

    import triton.language as tl

    original = getattr(interp, "_patch_lang", None)
    if original is None or getattr(original, _MARK, False) or not hasattr(interp, "_LangPatchScope"):
        return
    try:
        src = inspect.getsource(original)
    except (OSError, TypeError):
        return
    if "fn.__globals__" not in src or "_patch_builtin" not in src:
        return

    def patched(lang) -> bool:
        f = vars(lang).get("arange")
        return inspect.isfunction(f) and f.__module__ == interp.__name__

    def _patch_lang(fn):
        todo = {name: lang for name, lang in (("tl", tl), ("core", tl.core)) if not patched(lang)}
        if not todo:
            return interp._LangPatchScope()
        return original(types.SimpleNamespace(__globals__=todo))

    setattr(_patch_lang, _MARK, True)
    interp._patch_lang = _patch_lang


def leaked_patches() -> list[str]:
    """Names in ``triton.language`` (and ``.core``, ``.math``, ``tensor``) that currently hold a
    function of Triton's interpreter: [] when no interpreted kernel is running and none leaked."""
    import triton.language as tl

    found = []
    for owner, label in (
        (tl, "triton.language"),
        (tl.core, "triton.language.core"),
        (tl.math, "triton.language.math"),
        (tl.tensor, "triton.language.tensor"),
    ):
        for name, value in vars(owner).items():
            if isinstance(value, functools.partial):
                value = value.func
            # Functions only: the @triton.jit objects of triton.language.standard are
            # InterpretedFunction instances under TRITON_INTERPRET=1, which is how they are meant to be.
            if inspect.isfunction(value) and value.__module__ == "triton.runtime.interpreter":
                found.append(f"{label}.{name}")
    return sorted(found)
