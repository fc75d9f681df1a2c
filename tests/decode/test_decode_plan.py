"""plan_decode: what an mla_decode call launches, decided on the host from the call's sizes, dtypes
and device.

tests/data/decode_plan_grid.json freezes, for a grid of calls (arch and CU count, B, N, q_len,
block size, table capacity, max_seq_len hint, q dtype, cache kind, k_scale form, quantize_q, forced
splits, a given workspace, a config override), every kernel launch mla_decode makes: grid,
arguments (tensors by their role, shape, strides and offset) and compile-time parameters, as a
sha256 of their canonical JSON beside a readable summary (kernel, grid, tile, splits). The test
replays each call with the kernels replaced by recorders and asserts the same launches, then
asserts that ``plan_decode`` for the call names exactly those launches.

``python3 tests/decode/test_decode_plan.py --write`` records the table again; do that only for a change
meant to alter what the kernels are launched with.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import rocm_mla._platform as platform
import rocm_mla.ops.decode as decode_mod
import rocm_mla.ops.decode_plan as plan_mod
from rocm_mla.configs import config_for, platform_fp8_dtype, tier_index

GRID_FILE = Path(__file__).resolve().parents[1] / "data" / "decode_plan_grid.json"
ARCHES = {"gfx942": 304, "gfx950": 256, "sm90": 132, "cpu": 4}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def grid() -> list[dict[str, Any]]:
    """The calls: every (arch, q dtype, cache kind) with a seeded sample of the sizes, plus the
    options (forced splits, workspace caps, config overrides, quantize_q, tensor scales)."""
    rng = random.Random(20261201)
    cases = []
    sizes = list(
        itertools.product(
            (1, 3, 32, 128),  # B
            (1, 8, 16, 24, 128),  # N
            (1, 2, 4),  # q_len
            (1, 16, 64, 48),  # block size
            (40, 4096, 33000),  # table capacity in tokens (rounded up to whole blocks)
            (None, "cap", 100),  # max_seq_len hint: none, the capacity, shorter
        )
    )
    for arch, dt, kv in itertools.product(ARCHES, DTYPES, ("same", "fp8", "fp8e")):
        if dt == "fp32" and kv == "fp8e":  # float32 q with an fp8 cache: the uint8 form is enough
            continue
        for B, N, q_len, block, cap, hint in rng.sample(sizes, 12):
            case = dict(arch=arch, B=B, N=N, q_len=q_len, block=block, cap=cap, hint=hint, dtype=dt, kv=kv)
            case.update(scale="none", quantize_q=False, splits=None, workspace=None, config=None)
            if kv != "same":
                case["scale"] = rng.choice(("float", "tensor", "none"))
                case["quantize_q"] = dt != "fp32" and rng.random() < 0.3
            r = rng.random()
            if r < 0.2:
                case["splits"] = rng.choice((1, 2, 7, 64))
                if rng.random() < 0.4:
                    case["workspace"] = rng.choice((0, 1, 65))  # too small for S > 1 -> ValueError
            elif r < 0.35:
                case["workspace"] = rng.choice((0, 1, 3, 65))  # caps S at what it holds
            elif r < 0.5 and dt != "fp32":
                case["config"] = rng.choice(("tier0", "tier-1", "cand0", "cand-1"))
            cases.append(case)
    return cases


def case_id(case: dict[str, Any]) -> str:
    return "-".join(f"{v}" for v in case.values())


def _config(case: dict[str, Any]) -> dict[str, Any] | None:
    name = case["config"]
    if name is None:
        return None
    table = config_for("mla_decode", case["arch"])
    group = table["tiers"] if name.startswith("tier") else table["candidates"] or table["tiers"]
    return group[int(name.lstrip("tiercand"))]


class _Recorder:
    def __init__(self, name: str, launches: list, roles: dict):
        self.name, self.launches, self.roles = name, launches, roles

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(
                {"kernel": self.name, "grid": list(grid), "args": [_arg(a, self.roles) for a in args], "meta": kwargs}
            )

        return launch


def _arg(a: Any, roles: dict) -> Any:
    if not isinstance(a, torch.Tensor):
        return a
    ptr = a.untyped_storage().data_ptr()
    role = roles.get(ptr, "workspace (allocated)")
    return [role, str(a.dtype).replace("torch.", ""), list(a.shape), list(a.stride()), a.storage_offset()]


def _inputs(case: dict[str, Any]) -> dict[str, Any]:
    """Tensors of the call: only their sizes, strides and dtypes matter (the kernels are recorders)."""
    B, N, q_len, block = case["B"], case["N"], case["q_len"], case["block"]
    dt = DTYPES[case["dtype"]]
    rows = B * q_len
    max_blocks = -(-case["cap"] // block)
    q = torch.empty(rows, N, 576, dtype=dt)
    kv_dt = {"same": dt, "fp8": torch.uint8, "fp8e": platform_fp8_dtype(case["arch"])}[case["kv"]]
    kv = torch.empty(3, block, 576, dtype=kv_dt)
    hint = {None: None, "cap": max_blocks * block, 100: 100}[case["hint"]]
    k_scale = {"none": None, "float": 0.05, "tensor": torch.full((1,), 0.05)}[case["scale"]]
    ws = None
    if case["workspace"] is not None:
        ws = torch.empty(case["workspace"] * rows * N * 513, dtype=torch.float32)  # S splits need S x rows x N x 513
    return dict(
        q_nope=q[..., :512],
        q_pe=q[..., 512:],
        kv_cache=kv,
        block_table=torch.zeros(B, max_blocks, dtype=torch.int32),
        seq_lens=torch.zeros(B, dtype=torch.int32),
        sm_scale=0.0721,
        kv_cache_dtype="fp8" if case["kv"] == "fp8" else "auto",
        k_scale=k_scale,
        num_splits=case["splits"],
        max_seq_len=hint,
        workspace=ws,
        config=_config(case),
        quantize_q=case["quantize_q"],
    )


def record(case: dict[str, Any], monkeypatch) -> list[dict[str, Any]]:
    """The launches mla_decode makes for ``case`` on its arch (kernels replaced by recorders)."""
    arch = case["arch"]
    monkeypatch.setattr(platform, "device_arch", lambda device: arch)
    monkeypatch.setattr(platform, "interpreter_active", lambda: False)
    monkeypatch.setattr(plan_mod, "num_compute_units", lambda device: ARCHES[arch])
    monkeypatch.setattr(plan_mod, "select", lambda *a, **k: "triton")
    kw = _inputs(case)
    launches: list = []
    roles: dict = {}
    monkeypatch.setattr(decode_mod, "mla_decode_stage1_kernel", _Recorder("stage1", launches, roles))
    monkeypatch.setattr(decode_mod, "mla_decode_reduce_kernel", _Recorder("reduce", launches, roles))
    rows, N = kw["q_nope"].shape[:2]
    out = torch.empty(rows, N, 512, dtype=kw["q_nope"].dtype)
    lse = torch.empty(rows, N, dtype=torch.float32)
    named = dict(kw, out=out, lse=lse)
    for name in ("q_nope", "kv_cache", "block_table", "seq_lens", "k_scale", "workspace", "out", "lse"):
        t = named[name]
        if isinstance(t, torch.Tensor):
            roles[t.untyped_storage().data_ptr()] = "q" if name == "q_nope" else name
    try:
        call = {k: kw[k] for k in ("q_nope", "q_pe", "kv_cache", "block_table", "seq_lens", "sm_scale", "k_scale")}
        decode_mod.mla_decode(**call, out=out, lse=lse, workspace=kw["workspace"], plan=_plan(case))
    except ValueError as exc:
        return [{"error": str(exc)}]
    return json.loads(json.dumps(launches))


def frozen_entry(launches: list[dict[str, Any]]) -> dict[str, str]:
    """A case's row in the table: a readable summary and the digest of every launch detail."""
    parts = []
    for x in launches:
        if "error" in x:
            parts.append(f"error: {x['error']}")
            continue
        m = x["meta"]
        tile = f" H{m['BLOCK_H']} N{m['BLOCK_N']} S{x['args'][14]}" if x["kernel"] == "stage1" else f" S{m['BLOCK_S']}"
        parts.append(f"{x['kernel']} grid {x['grid']}{tile}")
    canon = json.dumps(launches, sort_keys=True, separators=(",", ":"))
    return {"summary": " | ".join(parts), "sha256": hashlib.sha256(canon.encode()).hexdigest()}


CASES = grid()


@pytest.fixture(scope="module")
def frozen() -> dict[str, Any]:
    return json.loads(GRID_FILE.read_text())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_launches_match_the_frozen_table(case, frozen, monkeypatch):
    assert frozen_entry(record(case, monkeypatch)) == frozen[case_id(case)]


def test_the_grid_covers_both_launch_forms_and_the_workspace_error(frozen):
    kinds = {tuple(p.split()[0] for p in v["summary"].split(" | ")) for v in frozen.values()}
    assert {("stage1",), ("stage1", "reduce"), ("error:",)} <= kinds
    assert len(frozen) == len(CASES)


def _plan(case: dict[str, Any], **over) -> plan_mod.DecodePlan:
    kw = _inputs(case)
    kv = kw["kv_cache"]
    ks = kw["k_scale"]
    args = dict(
        batch=case["B"],
        num_heads=case["N"],
        q_len=case["q_len"],
        max_blocks=kw["block_table"].shape[1],
        block_size=case["block"],
        q_dtype=DTYPES[case["dtype"]],
        kv_dtype=kv.dtype,
        kv_cache_dtype=kw["kv_cache_dtype"],
        device=torch.device("cpu"),
        max_seq_len=kw["max_seq_len"],
        num_splits=kw["num_splits"],
        workspace_numel=None if kw["workspace"] is None else kw["workspace"].numel(),
        config=kw["config"],
        fp8_dots="qk" if kw["quantize_q"] else None,
        k_scale_on_device=isinstance(ks, torch.Tensor),
    )
    return plan_mod.plan_decode(**{**args, **over})


def _json(x: Any) -> Any:
    return json.loads(json.dumps(x))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_plan_names_the_launches(case, monkeypatch):
    launches = record(case, monkeypatch)  # the patches (arch, CU count) stay for the plan
    plan = _plan(case)
    if "error" in launches[0]:
        assert plan.workspace_numel > _inputs(case)["workspace"].numel()
        assert f">= {plan.workspace_numel} elements (S={plan.num_splits} splits" in launches[0]["error"]
        return
    assert plan.arch == case["arch"] and plan.num_cus == ARCHES[case["arch"]]
    assert len(launches) == plan.launches == (1 if plan.direct else 2)
    s1 = launches[0]
    assert s1["grid"] == list(plan.grid)
    assert s1["meta"] == _json({**plan.constexprs, **plan.options})
    assert s1["args"][14] == plan.num_splits and s1["args"][15] == plan.split_programs
    assert s1["args"][16] == plan.head_blocks
    assert s1["args"][18] == plan.page_shift and plan.constexprs["PAGE_MODE"] == plan.page_mode
    assert plan.constexprs["BLOCK_H"] == plan.config["BLOCK_H"]
    if plan.direct:
        assert plan.workspace_numel == 0 and plan.workspace_shapes is None and plan.reduce is None
        return
    (so, sl) = plan.workspace_shapes
    assert plan.workspace_numel == so[0] * so[1] * so[2] + sl[0] * sl[1]
    assert s1["args"][8][2] == [so[0] * so[1] * so[2]] and s1["args"][9][2] == [sl[0] * sl[1]]  # part_o, part_lse
    s2 = launches[1]
    assert s2["grid"] == list(plan.reduce.grid)
    assert s2["meta"] == _json({**plan.reduce.constexprs, **plan.reduce.options})


def test_plan_tier_is_the_configs_index_or_none_for_an_override():
    cpu = torch.device("cpu")
    base = dict(q_len=1, max_blocks=64, block_size=64, q_dtype=torch.float16, kv_dtype=torch.float16, device=cpu)
    tiers = config_for("mla_decode", "cpu")["tiers"]
    for n in (1, tiers[0]["BLOCK_H"], tiers[0]["BLOCK_H"] + 1, 128):
        plan = plan_mod.plan_decode(batch=2, num_heads=n, **base)
        assert plan.tier == tier_index(tiers, n)
        assert plan.config == plan_mod.tier_config("cpu", n, torch.float16, False)
    assert plan_mod.plan_decode(batch=2, num_heads=16, config=tiers[-1], **base).tier is None


def test_plan_is_frozen_and_uint8_storage_plans_as_its_fp8_kind():
    import dataclasses

    cpu = torch.device("cpu")
    base = dict(batch=4, num_heads=16, q_len=2, max_blocks=70, block_size=16, q_dtype=torch.bfloat16, device=cpu)
    plan = plan_mod.plan_decode(kv_dtype=torch.uint8, kv_cache_dtype="fp8", **base)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.num_splits = 3
    typed = plan_mod.plan_decode(kv_dtype=platform_fp8_dtype("cpu"), **base)
    # The same launches; only the storage the calls pass differs.
    assert dataclasses.replace(plan, kv_dtype=typed.kv_dtype, kv_cache_dtype="auto") == typed
    assert plan.kv_kind == typed.kv_kind == platform_fp8_dtype("cpu") and plan.kv_dtype == torch.uint8
    with pytest.raises(ValueError, match=r"kv_cache_dtype: expected 'fp8' or 'fp8_e4m3' for a uint8 cache"):
        plan_mod.plan_decode(kv_dtype=torch.uint8, **base)


@pytest.mark.parametrize("storage", ["uint8", "float8"])
def test_a_plan_for_other_sizes_is_refused_naming_the_field_that_differs(storage):
    """mla_decode names the plan field a call's tensors differ in (uint8 storage included: the plan
    keeps the tensor's dtype as kv_dtype and the read kind as kv_kind), and writes nothing."""
    cpu = torch.device("cpu")
    B, N, q_len, bs, mb = 2, 4, 1, 16, 3
    fp8 = platform_fp8_dtype("cpu")
    kv_dtype = torch.uint8 if storage == "uint8" else fp8
    gen = torch.Generator().manual_seed(7)
    q_nope = torch.randn(B * q_len, N, 512, generator=gen, dtype=torch.bfloat16)
    q_pe = torch.randn(B * q_len, N, 64, generator=gen, dtype=torch.bfloat16)
    kv = torch.randn(6, bs, 576, generator=gen).to(fp8).view(kv_dtype)
    table = torch.randperm(6, generator=gen)[: B * mb].view(B, mb).to(torch.int32)
    lens = torch.tensor([5, 33], dtype=torch.int32)
    base = dict(batch=B, q_len=q_len, max_blocks=mb, block_size=bs, q_dtype=torch.bfloat16, device=cpu)
    plan = plan_mod.plan_decode(num_heads=N + 4, kv_dtype=kv_dtype, kv_cache_dtype="fp8", **base)
    assert not plan.matches(q_nope, q_pe, kv, table, lens)
    out = torch.full((B * q_len, N, 512), float("nan"), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"mla_decode: plan: expected a plan made for this call \(num_heads={N}\)"):
        decode_mod.mla_decode(q_nope, q_pe, kv, table, lens, sm_scale=0.1, plan=plan, out=out)
    assert out.isnan().all()
    fits = plan_mod.plan_decode(num_heads=N, kv_dtype=kv_dtype, kv_cache_dtype="fp8", **base)
    assert fits.matches(q_nope, q_pe, kv, table, lens)


def test_a_workspace_caps_the_split_count_a_forced_one_does_not():
    cpu = torch.device("cpu")
    base = dict(batch=1, num_heads=16, q_len=1, max_blocks=64, block_size=64, q_dtype=torch.float16)
    base.update(kv_dtype=torch.float16, device=cpu)
    free = plan_mod.plan_decode(**base)
    assert free.num_splits > 2
    per_split = 16 * 513
    assert plan_mod.plan_decode(workspace_numel=2 * per_split + 5, **base).num_splits == 2
    assert plan_mod.plan_decode(workspace_numel=0, **base).num_splits == 1
    forced = plan_mod.plan_decode(workspace_numel=0, num_splits=4, **base)
    assert forced.num_splits == 4 and forced.workspace_numel == 4 * per_split


def _write() -> None:
    class _Patch:
        def __init__(self):
            self.undo = []

        def setattr(self, obj, name, value):
            self.undo.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        def restore(self):
            for obj, name, value in reversed(self.undo):
                setattr(obj, name, value)
            self.undo.clear()

    out = {}
    mp = _Patch()
    for case in CASES:
        out[case_id(case)] = frozen_entry(record(case, mp))
        mp.restore()
    GRID_FILE.write_text(json.dumps(out, indent=0) + "\n")
    print(f"wrote {len(out)} cases to {GRID_FILE}")


if __name__ == "__main__" and "--write" in sys.argv:
    _write()


@pytest.mark.parametrize(
    "table,kernel", [("STAGE1_ARGS", "mla_decode_stage1_kernel"), ("REDUCE_ARGS", "mla_decode_reduce_kernel")]
)
def test_argument_tables_are_the_kernels_signatures(table, kernel):
    """The launch fills and the ISA report types the kernels' runtime arguments from these tables:
    they hold each kernel's non-constexpr parameters, in order, each with a known kind."""
    import inspect

    import rocm_mla.kernels.decode as kernels

    fn = getattr(kernels, kernel).fn
    params = [n for n, p in inspect.signature(fn).parameters.items() if "constexpr" not in str(p.annotation)]
    rows = getattr(plan_mod, table)
    assert [n for n, _ in rows] == params
    kinds = {"*q/16", "*kv/16", "*i32/16", "*fp32/16", "*fp32", "fp32", "i32", "i32/16", "1"}
    assert {k for _, k in rows} <= kinds
    sig, ones, div16 = plan_mod.argument_types(rows, {"q": "bf16", "kv": "fp8e4nv"})
    assert set(sig) | set(ones) == set(params) and not set(sig) & set(ones)
    assert set(div16) <= set(sig)
