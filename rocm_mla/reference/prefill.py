"""Float32 reference of mla_prefill: per sequence, explicit k = cat(k_nope, k_pe broadcast), dense
softmax with a bottom-right aligned causal mask."""

from __future__ import annotations

import torch


def mla_prefill_ref(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    sm_scale: float,
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen MLA prefill attention in float32.

    q: ``[Tq, N, P + R]`` (nope part, then rope part); k_nope: ``[Tk, N, P]``; k_pe: ``[Tk, 1, R]``
    (broadcast over heads) or ``[Tk, N, R]``, or None when there is no rope part (R = 0, q
    ``[Tq, N, P]``); v: ``[Tk, N, V]``; any P, R, V (MLA's geometries: (128, 64, 128), (192, 64, 256),
    (64, 64, 128), (256, 0, 256)); cu_seqlens_q, cu_seqlens_k: ``[B + 1]``
    integer prefix sums (sequence b owns q rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and k/v rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``). Any strides.

    Causal is bottom-right aligned: query i of a sequence with lq queries and lk keys sees keys
    ``j <= i + lk - lq``. A query that sees no key gets output 0 and lse -inf -- and only such a
    query: a NaN in q, or in the k of a key the query sees, makes its out and lse NaN; a NaN in the
    v of a key it sees makes its out NaN. Keys it does not see never reach it, NaN or not.
    Rows of q outside every sequence are 0 in the returned ``out`` and -inf in ``lse`` (the op's
    reference backend copies only the rows of sequences into the caller's out/lse).

    Offsets that do not start at >= 0, decrease, or end past Tq / Tk raise a ValueError naming
    the argument (no silent wrap-around of a negative offset, no clipping).

    Returns ``(out [Tq, N, V] float32, lse [N, Tq] float32)``, lse in natural log.
    """
    Tq, N, _ = q.shape
    V = v.shape[-1]
    out = torch.zeros(Tq, N, V, dtype=torch.float32, device=q.device)
    lse = torch.full((N, Tq), float("-inf"), dtype=torch.float32, device=q.device)
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    for name, cu, total in (("cu_seqlens_q", cq, Tq), ("cu_seqlens_k", ck, k_nope.shape[0])):
        if len(cu) != len(cq) or not cu or cu[0] < 0 or cu[-1] > total or any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(
                f"mla_prefill_ref: {name}: expected {len(cq)} non-decreasing offsets in [0, {total}], got {cu}"
            )
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        qb = q[q0:q1].float()
        kb = k_nope[k0:k1].float()
        if k_pe is not None:
            kpe = k_pe[k0:k1].float().expand(lk, N, k_pe.shape[-1])
            kb = torch.cat([kb, kpe], dim=-1)  # [lk, N, P + R]
        vb = v[k0:k1].float()
        s = torch.einsum("ind,jnd->nij", qb, kb) * sm_scale  # [N, lq, lk]
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        visible = (j <= i + (lk - lq)) if causal else torch.ones(lq, lk, dtype=torch.bool, device=q.device)
        s = s.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1) if lk else torch.full((N, lq), float("-inf"), device=q.device)
        # -inf means exactly "saw no key"; a NaN lse (a NaN in q or in a key the row sees) is not
        # blind: its p, and so its out, stay NaN.
        blind = torch.isneginf(row_lse)  # [N, lq]
        p = torch.exp(s - torch.where(blind, torch.zeros_like(row_lse), row_lse)[..., None])
        p = torch.where(blind[..., None], torch.zeros_like(p), p)
        # A key the row does not see contributes exactly 0, even a NaN value (0 * NaN would not):
        # NaN values are taken out of the product and put back where a row sees them.
        v_nan = torch.isnan(vb)
        o = torch.einsum("nij,jnd->ind", p, torch.where(v_nan, 0.0, vb))
        if bool(v_nan.any()):
            hit = torch.einsum("ij,jnd->ind", visible.float(), v_nan.float()) > 0
            o = torch.where(hit, float("nan"), o)
        out[q0:q1] = o
        lse[:, q0:q1] = row_lse
    return out, lse
