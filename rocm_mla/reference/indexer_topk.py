"""Float64 reference of mla_indexer_topk (the lightning indexer's scores and top-k selection), and
the check that a selection is a valid top-k.

logit(t, j) = sum_h weights[t, h] x relu(q[t, h] . k_j) for the keys j in [0, kv_lens[t]) of row t's
request, k_j the fp8 row of position j dequantised with its scale (index_cache_keys), its values
decoded in the cache's fp8 kind (q's, or e4m3fn under an e4m3fnuz q). A selection is
valid when it holds min(topk, kv_len) distinct in-range positions in ascending order, then -1, and
no unselected key scores more than a selected one (up to float rounding: the kernel sums in
float32).

Candidate blocks (DeepSeek-V4.1's two-level indexer; blocks of ``block_size`` positions): a row
given a list of blocks sees only the keys of those blocks (``candidate_keep_ref``); the source
layer's list is a valid top of the blocks ranked by their largest logit, the newest block always
in it (``mla_indexer_candidates_ref``, ``check_candidate_blocks``).
"""

from __future__ import annotations

import torch

from .indexer import index_cache_keys

SENTINEL = -2


def _sentinel_row(logits: torch.Tensor | None) -> bool:
    """Whether a row's answer is SENTINEL everywhere: a bad row (no logits) or a NaN logit."""
    return logits is None or bool(torch.isnan(logits).any())


def mla_indexer_logits_ref(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    block_table: torch.Tensor,
    req_id_per_token: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    shuffled: bool = False,
    max_keys: int | None = None,
    cache_kind: torch.dtype | None = None,
) -> list[torch.Tensor | None]:
    """Per row t, the float64 logits ``[kv_lens[t]]`` of its visible keys (position order), or None
    for a bad row (request outside the table, kv_len < 0, past the table's capacity or past
    ``max_keys``). A key on a page outside ``[0, num_blocks)`` scores NaN (nothing read for it).

    q ``[T, H, 128]`` fp8, weights ``[T, H]`` float32, index_cache uint8 ``[num_blocks,
    block_size, 132]`` (rocm_mla/reference/indexer.py's layout, ``shuffled`` or flat), block_table
    ``[B, max_blocks]`` int32, req_id_per_token ``[>= T]``, kv_lens ``[T]``. cache_kind: the fp8
    kind the cache's values are decoded in (None: q's kind; the op's plan allows q's kind or
    float8_e4m3fn under a float8_e4m3fnuz q).
    """
    T = q.shape[0]
    kind = q.dtype if cache_kind is None else cache_kind
    num_blocks, bs = index_cache.shape[0], index_cache.shape[1]
    bt = block_table.cpu().long()
    reqs = req_id_per_token[:T].cpu().long()
    lens = kv_lens[:T].cpu().long()
    qf = q.cpu().float().double()
    w = weights.cpu().double()
    cap = bt.shape[1] * bs if max_keys is None else min(bt.shape[1] * bs, max_keys)
    out: list[torch.Tensor | None] = []
    for t in range(T):
        r, n = int(reqs[t]), int(lens[t])
        if not (0 <= r < bt.shape[0] and 0 <= n <= cap):
            out.append(None)
            continue
        pos = torch.arange(n)
        pages = bt[r, pos // bs]
        ok = (pages >= 0) & (pages < num_blocks)
        slots = torch.where(ok, pages, 0) * bs + pos % bs
        keys = index_cache_keys(index_cache.cpu(), slots, fp8_dtype=kind, shuffled=shuffled)[0].double()  # [n, 128]
        s = torch.relu(qf[t] @ keys.T)  # [H, n]
        lg = (w[t][:, None] * s).sum(0)
        # relu(NaN) must stay NaN (torch.relu keeps it) and so must 0 x NaN in the weights' sum.
        lg = torch.where(ok, lg, float("nan"))
        out.append(lg)
    return out


def mla_indexer_topk_ref(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    block_table: torch.Tensor,
    req_id_per_token: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    topk: int,
    shuffled: bool = False,
    max_keys: int | None = None,
    cache_kind: torch.dtype | None = None,
) -> torch.Tensor:
    """``[T, topk]`` int32: per row the positions of its ``topk`` largest logits (float64, ties by
    position) in ascending order, then -1; SENTINEL (-2) in every entry of a bad row or of a row
    whose logits hold a NaN. Arguments as ``mla_indexer_logits_ref``. Rows that see only their
    candidate blocks: ``topk_from_logits`` with ``candidate_keep_ref``'s masks."""
    logits = mla_indexer_logits_ref(
        q, weights, index_cache, block_table, req_id_per_token, kv_lens, shuffled=shuffled, max_keys=max_keys,
        cache_kind=cache_kind,
    )  # fmt: skip
    return topk_from_logits(logits, topk).to(q.device)


def topk_from_logits(logits: list[torch.Tensor | None], topk: int, *, keep=None) -> torch.Tensor:
    """``mla_indexer_topk_ref``'s answer ``[T, topk]`` int32 (CPU) from its rows' float64 ``logits``
    (``mla_indexer_logits_ref``'s), with ``keep`` (``candidate_keep_ref``'s masks) when the rows
    see only their candidate blocks."""
    out = torch.full((len(logits), topk), -1, dtype=torch.int32)
    for t, lg in enumerate(logits):
        lg, pos = _kept(lg, False if keep is None else keep[t])
        if _sentinel_row(lg):
            out[t] = SENTINEL
            continue
        m = min(topk, lg.numel())
        out[t, :m] = pos[_top_ids(lg, m)]
    return out


def _top_ids(score: torch.Tensor, m: int) -> torch.Tensor:
    """The indices of the m largest of ``score`` (ties by index, as the kernels take them), in
    ascending order, int32."""
    order = torch.sort(score, descending=True, stable=True).indices[:m]
    return torch.sort(order).values.to(torch.int32)


def candidate_keep_ref(
    candidates: torch.Tensor, logits: list[torch.Tensor | None], block_size: int
) -> list[torch.Tensor | None]:
    """Per row t (of ``logits``, ``mla_indexer_logits_ref``'s), a bool ``[kv_len]``: which of its
    keys lie in a block listed in ``candidates[t]`` (block of position j: ``j // block_size``;
    -1 and ids past the row's blocks list nothing); None for a list holding an entry below -1
    (a bad list: the row's keys then count as NaN, so a row that sees any key gets SENTINEL)."""
    cands = candidates.cpu().long()
    keep: list[torch.Tensor | None] = []
    for t, lg in enumerate(logits):
        row = cands[t]
        if bool((row < -1).any()):
            keep.append(None)
            continue
        n = 0 if lg is None else lg.numel()
        listed = torch.zeros(-(-n // block_size) + 1, dtype=torch.bool)
        ids = row[(row >= 0) & (row < listed.numel() - 1)]
        listed[ids] = True
        keep.append(listed[torch.arange(n) // block_size])
    return keep


def _kept(lg: torch.Tensor | None, keep) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(the logits a row's selection ranks, their positions): all of them without candidates; the
    listed keys' with a keep mask; every key as NaN for a bad list (None) -- a row without keys
    keeps none either way."""
    if lg is None:
        return None, None
    pos = torch.arange(lg.numel())
    if keep is False:  # no candidates given
        return lg, pos
    if keep is None:
        return torch.full_like(lg, float("nan")), pos
    return lg[keep], pos[keep]


def mla_indexer_candidates_ref(logits: list[torch.Tensor | None], *, block_size: int, num_blocks: int) -> torch.Tensor:
    """``[T, num_blocks]`` int32 (CPU), a candidate source layer's lists from its rows' float64
    ``logits`` (``mla_indexer_logits_ref``'s): per row the ids of its min(num_blocks,
    cdiv(kv_len, block_size)) blocks ranked by their largest logit (a NaN logit and the newest
    block, the one holding position kv_len - 1, rank first: ``block_scores_ref``), ties by id, in
    ascending order, then -1; SENTINEL everywhere for a bad row."""
    out = torch.full((len(logits), num_blocks), -1, dtype=torch.int32)
    for t, lg in enumerate(logits):
        if lg is None:
            out[t] = SENTINEL
            continue
        score = block_scores_ref(lg, block_size)
        m = min(num_blocks, score.numel())
        out[t, :m] = _top_ids(score, m)
    return out


def block_scores_ref(lg: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[cdiv(n, block_size)]`` float64: each block's largest logit of a row's ``lg [n]``; +inf
    for a block holding a NaN and for the newest block (the source layer always lists them)."""
    n = lg.numel()
    nb = -(-n // block_size)
    padded = torch.full((nb * block_size,), float("-inf"), dtype=torch.float64)
    padded[:n] = lg
    blocks = padded.view(nb, block_size)
    score = torch.where(torch.isnan(blocks).any(1), float("inf"), blocks.nan_to_num(nan=0.0).amax(1))
    if nb:
        score[nb - 1] = float("inf")
    return score


def check_candidate_blocks(
    out: torch.Tensor, logits: list[torch.Tensor | None], block_size: int, *, rtol: float = 1e-4
) -> str:
    """ "" when ``out [T, C]`` is a valid candidate source answer for the reference ``logits``
    (``mla_indexer_candidates_ref``'s rules, ties and float rounding aside: no unlisted block
    scores more than a listed one, the newest and NaN blocks listed), else what is wrong with the
    first bad row."""
    o = out.cpu().long()
    C = o.shape[1]
    for t in range(o.shape[0]):
        lg, row = logits[t], o[t]
        if lg is None:
            if not bool((row == SENTINEL).all()):
                return f"row {t}: expected the bad-row sentinel {SENTINEL} everywhere, got {row[:8].tolist()}..."
            continue
        score = block_scores_ref(lg, block_size)
        nb = score.numel()
        m = min(C, nb)
        sel, pad = row[:m], row[m:]
        if bool((pad != -1).any()):
            return f"row {t}: expected -1 after the first {m} entries, got {pad[pad != -1][:8].tolist()}"
        if bool(((sel < 0) | (sel >= nb)).any()):
            return f"row {t}: expected block ids in [0, {nb}), got {sel[(sel < 0) | (sel >= nb)][:8].tolist()}"
        if m > 1 and bool((sel[1:] <= sel[:-1]).any()):
            return f"row {t}: expected distinct block ids in ascending order, got {sel[:8].tolist()}..."
        if m < nb:
            picked = torch.zeros(nb, dtype=torch.bool)
            picked[sel] = True
            if bool((score[~picked] == float("inf")).any()):
                return f"row {t}: the newest block or a block with a NaN logit is not listed"
            finite = score[torch.isfinite(score)]
            tol = rtol * float(finite.abs().max() if finite.numel() else 0.0) + 1e-30
            low_in, high_out = float(score[picked].min()), float(score[~picked].max())
            if high_out > low_in + tol:
                return f"row {t}: an unlisted block scores {high_out:.6g} above a listed {low_in:.6g}: not a top-{C}"
    return ""


def check_indexer_topk(
    out: torch.Tensor, logits: list[torch.Tensor | None], topk: int, *, rtol: float = 1e-4, rows=None, keep=None
) -> str:
    """ "" when ``out [T, topk]`` is a valid answer for the reference ``logits`` (see the module
    docstring), else what is wrong with the first bad row. ``keep``: ``candidate_keep_ref``'s
    masks, when the rows saw only their candidate blocks."""
    o = out.cpu().long()
    for t in range(o.shape[0]) if rows is None else rows:
        lg, pos = _kept(logits[t], False if keep is None else keep[t])
        row = o[t]
        if _sentinel_row(lg):
            if not bool((row == SENTINEL).all()):
                return f"row {t}: expected the bad-row sentinel {SENTINEL} everywhere, got {row[:8].tolist()}..."
            continue
        n, m = lg.numel(), min(topk, lg.numel())
        sel, pad = row[:m], row[m:]
        if bool((pad != -1).any()):
            return f"row {t}: expected -1 after the first {m} entries, got {pad[pad != -1][:8].tolist()}"
        if keep is not None:  # positions -> indices among the kept keys (-1: not a kept key)
            where = torch.full((int(pos.max()) + 1 if pos.numel() else 0,), -1, dtype=torch.long)
            where[pos] = torch.arange(n)
            bad = (sel < 0) | (sel >= where.numel())
            if bool(bad.any()) or bool((where[sel] < 0).any()):
                return f"row {t}: expected positions of the row's candidate blocks, got {sel[:8].tolist()}..."
            sel = where[sel]
        if bool(((sel < 0) | (sel >= n)).any()):
            return f"row {t}: expected positions in [0, {n}), got {sel[(sel < 0) | (sel >= n)][:8].tolist()}"
        if torch.unique(sel).numel() != m:
            return f"row {t}: expected {m} distinct positions, got {torch.unique(sel).numel()} distinct"
        if m < n:
            tol = rtol * float(lg.abs().max()) + 1e-30
            picked = torch.zeros(n, dtype=torch.bool)
            picked[sel] = True
            low_in, high_out = float(lg[picked].min()), float(lg[~picked].max())
            if high_out > low_in + tol:
                return (
                    f"row {t}: an unselected key scores {high_out:.6g} above a selected {low_in:.6g} "
                    f"(tolerance {tol:.3g}): not a top-{topk}"
                )
        if m > 1 and bool((sel[1:] <= sel[:-1]).any()):
            return f"row {t}: expected the positions in ascending order, got {sel[:8].tolist()}..."
    return ""


__all__ = [
    "SENTINEL",
    "mla_indexer_logits_ref",
    "mla_indexer_topk_ref",
    "topk_from_logits",
    "check_indexer_topk",
    "candidate_keep_ref",
    "mla_indexer_candidates_ref",
    "block_scores_ref",
    "check_candidate_blocks",
]
