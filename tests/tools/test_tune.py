"""Config overlays (rocm_mla/configs) and the tuner (rocm_mla/tools/tune/).

The overlay mechanism: where files are found, merge precedence (override > overlay > package),
the cache (reload_overlays), the named schema errors, the stamp, and that a bad overlay is ignored
with one warning. The tuner: its decode tier composition, its selection rules under a fake timer
(the default is a candidate and wins ties; no shape slower; the re-time rejects noise), the hard
stop, ``--check`` (named compile / reference errors, ``--stamp``), and one tiny tuning run in the
Triton interpreter whose overlay a fresh process then uses. The sparse op's tuning: its shape
specs and presets, its groups, the tier composition and a tiny interpreter run. The indexer's
(mla_indexer_topk): its shape specs and presets, its one group and candidates, the plan made once
per config, the overlay round trip, its acceptance in the interpreter and a tiny run. DeepSeek-V4
attention's (mla_v4_attention): its shape specs and presets, its groups and listed candidates,
the tier composition, its verification cases and a tiny interpreter run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import rocm_mla.configs as C
from rocm_mla.tools.tune import acceptance, inputs
from rocm_mla.tools.tune.cli import main as tune_main
from rocm_mla.tools.tune.groups import (
    COMBOS,
    _decode_fix,
    _listed,
    compose_prefill_tier,
    compose_sparse_tier,
    compose_tier,
    compose_v4_tier,
    full_stage1,
    point_key,
)
from rocm_mla.tools.tune.overlay import describe_overlay
from rocm_mla.tools.tune.shapes import ALL_OPS, OP_KEYS, Shape, parse_shapes
from rocm_mla.tools.tune.tuner import Tuner

ROOT = Path(__file__).resolve().parents[2]


def _here() -> str:
    """The arch key of the device `rocm-mla tune` runs on here (cpu without a GPU)."""
    from rocm_mla import _platform

    return _platform.device_arch(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))


@pytest.fixture
def cfgdir(tmp_path, monkeypatch):
    """An empty overlay folder for this test; the cache and the warn-once memory reset around it."""
    d = tmp_path / "cfg"
    d.mkdir()
    monkeypatch.setenv("ROCM_MLA_CONFIG_DIR", str(d))
    C.reload_overlays()
    C._WARNED.clear()
    yield d
    monkeypatch.undo()
    C.reload_overlays()
    C._WARNED.clear()


def _write(path: Path, data: dict, stamp: bool = True) -> Path:
    path.write_text(json.dumps(C.stamp_overlay(data, by="test") if stamp else data))
    return path


def _overlay(arch: str, entries: dict, **meta) -> dict:
    return {**{op: {arch: e} for op, e in entries.items()}, "_meta": {"arch": arch, **meta}}


def _prefill_tiers(arch: str, **kw) -> dict:
    """An overlay entry of mla_prefill's tiers of ``arch`` with ``kw`` set in the first (a list is
    replaced whole, so the entry holds every tier)."""
    tiers = C.package_config("mla_prefill", arch)["tiers"]
    return {"mla_prefill": {"tiers": [{**tiers[0], **kw}, *tiers[1:]]}}


PREFILL_M64 = _prefill_tiers("cpu", BLOCK_M=64)


# --------------------------------------------------------------------------- loading and merging


def test_no_overlay_is_the_package(cfgdir):
    for op in C.SCHEMAS:
        for arch in ("cpu", "gfx942", "sm90"):
            assert C.config_for(op, arch) is C.package_config(op, arch)
    assert C.overlay_status("cpu").path is None


def test_overlay_merges_objects_and_replaces_lists(cfgdir):
    pkg_prefill = json.loads(json.dumps(C.package_config("mla_prefill", "cpu")))
    pkg_decode = json.loads(json.dumps(C.package_config("mla_decode", "cpu")))
    tiers = [dict(t, BLOCK_N=32) for t in pkg_decode["tiers"]]
    entry = {**PREFILL_M64, "mla_decode": {"tiers": tiers[:2], "reduce": {"num_warps": 8}}}
    _write(cfgdir / "cpu.json", _overlay("cpu", entry))
    got = C.config_for("mla_decode", "cpu")
    assert got["reduce"] == {**pkg_decode["reduce"], "num_warps": 8}  # an object field by field
    assert got["tiers"] == tiers[:2] and got["candidates"] == pkg_decode["candidates"]  # a list is replaced whole
    assert C.config_for("mla_prefill", "cpu")["tiers"][0]["BLOCK_M"] == 64
    assert C.package_config("mla_prefill", "cpu") == pkg_prefill  # the package's data is not modified
    assert C.config_for("mla_prefill", "sm90") is C.package_config("mla_prefill", "sm90")  # other arches untouched
    from rocm_mla.ops.prefill_plan import launch_config

    assert launch_config("cpu", torch.float16)["BLOCK_M"] == 64  # the op reads it through config_for


def test_empty_env_turns_overlays_off(cfgdir, monkeypatch):
    _write(cfgdir / "cpu.json", _overlay("cpu", PREFILL_M64))
    assert C.config_for("mla_prefill", "cpu")["tiers"][0]["BLOCK_M"] == 64
    monkeypatch.setenv("ROCM_MLA_CONFIG_DIR", "")
    C.reload_overlays()
    assert C.overlay_dir() is None
    assert C.config_for("mla_prefill", "cpu") is C.package_config("mla_prefill", "cpu")


def test_default_dir_and_single_file(tmp_path, monkeypatch, cfgdir):
    monkeypatch.delenv("ROCM_MLA_CONFIG_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert C.overlay_dir() == tmp_path / "xdg" / "rocm_mla"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert C.overlay_dir() == tmp_path / "home" / ".config" / "rocm_mla"
    f = _write(tmp_path / "any-name.json", _overlay("cpu", PREFILL_M64))
    monkeypatch.setenv("ROCM_MLA_CONFIG_DIR", str(f))  # a .json value names the file itself
    C.reload_overlays()
    assert C.overlay_status("cpu").path == f
    assert C.config_for("mla_prefill", "cpu")["tiers"][0]["BLOCK_M"] == 64


def test_cu_specific_file_first(cfgdir, monkeypatch):
    monkeypatch.setattr(C.loader, "device_compute_units", lambda arch: 304 if arch == "gfx942" else None)
    _write(cfgdir / "gfx942-304cu.json", _overlay("gfx942", _prefill_tiers("gfx942", BLOCK_N=64), cus=304))
    _write(cfgdir / "gfx942.json", _overlay("gfx942", _prefill_tiers("gfx942", BLOCK_N=16)))
    C.reload_overlays()
    assert C.config_for("mla_prefill", "gfx942")["tiers"][0]["BLOCK_N"] == 64
    monkeypatch.setattr(C.loader, "device_compute_units", lambda arch: 80)  # an MI308X: only the generic file fits
    C.reload_overlays()
    assert C.config_for("mla_prefill", "gfx942")["tiers"][0]["BLOCK_N"] == 16
    # a CU-specific overlay for another CU count is refused even under the generic name
    _write(cfgdir / "gfx942.json", _overlay("gfx942", _prefill_tiers("gfx942", BLOCK_N=16), cus=304))
    C.reload_overlays()
    with pytest.warns(C.OverlayWarning, match="OverlayArchMismatch"):
        assert C.config_for("mla_prefill", "gfx942") is C.package_config("mla_prefill", "gfx942")


def test_gfx950_overlay_is_its_own(cfgdir, monkeypatch):
    """An MI355X (gfx950, 256 CUs) reads gfx950-256cu.json over gfx950's own package data; a
    gfx942 overlay is not used there, nor a gfx950 one on gfx942."""
    monkeypatch.setattr(C.loader, "device_compute_units", lambda arch: {"gfx942": 304, "gfx950": 256}.get(arch))
    tier = dict(C.package_config("mla_decode", "gfx950")["tiers"][0], BLOCK_N=32)
    entry = {"mla_decode": {"tiers": [tier, *C.package_config("mla_decode", "gfx950")["tiers"][1:]]}}
    _write(cfgdir / "gfx950-256cu.json", _overlay("gfx950", entry, cus=256))
    _write(cfgdir / "gfx942-304cu.json", _overlay("gfx942", PREFILL_M64, cus=304))
    C.reload_overlays()
    assert C.config_for("mla_decode", "gfx950")["tiers"][0]["BLOCK_N"] == 32
    assert C.config_for("mla_prefill", "gfx950") == C.package_config("mla_prefill", "gfx950")
    assert C.config_for("mla_decode", "gfx942") == C.package_config("mla_decode", "gfx942")
    assert C.overlay_filename("gfx950", 256) == "gfx950-256cu.json"
    errs = C.validate_overlay(_overlay("gfx950", entry, cus=256), "gfx942", 304, check_stamp=False)
    assert errs and all(isinstance(e, C.OverlayArchMismatch) for e in errs)


def test_tuner_sweeps_only_the_kpack_the_compiler_honours():
    from rocm_mla.tools.tune.groups import kpack_values

    assert kpack_values("gfx942") == [1, 2]
    assert kpack_values("gfx950") == [1]  # Triton replaces kpack 2 by 1 on gfx950


def test_cache_is_not_stale_after_reload(cfgdir):
    assert C.config_for("mla_prefill", "cpu") is C.package_config("mla_prefill", "cpu")
    _write(cfgdir / "cpu.json", _overlay("cpu", PREFILL_M64))
    # cached: a serving process does not change configs under its own feet ...
    assert C.config_for("mla_prefill", "cpu") is C.package_config("mla_prefill", "cpu")
    C.reload_overlays()  # ... until told (the tuner calls this after writing)
    assert C.config_for("mla_prefill", "cpu")["tiers"][0]["BLOCK_M"] == 64


def test_precedence_override_overlay_package(cfgdir):
    _write(cfgdir / "cpu.json", _overlay("cpu", PREFILL_M64))
    pkg = C.package_config("mla_prefill", "cpu")
    mine = {**pkg, "tiers": [{**pkg["tiers"][0], "BLOCK_M": 128}]}
    with C.override("mla_prefill", "cpu", mine):
        assert C.config_for("mla_prefill", "cpu") is mine
        with C.overlays_disabled():
            assert C.config_for("mla_prefill", "cpu") is mine  # the tuner's candidate wins everything
    assert C.config_for("mla_prefill", "cpu")["tiers"][0]["BLOCK_M"] == 64
    with C.overlays_disabled():
        assert C.config_for("mla_prefill", "cpu") is pkg
    assert C.config_for("mla_prefill", "cpu")["tiers"][0]["BLOCK_M"] == 64


def test_package_json_passes_its_own_schema():
    for op in C.SCHEMAS:
        for arch in ("gfx942", "gfx950", "sm90", "cpu"):
            assert C.validate_overlay(_overlay(arch, {op: C.package_config(op, arch)}), arch, check_stamp=False) == []


# --------------------------------------------------------------------------- bad overlays


def _tier(**kw):
    return {**C.package_config("mla_decode", "cpu")["tiers"][0], **kw}


def _sparse_tier(**kw):
    return {**C.package_config("mla_sparse_attention", "cpu")["tiers"][0], **kw}


def _v4_tier(**kw):
    return {**C.package_config("mla_v4_attention", "cpu")["tiers"][0], **kw}


def _one_tier(op: str, arch: str = "cpu", hip: bool = False, **kw) -> dict:
    """An overlay entry of ``op``'s one tier (``hip``: its HIP kernel's) with ``kw`` set."""
    obj = C.package_config(op, arch)
    tier = {**(obj["hip"] if hip else obj)["tiers"][0], **kw}
    return {op: {"hip": {"tiers": [tier]}} if hip else {"tiers": [tier]}}


def _cpu(entry: dict) -> dict:
    return {op: {"cpu": e} for op, e in entry.items()}


BAD = [
    ("unknown op", {"mla_decod": {"cpu": {}}}, C.OverlayUnknownKey),
    ("unknown arch", {"mla_prefill": {"gpu0": PREFILL_M64["mla_prefill"]}}, C.OverlayUnknownKey),
    ("another arch", {"mla_prefill": {"gfx942": PREFILL_M64["mla_prefill"]}}, C.OverlayArchMismatch),
    ("unknown field", _cpu(_prefill_tiers("cpu", BLOCK_Q=64)), C.OverlayUnknownKey),
    ("unknown top field", {"merge_attn_states": {"cpu": {"cuda": {}}}}, C.OverlayUnknownKey),
    ("string for int", _cpu(_prefill_tiers("cpu", BLOCK_M="64")), C.OverlayTypeError),
    ("float for int", _cpu(_prefill_tiers("cpu", num_warps=4.0)), C.OverlayTypeError),
    ("bool for int", _cpu(_prefill_tiers("cpu", num_warps=True)), C.OverlayTypeError),
    ("unknown fp32 field", _cpu(_prefill_tiers("cpu", fp32={"BLOCK_Q": 16})), C.OverlayUnknownKey),
    ("negative", _cpu(_one_tier("merge_attn_states", tile_elems=-1)), C.OverlayTypeError),
    ("unknown hip field", _cpu(_one_tier("merge_attn_states", hip=True, tile_elems=1)), C.OverlayUnknownKey),
    ("incomplete hip tier", _cpu({"rope_kv_write": {"hip": {"tiers": [{"waves_per_block": 4}]}}}), C.OverlayTypeError),
    ("int for bool", {"mla_decode": {"cpu": {"tiers": [_tier(RELOAD_K=1)]}}}, C.OverlayTypeError),
    ("object for list", {"mla_decode": {"cpu": {"tiers": _tier()}}}, C.OverlayTypeError),
    ("empty tiers", {"mla_decode": {"cpu": {"tiers": []}}}, C.OverlayTypeError),
    ("incomplete tier", {"mla_decode": {"cpu": {"tiers": [{"BLOCK_H": 16, "num_warps": 4}]}}}, C.OverlayTypeError),
    ("incomplete candidate", {"mla_decode": {"cpu": {"candidates": [{"BLOCK_H": 16}]}}}, C.OverlayTypeError),
    ("bad backend", {"rope_kv_write": {"cpu": {"backend_order": ["cuda"]}}}, C.OverlayTypeError),
    ("bad tma", _cpu(_prefill_tiers("cpu", tma="yes")), C.OverlayTypeError),
    ("platform is not tunable", {"platform": {"cpu": {"fp8_dtype": "float8_e5m2"}}}, C.OverlayUnknownKey),
    (
        "unknown sparse tier field",
        {"mla_sparse_attention": {"cpu": {"tiers": [_sparse_tier(BLOCK_Q=1)]}}},
        C.OverlayUnknownKey,
    ),
    (
        "unknown sparse fp8 field",
        {"mla_sparse_attention": {"cpu": {"tiers": [_sparse_tier(fp8={"V_SPLIT": 2})]}}},
        C.OverlayUnknownKey,
    ),
    ("incomplete sparse tier", {"mla_sparse_attention": {"cpu": {"tiers": [{"BLOCK_H": 16}]}}}, C.OverlayTypeError),
    (
        "sparse int for bool",
        {"mla_sparse_attention": {"cpu": {"tiers": [_sparse_tier(RELOAD_K=1)]}}},
        C.OverlayTypeError,
    ),
    ("unknown sparse split field", {"mla_sparse_attention": {"cpu": {"split": {"max_split": 8}}}}, C.OverlayUnknownKey),
    ("unknown v4 tier field", {"mla_v4_attention": {"cpu": {"tiers": [_v4_tier(D_SPLIT=1)]}}}, C.OverlayUnknownKey),
    (
        "unknown v4 fp8 object",
        {"mla_v4_attention": {"cpu": {"tiers": [_v4_tier(fp8={"BLOCK_N": 16})]}}},
        C.OverlayUnknownKey,
    ),
    ("incomplete v4 tier", {"mla_v4_attention": {"cpu": {"tiers": [{"BLOCK_H": 16}]}}}, C.OverlayTypeError),
    (
        "v4 string for int",
        {"mla_v4_attention": {"cpu": {"tiers": [_v4_tier(fp32={"BLOCK_N": "16"})]}}},
        C.OverlayTypeError,
    ),
    ("unknown v4 split field", {"mla_v4_attention": {"cpu": {"split": {"max_split": 8}}}}, C.OverlayUnknownKey),
    ("unknown indexer merge field", _cpu(_one_tier("mla_indexer_topk", merge={"chunks": 64})), C.OverlayUnknownKey),
    ("indexer int for bool", _cpu(_one_tier("mla_indexer_topk", direct=0)), C.OverlayTypeError),
]


@pytest.mark.parametrize("what,entries,err", BAD, ids=[b[0] for b in BAD])
def test_bad_overlay_named_error_and_one_warning(cfgdir, what, entries, err):
    data = {**entries, "_meta": {"arch": "cpu"}}
    errors = C.validate_overlay(data, "cpu", check_stamp=False)
    assert errors and isinstance(errors[0], err), errors
    assert errors[0].name == err.__name__
    _write(cfgdir / "cpu.json", data)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(3):
            for op in C.SCHEMAS:
                assert C.config_for(op, "cpu") is C.package_config(op, "cpu")  # ignored whole
    ours = [w for w in rec if issubclass(w.category, C.OverlayWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert err.__name__ in str(ours[0].message)


def test_stamp_errors(cfgdir, monkeypatch):
    data = _overlay("cpu", PREFILL_M64)
    assert isinstance(C.stamp_problems(data)[0], C.OverlayUnverified)  # never verified
    stamped = C.stamp_overlay(data, by="test")
    assert C.stamp_problems(stamped) == []
    edited = json.loads(json.dumps(stamped))
    edited["mla_prefill"]["cpu"]["tiers"][0]["BLOCK_M"] = 128  # edited after verification
    assert isinstance(C.stamp_problems(edited)[0], C.OverlayUnverified)
    edited_meta = json.loads(json.dumps(stamped))
    edited_meta["_meta"]["note"] = "comments in _meta do not matter"
    assert C.stamp_problems(edited_meta) == []
    real = C.software_versions()
    monkeypatch.setattr(C.overlay, "software_versions", lambda: {**real, "triton": "9.9.9"})  # Triton upgraded
    errs = C.stamp_problems(stamped)
    assert isinstance(errs[0], C.OverlayStale) and "9.9.9" in str(errs[0])


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", ""])
def test_unparsable_overlay(cfgdir, text):
    (cfgdir / "cpu.json").write_text(text)
    with pytest.warns(C.OverlayWarning, match="OverlayParseError"):
        assert C.config_for("mla_decode", "cpu") is C.package_config("mla_decode", "cpu")


def test_meta_arch_mismatch(cfgdir):
    data = {"_meta": {"arch": "gfx942"}}
    assert isinstance(C.validate_overlay(data, "cpu", check_stamp=False)[0], C.OverlayArchMismatch)


# --------------------------------------------------------------------------- the tuner's pieces


def test_shapes_and_presets():
    q = parse_shapes("quick")
    assert {s.op for s in q} == set(ALL_OPS)
    assert Shape.make("decode", B=128, N=16) in q
    mixed = parse_shapes("tp8,mtp;decode:B=64,seq=8192,N=16,kv=fp8")
    assert mixed[-1] == Shape.make("decode", B=64, seq=8192, N=16, kv="fp8")
    assert len(mixed) == len(set(mixed))
    full = parse_shapes("deepseek-v3")
    assert any(s.op == "decode" and s["N"] == 128 for s in full) and any(
        s["kv"] == "fp8" for s in full if s.op == "decode"
    )
    assert any(s.op == "decode" and s["q"] > 1 for s in full)
    for bad in ("nope", "decode:X=1", "decode:B"):
        with pytest.raises(ValueError):
            parse_shapes(bad)
    s = Shape.make("decode", B=2, block=16)
    assert Shape.make("decode", **dict(kv.split("=") for kv in s.label.split())) == s


def test_presets_are_the_cases_shape_sets():
    from rocm_mla import cases

    sets = {"tp8": ("decode", "tp8"), "dp": ("decode", "dp"), "mtp": ("decode", "mtp")}
    sets.update({op: (op, "tune") for op in ("prefill", "merge", "rope_kv_write")})
    for preset, (op, name) in sets.items():
        want = getattr(cases, op).SHAPES[name]
        got = parse_shapes(preset)
        assert [s.case_shape for s in got] == want, preset  # the timed inputs are built from these
        assert all(s.op == op and Shape.from_case(op, s.case_shape) == s for s in got)
    # sparse's, the indexer's and v4's tiny cases have requests of uneven lengths (no spec): the tuner's own
    # uniform ones
    own = ("sparse", "indexer", "v4")
    tiny = [s.case_shape for s in parse_shapes("tiny") if s.op not in own]
    mods = {"indexer": "indexer_topk"}
    assert tiny == [getattr(cases, mods.get(op, op)).SHAPES["tiny"][0] for op in ALL_OPS if op not in own]
    assert [s for s in parse_shapes("tiny") if s.op == "sparse"] == parse_shapes("sparse:B=2,ctx=64,N=16,K=32,block=16")
    assert [s for s in parse_shapes("tiny") if s.op == "indexer"] == parse_shapes(
        "indexer:B=1,ctx=300,H=32,topk=48,block=16"
    )
    assert [s for s in parse_shapes("tiny") if s.op == "v4"] == parse_shapes(
        "v4:B=2,ctx=150,H=16,kind=csa,topk=16,block=16"
    )
    with pytest.raises(ValueError, match="not expressible"):
        Shape.from_case("prefill", cases.prefill.SHAPES["verify"][0])  # uneven lengths: no B x L spec


def test_tiny_cases_check_against_the_reference(monkeypatch):
    """Each op's timed call on the tiny preset matches the reference; one wrong element is named."""
    dev = torch.device("cpu")
    for s in parse_shapes("tiny"):
        case = inputs.CASES[s.op](s, dev)
        assert case.copies == 1 and case.check() == "", s.key
        inp = case.inputs
        wrong = inp.q_pe if s.op == "rope_kv_write" else inp.output if s.op == "merge" else inp.out
        run = type(inp).run
        if s.op == "indexer":  # a top-k answer: one position repeated is not a valid one
            spoil = lambda w: w[0, 0].copy_(w[0, 1])  # noqa: E731
        else:
            spoil = lambda w: w[0, 0, 0].add_(1.0)  # noqa: E731
        monkeypatch.setattr(
            inp, "run", lambda *a, inp=inp, run=run, wrong=wrong, spoil=spoil, **k: (run(inp, *a, **k), spoil(wrong))
        )
        if s.op == "indexer":
            assert case.check().startswith("row 0: expected"), (s.key, case.check())
            continue
        name = {"rope_kv_write": "q_pe", "merge": "output"}.get(s.op, "out")
        assert case.check().startswith(f"{name}: 1 of"), s.key


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90", "cpu"])
def test_compose_tier_changes_only_its_combination(arch):
    from rocm_mla.ops.decode_plan import tier_config
    from rocm_mla.tools.tune.groups import tier_invariant_fields

    pkg = C.package_config("mla_decode", arch)
    for tier in pkg["tiers"]:
        for combo in ((torch.bfloat16, False), (torch.bfloat16, True), (torch.float16, True)):
            for cand in _listed(pkg):
                point = tier_config(arch, 0, combo[0], combo[1], cand)
                if not combo[1] and point["BLOCK_H"] != tier["BLOCK_H"]:
                    continue
                new = compose_tier(arch, tier, combo, point)
                # The batch-invariant fields stay the tier's, whatever the candidate's.
                point = tier_invariant_fields(arch, tier, combo, point)
                assert new is not None, (tier, combo, cand)
                assert new["BLOCK_H"] == tier["BLOCK_H"]  # tier selection unchanged
                for c in COMBOS:
                    want = (
                        point
                        if c == combo or (combo == (torch.bfloat16, False) and c[1] is False and c[0] == torch.float16)
                        else tier_config(arch, 0, *c, tier)
                    )
                    assert full_stage1(tier_config(arch, 0, c[0], c[1], new)) == full_stage1(want), (c, new)
                assert (
                    C.validate_overlay(_overlay(arch, {"mla_decode": {"tiers": [new]}}), arch, check_stamp=False) == []
                )


def test_compose_tier_with_v_split():
    """A V_SPLIT point (perf/sweeps/decode_sm90_vsplit.json) is expressible, and the tuner's knob
    moves keep V_SPLIT 2 with D_SPLIT 2."""
    from rocm_mla.ops.decode_plan import tier_config

    tier = C.package_config("mla_decode", "sm90")["tiers"][2]
    point = {**tier_config("sm90", 0, torch.bfloat16, False, tier), "D_SPLIT": 2, "V_SPLIT": 2, "num_warps": 4}
    new = compose_tier("sm90", tier, (torch.bfloat16, False), point)
    assert new is not None and tier_config("sm90", 0, torch.bfloat16, False, new)["V_SPLIT"] == 2
    # the fp8 path keeps its own config, whatever it is
    assert tier_config("sm90", 0, torch.bfloat16, True, new) == tier_config("sm90", 0, torch.bfloat16, True, tier)
    assert C.validate_overlay(_overlay("sm90", {"mla_decode": {"tiers": [new]}}), "sm90", check_stamp=False) == []
    assert _decode_fix({"D_SPLIT": 1, "V_SPLIT": 2})["D_SPLIT"] == 2


# --------------------------------------------------------------------------- the sparse op


def test_sparse_shape_spec_and_presets():
    """``sparse:`` specs, the round trip to the cases' shapes, and the presets built from them."""
    from rocm_mla import cases
    from rocm_mla.cases.sparse import SparseShape

    (s,) = parse_shapes("sparse:B=2,ctx=64,N=16,K=32,block=16")
    assert s.op == "sparse" and OP_KEYS["sparse"] == "mla_sparse_attention"
    assert s.case_shape == SparseShape.decode(2, 64, 16, 1, K=32, block=16)
    assert Shape.make("sparse", **dict(kv.split("=") for kv in s.label.split())) == s  # labels parse back
    mtp = Shape.make("sparse", B=4, ctx=100, N=8, q=2, K=64, kv="fp8", mode="slots", dt="fp32")
    assert mtp.case_shape == SparseShape((100,) * 4, 2, 8, K=64, kv="fp8", mode="slots")
    assert mtp.dtype(torch.device("cpu")) == torch.float32
    for name in ("tune", "quick"):  # uniform decode, MTP and prefill-chunk shapes round-trip
        for cs in cases.sparse.SHAPES[name]:
            assert Shape.from_case("sparse", cs).case_shape == cs, cs
    assert [x.case_shape for x in parse_shapes("deepseek-v3.2") if x.op == "sparse"] == cases.sparse.SHAPES["tune"]
    assert parse_shapes("sparse") == [x for x in parse_shapes("deepseek-v3.2") if x.op == "sparse"]
    assert [x for x in parse_shapes("quick") if x.op == "sparse"] == [
        Shape.from_case("sparse", cs) for cs in cases.sparse.SHAPES["quick"]
    ]
    for cs in (cases.sparse.SHAPES["tiny"][0], cases.sparse.SHAPES["verify"][0], SparseShape((), 1)):
        with pytest.raises(ValueError, match="not expressible"):
            Shape.from_case("sparse", cs)  # uneven lengths or row counts, no request
    for bad in ("sparse:seq=64", "sparse:kv=fp16", "sparse:mode=global", "sparse:B=2,ctx=4,q=8"):
        with pytest.raises(ValueError):
            _ = parse_shapes(bad)[0].case_shape


def _op_tuner(op: str, tmp_path, shapes: str, quick: bool = False, arch: str | None = None) -> Tuner:
    """A Tuner of ``op`` on the CPU; with ``arch``, one planning for a GPU of that arch (no kernel
    runs)."""
    t = Tuner(
        torch.device("cpu"),
        [op],
        parse_shapes(shapes),
        quick=quick,
        max_minutes=None,
        max_candidates=None,
        out_path=tmp_path / "cpu.json",
        argv=["test"],
        log=lambda s: None,
    )
    if arch is not None:
        t.arch, t.dev = arch, torch.device("cuda")
        t.package = {k: C.package_config(k, arch) for k in t.package}
        t.current = dict(t.package)
    return t


def _sparse_tuner(tmp_path, shapes: str, quick: bool = False, arch: str | None = None) -> Tuner:
    """A Tuner of the sparse op on the CPU; with ``arch``, one planning for a GPU of that arch (bf16 q)."""
    return _op_tuner("sparse", tmp_path, shapes, quick, arch)


def test_sparse_groups_for_the_tiny_preset(tmp_path):
    """One group per (tier, kind of call), the split group in full mode; a point is written back
    into its tier alone."""
    from rocm_mla.ops.sparse_plan import tier_config

    t = _sparse_tuner(tmp_path, "tiny")
    t.plan()
    assert [g.name for g in t.groups] == ["tiers[0] H16 16-bit cache", "split"]
    g, split = t.groups
    assert [s.op for s in g.shapes] == ["sparse"] and g.op_key == "mla_sparse_attention"
    assert g.point0 == tier_config("cpu", 16, torch.float16, False)
    assert g.build(g.point0)["tiers"] == t.package[g.op_key]["tiers"]  # the default writes the package's tier
    knobs = dict(g.knobs)
    assert knobs["BLOCK_N"] == [16, 32, 64] and knobs["num_stages"] == [2, 3, 4, 5] and "RELOAD_K" not in knobs
    assert all(p["BLOCK_H"] == 16 for p in g.listed)
    assert split.point0 == t.package[g.op_key]["split"] and {k for k, _ in split.knobs} == set(split.point0)
    # a winner changes its tier's 16-bit config alone
    new = g.build({**g.point0, "BLOCK_N": 32})
    assert tier_config("cpu", 16, torch.float16, False, new["tiers"][0])["BLOCK_N"] == 32
    for dt, fp8 in ((torch.float16, True), (torch.float32, False), (torch.float32, True)):
        assert tier_config("cpu", 16, dt, fp8, new["tiers"][0]) == tier_config("cpu", 16, dt, fp8)
    assert new["tiers"][1:] == t.package[g.op_key]["tiers"][1:]
    assert C.validate_overlay(_overlay("cpu", {"mla_sparse_attention": new}), "cpu", check_stamp=False) == []
    # quick mode: no split group; fp8 caches and float32 q have their own groups
    t = _sparse_tuner(tmp_path, "sparse:N=16,kv=fp8;sparse:N=128,dt=fp32;sparse:N=16,dt=fp32,kv=fp8", quick=True)
    t.plan()
    assert [g.name for g in t.groups] == ["tiers[0] H16 fp8 cache", "tiers[2] H64 fp32 q"]  # fp32 q + fp8: not tuned
    assert "RELOAD_K" in dict(t.groups[0].knobs) and "F16_DOT" not in dict(t.groups[0].knobs)


@pytest.mark.parametrize("arch", ["gfx942", "sm90"])
def test_sparse_groups_on_gpus(tmp_path, arch):
    """The groups of the DeepSeek-V3.2 preset on an AMD and an NVIDIA GPU (bf16 q; planned only)."""
    from rocm_mla.ops.sparse_plan import tier_config
    from rocm_mla.tools.tune.groups import sparse_groups

    t = _sparse_tuner(tmp_path, "deepseek-v3.2", arch=arch)
    groups = sparse_groups(t, t.shapes)
    names = [g.name for g in groups]
    assert names == ["tiers[0] H16 16-bit cache", "tiers[0] H16 fp8 cache", "tiers[2] H64 16-bit cache", "split"]
    fp8 = dict(groups[1].knobs)
    assert groups[1].point0 == tier_config(arch, 16, torch.bfloat16, True)
    assert ("F16_DOT" in fp8) == (arch == "sm90") and "RELOAD_K" in fp8
    assert ("kpack" in dict(groups[0].knobs)) == (arch == "gfx942")
    assert {s["N"] for s in groups[2].shapes} == {128} and {s["q"] for s in groups[2].shapes} == {1, 2}


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90", "cpu"])
def test_compose_sparse_tier_changes_only_its_kind(arch):
    """A point for one kind (16-bit, fp8 cache, float32 q) leaves the others' configs as they were."""
    from rocm_mla.ops.sparse_plan import tier_config

    kinds = {"16-bit": (torch.bfloat16, False), "fp8": (torch.bfloat16, True), "fp32": (torch.float32, False)}
    pkg = C.package_config("mla_sparse_attention", arch)
    for tier in pkg["tiers"]:
        h = tier["BLOCK_H"]
        for kind, (qdt, fp8) in kinds.items():
            points = [tier_config(arch, h, qdt, fp8, c) for c in _listed(pkg)]
            points.append({**tier_config(arch, h, qdt, fp8, tier), "BLOCK_N": 64, "num_warps": 8, "RELOAD_K": True})
            for point in points:
                if point["BLOCK_H"] > h or (kind == "16-bit" and point["BLOCK_H"] != h):
                    continue
                new = compose_sparse_tier(arch, tier, kind, point)
                assert new is not None and new["BLOCK_H"] == h, (tier, kind, point)
                for k, (q2, f2) in kinds.items():
                    want = tier_config(arch, h, q2, f2, point if k == kind else tier)
                    assert tier_config(arch, h, q2, f2, new) == want, (k, new)
                sub = {"tiers": [new]}
                assert C.validate_overlay(_overlay(arch, {"mla_sparse_attention": sub}), arch, check_stamp=False) == []
        # the package's own config composes to a tier that resolves as the tier does, fp32 q + fp8 included
        new = compose_sparse_tier(arch, tier, "16-bit", tier_config(arch, h, torch.bfloat16, False, tier))
        assert tier_config(arch, h, torch.float32, True, new) == tier_config(arch, h, torch.float32, True, tier)
    tier = C.package_config("mla_sparse_attention", arch)["tiers"][0]
    assert compose_sparse_tier(arch, tier, "16-bit", {**tier, "BLOCK_H": 2 * tier["BLOCK_H"]}) is None  # the tier key


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90", "cpu"])
def test_prefill_groups_and_composed_tiers(tmp_path, arch):
    """mla_prefill: a group per kind of input of the first tier, the 16-bit one listing the configs'
    candidates; a point for one kind leaves the other kind's launch and the other tiers as they were."""
    t = _op_tuner("prefill", tmp_path, "prefill:dt=bf16;prefill:dt=fp32", arch=None if arch == "cpu" else arch)
    t.plan()
    pkg = t.package["mla_prefill"]
    g16, g32 = t.groups
    assert (g16.name, g32.name) == ("16-bit", "fp32") and g32.listed == []
    assert g16.point0 == C.resolve_tier(pkg["tiers"][0], []) and g32.point0 == C.resolve_tier(pkg["tiers"][0], ["fp32"])
    assert sorted(map(point_key, g16.listed)) == sorted(point_key(c) for c in pkg["candidates"] if c != g16.point0)
    assert g16.build(g16.point0) == pkg and g32.build(g32.point0) == pkg
    for g in (g16, g32):
        for p in g.listed + Tuner.neighbours(g):
            new = g.build(p)
            assert new is not None and new["tiers"][1:] == pkg["tiers"][1:]
            got = {k: C.resolve_tier(new["tiers"][0], tags) for k, tags in (("16-bit", []), ("fp32", ["fp32"]))}
            assert got == {"16-bit": g16.point0, "fp32": g32.point0, g.name: p}
            assert C.validate_overlay(_overlay(arch, {"mla_prefill": new}), arch, check_stamp=False) == []
    tier = {k: v for k, v in pkg["tiers"][0].items() if k != "fp32"}
    assert compose_prefill_tier({**tier, "fp32": {"BLOCK_M": 16}}, "fp32", {**tier, "BLOCK_M": 16}) is not None
    assert compose_prefill_tier(tier, "fp32", {"BLOCK_M": 16}) is None  # a 16-bit field float32 would inherit


@pytest.mark.parametrize("op,impl", [(op, impl) for op in ("merge", "rope_kv_write") for impl in ("hip", "triton")])
def test_impl_groups_take_the_configs_candidates(tmp_path, monkeypatch, op, impl):
    """merge / RoPE: the dispatched implementation's tier is the default, its candidates
    (``hip.candidates`` for the HIP kernel) the listed points, the fields they vary the knobs; a
    winner replaces that tier."""
    from rocm_mla.ops import _dispatch
    from rocm_mla.tools.tune.groups import impl_groups

    monkeypatch.setattr(_dispatch, "select", lambda *a, **k: impl)
    t = _op_tuner(op, tmp_path, op, arch="gfx942")
    (g,) = impl_groups(t, op, t.shapes)
    pkg = t.package[OP_KEYS[op]]
    obj = pkg["hip"] if impl == "hip" else pkg
    assert g.point0 == obj["tiers"][0] and g.build(g.point0) == pkg
    assert sorted(map(point_key, g.listed)) == sorted(map(point_key, obj["candidates"]))
    varied = [k for k in g.point0 if len({c[k] for c in obj["candidates"]}) > 1]
    assert [k for k, _ in g.knobs][: len(varied)] == varied
    new = g.build(g.listed[0])
    assert (new["hip"] if impl == "hip" else new)["tiers"] == [g.listed[0]]
    assert C.validate_overlay(_overlay("gfx942", {OP_KEYS[op]: new}), "gfx942", check_stamp=False) == []


# --------------------------------------------------------------------------- the v4 op

V4 = "mla_v4_attention"


def test_v4_shape_spec_and_presets():
    """``v4:`` specs, the round trip to the cases' shapes, and the presets built from them."""
    from rocm_mla import cases
    from rocm_mla.cases.v4_attention import V4Shape

    (s,) = parse_shapes("v4:B=2,ctx=150,H=16,kind=csa,topk=16,block=16")
    assert s.op == "v4" and OP_KEYS["v4"] == V4 and "v4" in ALL_OPS
    assert s.case_shape == V4Shape.decode(2, 150, 16, 1, kind="csa", topk=16, block=16)
    assert Shape.make("v4", **dict(kv.split("=") for kv in s.label.split())) == s  # labels parse back
    assert parse_shapes("v4:")[0].case_shape == V4Shape.decode(128, 32768, 16, kind="csa", topk=512)
    mtp = Shape.make("v4", B=4, ctx=1000, H=64, q=2, kind="hca", kv="auto", dt="fp32")
    assert mtp.case_shape == V4Shape((1000,) * 4, 2, 64, kind="hca", kv="auto")
    assert mtp.dtype(torch.device("cpu")) == torch.float32
    tune = [Shape.from_case("v4", cs) for cs in cases.v4_attention.SHAPES["tune"]]
    assert [x.case_shape for x in tune] == cases.v4_attention.SHAPES["tune"]  # uniform decode shapes round-trip
    assert parse_shapes("v4") == parse_shapes("deepseek-v4") == tune
    assert [x for x in parse_shapes("quick") if x.op == "v4"] == tune
    assert not any(x.op == "v4" for x in parse_shapes("deepseek-v3") + parse_shapes("deepseek-v3.2"))
    for name in ("tiny", "selfcheck", "odd"):
        for cs in cases.v4_attention.SHAPES[name]:
            with pytest.raises(ValueError, match="not expressible"):
                Shape.from_case("v4", cs)  # uneven lengths or rows, ragged lists, holes, a ratio or block of its own
    for bad in ("v4:N=16", "v4:kind=swa", "v4:kv=fp16", "v4:B=2,ctx=4,q=8", "v4:topk=x"):
        with pytest.raises(ValueError):
            _ = parse_shapes(bad)[0].case_shape


def test_v4_groups_for_the_tiny_preset(tmp_path):
    """One group per (tier, kind of q), the split group in full mode; a point is written back into
    its tier alone, the float32 launch kept."""
    from rocm_mla.ops.v4_attention_plan import tier_config

    t = _op_tuner("v4", tmp_path, "tiny")
    t.plan()
    assert [g.name for g in t.groups] == ["tiers[0] H16 16-bit q", "split"]
    g, split = t.groups
    assert [s.op for s in g.shapes] == ["v4"] and g.op_key == V4
    assert g.point0 == tier_config("cpu", 16, torch.float16)
    assert g.build(g.point0)["tiers"] == t.package[V4]["tiers"]  # the default writes the package's tier
    knobs = dict(g.knobs)
    assert knobs["BLOCK_N"] == [16, 32, 64] and knobs["num_warps"] == [4, 8] and "waves_per_eu" not in knobs
    assert all(p["BLOCK_H"] == 16 for p in g.listed)
    assert split.point0 == t.package[V4]["split"] and {k for k, _ in split.knobs} == set(split.point0)
    new = g.build({**g.point0, "BLOCK_N": 32})
    assert tier_config("cpu", 16, torch.float16, new["tiers"][0])["BLOCK_N"] == 32
    assert tier_config("cpu", 16, torch.float32, new["tiers"][0]) == tier_config("cpu", 16, torch.float32)
    assert C.validate_overlay(_overlay("cpu", {V4: new}), "cpu", check_stamp=False) == []
    # quick mode: no split group; float32 q has its own group, every cache kind shares its q's
    t = _op_tuner("v4", tmp_path, "v4:H=16,kv=auto;v4:H=16;v4:H=128,dt=fp32", quick=True)
    t.plan()
    assert [(g.name, len(g.shapes)) for g in t.groups] == [("tiers[0] H16 16-bit q", 2), ("tiers[0] H16 fp32 q", 1)]


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90"])
def test_v4_groups_on_gpus(tmp_path, arch):
    """The groups of the DeepSeek-V4 preset on AMD and NVIDIA GPUs (bf16 q; planned only): a tier
    group lists the configs' tiers and ``candidates`` (sm90's grid) whose BLOCK_H is the tier's."""
    from rocm_mla.ops.v4_attention_plan import tier_config
    from rocm_mla.tools.tune.groups import v4_groups

    t = _op_tuner("v4", tmp_path, "deepseek-v4", arch=arch)
    groups = v4_groups(t, t.shapes)
    pkg = C.package_config(V4, arch)
    tiers = pkg["tiers"]
    hi = C.tier_index(tiers, 64)  # 64 and 128 heads: the last tier (gfx942's is H32, two head blocks)
    assert hi == len(tiers) - 1
    names = [g.name for g in groups]
    assert names == [
        f"tiers[0] H{tiers[0]['BLOCK_H']} 16-bit q",
        f"tiers[{hi}] H{tiers[hi]['BLOCK_H']} 16-bit q",
        "split",
    ]
    assert {s["H"] for s in groups[0].shapes} == {8, 16} and {s["H"] for s in groups[1].shapes} == {64, 128}
    for g, ti in zip(groups, (0, hi)):
        h = tiers[ti]["BLOCK_H"]
        assert g.point0 == tier_config(arch, h, torch.bfloat16)
        want = {point_key(tier_config(arch, h, torch.bfloat16, c)) for c in _listed(pkg)} - {point_key(g.point0)}
        assert {point_key(p) for p in g.listed} == {k for k in want if json.loads(k)["BLOCK_H"] == h}
        knobs = dict(g.knobs)
        assert ("kpack" in knobs) == ("waves_per_eu" in knobs) == (arch != "sm90") and "D_SPLIT" not in knobs
        for p in g.listed + Tuner.neighbours(g):
            new = g.build(p)
            assert new is not None and tier_config(arch, h, torch.bfloat16, new["tiers"][ti]) == p
            assert C.validate_overlay(_overlay(arch, {V4: new}), arch, check_stamp=False) == []
    if arch == "sm90":  # the candidates grid: 2 BLOCK_N x 2 num_warps x 2 num_stages per BLOCK_H
        for g, ti in zip(groups, (0, hi)):
            grid = [c for c in pkg["candidates"] if c["BLOCK_H"] == tiers[ti]["BLOCK_H"]]
            assert len(grid) == 8 and len(g.listed) >= 7


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90", "cpu"])
def test_compose_v4_tier_changes_only_its_kind(arch):
    """A point for 16-bit or float32 q leaves the other kind's config as it was."""
    from rocm_mla.ops.v4_attention_plan import tier_config

    kinds = {"16-bit": torch.bfloat16, "fp32": torch.float32}
    pkg = C.package_config(V4, arch)
    for tier in pkg["tiers"]:
        h = tier["BLOCK_H"]
        for kind, qdt in kinds.items():
            points = [tier_config(arch, h, qdt, c) for c in _listed(pkg)]
            points.append({**tier_config(arch, h, qdt, tier), "BLOCK_N": 64, "num_warps": 8, "ctas_per_cu": 2})
            for point in points:
                if point["BLOCK_H"] > h or (kind == "16-bit" and point["BLOCK_H"] != h):
                    continue
                new = compose_v4_tier(arch, tier, kind, point)
                assert new is not None and new["BLOCK_H"] == h, (tier, kind, point)
                for k, q2 in kinds.items():
                    assert tier_config(arch, h, q2, new) == tier_config(arch, h, q2, point if k == kind else tier)
                assert C.validate_overlay(_overlay(arch, {V4: {"tiers": [new]}}), arch, check_stamp=False) == []
        # the package's own config composes back to a tier that resolves as the tier does
        new = compose_v4_tier(arch, tier, "16-bit", tier_config(arch, h, torch.bfloat16, tier))
        assert all(tier_config(arch, h, q, new) == tier_config(arch, h, q, tier) for q in kinds.values())
    tier = pkg["tiers"][0]
    assert compose_v4_tier(arch, tier, "16-bit", {**tier, "BLOCK_H": 2 * tier["BLOCK_H"]}) is None  # the tier key


def test_v4_verification_cases():
    """A changed 16-bit top level is verified for each 16-bit q dtype over fp8_ds_mla and q-dtype
    caches, one split and three, with the tier's BLOCK_H heads; the split model over the general
    calls; on a GPU on the cases' selfcheck CSA shape."""
    from rocm_mla.cases.v4_attention import SHAPES

    dev = torch.device("cpu")
    pkg = C.package_config(V4, "cpu")
    assert acceptance.verification_cases(V4, "cpu", dev, pkg, pkg) == []
    tier = pkg["tiers"][0]
    new = {**pkg, "tiers": [compose_v4_tier("cpu", tier, "16-bit", {**C.resolve_tier(tier, []), "BLOCK_N": 32})]}
    names = [w for w, _ in acceptance.verification_cases(V4, "cpu", dev, pkg, new)]  # float32 q: its launch kept
    assert names == [
        f"mla_v4_attention.cpu.tiers[0] q=float16 cache={c} H=16 S={s}"
        for c in ("fp8_ds_mla", "q dtype")
        for s in (1, 3)
    ]
    split = {**pkg, "split": {**pkg["split"], "max_splits": 8}}
    names = [w for w, _ in acceptance.verification_cases(V4, "cpu", dev, pkg, split)]
    assert (
        len(names) == 4 * len(acceptance._dtypes(dev)) + 3 and names[-1] == "mla_v4_attention.cpu H=16 batch_invariant"
    )
    shape = acceptance.v4_verify_shape(torch.device("cuda"))
    assert shape.kind == "csa" and shape.topk == 512 and shape in SHAPES["selfcheck"]
    gpu = acceptance.verification_cases(V4, "gfx942", torch.device("cuda"), pkg, new)  # names only
    assert gpu and all(w.startswith("mla_v4_attention.gfx942") for w, _ in gpu)


# --------------------------------------------------------------------------- the indexer op

INDEXER = "mla_indexer_topk"
# A config small enough for the interpreter: the plan raises split_keys and chunk to one element a
# thread (4 warps x 32 lanes there), so the selfcheck rows of 200 keys take two splits and a merge.
SMALL_INDEXER = {
    "split_keys": 64,
    "BLOCK_N": 32,
    "num_warps": 4,
    "num_stages": 1,
    "merge": {"chunk": 64, "num_warps": 4},
}


def test_indexer_shape_spec_and_presets():
    """``indexer:`` specs, the round trip to the cases' shapes, and the presets built from them."""
    from rocm_mla import cases
    from rocm_mla.cases.indexer_topk import IndexerShape

    (s,) = parse_shapes("indexer:B=128,ctx=32768,H=64,q=1,topk=2048")
    assert s.op == "indexer" and OP_KEYS["indexer"] == INDEXER and "indexer" in ALL_OPS
    assert s.case_shape == IndexerShape.decode(128, 32768, 64) == cases.indexer_topk.SHAPES["tune"][0]
    assert parse_shapes("indexer:") == [s]  # the spec's defaults: DeepSeek-V3.2's decode at 32K
    assert Shape.make("indexer", **dict(kv.split("=") for kv in s.label.split())) == s  # labels parse back
    mtp = Shape.make("indexer", B=4, ctx=100, H=32, q=2, topk=64, block=16)
    assert mtp.case_shape == IndexerShape((100,) * 4, 2, 32, topk=64, block=16)
    for cs in cases.indexer_topk.SHAPES["tune"] + cases.indexer_topk.SHAPES["quick"]:
        assert Shape.from_case("indexer", cs).case_shape == cs, cs
    tune = [Shape.from_case("indexer", cs) for cs in cases.indexer_topk.SHAPES["tune"]]
    assert parse_shapes("indexer") == tune
    assert [x for x in parse_shapes("deepseek-v3.2") if x.op == "indexer"] == tune
    assert [x for x in parse_shapes("quick") if x.op == "indexer"] == tune
    assert not any(x.op == "indexer" for x in parse_shapes("deepseek-v3"))
    for name in ("tiny", "verify", "selfcheck"):
        with pytest.raises(ValueError, match="not expressible"):
            Shape.from_case("indexer", cases.indexer_topk.SHAPES[name][0])  # uneven lengths or row counts
    for bad in ("indexer:N=16", "indexer:dt=fp16", "indexer:B=2,ctx=4,q=8", "indexer:topk=x"):
        with pytest.raises(ValueError):
            _ = parse_shapes(bad)[0].case_shape


def _indexer_tuner(tmp_path, shapes: str, quick: bool = False, arch: str | None = None) -> Tuner:
    """A Tuner of the indexer on the CPU; with ``arch``, one planning for a GPU of that arch."""
    return _op_tuner("indexer", tmp_path, shapes, quick, arch)


@pytest.mark.parametrize("arch,count", [("sm90", 14), ("gfx942", 14), ("gfx950", 14), ("cpu", 6)])
def test_indexer_group_and_candidates(tmp_path, arch, count):
    """One group over every shape; its point is the arch's one tier, its candidates the configs'
    complete launch configs, each one field changed (num_stages and key_streams on NVIDIA,
    waves_per_eu and the many_items grid on gfx9, the prefilter's split where the tier has one), each one a distinct
    launch; --quick keeps 4."""
    from rocm_mla.tools.tune.groups import indexer_launch
    from rocm_mla.tools.tune.overlay import _obj_diff

    shapes, gpu = ("tiny", None) if arch == "cpu" else ("deepseek-v3.2", arch)
    t = _indexer_tuner(tmp_path, shapes, arch=gpu)
    t.plan()
    (g,) = t.groups
    assert g.op == "indexer" and g.op_key == INDEXER and g.name == "launch data"
    assert g.shapes == [s for s in t.shapes if s.op == "indexer"] and g.knobs == []
    pkg = C.package_config(INDEXER, arch)
    tier = pkg["tiers"][0]
    assert g.point0 == tier and g.build(g.point0) == pkg
    assert t.count(g) == count == 1 + len(g.listed) and g.listed == pkg["candidates"]
    launches = {json.dumps(indexer_launch(arch, p, 2048 if arch != "cpu" else 64), sort_keys=True) for p in g.listed}
    assert len(launches) == len(g.listed)
    changed = set()
    for p in g.listed:
        assert set(p) == set(tier) and g.build(p) == {**pkg, "tiers": [p]}
        ((k, v),) = _obj_diff(tier, p).items()  # one field
        if k in ("merge", "prefilter", "many_items"):
            ((sub, _),) = v.items()
            k = f"{k}.{sub}"
        changed.add(k)
        assert C.validate_overlay(_overlay(arch, {INDEXER: {"tiers": [p]}}), arch, check_stamp=False) == []
    assert ("num_stages" in changed) == (arch == "sm90")
    assert ("waves_per_eu" in changed) == arch.startswith("gfx")
    assert {"BLOCK_N", "num_warps", "split_keys", "merge.chunk"} <= changed
    assert ("programs_per_cu" in changed) == (arch != "cpu")
    assert ("key_streams" in changed) == (arch == "sm90")
    assert ("prefilter.split_keys" in changed) == (arch != "cpu")
    assert ("many_items.programs_per_cu" in changed) == arch.startswith("gfx")
    if arch == "sm90":
        splits = sorted(p["split_keys"] for p in g.listed if p["split_keys"] != tier["split_keys"])
        assert splits == [4096, 16384] and {p["num_stages"] for p in g.listed} == {2, 3, 4}
    assert g.label(g.point0).startswith(f"S{tier['split_keys']} N{tier['BLOCK_N']} w{tier['num_warps']}")
    t = _indexer_tuner(tmp_path, shapes, quick=True, arch=gpu)
    t.plan()
    assert t.count(t.groups[0]) == 4


def test_indexer_candidates_are_what_the_plan_launches(tmp_path):
    """``indexer_launch`` raises split_keys and chunk as the plan does; candidates the plan would
    launch like the tier (a top-k past every split size) are left out."""
    from rocm_mla.ops import plan_indexer_topk
    from rocm_mla.tools.tune.groups import indexer_launch

    pkg = C.package_config(INDEXER, "cpu")
    tier = pkg["tiers"][0]
    for cfg in [tier, {**tier, **SMALL_INDEXER}, *pkg["candidates"]]:
        for topk in (40, 700):
            plan = plan_indexer_topk(
                num_rows=2, num_heads=16, topk=topk, max_kv_len=4096, block_size=16,
                q_dtype=torch.float8_e4m3fn, device=torch.device("cpu"), config=cfg,
            )  # fmt: skip
            want = indexer_launch("cpu", cfg, plan.topk_p2)
            assert (plan.split_keys, plan.config["merge"]) == (want["split_keys"], want["merge"])
    t = _indexer_tuner(tmp_path, "indexer:topk=16384", arch="sm90")
    t.plan()
    sm90 = C.package_config(INDEXER, "sm90")["tiers"][0]
    assert not any(p["split_keys"] != sm90["split_keys"] for p in t.groups[0].listed)


def test_indexer_case_plans_once_per_config():
    """The timed call passes one plan and one workspace while the config stays, a new pair under
    another config (the candidate's, through config_for); its check reads the answer it wrote."""
    (s,) = [x for x in parse_shapes("tiny") if x.op == "indexer"]
    case = inputs.CASES["indexer"](s, torch.device("cpu"))
    inp, seen = case.inputs, []
    run = type(inp).run
    inp.run = lambda *a, **k: (seen.append((k["plan"], k["workspace"])), run(inp, *a, **k))[1]
    assert case.check() == ""
    case.call(0)
    assert seen[0][0] is seen[1][0] and seen[0][1] is seen[1][1]
    assert seen[0][0].num_splits >= 2 and seen[0][1].numel() >= seen[0][0].workspace_numel  # the merge runs
    pkg = C.package_config(INDEXER, "cpu")
    other = {**pkg, "tiers": [{**pkg["tiers"][0], "split_keys": 512}]}
    with C.override(INDEXER, "cpu", other):
        assert case.check() == ""
    assert seen[2][0] is not seen[0][0] and seen[2][0].config["split_keys"] == 512


def test_indexer_overlay_round_trip(cfgdir, tmp_path):
    """A winner is written as the tiers list it replaces (a list is replaced whole), validates,
    stamps, and config_for then returns the winner."""
    t = _indexer_tuner(tmp_path, "tiny")
    pkg = t.package[INDEXER]
    tier = pkg["tiers"][0]
    win = {**pkg, "tiers": [{**tier, "split_keys": 512, "merge": {**tier["merge"], "chunk": 256}}]}
    t.current[INDEXER] = win
    data = t.overlay()
    assert data[INDEXER] == {"cpu": {"tiers": win["tiers"]}}
    assert C.validate_overlay(data, "cpu") == [] and C.stamp_problems(data) == []
    assert C.merge_overlay(pkg, data[INDEXER]["cpu"]) == win
    (cfgdir / "cpu.json").write_text(json.dumps(data))
    C.reload_overlays()
    assert C.config_for(INDEXER, "cpu") == win
    lines = describe_overlay(C.overlay_status("cpu"))
    assert any("mla_indexer_topk.tiers[0].split_keys: 256 -> 512" in x for x in lines)
    t.current[INDEXER] = pkg
    assert INDEXER not in t.overlay()  # the default changes nothing
    for arch in ("gfx942", "sm90"):  # a GPU's object: the same diff composes back
        from rocm_mla.tools.tune.overlay import _obj_diff

        base = C.package_config(INDEXER, arch)
        for p in base["candidates"]:
            entry = _obj_diff(base, {**base, "tiers": [p]})
            assert entry == {"tiers": [p]} and C.merge_overlay(base, entry) == {**base, "tiers": [p]}
            assert C.validate_overlay(_overlay(arch, {INDEXER: entry}), arch, check_stamp=False) == []


def test_indexer_acceptance_in_the_interpreter():
    """verify(): a changed indexer config is run on the interpreter's check shapes (several splits
    and a merge, then the one-split form) and its answers must be valid top-k; a config the plan
    refuses is a named compile error; on a GPU the cases' verify shapes are the ones run."""
    from rocm_mla.cases.indexer_topk import SHAPES
    from rocm_mla.ops import plan_indexer_topk

    dev = torch.device("cpu")
    pkg = C.package_config(INDEXER, "cpu")
    small_tier = {**pkg["tiers"][0], **SMALL_INDEXER}
    small = {**pkg, "tiers": [small_tier]}
    assert acceptance.verification_cases(INDEXER, "cpu", dev, pkg, pkg) == []
    cases = acceptance.verification_cases(INDEXER, "cpu", dev, pkg, small)
    shape = SHAPES["selfcheck"][0]
    assert [w for w, _ in cases] == [
        f"mla_indexer_topk.cpu {shape.label()}",
        f"mla_indexer_topk.cpu {acceptance.indexer_one_split(shape).label()} (one split)",
    ]
    for s, splits in ((shape, 2), (acceptance.indexer_one_split(shape), 1)):
        plan = plan_indexer_topk(
            num_rows=s.T, num_heads=s.H, topk=s.topk, max_kv_len=-(-max(s.lens) // s.block) * s.block,
            block_size=s.block, q_dtype=torch.float8_e4m3fn, device=dev, config=small_tier,
        )  # fmt: skip
        assert plan.num_splits == splits
    assert acceptance.verify(INDEXER, "cpu", dev, pkg, small) == []
    errs = acceptance.verify(INDEXER, "cpu", dev, pkg, {**pkg, "tiers": [{**small_tier, "BLOCK_N": 48}]})
    assert len(errs) == 2 and all(isinstance(e, C.OverlayCompileError) for e in errs)
    assert "BLOCK_N a power of two" in str(errs[0]) and errs[0].name == "OverlayCompileError"
    gpu = acceptance.verification_cases(INDEXER, "gfx942", torch.device("cuda"), pkg, small)  # names only
    assert [w for w, _ in gpu][0] == f"mla_indexer_topk.gfx942 {SHAPES['verify'][0].label()}"
    one = acceptance.indexer_one_split(SHAPES["verify"][0])
    assert one.lens == (2048, 70, 2048) and one.rows == SHAPES["verify"][0].rows


class _FakeCase:
    """No kernel: the 'time' is a function of the config the op would read (config_for), so the
    tuner's choice can be checked exactly."""

    def __init__(self, s, dev):
        self.s = s

    def check(self):
        return ""


def _fake_tuner(tmp_path, monkeypatch, times, ops=("merge",), shapes="merge:T=40,N=4,D=128;merge:T=64,N=4,D=128", **kw):
    """A Tuner for merge on the CPU whose timer returns times[(tile_elems, num_warps)][shape T]."""
    monkeypatch.setitem(inputs.CASES, "merge", _FakeCase)
    calls = []

    def timer(case):
        cfg = C.config_for("merge_attn_states", "cpu")["tiers"][0]
        key = (cfg["tile_elems"], cfg["num_warps"])
        calls.append(key)
        t = times(key, case.s["T"], len(calls))
        return t

    kw.setdefault("quick", True)
    monkeypatch.setattr(acceptance, "verify", lambda *a, **k: [])  # the small real-kernel checks are tested below
    tuner = Tuner(
        torch.device("cpu"),
        list(ops),
        parse_shapes(shapes),
        max_minutes=kw.pop("max_minutes", None),
        max_candidates=None,
        out_path=tmp_path / "cpu.json",
        argv=["test"],
        log=lambda s: None,
        timer=timer,
        **kw,
    )
    return tuner, calls


DEFAULT_MERGE = (
    C.package_config("merge_attn_states", "cpu")["tiers"][0]["tile_elems"],
    C.package_config("merge_attn_states", "cpu")["tiers"][0]["num_warps"],
)


def test_tuner_keeps_a_faster_winner_and_never_a_slower_one(cfgdir, tmp_path, monkeypatch):
    def times(key, t, n):
        if key == DEFAULT_MERGE:
            return 100.0
        if key == (8192, 4):  # 30% faster at one shape, 5% slower at the other: never taken
            return 70.0 if t == 40 else 105.0
        if key == (4096, 8):  # 10% faster everywhere: the winner
            return 90.0
        return 99.5  # within 1%: a tie, the default's

    tuner, calls = _fake_tuner(tmp_path, monkeypatch, times)
    data = tuner.run()
    assert DEFAULT_MERGE in calls  # the default is always timed
    assert data["merge_attn_states"]["cpu"] == {"tiers": [{"tile_elems": 4096, "num_warps": 8}]}
    for r in data["_meta"]["shapes"].values():
        assert r["tuned_us"] <= r["default_us"]
    assert C.stamp_problems(data) == [] and data["_meta"]["arch"] == "cpu"
    # written where the loader looks: the next config_for (after the reload run() did) uses it
    assert json.loads((tmp_path / "cpu.json").read_text())["merge_attn_states"] == data["merge_attn_states"]


def test_ties_go_to_the_default(cfgdir, tmp_path, monkeypatch):
    tuner, _ = _fake_tuner(tmp_path, monkeypatch, lambda key, t, n: 100.0 if key == DEFAULT_MERGE else 99.5)
    data = tuner.run()
    assert "merge_attn_states" not in data  # nothing changed: the overlay only records the measurements
    assert all(r["config"] == "default" for r in data["_meta"]["shapes"].values())


def test_retime_rejects_a_noisy_winner(cfgdir, tmp_path, monkeypatch):
    seen = {"search": True}

    def times(key, t, n):
        if key == DEFAULT_MERGE:
            return 100.0
        if key == (2048, 8) and seen["search"]:
            return 80.0  # fast while searching ...
        return 101.0  # ... slower when timed back to back with the default

    tuner, _ = _fake_tuner(tmp_path, monkeypatch, times)
    real = tuner.retime

    def retime(*a, **k):
        seen["search"] = False
        return real(*a, **k)

    monkeypatch.setattr(tuner, "retime", retime)
    data = tuner.run()
    assert "merge_attn_states" not in data
    assert "default kept" in data["_meta"]["groups"][0]["status"]


def test_max_minutes_is_a_hard_stop_that_still_writes(cfgdir, tmp_path, monkeypatch):
    tuner, calls = _fake_tuner(tmp_path, monkeypatch, lambda key, t, n: 100.0, max_minutes=1e-4)
    data = tuner.run()
    assert calls == []  # no candidate was started after the deadline
    assert data["_meta"]["complete"] is False and "max-minutes" in data["_meta"]["stopped"]
    assert (tmp_path / "cpu.json").is_file() and C.stamp_problems(data) == []


def test_cli_refuses_cpu_without_allow_cpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert tune_main(["--shapes", "tiny"]) == 2
    assert "--allow-cpu" in capsys.readouterr().err


# --------------------------------------------------------------------------- --check

# These run on the device that is here (the interpreter without a GPU), with an <arch>.json overlay.


def test_check_reports_compile_errors_by_name(cfgdir, capsys):
    a = _here()
    path = _write(cfgdir / f"{a}.json", _overlay(a, _prefill_tiers(a, BLOCK_M=48)))  # not 2^k
    assert tune_main(["--check", "--allow-cpu"]) == 1
    out = capsys.readouterr().out
    assert f"OverlayCompileError: mla_prefill.{a}.tiers" in out
    assert path.is_file()


def test_check_reports_reference_errors_by_name(cfgdir, capsys, monkeypatch):
    a = _here()
    monkeypatch.setattr(inputs, "verify_call", lambda op, shape, dev, dt, *a, **k: "out: relative norm error 1 > 0.002")
    _write(cfgdir / f"{a}.json", _overlay(a, _prefill_tiers(a, BLOCK_M=64)))
    assert tune_main(["--check", "--allow-cpu"]) == 1
    assert f"OverlayReferenceError: mla_prefill.{a}.tiers" in capsys.readouterr().out


def test_check_stamp_accepts_a_hand_written_overlay(cfgdir, capsys):
    a = _here()
    path = _write(cfgdir / f"{a}.json", _overlay(a, _prefill_tiers(a, BLOCK_M=64)), stamp=False)
    with pytest.warns(C.OverlayWarning, match="OverlayUnverified"):
        assert C.config_for("mla_prefill", a) is C.package_config("mla_prefill", a)
    assert tune_main(["--check", "--allow-cpu"]) == 1
    assert "OverlayUnverified" in capsys.readouterr().out
    assert tune_main(["--check", "--stamp", "--allow-cpu"]) == 0
    C.reload_overlays()
    assert C.config_for("mla_prefill", a)["tiers"][0]["BLOCK_M"] == 64
    assert C.stamp_problems(json.loads(path.read_text())) == []
    assert tune_main(["--check", "--allow-cpu"]) == 0


def test_check_names_schema_errors(cfgdir, capsys):
    a = _here()
    entry = _prefill_tiers(a, BLOCK_Q=1)["mla_prefill"]
    _write(cfgdir / f"{a}.json", {"mla_prefill": {a: entry}, "_meta": {"arch": a}})
    assert tune_main(["--check", "--allow-cpu"]) == 1
    assert f"OverlayUnknownKey: mla_prefill.{a}.tiers[0].BLOCK_Q" in capsys.readouterr().out


# --------------------------------------------------------------------------- a real (tiny) run


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU test; GPUs run the real tuner")
def test_tiny_interpreter_run_and_the_next_process_uses_it(cfgdir, capsys):
    rc = tune_main(["--allow-cpu", "--shapes", "tiny", "--max-candidates", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    path = cfgdir / "cpu.json"
    data = json.loads(path.read_text())
    meta = data["_meta"]
    assert meta["arch"] == "cpu" and meta["complete"] and meta["note"].startswith("CPU interpreter")
    assert {r["op"] for r in meta["shapes"].values()} == set(OP_KEYS.values())
    for r in meta["shapes"].values():
        assert r["tuned_us"] <= r["default_us"]
    assert out.rstrip().splitlines()[-1].startswith(ALL_OPS[-1])  # the table (rows in op order) comes last
    assert "default vs tuned per shape" in out and "ETA" in out
    # In this process (reloaded by the run) and in the next one, config_for is the package's data
    # with the overlay merged in.
    for op_key in C.SCHEMAS:
        want = (
            C.merge_overlay(C.package_config(op_key, "cpu"), data[op_key]["cpu"])
            if op_key in data
            else C.package_config(op_key, "cpu")
        )
        assert C.config_for(op_key, "cpu") == want
    code = (
        "import json, rocm_mla.configs as C; st = C.overlay_status('cpu'); "
        "print(json.dumps({'path': str(st.path), 'error': str(st.error) if st.error else None, "
        "'cfg': {op: C.config_for(op, 'cpu') for op in C.SCHEMAS}}))"
    )
    env = dict(
        os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    child = json.loads(res.stdout)
    assert child["path"] == str(path) and child["error"] is None
    assert child["cfg"] == json.loads(json.dumps({op: C.config_for(op, "cpu") for op in C.SCHEMAS}))
    assert tune_main(["--show"]) == 0
    shown = capsys.readouterr().out
    assert "ACTIVE" in shown and "default vs tuned per shape" in shown


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU test; GPUs run the real tuner")
def test_tiny_sparse_run_writes_a_valid_overlay(cfgdir, capsys, monkeypatch):
    """``--ops sparse --shapes tiny`` in the interpreter, its kernels checked against the reference,
    under a timer that makes BLOCK_N 32 the faster tile: the overlay holds that tier, is stamped and
    valid, passes ``--check``, and config_for returns it."""
    from rocm_mla.ops.sparse_plan import tier_config
    from rocm_mla.tools.tune import tuner as tuner_mod

    def timer(case):
        cfg = tier_config("cpu", 16, torch.float16, False)  # through config_for: the candidate's
        return 80.0 if cfg["BLOCK_N"] == 32 else 100.0

    monkeypatch.setattr(tuner_mod, "time_case_us", timer)
    assert tune_main(["--ops", "sparse", "--shapes", "tiny", "--allow-cpu", "--max-candidates", "3"]) == 0
    out = capsys.readouterr().out
    data = json.loads((cfgdir / "cpu.json").read_text())
    assert C.validate_overlay(data, "cpu") == []
    assert set(data) == {"mla_sparse_attention", "_meta"}
    groups = {g["name"]: g for g in data["_meta"]["groups"]}
    assert groups["tiers[0] H16 16-bit cache"]["status"] == "accepted"
    assert groups["split"]["status"].startswith("default kept")
    (row,) = data["_meta"]["shapes"].values()
    assert row["op"] == "mla_sparse_attention" and row["tuned_us"] < row["default_us"]
    tiers = C.config_for("mla_sparse_attention", "cpu")["tiers"]
    assert tiers == data["mla_sparse_attention"]["cpu"]["tiers"] and tiers[0]["BLOCK_N"] == 32
    assert tier_config("cpu", 16, torch.float16, True)["BLOCK_N"] == 16  # the fp8 path keeps its own
    assert "sparse   tiers[0] H16 16-bit cache" in out
    assert tune_main(["--check", "--allow-cpu"]) == 0
    assert "mla_sparse_attention: 2 compile + reference case(s)" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU test; GPUs run the real tuner")
def test_tiny_indexer_run_writes_a_valid_overlay(cfgdir, capsys, monkeypatch):
    """``--ops indexer --shapes tiny`` in the interpreter, every answer checked, under a timer that
    makes BLOCK_N 64 faster: the overlay holds that field alone, is stamped and valid, passes
    ``--check`` (its compile + reference cases), and config_for returns it."""
    from rocm_mla.tools.tune import tuner as tuner_mod

    def timer(case):
        return 80.0 if C.config_for(INDEXER, "cpu")["tiers"][0]["BLOCK_N"] == 64 else 100.0  # the candidate's

    monkeypatch.setattr(tuner_mod, "time_case_us", timer)
    assert tune_main(["--ops", "indexer", "--shapes", "tiny", "--allow-cpu", "--max-candidates", "3"]) == 0
    out = capsys.readouterr().out
    data = json.loads((cfgdir / "cpu.json").read_text())
    assert C.validate_overlay(data, "cpu") == []
    pkg = C.package_config(INDEXER, "cpu")
    win = {**pkg, "tiers": [{**pkg["tiers"][0], "BLOCK_N": 64}]}
    assert set(data) == {INDEXER, "_meta"} and data[INDEXER] == {"cpu": {"tiers": win["tiers"]}}
    (group,) = data["_meta"]["groups"]
    assert group["name"] == "launch data" and group["status"] == "accepted" and group["candidates_timed"] == 3
    (row,) = data["_meta"]["shapes"].values()
    assert row["op"] == INDEXER and row["tuned_us"] < row["default_us"] and row["config"].startswith("S256 N64")
    assert C.config_for(INDEXER, "cpu") == win
    assert "indexer  launch data" in out
    assert tune_main(["--check", "--allow-cpu"]) == 0
    assert "mla_indexer_topk: 2 compile + reference case(s)" in capsys.readouterr().out
    assert tune_main(["--ops", "indexer", "--shapes", "deepseek-v3.2", "--list-shapes"]) == 0
    assert capsys.readouterr().out.splitlines() == [s.key for s in parse_shapes("indexer")]


def test_check_reports_a_bad_indexer_config_by_name(cfgdir, capsys):
    a = _here()
    _write(cfgdir / f"{a}.json", _overlay(a, _one_tier(INDEXER, a, BLOCK_N=48)))  # not a power of two
    assert tune_main(["--check", "--allow-cpu"]) == 1
    assert f"OverlayCompileError: mla_indexer_topk.{a} lens=" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU test; GPUs run the real tuner")
def test_tiny_v4_run_writes_a_valid_overlay(cfgdir, capsys, monkeypatch):
    """``--ops v4 --shapes tiny`` in the interpreter, its kernels checked against the reference,
    under a timer that makes BLOCK_N 32 the faster tile: the overlay holds that tier, is stamped
    and valid, passes ``--check``, and config_for returns it; float32 q keeps its launch."""
    from rocm_mla.ops.v4_attention_plan import tier_config
    from rocm_mla.tools.tune import tuner as tuner_mod

    def timer(case):
        cfg = tier_config("cpu", 16, torch.float16)  # through config_for: the candidate's
        return 80.0 if cfg["BLOCK_N"] == 32 else 100.0

    monkeypatch.setattr(tuner_mod, "time_case_us", timer)
    assert tune_main(["--ops", "v4", "--shapes", "tiny", "--allow-cpu", "--max-candidates", "3"]) == 0
    out = capsys.readouterr().out
    data = json.loads((cfgdir / "cpu.json").read_text())
    assert C.validate_overlay(data, "cpu") == []
    assert set(data) == {V4, "_meta"}
    groups = {g["name"]: g for g in data["_meta"]["groups"]}
    assert groups["tiers[0] H16 16-bit q"]["status"] == "accepted"
    assert groups["split"]["status"].startswith("default kept")
    (row,) = data["_meta"]["shapes"].values()
    assert row["op"] == V4 and row["tuned_us"] < row["default_us"]
    tiers = C.config_for(V4, "cpu")["tiers"]
    assert tiers == data[V4]["cpu"]["tiers"] and tiers[0]["BLOCK_N"] == 32
    assert tier_config("cpu", 16, torch.float32) == C.resolve_tier(C.package_config(V4, "cpu")["tiers"][0], ["fp32"])
    assert "v4       tiers[0] H16 16-bit q" in out
    assert tune_main(["--check", "--allow-cpu"]) == 0
    assert "mla_v4_attention: 4 compile + reference case(s)" in capsys.readouterr().out


def test_check_reports_a_bad_v4_tier_by_name(cfgdir, capsys):
    a = _here()
    tiers = [dict(t) for t in C.package_config(V4, a)["tiers"]]
    tiers[0]["BLOCK_N"] = 48  # not a power of two
    _write(cfgdir / f"{a}.json", _overlay(a, {V4: {"tiers": tiers}}))
    assert tune_main(["--check", "--allow-cpu"]) == 1
    assert f"OverlayCompileError: mla_v4_attention.{a}.tiers[0]" in capsys.readouterr().out


def test_check_reports_a_bad_sparse_tier_by_name(cfgdir, capsys):
    a = _here()
    tiers = [dict(t) for t in C.package_config("mla_sparse_attention", a)["tiers"]]
    tiers[0]["BLOCK_N"] = 48  # not a power of two
    _write(cfgdir / f"{a}.json", _overlay(a, {"mla_sparse_attention": {"tiers": tiers}}))
    assert tune_main(["--check", "--allow-cpu"]) == 1
    assert f"OverlayCompileError: mla_sparse_attention.{a}.tiers[0]" in capsys.readouterr().out


def test_describe_overlay_states(cfgdir, monkeypatch):
    assert "none for cpu" in describe_overlay(C.overlay_status("cpu"))[0]
    _write(cfgdir / "cpu.json", _overlay("cpu", PREFILL_M64))
    C.reload_overlays()
    lines = describe_overlay(C.overlay_status("cpu"))
    old = C.package_config("mla_prefill", "cpu")["tiers"][0]["BLOCK_M"]
    assert "ACTIVE" in lines[0] and any(f"mla_prefill.tiers[0].BLOCK_M: {old} -> 64" in x for x in lines)
    _write(cfgdir / "cpu.json", _overlay("cpu", PREFILL_M64), stamp=False)
    C.reload_overlays()
    assert "IGNORED: OverlayUnverified" in describe_overlay(C.overlay_status("cpu"))[0]
    monkeypatch.setenv("ROCM_MLA_CONFIG_DIR", "")
    assert "off" in describe_overlay(C.overlay_status("cpu"))[0]
