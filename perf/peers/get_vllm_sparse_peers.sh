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
#         import rocm_v4        # DeepSeek-V4 attention (fp8_ds_mla window + compressed caches, sink):
#                               # rocm_sparse_attn_decode (split-K partials + reduce, fused inverse RoPE),
#                               # rocm_sparse_attn_prefill, rocm_inverse_rope_rows_,
#                               # build_ragged_indices_from_dense, _decode_num_splits (the split rule),
#                               # dequantize_and_gather_k_cache (the prefill's bf16 gather),
#                               # quantize_and_insert_k_cache (vLLM's fp8_ds_mla writer),
#                               # combine_topk_swa_indices (amd/rocm.py's own),
#                               # compute_global_topk_ragged_indices_and_indptr
# rocm_sparse.py holds the functions of vllm/v1/attention/ops/rocm_aiter_mla_sparse.py those entry
# points reach (found by walking the module's syntax tree from them), unchanged, behind a header that
# gives them torch/triton and the module constants they read; aiter's gates answer "not available",
# as on a ROCm machine without aiter (the path vLLM's ROCm Triton fallback then runs).
# rocm_indexer.py: the indexer functions of the same file, extracted the same way; its header stands
# in for vLLM's workspace manager (get_simultaneous: one persistent buffer per shape and dtype, as
# vLLM's locked workspace hands the same memory back every step) and current_platform
# (fp8_dtype() = the module's FP8_DTYPE, which a caller may set). The modules import torch and
# triton alone, never vllm.
# rocm_v4.py: the functions DeepSeek-V4's ROCm attention (vllm/models/deepseek_v4/amd/rocm.py) calls, from
# three files of the wheel (ops/rocm_aiter_mla_sparse.py, models/deepseek_v4/common/ops/cache_utils.py,
# amd/rocm.py), extracted the same way, each part under a line naming its file. Its header says gfx942
# (_ON_GFX942 = True, _ON_GFX950 = False), so the decode takes the split-K path an MI300 runs (its
# _decode_num_splits rule, reading the GPU's multiprocessor count) rather than the fallback for other
# chips; current_platform.is_fp8_fnuz() answers False: NVIDIA Triton has no e4m3fnuz, so both caches are
# read as OCP e4m3 (the compressed cache is OCP on every chip; the window cache, FNUZ on a real gfx942,
# must be written OCP for this peer). aiter's gates answer "not available"; vLLM's warmup machinery
# (VllmTritonJitKernel, kernel_launcher) is replaced by a launcher that binds the call's names to the
# kernel's parameters as vLLM's does (x -> x / x_ptr, strides named x_stride<d>) and launches at once;
# has_cutedsl() answers False (the Triton gather, vLLM's ROCm branch); the workspace manager is
# rocm_indexer.py's.
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
V4_HEADER = f"""# Extracted from vllm {ver} by perf/peers/get_vllm_sparse_peers.sh: a benchmark peer, never part of rocm-mla.
# From {{paths}}.
# Functions unchanged; the header stands in for the vLLM imports they use.
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
import triton
import triton.language as tl

# The chip DeepSeek-V4's ROCm path runs on an MI300: gfx942. _rocm_sparse_attn_decode_ragged_triton then takes
# its gfx942 split-K path (_sparse_attn_decode_partial_kernel + _sparse_attn_decode_reduce_kernel, the split
# count from _decode_num_splits), not the fallback for untuned chips.
_ON_GFX942 = True
_ON_GFX950 = False
_ON_GFX1151 = False
_ON_RDNA = False
# OCP e4m3: NVIDIA Triton (where this peer is timed) has no e4m3fnuz, so is_fp8_fnuz() answers False below.
FP8_DTYPE = torch.float8_e4m3fn


def get_cdna_version():  # CDNA3 = gfx942
    return 3


class _Platform:  # vllm.platforms.current_platform, the parts these functions ask
    @staticmethod
    def is_fp8_fnuz():
        # A real gfx942 answers True (its window cache is FNUZ). Here False: NVIDIA Triton cannot convert
        # e4m3fnuz, so the window cache is read (and must be written) as OCP e4m3, like the compressed one.
        return False

    @staticmethod
    def fp8_dtype():
        return FP8_DTYPE

    @staticmethod
    def is_rocm():
        return True

    @staticmethod
    def is_cuda():
        return False

    device_type = "cuda"


current_platform = _Platform()


def _can_use_aiter_sparse_prefill_opus(*args, **kwargs):  # aiter absent
    return False


def _can_use_aiter_pa_prefill_sparse(*args, **kwargs):  # aiter absent
    return False


def _get_aiter_sparse_prefill_opus():  # aiter absent
    return None


def has_cutedsl():  # no CuTeDSL on ROCm: dequantize_and_gather_k_cache takes its Triton kernel
    return False


def get_fp8_min_max():  # vllm...quant_utils: the platform's e4m3 range (FNUZ: +-224 as vLLM uses it)
    if current_platform.is_fp8_fnuz():
        return -224.0, 224.0
    info = torch.finfo(FP8_DTYPE)
    return info.min, info.max


class _Logger:  # vllm.logger: only reached behind the aiter gates above
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


logger = _Logger()


class _Workspace:  # vllm.v1.worker.workspace (rocm_indexer.py's): the same buffer for the same shape and dtype
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


def current_workspace_manager():  # none of these functions asks; _forward_prefill's workspace is the caller's
    return _WORKSPACE


# vLLM's JIT warmup machinery (vllm/model_executor/warmup): only the runtime launch is kept. A kernel owner's
# __call__ returns (grid, launch kwargs); kernel_launcher binds the call's own arguments to the kernel's
# parameters by name (x, x_ptr, X, X_PTR; launch kwargs win), fills x_stride<d> from a bound tensor x, and
# launches. The warmup methods (dispatch, get_warmup_keys, warmup_inputs) are never called here.
CompileKeyT = TypeVar("CompileKeyT")
LaunchSpec = tuple
DispatchSpec = tuple


class VllmJitKernel(Generic[CompileKeyT]):
    bind_launch_inputs = True


class VllmTritonJitKernel(VllmJitKernel[CompileKeyT]):
    kernel: Any

    def launch(self, launch_spec, inputs):
        grid, launch_kwargs = launch_spec[0], dict(launch_spec[1])
        arg_names = tuple(self.kernel.arg_names)
        for name, value in inputs.items():
            for target in (name, name + "_ptr", name.upper(), name.upper() + "_PTR"):
                if target in arg_names:
                    if target not in launch_kwargs:
                        launch_kwargs[target] = value
                    break
        for target in arg_names:
            if target in launch_kwargs:
                continue
            name, sep, dim = target.rpartition("_stride")
            dim = dim.removeprefix("_")
            if sep and (not dim or dim.isdigit()):
                source = name if name in launch_kwargs else name + "_ptr"
                if source in launch_kwargs:
                    launch_kwargs[target] = launch_kwargs[source].stride(int(dim or 0))
        if grid is not None:
            self.kernel[grid](**launch_kwargs)
        return launch_spec[2] if len(launch_spec) == 3 else None


def kernel_launcher(call_fn):
    signature = inspect.signature(call_fn)

    @functools.wraps(call_fn)
    def wrapper(self, *args, **kwargs):
        spec = call_fn(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return self.launch(spec, dict((k, v) for k, v in bound.arguments.items() if k != "self"))

    return wrapper


class TritonWarmupTensor:  # warmup inputs: never built here
    def __init__(self, *args, **kwargs):
        raise RuntimeError("warmup is not part of this peer")


TritonPointerInputVariant = WarmupIntRange = TritonWarmupTensor


def zip_inputs(*args, **kwargs):
    raise RuntimeError("warmup is not part of this peer")


def triton_scalar_specialization_rep(value):
    return value


def get_compress_ratios(*args, **kwargs):
    raise RuntimeError("warmup is not part of this peer")


"""
v4_stubs = {
    "_ON_GFX942", "_ON_GFX950", "_ON_GFX1151", "_ON_RDNA", "get_cdna_version", "FP8_DTYPE", "logger",
    "current_platform", "current_workspace_manager", "_can_use_aiter_sparse_prefill_opus",
    "_can_use_aiter_pa_prefill_sparse", "_get_aiter_sparse_prefill_opus", "has_cutedsl", "get_fp8_min_max",
}
v4_parts = [
    (ops + "rocm_aiter_mla_sparse.py",
     ["rocm_sparse_attn_decode", "rocm_sparse_attn_prefill", "rocm_inverse_rope_rows_",
      "build_ragged_indices_from_dense", "_decode_num_splits", "_decode_gfx950_num_splits", "_decode_cu_count"]),
    ("vllm/models/deepseek_v4/common/ops/cache_utils.py",
     ["dequantize_and_gather_k_cache", "quantize_and_insert_k_cache"]),
    ("vllm/models/deepseek_v4/amd/rocm.py",
     ["combine_topk_swa_indices", "compute_global_topk_ragged_indices_and_indptr"]),
]
bodies, seen = [], dict()
for path, roots in v4_parts:
    src = z.read(path).decode()
    body = closure(src, roots, v4_stubs)
    for node in ast.parse(body).body:  # one name, one definition across the three files
        names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [
            t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        for name in names:
            text = ast.dump(node)
            if seen.get(name, text) != text:
                raise SystemExit(f"rocm_v4.py: {name} defined differently in two of {[p for p, _ in v4_parts]}")
            seen[name] = text
    bodies.append(f"# ---------------------------------------------------------------- {path}\n\n\n" + body)
body = "\n\n".join(bodies)
imports = [line.strip() for line in body.splitlines() if line.lstrip().startswith(("import ", "from "))]
# the one vllm import of these functions: CuTeDSL's gather, behind has_cutedsl() (False here)
lazy = "from vllm.models.deepseek_v4.nvidia.ops.dequant_gather_k_cutedsl import ("
if any("vllm" in line and line != lazy for line in imports):
    raise SystemExit("rocm_v4.py: the extracted functions import vllm: " + str([x for x in imports if "vllm" in x]))
paths = ", ".join(p for p, _ in v4_parts)
open(f"{out}/rocm_v4.py", "w").write(V4_HEADER.format(paths=paths) + body)
open(f"{out}/VLLM_VERSION", "w").write(ver + "\n")
PY
python3 -c "import ast, sys; [ast.parse(open(f).read()) for f in sys.argv[1:]]" "$dest"/vllm_sparse/*.py
echo "vLLM $ver sparse MLA peers ready in $dest/vllm_sparse (rocm_sparse.py, xpu_sparse.py, rocm_indexer.py, rocm_convert.py, rocm_v4.py)"
