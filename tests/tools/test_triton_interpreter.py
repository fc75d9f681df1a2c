"""An ahead-of-time compile works in a process that has run interpreted kernels.

Triton 3.6/3.7's interpreter leaves ``triton.language.core`` patched after an interpreted kernel
calls a ``@triton.jit`` helper (``tl.cdiv``, ``tl.max``, ...); the next AOT compile in that process
then failed, but only with a cold Triton cache. Each case runs in its own interpreter with its own
empty TRITON_CACHE_DIR, so neither the test order nor a warm cache can decide the outcome.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

# Runs an interpreted kernel that calls triton.language.standard helpers and a helper of its own,
# checks its result, then AOT-compiles a small kernel for gfx942. {install} chooses whether
# rocm_mla's fix is imported before the interpreted kernel runs.
_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    if {install}:
        import rocm_mla.kernels  # installs the scoped device-function call
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    from rocm_mla._triton_interpreter import leaked_patches  # a leaf module: installs nothing

    @triton.jit
    def _helper(x):
        return x * 2

    @triton.jit
    def _interp(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=float("-inf"))
        tl.store(out_ptr, _helper(tl.max(x, axis=0)) + tl.cdiv(n, BLOCK))

    x = torch.randn(50)
    out = torch.empty(1)
    _interp[(1,)](x, out, 50, BLOCK=64)
    assert torch.allclose(out, x.max() * 2 + 1), (out, x.max())
    print("leaked:", len(leaked_patches()))

    from rocm_mla.variants import TritonVariant  # imports the kernels: installs the fix, too late
    from rocm_mla.tools.isa_report import triton_compile as tc

    def _add(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)

    v = TritonVariant(kernel="add", config="fp32", fn=JITFunction(_add),
                      signature={{"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}},
                      constexprs={{"BLOCK": 256}}, options={{"num_warps": 4}})
    try:
        art = tc.compile_variant(v, "gfx942")
    except RuntimeError as e:
        print("compile error:", e)
        sys.exit(3)
    assert "global_store" in art.isa or "buffer_store" in art.isa, art.isa[:2000]
    print("compiled gfx942:", len(art.isa), "chars of AMDGCN")
""")


def _run(install: bool, tmp_path) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's rocm_mla
    env = dict(
        os.environ,
        TRITON_CACHE_DIR=str(tmp_path / "triton_cache"),
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    )
    script = tmp_path / "interp_then_aot.py"  # @triton.jit needs its source in a file
    script.write_text(_SCRIPT.format(install=install))
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)


def test_aot_compile_after_interpreted_helpers(tmp_path):
    p = _run(True, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "leaked: 0" in p.stdout, p.stdout
    assert "compiled gfx942" in p.stdout, p.stdout


def test_leak_is_named_when_the_fix_came_too_late(tmp_path):
    # Without the fix in place before the interpreted kernel, this Triton leaves the language
    # patched; the compile must then stop with a message that names the cause, not an
    # AttributeError from deep inside code generation.
    from triton.runtime.interpreter import InterpretedFunction

    from rocm_mla._triton_interpreter import _leaky

    if not _leaky(InterpretedFunction.__call__) and not getattr(
        InterpretedFunction.__call__, "_rocm_mla_scoped_patch", False
    ):
        pytest.skip("this Triton restores the language after device-function calls itself")
    p = _run(False, tmp_path)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "leaked: 0" not in p.stdout, p.stdout
    assert "still patched by Triton's CPU interpreter" in p.stdout, p.stdout
