"""gfx950 launch data: the loader's fallback (rocm_mla/configs/tables.py: a gfx9 arch without its
own entry takes gfx942's) resolves every op on gfx950 to the pinned snapshot
(tests/data/gfx950_configs_snapshot.json), so a change to gfx942's data that gfx950 inherits is
deliberate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocm_mla.configs import config_for
from rocm_mla.configs.tables import _table

SNAPSHOT = json.loads((Path(__file__).resolve().parents[1] / "data" / "gfx950_configs_snapshot.json").read_text())
OPS = sorted(k for k in SNAPSHOT if not k.startswith("_"))
# The blocks that were verbatim copies of gfx942 (removed) and those that differ (kept).
COPIED = ("merge_attn_states", "mla_decode", "rope_kv_write")
OWN = ("mla_prefill", "platform")


@pytest.mark.parametrize("op", OPS)
def test_gfx950_resolves_as_before(op):
    assert config_for(op, "gfx950") == SNAPSHOT[op]


@pytest.mark.parametrize("op", COPIED)
def test_copied_blocks_are_gone_and_gfx950_equals_gfx942(op):
    assert "gfx950" not in _table(op)
    assert config_for(op, "gfx950") == config_for(op, "gfx942")


@pytest.mark.parametrize("op", OWN)
def test_own_gfx950_blocks_stay_and_differ(op):
    assert "gfx950" in _table(op)
    assert config_for(op, "gfx950") != config_for(op, "gfx942")


def test_no_arch_block_copies_gfx942():
    """A block identical to gfx942's is dead weight: the fallback gives it anyway."""
    for path in sorted((Path(__file__).resolve().parents[2] / "rocm_mla" / "configs").glob("*.json")):
        table = json.loads(path.read_text())
        for arch, obj in table.items():
            if arch.startswith("gfx9") and arch != "gfx942":
                assert obj != table.get("gfx942"), f"{path.name}: {arch} copies gfx942"


def test_docs_narrate_no_dates():
    """_doc strings say what fields mean and where values come from; the measurements behind
    the values live in docs/notes/config-rationale.md and git."""
    import re

    for path in sorted((Path(__file__).resolve().parents[2] / "rocm_mla" / "configs").glob("*.json")):
        doc = json.loads(path.read_text()).get("_doc", "")
        text = " ".join(doc) if isinstance(doc, list) else doc
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), path.name
