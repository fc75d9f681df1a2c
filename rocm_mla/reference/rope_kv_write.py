"""Float32 reference of fused_rope_mla_kv_write and concat_and_cache_mla.

Semantics, bad indices (no wrap-around; NaN rotations for a position outside the cos/sin cache, a
slot outside the cache skipped like -1) and FP8 storage: the ``fused_rope_mla_kv_write`` docstring
(rocm_mla/ops/rope_kv_write.py). Everything is computed in float32 from the inputs as given and
rounded once on store -- the kernels do the same; vLLM's unfused path rounds after every torch op
in the model dtype.
"""

from __future__ import annotations

import math

import torch

from ..mla_dims import QK_ROPE_HEAD_DIM

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0}


def rope_cos_sin_cache(
    max_pos: int,
    *,
    rot_dim: int = QK_ROPE_HEAD_DIM,
    base: float = 10000.0,
    mscale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The RoPE cos/sin table ``cos_sin_cache [max_pos, rot_dim]``, vLLM's layout: row p is
    ``cat(cos(p * inv_freq), sin(p * inv_freq)) * mscale`` -- the first half (``rot_dim / 2``
    columns) cos, the second half sin -- with ``inv_freq[i] = 1 / base ** (2i / rot_dim)``
    (vLLM's ``RotaryEmbedding``, DeepSeek's base 10000).

    mscale: a factor folded into the table (YaRN's mscale; 1 = none, and then no multiply).
    compute_dtype: the dtype of the frequencies, angles, cos/sin and the mscale multiply (float32
    as vLLM; float64 for a table closer to exact); the result is then cast to ``dtype``.
    device: where it is computed and kept (None: torch's default device).
    Raises ValueError naming the argument for max_pos < 0, an odd or non-positive rot_dim, or a
    base / mscale that is not a finite number > 0.
    """

    def real_above_0(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0

    def int_at_least(x, lo: int) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= lo

    for arg, v, ok, want in (
        ("max_pos", max_pos, int_at_least(max_pos, 0), "an int >= 0"),
        ("rot_dim", rot_dim, int_at_least(rot_dim, 2) and rot_dim % 2 == 0, "an even int > 0"),
        ("base", base, real_above_0(base), "a finite number > 0"),
        ("mscale", mscale, real_above_0(mscale), "a finite number > 0"),
    ):
        if not ok:
            raise ValueError(f"rope_cos_sin_cache: {arg}: expected {want}, got {v!r}")
    exponent = torch.arange(0, rot_dim, 2, dtype=compute_dtype, device=device) / rot_dim
    inv_freq = 1.0 / (base**exponent)
    freqs = torch.outer(torch.arange(max_pos, dtype=compute_dtype, device=device), inv_freq)
    cs = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    if mscale != 1.0:
        cs = cs * mscale
    return cs.to(dtype)


def rope_ref(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor, *, is_neox: bool) -> torch.Tensor:
    """Rotate ``x [T, ..., 64]`` by the angles of ``positions [T]``; returns float32, x's shape.

    ``cos_sin_cache [max_pos, 64]`` holds ``cat(cos[32], sin[32])`` per position (vLLM's layout).
    A position outside ``[0, max_pos)`` reads nothing (no wrap-around of -1) and rotates that
    token with NaN: its result is NaN.
    """
    pos = positions.long()
    ok = (pos >= 0) & (pos < cos_sin_cache.shape[0])
    if cos_sin_cache.shape[0]:
        cs = cos_sin_cache.float()[torch.where(ok, pos, 0)]  # [T, 64]
    else:  # an empty cache: every position is outside
        cs = torch.zeros(pos.shape[0], cos_sin_cache.shape[1], device=cos_sin_cache.device)
    cs = torch.where(ok[:, None], cs, float("nan"))
    cos, sin = cs[:, :32], cs[:, 32:]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (32,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    xf = x.float()
    if is_neox:
        a, b = xf[..., :32], xf[..., 32:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    a, b = xf[..., 0::2], xf[..., 1::2]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)


def quantize_fp8_ref(x: torch.Tensor, k_scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """``x / k_scale`` saturated to ``fp8_dtype``'s largest finite value, as ``fp8_dtype``. k_scale:
    one value (``[]`` or ``[1]``), or any shape that broadcasts against x (a scale per row).

    torch's own conversion turns out-of-range values into NaN (the formats have no inf): the clamp
    is what makes a finite input stay finite.
    """
    m = FP8_MAX[fp8_dtype]
    return (x.float() / k_scale.float()).clamp(-m, m).to(fp8_dtype)


def cache_rows_ref(kv_c: torch.Tensor, k_pe_rotated: torch.Tensor) -> torch.Tensor:
    """The 576-wide cache rows ``[kv_c | k_pe]`` of every token, float32 ``[T, 576]``."""
    return torch.cat((kv_c.float(), k_pe_rotated.float().reshape(kv_c.shape[0], QK_ROPE_HEAD_DIM)), dim=-1)


def write_cache_ref(
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    rows: torch.Tensor,
    *,
    fp8_dtype: torch.dtype | None = None,
    k_scale: torch.Tensor | None = None,
) -> None:
    """Store ``rows [T, 576]`` (float32) at ``slot_mapping [S <= T]`` of ``kv_cache``, in place.

    kv_cache: ``[num_blocks, block_size, 576]`` of its own dtype (any strides); with ``fp8_dtype``,
    a tensor of that dtype (or a uint8 view of one) that gets ``quantize_fp8_ref(row, k_scale)``.
    Negative slots, slots >= num_blocks x block_size (outside the cache) and tokens t >= S are
    not written; nothing else in the cache is touched.
    """
    S = slot_mapping.shape[0]
    slots = slot_mapping.long()
    keep = ((slots >= 0) & (slots < kv_cache.shape[0] * kv_cache.shape[1])).nonzero().flatten()
    if keep.numel() == 0:
        return
    slots = slots[keep]
    bs = kv_cache.shape[1]
    blk, off = slots // bs, slots % bs
    sel = rows[:S][keep]
    if fp8_dtype is not None:
        assert k_scale is not None
        # Scatter bytes: indexing ops lack float8 kernels in some torch builds (CUDA index_put).
        kv_cache.view(torch.uint8)[blk, off] = quantize_fp8_ref(sel, k_scale, fp8_dtype).view(torch.uint8)
    else:
        kv_cache[blk, off] = sel.to(kv_cache.dtype)


def fused_rope_mla_kv_write_ref(
    positions: torch.Tensor,
    q_pe: torch.Tensor,
    k_pe: torch.Tensor,
    kv_c: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op's results, in float32, without touching any input.

    positions ``[T]``; q_pe ``[T, N, 64]``; k_pe ``[T, 1, 64]`` or ``[T, 64]``; kv_c ``[T, 512]``;
    cos_sin_cache ``[max_pos, 64]``. Returns ``(q_pe rotated [T, N, 64], k_pe rotated (k_pe's
    shape), cache rows [T, 576])``; store the rows with ``write_cache_ref``.
    """
    q_rot = rope_ref(positions, q_pe, cos_sin_cache, is_neox=is_neox)
    k_rot = rope_ref(positions, k_pe, cos_sin_cache, is_neox=is_neox)
    return q_rot, k_rot, cache_rows_ref(kv_c, k_rot)
