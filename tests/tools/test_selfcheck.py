"""rocm_mla.tools.selfcheck (the checks `rocm-mla doctor` runs): a case that raises is reported as a
failed row, and the other cases still run; the doctor's --arch list."""

from __future__ import annotations

import pytest
import torch

import rocm_mla.configs
from rocm_mla.tools.selfcheck import check_decode


def test_decode_check_reports_an_fp8_cache_it_cannot_make(monkeypatch):
    """A torch without the platform's fp8 kind: the fp8-cache rows fail with the error, named; the
    16-bit and float32 rows still run and pass."""
    monkeypatch.setattr(rocm_mla.configs, "platform_fp8_dtype", lambda arch: "no-such-fp8-kind")
    rows = check_decode(torch.device("cpu"), ["triton"])
    fp8_rows = [r for r in rows if "fp8 cache" in r.case]
    other = [r for r in rows if "fp8 cache" not in r.case]
    assert fp8_rows and all(not r.ok and "no-such-fp8-kind" in r.error for r in fp8_rows)
    assert other and all(r.ok for r in other)


def test_v4_check_runs_every_case_and_reports_one_that_raises(monkeypatch):
    """mla_v4_attention's self-check (on the cases' tiny shapes here): each selfcheck shape with the
    plan's splits, the ragged one over 3 and batch-invariant splits, the window one over caches in
    q's dtype; float32 q on the CPU. A case whose inputs cannot be made is a failed row naming the
    error; the others still run and pass."""
    from rocm_mla.cases import v4_attention as v4_cases
    from rocm_mla.tools.selfcheck import check_v4_attention

    tiny = v4_cases.SHAPES["tiny"]
    monkeypatch.setitem(v4_cases.SHAPES, "selfcheck", [tiny[0], tiny[1], tiny[2], tiny[3]])
    make = v4_cases.make_inputs

    def make_or_raise(shape, **kw):
        if shape.kv == "auto":
            raise RuntimeError("no 16-bit cache here")
        return make(shape, **kw)

    monkeypatch.setattr(v4_cases, "make_inputs", make_or_raise)
    rows = check_v4_attention(torch.device("cpu"), ["triton", "hip"])
    assert {r.op for r in rows} == {"mla_v4_attention"} and {(r.backend, r.dtype) for r in rows} == {
        ("triton", "float32")
    }
    (bad,) = [r for r in rows if not r.ok]
    assert bad.case.endswith("splits=3") and "no 16-bit cache here" in bad.error
    good = [r.case for r in rows if r.ok]
    assert len(good) == 2 * 6 and sum(c.endswith(" lse") for c in good) == 6
    assert any("ragged" in c and "batch_invariant" in c for c in good)


def test_doctor_reports_each_arch_it_is_given():
    from rocm_mla.tools.doctor import report_arches

    assert report_arches("gfx942") == ["gfx942"]
    assert report_arches("gfx942, gfx950") == ["gfx942", "gfx950"]
    with pytest.raises(ValueError, match="gfx90a"):
        report_arches("gfx942,gfx90a")


def test_doctor_answers_a_bad_flag_with_the_valid_values(capsys):
    """--arch gfx90a: argparse's usage error (exit 2) naming the arches, no traceback."""
    from rocm_mla.tools.cli import main

    with pytest.raises(SystemExit) as e:
        main(["doctor", "--arch", "gfx90a"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --arch: expected a comma-separated list of gfx942, gfx950, sm90, got 'gfx90a'" in err


def test_doctor_sections_and_json(monkeypatch, capsys):
    """The environment section (a bad value fails, an unknown name is reported), the vLLM section
    from the probe's answer (an unsupported version and a VLLM_PLUGINS without rocm_mla fail), and
    --json: lines on stderr, one JSON object on stdout."""
    import json
    import types

    from rocm_mla.tools import doctor

    monkeypatch.setenv("ROCM_MLA_DEBUG", "yes")
    monkeypatch.setenv("ROCM_MLA_NO_JTI", "1")
    monkeypatch.setattr(doctor, "OUT", __import__("sys").stderr)
    doctor.REPORT.clear()
    assert doctor._environment() is False
    env = doctor.REPORT["environment"]
    assert "expected one of 0, 1" in env["ROCM_MLA_DEBUG"]["error"] and env["ROCM_MLA_NO_JTI"]["read"] is False

    good = {
        "installed": True, "version": "0.34.0", "supported": True, "entry_point": "rocm_mla.vllm:register",
        "plugins_allowed": True, "platform": "RocmPlatform", "registered_ok": True,
        "registered": {"ROCM_MLA": "a", "ROCM_MLA_SPARSE": "b", "CUSTOM": "a"}, "selectable": True,
        "sparse_layers": True, "v4_layers": ["DeepSeek-V4", "DeepSeek-V4.1"], "fused_rope_kv": True,
    }  # fmt: skip

    def probe(answer):
        out = types.SimpleNamespace(stdout=json.dumps(answer) + "\n", stderr="", returncode=0)
        monkeypatch.setattr(doctor.subprocess, "run", lambda *a, **k: out)

    probe(good)
    assert doctor._vllm() is True
    probe({**good, "version": "0.35.0", "supported": False})
    assert doctor._vllm() is False
    probe({**good, "plugins_allowed": False})
    assert doctor._vllm() is False
    probe({**good, "v4_layers": ["DeepSeek-V4"]})
    assert doctor._vllm() is False
    probe({"installed": False, "error": "ModuleNotFoundError: No module named 'vllm'"})
    assert doctor._vllm() is True  # the ops work without vLLM
    err = capsys.readouterr().err
    assert "NOT SUPPORTED: rocm-mla is written for 0.34.0, 0.33.0" in err and "LACKS rocm_mla" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU run (the interpreter); GPU runs call rocm-mla doctor itself")
def test_doctor_json_on_the_cpu(monkeypatch, capsys):
    """The doctor with --json (no compile report, no vLLM probe): stdout is one JSON object with
    every section and the verdict; the human lines, progress included, are on stderr. Two ops'
    self-checks stand for all nine here: CI's `./dev.sh doctor` runs every one on the CPU."""
    import json

    from rocm_mla.tools import selfcheck
    from rocm_mla.tools.cli import main

    monkeypatch.delenv("ROCM_MLA_DEBUG", raising=False)
    monkeypatch.setattr(selfcheck, "CHECKS", [selfcheck.check_merge, selfcheck.check_indexer_cache])
    assert main(["doctor", "--no-gpu", "--skip-isa", "--no-vllm", "--json"]) == 0
    cap = capsys.readouterr()
    report = json.loads(cap.out)
    assert report["ok"] is True and report["self_check"]["failed"] == []
    assert report["self_check"]["passed"] > 0
    assert {"versions", "device", "environment", "config_overlay", "self_check"} <= set(report)
    assert "[1/2] merge ..." in cap.err and "[2/2] indexer_cache ..." in cap.err
    assert "doctor: all checks passed" in cap.err
