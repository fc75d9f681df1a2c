"""The ISA report's main-loop figures (rocm_mla.tools.isa_report.kv_loop): loop blocks found from
LLVM's loop annotations, serial global round trips counted as vmcnt(0) drains of outstanding
loads (a rotated loop's wait at the top counts the load issued at the bottom), LDS bytes from the
ds_* widths; then one real compile for gfx950 whose loop must show its load round trip."""

from __future__ import annotations

import pytest

from rocm_mla.tools.isa_report.kv_loop import loop_stats, loops, main_loop_stats

# A kernel with a prologue loop (no MFMA) and a rotated main loop: the header issues the table
# load and waits for it, the body issues the tile loads and waits (vmcnt(1): one left in flight,
# then vmcnt(0): a drain), and the latch issues one more load that the next iteration's first
# wait drains. A wait with nothing outstanding is no round trip.
ASM = """
\t.type\tk,@function
k:
\tglobal_load_dword v1, v0, s[0:1]
\ts_waitcnt vmcnt(0)
.LBB0_1:                                ; =>This Inner Loop Header: Depth=1
\tv_add_u32_e32 v1, 1, v1
\ts_cbranch_scc1 .LBB0_1
; %bb.2:
\ts_waitcnt vmcnt(0)
\ts_branch .LBB0_4
.LBB0_3:                                ;   in Loop: Header=BB0_4 Depth=1
\ts_waitcnt vmcnt(0)
\tds_write_b64 v2, v[4:5]
\ts_barrier
\tv_mfma_f32_16x16x32_bf16 v[8:11], v[0:3], v[4:7], v[8:11]
.LBB0_4:                                ; =>This Inner Loop Header: Depth=1
\tglobal_load_dword v3, v2, s[2:3]
\ts_waitcnt vmcnt(0)
\tglobal_load_dwordx4 v[4:7], v3, s[4:5]
\tglobal_load_dwordx4 v[12:15], v3, s[4:5] offset:16
\ts_waitcnt vmcnt(1)
\tds_read2st64_b64 v[16:19], v2 offset1:1
\ts_waitcnt vmcnt(0) lgkmcnt(0)
\tv_mfma_f32_16x16x16_bf16 v[8:11], v[4:5], v[6:7], v[8:11]
\ts_waitcnt vmcnt(0)
; %bb.5:                                ;   in Loop: Header=BB0_4 Depth=1
\tglobal_load_dwordx2 v[20:21], v3, s[4:5] offset:1024
\ts_cbranch_scc0 .LBB0_3
; %bb.6:
\ts_endpgm
.Lfunc_end0:
"""


def test_loops_found_from_annotations():
    found = loops(ASM)
    assert set(found) == {"BB0_1", "BB0_4"}
    assert [m for m, _ in found["BB0_1"]] == ["v_add_u32_e32", "s_cbranch_scc1"]
    assert len(found["BB0_4"]) == 15  # .LBB0_3, .LBB0_4 and %bb.5; not the prologue or the exit


def test_main_loop_figures():
    st = main_loop_stats(ASM)
    assert st is not None
    assert st.mfma == 2 and st.mfma_shapes == ["v_mfma_f32_16x16x16_bf16", "v_mfma_f32_16x16x32_bf16"]
    assert st.vmem == 4 and st.barriers == 1 and st.instructions == 15
    # table load -> drain 1; the tile loads -> drain 2 (vmcnt(1) keeps one in flight; the second
    # vmcnt(0) in a row has nothing outstanding); the latch load -> drained at the loop top: 3.
    assert st.drains == 3
    assert st.lds_bytes == (8 + 16) * 64  # ds_write_b64 + ds_read2st64_b64, 64 lanes


def test_drains_are_counted_once_per_outstanding_group():
    body = [("global_load_dword", ""), ("s_waitcnt", " vmcnt(0)"), ("s_waitcnt", " vmcnt(0)")]
    assert loop_stats(body).drains == 1
    assert loop_stats([("global_load_dword", ""), ("s_waitcnt", " vmcnt(3)")]).drains == 0
    # rotated: the load at the bottom is drained at the top of the next iteration
    assert loop_stats([("s_waitcnt", " vmcnt(0)"), ("v_mov_b32", ""), ("buffer_load_dword", "")]).drains == 1
    assert loop_stats([("s_waitcnt", " lgkmcnt(0)"), ("global_load_dword", "")]).drains == 0
    # a scalar load (a uniform table entry) is drained by lgkmcnt(0); one wait draining both is one
    assert loop_stats([("s_load_dword", ""), ("s_waitcnt", " lgkmcnt(0)")]).drains == 1
    both = [("s_load_dword", ""), ("global_load_dword", ""), ("s_waitcnt", " vmcnt(0) lgkmcnt(0)")]
    assert loop_stats(both).drains == 1
    assert loop_stats([("ds_read_b64", ""), ("s_waitcnt", " lgkmcnt(0)")]).drains == 0
    assert main_loop_stats("\t.type\tk,@function\nk:\n\ts_endpgm\n") is None


triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


# Wrapped in JITFunction explicitly: conftest turns on TRITON_INTERPRET, under which @triton.jit
# would make an InterpretedFunction.
def _table_walk(table, data, out, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.load(out + offs)  # (tl.zeros would be the interpreter's in a test process)
    for i in range(0, n):
        page = tl.load(table + i)  # the row's address depends on this load: two round trips
        acc += tl.load(data + page * BLOCK + offs)
    tl.store(out + offs, acc)


def test_real_gfx950_loop_shows_its_dependent_loads():
    """A loop whose load address comes from another load makes two serial round trips per
    iteration on gfx950 (compiled ahead of time, num_stages 1): the table entry (a scalar load,
    the address is uniform), then the row."""
    from rocm_mla.tools.isa_report import triton_compile as tc
    from rocm_mla.variants import TritonVariant

    v = TritonVariant(
        kernel="walk",
        config="fp32 B=256",
        fn=JITFunction(_table_walk),
        signature={"table": "*i32", "data": "*fp32", "out": "*fp32", "n": "i32"},
        constexprs={"BLOCK": 256},
        options={"num_warps": 4, "num_stages": 1},
        divisible_by_16=("table", "data", "out"),
    )
    st = main_loop_stats(tc.compile_variant(v, "gfx950").isa)
    assert st is not None and st.vmem >= 1
    assert st.drains == 2, st
