"""The ROCM_MLA backends and vLLM's MLA head geometries (qk_nope_head_dim, qk_rope_head_dim,
v_head_dim): the MLA prefill backend declares every one its kernels run (the four vLLM's FLASH_ATTN
MLA prefill accepts), the attention backend refuses a latent row other than 512 + 64 with a reason,
and a GLM-4.x-Lite-shaped layer step (192/64/256) runs through the simulated gfx942 ROCm platform.

Same set-up as test_vllm_backend.py (vLLM 0.34.0 or 0.33.0, simulated gfx942 platform, Triton interpreter).
"""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, HAS_GPU
from vllm_harness import require_vllm

require_vllm()

from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm_harness.layer_step import LayerStep, Request, use_simulated_gfx942_platform  # noqa: E402

use_simulated_gfx942_platform()

import rocm_mla.vllm as rocm_vllm  # noqa: E402

rocm_vllm.register()

from vllm.v1.attention.backends.mla.prefill.base import MLADimensions  # noqa: E402
from vllm.v1.attention.backends.mla.prefill.flash_attn import FlashAttnPrefillBackend  # noqa: E402

from rocm_mla.cases import raise_on  # noqa: E402
from rocm_mla.mla_dims import PREFILL_GEOMETRIES  # noqa: E402
from rocm_mla.vllm.backend import RocmMLABackend  # noqa: E402
from rocm_mla.vllm.prefill import RocmMLAPrefillBackend  # noqa: E402


def _dims(p, r, v) -> MLADimensions:
    return MLADimensions(qk_nope_head_dim=p, qk_rope_head_dim=r, v_head_dim=v)


def _prefill_reasons(dims: MLADimensions) -> list[str]:
    from vllm.v1.attention.backends.mla.prefill.selector import MLAPrefillSelectorConfig

    sel = MLAPrefillSelectorConfig(dtype=torch.bfloat16, mla_dimensions=dims)
    return RocmMLAPrefillBackend.validate_configuration(None, sel)


def test_prefill_backend_declares_every_geometry_vllm_serves():
    """Exactly the four geometries of vLLM's FLASH_ATTN MLA prefill, each valid; another is
    refused with vLLM's reason naming the supported ones."""
    ours = {
        (d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim) for d in RocmMLAPrefillBackend.supported_mla_dimensions
    }
    assert ours == set(PREFILL_GEOMETRIES.values())
    for p, r, v in ours:
        assert FlashAttnPrefillBackend.supports_mla_dimensions(_dims(p, r, v))
        assert _prefill_reasons(_dims(p, r, v)) == []
    (reason,) = _prefill_reasons(_dims(96, 64, 128))
    assert "Model does not have supported MLA dimensions" in reason and "qk_nope_head_dim=192" in reason


def test_attention_backend_refuses_a_latent_row_other_than_576():
    """256/0/256 (no RoPE part) has a 512-wide latent row: refused by the attention backend with a
    reason that names the row; 576 (DeepSeek, GLM-4.x-Lite, 64/64/128) is taken."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    why = RocmMLABackend.supports_combination(512, torch.bfloat16, "auto", 16, True, False, False, False, None)
    assert "latent head size 512" in why and "512 + 64 = 576" in why and "mla_prefill_backend=ROCM_MLA" in why
    assert RocmMLABackend.supports_combination(576, torch.bfloat16, "auto", 16, True, False, False, False, None) is None
    sel = AttentionSelectorConfig(
        head_size=512, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=True
    )
    with pytest.raises(ValueError, match="latent head size 512"):
        current_platform.get_attn_backend_cls(AttentionBackendEnum["ROCM_MLA"], sel, num_heads=16)


# Decodes first (vLLM's order), then prefills with cached context split over several chunks
# (workspace 48 rows), one without context.
GLM_BATCH = [Request(21, 1), Request(6, 1), Request(37, 5), Request(0, 9), Request(60, 3)]


@pytest.mark.parametrize("geo", ["glm-lite", "nope64"])
def test_layer_step_other_geometries(geo):
    """One layer step of a GLM-4.x-Lite-shaped (192/64/256) or 64/64/128 layer through vLLM's
    MLAAttention with ROCM_MLA (decode, KV write, prefill, chunked context), against the float32
    reference; the layer's prefill backend is ROCM_MLA's, selected for that geometry."""
    dtype = torch.bfloat16 if HAS_GPU else torch.float32
    step = LayerStep(
        RocmMLABackend,
        GLM_BATCH,
        num_heads=4,
        dtype=dtype,
        device=DEVICE,
        block_size=16,
        workspace_rows=48,
        dims=PREFILL_GEOMETRIES[geo],
    )
    # vLLM's own selection on the simulated gfx942 platform, for this model config: the attention
    # backend (latent head 576) and the layer's MLA prefill backend (this geometry).
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    with set_current_vllm_config(step.vllm_config):
        assert get_attn_backend(576, dtype, "auto", use_mla=True, num_heads=4) is RocmMLABackend
    assert isinstance(step.layer.prefill_backend, RocmMLAPrefillBackend)
    assert step.metadata.num_decodes == 2 and len(step.metadata.prefill.chunked_context.chunks) >= 2
    out = step.run()
    assert out.shape == (sum(r.query for r in GLM_BATCH), 4 * PREFILL_GEOMETRIES[geo][2])
    raise_on(step.mismatch())


def test_prefill_backend_without_rope_part():
    """256/0/256 through the MLA prefill backend's own entry points (vLLM's common forward_mha
    hands it k = cat(k_nope, k_pe) with R = 0, i.e. k_nope itself): no rope view is read."""
    from types import SimpleNamespace

    from rocm_mla.cases import prefill

    P, R, V = PREFILL_GEOMETRIES["norope"]
    c = prefill.make_inputs(prefill.PrefillShape((7, 12), 2, dims=(P, R, V)), dtype=torch.float32, device=DEVICE)
    backend = RocmMLAPrefillBackend(
        num_heads=2,
        scale=c.sm_scale,
        kv_lora_rank=512,
        qk_nope_head_dim=P,
        qk_rope_head_dim=R,
        v_head_dim=V,
        vllm_config=None,
    )
    backend._prefill_metadata = SimpleNamespace(query_start_loc=c.cu_seqlens_q, max_query_len=12)
    out, lse = backend.run_prefill_new_tokens(c.q, c.k_nope, c.v, return_softmax_lse=True, out=c.out)
    assert out is c.out
    c.check(out, lse)
