"""fused_rope_mla_kv_write and concat_and_cache_mla: RoPE of q_pe / k_pe in place plus the latent
KV-cache write, in one kernel.

Kernels: hip_src/kernels/rope_kv_write.cuh (HIP), rocm_mla/kernels/rope_kv_write.py (Triton).
Reference: rocm_mla/reference/rope_kv_write.py. Both ops share one kernel family, one config
(configs/rope_kv_write.json) and one backend switch: ``ROCM_MLA_BACKEND_ROPE_KV_WRITE``.
Every layer of the family (config, kernels, op, reference, variants, tests, benchmark, the tuner's
op key) says ``rope_kv_write``; the two public functions keep vLLM's op names
(``fused_rope_mla_kv_write``, ``concat_and_cache_mla``), which they mirror.

The contract (int64 indices, a slot_mapping shorter than the batch, FP8 storage, bad indices, no
overlapping destinations) is on ``fused_rope_mla_kv_write``; ``concat_and_cache_mla`` keeps it.
"""

from __future__ import annotations

import torch
import triton

from .. import _ext, _platform
from ..configs import config_for, platform_fp8_dtype
from ..kernels.rope_kv_write import rope_mla_kv_write_kernel
from ..mla_dims import FP8_KV_CACHE_DTYPES, KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM
from ..reference.rope_kv_write import cache_rows_ref, fused_rope_mla_kv_write_ref, write_cache_ref
from ..triton_common import amd_options
from ._checks import FLOAT_DTYPES, Checker, debug_enabled
from ._dispatch import select

OP = "rope_kv_write"  # config file, backend switch (ROCM_MLA_BACKEND_ROPE_KV_WRITE)

# kv_cache_dtype values: "auto" (the q dtype), or an FP8 E4M3 kind (mla_dims.FP8_KV_CACHE_DTYPES).
KV_CACHE_DTYPES = ("auto", *FP8_KV_CACHE_DTYPES)
_FP8_KIND = {torch.float8_e4m3fn: 1, torch.float8_e4m3fnuz: 2}  # the kernels' CACHE_KIND


def fused_rope_mla_kv_write(
    positions: torch.Tensor,
    q_pe: torch.Tensor,
    k_pe: torch.Tensor,
    kv_c: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    is_neox: bool,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    backend: str | None = None,
    debug: bool | None = None,
) -> None:
    """Rotate ``q_pe`` and ``k_pe`` in place and write ``[kv_c | rope(k_pe)]`` into the paged cache.

    Args:
        positions: ``[T]`` int64 token positions, each in ``[0, max_pos)`` (int32 is rejected);
            a token whose position is outside gets NaN (see "Bad indices" below).
        q_pe: ``[T, N, 64]`` float32/float16/bfloat16, any strides (typically the strided slice
            ``q[..., 128:]`` of the ``[T, N, 192]`` query); rotated in place. Any N >= 1.
        k_pe: ``[T, 1, 64]`` or ``[T, 64]``, q_pe's dtype, any strides (e.g. a slice of the
            ``[T, 576]`` kv_a output); rotated in place.
        kv_c: ``[T, 512]``, q_pe's dtype, any strides: the latent part of the cache row.
        cos_sin_cache: ``[max_pos, 64]`` = ``cat(cos[32], sin[32])`` per position (vLLM's layout;
            YaRN's mscale folded in), float32 or q_pe's dtype, any strides.
        kv_cache: ``[num_blocks, block_size, 576]``, any strides (e.g. a non-contiguous block
            stride). dtype: q_pe's (``kv_cache_dtype="auto"``); or FP8 -- a float8_e4m3fn /
            float8_e4m3fnuz tensor, or uint8 storage holding the codes (as vLLM passes it) whose
            kind ``kv_cache_dtype`` names: ``"fp8_e4m3fn"``, ``"fp8_e4m3fnuz"``, or ``"fp8"`` /
            ``"fp8_e4m3"`` = the platform's kind (e4m3fnuz on gfx94x, e4m3fn elsewhere).
        slot_mapping: ``[S]`` int64 with ``S <= T``; token t's row goes to block
            ``slot // block_size``, offset ``slot % block_size``. A negative slot (-1) and tokens
            ``t >= S`` (vLLM's CUDA-graph padding) are rotated but not cached, and so is a slot
            ``>= num_blocks x block_size``. Slots must be distinct (two tokens writing one row race).
        is_neox: False: GPT-J style, pairs (2i, 2i+1) (DeepSeek); True: NeoX style, pairs (i, i+32).
        kv_cache_dtype: ``"auto"`` (cache dtype == q_pe's) or one of the FP8 names above.
        k_scale: FP8 only (ignored otherwise, so vLLM may always pass it): a 1-element float32
            tensor on the cache's device; the cache stores ``x / k_scale``, saturated to the
            format's largest finite value (448 e4m3fn, 240 e4m3fnuz), round to nearest even.
            Read on the device: no host sync, safe under CUDA-graph capture.
        backend: ``"hip"``, ``"triton"`` or ``"reference"`` to force one (default: fastest
            available; ``ROCM_MLA_BACKEND_ROPE_KV_WRITE`` forces one for both rope/cache ops).
        debug: range-check positions and slots on the host first (a device sync: not
            capturable); default ``ROCM_MLA_DEBUG=1`` in the environment.

    Rotation: ``x' = x cos_i - y sin_i, y' = y cos_i + x sin_i`` in float32, rounded once per store;
    the cache gets the float32 rotation rounded (or quantised) once to its own type. Nothing else
    in the cache is touched. q_pe, k_pe and kv_cache (written) may not overlap each other, kv_c,
    cos_sin_cache, positions, slot_mapping or k_scale (ValueError naming both).

    Bad indices (debug off; every backend): nothing outside the given tensors is read or written.
    A slot outside ``[0, num_blocks x block_size)`` is skipped like -1. A position outside
    ``[0, max_pos)`` reads no cos/sin: that token's q_pe and k_pe become NaN, its cache row (if
    its slot is valid) gets NaN in the rope part and kv_c as given; other tokens are unaffected.
    With ``debug=True`` (or ``ROCM_MLA_DEBUG=1``) they raise a ValueError naming the argument,
    the index and the bound instead.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker("fused_rope_mla_kv_write")
    k2, fp8, k_scale = _check(
        c, positions, q_pe, k_pe, kv_c, cos_sin_cache, kv_cache, slot_mapping, kv_cache_dtype, k_scale, debug
    )
    launch(positions, q_pe, k2, kv_c, cos_sin_cache, kv_cache, slot_mapping, is_neox, fp8, k_scale, backend)


def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    backend: str | None = None,
    debug: bool | None = None,
) -> None:
    """Write ``[kv_c | k_pe]`` into the paged cache, no rotation (k_pe already rotated elsewhere).

    Same contract as ``fused_rope_mla_kv_write`` without ``positions``, ``q_pe`` and
    ``cos_sin_cache`` (vLLM's ``concat_and_cache_mla``): kv_c ``[T, 512]``, k_pe ``[T, 1, 64]`` or
    ``[T, 64]`` (kv_c's dtype, read only), kv_cache ``[num_blocks, block_size, 576]`` of kv_c's
    dtype or FP8 (see there), slot_mapping ``[S <= T]`` int64 (negative or outside the cache =
    skip; ``debug=True`` / ``ROCM_MLA_DEBUG=1`` raises for one outside instead). kv_cache may not
    overlap kv_c, k_pe, slot_mapping or k_scale.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker("concat_and_cache_mla")
    k2, fp8, k_scale = _check(c, None, None, k_pe, kv_c, None, kv_cache, slot_mapping, kv_cache_dtype, k_scale, debug)
    launch(None, None, k2, kv_c, None, kv_cache, slot_mapping, False, fp8, k_scale, backend)


# ---------------------------------------------------------------- validation


def _check(
    c: Checker, positions, q_pe, k_pe, kv_c, cos_sin_cache, kv_cache, slot_mapping, kv_cache_dtype, k_scale, debug
) -> tuple[torch.Tensor, torch.dtype | None, torch.Tensor | None]:
    """Validate either op's arguments (``q_pe`` None: concat_and_cache_mla, no positions or cos/sin).
    Returns k_pe as a ``[T, 64]`` view, the cache's FP8 kind (None: it stores the q / kv_c dtype)
    and k_scale (None unless FP8)."""
    rope = q_pe is not None
    if rope:
        c.tensor("q_pe", q_pe, ndim=3, layout="[T, N, 64]", dtypes=FLOAT_DTYPES)
        T, N, D = q_pe.shape
        if D != QK_ROPE_HEAD_DIM:
            c.fail("q_pe", f"shape [T, N, 64] = (*, *, {QK_ROPE_HEAD_DIM})", tuple(q_pe.shape))
        if N < 1:
            c.fail("q_pe", "at least one head (N >= 1)", tuple(q_pe.shape))
        c.tensor("positions", positions, shape=(T,), layout="[T]", like="q_pe's T")
        _check_index_dtype(c, "positions", positions)
        cs_dtypes = tuple(dict.fromkeys((torch.float32, q_pe.dtype)))
        c.tensor("cos_sin_cache", cos_sin_cache, ndim=2, layout="[max_pos, 64]", dtypes=cs_dtypes)
        if cos_sin_cache.shape[1] != QK_ROPE_HEAD_DIM:
            c.fail("cos_sin_cache", "shape [max_pos, 64] = (*, 64) (cat(cos[32], sin[32]))", tuple(cos_sin_cache.shape))
    else:
        c.tensor("kv_c", kv_c, shape=(None, KV_LORA_RANK), layout="[T, 512]", dtypes=FLOAT_DTYPES)
    ref_name, ref = ("q_pe", q_pe) if rope else ("kv_c", kv_c)
    T = ref.shape[0]
    c.tensor("k_pe", k_pe, layout="[T, 1, 64] or [T, 64]")
    if tuple(k_pe.shape) not in ((T, 1, QK_ROPE_HEAD_DIM), (T, QK_ROPE_HEAD_DIM)):
        c.fail("k_pe", f"shape [T, 1, 64] = ({T}, 1, 64) or [T, 64] = ({T}, 64) ({ref_name}'s T)", tuple(k_pe.shape))
    k2 = k_pe.select(1, 0) if k_pe.dim() == 3 else k_pe
    c.tensor("kv_c", kv_c, shape=(T, KV_LORA_RANK), layout="[T, 512]", like=f"{ref_name}'s T")
    c.same_dtype(ref_name, ref, k_pe=k_pe, kv_c=kv_c)
    c.tensor("kv_cache", kv_cache, ndim=3, layout="[num_blocks, block_size, 576]")
    if kv_cache.shape[2] != KV_ROW_DIM:
        c.fail("kv_cache", f"shape [num_blocks, block_size, 576] = (*, *, {KV_ROW_DIM})", tuple(kv_cache.shape))
    if kv_cache.shape[0] * kv_cache.shape[1] >= 1 << 32:
        c.fail("kv_cache", "fewer than 2^32 slots (num_blocks x block_size)", tuple(kv_cache.shape))
    c.tensor("slot_mapping", slot_mapping, ndim=1, layout="[S <= T]")
    if slot_mapping.shape[0] > T:
        c.fail("slot_mapping", f"shape [S] with S <= T = {T}", tuple(slot_mapping.shape))
    _check_index_dtype(c, "slot_mapping", slot_mapping)
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        c.fail("kv_cache_dtype", f"one of {', '.join(repr(k) for k in KV_CACHE_DTYPES)}", repr(kv_cache_dtype))
    if kv_cache_dtype == "auto":
        if kv_cache.dtype != ref.dtype:
            want, got = (str(d).replace("torch.", "") for d in (ref.dtype, kv_cache.dtype))
            hint = " (an FP8 cache needs kv_cache_dtype='fp8')" if kv_cache.dtype in (torch.uint8, *_FP8_KIND) else ""
            c.fail("kv_cache", f"dtype {want} (kv_cache_dtype='auto' means the q dtype){hint}", got, TypeError)
        fp8 = k_scale = None
    else:
        fp8 = c.fp8_cache_kind(kv_cache, kv_cache_dtype)
        c.fp8_scale("k_scale", k_scale)
    # fused_rope_mla_kv_write rotates k_pe in place; concat_and_cache_mla only reads it.
    dests = {"q_pe": q_pe, "k_pe": k2} if rope else {}
    srcs = {} if rope else {"k_pe": k2}
    srcs |= {"positions": positions, "kv_c": kv_c, "cos_sin_cache": cos_sin_cache, "slot_mapping": slot_mapping}
    c.arguments({**dests, "kv_cache": kv_cache}, {**srcs, "k_scale": k_scale}, like=ref_name)
    if debug_enabled(debug):
        if rope:
            hi = cos_sin_cache.shape[0]
            want = f"values in [0, {hi}) (cos_sin_cache's max_pos; debug check)"
            _debug_first_bad(c, "positions", positions, (positions < 0) | (positions >= hi), want)
        _debug_slots(c, slot_mapping, kv_cache)
    return k2, fp8, k_scale


def _check_index_dtype(c: Checker, name: str, x: torch.Tensor) -> None:
    if x.dtype != torch.int64:
        c.fail(
            name,
            "dtype int64 (int32 is not accepted: converting would allocate per call)",
            str(x.dtype).replace("torch.", ""),
            TypeError,
        )


def _debug_first_bad(c: Checker, name: str, x: torch.Tensor, bad: torch.Tensor, expected: str) -> None:
    """Raise naming the first index of ``x`` where ``bad`` holds (a host sync: debug checks only)."""
    idx = bad.nonzero()
    if idx.numel():
        i = int(idx[0, 0])
        c.fail(name, expected, f"{int(x[i])} at index {i} ({idx.shape[0]} out of range)")


def _debug_slots(c: Checker, slots: torch.Tensor, kv_cache: torch.Tensor) -> None:
    n = kv_cache.shape[0] * kv_cache.shape[1]
    want = f"values < num_blocks x block_size = {n} or negative (debug check)"
    _debug_first_bad(c, "slot_mapping", slots, slots >= n, want)
    valid = slots[slots >= 0]
    if valid.numel() != valid.unique().numel():
        c.fail(
            "slot_mapping",
            "distinct non-negative slots (debug check)",
            f"{valid.numel() - valid.unique().numel()} repeated",
        )


# ---------------------------------------------------------------- dispatch


def launch(positions, q_pe, k_pe, kv_c, cos_sin_cache, kv_cache, slot_mapping, is_neox, fp8, k_scale, backend):
    """Validated arguments (k_pe as [T, 64]; q_pe None = no rope; fp8: the cache's FP8 dtype or
    None, k_scale None unless fp8) -> the selected implementation."""
    impl = select(OP, kv_cache.device, backend)
    if k_pe.shape[0] == 0:
        return
    # Kernels write FP8 codes through a uint8 view (one code path for float8 and uint8 caches).
    cache = kv_cache.view(torch.uint8) if fp8 is not None else kv_cache
    kind = _FP8_KIND[fp8] if fp8 is not None else 0
    if impl == "hip":
        cfg = config_for(OP, _platform.device_arch(kv_cache.device))["hip"]["tiers"][0]
        _ext.load().rope_mla_kv_write(
            positions,
            q_pe,
            k_pe,
            kv_c,
            cos_sin_cache,
            cache,
            slot_mapping,
            k_scale,
            bool(is_neox),
            kind,
            int(cfg["waves_per_block"]),
            int(cfg["units_per_thread"]),
            int(cfg["min_blocks_per_cu"]),
        )
    elif impl == "triton":
        _launch_triton(positions, q_pe, k_pe, kv_c, cos_sin_cache, cache, slot_mapping, k_scale, bool(is_neox), kind)
    else:
        if q_pe is not None:
            q_rot, k_rot, rows = fused_rope_mla_kv_write_ref(
                positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox=is_neox
            )
            q_pe.copy_(q_rot)
            k_pe.copy_(k_rot)
        else:
            rows = cache_rows_ref(kv_c, k_pe)
        write_cache_ref(kv_cache, slot_mapping, rows, fp8_dtype=fp8, k_scale=k_scale)


def fp8_cache_kind(arch: str) -> int:
    """The kernels' CACHE_KIND of a plain "fp8" cache on ``arch`` (configs/platform.json)."""
    return _FP8_KIND[platform_fp8_dtype(arch)]


def triton_meta(
    num_heads: int, arch: str, *, rope: bool, is_neox: bool, cache_kind: int, cs_i64: bool = False
) -> tuple[dict, dict]:
    """``(constexprs, compile options)`` of one Triton launch for ``num_heads`` heads on ``arch``:
    the single place the launch and the ISA report's variants (rocm_mla/variants/rope_kv_write.py)
    take them from.

    TOKENS: tokens per program, so that a program moves about ``rows_per_program`` q_pe rows
    (16 heads -> 8 tokens, 128 heads -> 1), at most ``max_tokens`` (its [TOKENS, 512] kv_c tile
    lives in registers). CS_I64 (``cs_i64``): 64-bit cos/sin row offsets, for a cos_sin_cache whose
    last row starts 2^31 elements or more from its first (32-bit otherwise: the position guard bounds
    the row).
    """
    cfg = config_for(OP, arch)["tiers"][0]
    tokens = max(1, min(cfg["max_tokens"], cfg["rows_per_program"] // max(1, num_heads)))
    tokens = 1 << (tokens.bit_length() - 1)  # a power of two (tl.arange)
    block_r = min(cfg["block_rows"], triton.next_power_of_2(max(1, tokens * num_heads)))
    options = {"num_warps": cfg["num_warps"], **amd_options(cfg, arch)}
    # IS_NEOX only matters with ROPE (no rope: one kernel whatever is_neox says).
    return {
        "TOKENS": tokens,
        "BLOCK_R": block_r,
        "ROPE": bool(rope),
        "IS_NEOX": bool(is_neox and rope),
        "CACHE_KIND": int(cache_kind),
        "CS_I64": bool(cs_i64 and rope),
    }, options


def cos_sin_offsets_need_64_bit(cos_sin_cache: torch.Tensor) -> bool:
    """Whether the Triton kernel needs 64-bit cos/sin row offsets (CS_I64): when the last row of
    ``cos_sin_cache`` ``[max_pos, 64]`` starts 2^31 elements or more from its first. Otherwise they
    are 32-bit: the position guard keeps every row the kernel reads below max_pos."""
    return (cos_sin_cache.shape[0] - 1) * cos_sin_cache.stride(0) >= 2**31


def _launch_triton(positions, q_pe, k_pe, kv_c, cos_sin_cache, cache, slot_mapping, k_scale, is_neox, kind):
    T = k_pe.shape[0]
    rope = q_pe is not None
    N = q_pe.shape[1] if rope else 0
    cs_i64 = rope and cos_sin_offsets_need_64_bit(cos_sin_cache)
    arch = _platform.device_arch(cache.device)
    consts, options = triton_meta(N, arch, rope=rope, is_neox=is_neox, cache_kind=kind, cs_i64=cs_i64)
    grid = (triton.cdiv(T, consts["TOKENS"]),)
    # Unused pointers get a live tensor of the right kind (never read: ROPE / CACHE_KIND are constexpr).
    pos = positions if rope else slot_mapping
    q = q_pe if rope else k_pe.unsqueeze(1)
    cs = cos_sin_cache if rope else k_pe
    ks = k_scale if kind else kv_c
    num_slots = cache.shape[0] * cache.shape[1]
    max_pos = cs.shape[0] if rope else 0
    # An empty cache or cos/sin cache is never dereferenced (every slot / position is out of
    # range), but it may carry a null pointer, which the launcher rejects: a 1-row stand-in.
    if num_slots == 0:
        cache = cache.new_empty((1, 1, KV_ROW_DIM))
    if rope and max_pos == 0:
        cs = cs.new_empty((1, QK_ROPE_HEAD_DIM))
    q_strides = q.stride() if rope else (0, 0, 0)
    cs_strides = cs.stride() if rope else (0, 0)
    rope_mla_kv_write_kernel[grid](
        pos,
        q,
        k_pe,
        kv_c,
        cs,
        cache,
        slot_mapping,
        ks,
        T,
        N,
        slot_mapping.shape[0],
        cache.shape[1],
        num_slots,
        max_pos,
        *q_strides,
        *k_pe.stride(),
        *kv_c.stride(),
        *cs_strides,
        *cache.stride(),
        **consts,
        **options,
    )
