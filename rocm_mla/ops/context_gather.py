"""context_gather: one chunk of cached context out of the paged MLA cache, for chunked prefill.

vLLM's MLA prefill with cached context gathers each context chunk's latent rows
``[kv_c (512) | k_pe (64)]`` from the paged cache into a contiguous workspace before the
``kv_b_proj`` up-projection (a GEMM needs the rows). Upstream this is vLLM's compiled
``gather_and_maybe_dequant_cache`` (vllm/_custom_ops.py); this op is the equivalent with no
compiled vLLM op: one Triton launch that gathers, and dequantises an fp8 cache (value = stored x
k_scale) on the way, straight into the workspace rows. It is a gather, which exists upstream as
well, not one of the copies rocm_mla removes.

Indexing follows vLLM's ``MLACommonPrefillMetadata.ContextChunk``
(vllm/model_executor/layers/attention/mla_attention.py); rocm_mla/vllm/backend.py hands it the
chunk's fields as they are.

Kernel: rocm_mla/kernels/context_gather.py (Triton; no HIP kernel). Reference:
rocm_mla/reference/context_gather.py. Launch data: configs/context_gather.json.
"""

from __future__ import annotations

import torch
import triton

from .. import _platform
from ..configs import config_for
from ..kernels.context_gather import context_gather_kernel
from ..mla_dims import FP8_DTYPES, FP8_KV_CACHE_DTYPES, KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM
from ..reference.context_gather import context_gather_ref
from ..triton_common import amd_options
from ._checks import FLOAT_DTYPES, Checker
from ._dispatch import select
from .latent_core import KV_CACHE_DTYPE_NAMES

OP = "context_gather"  # config file, backend switch (ROCM_MLA_BACKEND_CONTEXT_GATHER)

_INDEX_DTYPES = (torch.int32, torch.int64)


def gather_context_chunk(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    starts: torch.Tensor,
    token_to_seq: torch.Tensor,
    dst: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    kv_cache_dtype: str = "auto",
    backend: str | None = None,
) -> torch.Tensor:
    """Gather ``dst.shape[0]`` context rows of one chunk from the paged cache into ``dst``.

    Args:
        kv_cache: ``[num_blocks, block_size, 576]`` (rows ``[kv_c (512) | k_pe (64)]``), any block
            and token strides, last dim contiguous; float32/float16/bfloat16, or an fp8 cache
            dequantised with ``k_scale``: float8_e4m3fn / float8_e4m3fnuz, or uint8 storage (vLLM's
            cache tensor as it is allocated) with an fp8 ``kv_cache_dtype``, read as the kind
            that name gives (the same bytes, the same result as the float8 view). block_size >= 1.
        block_table: ``[R, max_blocks]`` int32/int64, the chunk's requests' rows of the table
            (e.g. ``block_table[chunk.request_slice]``), column stride 1.
        cu_seq_lens: ``[R + 1]`` int32/int64, the chunk's context rows per request, cumulative.
        starts: ``[R]`` int32/int64, each request's first context position in this chunk.
        token_to_seq: ``[>= T]`` int32/int64, the request (0..R-1) of each chunk row; entries
            past T are not read.
        dst: ``[T, 576]`` destination (the workspace rows), float32/float16/bfloat16, any row
            stride, last dim contiguous; every element is written. It may not overlap any input.
        k_scale: one-element float32 tensor, fp8 caches only (ignored otherwise); read on the
            device: no host sync.
        kv_cache_dtype: vLLM's name of the cache's dtype: ``"auto"`` (the tensor's own dtype;
            float8 included), ``"bfloat16"`` / ``"float16"`` / ``"float32"`` (the tensor's dtype
            must be that one), or an fp8 name (``"fp8"``, ``"fp8_e4m3"``: the platform's E4M3 kind,
            configs/platform.json, e4m3fnuz on gfx942 and e4m3fn elsewhere; ``"fp8_e4m3fn"``,
            ``"fp8_e4m3fnuz"``: that kind) for a uint8 or float8 cache (a float8 cache must be the
            kind a kind-naming name gives). A uint8 cache needs an fp8 name (mla_decode's rule).
        backend: ``"triton"`` or ``"reference"`` to force one (there is no HIP kernel; default:
            Triton on a GPU or under the interpreter, else the reference; see
            ``rocm_mla.ops._dispatch``).

    Chunk row t belongs to request ``s = token_to_seq[t]``, is that request's context position
    ``pos = starts[s] + t - cu_seq_lens[s]`` and is read from
    ``kv_cache[block_table[s, pos // block_size], pos % block_size]``; it is written to ``dst[t]``
    converted once (float32 in between) to dst's dtype. T = 0: nothing to do.

    Bad indices (debug off, every backend; no host sync): nothing outside the given tensors is
    read or written. A chunk row whose request is outside ``[0, R)``, whose position is outside
    its table row ``[0, max_blocks x block_size)``, or whose page is outside ``[0, num_blocks)``
    gets NaN in all 576 values; other rows are unaffected (the attention over the chunk then makes
    every query row of that request NaN: a NaN key is seen by all of them).

    Returns:
        ``dst``.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    fp8, k_scale = _check(c, kv_cache, block_table, cu_seq_lens, starts, token_to_seq, dst, k_scale, kv_cache_dtype)
    impl = select(OP, dst.device, backend, has_hip=False)
    if dst.shape[0] == 0:
        return dst
    kv = kv_cache.view(fp8) if fp8 is not None and kv_cache.dtype != fp8 else kv_cache
    if impl == "triton":
        _launch_triton(kv, block_table, cu_seq_lens, starts, token_to_seq, dst, k_scale)
    else:
        dst.copy_(context_gather_ref(kv, block_table, cu_seq_lens, starts, token_to_seq, dst.shape[0], k_scale))
    return dst


def _cache_kind(c: Checker, kv_cache: torch.Tensor, kv_cache_dtype: object) -> torch.dtype | None:
    """The FP8 kind the kernel reads the cache as (uint8 storage viewed as the kind its fp8
    ``kv_cache_dtype`` names, ``Checker.fp8_cache_kind``), or None for a 16/32-bit cache."""
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPE_NAMES:
        c.fail("kv_cache_dtype", f"one of {', '.join(map(repr, KV_CACHE_DTYPE_NAMES))}", repr(kv_cache_dtype))
    if kv_cache_dtype in FP8_KV_CACHE_DTYPES:
        return c.fp8_cache_kind(kv_cache, kv_cache_dtype)
    dt = kv_cache.dtype
    got = str(dt).replace("torch.", "")
    if dt == torch.uint8:
        names = ", ".join(map(repr, FP8_KV_CACHE_DTYPES))
        c.fail(
            "kv_cache",
            f"uint8 storage with an fp8 kv_cache_dtype ({names})",
            f"uint8 (kv_cache_dtype={kv_cache_dtype!r})",
            TypeError,
        )
    c.tensor("kv_cache", kv_cache, layout="[num_blocks, block_size, 576]", dtypes=FLOAT_DTYPES + FP8_DTYPES)
    if kv_cache_dtype != "auto" and got != kv_cache_dtype:
        c.fail("kv_cache", f"dtype {kv_cache_dtype} (kv_cache_dtype={kv_cache_dtype!r})", got, TypeError)
    return dt if dt in FP8_DTYPES else None


def _check(
    c: Checker, kv_cache, block_table, cu_seq_lens, starts, token_to_seq, dst, k_scale, kv_cache_dtype
) -> tuple[torch.dtype | None, torch.Tensor | None]:
    """Validate the arguments; returns the FP8 kind of an fp8 cache (None for 16/32-bit ones) and
    k_scale (None unless fp8)."""
    c.tensor("dst", dst, ndim=2, layout="[T, 576]", dtypes=FLOAT_DTYPES)
    T = dst.shape[0]
    if dst.shape[1] != KV_ROW_DIM:
        c.fail("dst", f"shape [T, 576] = (*, {KV_ROW_DIM})", tuple(dst.shape))
    c.tensor("kv_cache", kv_cache, ndim=3, layout="[num_blocks, block_size, 576]")
    fp8 = _cache_kind(c, kv_cache, kv_cache_dtype)
    if kv_cache.shape[2] != KV_ROW_DIM:
        c.fail("kv_cache", f"shape [num_blocks, block_size, 576] = (*, *, {KV_ROW_DIM})", tuple(kv_cache.shape))
    if kv_cache.shape[1] < 1:
        c.fail("kv_cache", "block_size >= 1", tuple(kv_cache.shape))
    for name, x in (("kv_cache", kv_cache), ("dst", dst)):
        if x.stride(-1) != 1:
            c.fail(name, "a contiguous last dim (stride 1)", f"strides {x.stride()}")
    c.tensor("block_table", block_table, ndim=2, layout="[R, max_blocks]", dtypes=_INDEX_DTYPES)
    R = block_table.shape[0]
    c.tensor("cu_seq_lens", cu_seq_lens, shape=(R + 1,), layout="[R + 1]", dtypes=_INDEX_DTYPES, like="block_table's R")
    c.tensor("starts", starts, shape=(R,), layout="[R]", dtypes=_INDEX_DTYPES, like="block_table's R")
    c.tensor("token_to_seq", token_to_seq, ndim=1, layout="[>= T]", dtypes=_INDEX_DTYPES)
    if token_to_seq.shape[0] < T:
        c.fail("token_to_seq", f"a 1-D tensor of at least dst's {T} rows", f"shape {tuple(token_to_seq.shape)}")
    # The kernel steps through these with unit strides (block_table: along a row).
    for name, x, dim in (
        ("block_table", block_table, 1),
        ("cu_seq_lens", cu_seq_lens, 0),
        ("starts", starts, 0),
        ("token_to_seq", token_to_seq, 0),
    ):
        if x.shape[dim] > 1 and x.stride(dim) != 1:
            c.fail(name, f"stride 1 in dim {dim}", f"strides {x.stride()}")
    if fp8 is None:
        k_scale = None
    else:
        c.fp8_scale("k_scale", k_scale)
    c.arguments(
        {"dst": dst},
        {
            "kv_cache": kv_cache,
            "block_table": block_table,
            "cu_seq_lens": cu_seq_lens,
            "starts": starts,
            "token_to_seq": token_to_seq,
            "k_scale": k_scale,
        },
    )
    return fp8, k_scale


def triton_meta(arch: str) -> tuple[dict, dict]:
    """Constexprs (D_NOPE, D_PE, BLOCK_T) and compile options the wrapper uses on ``arch``;
    rocm_mla.variants.context_gather builds the ISA report's variants with it. The row is read as
    two power-of-two pieces (tl.arange): the latent part and the rope part."""
    cfg = config_for(OP, arch)["tiers"][0]
    options = {"num_warps": cfg["num_warps"], **amd_options(cfg, arch)}
    return {"D_NOPE": KV_LORA_RANK, "D_PE": QK_ROPE_HEAD_DIM, "BLOCK_T": cfg["rows_per_program"]}, options


def _launch_triton(kv_cache, block_table, cu_seq_lens, starts, token_to_seq, dst, k_scale):
    T = dst.shape[0]
    R, max_blocks = block_table.shape
    num_blocks, page_size = kv_cache.shape[0], kv_cache.shape[1]
    consts, options = triton_meta(_platform.device_arch(dst.device))
    grid = (triton.cdiv(T, consts["BLOCK_T"]),)
    # Empty tensors are never dereferenced (every row is then out of range) but may carry a
    # null pointer, which the launcher rejects: hand it another live tensor instead.
    cache = kv_cache if kv_cache.numel() else dst
    bt = block_table if block_table.numel() else token_to_seq
    st = starts if starts.numel() else token_to_seq
    context_gather_kernel[grid](
        cache,
        bt,
        cu_seq_lens,
        st,
        token_to_seq,
        k_scale if k_scale is not None else dst,
        dst,
        T,
        page_size,
        R,
        max_blocks * page_size,
        num_blocks,
        kv_cache.stride(0),
        kv_cache.stride(1),
        block_table.stride(0),
        dst.stride(0),
        FP8=k_scale is not None,
        **consts,
        **options,
    )
