"""The decode tests' batch: a paged cache with NaN wherever seq_lens does not reach (page tails and
whole unused pages), a shuffled block table whose unused entries point at all-NaN pages (one stray
read poisons the output), q_nope / q_pe as strided slices; the comparison against the float32
reference."""

from __future__ import annotations

import math

import torch
from _util import DEVICE, HAS_GPU, assert_close, backends

import rocm_mla
from rocm_mla.reference import mla_decode_ref

NAN = float("nan")
BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP decode kernel
# (rtol, atol) on out; lse is compared with 1e-3 abs (fp32 accumulation of exact products).
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}
FP8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
# The interpreter converts e4m3fn only; GPU runs use the platform's flavour (gfx942: e4m3fnuz).
FP8_HERE = FP8 if HAS_GPU else torch.float8_e4m3fn

V_SPLIT_CFG = {"BLOCK_H": 16, "BLOCK_N": 16, "D_SPLIT": 2, "V_SPLIT": 2, "num_warps": 4, "num_stages": 1}


class Case:
    """One decode batch: paged cache (NaN wherever seq_lens does not reach), shuffled block table,
    q_nope/q_pe as strided slices, and the logical (unpaged) per-request K rows for the
    independent check."""

    def __init__(
        self,
        B,
        N,
        q_len,
        block_size,
        lens,
        dtype,
        *,
        kv_dtype=None,
        k_scale=None,
        seed=0,
        spare_cols=1,
        q_layout="one_buffer",
    ):
        assert len(lens) == B
        g = torch.Generator().manual_seed(seed)
        self.B, self.N, self.q_len, self.lens, self.dtype = B, N, q_len, list(lens), dtype
        nblk = [math.ceil(L / block_size) for L in lens]
        used = sum(nblk)
        num_pages = used + 3  # 3 all-NaN pages for unused table entries
        perm = torch.randperm(num_pages, generator=g)
        max_blocks = max(nblk + [1]) + spare_cols
        kv = torch.full((num_pages, block_size, 576), NAN)
        bt = torch.empty(B, max_blocks, dtype=torch.int32)
        self.logical = []
        k = 0
        scale = 1.0 if k_scale is None else float(k_scale)
        for b, L in enumerate(lens):
            pages = perm[k : k + nblk[b]]
            k += nblk[b]
            bt[b, : nblk[b]] = pages.int()
            bt[b, nblk[b] :] = perm[used + (b % 3)].int()
            vals = torch.randn(L, 576, generator=g)
            if kv_dtype is not None and kv_dtype.is_floating_point and kv_dtype.itemsize == 1:
                vals = (vals / scale).to(kv_dtype).float() * scale  # what the cache can hold
            tok = torch.arange(L)
            kv[pages[tok // block_size], tok % block_size] = vals / scale
            self.logical.append(vals)
        kvd = kv_dtype or dtype
        self.kv = kv.to(kvd).to(DEVICE)
        self.block_table = bt.to(DEVICE)
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        rows = B * q_len
        if q_layout == "one_buffer":  # [rows, N, 576 + 8]: nope and pe are slices of one row
            base = torch.randn(rows, N, 584, generator=g).to(dtype).to(DEVICE)
            self.q_nope, self.q_pe = base[..., :512], base[..., 512:576]
        else:  # separate buffers, q_pe a [.., 192][..., 128:] slice and token-strided
            self.q_nope = torch.randn(rows, N, 512, generator=g).to(dtype).to(DEVICE)
            qb = torch.randn(rows + 1, N, 192, generator=g).to(dtype).to(DEVICE)
            self.q_pe = qb[1:, :, 128:]
        self.k_scale = k_scale
        self.sm_scale = 1.0 / math.sqrt(192)

    def run(self, **kw):
        return rocm_mla.mla_decode(
            self.q_nope, self.q_pe, self.kv, self.block_table, self.seq_lens, sm_scale=self.sm_scale, **kw
        )

    def ref(self):
        return mla_decode_ref(
            self.q_nope, self.q_pe, self.kv, self.block_table, self.seq_lens, self.sm_scale, self.k_scale
        )


def check_case(case, out, lse, ref=None, tol=None):
    """out and lse of ``case`` against ``ref`` (default: its float32 reference): no NaN, TOL on out,
    1e-3 absolute on lse."""
    ro, rl = ref if ref is not None else case.ref()
    rtol, atol = tol or TOL[case.dtype]
    assert not torch.isnan(out.float()).any(), "NaN in out: an element not written, or a poisoned slot read"
    assert not torch.isnan(lse).any(), "NaN in lse"
    assert_close(out.float(), ro, rtol=rtol, atol=atol)
    assert_close(lse, rl, rtol=0, atol=1e-3)
