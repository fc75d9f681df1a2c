"""The ROCM_MLA backend in vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1, or
ROCM_MLA_BATCH_INVARIANT=1), through the simulated ROCm platform: the selector accepts the backend,
every op runs with batch_invariant=True, a decode/prefill/context step still matches the float32
reference, and the context chunks are cut per request (a request's bits the same whatever the
other requests of the step)."""

from __future__ import annotations

import pytest
import torch
from _util import HAS_GPU
from vllm_harness import require_vllm  # noqa: E402

require_vllm()
from vllm_harness.layer_step import LayerStep, Request, use_simulated_gfx942_platform  # noqa: E402

use_simulated_gfx942_platform()

from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402

import rocm_mla.vllm as rocm_vllm  # noqa: E402
from rocm_mla.cases import raise_on  # noqa: E402
from rocm_mla.vllm import backend as backend_mod  # noqa: E402
from rocm_mla.vllm.backend import RocmMLABackend  # noqa: E402

rocm_vllm.register()
DTYPE = torch.bfloat16 if HAS_GPU else torch.float16
ENVS = ("VLLM_BATCH_INVARIANT", "ROCM_MLA_BATCH_INVARIANT")


@pytest.fixture(params=ENVS)
def invariant_env(request, monkeypatch):
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(request.param, "1")
    return request.param


def test_backend_declares_batch_invariance():
    assert RocmMLABackend.supports_batch_invariance()


def test_selector_accepts_rocm_mla_with_vllm_batch_invariant(monkeypatch):
    from vllm.platforms import current_platform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    sel = AttentionSelectorConfig(
        head_size=576,
        dtype=torch.bfloat16,
        kv_cache_dtype="auto",
        block_size=64,
        use_mla=True,
        use_batch_invariant=True,
    )
    path = current_platform.get_attn_backend_cls(AttentionBackendEnum["ROCM_MLA"], sel, num_heads=16)
    assert path == rocm_vllm.BACKEND_CLASS


def _step(reqs, threshold=1, seed=0, **kw):
    return LayerStep(
        RocmMLABackend,
        reqs,
        num_heads=8,
        dtype=DTYPE,
        device="cuda" if HAS_GPU else "cpu",
        block_size=16,
        decode_threshold=threshold,
        workspace_rows=48,
        k_scale=0.05,
        seed=seed,
        **kw,
    )


@pytest.mark.parametrize(
    "reqs,threshold",
    [
        ([Request(40, 1), Request(0, 1), Request(90, 1)], 1),
        ([Request(30, 2), Request(9, 2)], 2),
        ([Request(37, 5), Request(0, 9), Request(70, 3), Request(120, 2)], 1),
    ],
    ids=["decode", "mtp", "prefill_context"],
)
def test_step_runs_invariant_ops_and_matches_reference(invariant_env, monkeypatch, reqs, threshold):
    if invariant_env == "VLLM_BATCH_INVARIANT" and reqs[0].query > threshold and not HAS_GPU:
        pytest.skip("vLLM's batch-invariant kv_b_proj matmul (its persistent Triton GEMM) needs a GPU")
    seen = []
    for name in ("mla_decode", "mla_prefill", "merge_attn_states"):
        fn = getattr(backend_mod, name, None)
        if fn is None:
            continue

        def spy(*a, __fn=fn, __name=name, **k):
            # mla_decode takes the mode through its plan (made by the metadata builder).
            flag = k["plan"].batch_invariant if "plan" in k else k.get("batch_invariant")
            seen.append((__name, flag))
            return __fn(*a, **k)

        monkeypatch.setattr(backend_mod, name, spy)
    step = _step(reqs, threshold)
    assert step.layer.impl._batch_invariant
    step.run()
    raise_on(step.mismatch())
    assert seen and all(flag is True for _, flag in seen), seen


def _set_request(step, i, kv_c, k_pe, q):
    """Give request i of ``step`` these latent rows (context + new) and queries: its cached
    context rewritten through the backend's KV write, the step's new-token inputs rebuilt."""
    r, bs = step.requests[i], step.bs
    step.kv_c[i], step.k_pe[i], step.q[i] = kv_c, k_pe, q
    if r.context:
        pos = torch.arange(0, r.context, device=step.device)
        slots = step.block_table[i, pos // bs].long() * bs + pos % bs
        impl = step.layer.impl
        impl.do_kv_cache_update(
            kv_c[: r.context],
            k_pe[: r.context, None, :],
            step.kv_cache,
            slots,
            step.kv_cache_dtype,
            step.layer._k_scale,
        )
    step.q_all = torch.cat(step.q)
    kv_a = torch.cat(
        [torch.cat([c[rq.context :], p[rq.context :]], dim=-1) for c, p, rq in zip(step.kv_c, step.k_pe, step.requests)]
    )
    step.kv_c_new, step.k_pe_new = kv_a[:, :512], kv_a[:, 512:].unsqueeze(1)


@pytest.mark.parametrize("invariant", [True, False])
def test_context_chunks_cut_per_request(monkeypatch, invariant):
    """The same request (70 cached tokens, 3 new) after other prefills: bitwise the same rows in
    the invariant mode, whatever the others (vLLM's packing into a 48-row workspace cuts its
    context at other places in each batch; the default mode follows those cuts)."""
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    if invariant:
        monkeypatch.setenv("ROCM_MLA_BATCH_INVARIANT", "1")
    target = Request(70, 3)
    alone = _step([target])
    data = (alone.kv_c[0], alone.k_pe[0], alone.q[0])
    outs = []
    for others in ([], [Request(20, 4)], [Request(37, 5), Request(0, 9), Request(5, 2)], [Request(11, 2)]):
        step = _step(others + [target], seed=1)
        _set_request(step, len(others), *data)
        out = step.run()
        raise_on(step.mismatch())
        outs.append(out[-target.query :].clone())
    same = [torch.equal(o, outs[0]) for o in outs[1:]]
    if invariant:
        assert all(same), same
    else:
        assert not all(same), "the default mode should follow vLLM's cuts (else this test cannot fail)"


def test_context_cut_per_request_on_uint8_fp8_storage(monkeypatch):
    """The per-request context pieces (``context_pieces``) with forward_mha handed the
    fp8 cache as vLLM allocates it (uint8 storage, as vLLM's backend tests call it): each gather
    reads the bytes as the layer's fp8 kind and the prefill rows match the float32 reference."""
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROCM_MLA_BATCH_INVARIANT", "1")
    step = _step([Request(25, 1), Request(60, 3)], kv_cache_dtype="fp8")
    assert step.layer.impl._batch_invariant and step.kv_cache.dtype == torch.uint8
    raise_on(step.mismatch(step.run_prefill_on_stored_cache()))
