"""The sparse tests' glue over rocm_mla.cases.sparse: a batch on DEVICE, and the batch inside sentinel
guards that the memory-safety tests use.

Inputs, tolerance and the check are rocm_mla.cases.sparse's (make_inputs, TOLERANCE, check): a paged
cache with NaN wherever no request reaches, a shuffled block table, top-k lists of distinct visible
positions in random order (``holes`` / ``dups``: -1 and repeated entries among them), q_nope / q_pe as
strided slices, out / lse NaN-poisoned views.
"""

from __future__ import annotations

import torch
from _util import DEVICE, backends

from rocm_mla.cases import Guarded, generator, sparse
from rocm_mla.mla_dims import KV_LORA_RANK, KV_ROW_DIM

BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP kernel


def make_case(lens, rows=1, N=16, K=32, block=16, dtype=torch.float32, *, kv="auto", mode="paged", **kw):
    """sparse.make_inputs on DEVICE: requests of ``lens`` keys with ``rows`` query rows each, N heads,
    K entries per row, pages of ``block`` tokens. q_nope / q_pe are slices of one ``[T, N, 584]``
    buffer unless ``q_layout=`` says otherwise."""
    kw.setdefault("q_layout", "one_buffer")
    shape = sparse.SparseShape(tuple(lens), rows, N, K=K, block=block, kv=kv, mode=mode)
    return sparse.make_inputs(shape, dtype=dtype, device=DEVICE, **kw)


class GuardedCase:
    """A sparse batch inside sentinel guards (rocm_mla.cases.SENTINEL): the cache finite in every
    slot (unused ones random: a row's NaN is the kernel's verdict, not a stray read), guards reaching
    two pages past each end of it; out ``[T, N, 512]`` (8 elements after each row) and lse ``[T, N]``
    (1 after each row) as Guarded views that start random (finite), so an unwritten row fails."""

    def __init__(self, lens, rows, N, block, K=24, *, dtype=torch.float32, kv="auto", mode="paged", seed=0, **kw):
        self.inputs = make_case(
            lens, rows, N, K, block, dtype, kv=kv, mode=mode, k_scale=1.0, seed=seed, q_layout="vllm",
            unused="randn", guard=2 * block * KV_ROW_DIM + 64, **kw,
        )  # fmt: skip
        T, g = self.inputs.shape.T, generator(seed + 1, "cpu")
        self.out = Guarded((T, N, KV_LORA_RANK), dtype, device=DEVICE, fill="randn", pad_last=8, generator=g)
        self.lse = Guarded((T, N), torch.float32, device=DEVICE, fill="randn", pad_last=1, generator=g)

    @property
    def kv(self) -> torch.Tensor:
        return self.inputs.kv_cache

    @property
    def nb(self) -> int:
        """Pages in the cache."""
        return self.kv.shape[0]

    def __getattr__(self, name):  # q_nope, q_pe, block_table, positions, reference, ...
        if name == "inputs":
            raise AttributeError(name)
        return getattr(self.inputs, name)

    def run(self, backend, **kw):
        """The op on the guarded out / lse, on ``backend`` (a given ``plan=`` holds its own)."""
        kw.setdefault("out", self.out.view)
        kw.setdefault("lse", self.lse.view)
        if kw.get("plan") is None:
            kw["backend"] = backend
        return self.inputs.run(**kw)

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
        self.out.check("out")
        self.lse.check("lse")
        self.inputs.paged.check_guards("kv_cache")
