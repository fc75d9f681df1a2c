"""The prefill tests' glue over rocm_mla.cases.prefill: inputs on the test device from plain
length lists, the backends with a prefill kernel."""

from __future__ import annotations

from _util import DEVICE, backends

from rocm_mla.cases import prefill

KERNEL_BACKENDS = [b for b in backends() if b == "triton"]


def case(lq, lk, N, dtype, *, causal=True, seed=0, **layouts) -> prefill.PrefillInputs:
    """prefill.make_inputs of ``lq`` queries over ``lk`` keys per sequence, N heads, on DEVICE
    (``layouts``: make_inputs' keywords: kpe_layout, out_layout, key_tail, guard, ...)."""
    shape = prefill.PrefillShape(tuple(lq), N, lk=tuple(lk), causal=causal)
    return prefill.make_inputs(shape, dtype=dtype, device=DEVICE, seed=seed, **layouts)


def cu(lengths, start=0):
    """cu_seqlens [B + 1] int32 on DEVICE, from ``start`` (rows before it belong to no sequence)."""
    return prefill.cu_seqlens(lengths, DEVICE, start=start)
