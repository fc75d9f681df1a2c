"""One sparse MLA layer step (DeepSeek-V3.2, GLM-5.x) through vLLM's classes and rocm_mla's sparse
backend, with a float32 reference: what the sparse vLLM tests run.

A :class:`SparseLayerStep` is a :class:`~vllm_harness.layer_step.LayerStep` of a sparse layer
(``MLAAttention(use_sparse=True)`` with a shared top-k buffer, the backend's own metadata builder)
plus the lightning indexer's inputs as vLLM's ROCm layer has them when its indexer runs: every
token's index key in the fp8 index cache (written by ``rocm_mla.indexer_k_cache_write`` in vLLM's
ROCm layout, shuffled above block size 1, through the latent cache's block table), and this step's
fp8 index queries and float32 weights. :meth:`SparseLayerStep.run` is the layer's step:
``run_indexer`` (rocm_mla.vllm.sparse_layer, reading this step's metadata from vLLM's forward
context) fills the top-k buffer, then the KV write and ``forward_impl`` as vLLM runs them.

The reference: the indexer's answer must be a valid top-k of the float64 logits
(``check_indexer_topk``), and the layer output must match the float32 composition: sparse rows
through ``mla_sparse_attention_ref`` over the positions the buffer holds (decode and MTP rows, and
every row of a prefill longer than index_topk), dense short prefills through ``LayerStep``'s
dense reference.
"""

from __future__ import annotations

import types

import torch

from rocm_mla.mla_dims import KV_LORA_RANK
from vllm_harness.layer_step import LayerStep, Request

INDEX_DIM = 128


class SparseLayerStep(LayerStep):
    """A batch through one sparse MLA layer (see the module docstring).

    Args (beyond LayerStep's): index_topk (the model's ``index_topk``), index_heads (the indexer's
    heads: 64 for DeepSeek-V3.2, 32 for GLM-5.x).
    """

    def __init__(self, backend, requests: list[Request], *, index_topk: int, index_heads: int = 64, **kw):
        super().__init__(backend, requests, index_topk=index_topk, **kw)
        from vllm.platforms import current_platform

        from rocm_mla.ops import indexer_k_cache_write

        self.index_heads = index_heads
        self.shuffled = self.bs > 1  # vLLM's ROCm index-cache layout rule
        num_blocks = self.kv_cache.shape[0]
        gen = torch.Generator().manual_seed(1234)

        def randn(*shape):
            return torch.randn(*shape, generator=gen).to(self.device)

        # Unused bytes hold 0xFF (NaN codes, huge scales): read by mistake, they would show.
        self.index_cache = torch.full((num_blocks, self.bs, INDEX_DIM + 4), 0xFF, dtype=torch.uint8, device=self.device)
        for i, r in enumerate(requests):
            n = r.context + r.query
            pos = torch.arange(n, device=self.device)
            slots = self.block_table[i, pos // self.bs].long() * self.bs + pos % self.bs
            indexer_k_cache_write(randn(n, INDEX_DIM).to(self.dtype), self.index_cache, slots, shuffled=self.shuffled)
        self.index_q = (randn(self.num_tokens, index_heads, INDEX_DIM) * 2).to(current_platform.fp8_dtype())
        self.index_w = randn(self.num_tokens, index_heads).float() * index_heads**-0.5
        # What the model's indexer holds: its top-k, its index cache and layout.
        k_cache = types.SimpleNamespace(kv_cache=self.index_cache, uses_shuffled_layout=self.shuffled)
        self.indexer = types.SimpleNamespace(
            topk_tokens=index_topk, k_cache=k_cache, topk_indices_buffer=self.topk_buffer
        )
        self.req_ids = torch.cat([torch.full((r.query,), i, dtype=torch.int32) for i, r in enumerate(requests)])
        self.kv_lens = torch.cat([torch.arange(r.context + 1, r.context + r.query + 1) for r in requests]).int()

    def run_indexer(self) -> torch.Tensor:
        """The indexer step (``rocm_mla.vllm.sparse_layer.run_indexer`` under this step's forward
        context); returns the top-k buffer."""
        from vllm.forward_context import set_forward_context

        from rocm_mla.vllm.sparse_layer import run_indexer

        self.topk_buffer.fill_(-1)  # as vLLM's fused_norm_rope leaves it
        with set_forward_context({self.layer.layer_name: self.metadata}, self.vllm_config):
            run_indexer(self.layer.layer_name, self.indexer, self.topk_buffer, self.index_q, self.index_w)
        return self.topk_buffer

    def run(self) -> torch.Tensor:
        self.run_indexer()
        return super().run()

    def forward_mqa_args(self) -> tuple:
        """Run the step once and return the arguments of its sparse attention call,
        ``(q, kv_cache, metadata, layer)`` as ``forward_impl`` handed them to ``forward_mqa``: a
        later layer of the step calls it with the same ones."""
        calls = [args for name, args, _ in self.capture_backend_calls() if name == "forward_mqa"]
        assert len(calls) == 1, f"expected one forward_mqa call in the step, got {len(calls)}"
        return calls[0]

    def indexer_mismatch(self) -> str:
        """'' when the top-k buffer is a valid top-k of the float64 indexer logits, else why not."""
        from rocm_mla.reference.indexer_topk import check_indexer_topk, mla_indexer_logits_ref

        logits = mla_indexer_logits_ref(
            self.index_q.cpu(),
            self.index_w.cpu(),
            self.index_cache.cpu(),
            self.block_table.cpu(),
            self.req_ids,
            self.kv_lens,
            shuffled=self.shuffled,
        )
        return check_indexer_topk(self.topk_buffer, logits, self.index_topk)

    @property
    def dense_prefill(self) -> bool:
        """Whether this step's prefill rows ran dense (their longest sequence <= index_topk)."""
        p = self.metadata.prefill
        return p is not None and bool(p.use_dense_mha)

    def reference(self) -> torch.Tensor:
        """The step's output ``[T, N * V]`` in float32: sparse rows over the buffer's positions
        (``mla_sparse_attention_ref`` on the absorbed query, the cache dequantised), dense short
        prefill rows through LayerStep's reference."""
        from vllm.platforms import current_platform

        from rocm_mla.reference import mla_sparse_attention_ref

        N, P, V = self.N, self.P, self.V
        w = self.layer.kv_b_proj.weight.float().T.reshape(KV_LORA_RANK, N, P + V)
        q = self.q_all.float()
        ql_nope = torch.einsum("tnd,lnd->tnl", q[..., :P], w[..., :P])
        cache, k_scale = self.kv_cache, None
        if self.fp8:
            cache, k_scale = cache.view(current_platform.fp8_dtype()), float(self.layer._k_scale)
        o, _ = mla_sparse_attention_ref(
            ql_nope, q[..., P:], cache, self.topk_buffer, self.block_table, self.req_ids.to(self.device), self.scale,
            k_scale,
        )  # fmt: skip
        sparse = torch.einsum("tnl,lnd->tnd", o, w[..., P:]).reshape(-1, N * V)
        if not self.dense_prefill:
            return sparse
        nd = self.metadata.num_decode_tokens
        dense = super().reference()
        return torch.cat([sparse[:nd], dense[nd:]])
