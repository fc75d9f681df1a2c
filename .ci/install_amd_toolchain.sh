#!/usr/bin/env bash
# Install what `rocm-mla isa-report --arch gfx942` and `--arch gfx950` need to compile the HIP
# kernels for MI300 (gfx942) and MI350/MI355 (gfx950) on a Debian/Ubuntu machine without an AMD
# GPU or ROCm:
#   clang-19, lld-19, llvm-19 (gfx942: the AMDGPU backend, linker, llvm-dis/llvm-as, llvm-cxxfilt),
#   clang-22, lld-22, llvm-22 (gfx950: clang-19 rejects --offload-arch=gfx950; Debian 12 ships
#   clang-22 in bookworm-security),
#   libamdhip64-dev (HIP headers), rocm-device-libs (ocml/ockl bitcode).
#
# Idempotent: installs only the packages that are missing; a second run does nothing.
# Needs root (or sudo) for apt-get.
#
# Not done here, on purpose: Debian's device libraries stop at gfx940 and clang wants an
# oclc_isa_version_942.bc (950.bc for gfx950). The report builds that itself, lazily, on first use
# (rocm_mla/tools/isa_report/hip_compile.py: device_lib_dir): a folder of symlinks to the system
# bitcode plus a copy of the 940 ISA-version file with the arch's version, cached under
# ~/.cache/rocm_mla/bitcode/ ($ROCM_MLA_CACHE_DIR or $XDG_CACHE_HOME move it). Keeping it in Python
# means machines that got the packages some other way work too, and a package upgrade gets a fresh
# folder automatically. The same file says what clang-22 needs besides (hip_compile.compile_amdgcn).
#
# Triton rows need none of this (only the triton wheel).
set -euo pipefail

PKGS=(clang-19 lld-19 llvm-19 clang-22 lld-22 llvm-22 libamdhip64-dev rocm-device-libs)

missing=()
for p in "${PKGS[@]}"; do
  # dpkg-query prints "install ok installed" only for a fully installed package.
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "AMD toolchain already installed (${PKGS[*]})"
fi

# Fail here, with a clear message, rather than later inside the report.
for tool in clang++-19 llvm-dis-19 clang++-22 llvm-dis-22; do
  command -v "$tool" >/dev/null || { echo "$tool not on PATH after install" >&2; exit 1; }
done
ls /usr/lib/*/amdgcn/bitcode/oclc_isa_version_940.bc >/dev/null 2>&1 \
  || { echo "rocm-device-libs installed but oclc_isa_version_940.bc not found" >&2; exit 1; }
clang++-19 --version | head -n1
clang++-22 --version | head -n1
