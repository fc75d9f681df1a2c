"""What ``rocm-mla doctor`` checks of the vLLM side, run in a child process (importing vLLM is slow
and picks its platform once per process): ``python -m rocm_mla.tools.vllm_probe`` prints one JSON
object.

Keys: ``installed`` (and ``error`` when vLLM does not import), ``version``, ``supported`` (one of
``rocm_mla.vllm.SUPPORTED_VLLM``), ``platform`` (vLLM's current platform), ``entry_point`` (the
``vllm.general_plugins`` entry point named ``rocm_mla`` and its target), ``plugins_allowed``
(``VLLM_PLUGINS`` unset or listing it), ``registered`` (``--attention-backend`` names registered
by the plugin and the classes they point at), ``selectable`` (on ROCm: vLLM's own
``get_attn_backend_cls`` accepts ROCM_MLA for a 576-wide latent head; elsewhere None with the
reason), ``fused_rope_kv`` (rocm-mla's kernel registered for vLLM's fused RoPE + KV-cache op, or
why not; vLLM runs it when its ``fuse_rope_kvcache_cat_mla`` pass is on), ``sparse_layers`` (on
ROCm: rocm-mla's DeepSeek-V3.2/GLM-5 attention class in place), ``v4_layers`` (on ROCm: the
models, DeepSeek-V4 and V4.1, whose attention class is rocm-mla's).
"""

from __future__ import annotations

import json
import os
import sys


def probe() -> dict:
    from importlib import metadata

    from rocm_mla.vllm import BACKEND_CLASS, PLUGIN_NAME, SPARSE_BACKEND_CLASS, SUPPORTED_VLLM

    out: dict = {"installed": False}
    try:
        import vllm
    except Exception as e:  # not installed, or broken
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    out.update(installed=True, version=vllm.__version__, supported=vllm.__version__ in SUPPORTED_VLLM)
    eps = [e for e in metadata.entry_points(group="vllm.general_plugins") if e.name == PLUGIN_NAME]
    out["entry_point"] = eps[0].value if eps else None
    allow = os.environ.get("VLLM_PLUGINS")
    out["plugins_allowed"] = allow is None or PLUGIN_NAME in [p.strip() for p in allow.split(",")]
    try:
        from vllm.platforms import current_platform

        out["platform"] = type(current_platform).__name__
        from rocm_mla.vllm import register

        register()
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        out["registered"] = {n: AttentionBackendEnum[n].get_path() for n in ("ROCM_MLA", "ROCM_MLA_SPARSE", "CUSTOM")}
        out["registered_ok"] = out["registered"]["ROCM_MLA"] == BACKEND_CLASS and (
            out["registered"]["ROCM_MLA_SPARSE"] == SPARSE_BACKEND_CLASS
        )
    except Exception as e:
        out["registered_ok"] = False
        out["register_error"] = f"{type(e).__name__}: {e}"
        return out
    if current_platform.is_rocm():
        try:
            import torch
            from vllm.v1.attention.selector import AttentionSelectorConfig

            sel = AttentionSelectorConfig(
                head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64, use_mla=True
            )
            path = current_platform.get_attn_backend_cls(AttentionBackendEnum["ROCM_MLA"], sel, num_heads=16)
            out["selectable"] = path == BACKEND_CLASS
            if not out["selectable"]:
                out["selectable_reason"] = f"vLLM chose {path}"
        except Exception as e:
            out["selectable"] = False
            out["selectable_reason"] = f"{type(e).__name__}: {e}"
        from rocm_mla.vllm import sparse_layer

        out["sparse_layers"] = sparse_layer.installed_class() is not None
        from rocm_mla.vllm import v4_layer

        out["v4_layers"] = v4_layer.installed_models()
    else:
        out["selectable"] = None
        out["selectable_reason"] = f"vLLM's platform here is {out['platform']}, not ROCm"
        out["sparse_layers"] = None
        out["v4_layers"] = None
    from rocm_mla.vllm import fused_rope_kv_op

    out["fused_rope_kv"] = fused_rope_kv_op.installed()
    if not out["fused_rope_kv"]:
        out["fused_rope_kv_reason"] = fused_rope_kv_op.last_error()
    return out


if __name__ == "__main__":
    print(json.dumps(probe()))
    sys.exit(0)
