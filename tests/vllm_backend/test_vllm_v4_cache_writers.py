"""DeepSeek-V4's KV caches as rocm_mla writes them are, byte for byte, the caches vLLM's own writers
write (vLLM 0.34 or 0.33).

The V4 layer tests (``vllm_harness.v4_step``, run by test_vllm_v4.py) fill the caches vLLM's V4
attention reads with rocm_mla's writers, not vLLM's; their answers stand for vLLM's only where the
bytes are vLLM's. Here vLLM's Triton writers and ours write the same rows into copies of one
poisoned buffer, and every byte of the two buffers must be equal (untouched slots and the pad at a
page's end included):

* fp8_ds_mla, the window cache and the compressed attention cache (uint8 pages of ``block_size x
  584`` bytes, padded to a multiple of 576 as vLLM allocates them): vLLM's
  ``quantize_and_insert_k_cache`` against ``rocm_mla.cases.v4_attention.fp8_ds_mla_write``, OCP
  e4m3fn, pages of 64 (the window) and 2 (HCA's compressed rows) and 16 tokens.
* The CSA indexer's compressed key cache (flat rows: 128 e4m3fn bytes a row, then a float32
  power-of-two scale a row after all rows of the page): vLLM's compressor launcher
  ``compress_norm_rope_store_triton`` (pool the state cache under its softmax gate, RMSNorm, GPT-J
  RoPE on the last 64 dims, bf16, UE8M0 quantisation, store) against ``indexer_k_cache_write`` given
  the bf16 rows the compressor quantises; then ``mla_indexer_topk`` over vLLM's own cache against
  the float64 logits.

vLLM's kernels run in a child process: on a machine without a GPU vLLM enables its Triton (not its
CPU placeholder) only when the platform's visible-devices variable is set and empty at its first
import (``vllm_harness.dcp.cpu_env``), and there they run in Triton's interpreter. The
interpreter's float32 -> e4m3 conversion is not a GPU's (triton 3.7.1: ties go away from zero, a
rounding carry into an odd exponent is lost, -126.74 becoming -64, and subnormal results are
truncated), so the child gives that one conversion torch's: round to nearest even, as the GPUs'
conversion instructions (vLLM clamps to +-448 first, so saturation never comes into it). The rest
of vLLM's kernels runs as written, and on a GPU nothing is replaced.

e4m3fnuz (vLLM's ``use_fnuz=True`` for gfx942's window cache) is not covered: the interpreter has
no ``tl.float8e4b8`` type (``fail to convert fp8e4b8 to ir type``) and NVIDIA's Triton has none
either, so vLLM's kernel runs only on a gfx94x GPU. For the same reason the top-k reads the
e4m3fn cache under an e4m3fn q (gfx950's and NVIDIA's kind), not gfx942's e4m3fnuz q.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from _util import DEVICE, HAS_GPU
from vllm_harness import require_vllm

require_vllm()

from vllm_harness.dcp import cpu_env  # noqa: E402
from vllm_harness.layer_step import use_simulated_gfx942_platform  # noqa: E402

use_simulated_gfx942_platform()

from rocm_mla.cases.v4_attention import fp8_ds_mla_poison, fp8_ds_mla_views, fp8_ds_mla_write  # noqa: E402
from rocm_mla.ops import indexer_k_cache_write, mla_indexer_topk, plan_indexer_topk_for  # noqa: E402
from rocm_mla.reference.indexer_topk import check_indexer_topk, mla_indexer_logits_ref  # noqa: E402

FN = torch.float8_e4m3fn
DS_ROW, DS_DATA, DS_SCALES = 584, 576, 8  # fp8_ds_mla token: 448 e4m3 bytes, 64 bf16, then 8 scale bytes
INDEX_DIM, INDEX_ROW = 128, 132  # an indexer key: 128 e4m3 bytes and a float32 scale
ALIGN = 576  # vLLM pads a page of either cache to a multiple of 576 bytes (fp8_ds_mla's alignment)
DS_BLOCKS = (64, 2, 16)  # window pages; HCA's compressed pages (256 tokens / 128); another size
INDEX_BLOCKS = {64: (70, 23), 16: (37, 20)}  # compressed rows a page (64: V4's): those of request 0, 1
RATIO, STATE_BLOCK, EPS = 4, 4, 1e-6  # CSA: 4 tokens a compressed row, vLLM's state pages of 4, V4's eps
TOPK, INDEX_HEADS = 24, 64


def _padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _pages(buf: torch.Tensor, block_size: int, row_bytes: int) -> torch.Tensor:
    """``[num_blocks, block_size, row_bytes]`` view of a padded page buffer ``[num_blocks, stride]``."""
    return buf.as_strided((buf.shape[0], block_size, row_bytes), (buf.shape[1], row_bytes, 1))


# ---------------------------------------------------------------- inputs (built alike in both processes)
def ds_mla_case(block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rows [40, 512] bf16, slots [40] int64, start [num_blocks, stride] uint8)``: fresh normal
    rows with magnitudes from 2^-24 (under the writer's 1e-4 amax floor) to 2^24, each 64-value block
    scaled by its own 2^-8..2^8, 1 in 20 values 2^-14 of the rest (e4m3 subnormals and zeros), one
    row of zeros; the slots a shuffle over several pages, one -1; the pages random bytes with every
    slot poisoned (NaN codes, 0xFF scales), the pads left random."""
    g = torch.Generator().manual_seed(100 + block_size)
    n = 40
    num_blocks = max(4, -(-2 * n // block_size) + 1)
    rows = torch.randn(n, 512, generator=g) * torch.exp2(torch.randint(-24, 25, (n, 1), generator=g).float())
    block = torch.exp2(torch.randint(-8, 9, (n, 8, 1), generator=g).float()).expand(n, 8, 64).reshape(n, 512)
    rows = rows * block
    rows = torch.where(torch.rand(n, 512, generator=g) < 0.05, rows * 2.0**-14, rows)
    rows[11] = 0.0
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    slots[7] = -1
    start = torch.randint(0, 256, (num_blocks, _padded(block_size * DS_ROW)), dtype=torch.uint8, generator=g)
    fp8_ds_mla_poison(_pages(start, block_size, DS_ROW), FN)
    return rows.to(torch.bfloat16), slots, start


def _four_squares(r: int) -> list[int] | None:
    """Four integers in [0, 255] whose squares sum to r, or None."""
    for a in range(min(255, math.isqrt(r)), -1, -1):
        for b in range(min(a, math.isqrt(r - a * a)), -1, -1):
            r2 = r - a * a - b * b
            for c in range(min(b, math.isqrt(r2)), -1, -1):
                d = math.isqrt(r2 - c * c)
                if d <= c and d * d == r2 - c * c:
                    return [a, b, c, d]
    return None


def _pooled_row(g: torch.Generator) -> torch.Tensor:
    """128 integers in [-255, 255] whose squares sum to 2^19 (a mean square of 64^2, a power of
    four, so RMSNorm's rsqrt is exact): normal values, 1 in 12 zero and 1 in 12 in [-2, 2], four of
    them completing the sum (``_four_squares``), in random order."""
    while True:
        z = torch.randn(124, generator=g)
        pick = torch.rand(124, generator=g)
        small = torch.where(pick < 1 / 12, 0.0, torch.randint(-2, 3, (124,), generator=g).float())
        fixed = pick < 2 / 12
        room = 2**19 - 40_000 - float((small * small)[fixed].sum())
        k = torch.where(fixed, small, (z * math.sqrt(room / float((z * z)[~fixed].sum()))).round())
        rest = 2**19 - int((k * k).sum())
        four = _four_squares(rest) if rest >= 0 and float(k.abs().max()) <= 255 else None
        if four is not None:
            signs = torch.randint(0, 2, (4,), generator=g).float() * 2 - 1
            row = torch.cat([k, torch.tensor(four, dtype=torch.float32) * signs])
            return row[torch.randperm(128, generator=g)]


def indexer_case(cblock: int) -> dict:
    """The inputs of vLLM's CSA compressor launch (``compress_norm_rope_store_triton``), built so that
    the bf16 row it quantises is known exactly on every platform:

    * pooling: per dim, the softmax gate scores one of the compressed row's 8 state entries (the
      previous 4 tokens' first half, its own 4 tokens' second half) O(1) and the others about
      -1e30, so it weighs that entry 1 and the rest 0: the pooled value is that entry's;
    * RMSNorm: pooled rows are integers x 2^-3..2^3 (``_pooled_row``: a mean square that is a power
      of four, at least 64, so the eps of 1e-6 is below half its ulp), so rsqrt is a power of two;
      the weights are powers of two (2^-6..2^3: e4m3 subnormals after the row's scale);
    * RoPE: each pair's angle a quarter turn (cos, sin in {-1, 0, 1}).

    Every float32 step is then exact (an approximate rsqrt or exp on a GPU, off by an ulp, rounds
    back to the same bf16), whatever rounding a platform uses for float32 -> bf16. One pooled row is
    zero. Tokens: every compressed row of two requests (positions 4i + 3), two positions that
    end no compressed row, and a repeat of a boundary token with the slot -1. Pages shuffled; the
    cache pages random bytes, padded to vLLM's stride."""
    g = torch.Generator().manual_seed(200 + cblock)
    counts = INDEX_BLOCKS[cblock]
    state_blocks = sum(counts) + 2
    state_ids = torch.randperm(state_blocks, generator=g).to(torch.int32)
    state_table = torch.zeros(len(counts), max(counts), dtype=torch.int32)
    pages = [-(-n // cblock) for n in counts]
    page_ids = torch.randperm(sum(pages) + 1, generator=g).to(torch.int32)
    table = torch.full((len(counts), max(pages)), int(page_ids[-1]), dtype=torch.int32)
    used_s = used_p = 0
    for r, n in enumerate(counts):
        state_table[r, :n] = state_ids[used_s : used_s + n]
        table[r, : pages[r]] = page_ids[used_p : used_p + pages[r]]
        used_s, used_p = used_s + n, used_p + pages[r]
    # state [blocks, 4 tokens, kv half 1 | kv half 2 | score half 1 | score half 2]
    state = torch.randn(state_blocks, STATE_BLOCK, 4 * INDEX_DIM, generator=g) * 8
    state[..., 2 * INDEX_DIM :] = -1e30 * (1 + torch.rand(state_blocks, STATE_BLOCK, 2 * INDEX_DIM, generator=g))
    positions, reqs, kv_slots = [], [], []
    for r, n in enumerate(counts):
        for i in range(n):
            pooled = torch.zeros(INDEX_DIM) if (r, i) == (1, 5) else _pooled_row(g)
            pooled = pooled * 2.0 ** int(torch.randint(-3, 4, (1,), generator=g))
            # entry e of the 8: tokens 4(i-1) + e (first half), then 4i + e - 4 (second half)
            first = 4 if i == 0 else 0
            pick = torch.randint(first, 8, (INDEX_DIM,), generator=g)
            for e in range(first, 8):
                dims = (pick == e).nonzero().flatten()
                blk = state_table[r, i - 1 + e // 4]
                half = INDEX_DIM * (e // 4)
                state[blk, e % 4, half + dims] = pooled[dims]
                state[blk, e % 4, 2 * INDEX_DIM + half + dims] = torch.randn(dims.numel(), generator=g)
            positions.append(RATIO * i + RATIO - 1)
            reqs.append(r)
            kv_slots.append(int(table[r, i // cblock]) * cblock + i % cblock)
    for p, r, s in ((9, 0, -1), (14, 1, -1), (11, 0, -1)):  # no compressed row ends at 9 or 14; 11 padding
        positions.append(p)
        reqs.append(r)
        kv_slots.append(s)
    cos_sin = torch.zeros(RATIO * max(counts), 64)
    turn = torch.randint(0, 4, (cos_sin.shape[0], 32), generator=g)
    cos_sin[:, :32] = torch.tensor([1.0, 0.0, -1.0, 0.0])[turn]
    cos_sin[:, 32:] = torch.tensor([0.0, 1.0, 0.0, -1.0])[turn]
    weight = torch.exp2(torch.randint(-6, 4, (INDEX_DIM,), generator=g).float()).to(torch.bfloat16)
    start = torch.randint(0, 256, (sum(pages) + 1, _padded(cblock * INDEX_ROW)), dtype=torch.uint8, generator=g)
    T = len(positions)
    return dict(
        state=state,
        positions=torch.tensor(positions, dtype=torch.int64),
        token_to_req=torch.tensor(reqs, dtype=torch.int32),
        state_slots=torch.arange(T, dtype=torch.int64),
        state_table=state_table,
        cos_sin=cos_sin,
        weight=weight,
        kv_slots=torch.tensor(kv_slots, dtype=torch.int64),
        table=table,
        counts=counts,
        start=start,
    )


def compressed_rows_f64(case: dict) -> torch.Tensor:
    """``[T, 128]`` float64: each token's compressed row recomputed from the case in float64 (vLLM's
    formula: softmax over the 8 entries per dim, weighted sum, RMSNorm with eps, GPT-J RoPE of dims
    64..127 at position ``p // 4 x 4``); tokens that end no compressed row get zeros."""
    out = torch.zeros(case["positions"].shape[0], INDEX_DIM, dtype=torch.float64)
    state = case["state"].double()
    w = case["weight"].double()
    for t, (p, r) in enumerate(zip(case["positions"].tolist(), case["token_to_req"].tolist())):
        if (p + 1) % RATIO:
            continue
        kv, score = [], []
        for e in range(2 * RATIO):
            q = p - 2 * RATIO + 1 + e
            if q < 0:
                continue
            row = state[case["state_table"][r, q // STATE_BLOCK], q % STATE_BLOCK]
            half = INDEX_DIM * (e // RATIO)
            kv.append(row[half : half + INDEX_DIM])
            score.append(row[2 * INDEX_DIM + half : 3 * INDEX_DIM + half])
        pooled = (torch.stack(kv) * torch.softmax(torch.stack(score), dim=0)).sum(0)
        x = pooled / torch.sqrt((pooled * pooled).mean() + EPS) * w
        cs = case["cos_sin"][p // RATIO * RATIO].double()
        even, odd = x[64::2].clone(), x[65::2].clone()
        x[64::2] = even * cs[:32] - odd * cs[32:]
        x[65::2] = odd * cs[:32] + even * cs[32:]
        out[t] = x
    return out


# ---------------------------------------------------------------- vLLM's writers (the child process)
def _interpreter_fp8_like_a_gpu() -> None:
    """In Triton's interpreter, convert float32 -> e4m3fn (round to nearest even) as a GPU does, by
    torch's conversion, instead of the interpreter's own (see the module docstring)."""
    import numpy as np
    from triton.runtime import interpreter

    plain = interpreter._convert_float

    def convert(x, src, dst, rounding):
        if src.name == "fp32" and dst.name == "fp8e4nv" and getattr(rounding, "name", "") == "RTNE":
            t = torch.from_numpy(np.array(x, dtype=np.float32))
            return t.to(FN).view(torch.uint8).numpy().reshape(x.shape)
        return plain(x, src, dst, rounding)

    interpreter._convert_float = convert


def write_with_vllm(out_path: str) -> None:
    """Run vLLM's writers on every case and save the pages they wrote (CPU tensors) to ``out_path``."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        _interpreter_fp8_like_a_gpu()
    from vllm.models.deepseek_v4.common.ops.cache_utils import quantize_and_insert_k_cache
    from vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache import compress_norm_rope_store_triton

    dev = "cuda" if HAS_GPU else "cpu"
    res: dict = {"ds_mla": {}, "indexer": {}}
    for bs in DS_BLOCKS:
        rows, slots, start = ds_mla_case(bs)
        buf = start.to(dev)
        quantize_and_insert_k_cache(rows.to(dev), buf, slots.to(dev), block_size=bs, use_fnuz=False)
        res["ds_mla"][bs] = buf.cpu()
    for cb in INDEX_BLOCKS:
        c = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in indexer_case(cb).items()}
        buf = c["start"].clone()
        compress_norm_rope_store_triton(
            state_cache=c["state"],
            num_actual=c["positions"].shape[0],
            token_to_req_indices=c["token_to_req"],
            positions=c["positions"],
            slot_mapping=c["state_slots"],
            block_table=c["state_table"],
            block_size=STATE_BLOCK,
            state_width=2 * INDEX_DIM,
            cos_sin_cache=c["cos_sin"],
            kv_cache=_pages(buf, cb, INDEX_ROW),
            k_cache_metadata=types.SimpleNamespace(slot_mapping=c["kv_slots"]),
            pdl_kwargs={},
            head_dim=INDEX_DIM,
            rope_head_dim=64,
            compress_ratio=RATIO,
            overlap=True,
            use_fp4_cache=False,
            rms_norm_weight=c["weight"],
            rms_norm_eps=EPS,
            quant_block=INDEX_DIM,
            token_stride=INDEX_DIM,
            scale_dim=4,
        )
        res["indexer"][cb] = buf.cpu()
    torch.save(res, out_path)


@pytest.fixture(scope="module")
def vllm_pages(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("v4_cache_writers") / "vllm_pages.pt"
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(out)],
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0 and out.is_file(), (
        f"vLLM's writers failed in the child:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    return torch.load(out)


# ---------------------------------------------------------------- the comparisons
def _differences(ours: torch.Tensor, theirs: torch.Tensor, field) -> str:
    """Empty when the page buffers are equal, else how many bytes differ and the first few: page,
    byte offset in the page, what the byte holds (``field``), ours and vLLM's."""
    ours, theirs = ours.cpu(), theirs.cpu()
    diff = (ours != theirs).nonzero().tolist()
    if not diff:
        return ""
    head = "; ".join(
        f"page {p} byte {o} ({field(o)}): ours {int(ours[p, o]):#04x}, vLLM {int(theirs[p, o]):#04x}"
        for p, o in diff[:8]
    )
    return f"{len(diff)} bytes differ: {head}"


def _ds_field(bs: int):
    def field(o: int) -> str:
        if o < bs * DS_DATA:
            return f"slot {o // DS_DATA} {'e4m3' if o % DS_DATA < 448 else 'rope'} byte {o % DS_DATA}"
        if o < bs * DS_ROW:
            return f"slot {(o - bs * DS_DATA) // DS_SCALES} scale byte {(o - bs * DS_DATA) % DS_SCALES}"
        return "pad"

    return field


def _index_field(cb: int):
    def field(o: int) -> str:
        if o < cb * INDEX_DIM:
            return f"slot {o // INDEX_DIM} value {o % INDEX_DIM}"
        if o < cb * INDEX_ROW:
            return f"slot {(o - cb * INDEX_DIM) // 4} scale byte {(o - cb * INDEX_DIM) % 4}"
        return "pad"

    return field


@pytest.mark.parametrize("block_size", DS_BLOCKS)
def test_fp8_ds_mla_write_is_vllms_bytes(vllm_pages, block_size):
    """fp8_ds_mla_write (what the V4 layer tests fill the window and compressed caches with) writes
    the bytes vLLM's quantize_and_insert_k_cache writes, e4m3fn: every byte of the padded pages
    equal, the poisoned slots the rows do not reach and the -1 slot's untouched. vLLM wrote every
    row (its padding scale byte 0 where the poison was 0xFF) and nothing else."""
    rows, slots, start = ds_mla_case(block_size)
    theirs = vllm_pages["ds_mla"][block_size]
    ours = start.to(DEVICE)
    fp8_ds_mla_write(_pages(ours, block_size, DS_ROW), rows.to(DEVICE), slots.to(DEVICE), FN)
    assert (problem := _differences(ours, theirs, _ds_field(block_size))) == "", problem
    written = torch.zeros(start.shape[0] * block_size, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    pad_byte = fp8_ds_mla_views(_pages(theirs, block_size, DS_ROW))[1][..., 7].reshape(-1)
    assert bool((pad_byte[written] == 0).all()) and bool((pad_byte[~written] == 0xFF).all())


@pytest.mark.parametrize("cblock", list(INDEX_BLOCKS))
def test_indexer_k_cache_write_is_the_compressors_bytes(vllm_pages, cblock):
    """vLLM's CSA compressor writes the indexer key cache that indexer_k_cache_write writes from the
    same bf16 rows (scale_fmt "ue8m0", e4m3fn, flat rows), byte for byte over the padded pages.

    The rows are exact by construction (``indexer_case``) and checked against the float64
    recomputation first. Then vLLM's bytes read back at the layout's offsets (value d of page offset
    o at ``128 o + d``, its float32 scale at ``128 block_size + 4 o``) decode to that recomputation
    within one e4m3 rounding, each scale the power of two ``2^ceil(log2(max(amax, 1e-4) / 448))``;
    and the whole buffers are equal. A plain ``amax / 448`` scale, a scale elsewhere, tiled rows or
    another rounding of the codes would each fail the last check."""
    case = indexer_case(cblock)
    theirs = vllm_pages["indexer"][cblock]
    ref = compressed_rows_f64(case)
    rows = ref.to(torch.bfloat16)
    assert bool(((rows.double() - ref).abs() <= 2.0**-20 * ref.abs()).all()), "the compressed rows are not exact"

    slots = case["kv_slots"]
    keep = (slots >= 0).nonzero().flatten()
    page, off = slots[keep] // cblock, slots[keep] % cblock
    codes = theirs[page[:, None], off[:, None] * INDEX_DIM + torch.arange(INDEX_DIM)]
    sbytes = theirs[page[:, None], cblock * INDEX_DIM + 4 * off[:, None] + torch.arange(4)]
    scale = sbytes.contiguous().view(torch.float32).flatten()
    amax = rows[keep].float().abs().amax(dim=1).clamp_min(1e-4)
    assert torch.equal(scale, torch.exp2(torch.ceil(torch.log2(amax.double() / 448))).float())
    vals = codes.view(FN).double() * scale.double()[:, None]
    half_step = torch.maximum(ref[keep].abs() * 2.0**-4, 2.0**-10 * scale.double()[:, None]) * (1 + 2.0**-20)
    assert bool(((vals - ref[keep]).abs() <= half_step).all()), "vLLM's values are not the rows within one e4m3 step"

    ours = case["start"].to(DEVICE)
    indexer_k_cache_write(rows.to(DEVICE), _pages(ours, cblock, INDEX_ROW), slots.to(DEVICE), scale_fmt="ue8m0",
                          shuffled=False, kv_cache_dtype="fp8_e4m3fn")  # fmt: skip
    assert (problem := _differences(ours, theirs, _index_field(cblock))) == "", problem


@pytest.mark.parametrize("cblock", list(INDEX_BLOCKS))
def test_indexer_topk_reads_the_compressors_cache(vllm_pages, cblock):
    """mla_indexer_topk over the cache vLLM's compressor wrote (e4m3fn, flat rows, padded pages,
    ``cache_kind`` e4m3fn, ``shuffled=False``) answers a valid top-k of the float64 logits of
    those bytes: rows that see every compressed row of their request, fewer, and fewer than topk."""
    case = indexer_case(cblock)
    cache = _pages(vllm_pages["indexer"][cblock].to(DEVICE), cblock, INDEX_ROW)
    n0, n1 = case["counts"]
    kv_lens = torch.tensor([n0, n0 - 9, n1, 5], dtype=torch.int32, device=DEVICE)
    req = torch.tensor([0, 0, 1, 1], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(300 + cblock)
    q = (torch.randn(4, INDEX_HEADS, INDEX_DIM, generator=g) * 2).to(FN).to(DEVICE)
    w = (torch.randn(4, INDEX_HEADS, generator=g) * INDEX_HEADS**-0.5).to(DEVICE)
    table = case["table"].to(DEVICE)
    plan = plan_indexer_topk_for(q, cache, table, topk=TOPK, shuffled=False, cache_kind=FN)
    out = mla_indexer_topk(q, w, cache, table, req, kv_lens, topk=TOPK, plan=plan)
    logits = mla_indexer_logits_ref(q, w, cache, table, req, kv_lens, shuffled=False, cache_kind=FN)
    assert all(lg is not None and bool(torch.isfinite(lg).all()) for lg in logits)
    assert (problem := check_indexer_topk(out, logits, TOPK)) == "", problem


if __name__ == "__main__":
    write_with_vllm(sys.argv[1])
