"""``ROCM_MLA`` in vLLM's MLA prefill registry (vllm/v1/attention/backends/mla/prefill/).

vLLM's common prefill (``MLACommonBaseImpl.forward_mha`` in
vllm/model_executor/layers/attention/mla_attention.py) up-projects the new tokens, concatenates
``k = cat(k_nope, k_pe.expand(N))`` itself, and then calls the layer's prefill backend with
``(q, k, v)``. This backend runs that call on :func:`rocm_mla.mla_prefill`: ``k`` is read as two
strided views (``k[..., :P]`` and ``k[..., P:]``; no rope view when R = 0), ``v`` (a strided slice of
the kv_b_proj output) is not padded to P + R, and the output is ``[T, N, V]`` written in place when
``out`` is given — so FlashAttention's pad-v and the ``[..., :128]`` slice copy disappear. The concatenation
of ``k`` stays: it happens in vLLM before this backend is called. The ROCM_MLA attention backend
(backend.py) therefore does not route its own prefill through this API; it overrides
``forward_mha`` and feeds ``k_nope``, ``k_pe`` and ``v`` to the kernel with no concatenation at all.

Select it for any MLA decode backend with ``-ac.mla_prefill_backend=ROCM_MLA`` (vLLM honours an
explicit MLA prefill backend on GPU platforms: ``get_mla_prefill_backend`` in
vllm/v1/attention/backends/mla/prefill/selector.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from vllm.v1.attention.backends.mla.prefill.base import MLADimensions, MLAPrefillBackend

from rocm_mla.mla_dims import PREFILL_GEOMETRIES
from rocm_mla.ops import PrefillPlan, mla_prefill, plan_prefill_for
from rocm_mla.vllm import PREFILL_BACKEND_NAME
from rocm_mla.vllm.step_plans import kept_plan

if TYPE_CHECKING:
    from vllm.model_executor.layers.attention.mla_attention import MLACommonPrefillMetadata


def plan_on(holder, tensors: tuple, **knobs) -> PrefillPlan:
    """The plan of an ``mla_prefill`` call with ``tensors`` (its six positional arguments) that
    ``holder`` carries: vLLM's prefill metadata (the new tokens' causal pass) or one of its context
    chunks (that chunk's pass). Its ``rocm_mla_plan`` when that matches the tensors (the metadata
    builder's, or the one the step's first layer left); else one planned from them
    (``plan_prefill_for`` with ``knobs``), left there for the step's other layers."""
    return kept_plan(holder, lambda plan: plan.matches(*tensors), lambda: plan_prefill_for(*tensors, **knobs))


class RocmMLAPrefillBackend(MLAPrefillBackend):
    """MLA prefill on :func:`rocm_mla.mla_prefill`: varlen, Dqk = P + R and Dv = V natively (no
    padding), k/v read through their strides, output and LSE written in place.

    Head geometries: every one vLLM's FLASH_ATTN MLA prefill accepts, each tested here
    (rocm_mla.mla_dims.PREFILL_GEOMETRIES): (128, 64, 128) DeepSeek-V2/V3/R1 and Kimi-K2, (192, 64,
    256) GLM-4.x-Lite and the DeepSeek-V3.2 layout, (64, 64, 128), (256, 0, 256) without RoPE."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    # vLLM's base class checks a model's dims against this list and names it in its reason.
    supported_mla_dimensions: ClassVar[list[MLADimensions]] = [
        MLADimensions(qk_nope_head_dim=p, qk_rope_head_dim=r, v_head_dim=v) for p, r, v in PREFILL_GEOMETRIES.values()
    ]

    @staticmethod
    def get_name() -> str:
        return PREFILL_BACKEND_NAME

    def supports_out(self) -> bool:
        # Every call honours `out` ([T, N, v_head_dim], any strides) and returns it.
        return True

    def run_prefill_new_tokens(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        return_softmax_lse: bool,
        out: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Causal attention of the new tokens over themselves. ``q``/``k`` ``[T, N, P + R]``,
        ``v`` ``[T, N, V]``; returns out ``[T, N, V]`` (and lse ``[N, T]`` natural log). The plan
        is made by the step's first layer and left on the prefill metadata for the others
        (``plan_on``)."""
        if output_scale is not None:
            raise NotImplementedError(
                "RocmMLAPrefillBackend does not fuse output quantisation (supports_quant_output is False)"
            )
        m: MLACommonPrefillMetadata = self._prefill_metadata
        k_nope, k_pe = self._split_k(k)
        tensors = (q, k_nope, k_pe, v, m.query_start_loc, m.query_start_loc)
        plan = plan_on(m, tensors, causal=True, max_seqlen_q=m.max_query_len, max_seqlen_k=m.max_query_len)
        out, lse = mla_prefill(*tensors, sm_scale=self.scale, plan=plan, out=out)
        return (out, lse) if return_softmax_lse else out

    def run_prefill_context_chunk(
        self,
        chunk: MLACommonPrefillMetadata.ContextChunk,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Non-causal attention of the chunk's queries over one gathered context chunk (its plan
        left on the chunk's metadata by the step's first layer: ``plan_on``)."""
        k_nope, k_pe = self._split_k(k)
        tensors = (q, k_nope, k_pe, v, chunk.query_start_loc, chunk.cu_seq_lens)
        plan = plan_on(chunk, tensors, causal=False, max_seqlen_q=chunk.max_query_len, max_seqlen_k=chunk.max_seq_len)
        return mla_prefill(*tensors, sm_scale=self.scale, plan=plan, out=out)

    def _split_k(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """vLLM's ``k = cat(k_nope, k_pe.expand(N))`` ``[T, N, P + R]`` as the two strided views the
        kernel reads (the rope view is a real per-head tensor here); no rope view when R = 0."""
        P = self.qk_nope_head_dim
        return k[..., :P], (k[..., P:] if self.qk_rope_head_dim else None)
