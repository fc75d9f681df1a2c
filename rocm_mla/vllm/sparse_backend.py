"""ROCM_MLA_SPARSE: vLLM's sparse MLA attention (DeepSeek-V3.2, GLM-5.x; vLLM 0.34 and 0.33) on
rocm_mla's kernels, with no aiter.

A sparse MLA layer attends, per query row, over the ``index_topk`` (2048) tokens its lightning
indexer picked: request-local positions in the layer's shared top-k buffer ``[tokens, topk]``
int32, -1 padded. This module is the attention half:

* ``RocmMLASparseBackend``: a sparse MLA backend (``is_sparse()``), any block size, bf16/fp16
  and fp8 latent caches.
* ``RocmMLASparseMetadataBuilder``: vLLM's common sparse metadata (``req_id_per_token``, the
  block table, the prefill fields), plus ``indexer_kv_lens`` ``[T]`` int32 (the keys each row
  sees: its position + 1) for the indexer. No host sync beyond vLLM's own, no aiter; uniform
  decode batches (MTP rows included) are capturable in full CUDA/HIP graphs.
* ``RocmMLASparseImpl.forward_mqa``: ``rocm_mla.mla_sparse_attention`` on the top-k buffer
  directly: it turns positions into cache slots itself through ``req_id_per_token`` and the block
  table (no ``[T, 2048]`` slot tensor, no conversion kernel), reads ``ql_nope`` and ``q_pe`` in
  place, heads per rank 1..128 without padding. The launches are planned once per step
  (``plan_sparse_attention``, by the builder, else by the step's first layer) and kept on the
  metadata (``rocm_mla_sparse_plan``) for every layer; a call the plan does not fit
  (``SparsePlan.matches``: other rows, heads, dtypes, cache storage or device) plans from its own
  tensors and leaves that plan for the layers after it. An fp8 cache is taken as uint8 storage
  or as its float8 view alike (the plan names the layer's ``kv_cache_dtype``).
* ``forward_mha``: prefills whose longest sequence is <= ``index_topk`` attend densely (vLLM's
  rule), on rocm_mla's dense prefill (``RocmMLAImplCommon.forward_mha``), any head geometry.

How vLLM reaches it: on ROCm the DeepSeek-V3.2 / GLM-5 attention class names aiter's sparse
backend itself, so ``--attention-backend`` never reaches these layers; ``rocm_mla.vllm.sparse_layer``
routes them here when the user selected ROCM_MLA or ROCM_MLA_SPARSE, and runs the indexer on
``rocm_mla.mla_indexer_topk``. Where vLLM's selector does run for sparse layers (CUDA, or another
model), ``--attention-backend ROCM_MLA_SPARSE`` selects this backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.model_executor.layers.attention.sparse_mla_attention import (
    SparseMLACommonImpl,
    SparseMLACommonMetadata,
    SparseMLACommonMetadataBuilder,
)
from vllm.platforms import current_platform
from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport, AttentionLayer

from rocm_mla.mla_dims import KV_LORA_RANK
from rocm_mla.ops import IndexerTopkPlan, SparsePlan, mla_sparse_attention, plan_sparse_attention
from rocm_mla.vllm import SPARSE_BACKEND_NAME
from rocm_mla.vllm.backend import RocmMLABackendTraits, RocmMLAImplCommon
from rocm_mla.vllm.step_plans import kept_plan


class RocmMLASparseBackend(RocmMLABackendTraits, AttentionBackend):
    """vLLM attention backend ``ROCM_MLA_SPARSE``: sparse MLA layers on rocm_mla's kernels."""

    @staticmethod
    def get_name() -> str:
        return SPARSE_BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[RocmMLASparseImpl]:
        return RocmMLASparseImpl

    @staticmethod
    def get_builder_cls() -> type[RocmMLASparseMetadataBuilder]:
        return RocmMLASparseMetadataBuilder

    @staticmethod
    def get_metadata_cls() -> type[RocmMLASparseMetadata]:
        return RocmMLASparseMetadata

    @classmethod
    def is_sparse(cls) -> bool:
        return True


@dataclass(kw_only=True)
class RocmMLASparseMetadata(SparseMLACommonMetadata):
    """vLLM's sparse MLA metadata plus ``indexer_kv_lens`` ``[>= T]`` int32: row t's visible keys
    (its position + 1; decode and MTP rows their context so far, prefill rows causal), in a
    buffer the builder reuses every step (CUDA/HIP graphs replay its address); and the step's
    plans, made once and run by every layer: ``rocm_mla_sparse_plan`` (the attention's, made by
    the builder or by the first ``forward_mqa``) and ``rocm_mla_indexer_plan`` (the indexer's, made
    by the first layer's ``sparse_layer.run_indexer``)."""

    indexer_kv_lens: torch.Tensor | None = None
    rocm_mla_sparse_plan: SparsePlan | None = None
    rocm_mla_indexer_plan: IndexerTopkPlan | None = None


class RocmMLASparseMetadataBuilder(SparseMLACommonMetadataBuilder[RocmMLASparseMetadata]):
    """vLLM's common sparse builder (decodes first, then prefills; dense-prefill decision), plus
    the indexer's per-row key counts. ``mla_sparse_attention`` takes ``req_id_per_token`` and the
    block table as they are."""

    # Uniform decode batches (q_len 1, or 1 + speculative tokens) have fixed shapes and no host
    # work in forward: full-graph capturable.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    metadata_cls = RocmMLASparseMetadata

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # MTP / spec-decode rows run as decode (uniform rows of 1 + k tokens).
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self.indexer_kv_lens_buffer = torch.empty(
            vllm_config.scheduler_config.max_num_batched_tokens, dtype=torch.int32, device=device
        )
        # The layers' settings the step's plan takes (the first layer's impl: every layer of the
        # group has the same); None when it is not rocm_mla's, and the first forward_mqa plans.
        layer = vllm_config.compilation_config.static_forward_context[layer_names[0]]
        impl = getattr(layer, "impl", None)
        self._plan_impl = impl if isinstance(impl, RocmMLASparseImpl) else None

    def _build_req_id_per_token(self, common_attn_metadata) -> torch.Tensor:
        """Each token's request (row of the block table), as vLLM's ``token_to_req_indices``
        defines it (tokens past the batch's query tokens: 0), in torch ops on the device
        ``query_start_loc`` (no host sync; vLLM's own Triton kernel needs ``vllm.triton_utils``
        to find Triton, which some images lack)."""
        cam = common_attn_metadata
        mapped = int(cam.query_start_loc_cpu[-1])
        n = max(mapped, cam.num_actual_tokens)
        num_reqs = cam.query_start_loc.shape[0] - 1
        tok = torch.arange(n, dtype=torch.int32, device=self.req_id_per_token_buffer.device)
        req = torch.searchsorted(cam.query_start_loc[1:], tok, right=True, out_int32=True)
        req = torch.where(tok < mapped, req.clamp_(max=max(num_reqs - 1, 0)), 0)
        out = self.req_id_per_token_buffer[:n]
        out.copy_(req)
        return out[: cam.num_actual_tokens]

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False) -> RocmMLASparseMetadata:
        md = super().build(common_prefix_len, common_attn_metadata, fast_build)
        cam = common_attn_metadata
        T = cam.num_actual_tokens
        req = md.req_id_per_token[:T].long()
        # Token t of request r (rows qsl[r] .. qsl[r + 1] - 1) is at position
        # seq_lens[r] - (qsl[r + 1] - t): it sees that many keys plus itself.
        kv = self.indexer_kv_lens_buffer[:T]
        torch.index_select(cam.seq_lens, 0, req, out=kv)
        kv.sub_(cam.query_start_loc[1:].index_select(0, req))
        kv.add_(torch.arange(1, T + 1, dtype=torch.int32, device=kv.device))
        md.indexer_kv_lens = self.indexer_kv_lens_buffer
        md.rocm_mla_sparse_plan = self._sparse_plan(md)
        return md

    def _mqa_rows(self, md: RocmMLASparseMetadata) -> int:
        """The rows ``forward_mqa`` gets this step (vLLM's ``forward_impl`` rule): the decode rows
        when the prefill rows run dense (or under ShardQ, whose prefill rows come with their own
        metadata), else every row."""
        dense = md.prefill is not None and bool(md.prefill.use_dense_mha)
        dense = dense and not getattr(self.vllm_config.attention_config, "sparse_mla_force_mqa", False)
        if not md.num_prefills or dense or getattr(md, "shardq", None) is not None:
            return md.num_decode_tokens
        return md.num_actual_tokens

    def _sparse_plan(self, md: RocmMLASparseMetadata) -> SparsePlan | None:
        """The step's ``mla_sparse_attention`` plan from its sizes and the layers' settings; None
        when no row runs sparse, under decode context parallelism or with another impl (the first
        ``forward_mqa`` then plans from its tensors)."""
        impl, rows = self._plan_impl, self._mqa_rows(md)
        if impl is None or not rows or self.dcp_world_size != 1:
            return None
        return impl.sparse_plan(rows, self.topk_tokens, self.kv_cache_spec.block_size, self.device)


class RocmMLASparseImpl(RocmMLAImplCommon, SparseMLACommonImpl[RocmMLASparseMetadata]):
    """Sparse MLA attention steps on rocm_mla's kernels (see the module docstring); the argument
    checks, the KV write (vLLM's ROCm DeepSeek-V3.2 layer writes its caches in fused_norm_rope
    instead; other callers come here) and the dense short prefills as ROCM_MLA's."""

    NAME: ClassVar[str] = SPARSE_BACKEND_NAME

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: RocmMLASparseMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sparse MQA over the latent cache for the first T rows of the batch (decode and MTP
        rows, and every row of a prefill longer than index_topk); returns ``(out [T, N, 512],
        lse [T, N] float32)``.

        ``q``: ``(ql_nope [T, N, 512], q_pe [T, N, 64])`` read in place, or one ``[T, N, 576]``
        tensor (an fp8 one is dequantised with the layer's q scale). Row t attends over the
        positions in row ``topk_start + t`` of the layer's top-k buffer (read on every call: MTP
        re-points the buffer after load). A row whose indexer found a bad page or a NaN (every
        entry -2) gets a NaN output.
        """
        q_nope, q_pe, k_scale = self._latent_query(q, layer)
        T, N = q_nope.shape[0], q_nope.shape[1]
        md = attn_metadata
        start = getattr(md, "topk_start", 0)  # vLLM 0.34's sharded-query offset (0.33: none)
        topk = self.topk_indices_buffer[start : start + T]
        out = torch.empty(T, N, KV_LORA_RANK, dtype=q_nope.dtype, device=q_nope.device)
        lse = torch.empty(T, N, dtype=torch.float32, device=q_nope.device)
        kv = kv_c_and_k_pe_cache
        table, req = md.block_table, md.req_id_per_token  # req row-aligned with q (vLLM narrows it with topk_start)
        # A plan made for other rows (a ShardQ or narrowed call, a guess of the builder's that
        # vLLM's forward did not take) gives way to one from this call's tensors. The plan cannot
        # see the layer's batch invariance in the tensors: its field is compared.
        plan = kept_plan(
            md,
            lambda plan: (
                plan.matches(q_nope, q_pe, kv, topk, table, req, k_scale=k_scale)
                and plan.batch_invariant == self._batch_invariant
            ),
            lambda: self.sparse_plan(
                T, topk.shape[1], kv.shape[1], q_nope.device, num_heads=N, q_dtype=q_nope.dtype, kv_dtype=kv.dtype
            ),
            attr="rocm_mla_sparse_plan",
        )
        mla_sparse_attention(
            q_nope, q_pe, kv, topk, table, req, sm_scale=self.scale, out=out, lse=lse, k_scale=k_scale, plan=plan
        )
        return out, lse

    def sparse_plan(
        self,
        rows: int,
        topk: int,
        block_size: int,
        device: torch.device,
        *,
        num_heads: int | None = None,
        q_dtype: torch.dtype | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> SparsePlan:
        """The ``mla_sparse_attention`` plan of this layer's calls with ``rows`` query rows: its
        heads per rank, its activation dtype, its cache (an fp8 one as the view
        ``forward_impl`` hands over, ``current_platform.fp8_dtype()``, under the layer's
        ``kv_cache_dtype`` name, its k_scale a device tensor) and its batch invariance; a call's
        own heads and dtypes replace the layer's when given (``kv_dtype``: the cache tensor's
        dtype as passed, uint8 storage included)."""
        q_dtype = self._act_dtype if q_dtype is None else q_dtype
        if kv_dtype is None:
            kv_dtype = current_platform.fp8_dtype() if self._fp8_cache else q_dtype
        return plan_sparse_attention(
            num_rows=rows,
            num_heads=self.num_heads if num_heads is None else num_heads,
            topk=topk,
            block_size=block_size,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            device=device,
            kv_cache_dtype=self.op_kv_cache_dtype,
            k_scale_on_device=self._fp8_cache,
            batch_invariant=self._batch_invariant,
        )


__all__ = [
    "RocmMLASparseBackend",
    "RocmMLASparseMetadata",
    "RocmMLASparseMetadataBuilder",
    "RocmMLASparseImpl",
]
