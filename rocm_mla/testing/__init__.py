"""Test scaffolding shipped with the package (the tests and the ``perf/`` scripts import it; the
runtime package never does: nothing under ``rocm_mla/`` outside this folder imports it).

* ``harness``: one MLA layer step through a vLLM 0.33 attention backend on vLLM's own objects, a
  simulated gfx942 ROCm platform for machines without one, stubs of vLLM's compiled-op schemas,
  and the float32 result of the step from ``rocm_mla.reference``.
* ``dcp_check``: decode context parallelism through vLLM's own DCP code, W ranks emulated in one
  process (``python -m rocm_mla.testing.dcp_check``) or run as real ranks (perf/dcp_two_ranks.py).

Both patch vLLM (its platform, its model-inspection subprocess, its dispatch keys) for the
duration of a test process: never import them in a serving process.
"""
