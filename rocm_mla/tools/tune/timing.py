"""The tuner's timer: one ``Case`` timed the way perf/ times the op (rocm_mla.tools.timing's graph timers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .inputs import Case


# How long each timer samples: long enough to hold many calls of the slowest tuned shape, short
# enough that a whole tuning group stays interactive.
ROTATING_SAMPLE_MS = 15  # one sample of the rotating-copies timer
ROTATING_SAMPLES = 3  # samples; their median is the time
GRAPH_WARMUP_MS = 5  # do_bench's warm-up of one captured call
GRAPH_REP_MS = 30  # do_bench's replays of it


def time_case_us(case: Case) -> float:
    """Time of one call of ``case`` in us. On a GPU: a case with several input copies (decode) as
    back-to-back replays of graphs of 8 calls rotating over the copies (each call reads its KV from
    HBM), ``ROTATING_SAMPLES`` samples of ``ROTATING_SAMPLE_MS`` each, their median; the others as
    one captured call replayed under do_bench (L2 flushed before each replay) with
    ``GRAPH_WARMUP_MS`` / ``GRAPH_REP_MS``. Elsewhere the wall time of one call after a warm-up
    call (the interpreter: the number says nothing about a GPU)."""
    from rocm_mla.tools.timing import graph_ms, rotating_graph_us, wall_ms

    if case.dev.type != "cuda":
        return wall_ms(case.fn, reps=1) * 1e3
    if case.copies > 1:
        return rotating_graph_us(case.call, case.copies, min_ms=ROTATING_SAMPLE_MS, reps=ROTATING_SAMPLES)
    return graph_ms(case.fn, warmup_ms=GRAPH_WARMUP_MS, rep_ms=GRAPH_REP_MS) * 1e3
