#!/usr/bin/env python3
"""Serving benchmark on an MI300: ROCM_MLA against what MI300 users run (ROCM_AITER_MLA and
ROCM_AITER_TRITON_MLA with aiter on, TRITON_MLA) under `vllm serve`, back to back, one server per
attention backend, everything else the same.

    python perf/serve_bench.py [--model M] [--tp N] [--profile amd|smoke] [--backends A,B,...]
                               [--lm-eval] [--out results] [--dry-run]

Profiles (the random dataset, EOS ignored, so every request generates its output length):
  amd    AMD's published method for MLA serving: long prompts (8192 tokens in) and 1K outputs, a
         concurrency sweep 4, 8, 16, 32, 64, 128 with 4 prompts per concurrent slot (at least 32),
         each point preceded by a warm-up of one request per slot that vLLM excludes
         (`vllm bench serve --num-warmups`). The default.
  smoke  1024 in, 128 out, concurrency 8, 32 prompts, 8 warm-up requests: a few minutes per backend.
--sharegpt FILE uses that dataset instead of random prompts.

Every server runs with VLLM_ROCM_USE_AITER=1 by default (--aiter all: aiter's MoE and GEMM kernels
for every backend, as MI300 deployments run, so that only attention differs; --aiter backend: only
for the ROCM_AITER_* backends; --aiter none: never). ROCM_MLA runs with the fused RoPE + KV-cache
write on, as the image serves it (-cc.use_inductor_graph_partition=true
-cc.pass_config.fuse_rope_kvcache_cat_mla=true; --no-fusion turns it off). Prefix caching is off.

Numbers come from vLLM's own result JSON (`--save-result`), never from its printed text.
--lm-eval also runs lm_eval gsm8k (5-shot exact_match) against each server after its sweep: the
accuracy gate fails a backend whose flexible-extract exact match is more than --accuracy-gate
(0.02) below TRITON_MLA's.

Writes, under --out:
  serve.csv            long format: kernel "vllm-serve", provider = backend, shape = model, TP,
                       profile lengths, concurrency, prompts; metrics named as in vLLM's JSON
  serve_table.txt      one table per metric of the sweep for this model and device (rows:
                       concurrency; columns: backends, then % change vs TRITON_MLA), gsm8k below
  serve_logs/          per backend: server log, each point's `vllm bench serve` log and JSON, lm_eval log

Runs on an MI300 machine with vLLM 0.34 (docker/Dockerfile), not on the CPU machines where it was
written: the commands, the JSON reading, the CSV rows, the tables and the gate are pure functions
the tests run (tests/tools/test_serve_bench.py), and the run loop is tested against a fake `vllm`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchutil import Record, print_table, write_csv

BACKENDS = ("ROCM_MLA", "ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA", "TRITON_MLA")
BASELINE = "TRITON_MLA"
AITER_BACKENDS = ("ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA")
AITER_MODES = ("all", "backend", "none")
FUSE_FLAGS = ("-cc.use_inductor_graph_partition=true", "-cc.pass_config.fuse_rope_kvcache_cat_mla=true")
KERNEL = "vllm-serve"
DEFAULT_MODEL = "deepseek-ai/DeepSeek-V3"
# The metrics every result must hold (vLLM's JSON keys).
REQUIRED = ("completed", "failed", "duration", "output_throughput", "median_ttft_ms", "median_tpot_ms")


class ServeBenchParseError(ValueError):
    """A result of `vllm bench serve` (or lm_eval's output) that cannot be read as one."""


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "_", label.lower()).strip("_")


def _tail(text: str, n: int = 15) -> str:
    lines = text.rstrip().splitlines()[-n:]
    return "\n".join("    " + ln for ln in lines) if lines else "    (empty output)"


def parse_lm_eval_output(text: str, task: str = "gsm8k") -> dict[str, float]:
    """exact_match per filter of ``task`` from lm_eval's results table, e.g.
    ``{"gsm8k_exact_match_flexible_extract": 0.9462, "gsm8k_exact_match_strict_match": 0.9447}``.

    Reads the markdown table lm_eval prints (``|Tasks|Version|Filter|n-shot|Metric|...|Value|``),
    where a task's second filter row leaves the Tasks cell empty. Raises ServeBenchParseError when
    the table or the task's exact_match rows are missing.
    """
    cols: dict[str, int] | None = None
    current = ""
    out: dict[str, float] = {}
    for line in text.splitlines():
        s = line.strip()
        if not (s.startswith("|") and s.endswith("|")):
            cols = None if s else cols  # a table ends at its first non-table line
            continue
        cells = [c.strip() for c in s[1:-1].split("|")]
        if "Tasks" in cells and "Metric" in cells and "Value" in cells:
            cols = {name: cells.index(name) for name in ("Tasks", "Filter", "Metric", "Value") if name in cells}
            current = ""
            continue
        if cols is None or set("".join(cells)) <= set("-: "):
            continue  # not in a table, or its |---|---:| rule
        current = cells[cols["Tasks"]] or current
        if current.lstrip(" -") != task or cells[cols["Metric"]] != "exact_match":
            continue
        filt = cells[cols["Filter"]] if "Filter" in cols else "none"
        try:
            out[f"{task}_exact_match_{_slug(filt)}"] = float(cells[cols["Value"]])
        except ValueError:
            raise ServeBenchParseError(
                f"lm_eval: {task} exact_match value {cells[cols['Value']]!r} is not a number"
            ) from None
    if not out:
        raise ServeBenchParseError(f"no {task} exact_match row in lm_eval's output; it ends with:\n{_tail(text)}")
    return out


@dataclass(frozen=True)
class Profile:
    """A workload: lengths, the concurrency sweep, prompts per concurrent slot (at least
    ``min_prompts``), warm-up requests per slot (excluded by vLLM)."""

    name: str
    input_len: int
    output_len: int
    concurrencies: tuple[int, ...]
    prompts_per_slot: int = 4
    min_prompts: int = 32
    warmups_per_slot: int = 1


PROFILES = {
    "amd": Profile("amd", 8192, 1024, (4, 8, 16, 32, 64, 128)),
    "smoke": Profile("smoke", 1024, 128, (8,)),
}


# --------------------------------------------------------------------------- commands (pure)


@dataclass
class Config:
    """What is served and how it is loaded and driven: identical for every backend of one comparison."""

    model: str = DEFAULT_MODEL
    tp: int = 8
    host: str = "127.0.0.1"
    port: int = 8000
    backends: tuple[str, ...] = BACKENDS
    profile: Profile = PROFILES["amd"]
    sharegpt: str | None = None  # path of a ShareGPT JSON file: that dataset instead of random
    ignore_eos: bool = True  # every request generates output_len tokens, whatever the backend
    seed: int = 0
    max_model_len: int | None = None  # None: the model's own
    gpu_memory_utilization: float = 0.9
    trust_remote_code: bool = False
    aiter: str = "all"
    fuse: bool = True
    serve_args: list[str] = field(default_factory=list)
    bench_args: list[str] = field(default_factory=list)
    lm_eval: bool = False
    lm_eval_limit: int | None = None  # None: every gsm8k question
    lm_eval_concurrency: int = 64
    accuracy_gate: float = 0.02

    @property
    def dataset(self) -> str:
        return "sharegpt" if self.sharegpt else "random"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def num_prompts(self, concurrency: int) -> int:
        p = self.profile
        return max(p.min_prompts, p.prompts_per_slot * concurrency)


def shape_label(cfg: Config, concurrency: int) -> str:
    """The CSV ``shape`` of one point: model, TP, dataset, lengths, concurrency, prompts."""
    name = cfg.model.rstrip("/").split("/")[-1]
    p = cfg.profile
    lengths = f"out{p.output_len}" if cfg.sharegpt else f"in{p.input_len}/out{p.output_len}"
    return f"{name} tp{cfg.tp} {cfg.dataset} {lengths} c{concurrency} n{cfg.num_prompts(concurrency)}"


def _has_json_compilation_config(args: Sequence[str]) -> bool:
    return any(a in ("--compilation-config", "-cc") or a.startswith(("--compilation-config=", "-cc=")) for a in args)


def serve_command(cfg: Config, backend: str) -> list[str]:
    """`vllm serve` for one backend: the backend flag (and, for ROCM_MLA, the fusion flags the
    image adds) is all that changes between runs. Prefix caching is off: random prompts would hit
    it by chance and skip prefill for some requests. With a JSON compilation config among
    ``serve_args`` no -cc.* flag is added (vLLM drops such a JSON when dotted flags come too)."""
    cmd = [
        "vllm", "serve", cfg.model,
        "--attention-backend", backend,
        "--tensor-parallel-size", str(cfg.tp),
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--gpu-memory-utilization", str(cfg.gpu_memory_utilization),
        "--no-enable-prefix-caching",
    ]  # fmt: skip
    if cfg.max_model_len:
        cmd += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.trust_remote_code:
        cmd.append("--trust-remote-code")
    if backend == "ROCM_MLA" and cfg.fuse and not _has_json_compilation_config(cfg.serve_args):
        cmd += list(FUSE_FLAGS)
    return cmd + list(cfg.serve_args)


def bench_command(cfg: Config, concurrency: int, result_dir: str | os.PathLike, label: str) -> list[str]:
    """`vllm bench serve` for one point of the sweep: all prompts sent at once, capped at
    ``concurrency`` in flight, after ``warmups_per_slot x concurrency`` warm-up requests vLLM
    leaves out of the result, which it saves as ``{result_dir}/{label}.json``."""
    p = cfg.profile
    cmd = [
        "vllm", "bench", "serve",
        "--backend", "vllm",
        "--model", cfg.model,
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--endpoint", "/v1/completions",
        "--num-prompts", str(cfg.num_prompts(concurrency)),
        "--max-concurrency", str(concurrency),
        "--num-warmups", str(p.warmups_per_slot * concurrency),
        "--request-rate", "inf",
        "--seed", str(cfg.seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99",
    ]  # fmt: skip
    if cfg.sharegpt:
        cmd += [
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            cfg.sharegpt,
            "--sharegpt-output-len",
            str(p.output_len),
        ]
    else:
        cmd += [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(p.input_len),
            "--random-output-len",
            str(p.output_len),
        ]
    if cfg.ignore_eos:
        cmd.append("--ignore-eos")
    if cfg.trust_remote_code:
        cmd.append("--trust-remote-code")
    cmd += ["--save-result", "--result-dir", str(result_dir), "--result-filename", f"{label}.json"]
    return cmd + list(cfg.bench_args)


def lm_eval_command(cfg: Config) -> list[str]:
    """lm_eval's gsm8k accuracy (5-shot exact_match) through the server's completions endpoint."""
    model_args = (
        f"model={cfg.model},base_url={cfg.base_url}/v1/completions,"
        f"num_concurrent={cfg.lm_eval_concurrency},max_retries=3"
    )
    cmd = ["lm_eval", "--model", "local-completions", "--tasks", "gsm8k", "--model_args", model_args]
    if cfg.lm_eval_limit:
        cmd += ["--limit", str(cfg.lm_eval_limit)]
    return cmd


def server_env(
    environ: Mapping[str, str], backend: str, aiter: str = "all", plugin: str = "rocm_mla"
) -> dict[str, str]:
    """One server's environment: ``environ`` with rocm-mla's plugin in vLLM's allow-list (appended
    to a list that lacks it; an unset list loads every plugin and stays unset) and
    VLLM_ROCM_USE_AITER per ``aiter``: "all" 1 for every backend, "backend" 1 for the ROCM_AITER_*
    ones and 0 for the others, "none" 0."""
    if aiter not in AITER_MODES:
        raise ValueError(f"aiter: expected one of {', '.join(AITER_MODES)}, got {aiter!r}")
    env = dict(environ)
    current = env.get("VLLM_PLUGINS")
    if current is not None and plugin not in current.split(","):
        env["VLLM_PLUGINS"] = f"{current},{plugin}" if current else plugin
    on = aiter == "all" or (aiter == "backend" and backend in AITER_BACKENDS)
    env["VLLM_ROCM_USE_AITER"] = "1" if on else "0"
    return env


def plan(cfg: Config, log_dir: str | os.PathLike = "serve_logs") -> list[tuple[str, dict[str, str], list[list[str]]]]:
    """Per backend: the environment it changes and the commands in the order they run (serve, one
    benchmark per concurrency, then lm_eval if asked)."""
    steps = []
    for b in cfg.backends:
        env = server_env({}, b, cfg.aiter)
        cmds = [serve_command(cfg, b)]
        cmds += [bench_command(cfg, c, log_dir, f"{b}.c{c}") for c in cfg.profile.concurrencies]
        if cfg.lm_eval:
            cmds.append(lm_eval_command(cfg))
        steps.append((b, env, cmds))
    return steps


# --------------------------------------------------------------------------- results (pure)


def read_result(path: str | os.PathLike) -> dict[str, float]:
    """The numbers of one `vllm bench serve --save-result` JSON: every numeric top-level value
    (counts, duration, throughputs, mean/median/std/pNN of ttft/tpot/itl/e2el in ms, and the run's
    own num_prompts / max_concurrency). ServeBenchParseError when the file is not such a result."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ServeBenchParseError(f"{path}: not a readable result JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise ServeBenchParseError(f"{path}: expected a JSON object, got {type(data).__name__}")
    out = {
        k: float(v)
        for k, v in data.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }
    missing = [k for k in REQUIRED if k not in out]
    if missing:
        raise ServeBenchParseError(f"{path}: no {', '.join(missing)} in vLLM's result (keys: {sorted(data)[:20]})")
    return out


# The sweep's tables: (vLLM key, title, which way is better).
SWEEP_METRICS: tuple[tuple[str, str, str], ...] = (
    ("output_throughput", "output tokens/s", "higher"),
    ("total_token_throughput", "total tokens/s", "higher"),
    ("median_ttft_ms", "median TTFT (ms)", "lower"),
    ("p99_ttft_ms", "p99 TTFT (ms)", "lower"),
    ("median_tpot_ms", "median TPOT (ms)", "lower"),
    ("p99_itl_ms", "p99 ITL (ms)", "lower"),
)


def pct_change(value: float, base: float) -> float | None:
    """(value - base) / base in percent; None when there is no meaningful base (0 or not finite)."""
    if base == 0 or not (math.isfinite(base) and math.isfinite(value)):
        return None
    return (value - base) / base * 100.0


def sweep_tables(
    results: Mapping[str, Mapping[int, Mapping[str, float]]], baseline: str = BASELINE
) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per metric of SWEEP_METRICS that some point has: (title, headers, rows); rows one per
    concurrency, columns the backends (``results`` order), then "B vs {baseline}" (% change) for
    every other backend when the baseline ran. A missing point is "-"."""
    names = list(results)
    others = [n for n in names if n != baseline] if baseline in results else []
    conc = sorted({c for r in results.values() for c in r})
    tables = []
    for key, title, better in SWEEP_METRICS:
        if not any(key in m for r in results.values() for m in r.values()):
            continue
        headers = ["concurrency", *names, *[f"{n} vs {baseline}" for n in others]]
        rows = []
        for c in conc:
            vals = {n: results[n].get(c, {}).get(key) for n in names}
            row = [str(c), *["-" if vals[n] is None else f"{vals[n]:.2f}" for n in names]]
            for n in others:
                pct = None if vals[n] is None or vals[baseline] is None else pct_change(vals[n], vals[baseline])
                row.append("-" if pct is None else f"{pct:+.1f}%")
            rows.append(row)
        tables.append((f"{title} ({better} is better)", headers, rows))
    return tables


def accuracy_problems(
    accuracy: Mapping[str, Mapping[str, float]], baseline: str = BASELINE, gate: float = 0.02
) -> dict[str, str]:
    """Backends whose gsm8k flexible-extract exact match is more than ``gate`` below the
    baseline's (none when the baseline has no score)."""
    key = "gsm8k_exact_match_flexible_extract"
    base = accuracy.get(baseline, {}).get(key)
    if base is None:
        return {}
    return {
        b: f"gsm8k exact match {a[key]:.4f} is {base - a[key]:.4f} below {baseline}'s {base:.4f} (gate {gate})"
        for b, a in accuracy.items()
        if b != baseline and key in a and a[key] < base - gate
    }


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """The table as text, through benchutil.print_table (the other benchmarks' format)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_table(headers, rows)
    return buf.getvalue()


def report_text(cfg: Config, device: str, version: str, results, accuracy) -> str:
    """serve_table.txt: a heading naming the model, TP, device and workload, the sweep's tables,
    the gsm8k scores."""
    p = cfg.profile
    lines = [
        f"# {cfg.model} tp{cfg.tp} on {device} ({version})",
        f"# profile {p.name}: {cfg.dataset}, in {p.input_len} / out {p.output_len} tokens, "
        f"aiter {cfg.aiter}, ROCM_MLA fusion {'on' if cfg.fuse else 'off'}",
        "",
    ]
    for title, headers, rows in sweep_tables(results):
        lines += [title, format_table(headers, rows)]
    if BASELINE not in results:
        lines.append(f"(no {BASELINE} result: no % change columns)")
    if accuracy:
        headers = ["backend", "gsm8k exact (flexible)", "gsm8k exact (strict)"]
        rows = [
            [
                b,
                *[
                    f"{a[k]:.4f}" if k in a else "-"
                    for k in ("gsm8k_exact_match_flexible_extract", "gsm8k_exact_match_strict_match")
                ],
            ]
            for b, a in accuracy.items()
        ]
        lines += ["gsm8k (lm_eval, 5-shot)", format_table(headers, rows)]
    return "\n".join(lines)


def to_records(results, accuracy, cfg: Config, device: str, version: str) -> list[Record]:
    """Long-format rows: one per (backend, point, metric), every number of vLLM's JSON; gsm8k per
    backend at shape "<model> tp<N> gsm8k"."""
    recs = [
        Record(KERNEL, backend, shape_label(cfg, c), metric, float(value), device, version)
        for backend, points in results.items()
        for c, metrics in points.items()
        for metric, value in metrics.items()
    ]
    name = cfg.model.rstrip("/").split("/")[-1]
    recs += [
        Record(KERNEL, backend, f"{name} tp{cfg.tp} gsm8k", metric, float(value), device, version)
        for backend, acc in accuracy.items()
        for metric, value in acc.items()
    ]
    return recs


# --------------------------------------------------------------------------- running (MI300 only)


class RunError(RuntimeError):
    """A backend whose run could not complete (server did not start, benchmark failed)."""


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen, grace_s: float = 120) -> None:
    """SIGTERM the server's process group (vLLM's workers are its children), SIGKILL after grace_s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the group we created with start_new_session
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _run_logged(cmd: list[str], log: Path, timeout_s: float) -> str:
    """Run ``cmd``, echoing and logging its output as it comes; return the output (stdout and
    stderr together). RunError when it exits non-zero or runs past ``timeout_s``."""
    print("$", shlex.join(cmd), flush=True)
    lines: list[str] = []
    with log.open("w") as f:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

        def pump() -> None:  # a thread, so that a silent hang still meets the timeout below
            assert p.stdout is not None
            for line in p.stdout:
                f.write(line)
                lines.append(line)
                sys.stdout.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(p, grace_s=10)
            raise RunError(f"`{shlex.join(cmd[:3])} ...` ran past {timeout_s:.0f} s; log: {log}") from None
        finally:
            reader.join(timeout=10)
    out = "".join(lines)
    if rc != 0:
        raise RunError(f"`{shlex.join(cmd[:3])} ...` exited {rc}; log: {log}\n{_tail(out)}")
    return out


HEALTH_POLL_S = 5.0


def run_backend(
    cfg: Config, backend: str, log_dir: Path, startup_timeout_s: float, bench_timeout_s: float
) -> tuple[dict[int, dict[str, float]], dict[str, float], str | None]:
    """Serve with ``backend``, run the sweep (and lm_eval if asked), stop the server.

    Returns the metrics per concurrency, the gsm8k scores, and why lm_eval failed when it did (the
    sweep's numbers are kept). RunError or ServeBenchParseError when the server or a point failed.
    """
    if not _port_free(cfg.host, cfg.port):
        raise RunError(f"port {cfg.port} on {cfg.host} is in use (a server left running?)")
    server_log = log_dir / f"{backend}.server.log"
    cmd = serve_command(cfg, backend)
    env = server_env(os.environ, backend, cfg.aiter)
    print(f"\n== {backend}: starting the server (log: {server_log}; VLLM_ROCM_USE_AITER={env['VLLM_ROCM_USE_AITER']})")
    print(f"$ {shlex.join(cmd)}", flush=True)
    with server_log.open("w") as log:
        # start_new_session: the server and its workers form one process group, stopped together.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        t0 = time.monotonic()
        while not _healthy(cfg.base_url):
            if proc.poll() is not None:
                raise RunError(
                    f"{backend}: the server exited ({proc.returncode}) before /health answered; "
                    f"log {server_log} ends with:\n{_tail(server_log.read_text(errors='replace'), 25)}"
                )
            if time.monotonic() - t0 > startup_timeout_s:
                raise RunError(
                    f"{backend}: /health did not answer within {startup_timeout_s:.0f} s (log: {server_log})"
                )
            time.sleep(HEALTH_POLL_S)
        print(f"== {backend}: ready after {time.monotonic() - t0:.0f} s", flush=True)
        points: dict[int, dict[str, float]] = {}
        sweep = cfg.profile.concurrencies
        for i, c in enumerate(sweep):
            label = f"{backend}.c{c}"
            print(f"== {backend}: [{i + 1}/{len(sweep)}] concurrency {c}, {cfg.num_prompts(c)} prompts", flush=True)
            _run_logged(bench_command(cfg, c, log_dir, label), log_dir / f"{label}.bench.log", bench_timeout_s)
            points[c] = read_result(log_dir / f"{label}.json")
        accuracy: dict[str, float] = {}
        lm_eval_error = None
        if cfg.lm_eval:
            try:
                text = _run_logged(lm_eval_command(cfg), log_dir / f"{backend}.lm_eval.log", bench_timeout_s)
                accuracy = parse_lm_eval_output(text)
            except (RunError, ServeBenchParseError) as e:
                lm_eval_error = f"lm_eval: {e}"
        return points, accuracy, lm_eval_error
    finally:
        print(f"== {backend}: stopping the server", flush=True)
        _stop(proc)


def _device_name() -> str:
    """GPU name, asked in a child process so that this one never holds a GPU context."""
    code = "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no-gpu')"
    try:
        return (
            subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "none"

    return f"rocm_mla-{v('rocm-mla')}/vllm-{v('vllm')}"


def config_from_args(argv: Sequence[str] | None = None) -> tuple[Config, argparse.Namespace]:
    """Parse the command line into a Config (and the remaining run options)."""
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[3:]),
    )
    d = Config()
    ap.add_argument("--model", default=d.model, help=f"model to serve (default {d.model})")
    ap.add_argument("--tp", type=int, default=d.tp, help=f"tensor-parallel size (default {d.tp})")
    ap.add_argument("--profile", default="amd", choices=sorted(PROFILES), help="the workload (default amd)")
    ap.add_argument(
        "--backends",
        default=",".join(d.backends),
        help=f"comma-separated attention backends, run in this order (default {','.join(d.backends)})",
    )
    ap.add_argument("--concurrency", default="", help="comma-separated concurrencies replacing the profile's sweep")
    ap.add_argument(
        "--aiter",
        default=d.aiter,
        choices=AITER_MODES,
        help="VLLM_ROCM_USE_AITER=1 for: all backends (default), the aiter backends, none",
    )
    ap.add_argument("--no-fusion", dest="fuse", action="store_false", help="ROCM_MLA without the fused RoPE + KV write")
    ap.add_argument("--host", default=d.host)
    ap.add_argument("--port", type=int, default=d.port)
    ap.add_argument("--sharegpt", metavar="JSON", help="ShareGPT file: use that dataset instead of random")
    ap.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at EOS (default: every request generates the profile's output length)",
    )
    ap.add_argument("--max-model-len", type=int, default=0, help="(default: the model's own)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    ap.add_argument("--trust-remote-code", action="store_true", help="pass --trust-remote-code (off by default)")
    ap.add_argument("--serve-args", default="", help="more `vllm serve` arguments (one string, shell-quoted)")
    ap.add_argument("--bench-args", default="", help="more `vllm bench serve` arguments (one string)")
    ap.add_argument("--lm-eval", action="store_true", help="also run lm_eval gsm8k against each server, gated")
    ap.add_argument("--lm-eval-limit", type=int, default=0, help="gsm8k questions (default: all)")
    ap.add_argument(
        "--accuracy-gate", type=float, default=d.accuracy_gate, help="allowed gsm8k drop vs TRITON_MLA (0.02)"
    )
    ap.add_argument("--out", default="results", help="folder for serve.csv, serve_table.txt, serve_logs/")
    ap.add_argument("--startup-timeout", type=float, default=1800, help="seconds to wait for /health (1800)")
    ap.add_argument("--bench-timeout", type=float, default=3600, help="seconds per point or lm_eval (3600)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args(argv)
    backends = tuple(b.strip() for b in a.backends.split(",") if b.strip())
    if not backends:
        ap.error("--backends: no backend named")
    if a.tp < 1:
        ap.error(f"--tp must be at least 1, got {a.tp}")
    profile = PROFILES[a.profile]
    if a.concurrency:
        try:
            conc = tuple(int(c) for c in a.concurrency.split(",") if c.strip())
        except ValueError:
            ap.error(f"--concurrency: expected comma-separated integers, got {a.concurrency!r}")
        if not conc or min(conc) < 1:
            ap.error(f"--concurrency: expected integers >= 1, got {a.concurrency!r}")
        profile = Profile(profile.name, profile.input_len, profile.output_len, conc, profile.prompts_per_slot,
                          profile.min_prompts, profile.warmups_per_slot)  # fmt: skip
    if a.sharegpt and not a.dry_run and not Path(a.sharegpt).is_file():
        ap.error(f"--sharegpt: no file {a.sharegpt}")
    cfg = Config(
        model=a.model,
        tp=a.tp,
        host=a.host,
        port=a.port,
        backends=backends,
        profile=profile,
        sharegpt=a.sharegpt,
        ignore_eos=a.ignore_eos,
        max_model_len=a.max_model_len or None,
        gpu_memory_utilization=a.gpu_memory_utilization,
        trust_remote_code=a.trust_remote_code,
        aiter=a.aiter,
        fuse=a.fuse,
        serve_args=shlex.split(a.serve_args),
        bench_args=shlex.split(a.bench_args),
        lm_eval=a.lm_eval,
        lm_eval_limit=a.lm_eval_limit or None,
        accuracy_gate=a.accuracy_gate,
    )
    return cfg, a


def main(argv: Sequence[str] | None = None) -> int:
    """Run every backend back to back; 0 only when every backend produced every point (and passed
    the accuracy gate when --lm-eval ran)."""
    cfg, a = config_from_args(argv)
    out = Path(a.out)
    log_dir = out / "serve_logs"
    if a.dry_run:
        for backend, env, cmds in plan(cfg, log_dir):
            changed = " ".join(f"{k}={v}" for k, v in env.items())
            print(f"# {backend}: environment {changed}; serve, wait for {cfg.base_url}/health, then")
            for c in cmds:
                print(shlex.join(c))
        return 0
    for tool in ("vllm", *(["lm_eval"] if cfg.lm_eval else [])):
        if shutil.which(tool) is None:
            print(f"serve_bench: `{tool}` is not on PATH (run in the image of docker/Dockerfile)", file=sys.stderr)
            return 2
    log_dir.mkdir(parents=True, exist_ok=True)
    device, version = _device_name(), _versions()
    print(f"device: {device}; {version}; profile {cfg.profile.name}, concurrency {cfg.profile.concurrencies}")
    results: dict[str, dict[int, dict[str, float]]] = {}
    accuracy: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for backend in cfg.backends:
        try:
            results[backend], acc, lm_eval_error = run_backend(
                cfg, backend, log_dir, a.startup_timeout, a.bench_timeout
            )
            if acc:
                accuracy[backend] = acc
            if lm_eval_error:
                errors[backend] = lm_eval_error
        except (RunError, ServeBenchParseError) as e:
            errors[backend] = str(e)
            print(f"== {backend}: FAILED: {e}", file=sys.stderr)
        # Written after every backend: a later crash keeps what was measured.
        write_csv(out / "serve.csv", to_records(results, accuracy, cfg, device, version))
    for backend, points in results.items():
        for c, m in points.items():
            if m.get("failed", 0) > 0:  # the numbers then describe fewer requests than the others'
                errors.setdefault(
                    backend, f"c{c}: {m['failed']:.0f} of {m['failed'] + m['completed']:.0f} requests failed"
                )
    for backend, why in accuracy_problems(accuracy, gate=cfg.accuracy_gate).items():
        errors.setdefault(backend, f"accuracy gate: {why}")
    if results:
        text = report_text(cfg, device, version, results, accuracy)
        print("\n" + text)
        (out / "serve_table.txt").write_text(text + "\n")
        print(f"wrote {out / 'serve.csv'}, {out / 'serve_table.txt'}, logs in {log_dir}")
    for backend, why in errors.items():
        print(f"{backend}: {why.splitlines()[0]}", file=sys.stderr)
    return 1 if errors or not results else 0


if __name__ == "__main__":
    sys.exit(main())
