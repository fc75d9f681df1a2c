"""mla_v4_attention: DeepSeek-V4 attention (window, compressed-sparse and heavily-compressed layers)
over vLLM's fp8_ds_mla caches, with the attention sink and the inverse RoPE fused, in place.

Kernel: rocm_mla/kernels/v4_attention.py (Triton) and the shared split-K reduce of
rocm_mla/kernels/latent_core.py for split rows. Reference: rocm_mla/reference/v4_attention.py. The
plan (``plan_v4_attention``, rocm_mla/ops/v4_attention_plan.py, or ``plan_v4_attention_for`` here)
is made once per step and passed to every layer's call; the call checks its tensors against it
(``V4Plan.matches``) before any backend runs, then launches what it says.
"""

from __future__ import annotations

from typing import Any

import torch

from ..kernels.latent_core import mla_decode_reduce_kernel
from ..kernels.v4_attention import mla_v4_attention_kernel
from ..reference.v4_attention import mla_v4_attention_ref
from ..triton_common import INT32_MAX
from ._checks import FLOAT_DTYPES, Checker
from ._launch import kernel_launch
from .latent_core import launch_args
from .v4_attention_plan import FP8_DS_MLA_TOKEN_BYTES, HEAD_DIM, OP, ROPE_DIM, V4Plan, plan_v4_attention


def mla_v4_attention(
    q: torch.Tensor,
    window_cache: torch.Tensor,
    window_indices: torch.Tensor,
    window_indptr: torch.Tensor | None = None,
    compressed_cache: torch.Tensor | None = None,
    compressed_indices: torch.Tensor | None = None,
    compressed_indptr: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    cos_sin_cache: torch.Tensor | None = None,
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    plan: V4Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 attention over a window list and a compressed list; returns ``(out, lse)``.

    Row t, head h attends over the multiset of cache rows its two lists name (a repeated entry
    counts twice): ``s_j = sm_scale x q[t, h] . k_j`` over the 512 values of the row (448 NoPE +
    64 RoPE), ``m = max(max_j s_j, sink_h)``, ``out[t, h] = sum_j e^(s_j - m) v_j / (sum_j
    e^(s_j - m) + e^(sink_h - m))`` with ``v_j = k_j`` (one KV head shared by every query head),
    ``lse[t, h] = log sum_j e^(s_j)`` (the sink excluded). With ``positions``, the output's last 64
    values are rotated back (GPT-J inverse RoPE at the row's position): pairs ``(a, b) =
    (out[448 + 2i], out[449 + 2i])`` become ``(a c + b s, b c - a s)``, ``c, s =
    cos_sin_cache[pos, i], cos_sin_cache[pos, 32 + i]``. Rows are independent: decode, MTP and
    prefill rows of any requests mix freely. A row that names no entry gets out 0 and lse -inf.

    Args:
        q: ``[T, H, 512]`` float16/bfloat16/float32, any strides; any H >= 1 (no padding).
        window_cache: the window (SWA) cache: vLLM's fp8_ds_mla storage, uint8 ``[num_blocks,
            block_size, 584]`` with its token and byte strides 584 and 1 and a page stride of at
            least ``block_size x 584`` bytes (token p of page b: 448 e4m3 NoPE bytes then 64
            bf16 RoPE values at byte ``b x page_stride + p x 576``, its 8 UE8M0 scale bytes, one
            per 64 NoPE values, at ``b x page_stride + block_size x 576 + p x 8``); or a 16-bit
            cache ``[num_blocks, block_size, 512]`` in q's dtype (float32 with float32 q), last
            dim contiguous. The e4m3 kind is the plan's (``window_kv_cache_dtype``).
        window_indices: dense ``[T, W]`` int32 (column stride 1) or, with ``window_indptr``,
            ragged ``[nnz]`` int32 (stride 1): global slots ``page x block_size + offset`` of the
            window cache; -1 names no token, wherever it stands.
        window_indptr: ``[T + 1]`` int32, stride 1: row t's entries are
            ``window_indices[indptr[t]:indptr[t + 1]]``. None: dense.
        compressed_cache, compressed_indices, compressed_indptr: the compressed list (CSA top-k or
            HCA rows) over its own cache, in the same forms (its own kind, block size and list
            form). All None for a window-only layer.
        attn_sink: ``[>= H]`` float32, stride 1: head h's sink logit (-inf: none). None: no sink.
        positions: ``[T]`` int32/int64: rotate out's last 64 values back at these positions. None:
            no rotation (then cos_sin_cache must be None too).
        cos_sin_cache: ``[P, 64]`` float32/bfloat16/float16, last dim contiguous, ``cos[0:32] |
            sin[32:64]`` (the layer's rotary cache).
        sm_scale: softmax scale of q . k: a finite number > 0.
        out: optional ``[T, H, 512]`` destination in q's dtype, any non-overlapping strides; every
            element is written (never zeroed first). Allocated when None.
        lse: optional ``[T, H]`` float32 destination (natural log, any strides). Allocated when None.
        workspace: optional contiguous float32 tensor of at least ``plan.workspace_numel``
            elements for split partials (without it a split call does one ``torch.empty``).
        plan: from ``plan_v4_attention`` (sizes) or ``plan_v4_attention_for`` (tensors): each
            cache's kind, the list forms, the sink and the rotation, the split count, batch
            invariance, the config, the backend, debug. Made once per step and passed to every
            layer of a kind; None: planned here from the tensors with every default.

    Returns:
        ``(out, lse)``: the destinations (given or allocated).

    Bad values (no host sync unless the plan's debug): nothing outside the given tensors is read
    or written. An entry < -1 or >= ``num_blocks x block_size`` of its cache, a ragged row whose
    ``indptr`` pair is decreasing, negative or past nnz, or (rotation) a position outside
    ``[0, P)``: that row's out and lse are NaN; every other row is exact. A NaN in a selected cache
    row reaches the rows that select it; a NaN sink reaches its head's out. A debug plan raises a
    ValueError naming the first bad value instead.

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    tensors = (q, window_cache, window_indices, window_indptr, compressed_cache, compressed_indices,
               compressed_indptr, attn_sink, positions, cos_sin_cache)  # fmt: skip
    if plan is None:
        plan = plan_v4_attention_for(*tensors, workspace=workspace)
    elif not isinstance(plan, V4Plan):
        c.fail("plan", "a plan from plan_v4_attention (V4Plan)", type(plan).__name__, TypeError)
    if not plan.matches(*tensors):
        want = _validate_tensors(c, *tensors)
        c.plan_for(plan, V4Plan, "plan_v4_attention", want)
    sm_scale = c.scale("sm_scale", sm_scale)
    T, H = plan.num_rows, plan.num_heads
    if out is None:
        out = torch.empty(T, H, HEAD_DIM, dtype=q.dtype, device=q.device)
    else:
        c.tensor("out", out, shape=(T, H, HEAD_DIM), layout="[T, H, 512]", dtypes=(q.dtype,), like="q's")
    if lse is None:
        lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    else:
        c.tensor("lse", lse, shape=(T, H), layout="[T, H]", dtypes=(torch.float32,), like="q's T, H")
    if workspace is not None:
        c.workspace(workspace, plan.workspace_numel, f"S={plan.num_splits} splits x {T * H} rows x 513")
    names = ("q", "window_cache", "window_indices", "window_indptr", "compressed_cache", "compressed_indices",
             "compressed_indptr", "attn_sink", "positions", "cos_sin_cache")  # fmt: skip
    c.arguments({"out": out, "lse": lse, "workspace": workspace}, dict(zip(names, tensors)), like="q")
    if plan.debug:
        _debug_checks(c, plan, *tensors)
    if out.numel() == 0:
        return out, lse
    if plan.backend == "triton":
        _launch_triton(plan, *tensors, out, lse, workspace, float(sm_scale))
    else:
        o, l_ref = mla_v4_attention_ref(
            q, window_cache, window_indices, window_indptr, compressed_cache, compressed_indices, compressed_indptr,
            attn_sink, positions, cos_sin_cache, float(sm_scale), window_kind=_ref_kind(plan.window_kind),
            compressed_kind=_ref_kind(plan.compressed_kind),
        )  # fmt: skip
        out.copy_(o)
        lse.copy_(l_ref)
    return out, lse


def _ref_kind(kind: torch.dtype | None) -> torch.dtype | None:
    """The reference's kind argument: an e4m3 kind for fp8_ds_mla storage, None for float caches."""
    return kind if kind in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) else None


# --------------------------------------------------------------------------- validation


def _check_cache(c: Checker, name: str, cache) -> None:
    c.tensor(name, cache, ndim=3, layout="[num_blocks, block_size, 584 (uint8) or 512]")
    if cache.dtype == torch.uint8:
        nb, bs, width = cache.shape
        if width != FP8_DS_MLA_TOKEN_BYTES:
            c.fail(name, f"[num_blocks, block_size, {FP8_DS_MLA_TOKEN_BYTES}] (fp8_ds_mla)", tuple(cache.shape))
        if cache.stride(2) != 1 or (bs > 1 and cache.stride(1) != FP8_DS_MLA_TOKEN_BYTES):
            c.fail(name, "token and byte strides 584 and 1 (fp8_ds_mla pages)", f"strides {cache.stride()}")
        if nb > 1 and cache.stride(0) < bs * FP8_DS_MLA_TOKEN_BYTES:
            c.fail(name, f"a page stride >= block_size x 584 = {bs * FP8_DS_MLA_TOKEN_BYTES}", cache.stride(0))
    else:
        if cache.shape[2] != HEAD_DIM:
            c.fail(name, "[num_blocks, block_size, 512] (a 16-bit cache)", tuple(cache.shape))
        if cache.stride(2) != 1:
            c.fail(name, "a contiguous last dim", f"strides {cache.stride()}")
    if cache.shape[1] < 1:
        c.fail(name, "block_size >= 1", tuple(cache.shape))


def _check_list(c: Checker, name: str, indices, indptr, T: int) -> tuple[int, bool]:
    """``(width or planned length, ragged)`` of one list."""
    c.tensor(f"{name}_indices", indices, dtypes=(torch.int32,))
    if indptr is None:
        c.tensor(f"{name}_indices", indices, ndim=2, layout="[T, W]")
        if indices.shape[0] != T:
            c.fail(f"{name}_indices", f"shape [T, W] = ({T}, *) (q's T)", tuple(indices.shape))
        if indices.shape[1] > 1 and indices.stride(1) != 1:
            c.fail(f"{name}_indices", "column stride 1", f"strides {indices.stride()}")
        return indices.shape[1], False
    c.tensor(f"{name}_indices", indices, ndim=1, layout="[nnz] (ragged)")
    if indices.shape[0] > 1 and indices.stride(0) != 1:
        c.fail(f"{name}_indices", "stride 1", f"strides {indices.stride()}")
    c.tensor(f"{name}_indptr", indptr, shape=(T + 1,), layout="[T + 1]", dtypes=(torch.int32,))
    if indptr.stride(0) != 1:
        c.fail(f"{name}_indptr", "stride 1", f"strides {indptr.stride()}")
    return max(1, -(-indices.shape[0] // max(1, T))), True


def _validate_tensors(c: Checker, q, window_cache, window_indices, window_indptr, compressed_cache,
                      compressed_indices, compressed_indptr, attn_sink, positions, cos_sin_cache) -> dict:  # fmt: skip
    """The tensors' own rules, with errors naming the argument; returns the plan fields they
    fix (``plan_v4_attention``'s sizes)."""
    c.tensor("q", q, ndim=3, layout="[T, H, 512]", dtypes=FLOAT_DTYPES)
    T, H = q.shape[0], q.shape[1]
    if q.shape[2] != HEAD_DIM:
        c.fail("q", "[T, H, 512]", tuple(q.shape))
    if H < 1:
        c.fail("q", "H >= 1 heads", tuple(q.shape))
    _check_cache(c, "window_cache", window_cache)
    w_len, w_ragged = _check_list(c, "window", window_indices, window_indptr, T)
    fields = dict(num_rows=T, num_heads=H, q_dtype=q.dtype, device=q.device, window_dtype=window_cache.dtype,
                  window_block_size=window_cache.shape[1], window_ragged=w_ragged)  # fmt: skip
    if not w_ragged:
        fields["window_len"] = w_len
    given = [x is not None for x in (compressed_cache, compressed_indices)]
    if any(given) != all(given) or (compressed_indptr is not None and not all(given)):
        c.fail("compressed_indices", "a tensor exactly when compressed_cache is one (a compressed list)",
               "one without the other")  # fmt: skip
    if compressed_cache is not None:
        _check_cache(c, "compressed_cache", compressed_cache)
        c_len, c_ragged = _check_list(c, "compressed", compressed_indices, compressed_indptr, T)
        fields.update(compressed_dtype=compressed_cache.dtype, compressed_block_size=compressed_cache.shape[1],
                      compressed_ragged=c_ragged)  # fmt: skip
        if not c_ragged:
            fields["compressed_len"] = c_len
    else:
        fields["compressed_dtype"] = None
    if attn_sink is not None:
        c.tensor("attn_sink", attn_sink, ndim=1, layout="[>= H]", dtypes=(torch.float32,))
        if attn_sink.shape[0] < H or (H > 1 and attn_sink.stride(0) != 1):
            c.fail("attn_sink", f"a [>= {H}] float32 tensor of stride 1", f"shape {tuple(attn_sink.shape)}, "
                   f"strides {attn_sink.stride()}")  # fmt: skip
    fields["has_sink"] = attn_sink is not None
    if (positions is None) != (cos_sin_cache is None):
        name = "cos_sin_cache" if positions is not None else "positions"
        c.fail(name, "a tensor exactly when the other of positions / cos_sin_cache is one (the inverse RoPE)", "None")
    if positions is not None:
        c.tensor("positions", positions, ndim=1, layout="[T]", dtypes=(torch.int32, torch.int64))
        if positions.shape[0] != T:
            c.fail("positions", f"shape [T] = ({T},) (q's T)", tuple(positions.shape))
        c.tensor("cos_sin_cache", cos_sin_cache, ndim=2, layout="[P, 64]", dtypes=FLOAT_DTYPES)
        if cos_sin_cache.shape[1] != ROPE_DIM or cos_sin_cache.stride(1) != 1:
            c.fail("cos_sin_cache", "[P, 64] (cos | sin), last dim contiguous",
                   f"shape {tuple(cos_sin_cache.shape)}, strides {cos_sin_cache.stride()}")  # fmt: skip
    fields["inverse_rope"] = positions is not None
    c.same_device(q=q, window_cache=window_cache, window_indices=window_indices, window_indptr=window_indptr,
                  compressed_cache=compressed_cache, compressed_indices=compressed_indices,
                  compressed_indptr=compressed_indptr, attn_sink=attn_sink, positions=positions,
                  cos_sin_cache=cos_sin_cache)  # fmt: skip
    return fields


def plan_v4_attention_for(
    q: torch.Tensor,
    window_cache: torch.Tensor,
    window_indices: torch.Tensor,
    window_indptr: torch.Tensor | None = None,
    compressed_cache: torch.Tensor | None = None,
    compressed_indices: torch.Tensor | None = None,
    compressed_indptr: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    cos_sin_cache: torch.Tensor | None = None,
    *,
    workspace: torch.Tensor | None = None,
    **knobs: Any,
) -> V4Plan:
    """``plan_v4_attention`` with the sizes, dtypes, device, list forms, sink and rotation read
    from a call's tensors (as ``mla_v4_attention`` takes them, checked as it checks them) and the
    split cap from ``workspace``. A ragged list's planned length is its mean (``nnz / T``) unless
    ``window_len`` / ``compressed_len`` are given. ``knobs``: the rest of ``plan_v4_attention``'s
    keywords (window_kv_cache_dtype, compressed_kv_cache_dtype, num_splits, batch_invariant,
    config, backend, debug, window_len / compressed_len for ragged lists)."""
    c = Checker(OP)
    fields = _validate_tensors(c, q, window_cache, window_indices, window_indptr, compressed_cache,
                               compressed_indices, compressed_indptr, attn_sink, positions, cos_sin_cache)  # fmt: skip
    T = q.shape[0]
    if fields["window_ragged"]:
        knobs.setdefault("window_len", -(-window_indices.shape[0] // max(1, T)))
    if compressed_cache is not None and fields["compressed_ragged"]:
        knobs.setdefault("compressed_len", -(-compressed_indices.shape[0] // max(1, T)))
    if isinstance(workspace, torch.Tensor) and "workspace_numel" not in knobs:
        knobs["workspace_numel"] = workspace.numel()
    return plan_v4_attention(**fields, **knobs)


def _debug_checks(c: Checker, plan: V4Plan, q, window_cache, window_indices, window_indptr, compressed_cache,
                  compressed_indices, compressed_indptr, attn_sink, positions, cos_sin_cache) -> None:  # fmt: skip
    """Index checks on the host (one sync): every indptr pair in order within its list, every
    entry >= -1 and within its cache, every position within the rotary cache."""
    lists = [("window", window_cache, window_indices, window_indptr)]
    if compressed_cache is not None:
        lists.append(("compressed", compressed_cache, compressed_indices, compressed_indptr))
    for name, cache, idx, indptr in lists:
        cap = cache.shape[0] * cache.shape[1]
        if indptr is not None:
            ip = indptr.cpu().long()
            nnz = idx.shape[0]
            bad = ((ip[:-1] < 0) | (ip[1:] < ip[:-1]) | (ip[1:] > nnz)).nonzero()
            if bad.numel():
                t = int(bad[0, 0])
                c.fail(f"{name}_indptr", f"0 <= indptr[t] <= indptr[t + 1] <= nnz = {nnz}",
                       f"indptr[{t}] = {int(ip[t])}, indptr[{t + 1}] = {int(ip[t + 1])}")  # fmt: skip
        flat = idx.cpu().long().reshape(-1)
        bad = ((flat < -1) | (flat >= cap)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            where = f"[{i}]" if indptr is not None else f"[{i // idx.shape[1]}, {i % idx.shape[1]}]"
            c.fail(f"{name}_indices", f"-1 or a slot in [0, {cap}) (num_blocks x block_size)",
                   f"{name}_indices{where} = {int(flat[i])}")  # fmt: skip
    if positions is not None and positions.numel():
        P = cos_sin_cache.shape[0]
        pos = positions.cpu().long()
        bad = ((pos < 0) | (pos >= P)).nonzero()
        if bad.numel():
            t = int(bad[0, 0])
            c.fail("positions", f"positions in [0, {P}) (cos_sin_cache's rows)", f"positions[{t}] = {int(pos[t])}")


# --------------------------------------------------------------------------- launch


def _cache_args(cache) -> tuple[torch.Tensor, int, int, int, int]:
    """``(tensor as the kernel reads it, block_size, slots, page stride, token stride)``."""
    nb, bs = cache.shape[0], cache.shape[1]
    t = cache if cache.numel() else torch.zeros(1, 1, cache.shape[2], dtype=cache.dtype, device=cache.device)
    return t, bs, min(nb * bs, INT32_MAX), cache.stride(0), cache.stride(1)


def _launch_triton(plan: V4Plan, q, window_cache, window_indices, window_indptr, compressed_cache,
                   compressed_indices, compressed_indptr, attn_sink, positions, cos_sin_cache, out, lse, workspace,
                   sm_scale: float) -> None:  # fmt: skip
    """Runs ``plan`` on validated tensors: the kernel, then (S > 1) the shared reduce."""
    T, H, S = plan.num_rows, plan.num_heads, plan.num_splits
    # The split partials carved from the workspace, the latent ops' way (no k_scale: fp8_ds_mla
    # rows carry their own scales).
    a = launch_args(plan, workspace, T, lse, sm_scale, None, None)
    part_o, part_lse, s_po, s_pl = a["part_o"], a["part_lse"], a["s_po_s"], a["s_pl_s"]
    wc, w_bs, w_slots, s_wb, s_wt = _cache_args(window_cache)
    w_ragged = window_indptr is not None
    w_ptr = window_indptr if w_ragged else window_indices
    w_nnz = window_indices.shape[0] if w_ragged else window_indices.shape[1]
    s_wi = 0 if w_ragged else window_indices.stride(0)
    if compressed_cache is not None:
        cc, c_bs, c_slots, s_cb, s_ct = _cache_args(compressed_cache)
        c_ragged = compressed_indptr is not None
        ci = compressed_indices
        c_ptr = compressed_indptr if c_ragged else ci
        c_nnz = ci.shape[0] if c_ragged else ci.shape[1]
        s_ci = 0 if c_ragged else ci.stride(0)
    else:
        cc, c_bs, c_slots, s_cb, s_ct, ci, c_ptr, c_nnz, s_ci = wc, 1, 0, 0, 0, window_indices, w_ptr, 0, 0
    sink = attn_sink if attn_sink is not None else lse
    pos = positions if positions is not None else window_indices
    cs = cos_sin_cache if cos_sin_cache is not None else lse
    num_pos = cos_sin_cache.shape[0] if cos_sin_cache is not None else 0
    s_pos = positions.stride(0) if positions is not None else 0
    s_cs = cos_sin_cache.stride(0) if cos_sin_cache is not None else 0
    launches = plan.kernel_launches
    if not launches:
        launches["kernel"] = kernel_launch(mla_v4_attention_kernel, plan.constexprs, plan.options)
        if not plan.direct:
            launches["reduce"] = kernel_launch(mla_decode_reduce_kernel, plan.reduce.constexprs, plan.reduce.options)
    launches["kernel"](plan.grid, (
        q, wc, window_indices, w_ptr, cc, ci, c_ptr, sink, pos, cs, out, lse, part_o, part_lse,
        a["qk_scale"],
        T, H, S, plan.split_len, plan.head_blocks,
        w_nnz, w_bs, w_slots, c_nnz, c_bs, c_slots, num_pos,
        *q.stride(), s_wb, s_wt, s_wi, s_cb, s_ct, s_ci, s_pos, s_cs,
        *out.stride(), *lse.stride(), s_po, s_pl,
    ))  # fmt: skip
    if plan.direct:
        return
    # The reduce in its default mode (every split of the grid is the row's); its seq_lens (the
    # lists stand in), capacity and split rule are batch-invariant decode's and unread here.
    launches["reduce"](plan.reduce.grid, (
        part_o, part_lse, out, lse, window_indices,
        H, S, 1, 0, 0, 0, 1,
        0, s_po, s_pl, *out.stride(), *lse.stride(),
        sink, pos, cs, num_pos, s_pos, s_cs,
    ))  # fmt: skip


__all__ = ["mla_v4_attention", "plan_v4_attention_for"]
