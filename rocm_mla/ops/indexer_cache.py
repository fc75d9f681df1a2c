"""indexer_k_cache_write: the lightning indexer's key-cache write (sparse MLA: DeepSeek-V3.2, GLM-5.x).

Each token's indexer key ``k [128]`` is quantised to fp8 E4M3 with one float32 scale and stored at
its slot of the indexer cache, in exactly the layout vLLM 0.34's ROCm model path writes
(``fused_norm_rope`` in models/deepseek_v32/common/kernels.py, ``indexer_k_quant_and_cache_triton``
in v1/attention/ops/rocm_aiter_mla_sparse.py), so a cache either one filled reads the same
(docs/indexer.md). vLLM's equivalent is ``ops.indexer_k_quant_and_cache`` / its Triton insert.

Kernel: rocm_mla/kernels/indexer_cache.py (Triton; no HIP kernel). Reference and the layout's
definition: rocm_mla/reference/indexer.py. Launch data: configs/indexer_k_cache_write.json.
Backend switch: ``ROCM_MLA_BACKEND_INDEXER_K_CACHE_WRITE``.
"""

from __future__ import annotations

import torch
import triton

from .. import _platform
from ..configs import config_for, wave_size
from ..kernels.indexer_cache import indexer_k_cache_write_kernel
from ..mla_dims import FP8_KV_CACHE_DTYPES
from ..reference.indexer import (
    INDEX_HEAD_DIM,
    INDEX_ROW_BYTES,
    INDEXER_FP8_MAX,
    SCALE_FORMATS,
    SHUFFLE_TILE,
    indexer_k_cache_write_ref,
)
from ..triton_common import INT32_MAX, amd_options
from ._checks import FLOAT_DTYPES, Checker, debug_enabled
from ._dispatch import select
from .latent_core import num_compute_units
from .rope_kv_write import _check_index_dtype, _debug_slots

OP = "indexer_k_cache_write"  # config file, backend switch (ROCM_MLA_BACKEND_INDEXER_K_CACHE_WRITE)


def indexer_k_cache_write(
    k: torch.Tensor,
    index_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    scale_fmt: str | None = "ue8m0",
    shuffled: bool | None = None,
    kv_cache_dtype: str = "fp8",
    backend: str | None = None,
    debug: bool | None = None,
) -> None:
    """Quantise each key row of ``k`` to fp8 with a per-token scale and write it into ``index_cache``.

    Args:
        k: ``[T, 128]`` bfloat16/float16/float32, any strides (e.g. a column slice of the
            ``wk_weights_proj`` output): the indexer keys after their LayerNorm and RoPE.
        index_cache: ``[num_blocks, block_size, 132]`` uint8 (vLLM's storage; also a float8 view
            of it), written in place. Each block's ``block_size x 132`` bytes must be contiguous
            (``stride(2) == 1``, ``stride(1) == 132``); the block stride may be larger (a padded
            or interleaved allocation), a multiple of 4 bytes, and the start 4-byte aligned (the
            scales are float32). block_size >= 1; at most 2^31 - 1 slots (num_blocks x
            block_size).
        slot_mapping: ``[S]`` int64, ``S <= T`` (vLLM pads T for CUDA graphs), unit stride;
            token t goes to block ``slot // block_size``, offset ``slot % block_size``. -1 (any
            negative slot), a slot ``>= num_blocks x block_size`` and tokens ``t >= S`` are not
            written. Slots must be distinct (two tokens on one slot race).
        scale_fmt: ``"ue8m0"`` (power-of-two scales: DeepSeek-V3.2's format, and the only one
            vLLM's fused ``fused_norm_rope`` writes) or None (plain float32 scales, vLLM's
            ``indexer_k_quant_and_cache_triton`` with another ``scale_fmt``).
        shuffled: the value layout. None (default): vLLM 0.34's ROCm rule, shuffled for every
            block_size > 1 and flat at block_size 1 (``reference.indexer.vllm_rocm_shuffled``).
            True: 16 x 16 tiles (block_size a multiple of 16, as vLLM's ROCm backend requires: 1
            or a multiple of 16). False: flat rows at any block_size (vLLM's non-ROCm cache).
        kv_cache_dtype: the fp8 kind of a uint8 cache: ``"fp8"`` / ``"fp8_e4m3"`` = the
            platform's (configs/platform.json: e4m3fnuz on gfx942, e4m3fn on gfx950 and NVIDIA,
            as vLLM's ``current_platform.fp8_dtype()``), or ``"fp8_e4m3fn"`` / ``"fp8_e4m3fnuz"``.
            A float8 cache is its own kind (it must agree with a kind named here).
        backend: ``"triton"`` or ``"reference"`` to force one (there is no HIP kernel).
        debug: range-check the slots on the host first (a device sync: not capturable) and raise
            for one ``>= num_blocks x block_size`` or a repeated one; default ``ROCM_MLA_DEBUG=1``.

    Layout of block b (bytes from the block's start; docs/indexer.md, the definition in
    ``rocm_mla.reference.indexer``): ``[0, 128 block_size)`` the values, ``[128 block_size,
    132 block_size)`` the float32 scales, scale of offset o at ``128 block_size + 4 o``. Value d
    of offset o: flat at ``128 o + d``; shuffled at ``(o // 16) 2048 + (d // 16) 256 + (o % 16) 16
    + d % 16`` (``[block_size / 16, 8, 16, 16]``: token tile, dim tile, token, dim).

    Quantisation: the bytes equal ``rocm_mla.reference.indexer.indexer_k_quant_ref``'s exactly, on
    every backend (fp8_max 448 for e4m3fn, 224 for e4m3fnuz; "ue8m0" against vLLM's rounding, and
    why ``fused_rope_mla_kv_write`` does not write this key: docs/indexer.md).

    Bad slots (debug off, every backend): nothing outside the given tensors is read or written;
    a slot outside the cache is skipped like -1 and every other byte of the cache is unchanged.

    Returns:
        None (``index_cache`` is written in place).

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    fp8, shuffle = _check(c, k, index_cache, slot_mapping, scale_fmt, shuffled, kv_cache_dtype)
    if debug_enabled(debug):
        _debug_slots(c, slot_mapping, index_cache)
    impl = select(OP, index_cache.device, backend, has_hip=False)
    if slot_mapping.shape[0] == 0:
        return
    if impl == "triton":
        _launch_triton(k, index_cache, slot_mapping, fp8, scale_fmt, shuffle)
    else:
        indexer_k_cache_write_ref(k, index_cache, slot_mapping, fp8_dtype=fp8, scale_fmt=scale_fmt, shuffled=shuffle)


def _check(c: Checker, k, index_cache, slot_mapping, scale_fmt, shuffled, kv_cache_dtype) -> tuple[torch.dtype, bool]:
    """Validate the arguments; returns (the cache's fp8 kind, shuffled)."""
    c.tensor("k", k, ndim=2, layout="[T, 128]", dtypes=FLOAT_DTYPES)
    T = k.shape[0]
    if k.shape[1] != INDEX_HEAD_DIM:
        c.fail("k", f"shape [T, 128] = (*, {INDEX_HEAD_DIM})", tuple(k.shape))
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in FP8_KV_CACHE_DTYPES:
        c.fail("kv_cache_dtype", f"one of {', '.join(repr(n) for n in FP8_KV_CACHE_DTYPES)}", repr(kv_cache_dtype))
    shuffle = c.index_cache(index_cache, shuffled)
    if index_cache.shape[0] * index_cache.shape[1] > INT32_MAX:
        # The kernel's slot arithmetic is 32-bit (283 GB of cache at this bound).
        c.fail("index_cache", "at most 2^31 - 1 slots (num_blocks x block_size)", tuple(index_cache.shape))
    fp8 = c.fp8_cache_kind(index_cache, kv_cache_dtype, name="index_cache")
    if scale_fmt not in SCALE_FORMATS:
        c.fail("scale_fmt", "'ue8m0' or None", repr(scale_fmt))
    c.tensor("slot_mapping", slot_mapping, ndim=1, layout="[S <= T]")
    if slot_mapping.shape[0] > T:
        c.fail("slot_mapping", f"shape [S] with S <= T = {T} (k's T)", tuple(slot_mapping.shape))
    _check_index_dtype(c, "slot_mapping", slot_mapping)
    if slot_mapping.shape[0] > 1 and slot_mapping.stride(0) != 1:
        c.fail("slot_mapping", "stride 1", f"strides {slot_mapping.stride()}")
    c.arguments({"index_cache": index_cache}, {"k": k, "slot_mapping": slot_mapping})
    return fp8, shuffle


def launch_rows(arch: str, num_rows: int, num_cus: int) -> int:
    """Key rows a program for a call of ``num_rows`` keys on ``num_cus`` CUs: the config's
    ``rows_per_program`` while its grid covers the CUs, else halved until it does (down to one).
    A decode step writes one key per request: spread over more programs, each thread of a program
    holds fewer of the values its serial chain (slot, key row, amax, quantise, store) works on."""
    rows = config_for(OP, arch)["tiers"][0]["rows_per_program"]
    while rows > 1 and triton.cdiv(num_rows, rows) < num_cus:
        rows //= 2
    return rows


def triton_meta(
    arch: str, *, fp8: torch.dtype, scale_fmt: str | None, shuffled: bool, rows: int | None = None
) -> tuple[dict, dict]:
    """Constexprs and compile options of one Triton launch on ``arch`` for a cache of kind ``fp8``,
    scale format ``scale_fmt`` and value layout ``shuffled``: the single place the launch and the
    ISA report's variants (rocm_mla/variants/indexer_cache.py) take them from. ROWS: key rows per
    program, ``rows`` (:func:`launch_rows`; a power of two up to the config's) or the config's
    ``rows_per_program``. The config's ``num_warps``, capped at one lane per value
    (``ROWS x 128 / wave_size``): a tensor of fewer values than threads would be replicated."""
    cfg = config_for(OP, arch)["tiers"][0]
    full = cfg["rows_per_program"]
    rows = full if rows is None else rows
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 or rows > full or rows & (rows - 1):
        raise ValueError(f"{OP}: rows: expected a power of two in [1, {full}] (rows_per_program), got {rows!r}")
    warps = max(1, min(cfg["num_warps"], rows * INDEX_HEAD_DIM // wave_size(arch)))
    options = {"num_warps": warps, **amd_options(cfg, arch)}
    return {
        "HEAD_DIM": INDEX_HEAD_DIM,
        "ROWS": rows,
        "FP8_MAX": INDEXER_FP8_MAX[fp8],
        "FNUZ": fp8 == torch.float8_e4m3fnuz,
        "UE8M0": scale_fmt == "ue8m0",
        "SHUFFLE": bool(shuffled),
        "TILE": SHUFFLE_TILE,
    }, options


def _launch_triton(k, index_cache, slot_mapping, fp8, scale_fmt, shuffled) -> None:
    S = slot_mapping.shape[0]
    nb, bs = index_cache.shape[0], index_cache.shape[1]
    arch = _platform.device_arch(index_cache.device)
    rows = launch_rows(arch, S, num_compute_units(index_cache.device))
    consts, options = triton_meta(arch, fp8=fp8, scale_fmt=scale_fmt, shuffled=shuffled, rows=rows)
    cache = index_cache.view(torch.uint8)
    # An empty cache is never dereferenced (every slot is outside) but may carry a null pointer,
    # which the launcher rejects: a one-block stand-in.
    if nb * bs == 0:
        cache = cache.new_empty((1, 1, INDEX_ROW_BYTES))
    grid = (triton.cdiv(S, consts["ROWS"]),)
    indexer_k_cache_write_kernel[grid](
        k, cache, slot_mapping, S, nb * bs, bs, k.stride(0), k.stride(1), cache.stride(0), **consts, **options
    )
