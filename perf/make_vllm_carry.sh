#!/usr/bin/env bash
# Builds the .vllm_carry folder that perf/vllm_on_device.sh unpacks on the GPU machine (which has no
# network), from PyPI, as perf/vllm_on_device_manifest.txt lists it:
#   bash perf/make_vllm_carry.sh [DEST]          (default .vllm_carry; git-ignored; ~30 MB)
# vllm-<V>-py.tar.xz for V = 0.34.0 and 0.33.0 (the releases the backend supports): each vllm wheel
# minus compiled objects (*.so), vllm/vllm-rs and the C/C++/CUDA sources under third_party; whl/ and
# whl_override/: cp312 manylinux wheels of the manifest's pins (shared by both releases).
# Third-party code: never commit the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.vllm_carry}
manifest=perf/vllm_on_device_manifest.txt
work=${TMPDIR:-/tmp}/vllm-carry-build
mkdir -p "$work" "$dest/whl" "$dest/whl_override"
grep -qxF '/.vllm_carry/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.vllm_carry/' >> .git/info/exclude; }
dl() {  # dl DIR SPEC...: cp312 manylinux wheels, no dependencies
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$1" "${@:2}"
}
specs() {  # specs SECTION: name==version of each wheel listed under that manifest heading
  awk -v sec="$1" '$0 ~ "^"sec"/" {on=1; next} /^[^ ]/ {on=0} on && NF {print $1}' "$manifest" |
    sed -E 's/^([A-Za-z0-9_.]+)-([^-]+)-.*/\1==\2/'
}
mapfile -t whl < <(specs whl)
mapfile -t over < <(specs whl_override)
dl "$dest/whl" "${whl[@]}"
dl "$dest/whl_override" "${over[@]}"
for v in 0.34.0 0.33.0; do
  [ -f "$dest/vllm-$v-py.tar.xz" ] && continue
  dl "$work" "vllm==$v"
  rm -rf "$work/tree" && mkdir -p "$work/tree"
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$work"/vllm-"$v"-*.whl "$work/tree"
  find "$work/tree" -name '*.so' -delete
  rm -rf "$work/tree/vllm/vllm-rs"
  find "$work/tree/vllm/third_party" -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cuh' -o -name '*.cu' \
    -o -name '*.c' -o -name '*.cc' -o -name '*.cpp' \) -delete 2>/dev/null || true
  tar -cJf "$dest/vllm-$v-py.tar.xz" -C "$work/tree" vllm "vllm-$v.dist-info"
done
du -sh "$dest" "$dest"/* | sed 's/^/  /'
