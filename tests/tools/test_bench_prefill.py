"""perf/bench_prefill.py without a GPU: its shapes and FLOP count, a CPU run of the whole script, and
the aiter peer it times -- loaded the way the bench loads it on an NVIDIA GPU (simulated here) and
run in the Triton interpreter against the float32 reference (Dqk 192 / Dv 128, natural-log lse).

The aiter tests need the peer folder (bash perf/peers/get_aiter_peers.sh .peers/aiter) and run in a
subprocess: they fake an NVIDIA device in torch.cuda, which must not leak into this test process.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "perf"))

import bench_prefill as bench  # noqa: E402

HAS_AITER = (ROOT / ".peers" / "aiter" / "aiter" / "ops" / "triton").is_dir()
needs_aiter = pytest.mark.skipif(
    not HAS_AITER, reason="no .peers/aiter (bash perf/peers/get_aiter_peers.sh .peers/aiter)"
)


def test_shapes_and_flops():
    assert all(128 <= L <= 8192 for L in bench.VARLEN) and len(set(bench.VARLEN)) > 4
    names = [s.label for s in bench.SHAPES]
    for want in (
        "4x4096 N=16",
        "4x4096 N=128",
        "16x1024 N=16",
        "1x16384 N=16",
        "1x16384 N=128",
        "varlen N=16",
        "varlen N=128",
    ):
        assert want in names
    # 2 * (192 + 128) * N * L (L + 1) / 2 per causal sequence
    assert bench.PrefillShape((4, 2), 3).flops() == 2 * 320 * 3 * (10 + 3)
    assert bench.SHAPES[0].flops() == 2 * 320 * 16 * 4 * 4096 * 4097 / 2
    assert [s.label for s in bench.QUICK] == ["4x4096 N=16", "4x4096 N=128", "16x1024 N=16", "varlen N=16"]


def test_aiter_unavailable_is_a_reason_not_a_crash(tmp_path):
    a = bench.Aiter(str(tmp_path / "nowhere"))
    assert a.mod is None and "get_aiter_peers.sh" in a.reason


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


FAKE_NVIDIA = """
    import sys, torch
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *a: (9, 0)
    sys.path.insert(0, "perf")
"""


@needs_aiter
def test_aiter_mha_loads_as_on_an_nvidia_gpu():
    """On NVIDIA, aiter's flash_attn_triton_amd would see Triton's int arch (90) where it expects a
    gfx string; the loader hands it a string. Here no driver exists at all: the import must not
    ask one, and the launch config is aiter's MI300X "pe" entry without the AMD-only options."""
    proc = _run(
        FAKE_NVIDIA
        + """
    import bench_prefill as b
    a = b.Aiter(".peers/aiter")
    assert a.mod is not None, a.reason
    cfg = a.launch_cfg()
    assert cfg["BLOCK_M"] == 256 and cfg["BLOCK_N"] == 64 and "waves_per_eu" not in cfg, cfg
    tile = a.launch_cfg({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3})
    assert tile["BLOCK_M"] == 128 and tile["num_stages"] == 3 and tile["PRELOAD_V"] is False, tile
    print("OK")
    """
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


@needs_aiter
def test_aiter_varlen_matches_reference_in_interpreter():
    """The peer as the bench calls it (k pre-concatenated, v a strided view, varlen, causal,
    return_lse): Dqk 192 / Dv 128 accepted, out equal to the float32 reference, lse [T, N] in
    natural log (the reference's [N, T] transposed)."""
    proc = _run(
        FAKE_NVIDIA
        + """
    import torch
    import bench_prefill as b
    from rocm_mla.reference import mla_prefill_ref
    b.DTYPE = torch.float16  # bf16 dots are wrong in the interpreter (triton issue 11584)
    a = b.Aiter(".peers/aiter")
    assert a.mod is not None, a.reason
    case = b.Case(b.PrefillShape((17, 70, 5), 2, name="varlen"), torch.device("cpu"))
    out, lse = a.run(case, a.launch_cfg({"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}))
    ref, ref_lse = mla_prefill_ref(case.q, case.k_nope, case.k_pe, case.v, case.cu, case.cu, b.SCALE, True)
    assert out.shape == (92, 2, 128) and lse.shape == (92, 2), (out.shape, lse.shape)
    torch.testing.assert_close(out.float(), ref, rtol=4e-3, atol=4e-3)
    torch.testing.assert_close(lse.transpose(0, 1), ref_lse, rtol=1e-3, atol=1e-3)
    print("OK")
    """
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


def test_isa_sweep_grid_and_register_limit():
    import isa_sweep_prefill as sweep

    cfgs = sweep.grid_configs(sweep.GRIDS["rows32"], "gfx942")
    assert cfgs and all(c["BLOCK_M"] // c["num_warps"] == 32 for c in cfgs)
    assert all(c.get("diag_stages", 0) <= c["num_stages"] for c in cfgs)
    assert len({json_key(c) for c in cfgs}) == len(cfgs)  # no duplicates
    sm90 = sweep.grid_configs(sweep.GRIDS["small"], "sm90")
    assert all(set(c) <= {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"} for c in sm90)
    assert sweep.register_limit(2) == 256 and sweep.register_limit(1) == 512 and sweep.register_limit(3) == 168


def json_key(cfg):
    import json

    return json.dumps(cfg, sort_keys=True)


SMOKE = """
    import contextlib, sys, torch
    import torch.nn.attention as tna
    import torch.nn.functional as F
    torch.cuda.is_available = lambda: True  # the aiter peer loads as on NVIDIA
    torch.cuda.get_device_capability = lambda *a: (9, 0)
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.empty_cache = lambda: None
    sys.path.insert(0, "perf")
    import bench_prefill as b

    # The GPU-only pieces, stood in for on the CPU: timing, the SDPA backends, FLASH with lse.
    from benchutil import BenchGPU
    b.start_bench = lambda name, **kw: BenchGPU(torch.device("cpu"), b.device_name(torch.device("cpu")), None, 1000.0)
    b.time_ms = lambda fn, *a, **k: (fn(), 1.0)[1]
    tna.sdpa_kernel = lambda *a, **k: contextlib.nullcontext()

    def flash(q, k, v, p, causal, ret, scale=None):
        o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=scale)
        s = torch.einsum("bnid,bnjd->bnij", q.float(), k.float()) * scale
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        return o.to(q.dtype), torch.logsumexp(s, -1)

    torch.ops.aten._scaled_dot_product_flash_attention = flash
    b.DTYPE = torch.float16  # bf16 dots are wrong in the interpreter
    S = b.PrefillShape
    b.SHAPES = b.QUICK = [S((40, 40), 2, name="2x40 N=2"), S((17, 70, 5), 2, name="varlen N=2")]
    b.REF_CASE = b.PrefillShape((30, 0, 7), 2, lk=(41, 3, 7))
    real_ctx = b.ContextCase
    b.ContextCase = lambda new, ctx, n, N, dev: real_ctx(48, 64, n, 2, dev)
    if len(sys.argv) > 2:  # --break: ours writes a wrong out; its checks must say so
        real_ours = b.Case.ours
        b.Case.ours = lambda self, config=None: (real_ours(self, config), self.out.add_(0.5))
    sys.argv = ["bench_prefill.py", "--quick", "--no-graphs", "--context", "--out", sys.argv[1],
                "--aiter-peers", ".peers/aiter"]
    sys.exit(b.main())
"""


def test_cpu_smoke_run_of_the_whole_script(tmp_path):
    """The full --quick --context flow on the CPU (interpreter, float16, tiny shapes, timing and
    SDPA stood in for): a GPU run must not die on a typo. Every correctness check in the run must
    pass (no WRONG / DISAGREE); the CSV perf/bench.py reads must hold both kernels' rows, ours with
    its launch config."""
    out = tmp_path / "out"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SMOKE), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "WRONG" not in log and "DISAGREE" not in log and "failed" not in log, log
    assert "mla_prefill_with_context vs the upstream" in log
    if HAS_AITER:
        assert "aiter ok" in log and "aiter-tile ok" in log and "aiter unavailable" not in log, log
    assert "ours ok" in log and "cuDNN ok" in log and "FLASH ok" in log and "upstream ok" in log, log
    assert "out vs cuDNN" in log, log
    with (out / "prefill.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    kernels = {r["kernel"] for r in rows}
    assert {"mla_prefill", "mla_prefill_with_context", "matmul"} <= kernels, kernels
    assert any(r["shape"].endswith("in 4 chunks") for r in rows)
    ours = [r for r in rows if r["kernel"] == "mla_prefill" and r["provider"] == "ours"]
    assert ours and all(r["config"] for r in ours)


def test_cpu_smoke_run_names_a_wrong_kernel(tmp_path):
    """The same run with ours writing out + 0.5: every shape's check of ours fails against float32
    and against cuDNN (WRONG, DISAGREE: perf/bench.py then fails the run)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SMOKE), str(tmp_path / "out"), "--break"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert log.count("ours WRONG (out:") == 2 and log.count("out vs cuDNN") == 2 and "DISAGREE" in log, log


def test_cpu_smoke_run_of_the_geometry_table(tmp_path):
    """--geometry on the CPU as the smoke run above: GLM-4.x-Lite's 192/64/256 and the no-RoPE
    256/0/256 (k = k_nope, no k_pe) through every provider, each checked against float32 before
    timing; the CSV rows carry each geometry's launch config."""
    out = tmp_path / "out"
    code = textwrap.dedent(SMOKE).replace(
        'b.SHAPES = b.QUICK = [S((40, 40), 2, name="2x40 N=2"), S((17, 70, 5), 2, name="varlen N=2")]',
        'b.GEOMETRY_QUICK = [S((40, 40), 2, name="2x40 N=2 192/64/256", dims=(192, 64, 256)),'
        ' S((17, 70, 5), 2, name="varlen N=2 256/0/256", dims=(256, 0, 256))]',
    )
    code = code.replace('"--context", "--out"', '"--geometry", "--out"')
    assert "GEOMETRY_QUICK" in code and "--geometry" in code
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "WRONG" not in log and "DISAGREE" not in log, log
    for prov in ("ours", "cuDNN", "FLASH", "upstream"):
        assert log.count(f"{prov} ok") == 2, log
    with (out / "prefill.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kernel"] == "mla_prefill" and r["provider"] == "ours"]
    assert {r["shape"] for r in rows} == {"2x40 N=2 192/64/256", "varlen N=2 256/0/256"}
    assert all(r["config"] for r in rows)
