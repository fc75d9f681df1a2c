"""The decode tests' glue over rocm_mla.cases.decode: a batch on DEVICE from request lengths, and
the batch inside sentinel guards that the memory-safety tests use.

Inputs, tolerance and the check are rocm_mla.cases.decode's (make_inputs, TOLERANCE, check): a paged
cache with NaN wherever seq_lens does not reach, a shuffled block table whose unused entries point at
all-NaN pages, q_nope / q_pe as strided slices, out / lse NaN-poisoned views.
"""

from __future__ import annotations

import torch
from _util import DEVICE, GuardedLatentCase, backends

from rocm_mla.cases import decode
from rocm_mla.mla_dims import KV_ROW_DIM

BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP decode kernel

V_SPLIT_CFG = {"BLOCK_H": 16, "BLOCK_N": 16, "D_SPLIT": 2, "V_SPLIT": 2, "num_warps": 4, "num_stages": 1}


def make_case(lens, N, q_len=1, block=16, dtype=torch.float32, *, fp8=False, **kw) -> decode.DecodeInputs:
    """decode.make_inputs on DEVICE for requests of ``lens`` keys, N heads, q_len rows each, pages of
    ``block`` tokens; ``fp8``: an fp8 cache of the platform's e4m3 kind (``k_scale=``). q_nope / q_pe
    are slices of one ``[rows, N, 584]`` buffer unless ``q_layout=`` says otherwise."""
    kw.setdefault("q_layout", "one_buffer")
    shape = decode.DecodeShape(N=N, q_len=q_len, block=block, lens=tuple(lens), kv="fp8" if fp8 else "auto")
    return decode.make_inputs(shape, dtype=dtype, device=DEVICE, **kw)


class GuardedCase(GuardedLatentCase):
    """A decode batch inside sentinel guards (rocm_mla.cases.SENTINEL): the cache finite in every
    slot (unused ones random: a request's NaN rows are the kernel's verdict, not a stray read),
    guards reaching two pages past each end of it; out and lse guarded (``GuardedLatentCase``)."""

    def __init__(self, lens, N, q_len, block, *, dtype=torch.float32, fp8=False, spare_pages=2, spare_cols=1, seed=0):
        inputs = make_case(
            lens, N, q_len, block, dtype, fp8=fp8, k_scale=1.0, seed=seed, q_layout="vllm", spare_pages=spare_pages,
            spare_cols=spare_cols, unused="randn", guard=2 * block * KV_ROW_DIM + 64,
        )  # fmt: skip
        super().__init__(inputs, len(lens) * q_len, N, dtype, seed)
        self.q_len = q_len

    def check(self, want, *, nan_requests=(), tol=None):
        """Requests in ``nan_requests``: every row NaN in out and lse; the others agree with ``want``
        (out, lse) under ``tol`` (default the decode tolerance); no guard byte of out, lse or the
        cache changed."""
        ro, rl = want
        out, lse = self.out.view, self.lse.view
        for b in range(self.inputs.shape.B):
            r = slice(b * self.q_len, (b + 1) * self.q_len)
            if b in nan_requests:
                assert torch.isnan(out[r].float()).all() and torch.isnan(lse[r]).all(), f"request {b}: not NaN"
            else:
                self.inputs.check(out[r], lse[r], ref=(ro[r], rl[r]), tol=tol)
        self.check_guards()
