"""Decode context parallelism (DCP) with the ROCM_MLA decode, through vLLM's own DCP code
(tests/vllm_harness/dcp.py describes what vLLM does; perf/dcp_two_ranks.py runs it on 2 ranks).

* vLLM's token-interleaved slot mapping (its ComputeSlotMappingKernel formula) and its
  get_dcp_local_seq_lens agree, and the shards partition each sequence in order.
* One process, W ranks emulated: vLLM's query all-gather (MLADCPManager._gather_query), the ROCM_MLA
  forward_mqa on each rank's shard, vLLM's cp_lse_ag_out_rs (mask_dcp_empty_shards_, lse all-gather,
  its correct_attn_out Triton kernel -- interpreted on CPU --, reduce-scatter over heads), W_UV:
  equal to the 1-rank layer step. Run in a child process (on CPU vLLM's Triton kernels need
  HIP_VISIBLE_DEVICES="" there: dcp_check.cpu_env).
* Two processes (gloo on CPU): vLLM's distributed groups TP = DCP = 2 and MLAAttention.forward_impl,
  against the 1-rank step (perf/dcp_two_ranks.py; on the 2-GPU machine with NCCL).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _util import HAS_GPU
from vllm_harness import require_vllm

require_vllm()

from vllm_harness import layer_step as H  # noqa: E402

from rocm_mla.cases import generator, paged_cache  # noqa: E402

H.use_simulated_gfx942_platform()

from vllm_harness import dcp as dcp_check  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("world,interleave,block_size", [(2, 1, 16), (2, 8, 16), (4, 1, 1), (4, 16, 64), (8, 2, 16)])
def test_slot_mapping_and_local_seq_lens_agree(world, interleave, block_size):
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    seq_lens = torch.tensor([1, 2, 7, block_size * world, block_size * world + 1, 333], dtype=torch.int32)
    B, vbs = len(seq_lens), block_size * world
    max_vblocks = int((seq_lens.max() + vbs - 1) // vbs)
    # Every request max_vblocks distinct shuffled pages (only the table is used).
    block_table = paged_cache(
        [max_vblocks * block_size] * B,
        block_size,
        dtype=torch.float32,
        device="cpu",
        gen=generator(world * 100 + interleave, "cpu"),
        spare_pages=0,
        spare_cols=0,
    ).table
    assert block_table.shape == (B, max_vblocks)
    for i, S in enumerate(seq_lens.tolist()):
        pos = torch.arange(S)
        owner = torch.full((S,), -1)
        for r in range(world):
            slots = dcp_check.dcp_slot_mapping(
                pos, torch.full_like(pos, i), block_table, block_size, world, r, interleave
            )
            mine = slots >= 0
            assert (owner[mine] == -1).all()  # each token on exactly one rank
            owner[mine] = r
            n = int(get_dcp_local_seq_lens(seq_lens, world, r, interleave)[i])
            assert int(mine.sum()) == n
            # the rank's tokens, in order, are local positions 0..n-1 of its paged sequence
            j = torch.arange(n)
            want = block_table[i, j // block_size].long() * block_size + j % block_size
            assert torch.equal(slots[mine], want)
        assert (owner >= 0).all()


def _emulate(*cases: str) -> list[dict]:
    r = subprocess.run(
        [sys.executable, "-m", "vllm_harness.dcp", *[a for c in cases for a in ("--case", c)]],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dcp_check.cpu_env(),
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return [json.loads(line.split(" ", 1)[1]) for line in r.stdout.splitlines() if line.startswith("DCP_RESULT ")]


def test_dcp_math_with_rocm_mla_decode_equals_one_rank():
    dt = "bfloat16" if HAS_GPU else "float32"
    lo = "bfloat16" if HAS_GPU else "float16"
    cases = [
        f"2:1:16:16:{dt}:auto",
        f"2:8:16:16:{dt}:auto",
        f"4:1:1:16:{dt}:auto",
        f"2:1:64:8:{lo}:fp8",
        f"2:16:64:16:{dt}:auto",
    ]
    results = _emulate(*cases)
    assert len(results) == len(cases)
    for res in results:
        tol = H.DCP_TOLERANCE[getattr(torch, res["dtype"])]
        what = json.dumps(res)
        assert res["vllm_triton"], "vLLM's correct_attn_out did not run as a Triton kernel: " + what
        assert res["finite"] and res["lse_1rank_finite"], what
        assert res["max_err_out_vs_1rank"] <= tol * res["ref_scale"], what
        assert res["max_err_latent_vs_1rank"] <= tol * 10, what
        assert res["max_err_out_vs_fp32"] <= 2 * res["max_err_1rank_vs_fp32"] + tol * res["ref_scale"], what
        if res["world"] >= 2 and res["interleave"] == 1:
            assert any(res["empty_shard_rows"]), "the batch should leave a shard empty: " + what


def _two_ranks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "perf" / "dcp_two_ranks.py"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1800,
    )


def test_two_processes_through_vllm_distributed_dcp_gloo():
    if HAS_GPU:
        pytest.skip("CPU variant (gloo); the gpu-marked test runs NCCL on 2 GPUs")
    r = _two_ranks("--backend", "gloo")
    assert "DCP 2-rank: PASS" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]


@pytest.mark.gpu
def test_two_gpus_through_vllm_distributed_dcp_nccl():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (run perf/dcp_two_ranks.py on the 2-GPU machine)")
    r = _two_ranks()
    assert "DCP 2-rank: PASS" in r.stdout, r.stdout[-4000:] + r.stderr[-4000:]
