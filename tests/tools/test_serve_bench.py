"""perf/serve_bench.py without a GPU: the commands it runs (profiles, concurrency sweep, aiter and
fusion settings), reading vLLM's result JSON, the sweep tables, the accuracy gate, the CSV rows, and
the run loop against a fake `vllm`; docker/serve.sh's command line.

The fixture tests/data/vllm_bench_serve_result.json is a result in the form `vllm bench serve
--save-result` writes it (vLLM 0.34's keys), with the numbers of a recorded run.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import socket
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULT = Path(__file__).resolve().parents[1] / "data" / "vllm_bench_serve_result.json"


def _load():
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "perf" / "serve_bench.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["serve_bench"] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


sb = _load()


def _after(cmd, flag):
    assert flag in cmd, f"{flag} missing from {cmd}"
    return cmd[cmd.index(flag) + 1]


# --------------------------------------------------------------------------- vLLM's result JSON


def test_reads_every_number_of_the_result_json():
    m = sb.read_result(RESULT)
    assert m["output_throughput"] == 404.01 and m["median_ttft_ms"] == 346.76 and m["p99_itl_ms"] == 19.31
    assert m["completed"] == 32 and m["failed"] == 0 and m["max_concurrency"] == 8 and m["p90_e2el_ms"] == 2790.4
    assert "model_id" not in m and "request_goodput" not in m  # text and null are not numbers


def test_a_result_that_is_not_one_is_refused(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text("{not json")
    with pytest.raises(sb.ServeBenchParseError, match="not a readable result JSON"):
        sb.read_result(bad)
    data = json.loads(RESULT.read_text())
    del data["median_tpot_ms"]
    bad.write_text(json.dumps(data))
    with pytest.raises(sb.ServeBenchParseError, match="no median_tpot_ms"):
        sb.read_result(bad)
    with pytest.raises(sb.ServeBenchParseError):
        sb.read_result(tmp_path / "missing.json")


# --------------------------------------------------------------------------- commands


def test_profiles_and_the_sweep_commands():
    """amd: 8192 in / 1024 out, concurrency 4..128, 4 prompts a slot (>= 32), one warm-up request
    a slot; each point saves its JSON under its own name; ROCM_MLA alone gets the fusion flags."""
    cfg = sb.Config()
    assert (cfg.profile.input_len, cfg.profile.output_len) == (8192, 1024)
    assert cfg.profile.concurrencies == (4, 8, 16, 32, 64, 128)
    assert [cfg.num_prompts(c) for c in (4, 8, 128)] == [32, 32, 512]
    b = sb.bench_command(cfg, 64, "logs", "ROCM_MLA.c64")
    assert _after(b, "--max-concurrency") == "64" and _after(b, "--num-prompts") == "256"
    assert _after(b, "--num-warmups") == "64" and _after(b, "--random-input-len") == "8192"
    assert _after(b, "--random-output-len") == "1024" and "--ignore-eos" in b
    assert _after(b, "--result-filename") == "ROCM_MLA.c64.json" and "--save-result" in b
    ours, theirs = sb.serve_command(cfg, "ROCM_MLA"), sb.serve_command(cfg, "ROCM_AITER_MLA")
    assert set(sb.FUSE_FLAGS) <= set(ours) and not set(sb.FUSE_FLAGS) & set(theirs)
    assert "--max-model-len" not in ours and "--trust-remote-code" not in ours  # the model's own, no remote code
    assert "--no-enable-prefix-caching" in ours
    off = sb.Config(fuse=False)
    assert not set(sb.FUSE_FLAGS) & set(sb.serve_command(off, "ROCM_MLA"))
    json_cc = sb.Config(serve_args=["--compilation-config", '{"cudagraph_mode": "FULL"}'])
    assert not set(sb.FUSE_FLAGS) & set(sb.serve_command(json_cc, "ROCM_MLA"))  # vLLM would drop the JSON
    smoke = sb.PROFILES["smoke"]
    assert (smoke.input_len, smoke.output_len, smoke.concurrencies) == (1024, 128, (8,))
    share = sb.Config(sharegpt="sg.json", profile=smoke)
    assert _after(sb.bench_command(share, 8, "l", "x"), "--dataset-path") == "sg.json"
    assert sb.shape_label(share, 8) == "DeepSeek-V3 tp8 sharegpt out128 c8 n32"


def test_server_env_aiter_and_plugins():
    """aiter on for every backend by default (only attention differs), or for the aiter backends
    only, or never; an unset VLLM_PLUGINS stays unset, a list without ours gets it."""
    assert sb.server_env({}, "ROCM_MLA") == {"VLLM_ROCM_USE_AITER": "1"}
    assert sb.server_env({}, "TRITON_MLA", "backend")["VLLM_ROCM_USE_AITER"] == "0"
    assert sb.server_env({}, "ROCM_AITER_TRITON_MLA", "backend")["VLLM_ROCM_USE_AITER"] == "1"
    assert sb.server_env({"VLLM_ROCM_USE_AITER": "1"}, "ROCM_AITER_MLA", "none")["VLLM_ROCM_USE_AITER"] == "0"
    assert sb.server_env({"VLLM_PLUGINS": "lora"}, "ROCM_MLA")["VLLM_PLUGINS"] == "lora,rocm_mla"
    assert sb.server_env({"VLLM_PLUGINS": "rocm_mla,x"}, "ROCM_MLA")["VLLM_PLUGINS"] == "rocm_mla,x"
    with pytest.raises(ValueError, match="aiter: expected one of all, backend, none"):
        sb.server_env({}, "ROCM_MLA", "some")


def test_lm_eval_command():
    cmd = sb.lm_eval_command(sb.Config(port=9010, lm_eval_limit=100))
    assert cmd[:5] == ["lm_eval", "--model", "local-completions", "--tasks", "gsm8k"]
    assert _after(cmd, "--limit") == "100" and "base_url=http://127.0.0.1:9010/v1/completions" in cmd[6]
    assert "--limit" not in sb.lm_eval_command(sb.Config())  # every question by default


def test_dry_run_prints_every_command_and_runs_nothing(tmp_path, capsys, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("--dry-run started a process")

    monkeypatch.setattr(sb.subprocess, "Popen", refuse)
    monkeypatch.setattr(sb.subprocess, "run", refuse)
    out = tmp_path / "out"
    rc = sb.main(["--dry-run", "--concurrency", "16,64", "--lm-eval", "--aiter", "backend", "--out", str(out)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    serve = [ln for ln in lines if ln.startswith("vllm serve ")]
    assert [_after(ln.split(), "--attention-backend") for ln in serve] == list(sb.BACKENDS)
    assert sum(ln.startswith("vllm bench serve ") for ln in lines) == 2 * len(sb.BACKENDS)
    assert sum(ln.startswith("lm_eval ") for ln in lines) == len(sb.BACKENDS)
    envs = [ln for ln in lines if ln.startswith("# ")]
    assert "VLLM_ROCM_USE_AITER=0" in envs[0] and "VLLM_ROCM_USE_AITER=1" in envs[1]
    assert not out.exists()


def test_bad_arguments_are_refused(capsys):
    for argv, msg in (
        (["--backends", " , "], "no backend named"),
        (["--concurrency", "8,x"], "--concurrency: expected comma-separated integers"),
        (["--concurrency", "0"], "--concurrency: expected integers >= 1"),
        (["--profile", "long"], "invalid choice: 'long'"),
        (["--tp", "0"], "--tp must be at least 1"),
    ):
        with pytest.raises(SystemExit):
            sb.main(["--dry-run", *argv])
        assert msg in capsys.readouterr().err


# --------------------------------------------------------------------------- tables, gate, rows


def _results():
    base = sb.read_result(RESULT)
    faster = {**base, "output_throughput": 505.0, "median_ttft_ms": 300.0}
    return {"ROCM_MLA": {8: faster, 64: faster}, "TRITON_MLA": {8: base}}


def test_sweep_tables():
    tables = dict((t, (h, r)) for t, h, r in sb.sweep_tables(_results()))
    h, rows = tables["output tokens/s (higher is better)"]
    assert h == ["concurrency", "ROCM_MLA", "TRITON_MLA", "ROCM_MLA vs TRITON_MLA"]
    assert rows == [["8", "505.00", "404.01", "+25.0%"], ["64", "505.00", "-", "-"]]
    assert tables["median TTFT (ms) (lower is better)"][1][0][-1] == "-13.5%"
    assert sb.sweep_tables({"ROCM_MLA": {8: sb.read_result(RESULT)}})[0][1] == ["concurrency", "ROCM_MLA"]
    assert sb.pct_change(1.0, 0.0) is None and sb.pct_change(float("nan"), 1.0) is None


def test_accuracy_gate():
    acc = {
        "TRITON_MLA": {"gsm8k_exact_match_flexible_extract": 0.94},
        "ROCM_MLA": {"gsm8k_exact_match_flexible_extract": 0.935},
        "ROCM_AITER_MLA": {"gsm8k_exact_match_flexible_extract": 0.90},
    }
    problems = sb.accuracy_problems(acc, gate=0.02)
    assert list(problems) == ["ROCM_AITER_MLA"] and "0.0400 below TRITON_MLA's 0.9400" in problems["ROCM_AITER_MLA"]
    assert sb.accuracy_problems({"ROCM_MLA": {"gsm8k_exact_match_flexible_extract": 0.1}}) == {}  # no baseline


def test_csv_rows_and_report(tmp_path):
    cfg = sb.Config(profile=sb.PROFILES["smoke"])
    acc = {"ROCM_MLA": {"gsm8k_exact_match_flexible_extract": 0.95}}
    recs = sb.to_records(_results(), acc, cfg, "AMD Instinct MI300X", "rocm_mla-0.1.0/vllm-0.34.0")
    shapes = {r.shape for r in recs}
    assert shapes == {"DeepSeek-V3 tp8 random in1024/out128 c8 n32", "DeepSeek-V3 tp8 random in1024/out128 c64 n256",
                      "DeepSeek-V3 tp8 gsm8k"}  # fmt: skip
    assert all(r.device == "AMD Instinct MI300X" and r.kernel == "vllm-serve" for r in recs)
    text = sb.report_text(cfg, "AMD Instinct MI300X", "v", _results(), acc)
    assert text.startswith("# deepseek-ai/DeepSeek-V3 tp8 on AMD Instinct MI300X (v)")
    assert "profile smoke: random, in 1024 / out 128 tokens, aiter all, ROCM_MLA fusion on" in text
    assert "gsm8k (lm_eval, 5-shot)" in text and "0.9500" in text


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
import http.server, json, os, signal, sys
args = sys.argv[1:]
if args[:1] == ["serve"]:
    backend = args[args.index("--attention-backend") + 1]
    assert os.environ["VLLM_ROCM_USE_AITER"] == "1", os.environ.get("VLLM_ROCM_USE_AITER")
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
    res = json.load(open(os.environ["FAKE_RESULT"]))
    res["max_concurrency"] = int(args[args.index("--max-concurrency") + 1])
    if label.startswith("ROCM_MLA"):
        res["output_throughput"] *= 1.25
    print("Serving Benchmark Result (printed text, never parsed)")
    d = args[args.index("--result-dir") + 1]
    json.dump(res, open(os.path.join(d, label), "w"))
else:
    sys.exit(f"fake vllm: unexpected arguments {args}")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_loop_against_a_fake_vllm(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_VLLM)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_RESULT", str(RESULT))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(sb, "HEALTH_POLL_S", 0.1)
    monkeypatch.setattr(sb, "_device_name", lambda: "fake-gpu")
    out = tmp_path / "out"
    port = _free_port()
    argv = ["--backends", "ROCM_MLA,BROKEN,TRITON_MLA", "--profile", "smoke", "--concurrency", "8,16"]
    argv += ["--port", str(port), "--out", str(out), "--startup-timeout", "60", "--bench-timeout", "60"]
    rc = sb.main(argv)
    captured = capsys.readouterr()
    assert rc == 1  # BROKEN failed: the run says so
    assert "BROKEN: the server exited (1) before /health answered" in captured.err
    assert "Selected backend BROKEN is not valid" in captured.err  # the server log's tail is shown
    assert "[2/2] concurrency 16, 64 prompts" in captured.out
    with (out / "serve.csv").open() as f:
        rows = list(csv.DictReader(f))
    got = {(r["provider"], r["shape"].split()[-2], r["metric"]): float(r["value"]) for r in rows}
    assert {p for p, _, _ in got} == {"ROCM_MLA", "TRITON_MLA"}
    assert got[("ROCM_MLA", "c16", "max_concurrency")] == 16
    assert got[("ROCM_MLA", "c8", "output_throughput")] == pytest.approx(404.01 * 1.25)
    assert got[("TRITON_MLA", "c8", "median_ttft_ms")] == 346.76
    assert all(r["device"] == "fake-gpu" for r in rows)
    table = (out / "serve_table.txt").read_text()
    assert "ROCM_MLA vs TRITON_MLA" in table and "+25.0%" in table and "on fake-gpu" in table
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


def test_serve_sh_merges_the_fusion_into_a_json_compilation_config():
    """vLLM drops a JSON --compilation-config / -cc when dotted -cc.* flags come too: serve.sh adds
    no dotted flag and merges the two keys into the JSON instead, the JSON's own values winning; a
    -cc that is not a JSON object is left alone with a note."""
    import os
    import shlex
    import subprocess

    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "MODEL", "TP", "ATTENTION"))}

    def run(*args):
        proc = subprocess.run(
            ["bash", str(ROOT / "docker" / "serve.sh"), *args],
            env={**base, "DRY_RUN": "1"}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return shlex.split(proc.stdout.splitlines()[-1]), proc.stderr

    argv, _ = run("--compilation-config", '{"cudagraph_mode": "PIECEWISE"}')
    assert not set(FUSE_FLAGS) & set(argv)
    cc = json.loads(_after(argv, "--compilation-config"))
    assert cc == {"cudagraph_mode": "PIECEWISE", "use_inductor_graph_partition": True,
                  "pass_config": {"fuse_rope_kvcache_cat_mla": True}}  # fmt: skip
    argv, _ = run('-cc={"pass_config": {"fuse_rope_kvcache_cat_mla": false}}')
    (cc_arg,) = [a for a in argv if a.startswith("-cc=")]
    assert json.loads(cc_arg[4:])["pass_config"] == {"fuse_rope_kvcache_cat_mla": False}  # the user's value wins
    argv, err = run("-cc", "3")
    assert _after(argv, "-cc") == "3" and "is not a JSON object" in err
