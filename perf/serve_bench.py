#!/usr/bin/env python3
"""Serving benchmark: ROCM_MLA vs ROCM_AITER_MLA vs TRITON_MLA under `vllm serve`, back to back.

    python perf/serve_bench.py [--model M] [--tp N] [--backends A,B,C] [--out results] [--dry-run]

The methodology of the upstream PRs this project grew from: for each attention backend, start
`vllm serve MODEL --attention-backend B`, wait for /health, run `vllm bench serve` (random dataset,
1024 tokens in / 128 out, 32 prompts, concurrency 8, all sent at once; the ShareGPT dataset when
--sharegpt FILE is given), optionally the lm_eval gsm8k accuracy check against the same server
(--lm-eval), then stop the server. Everything but the attention backend is the same for every run.

Writes, under --out:
  serve.csv            long format: kernel, provider, shape, metric, value, device, version
                       (kernel "vllm-serve", provider = backend; metrics named as in vLLM's JSON)
  serve_table.txt      the comparison table printed at the end (% change vs TRITON_MLA)
  serve_logs/          per backend: server log, `vllm bench serve` output and its JSON, lm_eval log

Runs on an MI300 machine with vLLM 0.34 (docker/Dockerfile), not on the CPU machines where it was
written. The output parsing, command construction, CSV rows and table are pure functions that the
tests run on recorded `vllm bench serve` output (tests/tools/test_serve_bench.py).

One run of 32 prompts moves by a few percent between two runs of the same server (the recorded
samples: TTFT 396 vs 388 ms): treat differences of that size as noise; use more prompts to resolve less.
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rocm_mla.tools.benchutil import Record, print_table, write_csv

BACKENDS = ("ROCM_MLA", "ROCM_AITER_MLA", "TRITON_MLA")
BASELINE = "TRITON_MLA"
KERNEL = "vllm-serve"
DEFAULT_MODEL = "deepseek-ai/DeepSeek-V2-Lite-Chat"


class ServeBenchParseError(ValueError):
    """Output of `vllm bench serve` (or lm_eval) that cannot be read as a result."""


# --------------------------------------------------------------------------- parsing (pure)

# Labels of vLLM's result block -> the keys of vLLM's own result JSON (`--save-result`), so that a
# CSV row can be checked against the JSON. Matched case-insensitively: vLLM 0.33 prints "Total token
# throughput", older releases "Total Token throughput".
_LABELS = {
    "successful requests": "completed",
    "failed requests": "failed",
    "maximum request concurrency": "max_concurrency",
    "request rate configured (rps)": "request_rate",
    "benchmark duration (s)": "duration",
    "total input tokens": "total_input_tokens",
    "total generated tokens": "total_output_tokens",
    "request throughput (req/s)": "request_throughput",
    "request goodput (req/s)": "request_goodput",
    "output token throughput (tok/s)": "output_throughput",
    "peak output token throughput (tok/s)": "max_output_tokens_per_s",
    "peak concurrent requests": "max_concurrent_requests",
    "total token throughput (tok/s)": "total_token_throughput",
}
# "Mean TTFT (ms)", "Median ITL (ms)", "P99 TPOT (ms)", "P99.9 E2EL (ms)" -> mean_ttft_ms, ...
_STAT = re.compile(r"^(mean|median|p\d+(?:\.\d+)?)\s+(\w+)\s+\(ms\)$", re.IGNORECASE)
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?(?:inf|nan)$", re.IGNORECASE)
_HEADER = re.compile(r"^=+\s*Serving Benchmark Result\s*=+\s*$")
_FOOTER = re.compile(r"^=+\s*$")
_VALUE_LINE = re.compile(r"^\s*(?P<label>[A-Za-z][^:]*?):\s+(?P<value>\S+)\s*$")

# What a result must hold to be worth a row in the comparison: a block without these is truncated
# or comes from a run that measured something else (e.g. a pooling model).
REQUIRED = ("completed", "failed", "duration", "output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")


def metric_key(label: str) -> str | None:
    """vLLM result-JSON key for a printed label, or None for a label this parser does not know.

    >>> metric_key("Mean TTFT (ms)"), metric_key("Output token throughput (tok/s)")
    ('mean_ttft_ms', 'output_throughput')
    """
    label = " ".join(label.split())
    key = _LABELS.get(label.lower())
    if key:
        return key
    m = _STAT.match(label)
    if m:
        return f"{m.group(1).lower()}_{m.group(2).lower()}_ms"
    return None


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "_", label.lower()).strip("_")


def _tail(text: str, n: int = 15) -> str:
    lines = text.rstrip().splitlines()[-n:]
    return "\n".join("    " + ln for ln in lines) if lines else "    (empty output)"


def parse_serve_output(text: str, required: Sequence[str] = REQUIRED) -> list[dict[str, float]]:
    """Every "Serving Benchmark Result" block in ``text``, in order, as {metric key: value}.

    Keys are those of vLLM's result JSON (``mean_ttft_ms``, ``output_throughput``, ...: see
    ``_LABELS``); labels this parser does not know are kept under a slug of the label (e.g. a
    speculative-decoding "Acceptance rate (%)" becomes ``acceptance_rate``). Lines between blocks
    and lines without a number (log lines, section rules) are ignored.

    Raises ServeBenchParseError, with the line and its number, when there is no block, when a
    block is not closed by its line of '=', when a known metric has a value that is not a number,
    when a metric appears twice in one block, or when a block lacks one of ``required``.
    """
    results: list[dict[str, float]] = []
    block: dict[str, float] | None = None
    start = 0
    for no, line in enumerate(text.splitlines(), 1):
        if _HEADER.match(line):
            if block is not None:
                raise ServeBenchParseError(
                    f"line {no}: a new result block starts before the one of line {start} "
                    "was closed by a line of '=' (truncated output?)"
                )
            block, start = {}, no
            continue
        if block is None:
            continue
        if _FOOTER.match(line):
            missing = [k for k in required if k not in block]
            if missing:
                raise ServeBenchParseError(
                    f"result block of line {start} lacks {', '.join(missing)} (found: {', '.join(block) or 'nothing'})"
                )
            results.append(block)
            block = None
            continue
        m = _VALUE_LINE.match(line)
        if not m:
            continue  # section rules ("----Time to First Token----"), blank or stray lines
        label, raw = m.group("label"), m.group("value")
        key = metric_key(label)
        if not _NUMBER.match(raw):
            if key is not None:
                raise ServeBenchParseError(
                    f"line {no}: {label.strip()!r} has value {raw!r}, not a number: {line.strip()!r}"
                )
            continue  # e.g. a log line that happens to contain a colon
        key = key or _slug(label)
        if key in block:
            raise ServeBenchParseError(
                f"line {no}: {label.strip()!r} appears twice in the result block of line {start}"
            )
        block[key] = float(raw)
    if block is not None:
        raise ServeBenchParseError(
            f"the result block of line {start} is not closed by a line of '=' "
            f"(output truncated?); output ends with:\n{_tail(text)}"
        )
    if not results:
        raise ServeBenchParseError(
            "no 'Serving Benchmark Result' block in the output of `vllm bench serve` "
            f"(did it fail?); output ends with:\n{_tail(text)}"
        )
    return results


def parse_single_result(text: str) -> dict[str, float]:
    """The one result block of one `vllm bench serve` run (ServeBenchParseError if not exactly one)."""
    blocks = parse_serve_output(text)
    if len(blocks) != 1:
        raise ServeBenchParseError(f"expected one result block from one `vllm bench serve` run, found {len(blocks)}")
    return blocks[0]


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


# --------------------------------------------------------------------------- commands (pure)


@dataclass
class Config:
    """What is served and how it is loaded: identical for every backend of one comparison."""

    model: str = DEFAULT_MODEL
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    backends: tuple[str, ...] = BACKENDS
    input_len: int = 1024
    output_len: int = 128
    num_prompts: int = 32
    concurrency: int = 8
    sharegpt: str | None = None  # path of a ShareGPT JSON file: that dataset instead of random
    ignore_eos: bool = True  # every request generates output_len tokens, whatever the backend
    seed: int = 0
    max_model_len: int | None = 8192
    gpu_memory_utilization: float = 0.9
    trust_remote_code: bool = True
    serve_args: list[str] = field(default_factory=list)
    bench_args: list[str] = field(default_factory=list)
    lm_eval: bool = False
    lm_eval_limit: int | None = 100
    lm_eval_concurrency: int = 30

    @property
    def dataset(self) -> str:
        return "sharegpt" if self.sharegpt else "random"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def shape_label(cfg: Config) -> str:
    """The CSV ``shape`` of a run: model, TP, dataset, lengths, prompts, concurrency."""
    name = cfg.model.rstrip("/").split("/")[-1]
    lengths = f"out{cfg.output_len}" if cfg.sharegpt else f"in{cfg.input_len}/out{cfg.output_len}"
    return f"{name} tp{cfg.tp} {cfg.dataset} {lengths} n{cfg.num_prompts} c{cfg.concurrency}"


def serve_command(cfg: Config, backend: str) -> list[str]:
    """`vllm serve` for one backend; the backend flag is the only thing that changes between runs.

    Prefix caching is off: random prompts would hit it by chance and skip prefill for some requests.
    """
    cmd = [
        "vllm",
        "serve",
        cfg.model,
        "--attention-backend",
        backend,
        "--tensor-parallel-size",
        str(cfg.tp),
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--gpu-memory-utilization",
        str(cfg.gpu_memory_utilization),
        "--no-enable-prefix-caching",
    ]
    if cfg.max_model_len:
        cmd += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.trust_remote_code:
        cmd.append("--trust-remote-code")
    return cmd + list(cfg.serve_args)


def bench_command(cfg: Config, result_dir: str | os.PathLike | None = None, label: str = "") -> list[str]:
    """`vllm bench serve` against the server of ``cfg`` (all prompts sent at once, capped by
    --max-concurrency). ``result_dir``: also save vLLM's JSON there as ``{label}.json``."""
    cmd = [
        "vllm",
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--model",
        cfg.model,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--endpoint",
        "/v1/completions",
        "--num-prompts",
        str(cfg.num_prompts),
        "--max-concurrency",
        str(cfg.concurrency),
        "--request-rate",
        "inf",
        "--seed",
        str(cfg.seed),
    ]
    if cfg.sharegpt:
        cmd += [
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            cfg.sharegpt,
            "--sharegpt-output-len",
            str(cfg.output_len),
        ]
    else:
        cmd += [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(cfg.input_len),
            "--random-output-len",
            str(cfg.output_len),
        ]
    if cfg.ignore_eos:
        cmd.append("--ignore-eos")
    if cfg.trust_remote_code:
        cmd.append("--trust-remote-code")
    if result_dir is not None:
        cmd += ["--save-result", "--result-dir", str(result_dir), "--result-filename", f"{label or 'bench'}.json"]
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


def server_env(environ: Mapping[str, str], plugin: str = "rocm_mla") -> dict[str, str]:
    """The servers' environment: ``environ`` with rocm-mla's plugin in vLLM's allow-list.

    VLLM_PLUGINS unset means "load every plugin"; a benchmark sets it to ours to make what runs
    explicit (docker/serve.sh leaves it unset for serving), and ours is appended to a list that
    lacks it (without it ROCM_MLA would not be registered).
    """
    env = dict(environ)
    current = env.get("VLLM_PLUGINS")
    if current is None:
        env["VLLM_PLUGINS"] = plugin
    elif plugin not in current.split(","):
        env["VLLM_PLUGINS"] = f"{current},{plugin}" if current else plugin
    return env


# --------------------------------------------------------------------------- results (pure)

# Rows of the comparison table: (metric key, label, which way is better, value format). Counts have
# no direction and get no percentage.
TABLE_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("mean_ttft_ms", "Mean TTFT (ms)", "lower", ".2f"),
    ("median_ttft_ms", "Median TTFT (ms)", "lower", ".2f"),
    ("p99_ttft_ms", "P99 TTFT (ms)", "lower", ".2f"),
    ("mean_tpot_ms", "Mean TPOT (ms)", "lower", ".2f"),
    ("median_tpot_ms", "Median TPOT (ms)", "lower", ".2f"),
    ("p99_tpot_ms", "P99 TPOT (ms)", "lower", ".2f"),
    ("mean_itl_ms", "Mean ITL (ms)", "lower", ".2f"),
    ("median_itl_ms", "Median ITL (ms)", "lower", ".2f"),
    ("p99_itl_ms", "P99 ITL (ms)", "lower", ".2f"),
    ("output_throughput", "Output tok/s", "higher", ".2f"),
    ("total_token_throughput", "Total tok/s", "higher", ".2f"),
    ("request_throughput", "Requests/s", "higher", ".2f"),
    ("duration", "Duration (s)", "lower", ".2f"),
    ("gsm8k_exact_match_flexible_extract", "gsm8k exact (flexible)", "higher", ".4f"),
    ("gsm8k_exact_match_strict_match", "gsm8k exact (strict)", "higher", ".4f"),
    ("completed", "Successful requests", "", ".0f"),
    ("failed", "Failed requests", "", ".0f"),
)


def pct_change(value: float, base: float) -> float | None:
    """(value - base) / base in percent; None when there is no meaningful base (0 or not finite)."""
    if base == 0 or not (math.isfinite(base) and math.isfinite(value)):
        return None
    return (value - base) / base * 100.0


def comparison_table(
    results: Mapping[str, Mapping[str, float]],
    baseline: str = BASELINE,
    metrics: Iterable[tuple[str, str, str, str]] = TABLE_METRICS,
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the comparison: one row per metric that some backend has; columns: the
    metric, which way is better, one per backend (in ``results`` order), then "B vs {baseline}"
    (% change) for every other backend B when the baseline has results. A missing value is "-";
    metrics without a direction (counts) get no percentage.
    """
    names = list(results)
    others = [n for n in names if n != baseline] if baseline in results else []
    headers = ["metric", "better", *names, *[f"{n} vs {baseline}" for n in others]]
    rows = []
    for key, label, better, fmt in metrics:
        if not any(key in r for r in results.values()):
            continue
        row = [label, better or "-", *[format(results[n][key], fmt) if key in results[n] else "-" for n in names]]
        for n in others:
            pct = None
            if better and key in results[n] and key in results[baseline]:
                pct = pct_change(results[n][key], results[baseline][key])
            row.append("-" if pct is None else f"{pct:+.2f}%")
        rows.append(row)
    return headers, rows


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """The table as text, through benchutil.print_table (the other benchmarks' format)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_table(headers, rows)
    return buf.getvalue()


def to_records(results: Mapping[str, Mapping[str, float]], cfg: Config, device: str, version: str) -> list[Record]:
    """Long-format rows: one per (backend, metric), every metric parsed (not only the table's)."""
    shape = shape_label(cfg)
    return [
        Record(KERNEL, backend, shape, metric, float(value), device, version)
        for backend, metrics in results.items()
        for metric, value in metrics.items()
    ]


def plan(cfg: Config, log_dir: str | os.PathLike = "serve_logs") -> list[tuple[str, list[list[str]]]]:
    """Per backend, the commands in the order they run: serve, bench, then lm_eval if asked."""
    steps = []
    for b in cfg.backends:
        cmds = [serve_command(cfg, b), bench_command(cfg, log_dir, b)]
        if cfg.lm_eval:
            cmds.append(lm_eval_command(cfg))
        steps.append((b, cmds))
    return steps


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
) -> tuple[dict[str, float], str | None]:
    """Serve with ``backend``, benchmark it (and lm_eval if asked), stop the server.

    Returns the metrics and, when lm_eval was asked for and failed, why (the benchmark's numbers
    are kept). RunError or ServeBenchParseError when the server or the benchmark failed.
    """
    if not _port_free(cfg.host, cfg.port):
        raise RunError(f"port {cfg.port} on {cfg.host} is in use (a server left running?)")
    server_log = log_dir / f"{backend}.server.log"
    cmd = serve_command(cfg, backend)
    print(f"\n== {backend}: starting the server (log: {server_log})\n$ {shlex.join(cmd)}", flush=True)
    with server_log.open("w") as log:
        # start_new_session: the server and its workers form one process group, stopped together.
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env(os.environ), start_new_session=True
        )
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
        out = _run_logged(bench_command(cfg, log_dir, backend), log_dir / f"{backend}.bench.log", bench_timeout_s)
        metrics = parse_single_result(out)
        lm_eval_error = None
        if cfg.lm_eval:
            try:
                text = _run_logged(lm_eval_command(cfg), log_dir / f"{backend}.lm_eval.log", bench_timeout_s)
                metrics.update(parse_lm_eval_output(text))
            except (RunError, ServeBenchParseError) as e:
                lm_eval_error = f"lm_eval: {e}"
        return metrics, lm_eval_error
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
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    d = Config()
    ap.add_argument("--model", default=d.model, help=f"model to serve (default {d.model})")
    ap.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel size (default 1)")
    ap.add_argument(
        "--backends",
        default=",".join(d.backends),
        help=f"comma-separated attention backends, run in this order (default {','.join(d.backends)})",
    )
    ap.add_argument("--host", default=d.host)
    ap.add_argument("--port", type=int, default=d.port)
    ap.add_argument("--input-len", type=int, default=d.input_len, help="random dataset: tokens in (1024)")
    ap.add_argument("--output-len", type=int, default=d.output_len, help="tokens out per request (128)")
    ap.add_argument("--num-prompts", type=int, default=d.num_prompts, help="(32)")
    ap.add_argument("--concurrency", type=int, default=d.concurrency, help="--max-concurrency (8)")
    ap.add_argument("--sharegpt", metavar="JSON", help="ShareGPT file: use that dataset instead of random")
    ap.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at EOS (default: every request generates --output-len tokens)",
    )
    ap.add_argument("--max-model-len", type=int, default=d.max_model_len, help="(8192; 0: the model's own)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    ap.add_argument("--no-trust-remote-code", dest="trust_remote_code", action="store_false")
    ap.add_argument("--serve-args", default="", help="more `vllm serve` arguments (one string, shell-quoted)")
    ap.add_argument("--bench-args", default="", help="more `vllm bench serve` arguments (one string)")
    ap.add_argument(
        "--lm-eval", action="store_true", help="also run lm_eval gsm8k against each server (accuracy, exact_match)"
    )
    ap.add_argument("--lm-eval-limit", type=int, default=d.lm_eval_limit, help="gsm8k questions (100; 0: all)")
    ap.add_argument("--out", default="results", help="folder for serve.csv, serve_table.txt, serve_logs/")
    ap.add_argument("--startup-timeout", type=float, default=1800, help="seconds to wait for /health (1800)")
    ap.add_argument("--bench-timeout", type=float, default=3600, help="seconds per benchmark or lm_eval (3600)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args(argv)
    backends = tuple(b.strip() for b in a.backends.split(",") if b.strip())
    if not backends:
        ap.error("--backends: no backend named")
    for name in ("tp", "num_prompts", "concurrency", "input_len", "output_len"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    if a.sharegpt and not a.dry_run and not Path(a.sharegpt).is_file():
        ap.error(f"--sharegpt: no file {a.sharegpt}")
    cfg = Config(
        model=a.model,
        tp=a.tp,
        host=a.host,
        port=a.port,
        backends=backends,
        input_len=a.input_len,
        output_len=a.output_len,
        num_prompts=a.num_prompts,
        concurrency=a.concurrency,
        sharegpt=a.sharegpt,
        ignore_eos=a.ignore_eos,
        max_model_len=a.max_model_len or None,
        gpu_memory_utilization=a.gpu_memory_utilization,
        trust_remote_code=a.trust_remote_code,
        serve_args=shlex.split(a.serve_args),
        bench_args=shlex.split(a.bench_args),
        lm_eval=a.lm_eval,
        lm_eval_limit=a.lm_eval_limit or None,
    )
    return cfg, a


def main(argv: Sequence[str] | None = None) -> int:
    """Run every backend back to back; 0 only when every backend produced a result."""
    cfg, a = config_from_args(argv)
    out = Path(a.out)
    log_dir = out / "serve_logs"
    if a.dry_run:
        print(f"# environment of every server: VLLM_PLUGINS={server_env(os.environ)['VLLM_PLUGINS']}")
        for backend, cmds in plan(cfg, log_dir):
            print(f"# {backend}: serve, wait for {cfg.base_url}/health, then")
            for c in cmds:
                print(shlex.join(c))
        return 0
    for tool in ("vllm", *(["lm_eval"] if cfg.lm_eval else [])):
        if shutil.which(tool) is None:
            print(f"serve_bench: `{tool}` is not on PATH (run in the image of docker/Dockerfile)", file=sys.stderr)
            return 2
    log_dir.mkdir(parents=True, exist_ok=True)
    device, version = _device_name(), _versions()
    print(f"device: {device}; {version}; {shape_label(cfg)}")
    results: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for backend in cfg.backends:
        try:
            results[backend], lm_eval_error = run_backend(cfg, backend, log_dir, a.startup_timeout, a.bench_timeout)
            if lm_eval_error:
                errors[backend] = lm_eval_error
        except (RunError, ServeBenchParseError) as e:
            errors[backend] = str(e)
            print(f"== {backend}: FAILED: {e}", file=sys.stderr)
        # Written after every backend: a later crash keeps what was measured.
        write_csv(out / "serve.csv", to_records(results, cfg, device, version))
    for backend, m in results.items():
        if m.get("failed", 0) > 0:  # the numbers then describe fewer requests than the others'
            errors.setdefault(
                backend, f"{m['failed']:.0f} of {m['failed'] + m.get('completed', 0):.0f} requests failed"
            )
    if results:
        headers, rows = comparison_table(results)
        text = f"{shape_label(cfg)} on {device} ({version})\n" + format_table(headers, rows)
        if BASELINE not in results:
            text += f"(no {BASELINE} result: no % change column)\n"
        print("\n" + text, end="")
        (out / "serve_table.txt").write_text(text)
        print(f"\nwrote {out / 'serve.csv'}, {out / 'serve_table.txt'}, logs in {log_dir}")
    for backend, why in errors.items():
        print(f"{backend}: {why.splitlines()[0]}", file=sys.stderr)
    return 1 if errors or not results else 0


if __name__ == "__main__":
    sys.exit(main())
