"""Every op's cases in one place: the input builder, the named shape sets, the tolerance (one table
per op) and the check against the float32 reference. Tests, the doctor's self-check, the tuner and
the benchmarks take their inputs and their verdicts from here; nothing else builds a paged cache or
holds a tolerance.

One module per op, each with the same parts:

==================  =================  ===================================================  ====================
module              shape              ``make_inputs(shape, *, dtype, device, seed, ...)``  named sets
==================  =================  ===================================================  ====================
``decode``          DecodeShape        DecodeInputs (paged cache, vLLM's q views, copies)   tp8 dp mtp serving
``prefill``         PrefillShape       PrefillInputs (varlen, k_nope/v views, k_pe slice)   bench tune reference
``merge``           MergeShape         MergeInputs (pad_v / head-slice / strided layouts)   bench tune
``rope_kv_write``   RopeShape          RopeInputs (q_pe/k_pe slices, slots, fp8 cache)      bench tune
``context_gather``  ChunkShape         ChunkInputs (vLLM's chunk indexing)                  selfcheck odd
``sparse``          SparseShape        SparseInputs (top-k lists, paged cache, q views)     bench quick tune
``indexer_cache``   IndexerCacheShape  IndexerCacheInputs (k slice, slots, 0xFF cache)      selfcheck odd bench
``indexer_topk``    IndexerShape       IndexerInputs (0xFF-poisoned key cache, q slice)     bench quick tune
``v4_attention``    V4Shape            V4Inputs (fp8_ds_mla caches, slot lists, sink)       selfcheck odd bench tune
==================  =================  ===================================================  ====================

Every module also has ``SHAPES["tiny" | "selfcheck" | "verify" | "odd" | "quick"]`` where they apply,
and ``TOLERANCE[dtype][output] -> Bound``. An inputs object has ``args()`` / ``kwargs()`` (the op's
call), ``run(**overrides)``, ``reference(...)`` (float32), ``compare(...)`` (a list of
:class:`Comparison`), ``mismatch(...)`` ('' or a readable sentence) and ``check(...)`` (raises
:class:`CaseMismatch`, an AssertionError). The rule (:mod:`._compare`): NaN and infinities where
the reference has them, ``|got - ref| <= atol + rtol * |ref|`` element-wise, and, where a bound has
one, ``||got - ref|| <= norm * ||ref||``.

``copies=R`` (decode, context_gather) gives R independent (cache, block table) pairs with fresh page
permutations, ``args(i)`` / ``run(i)`` the call on copy i; ``rope_kv_write.make_copies(shape, R)``
gives R whole input sets (the op writes its inputs). ``cold_copies(set_bytes, cold_bytes)`` says how
many copies a cold-L2 rotation needs.

Random values are fresh normal draws (never zeros) from a generator on the target device
(``seed=``, or ``gen=``); unused cache pages, page tails and output buffers hold NaN.

A test (CPU: float32/float16 in the Triton interpreter)::

    from rocm_mla.cases import decode

    case = decode.make_inputs(decode.DecodeShape(N=16, q_len=2, block=16, lens=(37, 5, 70)),
                              dtype=torch.float16, device=DEVICE, q_layout="one_buffer",
                              out_layout="padded", lse_layout="transposed")
    case.run(backend="triton", num_splits=3)
    case.check()                                   # raises CaseMismatch naming out or lse
    assert outside_untouched(case.out_base, case.out)

The tuner (``rocm-mla tune``: build once, check a candidate config, time it over cold copies)::

    from rocm_mla.cases import cold_copies, decode

    for shape in decode.SHAPES["tp8"] + decode.SHAPES["dp"] + decode.SHAPES["mtp"]:
        R, cold = cold_copies(shape.set_bytes(torch.bfloat16), cold_cache_bytes(dev))
        case = decode.make_inputs(shape, dtype=torch.bfloat16, device=dev, copies=R, spare_cols=0)
        case.run(config=cfg, max_seq_len=shape.seq)
        bad = case.mismatch(requests=2)            # '' = accepted; else the reason, for the report
        us = rotating_graph_us(lambda i: case.run(i, config=cfg, max_seq_len=shape.seq), R)

A benchmark (peers beside ours, every output checked the same way)::

    from rocm_mla.cases import prefill

    for shape in prefill.SHAPES["bench"]:
        case = prefill.make_inputs(shape, dtype=torch.bfloat16, device=dev)
        case.run(backend="triton")
        wrong = case.mismatch(first_rows=128)      # long sequences: the first 128 causal rows
        peer_out = ...                             # a peer's [T, N, 128] on the same tensors
        wrong_peer = case.mismatch(peer_out, case.lse, first_rows=128)
        gflops = shape.flops() / seconds / 1e9

Nothing here imports pytest, perf/ or tools/; the modules use rocm_mla.reference (the yardstick),
rocm_mla.ops (to run the op) and the platform's fp8 kind (``platform_fp8``).
"""

from . import context_gather, decode, indexer_cache, indexer_topk, merge, prefill, rope_kv_write, sparse, v4_attention
from ._buffers import SENTINEL, Guarded, outside_untouched, poisoned
from ._compare import Bound, CaseMismatch, Comparison, compare, dtype_name, first_problem, raise_on
from ._paged import PagedCache, cold_copies, generator, nan_filled, paged_cache, platform_fp8, randn, to_fp8

__all__ = [
    "Bound",
    "CaseMismatch",
    "Comparison",
    "Guarded",
    "PagedCache",
    "SENTINEL",
    "cold_copies",
    "compare",
    "context_gather",
    "decode",
    "dtype_name",
    "first_problem",
    "generator",
    "indexer_cache",
    "indexer_topk",
    "merge",
    "nan_filled",
    "outside_untouched",
    "paged_cache",
    "platform_fp8",
    "poisoned",
    "prefill",
    "raise_on",
    "randn",
    "rope_kv_write",
    "sparse",
    "to_fp8",
    "v4_attention",
]
