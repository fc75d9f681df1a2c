#!/usr/bin/env bash
# Makes vLLM 0.34's Triton kernels of sparse MLA (DeepSeek-V3.2 / GLM-5) importable WITHOUT vLLM, for
# side-by-side benchmarks:
#   perf/peers/get_vllm_sparse_peers.sh .peers         (run on this machine; downloads the vllm wheel from PyPI)
#   then: sys.path.insert(0, ".peers/vllm_sparse")
#         import rocm_sparse    # rocm_sparse_attn_prefill, rocm_sparse_attn_decode_bf16,
#                               # rocm_sparse_decode_bf16_num_splits, build_ragged_indices_from_dense
#         import xpu_sparse     # triton_bf16_mla_sparse_interface (vLLM's portable Triton kernel)
#         import rocm_convert   # triton_convert_req_index_to_global_index (positions -> cache slots,
#                               # the ROCm sparse backend's step before the attention)
#         import rocm_indexer   # the lightning indexer: rocm_fp8_paged_mqa_logits_triton (decode
#                               # logits), cp_gather_indexer_k_quant_cache_triton + fp8_mqa_logits_torch
#                               # (prefill logits, vLLM's ROCm path without aiter),
#                               # indexer_k_quant_and_cache_triton (the key-cache insert),
#                               # _unshuffle_indexer_k_values, indexer_k_cache_is_shuffled
# rocm_sparse.py holds the functions of vllm/v1/attention/ops/rocm_aiter_mla_sparse.py those entry
# points reach (found by walking the module's syntax tree from them), unchanged, behind a header that
# gives them torch/triton and the module constants they read; aiter's gates answer "not available",
# as on a ROCm machine without aiter (the path vLLM's ROCm Triton fallback then runs).
# rocm_indexer.py: the indexer functions of the same file, extracted the same way; its header stands
# in for vLLM's workspace manager (get_simultaneous: one persistent buffer per shape and dtype, as
# vLLM's locked workspace hands the same memory back every step) and current_platform
# (fp8_dtype() = the module's FP8_DTYPE, which a caller may set). The modules import torch and
# triton alone, never vllm.
# Third-party code: the folder stays ignored (.gitignore: .peers/), never committed. A GPU machine
# without network access: make the folder here and carry it there.
set -eu
dest=${1:?usage: get_vllm_sparse_peers.sh DEST_DIR}
ver=${VLLM_SPARSE_PEER_VERSION:-0.34.0}
cache=${TMPDIR:-/tmp}/vllm-wheel-$ver
mkdir -p "$cache" "$dest/vllm_sparse"
whl=$(find "$cache" -maxdepth 1 -name "vllm-$ver-*.whl" | head -n 1)
if [ -z "$whl" ]; then
  python3 -m pip download -q --no-deps --only-binary :all: --platform manylinux_2_28_x86_64 --python-version 3.12 \
    -d "$cache" "vllm==$ver"
  whl=$(find "$cache" -maxdepth 1 -name "vllm-$ver-*.whl" | head -n 1)
fi
python3 - "$whl" "$dest/vllm_sparse" "$ver" <<'PY'
import ast
import sys
import zipfile

whl, out, ver = sys.argv[1:4]
ops = "vllm/v1/attention/ops/"
z = zipfile.ZipFile(whl)


def closure(src: str, roots: list[str], stubs: set[str]) -> str:
    """The top-level statements of ``src`` that define ``roots`` and every top-level name they
    reach (through names and decorators), in source order; ``stubs`` are left out."""
    tree = ast.parse(src)
    defs = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            for t in node.targets:
                defs[t.id] = node
    keep, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in keep or name in stubs or name not in defs:
            continue
        keep.add(name)
        todo += [n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)]
    nodes = sorted({id(defs[n]): defs[n] for n in keep}.values(), key=lambda n: n.lineno)
    lines = src.splitlines()
    parts = []
    for n in nodes:
        start = min([d.lineno for d in getattr(n, "decorator_list", [])] + [n.lineno])
        parts.append("\n".join(lines[start - 1 : n.end_lineno]))
    return "\n\n\n".join(parts) + "\n"


HEADER = f'''# Extracted from vllm {ver} ({{path}}) by perf/peers/get_vllm_sparse_peers.sh: a benchmark peer,
# never part of rocm-mla. Functions unchanged; the header stands in for the vLLM imports they use.
import functools
import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LOGE2 = 0.6931471805599453
_ON_GFX942 = _ON_GFX950 = False
FP8_DTYPE = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn


def _can_use_aiter_sparse_prefill_opus(*args, **kwargs):  # aiter absent
    return False


def _can_use_aiter_pa_prefill_sparse(*args, **kwargs):  # aiter absent
    return False


def _get_aiter_sparse_prefill_opus():  # aiter absent
    return None


'''
stubs = {"_can_use_aiter_sparse_prefill_opus", "_can_use_aiter_pa_prefill_sparse", "_get_aiter_sparse_prefill_opus",
         "_ON_GFX942", "_ON_GFX950", "FP8_DTYPE", "logger"}
path = ops + "rocm_aiter_mla_sparse.py"
src = z.read(path).decode()
roots = ["rocm_sparse_attn_prefill", "rocm_sparse_attn_decode_bf16", "rocm_sparse_decode_bf16_num_splits",
         "build_ragged_indices_from_dense"]
open(f"{out}/rocm_sparse.py", "w").write(HEADER.format(path=path) + closure(src, roots, stubs))
path = ops + "xpu_mla_sparse.py"
src = z.read(path).decode()
head = HEADER.format(path=path).split("_ON_GFX942")[0]
open(f"{out}/xpu_sparse.py", "w").write(head + closure(src, ["triton_bf16_mla_sparse_interface"], set()))
path = "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py"
src = z.read(path).decode()
head = HEADER.format(path=path).split("_ON_GFX942")[0]
open(f"{out}/rocm_convert.py", "w").write(head + closure(src, ["triton_convert_req_index_to_global_index"], set()))
INDEXER_HEADER = f'''# Extracted from vllm {ver} ({{path}}) by perf/peers/get_vllm_sparse_peers.sh: a benchmark peer,
# never part of rocm-mla. Functions unchanged; the header stands in for the vLLM imports they use.
import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

_ON_GFX942 = _ON_GFX950 = False
FP8_DTYPE = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn


class _Platform:  # vllm.platforms.current_platform, the parts these functions ask
    @staticmethod
    def fp8_dtype():
        return FP8_DTYPE

    @staticmethod
    def is_rocm():
        return torch.version.hip is not None


current_platform = _Platform()


class _Workspace:  # vllm.v1.worker.workspace: the same buffer for the same shape and dtype
    def __init__(self):
        self.buffers = dict()

    def get_simultaneous(self, *specs):
        dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        out = []
        for shape, dtype in specs:
            key = (tuple(shape), dtype, dev)
            if key not in self.buffers:
                self.buffers[key] = torch.empty(shape, dtype=dtype, device=dev)
            out.append(self.buffers[key])
        return tuple(out)


_WORKSPACE = _Workspace()


def current_workspace_manager():
    return _WORKSPACE


'''
path = ops + "rocm_aiter_mla_sparse.py"
src = z.read(path).decode()
roots = ["rocm_fp8_paged_mqa_logits_triton", "cp_gather_indexer_k_quant_cache_triton", "fp8_mqa_logits_torch",
         "indexer_k_quant_and_cache_triton", "_unshuffle_indexer_k_values", "indexer_k_cache_is_shuffled"]
stubs = {"_ON_GFX942", "_ON_GFX950", "FP8_DTYPE", "logger", "current_platform", "current_workspace_manager"}
body = closure(src, roots, stubs)
if "vllm" in "\n".join(line for line in body.splitlines() if line.lstrip().startswith(("import", "from"))):
    raise SystemExit("rocm_indexer.py: the extracted functions import vllm")
open(f"{out}/rocm_indexer.py", "w").write(INDEXER_HEADER.format(path=path) + body)
open(f"{out}/VLLM_VERSION", "w").write(ver + "\n")
PY
python3 -c "import ast, sys; [ast.parse(open(f).read()) for f in sys.argv[1:]]" "$dest"/vllm_sparse/*.py
echo "vLLM $ver sparse MLA peers ready in $dest/vllm_sparse (rocm_sparse.py, xpu_sparse.py, rocm_indexer.py, rocm_convert.py)"
