"""plan_decode: what an mla_decode call launches, decided on the host from the call's sizes, dtypes
and device.

tests/data/decode_plan_grid.json freezes, for a grid of calls (arch and CU count, B, N, q_len,
block size, table capacity, max_seq_len hint, q dtype, cache kind, k_scale form, quantize_q, forced
splits, a given workspace, a config override), every kernel launch mla_decode makes: grid,
arguments (tensors by their role, shape, strides and offset) and compile-time parameters, as a
sha256 of their canonical JSON beside a readable summary (kernel, grid, tile, splits). The test
replays each call with the kernels replaced by recorders and asserts the same launches, then
asserts that ``plan_decode`` for the call names exactly those launches.

``python3 tests/test_decode_plan.py --write`` records the table again; do that only for a change
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
from rocm_mla.configs import config_for, platform_fp8_dtype

GRID_FILE = Path(__file__).parent / "data" / "decode_plan_grid.json"
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
    group = table["stage1"] if name.startswith("tier") else table.get("candidates") or table["stage1"]
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
        num_kv_splits=case["splits"],
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
    monkeypatch.setattr(decode_mod, "num_compute_units", lambda device: ARCHES[arch])
    monkeypatch.setattr(decode_mod, "select", lambda *a, **k: "triton")
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
        decode_mod.mla_decode(**kw, out=out, lse=lse)
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
