#!/usr/bin/env bash
# Builds docker/Dockerfile's own layers on a stand-in base image, without a Docker daemon and without
# ROCm, then checks the image: the package imports, the plugin registers ROCM_MLA, the argument
# parser of `vllm serve` (make_arg_parser) takes --attention-backend ROCM_MLA, and serve.sh's
# start-up checks pass.
#
#   sudo bash docker/build_standin.sh            (root: buildah's vfs storage and chroot isolation)
#
# The stand-in base is what vllm/vllm-openai-rocm provides minus ROCm: Debian bookworm (debootstrap
# --variant=minbase), its Python 3.11, a CPU torch 2.13.0, triton 3.7.1 and vLLM 0.34.0's Python
# (.ci/install_vllm_cpu.sh: the wheel and its pinned dependencies). The Dockerfile is then built on it
# with REQUIRE_HIP_EXTENSION=0 (no hipcc there: the HIP extension is not built, the install says so
# and the Triton kernels serve every op), ISA_REPORT_FLAGS= (the compile reports' HIP rows need
# ROCm's clang: skipped; their Triton rows compile for gfx942 and gfx950) and LM_EVAL_VERSION=
# (no lm-eval). What it proves: the Dockerfile's steps, COPY set, install, doctor and checks work as
# written; not that the real ROCm base image builds (it was never pulled here).
#
# Tools: buildah and debootstrap (apt-get install buildah debootstrap). Wheels: downloaded by this
# machine's pip with its own configuration (torch from the CPU index of download.pytorch.org when
# that configuration has no CPU build), then installed offline in the containers. Cache: $STANDIN_CACHE (default /var/tmp/rocm-mla-standin) keeps the rootfs; the base
# image is kept in buildah's storage and reused unless STANDIN_REBUILD_BASE=1. Exit status 0 only
# when the image builds and every check passes.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CACHE=${STANDIN_CACHE:-/var/tmp/rocm-mla-standin}
BASE=localhost/rocm-mla-standin-base:vllm0.34
IMAGE=localhost/rocm-mla:standin
B=(buildah --storage-driver vfs)
log() { echo "[standin] $*" >&2; }
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { log "$tool is missing: apt-get install buildah debootstrap"; exit 2; }
done
[ "$(id -u)" = 0 ] || { log "run as root (buildah vfs storage, chroot isolation)"; exit 2; }

# Every wheel the base needs is downloaded here, with this machine's pip and its configuration
# (indexes, mirror, CA bundle); the containers install offline from that folder.
WHEELS=$CACHE/wheels
mounts=(-v "$REPO:/src:ro" -v "$WHEELS:/wheels:ro")
pipenv=(--env PIP_BREAK_SYSTEM_PACKAGES=1 --env PIP_DISABLE_PIP_VERSION_CHECK=1 --env PIP_NO_INDEX=1
        --env PIP_FIND_LINKS=/wheels)
download_wheels() {
  mkdir -p "$WHEELS"
  # torch and triton with their dependencies (the CPU index when this pip's own has no CPU torch);
  # vLLM and its pins without (as .ci/install_vllm_cpu.sh installs them).
  python3 -m pip download -q -d "$WHEELS" torch==2.13.0 triton==3.7.1 2>/dev/null ||
    python3 -m pip download -q -d "$WHEELS" --extra-index-url https://download.pytorch.org/whl/cpu \
      torch==2.13.0+cpu triton==3.7.1
  python3 -m pip download -q --no-deps -d "$WHEELS" vllm==0.34.0 "typing_extensions>=4.16" \
    -r .ci/vllm-cpu-requirements.txt
}

if [ "${STANDIN_REBUILD_BASE:-0}" = 1 ] || ! "${B[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  if [ ! -x "$CACHE/rootfs/usr/bin/python3" ]; then
    log "debootstrap bookworm (minbase + python3) into $CACHE/rootfs"
    mkdir -p "$CACHE"
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python3-setuptools,python3-wheel,ca-certificates \
      bookworm "$CACHE/rootfs" http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1 ||
      { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
  fi
  log "wheels for the base (torch 2.13.0 CPU, triton 3.7.1, vLLM 0.34.0 and its pins) into $WHEELS"
  download_wheels
  log "base image $BASE: the rootfs, CPU torch, triton, vLLM 0.34.0's Python"
  ctr=$("${B[@]}" from scratch)
  trap '"${B[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
  mnt=$("${B[@]}" mount "$ctr")
  cp -a "$CACHE/rootfs/." "$mnt/"
  "${B[@]}" umount "$ctr" >/dev/null
  "${B[@]}" run --isolation chroot "${mounts[@]}" "${pipenv[@]}" "$ctr" -- bash -euc "
    python3 -m pip install -q torch==2.13.0 triton==3.7.1
    CI=true VLLM_VERSION=0.34.0 bash /src/.ci/install_vllm_cpu.sh
    python3 -c 'import torch, triton, vllm; print(\"base:\", torch.__version__, triton.__version__, vllm.__version__)'"
  "${B[@]}" config --env PIP_BREAK_SYSTEM_PACKAGES=1 --workingdir /workspace "$ctr"
  "${B[@]}" commit -q "$ctr" "$BASE" >/dev/null
  "${B[@]}" rm "$ctr" >/dev/null
  trap - EXIT
fi

log "building docker/Dockerfile on $BASE"
"${B[@]}" bud --isolation chroot --format docker "${mounts[@]}" -f docker/Dockerfile \
  --build-arg BASE_IMAGE="$BASE" --build-arg REQUIRE_HIP_EXTENSION=0 --build-arg ISA_REPORT_FLAGS= \
  --build-arg LM_EVAL_VERSION= -t "$IMAGE" .

log "checks inside $IMAGE"
ctr=$("${B[@]}" from "$IMAGE")
trap '"${B[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
"${B[@]}" run --isolation chroot "$ctr" -- bash -euc '
  python3 -c "import rocm_mla; print(\"import: rocm_mla\", rocm_mla.__version__)"
  python3 -c "
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
assert E[\"ROCM_MLA\"].get_path() == \"rocm_mla.vllm.backend.RocmMLABackend\", E[\"ROCM_MLA\"].get_path()
print(\"plugin: ROCM_MLA ->\", E[\"ROCM_MLA\"].get_path(), \"; ROCM_MLA_SPARSE ->\", E[\"ROCM_MLA_SPARSE\"].get_path())
"
  python3 -c "
import sys
sys.path.insert(0, \"/opt/rocm-mla/src/tests\")  # no GPU in the build: vLLM sees a simulated gfx942 ROCm platform
from vllm_harness.layer_step import use_simulated_gfx942_platform
use_simulated_gfx942_platform()
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.plugins import load_general_plugins
from vllm.utils.argparse_utils import FlexibleArgumentParser
load_general_plugins()
a = make_arg_parser(FlexibleArgumentParser()).parse_args([\"--model\", \"deepseek-ai/DeepSeek-V3\", \"--attention-backend\", \"ROCM_MLA\"])
print(\"vllm serve arguments: --attention-backend ROCM_MLA parses to\", a.attention_backend)
"
  ROCM_MLA_SERVE_CHECK_ONLY=1 bash /opt/rocm-mla/src/docker/serve.sh
  ls /opt/rocm-mla/isa-report-gfx942.json /opt/rocm-mla/isa-report-gfx950.json
'
log "OK: $IMAGE built on the stand-in base and every check passed"
