"""Ahead-of-time compilation of one Triton variant, without a GPU or driver.

Only runs the compiler and hands back its text outputs; what those outputs mean (registers,
spills, MFMA count) is parsed in ``amdgcn`` (gfx942, gfx950) and ``sm90`` of this package, one parser per target
shared between Triton and HIP.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# report architecture name -> (triton backend, arch, warp size) for GPUTarget.
TARGETS = {"gfx942": ("hip", "gfx942", 64), "gfx950": ("hip", "gfx950", 64), "sm90": ("cuda", 90, 32)}


@dataclass
class TritonArtifacts:
    """What one Triton compile produced (text only; the ISA report parses it)."""

    isa: str  # AMDGCN text (hip) or PTX text (cuda)
    shared: int  # LDS / shared bytes Triton allocates dynamically (metadata.shared)
    num_warps: int
    ptxas_log: str = ""  # sm90 only: ``ptxas -v`` output for the PTX
    sass: str = ""  # sm90 only: ``nvdisasm -c`` of the cubin ("" when nvdisasm is not found)


def build_attrs(fn: Any, divisible_by_16: tuple[str, ...]) -> dict[tuple[int, ...], list[list[Any]]]:
    """``ASTSource.attrs`` for the given argument names.

    triton 3.7.1 keys attributes by the argument's path: ``(index in fn.arg_names,)``, with
    constexpr arguments counted (``ast_to_ttir`` walks every argument).
    """
    attrs = {}
    for name in divisible_by_16:
        if name not in fn.arg_names:
            raise ValueError(f"divisible_by_16 names {name!r}, which is not an argument of {fn.__name__}")
        attrs[(fn.arg_names.index(name),)] = [["tt.divisibility", 16]]
    return attrs


def full_signature(fn: Any, signature: dict[str, str], constexprs: dict[str, Any]) -> dict[str, str]:
    """The signature with every argument typed, in argument order.

    triton 3.7.1 wants constexpr arguments in the signature too (as ``"constexpr"``); variants
    may leave them out, so add them here. An argument with neither a type nor a constexpr value
    would crash deep inside the code generator, so say which one it is instead.
    """
    out = {}
    for name in fn.arg_names:
        if name in signature:
            out[name] = signature[name]
        elif name in constexprs:
            out[name] = "constexpr"
        else:
            raise ValueError(f"argument {name!r} of {fn.__name__} has no type in the signature and no constexpr value")
    extra = set(signature) - set(fn.arg_names)
    if extra:
        raise ValueError(f"signature names {sorted(extra)}, not arguments of {fn.__name__}")
    return out


def find_ptxas() -> str | None:
    """The ptxas that matches Triton's PTX version: Triton's own, else one on PATH."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        path = get_ptxas(90).path
        if path and Path(path).exists():
            return path
    except Exception:  # an older/newer triton layout: fall back to PATH
        pass
    return shutil.which("ptxas")


def run_ptxas(ptx: str, ptxas: str) -> str:
    """``ptxas -v`` on PTX text; returns its resource log (registers, spills, smem per entry).

    The GPU name comes from the PTX's ``.target`` line (Triton emits ``sm_90a`` for wgmma).
    """
    return run_ptxas_sass(ptx, ptxas, sass=False)[0]


def run_ptxas_sass(ptx: str, ptxas: str, sass: bool = True) -> tuple[str, str]:
    """``(ptxas -v log, SASS)``: the log as :func:`run_ptxas`; with ``sass``, the cubin disassembled
    by the ``nvdisasm`` next to ``ptxas`` (or on PATH), "" when there is none."""
    m = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.MULTILINE)
    gpu = m.group(1) if m else "sm_90a"
    text = ""
    with tempfile.TemporaryDirectory(prefix="rocm_mla_ptx_") as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        proc = subprocess.run(
            [ptxas, "-v", "--gpu-name", gpu, str(src), "-o", str(cubin)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas failed:\n{proc.stderr.strip()[-2000:]}")
        if sass:
            nvd = Path(ptxas).resolve().parent / "nvdisasm"
            nvdisasm = str(nvd) if nvd.exists() else shutil.which("nvdisasm")
            if nvdisasm:
                dis = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True)
                text = dis.stdout if dis.returncode == 0 else ""
    return proc.stdout + proc.stderr, text


def as_jit(fn: Any) -> Any:
    """A ``JITFunction`` for ``fn``.

    Under ``TRITON_INTERPRET=1`` (the CPU test set-up) ``@triton.jit`` makes an
    ``InterpretedFunction``, which ``triton.compile`` cannot take. Re-wrapping the Python
    function works for a self-contained kernel; one that calls other ``@triton.jit`` helpers
    still fails (they are interpreted too), and ``compile_variant`` says why.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if isinstance(fn, InterpretedFunction):
        return JITFunction(fn.fn, **fn.kwargs)
    return fn


def compile_variant(variant: Any, arch: str) -> TritonArtifacts:
    """Compile one ``TritonVariant`` for ``arch`` (a key of ``TARGETS``) ahead of time.

    Uses ``triton.compile`` directly: ``python -m triton.tools.compile`` needs a live driver.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    from ..._triton_interpreter import install, leaked_patches

    install()
    leaked = leaked_patches()
    if leaked:
        # The compiler would call these interpreter stand-ins with IR values and fail deep inside
        # code generation; say what happened instead.
        raise RuntimeError(
            f"triton.language is still patched by Triton's CPU interpreter ({len(leaked)} "
            f"names, e.g. {', '.join(leaked[:3])}): an interpreted kernel ran in this process "
            "before rocm_mla's interpreter fix was installed (rocm_mla._triton_interpreter)"
        )
    backend, target_arch, warp = TARGETS[arch]
    fn = as_jit(variant.fn)
    src = triton.compiler.ASTSource(
        fn=fn,
        signature=full_signature(fn, dict(variant.signature), dict(variant.constexprs)),
        constexprs=dict(variant.constexprs),
        attrs=build_attrs(fn, tuple(variant.divisible_by_16)),
    )
    try:
        k = triton.compile(src, target=GPUTarget(backend, target_arch, warp), options=dict(variant.options))
    except RuntimeError as e:
        if "InterpretedFunction" in str(e):
            raise RuntimeError(
                f"{e}\nTRITON_INTERPRET=1 was set when the kernels were imported; run the "
                "report in a process without it (rocm-mla isa-report does)"
            ) from e
        raise
    num_warps = int(getattr(k.metadata, "num_warps", variant.options.get("num_warps", 4)))
    shared = int(getattr(k.metadata, "shared", 0) or 0)
    if backend == "hip":
        return TritonArtifacts(isa=k.asm["amdgcn"], shared=shared, num_warps=num_warps)
    ptxas = find_ptxas()
    if ptxas is None:
        raise FileNotFoundError("ptxas not found (neither Triton's bundled one nor on PATH)")
    ptx = k.asm["ptx"]
    log, sass = run_ptxas_sass(ptx, ptxas)
    return TritonArtifacts(isa=ptx, shared=shared, num_warps=num_warps, ptxas_log=log, sass=sass)
