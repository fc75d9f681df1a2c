"""perf/profile_*.py: the drivers a profiler attaches to run end to end on the CPU (interpreter,
float16, a tiny shape; the GPU preamble stood in for), so a device call is not spent on a typo."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PREFILL = """
    import sys, torch
    sys.path.insert(0, "perf")
    import bench_prefill as b
    import profile_prefill as p
    from rocm_mla.tools.benchutil import BenchGPU
    b.DTYPE = torch.float16  # bf16 dots are wrong in the interpreter
    from rocm_mla.cases import Comparison
    from rocm_mla.cases.prefill import PrefillShape
    p.SHAPES[:] = [PrefillShape((40, 40), 2, name="2x40 N=2"), PrefillShape((17, 70, 5), 2, name="varlen N=2")]
    b.REF_CASE = PrefillShape((30, 0, 7), 2, lk=(41, 3, 7))  # bench_prefill's check, at a CPU size
    p.start_bench = lambda name, **kw: BenchGPU(torch.device("cpu"), "cpu")
    if "--break-ref" in sys.argv:  # a check that fails: the run must stop before profiling
        sys.argv.remove("--break-ref")
        p.check_against_reference = lambda dev, cfg: [Comparison("out", 0.5, 0.5, "out: relative norm error 0.5")]
    sys.argv = ["profile_prefill.py", "--shape", sys.argv[1], "--calls", "2"] + sys.argv[2:]
    sys.exit(p.main())
"""


def _run(*args):
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-c", textwrap.dedent(PREFILL), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_profile_prefill_runs_and_checks_its_output():
    proc = _run("varlen N=2")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "varlen N=2: config=default rel. error" in log
    assert "call 0:" in log and "call 1:" in log


def test_profile_prefill_takes_a_config_and_names_a_bad_one():
    cfg = '{"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}'
    proc = _run("2x40 N=2", "--config", cfg)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "config={'BLOCK_M': 16" in proc.stdout
    bad = _run("2x40 N=2", "--config", '{"BLOCK_M": 16}')  # no BLOCK_N: the wrapper names it
    assert bad.returncode != 0 and "BLOCK_N" in bad.stdout + bad.stderr


def test_profile_prefill_refuses_to_profile_a_wrong_result():
    proc = _run("2x40 N=2", "--break-ref")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error too large" in proc.stderr and "call 0:" not in proc.stdout
