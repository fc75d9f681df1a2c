"""perf/serve_bench.py without a GPU: parsing of recorded `vllm bench serve` output, the comparison
table's math, the CSV rows, the commands it would run, and the run loop against a fake `vllm`.

The fixture tests/data/vllm_bench_serve_sample.txt is a verbatim copy of real outputs from the
upstream PRs (four result blocks, trailing spaces included).
"""

from __future__ import annotations

import csv
import importlib.util
import socket
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "vllm_bench_serve_sample.txt"


def _load():
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "perf" / "serve_bench.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["serve_bench"] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


sb = _load()


@pytest.fixture(scope="module")
def blocks():
    return sb.parse_serve_output(SAMPLE.read_text())


# --------------------------------------------------------------------------- parsing real output

# Every number of the four recorded blocks, as printed.
EXPECTED = [
    dict(
        completed=32,
        failed=0,
        max_concurrency=8,
        duration=10.14,
        total_input_tokens=32736,
        total_output_tokens=4096,
        request_throughput=3.16,
        output_throughput=404.01,
        max_output_tokens_per_s=488.00,
        max_concurrent_requests=16.00,
        total_token_throughput=3632.93,
        mean_ttft_ms=395.99,
        median_ttft_ms=346.76,
        p99_ttft_ms=711.16,
        mean_tpot_ms=16.83,
        median_tpot_ms=16.58,
        p99_tpot_ms=20.67,
        mean_itl_ms=16.83,
        median_itl_ms=16.47,
        p99_itl_ms=19.31,
    ),
    dict(
        completed=32,
        failed=0,
        max_concurrency=8,
        duration=10.12,
        total_input_tokens=32736,
        total_output_tokens=4096,
        request_throughput=3.16,
        output_throughput=404.60,
        max_output_tokens_per_s=488.00,
        max_concurrent_requests=16.00,
        total_token_throughput=3638.20,
        mean_ttft_ms=387.51,
        median_ttft_ms=336.47,
        p99_ttft_ms=707.50,
        mean_tpot_ms=16.87,
        median_tpot_ms=16.61,
        p99_tpot_ms=20.69,
        mean_itl_ms=16.90,
        median_itl_ms=16.53,
        p99_itl_ms=18.03,
    ),
    dict(
        completed=64,
        failed=0,
        max_concurrency=64,
        duration=64.74,
        total_input_tokens=229312,
        total_output_tokens=65536,
        request_throughput=0.99,
        output_throughput=1012.31,
        max_output_tokens_per_s=1664.00,
        max_concurrent_requests=64.00,
        total_token_throughput=4554.42,
        mean_ttft_ms=13440.84,
        median_ttft_ms=13691.91,
        p99_ttft_ms=23198.25,
        mean_tpot_ms=50.01,
        median_tpot_ms=49.77,
        p99_tpot_ms=60.45,
        mean_itl_ms=50.01,
        median_itl_ms=40.45,
        p99_itl_ms=46.96,
    ),
    dict(
        completed=64,
        failed=0,
        max_concurrency=64,
        duration=63.03,
        total_input_tokens=229312,
        total_output_tokens=65536,
        request_throughput=1.02,
        output_throughput=1039.81,
        max_output_tokens_per_s=1685.00,
        max_concurrent_requests=64.00,
        total_token_throughput=4678.13,
        mean_ttft_ms=13330.10,
        median_ttft_ms=13578.90,
        p99_ttft_ms=23058.80,
        mean_tpot_ms=48.45,
        median_tpot_ms=48.21,
        p99_tpot_ms=58.89,
        mean_itl_ms=48.45,
        median_itl_ms=38.99,
        p99_itl_ms=46.28,
    ),
]


def test_parses_every_recorded_block_exactly(blocks):
    assert len(blocks) == 4
    for got, want in zip(blocks, EXPECTED):
        # Same keys (nothing unknown, nothing dropped) and the printed numbers, exactly.
        assert got == {k: float(v) for k, v in want.items()}


def test_named_numbers(blocks):
    assert blocks[0]["mean_ttft_ms"] == 395.99
    assert blocks[0]["output_throughput"] == 404.01
    assert blocks[3]["p99_itl_ms"] == 46.28


def test_parse_single_result_needs_exactly_one_block(blocks):
    text = SAMPLE.read_text()
    one = text[text.index("============ Serving") : text.index("=" * 50) + 50]
    assert sb.parse_single_result(one) == blocks[0]
    with pytest.raises(sb.ServeBenchParseError, match="expected one result block.*found 4"):
        sb.parse_single_result(text)


# vLLM 0.33's own format (vllm/benchmarks/serve.py print statements, constructed here: no recorded
# 0.33 run exists): "Total token throughput" in lower case, a configured request rate, extra
# percentiles, an E2EL section, a speculative-decoding section, and log lines interleaved.
V033 = textwrap.dedent("""\
    INFO 11-29 10:00:00 [serve.py:500] Starting main benchmark run...
    ============ Serving Benchmark Result ============
    Successful requests:                     32        
    Failed requests:                         0         
    Maximum request concurrency:             8         
    Request rate configured (RPS):           4.00      
    Benchmark duration (s):                  9.87      
    Total input tokens:                      32768     
    Total generated tokens:                  4096      
    Request throughput (req/s):              3.24      
    Output token throughput (tok/s):         415.00    
    Peak output token throughput (tok/s):    496.00    
    Peak concurrent requests:                9.00      
    Total token throughput (tok/s):          3735.00   
    WARNING 11-29 10:00:10 [api_server.py:90] client: disconnected
    ---------------Time to First Token----------------
    Mean TTFT (ms):                          380.25    
    Median TTFT (ms):                        330.00    
    P50 TTFT (ms):                           330.00    
    P99.9 TTFT (ms):                         700.10    
    -----Time per Output Token (excl. 1st token)------
    Mean TPOT (ms):                          16.50     
    Median TPOT (ms):                        16.40     
    P99 TPOT (ms):                           20.00     
    ---------------Inter-token Latency----------------
    Mean ITL (ms):                           16.55     
    Median ITL (ms):                         16.30     
    P99 ITL (ms):                            18.50     
    ----------------End-to-end Latency----------------
    Mean E2EL (ms):                          2476.00   
    Median E2EL (ms):                        2400.00   
    P99 E2EL (ms):                           3000.00   
    ---------------Speculative Decoding---------------
    Acceptance rate (%):                     71.25     
      Position 0:                            85.00     
    ==================================================
    """)


def test_parses_vllm_033_format_and_keeps_unknown_metrics():
    (r,) = sb.parse_serve_output(V033)
    assert r["total_token_throughput"] == 3735.0  # lower-case "token" label
    assert r["request_rate"] == 4.0
    assert r["p50_ttft_ms"] == 330.0 and r["p99.9_ttft_ms"] == 700.1
    assert r["mean_e2el_ms"] == 2476.0 and r["p99_e2el_ms"] == 3000.0
    assert r["acceptance_rate"] == 71.25 and r["position_0"] == 85.0  # unknown labels: slugs
    assert not any(k.startswith(("info", "warning")) for k in r)  # log lines ignored


# --------------------------------------------------------------------------- malformed output


@pytest.mark.parametrize(
    "text, match",
    [
        ("", r"no 'Serving Benchmark Result' block(.|\n)*\(empty output\)"),
        (
            "Traceback (most recent call last):\nRuntimeError: server died\n",
            r"no 'Serving Benchmark Result' block(.|\n)*RuntimeError: server died",
        ),
        (V033.replace("=" * 50 + "\n", ""), r"result block of line 2 is not closed"),
        (
            V033.replace(
                "Mean TTFT (ms):                          380.25", "Mean TTFT (ms):                          n/a"
            ),
            r"line 17: 'Mean TTFT \(ms\)' has value 'n/a', not a number",
        ),
        ("\n".join(ln for ln in V033.splitlines() if "TPOT" not in ln) + "\n", r"lacks mean_tpot_ms"),
        (V033.replace("Median ITL (ms):", "Mean ITL (ms):"), r"'Mean ITL \(ms\)' appears twice"),
        (V033.replace("=" * 50 + "\n", "") + V033, r"a new result block starts before the one of line 2"),
    ],
)
def test_malformed_output_raises_a_clear_error(text, match):
    with pytest.raises(sb.ServeBenchParseError, match=match):
        sb.parse_serve_output(text)


def test_parse_error_is_a_value_error():
    assert issubclass(sb.ServeBenchParseError, ValueError)


# --------------------------------------------------------------------------- table math


def test_pct_change():
    assert sb.pct_change(387.51, 395.99) == pytest.approx((387.51 - 395.99) / 395.99 * 100)
    assert sb.pct_change(110.0, 100.0) == pytest.approx(10.0)
    assert sb.pct_change(1.0, 0.0) is None
    assert sb.pct_change(float("nan"), 1.0) is None


def test_comparison_table(blocks):
    results = {"ROCM_MLA": blocks[1], "ROCM_AITER_MLA": blocks[3], "TRITON_MLA": blocks[0]}
    headers, rows = sb.comparison_table(results)
    assert headers == [
        "metric",
        "better",
        "ROCM_MLA",
        "ROCM_AITER_MLA",
        "TRITON_MLA",
        "ROCM_MLA vs TRITON_MLA",
        "ROCM_AITER_MLA vs TRITON_MLA",
    ]
    by = {r[0]: r for r in rows}
    # (387.51 - 395.99) / 395.99 = -2.14 %; (404.60 - 404.01) / 404.01 = +0.15 %
    assert by["Mean TTFT (ms)"] == ["Mean TTFT (ms)", "lower", "387.51", "13330.10", "395.99", "-2.14%", "+3266.27%"]
    assert by["Output tok/s"][1] == "higher"
    assert by["Output tok/s"][5] == "+0.15%"
    assert by["P99 ITL (ms)"][5] == "-6.63%"  # (18.03 - 19.31) / 19.31
    assert by["Successful requests"] == ["Successful requests", "-", "32", "64", "32", "-", "-"]  # counts: no %
    assert "gsm8k exact (strict)" not in by  # no backend has it: no row
    text = sb.format_table(headers, rows)
    assert text.splitlines()[0].split() == headers[:5] + [
        "ROCM_MLA",
        "vs",
        "TRITON_MLA",
        "ROCM_AITER_MLA",
        "vs",
        "TRITON_MLA",
    ]


def test_comparison_table_without_baseline_or_with_gaps(blocks):
    headers, rows = sb.comparison_table({"ROCM_MLA": blocks[1], "ROCM_AITER_MLA": blocks[3]})
    assert headers == ["metric", "better", "ROCM_MLA", "ROCM_AITER_MLA"]  # no baseline: no % columns
    partial = {k: v for k, v in blocks[0].items() if k != "p99_ttft_ms"}
    headers, rows = sb.comparison_table({"ROCM_MLA": blocks[1], "TRITON_MLA": partial})
    by = {r[0]: r for r in rows}
    assert by["P99 TTFT (ms)"] == ["P99 TTFT (ms)", "lower", "707.50", "-", "-"]


# --------------------------------------------------------------------------- CSV rows


def test_csv_rows(tmp_path, blocks):
    cfg = sb.Config(model="deepseek-ai/DeepSeek-V2.5", tp=8)
    results = {"ROCM_MLA": blocks[1], "TRITON_MLA": blocks[0]}
    records = sb.to_records(results, cfg, "AMD Instinct MI300X", "rocm_mla-0.1.0/vllm-0.33.0")
    assert len(records) == len(blocks[1]) + len(blocks[0])
    path = tmp_path / "serve.csv"
    sb.write_csv(path, records)
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["kernel", "provider", "shape", "metric", "value", "device", "version", "config"]
    row = next(r for r in rows if r["provider"] == "ROCM_MLA" and r["metric"] == "mean_ttft_ms")
    assert row == {
        "kernel": "vllm-serve",
        "provider": "ROCM_MLA",
        "shape": "DeepSeek-V2.5 tp8 random in1024/out128 n32 c8",
        "metric": "mean_ttft_ms",
        "value": "387.51",
        "device": "AMD Instinct MI300X",
        "version": "rocm_mla-0.1.0/vllm-0.33.0",
        "config": "",
    }
    got = {(r["provider"], r["metric"]): float(r["value"]) for r in rows}
    assert got[("TRITON_MLA", "output_throughput")] == 404.01
    assert got[("TRITON_MLA", "total_input_tokens")] == 32736


def test_shape_label_sharegpt():
    cfg = sb.Config(model="deepseek-ai/DeepSeek-V3/", sharegpt="/data/sg.json", num_prompts=64, concurrency=64)
    assert sb.shape_label(cfg) == "DeepSeek-V3 tp1 sharegpt out128 n64 c64"


# --------------------------------------------------------------------------- commands


def _after(cmd, flag):
    assert flag in cmd, f"{flag} missing from {cmd}"
    return cmd[cmd.index(flag) + 1]


def test_serve_and_bench_commands():
    cfg = sb.Config(model="deepseek-ai/DeepSeek-V3", tp=8, port=9020, serve_args=["--dtype", "bfloat16"])
    s = sb.serve_command(cfg, "ROCM_MLA")
    assert s[:3] == ["vllm", "serve", "deepseek-ai/DeepSeek-V3"]
    assert _after(s, "--attention-backend") == "ROCM_MLA"
    assert _after(s, "--tensor-parallel-size") == "8"
    assert _after(s, "--port") == "9020"
    assert s[-2:] == ["--dtype", "bfloat16"]  # extra arguments last: they override
    b = sb.bench_command(cfg, "logs", "ROCM_MLA")
    assert b[:3] == ["vllm", "bench", "serve"]
    assert _after(b, "--model") == "deepseek-ai/DeepSeek-V3"
    assert _after(b, "--dataset-name") == "random"
    assert (_after(b, "--random-input-len"), _after(b, "--random-output-len")) == ("1024", "128")
    assert (_after(b, "--num-prompts"), _after(b, "--max-concurrency")) == ("32", "8")
    assert _after(b, "--request-rate") == "inf" and "--ignore-eos" in b
    assert _after(b, "--result-filename") == "ROCM_MLA.json"


def test_sharegpt_and_lm_eval_commands():
    cfg = sb.Config(
        sharegpt="/data/ShareGPT_V3_unfiltered_cleaned_split.json", output_len=100, port=9010, ignore_eos=False
    )
    b = sb.bench_command(cfg)
    assert _after(b, "--dataset-name") == "sharegpt"
    assert _after(b, "--dataset-path") == cfg.sharegpt
    assert _after(b, "--sharegpt-output-len") == "100"
    assert "--random-input-len" not in b and "--ignore-eos" not in b and "--save-result" not in b
    e = sb.lm_eval_command(cfg)
    assert e[:5] == ["lm_eval", "--model", "local-completions", "--tasks", "gsm8k"]
    assert _after(e, "--model_args") == (
        f"model={cfg.model},base_url=http://127.0.0.1:9010/v1/completions,num_concurrent=30,max_retries=3"
    )
    assert _after(e, "--limit") == "100"


def test_server_env_puts_our_plugin_in_the_allow_list():
    assert sb.server_env({})["VLLM_PLUGINS"] == "rocm_mla"
    assert sb.server_env({"VLLM_PLUGINS": "lora"})["VLLM_PLUGINS"] == "lora,rocm_mla"
    assert sb.server_env({"VLLM_PLUGINS": "rocm_mla,x"})["VLLM_PLUGINS"] == "rocm_mla,x"
    assert sb.server_env({"VLLM_PLUGINS": ""})["VLLM_PLUGINS"] == "rocm_mla"
    assert sb.server_env({"A": "1"}, plugin="ours") == {"A": "1", "VLLM_PLUGINS": "ours"}


def test_dry_run_prints_every_command_and_runs_nothing(tmp_path, capsys, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("--dry-run started a process")

    monkeypatch.setattr(sb.subprocess, "Popen", refuse)
    monkeypatch.setattr(sb.subprocess, "run", refuse)
    out = tmp_path / "out"
    rc = sb.main(["--dry-run", "--tp", "8", "--model", "deepseek-ai/DeepSeek-V3", "--lm-eval", "--out", str(out)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    serve = [ln for ln in lines if ln.startswith("vllm serve ")]
    assert [_after(ln.split(), "--attention-backend") for ln in serve] == ["ROCM_MLA", "ROCM_AITER_MLA", "TRITON_MLA"]
    assert all("deepseek-ai/DeepSeek-V3" in ln and "--tensor-parallel-size 8" in ln for ln in serve)
    assert sum(ln.startswith("vllm bench serve ") for ln in lines) == 3
    assert sum(ln.startswith("lm_eval ") for ln in lines) == 3
    assert "VLLM_PLUGINS=rocm_mla" in lines[0]
    assert not out.exists()


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        sb.main(["--dry-run", "--backends", " , "])
    assert "no backend named" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sb.main(["--dry-run", "--concurrency", "0"])
    assert "--concurrency must be at least 1" in capsys.readouterr().err


# --------------------------------------------------------------------------- lm_eval output

# lm_eval's results table (format of lm_eval 0.4's make_table, constructed here with the MI300
# figure of the notes: no recorded lm_eval output is in the repository).
LM_EVAL = textwrap.dedent("""\
    local-completions (model=deepseek-ai/DeepSeek-V3,base_url=http://127.0.0.1:9010/v1/completions), gen_kwargs: (None), limit: 100.0, num_fewshot: None, batch_size: 1
    |Tasks|Version|     Filter     |n-shot|  Metric   |   |Value |   |Stderr|
    |-----|------:|----------------|-----:|-----------|---|-----:|---|-----:|
    |gsm8k|      3|flexible-extract|     5|exact_match|↑  |0.9462|±  |0.0227|
    |     |       |strict-match    |     5|exact_match|↑  |0.9400|±  |0.0239|

    """)


def test_parse_lm_eval():
    assert sb.parse_lm_eval_output(LM_EVAL) == {
        "gsm8k_exact_match_flexible_extract": 0.9462,
        "gsm8k_exact_match_strict_match": 0.94,
    }
    with pytest.raises(sb.ServeBenchParseError, match="no gsm8k exact_match row"):
        sb.parse_lm_eval_output("lm_eval: connection refused\n")
    with pytest.raises(sb.ServeBenchParseError, match="not a number"):
        sb.parse_lm_eval_output(LM_EVAL.replace("0.9462", "N/A"))


# --------------------------------------------------------------------------- the run loop, with a fake vllm

FAKE_VLLM = """\
import http.server, os, signal, sys
args = sys.argv[1:]
if args[:1] == ["serve"]:
    backend = args[args.index("--attention-backend") + 1]
    assert "rocm_mla" in os.environ["VLLM_PLUGINS"].split(","), os.environ.get("VLLM_PLUGINS")
    if backend == "BROKEN":
        print("ValueError: Selected backend BROKEN is not valid", flush=True)
        sys.exit(1)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), H)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    srv.timeout = 0.2
    for _ in range(600):  # bounded: 2 minutes at most
        srv.handle_request()
elif args[:2] == ["bench", "serve"]:
    label = args[args.index("--result-filename") + 1]
    text = open(os.environ["FAKE_SAMPLE"]).read()
    blocks = text.split("============ Serving Benchmark Result ============")
    pick = 2 if label.startswith("ROCM_MLA") else 1  # ROCM_MLA: the second recorded block
    print("============ Serving Benchmark Result ============" + blocks[pick].split("## ")[0].rstrip())
else:
    sys.exit(f"fake vllm: unexpected arguments {args}")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_loop_against_a_fake_vllm(tmp_path, monkeypatch, capsys, blocks):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_VLLM)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_SAMPLE", str(SAMPLE))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(sb, "HEALTH_POLL_S", 0.1)
    monkeypatch.setattr(sb, "_device_name", lambda: "fake-gpu")
    out = tmp_path / "out"
    port = _free_port()
    rc = sb.main(
        [
            "--backends",
            "ROCM_MLA,BROKEN,TRITON_MLA",
            "--port",
            str(port),
            "--out",
            str(out),
            "--startup-timeout",
            "60",
            "--bench-timeout",
            "60",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 1  # BROKEN failed: the run says so
    assert "BROKEN: the server exited (1) before /health answered" in captured.err
    assert "Selected backend BROKEN is not valid" in captured.err  # the server log's tail is shown
    with (out / "serve.csv").open() as f:
        rows = list(csv.DictReader(f))
    got = {(r["provider"], r["metric"]): float(r["value"]) for r in rows}
    assert {p for p, _ in got} == {"ROCM_MLA", "TRITON_MLA"}
    assert got[("ROCM_MLA", "mean_ttft_ms")] == blocks[1]["mean_ttft_ms"]
    assert got[("TRITON_MLA", "mean_ttft_ms")] == blocks[0]["mean_ttft_ms"]
    assert all(r["device"] == "fake-gpu" for r in rows)
    table = (out / "serve_table.txt").read_text()
    assert "ROCM_MLA vs TRITON_MLA" in table and "-2.14%" in table
    for b in ("ROCM_MLA", "BROKEN", "TRITON_MLA"):
        assert (out / "serve_logs" / f"{b}.server.log").exists()
    assert sb._port_free("127.0.0.1", port)  # every server was stopped


# --------------------------------------------------------------------------- docker/serve.sh (dry run)


def _serve_sh(env: dict[str, str], *args: str) -> list[str]:
    import os
    import subprocess

    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "MODEL", "TP", "ATTENTION"))}
    proc = subprocess.run(
        ["bash", str(ROOT / "docker" / "serve.sh"), *args],
        env={**base, **env, "DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_serve_sh_defaults_to_rocm_mla():
    """ROCM_MLA; VLLM_PLUGINS left unset (every installed plugin loads, ours among them); the
    model's own context length and no remote code unless asked."""
    plugins, cmd = _serve_sh({})
    assert plugins == "VLLM_PLUGINS=(unset: every installed plugin)"
    argv = cmd.split()
    assert not {"--max-model-len", "--trust-remote-code"} & set(argv)
    _, cmd = _serve_sh({"MAX_MODEL_LEN": "32768", "TRUST_REMOTE_CODE": "1"})
    assert _after(cmd.split(), "--max-model-len") == "32768" and "--trust-remote-code" in cmd.split()
    assert argv[:3] == ["vllm", "serve", "deepseek-ai/DeepSeek-V2-Lite-Chat"]
    assert _after(argv, "--attention-backend") == "ROCM_MLA"
    assert _after(argv, "--tensor-parallel-size") == "1" and _after(argv, "--port") == "8000"


def test_serve_sh_environment_and_arguments():
    plugins, cmd = _serve_sh(
        {
            "MODEL": "deepseek-ai/DeepSeek-V3",
            "TP": "8",
            "PORT": "9020",
            "ATTENTION_BACKEND": "TRITON_MLA",
            "VLLM_PLUGINS": "lora",
            "VLLM_EXTRA_ARGS": "--dtype bfloat16",
        },
        "--max-num-seqs",
        "64",
    )
    assert plugins == "VLLM_PLUGINS=lora,rocm_mla"
    argv = cmd.split()
    assert _after(argv, "serve") == "deepseek-ai/DeepSeek-V3"
    assert (_after(argv, "--tensor-parallel-size"), _after(argv, "--port")) == ("8", "9020")
    assert _after(argv, "--attention-backend") == "TRITON_MLA"
    assert argv[-4:] == ["--dtype", "bfloat16", "--max-num-seqs", "64"]  # extra, then arguments: last wins
    _, cmd = _serve_sh({"ATTENTION_BACKEND": "", "MAX_MODEL_LEN": "", "TRUST_REMOTE_CODE": "0"})
    assert not {"--attention-backend", "--max-model-len", "--trust-remote-code"} & set(cmd.split())


FUSE_FLAGS = ["-cc.use_inductor_graph_partition=true", "-cc.pass_config.fuse_rope_kvcache_cat_mla=true"]


def test_serve_sh_turns_the_fused_rope_kv_write_on_for_rocm_mla():
    """The fuse_rope_kvcache_cat_mla pass flags (what vLLM makes of them: tests/vllm_backend/test_vllm_fused_rope_kv.py),
    before VLLM_EXTRA_ARGS and the arguments, so a later -cc.* flag overrides them."""
    _, cmd = _serve_sh({"VLLM_EXTRA_ARGS": "--dtype bfloat16"}, "-cc.pass_config.fuse_rope_kvcache_cat_mla=false")
    argv = cmd.split()
    i = argv.index(FUSE_FLAGS[0])
    assert argv[i : i + 2] == FUSE_FLAGS and argv[i + 2 :] == [
        "--dtype",
        "bfloat16",
        "-cc.pass_config.fuse_rope_kvcache_cat_mla=false",
    ]
    for env in ({"ROCM_MLA_FUSE_ROPE_KV": "0"}, {"ATTENTION_BACKEND": "TRITON_MLA"}, {"ATTENTION_BACKEND": ""}):
        _, cmd = _serve_sh(env)
        assert not set(FUSE_FLAGS) & set(cmd.split()), env


def test_serve_sh_leaves_a_json_compilation_config_alone():
    """vLLM 0.33 drops a JSON --compilation-config / -cc when dotted -cc.* flags come too: serve.sh
    then adds none and says which keys to put in the JSON."""
    import os
    import subprocess

    for args in (["--compilation-config", '{"cudagraph_mode": "PIECEWISE"}'], ["-cc={}"]):
        _, cmd = _serve_sh({}, *args)
        assert not set(FUSE_FLAGS) & set(cmd.split())
        base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "MODEL", "TP", "ATTENTION"))}
        proc = subprocess.run(
            ["bash", str(ROOT / "docker" / "serve.sh"), *args],
            env={**base, "DRY_RUN": "1"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert '"fuse_rope_kvcache_cat_mla": true' in proc.stderr
