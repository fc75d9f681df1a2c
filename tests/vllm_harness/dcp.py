"""Decode context parallelism (DCP) with the ROCM_MLA decode, checked through vLLM's own DCP code.

What vLLM (0.33, 0.34) does for MLA decode rows under DCP (no PCP), with W DCP ranks that are also TP ranks:

1. KV shards, token-interleaved (vllm/v1/worker/block_table.py, ``ComputeSlotMappingKernel``): with
   ``I = cp_kv_cache_interleave_size`` and virtual blocks of ``block_size * W`` positions, token
   position ``p`` lives on rank ``((p % (block_size*W)) // I) % W`` at local offset
   ``((p % (block_size*W)) // (W*I)) * I + p % I`` of page ``block_table[req, p // (block_size*W)]``
   (:func:`dcp_slot_mapping`). The decode then reads a contiguous local sequence of
   ``get_dcp_local_seq_lens(seq_lens, W, rank, I)`` tokens through the same block table
   (``MLACommonMetadataBuilder.build``: ``decode.seq_lens = dcp_local_seq_lens``, ``max_seq_len`` =
   ``ceil(max_seq_len / (W*I)) * I``); the DCP builder forces decode rows to q_len 1.
2. Query (``MLAAttention.forward_impl``): each rank's ``(ql_nope, q_pe)`` for its N/W heads is
   concatenated and all-gathered over the DCP group along heads
   (``MLADCPManager._gather_query``: ``group.all_gather(q, dim=1)``), so ``forward_mqa`` gets one
   ``[B, N, 576]`` tensor and attends all N heads over the local shard -> out ``[B, N, 512]``, lse.
3. Combine (``MLADCPManager.combine`` = ``cp_lse_ag_out_rs`` in vllm/v1/attention/ops/dcp.py, with
   ``is_lse_base_on_e = impl.lse_base_on_e`` = True): lse of rows whose local sequence is empty set to
   -inf (``mask_dcp_empty_shards_``), lse all-gathered (dim 0), ``correct_attn_out`` (a Triton kernel)
   scales out by ``exp(lse_rank - logsumexp_ranks(lse))``, ``reduce_scatter`` over heads (dim 1) sums
   the ranks and leaves each rank its N/W heads; then W_UV.

:func:`emulate` runs that math for W ranks in one process -- vLLM's functions themselves
(``get_dcp_local_seq_lens``, ``MLADCPManager._gather_query``, ``cp_lse_ag_out_rs`` with its
``correct_attn_out`` kernel and ``mask_dcp_empty_shards_``) with the collectives of
``DeviceCommunicatorBase`` (what ``GroupCoordinator.all_gather`` / ``reduce_scatter`` compute)
emulated across the ranks, and the ROCM_MLA impl's ``forward_mqa`` on each shard -- against the
1-rank layer step. ``perf/dcp_two_ranks.py`` runs the real thing: two processes, vLLM's
distributed groups (TP=2, DCP=2) on NCCL (gloo on CPU) and ``MLAAttention.forward_impl``.

On a CPU-only machine vLLM replaces Triton by a placeholder unless the visible-devices variable of
the platform is set and empty (vllm/triton_utils/importing.py: a "distributed environment");
:func:`cpu_env` sets ``HIP_VISIBLE_DEVICES=""`` (the simulated platform is ROCm) so that vLLM's
``correct_attn_out`` kernel runs in the Triton interpreter.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import torch

from . import layer_step as H
from . import process_weights

KV_LORA_RANK, QK_ROPE = H.KV_LORA_RANK, H.QK_ROPE
# Decode requests (context, 1 new token): long, short, one whose single token leaves rank 1 empty,
# one not a multiple of the interleave, one exactly a virtual block.
DECODE_BATCH = [H.Request(90, 1), H.Request(17, 1), H.Request(0, 1), H.Request(40, 1), H.Request(31, 1)]


def cpu_env() -> dict[str, str]:
    """Environment for a child process that imports this harness (tests/ on PYTHONPATH) and, on a
    machine without a GPU, runs vLLM's Triton kernels interpreted."""
    env = dict(os.environ)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, env.get("PYTHONPATH")]))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
        env["HIP_VISIBLE_DEVICES"] = ""
    return env


def interpreter_shims() -> None:
    """Under ``TRITON_INTERPRET=1`` ``triton.jit`` returns an ``InterpretedFunction``, which lacks
    the ``constexprs`` index list that vLLM's Triton launcher reads from a ``JITFunction``
    (``CorrectAttnCPOutKernel.__call__``): give vLLM's kernel object the same list. No effect
    when Triton compiles."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import inspect

    from vllm.v1.attention.ops import dcp

    k = dcp._CORRECT_ATTN_CP_OUT_KERNEL.kernel
    if not hasattr(k, "constexprs") and hasattr(k, "fn"):
        params = list(inspect.signature(k.fn).parameters.values())
        k.constexprs = [i for i, p in enumerate(params) if "constexpr" in str(p.annotation)]


def dcp_slot_mapping(
    positions: torch.Tensor,
    req: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    world: int,
    rank: int,
    interleave: int,
) -> torch.Tensor:
    """vLLM's ``ComputeSlotMappingKernel`` (block_table.py) in torch: the slot of each token
    on ``rank`` (-1 where another rank holds it)."""
    vbs = block_size * world
    vbi = positions // vbs
    vbo = positions - vbi * vbs
    local = (vbo // interleave) % world == rank
    off = (vbo // (world * interleave)) * interleave + vbo % interleave
    page = block_table[req, vbi].long()
    return torch.where(local, page * block_size + off, torch.full_like(positions, -1))


class EmulatedGroup:
    """The part of vLLM's ``GroupCoordinator`` that ``_gather_query`` and ``cp_lse_ag_out_rs`` use,
    for ``world`` ranks emulated one after the other in one process, with the semantics of
    ``DeviceCommunicatorBase.all_gather`` / ``reduce_scatter``.

    ``all_gather``: every rank's input is known beforehand (``expect(step, tensors)``); the call
    checks that the caller passes its own, then returns the gathered tensor. ``reduce_scatter``:
    records the input and returns a tensor that :meth:`finish` fills once every rank has run.
    """

    def __init__(self, world: int):
        self.world = world
        self._expected: dict[str, list[torch.Tensor]] = {}
        self._pending: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}

    def expect(self, step: str, tensors: list[torch.Tensor]) -> None:
        self._expected[step] = tensors

    def rank(self, r: int, step: str) -> SimpleNamespace:
        g = self

        def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
            mine = g._expected[step][r]
            assert x.shape == mine.shape and torch.equal(x, mine), f"rank {r} all_gather({step}): unexpected input"
            if dim < 0:
                dim += x.dim()
            # DeviceCommunicatorBase.all_gather: concat along dim 0, then move the rank dim to `dim`
            out = torch.cat([t.contiguous() for t in g._expected[step]], dim=0)
            out = out.reshape((g.world,) + tuple(x.shape)).movedim(0, dim)
            return out.reshape(tuple(x.shape[:dim]) + (g.world * x.shape[dim],) + tuple(x.shape[dim + 1 :]))

        def reduce_scatter(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
            if dim < 0:
                dim += x.dim()
            shape = list(x.shape)
            shape[dim] //= g.world
            out = torch.empty(shape, dtype=x.dtype, device=x.device)
            g._pending[r] = (x.clone(), dim, out)
            return out

        return SimpleNamespace(
            world_size=self.world, rank_in_group=r, all_gather=all_gather, reduce_scatter=reduce_scatter
        )

    def finish(self) -> None:
        """Complete the reduce_scatter: sum of the ranks' inputs (in their dtype, as NCCL does),
        chunk ``r`` of ``dim`` to rank ``r``."""
        assert sorted(self._pending) == list(range(self.world))
        x0, dim, _ = self._pending[0]
        total = torch.stack([self._pending[r][0].movedim(dim, 0) for r in range(self.world)]).sum(0, dtype=x0.dtype)
        for r in range(self.world):
            self._pending[r][2].copy_(total.chunk(self.world, 0)[r].movedim(0, dim))
        self._pending.clear()


def local_cache(step: H.LayerStep, world: int, rank: int, interleave: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s KV shard of every token of ``step`` (context and new), written by the
    ROCM_MLA impl's KV write through vLLM's DCP slot mapping; returns (cache, local seq_lens)."""
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    cache = H.nan_cache(step.kv_cache.shape[0], step.bs, step.dtype, step.fp8, step.device)
    counts = []
    for i, r in enumerate(step.requests):
        S = r.context + r.query
        pos = torch.arange(S, device=step.device)
        slots = dcp_slot_mapping(pos, torch.full_like(pos, i), step.block_table, step.bs, world, rank, interleave)
        counts.append(int((slots >= 0).sum()))
        step.layer.impl.do_kv_cache_update(
            step.kv_c[i], step.k_pe[i][:, None, :], cache, slots, step.kv_cache_dtype, step.layer._k_scale
        )
    seq_lens = torch.tensor([r.context + r.query for r in step.requests], dtype=torch.int32)
    local = get_dcp_local_seq_lens(seq_lens, world, rank, interleave)
    assert local.tolist() == counts, (local.tolist(), counts)  # vLLM's two formulas agree
    return cache, local.to(step.device)


def emulate(step: H.LayerStep, world: int = 2, interleave: int = 1) -> dict:
    """Run vLLM's DCP decode math for ``world`` ranks in one process on ``step`` (a world-1 ROCM_MLA
    LayerStep of decode requests, N heads = all ranks' heads); returns max errors against the
    1-rank layer step and the float32 reference, and facts checked on the way."""
    from vllm.v1.attention.ops.dcp import MLADCPManager, cp_lse_ag_out_rs

    interpreter_shims()
    impl, layer = step.layer.impl, step.layer
    assert impl.lse_base_on_e and impl.can_return_lse_for_decode
    md = step.metadata
    assert md.num_prefills == 0, "DCP check: decode rows only"
    B, N = md.num_decodes, step.N
    assert N % world == 0
    Nl = N // world
    calls = step.capture_backend_calls()  # the 1-rank step; its forward_mqa call and result
    ((_, (q1, cache1, md1, _), _),) = [c for c in calls if c[0] == "forward_mqa"]
    out_1rank_step = step.output.clone()
    o1, lse1 = impl.forward_mqa(q1, cache1, md1, layer)
    ql_nope, q_pe = q1  # [B, N, 512] (W_UK_T applied), [B, N, 64]

    group = EmulatedGroup(world)
    # 2. per rank: its heads' (ql_nope, q_pe) concatenated, then vLLM's all-gather over heads
    q_ranks = [
        torch.cat((ql_nope[:, r * Nl : (r + 1) * Nl], q_pe[:, r * Nl : (r + 1) * Nl]), dim=-1) for r in range(world)
    ]
    group.expect("q", q_ranks)
    shards = [local_cache(step, world, r, interleave) for r in range(world)]
    qsl = md.query_start_loc[: B + 1]
    max_seq = int(md.max_seq_len)
    outs, lses, masked = [], [], []
    for r in range(world):
        q_all = MLADCPManager._gather_query(
            SimpleNamespace(group=group.rank(r, "q"), padded_num_heads=None), q_ranks[r]
        )
        assert torch.equal(q_all, torch.cat(q1, dim=-1))
        cache, local = shards[r]
        dmd = SimpleNamespace(
            decode=SimpleNamespace(block_table=md.decode.block_table, seq_lens=local),
            max_seq_len=math.ceil(max_seq / (world * interleave)) * interleave,
        )
        o, lse = impl.forward_mqa(q_all, cache, dmd, layer)  # 3. ROCM_MLA decode on the shard
        outs.append(o)
        lses.append(lse)
        from vllm.v1.attention.ops.dcp import mask_dcp_empty_shards_

        m = lse.contiguous().clone()
        mask_dcp_empty_shards_(m, local, qsl)
        masked.append(m)
    group.expect("lse", masked)
    combined = []
    for r in range(world):  # 4. vLLM's combine, as MLADCPManager.combine calls it
        combined.append(
            cp_lse_ag_out_rs(
                outs[r],
                lses[r],
                cp_group=group.rank(r, "lse"),
                is_lse_base_on_e=True,
                seq_lens=shards[r][1],
                query_start_loc=qsl,
            )
        )
    group.finish()
    o_dcp = torch.cat(combined, dim=1)  # [B, N, 512], rank r's heads at [r*Nl, (r+1)*Nl)
    # 5. W_UV (vLLM's _v_up_proj) per rank = on the whole [B, N, 512]
    out_dcp = torch.empty_like(step.output)
    layer._v_up_proj(o_dcp, out=out_dcp)
    ref = step.reference()
    scale = max(1.0, ref.abs().max().item())
    empty = [int((s[1] == 0).sum()) for s in shards]
    return {
        "world": world,
        "interleave": interleave,
        "num_heads": N,
        "block_size": step.bs,
        "kv_cache_dtype": step.kv_cache_dtype,
        "empty_shard_rows": empty,
        "local_seq_lens": [s[1].tolist() for s in shards],
        "max_err_latent_vs_1rank": (o_dcp.float() - o1.float()).abs().max().item(),
        "max_err_out_vs_1rank": (out_dcp.float() - out_1rank_step.float()).abs().max().item(),
        "max_err_out_vs_fp32": (out_dcp.float() - ref).abs().max().item(),
        "max_err_1rank_vs_fp32": (out_1rank_step.float() - ref).abs().max().item(),
        "ref_scale": scale,
        "finite": bool(torch.isfinite(out_dcp).all()),
        "lse_1rank_finite": bool(torch.isfinite(lse1).all()),
    }


# ---------------------------------------------------------------- the real thing: W processes

BASE_COMMUNICATOR = "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"


def prepare_case(step: H.LayerStep) -> dict:
    """What every rank needs of a world-1 ROCM_MLA layer step of decode requests (run here): its
    inputs, weights, block table, the 1-rank output and the float32 reference (CPU tensors)."""
    out = step.run().clone()
    cpu = lambda t: t.detach().cpu()  # noqa: E731
    return {
        "requests": [(r.context, r.query) for r in step.requests],
        "num_heads": step.N,
        "dtype": str(step.dtype),
        "kv_cache_dtype": step.kv_cache_dtype,
        "block_size": step.bs,
        "k_scale": float(step.layer._k_scale),
        "kv_c": [cpu(t) for t in step.kv_c],
        "k_pe": [cpu(t) for t in step.k_pe],
        "q": cpu(step.q_all),
        "kv_b_proj": cpu(step.layer.kv_b_proj.weight),
        "block_table": cpu(step.block_table),
        "num_blocks": step.kv_cache.shape[0],
        "out_1rank": cpu(out),
        "reference": cpu(step.reference()),
    }


def init_vllm_dcp(rank: int, world: int, port: int, backend: str, communicator: str, interleave: int):
    """vLLM's distributed environment for one rank: TP = DCP = ``world`` (DCP reuses the TP
    ranks), custom all-reduce off. Returns the VllmConfig. ``communicator``: "base" (vLLM's
    ``DeviceCommunicatorBase``: torch.distributed collectives on the device group, NCCL or gloo)
    or "platform" (the platform's, ROCm's ``CudaCommunicator``: PyNccl). On CPU (gloo) the
    collectives are called directly rather than through vLLM's custom ops, which ROCm registers
    for the "CUDA" dispatch key only."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.platforms import current_platform

    cls = type(current_platform)
    if communicator == "base":
        cls.get_device_communicator_cls = classmethod(lambda c: BASE_COMMUNICATOR)
    if backend == "gloo":
        cls.use_custom_op_collectives = classmethod(lambda c: False)
    if torch.cuda.is_available():
        torch.cuda.set_device(rank)
    ps.set_custom_all_reduce(False)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    vc = VllmConfig(
        model_config=ModelConfig(
            model=H._tiny_deepseek_v3_dir(), skip_tokenizer_init=True, max_model_len=4096, dtype=torch.bfloat16
        ),
        cache_config=CacheConfig(block_size=16),
        parallel_config=ParallelConfig(
            tensor_parallel_size=world,
            decode_context_parallel_size=world,
            cp_kv_cache_interleave_size=interleave,
            disable_custom_all_reduce=True,
        ),
        device_config=DeviceConfig(device=dev),
    )
    with set_current_vllm_config(vc):
        ps.init_distributed_environment(
            world_size=world,
            rank=rank,
            local_rank=rank,
            backend=backend,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
        )
        ps.initialize_model_parallel(tensor_model_parallel_size=world, decode_context_model_parallel_size=world)
    return vc


def run_rank_case(case: dict, rank: int, world: int, interleave: int) -> dict:
    """One decode step of ``case`` on this rank through vLLM's own DCP path: an MLAAttention
    layer (ROCM_MLA) with this TP rank's heads and kv_b_proj shard, this rank's KV shard, vLLM's
    metadata builder with ``dcp_local_seq_lens``, then ``MLAAttention.forward_impl`` (W_UK bmm,
    cat + DCP all-gather of the heads, ROCM_MLA forward_mqa on the shard, cp_lse_ag_out_rs,
    W_UV). Returns this rank's errors against the 1-rank output and the float32 reference."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.attention import AttentionConfig
    from vllm.distributed import get_dcp_group
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.layers.linear import ColumnParallelLinear
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    from rocm_mla.vllm.backend import RocmMLABackend

    interpreter_shims()
    dev = torch.device(f"cuda:{rank}" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, case["dtype"].replace("torch.", ""))
    N, bs, kvd = case["num_heads"], case["block_size"], case["kv_cache_dtype"]
    Nl = N // world
    reqs = [H.Request(c, q) for c, q in case["requests"]]
    assert all(r.query == 1 for r in reqs), "DCP decode rows have q_len 1 (vLLM forces it)"
    fp8 = kvd in H.VLLM_FP8_KV_CACHE_DTYPES
    vc = VllmConfig(
        model_config=ModelConfig(
            model=H._tiny_deepseek_v3_dir(), skip_tokenizer_init=True, max_model_len=4096, dtype=dtype
        ),
        cache_config=CacheConfig(block_size=bs, cache_dtype=kvd),
        parallel_config=ParallelConfig(
            tensor_parallel_size=world,
            decode_context_parallel_size=world,
            cp_kv_cache_interleave_size=interleave,
            disable_custom_all_reduce=True,
        ),
        device_config=DeviceConfig(device=dev.type),
        attention_config=AttentionConfig(backend="ROCM_MLA", mla_prefill_backend="ROCM_MLA"),
    )
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with set_current_vllm_config(vc), torch.device(dev):
            kvb = ColumnParallelLinear(
                KV_LORA_RANK, N * (H.QK_NOPE + H.V_HEAD), bias=False, prefix="model.layers.0.self_attn.kv_b_proj"
            )
            rows = Nl * (H.QK_NOPE + H.V_HEAD)
            assert kvb.weight.shape[0] == rows, "ColumnParallelLinear did not shard over the TP ranks"
            kvb.weight.data.copy_(case["kv_b_proj"][rank * rows : (rank + 1) * rows])
            layer = MLAAttention(
                num_heads=Nl,
                scale=1.0 / math.sqrt(H.QK_NOPE + QK_ROPE),
                qk_nope_head_dim=H.QK_NOPE,
                qk_rope_head_dim=QK_ROPE,
                v_head_dim=H.V_HEAD,
                q_lora_rank=None,
                kv_lora_rank=KV_LORA_RANK,
                kv_b_proj=kvb,
                cache_config=vc.cache_config,
                prefix="model.layers.0.self_attn.attn",
                attn_backend=RocmMLABackend,
            )
            process_weights(layer, dtype)
            if fp8:
                layer._k_scale.fill_(case["k_scale"])
                layer._k_scale_float = case["k_scale"]
            spec = layer.get_kv_cache_spec(vc)
            builder = RocmMLABackend.get_builder_cls()(spec, [layer.layer_name], vc, dev)
    finally:
        torch.set_default_dtype(prev)
    impl = layer.impl
    assert impl.dcp_world_size == world and get_dcp_group().world_size == world
    assert layer.dcp_manager is not None and builder.reorder_batch_threshold == 1

    bt = case["block_table"].to(dev)
    cache = H.nan_cache(case["num_blocks"], bs, dtype, fp8, dev)
    new_slots = []
    for i, r in enumerate(reqs):  # cached context: this rank's share, through the backend's KV write
        pos = torch.arange(r.context + r.query, device=dev)
        slots = dcp_slot_mapping(pos, torch.full_like(pos, i), bt, bs, world, rank, interleave)
        kv_c, k_pe = case["kv_c"][i].to(dev), case["k_pe"][i].to(dev)
        if r.context:
            impl.do_kv_cache_update(
                kv_c[: r.context], k_pe[: r.context, None, :], cache, slots[: r.context], kvd, layer._k_scale
            )
        new_slots.append(slots[r.context :])
    kv_c_new = torch.cat([case["kv_c"][i][r.context :] for i, r in enumerate(reqs)]).to(dev)
    k_pe_new = torch.cat([case["k_pe"][i][r.context :] for i, r in enumerate(reqs)]).to(dev).unsqueeze(1)
    slot_mapping = torch.cat(new_slots)
    seq_lens = torch.tensor([r.context + r.query for r in reqs], dtype=torch.int32)
    local = get_dcp_local_seq_lens(seq_lens, world, rank, interleave)
    B = len(reqs)
    qsl = torch.arange(B + 1, dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl.to(dev),
        query_start_loc_cpu=qsl,
        seq_lens=seq_lens.to(dev),
        num_reqs=B,
        num_actual_tokens=B,
        max_query_len=1,
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=bt,
        slot_mapping=slot_mapping,
        seq_lens_cpu_upper_bound=seq_lens,
        dcp_local_seq_lens=local.to(dev),
        dcp_local_seq_lens_cpu_upper_bound=local,
    )
    md = builder.build(0, common)
    assert md.num_decodes == B and md.decode.seq_lens.tolist() == local.tolist()

    seen = {"q_heads": [], "combine": 0}
    fwd, comb = impl.forward_mqa, layer.dcp_manager.combine

    def forward_mqa(q, *a, **k):
        seen["q_heads"].append(q.shape[1] if isinstance(q, torch.Tensor) else None)
        return fwd(q, *a, **k)

    def combine(*a, **k):
        seen["combine"] += 1
        return comb(*a, **k)

    impl.forward_mqa, layer.dcp_manager.combine = forward_mqa, combine
    q = case["q"].to(dev)[:, rank * Nl : (rank + 1) * Nl]  # this TP rank's heads
    out = torch.empty(B, Nl * H.V_HEAD, dtype=dtype, device=dev)
    with set_current_vllm_config(vc):
        layer.update_kv_cache(kv_c_new, k_pe_new, cache, slot_mapping, md, kvd, layer._k_scale)
        layer.forward_impl(q, kv_c_new, k_pe_new, cache, md, output=out)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    cols = slice(rank * Nl * H.V_HEAD, (rank + 1) * Nl * H.V_HEAD)
    one, ref = case["out_1rank"][:, cols].float(), case["reference"][:, cols].float()
    got = out.float().cpu()
    comm = get_dcp_group().device_communicator
    pynccl = getattr(comm, "pynccl_comm", None)
    return {
        "rank": rank,
        "local_seq_lens": local.tolist(),
        "forward_mqa_q_heads": seen["q_heads"],
        "dcp_communicator": type(comm).__name__,
        "pynccl": None if pynccl is None else ("disabled" if pynccl.disabled else "enabled"),
        "dcp_combine_calls": seen["combine"],
        "finite": bool(torch.isfinite(got).all()),
        "max_err_vs_1rank": (got - one).abs().max().item(),
        "max_err_vs_fp32": (got - ref).abs().max().item(),
        "max_err_1rank_vs_fp32": (one - ref).abs().max().item(),
        "ref_scale": max(1.0, ref.abs().max().item()),
    }


def main(argv=None) -> int:
    """``python -m vllm_harness.dcp [--case WORLD:INTERLEAVE:BLOCK:HEADS:DTYPE:KV_CACHE_DTYPE ...]``:
    the one-process emulation; prints one ``DCP_RESULT {json}`` line per case. Tests run it in a
    child process with :func:`cpu_env` (on CPU)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_dtype = "float32" if not torch.cuda.is_available() else "bfloat16"
    ap.add_argument(
        "--case",
        action="append",
        default=None,
        help=f"WORLD:INTERLEAVE:BLOCK:HEADS:DTYPE:KV (default 2:1:16:16:{default_dtype}:auto)",
    )
    args = ap.parse_args(argv)
    H.use_simulated_gfx942_platform()
    from rocm_mla.vllm import register

    register()
    from vllm.triton_utils import HAS_TRITON

    from rocm_mla.vllm.backend import RocmMLABackend

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for spec in args.case or [f"2:1:16:16:{default_dtype}:auto"]:
        world, interleave, block, heads, dtype, kvd = spec.split(":")
        step = H.LayerStep(
            RocmMLABackend,
            DECODE_BATCH,
            num_heads=int(heads),
            dtype=getattr(torch, dtype),
            device=dev,
            kv_cache_dtype=kvd,
            block_size=int(block),
            k_scale=0.05,
        )
        res = emulate(step, int(world), int(interleave))
        res["dtype"], res["vllm_triton"] = dtype, bool(HAS_TRITON)
        print("DCP_RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
