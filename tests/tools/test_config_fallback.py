"""Per-arch launch data: every op has a gfx950 entry of its own beside gfx942's, an AMD arch
without an entry takes the nearest one (rocm_mla/configs/tables.py: AMD_FALLBACK), and the gfx950
entries keep the structure of gfx942's with the values its compiler honours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocm_mla.configs import config_for, package_config
from rocm_mla.configs.tables import AMD_FALLBACK, _table, amd_entry_key

CONFIG_DIR = Path(__file__).resolve().parents[2] / "rocm_mla" / "configs"
OPS = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


@pytest.mark.parametrize("op", OPS)
def test_every_op_has_gfx942_and_gfx950_entries(op):
    table = _table(op)
    assert "gfx942" in table and "gfx950" in table, f"{op}.json: {sorted(table)}"
    assert package_config(op, "gfx950") is table["gfx950"]
    assert config_for(op, "gfx950") == table["gfx950"]  # no overlay in the tests


@pytest.mark.parametrize("op", OPS)
def test_amd_fallback_rules(op):
    table = _table(op)
    assert amd_entry_key(table, "gfx955") == "gfx950"  # another CDNA4 part: gfx950's 160 KiB LDS
    assert amd_entry_key(table, "gfx90a") == "gfx942"  # any other gfx9 part: gfx942's
    assert amd_entry_key(table, "gfx1100") == "default"  # RDNA: no CDNA data
    assert package_config(op, "gfx955") == table["gfx950"]
    assert package_config(op, "gfx90a") == table["gfx942"]
    assert package_config(op, "gfx1100") == table["default"]
    assert [k for _, k in AMD_FALLBACK] == ["gfx950", "gfx942"]


@pytest.mark.parametrize("op", [op for op in OPS if op != "platform"])
def test_every_arch_object_has_the_one_shape(op):
    """Every op's arch object holds ``tiers`` (launch configs, at least one) and ``candidates``
    (configs in the tiers' shape, maybe none); a HIP kernel's ``hip`` object the same."""
    for arch, obj in _table(op).items():
        if arch.startswith("_"):
            continue
        for o in [obj] + ([obj["hip"]] if "hip" in obj else []):
            assert o["tiers"] and all(isinstance(c, dict) for c in o["tiers"] + o["candidates"]), (op, arch)


def test_gfx950_decode_tiers_keep_gfx942s_structure():
    """The tiers are chosen per arch, their shape is shared: the same tier count and BLOCK_H
    ladder (the tier lookup depends on it), the same top-level fields per tier."""
    t942, t950 = _table("mla_decode")["gfx942"], _table("mla_decode")["gfx950"]
    assert set(t950) == set(t942)
    assert [t["BLOCK_H"] for t in t950["tiers"]] == [t["BLOCK_H"] for t in t942["tiers"]]
    for a, b in zip(t942["tiers"], t950["tiers"]):
        assert {k for k in b if not isinstance(b[k], dict)} == {k for k in a if not isinstance(a[k], dict)}


def _walk(obj, where=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{where}.{k}")
            if k == "kpack":
                yield where, v
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{where}[{i}]")


@pytest.mark.parametrize("op", OPS)
def test_gfx950_kpack_is_one_the_compiler_honours(op):
    """Triton replaces kpack 2 by 1 on gfx950 (with a warning): a 2 there would be a config that
    is not what it says (configs/platform.json: kpack_values)."""
    allowed = config_for("platform", "gfx950")["kpack_values"]
    bad = [(w, v) for w, v in _walk(_table(op)["gfx950"]) if v not in allowed]
    assert not bad, bad


def test_platform_fp8_kinds_follow_vllm():
    assert config_for("platform", "gfx942")["fp8_dtype"] == "float8_e4m3fnuz"
    assert config_for("platform", "gfx950")["fp8_dtype"] == "float8_e4m3fn"


def test_docs_narrate_no_dates():
    """_doc strings say what fields mean and where values come from; the measurements behind
    the values live in docs/notes/config-rationale.md and git."""
    import re

    for path in sorted(CONFIG_DIR.glob("*.json")):
        doc = json.loads(path.read_text()).get("_doc", "")
        text = " ".join(doc) if isinstance(doc, list) else doc
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), path.name
