"""Compiling the HIP ISA translation units (``hip_src/isa/*.cu``) without a GPU.

gfx942: Debian's clang-19 (clang-22 where clang-19 is missing); gfx950: Debian's clang-22
(clang-19 rejects ``--offload-arch=gfx950``); both with a private device-library folder (see
``device_lib_dir``); sm90: nvcc to PTX, then ``ptxas -v``. Only runs the compilers and hands back
text; the ISA report parses it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ... import env
from ..files import write_text_atomic

INSTALL_HINT = "run .ci/install_amd_toolchain.sh"

# clang++ names that can target each AMD arch, first found on PATH wins ($ROCM_MLA_CLANG overrides).
CLANGS = {"gfx942": ("clang++-19", "clang++-22"), "gfx950": ("clang++-22",)}
# The ISA version constant of oclc_isa_version_<n>.bc (major, minor, stepping as decimal digits).
_ISA_VERSION = {"gfx942": 9402, "gfx950": 9500}

# Debian's HIP headers (5.2.3) predate clang 20: they read the __AMDGCN_WAVEFRONT_SIZE macro that
# clang 20 dropped (wave64 is the only width on CDNA) and, under clang's HIP wrapper, expect the
# wrapper to declare __llvm_amdgcn_rcp_f16/__llvm_amdgcn_rcp_2f16, which newer wrappers do not.
_NEW_CLANG_PRELUDE = """\
#define __AMDGCN_WAVEFRONT_SIZE 64
typedef _Float16 __rocm_mla_2f16 __attribute__((ext_vector_type(2)));
extern "C" __attribute__((device, const)) _Float16 __llvm_amdgcn_rcp_f16(_Float16) __asm("llvm.amdgcn.rcp.f16");
extern "C" __attribute__((device)) inline __rocm_mla_2f16 __llvm_amdgcn_rcp_2f16(__rocm_mla_2f16 x) {
  return __rocm_mla_2f16{__llvm_amdgcn_rcp_f16(x.x), __llvm_amdgcn_rcp_f16(x.y)};
}
"""

# Where distributions put the AMD device libraries (Debian/Ubuntu's rocm-device-libs, ROCm).
_DEVICE_LIB_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode",
    "/usr/lib/aarch64-linux-gnu/amdgcn/bitcode",
    "/usr/lib/amdgcn/bitcode",
    "/opt/rocm/amdgcn/bitcode",
)

_MARKER = re.compile(r"//\s*isa-report:\s*expects-mfma\s+(.+?)\s*$", re.MULTILINE)


def hip_src_dir() -> Path | None:
    """``hip_src/``: the installed copy inside the package, else the source checkout's."""
    pkg = Path(__file__).resolve().parents[2]  # .../rocm_mla
    for cand in (pkg / "hip_src", pkg.parent / "hip_src"):
        if (cand / "isa").is_dir():
            return cand
    return None


def isa_sources(hip_src: Path | None = None) -> list[Path]:
    """Every ISA translation unit, sorted (each instantiates what the launchers can choose)."""
    root = hip_src or hip_src_dir()
    return sorted((root / "isa").glob("*.cu")) if root else []


def mfma_markers(src: Path) -> list[str]:
    """Kernel-name substrings opted into the MFMA gate by ``// isa-report: expects-mfma SUBSTR``."""
    return _MARKER.findall(src.read_text(errors="replace"))


def cache_dir() -> Path:
    """Per-user cache for derived toolchain files ($ROCM_MLA_CACHE_DIR, else XDG)."""
    given = env.get("ROCM_MLA_CACHE_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rocm_mla"


def find_clang(arch: str = "gfx942") -> str | None:
    """clang++ able to target ``arch`` (gfx942, gfx950): $ROCM_MLA_CLANG, else ROCm's own
    (``$ROCM_PATH/llvm/bin/clang++``, /opt/rocm by default; for gfx950 from LLVM 19), else the first
    of ``CLANGS[arch]`` on PATH.

    Debian's hipcc is not used: it wraps clang-15, which rejects gfx942.
    """
    given = env.get("ROCM_MLA_CLANG")
    if given:
        return shutil.which(given) or (given if Path(given).exists() else None)
    rocm = rocm_clang()
    if rocm is not None and (arch != "gfx950" or clang_major(rocm) >= 19):  # gfx950 from LLVM 19 (ROCm 6.4)
        return rocm
    for name in CLANGS.get(arch, ()):
        found = shutil.which(name)
        if found:
            return found
    return None


@functools.cache
def clang_major(clang: str) -> int:
    """The major version of ``clang`` (``clang --version``), 0 when it does not say."""
    proc = subprocess.run([clang, "--version"], capture_output=True, text=True)
    m = re.search(r"clang version (\d+)", proc.stdout)
    return int(m.group(1)) if m else 0


def rocm_root() -> Path:
    """The ROCm installation: $ROCM_PATH, else /opt/rocm."""
    return Path(os.environ.get("ROCM_PATH") or "/opt/rocm")


def rocm_clang() -> str | None:
    """ROCm's own clang++ (``<ROCm>/llvm/bin/clang++``), which a ROCm image has, if present."""
    cand = rocm_root() / "llvm" / "bin" / "clang++"
    return str(cand) if cand.exists() else None


def find_nvcc() -> str | None:
    """nvcc for the sm90 path ($ROCM_MLA_NVCC, else PATH)."""
    return shutil.which(env.get("ROCM_MLA_NVCC") or "nvcc")


def _llvm_tool(clang: str, tool: str) -> str | None:
    """An LLVM tool of the same release as ``clang`` (clang++-19 -> llvm-dis-19)."""
    m = re.search(r"(-\d+)$", Path(clang).name)
    suffix = m.group(1) if m else ""
    here = Path(clang).resolve().parent
    for name in (tool + suffix, tool):
        for cand in (here / name, shutil.which(name)):
            if cand and Path(cand).exists():
                return str(cand)
    return None


def system_device_libs() -> Path | None:
    """The installed AMD device-library folder ($ROCM_MLA_DEVICE_LIBS overrides)."""
    given = env.get("ROCM_MLA_DEVICE_LIBS")
    rocm = rocm_root()
    cands = [given] if given else [str(rocm / "amdgcn" / "bitcode"), str(rocm / "lib" / "llvm" / "amdgcn" / "bitcode")]
    cands += [] if given else list(_DEVICE_LIB_CANDIDATES)
    for c in cands:
        if c and (Path(c) / "ocml.bc").exists():
            return Path(c)
    return None


def device_lib_dir(clang: str, arch: str = "gfx942") -> Path:
    """A device-library folder that has ``arch``'s ISA-version file; built lazily, then cached.

    Debian's rocm-device-libs stop at gfx940, and clang refuses to link a HIP kernel without
    ``oclc_isa_version_942.bc`` (``_950`` for gfx950). That file holds a single constant (the ISA
    version), so a copy of the 940 one with 9400 -> 9402 (9500) is exact. The folder is symlinks
    to the system files plus that copy, in the user cache. It is built here rather than by the
    install script so that a machine that got the packages some other way also works.
    """
    version = _ISA_VERSION[arch]
    isa_file = f"oclc_isa_version_{arch[3:]}.bc"
    sys_dir = system_device_libs()
    if sys_dir is None:
        raise FileNotFoundError(f"AMD device libraries (ocml.bc) not found; {INSTALL_HINT}")
    if (sys_dir / isa_file).exists():
        return sys_dir  # ROCm, or a newer distribution: nothing to patch
    src940 = sys_dir / "oclc_isa_version_940.bc"
    # Keyed on the system folder, the 940 file's mtime and the arch: a reinstall or upgrade gets
    # a fresh folder, and a finished folder is never modified or deleted (safe for concurrent runs).
    key = hashlib.sha1(f"{sys_dir.resolve()}:{src940.stat().st_mtime_ns}:{arch}".encode()).hexdigest()[:12]
    out = cache_dir() / "bitcode" / key
    if (out / isa_file).exists() and (out / "ocml.bc").exists():
        return out

    dis, asm = _llvm_tool(clang, "llvm-dis"), _llvm_tool(clang, "llvm-as")
    if not (dis and asm):
        raise FileNotFoundError(f"llvm-dis/llvm-as (the LLVM of {Path(clang).name}) not found; {INSTALL_HINT}")
    text = subprocess.run([dis, str(src940), "-o", "-"], capture_output=True, text=True, check=True).stdout
    patched, n = re.subn(r"\bi32 9400\b", f"i32 {version}", text)
    if n != 1:
        raise RuntimeError(f"{src940}: expected one 'i32 9400' constant to patch, found {n}")

    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename into place, so that a concurrent run never sees a
    # half-built folder.
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
    try:
        for f in sys_dir.iterdir():
            (tmp / f.name).symlink_to(f)
        subprocess.run(
            [asm, "-", "-o", str(tmp / isa_file)],
            input=patched,
            text=True,
            capture_output=True,
            check=True,
        )
        try:
            tmp.rename(out)
        except OSError:  # another process won the race; its folder is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def compile_amdgcn(src: Path, clang: str, arch: str = "gfx942") -> str:
    """AMDGCN assembly text of one translation unit for ``arch`` (gfx942, gfx950).

    ``-S`` alone is enough: the text carries the same per-kernel resource block that
    ``-Rpass-analysis=kernel-resource-usage`` prints (both come from the AMDGPU asm printer),
    plus the instructions for counting MFMA, so one compile serves both. With clang 20 or newer
    (clang-22: the one Debian clang that knows gfx950) Debian's old HIP headers need
    ``_NEW_CLANG_PRELUDE``, and code object v5: that clang defaults to v6, whose ABI file
    (``oclc_abi_version_600.bc``) Debian's device libraries lack; the kernels' code and resource
    figures do not depend on it. The text is kept in ``cache_dir()/amdgcn`` under
    ``_compile_key``.
    """
    libs = device_lib_dir(clang, arch)
    cached = cache_dir() / "amdgcn" / f"{_compile_key(src, clang, arch, libs)}.s"
    if cached.is_file():
        return cached.read_text()
    with tempfile.TemporaryDirectory(prefix="rocm_mla_hip_") as tmp:
        out = Path(tmp) / "k.s"
        extra: list[str] = []
        if clang_major(clang) >= 20:
            prelude = Path(tmp) / "prelude.h"
            prelude.write_text(_NEW_CLANG_PRELUDE)
            extra = ["-mcode-object-version=5", "-include", str(prelude)]
        cmd = [
            clang,
            "-x",
            "hip",
            f"--offload-arch={arch}",
            "--cuda-device-only",
            "--no-gpu-bundle-output",
            "-O3",
            "-std=c++17",
            "-S",
            str(src),
            "-o",
            str(out),
            f"--rocm-device-lib-path={libs}",
            *extra,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"clang failed on {src.name}:\n{proc.stderr.strip()[-3000:]}")
        text = out.read_text()
    _keep(cached, text)
    return text


@functools.cache
def _tool_version(tool: str) -> str:
    return subprocess.run([tool, "--version"], capture_output=True, text=True).stdout


def _compile_key(src: Path, clang: str, arch: str, libs: Path) -> str:
    """What one compile's text depends on: the compiler (its path and version), the arch, the
    device-library folder, the prelude, the translation unit and every file under hip_src/ (the
    headers it includes). The same key is the same text, so a report, the tests and the doctor
    in one CI run compile each translation unit once per arch."""
    h = hashlib.sha256()
    for part in (clang, _tool_version(clang), arch, str(libs), _NEW_CLANG_PRELUDE):
        h.update(part.encode() + b"\0")
    h.update(src.read_bytes())
    root = hip_src_dir()
    for f in sorted(root.rglob("*")) if root else []:
        if f.is_file():
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:24]


def _keep(path: Path, text: str) -> None:
    """Keep ``text`` at ``path`` for later compiles; a cache that cannot be written is no error."""
    try:
        write_text_atomic(path, text)
    except OSError:
        pass


def compile_sm90(src: Path, nvcc: str) -> tuple[str, str]:
    """(PTX text, ``ptxas -v`` log) of one translation unit for sm_90.

    PTX first (to count ``mma``/``wgmma``), then the ptxas of the same CUDA install: nvcc's PTX
    version may be newer than what Triton's bundled ptxas accepts.
    """
    from .triton_compile import run_ptxas

    ptxas = Path(nvcc).resolve().parent / "ptxas"
    ptxas_path = str(ptxas) if ptxas.exists() else shutil.which("ptxas")
    if ptxas_path is None:
        raise FileNotFoundError("ptxas not found next to nvcc or on PATH")
    with tempfile.TemporaryDirectory(prefix="rocm_mla_cu_") as tmp:
        out = Path(tmp) / "k.ptx"
        cmd = [nvcc, "-arch=sm_90", "-O3", "-std=c++17", "-x", "cu", "-ptx", str(src), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed on {src.name}:\n{proc.stderr.strip()[-3000:]}")
        ptx = out.read_text()
    return ptx, run_ptxas(ptx, ptxas_path)


def demangle(names: list[str]) -> dict[str, str]:
    """Itanium-demangled names (identity when no demangler is installed)."""
    names_ = ("llvm-cxxfilt-19", "llvm-cxxfilt-22", "llvm-cxxfilt", "c++filt")
    tool = next((t for t in map(shutil.which, names_) if t), None)
    if not tool or not names:
        return {n: n for n in names}
    proc = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) != len(names):
        return {n: n for n in names}
    return dict(zip(names, lines))


def short_name(demangled: str) -> tuple[str, str]:
    """``void rocm_mla::k<rocm_mla::bf16_t, 8, unsigned int>(...)`` -> ``("k", "<bf16_t, 8, unsigned int>")``.

    Drops the return type, the parameter list and the project namespace: the template
    arguments are what tell two instantiations apart.
    """
    s = demangled.replace("rocm_mla::", "")
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # the parameter list is the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    s = s[:cut]
    lt = s.find("<")
    head, targs = (s[:lt], s[lt:]) if lt >= 0 else (s, "")
    head = head.split()[-1] if head.split() else head  # drop "void"
    return head, targs or "-"
