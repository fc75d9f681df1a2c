"""The ROCM_MLA vLLM backend against the real vLLM package (0.34.0, or 0.33.0).

Needs vLLM 0.34.0 or 0.33.0 importable (CI: .ci/install_vllm_cpu.sh, called by ./dev.sh test); the whole
module is skipped, with the reason, when it is not. No MI300 here: vLLM's ROCm platform is
simulated as gfx942 (``vllm_harness.layer_step.use_simulated_gfx942_platform``: only the host
queries are patched) before any vLLM module that binds ``current_platform`` is imported.
Kernels run in the Triton CPU interpreter (conftest sets TRITON_INTERPRET=1; fp32/fp16) or on a
GPU (``gpu`` marker; bf16 and N=128 there).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _util import DEVICE, HAS_GPU, raises_naming
from vllm_harness import require_vllm

require_vllm()

from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm_harness.layer_step import LayerStep, Request, use_simulated_gfx942_platform  # noqa: E402

use_simulated_gfx942_platform()

from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum  # noqa: E402

import rocm_mla.vllm as rocm_vllm  # noqa: E402

rocm_vllm.register()

from rocm_mla.cases import compare, first_problem, raise_on  # noqa: E402
from rocm_mla.cases import decode as decode_cases  # noqa: E402
from rocm_mla.cases import rope_kv_write as rope_cases  # noqa: E402
from rocm_mla.ops import DecodePlan, PrefillPlan  # noqa: E402
from rocm_mla.reference import mla_decode_ref  # noqa: E402
from rocm_mla.reference.rope_kv_write import quantize_fp8_ref  # noqa: E402
from rocm_mla.vllm.backend import RocmMLABackend, RocmMLAImpl, RocmMLAMetadataBuilder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CPU_DTYPES = [torch.float32, torch.float16]
GPU_DTYPES = [torch.bfloat16, torch.float16]


def _fp8_kind() -> torch.dtype:
    from vllm.platforms import current_platform

    return current_platform.fp8_dtype()


# A fresh interpreter on an NVIDIA GPU with a copy of vLLM's pure-Python part (no compiled ops:
# perf/vllm_on_device.sh) would resolve vLLM's platform to CUDA, which imports those ops; it
# takes the simulated gfx942 platform that this process runs on instead. On ROCm and on a CPU it
# resolves its own platform.
_CHILD_PLATFORM = (
    "from vllm_harness.layer_step import use_simulated_gfx942_platform\nuse_simulated_gfx942_platform()\n"
    if torch.cuda.is_available() and torch.version.cuda and importlib.util.find_spec("vllm._C") is None
    else ""
)


def _python(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a process that has loaded no plugin yet)."""
    code = _CHILD_PLATFORM + code
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))  # vllm_harness
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=REPO)


# ---------------------------------------------------------------- registration and plugin loading


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get(rocm_vllm.PLUGIN_NAME) == "rocm_mla.vllm:register", (
        "the vllm.general_plugins entry point is missing: reinstall rocm-mla (pip install -e .)"
    )


def test_load_general_plugins_registers_in_a_fresh_process():
    code = """
import vllm.plugins
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum as P
assert "ROCM_MLA" not in E.__members__
vllm.plugins.load_general_plugins()
print(E["ROCM_MLA"].get_path(), E.CUSTOM.get_path(), P["ROCM_MLA"].get_path())
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [rocm_vllm.BACKEND_CLASS, rocm_vllm.BACKEND_CLASS, rocm_vllm.PREFILL_BACKEND_CLASS]
    # VLLM_PLUGINS is an allow-list of entry-point names: without "rocm_mla" nothing registers.
    code_off = """
import vllm.plugins
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
vllm.plugins.load_general_plugins()
print("ROCM_MLA" in E.__members__)
"""
    assert _python(code_off, {"VLLM_PLUGINS": "lora_filesystem_resolver"}).stdout.strip() == "False"
    assert _python(code_off, {"VLLM_PLUGINS": "rocm_mla"}).stdout.strip() == "True"


def test_register_is_reentrant_and_pickles_by_name():
    rocm_vllm.register()
    rocm_vllm.register()
    member = AttentionBackendEnum["ROCM_MLA"]
    assert member.get_class() is RocmMLABackend
    assert AttentionBackendEnum.CUSTOM.get_class() is RocmMLABackend
    assert MLAPrefillBackendEnum["ROCM_MLA"].get_path() == rocm_vllm.PREFILL_BACKEND_CLASS
    assert list(AttentionBackendEnum.__members__).count("ROCM_MLA") == 1
    assert pickle.loads(pickle.dumps(member)) is member
    assert pickle.loads(pickle.dumps(MLAPrefillBackendEnum["ROCM_MLA"])) is MLAPrefillBackendEnum["ROCM_MLA"]


def test_spawned_process_unpickles_the_config_before_loading_plugins(tmp_path):
    """vLLM's engine core / workers under the spawn start method unpickle the VllmConfig before
    they load plugins: the registered member must come back by name."""
    from vllm.config.attention import AttentionConfig

    cfg = AttentionConfig(backend="ROCM_MLA", mla_prefill_backend="ROCM_MLA")
    path = tmp_path / "cfg.pkl"
    path.write_bytes(pickle.dumps(cfg))
    # The child's platform is simulated as the parent's is: vllm.config resolves the platform at
    # import, and on an NVIDIA machine that is CUDA, whose module needs vLLM's compiled CUDA ops.
    code = f"""
import pickle
from vllm_harness.layer_step import use_simulated_gfx942_platform
use_simulated_gfx942_platform()
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
assert "ROCM_MLA" not in E.__members__
cfg = pickle.loads(open({str(path)!r}, "rb").read())
print(cfg.backend is E["ROCM_MLA"], cfg.backend.get_path(), cfg.mla_prefill_backend.name)
"""
    r = _python(code, {"VLLM_PLUGINS": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", rocm_vllm.BACKEND_CLASS, "ROCM_MLA"]


# ---------------------------------------------------------------- argument parsing and selection


def test_cli_parses_attention_backend():
    from vllm.config.attention import AttentionConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", "x", "--attention-backend", "ROCM_MLA"])
    ea = EngineArgs.from_cli_args(args)
    # create_engine_config converts it exactly so (vllm/engine/arg_utils.py).
    assert AttentionConfig.validate_backend_before(ea.attention_backend) is AttentionBackendEnum["ROCM_MLA"]
    args = parser.parse_args(["--model", "x", "-ac.backend=ROCM_MLA", "-ac.mla_prefill_backend=ROCM_MLA"])
    ea = EngineArgs.from_cli_args(args)
    assert ea.attention_config.backend is AttentionBackendEnum["ROCM_MLA"]
    assert ea.attention_config.mla_prefill_backend is MLAPrefillBackendEnum["ROCM_MLA"]
    assert AttentionConfig(backend="custom").backend is AttentionBackendEnum.CUSTOM


def test_engine_args_create_engine_config_on_rocm():
    from vllm.engine.arg_utils import EngineArgs
    from vllm_harness.layer_step import _tiny_deepseek_v3_dir

    ea = EngineArgs(
        model=_tiny_deepseek_v3_dir(), attention_backend="ROCM_MLA", skip_tokenizer_init=True, max_model_len=512
    )
    cfg = ea.create_engine_config()
    assert cfg.attention_config.backend is AttentionBackendEnum["ROCM_MLA"]
    assert pickle.loads(pickle.dumps(cfg)).attention_config.backend is AttentionBackendEnum["ROCM_MLA"]
    # No --block-size: the release's default page (16 tokens in 0.33, 64 in 0.34), which the backend takes.
    import vllm
    from vllm.config.cache import CacheConfig

    assert CacheConfig.DEFAULT_BLOCK_SIZE == {"0.33.0": 16, "0.34.0": 64}[vllm.__version__]
    assert cfg.cache_config.block_size in (None, CacheConfig.DEFAULT_BLOCK_SIZE)
    assert RocmMLABackend.supports_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)


@pytest.mark.parametrize("num_heads", [8, 16, 128])
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rocm_platform_selects_rocm_mla(dtype, kv_cache_dtype, block_size, num_heads):
    from vllm.platforms import current_platform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    sel = AttentionSelectorConfig(
        head_size=576, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=block_size, use_mla=True
    )
    for member in (AttentionBackendEnum["ROCM_MLA"], AttentionBackendEnum.CUSTOM):
        path = current_platform.get_attn_backend_cls(member, sel, num_heads=num_heads)
        assert path == rocm_vllm.BACKEND_CLASS


def test_rocm_platform_rejects_what_the_kernels_cannot_do():
    from vllm.platforms import current_platform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    member = AttentionBackendEnum["ROCM_MLA"]
    cases = {
        "head_size": AttentionSelectorConfig(
            head_size=320, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=True
        ),
        "kv_cache_dtype float16": AttentionSelectorConfig(
            head_size=576, dtype=torch.bfloat16, kv_cache_dtype="float16", block_size=16, use_mla=True
        ),
        "sparse": AttentionSelectorConfig(
            head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64, use_mla=True, use_sparse=True
        ),
        "non-causal": AttentionSelectorConfig(
            head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=True, use_non_causal=True
        ),
    }
    for reason, sel in cases.items():
        with pytest.raises(ValueError, match=reason.split()[0]):
            current_platform.get_attn_backend_cls(member, sel, num_heads=16)


def test_backend_declarations():
    assert RocmMLABackend.get_supported_head_sizes() == [576]
    assert set(RocmMLABackend.supported_kv_cache_dtypes) == {"auto", "bfloat16", "float16", "fp8", "fp8_e4m3"}
    assert all(RocmMLABackend.supports_block_size(b) for b in (1, 3, 16, 64, 256))
    from vllm.model_executor.layers.attention.mla_attention import QueryLenSupport
    from vllm.v1.attention.backend import AttentionCGSupport

    assert RocmMLAMetadataBuilder.query_len_support is QueryLenSupport.UNIFORM
    assert RocmMLAMetadataBuilder._cudagraph_support is AttentionCGSupport.UNIFORM_BATCH
    assert RocmMLAImpl.can_return_lse_for_decode


def test_selector_builds_an_mla_layer_with_rocm_mla():
    """vLLM's own selection path of MLAAttention (no attn_backend passed) with the config's backend."""
    from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config
    from vllm.config.attention import AttentionConfig
    from vllm.v1.attention.selector import get_attn_backend

    vc = VllmConfig(cache_config=CacheConfig(block_size=64), attention_config=AttentionConfig(backend="ROCM_MLA"))
    with set_current_vllm_config(vc):
        backend = get_attn_backend(576, torch.bfloat16, "fp8", use_mla=True, num_heads=128)
    assert backend is RocmMLABackend


# ---------------------------------------------------------------- forward on vLLM's objects

# (cached context, new tokens) per request, decodes first.
DECODE = [Request(40, 1), Request(17, 1), Request(0, 1), Request(90, 1)]
MTP = [Request(30, 2), Request(9, 2), Request(64, 2)]
# With workspace_rows=48 vLLM plans 7 context chunks: chunks spanning requests, a request without
# context, requests split over two and over four chunks (70 and 120 cached tokens), a split request
# that ends a multi-request chunk: every branch of the in-place LSE bookkeeping runs. vLLM aligns
# context chunks to the block size and needs a workspace of at least one block: with block 64 the
# workspace is 64 rows and vLLM plans 6 chunks, 2 of them continuations.
PREFILL = [Request(37, 5), Request(0, 9), Request(10, 3), Request(70, 3), Request(20, 4), Request(120, 2)]
MIXED = [Request(25, 1), Request(6, 1), Request(33, 4), Request(0, 7)]
BATCHES = {"decode": (DECODE, 1), "mtp": (MTP, 2), "prefill_context": (PREFILL, 1), "mixed": (MIXED, 1)}


def _step(batch: str, dtype, kv_cache_dtype, block_size, num_heads, **kw) -> LayerStep:
    reqs, threshold = BATCHES[batch]
    kw.setdefault("workspace_rows", max(48, block_size))
    return LayerStep(
        RocmMLABackend,
        reqs,
        num_heads=num_heads,
        dtype=dtype,
        device=DEVICE,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        decode_threshold=threshold,
        k_scale=0.05,
        **kw,
    )


def _check_forward(batch, dtype, kv_cache_dtype, block_size, num_heads):
    step = _step(batch, dtype, kv_cache_dtype, block_size, num_heads)
    md = step.metadata
    if batch in ("decode", "mtp"):
        assert md.num_prefills == 0 and md.num_decodes == len(step.requests)
    if batch == "prefill_context":
        chunks = md.prefill.chunked_context.chunks
        assert len(chunks) >= 6 and sum(c.is_continuation for c in chunks) == (4 if block_size <= 48 else 2)
    step.run()
    raise_on(step.mismatch())
    # The KV write put the new tokens where the decode and later steps read them.
    for i, r in enumerate(step.requests):
        got = torch.cat(step.cached_rows(i, r.context, r.context + r.query, codes=True), dim=-1)
        want = torch.cat([step.kv_c[i][r.context :], step.k_pe[i][r.context :]], dim=-1).float()
        if step.fp8:  # the reference's e4m3 codes of want / k_scale
            want = quantize_fp8_ref(want, step.layer._k_scale.reshape(1), _fp8_kind()).float()
            raise_on(compare(f"request {i}: new cache rows (fp8 codes)", got, want, rope_cases.FP8_SAME_CODES).problem)
        else:
            assert torch.equal(got, want)


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_forward_matches_reference(batch, dtype, kv_cache_dtype):
    if HAS_GPU:
        pytest.skip("CPU variant (interpreter); the gpu-marked test covers the GPU")
    _check_forward(batch, dtype, kv_cache_dtype, block_size=16, num_heads=16)


@pytest.mark.parametrize("block_size", [1, 64])
@pytest.mark.parametrize("batch", ["decode", "prefill_context"])
def test_forward_block_sizes_1_and_64_with_8_heads(batch, block_size):
    if HAS_GPU:
        pytest.skip("CPU variant (interpreter); the gpu-marked test covers the GPU")
    _check_forward(batch, torch.float16, "auto", block_size=block_size, num_heads=8)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3"])
def test_prefill_with_context_on_uint8_fp8_storage(kv_cache_dtype):
    """forward_mha handed the fp8 cache as vLLM allocates it (uint8 storage, as vLLM's backend
    tests call it) rather than forward_impl's float8 view: the context gather reads the bytes as
    the layer's fp8 kind and the prefill rows (their context in several chunks) match the float32
    reference."""
    dtype = torch.bfloat16 if HAS_GPU else torch.float16
    step = _step("mixed", dtype, kv_cache_dtype, 16, 8, workspace_rows=16)
    assert step.kv_cache.dtype == torch.uint8 and step.layer.impl.op_kv_cache_dtype == kv_cache_dtype
    assert len(step.metadata.prefill.chunked_context.chunks) >= 2
    raise_on(step.mismatch(step.run_prefill_on_stored_cache()))


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads", [16, 128])
@pytest.mark.parametrize("block_size", [1, 64])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_forward_matches_reference_gpu(batch, dtype, kv_cache_dtype, block_size, num_heads):
    _check_forward(batch, dtype, kv_cache_dtype, block_size, num_heads)


def test_fp8_cache_keeps_the_tuple_query_path():
    """supports_quant_query_input stays False with an fp8 cache: forward_impl hands forward_mqa
    the (ql_nope, q_pe) tuple, q_pe still a strided view of the layer's q (no cat, no quant)."""
    step = _step("decode", torch.float16, "fp8", 16, 16)
    assert step.layer.impl.supports_quant_query_input is False
    ((name, args, _),) = [c for c in step.capture_backend_calls() if c[0] == "forward_mqa"]
    q = args[0]
    assert isinstance(q, tuple) and q[1].data_ptr() == step.q_all.data_ptr() + 128 * step.q_all.element_size()


@pytest.mark.parametrize("form", ["concatenated", "fp8_quantized"])
def test_forward_mqa_single_tensor_query(form):
    """One [rows, N, 576] query, as vLLM sends it under decode context parallelism (concatenated)
    or if supports_quant_query_input were on (fp8 with the layer's q scale): same result as the tuple."""
    step = _step("decode", torch.float16 if not HAS_GPU else torch.bfloat16, "fp8", 16, 16)
    calls = step.capture_backend_calls()
    ((_, (q, cache, md, layer), _),) = [c for c in calls if c[0] == "forward_mqa"]
    o_ref, lse_ref = step.layer.impl.forward_mqa(q, cache, md, layer)
    full = torch.cat(q, dim=-1)
    if form == "concatenated":
        # The same values through the same kernel, only the strides differ: the same result.
        o, lse = step.layer.impl.forward_mqa(full, cache, md, layer)
        assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
        return
    q_scale = full.float().abs().max() / 200
    layer._q_scale.fill_(q_scale)
    full = (full.float() / q_scale).to(_fp8_kind())
    o, lse = step.layer.impl.forward_mqa(full, cache, md, layer)
    # The float32 reference of the query the fp8 codes hold (codes x q_scale, in the model dtype).
    qd = (full.float() * q_scale).to(o.dtype).float()
    want_o, want_lse = mla_decode_ref(
        qd[..., :512],
        qd[..., 512:],
        cache.view(_fp8_kind()),
        md.decode.block_table,
        md.decode.seq_lens,
        step.layer.impl.scale,
        layer._k_scale.reshape(1),
    )
    tol = decode_cases.TOLERANCE[o.dtype]
    raise_on(first_problem(compare("out", o, want_o, tol["out"]), compare("lse", lse, want_lse, tol["lse"])))


def test_fp8_dots_refused_for_a_float32_model(monkeypatch):
    """ROCM_MLA_FP8_DOTS=qk/all with an fp8 cache and a float32 model: the backend refuses at
    build, naming the variable (mla_decode would refuse every decode step); a value that is not
    a mode is refused too."""
    for value, words in (("qk", "ROCM_MLA_FP8_DOTS=qk.*float32"), ("all", "ROCM_MLA_FP8_DOTS=all.*float32")):
        monkeypatch.setenv("ROCM_MLA_FP8_DOTS", value)
        with pytest.raises(ValueError, match=words):
            _step("decode", torch.float32, "fp8", 16, 16)
    monkeypatch.setenv("ROCM_MLA_FP8_DOTS", "pv")
    with pytest.raises(ValueError, match="ROCM_MLA_FP8_DOTS='pv': expected one of none, qk, all"):
        _step("decode", torch.float16, "fp8", 16, 16)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "auto"])
def test_fp8_dots_by_environment(monkeypatch, kv_cache_dtype):
    """ROCM_MLA_FP8_DOTS=qk / all makes forward_mqa run mla_decode(fp8_dots=...) with an fp8 cache
    (and changes nothing with a 16-bit one); unset, the decode is the op's default."""

    dtype = torch.float16 if not HAS_GPU else torch.bfloat16
    results = {}
    for env in ("", "qk", "all"):  # "": the variable unset
        if env:
            monkeypatch.setenv("ROCM_MLA_FP8_DOTS", env)
        else:
            monkeypatch.delenv("ROCM_MLA_FP8_DOTS", raising=False)
        step = _step("decode", dtype, kv_cache_dtype, 16, 16)
        ((_, (q, cache, md, layer), _),) = [c for c in step.capture_backend_calls() if c[0] == "forward_mqa"]
        results[env] = step.layer.impl.forward_mqa(q, cache, md, layer)[0]
        assert step.layer.impl._fp8_dots == (env if env and kv_cache_dtype == "fp8" else None)
        if kv_cache_dtype == "fp8" and env:
            want, _ = decode_cases.call_decode(
                q[0],
                q[1],
                cache,
                md.decode.block_table,
                md.decode.seq_lens,
                sm_scale=step.layer.impl.scale,
                kv_cache_dtype="fp8",
                k_scale=layer._k_scale.reshape(1),
                fp8_dots=env,
            )
            assert torch.equal(results[env], want)
            assert not torch.equal(results[""], results[env])
    if kv_cache_dtype != "fp8":
        assert torch.equal(results[""], results["qk"]) and torch.equal(results[""], results["all"])


@pytest.mark.parametrize("kv_cache_dtype,q_len", [("auto", 1), ("fp8", 2)])
def test_the_builder_plans_the_decode_once_for_every_layer(kv_cache_dtype, q_len, monkeypatch):
    """The metadata builder makes the step's decode plan; each layer's forward_mqa runs it without
    planning again, and its output is the one a call planned from its own tensors gives."""
    import rocm_mla.vllm.backend as backend_mod

    dtype = torch.float16 if not HAS_GPU else torch.bfloat16
    step = _step("mtp" if q_len == 2 else "decode", dtype, kv_cache_dtype, 16, 16)
    ((_, (q, cache, md, layer), _),) = [c for c in step.capture_backend_calls() if c[0] == "forward_mqa"]
    plan = md.decode.rocm_mla_plan
    assert isinstance(plan, DecodePlan) and plan.q_len == q_len
    assert plan.matches(q[0], q[1], cache, md.decode.block_table, md.decode.seq_lens)
    planned = []
    monkeypatch.setattr(backend_mod, "plan_decode_for", lambda *a, **k: planned.append(1))
    monkeypatch.setattr(backend_mod, "plan_decode", lambda *a, **k: planned.append(1))
    outs = [step.layer.impl.forward_mqa(q, cache, md, layer)[0] for _ in range(3)]
    assert not planned and md.decode.rocm_mla_plan is plan
    monkeypatch.undo()
    fp8 = kv_cache_dtype == "fp8"
    want, _ = decode_cases.call_decode(
        q[0],
        q[1],
        cache,
        md.decode.block_table,
        md.decode.seq_lens,
        sm_scale=step.layer.impl.scale,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=layer._k_scale.reshape(1) if fp8 else None,
        max_seq_len=int(md.max_seq_len),
    )
    assert all(torch.equal(o, want) for o in outs)


def test_forward_mqa_plans_from_its_tensors_when_the_metadata_has_no_plan():
    """Metadata without a fitting plan (another builder's, or a DCP-gathered query): the first
    layer plans from its tensors and leaves the plan for the others."""
    step = _step("decode", torch.float32, "auto", 16, 16)
    ((_, (q, cache, md, layer), _),) = [c for c in step.capture_backend_calls() if c[0] == "forward_mqa"]
    built = md.decode.rocm_mla_plan
    md.decode.rocm_mla_plan = None
    a = step.layer.impl.forward_mqa(q, cache, md, layer)[0]
    assert md.decode.rocm_mla_plan == built
    b = step.layer.impl.forward_mqa(q, cache, md, layer)[0]
    assert torch.equal(a, b)


@pytest.mark.parametrize("batch", ["prefill_context", "mixed"])
def test_the_builder_plans_the_prefill_once_for_every_layer(batch, monkeypatch):
    """The metadata builder makes the step's prefill plans (the new tokens' causal pass on the
    prefill metadata, each context chunk's non-causal pass on the chunk); each layer's forward_mha
    runs them without planning again. A step whose metadata has none plans from the tensors in its
    first layer, leaves the plans for the other layers, and they are the builder's: the same bits."""
    import rocm_mla.ops.prefill as prefill_ops
    import rocm_mla.vllm.backend as backend_mod
    import rocm_mla.vllm.prefill as vllm_prefill

    dtype = torch.float16 if not HAS_GPU else torch.bfloat16
    step = _step(batch, dtype, "auto", 16, 16)
    ((_, args, kwargs),) = [c for c in step.capture_backend_calls() if c[0] == "forward_mha"]
    md = args[4]
    q, output = args[0], kwargs["output"]
    plan = md.prefill.rocm_mla_plan
    assert isinstance(plan, PrefillPlan) and plan.causal and plan.batch == md.num_prefills
    assert plan.q_rows == plan.k_rows == q.shape[0] and plan.num_heads == 16 and plan.q_dtype == dtype
    chunks = md.prefill.chunked_context.chunks if md.prefill.chunked_context is not None else []
    assert batch != "prefill_context" or len(chunks) >= 6
    chunk_plans = [c.rocm_mla_plan for c in chunks]
    for c, p in zip(chunks, chunk_plans):
        assert isinstance(p, PrefillPlan) and not p.causal and p.k_rows == c.num_context_tokens
        assert p.batch == c.num_requests and p.q_rows == c.token_slice.stop - c.token_slice.start
    planned = []
    count = lambda *a, **k: planned.append(1)  # noqa: E731
    for mod, name in (
        (backend_mod, "plan_prefill"),
        (vllm_prefill, "plan_prefill_for"),
        (prefill_ops, "plan_prefill_for"),
    ):
        monkeypatch.setattr(mod, name, count)
    # A layer: it plans nothing and leaves the builder's plans on the metadata for the next one.
    output.fill_(float("nan"))
    step.layer.impl.forward_mha(*args, **kwargs)
    first = output.clone()
    assert not planned and md.prefill.rocm_mla_plan is plan
    assert all(c.rocm_mla_plan is p for c, p in zip(chunks, chunk_plans))
    monkeypatch.undo()
    raise_on(step.mismatch())
    # No plan on the metadata (another builder's): the first layer plans and leaves the plans.
    md.prefill.rocm_mla_plan = None
    for c in chunks:
        c.rocm_mla_plan = None
    output.fill_(float("nan"))
    step.layer.impl.forward_mha(*args, **kwargs)
    assert md.prefill.rocm_mla_plan == plan and [c.rocm_mla_plan for c in chunks] == chunk_plans
    assert torch.equal(first, output)


def test_forward_mqa_on_uint8_fp8_storage():
    """forward_mqa handed the fp8 cache as vLLM allocates it (uint8 storage) rather than
    forward_impl's float8 view: the call plans for the storage it got and answers as on the view,
    bit for bit."""
    step = _step("decode", torch.float16, "fp8", 16, 16)
    ((_, (q, cache, md, layer), _),) = [c for c in step.capture_backend_calls() if c[0] == "forward_mqa"]
    assert cache.dtype != torch.uint8 and step.kv_cache.dtype == torch.uint8
    out, lse = step.layer.impl.forward_mqa(q, cache, md, layer)
    raw_out, raw_lse = step.layer.impl.forward_mqa(q, step.kv_cache, md, layer)
    assert md.decode.rocm_mla_plan.kv_dtype == torch.uint8
    assert torch.equal(raw_out, out) and torch.equal(raw_lse, lse)


def test_forward_mqa_returns_natural_log_lse():
    step = _step("decode", torch.float32, "auto", 16, 16)
    ((_, (q, cache, md, layer), _),) = [c for c in step.capture_backend_calls() if c[0] == "forward_mqa"]
    _, lse = step.layer.impl.forward_mqa(q, cache, md, layer)
    w = step.layer.kv_b_proj.weight.float().T.reshape(512, 16, 256)
    for i, r in enumerate(step.requests):
        kv_c, k_pe = step.cached_rows(i, 0, r.context + r.query)
        qq = step.q[i].float()[0]
        s = (
            torch.einsum("nd,snd->ns", qq[:, :128], torch.einsum("sl,lnd->snd", kv_c, w[..., :128]))
            + torch.einsum("nd,sd->ns", qq[:, 128:], k_pe)
        ) * step.scale
        raise_on(compare(f"request {i}: lse", lse[i], torch.logsumexp(s, -1), decode_cases.FP32_SHORT["lse"]).problem)


def test_kv_write_with_gfx942_fp8_kind():
    """On an MI300 vLLM's fp8 is e4m3fnuz: the KV write follows current_platform.fp8_dtype()."""
    from vllm.platforms import current_platform

    from rocm_mla import _platform

    if HAS_GPU and not _platform.device_arch(DEVICE).startswith("gfx94"):
        pytest.skip("e4m3fnuz runs in the CPU interpreter and on gfx94x, not on this GPU")

    cls = type(current_platform)
    orig = cls.fp8_dtype
    cls.fp8_dtype = classmethod(lambda c: torch.float8_e4m3fnuz)
    try:
        impl = _step("decode", torch.float32, "auto", 16, 8).layer.impl
        cache = torch.zeros(4, 16, 576, dtype=torch.uint8, device=DEVICE)
        kv_c = torch.randn(5, 512, device=DEVICE)
        k_pe = torch.randn(5, 1, 64, device=DEVICE)
        slots = torch.tensor([3, 17, -1, 40, 63], device=DEVICE)
        scale = torch.tensor([0.02], device=DEVICE)
        impl.do_kv_cache_update(kv_c, k_pe, cache, slots, "fp8", scale)
        codes = cache.view(-1, 576).view(torch.float8_e4m3fnuz).float()
        want = quantize_fp8_ref(torch.cat([kv_c, k_pe[:, 0]], dim=-1), scale, torch.float8_e4m3fnuz).float()
        keep = slots >= 0
        raise_on(compare("e4m3fnuz cache rows", codes[slots[keep]], want[keep], rope_cases.FP8_SAME_CODES).problem)
        assert cache.view(-1, 576)[[0, 1, 2]].eq(0).all()  # untouched rows
    finally:
        cls.fp8_dtype = orig


# ---------------------------------------------------------------- the MLA prefill backend


@pytest.mark.parametrize("dtype", [torch.float32] if not HAS_GPU else [torch.bfloat16])
def test_prefill_backend_through_vllm_common_path(dtype, monkeypatch):
    """ROCM_MLA as vLLM's MLA prefill backend under vLLM's own forward_mha (MLACommonBaseImpl):
    k arrives concatenated, v strided; results match the reference."""
    from vllm.model_executor.layers.attention.mla_attention import MLACommonBaseImpl

    from rocm_mla.vllm.prefill import RocmMLAPrefillBackend

    step = _step("prefill_context", dtype, "auto", 16, 16)
    assert isinstance(step.layer.prefill_backend, RocmMLAPrefillBackend)
    assert step.metadata.prefill.prefill_backend.supports_out()
    impl = step.layer.impl
    impl.forward_mha = MLACommonBaseImpl.forward_mha.__get__(impl)  # vLLM's common prefill
    impl._compute_prefill_context = _compute_context_with(impl, step)
    # vLLM's merge dispatches to its compiled op on ROCm, which cannot load here: rocm_mla's merge
    # stands in for that one call.
    from vllm.model_executor.layers.attention import mla_attention

    import rocm_mla

    monkeypatch.setattr(mla_attention, "merge_attn_states", rocm_mla.merge_attn_states)
    raise_on(step.mismatch(step.run()))


def _compute_context_with(impl, step):
    """vLLM's _compute_prefill_context gathers through vLLM's compiled gather op, which cannot
    load here; the same loop with rocm_mla's gather, calling the registered prefill backend."""
    from vllm.model_executor.layers.attention.mla_attention import (
        accumulate_mla_context_chunk,
        init_mla_context_partial,
    )

    from rocm_mla.ops import gather_context_chunk

    def compute(q, kv_cache, attn_metadata, k_scale):
        prefill = attn_metadata.prefill
        chunked = prefill.chunked_context
        out = lse = None
        for chunk in chunked.chunks:
            ws = chunked.workspace[: chunk.num_context_tokens]
            gather_context_chunk(
                kv_cache,
                prefill.block_table[chunk.request_slice],
                chunk.cu_seq_lens,
                chunk.starts,
                chunk.token_to_seq,
                ws,
                k_scale=k_scale.reshape(1) if impl._fp8_cache else None,
                kv_cache_dtype=impl.op_kv_cache_dtype,
            )
            kv_nope = impl.kv_b_proj(ws[:, :512])[0].view(-1, impl.num_heads, 256)
            k = impl._concat_k_nope_k_pe(kv_nope[..., :128], ws[:, 512:].unsqueeze(1))
            o, o_lse = prefill.prefill_backend.run_prefill_context_chunk(
                chunk=chunk, q=q[chunk.token_slice], k=k, v=kv_nope[..., 128:]
            )
            if out is None:
                out, lse = init_mla_context_partial(chunked, o, o_lse, num_tokens=q.shape[0])
            _accumulate(chunk, o, o_lse, out, lse)
        return out, lse

    def _accumulate(chunk, o, o_lse, out, lse):
        # accumulate_mla_context_chunk with rocm_mla's merge (vLLM's merge needs its GPU build).
        from rocm_mla.ops import merge_attn_states

        s, e = chunk.token_slice.start, chunk.token_slice.stop
        start = chunk.continuation_token_end if chunk.is_continuation else s
        if start > s:
            prev = lse[:, s:start].clone()
            merge_attn_states(out[s:start], out[s:start], prev, o[: start - s], o_lse[:, : start - s], lse[:, s:start])
        out[start:e].copy_(o[start - s :])
        lse[:, start:e].copy_(o_lse[:, start - s :])

    assert accumulate_mla_context_chunk is not None  # the vLLM function mirrored above exists
    return compute


# ---------------------------------------------------------------- no copies in the attention path


def _bench():
    spec = importlib.util.spec_from_file_location("bench_layer_copies", REPO / "perf" / "bench_layer_copies.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_attention_path_launches_no_copy_kernels(kv_cache_dtype):
    """Profile the backend calls of one decode step and one prefill-with-context step: ROCM_MLA
    moves no data outside its kernels; the upstream-shaped composition (TRITON_MLA + FA prefill
    data movement, same kernels) does, and both are correct. On the CPU the fp8 cache runs ours
    alone (the upstream shape's copies do not depend on the cache's dtype; a GPU runs both)."""
    bench = _bench()
    dtype = torch.bfloat16 if HAS_GPU else torch.float16
    both = HAS_GPU or kv_cache_dtype == "auto"
    comps = ("ROCM_MLA", "upstream-shaped") if both else ("ROCM_MLA",)
    res = bench.compare(num_heads=16, dtype=dtype, kv_cache_dtype=kv_cache_dtype, device=DEVICE, compositions=comps)
    for step in ("decode", "prefill+context"):
        ours = res[(step, "ROCM_MLA")]
        assert not ours["mismatch"], (step, ours["mismatch"])
        assert sum(ours["ops"].values()) == 0, (step, ours["ops"])
        if HAS_GPU:
            assert sum(ours["kernels"].values()) == 0, (step, ours["kernel_names"])
        if not both:
            continue
        up = res[(step, "upstream-shaped")]
        assert not up["mismatch"], (step, up["mismatch"])
        if HAS_GPU:
            assert sum(up["kernels"].values()) > 0
        assert sum(up["ops"].values()) > 0, (step, up["ops"])
    if not both:
        return
    # What the upstream shape pays, by construction: decode cat q + 2 memsets; prefill cat k, pad v.
    assert res[("decode", "upstream-shaped")]["ops"]["cat"] >= 1
    assert res[("decode", "upstream-shaped")]["ops"]["fill"] >= 2
    assert res[("prefill+context", "upstream-shaped")]["ops"]["pad"] >= 1


def test_kernel_name_classes():
    """The GPU count's name patterns: the prefill attention kernel is not a fill (a substring
    match would take it for one), torch's fill and memset kernels are."""
    pats = dict(_bench().KERNEL_PATTERNS)
    raises_naming(ValueError, lambda: _bench().compare(compositions=("TRITON_MLA",)), "compositions", "TRITON_MLA")
    assert not any(p.search("mla_prefill_kernel") for p in pats.values())
    assert pats["fill"].search("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>")
    assert pats["fill"].search("Memset (Device)")
    assert pats["cat"].search("void at::native::(anonymous namespace)::CatArrayBatchedCopy<int, 4>")
    assert pats["copy"].search("Memcpy DtoD (Device -> Device)")
