"""Float32 reference of merge_attn_states."""

from __future__ import annotations

import torch


def merge_attn_states_ref(
    prefix_output: torch.Tensor, prefix_lse: torch.Tensor, suffix_output: torch.Tensor, suffix_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions by their log-sum-exps, in float32.

    prefix_output, suffix_output: ``[T, N, D]``; prefix_lse, suffix_lse: ``[N, T]`` (natural log).
    Returns ``(out [T, N, D] float32, lse [N, T] float32)``.

    Rules: lse +inf means "saw no key" (read as -inf); a side with weight 0 contributes exactly 0
    (its values are not used, so NaN there cannot leak); both sides -inf gives out 0, lse -inf.
    A NaN lse (a side that saw a NaN) propagates: that row's out and lse are NaN (torch.maximum
    propagates NaN, so the weights are NaN and both sides are read).
    """
    po = prefix_output.float()
    so = suffix_output.float()
    lp = prefix_lse.float().transpose(0, 1)  # [T, N]
    ls = suffix_lse.float().transpose(0, 1)
    lp = torch.where(lp == float("inf"), float("-inf"), lp)
    ls = torch.where(ls == float("inf"), float("-inf"), ls)
    m = torch.maximum(lp, ls)
    empty = m == float("-inf")
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    ep = torch.exp(lp - m_safe)
    es = torch.exp(ls - m_safe)
    total = ep + es
    denom = torch.where(empty, torch.ones_like(total), total)
    wp = torch.where(empty, torch.zeros_like(ep), ep / denom)
    ws = torch.where(empty, torch.zeros_like(es), es / denom)
    zero = torch.zeros((), dtype=torch.float32, device=po.device)
    out = torch.where(wp[..., None] != 0, wp[..., None] * po, zero) + torch.where(
        ws[..., None] != 0, ws[..., None] * so, zero
    )
    lse = torch.where(empty, torch.full_like(m, float("-inf")), torch.log(denom) + m_safe)
    return out, lse.transpose(0, 1).contiguous()
