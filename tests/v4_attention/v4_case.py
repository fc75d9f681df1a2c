"""The V4 attention tests' glue over rocm_mla.cases.v4_attention: a batch on DEVICE, the batch inside
sentinel guards that the memory-safety tests use, and an independent float64 formula of the op.

Inputs, tolerance and the check are rocm_mla.cases.v4_attention's (make_inputs, TOLERANCE, check):
fp8_ds_mla or 16-bit caches with NaN wherever no list can reach, shuffled block tables, window and
compressed lists of global slots (dense or ragged; ``holes`` / ``dups`` in the shape), q fresh
random values, out / lse NaN-poisoned views.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from _util import DEVICE, backends

from rocm_mla.cases import Guarded, generator
from rocm_mla.cases import v4_attention as v4

BACKENDS = [b for b in ("triton", "reference") if b in backends()]  # no HIP kernel
FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz


def shape(lens, rows=1, H=8, kind="csa", **kw) -> v4.V4Shape:
    """A V4Shape with the tests' small defaults: pages of 16 tokens (window) and 4 compressed rows,
    top-16 CSA lists."""
    kw.setdefault("block", 16)
    if kind != "window":
        kw.setdefault("cblock", 4)
    if kind == "csa":
        kw.setdefault("topk", 16)
    return v4.V4Shape(tuple(lens), rows, H, kind=kind, **kw)


def make_case(lens, rows=1, H=8, kind="csa", *, dtype=torch.float32, seed=0, build=None, **kw) -> v4.V4Inputs:
    """v4.make_inputs on DEVICE of :func:`shape` (``kw``: the shape's fields); ``build``: the
    keywords of make_inputs."""
    return v4.make_inputs(shape(lens, rows, H, kind, **kw), dtype=dtype, device=DEVICE, seed=seed, **(build or {}))


def replace(s: v4.V4Shape, **kw) -> v4.V4Shape:
    return dataclasses.replace(s, **kw)


# ---------------------------------------------------------------- the independent formula
def e4m3_values(codes: torch.Tensor, kind: torch.dtype) -> torch.Tensor:
    """float64 values of e4m3 byte codes from their bits (sign, 4 exponent bits, 3 mantissa bits;
    bias 7 for e4m3fn, whose 0x7F / 0xFF are NaN; bias 8 for e4m3fnuz, whose 0x80 is NaN and which
    has no negative zero)."""
    c = codes.long()
    sign = torch.where(c >= 128, -1.0, 1.0).double()
    e, m = (c >> 3) & 15, (c & 7).double()
    bias = 7 if kind == FN else 8
    mag = torch.where(e == 0, m / 8 * 2.0 ** (1 - bias), (1 + m / 8) * torch.exp2((e - bias).double()))
    val = sign * mag
    nan = (c & 127) == 127 if kind == FN else c == 128
    return torch.where(nan, math.nan, val)


def slot_rows(cache: torch.Tensor, kind: torch.dtype | None) -> torch.Tensor:
    """float64 ``[num_blocks x block_size, 512]``: every slot's row, read from the raw page bytes
    (fp8_ds_mla: ``kind`` an e4m3 dtype) or the values (a float cache: kind None)."""
    nb, bs, _ = cache.shape
    if kind is None:
        return cache.double().reshape(nb * bs, 512)
    pages = cache.as_strided((nb, bs * 584), (cache.stride(0), 1))
    data = pages[:, : bs * 576].reshape(nb * bs, 576)
    scale_bytes = pages[:, bs * 576 :].reshape(nb * bs, 8)[:, :7].double()
    scale = torch.where(scale_bytes == 255, math.inf, 2.0 ** (scale_bytes - 127))
    nope = e4m3_values(data[:, :448], kind).view(-1, 7, 64) * scale[..., None]
    lo, hi = data[:, 448::2].long(), data[:, 449::2].long()
    rope = ((hi << 8) | lo).to(torch.int16).view(torch.bfloat16).double()  # little-endian bf16
    return torch.cat([nope.reshape(-1, 448), rope], 1)


def _entries(idx: torch.Tensor, ptr: torch.Tensor | None, t: int) -> list[int]:
    if ptr is None:
        return idx[t].tolist()
    return idx[int(ptr[t]) : int(ptr[t + 1])].tolist()


def dense_f64(case: v4.V4Inputs, i: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The op by an independent formula, float64 over a dense mask: each row's multiplicity of every
    slot of both caches ``C [T, n]``, logits ``s + log C`` over all n slots ``[T, H, n]``, softmax
    over them and the sink, then the rotation as a complex product with conj(cos + i sin). Valid
    inputs only (no bad entries or positions)."""
    q, wc, wi, wp, cc, ci, cp, sink, pos, cs = (x.cpu() if isinstance(x, torch.Tensor) else x for x in case.args(i))
    T, H, _ = q.shape
    caches = [(wc, case.window.kind if case.window.fp8 else None, wi, wp)]
    if cc is not None:
        caches.append((cc, case.compressed.kind if case.compressed.fp8 else None, ci, cp))
    rows, counts = [], []
    for cache, kind, idx, ptr in caches:
        n = cache.shape[0] * cache.shape[1]
        C = torch.zeros(T, n, dtype=torch.float64)
        for t in range(T):
            for e in _entries(idx, ptr, t):
                if e >= 0:
                    C[t, e] += 1
        rows.append(slot_rows(cache, kind))
        counts.append(C)
    K, C = torch.cat(rows), torch.cat(counts, 1)
    K = torch.where((C.sum(0) > 0)[:, None], K, 0.0)  # slots nobody names: never read
    s = torch.einsum("thd,nd->thn", q.double(), K) * case.sm_scale + torch.log(C)[:, None, :]
    lse = torch.logsumexp(s, -1)
    if sink is not None:
        s = torch.cat([s, sink[:H].double()[None, :, None].expand(T, H, 1)], -1)
    w = torch.softmax(s, -1)[..., : K.shape[0]]
    out = torch.einsum("thn,nd->thd", w, K)  # rows naming nothing (NaN weights) are set below
    named = C.sum(1) > 0
    out[~named], lse[~named] = 0.0, -math.inf
    if pos is not None:
        c, si = cs.double()[pos.long(), :32], cs.double()[pos.long(), 32:]
        z = torch.view_as_complex(out[..., 448:].reshape(T, H, 32, 2).contiguous())
        z = z * torch.complex(c, -si)[:, None, :]
        out[..., 448:] = torch.view_as_real(z).reshape(T, H, 64)
    return out, lse


# ---------------------------------------------------------------- guarded batches
class GuardedCase:
    """A V4 batch inside sentinel guards (rocm_mla.cases.SENTINEL): both caches finite in every slot
    (unused ones random: a row's NaN is the kernel's verdict, not a stray read) with guards of two
    pages past each end, pages wider than their bytes; out ``[T, H, 512]`` (8 elements after each
    row) and lse ``[T, H]`` (1 after each row) as Guarded views that start random (finite), so an
    unwritten row fails the comparison."""

    def __init__(self, lens, rows=1, H=4, kind="csa", *, dtype=torch.float32, seed=0, build=None, **kw):
        kw.setdefault("block", 16)
        build = {"unused": "randn", "guard": 2 * 16 * 584 + 64, "page_pad": 24, **(build or {})}
        self.inputs = make_case(lens, rows, H, kind, dtype=dtype, seed=seed, build=build, **kw)
        T = self.inputs.shape.T
        g = generator(seed + 1, "cpu")
        self.out = Guarded((T, H, 512), dtype, device=DEVICE, fill="randn", pad_last=8, generator=g)
        self.lse = Guarded((T, H), torch.float32, device=DEVICE, fill="randn", pad_last=1, generator=g)

    def __getattr__(self, name):
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
        """Rows in ``nan_rows``: NaN in every element of out and lse; the others agree with ``want``
        (out, lse) under ``tol`` (default the op's tolerance); no guard byte of out, lse or either
        cache changed."""
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

    def check_guards(self) -> None:
        self.out.check("out")
        self.lse.check("lse")
        self.inputs.check_guards()
