"""Float64 reference of mla_v4_attention (DeepSeek-V4 attention) and the fp8_ds_mla cache decoder.

Per query row: gather the cache rows its window list and its compressed list name (global slots of
each list's own cache), run dense softmax attention over that multiset with the head's sink as one
more term of the denominator, then rotate the output's RoPE part back (vLLM's inverse GPT-J RoPE).
Deliberately plain (rows in chunks, no splits, no online softmax) so that it is an independent
yardstick for the split kernels; tests/v4_attention/test_v4_attention.py checks it in turn against a
float64 formula over a dense mask.

The fp8_ds_mla cache (vLLM's DeepSeek-V4 layout), uint8 ``[num_blocks, block_size, 584]``: the bytes
of page b start at ``b x stride(0)``; token p's data at ``p x 576`` in it (448 e4m3 bytes, the NoPE
part, then 64 little-endian bf16, the RoPE part), its scales at ``block_size x 576 + p x 8`` (8
bytes, the first 7 used: UE8M0, ``2^(e - 127)`` for the 64 NoPE values ``[64i, 64i + 64)``).
"""

from __future__ import annotations

import math

import torch

from ..mla_dims import KV_LORA_RANK, QK_ROPE_HEAD_DIM

V4_DIM = KV_LORA_RANK  # 512: a V4 cache row, K and V alike
V4_NOPE = V4_DIM - QK_ROPE_HEAD_DIM  # 448 e4m3 values per fp8_ds_mla row
V4_DATA_BYTES = V4_NOPE + 2 * QK_ROPE_HEAD_DIM  # 576: a row's e4m3 bytes and bf16 RoPE bytes
V4_SCALE_BYTES = 8  # a row's UE8M0 scale bytes (7 used)
V4_ROW_BYTES = V4_DATA_BYTES + V4_SCALE_BYTES  # 584: a cache row's bytes (the tensor's last dim)
V4_SCALE_GROUP = 64  # NoPE values per scale byte
FP8_DS_MLA_KINDS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)

# Bytes of float64 one chunk of rows may gather (keys, scores and q together).
_CHUNK_BYTES = 1 << 28


def fp8_value_table(kind: torch.dtype, device=None) -> torch.Tensor:
    """``[256]`` float64: the value of every byte code of the e4m3 ``kind`` (torch's own dtype:
    float8_e4m3fn, NaN at 0x7F / 0xFF; float8_e4m3fnuz, NaN at 0x80)."""
    if kind not in FP8_DS_MLA_KINDS:
        raise TypeError(f"fp8_value_table: kind: expected torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {kind}")
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(kind).to(torch.float64).to(device)


def ue8m0_values(codes: torch.Tensor) -> torch.Tensor:
    """float64 ``2^(e - 127)`` of UE8M0 bytes ``codes`` (any shape, uint8): e = 0 gives 2^-127,
    e = 255 gives inf."""
    e = codes.to(torch.float64)
    return torch.where(codes == 255, math.inf, torch.exp2(e - 127.0))


def _page_parts(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of an fp8_ds_mla cache's bytes: ``data [num_blocks, block_size, 576]`` and
    ``scales [num_blocks, block_size, 8]`` (page b at ``b x stride(0)``)."""
    nb, bs, _ = cache.shape
    pages = cache.flatten(1)  # [nb, bs * 584]: a view (stride(1) == 584, stride(2) == 1), page stride kept
    data = pages[:, : bs * V4_DATA_BYTES].unflatten(1, (bs, V4_DATA_BYTES))
    scales = pages[:, bs * V4_DATA_BYTES : bs * V4_ROW_BYTES].unflatten(1, (bs, V4_SCALE_BYTES))
    return data, scales


def _check_fp8_ds_mla(cache: torch.Tensor, who: str) -> None:
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != V4_ROW_BYTES:
        raise ValueError(f"{who}: expected a uint8 [num_blocks, block_size, 584] cache, got {cache.dtype} "
                         f"{list(cache.shape)}")  # fmt: skip
    nb, bs, _ = cache.shape
    if nb * bs and (cache.stride(2) != 1 or cache.stride(1) != V4_ROW_BYTES or cache.stride(0) < bs * V4_ROW_BYTES):
        raise ValueError(f"{who}: expected strides (>= block_size * 584, 584, 1), got {cache.stride()}")


def _decode_rows(data: torch.Tensor, scales: torch.Tensor, kind: torch.dtype) -> torch.Tensor:
    """float64 ``[n, 512]`` rows of ``data [n, 576]`` and ``scales [n, 8]`` uint8 bytes."""
    n = data.shape[0]
    table = fp8_value_table(kind, data.device)
    nope = table[data[:, :V4_NOPE].long()].view(n, V4_NOPE // V4_SCALE_GROUP, V4_SCALE_GROUP)
    nope = nope * ue8m0_values(scales[:, : V4_NOPE // V4_SCALE_GROUP])[..., None]
    rope = data[:, V4_NOPE:V4_DATA_BYTES].contiguous().view(torch.bfloat16).to(torch.float64)
    return torch.cat([nope.view(n, V4_NOPE), rope], dim=1)


def fp8_ds_mla_rows(cache: torch.Tensor, kind: torch.dtype) -> torch.Tensor:
    """Every slot of an fp8_ds_mla cache, decoded: float64 ``[num_blocks x block_size, 512]``, row
    ``page x block_size + offset``.

    cache: uint8 ``[num_blocks, block_size, 584]``, strides ``(>= block_size x 584, 584, 1)`` (the
    layout in the module docstring; a page stride wider than its bytes is honoured). kind: the e4m3
    kind of its bytes (torch.float8_e4m3fn or torch.float8_e4m3fnuz). Value = e4m3(byte) x
    2^(e - 127) (e = 255: inf), then the 64 bf16 RoPE values. A NaN code gives NaN.
    """
    _check_fp8_ds_mla(cache, "fp8_ds_mla_rows: cache")
    if kind not in FP8_DS_MLA_KINDS:
        raise TypeError(f"fp8_ds_mla_rows: kind: expected torch.float8_e4m3fn or torch.float8_e4m3fnuz, got {kind}")
    nb, bs, _ = cache.shape
    if nb * bs == 0:
        return torch.zeros(0, V4_DIM, dtype=torch.float64, device=cache.device)
    data, scales = _page_parts(cache)
    return _decode_rows(data.reshape(nb * bs, V4_DATA_BYTES), scales.reshape(nb * bs, V4_SCALE_BYTES), kind)


class _CacheRows:
    """Rows of one cache by global slot, as float64 ``[..., 512]``: an fp8_ds_mla cache (uint8 and an
    e4m3 ``kind``) decoded slot by slot, or a 16/32-bit ``[num_blocks, block_size, 512]`` cache."""

    def __init__(self, cache: torch.Tensor, kind: torch.dtype | None, who: str):
        self.cache = cache
        if cache.dtype == torch.uint8:
            if kind not in FP8_DS_MLA_KINDS:
                raise TypeError(f"mla_v4_attention_ref: {who}_kind: a uint8 cache needs torch.float8_e4m3fn or "
                                f"torch.float8_e4m3fnuz, got {kind}")  # fmt: skip
            _check_fp8_ds_mla(cache, f"mla_v4_attention_ref: {who}_cache")
            self.kind = kind
            self.parts = _page_parts(cache)
        else:
            if kind is not None and kind != cache.dtype:
                raise TypeError(f"mla_v4_attention_ref: {who}_kind: a {cache.dtype} cache is read as itself, "
                                f"got {kind}")  # fmt: skip
            if cache.dim() != 3 or cache.shape[2] != V4_DIM:
                raise ValueError(f"mla_v4_attention_ref: {who}_cache: expected [num_blocks, block_size, 512], got "
                                 f"{list(cache.shape)}")  # fmt: skip
            self.kind = None
        self.block_size = cache.shape[1]
        self.capacity = cache.shape[0] * cache.shape[1]

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """float64 ``[*slots.shape, 512]`` of slots in ``[0, capacity)`` (int64, any shape)."""
        flat = slots.reshape(-1).to(self.cache.device)
        if flat.numel() == 0 or self.capacity == 0:
            return torch.zeros(*slots.shape, V4_DIM, dtype=torch.float64, device=slots.device)
        page, off = flat // self.block_size, flat % self.block_size
        if self.kind is None:
            rows = self.cache[page, off].to(torch.float64)
        else:
            data, scales = self.parts
            rows = _decode_rows(data[page, off], scales[page, off], self.kind)
        return rows.view(*slots.shape, V4_DIM).to(slots.device)


def _list_chunk(indices: torch.Tensor, indptr: torch.Tensor | None, t0: int, t1: int):
    """Rows ``[t0, t1)`` of a list as ``(entries [rows, W] int64 with -1 padding, bad [rows] bool)``:
    dense ``indices [T, W]``, or ragged ``indices [nnz]`` with ``indptr [T + 1]`` (a row is bad when
    ``indptr[t] < 0``, ``indptr[t + 1] < indptr[t]`` or ``indptr[t + 1] > nnz``; it then names none)."""
    dev = indices.device
    if indptr is None:
        return indices[t0:t1].long(), torch.zeros(t1 - t0, dtype=torch.bool, device=dev)
    nnz = indices.shape[0]
    start, end = indptr[t0:t1].long().to(dev), indptr[t0 + 1 : t1 + 1].long().to(dev)
    bad = (start < 0) | (end < start) | (end > nnz)
    n = torch.where(bad, 0, end - start)
    width = int(n.max()) if n.numel() else 0
    col = torch.arange(width, device=dev)
    take = col[None, :] < n[:, None]
    at = torch.where(take, start[:, None] + col[None, :], 0)
    got = indices[at].long() if nnz else torch.zeros_like(at)
    return torch.where(take, got, -1), bad


def _widest(indices: torch.Tensor | None, indptr: torch.Tensor | None) -> int:
    """Entries of the longest row of a list (for the chunk size)."""
    if indices is None:
        return 0
    if indptr is None:
        return indices.shape[1] if indices.dim() == 2 else 0
    if indptr.numel() < 2:
        return 0
    n = (indptr[1:].long() - indptr[:-1].long()).clamp(0, indices.shape[0])
    return int(n.max())


def mla_v4_attention_ref(
    q: torch.Tensor,
    window_cache: torch.Tensor,
    window_indices: torch.Tensor,
    window_indptr: torch.Tensor | None,
    compressed_cache: torch.Tensor | None,
    compressed_indices: torch.Tensor | None,
    compressed_indptr: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    positions: torch.Tensor | None,
    cos_sin_cache: torch.Tensor | None,
    sm_scale: float,
    window_kind: torch.dtype | None = None,
    compressed_kind: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 attention of ``q [T, H, 512]`` over the rows two lists name, computed in float64.

    Caches: fp8_ds_mla uint8 ``[num_blocks, block_size, 584]`` read as ``*_kind`` (an e4m3 dtype,
    :func:`fp8_ds_mla_rows`), or ``[num_blocks, block_size, 512]`` in a float dtype (``*_kind``
    None or that dtype). Lists: dense ``[T, W]`` int (``*_indptr`` None) or ragged ``[nnz]`` with
    ``*_indptr [T + 1]`` (row t: ``indices[indptr[t]:indptr[t + 1]]``); entries are global slots
    ``page x block_size + offset`` of their own cache, -1 names no row (wherever it stands), a
    repeated entry counts twice. ``compressed_cache`` None: a window-only layer (no compressed list).
    attn_sink ``[>= H]`` float32 (the first H used; -inf: none) or None. positions ``[T]`` int with
    cos_sin_cache ``[P, 64]`` (cos | sin), or both None.

    Per row t and head h, over the multiset J of rows named: ``s_j = sm_scale x q[t, h] . k_j`` (all
    512 values), ``m = max(max_j s_j, sink_h)``, ``out = sum_j e^(s_j - m) k_j / (sum_j e^(s_j - m) +
    e^(sink_h - m))`` (V = K, the whole row), ``lse = log sum_j e^(s_j)`` (the sink excluded). Then,
    with positions: pairs ``(a, b) = out[448 + 2i], out[449 + 2i]`` for i < 32 become ``(a c + b s,
    b c - a s)``, c = cos_sin_cache[pos_t, i], s = cos_sin_cache[pos_t, 32 + i] (lse unrotated).

    Returns ``(out [T, H, 512] float32, lse [T, H] float32)``. A row naming no entry: out 0, lse
    -inf, whatever the sink. A bad row -- an entry < -1 or >= its cache's num_blocks x block_size, a
    ragged row with ``indptr[t] < 0``, ``indptr[t + 1] < indptr[t]`` or ``indptr[t + 1] > nnz``, a
    position < 0 or >= P -- is NaN in out and lse (every head); no other row changes. A NaN (or an
    inf scale) in a named row reaches the row's out and lse; a NaN sink reaches that head's out only;
    rows nobody names are never read. A sink of +inf gives out 0 (the formula's limit).
    """
    T, H, D = q.shape
    if D != V4_DIM:
        raise ValueError(f"mla_v4_attention_ref: q: expected [T, H, 512], got {list(q.shape)}")
    if (compressed_cache is None) != (compressed_indices is None):
        raise ValueError("mla_v4_attention_ref: compressed_indices: given exactly when compressed_cache is")
    if (positions is None) != (cos_sin_cache is None):
        raise ValueError("mla_v4_attention_ref: positions and cos_sin_cache: both or neither")
    dev = q.device
    out = torch.zeros(T, H, V4_DIM, dtype=torch.float64, device=dev)
    lse = torch.full((T, H), -math.inf, dtype=torch.float64, device=dev)
    lists = [(_CacheRows(window_cache, window_kind, "window"), window_indices.to(dev), window_indptr)]
    if compressed_cache is not None:
        lists.append((_CacheRows(compressed_cache, compressed_kind, "compressed"), compressed_indices.to(dev),
                      compressed_indptr))  # fmt: skip
    bad_row = torch.zeros(T, dtype=torch.bool, device=dev)
    if T and H:
        sink = None
        if attn_sink is not None:
            sink = attn_sink.reshape(-1)[:H].to(device=dev, dtype=torch.float64)
        width = sum(_widest(idx, ptr) for _, idx, ptr in lists)
        per_row = 8 * (width * V4_DIM + 3 * H * max(width, 1) + 2 * H * V4_DIM)
        chunk = max(1, _CHUNK_BYTES // per_row)
        for t0 in range(0, T, chunk):
            t1 = min(T, t0 + chunk)
            keys, used = [], []
            for rows, idx, ptr in lists:
                e, bad = _list_chunk(idx, ptr, t0, t1)
                wrong = (e < -1) | (e >= rows.capacity)
                bad_row[t0:t1] |= bad | wrong.any(dim=1)
                ok = (e >= 0) & ~wrong
                k = rows.gather(torch.where(ok, e, 0))
                keys.append(torch.where(ok[..., None], k, 0.0))  # rows named by no entry: never part of a sum
                used.append(ok)
            k, ok = torch.cat(keys, dim=1), torch.cat(used, dim=1)  # [rows, J, 512], [rows, J]
            s = torch.einsum("thd,tjd->thj", q[t0:t1].to(torch.float64), k) * sm_scale
            s = s.masked_fill(~ok[:, None, :], -math.inf)
            named = ok.any(dim=1)  # [rows]
            row_lse = torch.logsumexp(s, dim=-1) if s.shape[-1] else torch.full(s.shape[:2], -math.inf, device=dev)
            smax = s.amax(dim=-1) if s.shape[-1] else torch.full(s.shape[:2], -math.inf, device=dev)
            m = smax if sink is None else torch.maximum(smax, sink[None, :])
            m = torch.where(named[:, None], m, 0.0)
            p = torch.where(ok[:, None, :], torch.exp(s - m[..., None]), 0.0)
            den = p.sum(dim=-1)
            if sink is not None:
                den = den + torch.exp(sink[None, :] - m)
            o = torch.einsum("thj,tjd->thd", p, k) / den[..., None]
            if sink is not None:  # a sink of +inf: the limit, 0 (the formula's inf - inf is NaN)
                o = torch.where(torch.isposinf(sink)[None, :, None], 0.0, o)
            out[t0:t1] = torch.where(named[:, None, None], o, 0.0)
            lse[t0:t1] = row_lse
    if positions is not None and T:
        P = cos_sin_cache.shape[0]
        pos = positions.reshape(-1)[:T].long().to(dev)
        pos_ok = (pos >= 0) & (pos < P)
        bad_row |= ~pos_ok
        cs = cos_sin_cache.to(device=dev, dtype=torch.float64)[torch.where(pos_ok, pos, 0)] if P else None
        if cs is not None:
            half = QK_ROPE_HEAD_DIM // 2
            c, s = cs[:, None, :half], cs[:, None, half:]
            a, b = out[..., V4_NOPE::2].clone(), out[..., V4_NOPE + 1 :: 2].clone()
            out[..., V4_NOPE::2] = a * c + b * s
            out[..., V4_NOPE + 1 :: 2] = b * c - a * s
    out[bad_row] = math.nan
    lse[bad_row] = math.nan
    return out.float(), lse.float()


__all__ = [
    "FP8_DS_MLA_KINDS",
    "V4_DATA_BYTES",
    "V4_DIM",
    "V4_NOPE",
    "V4_ROW_BYTES",
    "V4_SCALE_BYTES",
    "fp8_ds_mla_rows",
    "fp8_value_table",
    "mla_v4_attention_ref",
    "ue8m0_values",
]
