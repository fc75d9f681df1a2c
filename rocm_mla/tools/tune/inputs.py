"""The tuner's calls on ``rocm_mla.cases`` inputs.

``CASES[op](shape, dev)`` builds the :class:`Case` of one timed shape from the op's ``make_inputs``
(decode, sparse, the indexer and v4: cache copies for the cold-cache rotation, ``cold_copies``;
decode's block table as wide as the longest request, the width the plan sees in serving); its
``call(i)`` is the public op on input copy i as a serving process calls it (a candidate config
reaches it through ``rocm_mla.configs.override``), its ``check()`` that call against the float32
reference on a subset of rows, under the op's ``TOLERANCE`` (the indexer: a valid top-k of float64
logits). :func:`verify_call` is one small checked call on a ``verify``
shape of the cases (a changed config's acceptance, ``rocm-mla tune --check``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rocm_mla.cases import cold_copies, decode, indexer_topk, merge, prefill, rope_kv_write, sparse, v4_attention

from .shapes import CASE_MODULES, Shape

# Rows the check of a timed call compares: serving shapes hold up to 32k tokens, and the float32
# reference of all of them would take longer than the search.
CHECK_REQUESTS = 2  # decode: the first 2 requests (all their q_len rows)
CHECK_PREFILL_ROWS = 128  # prefill: the first 128 causal queries of sequence 0
CHECK_TOKENS = 256  # merge, rope_kv_write: the first 256 tokens
CHECK_SPARSE_ROWS = 8  # sparse: the first 8 query rows (each a K-entry gather of the reference)
CHECK_INDEXER_ROWS = 8  # indexer: the first 8 query rows (float64 logits of every key each sees)
CHECK_V4_ROWS = 8  # v4: the first 8 query rows (each a window + compressed gather of the float64 reference)


@dataclass
class Case:
    """One timed shape on ``dev``: ``call(i)`` runs the op on input copy ``i`` of ``copies``
    (``timing.time_case_us`` times it), ``fn()`` on copy 0; ``check()`` runs it once and returns
    '' when the result matches the reference, else what differs. ``inputs``: the cases object."""

    dev: torch.device
    inputs: Any
    call: Callable[[int], object]
    checked: Callable[[], str]
    copies: int = 1

    def fn(self) -> None:
        self.call(0)

    def check(self) -> str:
        return self.checked()


def decode_case(s: Shape, dev: torch.device) -> Case:
    """mla_decode (Triton) with q as vLLM hands it over, max_seq_len given, an fp8 cache as uint8."""
    from rocm_mla.tools.timing import cold_cache_bytes

    shape, dt = s.case_shape, s.dtype(dev)
    copies, _ = cold_copies(shape.set_bytes(dt), cold_cache_bytes(dev) if dev.type == "cuda" else 0)
    inp = decode.make_inputs(shape, dtype=dt, device=dev, copies=copies, spare_cols=0)

    def call(i: int):
        return inp.run(i, backend="triton", max_seq_len=shape.seq)

    def check() -> str:
        call(0)
        return inp.mismatch(requests=CHECK_REQUESTS)

    return Case(dev, inp, call, check, copies)


def sparse_case(s: Shape, dev: torch.device) -> Case:
    """mla_sparse_attention (Triton) with q as vLLM hands it over, an fp8 cache as uint8 with a
    device k_scale, rotating over cache copies (the lists hold positions, so they hold for every
    copy)."""
    from rocm_mla.tools.timing import cold_cache_bytes

    shape, dt = s.case_shape, s.dtype(dev)
    copies, _ = cold_copies(shape.set_bytes(dt), cold_cache_bytes(dev) if dev.type == "cuda" else 0)
    inp = sparse.make_inputs(shape, dtype=dt, device=dev, copies=copies, spare_cols=0)

    def call(i: int):
        return inp.run(i, backend="triton")

    def check() -> str:
        call(0)
        return inp.mismatch(rows=CHECK_SPARSE_ROWS)

    return Case(dev, inp, call, check, copies)


def v4_case(s: Shape, dev: torch.device) -> Case:
    """mla_v4_attention (Triton) on vLLM's fp8_ds_mla caches (or 16-bit ones) with the sink and
    the inverse RoPE, rotating over cache copies (the lists hold positions, turned into each
    copy's global slots). The check poisons the rows it reads first (a call that writes nothing
    cannot pass on an earlier candidate's answer)."""
    from rocm_mla.tools.timing import cold_cache_bytes

    shape, dt = s.case_shape, s.dtype(dev)
    copies, _ = cold_copies(shape.set_bytes(dt), cold_cache_bytes(dev) if dev.type == "cuda" else 0)
    inp = v4_attention.make_inputs(shape, dtype=dt, device=dev, copies=copies)

    def call(i: int):
        return inp.run(i, backend="triton")

    def check() -> str:
        inp.out[:CHECK_V4_ROWS].fill_(float("nan"))
        inp.lse[:CHECK_V4_ROWS].fill_(float("nan"))
        call(0)
        return inp.mismatch(rows=CHECK_V4_ROWS)

    return Case(dev, inp, call, check, copies)


def indexer_case(s: Shape, dev: torch.device) -> Case:
    """mla_indexer_topk (Triton) with q as vLLM hands it over (an fp8 slice, the platform's kind),
    rotating over key-cache copies, with a plan made once per launch config (the one
    ``config_for`` returns when the call is made: the candidate's) and its workspace allocated
    with it, as a serving step plans once for every layer. The check poisons the rows it reads
    first (a call that writes nothing cannot pass on an earlier candidate's answer)."""
    from rocm_mla import _platform
    from rocm_mla import configs as C
    from rocm_mla.ops.indexer_topk_plan import OP
    from rocm_mla.tools.timing import cold_cache_bytes

    shape = s.case_shape
    copies, _ = cold_copies(shape.set_bytes(), cold_cache_bytes(dev) if dev.type == "cuda" else 0)
    inp = indexer_topk.make_inputs(shape, device=dev, copies=copies)
    arch = _platform.device_arch(dev)
    held: dict = {}  # the current config's (key, plan, workspace): one workspace alive at a time

    def prepared():
        key = json.dumps(C.config_for(OP, arch), sort_keys=True)
        if held.get("key") != key:
            held.clear()
            plan = inp.plan(backend="triton")
            ws = torch.empty(max(plan.workspace_numel, 1), dtype=torch.int32, device=dev)
            held.update(key=key, plan=plan, ws=ws)
        return held["plan"], held["ws"]

    def call(i: int):
        plan, ws = prepared()
        return inp.run(i, plan=plan, workspace=ws)

    def check() -> str:
        inp.out[:CHECK_INDEXER_ROWS].fill_(indexer_topk.POISON_OUT)
        call(0)
        return inp.mismatch(rows=CHECK_INDEXER_ROWS)

    return Case(dev, inp, call, check, copies)


def prefill_case(s: Shape, dev: torch.device) -> Case:
    """mla_prefill causal on k_nope / v views of kv_b_proj's output, out into the layer's buffer."""
    inp = prefill.make_inputs(s.case_shape, dtype=s.dtype(dev), device=dev)

    def check() -> str:
        inp.run()
        return inp.mismatch(first_rows=CHECK_PREFILL_ROWS)

    return Case(dev, inp, lambda i: inp.run(), check)


def merge_case(s: Shape, dev: torch.device) -> Case:
    """merge_attn_states in the shape's layout, output_lse written."""
    inp = merge.make_inputs(s.case_shape, dtype=s.dtype(dev), device=dev)

    def check() -> str:
        inp.run()
        return inp.mismatch(rows=CHECK_TOKENS)

    return Case(dev, inp, lambda i: inp.run(), check)


def rope_case(s: Shape, dev: torch.device) -> Case:
    """fused_rope_mla_kv_write on DeepSeek's layout with the cos/sin table in the model dtype, as
    vLLM keeps it (DeepSeek-V3's 163840 positions on a GPU). The timed calls rotate q_pe / k_pe
    over and over; the check restores the originals first."""
    dt = s.dtype(dev)
    max_pos = rope_kv_write.MAX_POS if dev.type == "cuda" else 4096
    inp = rope_kv_write.make_inputs(s.case_shape, dtype=dt, device=dev, max_pos=max_pos, cs_dtype=dt)

    def check() -> str:
        inp.restore()
        inp.run()
        return inp.mismatch(rows=CHECK_TOKENS)

    return Case(dev, inp, lambda i: inp.run(), check)


CASES: dict[str, Callable[[Shape, torch.device], Case]] = {
    "decode": decode_case,
    "prefill": prefill_case,
    "merge": merge_case,
    "rope_kv_write": rope_case,
    "sparse": sparse_case,
    "indexer": indexer_case,
    "v4": v4_case,
}


def verify_call(op: str, shape, dev: torch.device, dtype: torch.dtype | None, make: dict | None = None, **run) -> str:
    """The public op once on fresh inputs of the cases shape ``shape`` (seed 7; ``make``: more
    ``make_inputs`` keywords; ``dtype`` None: an op whose inputs have no dtype choice, the
    indexer's fp8), every output against the float32 reference: '' or what differs. ``run``: the
    op's keywords (backend, num_splits, ...)."""
    kw = dict(make or {}) if dtype is None else {"dtype": dtype, **(make or {})}
    inp = CASE_MODULES[op].make_inputs(shape, device=dev, seed=7, **kw)
    inp.run(**run)
    return inp.mismatch()
