"""Small random checks of every op and backend against the float32 reference (used by doctor).

Each check builds its inputs with rocm_mla.cases (fresh random values, never zeros; shuffled pages
and NaN in every slot no request covers; strided views; NaN-poisoned outputs), runs the op and
compares every element with the reference under the op's tolerance (rocm_mla.cases). One row per
(op, backend, dtype, case, output); a check that raises gives a failed row and the rest still run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rocm_mla.cases import Comparison
from rocm_mla.cases import context_gather as cg_cases
from rocm_mla.cases import decode as decode_cases
from rocm_mla.cases import indexer_cache as ic_cases
from rocm_mla.cases import indexer_topk as topk_cases
from rocm_mla.cases import merge as merge_cases
from rocm_mla.cases import prefill as prefill_cases
from rocm_mla.cases import rope_kv_write as rope_cases
from rocm_mla.cases import sparse as sparse_cases
from rocm_mla.cases import v4_attention as v4_cases
from rocm_mla.ops.decode_plan import FP8_DOTS


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


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _rows(op, backend, dtype, case, comparisons: list[Comparison], tolerance: dict, names: dict) -> list[CheckRow]:
    """One row per comparison: ``names`` maps a comparison's name to (case suffix, bound key)."""
    rows = []
    for c in comparisons:
        suffix, key = names[c.name]
        bound = tolerance[key]
        rows.append(CheckRow(op, backend, _dt(dtype), case + suffix, c.max_err, bound.atol, c.ok, c.problem))
    return rows


def _failed(op, backend, dtype, case, exc: Exception) -> CheckRow:
    """The row of a check that raised (reported; the other checks still run)."""
    return CheckRow(op, backend, _dt(dtype), case, float("nan"), 0.0, False, f"{type(exc).__name__}: {exc}")


def check_merge(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """merge_attn_states on pad_v rows ([T, N, 192][..., :128]), lse [N, T] transposed views."""
    op, rows = "merge_attn_states", []
    (shape,) = merge_cases.SHAPES["selfcheck"]
    case = f"T={shape.T} N={shape.N} D={shape.D} pad_v"
    names = {"output": ("", "output"), "output_lse": (" lse", "output_lse")}
    for backend in backends:
        for dtype in _dtypes(device):
            try:
                inp = merge_cases.make_inputs(shape, dtype=dtype, device=device)
                inp.run(backend=backend)
                tol = merge_cases.TOLERANCE[dtype]
                rows += _rows(op, backend, dtype, case, inp.compare(), tol, names)
            except Exception as exc:  # report, keep checking the rest
                rows.append(_failed(op, backend, dtype, case, exc))
    return rows


def check_prefill(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """mla_prefill on a small varlen batch (uneven lengths, lq != lk, an empty sequence), k_nope/v
    as views of one [Tk, N, 256] buffer, k_pe a slice of a [Tk, 576] buffer, out written into a
    NaN-poisoned pad_v buffer and lse into a [T, N] buffer's transpose."""
    op, rows = "mla_prefill", []
    (shape,) = prefill_cases.SHAPES["selfcheck"]
    case = f"B={len(shape.lq)} N={shape.N} causal strided"
    names = {"out": ("", "out"), "lse": (" lse", "lse")}
    for backend in backends:
        if backend == "hip":
            continue  # mla_prefill has no HIP kernel
        for dtype in _dtypes(device):
            try:
                inp = prefill_cases.make_inputs(
                    shape, dtype=dtype, device=device, out_layout="pad_v", lse_layout="transposed"
                )
                inp.run(backend=backend, max_seqlen_q=None, max_seqlen_k=None)
                tol = prefill_cases.TOLERANCE[dtype]
                rows += _rows(op, backend, dtype, case, inp.compare(), tol, names)
            except Exception as exc:  # report, keep checking the rest
                rows.append(_failed(op, backend, dtype, case, exc))
    return rows


def check_decode(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """mla_decode on a small paged batch: 3 requests (37, 5, 70 keys) with q_len 2 (causal MTP
    rows), N=16, block 16, shuffled page ids, every cache slot past seq_lens NaN, q_nope/q_pe as
    slices of one [rows, N, 584] buffer, out/lse written into NaN-poisoned buffers; once with the
    heuristic's split count and once with 3 splits (stage 2). Then with the platform's fp8 cache
    (k_scale 0.5) in each fp8_dots mode: "none" against the float32 reference, "qk" and "all" (q,
    and p, rounded to e4m3) against the reference of the rounded values."""
    op, rows = "mla_decode", []
    (shape,) = decode_cases.SHAPES["selfcheck"]
    head = f"B={shape.B} N={shape.N} q_len={shape.q_len} block={shape.block}"
    names = {"out": ("", "out"), "lse": (" lse", "lse")}
    for backend in backends:
        if backend == "hip":
            continue  # mla_decode has no HIP kernel
        for dtype in _dtypes(device):
            tol = decode_cases.TOLERANCE[dtype]
            for splits in (None, 3):
                case = f"{head} splits={splits or 'auto'}"
                try:
                    inp = decode_cases.make_inputs(
                        shape,
                        dtype=dtype,
                        device=device,
                        q_layout="one_buffer",
                        out_layout="padded",
                        lse_layout="transposed",
                    )
                    inp.run(num_splits=splits, backend=backend)
                    rows += _rows(op, backend, dtype, case, inp.compare(), tol, names)
                except Exception as exc:  # report, keep checking the rest
                    rows.append(_failed(op, backend, dtype, case, exc))
            # The fp8 cache as stored, in each fp8_dots mode (16-bit q), whose spec is the reference
            # of the values the mode rounds. The cache is made inside each case's try: a torch
            # without the platform's kind reports failed rows instead of ending the check.
            for dots in FP8_DOTS if dtype != torch.float32 else ("none",):
                case = f"{head} splits=3 fp8 cache" + (f" fp8_dots={dots}" if dots != "none" else "")
                try:
                    fp8_shape = decode_cases.DecodeShape(
                        N=shape.N, q_len=shape.q_len, block=shape.block, lens=shape.lens, kv="fp8"
                    )
                    inp = decode_cases.make_inputs(
                        fp8_shape, dtype=dtype, device=device, k_scale=0.5, q_layout="one_buffer"
                    )
                    _, lse = inp.run(lse=None, num_splits=3, backend=backend, fp8_dots=dots)
                    qtol = decode_cases.fp8_dots_bound(dots, dtype, device) if dots != "none" else None
                    comps = inp.compare(inp.out, lse, fp8_dots=dots, tol=qtol)
                    rows += _rows(op, backend, dtype, case, comps, qtol or tol, names)
                except Exception as exc:
                    rows.append(_failed(op, backend, dtype, case, exc))
    return rows


def check_rope_kv_write(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """fused_rope_mla_kv_write on DeepSeek's layout: q_pe a [T, N, 192][..., 128:] slice, k_pe a
    [T, 576][:, 512:] slice, GPT-J style, block 16, shuffled slots with one -1, a NaN-poisoned
    cache; q_pe, k_pe and the written rows against the reference, plus "untouched": every other
    cache row, q outside q_pe and kv_a outside k_pe bitwise unchanged. Then an FP8 cache (the
    platform's E4M3 kind, k_scale 0.5): the stored codes within one step of the reference's."""
    op, rows = "fused_rope_mla_kv_write", []
    names = {
        "cache rows": (" rows", "rows"),
        "cache rows (fp8 codes)": (" rows", "rows_fp8"),
        "q_pe": (" q_pe", "q_pe"),
        "k_pe": (" k_pe", "k_pe"),
    }
    for backend in backends:
        for dtype in _dtypes(device):
            for shape in rope_cases.SHAPES["selfcheck"]:
                case = f"T={shape.T} N={shape.N} block={shape.block} gptj strided cache={shape.kv}"
                try:
                    inp = rope_cases.make_inputs(
                        shape, dtype=dtype, device=device, max_pos=4096, k_scale=0.5, skip=(3,)
                    )
                    inp.run(backend=backend)
                    comps = inp.compare()
                    if shape.fp8:  # q_pe / k_pe: the 16-bit rows cover them
                        comps = [c for c in comps if c.name not in ("q_pe", "k_pe")]
                    tol = rope_cases.TOLERANCE[dtype]
                    comps = [comps[-1], *comps[:-1]]  # rows first
                    rows += _rows(op, backend, dtype, case, comps, tol, names)
                    bad = inp.untouched()
                    rows.append(
                        CheckRow(
                            op,
                            backend,
                            _dt(dtype),
                            case + " untouched",
                            0.0 if not bad else float("nan"),
                            0.0,
                            not bad,
                            bad,
                        )
                    )
                except Exception as exc:  # report, keep checking the rest
                    rows.append(_failed(op, backend, dtype, case, exc))
    return rows


def check_context_gather(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """gather_context_chunk on one vLLM-shaped context chunk: 3 requests (a continued one starting
    at position 17, a 1-token context, one not a multiple of the block), block 16, shuffled page
    ids, every cache slot outside the requests' contexts NaN, dst rows of a NaN-poisoned wider
    buffer; the cache in the dtype, then an fp8 cache (the platform's kind, k_scale 0.25), as a
    float8 tensor and as vLLM allocates it (uint8 storage, kv_cache_dtype "fp8"). A gather is
    exact: tolerance 0."""
    op, rows = "gather_context_chunk", []
    (shape,) = cg_cases.SHAPES["selfcheck"]
    names = {"dst": ("", "dst")}
    for backend in backends:
        if backend == "hip":
            continue  # context_gather has no HIP kernel
        for dtype in _dtypes(device):
            for kv in ("auto", "fp8", "uint8"):
                case = f"R={len(shape.ctx)} T={shape.T} block={shape.block} shuffled cache={kv}"
                try:
                    s = cg_cases.ChunkShape(shape.ctx, shape.starts, shape.rows, shape.block, kv=kv)
                    inp = cg_cases.make_inputs(s, dtype=dtype, device=device)
                    inp.run(backend=backend)
                    rows += _rows(op, backend, dtype, case, inp.compare(), cg_cases.TOLERANCE[dtype], names)
                except Exception as exc:  # report, keep checking the rest
                    rows.append(_failed(op, backend, dtype, case, exc))
    return rows


def check_sparse(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """mla_sparse_attention on a small mixed batch: 3 requests (37, 90, 5 keys) with 2, 3 and 1 query
    rows (causal), N=16, K=48 entries per row (lists shorter than K padded with -1, 10% holes and
    repeated entries), block 16, shuffled page ids, every unused cache slot NaN, q_nope/q_pe slices
    of one buffer, out/lse into NaN-poisoned padded / transposed buffers; with the plan's split
    count, 3 splits, and batch-invariant splits; then an fp8 cache (the platform's kind, k_scale 0.5)
    and the lists as global slots."""
    op, rows = "mla_sparse_attention", []
    (shape,) = sparse_cases.SHAPES["selfcheck"]
    head = f"T={shape.T} N={shape.N} K={shape.K} block={shape.block}"
    names = {"out": ("", "out"), "lse": (" lse", "lse")}
    fp8 = sparse_cases.SparseShape(shape.lens, shape.rows, shape.N, shape.K, shape.block, kv="fp8")
    slots = sparse_cases.SparseShape(shape.lens, shape.rows, shape.N, shape.K, shape.block, mode="slots")
    runs = [(shape, {}, "splits=auto"), (shape, {"num_splits": 3}, "splits=3"),
            (shape, {"batch_invariant": True}, "batch_invariant"), (fp8, {"num_splits": 3}, "splits=3 fp8 cache"),
            (slots, {}, "slots")]  # fmt: skip
    for backend in backends:
        if backend == "hip":
            continue  # mla_sparse_attention has no HIP kernel
        for dtype in _dtypes(device):
            tol = sparse_cases.TOLERANCE[dtype]
            for s, kw, what in runs:
                case = f"{head} {what}"
                try:
                    inp = sparse_cases.make_inputs(
                        s, dtype=dtype, device=device, k_scale=0.5, holes=0.1, dups=0.1, q_layout="one_buffer",
                        out_layout="padded", lse_layout="transposed",
                    )  # fmt: skip
                    inp.run(backend=backend, **kw)
                    rows += _rows(op, backend, dtype, case, inp.compare(), tol, names)
                except Exception as exc:  # report, keep checking the rest
                    rows.append(_failed(op, backend, dtype, case, exc))
    return rows


def check_indexer_cache(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """indexer_k_cache_write on vLLM's layouts: 37 keys (a row of zeros, one below the 1e-4 floor,
    one large) from a column slice of a wider buffer, block 16 (shuffled values) and block 1
    (flat), UE8M0 and plain scales, every other block of a 0xFF-poisoned buffer, shuffled slots
    with a -1 and two past the cache; each fp8 kind (e4m3fn, e4m3fnuz). Values and scales equal
    the reference's bytes, and every other byte is unchanged: tolerance 0."""
    op, rows = "indexer_k_cache_write", []
    names = {"values": (" values", "values"), "scales": (" scales", "scales")}
    for backend in backends:
        if backend == "hip":
            continue  # indexer_k_cache_write has no HIP kernel
        for dtype in _dtypes(device):
            for shape in ic_cases.SHAPES["selfcheck"]:
                for kind in ("fp8_e4m3fn", "fp8_e4m3fnuz"):
                    s = dataclasses.replace(shape, kind=kind)
                    case = s.label + " strided"
                    try:
                        inp = ic_cases.make_inputs(s, dtype=dtype, device=device, block_pad=1)
                        inp.run(backend=backend)
                        comps = inp.compare()
                        rows += _rows(op, backend, dtype, case, comps[:2], ic_cases.TOLERANCE[dtype], names)
                        rows.append(CheckRow(op, backend, _dt(dtype), case + " untouched", comps[2].max_err, 0.0,
                                             comps[2].ok, comps[2].problem))  # fmt: skip
                    except Exception as exc:  # report, keep checking the rest
                        rows.append(_failed(op, backend, dtype, case, exc))
    return rows


def check_indexer_topk(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """mla_indexer_topk on a small mixed batch: 3 requests (37, 200, 5 keys) with 2, 3 and 1 rows
    (causal), 32 heads, topk 40 (rows of fewer keys padded with -1), block 16 in vLLM's ROCm layout,
    shuffled page ids, every byte no request covers 0xFF (a NaN scale), q a slice of a wider
    buffer; with the arch's splits, with 64-key splits (several per row, then the merge) and in the
    prefiltered form (one-warp programs, 64-key prefilter splits: bounds, floor, the kept keys'
    merge); then DeepSeek-V4.1's two-level indexer (a candidate source's lists of 6 blocks of 8,
    then a call masked by them). The answer must be a valid top-k of the float64 logits (tolerance:
    the float32 sums' rounding); the lists a valid top of the blocks, the newest in."""
    op, rows = "mla_indexer_topk", []
    (shape,) = topk_cases.SHAPES["selfcheck"]
    head = f"T={shape.T} H={shape.H} topk={shape.topk} block={shape.block}"
    small = {"split_keys": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "merge": {"chunk": 64, "num_warps": 4}}
    prefiltered = {**small, "split_keys": 1024, "num_warps": 1, "programs_per_cu": 64, "prefilter": {"split_keys": 64}}
    for backend in backends:
        if backend == "hip":
            continue  # mla_indexer_topk has no HIP kernel
        runs = [({}, "splits=auto")]
        if backend == "triton":
            runs += [({"config": small}, "splits of 64"), ({"config": prefiltered}, "prefiltered, splits of 64")]
        for kw, what in runs:
            case = f"{head} {what}"
            try:
                inp = topk_cases.make_inputs(shape, device=device)
                inp.run(backend=backend, **kw)
                problem = inp.mismatch()
                if kw.get("config") is prefiltered and not inp.plan(config=prefiltered).prefiltered:
                    problem = "the call did not take the prefiltered form"
                rows.append(CheckRow(op, backend, "fp8", case, 0.0, 0.0, not problem, problem))
            except Exception as exc:  # report, keep checking the rest
                rows.append(_failed(op, backend, torch.float32, case, exc))
        # DeepSeek-V4.1's two-level indexer: the source's lists (blocks of 8, 6 a row), a masked call.
        case = f"{head} two-level: blocks of 8, 6 listed"
        try:
            inp = topk_cases.make_inputs(shape, device=device)
            own, lists, masked = inp.run_two_level(8, 6, backend=backend)
            problem = inp.two_level_mismatch(own, lists, masked, 8)
            rows.append(CheckRow(op, backend, "fp8", case, 0.0, 0.0, not problem, problem))
        except Exception as exc:
            rows.append(_failed(op, backend, torch.float32, case, exc))
    return rows


def check_v4_attention(device: torch.device, backends: list[str]) -> list[CheckRow]:
    """mla_v4_attention on the cases' selfcheck shapes: a window layer (H=8, 3 requests, MTP rows),
    a CSA top-512 layer (H=64, holes in the lists), an HCA layer (H=128, 20000 tokens), a CSA layer
    with ragged lists and a large sink (H=16); fp8_ds_mla caches of vLLM's writers' kinds (the
    window cache's the platform's, the compressed one's e4m3fn), shuffled pages, every slot no list
    can name poisoned, the sink and the inverse RoPE, out/lse into NaN-poisoned buffers; with the
    plan's split count; then the ragged layer over 3 splits (the shared reduce's sink and rotation)
    and with batch-invariant splits, and the window layer over caches in q's dtype and 3 splits. The
    CPU interpreter runs float32 q alone (these rows take it seconds each)."""
    op, rows = "mla_v4_attention", []
    shapes = v4_cases.SHAPES["selfcheck"]
    window, _, _, ragged = shapes
    runs = [(s, {}, "splits=auto") for s in shapes]
    runs += [(ragged, {"num_splits": 3}, "splits=3"), (ragged, {"batch_invariant": True}, "batch_invariant"),
             (dataclasses.replace(window, kv="auto"), {"num_splits": 3}, "splits=3")]  # fmt: skip
    names = {"out": ("", "out"), "lse": (" lse", "lse")}
    dtypes = _dtypes(device) if device.type == "cuda" else [torch.float32]
    for backend in backends:
        if backend == "hip":
            continue  # mla_v4_attention has no HIP kernel
        for dtype in dtypes:
            tol = v4_cases.TOLERANCE[dtype]
            for s, kw, what in runs:
                case = f"{s.label(dtype)} {what}"
                try:
                    inp = v4_cases.make_inputs(s, dtype=dtype, device=device, q_layout="padded", out_layout="padded",
                                               lse_layout="transposed")  # fmt: skip
                    inp.run(backend=backend, **kw)
                    rows += _rows(op, backend, dtype, case, inp.compare(), tol, names)
                except Exception as exc:  # report, keep checking the rest
                    rows.append(_failed(op, backend, dtype, case, exc))
    return rows


CHECKS = [
    check_merge,
    check_prefill,
    check_decode,
    check_rope_kv_write,
    check_context_gather,
    check_sparse,
    check_indexer_cache,
    check_indexer_topk,
    check_v4_attention,
]


def run_all(device: torch.device, progress=None) -> list[CheckRow]:
    """Every op's self-check on ``device`` with each backend that can run there; ``progress(i, n,
    name)`` is called before each op's check (long on the CPU interpreter)."""
    from rocm_mla.ops._dispatch import BACKENDS, unavailable

    # The reference is the yardstick, not a contestant.
    backends = [b for b in BACKENDS if b != "reference" and unavailable(b, device) is None]
    rows: list[CheckRow] = []
    for i, check in enumerate(CHECKS):
        if progress is not None:
            progress(i, len(CHECKS), check.__name__.removeprefix("check_"))
        rows += check(device, backends)
    return rows
