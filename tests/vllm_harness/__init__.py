"""The vLLM test harness (tests/vllm_backend/ and the layer-step and DCP scripts of ``perf/`` import it; it
lives outside the wheel: nothing in ``rocm_mla`` needs it at run time). Importable with tests/ on
sys.path (pytest's conftest puts it there; the perf scripts insert it).

* ``layer_step``: one MLA layer step through a vLLM 0.33 attention backend on vLLM's own objects, a
  simulated gfx942 ROCm platform for machines without one, stubs of vLLM's compiled-op schemas,
  the float32 result of the step from ``rocm_mla.reference``, and the bounds of a whole layer step
  (not one op, so not in rocm_mla.cases): LAYER_TOLERANCE, COMPILED_VS_EAGER, DCP_TOLERANCE,
  LAYER_AGREEMENT.
* ``dcp``: decode context parallelism through vLLM's own DCP code, W ranks emulated in one
  process (``python -m vllm_harness.dcp`` from tests/) or run as real ranks (perf/dcp_two_ranks.py).

Both patch vLLM (its platform, its model-inspection subprocess, its dispatch keys) for the
duration of a test process: never import them in a serving process.
"""
