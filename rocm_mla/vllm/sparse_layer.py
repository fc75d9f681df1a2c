"""Routing vLLM's DeepSeek-V3.2 / GLM-5.x layers on ROCm to rocm_mla (vLLM 0.34 and 0.33).

Why a hook: on ROCm, vLLM builds these models' attention with
``vllm.models.deepseek_v32.amd.rocm.DeepseekV32MLAAttention``, which hands aiter's sparse backend
to ``MLAAttention`` itself and runs the indexer through ``SparseAttnIndexer.forward_hip`` (which
raises on gfx942 without aiter). ``--attention-backend`` is never consulted for these layers.

What :func:`install` does (called by ``rocm_mla.vllm.register`` on ROCm platforms, in every vLLM
process): it puts :class:`RocmMLASparseAttention`, a subclass of that class, in its place (the
name in ``amd/rocm.py`` and, when already imported, in ``amd/model.py``, which the decoder and MTP
layers build from). Each layer decides at construction:

* the user selected ``ROCM_MLA`` or ``ROCM_MLA_SPARSE`` (``--attention-backend``, or ``CUSTOM``
  pointing at rocm_mla): the layer runs ``RocmMLASparseBackend`` (rocm_mla's
  ``mla_sparse_attention``, and ``mla_prefill`` for short prompts), and its indexer runs
  ``rocm_mla.mla_indexer_topk`` on the query, weights and index cache vLLM's fused kernels made
  (vLLM's ``fused_norm_rope`` still writes both caches; the ROCm layout is read as it is);
* anything else: the layer is vLLM's own, unchanged (the subclass defers to it entirely).

So not selecting ROCM_MLA undoes it, and other models and backends never see it.
"""

from __future__ import annotations

import logging
import sys

import torch

from rocm_mla.ops import mla_indexer_topk, plan_indexer_topk
from rocm_mla.vllm import BACKEND_NAME, SPARSE_BACKEND_NAME
from rocm_mla.vllm.step_plans import kept_plan

logger = logging.getLogger(__name__)

_ROCM_MODULE = "vllm.models.deepseek_v32.amd.rocm"
_MODEL_MODULE = "vllm.models.deepseek_v32.amd.model"
SELECTING_NAMES = (BACKEND_NAME, SPARSE_BACKEND_NAME)


def rocm_mla_selected(vllm_config) -> bool:
    """Whether the user's attention backend is rocm_mla's: ``ROCM_MLA``, ``ROCM_MLA_SPARSE``, or
    ``CUSTOM`` registered to one of their classes."""
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if backend is None:
        return False
    name = getattr(backend, "name", str(backend))
    if name in SELECTING_NAMES:
        return True
    if name == "CUSTOM" and backend.is_overridden():
        return backend.get_path().startswith("rocm_mla.vllm.")
    return False


def run_indexer(
    layer_name: str, indexer, topk_indices_buffer: torch.Tensor, index_q_fp8: torch.Tensor, index_weights: torch.Tensor
) -> None:
    """A layer's lightning indexer on rocm_mla: fills ``topk_indices_buffer[:T]`` with each row's
    top ``indexer.topk_tokens`` request-local positions (-1 padded; every entry -2 for a row with a
    bad page or a NaN logit, which the attention turns into a NaN row).

    ``index_q_fp8`` ``[>= T, H, 128]`` and ``index_weights`` ``[>= T, H]`` float32 as vLLM's
    ``fused_q`` returns them (scales folded into the weights); the index cache
    (``indexer.k_cache.kv_cache``, uint8 ``[num_blocks, block_size, 132]``, its layout by
    ``indexer.k_cache.uses_shuffled_layout``), the block table, ``req_id_per_token`` and the rows'
    key counts from the layer's metadata of this step (``RocmMLASparseMetadata``, forward
    context). Before the first step (profiling: no metadata) the buffer stays as vLLM's
    ``fused_norm_rope`` filled it (-1).

    The launches are planned once per step: the first layer's call plans (``plan_indexer_topk``)
    and leaves the plan on the metadata (``rocm_mla_indexer_plan``); a later call runs it when it
    fits (``IndexerTopkPlan.matches``, and the plan's ``max_kv_len`` and ``shuffled`` are this
    call's: the tensors do not show them), else plans from its own tensors and leaves that plan
    instead.
    """
    from vllm.forward_context import get_forward_context

    md = get_forward_context().attn_metadata
    if isinstance(md, list):
        md = md[0]
    if not isinstance(md, dict):
        return
    md = md.get(layer_name)
    if md is None:
        return
    T = md.num_actual_tokens
    q, weights = index_q_fp8[:T], index_weights[:T]
    cache = indexer.k_cache.kv_cache
    shuffled = bool(indexer.k_cache.uses_shuffled_layout)
    topk = indexer.topk_tokens
    table, req, kv_lens = md.block_table, md.req_id_per_token, md.indexer_kv_lens
    plan = kept_indexer_plan(
        md, q, weights, cache, table, req, kv_lens, topk=topk, shuffled=shuffled, group_rows=decode_group_rows(md)
    )
    mla_indexer_topk(q, weights, cache, table, req, kv_lens, topk=topk, out=topk_indices_buffer[:T], plan=plan)


def decode_group_rows(md) -> int:
    """The rows a decode request has this step when every decode request has as many (MTP: 1 +
    speculative tokens; vLLM puts the decode rows first), else 1: the indexer plan's
    ``group_rows``, which reads a request's keys once for its rows (as many as the plan groups)."""
    n, rows = int(getattr(md, "num_decodes", 0) or 0), int(getattr(md, "num_decode_tokens", 0) or 0)
    if n <= 0 or rows % n:
        return 1
    return max(1, rows // n)


def kept_indexer_plan(holder, q, weights, cache, table, req, kv_lens, *, topk: int, shuffled: bool,
                      cache_kind: torch.dtype | None = None,
                      candidates: tuple[str, int, int] | None = None, group_rows: int = 1):  # fmt: skip
    """The ``mla_indexer_topk`` plan of a step (``kept_plan`` on ``holder``, the step's metadata):
    the one the step's first indexer call made when it fits this call (``IndexerTopkPlan.matches``
    plus what the tensors do not show: ``max_kv_len``, every key of a table row; the cache layout
    ``shuffled``; the cache's fp8 kind, None for q's), else a new one left in its place.
    ``candidates``: (candidate_mode, candidate_block_size, candidate_blocks) of a two-level
    indexer layer (V4.1), kept apart from the plain layers' plan, one a mode. ``group_rows``: the
    rows the plan groups (``decode_group_rows``), as far as the arch's config allows."""
    max_kv_len = table.shape[1] * cache.shape[1]
    kind = q.dtype if cache_kind is None else cache_kind
    mode, cbs, C = candidates or (None, 0, 0)
    return kept_plan(
        holder,
        lambda plan: (
            plan.matches(q, weights, cache, table, req, kv_lens, topk=topk)
            and plan.max_kv_len == max_kv_len
            and plan.shuffled == shuffled
            and plan.cache_kind == kind
            and (plan.candidate_mode, plan.candidate_block_size, plan.candidate_blocks) == (mode, cbs, C)
            and plan.group_rows_asked == group_rows
        ),
        lambda: plan_indexer_topk(
            num_rows=q.shape[0],
            num_heads=q.shape[1],
            topk=topk,
            max_kv_len=max_kv_len,
            block_size=cache.shape[1],
            q_dtype=q.dtype,
            device=q.device,
            shuffled=shuffled,
            cache_kind=cache_kind,
            candidate_mode=mode,
            candidate_block_size=cbs,
            candidate_blocks=C,
            group_rows=group_rows,
        ),
        attr="rocm_mla_indexer_plan" + (f"_{mode}" if mode else ""),
    )


def _make_class(base: type) -> type:
    """``RocmMLASparseAttention`` over vLLM's ROCm attention class ``base`` (amd/rocm.py)."""
    from vllm.models.deepseek_v32.attention import DeepseekV32Attention
    from vllm.v1.kv_cache_interface import is_quantized_kv_cache

    from rocm_mla.vllm.sparse_backend import RocmMLASparseBackend

    class RocmMLASparseAttention(base):
        """vLLM's ROCm DeepSeek-V3.2 / GLM-5 attention, on rocm_mla when the user selected it
        (``rocm_mla.vllm.sparse_layer``); vLLM's own otherwise."""

        _rocm_mla_base = base

        def __init__(self, vllm_config, config, prefix, topk_indices_buffer=None):
            self._rocm_mla = rocm_mla_selected(vllm_config)
            if not self._rocm_mla:
                base.__init__(self, vllm_config, config, prefix, topk_indices_buffer)
                return
            DeepseekV32Attention.__init__(
                self, vllm_config, config, prefix, topk_indices_buffer, attn_backend=RocmMLASparseBackend
            )
            self.indexer_op = None  # the indexer runs on rocm_mla (run_indexer)
            if self.prefill_backend is None:
                # vLLM found no MLA prefill backend on this install (none of aiter's or
                # FlashAttention's): short prefills still run dense, on rocm_mla's, whose
                # forward_mha needs only the prefill metadata that a backend object enables.
                from rocm_mla.vllm.prefill import RocmMLAPrefillBackend

                self.prefill_backend = RocmMLAPrefillBackend(
                    num_heads=self.num_heads,
                    scale=self.scale,
                    kv_lora_rank=self.kv_lora_rank,
                    qk_nope_head_dim=self.qk_nope_head_dim,
                    qk_rope_head_dim=self.qk_rope_head_dim,
                    v_head_dim=self.v_head_dim,
                    vllm_config=vllm_config,
                )
            # The attention reads a 16-bit query and dequantises an fp8 cache itself: fused_q
            # then hands over (ql_nope, q_pe) instead of an fp8-packed [T, N, 576] query.
            self._fp8_kv = False
            self._fp8_kv_needs_view = is_quantized_kv_cache(self.kv_cache_dtype) and self.kv_cache_dtype != "fp8_ds_mla"

        def _run_indexer(self, q_c, index_q_fp8, index_weights_out) -> None:
            if not self._rocm_mla:
                return super()._run_indexer(q_c, index_q_fp8, index_weights_out)
            run_indexer(self.layer_name, self.indexer, self.topk_indices_buffer, index_q_fp8, index_weights_out)

    RocmMLASparseAttention.__qualname__ = RocmMLASparseAttention.__name__
    return RocmMLASparseAttention


def install() -> bool:
    """Put :class:`RocmMLASparseAttention` in place of vLLM's ROCm DeepSeek-V3.2 attention class
    (re-entrant). Returns whether it is in place; on a vLLM without the module (another release)
    it logs why and changes nothing."""
    try:
        import importlib

        rocm = importlib.import_module(_ROCM_MODULE)
    except Exception as e:  # noqa: BLE001 - any import failure leaves vLLM's path alone
        logger.warning("rocm_mla: DeepSeek-V3.2/GLM-5 layers stay on vLLM's path (%s: %s)", type(e).__name__, e)
        return False
    current = rocm.DeepseekV32MLAAttention
    cls = current if hasattr(current, "_rocm_mla_base") else _make_class(current)
    rocm.DeepseekV32MLAAttention = cls
    model = sys.modules.get(_MODEL_MODULE)
    if model is not None:
        model.DeepseekV32MLAAttention = cls
    return True


def installed_class() -> type | None:
    """The class vLLM's ROCm DeepSeek-V3.2 model builds its attention from, if it is rocm_mla's."""
    rocm = sys.modules.get(_ROCM_MODULE)
    cls = getattr(rocm, "DeepseekV32MLAAttention", None)
    return cls if hasattr(cls, "_rocm_mla_base") else None


__all__ = ["SELECTING_NAMES", "rocm_mla_selected", "run_indexer", "kept_indexer_plan", "install", "installed_class"]
