"""Float32 reference of the lightning indexer's key cache (sparse MLA: DeepSeek-V3.2, GLM-5.x).

The cache is vLLM 0.34's ROCm layout (docs/indexer.md): uint8 ``[num_blocks, block_size, 132]``
whose block ``b`` is one run of ``block_size x 132`` bytes -- first the ``block_size x 128`` fp8
E4M3 values, then ``block_size`` float32 scales (little-endian), the scale of the token at offset
``o`` at byte ``block_size x 128 + 4 o``. A key is ``value x scale``.

Values: flat (row ``o`` at bytes ``[128 o, 128 o + 128)``), or shuffled in 16 x 16 tiles (vLLM's
ROCm path for every block_size > 1: ``[block_size / 16, 128 / 16, 16, 16]`` = (token tile,
dim tile, token in tile, dim in tile)); :func:`indexer_value_offsets` is the one definition.
Quantisation: :func:`indexer_k_quant_ref`.

Imports nothing of rocm_mla: the ops, kernels and tests take the layout from here.
"""

from __future__ import annotations

import torch

INDEX_HEAD_DIM = 128  # the indexer key's width (DeepSeek-V3.2, GLM-5.x)
INDEX_ROW_BYTES = INDEX_HEAD_DIM + 4  # per token: 128 fp8 values and one float32 scale
SHUFFLE_TILE = 16  # the shuffled layout's tile: 16 tokens x 16 bytes
# The largest |value| a scale maps to, per kind: vLLM's _FP8_MAX / the indexer insert's constant
# (224 keeps a power-of-two scale inside e4m3fnuz's range of 240).
INDEXER_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 224.0}
SCALE_FORMATS = ("ue8m0", None)


def vllm_rocm_shuffled(block_size: int) -> bool:
    """The value layout vLLM 0.34's ROCm path uses for a cache of ``block_size`` tokens per block:
    shuffled 16 x 16 tiles above one token per block (``indexer_k_cache_is_shuffled``;
    ``DeepseekV32ROCmIndexerCache.uses_shuffled_layout``), flat rows at block_size 1."""
    return block_size > 1


def round_up_pow2(s: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= ``s`` (float32, > 0), exactly: the UE8M0 scale format, computed
    on the bits (a power of two is kept, any other value takes the next exponent). NaN and inf
    stay as they are."""
    bits = s.float().contiguous().view(torch.int32)
    mant = bits & 0x7FFFFF
    up = (bits & 0x7F800000) + 0x800000
    finite = (bits & 0x7FFFFFFF) < 0x7F800000
    return torch.where(finite & (mant != 0), up, bits).view(torch.float32)


def indexer_k_quant_ref(
    k: torch.Tensor, fp8_dtype: torch.dtype, *, scale_fmt: str | None = "ue8m0"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise key rows as the cache stores them.

    k: ``[T, 128]`` any float dtype. fp8_dtype: torch.float8_e4m3fn or torch.float8_e4m3fnuz.
    scale_fmt: "ue8m0" (power-of-two scales, DeepSeek-V3.2) or None (plain).

    Returns ``(codes [T, 128] uint8, scales [T] float32)``: ``scales = max(1e-4, amax|row|) /
    INDEXER_FP8_MAX[kind]`` (rounded up to a power of two for "ue8m0"), ``codes`` the kind's bit
    patterns of ``row / scale`` (round to nearest even, saturating). A row with a NaN gets a NaN
    scale and NaN codes; a row with an infinity an infinite scale (its finite values code 0).
    """
    x = k.float()
    amax = x.abs().amax(dim=-1) if x.shape[-1] else torch.zeros(x.shape[:-1], device=x.device)
    amax = torch.where(torch.isnan(x).any(dim=-1), float("nan"), amax)
    # Correctly rounded float32 division (through float64: exact for a float32 quotient) on every
    # device: torch divides by a Python scalar as a multiply by its reciprocal on the GPU.
    scale = (amax.clamp(min=1e-4).double() / INDEXER_FP8_MAX[fp8_dtype]).float()
    scale = torch.where(torch.isnan(amax), float("nan"), scale)  # clamp's min would drop a NaN
    if scale_fmt == "ue8m0":
        scale = round_up_pow2(scale)
    m = torch.finfo(fp8_dtype).max  # the format's largest finite value (saturate, never overflow to NaN)
    codes = (x / scale[..., None]).clamp(-m, m).to(fp8_dtype).view(torch.uint8)
    return codes, scale


def indexer_value_offsets(block_size: int, shuffled: bool, *, device=None) -> torch.Tensor:
    """``[block_size, 128]`` int64: the byte offset, inside its block, of value ``d`` of the token at
    offset ``o``. Flat: ``128 o + d``. Shuffled (block_size a multiple of 16)::

        (o // 16) x 16 x 128  +  (d // 16) x 256  +  (o % 16) x 16  +  d % 16

    that is ``[block_size / 16, 128 / 16, 16, 16]`` (token tile, dim tile, token, dim): vLLM's
    ``indexer_k_quant_and_cache_triton`` / ``_fp8_quant_and_cache_write`` (the writers) and
    ``_unshuffle_indexer_k_values`` (its torch reader)."""
    o = torch.arange(block_size, device=device)[:, None]
    d = torch.arange(INDEX_HEAD_DIM, device=device)[None, :]
    if not shuffled:
        return o * INDEX_HEAD_DIM + d
    if block_size % SHUFFLE_TILE:
        raise ValueError(
            f"indexer_value_offsets: block_size: expected a multiple of 16 when shuffled, got {block_size}"
        )
    t = SHUFFLE_TILE
    return (o // t) * (t * INDEX_HEAD_DIM) + (d // t) * (t * t) + (o % t) * t + d % t


def _slot_bytes(index_cache: torch.Tensor, slots: torch.Tensor, shuffled: bool):
    """Flat byte indices into ``index_cache``'s blocks of every slot's values ``[n, 128]`` and scale
    ``[n, 4]`` (slots already in range), through the cache's block stride."""
    bs = index_cache.shape[1]
    blk, off = slots // bs, slots % bs
    base = blk * index_cache.stride(0)
    vals = base[:, None] + indexer_value_offsets(bs, shuffled, device=slots.device)[off]
    scale = base[:, None] + bs * INDEX_HEAD_DIM + 4 * off[:, None] + torch.arange(4, device=slots.device)
    return vals, scale


def _flat_bytes(index_cache: torch.Tensor) -> torch.Tensor:
    """All bytes from the first block's start to the last block's end, as a 1-D uint8 view (its
    blocks ``stride(0)`` bytes apart; within a block, contiguous)."""
    u8 = index_cache.view(torch.uint8)
    nb, bs = u8.shape[0], u8.shape[1]
    n = (nb - 1) * u8.stride(0) + bs * INDEX_ROW_BYTES if nb and bs else 0
    return u8.as_strided((n,), (1,))


def indexer_k_cache_write_ref(
    k: torch.Tensor,
    index_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    fp8_dtype: torch.dtype,
    scale_fmt: str | None = "ue8m0",
    shuffled: bool,
) -> None:
    """Quantise ``k [T, 128]`` (:func:`indexer_k_quant_ref`) and write token t at slot
    ``slot_mapping[t]`` (``[S <= T]`` int; slot = block x block_size + offset) of ``index_cache``
    (uint8 or float8 ``[num_blocks, block_size, 132]``, each block's bytes contiguous), in place.
    Negative slots, slots >= num_blocks x block_size and tokens t >= S are not written; no other
    byte changes."""
    S = slot_mapping.shape[0]
    nb, bs = index_cache.shape[0], index_cache.shape[1]
    slots = slot_mapping.long().to(index_cache.device)
    keep = ((slots >= 0) & (slots < nb * bs)).nonzero().flatten()
    if keep.numel() == 0:
        return
    codes, scales = indexer_k_quant_ref(k[:S][keep.to(k.device)], fp8_dtype, scale_fmt=scale_fmt)
    vals, sc = _slot_bytes(index_cache, slots[keep], shuffled)
    flat = _flat_bytes(index_cache)
    flat[vals.flatten()] = codes.to(flat.device).flatten()
    flat[sc.flatten()] = scales.to(flat.device).contiguous().view(torch.uint8).flatten()


def index_cache_keys(
    index_cache: torch.Tensor,
    slots: torch.Tensor,
    *,
    fp8_dtype: torch.dtype,
    shuffled: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Read keys back from the cache: what a top-k scorer multiplies its queries with.

    index_cache: uint8 (or float8) ``[num_blocks, block_size, 132]`` in the layout above.
    slots: ``[n]`` int, slot = block x block_size + offset. fp8_dtype: the values' kind.
    shuffled: the values' layout (vLLM's ROCm rule: ``block_size > 1``).

    Returns ``(keys [n, 128] float32 = values x scale, values [n, 128] fp8_dtype, scales [n]
    float32)``. A slot outside ``[0, num_blocks x block_size)`` reads nothing: its key and scale
    are NaN and its values the kind's NaN code.
    """
    nb, bs = index_cache.shape[0], index_cache.shape[1]
    dev = index_cache.device
    s = slots.long().to(dev).reshape(-1)
    ok = (s >= 0) & (s < nb * bs)
    vals, sc = _slot_bytes(index_cache, torch.where(ok, s, 0), shuffled)
    n = s.shape[0]
    if nb * bs:
        flat = _flat_bytes(index_cache)
        codes, sbytes = flat[vals], flat[sc]
    else:
        codes = torch.zeros(n, INDEX_HEAD_DIM, dtype=torch.uint8, device=dev)
        sbytes = torch.zeros(n, 4, dtype=torch.uint8, device=dev)
    nan_code = 0x80 if fp8_dtype == torch.float8_e4m3fnuz else 0x7F
    codes = torch.where(ok[:, None], codes, nan_code)
    scales = torch.where(ok, sbytes.contiguous().view(torch.float32).reshape(n), float("nan"))
    values = codes.contiguous().view(fp8_dtype)
    return values.float() * scales[:, None], values, scales
