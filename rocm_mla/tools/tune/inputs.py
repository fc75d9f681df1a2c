"""What the tuner runs: per op a ``Case`` (the inputs of one timed shape, laid out as a serving
process lays them out, and ``check()`` against the float32 reference on a subset of rows) and the
``small_*`` calls that verify a changed config on small uneven inputs (the same checks as
``rocm-mla tune --check``)."""

from __future__ import annotations

import torch

from rocm_mla import configs as C
from rocm_mla.tools.bench_decode_inputs import SCALE as SCALE_DECODE  # the timed call's scale: its check uses it too
from rocm_mla.tools.bench_decode_inputs import Setup, ours

from .shapes import Shape

MAX_POS = 163840  # DeepSeek-V3: 4096 positions x YaRN factor 40

_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def shape_dtype(s: Shape, dev: torch.device) -> torch.dtype:
    dt = s["dt"]
    if dt == "auto":  # bf16 dots are wrong in the Triton CPU interpreter (triton issue 11584)
        return torch.bfloat16 if dev.type == "cuda" else torch.float16
    if dt not in _DT:
        raise ValueError(f"{s.key}: dt must be auto, bf16, fp16 or fp32")
    return _DT[dt]


def rel_err(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float) -> str:
    """'' when max |got - ref| / (1 + |ref|) <= tol (equal infinities agree), else what failed."""
    got, ref = got.float(), ref.float()
    same_inf = torch.isinf(ref) & (got == ref)
    err = torch.where(same_inf, torch.zeros_like(ref), (got - ref).abs() / (1 + ref.abs()))
    e = float(err.max()) if err.numel() else 0.0
    return "" if e <= tol else f"{name} max err {e:.3g} > {tol:g}"


class Case:
    """Inputs of one shape on ``dev``; ``check()`` runs the op once and compares with the reference
    ('' = right); ``fn()`` is the timed call, ``call(i)`` the same on input copy ``i`` of ``copies``
    (``timing.time_case_us`` times it)."""

    copies = 1
    dev: torch.device

    def fn(self) -> None:
        raise NotImplementedError

    def call(self, i: int) -> None:
        self.fn()

    def check(self) -> str:
        raise NotImplementedError


class DecodeCase(Case):
    """mla_decode as vLLM calls it, on perf/bench_decode.py's inputs (tools/bench_decode_inputs.Setup:
    ql_nope the [N, rows, 512] bmm output seen as [rows, N, 512], q_pe a slice of q [rows, N, 192],
    out/lse preallocated, shuffled pages, the same cold-cache copies); the fp8 cache handed over as
    uint8 with kv_cache_dtype "fp8", max_seq_len given."""

    def __init__(self, s: Shape, dev: torch.device):
        from rocm_mla.tools.benchutil import cold_cache_bytes

        self.s, self.dev = s, dev
        dt = shape_dtype(s, dev)
        if s["kv"] not in ("auto", "fp8"):
            raise ValueError(f"{s.key}: kv must be auto or fp8")
        cold = cold_cache_bytes(dev) if dev.type == "cuda" else 0
        self.su = Setup(s["B"], s["seq"], s["N"], s["kv"], dev, cold, block=s["block"], q_len=s["q"], dtype=dt)
        self.copies, self.tol = self.su.R, _TOL[dt]
        self._call = ours(self.su)

    def call(self, i: int) -> None:
        self._call(i)

    def fn(self) -> None:
        self.call(0)

    def check(self) -> str:
        from rocm_mla.reference import mla_decode_ref

        su = self.su
        self.call(0)
        nb = min(su.B, 2)
        r = nb * su.q_len
        ro, rl = mla_decode_ref(
            su.ql_nope[:r], su.q_pe[:r], su.caches[0], su.tables[0][:nb], su.seq_lens[:nb], SCALE_DECODE, su.k_scale
        )
        return rel_err("out", su.out[:r], ro, self.tol) or rel_err("lse", su.lse[:r], rl, 1e-3)


class PrefillCase(Case):
    """mla_prefill causal as the model lays it out: k_nope / v views of the [T, N, 256] kv_b_proj
    output, k_pe a slice of the [T, 576] latent buffer, out into a [T, N*128] buffer, lse [N, T]."""

    def __init__(self, s: Shape, dev: torch.device):
        self.s, self.dev = s, dev
        B, L, N = s["B"], s["L"], s["N"]
        dt = shape_dtype(s, dev)
        T = B * L
        self.L, self.tol = L, _TOL[dt]
        self.q = torch.randn(T, N, 192, device=dev, dtype=dt)
        kv = torch.randn(T, N, 256, device=dev, dtype=dt)
        self.k_nope, self.v = kv[..., :128], kv[..., 128:]
        self.k_pe = torch.randn(T, 576, device=dev, dtype=dt)[:, 512:].unsqueeze(1)
        self.cu = torch.arange(0, T + 1, L, dtype=torch.int32, device=dev)
        self.out = torch.empty(T, N * 128, device=dev, dtype=dt).view(T, N, 128)
        self.lse = torch.empty(N, T, device=dev, dtype=torch.float32)

    def fn(self) -> None:
        from rocm_mla.ops import mla_prefill

        mla_prefill(
            self.q,
            self.k_nope,
            self.k_pe,
            self.v,
            self.cu,
            self.cu,
            sm_scale=192**-0.5,
            causal=True,
            out=self.out,
            lse=self.lse,
            max_seqlen_q=self.L,
            max_seqlen_k=self.L,
        )

    def check(self) -> str:
        # Causal with lq == lk: the first m queries of sequence 0 see only its first m keys.
        from rocm_mla.reference import mla_prefill_ref

        self.fn()
        m = min(self.L, 128)
        cu = torch.tensor([0, m], dtype=torch.int32, device=self.dev)
        ro, rl = mla_prefill_ref(self.q[:m], self.k_nope[:m], self.k_pe[:m], self.v[:m], cu, cu, 192**-0.5, True)
        return rel_err("out", self.out[:m], ro, self.tol) or rel_err("lse", self.lse[:, :m], rl, 1e-3)


class MergeCase(Case):
    """merge_attn_states on [T, N, D] views ("strided": rows padded to D + 64, the pad_v layout),
    lse [N, T], output_lse written."""

    def __init__(self, s: Shape, dev: torch.device):
        self.s, self.dev = s, dev
        T, N, D = s["T"], s["N"], s["D"]
        dt = shape_dtype(s, dev)
        if s["layout"] not in ("strided", "contiguous"):
            raise ValueError(f"{s.key}: layout must be strided or contiguous")
        width = D + 64 if s["layout"] == "strided" else D
        mk = lambda: torch.randn(T, N, width, device=dev, dtype=dt)[..., :D]  # noqa: E731
        self.po, self.so, self.out = mk(), mk(), mk()
        self.pl, self.sl, self.ol = (torch.randn(N, T, device=dev) * 3 for _ in range(3))
        self.T, self.tol = T, _TOL[dt]

    def fn(self) -> None:
        from rocm_mla.ops import merge_attn_states

        merge_attn_states(self.out, self.po, self.pl, self.so, self.sl, self.ol)

    def check(self) -> str:
        from rocm_mla.reference import merge_attn_states_ref

        self.fn()
        r = min(self.T, 256)
        ro, rl = merge_attn_states_ref(self.po[:r], self.pl[:, :r], self.so[:r], self.sl[:, :r])
        return rel_err("output", self.out[:r], ro, self.tol) or rel_err("output_lse", self.ol[:, :r], rl, 1e-4)


class RopeCase(Case):
    """fused_rope_mla_kv_write on DeepSeek's layout (perf/bench_rope_kv_write.py): q_pe = q[..., 128:] of
    [T, N, 192], k_pe = kv_a[:, 512:] of [T, 576], cos_sin_cache in the model dtype, random
    positions, shuffled slots, cache [blocks, block, 576] (fp8: uint8 storage, k_scale 0.05)."""

    def __init__(self, s: Shape, dev: torch.device):
        from rocm_mla import _platform
        from rocm_mla.reference.rope_kv_write import rope_cos_sin_cache

        self.s, self.dev = s, dev
        T, N, block = s["T"], s["N"], s["block"]
        dt = shape_dtype(s, dev)
        if s["kv"] not in ("auto", "fp8"):
            raise ValueError(f"{s.key}: kv must be auto or fp8")
        self.fp8 = C.platform_fp8_dtype(_platform.device_arch(dev)) if s["kv"] == "fp8" else None
        max_pos = MAX_POS if dev.type == "cuda" else 4096
        self.cos_sin = rope_cos_sin_cache(max_pos, dtype=dt, device=dev)
        self.q = torch.randn(T, N, 192, device=dev, dtype=dt)
        self.kv_a = torch.randn(T, 576, device=dev, dtype=dt)
        self.kv_c = torch.randn(T, 512, device=dev, dtype=dt)
        self.pos = torch.randint(0, max_pos, (T,), device=dev)
        nblk = (T * 5 // 4 + block - 1) // block + 1
        self.slots = torch.randperm(nblk * block, device=dev)[:T]
        self.cache = torch.zeros(nblk, block, 576, device=dev, dtype=dt)
        if self.fp8 is not None:
            self.cache = self.cache.to(self.fp8)
        self.k_scale = torch.tensor([0.05], device=dev)
        self.q_w, self.kv_w = self.q.clone(), self.kv_a.clone()  # the timed calls rotate these over and over
        self.T, self.block, self.tol = T, block, _TOL[dt]

    def _run(self, q, kv_a, cache) -> None:
        from rocm_mla.ops import fused_rope_mla_kv_write

        fused_rope_mla_kv_write(
            self.pos,
            q[..., 128:],
            kv_a[:, 512:].unsqueeze(1),
            self.kv_c,
            self.cos_sin,
            cache.view(torch.uint8) if self.fp8 is not None else cache,
            self.slots,
            is_neox=False,
            kv_cache_dtype="fp8" if self.fp8 is not None else "auto",
            k_scale=self.k_scale,
        )

    def fn(self) -> None:
        self._run(self.q_w, self.kv_w, self.cache)

    def check(self) -> str:
        from rocm_mla.reference.rope_kv_write import fused_rope_mla_kv_write_ref, quantize_fp8_ref

        qc, kc, cc = self.q.clone(), self.kv_a.clone(), self.cache.clone()
        self._run(qc, kc, cc)
        r = min(self.T, 256)
        q_ref, k_ref, rows = fused_rope_mla_kv_write_ref(
            self.pos[:r], self.q[:r, :, 128:], self.kv_a[:r, 512:], self.kv_c[:r], self.cos_sin, is_neox=False
        )
        sl = self.slots[:r]
        got = cc.view(torch.uint8)[sl // self.block, sl % self.block]
        if self.fp8 is not None:
            got = got.view(self.fp8).float() * self.k_scale
            want, tol = quantize_fp8_ref(rows, self.k_scale, self.fp8).float() * self.k_scale, 0.13
        else:
            got, want, tol = got.view(self.cache.dtype), rows, self.tol
        return (
            rel_err("q_pe", qc[:r, :, 128:], q_ref, self.tol)
            or rel_err("k_pe", kc[:r, 512:], k_ref, self.tol)
            or rel_err("cache rows", got, want, tol)
        )


CASES = {"decode": DecodeCase, "prefill": PrefillCase, "merge": MergeCase, "rope_kv_write": RopeCase}


def small_decode(dev, arch, dt, fp8: bool, n: int, splits) -> str:
    """One small paged decode (3 requests, uneven lengths, block 64, q_len 1) against the reference."""
    from rocm_mla.ops import mla_decode
    from rocm_mla.reference import mla_decode_ref

    g = torch.Generator().manual_seed(7)
    lens, block = [150, 7, 64], 64
    nblk = [-(-L // block) for L in lens]
    pages = sum(nblk) + 1
    kv = torch.randn(pages, block, 576, generator=g)
    bt = torch.zeros(len(lens), max(nblk), dtype=torch.int32)
    perm = torch.randperm(pages, generator=g)
    k = 0
    for b, nb in enumerate(nblk):
        bt[b, :nb] = perm[k : k + nb].int()
        k += nb
    ks = None
    if fp8:
        kv = (kv / 0.05).clamp(-200, 200).to(C.platform_fp8_dtype(arch))
        ks = torch.tensor([0.05], device=dev)
    else:
        kv = kv.to(dt)
    kv, bt = kv.to(dev), bt.to(dev)
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    qn = torch.randn(len(lens), n, 512, generator=g).to(dt).to(dev)
    qp = torch.randn(len(lens), n, 64, generator=g).to(dt).to(dev)
    out, lse = mla_decode(
        qn,
        qp,
        kv.view(torch.uint8) if fp8 else kv,
        bt,
        sl,
        sm_scale=SCALE_DECODE,
        kv_cache_dtype="fp8" if fp8 else "auto",
        k_scale=ks,
        num_kv_splits=splits,
    )
    ro, rl = mla_decode_ref(qn, qp, kv, bt, sl, SCALE_DECODE, ks)
    return rel_err("out", out, ro, _TOL[dt]) or rel_err("lse", lse, rl, 1e-3)


def small_prefill(dev, dt, causal: bool) -> str:
    from rocm_mla.ops import mla_prefill
    from rocm_mla.reference import mla_prefill_ref

    g = torch.Generator().manual_seed(7)
    lq, lk, N = [37, 0, 20, 5], [37, 6, 45, 5], 4
    cu = lambda ls: torch.tensor([sum(ls[:i]) for i in range(len(ls) + 1)], dtype=torch.int32, device=dev)  # noqa: E731
    q = torch.randn(sum(lq), N, 192, generator=g).to(dt).to(dev)
    kv = torch.randn(sum(lk), N, 256, generator=g).to(dt).to(dev)
    kpe = torch.randn(sum(lk), 576, generator=g).to(dt).to(dev)[:, 512:].unsqueeze(1)
    args = (q, kv[..., :128], kpe, kv[..., 128:], cu(lq), cu(lk))
    out, lse = mla_prefill(*args, sm_scale=192**-0.5, causal=causal)
    ro, rl = mla_prefill_ref(*args, 192**-0.5, causal)
    return rel_err("out", out, ro, _TOL[dt]) or rel_err("lse", lse, rl, 1e-3)


def small_merge(dev, dt, d: int, backend: str | None) -> str:
    from rocm_mla.ops import merge_attn_states
    from rocm_mla.reference import merge_attn_states_ref

    g = torch.Generator().manual_seed(7)
    T, N = 37, 8
    po, so = (torch.randn(T, N, d + 64, generator=g).to(dt).to(dev)[..., :d] for _ in range(2))
    pl, sl = (torch.randn(N, T, generator=g).mul(3).to(dev) for _ in range(2))
    out = torch.empty(T, N, d, dtype=dt, device=dev)
    ol = torch.empty(N, T, device=dev)
    merge_attn_states(out, po, pl, so, sl, ol, backend=backend)
    ro, rl = merge_attn_states_ref(po, pl, so, sl)
    return rel_err("output", out, ro, _TOL[dt]) or rel_err("output_lse", ol, rl, 1e-4)


def small_rope(dev, arch, dt, n: int, fp8: bool, neox: bool, backend: str | None) -> str:
    from rocm_mla.ops import fused_rope_mla_kv_write
    from rocm_mla.reference.rope_kv_write import fused_rope_mla_kv_write_ref, quantize_fp8_ref, rope_cos_sin_cache

    g = torch.Generator().manual_seed(7)
    T, block, max_pos = 37, 16, 4096
    q = torch.randn(T, n, 192, generator=g).to(dt).to(dev)
    kv_a = torch.randn(T, 576, generator=g).to(dt).to(dev)
    kv_c = torch.randn(T, 512, generator=g).to(dt).to(dev)
    pos = torch.randint(0, max_pos, (T,), generator=g).to(dev)
    cs = rope_cos_sin_cache(max_pos, device=dev)
    nblk = T // block + 2
    slots = torch.randperm(nblk * block, generator=g)[:T].to(dev)
    f8 = C.platform_fp8_dtype(arch) if fp8 else None
    cache = torch.zeros(nblk, block, 576, dtype=dt, device=dev)
    if f8 is not None:
        cache = cache.to(f8)
    ks = torch.tensor([0.5], device=dev)
    q_ref, k_ref, rows = fused_rope_mla_kv_write_ref(pos, q[..., 128:], kv_a[:, 512:], kv_c, cs, is_neox=neox)
    fused_rope_mla_kv_write(
        pos,
        q[..., 128:],
        kv_a[:, 512:].unsqueeze(1),
        kv_c,
        cs,
        cache.view(torch.uint8) if fp8 else cache,
        slots,
        is_neox=neox,
        kv_cache_dtype="fp8" if fp8 else "auto",
        k_scale=ks,
        backend=backend,
    )
    got = cache.view(torch.uint8)[slots // block, slots % block]
    if f8 is not None:
        got, want, tol = got.view(f8).float() * ks, quantize_fp8_ref(rows, ks, f8).float() * ks, 0.07
    else:
        got, want, tol = got.view(dt), rows, _TOL[dt]
    return (
        rel_err("q_pe", q[..., 128:], q_ref, _TOL[dt])
        or rel_err("k_pe", kv_a[:, 512:], k_ref, _TOL[dt])
        or rel_err("cache rows", got, want, tol)
    )
