"""The prefill tests' inputs: varlen batches with q [Tq, N, 192], k_nope / v as views of one
kv_b_proj-shaped buffer and k_pe in each of its layouts, context chunks with the equal one-shot
inputs; the comparison against the float32 reference (lse -inf exactly where the reference has it)."""

from __future__ import annotations

import math

import torch
from _util import DEVICE, assert_close, backends, rand

from rocm_mla.ops.prefill import ContextChunk

P, R, V = 128, 64, 128
SCALE = 1.0 / math.sqrt(P + R)
# Attention output error in fp16 is a few ulps of the largest |v| (~4): 2e-3 relative is too tight.
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}
KERNEL_BACKENDS = [b for b in backends() if b == "triton"]


def cu(lengths, start=0) -> torch.Tensor:
    """cu_seqlens [B + 1] int32 of ``lengths``, from ``start`` (rows before it belong to no sequence)."""
    out = [start]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=DEVICE)


def make_inputs(lq, lk, N, dtype, *, kpe_layout="latent"):
    """q [Tq, N, 192]; k_nope, v as views of one [Tk, N, 256] kv_b_proj-shaped buffer; k_pe as
    ``latent``: [Tk, 576][:, 512:] unsqueezed to [Tk, 1, 64]; ``expand``: [Tk, 1, 64].expand(N) (head
    stride 0); ``per_head_copy``: a real [Tk, N, 64] tensor with every head equal."""
    Tq, Tk = sum(lq), sum(lk)
    q = rand((Tq, N, P + R), dtype)
    kv = rand((Tk, N, P + V), dtype)
    latent = rand((Tk, 512 + R), dtype)
    k_pe = latent[:, 512:].unsqueeze(1)
    if kpe_layout == "expand":
        k_pe = k_pe.expand(Tk, N, R)
    elif kpe_layout == "per_head_copy":
        k_pe = k_pe.expand(Tk, N, R).contiguous()
    return q, kv[..., :P], k_pe, kv[..., P:], cu(lq), cu(lk)


def assert_matches(out, lse, ref, ref_lse, dtype):
    """out [Tq, N, 128] and lse [N, Tq] against the reference: every element written, TOL on out."""
    rtol, atol = TOL[dtype]
    assert not torch.isnan(out.float()).any(), "an output element was not written (NaN)"
    assert not torch.isnan(lse).any(), "an lse element was not written (NaN)"
    assert_close(out.float(), ref, rtol=rtol, atol=atol)
    # -inf where the reference has -inf (rows that see no key), close elsewhere.
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "lse -inf pattern differs"
    fin = torch.isfinite(ref_lse)
    assert_close(
        lse[fin],
        ref_lse[fin],
        rtol=1e-4 if dtype != torch.float32 else 1e-5,
        atol=1e-4 if dtype != torch.float32 else 1e-5,
    )


def context_case(lq, ctx_splits, N, dtype):
    """New tokens (lq per sequence) and context chunks: ctx_splits[c][b] = keys of sequence b in
    chunk c. Returns the helper's inputs and the one-shot inputs (keys = [context..., new])."""
    q, kn, kpe, v, cq, ck = make_inputs(lq, lq, N, dtype)
    chunks = []
    for split in ctx_splits:
        _, c_kn, c_kpe, c_v, _, c_ck = make_inputs(lq, split, N, dtype)
        chunks.append(ContextChunk(c_kn, c_kpe, c_v, c_ck))
    return (q, kn, kpe, v, cq, ck, chunks), one_shot_from(q, kn, kpe, v, cq, ck, chunks)


def one_shot_from(q, kn, kpe, v, cq, ck, chunks):
    """One-shot inputs equal to the chunked-context call: each sequence's keys = [its keys of
    chunk 0, chunk 1, ..., its new keys] (copies of the given tensors)."""
    B = cq.shape[0] - 1
    per_seq = [[] for _ in range(B)]  # per_seq[b]: (kn, kpe, v) pieces in order
    for c in [*chunks, ContextChunk(kn, kpe, v, ck)]:
        for b in range(B):
            s, e = int(c.cu_seqlens_k[b]), int(c.cu_seqlens_k[b + 1])
            per_seq[b].append((c.k_nope[s:e], c.k_pe[s:e], c.v[s:e]))
    full = [torch.cat([piece[i] for b in range(B) for piece in per_seq[b]]) for i in range(3)]
    total = [sum(piece[0].shape[0] for piece in per_seq[b]) for b in range(B)]
    return (q, *full, cq, cu(total))
