"""vLLM's fused RoPE + MLA KV-cache op, served by ``rocm_mla.fused_rope_mla_kv_write`` for
ROCM_MLA layers (no patch to vLLM).

How vLLM (0.33 and 0.34) reaches it (paths relative to the ``vllm`` package):

* The compile pass ``MLARoPEKVCacheCatFusionPass``
  (compilation/passes/fusion/mla_rope_kvcache_cat_fusion.py) matches the model's RoPE of
  ``q[..., 128:]`` / ``k_pe`` followed by ``torch.ops.vllm.unified_mla_kv_cache_update`` for every
  MLA layer, and replaces the pair with ``torch.ops.vllm.fused_rope_unified_mla_kv_cache_update(
  positions, q_pe!, k_pe!, kv_c, cos_sin_cache, is_neox, kv_cache_dtype, kv_cache_scale,
  layer_name)``. The pass runs when ``compilation_config.pass_config.fuse_rope_kvcache_cat_mla``
  is on (CUDA and ROCm only; default on at -O2/-O3 only when the KV update is not a splitting op,
  i.e. with ``use_inductor_graph_partition``: config/vllm.py ``enable_rope_kvcache_mla_fusion``).
* That op is a Python custom op in the ``vllm`` namespace, registered by the same module
  (``direct_register_custom_op``) on the platform's dispatch key ("CUDA", ROCm included); its
  kernel ``fused_rope_unified_mla_kv_cache_update_impl`` calls vLLM's compiled
  ``concat_and_cache_mla_rope_fused`` on ``kv_cache.squeeze(1)`` -- with no backend dispatch.

What :func:`install` does: after importing vLLM's fusion module (so that the op and vLLM's
kernel exist; importing it later would not re-register, Python caches the module), it registers
:func:`fused_rope_unified_mla_kv_cache_update` as the op's kernel on the same dispatch key from
a ``torch.library.Library("vllm", "IMPL")`` that this module keeps alive. The dispatcher runs
the newest registration, eagerly and in compiled graphs (Inductor calls the op through the
dispatcher), and restores vLLM's kernel if the library is destroyed (:func:`uninstall`).

Per call, for the layer the op names:

* ROCM_MLA layer (its ``impl`` is a ``RocmMLAImpl``): one ``rocm_mla.fused_rope_mla_kv_write``
  launch on the layer's cache and slot mapping -- q_pe and k_pe rotated in place, ``[kv_c |
  rope(k_pe)]`` written (fp8: the uint8 cache viewed as ``current_platform.fp8_dtype()``, as
  ``MLAAttention.forward_impl`` views it for the decode, values ``x / k_scale``). The cache is
  used as the layer holds it (``[num_blocks, block_size, 576]``: ``bind_kv_cache`` already
  squeezed the head dim); vLLM's kernel squeezes dim 1 again, which at block size 1 is the
  block dim.
  Without a slot mapping (profile and dummy runs) q_pe/k_pe are still rotated (vLLM's kernel
  then rotates nothing); with prefill context parallelism or a HiSparse cache (which vLLM's
  fused kernel ignores) q_pe/k_pe are rotated by the same kernel and the cache is written through
  the layer's own ``update_kv_cache`` (its PCP gather, then ``do_kv_cache_update``).
* any other layer: vLLM's own kernel function, unchanged.
"""

from __future__ import annotations

import inspect
import logging

import torch

from rocm_mla.mla_dims import KV_ROW_DIM

OP_NAME = "fused_rope_unified_mla_kv_cache_update"
FUSION_MODULE = "vllm.compilation.passes.fusion.mla_rope_kvcache_cat_fusion"

logger = logging.getLogger(__name__)

_lib: torch.library.Library | None = None  # holds our kernel registrations alive
_keys: set[str] = set()
_vllm_kernel = None  # vLLM's Python kernel of the op, for layers of other backends
_last_error: str | None = None
# Counts per path, for tests and debugging: {"rocm_mla": n, "rocm_mla_unfused_write": n, "vllm": n}
calls: dict[str, int] = {"rocm_mla": 0, "rocm_mla_unfused_write": 0, "vllm": 0}


def installed() -> bool:
    """True when this module's kernel is registered (on at least one dispatch key)."""
    return _lib is not None and bool(_keys)


def install(dispatch_keys: tuple[str, ...] | None = None) -> bool:
    """Register the override (idempotent). Returns True when it is in place.

    ``dispatch_keys``: default the platform's key (``current_platform.dispatch_key``: "CUDA" on
    CUDA and ROCm); tests on a CPU-only torch add "CPU". With the default, nothing is registered
    (False) on a platform that is not CUDA-alike (vLLM disables the pass there). False too, with
    a warning, when vLLM's fusion module cannot be imported (e.g. vLLM's compiled ops missing):
    vLLM then keeps its own kernel. :func:`last_error` says why.
    """
    global _lib, _vllm_kernel, _last_error
    try:
        from vllm.platforms import current_platform

        if dispatch_keys is None:
            if not current_platform.is_cuda_alike():
                _last_error = f"platform {current_platform.device_name!r} is not CUDA or ROCm"
                return False
            dispatch_keys = (current_platform.dispatch_key,)
        import importlib

        fusion = importlib.import_module(FUSION_MODULE)  # defines the op + vLLM's kernel first
    except Exception as e:  # noqa: BLE001 - a plugin must not break vLLM's start-up
        err = f"{type(e).__name__}: {e}"
        if err != _last_error:  # once per cause and process (register() may run several times)
            logger.warning("rocm_mla: vLLM's fused RoPE + MLA KV-cache op keeps vLLM's kernel (%s)", err)
        _last_error = err
        return installed()
    _last_error = None
    _vllm_kernel = fusion.fused_rope_unified_mla_kv_cache_update_impl
    if _lib is None:
        _lib = torch.library.Library("vllm", "IMPL")
    kw = {"allow_override": True} if "allow_override" in inspect.signature(_lib.impl).parameters else {}
    for key in dispatch_keys:
        if key not in _keys:
            _lib.impl(OP_NAME, fused_rope_unified_mla_kv_cache_update, key, **kw)
            _keys.add(key)
    return True


def uninstall() -> None:
    """Drop the override: the dispatcher goes back to vLLM's kernel (tests)."""
    global _lib
    if _lib is not None:
        _lib._destroy()
    _lib = None
    _keys.clear()


def last_error() -> str | None:
    """Why the last :func:`install` did nothing (None when it succeeded)."""
    return _last_error


def fused_rope_unified_mla_kv_cache_update(
    positions: torch.Tensor,
    q_pe: torch.Tensor,
    k_pe: torch.Tensor,
    kv_c: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    kv_cache_dtype: str,
    kv_cache_scale: torch.Tensor,
    layer_name,
) -> torch.Tensor:
    """The op's kernel (vLLM's schema; see the module docstring). Returns vLLM's dummy
    dependency tensor (empty)."""
    from vllm.model_executor.layers.attention.attention import get_attention_context
    from vllm.utils.torch_utils import _resolve_layer_name

    from .backend import RocmMLAImpl, cache_for_writers

    name = _resolve_layer_name(layer_name)
    attn_metadata, layer, kv_cache, slot_mapping = get_attention_context(name)
    if not isinstance(getattr(layer, "impl", None), RocmMLAImpl):
        calls["vllm"] += 1
        return _vllm_kernel(
            positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, kv_cache_dtype, kv_cache_scale, layer_name
        )

    from rocm_mla.ops import fused_rope_mla_kv_write

    layer.prepare_kv_cache_update(attn_metadata)
    T = q_pe.shape[0]
    direct = slot_mapping is not None and kv_cache.numel() > 0 and not layer.use_pcp and layer.hisparse_cache is None
    if direct:
        calls["rocm_mla"] += 1
        slots = slot_mapping.flatten()[:T]
        cache, kind = cache_for_writers(kv_cache, kv_cache_dtype, kv_cache_scale)
        fused_rope_mla_kv_write(positions, q_pe, k_pe, kv_c, cos_sin_cache, cache, slots, is_neox=is_neox, **kind)
    else:
        calls["rocm_mla_unfused_write"] += 1
        # Rotate only: no slot (an empty view), a cache with no rows (nothing is written).
        fused_rope_mla_kv_write(
            positions,
            q_pe,
            k_pe,
            kv_c,
            cos_sin_cache,
            q_pe.new_empty((0, 1, KV_ROW_DIM)),
            positions[:0],
            is_neox=is_neox,
            kv_cache_dtype="auto",
        )
        if slot_mapping is not None:
            layer.update_kv_cache(
                kv_c, k_pe.unsqueeze(1), kv_cache, slot_mapping, attn_metadata, kv_cache_dtype, kv_cache_scale
            )
    return torch.empty(0, device=kv_c.device, dtype=kv_c.dtype)
