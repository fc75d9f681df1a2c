#!/usr/bin/env bash
# Install what `rocm-mla isa-report --arch gfx942` needs to compile the HIP kernels for MI300
# (gfx942) on a Debian/Ubuntu machine without an AMD GPU or ROCm:
#   clang-19, lld-19 (the AMDGPU backend and linker), llvm-19 (llvm-dis/llvm-as, llvm-cxxfilt),
#   libamdhip64-dev (HIP headers), rocm-device-libs (ocml/ockl bitcode).
#
# Idempotent: installs only the packages that are missing; a second run does nothing.
# Needs root (or sudo) for apt-get.
#
# Not done here, on purpose: Debian's device libraries stop at gfx940 and clang wants an
# oclc_isa_version_942.bc. The report builds that itself, lazily, on first use
# (rocm_mla/tools/isa_report/hip_compile.py: device_lib_dir): a folder of symlinks to the system bitcode
# plus a 942 copy of the 940 ISA-version file, cached under ~/.cache/rocm_mla/bitcode/
# ($ROCM_MLA_CACHE_DIR or $XDG_CACHE_HOME move it). Keeping it in Python means machines that got
# the packages some other way work too, and a package upgrade gets a fresh folder automatically.
#
# Triton rows need none of this (only the triton wheel).
set -euo pipefail

PKGS=(clang-19 lld-19 llvm-19 libamdhip64-dev rocm-device-libs)

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
  echo "gfx942 toolchain already installed (${PKGS[*]})"
fi

# Fail here, with a clear message, rather than later inside the report.
command -v clang++-19 >/dev/null || { echo "clang++-19 not on PATH after install" >&2; exit 1; }
command -v llvm-dis-19 >/dev/null || { echo "llvm-dis-19 not on PATH after install" >&2; exit 1; }
ls /usr/lib/*/amdgcn/bitcode/oclc_isa_version_940.bc >/dev/null 2>&1 \
  || { echo "rocm-device-libs installed but oclc_isa_version_940.bc not found" >&2; exit 1; }
clang++-19 --version | head -n1
