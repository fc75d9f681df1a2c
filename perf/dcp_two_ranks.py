#!/usr/bin/env python3
"""Decode context parallelism with 2 ranks through vLLM 0.33's own DCP code, ROCM_MLA decode on each
rank's KV shard, against the 1-rank result. Prints per case and rank the max error, then
``DCP 2-rank: PASS`` or ``DCP 2-rank: FAIL`` (exit status 0 / 1).

    # on the 2-GPU machine (vLLM's pure-Python part carried, perf/vllm_on_device.sh):
    source perf/vllm_on_device.sh && python3 perf/dcp_two_ranks.py
    # on CPU (gloo, 2 processes, Triton interpreter; small cases):
    python3 perf/dcp_two_ranks.py --backend gloo --quick

What runs (tests/vllm_harness/dcp.py has the details):
1. The parent builds a world-1 ROCM_MLA layer step of decode requests with all N heads
   (tests/vllm_harness/layer_step.py LayerStep: vLLM's MLAAttention + metadata builder) and runs it: the 1-rank
   output and the float32 reference; inputs, weights and block table go to a temporary folder.
2. ``world`` processes (torch.multiprocessing, spawn) each start vLLM's distributed environment with
   TP = DCP = world (``init_distributed_environment`` + ``initialize_model_parallel``; NCCL on GPUs,
   gloo on CPU; custom all-reduce off), build an MLAAttention layer with their TP rank's N/world heads
   and kv_b_proj shard (vLLM's ColumnParallelLinear), write their token-interleaved KV shard
   (vLLM's slot-mapping formula) through the ROCM_MLA KV write, build the metadata with
   ``dcp_local_seq_lens`` (vLLM's get_dcp_local_seq_lens) through vLLM's builder, and run
   ``MLAAttention.update_kv_cache`` + ``forward_impl``: vLLM's all-gather of the query heads, the
   ROCM_MLA ``forward_mqa`` on the shard (all N heads), vLLM's ``cp_lse_ag_out_rs`` (lse
   all-gather, ``correct_attn_out`` Triton kernel, reduce-scatter over heads), W_UV.
3. Each rank compares its N/world heads of the output with the 1-rank output and the float32
   reference, and checks that forward_mqa saw N heads and that the DCP combine ran.

``--communicator base`` (default) uses vLLM's ``DeviceCommunicatorBase`` (torch.distributed
all_gather_into_tensor / reduce_scatter_tensor on the NCCL device group); ``platform`` uses the
(simulated ROCm) platform's ``CudaCommunicator``, as vLLM on ROCm does: its reduce-scatter goes through
vLLM's PyNccl (ctypes on libnccl.so.2 under a CUDA torch); GPUs only (on CPU PyNccl is disabled and the
reduce-scatter returns garbage, which the check reports as FAIL).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # vLLM replaces Triton by a placeholder on a machine without a GPU driver unless the platform's
    # visible-devices variable is set and empty; the kernels then run in the Triton interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["HIP_VISIBLE_DEVICES"] = ""

# The vLLM layer-step and DCP harness lives with the tests (tests/vllm_harness).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

# (num_heads, block_size, kv_cache_dtype, interleave)
FULL = [
    (16, 16, "auto", 1),
    (16, 64, "auto", 1),
    (16, 1, "auto", 1),
    (16, 64, "fp8", 1),
    (128, 64, "auto", 1),
    (16, 16, "auto", 8),
]
QUICK = [(16, 16, "auto", 1), (8, 16, "fp8", 8)]
# Decode requests (context, new): long ones, a single token (rank 1's shard empty), uneven lengths.
REQUESTS = [(1000, 1), (17, 1), (0, 1), (300, 1), (63, 1), (64, 1), (2047, 1), (5, 1)]
QUICK_REQUESTS = [(90, 1), (17, 1), (0, 1), (40, 1), (31, 1)]


def _setup_vllm():
    from vllm_harness import layer_step as H

    H.use_simulated_gfx942_platform()
    from rocm_mla.vllm import register

    register()
    return H


def prepare(tmp: Path, cases, requests, dtype) -> list[dict]:
    H = _setup_vllm()
    from vllm_harness.dcp import prepare_case

    from rocm_mla.vllm.backend import RocmMLABackend

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    meta = []
    for i, (N, bs, kvd, interleave) in enumerate(cases):
        step = H.LayerStep(
            RocmMLABackend,
            [H.Request(c, q) for c, q in requests],
            num_heads=N,
            dtype=dtype,
            device=dev,
            kv_cache_dtype=kvd,
            block_size=bs,
            k_scale=0.05,
            seed=i,
        )
        case = prepare_case(step)
        case["interleave"] = interleave
        torch.save(case, tmp / f"case{i}.pt")
        meta.append(
            {
                "case": i,
                "num_heads": N,
                "block_size": bs,
                "kv_cache_dtype": kvd,
                "interleave": interleave,
                "dtype": str(dtype).replace("torch.", ""),
                "err_1rank_vs_fp32": (case["out_1rank"].float() - case["reference"]).abs().max().item(),
            }
        )
        del step
    return meta


def rank_main(rank: int, world: int, port: int, backend: str, communicator: str, tmp: str, ncases: int) -> None:
    results = {"rank": rank, "cases": [], "error": None}
    try:
        if torch.cuda.is_available():
            torch.cuda.set_device(rank)  # before anything touches the GPU (the platform set-up reads its arch)
        _setup_vllm()
        from vllm_harness import dcp as dcp_check

        first = torch.load(Path(tmp) / "case0.pt")
        dcp_check.init_vllm_dcp(rank, world, port, backend, communicator, first["interleave"])
        import vllm.distributed.parallel_state as ps

        for i in range(ncases):
            case = torch.load(Path(tmp) / f"case{i}.pt")
            interleave = case["interleave"]
            if interleave != first["interleave"]:  # the interleave is a ParallelConfig field: reinit
                ps.destroy_model_parallel()
                ps.destroy_distributed_environment()
                dcp_check.init_vllm_dcp(rank, world, port + 1 + i, backend, communicator, interleave)
                first = case
            t0 = time.time()
            res = dcp_check.run_rank_case(case, rank, world, interleave)
            res["case"], res["seconds"] = i, round(time.time() - t0, 2)
            results["cases"].append(res)
    except Exception:  # noqa: BLE001 - report, and let the parent print it
        results["error"] = traceback.format_exc()
    (Path(tmp) / f"rank{rank}.json").write_text(json.dumps(results))
    try:
        import vllm.distributed.parallel_state as ps

        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
    except Exception:  # noqa: BLE001
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo", choices=["nccl", "gloo"])
    ap.add_argument("--communicator", default="base", choices=["base", "platform"])
    ap.add_argument("--quick", action="store_true", help="small cases (the CPU default)")
    ap.add_argument("--out", default=None, help="folder for dcp_two_ranks.json")
    ap.add_argument(
        "--deadline",
        type=float,
        default=480.0,
        help="seconds the ranks may take; then they are killed and the run FAILs (a rank that "
        "failed leaves the other waiting in a collective)",
    )
    args = ap.parse_args()
    gpu = torch.cuda.is_available()
    if gpu and torch.cuda.device_count() < args.world:
        print(f"DCP {args.world}-rank: needs {args.world} GPUs, {torch.cuda.device_count()} visible")
        return 2
    quick = args.quick or not gpu
    cases, requests = (QUICK, QUICK_REQUESTS) if quick else (FULL, REQUESTS)
    dtype = torch.bfloat16 if gpu else torch.float32
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="rocm_mla_dcp_") as tmp:
        t0 = time.time()
        meta = prepare(Path(tmp), cases, requests, dtype)
        print(f"prepared {len(meta)} cases (1-rank steps) in {time.time() - t0:.1f} s")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        t0 = time.time()
        ctx = mp.start_processes(
            rank_main,
            args=(args.world, port, args.backend, args.communicator, tmp, len(meta)),
            nprocs=args.world,
            join=False,
            start_method="spawn",
        )
        timed_out = False
        while not ctx.join(timeout=5):
            if time.time() - t0 > args.deadline:
                timed_out = True
                for proc in ctx.processes:
                    if proc.is_alive():
                        proc.kill()
                break
        print(
            f"{args.world} ranks ran in {time.time() - t0:.1f} s ({args.backend}, communicator {args.communicator})"
            + (f": KILLED after the {args.deadline:.0f} s deadline" if timed_out else "")
        )
        ranks = []
        for r in range(args.world):
            f = Path(tmp) / f"rank{r}.json"
            ranks.append(
                json.loads(f.read_text())
                if f.exists()
                else {"rank": r, "cases": [], "error": "no result (killed, or it died without writing one)"}
            )
    ok = True
    for r in ranks:
        if r["error"]:
            ok = False
            print(f"rank {r['rank']} FAILED:\n{r['error']}")
    from vllm_harness.layer_step import DCP_TOLERANCE

    tol = DCP_TOLERANCE[dtype]  # max |err| vs 1-rank <= tol x max(1, max |ref|)
    rows = []
    for m in meta:
        i = m["case"]
        per = [c for r in ranks for c in r["cases"] if c["case"] == i]
        if len(per) != args.world:
            ok = False
            continue
        N = m["num_heads"]
        err = max(c["max_err_vs_1rank"] for c in per)
        scale = max(c["ref_scale"] for c in per)
        case_ok = (
            all(c["finite"] for c in per)
            and err <= tol * scale
            and all(h == [N] for h in (c["forward_mqa_q_heads"] for c in per))
            and all(c["dcp_combine_calls"] == 1 for c in per)
        )
        ok &= case_ok
        comm = sorted({f"{c['dcp_communicator']}" + (f" (pynccl {c['pynccl']})" if c["pynccl"] else "") for c in per})
        rows.append(
            {
                **m,
                "communicator": comm,
                "max_err_vs_1rank": err,
                "max_err_vs_fp32": max(c["max_err_vs_fp32"] for c in per),
                "ref_scale": scale,
                "local_seq_lens": [c["local_seq_lens"] for c in per],
                "forward_mqa_q_heads": [c["forward_mqa_q_heads"] for c in per],
                "pass": case_ok,
            }
        )
        print(
            f"case {i}: N={N} block={m['block_size']} kv={m['kv_cache_dtype']} interleave={m['interleave']} "
            f"{m['dtype']}: max |err| vs 1-rank {err:.3g} (vs fp32 {rows[-1]['max_err_vs_fp32']:.3g}, "
            f"1-rank vs fp32 {m['err_1rank_vs_fp32']:.3g}, scale {scale:.3g}) "
            f"forward_mqa heads {rows[-1]['forward_mqa_q_heads']}, DCP group {', '.join(comm)} "
            f"-> {'PASS' if case_ok else 'FAIL'}"
        )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "dcp_two_ranks.json").write_text(
            json.dumps(
                {
                    "world": args.world,
                    "backend": args.backend,
                    "communicator": args.communicator,
                    "device": torch.cuda.get_device_name(0) if gpu else "cpu",
                    "torch": torch.__version__,
                    "cases": rows,
                    "errors": [r["error"] for r in ranks if r["error"]],
                },
                indent=1,
            )
        )
    worst = max((r["max_err_vs_1rank"] for r in rows), default=float("nan"))
    print(f"DCP {args.world}-rank: {'PASS' if ok and rows else 'FAIL'} (max |err| vs 1-rank {worst:.3g})")
    return 0 if ok and rows else 1


if __name__ == "__main__":
    sys.exit(main())
