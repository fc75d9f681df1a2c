"""One DeepSeek-V4 attention step through vLLM's own ROCm layer code and rocm_mla's hook, with a
float64 reference: what the V4 vLLM tests and the V4 layer bench run.

A :class:`V4Step` holds a batch of requests (decode, MTP and prefill rows, decode rows first as
vLLM orders them) through one V4 layer of a kind: window-only, CSA (ratio 4, top-k from the
indexer) or HCA (ratio 128, every compressed row). Its layer is rocm_mla's subclass of vLLM's
``DeepseekV4ROCMAiterMLAAttention`` (``rocm_mla.vllm.v4_layer``) with the attributes vLLM's
``__init__`` gives it (not built through ``__init__``, which needs the whole checkpoint config):
the step runs vLLM's ``forward_mqa``, ``_forward_decode`` and ``_forward_prefill_aiter`` as they
are, vLLM's global-slot list builders (``compute_global_topk_ragged_indices_and_indptr``,
``build_prefill_topk_ragged_indices``, ``build_ragged_indices_from_dense``) included. The
metadata holds what vLLM's builders put there for this batch: per-token window slot lists
(``decode_swa_indices`` / ``prefill_swa_indices`` with their lengths, entries past a row's length
naming a poisoned slot), requests, lengths, block tables, HCA's compressed rows and the prefill
fields vLLM's own (gathering) prefill reads, so that the same layer with the hook off
(``_rocm_mla`` and the in-place flags False) runs vLLM's path (perf/bench_v4_layer.py).

Caches: fp8_ds_mla pages (``rocm_mla.cases.v4_attention.fp8_ds_mla_write``, byte for byte vLLM
0.34's writer; the window in the platform's fp8 kind, the compressed cache in e4m3fn), the CSA
indexer's block-flat C4 key cache (``indexer_k_cache_write``, byte for byte vLLM's compressor:
test_vllm_v4_cache_writers.py); block tables shuffled, every page
no request holds poisoned with NaN codes. The CSA indexer runs through the hook's op
(``V4IndexerOp.forward_hip``) and fills vLLM's ``topk_indices_buffer``.

The reference: the indexer's answer a valid top-k of the float64 logits (``check_indexer_topk``);
the layer output ``mla_v4_attention_ref`` over the global slots each row sees, computed here from
positions (the window's last 128 positions, the compressed rows the buffer or HCA names), with
the sink and the inverse RoPE.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass

import torch

WINDOW = 128  # sliding_window of V4
SWA_BLOCK = 64  # vLLM's window-cache page
PAGE_TOKENS = 256  # tokens per compressed-cache page (get_supported_kernel_block_sizes)
INDEX_HEADS, INDEX_DIM = 64, 128
PREFIX = "model.layers.0.self_attn"
SWA_PREFIX = f"{PREFIX}.swa_cache"
INDEX_PREFIX = f"{PREFIX}.indexer.k_cache"
RATIO = {"window": 1, "csa": 4, "hca": 128}  # V4's compress_ratio = max(1, rate)
# DeepSeek-V4.1: window-only layers are ratio 0; its CSA layers compress 1:1 or 2:1, their index
# caches in 16 x 16 tiles; compressed pages of 64 tokens (128 also occur).
RATIO_V41 = {"window": 0, "csa1": 1, "csa2": 2}
PAGE_TOKENS_V41 = 64
CANDIDATE_BLOCK = 8  # V4.1's candidate_block_size
MODULES = {"v4": ("vllm.models.deepseek_v4.amd.rocm", "DeepseekV4ROCMAiterMLAAttention"),
           "v4.1": ("vllm.models.deepseek_v41.amd.rocm", "DeepseekV41ROCMAiterMLAAttention")}  # fmt: skip


@dataclass(frozen=True)
class V4Request:
    """A request with ``context`` tokens cached before this step and ``query`` rows in it."""

    context: int
    query: int


def hooked_class(model: str = "v4") -> type:
    """rocm_mla's V4 (or V4.1) attention class as ``rocm_mla.vllm.register`` installs it on ROCm."""
    import importlib

    from rocm_mla.vllm import v4_layer

    v4_layer.install()
    mod, name = MODULES[model]
    return getattr(importlib.import_module(mod), name)


class V4Step:
    """A batch through one V4 layer (see the module docstring).

    Args: kind ("window", "csa", "hca"), heads (query heads on this rank), requests (decode and
    MTP requests first: ``num_decodes`` of them), topk (the model's ``index_topk``), dtype (q's),
    device, seed."""

    def __init__(self, kind: str, heads: int, requests: list[V4Request], *, num_decodes: int, topk: int = 512,
                 dtype=torch.bfloat16, device="cpu", seed: int = 0, model: str = "v4"):  # fmt: skip
        from vllm.platforms import current_platform

        from rocm_mla.cases.v4_attention import fp8_ds_mla_poison, fp8_ds_mla_write
        from rocm_mla.ops import indexer_k_cache_write

        ratios = RATIO if model == "v4" else RATIO_V41
        if kind not in ratios:
            raise ValueError(f"V4Step: kind: expected one of {sorted(ratios)} for {model}, got {kind!r}")
        self.model, self.kind, self.H, self.topk, self.dtype = model, kind, heads, topk, dtype
        self.device = dev = torch.device(device)
        self.requests, self.num_decodes = requests, num_decodes
        self.ratio = ratio = ratios[kind]
        self.compressed = kind != "window"
        self.indexed = kind.startswith("csa")  # the layer's top-k comes from the indexer
        self.shuffled = model == "v4.1"  # V4.1's index caches: 16 x 16 tiles
        gen = torch.Generator().manual_seed(seed)

        def randn(*shape, scale=1.0):
            return (torch.randn(*shape, generator=gen) * scale).to(dev)

        def table(pages_per_req: int, spare: int = 3) -> tuple[torch.Tensor, int]:
            n = len(requests) * pages_per_req + spare
            perm = torch.randperm(n, generator=gen)[: len(requests) * pages_per_req]
            return perm.view(len(requests), pages_per_req).to(torch.int32).to(dev), n

        seq = [r.context + r.query for r in requests]
        self.positions = torch.cat([torch.arange(r.context, r.context + r.query) for r in requests]).to(dev)
        self.req = torch.cat([torch.full((r.query,), i) for i, r in enumerate(requests)]).to(torch.int32).to(dev)
        self.T = T = int(self.positions.shape[0])
        self.num_decode_tokens = sum(r.query for r in requests[:num_decodes])
        qsl = [0]
        for r in requests:
            qsl.append(qsl[-1] + r.query)
        self.query_start_loc = torch.tensor(qsl, dtype=torch.int32, device=dev)
        self.seq_lens = torch.tensor(seq, dtype=torch.int32, device=dev)

        # Window cache: every position of every request written (a freed page would be poison).
        self.window_kind = current_platform.fp8_dtype()
        w_pages = max(-(-s // SWA_BLOCK) for s in seq)
        self.w_table, nb = table(w_pages)
        self.window_cache = torch.empty(nb, SWA_BLOCK, 584, dtype=torch.uint8, device=dev)
        fp8_ds_mla_poison(self.window_cache, self.window_kind)
        for i, s in enumerate(seq):
            p = torch.arange(s, device=dev)
            fp8_ds_mla_write(self.window_cache, randn(s, 512), self._slots(self.w_table, i, p, SWA_BLOCK),
                             self.window_kind)  # fmt: skip
        self.poison_slot = int(self.window_cache.shape[0] - 1) * SWA_BLOCK  # a page no request holds

        self.page_tokens = PAGE_TOKENS if model == "v4" else PAGE_TOKENS_V41
        self.cblock = self.page_tokens // ratio if self.compressed else 0
        if self.compressed:
            n_comp = [s // ratio for s in seq]
            self.c_table, nb = table(max(1, max(-(-n // self.cblock) for n in n_comp)))
            self.compressed_cache = torch.empty(nb, self.cblock, 584, dtype=torch.uint8, device=dev)
            fp8_ds_mla_poison(self.compressed_cache, torch.float8_e4m3fn)
            for i, n in enumerate(n_comp):
                j = torch.arange(n, device=dev)
                fp8_ds_mla_write(self.compressed_cache, randn(n, 512), self._slots(self.c_table, i, j, self.cblock),
                                 torch.float8_e4m3fn)  # fmt: skip
        else:
            self.compressed_cache = None

        self.q = randn(T, heads, 512, scale=1.5).to(dtype)
        self.attn_sink = randn(heads, scale=2.0).float()
        max_pos = max(seq) + 8
        ang = torch.rand(max_pos, 32, generator=gen) * 2 * math.pi
        self.cos_sin = torch.cat([ang.cos(), ang.sin()], dim=1).float().to(dev)
        self.scale = 512**-0.5
        self.topk_buffer = torch.full((T, topk), -1, dtype=torch.int32, device=dev)

        if self.indexed:
            # The indexer's key cache: the same pages as the compressed cache (one compressed row
            # per `ratio` tokens), block-flat (V4) or in 16 x 16 tiles (V4.1).
            self.index_cache = torch.full((self.compressed_cache.shape[0], self.cblock, INDEX_DIM + 4), 0xFF,
                                          dtype=torch.uint8, device=dev)  # fmt: skip
            for i, n in enumerate(n_comp):
                j = torch.arange(n, device=dev)
                indexer_k_cache_write(randn(n, INDEX_DIM).to(torch.bfloat16), self.index_cache,
                                      self._slots(self.c_table, i, j, self.cblock).long(),
                                      shuffled=self.shuffled)  # fmt: skip
            self.index_q = randn(T, INDEX_HEADS, INDEX_DIM, scale=2.0).to(current_platform.fp8_dtype())
            self.index_w = randn(T, INDEX_HEADS).float() * INDEX_HEADS**-0.5
        self.layer = self._layer()
        self.metadata = self._metadata()

    @staticmethod
    def _slots(tbl: torch.Tensor, i: int, pos: torch.Tensor, bs: int) -> torch.Tensor:
        return (tbl[i, pos // bs].long() * bs + pos % bs).to(torch.int32)

    def window_slots(self, t: int) -> list[int]:
        """The global window slots row t sees: its request's last 128 positions up to its own."""
        p, r = int(self.positions[t]), int(self.req[t])
        pos = torch.arange(max(0, p - WINDOW + 1), p + 1, device=self.device)
        return self._slots(self.w_table, r, pos, SWA_BLOCK).tolist()

    def compressed_slots(self, t: int) -> list[int]:
        """The global compressed slots row t sees: HCA every compressed row so far, CSA the
        top-k buffer's request-local positions."""
        if not self.compressed:
            return []
        r, p = int(self.req[t]), int(self.positions[t])
        if not self.indexed:
            local = torch.arange((p + 1) // self.ratio, device=self.device)
        else:
            row = self.topk_buffer[t]
            local = row[row >= 0].long()
        return self._slots(self.c_table, r, local, self.cblock).tolist()

    def _dense(self, rows: range, fn, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[len(rows), 1, width]`` int32 lists (past a row's length: a poisoned slot) and lengths."""
        out = torch.full((len(rows), 1, width), self.poison_slot, dtype=torch.int32)
        lens = torch.zeros(len(rows), dtype=torch.int32)
        for k, t in enumerate(rows):
            s = fn(t)
            out[k, 0, : len(s)] = torch.tensor(s, dtype=torch.int32)
            lens[k] = len(s)
        return out.to(self.device), lens.to(self.device)

    def _layer(self):
        cls = hooked_class(self.model)
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._rocm_mla = True
        layer.prefix = layer.layer_name = PREFIX
        layer.compress_ratio = self.ratio
        layer.n_local_heads = self.H
        layer.head_dim, layer.nope_head_dim, layer.rope_head_dim = 512, 448, 64
        layer.scale = self.scale
        layer.window_size = WINDOW
        layer.max_model_len = int(self.seq_lens.max()) + 64
        layer.max_num_batched_tokens = max(self.T, 1)
        layer.max_image_tokens = 0
        layer.attn_sink = self.attn_sink
        layer.rotary_emb = types.SimpleNamespace(cos_sin_cache=self.cos_sin)
        layer.kv_cache = self.compressed_cache
        layer.swa_cache_layer = types.SimpleNamespace(prefix=SWA_PREFIX, kv_cache=self.window_cache)
        layer.topk_indices_buffer = self.topk_buffer
        layer._wo_a_fp8_weight = None
        layer._has_kv_transfer = False
        layer.kv_cache_dtype = "fp8_ds_mla"
        for flag in ("_use_aiter_sparse_mla_decode", "_use_aiter_sparse_mla_prefill", "_use_aiter_sparse_mla"):
            setattr(layer, flag, True)
        if self.model == "v4.1":
            # V4.1's sharing: this layer is its own KV and index source.
            layer.is_kv_source = True
            layer.compressed_cache_prefix = PREFIX if self.compressed else None
            layer._index_source_prefix = PREFIX
            layer._static_forward_context = {PREFIX: layer}
        layer.indexer = None
        if self.indexed:
            from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

            from rocm_mla.vllm.v4_layer import _indexer_op_class

            op_cls = _indexer_op_class(SparseAttnIndexer)
            op = op_cls.__new__(op_cls)
            torch.nn.Module.__init__(op)
            op.k_cache = types.SimpleNamespace(prefix=INDEX_PREFIX, kv_cache=self.index_cache)
            op.topk_tokens, op.compress_ratio = self.topk, self.ratio
            op.topk_indices_buffer = self.topk_buffer
            op.rocm_mla_swa_prefix = SWA_PREFIX
            op.candidate_blocks, op.candidate_write, op.candidate_block_size = None, False, 0
            layer.indexer = types.SimpleNamespace(indexer_op=op)
        return layer

    def use_candidates(self, lists: torch.Tensor | None, *, write: bool, block_size: int = CANDIDATE_BLOCK) -> None:
        """Make the layer's indexer one of V4.1's two-level indexer, as vLLM's model sets it:
        ``write`` the candidate source (its best blocks into ``lists``, vLLM's shared ``[max
        tokens, C]`` buffer), else a later layer that reads them; None: a plain indexer."""
        op = self.layer.indexer.indexer_op
        op.candidate_blocks, op.candidate_write, op.candidate_block_size = lists, write, block_size

    def _metadata(self) -> dict:
        from vllm.models.deepseek_v4.amd.rocm import DeepseekV4ROCMAiterSparseSWAMetadata
        from vllm.v1.attention.ops.rocm_aiter_mla_sparse import build_ragged_indices_from_dense

        Td, T = self.num_decode_tokens, self.T
        dec, pre = range(0, Td), range(Td, T)
        d_idx, d_len = self._dense(dec, self.window_slots, WINDOW)
        p_idx, p_len = self._dense(pre, self.window_slots, WINDOW)
        d_ragged = build_ragged_indices_from_dense(d_idx.reshape(Td, -1), d_len) if Td else (None, None)
        swa = DeepseekV4ROCMAiterSparseSWAMetadata(
            block_table=self.w_table,
            slot_mapping=torch.zeros(T, dtype=torch.int64, device=self.device),
            block_size=SWA_BLOCK,
            seq_lens=self.seq_lens,
            query_start_loc=self.query_start_loc,
            query_start_loc_cpu=self.query_start_loc.cpu(),
            is_valid_token=torch.ones(T, dtype=torch.bool, device=self.device),
            token_to_req_indices=self.req,
            decode_swa_indices=d_idx if Td else None,
            decode_swa_lens=d_len if Td else None,
            decode_swa_width=WINDOW,
            prefill_swa_indices=p_idx if T > Td else None,
            prefill_swa_lens=p_len if T > Td else None,
            num_decodes=self.num_decodes,
            num_prefills=len(self.requests) - self.num_decodes,
            num_decode_tokens=Td,
            num_prefill_tokens=T - Td,
            decode_swa_ragged_indices=d_ragged[0],
            decode_swa_ragged_indptr=d_ragged[1],
            **self._prefill_fields(),
        )
        md = {SWA_PREFIX: swa}
        if self.compressed:
            main = types.SimpleNamespace(block_table=self.c_table, block_size=self.page_tokens,
                                         for_cudagraph_capture=False)  # fmt: skip
            if self.kind == "hca":
                width = int(self.seq_lens.max()) // self.ratio + 1
                g_idx, g_len = self._dense(dec, self.compressed_slots, width)
                main.c128a_global_decode_topk_indices, main.c128a_decode_topk_lens = g_idx, g_len
                r = build_ragged_indices_from_dense(g_idx.reshape(Td, -1), g_len) if Td else (None, None)
                main.c128a_decode_topk_ragged_indices, main.c128a_decode_topk_ragged_indptr = r
                local = torch.full((T - Td, width), -1, dtype=torch.int32)
                for k, t in enumerate(pre):
                    n = (int(self.positions[t]) + 1) // self.ratio
                    local[k, :n] = torch.arange(n)
                main.c128a_prefill_topk_indices = local.to(self.device)
            md[PREFIX] = main
        if self.indexed:
            md[INDEX_PREFIX] = types.SimpleNamespace(num_decode_tokens=Td, num_prefill_tokens=T - Td,
                                                     block_table=self.c_table)  # fmt: skip
        return md

    def _prefill_fields(self) -> dict:
        """The prefill fields vLLM's SWA builder (``_build_deepseek_v4_metadata``) gives a step with
        prefill requests, which vLLM's own prefill (gather and chunk plan) reads: ``[P]`` int32 per
        prefill request (P of them) its length (device and host), gathered rows (its query rows + up
        to window - 1 cached; device) and query rows (host); the window, max_model_len and
        max_num_batched_tokens the chunk plan sizes by. ``{}`` without prefill requests."""
        reqs = self.requests[self.num_decodes :]
        if not reqs:
            return {}
        seq = torch.tensor([r.context + r.query for r in reqs], dtype=torch.int32)
        query = torch.tensor([r.query for r in reqs], dtype=torch.int32)
        gather = query + torch.clamp(seq - query, max=WINDOW - 1)
        return dict(prefill_seq_lens=self.seq_lens[self.num_decodes :], prefill_seq_lens_cpu=seq,
                    prefill_gather_lens=gather.to(self.device), prefill_query_lens_cpu=query,
                    prefill_window_size=WINDOW, prefill_max_model_len=self.layer.max_model_len,
                    prefill_max_num_batched_tokens=self.layer.max_num_batched_tokens)  # fmt: skip

    def run(self, vllm_config) -> torch.Tensor:
        """The layer's step under this step's forward context: the CSA indexer (rocm_mla's op in
        vLLM's indexer seat), then vLLM's ``forward_mqa``. Returns the output ``[T, H, 512]``
        (poisoned with NaN before the step)."""
        from vllm.forward_context import set_forward_context

        out = torch.full((self.T, self.H, 512), float("nan"), dtype=self.dtype, device=self.device)
        with set_forward_context(self.metadata, vllm_config):
            if self.indexed:
                self.topk_buffer.fill_(-1)
                self.layer.indexer.indexer_op.forward_hip(None, self.index_q, None, self.index_w)
            self.layer.forward_mqa(self.q, None, self.positions, out)
        return out

    def index_logits(self) -> list[torch.Tensor | None]:
        """The float64 indexer logits of every row over the compressed rows it sees."""
        from rocm_mla.reference.indexer_topk import mla_indexer_logits_ref

        kv = torch.div(self.positions + 1, self.ratio, rounding_mode="floor").to(torch.int32)
        return mla_indexer_logits_ref(self.index_q, self.index_w, self.index_cache, self.c_table, self.req, kv,
                                      shuffled=self.shuffled)  # fmt: skip

    def reference(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, lse)`` float32 of the float64 reference over the slots each row sees."""
        from rocm_mla.reference.v4_attention import mla_v4_attention_ref

        def dense(fn):
            rows = [fn(t) for t in range(self.T)]
            width = max(1, max(len(r) for r in rows))
            d = torch.full((self.T, width), -1, dtype=torch.int32)
            for t, r in enumerate(rows):
                d[t, : len(r)] = torch.tensor(r, dtype=torch.int32)
            return d.to(self.device)

        c_list = dense(self.compressed_slots) if self.compressed else None
        return mla_v4_attention_ref(
            self.q, self.window_cache, dense(self.window_slots), None, self.compressed_cache, c_list, None,
            self.attn_sink, self.positions, self.cos_sin, self.scale,
            window_kind=self.window_kind, compressed_kind=torch.float8_e4m3fn if self.compressed else None,
        )  # fmt: skip


__all__ = ["V4Request", "V4Step", "hooked_class", "WINDOW", "RATIO"]


# ------------------------------------------------------------------ the cases the tests run
# (name, model, kind, heads, requests, num_decodes, topk): decode, MTP (2 rows) and prefill rows
# with context in one step; contexts past topk x ratio tokens (the indexer selects) and short ones
# (every compressed row). V4: V4-Flash 8 heads a rank (TP8), V4-Pro 16 (TP8); 64 and 128 (TP1)
# on the GPU. V4.1 (64 heads): 8 a rank, 64 on the GPU.
_MIXED = [V4Request(40, 1), V4Request(300, 2), V4Request(0, 9), V4Request(130, 5)]
_LONG = [V4Request(900, 1), V4Request(2100, 2), V4Request(0, 300), V4Request(700, 40)]
CPU_CASES = [(f"v4-{k}-h{h}", "v4", k, h, _MIXED, 2, 32) for k in ("window", "csa", "hca") for h in (8, 16)] + [
    (f"v4.1-{k}-h8", "v4.1", k, 8, _MIXED, 2, 32) for k in ("window", "csa1", "csa2")
]
_V4_KINDS = ("window", "csa", "hca")
GPU_CASES = [(f"v4-{k}-h{h}", "v4", k, h, _LONG, 2, 512) for k in _V4_KINDS for h in (8, 16, 64, 128)] + [
    (f"v4.1-{k}-h{h}", "v4.1", k, h, _LONG, 2, 512) for k in ("window", "csa1", "csa2") for h in (8, 64)
]


def run_cases(cases, device: str, dtype) -> dict:
    """Each case's step through vLLM's layer code: {name: {"out": problem or "", "indexer": ...,
    "nan_row": ...}} (the JSON the tests read)."""
    from vllm.config import VllmConfig

    from rocm_mla.cases._compare import compare
    from rocm_mla.cases.v4_attention import TOLERANCE
    from rocm_mla.reference.indexer_topk import check_indexer_topk

    vc = VllmConfig()
    res = {}
    for name, model, kind, heads, reqs, nd, topk in cases:
        step = V4Step(kind, heads, reqs, num_decodes=nd, topk=topk, dtype=dtype, device=device, seed=len(res),
                      model=model)  # fmt: skip
        out = step.run(vc)
        ro, _ = step.reference()
        r = {"out": compare("out", out.float(), ro, TOLERANCE[dtype]["out"]).problem}
        if step.indexed:
            r["indexer"] = check_indexer_topk(step.topk_buffer, step.index_logits(), topk)
            # A NaN in one index key a row sees (its scale): that row's indexer answer is the
            # sentinel and its attention output NaN (vLLM's list builders would drop -2 entries).
            t = step.T - 1
            slot = step.compressed_slots(t)[0] if step.compressed_slots(t) else None
            if slot is not None:
                pg, off = divmod(slot, step.cblock)
                # A page holds its fp8 values (either layout), then their float32 scales.
                at = step.cblock * INDEX_DIM + off * 4
                step.index_cache[pg].view(-1)[at : at + 4] = torch.tensor([0, 0, 0xC0, 0x7F], dtype=torch.uint8)
                out = step.run(vc)
                nan_rows = torch.isnan(out.float()).flatten(1).all(dim=1)
                r["nan_row"] = bool(nan_rows[t]) and bool((step.topk_buffer[t] == -2).all())
                others = [u for u in range(step.T) if int(step.req[u]) != int(step.req[t])]
                r["other_rows_finite"] = bool(torch.isfinite(out.float()[others]).all())
        res[name] = r
    return res


# V4.1's two-level indexer at ratio 1: (name, heads, requests, num_decodes, topk, candidate lists);
# the lists cover more keys than topk and fewer than the long rows see.
CPU_CANDIDATE_CASES = [("v4.1-csa1-candidates-h8", 8, _MIXED, 2, 32, 6)]
GPU_CANDIDATE_CASES = [("v4.1-csa1-candidates-h64", 64, _LONG, 2, 512, 128)]


def candidate_cases(cases, device: str, dtype) -> dict:
    """Each case's candidate source step (its own top-k and its lists into a shared buffer), then
    the same layer as a later index layer reading those lists: {name: {"two_level": the pair's
    problem (``cases.indexer_topk.two_level_problem``: the source's top-k, its lists with every
    row's newest block, the buffer's rows past T untouched, the masked top-k) or "", "out": the
    masked step's output against the reference}}."""
    from vllm.config import VllmConfig

    from rocm_mla.cases._compare import compare
    from rocm_mla.cases.indexer_topk import POISON_LISTS, two_level_problem
    from rocm_mla.cases.v4_attention import TOLERANCE

    vc = VllmConfig()
    res = {}
    for name, heads, reqs, nd, topk, C in cases:
        step = V4Step("csa1", heads, reqs, num_decodes=nd, topk=topk, dtype=dtype, device=device, seed=11,
                      model="v4.1")  # fmt: skip
        lists = torch.full((step.T + 4, C), POISON_LISTS, dtype=torch.int32, device=step.device)
        step.use_candidates(lists, write=True)
        step.run(vc)
        own = step.topk_buffer.clone()
        step.use_candidates(lists, write=False)
        out = step.run(vc)
        kv_lens = step.positions + 1  # ratio 1: a row sees its position's compressed rows and those before
        problem = two_level_problem(own, lists, step.topk_buffer, step.index_logits(), kv_lens, topk, CANDIDATE_BLOCK)
        ro, _ = step.reference()
        res[name] = {"two_level": problem, "out": compare("out", out.float(), ro, TOLERANCE[dtype]["out"]).problem}
    return res


def graph_cases(device: str, dtype) -> dict:
    """A decode step (decode and MTP rows) of each kind captured in a CUDA graph and replayed:
    {model-kind: "" when the replay equals the eager step bit for bit, else what differed}."""
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    from rocm_mla.cases.indexer_topk import POISON_LISTS

    vc = VllmConfig()
    res = {}
    kinds = [("v4", k, None) for k in ("window", "csa", "hca")]
    kinds += [("v4.1", "csa1", c) for c in (None, "select", "mask")]
    for model, kind, cand in kinds:
        step = V4Step(kind, 16, [V4Request(2100, 1), V4Request(700, 2), V4Request(3000, 1)], num_decodes=3,
                      topk=512, dtype=dtype, device=device, seed=7, model=model)  # fmt: skip
        if cand is not None:  # the two-level indexer's layers: the source's lists, then a masked layer
            lists = torch.full((step.T, 128), POISON_LISTS, dtype=torch.int32, device=step.device)
            step.use_candidates(lists, write=True)
            if cand == "mask":
                step.run(vc)
                step.use_candidates(lists, write=False)
        eager = step.run(vc)
        out = torch.full_like(eager, float("nan"))
        g = torch.cuda.CUDAGraph()
        with set_forward_context(step.metadata, vc):
            with torch.cuda.graph(g):
                if step.indexed:
                    step.layer.indexer.indexer_op.forward_hip(None, step.index_q, None, step.index_w)
                step.layer.forward_mqa(step.q, None, step.positions, out)
        step.topk_buffer.fill_(-1)
        g.replay()
        torch.cuda.synchronize()
        diff = (out.float() - eager.float()).abs().max().item()
        res[f"{model}-{kind}" + (f"-{cand}" if cand else "")] = "" if torch.equal(out, eager) else f"max diff {diff}"
    return res


def main() -> None:
    """``python -m vllm_harness.v4_step [gpu]``: the cases' results as one JSON line."""
    import json
    import sys

    from vllm_harness.layer_step import use_simulated_gfx942_platform

    use_simulated_gfx942_platform()
    gpu = len(sys.argv) > 1 and sys.argv[1] == "gpu"
    cases, dev, dt = (GPU_CASES, "cuda", torch.bfloat16) if gpu else (CPU_CASES, "cpu", torch.float16)
    res = run_cases(cases, dev, dt)
    res.update(candidate_cases(GPU_CANDIDATE_CASES if gpu else CPU_CANDIDATE_CASES, dev, dt))
    if gpu:
        res["graph"] = graph_cases(dev, dt)
    print("V4STEP " + json.dumps(res))


if __name__ == "__main__":
    main()
