"""Small random checks of every op and backend against the float32 reference (used by doctor).

Each check draws fresh random inputs (never zeros), poisons the outputs with NaN and compares
every element with the reference. One row per (op, backend, dtype, case).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclass
class CheckRow:
    op: str
    backend: str
    dtype: str
    case: str
    max_err: float
    tol: float
    ok: bool
    error: str = ""


def _dtypes(device: torch.device) -> list[torch.dtype]:
    # The Triton CPU interpreter computes bf16 wrongly (upstream triton issue 11584).
    return [torch.float32, torch.float16] + ([torch.bfloat16] if device.type == "cuda" else [])


def _compare(op, backend, dtype, case, got, ref, tol) -> CheckRow:
    got = got.float()
    if torch.isnan(got).any():
        return CheckRow(
            op,
            backend,
            str(dtype).replace("torch.", ""),
            case,
            float("nan"),
            tol,
            False,
            "NaN in output (element not written?)",
        )
    err = ((got - ref).abs() / (1.0 + ref.abs())).max().item() if ref.numel() else 0.0
    return CheckRow(op, backend, str(dtype).replace("torch.", ""), case, err, tol, err <= tol)


def _failed(op, backend, dtype, case, exc: Exception) -> CheckRow:
    """The row of a check that raised (reported; the other checks still run)."""
    return CheckRow(op, backend, str(dtype), case, float("nan"), 0.0, False, f"{type(exc).__name__}: {exc}")


def check_merge(device: torch.device, backends: list[str]) -> list[CheckRow]:
    from rocm_mla.ops import merge_attn_states
    from rocm_mla.reference import merge_attn_states_ref

    rows = []
    for backend in backends:
        for dtype in _dtypes(device):
            T, N, D = 37, 16, 128
            case = f"T={T} N={N} D={D} pad_v"
            try:
                base = lambda: torch.randn(T, N, 192, device=device).to(dtype)[..., :D]  # noqa: E731
                po, so = base(), base()
                pl = torch.randn(T, N, device=device).t() * 3  # [N, T] transposed view
                sl = torch.randn(N, T, device=device) * 3
                out = torch.full((T, N, 192), float("nan"), dtype=dtype, device=device)[..., :D]
                ol = torch.full((N, T), float("nan"), device=device)
                merge_attn_states(out, po, pl, so, sl, ol, backend=backend)
                ref, ref_lse = merge_attn_states_ref(po, pl, so, sl)
                r = _compare("merge_attn_states", backend, dtype, case, out, ref, TOL[dtype])
                rl = _compare("merge_attn_states", backend, dtype, case + " lse", ol, ref_lse, 1e-5)
                rows += [r, rl]
            except Exception as exc:  # report, keep checking the rest
                rows.append(_failed("merge_attn_states", backend, dtype, case, exc))
    return rows


def check_prefill(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """mla_prefill on a small varlen batch (uneven lengths, lq != lk, an empty sequence), k_nope/v
    as views of one [Tk, N, 256] buffer, k_pe a slice of a [Tk, 576] buffer, out written into a
    NaN-poisoned [T, N*128 + pad] buffer and lse into a [T, N] buffer's transpose."""
    from rocm_mla.ops import mla_prefill
    from rocm_mla.reference import mla_prefill_ref

    rows = []
    lq, lk, N = [37, 0, 20, 5], [37, 6, 45, 5], 16

    def cu(ls):
        return torch.tensor([sum(ls[:i]) for i in range(len(ls) + 1)], dtype=torch.int32, device=device)

    Tq, Tk = sum(lq), sum(lk)
    for backend in backends:
        if backend == "hip":
            continue  # mla_prefill has no HIP kernel
        for dtype in _dtypes(device):
            case = f"B={len(lq)} N={N} causal strided"
            try:
                q = torch.randn(Tq, N, 192, device=device).to(dtype)
                kv = torch.randn(Tk, N, 256, device=device).to(dtype)
                k_pe = torch.randn(Tk, 576, device=device).to(dtype)[:, 512:].unsqueeze(1)
                out = torch.full((Tq, N * 128 + 8), float("nan"), dtype=dtype, device=device)[:, : N * 128]
                out = out.view(Tq, N, 128)
                lse = torch.full((Tq, N), float("nan"), device=device).t()
                args = (q, kv[..., :128], k_pe, kv[..., 128:], cu(lq), cu(lk))
                mla_prefill(*args, sm_scale=192**-0.5, out=out, lse=lse, backend=backend)
                ref, ref_lse = mla_prefill_ref(*args, 192**-0.5, True)
                rows.append(_compare("mla_prefill", backend, dtype, case, out, ref, TOL[dtype]))
                rows.append(_compare("mla_prefill", backend, dtype, case + " lse", lse, ref_lse, 1e-4))
            except Exception as exc:  # report, keep checking the rest
                rows.append(_failed("mla_prefill", backend, dtype, case, exc))
    return rows


def check_decode(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """mla_decode on a small paged batch: 3 requests (37, 5, 70 keys) with q_len 2 (causal MTP
    rows), N=16, block 16, shuffled page ids, every cache slot past seq_lens NaN, q_nope/q_pe as
    slices of one [rows, N, 584] buffer, out/lse written into NaN-poisoned buffers; once with the
    heuristic's split count and once with 3 splits (stage 2). Then with the platform's fp8 cache,
    and with quantize_q (q rounded to e4m3) against the reference of the rounded q."""
    from rocm_mla._platform import device_arch
    from rocm_mla.configs import platform_fp8_dtype
    from rocm_mla.ops import mla_decode
    from rocm_mla.reference import mla_decode_ref
    from rocm_mla.reference.decode import quantize_q_fp8

    rows = []
    lens, N, q_len, bs = [37, 5, 70], 16, 2, 16
    B = len(lens)
    nblk = [-(-L // bs) for L in lens]
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(sum(nblk) + 1, generator=g)  # the last page stays NaN
    kv32 = torch.full((sum(nblk) + 1, bs, 576), float("nan"))
    bt = torch.full((B, max(nblk) + 1), int(perm[-1]), dtype=torch.int32)
    k = 0
    for b, L in enumerate(lens):
        pages = perm[k : k + nblk[b]]
        k += nblk[b]
        bt[b, : nblk[b]] = pages.int()
        tok = torch.arange(L)
        kv32[pages[tok // bs], tok % bs] = torch.randn(L, 576, generator=g)
    table, seq_lens = bt.to(device), torch.tensor(lens, dtype=torch.int32, device=device)
    # The platform's fp8 kind (k_scale 0.5) for the fp8-cache cases; the cache is made inside each
    # case's try, so a torch without that kind reports failed rows instead of ending the check.
    fp8 = platform_fp8_dtype(device_arch(device))
    for backend in backends:
        if backend == "hip":
            continue  # mla_decode has no HIP kernel
        for dtype in _dtypes(device):
            for splits in (None, 3):
                case = f"B={B} N={N} q_len={q_len} block={bs} splits={splits or 'auto'}"
                try:
                    kv = kv32.to(dtype).to(device)
                    q = torch.randn(B * q_len, N, 584, device=device).to(dtype)
                    out = torch.full((B * q_len, N, 520), float("nan"), dtype=dtype, device=device)[..., :512]
                    lse = torch.full((N, B * q_len), float("nan"), device=device).t()
                    args = (q[..., :512], q[..., 512:576], kv, table, seq_lens)
                    mla_decode(*args, sm_scale=192**-0.5, out=out, lse=lse, num_kv_splits=splits, backend=backend)
                    ref, ref_lse = mla_decode_ref(*args, 192**-0.5)
                    rows.append(_compare("mla_decode", backend, dtype, case, out, ref, TOL[dtype]))
                    rows.append(_compare("mla_decode", backend, dtype, case + " lse", lse, ref_lse, 1e-4))
                except Exception as exc:  # report, keep checking the rest
                    rows.append(_failed("mla_decode", backend, dtype, case, exc))
            # The fp8 cache as stored; then quantize_q (16-bit q), whose spec is the reference fed
            # quantize_q_fp8's q.
            for quantize in (False, True) if dtype != torch.float32 else (False,):
                case = f"B={B} N={N} q_len={q_len} block={bs} splits=3 fp8 cache" + (" quantize_q" if quantize else "")
                try:
                    kv8 = (kv32 / 0.5).to(fp8).to(device)
                    q = torch.randn(B * q_len, N, 584, device=device).to(dtype)
                    out = torch.full((B * q_len, N, 512), float("nan"), dtype=dtype, device=device)
                    args = (q[..., :512], q[..., 512:576], kv8, table, seq_lens)
                    _, lse = mla_decode(
                        *args,
                        sm_scale=192**-0.5,
                        out=out,
                        k_scale=0.5,
                        num_kv_splits=3,
                        backend=backend,
                        quantize_q=quantize,
                    )
                    qn, qp = quantize_q_fp8(args[0], args[1], fp8) if quantize else args[:2]
                    ref, ref_lse = mla_decode_ref(qn, qp, *args[2:], 192**-0.5, 0.5)
                    rows.append(_compare("mla_decode", backend, dtype, case, out, ref, TOL[dtype]))
                    rows.append(_compare("mla_decode", backend, dtype, case + " lse", lse, ref_lse, 1e-3))
                except Exception as exc:
                    rows.append(_failed("mla_decode", backend, dtype, case, exc))
    return rows


def check_rope_kv_write(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """fused_rope_mla_kv_write on DeepSeek's layout: q_pe a [T, N, 192][..., 128:] slice, k_pe a
    [T, 576][:, 512:] slice, GPT-J style, block 16, shuffled slots with one -1, a NaN-poisoned
    cache; q_pe, k_pe and the written rows against the reference, plus "untouched": the rows
    without a slot still NaN. Then an FP8 cache (the platform's E4M3 kind, k_scale 0.5) in the
    q dtype's place, dequantised (tolerance: half an FP8 step, 2^-4 relative)."""
    from rocm_mla._platform import device_arch
    from rocm_mla.configs import platform_fp8_dtype
    from rocm_mla.ops import fused_rope_mla_kv_write
    from rocm_mla.reference.rope_kv_write import fused_rope_mla_kv_write_ref, rope_cos_sin_cache

    rows = []
    T, N, bs, max_pos = 37, 16, 16, 4096
    fp8 = platform_fp8_dtype(device_arch(device))  # what kv_cache_dtype="fp8" means here
    cos_sin = rope_cos_sin_cache(max_pos, device=device)  # float32: every backend and dtype reads it
    for backend in backends:
        for dtype in _dtypes(device):
            for cache_kind in ("auto", "fp8"):
                case = f"T={T} N={N} block={bs} gptj strided cache={cache_kind}"
                try:
                    g = torch.Generator().manual_seed(0)
                    q = torch.randn(T, N, 192, generator=g).to(dtype).to(device)
                    kv_a = torch.randn(T, 576, generator=g).to(dtype).to(device)
                    kv_c = torch.randn(T, 512, generator=g).to(dtype).to(device)
                    pos = torch.randint(0, max_pos, (T,), generator=g).to(device)
                    nblk = T // bs + 2
                    slots = torch.randperm(nblk * bs, generator=g)[:T].to(device)
                    slots[3] = -1
                    cdt = fp8 if cache_kind == "fp8" else dtype
                    cache = torch.full((nblk, bs, 576), float("nan")).to(cdt).to(device)
                    k_scale = torch.tensor([0.5], device=device)
                    q_ref, k_ref, row_ref = fused_rope_mla_kv_write_ref(
                        pos, q[..., 128:], kv_a[:, 512:], kv_c, cos_sin, is_neox=False
                    )
                    fused_rope_mla_kv_write(
                        pos,
                        q[..., 128:],
                        kv_a[:, 512:].unsqueeze(1),
                        kv_c,
                        cos_sin,
                        cache,
                        slots,
                        is_neox=False,
                        kv_cache_dtype=cache_kind,
                        k_scale=k_scale,
                        backend=backend,
                    )
                    valid = slots >= 0
                    # gather bytes, then convert: float8 indexing is missing from some torch builds
                    got = cache.view(torch.uint8)[slots[valid] // bs, slots[valid] % bs].view(cdt).float()
                    if cache_kind == "fp8":
                        got = got * k_scale
                    tol = 0.07 if cache_kind == "fp8" else TOL[dtype]
                    rows.append(
                        _compare("fused_rope_mla_kv_write", backend, dtype, case + " rows", got, row_ref[valid], tol)
                    )
                    if cache_kind == "auto":
                        rows.append(
                            _compare(
                                "fused_rope_mla_kv_write",
                                backend,
                                dtype,
                                case + " q_pe",
                                q[..., 128:],
                                q_ref,
                                TOL[dtype],
                            )
                        )
                        rows.append(
                            _compare(
                                "fused_rope_mla_kv_write",
                                backend,
                                dtype,
                                case + " k_pe",
                                kv_a[:, 512:],
                                k_ref,
                                TOL[dtype],
                            )
                        )
                    written = torch.zeros(nblk * bs, dtype=torch.bool, device=device)
                    written[slots[valid]] = True
                    rest = cache.view(torch.uint8).view(nblk * bs, -1)[~written].view(cdt).float()
                    ok = bool(torch.isnan(rest).all())
                    rows.append(
                        CheckRow(
                            "fused_rope_mla_kv_write",
                            backend,
                            str(dtype).replace("torch.", ""),
                            case + " untouched",
                            0.0 if ok else float("nan"),
                            0.0,
                            ok,
                            "" if ok else "wrote a cache row it had no slot for",
                        )
                    )
                except Exception as exc:  # report, keep checking the rest
                    rows.append(_failed("fused_rope_mla_kv_write", backend, dtype, case, exc))
    return rows


def check_context_gather(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """gather_context_chunk on one vLLM-shaped context chunk: 3 requests (a continued one starting
    at position 17, a 1-token context, one not a multiple of the block), block 16, shuffled page
    ids, every cache slot outside the requests' contexts NaN, dst rows of a NaN-poisoned wider
    buffer; the cache in the dtype, then an fp8 cache (the platform's kind, k_scale 0.25). A gather
    is exact: tolerance 0."""
    from rocm_mla._platform import device_arch
    from rocm_mla.configs import platform_fp8_dtype
    from rocm_mla.ops import gather_context_chunk
    from rocm_mla.reference import context_gather_ref

    rows = []
    ctx, starts, lens, bs = [50, 1, 23], [17, 0, 0], [33, 1, 23], 16
    nblk = [-(-c // bs) for c in ctx]
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(sum(nblk) + 1, generator=g)  # the last page stays NaN
    kv32 = torch.full((sum(nblk) + 1, bs, 576), float("nan"))
    bt = torch.full((len(ctx), max(nblk) + 1), int(perm[-1]), dtype=torch.int32)
    k = 0
    for b, c in enumerate(ctx):
        bt[b, : nblk[b]] = perm[k : k + nblk[b]].int()
        k += nblk[b]
        tok = torch.arange(c)
        kv32[bt[b, tok // bs].long(), tok % bs] = torch.randn(c, 576, generator=g)
    T = sum(lens)
    idx = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    cu, st = idx([sum(lens[:i]) for i in range(len(lens) + 1)]), idx(starts)
    t2s = idx([i for i, n in enumerate(lens) for _ in range(n)])
    fp8 = platform_fp8_dtype(device_arch(device))
    for backend in backends:
        if backend == "hip":
            continue  # context_gather has no HIP kernel
        for dtype in _dtypes(device):
            for cache_kind in ("auto", "fp8"):
                case = f"R={len(ctx)} T={T} block={bs} shuffled cache={cache_kind}"
                try:
                    cache = kv32.to(fp8 if cache_kind == "fp8" else dtype).to(device)
                    k_scale = torch.tensor([0.25], device=device) if cache_kind == "fp8" else None
                    dst = torch.full((T, 584), float("nan"), dtype=dtype, device=device)[:, :576]
                    gather_context_chunk(cache, bt.to(device), cu, st, t2s, dst, k_scale=k_scale, backend=backend)
                    ref = context_gather_ref(cache, bt.to(device), cu, st, t2s, T, k_scale).to(dtype)
                    rows.append(_compare("gather_context_chunk", backend, dtype, case, dst, ref.float(), 0.0))
                except Exception as exc:  # report, keep checking the rest
                    rows.append(_failed("gather_context_chunk", backend, dtype, case, exc))
    return rows


CHECKS = [check_merge, check_prefill, check_decode, check_rope_kv_write, check_context_gather]


def run_all(device: torch.device) -> list[CheckRow]:
    """Every op's self-check on ``device`` with each backend that can run there."""
    from rocm_mla.ops._dispatch import BACKENDS, unavailable

    # The reference is the yardstick, not a contestant.
    backends = [b for b in BACKENDS if b != "reference" and unavailable(b, device) is None]
    rows: list[CheckRow] = []
    for check in CHECKS:
        rows += check(device, backends)
    return rows
