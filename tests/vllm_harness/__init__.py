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


def require_vllm() -> None:
    """Skip the calling test module unless vLLM 0.33.0 imports with its attention registry (the
    backend is written against that version); call it before importing anything from vLLM or
    from ``layer_step``/``dcp``."""
    import pytest

    try:
        import vllm
        from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: F401
    except Exception as e:  # not installed, or installed without its pinned dependencies
        pytest.skip(
            f"vLLM 0.33.0 is not importable ({type(e).__name__}: {e}); .ci/install_vllm_cpu.sh installs it",
            allow_module_level=True,
        )
    if vllm.__version__ != "0.33.0":
        pytest.skip(
            f"the ROCM_MLA backend is written against vLLM 0.33.0, found {vllm.__version__}", allow_module_level=True
        )
