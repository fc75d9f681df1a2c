"""ROCM_MLA: vLLM's MLA attention (0.34 and 0.33) running on rocm_mla's kernels, with no extra copies.

Subclasses of vLLM's MLA common classes (vllm/model_executor/layers/attention/mla_attention.py);
vLLM's ``MLAAttention`` layer keeps doing what is not attention (q/k/v projections, the absorbed
``W_UK`` bmm before decode and the ``W_UV`` bmm after it, output quantisation); this module
replaces the four attention steps:

* KV write (``do_kv_cache_update``): ``rocm_mla.concat_and_cache_mla`` writes ``[kv_c | k_pe]``
  straight from the model's strided views into the paged cache (fp8: ``x / k_scale``).
* Decode (``forward_mqa``): ``rocm_mla.mla_decode`` reads ``ql_nope`` and ``q_pe`` as the two
  tensors vLLM hands over (no ``torch.cat``), writes out and LSE into buffers it never memsets
  (every element is written), and takes uniform multi-token rows (MTP / spec-decode
  verification: rows = B x q_len, causal within each request) without expanding block tables.
* Prefill (``forward_mha``): ``rocm_mla.mla_prefill`` reads ``k_nope``/``v`` as strided views of
  the ``kv_b_proj`` output and ``k_pe`` as one ``[T, 1, 64]`` head broadcast over N (no cat, no
  pad), and writes the layer's output rows in place. Cached context: each chunk is gathered
  (``rocm_mla.ops.gather_context_chunk``), up-projected, attended into one reusable chunk
  buffer, and folded into the output rows in place with the strided
  ``rocm_mla.merge_attn_states`` (no partial copies).

The fused RoPE + KV write is not a backend hook in vLLM 0.33 or 0.34: RoPE is applied by the model
(``MultiHeadLatentAttentionWrapper.forward`` in vllm/model_executor/layers/mla.py) before
``MLAAttention`` is called, and ``do_kv_cache_update`` receives neither positions nor ``q_pe`` nor
the cos/sin cache. vLLM's ``fuse_rope_kvcache_cat_mla`` compile pass joins them into
``torch.ops.vllm.fused_rope_unified_mla_kv_cache_update``, whose kernel the plugin overrides for
ROCM_MLA layers (fused_rope_kv_op.py); without the pass ``do_kv_cache_update`` below writes the
already-rotated k_pe.
"""

from __future__ import annotations

import inspect
from typing import ClassVar

import torch
from vllm.config.cache import CacheDType
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
    MLACommonPrefillMetadata,
    QueryLenSupport,
    _get_kv_b_proj_input_dtype,
)
from vllm.platforms import current_platform
from vllm.v1.attention.backend import AttentionCGSupport, AttentionLayer, AttentionType, MultipleOf
from vllm.v1.kv_cache_interface import is_quantized_kv_cache

from rocm_mla import env
from rocm_mla.mla_dims import FP8_DTYPES, KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM, VLLM_FP8_KV_CACHE_DTYPES
from rocm_mla.ops import (
    DecodePlan,
    concat_and_cache_mla,
    gather_context_chunk,
    merge_attn_states,
    mla_decode,
    mla_prefill,
    plan_decode,
    plan_decode_for,
    plan_prefill,
)
from rocm_mla.vllm import BACKEND_NAME, model_support
from rocm_mla.vllm.invariant_context import context_pieces
from rocm_mla.vllm.prefill import plan_on
from rocm_mla.vllm.step_plans import kept_plan

# vLLM's names of a 16-bit cache: the kernels read one only in the model dtype (cache_dtype_problem).
_16BIT_CACHE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class RocmMLABackendTraits:
    """What rocm_mla's dense (``ROCM_MLA``) and sparse (``ROCM_MLA_SPARSE``) backends declare alike."""

    # The kernels take fp16, bf16 and fp32 activations (fp32 mostly for tests).
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    # 16-bit caches must hold the model dtype (the kernels do not convert between 16-bit types:
    # see cache_dtype_problem); fp8 = e4m3 of the platform (e4m3fnuz on gfx942), per-tensor k_scale.
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto", *_16BIT_CACHE_DTYPES, *VLLM_FP8_KV_CACHE_DTYPES]

    # What supports_combination adds to its reason for another latent row.
    _head_size_hint: ClassVar[str] = ""

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [KV_ROW_DIM]  # 576: one latent "head" of [kv_c | k_pe]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        # Every kernel (decode, sparse attention, indexer, KV write, context gather) indexes pages
        # with any block size (1, 16, 64, ...).
        return [MultipleOf(1)]

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        # A request's out and lse do not depend on the batch (batch_invariant=True of the ops;
        # the impls turn it on under VLLM_BATCH_INVARIANT=1 or ROCM_MLA_BATCH_INVARIANT=1).
        return True

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        # Triton kernels: compiled for gfx942 (MI300) and gfx950 (MI350) in CI, run and timed on an
        # NVIDIA H200 (sm90).
        return True

    @classmethod
    def supports_combination(
        cls,
        head_size,
        dtype,
        kv_cache_dtype,
        block_size,
        use_mla,
        has_sink,
        use_sparse,
        use_mm_prefix,
        device_capability,
    ) -> str | None:
        """vLLM's selector hook: why the backend cannot serve this layer (None: it can). A model
        rocm-mla does not serve (``model_support.MLA_FAMILY``) is refused by name, so that vLLM's
        start-up error says which model and why."""
        why = model_support.current_refusal(head_size)
        if why is not None:
            return why
        # The kernels work on the latent row, the same for every (qk_nope, v) head geometry whose
        # row is 512 + 64; the prefill takes every MLA geometry
        # (rocm_mla.vllm.prefill.RocmMLAPrefillBackend.supported_mla_dimensions).
        if head_size != KV_ROW_DIM:
            return (
                f"MLA latent head size {head_size} (kv_lora_rank + qk_rope_head_dim): {cls.get_name()}'s kernels "
                f"are built for {KV_LORA_RANK} + {QK_ROPE_HEAD_DIM} = {KV_ROW_DIM}{cls._head_size_hint}"
            )
        if has_sink:
            return f"attention sinks ({cls.get_name()} has none)"
        return cls.cache_dtype_problem(kv_cache_dtype, dtype)

    @staticmethod
    def cache_dtype_problem(kv_cache_dtype, dtype) -> str | None:
        """Why a 16-bit ``kv_cache_dtype`` cannot serve a ``dtype`` model (None: it can)."""
        want = _16BIT_CACHE_DTYPES.get(kv_cache_dtype or "auto")
        if want is not None and want != dtype:
            return (
                f"kv_cache_dtype {kv_cache_dtype} with a {str(dtype).replace('torch.', '')} model "
                "(a 16-bit cache must hold the model dtype; use auto or fp8)"
            )
        return None


class RocmMLABackend(RocmMLABackendTraits, MLACommonBackend):
    """vLLM attention backend ``ROCM_MLA`` (selected with ``--attention-backend ROCM_MLA``)."""

    _head_size_hint: ClassVar[str] = (
        " (any qk_nope_head_dim / v_head_dim of vLLM's MLA geometries); a model without RoPE part can still "
        "use ROCM_MLA as its MLA prefill backend (-ac.mla_prefill_backend=ROCM_MLA)"
    )

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[RocmMLAImpl]:
        return RocmMLAImpl

    @staticmethod
    def get_builder_cls() -> type[RocmMLAMetadataBuilder]:
        return RocmMLAMetadataBuilder


class RocmMLAMetadataBuilder(MLACommonMetadataBuilder[MLACommonMetadata]):
    """vLLM's MLA metadata: ``decode.block_table`` and ``decode.seq_lens`` are exactly what
    ``mla_decode`` takes, and the prefill/context-chunk metadata is what the prefill uses; the
    builder adds the step's plans (``rocm_mla_plan`` on the decode metadata, the prefill metadata
    and each context chunk)."""

    # mla_decode reads uniform multi-token decode blocks as rows = B x q_len, causal inside each
    # request, from seq_lens alone: no host sync, no per-row tensors -> capturable, any q_len.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.UNIFORM

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # The decode metadata only references the runner's persistent block_table/seq_lens
        # buffers (nothing derived), so draft steps need no rebuild. DCP local lengths are not
        # advanced between draft steps (as for TRITON_MLA).
        self.supports_draft_decode_metadata_update = self.dcp_world_size == 1

    def update_draft_decode_metadata(self, metadata: MLACommonMetadata) -> None:
        """Nothing to refresh: see ``supports_draft_decode_metadata_update``."""

    def build(self, *args, **kwargs) -> MLACommonMetadata:
        """vLLM's metadata, with the step's plans made once here: the decode plan
        (``rocm_mla.plan_decode``) on ``metadata.decode.rocm_mla_plan``, run by every layer's
        ``forward_mqa``; the prefill plans (``rocm_mla.plan_prefill``) on
        ``metadata.prefill.rocm_mla_plan`` and each context chunk's ``rocm_mla_plan``, run by every
        layer's ``forward_mha``."""
        metadata = super().build(*args, **kwargs)
        if metadata.decode is not None:
            metadata.decode.rocm_mla_plan = self._decode_plan(metadata)
        if metadata.prefill is not None:
            self._plan_prefill(metadata)
        return metadata

    def _plan_prefill(self, metadata: MLACommonMetadata) -> None:
        """The prefill rows' plans from the step's sizes and the layers' settings (the model dtype,
        the head geometry, batch invariance): one per distinct call shape of ``forward_mha``, the
        new tokens' causal pass (B prefills, T rows over T keys) on ``metadata.prefill``, and each
        context chunk's non-causal pass (its requests, its rows over its gathered keys) on the
        chunk. None under decode context parallelism (vLLM's common prefill runs there), nor for
        the chunks in batch-invariant mode (``context_pieces`` cuts the context per request,
        each piece planned by the layer): a layer that finds no fitting plan plans from its tensors
        and leaves the plan for the others (``rocm_mla.vllm.prefill.plan_on``)."""
        if self.dcp_world_size != 1:
            return
        p = metadata.prefill
        dims = self.mla_dims
        invariant = batch_invariant_requested()
        knobs = dict(
            num_heads=self.num_heads,
            q_dtype=self.model_config.dtype,
            device=p.query_start_loc.device,
            head_dims=(dims.qk_nope_head_dim, dims.qk_rope_head_dim, dims.v_head_dim),
            batch_invariant=invariant,
        )
        rows = metadata.num_actual_tokens - metadata.num_decode_tokens
        p.rocm_mla_plan = plan_prefill(
            batch=p.query_start_loc.shape[0] - 1,
            q_rows=rows,
            k_rows=rows,
            causal=True,
            max_seqlen_q=p.max_query_len,
            max_seqlen_k=p.max_query_len,
            **knobs,
        )
        if p.chunked_context is None or invariant:
            return
        for chunk in p.chunked_context.chunks:
            chunk.rocm_mla_plan = plan_prefill(
                batch=chunk.num_requests,
                q_rows=chunk.token_slice.stop - chunk.token_slice.start,
                k_rows=chunk.num_context_tokens,
                causal=False,
                max_seqlen_q=chunk.max_query_len,
                max_seqlen_k=chunk.max_seq_len,
                **knobs,
            )

    def _decode_plan(self, metadata: MLACommonMetadata) -> DecodePlan | None:
        """The decode rows' plan from the step's sizes and the layers' settings (the ones
        ``RocmMLAImpl`` reads: the cache kind, ROCM_MLA_FP8_DOTS, batch invariance). None under
        decode context parallelism (its query is gathered over the ranks): the first layer then
        plans from its tensors and leaves the plan for the others."""
        if self.dcp_world_size != 1 or not metadata.num_decodes:
            return None
        d = metadata.decode
        fp8 = is_quantized_kv_cache(self.vllm_config.cache_config.cache_dtype)
        act = self.model_config.dtype
        return plan_decode(
            batch=d.block_table.shape[0],
            num_heads=self.num_heads,
            q_len=metadata.num_decode_tokens // metadata.num_decodes,
            max_blocks=d.block_table.shape[1],
            block_size=self.kv_cache_spec.block_size,
            q_dtype=act,
            kv_dtype=current_platform.fp8_dtype() if fp8 else self.kv_cache_spec.dtype,
            kv_cache_dtype="fp8" if fp8 else "auto",
            device=d.block_table.device,
            max_seq_len=int(metadata.max_seq_len),
            fp8_dots=fp8_dots_from_env(fp8, act),
            k_scale_on_device=fp8,
            batch_invariant=batch_invariant_requested(),
        )


def fp8_dots_from_env(fp8_cache: bool, act_dtype: torch.dtype) -> str | None:
    """mla_decode's ``fp8_dots`` for a layer from ``ROCM_MLA_FP8_DOTS`` (none, qk, all; unset or
    empty: None, the op's default). Checked when the layer is built, not at every step: a value
    that is not a mode, or qk/all with a float32 model (exact products), raise ValueError; with a
    16-bit cache the variable does not apply and None is returned."""
    value = env.get("ROCM_MLA_FP8_DOTS")  # checked against none / qk / all
    if not value or not fp8_cache:
        return None
    if value != "none" and act_dtype == torch.float32:
        raise ValueError(
            f"ROCM_MLA_FP8_DOTS={value}: expected a float16 or bfloat16 model (fp8 dots round 16-bit "
            "queries), got float32; unset it or set none for a float32 model"
        )
    return value


def cache_for_writers(kv_cache: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The layer's cache as rocm_mla's KV writers take it, with their ``kv_cache_dtype`` /
    ``k_scale`` keywords: an fp8 cache (uint8 storage) viewed as ``current_platform.fp8_dtype()``,
    the view ``forward_impl`` gives the decode, so writer and reader agree on e4m3fn vs e4m3fnuz;
    a 16-bit one ("auto", or a name equal to the model dtype) as it is."""
    if kv_cache_dtype in VLLM_FP8_KV_CACHE_DTYPES:
        if kv_cache.dtype == torch.uint8:
            kv_cache = kv_cache.view(current_platform.fp8_dtype())
        return kv_cache, {"kv_cache_dtype": "fp8", "k_scale": k_scale.reshape(1)}
    return kv_cache, {"kv_cache_dtype": "auto"}


def batch_invariant_requested() -> bool:
    """vLLM's ``VLLM_BATCH_INVARIANT=1`` or ``ROCM_MLA_BATCH_INVARIANT=1``: every op runs with
    ``batch_invariant=True`` and cached context is cut per request (``context_pieces``)."""
    import vllm.envs as envs

    return bool(envs.VLLM_BATCH_INVARIANT) or env.flag("ROCM_MLA_BATCH_INVARIANT")


class RocmMLAImplCommon:
    """What rocm_mla's dense (``RocmMLAImpl``) and sparse (``RocmMLASparseImpl``) impls do alike,
    placed before vLLM's impl class in their bases: the argument checks and settings, the KV
    write, and the prefill rows on the dense kernels (``forward_mha``, on the prefill metadata
    vLLM's MLA builders make: ``MLACommonPrefillMetadata`` and its sparse subclass)."""

    NAME: ClassVar[str] = BACKEND_NAME

    def __init__(self, *args, **kwargs):
        """vLLM's impl arguments, passed to its impl class unchanged; raises NotImplementedError
        for what the kernels do not run (ALiBi, a sliding window, a logits soft cap, attention
        other than decoder self-attention, a latent row other than 512 + 64)."""
        # By name whichever way they came (vLLM's own signature orders them).
        given = inspect.signature(super().__init__).bind(*args, **kwargs).arguments
        super().__init__(*args, **kwargs)
        if any(given.get(name) for name in ("alibi_slopes", "sliding_window", "logits_soft_cap")):
            raise NotImplementedError(f"{self.NAME} does not support alibi_slopes, sliding_window or logits_soft_cap")
        if given["attn_type"] != AttentionType.DECODER:
            raise NotImplementedError(f"{self.NAME} supports decoder self-attention only, got {given['attn_type']}")
        if self.kv_lora_rank != KV_LORA_RANK or self.qk_rope_head_dim != QK_ROPE_HEAD_DIM:
            raise NotImplementedError(
                f"{self.NAME}'s kernels are built for kv_lora_rank {KV_LORA_RANK} and "
                f"qk_rope_head_dim {QK_ROPE_HEAD_DIM}, got {self.kv_lora_rank} and {self.qk_rope_head_dim}"
            )
        # With an fp8 cache the kernels read bf16/fp16 queries and dequantise K/V in
        # registers. A pre-quantised query would cost vLLM's _DecodeConcatQuantFP8 (a torch.cat of
        # ql_nope and q_pe plus a quant kernel) and then a dequant here: keep the tuple path.
        self.supports_quant_query_input = False
        self._fp8_cache = is_quantized_kv_cache(self.kv_cache_dtype)
        # The ops' kv_cache_dtype for this layer's cache: vLLM's fp8 name, under which the ops read
        # uint8 storage (how vLLM holds the cache) and its float8 view alike; "auto" for a cache
        # of the model dtype.
        self.op_kv_cache_dtype = self.kv_cache_dtype if self._fp8_cache else "auto"
        self._batch_invariant = batch_invariant_requested()
        # The activation dtype: vLLM builds layers under set_default_torch_dtype(model dtype), as
        # MLAAttention.__init__ itself relies on.
        self._act_dtype = torch.get_default_dtype()

    def _latent_query(
        self, q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], layer: AttentionLayer
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``forward_mqa``'s query as ``(ql_nope [rows, N, 512], q_pe [rows, N, 64])``, read in
        place, and the layer's k_scale as the ops take it (None for a 16-bit cache). ``q`` comes
        as that tuple, or as one ``[rows, N, 576]`` tensor (vLLM's concatenation: a query gathered
        over DCP ranks, or an fp8 one, dequantised here with the layer's q scale)."""
        if isinstance(q, tuple):
            q_nope, q_pe = q
        else:
            if q.dtype in FP8_DTYPES:
                q = (q.to(torch.float32) * layer._q_scale.reshape(())).to(self._act_dtype)
            q_nope, q_pe = q[..., :KV_LORA_RANK], q[..., KV_LORA_RANK:]
        return q_nope, q_pe, (layer._k_scale.reshape(1) if self._fp8_cache else None)

    def do_kv_cache_update(
        self,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
        skip_scale: bool = False,
    ) -> None:
        """Write ``[kv_c | k_pe]`` of each token into its cache slot (slot -1: skipped).

        ``kv_cache`` is the layer's raw cache (uint8 storage for fp8): it is viewed as
        ``current_platform.fp8_dtype()``, the same view ``MLAAttention.forward_impl`` gives the
        decode, so writer and reader agree on e4m3fn vs e4m3fnuz by construction. ``skip_scale``
        (vLLM's hint that k_scale is 1.0) needs no special case: dividing by the device scale is free.
        """
        if kv_cache.numel() == 0:
            return
        cache, kind = cache_for_writers(kv_cache, kv_cache_dtype, k_scale)
        concat_and_cache_mla(kv_c_normed, k_pe, cache, slot_mapping.flatten(), **kind)

    def forward_mha(
        self,
        q: torch.Tensor,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: MLACommonMetadata,
        k_scale: torch.Tensor,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
    ) -> None:
        """Prefill rows: causal attention over the new tokens, then each cached-context chunk
        folded in, all written into ``output`` ``[T, N * V]`` in place.

        Each call runs the plan the metadata builder left for its shape (``prefill.rocm_mla_plan``,
        each chunk's ``rocm_mla_plan``); metadata without one (another builder's: the sparse
        backend's) gets it from the step's first layer (``plan_on``).

        ``kv_c_and_k_pe_cache`` ``[num_blocks, block_size, 576]``: the cache in either form vLLM
        passes, an fp8 one as uint8 storage or as its float8 view; the context gather reads both
        under the layer's fp8 name (``op_kv_cache_dtype``).

        Decode context parallelism needs vLLM's KV all-gather of the context
        (``_context_parallel_compute_prefill_context``): that case runs vLLM's common prefill,
        through the layer's MLA prefill backend.
        """
        prefill = attn_metadata.prefill
        assert prefill is not None
        if self.dcp_world_size > 1:
            return super().forward_mha(
                q, kv_c_normed, k_pe, kv_c_and_k_pe_cache, attn_metadata, k_scale, output, output_scale
            )
        if output_scale is not None:
            raise NotImplementedError("ROCM_MLA's prefill does not fuse output quantisation")
        if prefill.q_data_type not in (None, q.dtype):
            raise NotImplementedError(f"ROCM_MLA's prefill runs in the model dtype, not {prefill.q_data_type}")
        T, N = q.shape[0], self.num_heads
        P, V = self.qk_nope_head_dim, self.v_head_dim
        kv_nope = self.kv_b_proj(kv_c_normed)[0].view(T, N, P + V)
        out = output.view(T, N, V)
        chunked = prefill.chunked_context
        lse = torch.empty(N, T, dtype=torch.float32, device=q.device) if chunked is not None else None
        cu = prefill.query_start_loc
        tensors = (q, kv_nope[..., :P], k_pe, kv_nope[..., P:], cu, cu)
        hint = prefill.max_query_len
        plan = plan_on(
            prefill, tensors, causal=True, max_seqlen_q=hint, max_seqlen_k=hint, batch_invariant=self._batch_invariant
        )
        mla_prefill(*tensors, sm_scale=self.scale, plan=plan, out=out, lse=lse)
        if chunked is not None:
            # Batch-invariant mode cuts each request's context by itself (vLLM's chunks pack requests).
            chunks = context_pieces(prefill, q.device) if self._batch_invariant else chunked.chunks
            self._fold_in_context(q, kv_c_and_k_pe_cache, prefill, chunks, k_scale, out, lse)

    def _fold_in_context(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        prefill: MLACommonPrefillMetadata,
        chunks: list,
        k_scale: torch.Tensor,
        out: torch.Tensor,
        lse_new: torch.Tensor,
    ) -> None:
        """Merge attention over every cached-context chunk into ``out`` (``[T, N, V]``, already
        holding the new-token attention whose LSE is ``lse_new`` ``[N, T]``), in place.

        ``chunks``: vLLM's (``build_mla_chunked_context_metadata``), or in batch-invariant mode
        the per-request pieces of ``context_pieces`` under the same names. A chunk covers a run of
        prefill requests (query rows ``token_slice``); only its first request can continue a
        request split across chunks (rows ``[token_slice.start, continuation_token_end)``), and
        requests without context are in no chunk (their rows stay as the new-token pass wrote them).

        A row's running LSE is needed again only if a later chunk continues its request. The
        merge must not write the LSE it reads (the HIP kernel reads it from several threads), so
        continued rows alternate between ``lse_new`` and one more ``[N, T]`` buffer; nothing is
        ever copied. Per chunk: one gather, one up-projection GEMM, one attention, one or two merges.
        """
        if not chunks:
            return
        workspace = prefill.chunked_context.workspace
        N, L, P, V = self.num_heads, self.kv_lora_rank, self.qk_nope_head_dim, self.v_head_dim
        proj_dtype = _get_kv_b_proj_input_dtype(self.kv_b_proj, False)
        rows_max = max(c.token_slice.stop - c.token_slice.start for c in chunks)
        chunk_out = torch.empty(rows_max, N, V, dtype=q.dtype, device=q.device)
        chunk_lse = torch.empty(N, rows_max, dtype=torch.float32, device=q.device)
        lse_alt: torch.Tensor | None = None
        tail = lse_new  # where the running LSE of the previous chunk's last request lives
        for i, chunk in enumerate(chunks):
            toks = chunk.num_context_tokens
            ws = workspace[:toks]
            gather_context_chunk(
                kv_cache,
                prefill.block_table[chunk.request_slice],
                chunk.cu_seq_lens,
                chunk.starts,
                chunk.token_to_seq,
                ws,
                k_scale=k_scale.reshape(1) if self._fp8_cache else None,
                kv_cache_dtype=self.op_kv_cache_dtype,
            )
            kv_c = ws[:, :L]
            if proj_dtype is not None and proj_dtype != kv_c.dtype:
                kv_c = kv_c.to(proj_dtype)  # only for checkpoints whose kv_b_proj wants another dtype
            kv_nope = self.kv_b_proj(kv_c)[0].view(toks, N, P + V)
            s, e = chunk.token_slice.start, chunk.token_slice.stop
            tensors = (q[s:e], kv_nope[..., :P], ws[:, L:].unsqueeze(1), kv_nope[..., P:])
            tensors += (chunk.query_start_loc, chunk.cu_seq_lens)
            hints = {"max_seqlen_q": chunk.max_query_len, "max_seqlen_k": chunk.max_seq_len}
            plan = plan_on(chunk, tensors, causal=False, batch_invariant=self._batch_invariant, **hints)
            mla_prefill(*tensors, sm_scale=self.scale, plan=plan, out=chunk_out[: e - s], lse=chunk_lse[:, : e - s])
            keep = i + 1 < len(chunks) and chunks[i + 1].is_continuation
            cont_end = chunk.continuation_token_end if chunk.is_continuation else s
            # Rows [s, cont_end) continue a request (running LSE in `tail`); rows [cont_end, e)
            # start theirs (running LSE still in lse_new).
            for a, b, src in ((s, cont_end, tail), (cont_end, e, lse_new)):
                if a >= b:
                    continue
                dst = None
                if keep and b == e:  # the rows' request continues in the next chunk: keep its LSE
                    lse_alt = torch.empty_like(lse_new) if lse_alt is None else lse_alt
                    dst = lse_alt if src is lse_new else lse_new
                    tail = dst
                # The chunk buffers are indexed from the chunk's first row s.
                merge_attn_states(
                    out[a:b],
                    out[a:b],
                    src[:, a:b],
                    chunk_out[a - s : b - s],
                    chunk_lse[:, a - s : b - s],
                    None if dst is None else dst[:, a:b],
                    batch_invariant=self._batch_invariant,
                )


class RocmMLAImpl(RocmMLAImplCommon, MLACommonImpl[MLACommonMetadata]):
    """The attention steps of an MLA layer on rocm_mla's kernels (see the module docstring)."""

    # forward_mqa always returns the natural-log LSE, which decode context parallelism combines.
    can_return_lse_for_decode: bool = True
    supports_dcp: bool = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # mla_decode's fp8_dots for an fp8 cache (an accuracy trade: docs/notes/fp8-decode.md):
        # ROCM_MLA_FP8_DOTS = none | qk | all; unset: mla_decode's DEFAULT_FP8_DOTS.
        self._fp8_dots = fp8_dots_from_env(self._fp8_cache, self._act_dtype)

    # ------------------------------------------------------------------ decode

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: MLACommonMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Paged MQA over the latent cache for the decode rows; returns ``(out [rows, N, 512],
        lse [rows, N] float32, natural log)``.

        ``q`` is ``(ql_nope [rows, N, 512], q_pe [rows, N, 64])`` as ``forward_impl`` hands it
        (q_pe a strided slice of the layer's q), read in place. Under decode context parallelism
        vLLM concatenates and all-gathers it first, so one ``[rows, N, 576]`` tensor arrives: its
        two slices are read in place the same way. A pre-quantised fp8 query (only if
        ``supports_quant_query_input`` were turned on) is dequantised with the layer's q scale.

        vLLM's Kimi-K3 layer, with aiter MLA on and an fp8 cache, writes the cache itself and hands
        over one fp8 ``[T, N, 576]`` query of every token row of the step, CUDA-graph padding
        included (``T >= attn_metadata.num_decode_tokens``): the decode rows are the first
        ``num_decode_tokens``; the rows past them come back as out 0 and lse -inf.
        """
        assert attn_metadata.decode is not None
        given = (q[0] if isinstance(q, tuple) else q).shape[0]
        rows = getattr(attn_metadata, "num_decode_tokens", None) or given
        if given > rows:
            q = tuple(t[:rows] for t in q) if isinstance(q, tuple) else q[:rows]
        q_nope, q_pe, k_scale = self._latent_query(q, layer)
        out = lse = None
        if given > rows:
            out = q_nope.new_empty(given, q_nope.shape[1], KV_LORA_RANK)
            lse = torch.empty(given, q_nope.shape[1], dtype=torch.float32, device=q_nope.device)
            out[rows:].zero_()
            lse[rows:].fill_(float("-inf"))
        decode = attn_metadata.decode
        kv, table, lens = kv_c_and_k_pe_cache, decode.block_table, decode.seq_lens
        # Metadata another builder made, or a query gathered over DCP ranks: the first layer plans
        # from its tensors and leaves the plan for the step's other layers.
        plan = kept_plan(
            decode,
            lambda plan: plan.matches(q_nope, q_pe, kv, table, lens),
            lambda: plan_decode_for(
                q_nope,
                kv,
                table,
                k_scale=k_scale,
                kv_cache_dtype="fp8" if self._fp8_cache else "auto",
                max_seq_len=int(attn_metadata.max_seq_len),
                fp8_dots=self._fp8_dots,
                batch_invariant=self._batch_invariant,
            ),
        )
        # out and lse fresh from mla_decode (torch.empty: the kernel writes every element): new
        # buffers alias nothing, so the call skips the destination checks a caller's buffers need.
        if out is None:
            return mla_decode(q_nope, q_pe, kv, table, lens, sm_scale=self.scale, plan=plan, k_scale=k_scale)
        out_rows, lse_rows = out[:rows], lse[:rows]
        mla_decode(
            q_nope, q_pe, kv, table, lens, sm_scale=self.scale, plan=plan, k_scale=k_scale, out=out_rows, lse=lse_rows
        )
        return out, lse
