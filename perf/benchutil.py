"""What the perf/ scripts share beyond the package's timers (``rocm_mla.tools.timing``: ``time_ms``,
``graph_ms``, ``rotating_graph_us``, ``wall_ms``, the copy ceiling, the cold-cache rule, which
``rocm-mla tune`` and ``rocm-mla doctor`` use too). Lives in perf/, outside the wheel: the peers'
loaders, matplotlib and the benchmarks' CSV are development tools; a script imports it as
``benchutil`` (perf/ is its own folder on ``sys.path``), a test after putting perf/ on ``sys.path``.

- the bf16 matmul ceiling (``matmul_tflops``), measured in the same process as the kernels it judges;
- ``one_call_us``: one call (events; host clock off a GPU), for perf/profile_*.py: it says a
  profiled run is the expected one;
- the preamble of a script's ``main()`` (``bench_parser``, ``start_bench``);
- a benchmark's own CSV (``Record``, ``write_csv``; perf/bench.py folds it into perf/results.csv),
  its table (``print_table``) and plots (``bar_plot``);
- the peers' loaders (``load_vllm_peer``, ``load_aiter_peer``) and the vLLM 0.33 paths the scripts
  time ours against (``vllm_forward_static``, ``vllm_unfused_rope_kv_write``,
  ``vllm_num_kv_splits``, ``vllm_triton_mla_decode``);
- the profiler's data-movement kernels (``DATA_MOVEMENT_KERNELS``, ``data_movement_kind``).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rocm_mla.reference.rope_kv_write import FP8_MAX
from rocm_mla.tools.timing import copy_bandwidth_gbs, device_name, time_ms


def matmul_tflops(device: torch.device, n: int = 8192) -> float:
    """bf16 matmul rate in TFLOP/s (random data: zeros run faster than real inputs)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = time_ms(lambda: a @ b)
    return 2 * n**3 / ms / 1e9


def load_vllm_peer(peers: str, module: str, name: str):
    """``name`` from vLLM 0.33's ``vllm.v1.attention.ops.<module>``, importable from the ``peers``
    folder that perf/peers/get_vllm_peers.sh makes; None (with the reason printed) when it is
    missing or fails to import — a peer that cannot load is reported, not fatal."""
    import importlib
    import sys

    if not Path(peers, "vllm").is_dir():
        print(f"vLLM peer unavailable: no {peers}/vllm (run perf/peers/get_vllm_peers.sh {peers})")
        return None
    if peers not in sys.path:
        sys.path.insert(0, peers)
    try:
        return getattr(importlib.import_module(f"vllm.v1.attention.ops.{module}"), name)
    except Exception as exc:
        print(f"vLLM peer unavailable: {type(exc).__name__}: {exc}")
        return None


def load_aiter_peer(peers: str, module: str, config_arch: str = "gfx942", raise_errors: bool = False):
    """aiter's ``aiter.ops.triton.<module>``, importable from the ``peers`` folder that
    perf/peers/get_aiter_peers.sh makes (aiter's Triton tree only; ``import aiter`` needs ROCm); None
    (with the reason printed) when it is missing or fails to import.

    aiter picks its JSON configs by asking Triton's active driver for a gfx arch; without an AMD GPU
    (the H200, or no GPU for the compile report) that answer is not a gfx name, so the loader makes
    aiter read ``config_arch``'s configs (gfx942 = its MI300X files). Launch configs taken from them
    carry AMD-only options: drop those with ``rocm_mla.triton_common.without_amd_options`` before an
    NVIDIA launch.
    raise_errors: raise (with the reason) instead of printing it and returning None.
    """
    import importlib
    import sys

    if not Path(peers, "aiter", "ops", "triton").is_dir():
        why = f"no {peers}/aiter/ops/triton (run perf/peers/get_aiter_peers.sh {peers})"
        if raise_errors:
            raise FileNotFoundError(why)
        print(f"aiter peer unavailable: {why}")
        return None
    if peers not in sys.path:
        sys.path.insert(0, peers)
    try:
        arch_info = importlib.import_module("aiter.ops.triton.utils._triton.arch_info")
        if not torch.cuda.is_available() or torch.version.hip is None:
            arch_info.get_arch = lambda: config_arch
            _string_arch_for_fa_amd(peers)
        return importlib.import_module(f"aiter.ops.triton.{module}")
    except Exception as exc:
        if raise_errors:
            raise
        print(f"aiter peer unavailable: {type(exc).__name__}: {exc}")
        return None


def _string_arch_for_fa_amd(peers: str) -> None:
    """aiter.ops.triton.mha imports flash_attn_triton_amd, whose ``utils.get_arch`` returns Triton's
    target arch as is: an int (90) on NVIDIA, which some of aiter's checks put through string
    operations (``arch in "gfx950"`` raises TypeError). Load that utils module first, under its
    own name, with ``get_arch`` returning a string ("sm90"; no gfx branch matches) and ``is_hip``
    False, so every later ``from .utils import get_arch`` binds the patched one. aiter's files are
    not touched. On a machine without a GPU driver there is nothing to ask: leave it alone."""
    import importlib.util
    import sys

    name = "aiter.ops.triton._triton_kernels.flash_attn_triton_amd.utils"
    path = Path(peers, *name.split(".")).with_suffix(".py")
    if not torch.cuda.is_available() or not path.is_file():
        return
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except Exception:
            del sys.modules[name]
            raise
    major, minor = torch.cuda.get_device_capability()
    mod.get_arch = lambda: f"sm{major}{minor}"
    mod.is_hip = lambda: False


def aiter_peer_version(peers: str) -> str:
    """The amd-aiter wheel version the peer folder was unpacked from ("" when unknown)."""
    f = Path(peers, "AITER_VERSION")
    return f.read_text().strip() if f.is_file() else ""


# Device kernels that only move or fill data, by kind, as torch.profiler names them; the first
# pattern that matches decides. "(?<!pre)fill": mla_prefill_kernel is attention, not a fill.
# "\bcat_": concat_and_cache_* kernels write the cache, they are not a cat.
DATA_MOVEMENT_KERNELS = (
    ("cat", re.compile(r"CatArray|\bcat_", re.I)),
    ("pad", re.compile(r"pad", re.I)),
    ("copy", re.compile(r"copy|Memcpy", re.I)),
    ("fill", re.compile(r"(?<!pre)fill|Memset|zero", re.I)),
)


def data_movement_kind(kernel_name: str) -> str | None:
    """ "cat", "pad", "copy" or "fill" for a device kernel that only moves or fills data (by its
    profiler name, :data:`DATA_MOVEMENT_KERNELS`); None for a compute kernel."""
    for kind, pat in DATA_MOVEMENT_KERNELS:
        if pat.search(kernel_name):
            return kind
    return None


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """A perf/ script's argument parser, described by the first line of its docstring ``doc``."""
    return argparse.ArgumentParser(description=doc.splitlines()[0])


@dataclass
class BenchGPU:
    """The GPU a benchmark runs on, its name, and the ceilings it asked ``start_bench`` for."""

    dev: torch.device
    name: str
    copy_gbs: float | None = None
    matmul_tflops: float | None = None


def start_bench(bench: str, *, copy: bool = False, matmul: bool = False) -> BenchGPU | None:
    """The preamble of every perf/ benchmark's main(): the GPU (``gpu_for``: RNG seeded), its
    name, and the copy bandwidth / bf16 matmul ceilings when asked, measured now (in the same run
    as the kernels they judge). None, after printing that ``bench`` needs a GPU, when there is none
    (the script then returns 2)."""
    dev = gpu_for(bench)
    if dev is None:
        return None
    return BenchGPU(
        dev, device_name(dev), copy_bandwidth_gbs(dev) if copy else None, matmul_tflops(dev) if matmul else None
    )


def gpu_for(bench: str) -> torch.device | None:
    """The GPU a benchmark runs on, with torch's RNG seeded (0) for repeatable inputs; None, after
    printing that ``bench`` needs a GPU, when there is none."""
    if not torch.cuda.is_available():
        print(f"{bench}: needs a GPU")
        return None
    torch.manual_seed(0)
    return torch.device("cuda")


@dataclass
class Record:
    """One long-format result row of a benchmark's own CSV (perf/bench.py adds the run's versions,
    commit and date when it appends the row to perf/results.csv). ``config``: the launch config of
    our kernel that produced the value ("" for peers)."""

    kernel: str
    provider: str
    shape: str
    metric: str
    value: float
    device: str
    version: str
    config: str = ""


class RateRun:
    """One benchmark run's table rows, CSV records and notes, for benches that report time, GB/s and
    TFLOP/s against the copy and matmul ceilings measured in the same run (None: not measured).
    ``kernel`` and ``version`` name our rows."""

    def __init__(self, name: str, copy: float | None, mm: float | None, kernel: str, version: str):
        self.name, self.copy, self.mm, self.kernel, self.version = name, copy, mm, kernel, version
        self.records: list[Record] = []
        if copy:
            self.records.append(Record("copy", "torch", "2 GiB", "GB/s", copy, name, torch.__version__))
        if mm:
            self.records.append(Record("matmul", "torch", "8192^3 bf16", "TFLOP/s", mm, name, torch.__version__))
        self.rows: list[list[str]] = []
        self.notes: list[str] = []

    def add(self, provider: str, label: str, nbytes: float, flops: float, us: float | None, config: str = "") -> str:
        """Records ``us`` for ``provider`` at shape ``label`` (with the GB/s, TFLOP/s and ceiling shares
        ``nbytes`` and ``flops`` give) and returns the table cell; "-" when not measured."""
        if us is None:
            return "-"
        gbs, tfs = nbytes / us / 1e3, flops / us / 1e6
        metrics = [("time_us", us), ("GB/s", gbs), ("pct_copy", 100 * gbs / self.copy if self.copy else None)]
        metrics += [("TFLOP/s", tfs), ("pct_matmul", 100 * tfs / self.mm if self.mm else None)]
        for metric, val in (m for m in metrics if m[1] is not None):
            self.records.append(Record(self.kernel, provider, label, metric, val, self.name, self.version, config))
        share = f" ({100 * gbs / self.copy:.0f}%)" if self.copy else ""
        return f"{us:.1f}us {gbs:.0f}GB/s{share} {tfs:.0f}TF"


def write_csv(path: str | os.PathLike, records: list[Record]) -> None:
    """Write long-format CSV: kernel, provider, shape, metric, value, device, version, config."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "provider", "shape", "metric", "value", "device", "version", "config"])
        for r in records:
            w.writerow([r.kernel, r.provider, r.shape, r.metric, f"{r.value:.6g}", r.device, r.version, r.config])


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    """Aligned plain-text table."""
    cells = [[str(h) for h in headers]] + [[f"{c:.1f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for k, r in enumerate(cells):
        print("  ".join(c.rjust(w) if k and i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if k == 0:
            print("  ".join("-" * w for w in widths))


def bar_plot(
    path: str | os.PathLike,
    title: str,
    groups: list[str],
    series: dict[str, list[float]],
    ylabel: str,
    hline: float | None = None,
    hline_label: str = "",
) -> bool:
    """Grouped bar chart (one bar per provider per shape), as perf/report.py draws perf/plots/*.png.
    Returns False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(matplotlib not installed: no plot written to {path})")
        return False
    fig, ax = plt.subplots(figsize=(min(18, max(8, 0.22 * len(groups) * max(1, len(series)))), 5))
    width = 0.8 / max(1, len(series))
    for i, (name, vals) in enumerate(series.items()):
        xs = [g + i * width for g in range(len(groups))]
        ax.bar(xs, vals, width, label=name)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    if hline:
        ax.axhline(hline, color="k", linestyle="--", linewidth=1, label=hline_label)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- profile scripts' timer


def one_call_us(fn: Callable[[], object], dev: torch.device) -> float:
    """Time of one call of ``fn`` in us, for the profile scripts (a profiler attached to them has
    the real numbers; this says the run is the expected one): CUDA/HIP events on a GPU, the host
    clock elsewhere."""
    if dev.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3


# --------------------------------------------------------------------------- vLLM 0.33's torch paths


def _rotate_gptj(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _rotate_neox(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def vllm_forward_static(positions, query, key, cos_sin_cache, is_neox: bool = False):
    """vLLM 0.33 DeepseekScalingRotaryEmbedding.forward_static, rotary_dim == head_size == 64, in
    the inputs' dtype (cos_sin_cache in the model dtype, as vLLM converts it at init): the timed
    unfused peer here and the unfused path the RoPE tests compare against."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    if is_neox:
        cos = torch.cat((cos, cos), dim=-1).unsqueeze(-2)
        sin = torch.cat((sin, sin), dim=-1).unsqueeze(-2)
    else:
        cos = cos.repeat_interleave(2, dim=-1).unsqueeze(-2)
        sin = sin.repeat_interleave(2, dim=-1).unsqueeze(-2)
    rot = _rotate_neox if is_neox else _rotate_gptj
    return query * cos + rot(query) * sin, key * cos + rot(key) * sin


def vllm_unfused_rope_kv_write(positions, q, kv_a, kv_c, cos_sin, cache, slots, fp8, k_scale) -> None:
    """The two-step path vLLM 0.33 runs for DeepSeek without the fusion pass: torch RoPE
    (``vllm_forward_static`` on q[..., 128:] and kv_a[:, 512:], then the model's copy back into q),
    then a torch cache write (cat([kv_c, k_pe]); FP8: / k_scale, clamp, convert; index_copy_ into
    the flattened cache)."""
    q_rot, k_rot = vllm_forward_static(positions, q[..., 128:], kv_a[:, 512:].unsqueeze(1), cos_sin)
    q[..., 128:] = q_rot
    row = torch.cat((kv_c, k_rot.squeeze(1)), dim=-1)
    flat = cache.view(-1, 576)
    if fp8 is not None:
        m = FP8_MAX[fp8]
        row = (row.float() / k_scale).clamp(-m, m).to(fp8).view(torch.uint8)
        flat = flat.view(torch.uint8)
    flat.index_copy_(0, slots, row)


def vllm_triton_mla_decode(
    decode_attention_fwd, ql_nope, q_pe, kv_cache, block_table, seq_lens, attn_logits, sm_scale, k_scale
) -> torch.Tensor:
    """vLLM 0.33 TRITON_MLA ``forward_mqa``'s decode as it runs it, copies included: q = cat(ql_nope
    [B, N, 512], q_pe [B, N, 64]) -> [B, N, 576], o and lse zero-filled, kv_cache [pages, block, 576]
    viewed [pages, block, 1, 576] as K and its first 512 columns as V, then vLLM's Triton
    ``decode_attention_fwd`` (loaded by ``load_vllm_peer``) with ``attn_logits`` [B, N, S, 513]
    float32 as the split workspace (S = its third dim: ``vllm_num_kv_splits``), the page size and
    k_scale = v_scale: a float32 tensor made once by the caller, as ``layer._k_scale`` is (ones for a
    16-bit cache; made per call it would add a fill kernel to the timed step). Returns o [B, N, 512]."""
    L = ql_nope.shape[-1]
    q = torch.cat((ql_nope, q_pe), dim=-1)
    o = torch.zeros(q.shape[0], q.shape[1], L, dtype=q.dtype, device=q.device)
    lse = torch.zeros(q.shape[0], q.shape[1], dtype=q.dtype, device=q.device)
    kv = kv_cache.unsqueeze(2)
    decode_attention_fwd(
        q,
        kv,
        kv[..., :L],
        o,
        lse,
        block_table,
        seq_lens,
        attn_logits,
        attn_logits.shape[2],
        sm_scale,
        kv.size(1),
        k_scale=k_scale,
        v_scale=k_scale,
        is_mla=True,
    )
    return o


def vllm_num_kv_splits(max_seq_len: int, sm_count: int) -> int:
    """vLLM 0.33 triton_mla.py _compute_num_kv_splits (min work per split 512, 2 x SMs cap)."""
    import triton

    return min(triton.next_power_of_2(max(1, max_seq_len // 512)), sm_count * 2)
