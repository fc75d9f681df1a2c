"""merge_attn_states: LSE merge of two partial attentions, in place, any strides.

Kernels: hip_src/kernels/merge_attn_states.cuh (HIP), rocm_mla/kernels/merge_attn_states.py
(Triton). Reference: rocm_mla/reference/merge.py.
"""

from __future__ import annotations

import torch
import triton

from .. import _ext, _platform
from ..configs import config_for
from ..kernels.merge_attn_states import merge_attn_states_kernel
from ..reference.merge import merge_attn_states_ref
from ..triton_common import amd_options
from ._checks import FLOAT_DTYPES, Checker
from ._dispatch import select

OP = "merge_attn_states"


def merge_attn_states(
    output: torch.Tensor,
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
    output_lse: torch.Tensor | None = None,
    *,
    backend: str | None = None,
    batch_invariant: bool = False,
) -> None:
    """Merge two partial attention results by their log-sum-exps, writing ``output`` in place.

    Args:
        output: ``[T, N, D]`` destination, float32/float16/bfloat16, any strides (e.g. the
            ``[T, N, 192][..., :128]`` pad_v view, or a head slice of a wider buffer). Only the
            elements of this view are written; every one of them is. It may be prefix_output or
            suffix_output itself (the same view), but not a view overlapping them otherwise.
        prefix_output, suffix_output: ``[T, N, D]``, output's dtype, any strides.
        prefix_lse, suffix_lse: ``[N, T]`` float32 natural-log LSEs, any strides (e.g. the
            transpose of a ``[T, N]`` buffer). +inf is read as -inf ("saw no key").
        output_lse: optional ``[N, T]`` float32 destination for the merged LSE; it may not share
            memory with output or any input (prefix_lse / suffix_lse included).
        backend: ``"hip"``, ``"triton"`` or ``"reference"`` to force one (default: fastest
            available; see ``rocm_mla.ops._dispatch``).
        batch_invariant: a row's result bitwise the same whatever T, the other rows and the
            strides (docs/batch-invariance.md). Always so: each (token, head) row is merged on
            its own, by a backend chosen from the device alone; the keyword states the
            requirement, and is checked to be a bool.

    Per row: ``out = w_p * prefix + w_s * suffix`` with ``w = softmax([lse_p, lse_s])``; a side
    with weight 0 is not read; both sides -inf gives 0 and lse -inf; a NaN lse on either side (a
    partial attention that saw a NaN) gives that row NaN out and NaN lse -- never "no key". Any
    head size D >= 0 (D = 0: only output_lse is written). T = 0 or N = 0: nothing to do.

    Memory: reads and writes only the elements of the given views; the overlaps above are
    rejected on the host (pointer arithmetic: no sync, capturable).

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came.
    """
    c = Checker(OP)
    if not isinstance(batch_invariant, bool):
        c.fail("batch_invariant", "a bool", repr(batch_invariant), TypeError)
    c.tensor("output", output, ndim=3, layout="[T, N, D]", dtypes=FLOAT_DTYPES)
    T, N, D = output.shape
    c.tensor("prefix_output", prefix_output, shape=(T, N, D), layout="[T, N, D]", like="output's")
    c.tensor("suffix_output", suffix_output, shape=(T, N, D), layout="[T, N, D]", like="output's")
    c.same_dtype("output", output, prefix_output=prefix_output, suffix_output=suffix_output)
    f32 = (torch.float32,)
    c.tensor("prefix_lse", prefix_lse, shape=(N, T), layout="[N, T]", dtypes=f32, like="output's N, T")
    c.tensor("suffix_lse", suffix_lse, shape=(N, T), layout="[N, T]", dtypes=f32, like="output's N, T")
    if output_lse is not None:
        c.tensor("output_lse", output_lse, shape=(N, T), layout="[N, T]", dtypes=f32, like="output's N, T")
    # output may be prefix_output or suffix_output itself (each element is read, then written, by
    # one thread); any other overlap of a destination with what the op reads is a race. Several
    # threads read a row's lse while one writes output_lse: it may not alias an input lse.
    c.arguments(
        {"output": output, "output_lse": output_lse},
        {
            "prefix_output": prefix_output,
            "suffix_output": suffix_output,
            "prefix_lse": prefix_lse,
            "suffix_lse": suffix_lse,
        },
        identical_ok=(("output", "prefix_output"), ("output", "suffix_output")),
    )

    impl = select(OP, output.device, backend)
    if output.numel() == 0 and (output_lse is None or output_lse.numel() == 0):
        return
    if impl == "hip":
        cfg = config_for(OP, _platform.device_arch(output.device))["hip"]["tiers"][0]
        _ext.load().merge_attn_states(
            output,
            output_lse,
            prefix_output,
            prefix_lse,
            suffix_output,
            suffix_lse,
            int(cfg["waves_per_block"]),
            int(cfg["vecs_per_thread"]),
        )
    elif impl == "triton":
        _launch_triton(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse)
    else:
        out, lse = merge_attn_states_ref(prefix_output, prefix_lse, suffix_output, suffix_lse)
        output.copy_(out)
        if output_lse is not None:
            output_lse.copy_(lse)


def triton_meta(head_size: int, has_out_lse: bool, arch: str) -> tuple[dict, dict]:
    """``(constexprs, compile options)`` of one Triton launch for ``head_size`` on ``arch``: the
    single place the launch and the ISA report's variants (rocm_mla/variants/merge.py) take them
    from."""
    cfg = config_for(OP, arch)["tiers"][0]
    block_d = triton.next_power_of_2(max(1, head_size))
    block_rows = max(1, cfg["tile_elems"] // block_d)
    options = {"num_warps": cfg["num_warps"], **amd_options(cfg, arch)}
    return {
        "HEAD_SIZE": head_size,
        "BLOCK_D": block_d,
        "BLOCK_ROWS": block_rows,
        "HAS_OUT_LSE": bool(has_out_lse),
    }, options


def _launch_triton(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse):
    T, N, D = output.shape
    num_rows = T * N
    consts, options = triton_meta(D, output_lse is not None, _platform.device_arch(output.device))
    grid = (triton.cdiv(num_rows, consts["BLOCK_ROWS"]),)
    olse = output_lse if output_lse is not None else prefix_lse  # unused when HAS_OUT_LSE=False
    olse_strides = output_lse.stride() if output_lse is not None else (0, 0)
    o_st, p_st, s_st = output.stride(), prefix_output.stride(), suffix_output.stride()
    if D == 0:
        # Only output_lse is written (the dim mask is all false). Empty tensors may carry a null
        # pointer, which the launcher rejects: hand it an lse tensor's (never dereferenced).
        output = prefix_output = suffix_output = prefix_lse
    merge_attn_states_kernel[grid](
        output,
        olse,
        prefix_output,
        prefix_lse,
        suffix_output,
        suffix_lse,
        num_rows,
        N,
        *o_st,
        *p_st,
        *s_st,
        *prefix_lse.stride(),
        *suffix_lse.stride(),
        *olse_strides,
        **consts,
        **options,
    )
