"""Routing vLLM's DeepSeek-V4 / V4.1 attention layers on ROCm to rocm_mla (vLLM 0.34 and 0.33).

Why a hook: on ROCm, vLLM builds every V4 attention layer (main model, MTP, DSpark) as
``vllm.models.deepseek_v4.amd.rocm.DeepseekV4ROCMAiterMLAAttention`` and every V4.1 layer as
``vllm.models.deepseek_v41.amd.rocm.DeepseekV41ROCMAiterMLAAttention`` (picked by
``deepseek_v41.amd.model._select_dsv4_attn_cls``, which refuses any ``--attention-backend`` but
its own two). Neither consults the attention selector, and their CSA indexer runs through
``SparseAttnIndexer.forward_hip``, which raises on gfx942 unless aiter is on.

What :func:`install` does (called by ``rocm_mla.vllm.register`` on ROCm, in every vLLM process):
it puts a subclass in place of each class (in ``amd/rocm.py`` and, when imported, ``amd/model.py``)
and wraps V4.1's ``_select_dsv4_attn_cls`` so that ``ROCM_MLA`` passes its check. Each layer decides
at construction, by the same switch as every other rocm_mla layer (``--attention-backend ROCM_MLA``,
``ROCM_MLA_SPARSE``, or ``CUSTOM`` pointing at rocm_mla: ``sparse_layer.rocm_mla_selected``):

* selected: the layer keeps vLLM's whole forward (projections, compressor, cache writes, the
  output projection) and takes the branch vLLM wrote for a kernel that reads both fp8 caches in
  place: its ``_aiter_sparse_mla`` seam, fed vLLM's own global-slot ragged lists (window, CSA
  top-k or HCA rows) for decode, MTP and prefill rows. There rocm_mla's ``mla_v4_attention`` runs,
  with the attention sink and the inverse RoPE of the output fused. The CSA indexer runs
  ``mla_indexer_topk`` on the index query, weights and C4 key cache vLLM made, writing vLLM's
  ``topk_indices_buffer`` in place (:class:`V4IndexerOp`); V4.1's two-level indexer too: its
  candidate source layer writes each row's best blocks into vLLM's shared candidate buffer, and
  the later index layers read only the keys of those blocks (the op's candidate modes).
* not selected: the layer is vLLM's own, unchanged.

Refused at construction (a ValueError naming the model and why, never a wrong answer later):
an MXFP4 indexer cache (aiter's format) and V4.1's MXFP8 attention output on gfx950 (both
aiter-only paths).
"""

from __future__ import annotations

import logging
import sys

import torch

from rocm_mla.ops import mla_indexer_topk, mla_v4_attention, plan_v4_attention_for
from rocm_mla.vllm.sparse_layer import decode_group_rows, kept_indexer_plan, rocm_mla_selected
from rocm_mla.vllm.step_plans import kept_plan

logger = logging.getLogger(__name__)

# (module, class name, the model module that imports the class by name, the model's name)
_TARGETS = (
    ("vllm.models.deepseek_v4.amd.rocm", "DeepseekV4ROCMAiterMLAAttention", "vllm.models.deepseek_v4.amd.model",
     "DeepSeek-V4"),
    ("vllm.models.deepseek_v41.amd.rocm", "DeepseekV41ROCMAiterMLAAttention", "vllm.models.deepseek_v41.amd.model",
     "DeepSeek-V4.1"),
)  # fmt: skip
_V41_MODEL = "vllm.models.deepseek_v41.amd.model"
# The flags vLLM's V4 (decode, prefill) and V4.1 (one) layers read to take their in-place branch.
_IN_PLACE_FLAGS = ("_use_aiter_sparse_mla_decode", "_use_aiter_sparse_mla_prefill", "_use_aiter_sparse_mla")


def _step_metadata(prefix: str):
    """This step's metadata of layer ``prefix`` (None before the first step: profiling)."""
    from vllm.forward_context import get_forward_context

    md = get_forward_context().attn_metadata
    if isinstance(md, list):
        md = md[0]
    return md.get(prefix) if isinstance(md, dict) else None


def window_kind_name() -> str:
    """The e4m3 kind of vLLM's window (SWA) cache: its writer stores the platform's fp8 kind
    (e4m3fnuz on gfx942); the compressed cache's Triton writer stores e4m3fn everywhere."""
    from vllm.platforms import current_platform

    fnuz = current_platform.fp8_dtype() == torch.float8_e4m3fnuz
    return "fp8_ds_mla_e4m3fnuz" if fnuz else "fp8_ds_mla_e4m3fn"


def run_attention(layer, q, output, swa_cache, swa_indices, swa_indptr, compressed_cache, topk_indices, topk_indptr,
                  positions) -> None:  # fmt: skip
    """One ``_aiter_sparse_mla`` call of a V4 / V4.1 layer on ``mla_v4_attention``.

    ``q`` ``[T, H, 512]``, ``output`` ``[T, H, 512]`` (written in place), the window cache (uint8
    ``[num_blocks, 64, 584]``, vLLM's fp8_ds_mla) with its ragged global-slot list ``swa_indices``
    + ``swa_indptr`` ``[T + 1]``, the compressed cache and its ragged list (None for a window-only
    layer), ``positions`` ``[T]`` (the inverse RoPE of the output's last 64 values, with the layer's
    ``rotary_emb.cos_sin_cache``) or None. The plan is made once per step and layer kind and kept
    on the window cache's metadata (``kept_plan``)."""
    T, H = q.shape[0], q.shape[1]
    if T == 0:
        return
    holder = _step_metadata(layer.swa_cache_layer.prefix)
    compressed = compressed_cache is not None
    cos_sin = layer.rotary_emb.cos_sin_cache if positions is not None else None
    sink = layer.attn_sink[:H]
    c_list = (compressed_cache, topk_indices, topk_indptr) if compressed else (None, None, None)
    tensors = (q, swa_cache, swa_indices, swa_indptr, *c_list, sink, positions, cos_sin)

    def make():
        # The sizes, list forms, sink and rotation from the call's tensors; the caches' kinds from
        # their writers (the window's the platform's fp8 kind, the compressed one's e4m3fn).
        return plan_v4_attention_for(
            *tensors,
            window_kv_cache_dtype=window_kind_name() if swa_cache.dtype == torch.uint8 else "auto",
            compressed_kv_cache_dtype="fp8_ds_mla_e4m3fn" if compressed and compressed_cache.dtype == torch.uint8
            else "auto",
            batch_invariant=_batch_invariant(),
        )  # fmt: skip

    bad = _indexer_sentinel_rows(layer, T) if compressed and layer.compress_ratio != 128 else None
    if bad is not None and positions is not None:
        # A row the indexer marked bad (a bad page or a NaN logit: -2, which vLLM's list builders
        # skip) is made NaN through a position outside the rotary cache (the op's bad-row rule).
        positions = torch.where(bad, -1, positions)
        tensors = (*tensors[:8], positions, cos_sin)
    if holder is None:
        plan = make()
    else:
        attr = f"rocm_mla_v4_plan_{layer.compress_ratio}_{T}_{positions is not None}"
        plan = kept_plan(holder, lambda p: p.matches(*tensors), make, attr=attr)
    mla_v4_attention(*tensors, sm_scale=layer.scale, out=output[:, :H], plan=plan)
    if bad is not None and positions is None:
        output[:, :H].masked_fill_(bad[:, None, None], float("nan"))


def _indexer_sentinel_rows(layer, T: int) -> torch.Tensor | None:
    """``[T]`` bool: the rows of this call whose CSA indexer answer is the bad-row sentinel
    (CSA layers: V4's ratio 4, V4.1's 1 and 2; a short context's filled rows are never -2)."""
    buf = layer.topk_indices_buffer
    if buf is None:
        return None
    row0 = getattr(layer, "_rocm_mla_row0", 0)
    # mla_indexer_topk answers positions >= 0, -1 padding, or -2 in every entry of a bad row.
    return buf[row0 : row0 + T, 0] < -1


def _batch_invariant() -> bool:
    from rocm_mla.vllm.backend import batch_invariant_requested

    return batch_invariant_requested()


def ensure_prefill_window_lists(swa_md) -> None:
    """Give this step's window metadata the ragged prefill lists (global slots) vLLM builds only
    for aiter's in-place prefill: once per step, from vLLM's dense ``prefill_swa_indices`` /
    ``prefill_swa_lens`` with vLLM's own ``build_ragged_indices_from_dense``."""
    if swa_md is None or swa_md.num_prefill_tokens == 0 or swa_md.prefill_swa_ragged_indices is not None:
        return
    if swa_md.prefill_swa_indices is None or swa_md.prefill_swa_lens is None:
        return
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import build_ragged_indices_from_dense

    dense = swa_md.prefill_swa_indices.reshape(swa_md.num_prefill_tokens, -1)
    indices, indptr = build_ragged_indices_from_dense(dense, swa_md.prefill_swa_lens)
    swa_md.prefill_swa_ragged_indices, swa_md.prefill_swa_ragged_indptr = indices, indptr


def token_kv_lens(swa_md, num_tokens: int, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(req_id_per_token, kv_lens)`` int32 ``[num_tokens]`` of a step: row t's request and the
    compressed rows it sees, ``(pos_t + 1) // ratio`` with ``pos_t = seq_lens[r] - (qend[r] - t)``
    (decode, MTP and prefill rows alike, from the window metadata's device tensors)."""
    req = swa_md.token_to_req_indices[:num_tokens].to(torch.int32)
    r = req.long()
    t = torch.arange(num_tokens, device=req.device)
    pos = swa_md.seq_lens[r].long() - (swa_md.query_start_loc[r + 1].long() - t)
    return req, torch.div(pos + 1, ratio, rounding_mode="floor").clamp_(min=0).to(torch.int32)


def run_indexer(op, q_fp8: torch.Tensor, weights: torch.Tensor) -> None:
    """A V4 CSA indexer (vLLM's ``SparseAttnIndexer`` ``op``) on ``mla_indexer_topk``: fills
    ``op.topk_indices_buffer[:T, :topk]`` with each row's top ``op.topk_tokens`` request-local
    compressed positions (ascending, -1 padded; -2 everywhere for a bad page or a NaN logit,
    which the attention's list builders skip).

    ``q_fp8`` ``[>= T, 64, 128]`` in the platform's fp8 kind and ``weights`` ``[>= T, 64]``
    float32 as vLLM's ``fused_indexer_q_rope_quant`` returns them; the C4 key cache
    ``op.k_cache.kv_cache`` (uint8 ``[num_blocks, 64, 132]``: V4's C4 cache block-flat, V4.1's
    in 16 x 16 tiles; e4m3fn values: vLLM's Triton writers store OCP on every platform); the
    block table of this step's indexer metadata; rows, requests and visible compressed rows from the window metadata
    (:func:`token_kv_lens`). Before the first step (profiling) nothing runs."""
    md = _step_metadata(op.k_cache.prefix)
    swa_md = _step_metadata(op.rocm_mla_swa_prefix)
    if md is None or swa_md is None:
        return
    T = md.num_decode_tokens + md.num_prefill_tokens
    buf = op.topk_indices_buffer
    if T == 0:
        return
    topk = op.topk_tokens
    cache = op.k_cache.kv_cache
    table = md.block_table
    # The same for every CSA layer of the step: made once, kept on the window metadata.
    key = f"rocm_mla_kv_lens_{op.compress_ratio}_{T}"
    req, kv_lens = getattr(swa_md, key, None) or token_kv_lens(swa_md, T, op.compress_ratio)
    setattr(swa_md, key, (req, kv_lens))
    q, w = q_fp8[:T], weights[:T]
    # V4's C4 key cache is block-flat; V4.1's (ratios 1, 2) 16 x 16 tiles above block size 1. Its
    # values are e4m3fn whatever q's kind (vLLM's Triton writers store OCP on every platform).
    shuffled = op.compress_ratio != 4 and cache.shape[1] > 1
    # V4.1's two-level indexer: the source layer writes each row's best blocks of its own logits
    # into vLLM's shared candidate buffer, the later layers read only the keys of those blocks.
    lists = getattr(op, "candidate_blocks", None)
    cand, kw = None, {}
    if lists is not None:
        mode = "select" if op.candidate_write else "mask"
        cand = (mode, int(op.candidate_block_size), lists.shape[1])
        kw = {"candidates_out" if mode == "select" else "candidates": lists[:T]}
    plan = kept_indexer_plan(md, q, w, cache, table, req, kv_lens, topk=topk, shuffled=shuffled,
                             cache_kind=torch.float8_e4m3fn, candidates=cand,
                             group_rows=decode_group_rows(md))  # fmt: skip
    mla_indexer_topk(q, w, cache, table, req, kv_lens, topk=topk, out=buf[:T, :topk], plan=plan, **kw)
    if buf.shape[1] > topk:
        buf[:T, topk:] = -1


def _indexer_op_class(base: type) -> type:
    """``V4IndexerOp`` over vLLM's ``SparseAttnIndexer`` ``base``."""

    class V4IndexerOp(base):
        """vLLM's sparse-attention indexer op of a V4 CSA layer, on rocm_mla (``run_indexer``)."""

        rocm_mla_swa_prefix: str = ""

        def forward_hip(self, _hidden_states, q_quant, _k, weights):
            if isinstance(q_quant, tuple):
                raise ValueError("rocm_mla: the V4 indexer takes one fp8 index query (an FP8 indexer cache)")
            run_indexer(self, q_quant, weights)
            return self.topk_indices_buffer

        forward_cuda = forward_native = forward_hip

    return V4IndexerOp


def _indexer_class(base: type) -> type:
    """A subclass of vLLM's V4 indexer ``base`` whose op is :class:`V4IndexerOp`."""
    cached = getattr(base, "_rocm_mla_indexer", None)
    if cached is not None and cached.__bases__[0] is base:
        return cached

    class RocmMLAV4Indexer(base):
        def _get_attn_cls(self):
            return _indexer_op_class(super()._get_attn_cls())

    base._rocm_mla_indexer = RocmMLAV4Indexer
    return RocmMLAV4Indexer


def refusal(model: str, vllm_config) -> str | None:
    """Why a selected layer of ``model`` cannot run on rocm_mla (None: it can), from the config,
    checked before the layer is built."""
    from vllm.v1.attention.backends.mla.indexer import dsa_indexer_uses_fp4

    if dsa_indexer_uses_fp4(vllm_config):
        return "its MXFP4 indexer cache is aiter's format (rocm_mla's indexer reads the FP8 cache)"
    import vllm.platforms.rocm as rocm

    if model == "DeepSeek-V4.1" and getattr(rocm, "on_gfx950", lambda: False)():
        return "on gfx950 its output projection takes aiter's MXFP8 attention output"
    return None


def _make_class(base: type, model: str) -> type:
    """The rocm_mla subclass of vLLM's ROCm V4 / V4.1 attention class ``base``."""

    class RocmMLAV4Attention(base):
        """vLLM's ROCm DeepSeek-V4 attention on rocm_mla when the user selected it
        (``rocm_mla.vllm.v4_layer``); vLLM's own otherwise."""

        _rocm_mla_base = base
        _rocm_mla_model = model

        def __init__(self, *args, **kwargs):
            vllm_config = args[0] if args else kwargs["vllm_config"]
            self._rocm_mla = rocm_mla_selected(vllm_config)
            why = refusal(model, vllm_config) if self._rocm_mla else None
            if why is not None:
                raise ValueError(f"rocm_mla cannot serve {model}: {why}")
            base.__init__(self, *args, **kwargs)
            if not self._rocm_mla:
                return
            for flag in _IN_PLACE_FLAGS:
                if hasattr(self, flag):
                    setattr(self, flag, True)
            op = getattr(getattr(self, "indexer", None), "indexer_op", None)
            if op is not None:
                op.rocm_mla_swa_prefix = self.swa_cache_layer.prefix

        # V4 names the hook _get_indexer_cls, V4.1 _indexer_cls: both lead to the same op.
        def _get_indexer_cls(self, vllm_config):
            cls = super()._get_indexer_cls(vllm_config)
            return _indexer_class(cls) if self._rocm_mla else cls

        def forward_mqa(self, q, kv, positions, output):
            if self._rocm_mla:
                ensure_prefill_window_lists(_step_metadata(self.swa_cache_layer.prefix))
            return super().forward_mqa(q, kv, positions, output)

        # Which rows of the step a call's q holds (the indexer's answer for row t is the shared
        # buffer's row t): decode rows first, then prefill rows.
        def _forward_decode(self, *args, **kwargs):
            self._rocm_mla_row0 = 0
            return super()._forward_decode(*args, **kwargs)

        def _forward_prefill(self, *args, **kwargs):
            md = _step_metadata(self.swa_cache_layer.prefix)
            self._rocm_mla_row0 = md.num_decode_tokens if md is not None else 0
            return super()._forward_prefill(*args, **kwargs)

        def _aiter_sparse_mla(self, q, output, swa_k_cache, swa_indices, swa_indptr, compressed_k_cache, topk_indices,
                              topk_indptr, positions=None, output_mxfp8=None):  # fmt: skip
            if not self._rocm_mla:
                kw = {} if output_mxfp8 is None else {"output_mxfp8": output_mxfp8}
                return super()._aiter_sparse_mla(q, output, swa_k_cache, swa_indices, swa_indptr, compressed_k_cache,
                                                 topk_indices, topk_indptr, positions=positions, **kw)  # fmt: skip
            if output is None:
                raise ValueError(f"rocm_mla: {model} layer {self.prefix} asked for an MXFP8 output (aiter's)")
            run_attention(self, q, output, swa_k_cache, swa_indices, swa_indptr, compressed_k_cache, topk_indices,
                          topk_indptr, positions)  # fmt: skip

    if not hasattr(base, "_get_indexer_cls"):
        del RocmMLAV4Attention._get_indexer_cls
    if hasattr(base, "_indexer_cls"):

        def _indexer_cls(self, *args, **kwargs):
            cls = base._indexer_cls(self, *args, **kwargs)
            return _indexer_class(cls) if self._rocm_mla and cls is not None else cls

        RocmMLAV4Attention._indexer_cls = _indexer_cls
    RocmMLAV4Attention.__qualname__ = RocmMLAV4Attention.__name__
    return RocmMLAV4Attention


def _wrap_v41_select(model_module) -> None:
    """Let V4.1's backend check accept rocm_mla's names: with them selected it returns the
    rocm_mla class; otherwise vLLM's function decides as before."""
    select = model_module._select_dsv4_attn_cls
    if getattr(select, "_rocm_mla", False):
        return

    def _select_dsv4_attn_cls(vllm_config):
        if rocm_mla_selected(vllm_config):
            if vllm_config.parallel_config.prefill_context_parallel_size > 1:
                raise NotImplementedError("DeepSeek-V4.1 prefill context parallelism is not served by rocm_mla")
            return sys.modules[_TARGETS[1][0]].DeepseekV41ROCMAiterMLAAttention
        return select(vllm_config)

    _select_dsv4_attn_cls._rocm_mla = True
    model_module._select_dsv4_attn_cls = _select_dsv4_attn_cls


def install() -> list[str]:
    """Put the rocm_mla subclasses in place of vLLM's ROCm V4 and V4.1 attention classes
    (re-entrant). Returns the models hooked; a release without one of the modules logs why and
    leaves that model alone."""
    import importlib

    hooked = []
    for mod_name, cls_name, model_name, model in _TARGETS:
        try:
            rocm = importlib.import_module(mod_name)
            current = getattr(rocm, cls_name)
            if mod_name == _TARGETS[1][0]:
                _wrap_v41_select(importlib.import_module(_V41_MODEL))
        except Exception as e:  # noqa: BLE001 - any import failure leaves vLLM's path alone
            logger.warning("rocm_mla: %s layers stay on vLLM's path (%s: %s)", model, type(e).__name__, e)
            continue
        cls = current if hasattr(current, "_rocm_mla_base") else _make_class(current, model)
        setattr(rocm, cls_name, cls)
        mod = sys.modules.get(model_name)
        if mod is not None and hasattr(mod, cls_name):
            setattr(mod, cls_name, cls)
        hooked.append(model)
    return hooked


def installed_models() -> list[str]:
    """The models whose ROCm attention class vLLM builds is rocm_mla's (for ``rocm-mla doctor``)."""
    out = []
    for mod_name, cls_name, _, model in _TARGETS:
        cls = getattr(sys.modules.get(mod_name), cls_name, None)
        if hasattr(cls, "_rocm_mla_base"):
            out.append(model)
    return out


__all__ = [
    "install",
    "installed_models",
    "run_attention",
    "run_indexer",
    "token_kv_lens",
    "ensure_prefill_window_lists",
    "window_kind_name",
    "refusal",
]
