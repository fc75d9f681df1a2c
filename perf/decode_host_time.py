#!/usr/bin/env python3
"""Host time of one mla_decode layer call in eager mode: the Python and launch work a serving step
pays per layer, apart from the GPU's.

Each mode makes LAYERS back-to-back calls on one shape (the GPU queue never fills at these sizes)
and reports the host time per call (the loop's wall time before any synchronisation, divided by
the calls) beside the wall time per call with the GPU waited for:

  planned    the plan made once (as the vLLM metadata builder makes it per step), every call
             passes it: what each layer of a step costs
  layer      planned, out and lse made by the call (as the vLLM backend's forward_mqa calls it:
             fresh buffers need no destination checks)
  planned-kernel[grid]
             the same with every launch through Triton's kernel[grid] instead of the kept
             compiled kernels (rocm_mla/ops/_launch.py)
  per-call   plan=None: each call plans from its tensors (a one-off caller)
  plan       plan_decode alone, once per step
  launch     the Triton kernels launched with the plan's arguments and nothing else: the floor

With an mla_decode that takes no plan (the API before plans), ``per-call`` is that API's call
with its keywords, and ``planned``/``plan`` are skipped: run the script against that tree to
compare. Every mode's output is checked against the reference in the first call.

    python perf/decode_host_time.py [--B 64] [--seq 4096] [--N 16] [--q-len 1] [--layers 200] [--json F]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time

import torch


def _timed(fn, calls: int) -> tuple[float, float]:
    """(host µs per call, wall µs per call with the GPU waited for)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return host / calls * 1e6, wall / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--N", type=int, default=16)
    ap.add_argument("--q-len", type=int, default=1)
    ap.add_argument("--layers", type=int, default=200, help="calls per timed loop")
    ap.add_argument("--repeats", type=int, default=5, help="timed loops per mode; the median is reported")
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("decode_host_time: needs a GPU (host time of kernel launches)", file=sys.stderr)
        return 2

    import rocm_mla
    from rocm_mla.cases.decode import DecodeShape, make_inputs

    shape = DecodeShape(B=args.B, seq=args.seq, N=args.N, q_len=args.q_len)
    case = make_inputs(shape, dtype=torch.bfloat16, device="cuda")
    a = case.args(0)
    has_plan = "plan" in inspect.signature(rocm_mla.mla_decode).parameters
    out, lse = case.out, case.lse
    modes = {}
    if has_plan:
        plan = case.plan(backend="triton")
        modes["planned"] = lambda: rocm_mla.mla_decode(*a, sm_scale=case.sm_scale, plan=plan, out=out, lse=lse)
        modes["layer"] = lambda: rocm_mla.mla_decode(*a, sm_scale=case.sm_scale, plan=plan)
        modes["per-call"] = lambda: rocm_mla.mla_decode(*a, sm_scale=case.sm_scale, out=out, lse=lse)
        modes["plan"] = lambda: case.plan(backend="triton")
        try:
            from rocm_mla.ops import _launch
        except ImportError:  # a tree before kept binaries
            _launch = None
        if _launch is not None:

            def through_triton():
                _launch._form_ok = False  # every launch through kernel[grid]
                try:
                    rocm_mla.mla_decode(*a, sm_scale=case.sm_scale, plan=plan, out=out, lse=lse)
                finally:
                    _launch._form_ok = None

            modes["planned-kernel[grid]"] = through_triton
        from rocm_mla.ops import decode as decode_ops

        kv = a[2]
        modes["launch"] = lambda: decode_ops._launch_triton(
            plan, a[0], a[1], kv, a[3], a[4], out, lse, None, case.sm_scale, None, None
        )
    else:  # the keyword API: every call validates and plans
        modes["per-call"] = lambda: rocm_mla.mla_decode(
            *a, sm_scale=case.sm_scale, out=out, lse=lse, max_seq_len=shape.seq, backend="triton"
        )
    rows = []
    for name, fn in modes.items():
        if name in ("planned", "per-call", "planned-kernel[grid]", "layer"):
            out.fill_(float("nan"))
            got = fn()
            problem = case.mismatch(*got) if name == "layer" else case.mismatch(out, lse)
            if problem:
                print(f"decode_host_time: {name}: output wrong: {problem}", file=sys.stderr)
                return 1
        times = sorted(_timed(fn, args.layers) for _ in range(args.repeats))
        host, wall = times[len(times) // 2]
        rows.append({"mode": name, "host_us": round(host, 2), "wall_us": round(wall, 2)})
    print(f"mla_decode host time, {shape.label()} ({torch.cuda.get_device_name()}, torch {torch.__version__})")
    print(f"{'mode':20s} {'host µs/call':>13s} {'wall µs/call':>13s}")
    for r in rows:
        print(f"{r['mode']:20s} {r['host_us']:13.1f} {r['wall_us']:13.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": shape.label(), "plan_api": has_plan, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
