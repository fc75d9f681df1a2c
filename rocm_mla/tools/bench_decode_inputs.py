"""The mla_decode benchmark's inputs, shared by perf/bench_decode.py and perf/profile_decode.py
(so that the profile script need not import the benchmark): one shape's tensors as vLLM hands
them to the decode, and our op's call on them.

Block size 64, q bf16 (or the given dtype), cache in q's dtype or fp8 (the platform's e4m3
kind) with a per-tensor k_scale; R copies of the cache and block table (fresh page permutations)
so that graphs rotating over them find their KV in HBM (see perf/bench_decode.py). rocm-mla tune
builds its decode inputs here too.
"""

from __future__ import annotations

import math

import torch

from .. import _platform
from ..mla_dims import KV_LORA_RANK, KV_ROW_DIM, QK_ROPE_HEAD_DIM
from ..ops.decode import fp8_dtype_for, mla_decode
from ..ops.decode_plan import DecodePlan, plan_decode

L, R_DIM, D = KV_LORA_RANK, QK_ROPE_HEAD_DIM, KV_ROW_DIM  # 512, 64, 576
BLOCK = 64
SCALE = 1.0 / math.sqrt(192)


def shape_label(kind: str, B: int, seq: int, N: int, q_len: int) -> str:
    return f"{kind} B={B} seq={seq} N={N}" + (f" q{q_len}" if q_len > 1 else "")


class Setup:
    """One shape: q as vLLM produces it (rows = B x q_len), out/lse buffers, R (cache, block table)
    copies (together > 3 x ``cold_bytes``, benchutil.cold_cache_bytes, up to 64 copies: ``cold``
    says whether they reach it; 0: one copy). Every request holds ``seq`` keys, its last q_len
    being the new tokens (MTP rows). ``kv_kind``: "fp8" (the platform's e4m3 kind, k_scale 0.05),
    or "bf16" / "auto" for a cache in ``dtype`` (q's and out's dtype)."""

    def __init__(
        self,
        B: int,
        seq: int,
        N: int,
        kv_kind: str,
        dev: torch.device,
        cold_bytes: int,
        block: int = BLOCK,
        q_len: int = 1,
        dtype: torch.dtype = torch.bfloat16,
    ):
        if kv_kind not in ("fp8", "bf16", "auto"):
            raise ValueError(f"Setup: kv_kind: expected 'fp8', 'bf16' or 'auto', got {kv_kind!r}")
        self.B, self.seq, self.N, self.kv_kind, self.block, self.q_len = B, seq, N, kv_kind, block, q_len
        self.rows, self.dtype = B * q_len, dtype
        self.fp8 = kv_kind == "fp8"
        blocks = math.ceil(seq / block)
        elem = 1 if self.fp8 else dtype.itemsize
        set_bytes = self.set_bytes = B * blocks * block * D * elem  # one (cache, table) copy's KV
        self.R = max(1, min(64, math.ceil(3 * cold_bytes / set_bytes)))
        # False when 64 copies are still short of 3 x cold_bytes (small shapes against AMD's 256 MB
        # Infinity Cache): their KV may then come partly from a cache, which the benches print.
        self.cold = self.R * set_bytes >= 3 * cold_bytes
        self.k_scale = torch.tensor([0.05], device=dev) if self.fp8 else None
        self.caches, self.tables = [], []
        fp8 = fp8_dtype_for(_platform.device_arch(dev))  # e4m3fnuz on gfx942, e4m3fn elsewhere
        for _ in range(self.R):
            npages = B * blocks
            kv = torch.randn(npages, block, D, device=dev, dtype=dtype)
            if self.fp8:
                kv = (kv.float() / 0.05).clamp(-200, 200).to(fp8)
            self.caches.append(kv)
            self.tables.append(torch.randperm(npages, device=dev, dtype=torch.int32).view(B, blocks))
        self.seq_lens = torch.full((B,), seq, dtype=torch.int32, device=dev)
        # ql_nope = bmm(q_nope^T [N, rows, 128], W_UK_T [N, 128, 512]) -> [N, rows, 512], read as [rows, N, 512].
        self.ql_nope = torch.randn(N, self.rows, L, device=dev, dtype=dtype).transpose(0, 1)
        self.q = torch.randn(self.rows, N, 192, device=dev, dtype=dtype)
        self.q_pe = self.q[..., 128:]
        self.out = torch.empty(self.rows, N, L, device=dev, dtype=dtype)
        self.lse = torch.empty(self.rows, N, device=dev, dtype=torch.float32)

    @property
    def label(self) -> str:
        return shape_label(self.kv_kind, self.B, self.seq, self.N, self.q_len)

    def nbytes(self) -> float:
        elem = 1 if self.fp8 else self.dtype.itemsize
        qb = self.dtype.itemsize
        return self.B * self.seq * D * elem + self.rows * self.N * D * qb + self.rows * self.N * L * qb

    def keys_seen(self) -> int:
        """Keys summed over one request's rows (row t of q_len sees seq - q_len + 1 + t: causal MTP)."""
        return sum(self.seq - self.q_len + 1 + t for t in range(self.q_len))

    def flops(self) -> float:
        return self.B * 2.0 * self.N * self.keys_seen() * (D + L)


def ours(s: Setup, config=None, num_kv_splits=None):
    """``call(i)``: mla_decode (Triton) on ``s`` with cache copy i, an fp8 cache handed over as vLLM
    does (uint8 storage, kv_cache_dtype "fp8"); ``config`` / ``num_kv_splits`` as the op takes
    them (tuning). perf/bench_decode.py and rocm-mla tune time this call."""

    def call(i: int):
        mla_decode(
            s.ql_nope,
            s.q_pe,
            s.caches[i].view(torch.uint8) if s.fp8 else s.caches[i],
            s.tables[i],
            s.seq_lens,
            sm_scale=SCALE,
            out=s.out,
            lse=s.lse,
            kv_cache_dtype="fp8" if s.fp8 else "auto",
            k_scale=s.k_scale,
            max_seq_len=s.seq,
            backend="triton",
            config=config,
            num_kv_splits=num_kv_splits,
        )
        return s.out

    return call


def plan_for(s: Setup, device, config=None, num_kv_splits=None) -> DecodePlan:
    """mla_decode's launch plan (splits, row blocks, config) for ``s``'s call, as ``ours`` makes it."""
    return plan_decode(
        batch=s.B,
        num_heads=s.N,
        q_len=s.q_len,
        max_blocks=s.tables[0].shape[1],
        block_size=s.block,
        q_dtype=s.dtype,
        kv_dtype=s.caches[0].dtype,
        device=device,
        max_seq_len=s.seq,
        num_kv_splits=num_kv_splits,
        config=config,
    )
