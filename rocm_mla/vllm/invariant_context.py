"""Cached context cut per request (the vLLM backend's batch-invariant mode, docs/batch-invariance.md):
a request's bits must not depend on which other requests share its step, and vLLM's chunk plan packs
requests into the workspace, so where it cuts a request's context follows the requests before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.model_executor.layers.attention.mla_attention import MLACommonPrefillMetadata

from rocm_mla.ops import PrefillPlan


@dataclass
class ContextPiece:
    """One piece of one request's cached context, under the names of vLLM's context chunk
    (``MLACommonPrefillMetadata.ContextChunk``) that ``RocmMLAImplCommon._fold_in_context`` reads;
    ``rocm_mla_plan``: the piece's ``mla_prefill`` plan (the pieces are made per layer call, so
    the plan is made there too, as the per-request gather always planned it)."""

    request_slice: slice
    token_slice: slice
    is_continuation: bool
    continuation_token_end: int
    num_context_tokens: int
    cu_seq_lens: torch.Tensor
    starts: torch.Tensor
    token_to_seq: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    rocm_mla_plan: PrefillPlan | None = None


def context_pieces(prefill: MLACommonPrefillMetadata, device: torch.device) -> list[ContextPiece]:
    """The prefill's cached context as chunks whose boundaries depend on the request alone, for
    ``RocmMLAImplCommon._fold_in_context``: each request's context cut at multiples of the
    workspace's rows (a constant of the deployment), its pieces in order, the later ones
    continuing the request. The request's bits are then the same in any batch. One gather, one
    up-projection, one attention and one merge per piece (more launches than vLLM's packing when
    many short contexts share a step). The query offsets come from the host (``query_lens_cpu``,
    else one copy of query_start_loc): prefill is not captured.
    """
    chunked = prefill.chunked_context
    assert chunked is not None
    rows = int(chunked.workspace.shape[0])
    if prefill.query_lens_cpu is not None:
        qsl = [0, *torch.as_tensor(prefill.query_lens_cpu).cumsum(0).tolist()]
    else:
        qsl = prefill.query_start_loc.tolist()
    i32 = {"dtype": torch.int32, "device": device}
    pieces = []
    for r, ctx in enumerate(chunked.context_lens_list):
        s, e = qsl[r], qsl[r + 1]
        if e <= s:
            continue
        for start in range(0, ctx, rows):
            n = min(rows, ctx - start)
            piece = ContextPiece(
                request_slice=slice(r, r + 1),
                token_slice=slice(s, e),
                is_continuation=start > 0,
                continuation_token_end=e,
                num_context_tokens=n,
                cu_seq_lens=torch.tensor([0, n], **i32),
                starts=torch.tensor([start], **i32),
                token_to_seq=torch.zeros(n, **i32),
                query_start_loc=torch.tensor([0, e - s], **i32),
                max_query_len=e - s,
                max_seq_len=n,
            )
            pieces.append(piece)
    return pieces


__all__ = ["ContextPiece", "context_pieces"]
