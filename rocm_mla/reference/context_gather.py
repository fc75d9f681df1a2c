"""Float32 reference of context_gather: the chunk's rows read straight from the paged cache."""

from __future__ import annotations

import torch


def context_gather_ref(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    starts: torch.Tensor,
    token_to_seq: torch.Tensor,
    num_tokens: int,
    k_scale: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Gather ``num_tokens`` context rows of one chunk from the paged cache, in float32.

    kv_cache ``[num_blocks, block_size, D]`` (any float dtype, float8 included; value = stored x
    k_scale when k_scale is given). block_table ``[R, max_blocks]`` int; cu_seq_lens ``[R + 1]``
    (the chunk's rows per request, cumulative); starts ``[R]`` (each request's first context
    position in the chunk); token_to_seq ``[>= num_tokens]`` (the request of each chunk row).
    Row t belongs to request ``s = token_to_seq[t]``, is its context position
    ``pos = starts[s] + t - cu_seq_lens[s]`` and lives at
    ``kv_cache[block_table[s, pos // block_size], pos % block_size]``.

    Bad values (the kernel's contract; nothing outside the given tensors is read): a row whose
    request is outside ``[0, R)``, whose position is outside its table row
    ``[0, max_blocks x block_size)``, or whose page is outside ``[0, num_blocks)`` is NaN (all D
    values); other rows are exact copies of the cache (times k_scale).

    Returns ``[num_tokens, D]`` float32.
    """
    T = int(num_tokens)
    dev = kv_cache.device
    R, max_blocks = block_table.shape
    num_blocks, block_size, D = kv_cache.shape
    seq = token_to_seq[:T].long().to(dev)
    ok = (seq >= 0) & (seq < R)
    seq = torch.where(ok, seq, 0)
    if R:
        pos = starts.long().to(dev)[seq] + torch.arange(T, device=dev) - cu_seq_lens.long().to(dev)[seq]
    else:
        pos = torch.zeros(T, dtype=torch.long, device=dev)
    ok &= (pos >= 0) & (pos < max_blocks * block_size)
    pos = torch.where(ok, pos, 0)
    page = block_table.long().to(dev)[seq, pos // block_size] if R and max_blocks else torch.zeros_like(pos)
    ok &= (page >= 0) & (page < num_blocks)
    if num_blocks:
        page, off = torch.where(ok, page, 0), pos % block_size
        if kv_cache.element_size() == 1 and kv_cache.dtype.is_floating_point:
            # float8: gather the bytes, then convert (float8 indexing is missing from some builds).
            rows = kv_cache.view(torch.uint8)[page, off].view(kv_cache.dtype).float()
        else:
            rows = kv_cache[page, off].float()
    else:
        rows = torch.zeros(T, D, device=dev)
    if k_scale is not None:
        scale = k_scale.float().reshape(-1)[0].to(dev) if isinstance(k_scale, torch.Tensor) else float(k_scale)
        rows = rows * scale
    return torch.where(ok[:, None], rows, float("nan"))
