"""DeepSeek MLA's fixed geometry and the kv_cache_dtype names, in one place for every layer.

The kernels are built for this geometry (docs/ARCHITECTURE.md §1); ops, references and the vLLM backend check
against these names instead of keeping their own copies. A leaf module: imports torch only, so
``rocm_mla.reference`` (which imports nothing else of the package) may use it too.

Latent cache row (decode, KV write): ``[kv_c (KV_LORA_RANK) | k_pe (QK_ROPE_HEAD_DIM)]`` =
``KV_ROW_DIM`` = 576 columns. Prefill (after kv_b_proj): q/k ``QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM``
= 192 per head, v ``V_HEAD_DIM`` = 128 for DeepSeek; the other head geometries vLLM serves are
``PREFILL_GEOMETRIES``.
"""

from __future__ import annotations

import torch

KV_LORA_RANK = 512  # kv_c width: the decode's V and the nope part of its K
QK_ROPE_HEAD_DIM = 64  # rotary part of q and k
KV_ROW_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576: one latent cache row
QK_NOPE_HEAD_DIM = 128  # prefill: the nope part of q / k per head
V_HEAD_DIM = 128  # prefill: v per head
PREFILL_DIMS = (QK_NOPE_HEAD_DIM, QK_ROPE_HEAD_DIM, V_HEAD_DIM)  # (P, R, V) of DeepSeek-V2/V3/R1, Kimi-K2
# Every MLA head geometry (qk_nope_head_dim, qk_rope_head_dim, v_head_dim) vLLM 0.33 and 0.34 serve (its
# FLASH_ATTN MLA prefill's supports_mla_dimensions), by name; the prefill runs each of them. The
# decode and the KV write run those whose latent row is KV_ROW_DIM (kv_lora_rank 512 + rope 64).
PREFILL_GEOMETRIES: dict[str, tuple[int, int, int]] = {
    "deepseek": PREFILL_DIMS,  # DeepSeek-V2/V3/R1, Kimi-K2
    "glm-lite": (192, 64, 256),  # GLM-4.x-Lite (Glm4MoeLiteAttention) and GLM-5.x
    "nope64": (64, 64, 128),
    "norope": (256, 0, 256),  # no RoPE part (GLM5Next's layout): k_pe absent
}

# kv_cache_dtype names of an FP8 E4M3 cache -> the torch dtype they name, or None for "the
# platform's kind" (configs/platform.json fp8_dtype: e4m3fnuz on gfx942, e4m3fn elsewhere; vLLM's
# current_platform.fp8_dtype()). A uint8 cache holds that kind; a float8 cache must match a named one.
FP8_KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "fp8": None,
    "fp8_e4m3": None,
    "fp8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e4m3fnuz": torch.float8_e4m3fnuz,
}
# The names vLLM itself passes for an e4m3 cache (its CacheDType): the platform's kind.
VLLM_FP8_KV_CACHE_DTYPES = tuple(n for n, dt in FP8_KV_CACHE_DTYPES.items() if dt is None)
# The float8 dtypes an FP8 cache tensor may have.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)

__all__ = [
    "KV_LORA_RANK",
    "QK_ROPE_HEAD_DIM",
    "KV_ROW_DIM",
    "QK_NOPE_HEAD_DIM",
    "V_HEAD_DIM",
    "PREFILL_DIMS",
    "PREFILL_GEOMETRIES",
    "FP8_KV_CACHE_DTYPES",
    "VLLM_FP8_KV_CACHE_DTYPES",
    "FP8_DTYPES",
]
