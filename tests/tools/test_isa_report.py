"""rocm-mla isa-report: real ahead-of-time compiles (no mocks) of tiny kernels and the HIP sources.

Compiles are slow, so results are shared through module-scoped fixtures: the file stays well
under a minute on two cores. Triton's cache (~/.triton/cache) makes reruns faster.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from rocm_mla.configs import config_for  # noqa: E402
from rocm_mla.tools import isa_report  # noqa: E402
from rocm_mla.tools.isa_report import collect, failures, main, summary  # noqa: E402
from rocm_mla.tools.isa_report import hip_compile as hipc  # noqa: E402
from rocm_mla.tools.isa_report import triton_compile as tc  # noqa: E402
from rocm_mla.variants import TritonVariant  # noqa: E402


# The kernels are wrapped in JITFunction explicitly instead of @triton.jit: conftest turns on
# TRITON_INTERPRET on CPU-only machines, and @triton.jit would then make InterpretedFunctions.
def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def _dot(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + r[:, None] * BLOCK + r[None, :])
    b = tl.load(b_ptr + r[:, None] * BLOCK + r[None, :])
    tl.store(c_ptr + r[:, None] * BLOCK + r[None, :], tl.dot(a, b))


add_kernel = JITFunction(_add)
dot_kernel = JITFunction(_dot)

ADD = TritonVariant(
    kernel="add",
    config="fp32 B=1024 w4",
    fn=add_kernel,
    signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
    constexprs={"BLOCK": 1024},
    options={"num_warps": 4},
    divisible_by_16=("x_ptr", "y_ptr", "out_ptr"),
)
# Same kernel, wrongly declared as containing a dot: the gate must catch the missing MFMA.
ADD_CLAIMS_DOT = dataclasses.replace(ADD, config="claims dot", expects_mfma=True)
DOT = TritonVariant(
    kernel="dot",
    config="bf16 64x64 w4",
    fn=dot_kernel,
    signature={"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*fp32"},  # BLOCK left out on purpose
    constexprs={"BLOCK": 64},
    options={"num_warps": 4, "num_stages": 2},
    divisible_by_16=("a_ptr", "b_ptr", "c_ptr"),
    expects_mfma=True,
)
# Planted spill: one wave holds a 64x64 fp32 accumulator (64 VGPRs/lane on its own) while
# waves_per_eu=8 caps the kernel at 64 VGPRs -> the register allocator spills to scratch.
SPILL = TritonVariant(
    kernel="dot",
    config="fp32 64x64 w1 wpe8 (planted spill)",
    fn=dot_kernel,
    signature={"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", "BLOCK": "constexpr"},
    constexprs={"BLOCK": 64},
    options={"num_warps": 1, "num_stages": 1, "waves_per_eu": 8},
    divisible_by_16=("a_ptr", "b_ptr", "c_ptr"),
    expects_mfma=True,
)

HAS_CLANG = hipc.find_clang() is not None
needs_clang = pytest.mark.skipif(not HAS_CLANG, reason="clang++-19 not found (run .ci/install_amd_toolchain.sh)")
HAS_CLANG_GFX950 = hipc.find_clang("gfx950") is not None
needs_clang_gfx950 = pytest.mark.skipif(
    not HAS_CLANG_GFX950, reason="clang++-22 not found (run .ci/install_amd_toolchain.sh)"
)


@pytest.fixture(autouse=True)
def _keep_interpreter_setting(monkeypatch):
    # main() drops TRITON_INTERPRET for its process (it needs the compiler); the other test
    # files need it back, and monkeypatch restores it at teardown.
    if "TRITON_INTERPRET" in os.environ:
        monkeypatch.setenv("TRITON_INTERPRET", os.environ["TRITON_INTERPRET"])


def _by_config(rows):
    return {r.config: r for r in rows}


@pytest.fixture(scope="module")
def gfx942_triton_rows():
    return _by_config(
        collect("gfx942", triton_variants=[ADD, ADD_CLAIMS_DOT, DOT, SPILL], hip_sources=[], progress=False)
    )


def test_triton_gfx942_add_parses_clean(gfx942_triton_rows):
    r = gfx942_triton_rows[ADD.config]
    assert r.error == "", r.error
    assert r.vgprs > 0 and r.sgprs > 0
    assert r.scratch == 0 and r.spills == 0 and r.mfma == 0
    assert 1 <= r.occupancy <= 8
    assert r.status == "ok" and not r.failed


def test_triton_gfx942_dot_has_mfma(gfx942_triton_rows):
    r = gfx942_triton_rows[DOT.config]
    assert r.error == "", r.error
    assert r.mfma > 0, "a 64x64 bf16 tl.dot must become v_mfma on gfx942"
    assert r.scratch == 0 and r.spills == 0
    assert r.lds > 0  # operands staged through LDS; Triton allocates it dynamically (metadata.shared)
    assert r.status == "ok"


@pytest.fixture(scope="module")
def gfx950_triton_rows():
    return _by_config(collect("gfx950", triton_variants=[ADD, DOT, SPILL], hip_sources=[], progress=False))


def test_triton_gfx950_dot_uses_cdna4_mfma(gfx950_triton_rows):
    """hip:gfx950:64: a bf16 dot becomes CDNA4's double-K MFMA, the gate and parser are gfx942's."""
    r = gfx950_triton_rows[DOT.config]
    assert r.error == "", r.error
    assert r.arch == "gfx950" and r.mfma > 0 and r.status == "ok"
    assert 1 <= r.occupancy <= 8 and r.lds > 0
    assert gfx950_triton_rows[ADD.config].status == "ok"
    planted = gfx950_triton_rows[SPILL.config]
    assert planted.failed and any("scratch" in p for p in planted.problems)


def test_gfx950_mfma_shapes_in_the_isa():
    art = tc.compile_variant(DOT, "gfx950")
    assert "v_mfma_f32_32x32x16_bf16" in art.isa or "v_mfma_f32_16x16x32_bf16" in art.isa
    assert "v_mfma_f32_32x32x16_bf16" not in tc.compile_variant(DOT, "gfx942").isa  # CDNA3 has no such shape


def test_lds_gate_uses_each_archs_limit():
    Row = isa_report.Row
    kw = dict(kernel="k", config="c", backend="triton", spills=0, scratch=0, lds=100 * 1024)
    assert any("LDS" in p for p in isa_report.check(Row(arch="gfx942", **kw)))
    assert isa_report.check(Row(arch="gfx950", **kw)) == []
    assert any("LDS" in p for p in isa_report.check(Row(arch="gfx950", **{**kw, "lds": 160 * 1024 + 1})))
    assert isa_report.ARCHS["gfx950"].lds_limit == 160 * 1024


def test_resident_programs_gate():
    """A persistent launch's grid places ``resident`` programs on each CU / SM: a row that holds
    fewer at once fails, naming both; no claim (0) or no figure (HIP rows) never does."""
    Row = isa_report.Row
    kw = dict(kernel="k", config="c", backend="triton", spills=0, scratch=0, lds=0)
    assert isa_report.check(Row(arch="gfx942", programs=3, resident=3, **kw)) == []
    assert isa_report.check(Row(arch="gfx942", programs=3, resident=4, **kw)) == [
        "3 programs a CU at once; its grid places 4"
    ]
    assert isa_report.check(Row(arch="sm90", programs=2, resident=4, **kw)) == [
        "2 programs an SM at once; its grid places 4"
    ]
    assert isa_report.check(Row(arch="gfx942", programs=1, resident=0, **kw)) == []
    assert isa_report.check(Row(arch="gfx942", programs=None, resident=4, **kw)) == []


def test_indexer_split_rows_claim_their_grid():
    """The indexer's split-kernel variants claim the programs a CU its config's grid places (the
    many_items grid where that form is the tier's own kernel); its other kernels claim none."""
    from rocm_mla.configs import config_for
    from rocm_mla.variants.indexer_topk import triton_variants

    for arch in ("gfx942", "gfx950", "sm90"):
        cfg = config_for("mla_indexer_topk", arch)["tiers"][0]
        ppc, many = cfg["programs_per_cu"], cfg.get("many_items", {})
        for v in triton_variants(arch):
            if v.fn.__name__ != "mla_indexer_split_topk_kernel":
                assert v.resident == 0, v.config
            elif "bounds" in v.config or " rows" in v.config:  # prefiltered or grouped: never many_items
                assert v.resident == ppc, v.config
            elif set(many) <= {"programs_per_cu"}:
                assert v.resident == max(ppc, many.get("programs_per_cu", 0)), v.config
            else:  # its own many_items kernel beside the tier's
                assert v.resident == (many["programs_per_cu"] if "maxnreg" in v.config else ppc), v.config


def test_missing_mfma_is_flagged(gfx942_triton_rows):
    r = gfx942_triton_rows[ADD_CLAIMS_DOT.config]
    assert r.mfma == 0 and r.failed
    assert any("MFMA" in p for p in r.problems)


def test_planted_triton_spill_fails_gate(gfx942_triton_rows):
    r = gfx942_triton_rows[SPILL.config]
    assert r.error == "", r.error
    assert r.scratch > 0 and r.spills > 0
    assert r.failed and any("scratch" in p for p in r.problems)
    # The asm's Occupancy ignores Triton's dynamic LDS; the report folds it in.
    assert r.occupancy == isa_report.amd_occupancy(8, r.lds, 1) < 8
    assert r.programs == r.occupancy * 4  # one wave a workgroup: four a CU for each wave a SIMD
    text = summary(list(gfx942_triton_rows.values()))
    assert "failing" in text and "planted spill" in text


def test_occupancy_and_names():
    assert isa_report.amd_occupancy(8, 0, 4) == 8
    assert isa_report.amd_occupancy(8, 32 * 1024, 4) == 2  # 2 workgroups x 4 waves over 4 SIMDs
    assert isa_report.amd_occupancy(8, 64 * 1024 + 1, 4) == 0
    # gfx950: 160 KiB of LDS per CU, 5 workgroups of 32 KiB; one workgroup may take 100 KiB
    assert isa_report.amd_occupancy(8, 32 * 1024, 4, "gfx950") == 5
    assert isa_report.amd_occupancy(8, 100 * 1024, 4, "gfx950") == 1
    assert isa_report.amd_occupancy(8, 160 * 1024 + 1, 4, "gfx950") == 0
    assert hipc.short_name(
        "void rocm_mla::k<rocm_mla::bf16_t, 8, unsigned int>(rocm_mla::elem<rocm_mla::bf16_t>::storage*, float*)"
    ) == ("k", "<bf16_t, 8, unsigned int>")
    assert hipc.short_name("scratch_kernel(float*, int const*)") == ("scratch_kernel", "-")


PLANTED_CU = r"""
#include <hip/hip_runtime.h>
// isa-report: expects-mfma plain_kernel
// isa-report: expects-mfma mfma_kernel
typedef float v4f __attribute__((ext_vector_type(4)));
// A 1 KiB per-thread array indexed by a runtime value cannot live in registers -> scratch.
__global__ void scratch_kernel(float* out, const int* idx) {
  float buf[256];
  for (int i = 0; i < 256; ++i) buf[i] = out[i * blockDim.x + threadIdx.x];
  out[threadIdx.x] = buf[idx[threadIdx.x] & 255];
}
__global__ void plain_kernel(float* out) { out[threadIdx.x] += 1.0f; }
__global__ void mfma_kernel(float* out, const float* a) {
  v4f c = {0.f, 0.f, 0.f, 0.f};
  c = __builtin_amdgcn_mfma_f32_4x4x1f32(a[threadIdx.x], a[threadIdx.x + 64], c, 0, 0, 0);
  out[threadIdx.x] = c[0] + c[1] + c[2] + c[3];
}
"""


@needs_clang
def test_planted_hip_kernels(tmp_path):
    src = tmp_path / "planted.cu"
    src.write_text(PLANTED_CU)
    rows = {r.kernel: r for r in collect("gfx942", triton_variants=[], hip_sources=[src], progress=False)}
    assert set(rows) == {"scratch_kernel", "plain_kernel", "mfma_kernel"}, rows
    assert rows["scratch_kernel"].scratch > 0 and rows["scratch_kernel"].failed
    assert rows["plain_kernel"].expects_mfma and rows["plain_kernel"].mfma == 0 and rows["plain_kernel"].failed
    assert rows["mfma_kernel"].mfma >= 1 and rows["mfma_kernel"].status == "ok"


@needs_clang
def test_hip_compile_is_kept_by_what_it_depends_on(tmp_path, monkeypatch):
    """A translation unit compiled once is read back from ROCM_MLA_CACHE_DIR (the tests, the doctor
    and the gfx950 report of one CI run share it); a changed source compiles again."""
    monkeypatch.setenv("ROCM_MLA_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "planted.cu"
    src.write_text(PLANTED_CU)
    clang, real, compiles = hipc.find_clang("gfx942"), hipc.subprocess.run, []

    def run(cmd, *a, **k):
        compiles.extend([cmd] if "-S" in cmd else [])
        return real(cmd, *a, **k)

    monkeypatch.setattr(hipc.subprocess, "run", run)
    first = hipc.compile_amdgcn(src, clang, "gfx942")
    assert hipc.compile_amdgcn(src, clang, "gfx942") == first and len(compiles) == 1
    assert list((tmp_path / "cache" / "amdgcn").glob("*.s"))
    src.write_text(PLANTED_CU.replace("scratch_kernel", "scratch2_kernel"))
    again = hipc.compile_amdgcn(src, clang, "gfx942")
    assert len(compiles) == 2 and "scratch2_kernel" in again and "scratch2_kernel" not in first


@needs_clang
def test_hip_isa_sources_compile_clean_for_gfx942(tmp_path, capsys):
    """The real hip_src/isa/*.cu, through the CLI: every instantiation, no scratch, JSON out."""
    sources = hipc.isa_sources()
    assert sources, "hip_src/isa/*.cu not found"
    out = tmp_path / "rows.json"
    rc = main(["--arch", "gfx942", "--filter", "hip", "--json", str(out), "--strict", "-q"])
    table = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert rc == 0, table
    assert rows and all(r["backend"] == "hip" for r in rows)
    for r in rows:
        assert r["scratch"] == 0 and r["spills"] == 0 and r["vgprs"] > 0, r
    assert "merge_attn_states_kernel" in table and "<bf16_t, 8, 4, unsigned int>" in table


@needs_clang_gfx950
def test_planted_hip_kernels_gfx950(tmp_path):
    src = tmp_path / "planted.cu"
    src.write_text(PLANTED_CU)
    rows = {r.kernel: r for r in collect("gfx950", triton_variants=[], hip_sources=[src], progress=False)}
    assert set(rows) == {"scratch_kernel", "plain_kernel", "mfma_kernel"}, rows
    assert rows["scratch_kernel"].scratch > 0 and rows["scratch_kernel"].failed
    assert rows["plain_kernel"].failed and rows["mfma_kernel"].mfma >= 1 and rows["mfma_kernel"].status == "ok"


@needs_clang_gfx950
def test_hip_isa_sources_compile_clean_for_gfx950(tmp_path, capsys):
    """clang-22 (Debian's old HIP headers with the report's prelude) builds every HIP kernel for gfx950."""
    out = tmp_path / "rows.json"
    rc = main(["--arch", "gfx950", "--filter", "hip", "--json", str(out), "--strict", "-q"])
    table = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert rc == 0, table
    assert rows and all(r["backend"] == "hip" and r["arch"] == "gfx950" for r in rows)
    for r in rows:
        assert r["scratch"] == 0 and r["spills"] == 0 and r["vgprs"] > 0 and r["occupancy"] >= 1, r
    assert "merge_attn_states_kernel" in table


def test_missing_clang_skips_unless_strict(monkeypatch, capsys):
    monkeypatch.setattr(hipc, "find_clang", lambda arch="gfx942": None)
    rows = collect("gfx942", triton_variants=[], progress=False)
    assert rows and all(r.skipped.startswith("clang++-19 or clang++-22 not found") for r in rows)
    assert "install_amd_toolchain.sh" in rows[0].skipped
    assert collect("gfx950", triton_variants=[], progress=False)[0].skipped.startswith("clang++-22 not found")
    assert failures(rows) == [] and len(failures(rows, strict=True)) == len(rows)
    assert main(["--arch", "gfx942", "--filter", "hip", "-q"]) == 0
    assert main(["--arch", "gfx942", "--filter", "hip", "-q", "--strict"]) == 1
    assert "skipped" in capsys.readouterr().out


@pytest.mark.skipif(tc.find_ptxas() is None, reason="no ptxas (Triton's bundled one or on PATH)")
def test_triton_sm90_via_ptxas():
    rows = _by_config(collect("sm90", triton_variants=[ADD, DOT], hip_sources=[], progress=False))
    add, dot = rows[ADD.config], rows[DOT.config]
    for r in (add, dot):
        assert r.error == "", r.error
        assert r.vgprs > 0 and r.spills == 0 and r.scratch == 0 and r.occupancy >= 1
        assert r.sgprs is None  # no SGPRs on NVIDIA
    assert add.mfma == 0 and dot.mfma > 0  # wgmma.mma_async (or mma.sync) in the PTX
    assert dot.lds > 0 and dot.status == "ok"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_hip_isa_sources_sm90():
    rows = collect("sm90", triton_variants=[], progress=False)
    assert rows and all(r.error == "" and r.vgprs > 0 and r.scratch == 0 for r in rows), rows


def test_filter_matching_nothing_fails(capsys):
    assert main(["--arch", "gfx942", "--filter", "no-such-kernel-xyz", "-q"]) == 1
    assert "no kernel matches" in capsys.readouterr().err


def test_variant_errors_are_rows_not_crashes():
    bad = TritonVariant(kernel="add", config="bad signature", fn=add_kernel, signature={"x_ptr": "*fp32"})
    (row,) = collect("gfx942", triton_variants=[bad], hip_sources=[], progress=False)
    assert row.status == "error" and row.failed and "y_ptr" in row.error


# ---------------------------------------------------------------- sm90 spills and loops

_SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R200 ;
.L_x_0:
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0030*/                   {STL_IN_LOOP}
        /*0040*/              @!P1 BRA `(.L_x_0) ;
        /*0050*/              @P0 BRA `(.L_x_1) ;
        /*0060*/                   LDL.LU R200, [R1] ;
.L_x_1:
        /*0070*/                   EXIT ;
.L_x_2:
        /*0080*/                   BRA `(.L_x_2);
"""

# A divergent branch's slow path past the exit, returning with a backward branch: no loop.
_SASS_DIV = """
        /*0000*/                   BRA.DIV UR4, `(.L_x_9) ;
.L_x_17:
        /*0010*/                   LDL.LU R20, [R1+0x14] ;
        /*0020*/              @P3 EXIT ;
        /*0030*/                   EXIT ;
.L_x_9:
        /*0040*/                   WARPSYNC.ALL ;
        /*0050*/                   BRA `(.L_x_17) ;
"""


# A persistent kernel's shape: an item loop (.L_x_0) whose own body reloads a spilled pointer, around
# the key loop (.L_x_1) that does the work.
_SASS_NESTED = """
        /*0000*/                   STL [R1], R200 ;
.L_x_0:
        /*0010*/                   LDL R200, [R1] ;
.L_x_1:
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0030*/                   {IN_INNER}
        /*0040*/              @!P1 BRA `(.L_x_1) ;
        /*0050*/              @!P2 BRA `(.L_x_0) ;
        /*0060*/                   EXIT ;
"""


def test_local_memory_in_loops_finds_backward_branch_loops():
    outside = _SASS.replace("{STL_IN_LOOP}", "NOP ;")
    inside = _SASS.replace("{STL_IN_LOOP}", "STL [R1+0x4], R201 ;")
    assert isa_report.local_memory_in_loops(outside) == (0, 0, 2)
    assert isa_report.local_memory_in_loops(inside) == (1, 0, 3)
    assert isa_report.local_memory_in_loops("") == (0, 0, 0)
    assert isa_report.local_memory_in_loops(_SASS_DIV) == (0, 0, 1)
    no_exit = _SASS_DIV.replace("        /*0030*/                   EXIT ;\n", "")
    assert isa_report.local_memory_in_loops(no_exit) == (1, 0, 1)  # then the branch back repeats code
    # In the item loop's own body: outer; in the key loop: innermost.
    assert isa_report.local_memory_in_loops(_SASS_NESTED.replace("{IN_INNER}", "NOP ;")) == (0, 1, 2)
    assert isa_report.local_memory_in_loops(_SASS_NESTED.replace("{IN_INNER}", "LDL R201, [R1+0x4] ;")) == (1, 1, 3)


def test_main_loop_sass_takes_the_loop_with_the_mma():
    from rocm_mla.tools.isa_report.sm90 import SassLoop, main_loop_sass

    inner = "@P3 LDG.E.128 R8, desc[UR4][R2.64] ;\n"
    inner += "        /*0031*/                   LDGSTS.E.BYPASS.128 [R5], desc[UR6][R2.64] ;"
    got = main_loop_sass(_SASS_NESTED.replace("{IN_INNER}", inner))
    # The key loop (0x20..0x40): the HMMA, the two loads, the predicated load and branch.
    assert got == SassLoop(instructions=4, mma=1, global_loads=2, predicated=2)
    # The item loop around it, with more instructions, is never the main loop: it encloses the key loop.
    no_mma = _SASS_NESTED.replace("{IN_INNER}", inner).replace("HMMA.16816.F32.BF16 R4, R8, R12, R4", "NOP")
    assert main_loop_sass(no_mma) == SassLoop(instructions=4, mma=0, global_loads=2, predicated=2)
    assert main_loop_sass(_SASS_DIV) is None and main_loop_sass("") is None
    tail = "        /*0000*/                   EXIT ;\n.L_x_2:\n        /*0010*/                   BRA `(.L_x_2);\n"
    assert main_loop_sass(tail) is None  # the branch to itself past the exit


def test_sm90_spill_outside_innermost_loops_is_a_note_not_a_failure():
    Row = isa_report.Row
    kw = dict(kernel="k", config="c", backend="triton", spills=40, scratch=24)
    outside = Row(arch="sm90", local_in_loops=0, **kw)
    assert isa_report.check(outside) == [] and "no local-memory access inside a loop" in isa_report.notes(outside)[0]
    inside = Row(arch="sm90", local_in_loops=3, **kw)
    assert any("inside innermost loops" in p for p in isa_report.check(inside)) and not isa_report.notes(inside)
    per_item = Row(arch="sm90", local_in_loops=0, local_in_outer_loops=4, **kw)
    assert (
        isa_report.check(per_item) == []
        and "4 local-memory instructions in outer loops" in isa_report.notes(per_item)[0]
    )
    both = Row(arch="sm90", local_in_loops=1, local_in_outer_loops=4, **kw)
    assert isa_report.check(both) and not isa_report.notes(both)
    unread = Row(arch="sm90", local_in_loops=None, **kw)  # no nvdisasm: the gate stays strict
    assert isa_report.check(unread) and not isa_report.notes(unread)
    gfx = Row(arch="gfx942", local_in_loops=0, **{**kw, "spills": 2, "scratch": 16})
    assert isa_report.check(gfx) and not isa_report.notes(gfx)


@pytest.mark.skipif(tc.find_ptxas() is None, reason="no ptxas (Triton's bundled one or on PATH)")
def test_sm90_sass_is_read_when_nvdisasm_is_there():
    ptxas = tc.find_ptxas()
    if not (Path(ptxas).resolve().parent / "nvdisasm").exists() and shutil.which("nvdisasm") is None:
        pytest.skip("no nvdisasm next to ptxas or on PATH")
    art = tc.compile_variant(DOT, "sm90")
    assert "MMA" in art.sass  # HMMA / HGMMA: the disassembly of the dot kernel
    row = _by_config(collect("sm90", triton_variants=[DOT], hip_sources=[], progress=False))[DOT.config]
    assert row.local_in_loops == 0 and row.status == "ok" and row.notes == []
    assert row.sass_loop is None  # one dot, no loop


# ---------------------------------------------------------------- peers (aiter), reported and not gated


def test_peer_rows_are_reported_not_gated(monkeypatch, capsys):
    """A peer's kernel that would fail our gate (planted spill) is noted, not failed; a missing
    peer folder is a skipped row that --strict does not fail on."""
    (row,) = collect("gfx942", triton_variants=[SPILL], hip_sources=[], progress=False)
    row.peer = True
    row.problems, row.notes = isa_report.check(row), isa_report.notes(row)
    assert row.problems == [] and not row.failed and "not gated" in row.notes[0] and "scratch" in row.notes[0]
    monkeypatch.setenv("ROCM_MLA_AITER_PEERS", "/nonexistent/aiter-peers")
    rows = collect("gfx942", "aiter", triton_variants=[], hip_sources=[], progress=False, peers=True)
    assert [r.kernel for r in rows] == ["aiter_mha_fwd", "aiter_mla_decode_stage1"]  # the two peers
    assert all(r.peer and r.backend == "aiter" and "get_aiter_peers.sh" in r.skipped for r in rows)
    assert failures(rows, strict=True) == []
    assert main(["--arch", "gfx942", "--filter", "aiter", "-q", "--strict"]) == 0
    assert "peer rows reported, not gated" in capsys.readouterr().out


@pytest.mark.skipif(
    not (Path(__file__).resolve().parents[2] / ".peers" / "aiter" / "aiter").is_dir(),
    reason="no .peers/aiter (bash perf/peers/get_aiter_peers.sh .peers/aiter)",
)
def test_aiter_mha_compiles_for_gfx942(tmp_path):
    """aiter's _attn_fwd with its MI300X config compiles for gfx942 beside ours (a subprocess: the
    compiler needs @triton.jit without the interpreter these tests run with)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocm_mla.tools.cli",
            "isa-report",
            "--arch",
            "gfx942",
            "--filter",
            "aiter",
            "-q",
            "--json",
            str(out),
        ],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in json.loads(out.read_text()) if r["kernel"] == "aiter_mha_fwd"]
    assert rows and all(r["peer"] and r["backend"] == "aiter" and r["error"] == "" for r in rows), rows
    for r in rows:
        assert r["vgprs"] > 0 and r["mfma"] > 0 and r["occupancy"] >= 1, r
        assert "MI300X" in r["config"] and "M256 N64 w8" in r["config"], r["config"]


@pytest.mark.skipif(
    not (Path(__file__).resolve().parents[2] / ".peers" / "aiter" / "aiter").is_dir(),
    reason="no .peers/aiter (bash perf/peers/get_aiter_peers.sh .peers/aiter; .ci/run fetches it)",
)
def test_decode_side_by_side_with_aiter_on_gfx942():
    """aiter's MLA decode compiled for gfx942 with its MI300X config beside our decode tiers (a
    subprocess: the compiler needs @triton.jit without the interpreter these tests run with). Only
    the side-by-side's rows are compiled (every stage-1 config is the doctor's gfx942 report)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = (
        "from rocm_mla.tools.isa_report.collect import collect\n"
        "from rocm_mla.tools.isa_report.peers import decode_side_by_side, side_by_side_variants\n"
        "from rocm_mla.variants.decode import default_tier_variants\n"
        "rows = collect('gfx942', 'mla_decode_stage1', triton_variants=default_tier_variants('gfx942'),\n"
        "               hip_sources=[], progress=False, peers=True)\n"
        "print(decode_side_by_side('gfx942', rows, side_by_side_variants('gfx942')))\n"
    )
    p = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    section = p.stdout.split("decode side by side on gfx942", 1)[1]
    ours = [ln for ln in section.splitlines() if ln.startswith("mla_decode_stage1 ")]
    peer = [ln for ln in section.splitlines() if ln.startswith("aiter_mla_decode_stage1")]
    assert len(ours) == len(config_for("mla_decode", "gfx942")["tiers"]) >= 3 and len(peer) == 2, section
    assert all(ln.rstrip().endswith("ok") for ln in ours), section
    assert "matrix_instr_nonkdim=16" in peer[0] and "waves_per_eu=1" in peer[0]  # its MI300X JSON


def test_side_by_side_without_peer_says_why():
    from rocm_mla.tools.isa_report import decode_side_by_side

    text = decode_side_by_side("gfx942", [], [])
    assert "aiter's decode not compiled" in text and "get_aiter_peers.sh" in text


@pytest.mark.skipif(
    not (Path(__file__).resolve().parents[2] / ".peers" / "aiter" / "aiter").is_dir(),
    reason="no .peers/aiter (bash perf/peers/get_aiter_peers.sh .peers/aiter; .ci/run fetches it)",
)
def test_aiter_peers_take_their_mi350x_configs_on_gfx950():
    """On gfx950 the peers are compiled with aiter's own MI350X files, on gfx942 and sm90 its MI300X ones."""
    from peer_variants import aiter_decode_variants

    v950, v942 = aiter_decode_variants("gfx950", heads=(16,)), aiter_decode_variants("gfx942", heads=(16,))
    assert "(MI350X cfg)" in v950[0].config and "(MI300X cfg)" in v942[0].config
    assert v950[0].options != v942[0].options  # the two files differ (stages, waves_per_eu, kpack)
    assert v950[0].options.get("kpack", 1) == 1


def test_decode_tiers_view_compiles_both_arches():
    """`rocm-mla isa-report --decode-tiers`: every default decode tier of gfx942 and gfx950 compiled and
    gated, with the KV loop per KV row (a subprocess: the decode kernel calls other @triton.jit
    helpers, which the interpreter these tests run with would have wrapped)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run(
        [sys.executable, "-m", "rocm_mla.tools.cli", "isa-report", "--decode-tiers", "-q"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("gfx942 ", "gfx950 "))]
    assert [ln.split()[:2] for ln in lines] == [[a, f"H{h}"] for a in ("gfx942", "gfx950") for h in (16, 32, 64)]
    assert all(" ok" in ln for ln in lines), p.stdout
    assert all("16x16x32_bf16" in ln for ln in lines[3:]) and not any("16x16x32" in ln for ln in lines[:3])
    assert "round trips/tile" in p.stdout and "per 16 rows" in p.stdout


@pytest.mark.parametrize("major,gfx950", [(19, True), (17, False)])
def test_rocm_toolchain_is_found_in_rocm_path(tmp_path, monkeypatch, major, gfx950):
    """On a ROCm image: ROCm's own clang++ ($ROCM_PATH/llvm/bin) and device bitcode are used
    without ROCM_MLA_CLANG / ROCM_MLA_DEVICE_LIBS; gfx950 only from LLVM 19."""
    root = tmp_path / f"rocm{major}"
    clang = root / "llvm" / "bin" / "clang++"
    clang.parent.mkdir(parents=True)
    clang.write_text(f"#!/bin/sh\necho 'AMD clang version {major}.0.0 (roc)'\n")
    clang.chmod(0o755)
    (root / "amdgcn" / "bitcode").mkdir(parents=True)
    (root / "amdgcn" / "bitcode" / "ocml.bc").write_bytes(b"")
    monkeypatch.setenv("ROCM_PATH", str(root))
    monkeypatch.delenv("ROCM_MLA_CLANG", raising=False)
    monkeypatch.delenv("ROCM_MLA_DEVICE_LIBS", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no Debian clang++-19/22 to fall back on
    assert hipc.find_clang("gfx942") == str(clang)
    assert (hipc.find_clang("gfx950") == str(clang)) == gfx950
    assert hipc.system_device_libs() == root / "amdgcn" / "bitcode"


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90"])
def test_v4_variants_list_every_launch(arch):
    """mla_v4_attention's ISA list: each tier's config (``tier_config``) with bf16 and fp16 q over
    fp8_ds_mla caches of vLLM's writers' kinds (``cache_kind``: the window cache e4m3fnuz on gfx942),
    direct and split, with the sink and the inverse RoPE; bf16 q with ragged lists, window-only and
    over bf16 caches; constexprs and options exactly ``triton_meta``'s; the shared reduce with the
    sink and the rotation for every tile a plan's split count gives."""
    import torch

    from rocm_mla.ops._checks import Checker
    from rocm_mla.ops.latent_core import reduce_meta
    from rocm_mla.ops.v4_attention_plan import KIND_CODES, OP, cache_kind, tier_config, triton_meta
    from rocm_mla.variants.v4_attention import triton_variants

    vs = triton_variants(arch)
    assert len({v.config for v in vs}) == len(vs)
    main_rows = [v for v in vs if v.kernel == OP]
    kind = {w: cache_kind(Checker(OP), "x", torch.uint8, "fp8_ds_mla", torch.bfloat16, arch, w) for w in (True, False)}
    assert kind[True] == (torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn)
    assert kind[False] == torch.float8_e4m3fn
    for tier in config_for(OP, arch)["tiers"]:
        for qdt in (torch.bfloat16, torch.float16):
            cfg = tier_config(arch, tier["BLOCK_H"], qdt)
            runs = [(kind[True], kind[False], False)]
            if qdt == torch.bfloat16:
                runs += [(kind[True], kind[False], True), (kind[True], None, False), (qdt, qdt, False)]
            for wk, ck, ragged in runs:
                for direct in (True, False):
                    meta, options = triton_meta(
                        arch, cfg, qdt, wk, ck, window_ragged=ragged, compressed_ragged=ragged, has_sink=True,
                        inverse_rope=True, direct=direct,
                    )  # fmt: skip
                    hits = [
                        v
                        for v in main_rows
                        if {k: v.constexprs[k] for k in meta} == meta
                        and v.options == options
                        and v.signature["q"] == ("*bf16" if qdt == torch.bfloat16 else "*fp16")
                    ]
                    assert len(hits) == 1, (arch, tier, qdt, wk, ck, ragged, direct)
                    v = hits[0]
                    assert v.expects_mfma and v.signature["w_cache"] == ("*u8" if wk in KIND_CODES else "*bf16")
    reduce_rows = [v for v in vs if v.kernel == "mla_decode_reduce"]
    tiles = {(c["BLOCK_S"], c["BLOCK_D"]) for s in range(2, 65) for c in [reduce_meta(s, arch)[0]]}
    assert {(v.constexprs["BLOCK_S"], v.constexprs["BLOCK_D"]) for v in reduce_rows} == tiles
    assert all(v.constexprs["HAS_SINK"] and v.constexprs["ROPE"] for v in reduce_rows if "sink rope" in v.config)
    assert {(v.constexprs["HAS_SINK"], v.constexprs["ROPE"]) for v in reduce_rows} == {
        (True, True),
        (True, False),
        (False, True),
    }


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_v4_first_tier_compiles_clean(arch):
    """`rocm-mla isa-report --filter <label>`: the first tier of mla_v4_attention with bf16 q over
    fp8_ds_mla caches (dense lists, the sink and the rotation, direct) compiles without spills or
    scratch, with MFMA (a subprocess: the kernel calls other @triton.jit helpers, which the
    interpreter these tests run with would have wrapped)."""
    import subprocess
    import sys

    from rocm_mla.variants.v4_attention import triton_variants

    label = triton_variants(arch)[0].config
    assert label.startswith("q=bf16 ") and label.endswith(" dense sink rope direct")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run(
        [sys.executable, "-m", "rocm_mla.tools.cli", "isa-report", "--arch", arch, "--filter", label, "--no-peers",
         "-q"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("mla_v4_attention ")]
    assert len(rows) == 1 and rows[0].rstrip().endswith(" ok"), p.stdout
    assert "all 1 compiled rows pass" in p.stdout


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm90"])
def test_every_variant_types_every_argument(arch):
    """Every variant of every op names each argument of its kernel, a type or a constexpr value
    (an ahead-of-time compile takes no default: a constexpr a kernel gains, such as the shared
    reduce's HAS_SINK and ROPE, must be named by every op's variants that launch it)."""
    from rocm_mla.variants import all_triton_variants

    for v in all_triton_variants(arch):
        fn = tc.as_jit(v.fn)
        sig = tc.full_signature(fn, dict(v.signature), dict(v.constexprs))
        assert list(sig) == fn.arg_names, (v.kernel, v.config)
