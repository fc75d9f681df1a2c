"""Former home of the context-chunk gather, now the op ``rocm_mla.ops.gather_context_chunk``
(rocm_mla/ops/context_gather.py: kernel, checks, config and ISA variants live with the other ops).

Kept only so that ``from rocm_mla.vllm.context_gather import gather_context_chunk`` keeps working
(perf/bench_layer_copies.py); new code imports the op from ``rocm_mla.ops``.
"""

from rocm_mla.ops.context_gather import gather_context_chunk

__all__ = ["gather_context_chunk"]
