"""perf/profile_*.py and perf/bench_decode.py: the drivers a profiler attaches to, and the decode
benchmark, run end to end on the CPU (interpreter, float16, tiny shapes; the GPU preamble and timers
stood in for), so a device call is not spent on a typo."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PREFILL = """
    import sys, torch
    sys.path.insert(0, "perf")
    import bench_prefill as b
    import profile_prefill as p
    from benchutil import BenchGPU
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


DECODE_BENCH = """
    import sys, types, torch
    sys.path.insert(0, "perf")
    import bench_decode as b
    from rocm_mla.cases import decode
    from benchutil import BenchGPU
    from rocm_mla.tools.timing import wall_ms
    b.start_bench = lambda name, **kw: BenchGPU(torch.device("cpu"), "cpu", 100.0, 1000.0)
    props = types.SimpleNamespace(multi_processor_count=4, L2_cache_size=1 << 20)
    torch.cuda.get_device_properties = lambda dev: props
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.empty_cache = lambda: None
    b.cold_cache_bytes = lambda dev: 1 << 16  # a few copies of each tiny shape
    b.rotating_graph_us = lambda fn, R: 1e3 * wall_ms(lambda: [fn(i) for i in range(R)]) / R
    b.time_ms = lambda fn, **k: wall_ms(fn)
    b.DTYPE = torch.float16  # bf16 dots are wrong in the interpreter
    decode.SHAPES["serving"] = [decode.DecodeShape(3, 80, 16), decode.DecodeShape(2, 80, 16, 2),
                                decode.DecodeShape(3, 80, 16, kv="fp8")]
    if "--break" in sys.argv:  # a kernel that writes a wrong out: every shape must say WRONG
        sys.argv.remove("--break")
        real = b.ours
        b.ours = lambda s, *mode: (lambda i, call=real(s, *mode): call(i).add_(0.5))
    out = sys.argv[1]
    sys.argv = ["bench_decode.py", "--preset", "serving", "--peers", "/nowhere", "--no-flashinfer", "--out", out]
    sys.exit(b.main())
"""


def _bench_decode(*args):
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-c", textwrap.dedent(DECODE_BENCH), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_bench_decode_runs_checks_and_writes_its_rows(tmp_path):
    """The serving flow on the CPU: inputs from rocm_mla.cases.decode (cold copies, fp8, MTP rows),
    the plan column, every output checked (no WRONG), the CSV rows keyed by the cases labels."""
    import csv

    proc = _bench_decode(str(tmp_path))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "WRONG" not in log, log
    assert "fp16 B=2 seq=80 N=16 q2 | S=" in log and "fp8 B=3 seq=80 N=16 | S=" in log, log
    with (tmp_path / "decode.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    shapes = {r["shape"] for r in rows if r["kernel"] == "mla_decode" and r["provider"] == "rocm_mla-triton"}
    assert shapes == {"fp16 B=3 seq=80 N=16", "fp16 B=2 seq=80 N=16 q2", "fp8 B=3 seq=80 N=16"}, shapes
    broken = _bench_decode(str(tmp_path / "broken"), "--break")
    assert broken.returncode == 0  # reported, not fatal: perf/bench.py fails a run that prints WRONG
    wrong = [line.split()[0] for line in broken.stdout.splitlines() if "rocm_mla-triton" in line and "WRONG" in line]
    # Each shape's default call, and the fp8 shape's two fp8_dots modes.
    assert sorted(wrong) == ["rocm_mla-triton"] * 3 + ["rocm_mla-triton-fp8all", "rocm_mla-triton-fp8qk"], (
        broken.stdout + broken.stderr
    )


def test_profile_decode_runs():
    code = """
    import sys, torch
    sys.path.insert(0, "perf")
    import profile_decode as p
    from benchutil import BenchGPU
    p.start_bench = lambda name, **kw: BenchGPU(torch.device("cpu"), "cpu")
    sys.argv = ["profile_decode.py", "--B", "2", "--seq", "80", "--N", "16", "--kv", "fp8", "--calls", "2"]
    sys.exit(p.main())
    """
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "fp8 B=2 seq=80 N=16 block=64: S=" in log and "call 1:" in log, log


INDEXER_LOOP = """
    import sys
    sys.path.insert(0, "perf")
    import profile_indexer_loop as p
    p.copy_bandwidth_gbs = lambda dev: 1000.0  # the CPU has no copy ceiling or event timer
    p.time_ms = lambda fn, **kw: (fn(), 1.0)[1]
    small = ["--rows", "2", "--keys", "1024", "--heads", "16", "--programs", "8"]
    print(f"OK rc={p.main(small)}", flush=True)
    p.fp8_dot_rtol = lambda dev: -1.0  # a tolerance no logits meet
    try:
        p.main(small + ["--no-op"])
    except SystemExit as e:
        print(f"BROKEN: {e}", flush=True)
"""


def test_profile_indexer_loop_runs_every_variant_and_checks_its_logits():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", textwrap.dedent(INDEXER_LOOP)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "OK rc=0" in log, log[-4000:]
    ok = log.split("OK rc=0")[0]
    kinds = ["strided, no dot", "position mask", "position + page mask", "2 a step, strided", "4 a step, strided"]
    kinds += ["8 warps", "contiguous", "_key_tile flat", "_key_tile shuffled"]
    kinds += ["mla_indexer_topk, shuffled cache, shipped", "mla_indexer_topk, flat cache, shipped"]
    for what in kinds:
        assert what in ok, (what, ok[-4000:])
    assert "BROKEN: plain 4 warps, 2 stages, NS 4, 1 a step, strided: row 0's logits differ" in log, log[-4000:]


COMPILE = """
    import sys
    sys.path.insert(0, "perf")
    import profile_indexer_loop as p
    every = p.loop_variants
    p.loop_variants = lambda arch, heads, ns: every(arch, heads, ns)[2:3]  # one compile: the op-like mask
    sys.exit(p.main(["--compile", "gfx942,sm90", "--heads", "16", "--rows", "2", "--keys", "1024"]))
"""


def test_profile_indexer_loop_compiles_its_loops():
    """--compile needs no GPU: the loop compiled ahead of time (gfx942, sm90) into the ISA report's
    rows and its main loop read back (AMDGCN, SASS)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler, not the interpreter
    cmd = [sys.executable, "-c", textwrap.dedent(COMPILE)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    for arch, fit in (("gfx942", "waves a SIMD"), ("sm90", "blocks an SM")):
        (line,) = [ln for ln in log.splitlines() if ln.startswith(arch)]
        assert "plain, position + page mask" in line and fit in line, line
        insns = int(line.split("loop: ")[1].split(" instructions")[0])
        assert insns > 20, line
    bad = subprocess.run(
        [sys.executable, "perf/profile_indexer_loop.py", "--compile", "gfx942,sm80"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert bad.returncode == 2 and "--compile takes gfx942, gfx950, sm90; got sm80" in bad.stderr, bad.stderr
