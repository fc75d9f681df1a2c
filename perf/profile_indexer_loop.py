#!/usr/bin/env python3
"""How fast a Triton q . k loop over the lightning indexer's cache goes on this GPU, beside the loop
with mla_indexer_topk's own key-tile load, vLLM's logits kernel and mla_indexer_topk itself: µs per
call and % of the copy ceiling, one line each (docs/notes/indexer.md, "The scoring loop against a
plain Triton loop").

    python perf/profile_indexer_loop.py [--rows 128] [--keys 131072] [--heads 64] [--peers .peers]
    python perf/profile_indexer_loop.py --compile gfx942,gfx950,sm90   # no GPU needed

Inputs: rocm_mla.cases.indexer_topk.make_inputs of rows requests of one row and keys keys (H
heads, top-k 2048, pages of 64 keys in shuffled order), once with a flat cache (vLLM's block-flat
layout: a page's 64 x 128 values, then its 64 float32 scales) and once shuffled. Bytes counted:
132 a key a row.

Variants (grid (rows, NS): a program a row's every NS-th 64-key tile, or NS contiguous runs):
  plain       the values' tile loaded without a mask, tl.dot with q^T, relu, the weighted sum over
              heads, times the keys' scales, float32 logits stored: num_warps, stages, tiles a step;
              and with a position mask (vLLM's), then also the page id's range (the op's)
  no dot      the same tiles loaded and summed: the paged read's own ceiling
  _key_tile   the plain loop with the op's tile load (rocm_mla.kernels.indexer_topk._key_tile), flat
              and shuffled values
  vLLM        rocm_fp8_paged_mqa_logits_triton (--peers, perf/peers/get_vllm_sparse_peers.sh), and
              with torch.topk
  op          mla_indexer_topk on rocm_mla.cases inputs of the same size (shuffled and flat caches),
              its plan as shipped and without the config's many_items
Every logits variant is checked against the inputs' float64 logits of the first rows
(IndexerInputs.logits, to fp8_dot_rtol of a row's largest); the op's answers with
IndexerInputs.mismatch. A failed check stops the run.

--compile ARCHS compiles the loops ahead of time instead (the ISA report's compiler: gfx942,
gfx950, sm90; no GPU): the plain loop unmasked, position-masked and position + page-masked, and the
_key_tile loop flat and shuffled, each at 4 warps and the stages of the measured loop, with its
registers, occupancy, spills and main loop per wave (AMDGCN: instructions, vector memory
instructions, serial round trips to memory, as rocm_mla.tools.isa_report.kv_loop counts them) or
per warp (SASS: instructions, global loads, predicated instructions).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from rocm_mla import _platform
from rocm_mla.cases.indexer_topk import IndexerShape, fp8_dot_rtol, make_inputs
from rocm_mla.configs import config_for, platform_fp8_dtype
from rocm_mla.configs.tables import is_amd_arch
from rocm_mla.kernels.indexer_topk import _key_tile
from rocm_mla.tools.isa_report.triton_rows import triton_row
from rocm_mla.tools.timing import copy_bandwidth_gbs, time_ms
from rocm_mla.triton_common import triton_type
from rocm_mla.variants.triton_variant import TritonVariant

D, BS = 128, 64  # values a key, keys a page (a tile)
CHECK_ROWS = 2


@triton.jit
def _row_q_and_weights(q_ptr, w_ptr, row, s_q_r, s_q_h, H: tl.constexpr, D: tl.constexpr):
    """Row ``row``'s q ``[H, D]`` fp8 (row and head strides given) and weights ``[H]`` float32."""
    h = tl.arange(0, H)
    d = tl.arange(0, D)
    return tl.load(q_ptr + row * s_q_r + h[:, None] * s_q_h + d[None, :]), tl.load(w_ptr + row * H + h)


@triton.jit
def plain_loop_kernel(
    q_ptr, w_ptr, cache_ptr, bt_ptr, out_ptr, num_keys, s_q_r, s_q_h, s_page, s_bt, s_out, num_pages,
    H: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, NS: tl.constexpr, STREAMS: tl.constexpr,
    CONTIG: tl.constexpr, DOT: tl.constexpr, STAGES: tl.constexpr, MASK: tl.constexpr,
):  # fmt: skip
    """A row's logits over its tiles t = split x STREAMS + k x NS x STREAMS (CONTIG: a run of
    tiles / NS); DOT 0: the tiles summed into out[row, split x BS ..] instead. MASK 0: the values
    loaded unmasked; 1: masked by position (vLLM's form); 2: by position and the page id's range,
    the page id itself loaded under a mask (the op's _key_tile form)."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    d = tl.arange(0, D)
    n = tl.arange(0, BS)
    q, w = _row_q_and_weights(q_ptr, w_ptr, row, s_q_r, s_q_h, H, D)
    tiles = num_keys // BS
    if CONTIG:
        t_lo = split * tl.cdiv(tiles, NS)
        t_hi = tl.minimum(t_lo + tl.cdiv(tiles, NS), tiles)
        step = STREAMS
    else:
        t_lo = split * STREAMS
        t_hi = tiles
        step = NS * STREAMS
    acc = tl.zeros([BS], dtype=tl.float32)
    for t0 in tl.range(t_lo, t_hi, step, num_stages=STAGES):
        for v in tl.static_range(STREAMS):
            t = t0 + v
            live = t * BS + n < num_keys
            if MASK == 2:
                page = tl.load(bt_ptr + row * s_bt + t, mask=t * BS < num_keys, other=0).to(tl.int64)
                live = live & (page.to(tl.uint32) < num_pages.to(tl.uint32))
            else:
                page = tl.load(bt_ptr + row * s_bt + t).to(tl.int64)
            base = cache_ptr + page * s_page
            if MASK == 0:
                kv = tl.load(base + n[:, None] * D + d[None, :])
            else:
                kv = tl.load(base + n[:, None] * D + d[None, :], mask=live[:, None])
            sc = tl.load(base.to(tl.pointer_type(tl.uint8)).to(tl.pointer_type(tl.float32)) + (BS * D) // 4 + n)
            if DOT:
                s = tl.dot(kv, tl.trans(q))
                s = tl.where(s < 0.0, 0.0, s)
                tl.store(out_ptr + row * s_out + t * BS + n, tl.sum(s * w[None, :], axis=1) * sc)
            else:
                acc += tl.sum(kv.to(tl.float32), axis=1) + sc
    if not DOT:
        tl.store(out_ptr + row * s_out + split * BS + n, acc, mask=split * BS + n < num_keys)


@triton.jit
def key_tile_loop_kernel(
    q_ptr, w_ptr, cache_ptr, bt_ptr, out_ptr, num_keys, s_q_r, s_q_h, s_page, s_bt, s_out, num_pages,
    H: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, NS: tl.constexpr, SHUFFLED: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    """plain_loop_kernel's strided loop with the values loaded by the op's ``_key_tile``."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    n = tl.arange(0, BS)
    q, w = _row_q_and_weights(q_ptr, w_ptr, row, s_q_r, s_q_h, H, D)
    qt = tl.trans(q)
    bt_row = bt_ptr + row * s_bt
    for t in tl.range(split, num_keys // BS, NS, num_stages=STAGES):
        p0 = t * BS
        kr = _key_tile(
            cache_ptr, bt_row, p0, num_keys, BS, 6, num_pages, s_page, q.dtype,
            D, BS, True, SHUFFLED, True, False,
        )  # fmt: skip
        page = tl.load(bt_row + t).to(tl.int64)
        base = (cache_ptr + page * s_page).to(tl.pointer_type(tl.uint8))
        sc = tl.load(base.to(tl.pointer_type(tl.float32)) + (BS * D) // 4 + n)
        s = tl.dot(kr, qt)
        s = tl.where(s < 0.0, 0.0, s)
        tl.store(out_ptr + row * s_out + p0 + n, tl.sum(s * w[None, :], axis=1) * sc)


def plain_variants(rows: int, tiles: int, programs: int) -> list[dict]:
    """The plain loop's configs: vLLM's (4 warps, 2 stages, ``programs`` / rows programs a row),
    then one change each, then contiguous runs of two tiles a step. NS is capped at the row's tiles."""

    def ns(programs: int) -> int:
        return max(1, min(programs // rows, tiles))

    base = dict(warps=4, stages=2, ns=ns(programs), streams=1, contig=False, dot=True, mask=0)
    out = [dict(base, dot=False), base, dict(base, mask=1), dict(base, mask=2)]
    out += [dict(base, stages=s) for s in (3, 4)] + [dict(base, warps=8)]
    out += [dict(base, streams=s) for s in (2, 4) if tiles % (base["ns"] * s) == 0]
    other = sorted({ns(programs // 4), ns(programs // 2), ns(2 * programs)} - {base["ns"]})
    out += [dict(base, ns=n) for n in other]
    runs = sorted({ns(programs // 2), ns(programs), ns(2 * programs)})
    out += [dict(base, ns=n, streams=2, contig=True) for n in runs if tiles % n == 0 and (tiles // n) % 2 == 0]
    return out


COMPILE_ARCHS = ("gfx942", "gfx950", "sm90")
COMPILE_STAGES = 3  # the measured loop's (docs/notes/indexer.md)


def loop_variants(arch: str, heads: int, ns: int) -> list[tuple[str, TritonVariant]]:
    """``(label, TritonVariant)`` of the loops --compile compiles for ``arch``: the plain loop at
    each MASK, then the _key_tile loop flat and shuffled; q and the cache's values in the arch's
    fp8 kind, every pointer and row stride 16-byte aligned (as the inputs are)."""
    fp8 = "*" + triton_type(platform_fp8_dtype(arch))
    ptrs = {"q_ptr": fp8, "w_ptr": "*fp32", "cache_ptr": fp8, "bt_ptr": "*i32", "out_ptr": "*fp32"}
    ints = ("num_keys", "s_q_r", "s_q_h", "s_page", "s_bt", "s_out", "num_pages")
    aligned = (*ptrs, "s_q_r", "s_q_h", "s_page", "s_bt", "s_out")
    options = {"num_warps": 4, "num_stages": COMPILE_STAGES}
    if is_amd_arch(arch):
        options.update(waves_per_eu=0, matrix_instr_nonkdim=16, kpack=1)

    def variant(fn, constexprs: dict) -> TritonVariant:
        sig = {**ptrs, **{n: "i32" for n in ints}}
        return TritonVariant("profile_indexer_loop", "", fn, sig, constexprs, options, aligned, True)

    shared = {"H": heads, "D": D, "BS": BS, "NS": ns, "STAGES": COMPILE_STAGES}
    masks = ("plain, unmasked", "plain, position mask", "plain, position + page mask")
    out = [
        (label, variant(plain_loop_kernel, dict(shared, STREAMS=1, CONTIG=False, DOT=True, MASK=mask)))
        for mask, label in enumerate(masks)
    ]
    for shuffled in (False, True):
        label = f"_key_tile, {'shuffled' if shuffled else 'flat'}"
        out.append((label, variant(key_tile_loop_kernel, dict(shared, SHUFFLED=shuffled))))
    return out


def compile_report(archs: list[str], heads: int, ns: int) -> None:
    """Compile ``loop_variants`` for each arch into the ISA report's rows and print one line each
    (the module docstring)."""
    print(f"triton {triton.__version__}; H {heads}, NS {ns}, 4 warps, {COMPILE_STAGES} stages; per wave / warp")
    for arch in archs:
        for label, v in loop_variants(arch, heads, ns):
            row = triton_row(v, arch)
            loop = row.loop if is_amd_arch(arch) else row.sass_loop
            if row.error or loop is None:
                raise SystemExit(f"{arch} {label}: {row.error or 'no loop found in the compiled code'}")
            if is_amd_arch(arch):
                fit = f"{row.vgprs:3d} VGPRs, {row.occupancy} waves a SIMD"
                body = (
                    f"{loop['instructions']} instructions, {loop['vmem']} vector memory, {loop['drains']} round trips"
                )
            else:
                fit = f"{row.vgprs:3d} registers, {row.occupancy} blocks an SM"
                body = (
                    f"{loop['instructions']} instructions, {loop['global_loads']} global loads, "
                    f"{loop['predicated']} predicated"
                )
            spills = f"{row.spills} spilled" if row.spills else "no spills"
            print(f"{arch:6s} {label:30s} {fit}, {spills}; loop: {body}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--keys", type=int, default=131072, help="keys a row (a multiple of 64)")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--peers", default="", help="folder with vllm_sparse/ (perf/peers/get_vllm_sparse_peers.sh)")
    ap.add_argument("--programs", type=int, default=1024, help="the base variant's programs, all rows (vLLM's 1024)")
    ap.add_argument("--no-op", action="store_true", help="leave out mla_indexer_topk's own lines")
    ap.add_argument("--compile", default="", metavar="ARCHS", help=f"compile instead, for {','.join(COMPILE_ARCHS)}")
    args = ap.parse_args(argv)
    if args.keys % BS or args.rows < 1:
        ap.error(f"--keys must be a multiple of {BS} and --rows at least 1")
    if args.compile:
        archs = args.compile.split(",")
        bad = [a for a in archs if a not in COMPILE_ARCHS]
        if bad:
            ap.error(f"--compile takes {', '.join(COMPILE_ARCHS)}; got {', '.join(bad)}")
        compile_report(archs, args.heads, max(1, min(args.programs // args.rows, args.keys // BS)))
        return 0
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    R, L, H = args.rows, args.keys, args.heads
    shape = IndexerShape(lens=(L,) * R, rows=(1,) * R, H=H, topk=min(2048, L), block=BS)
    nbytes = R * L * (D + 4)
    copy = copy_bandwidth_gbs(dev)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}, triton {triton.__version__}; {R} rows x {L} keys, H {H}, "
          f"{nbytes / 1e9:.2f} GB; copy ceiling {copy:.0f} GB/s", flush=True)  # fmt: skip
    rows_ok = min(CHECK_ROWS, R)
    rtol = fp8_dot_rtol(dev)
    out = torch.empty(R, L, device=dev)
    ns = max(1, min(args.programs // R, L // BS))

    def line(label: str, fn, want: list | None) -> None:
        """Run ``fn`` once; check the logits it returns or wrote to ``out`` against ``want`` (the
        inputs' float64 logits, to ``rtol`` of a row's largest; None: no check); time it."""
        got = fn()
        got = got[:, :L] if isinstance(got, torch.Tensor) else out
        for r in range(rows_ok if want is not None else 0):
            err = (got[r].double() - want[r]).abs().max().item()
            if not err <= rtol * want[r].abs().max().item():
                raise SystemExit(f"{label}: row {r}'s logits differ from the float64 reference by {err:.3g}")
        ms = time_ms(fn, warmup_ms=10, rep_ms=60)
        print(f"{label:72s} {ms * 1e3:9.1f} µs {100 * nbytes / ms / 1e6 / copy:5.1f}% of copy", flush=True)

    def loops(inp, want: list) -> None:
        """The plain loops (flat cache only) and the _key_tile loop over ``inp``'s cache."""
        cache, bt = inp.index_cache, inp.block_table
        args_ = (inp.q, inp.weights, cache.view(inp.fp8), bt, out, L, inp.q.stride(0), inp.q.stride(1),
                 cache.stride(0), bt.stride(0), out.stride(0), cache.shape[0])  # fmt: skip
        for c in plain_variants(R, L // BS, args.programs) if not inp.shuffled else []:
            masks = ("", ", position mask", ", position + page mask")
            order = "contiguous" if c["contig"] else "strided"
            label = f"plain {c['warps']} warps, {c['stages']} stages, NS {c['ns']}, {c['streams']} a step, {order}"
            label += ("" if c["dot"] else ", no dot") + masks[c["mask"]]
            line(label, lambda c=c: plain_loop_kernel[(R, c["ns"])](
                *args_, H=H, D=D, BS=BS, NS=c["ns"], STREAMS=c["streams"], CONTIG=c["contig"], DOT=c["dot"],
                STAGES=c["stages"], MASK=c["mask"], num_warps=c["warps"],
            ), want if c["dot"] else None)  # fmt: skip
        for stages in (2, 3):
            label = f"_key_tile {'shuffled' if inp.shuffled else 'flat'}, 4 warps, {stages} stages, NS {ns}, strided"
            line(label, lambda st=stages: key_tile_loop_kernel[(R, ns)](
                *args_, H=H, D=D, BS=BS, NS=ns, SHUFFLED=inp.shuffled, STAGES=st, num_warps=4,
            ), want)  # fmt: skip

    def vllm(inp, want: list) -> None:
        """vLLM's logits kernel over ``inp``'s flat cache, alone and with torch.topk."""
        folder = Path(args.peers) / "vllm_sparse"
        if not (folder / "rocm_indexer.py").exists():
            raise SystemExit(f"no {folder}/rocm_indexer.py (run perf/peers/get_vllm_sparse_peers.sh {args.peers})")
        sys.path.insert(0, str(folder))
        import rocm_indexer

        rocm_indexer.FP8_DTYPE = inp.fp8
        q4, lens = inp.q.unsqueeze(1), inp.kv_lens[:R]

        def logits():
            return rocm_indexer.rocm_fp8_paged_mqa_logits_triton(
                q4, inp.index_cache, inp.weights, lens, inp.block_table, L
            )

        line("vLLM 0.34 rocm_fp8_paged_mqa_logits_triton", logits, want)
        line("vLLM 0.34 logits + torch.topk(2048)", lambda: torch.topk(logits(), shape.topk, dim=-1), None)

    def op(inp) -> None:
        """mla_indexer_topk on ``inp``: the shipped plan, and the arch's tier without many_items."""
        plans = {"shipped": inp.plan()}
        tier = dict(config_for("mla_indexer_topk", _platform.device_arch(dev))["tiers"][0])
        if tier.pop("many_items", None) is not None:
            plans["without many_items"] = inp.plan(config=tier)
        for what, plan in plans.items():
            ws = torch.empty(max(1, plan.workspace_numel), dtype=torch.int32, device=dev)
            label = f"mla_indexer_topk, {'shuffled' if inp.shuffled else 'flat'} cache, {what}"

            def call(plan=plan, ws=ws):
                inp.run(plan=plan, workspace=ws)

            call()
            problem = inp.mismatch(rows=rows_ok)
            if problem:
                raise SystemExit(f"{label}: {problem}")
            line(label, call, None)

    for shuffled in (False, True):
        inp = make_inputs(shape, device=dev, shuffled=shuffled)
        want = inp.logits(rows_ok)
        loops(inp, want)
        if args.peers and not shuffled:
            vllm(inp, want)
        if not args.no_op:
            op(inp)
        del inp, want
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
