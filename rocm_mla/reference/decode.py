"""Float32 reference of mla_decode: gather each request's pages, dense softmax attention.

Deliberately plain (a Python loop over requests, no splits, no online softmax) so that it is an
independent yardstick for the split-KV kernels; tests/decode/test_decode.py checks it in turn against a
float64 SDPA formulation.
"""

from __future__ import annotations

import torch

from ..mla_dims import KV_LORA_RANK  # V = the first 512 columns of each cache row; K = all 576
from .rope_kv_write import FP8_MAX, quantize_fp8_ref


def mla_decode_ref(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    k_scale: float | torch.Tensor | None = None,
    *,
    p_fp8: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged MQA over the MLA latent cache, in float32.

    q_nope ``[rows, N, 512]``, q_pe ``[rows, N, 64]``: rows = B x q_len, request-major (the rows of
    request b are ``b*q_len .. b*q_len + q_len - 1``, its last q_len tokens in order).
    kv_cache ``[num_blocks, block_size, 576]`` (any float dtype, float8 included; value = stored x
    k_scale when k_scale is given). block_table ``[B, max_blocks]`` int: token j of request b lives
    at ``kv_cache[block_table[b, j // block_size], j % block_size]``. seq_lens ``[B]``: keys per
    request, the new tokens included. Row t of request b sees keys ``j <= seq_len - q_len + t``.

    p_fp8: an e4m3 dtype: round the softmax weights as ``mla_decode(fp8_dots="all")`` does before
    p . v -- each row's weights exp(s - max) scaled by the kind's largest value (448 e4m3fn, 240
    e4m3fnuz), rounded to ``p_fp8`` and scaled back; the normaliser sums the unrounded weights.
    (The kernel subtracts its running max, which on early tiles is below the global one.)

    Returns ``(out [rows, N, 512] float32, lse [rows, N] float32)``, lse the natural-log
    sum-exp of the scaled scores. A row that sees no key gets out 0 and lse -inf. Cache slots
    outside each request's first seq_len tokens are never read.

    Bad values (the kernels' contract; nothing outside the given tensors is read): seq_len is
    clamped to the table's capacity ``max_blocks x block_size`` (negative means 0); a request
    whose used block-table entries (those covering its first seq_len tokens) include a page
    outside ``[0, num_blocks)`` gets NaN in every row of out and lse -- no wrap-around of -1 to
    the last page -- and no other request is affected.
    """
    rows, N, _ = q_nope.shape
    B, max_blocks = block_table.shape
    q_len = rows // B if B else 1
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    capacity = max_blocks * block_size
    q = torch.cat([q_nope.float(), q_pe.float()], dim=-1)  # [rows, N, 576]
    scale = (
        1.0
        if k_scale is None
        else (float(k_scale.float().reshape(-1)[0]) if isinstance(k_scale, torch.Tensor) else float(k_scale))
    )
    out = torch.zeros(rows, N, KV_LORA_RANK, dtype=torch.float32, device=q_nope.device)
    lse = torch.full((rows, N), float("-inf"), dtype=torch.float32, device=q_nope.device)
    for b in range(B):
        L = min(int(seq_lens[b]), capacity)
        if L <= 0:
            continue
        tok = torch.arange(L, device=kv_cache.device)
        pages = block_table[b, tok // block_size].long().to(kv_cache.device)
        if bool(((pages < 0) | (pages >= num_blocks)).any()):
            out[b * q_len : (b + 1) * q_len] = float("nan")
            lse[b * q_len : (b + 1) * q_len] = float("nan")
            continue
        k = kv_cache[pages, tok % block_size].float() * scale  # [L, 576]
        v = k[:, :KV_LORA_RANK]
        qb = q[b * q_len : (b + 1) * q_len]  # [q_len, N, 576]
        s = torch.einsum("tnd,jd->tnj", qb, k.to(qb.device)) * sm_scale
        limit = L - q_len + torch.arange(q_len, device=s.device)  # last visible key per row
        visible = tok.to(s.device)[None, :] <= limit[:, None]  # [q_len, L]
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [q_len, N]
        seen = row_lse > float("-inf")
        p = torch.exp(s - torch.where(seen, row_lse, 0.0)[..., None])
        p = torch.where(seen[..., None], p, 0.0)
        if p_fp8 is not None:
            p = _round_p(s, seen, row_lse, p_fp8)
        out[b * q_len : (b + 1) * q_len] = torch.einsum("tnj,jd->tnd", p, v.to(p.device))
        lse[b * q_len : (b + 1) * q_len] = row_lse
    return out, lse


def _round_p(s: torch.Tensor, seen: torch.Tensor, row_lse: torch.Tensor, kind: torch.dtype) -> torch.Tensor:
    """The normalised weights p = exp(s - lse) with each row's exp(s - max) rounded to e4m3 at
    the scale that maps the row's largest weight to the kind's largest value (``p_fp8``)."""
    fmax = FP8_MAX[kind]
    m = torch.where(seen, s.amax(-1), 0.0)[..., None]
    w = torch.exp(s - m) * fmax  # in [0, fmax]
    w8 = quantize_fp8_ref(w, torch.ones((), dtype=torch.float32, device=w.device), kind).float()
    # p = w8 / sum(w): the unrounded sum, as the kernel's l; exp(lse - m) = sum(exp(s - m)).
    denom = torch.exp(torch.where(seen, row_lse, 0.0)[..., None] - m) * fmax
    return torch.where(seen[..., None], w8 / denom, 0.0)


def quantize_q_fp8(
    q_nope: torch.Tensor, q_pe: torch.Tensor, fp8_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the decode kernel's ``FP8_QK`` mode makes of q, as float32: each (row, head) of
    ``[q_nope | q_pe]`` (576 values) scaled by ``absmax / fp8_max`` (448 for e4m3fn, 240 for
    e4m3fnuz; an all-zero row keeps scale 1), rounded to ``fp8_dtype`` and scaled back.

    ``mla_decode_ref(*quantize_q_fp8(q_nope, q_pe, kind), ...)`` is then the exact target of that
    mode up to float32 summation order and the float16 rounding of p and V in p . v.
    Returns ``(q_nope [rows, N, 512], q_pe [rows, N, 64])`` float32.
    """
    qn, qp = q_nope.float(), q_pe.float()
    amax = torch.maximum(qn.abs().amax(-1), qp.abs().amax(-1))
    scale = amax / FP8_MAX[fp8_dtype]
    scale = torch.where(amax > 0, scale, torch.ones_like(scale))[..., None]
    return tuple(quantize_fp8_ref(x, scale, fp8_dtype).float() * scale for x in (qn, qp))
