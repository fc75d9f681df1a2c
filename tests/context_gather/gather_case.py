"""The context_gather tests' glue over rocm_mla.cases.context_gather: the chunk by its definition."""

from __future__ import annotations

import torch

from rocm_mla.cases.context_gather import ChunkInputs


def by_definition(c: ChunkInputs) -> torch.Tensor:
    """``[T, 576]`` float32: request i's context positions ``[starts[i], starts[i] + rows[i])``, taken
    from the keys the cache was filled with (``c.paged.values``, never paged: independent of the
    block table and of the reference's indexing)."""
    s, values = c.shape, c.paged.values
    rows = [values[i][st : st + n] for i, (st, n) in enumerate(zip(s.starts, s.rows))]
    return torch.cat(rows) if rows else torch.empty(0, 576, device=c.dst.device)
