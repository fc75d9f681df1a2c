"""The vLLM test harness (tests/vllm_backend/ and the layer-step and DCP scripts of ``perf/`` import it; it
lives outside the wheel: nothing in ``rocm_mla`` needs it at run time). Importable with tests/ on
sys.path (pytest's conftest puts it there; the perf scripts insert it).

* ``layer_step``: one MLA layer step through a vLLM attention backend (0.33 or 0.34) on vLLM's own objects, a
  simulated gfx942 ROCm platform for machines without one, stubs of vLLM's compiled-op schemas,
  the float32 result of the step from ``rocm_mla.reference``, and the bounds of a whole layer step
  (not one op, so not in rocm_mla.cases): LAYER_TOLERANCE, COMPILED_VS_EAGER, DCP_TOLERANCE,
  LAYER_AGREEMENT.
* ``dcp``: decode context parallelism through vLLM's own DCP code, W ranks emulated in one
  process (``python -m vllm_harness.dcp`` from tests/) or run as real ranks (perf/dcp_two_ranks.py).

Both patch vLLM (its platform, its model-inspection subprocess, its dispatch keys) for the
duration of a test process: never import them in a serving process.
"""

# The vLLM releases the backend is written and tested against (CI installs the first; docs/vllm.md
# gives the command that runs the vLLM tests against the other).
from rocm_mla.vllm import SUPPORTED_VLLM  # noqa: E402


def require_vllm() -> None:
    """Skip the calling test module unless a supported vLLM (``SUPPORTED_VLLM``) imports with its
    attention registry; call it before importing anything from vLLM or from
    ``layer_step``/``dcp``."""
    import pytest

    want = " or ".join(SUPPORTED_VLLM)
    try:
        import vllm
        from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: F401
    except Exception as e:  # not installed, or installed without its pinned dependencies
        pytest.skip(
            f"vLLM {want} is not importable ({type(e).__name__}: {e}); .ci/install_vllm_cpu.sh installs it",
            allow_module_level=True,
        )
    if vllm.__version__ not in SUPPORTED_VLLM:
        pytest.skip(
            f"the ROCM_MLA backend is written against vLLM {want}, found {vllm.__version__}", allow_module_level=True
        )


def process_weights(layer, dtype) -> None:
    """``MLAAttention.process_weights_after_loading`` as the installed vLLM takes it: 0.33 passes the
    activation dtype, 0.34 reads the layer's own ``act_dtype``."""
    import inspect

    if "act_dtype" in inspect.signature(layer.process_weights_after_loading).parameters:
        layer.process_weights_after_loading(dtype)
    else:
        layer.process_weights_after_loading()
