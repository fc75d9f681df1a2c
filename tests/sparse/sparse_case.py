"""The sparse tests' glue over rocm_mla.cases.sparse: a batch on DEVICE, and the batch inside sentinel
guards that the memory-safety tests use.

Inputs, tolerance and the check are rocm_mla.cases.sparse's (make_inputs, TOLERANCE, check): a paged
cache with NaN wherever no request reaches, a shuffled block table, top-k lists of distinct visible
positions in random order (``holes`` / ``dups``: -1 and repeated entries among them), q_nope / q_pe as
strided slices, out / lse NaN-poisoned views.
"""

from __future__ import annotations

import torch
from _util import DEVICE, GuardedLatentCase, backends

from rocm_mla.cases import sparse
from rocm_mla.mla_dims import KV_ROW_DIM

BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP kernel


def make_case(lens, rows=1, N=16, K=32, block=16, dtype=torch.float32, *, kv="auto", mode="paged", **kw):
    """sparse.make_inputs on DEVICE: requests of ``lens`` keys with ``rows`` query rows each, N heads,
    K entries per row, pages of ``block`` tokens. q_nope / q_pe are slices of one ``[T, N, 584]``
    buffer unless ``q_layout=`` says otherwise."""
    kw.setdefault("q_layout", "one_buffer")
    shape = sparse.SparseShape(tuple(lens), rows, N, K=K, block=block, kv=kv, mode=mode)
    return sparse.make_inputs(shape, dtype=dtype, device=DEVICE, **kw)


class GuardedCase(GuardedLatentCase):
    """A sparse batch inside sentinel guards (rocm_mla.cases.SENTINEL): the cache finite in every
    slot (unused ones random: a row's NaN is the kernel's verdict, not a stray read), guards reaching
    two pages past each end of it; out and lse guarded (``GuardedLatentCase``)."""

    def __init__(self, lens, rows, N, block, K=24, *, dtype=torch.float32, kv="auto", mode="paged", seed=0, **kw):
        inputs = make_case(
            lens, rows, N, K, block, dtype, kv=kv, mode=mode, k_scale=1.0, seed=seed, q_layout="vllm",
            unused="randn", guard=2 * block * KV_ROW_DIM + 64, **kw,
        )  # fmt: skip
        super().__init__(inputs, inputs.shape.T, N, dtype, seed)

    def check(self, want, *, nan_rows=(), tol=None):
        """Rows in ``nan_rows``: NaN in out and lse; the others agree with ``want`` (out, lse) under
        ``tol`` (default the op's tolerance); no guard byte of out, lse or the cache changed."""
        ro, rl = want
        out, lse = self.out.view, self.lse.view
        nan = torch.zeros(out.shape[0], dtype=torch.bool)
        nan[list(nan_rows)] = True
        for t in range(out.shape[0]):
            if nan[t]:
                assert torch.isnan(out[t].float()).all() and torch.isnan(lse[t]).all(), f"row {t}: not NaN"
        keep = (~nan).nonzero().flatten().to(out.device)
        self.inputs.check(out[keep], lse[keep], ref=(ro[keep], rl[keep]), tol=tol)
        self.check_guards()
