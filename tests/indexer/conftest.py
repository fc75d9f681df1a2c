"""The indexer tests' shared fixture: a test parametrized with ``form="streamed"`` plans as if the
device had 4 CUs (the CPU interpreter's count), so that its small calls' (row, split) items
outnumber the grid -- where the plan takes the streamed form -- on a GPU too."""

from __future__ import annotations

import pytest

import rocm_mla.ops.indexer_topk_plan as plan_mod


@pytest.fixture(autouse=True)
def _streamed_form_grid(request, monkeypatch):
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("form") == "streamed":
        monkeypatch.setattr(plan_mod, "num_compute_units", lambda device: 4)
