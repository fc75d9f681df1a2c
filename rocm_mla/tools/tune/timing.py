"""The tuner's timer: one ``Case`` timed the way perf/ times the op (rocm_mla.tools.timing's graph timers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .inputs import Case


def time_case_us(case: Case) -> float:
    """Time of one call of ``case`` in us. On a GPU: a case with several input copies (decode) as
    back-to-back replays of graphs of 8 calls rotating over the copies (each call reads its KV from
    HBM), 15 ms per sample, median of 3; the others as one captured call replayed under do_bench
    (L2 flushed before each replay), warm-up 5 ms, 30 ms of replays. Elsewhere the wall time of one
    call after a warm-up call (the interpreter: the number says nothing about a GPU)."""
    from rocm_mla.tools.timing import graph_ms, rotating_graph_us, wall_ms

    if case.dev.type != "cuda":
        return wall_ms(case.fn, reps=1) * 1e3
    if case.copies > 1:
        return rotating_graph_us(case.call, case.copies, min_ms=15, reps=3)
    return graph_ms(case.fn, warmup_ms=5, rep_ms=30) * 1e3
