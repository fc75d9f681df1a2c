"""Test-only helpers shared by the op tests: the device, the dtypes the interpreter gets right, the
backends that can run here, the raises-and-names check, bad scales, the no-sync/capturable check and
decode's page-guard tile configs. Inputs, poisoned and guarded buffers, tolerances and the one
comparison rule live in the package (``rocm_mla.cases``), shared with doctor, the tuner and the
benches.

The memory-safety contract that each op's ``tests/<op>/test_<op>_memory_safety.py`` checks
(docs/bad-input.md):

1. No op reads or writes outside the tensors it was given, whatever the values in slot_mapping,
   positions, block_table, seq_lens and cu_seqlens, debug off. Every destination and cache there
   lives inside a larger buffer whose other elements hold a sentinel (``rocm_mla.cases.Guarded``):
   a guard byte that changes fails the test, and a stray *read* of a (finite) sentinel shows up as
   a finite result where NaN is required.
2. Debug mode names the argument, the index and the bound.
3. A destination that overlaps an input, a cache it reads or the other destination is a
   ValueError naming both (host pointer arithmetic), except the documented in-place aliases.
4. The reference backend follows the same contract.
5. Zero sizes work with every optional output; scales are validated alike.

Inputs are fresh random values, destinations are poisoned with NaN (every element must be
written) and sizes are odd. CPU: Triton in the interpreter, the reference, and the HIP kernels
compiled for the host (tests/_hip_cpu.py). ``@pytest.mark.gpu`` tests run the real HIP and
Triton kernels; on a GPU run those files under ``compute-sanitizer --tool memcheck``.
"""

from __future__ import annotations

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda") if HAS_GPU else torch.device("cpu")

# bf16 dots and adds are wrong in the Triton CPU interpreter (upstream triton issue 11584):
# bf16 is covered on the GPU only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_GPU else [])


def backends() -> list[str]:
    """Implementations that can run here: reference always, Triton (GPU or interpreter), HIP on GPU."""
    from rocm_mla.ops._dispatch import unavailable

    return [b for b in ("hip", "triton", "reference") if unavailable(b, DEVICE) is None]


def raises_naming(exc, fn, *words) -> str:
    """``fn()`` raises ``exc`` whose message holds every one of ``words``; returns the message."""
    import pytest

    with pytest.raises(exc) as err:
        fn()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    return str(err.value)


# Bad sm_scale values with the error each op raises and the words the message holds
# (one rule, Checker.scale, for decode and prefill).
BAD_SCALES = [
    ("x", TypeError, ["a float", "str"]),
    (True, TypeError, ["a float", "bool"]),
    (0.0, ValueError, ["finite number > 0", "0.0"]),
    (-1, ValueError, ["finite number > 0", "-1"]),
    (float("nan"), ValueError, ["finite number > 0", "nan"]),
    (float("inf"), ValueError, ["finite number > 0", "inf"]),
]


def assert_no_sync_and_capturable(ops, guarded):
    """Each of ``ops`` (callables that run an op with caller-given destinations, so its overlap
    checks run) runs under torch's sync debug mode (raises on a synchronising call), on a side
    stream and inside a CUDA graph capture that is then replayed; the ``Guarded`` buffers in
    ``guarded`` keep their guards. GPU only."""
    for op in ops:
        op()  # compile / build outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for op in ops:
            op()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for op in ops:
            op()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for op in ops:
            op()
    g.replay()
    torch.cuda.synchronize()
    for x in guarded:
        x.check()


# mla_decode's CPU tile with each form of the page guard: a 16-row, 16-token tile in one stage,
# checking the block-table entries before the loop (CHECK_CFG) or clamping each tile's page into
# the cache in the loop and checking the entries after it (CLAMP_CFG; it acts where a tile lies in
# one page). The default is per arch (AMD clamps; sm90 clamps with fp8 caches at 16 rows).
CLAMP_CFG = {"BLOCK_H": 16, "BLOCK_N": 16, "D_SPLIT": 1, "num_warps": 4, "num_stages": 1, "CLAMP_PAGES": True}
CHECK_CFG = {**CLAMP_CFG, "CLAMP_PAGES": False}
PAGE_GUARD_CFGS = [pytest.param(CHECK_CFG, id="check_first"), pytest.param(CLAMP_CFG, id="clamp")]


class GuardedLatentCase:
    """A latent-attention batch (``inputs``: rocm_mla.cases' DecodeInputs or SparseInputs) with
    out ``[rows, N, 512]`` (8 elements after each row) and lse ``[rows, N]`` (1 after each row)
    as Guarded views that start random (finite), so an unwritten row fails the comparison; the
    inputs' own attributes (q_nope, block_table, reference, ...) read through."""

    def __init__(self, inputs, rows: int, N: int, dtype: torch.dtype, seed: int):
        from rocm_mla.cases import Guarded, generator
        from rocm_mla.mla_dims import KV_LORA_RANK

        self.inputs = inputs
        g = generator(seed + 1, "cpu")
        self.out = Guarded((rows, N, KV_LORA_RANK), dtype, device=DEVICE, fill="randn", pad_last=8, generator=g)
        self.lse = Guarded((rows, N), torch.float32, device=DEVICE, fill="randn", pad_last=1, generator=g)

    @property
    def kv(self) -> torch.Tensor:
        return self.inputs.kv_cache

    @property
    def nb(self) -> int:
        """Pages in the cache."""
        return self.kv.shape[0]

    def __getattr__(self, name):
        if name == "inputs":
            raise AttributeError(name)
        return getattr(self.inputs, name)

    def run(self, backend, **kw):
        """The op on the guarded out / lse, on ``backend`` (a given ``plan=`` holds its own)."""
        kw.setdefault("out", self.out.view)
        kw.setdefault("lse", self.lse.view)
        if kw.get("plan") is None:
            kw["backend"] = backend
        return self.inputs.run(**kw)

    def check_guards(self) -> None:
        """No guard byte of out, lse or the cache changed."""
        self.out.check("out")
        self.lse.check("lse")
        self.inputs.paged.check_guards("kv_cache")
