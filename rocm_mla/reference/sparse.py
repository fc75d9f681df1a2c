"""Float32 reference of mla_sparse_attention: per query row, gather the selected cache rows and run
dense softmax attention over them.

Deliberately plain (rows in chunks, no splits, no online softmax) so that it is an independent
yardstick for the split kernels; tests/sparse/test_sparse.py checks it in turn against a float64
formula over a dense mask.
"""

from __future__ import annotations

import torch

from ..mla_dims import KV_LORA_RANK  # V = the first 512 columns of each cache row; K = all 576

# Rows per step: the gathered keys are [rows, K, 576] float32.
_ROW_CHUNK = 64


def sparse_slots(
    topk_indices: torch.Tensor,
    block_table: torch.Tensor | None,
    req_id_per_token: torch.Tensor | None,
    num_blocks: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(slots, used, bad_row)`` of a sparse call: ``slots [T, K]`` int64 the cache slot
    (page x block_size + offset) each entry names (0 where it names none), ``used [T, K]`` bool the
    entries that select a token, ``bad_row [T]`` bool the rows holding a bad entry.

    With a block table (``block_table [B, max_blocks]``, ``req_id_per_token [T]``): entry ``p >= 0``
    of row t is position p of request ``r = req_id_per_token[t]``, slot
    ``block_table[r, p // block_size] x block_size + p % block_size``. Bad: ``p < -1``,
    ``p >= max_blocks x block_size``, ``r`` outside ``[0, B)`` (only when the row names a token), a
    block-table entry outside ``[0, num_blocks)``. Without one (both None) the entries are slots;
    bad: ``p < -1`` or ``p >= num_blocks x block_size``. -1 names no token.
    """
    idx = topk_indices.long()
    T = idx.shape[0]
    named = idx >= 0
    if block_table is None:
        capacity = num_blocks * block_size
        wrong = (idx < -1) | (idx >= capacity)
        used = named & ~wrong
        slots = torch.where(used, idx, 0)
    else:
        B, max_blocks = block_table.shape
        req = req_id_per_token.long().to(idx.device)[:T]
        req_ok = (req >= 0) & (req < B)
        wrong = (idx < -1) | (idx >= max_blocks * block_size) | (named & ~req_ok[:, None])
        take = named & ~wrong
        r = torch.where(req_ok, req, 0)[:, None].expand_as(idx)
        blk = torch.where(take, idx // block_size, 0)
        bt = block_table.long().to(idx.device)
        page = bt[r, blk] if B and max_blocks else torch.zeros_like(idx)
        wrong = wrong | (take & ((page < 0) | (page >= num_blocks)))
        used = named & ~wrong
        slots = torch.where(used, page * block_size + idx % block_size, 0)
    return slots, used, wrong.any(dim=1) if idx.shape[1] else torch.zeros(T, dtype=torch.bool, device=idx.device)


def mla_sparse_attention_ref(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    topk_indices: torch.Tensor,
    block_table: torch.Tensor | None,
    req_id_per_token: torch.Tensor | None,
    sm_scale: float,
    k_scale: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MQA over the MLA latent cache, in float32.

    q_nope ``[T, N, 512]``, q_pe ``[T, N, 64]``; kv_cache ``[num_blocks, block_size, 576]`` (any
    float dtype, float8 included; value = stored x k_scale when k_scale is given); topk_indices
    ``[T, K]`` int: row t attends over the multiset of cache rows its entries name
    (:func:`sparse_slots`: request-local positions through ``block_table`` and
    ``req_id_per_token``, or global slots when both are None; -1 names none; a repeated entry counts
    twice), softmax(sm_scale x q . k) over all 576 columns, V = the first 512.

    Returns ``(out [T, N, 512] float32, lse [T, N] float32)``, lse the natural-log sum-exp of the
    scaled scores. A row that selects no token gets out 0 and lse -inf; a row holding a bad entry
    (see :func:`sparse_slots`) gets NaN in out and lse, and no other row is affected. Cache rows
    nobody selects are never read.
    """
    T, N, _ = q_nope.shape
    num_blocks, block_size, D = kv_cache.shape
    dev = q_nope.device
    out = torch.zeros(T, N, KV_LORA_RANK, dtype=torch.float32, device=dev)
    lse = torch.full((T, N), float("-inf"), dtype=torch.float32, device=dev)
    if T == 0 or N == 0:
        return out, lse
    slots, used, bad_row = sparse_slots(topk_indices, block_table, req_id_per_token, num_blocks, block_size)
    scale = (
        1.0
        if k_scale is None
        else (float(k_scale.float().reshape(-1)[0]) if isinstance(k_scale, torch.Tensor) else float(k_scale))
    )
    if kv_cache.element_size() == 1 and kv_cache.dtype.is_floating_point:
        # float8: gather the bytes, then convert (float8 indexing is missing from some torch builds).
        flat = kv_cache.view(torch.uint8).reshape(num_blocks * block_size, D)
    else:
        flat = kv_cache.reshape(num_blocks * block_size, D)
    q = torch.cat([q_nope.float(), q_pe.float()], dim=-1)  # [T, N, 576]
    for t0 in range(0, T, _ROW_CHUNK):
        t1 = min(T, t0 + _ROW_CHUNK)
        sl, us = slots[t0:t1].to(flat.device), used[t0:t1]
        if flat.numel():
            k = flat[sl]
            k = (k.view(kv_cache.dtype) if flat.dtype == torch.uint8 else k).float().to(dev) * scale
        else:
            k = torch.zeros(*sl.shape, D, device=dev)
        # Entries that select nothing are left out of the softmax (their gathered rows may be NaN).
        k = torch.where(us[..., None].to(dev), k, 0.0)  # [rows, K, 576]
        s = torch.einsum("tnd,tjd->tnj", q[t0:t1], k) * sm_scale
        s = s.masked_fill(~us[:, None, :].to(dev), float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1) if s.shape[-1] else torch.full(s.shape[:2], float("-inf"), device=dev)
        seen = ~torch.isneginf(row_lse)  # NaN counts as seen: a selected NaN row reaches out too
        p = torch.exp(s - torch.where(seen, row_lse, 0.0)[..., None])
        p = torch.where(seen[..., None], p, 0.0)
        out[t0:t1] = torch.einsum("tnj,tjd->tnd", p, k[..., :KV_LORA_RANK])
        lse[t0:t1] = row_lse
    nan_rows = bad_row.to(dev)
    out[nan_rows] = float("nan")
    lse[nan_rows] = float("nan")
    return out, lse
