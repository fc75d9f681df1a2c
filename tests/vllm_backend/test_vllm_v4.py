"""DeepSeek-V4 and V4.1 on rocm_mla through vLLM's own ROCm layer code (vLLM 0.34 or 0.33, the
simulated gfx942 platform): the hook (``rocm_mla.vllm.v4_layer``) installs, selects by the ROCM_MLA
switch, passes V4.1's backend check, refuses what it cannot serve at construction, and a step of
each layer kind (V4: window-only, CSA, HCA; V4.1: window-only, CSA at ratio 1 and 2, the two-level
indexer's source and masked layers; decode, MTP and prefill rows with context; 8 and 16 heads a
rank on the CPU, up to 128 on the GPU) matches the float64 reference, its indexer's answer a valid
top-k (``vllm_harness.v4_step``).

The steps run in a child process: vLLM's own Triton list builders need its Triton (not its CPU
placeholder), which on a machine without a GPU vLLM enables only when the platform's
visible-devices variable is set and empty at its first import (``dcp.cpu_env``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import torch
from vllm_harness import require_vllm

require_vllm()

from vllm_harness import v4_step  # noqa: E402
from vllm_harness.dcp import cpu_env  # noqa: E402
from vllm_harness.layer_step import use_simulated_gfx942_platform  # noqa: E402

use_simulated_gfx942_platform()

from rocm_mla.vllm import BACKEND_NAME, register, v4_layer  # noqa: E402

register()  # the ROCM_MLA name in vLLM's registry, whichever test of the process runs first

GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def steps() -> dict:
    import vllm

    if vllm.__version__ == "0.33.0" and not GPU:
        # 0.33 rotates the output in its own pass, which writes bf16 only, and the CPU
        # interpreter's bf16 dots are not exact: these steps run on a GPU there.
        pytest.skip("vLLM 0.33's V4 inverse-RoPE pass takes bf16 outputs; bf16 runs on a GPU")
    args = [sys.executable, "-m", "vllm_harness.v4_step"] + (["gpu"] if GPU else [])
    r = subprocess.run(args, env=cpu_env(), capture_output=True, text=True, timeout=1200)
    line = [x for x in r.stdout.splitlines() if x.startswith("V4STEP ")]
    assert r.returncode == 0 and line, f"the V4 step child failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads(line[-1][len("V4STEP ") :])


CASES = [c[0] for c in (v4_step.GPU_CASES if GPU else v4_step.CPU_CASES)]


@pytest.mark.parametrize("name", CASES)
def test_layer_step_matches_the_reference(steps, name):
    r = steps[name]
    assert r["out"] == "", r["out"]
    if "-csa" in name:
        assert r["indexer"] == "", r["indexer"]
        assert r["nan_row"], "a NaN index key did not make its row's output NaN"
        assert r["other_rows_finite"], "a NaN index key reached another request's rows"


@pytest.mark.parametrize("name", [c[0] for c in (v4_step.GPU_CANDIDATE_CASES if GPU else v4_step.CPU_CANDIDATE_CASES)])
def test_two_level_indexer_step(steps, name):
    """V4.1's two-level indexer through the hooked op: the source layer's own top-k and its lists
    (a valid top of the blocks by their largest logit, every row's newest block in, no row past
    the step written), then a later layer's top-k a valid one of the listed blocks' keys and its
    attention output the float64 reference's."""
    r = steps[name]
    assert r["two_level"] == "", r["two_level"]
    assert r["out"] == "", r["out"]


@pytest.mark.gpu
def test_decode_step_replays_in_a_cuda_graph(steps):
    """The indexer and forward_mqa of a decode step captured in one CUDA graph replay the eager
    answer bit for bit (no host sync, no allocation the replay would miss)."""
    assert steps["graph"] == {"v4-window": "", "v4-csa": "", "v4-hca": "", "v4.1-csa1": "", "v4.1-csa1-select": "",
                              "v4.1-csa1-mask": ""}  # fmt: skip


def test_install_hooks_v4_and_v41():
    assert v4_layer.install() == ["DeepSeek-V4", "DeepSeek-V4.1"]
    assert v4_layer.install() == ["DeepSeek-V4", "DeepSeek-V4.1"]  # re-entrant
    assert v4_layer.installed_models() == ["DeepSeek-V4", "DeepSeek-V4.1"]
    import vllm.models.deepseek_v4.amd.model as m4
    import vllm.models.deepseek_v4.amd.rocm as r4

    assert m4.DeepseekV4ROCMAiterMLAAttention is r4.DeepseekV4ROCMAiterMLAAttention
    assert r4.DeepseekV4ROCMAiterMLAAttention._rocm_mla_base.__name__ == "DeepseekV4ROCMAiterMLAAttention"


def test_mtp_and_draft_layers_build_the_hooked_class():
    """V4's MTP and DSpark layers build DeepseekV4DecoderLayer of amd/model.py, which names the
    attention class through its module globals; V4.1's (main, MTP, DSpark) call
    _select_dsv4_attn_cls there: after install both names lead to rocm_mla."""
    v4_layer.install()
    import vllm.models.deepseek_v4.amd.dspark as dspark4
    import vllm.models.deepseek_v4.amd.mtp as mtp4
    import vllm.models.deepseek_v41.amd.model as m41

    for module in (mtp4, dspark4):
        layer_cls = module.DeepseekV4DecoderLayer
        attn = layer_cls.__init__.__globals__["DeepseekV4ROCMAiterMLAAttention"]
        assert hasattr(attn, "_rocm_mla_base"), module.__name__
    select = m41.DeepseekV4DecoderLayer.__init__.__globals__["_select_dsv4_attn_cls"]
    assert getattr(select, "_rocm_mla", False)


def _config(backend_name: str | None, pcp: int = 1):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend = None if backend_name is None else AttentionBackendEnum[backend_name]
    return types.SimpleNamespace(
        attention_config=types.SimpleNamespace(backend=backend),
        parallel_config=types.SimpleNamespace(prefill_context_parallel_size=pcp),
    )


def test_v41_backend_check_takes_the_switch():
    """V4.1's check refuses any backend but its own two; with rocm_mla's name it now picks
    rocm_mla's class, and vLLM's own answers stay as they were."""
    import vllm.models.deepseek_v41.amd.model as m41
    import vllm.models.deepseek_v41.amd.rocm as r41

    v4_layer.install()
    cls = m41._select_dsv4_attn_cls(_config(BACKEND_NAME))
    assert cls is r41.DeepseekV41ROCMAiterMLAAttention and hasattr(cls, "_rocm_mla_base")
    assert m41._select_dsv4_attn_cls(_config(None)) is cls  # vLLM's default: the same class, deferring
    with pytest.raises(ValueError, match="not supported for DeepSeek V4.1"):
        m41._select_dsv4_attn_cls(_config("TRITON_MLA"))
    with pytest.raises(NotImplementedError, match="prefill context parallelism"):
        m41._select_dsv4_attn_cls(_config(BACKEND_NAME, pcp=2))


def test_refusals_name_the_model(monkeypatch):
    import vllm.v1.attention.backends.mla.indexer as idx

    cfg = _config(BACKEND_NAME)
    monkeypatch.setattr(idx, "dsa_indexer_uses_fp4", lambda c: True)
    assert "MXFP4 indexer cache" in v4_layer.refusal("DeepSeek-V4", cfg)
    monkeypatch.setattr(idx, "dsa_indexer_uses_fp4", lambda c: False)
    assert v4_layer.refusal("DeepSeek-V4", cfg) is None
    assert v4_layer.refusal("DeepSeek-V4.1", cfg) is None  # the two-level indexer is served
    import vllm.models.deepseek_v4.amd.rocm as rocm_v4

    monkeypatch.setattr(idx, "dsa_indexer_uses_fp4", lambda c: True)
    with pytest.raises(ValueError, match="rocm_mla cannot serve DeepSeek-V4: its MXFP4"):
        rocm_v4.DeepseekV4ROCMAiterMLAAttention(_config(BACKEND_NAME))


def test_token_kv_lens_follow_positions():
    """Row t sees (pos_t + 1) // ratio compressed rows, pos_t from the step's lengths."""
    md = types.SimpleNamespace(
        token_to_req_indices=torch.tensor([0, 1, 1, 2, 2, 2], dtype=torch.int32),
        seq_lens=torch.tensor([41, 302, 3], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1, 3, 6], dtype=torch.int32),
    )
    req, kv = v4_layer.token_kv_lens(md, 6, 4)
    pos = torch.tensor([40, 300, 301, 0, 1, 2])
    assert req.tolist() == [0, 1, 1, 2, 2, 2]
    assert kv.tolist() == ((pos + 1) // 4).tolist()
