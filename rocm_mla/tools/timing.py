"""The timers and ceilings ``rocm-mla tune`` and ``rocm-mla doctor``'s quick benchmark use; the
perf/ scripts time with the same ones (perf/benchutil.py holds what only they need).

One timer per purpose (each a median):

=====================  ==========================================  ==========================================
timer                  what it measures                            who uses it, and why
=====================  ==========================================  ==========================================
``time_ms``            eager calls, CUDA/HIP events, L2 flushed    bench_merge, bench_rope_kv_write,
                       before each (``triton.testing.do_bench``)   bench_layer, the ceilings: the host cost
                                                                   of a launch is part of what they compare
``graph_ms``           one call captured in a graph, replays       ``rocm-mla tune`` (merge, RoPE, prefill):
                       under ``do_bench`` (L2 flushed)             the kernel without the launcher's host time
``rotating_graph_us``  back-to-back replays of graphs of several   bench_decode and ``rocm-mla tune``'s decode
                       calls, rotating over input copies larger    (short calls reading KV from HBM, as a
                       than the caches                             captured serving step runs them);
                                                                   bench_prefill (one input set, one call a
                                                                   graph)
``wall_ms``            host clock after a warm-up call             CPU runs (Triton interpreter): exercises a
                                                                   timing loop, measures nothing of a GPU
=====================  ==========================================  ==========================================

Also the copy-bandwidth ceiling (``copy_bandwidth_gbs``: a large device-to-device copy, bytes read
+ written, measured in the same process as the kernels it judges), the cold-cache rule
(``cold_cache_bytes``) and the device name results carry (``device_name``).
"""

from __future__ import annotations

import platform
from collections.abc import Callable

import torch


def time_ms(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn`` in milliseconds (events; L2 flushed before each run)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy rate in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda src=src, dst=dst: dst.copy_(src))
    del src, dst
    return 2 * nbytes / ms / 1e6


def device_name(device: torch.device) -> str:
    """The name the results carry for ``device``: the GPU's name, else the host processor's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or "cpu"


def cold_cache_bytes(dev: torch.device) -> int:
    """Bytes of cache an input set must exceed to be read from HBM: the device's L2, and on AMD at
    least the 256 MB Infinity Cache (MI300's last level beside the L2s). Benchmarks rotate over
    copies that together exceed three times this (perf/bench_decode.py, rocm-mla tune)."""
    from rocm_mla import _platform

    props = torch.cuda.get_device_properties(dev)
    size = int(getattr(props, "L2_cache_size", 0) or (50 << 20))
    if _platform.vendor(dev) == "amd":
        size = max(size, 256 << 20)
    return size


def graph_ms(fn: Callable[[], object], warmup_ms: float = 10, rep_ms: float = 50) -> float:
    """Median GPU time in ms of one call of ``fn``, captured in a CUDA/HIP graph and replayed under
    do_bench (L2 flushed before each replay): the host work of the wrapper and of Triton's launcher
    is left out. ``fn`` is called once outside capture first (compiles, allocator pools)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        # thread_local: the HIP extension may be building (and loading) in another thread.
        g.capture_begin(capture_error_mode="thread_local")
        try:
            fn()
        finally:
            g.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    ms = time_ms(g.replay, warmup_ms=warmup_ms, rep_ms=rep_ms)
    del g
    return ms


def rotating_graph_us(
    call: Callable[[int], object], copies: int, min_ms: float = 30.0, reps: int = 5, calls_per_graph: int = 8
) -> float:
    """Median per-call time in us of back-to-back replays of CUDA/HIP graphs that each hold
    ``calls_per_graph`` calls (``call(i)`` uses input copy i), rotating over the copies: with
    copies that together exceed the caches, each call finds its inputs in HBM (perf/bench_decode.py's
    method). Several calls per graph keep the host out of the number: a replay's host cost exceeds a
    short kernel's time (B=1 decode; docs/notes/decode-tiers-and-splits.md), so one-call graphs
    measured the host instead of the kernel; inside one graph consecutive kernels start as a serving
    step's do (vLLM captures whole steps)."""
    import statistics

    if isinstance(calls_per_graph, bool) or not isinstance(calls_per_graph, int) or calls_per_graph < 1:
        raise ValueError(f"rotating_graph_us: calls_per_graph: expected an int >= 1, got {calls_per_graph!r}")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture: compiles, allocator pools
        for i in range(min(copies, 2)):
            call(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    per_graph = calls_per_graph
    graphs = []
    # Graph g holds calls g * per_graph .. (g + 1) * per_graph - 1 of the rotation: every copy is
    # used equally and no copy runs twice in a row (for copies > 1).
    for g_i in range(copies):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local"):
            for k in range(per_graph):
                call((g_i * per_graph + k) % copies)
        graphs.append(g)
    for g in graphs:
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for g in graphs:
        g.replay()
    end.record()
    torch.cuda.synchronize()
    per = start.elapsed_time(end) / len(graphs)
    iters = max(copies, int(min_ms / max(per, 1e-3)))
    samples = []
    for _ in range(reps):
        start.record()
        for k in range(iters):
            graphs[k % copies].replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / (iters * per_graph))
    del graphs
    return statistics.median(samples)


def wall_ms(fn: Callable[[], object], reps: int = 3) -> float:
    """Median wall time in ms of ``fn`` after one warm-up call (CPU runs, e.g. the Triton
    interpreter: it exercises a timing loop, it measures nothing about a GPU)."""
    import statistics

    fn()
    return statistics.median(_host_ms(fn) for _ in range(reps))


def _host_ms(fn: Callable[[], object]) -> float:
    """Host-clock time of one call of ``fn`` in ms."""
    import time

    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3
