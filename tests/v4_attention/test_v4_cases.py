"""rocm_mla.cases.v4_attention's builder: the lists say what vLLM's V4 layer says (window positions
max(0, p - 127) .. p, CSA top-k distinct visible compressed rows, HCA all of them), through shuffled
tables into global slots; ragged lists are the dense ones without padding; every slot no list can
name is poisoned and every named row finite; copies, layouts, sink kinds, the named shape sets."""

from __future__ import annotations

import math

import pytest
import torch
from _util import DEVICE
from v4_case import FN, FNUZ, make_case, replace, slot_rows

from rocm_mla.cases import outside_untouched, platform_fp8
from rocm_mla.cases import v4_attention as v4


def _inverse(table: torch.Tensor, bs: int) -> dict[int, tuple[int, int]]:
    """slot -> (request, position) of every page a table holds."""
    inv = {}
    for b, row in enumerate(table.tolist()):
        for col, page in enumerate(row):
            if page >= 0:
                for o in range(bs):
                    inv[page * bs + o] = (b, col * bs + o)
    return inv


@pytest.mark.parametrize("shape", v4.SHAPES["tiny"] + v4.SHAPES["odd"], ids=lambda s: s.label(torch.float32))
def test_lists_name_what_the_layer_sees(shape):
    case = v4.make_inputs(replace(shape, holes=0.0, dups=0.0), dtype=torch.float32, device=DEVICE, seed=4)
    s = case.shape
    pos = s.positions()
    req = case.req.tolist()
    w_inv = _inverse(case.window.table.cpu(), s.block)
    for t, p in enumerate(pos):
        lo = max(0, p - s.window + 1)
        ptr = case.window_indptr()
        ent = case.window_indices()[int(ptr[t]) : int(ptr[t + 1])] if ptr is not None else case.window_indices()[t]
        named = [e for e in ent.tolist() if e >= 0]
        assert [w_inv[e] for e in named] == [(req[t], x) for x in range(lo, p + 1)], t
        if ptr is None:
            assert ent.shape[0] == s.window and bool((ent[len(named) :] == -1).all())
        if not s.compressed:
            continue
        c_inv = _inverse(case.compressed.table.cpu(), s.cblock)
        cptr = case.compressed_indptr()
        ci = case.compressed_indices()
        ent = ci[int(cptr[t]) : int(cptr[t + 1])] if cptr is not None else ci[t]
        named = [c_inv[e] for e in ent.tolist() if e >= 0]
        assert all(b == req[t] for b, _ in named)
        rows = [r for _, r in named]
        vis = (p + 1) // s.ratio
        if s.kind == "hca":
            assert rows == list(range(vis))
        else:
            assert len(set(rows)) == len(rows) == min(vis, s.topk) and all(0 <= r < vis for r in rows)
        if cptr is None:
            assert ent.shape[0] == s.compressed_width() and bool((ent[len(rows) :] == -1).all())


def test_holes_and_dups_stay_inside_a_row():
    """holes: -1 among a row's entries (valid ones after them); dups: repeats of the row's own
    entries; the padding past a row's count stays -1."""
    case = make_case((300, 200), (3, 2), 2, "csa", topk=40, holes=0.2, dups=0.2)
    for lst, count in ((case.window_positions, case.window_count), (case.compressed_positions, case.compressed_count)):
        found_hole = found_dup = False
        for t in range(case.shape.T):
            row, n = lst[t].tolist(), int(count[t])
            assert all(x == -1 for x in row[n:])
            named = [x for x in row[:n] if x >= 0]
            found_hole |= any(row[i] == -1 and max(row[i:n]) >= 0 for i in range(n))  # a -1 before a valid entry
            found_dup |= len(set(named)) < len(named)
        assert found_hole and found_dup


def test_slots_poisoned_and_named_rows_finite():
    """Every slot no list can name (page tails, positions before the first window, spare pages) is
    NaN; every named slot's row finite; the tables shuffled, no page held twice."""
    for kv, kinds in (("fp8", ("e4m3fnuz", "e4m3fn")), ("auto", (None, None))):
        case = make_case((300, 40, 7), (2, 1, 3), 2, "hca", ratio=16, kv=kv, window_fp8=kinds[0],
                         compressed_fp8=kinds[1], dtype=torch.float16, build={"page_pad": 24})  # fmt: skip
        for cache, vc, idx, fp8 in ((case.window_cache, case.window, case.window_indices(), case.window.fp8),
                                    (case.compressed_cache, case.compressed, case.compressed_indices(),
                                     case.compressed.fp8)):  # fmt: skip
            rows = slot_rows(cache, vc.kind if fp8 else None)
            named = torch.zeros(rows.shape[0], dtype=torch.bool)
            named[idx[idx >= 0].long().cpu()] = True
            assert bool(rows[named].isfinite().all())
            assert bool(rows[~named].isnan().all()) if vc is case.window else True
            held = vc.table[vc.table >= 0]
            assert held.unique().numel() == held.numel()
            assert not torch.equal(held.sort().values, held), "pages in order"
        # the compressed cache holds every compressed row; those past them (page tails) are NaN
        held = sum(n // 16 for n in case.shape.lens)
        rows = slot_rows(case.compressed_cache, case.compressed.kind if case.compressed.fp8 else None)
        assert int(rows.isfinite().all(1).sum()) == held
    assert case.window_kind == torch.float16 and case.window.kv_cache_dtype == "auto"
    fp8 = make_case((30,), 1, 2, "csa")
    assert fp8.window_kind == platform_fp8(DEVICE) and fp8.compressed_kind == FN
    assert fp8.compressed.kv_cache_dtype == "fp8_ds_mla_e4m3fn"
    nuz = make_case((30,), 1, 2, "csa", window_fp8="e4m3fnuz")
    assert nuz.window_kind == FNUZ and nuz.window.kv_cache_dtype == "fp8_ds_mla_e4m3fnuz"


def test_ragged_lists_are_the_dense_ones_without_padding():
    dense = make_case((150, 70), (2, 1), 2, "csa", topk=24, holes=0.1, dups=0.1, seed=7)
    ragged = make_case((150, 70), (2, 1), 2, "csa", topk=24, holes=0.1, dups=0.1, seed=7, ragged=True)
    for name in ("window", "compressed"):
        d = getattr(dense, f"{name}_indices")()
        r, ptr = getattr(ragged, f"{name}_indices")(), getattr(ragged, f"{name}_indptr")()
        count = getattr(dense, f"{name}_count")
        assert r.dtype == ptr.dtype == torch.int32 and r.dim() == 1 and ptr.shape == (4,) and int(ptr[0]) == 0
        for t in range(3):
            assert torch.equal(r[int(ptr[t]) : int(ptr[t + 1])], d[t, : int(count[t])])
    assert torch.equal(dense.q, ragged.q)
    half = make_case((150, 70), (2, 1), 2, "csa", ragged="compressed")
    assert half.window_indptr() is None and half.compressed_indptr() is not None


def test_copies_share_positions_not_pages():
    case = make_case((200, 70), (2, 1), 2, "csa", build={"copies": 2})
    assert case.copies == 2
    a, b = case.args(0), case.args(1)
    assert a[1].data_ptr() != b[1].data_ptr() and not torch.equal(case.window.tables[0], case.window.tables[1])
    assert not torch.equal(a[2], b[2]) and a[0] is b[0]
    ra, rb = case.reference(i=0), case.reference(i=1)
    assert not torch.equal(ra[0], rb[0])  # other random rows


def test_layouts_sinks_and_rope():
    s = v4.V4Shape((40, 9), (2, 1), 4, kind="window", block=16)
    c = v4.make_inputs(s, dtype=torch.float16, device=DEVICE, q_layout="heads_major", out_layout="token_pad",
                       lse_layout="transposed", sink_pad=3)  # fmt: skip
    assert c.q.shape == (3, 4, 512) and c.q.stride() == (512, 3 * 512, 1)
    assert c.out.stride() == (5 * 512, 512, 1) and c.lse.stride() == (1, 3)
    assert torch.isnan(c.out).all() and torch.isnan(c.lse).all() and outside_untouched(c.out_base, c.out)
    assert c.attn_sink.shape == (7,) and c.attn_sink.dtype == torch.float32
    p = v4.make_inputs(s, dtype=torch.float16, q_layout="padded", out_layout="padded")
    assert p.q.stride() == (4 * 576, 576, 1) and p.out.stride() == (4 * 520, 520, 1)
    assert c.positions.tolist() == [38, 39, 8] and c.positions.dtype == torch.int64
    assert c.cos_sin_cache.shape == (45, 64) and c.cos_sin_cache.dtype == torch.float32
    ang = 39 * 10000.0 ** (-torch.arange(32, dtype=torch.float64) / 32)
    torch.testing.assert_close(c.cos_sin_cache[39].double(), torch.cat([ang.cos(), ang.sin()]), atol=1e-5, rtol=0)
    assert v4.make_inputs(replace(s, sink="none", rope=False)).attn_sink is None
    assert v4.make_inputs(replace(s, rope=False)).positions is None
    inf = v4.make_inputs(replace(s, sink="neginf")).attn_sink
    assert bool((inf == -math.inf).all())
    large = v4.make_inputs(replace(s, sink="large")).attn_sink
    assert large[0] == 200.0 and bool(((large[1:] >= 6) & (large[1:] <= 12)).all())
    q = v4.make_inputs(replace(s, H=64)).q.float()
    assert 1.3 < float(q.std()) < 1.7 and bool((q != 0).all())


def test_shape_sets():
    bench = v4.SHAPES["bench"]
    decode = [s for s in bench if set(s.rows) == {1}]
    assert len(decode) == 96 and {s.T for s in decode} == {1, 8, 32, 64, 128, 256}
    assert {s.H for s in decode} == {8, 16, 64, 128}
    assert {(s.kind, s.topk if s.kind == "csa" else 0) for s in decode} == {
        ("window", 0), ("csa", 512), ("csa", 1024), ("hca", 0)}  # fmt: skip
    for s in decode:
        if s.kind == "hca":
            assert s.compressed_counts() == [8192] * s.T and s.ratio == 128 and s.cblock == 2
        if s.kind == "csa":
            assert min(s.lens) >= 32768 and s.ratio == 4 and s.cblock == 64
    prefill = [s for s in bench if s not in decode]
    assert [(s.T, len(s.lens), s.lens[0], s.H, s.kind, s.topk) for s in prefill] == [
        (8192, 1, 32768, 64, "csa", 512), (8192, 1, 32768, 128, "csa", 512)]  # fmt: skip
    assert all(s.fp8 and s.window == 128 and s.block == 64 for s in bench)
    tiny = v4.SHAPES["tiny"]
    assert {s.kind for s in tiny} == set(v4.KINDS) and {1, 8, 16} <= {s.H for s in tiny}
    assert any(s.ragged for s in tiny) and any(not s.ragged for s in tiny)
    odd = v4.SHAPES["odd"]
    assert {1, 24} <= {s.H for s in odd} and {1, 16} <= {s.block for s in odd} and any(s.T == 0 for s in odd)
    assert any(1 in s.lens for s in odd) and any(s.compressed_width() == 0 and s.T for s in odd)
    check = v4.SHAPES["selfcheck"]
    assert {8, 64, 128} <= {s.H for s in check} and {s.kind for s in check} == set(v4.KINDS)
    assert all(s.fp8 for s in check) and v4.SHAPES["tune"]
    assert decode[0].label() == "fp8 window B=1 ctx=32768 H=8"
    assert prefill[0].label() == "fp8 csa512 B=1 ctx=32768 H=64 T=8192"
    assert tiny[3].label(torch.float32) == "fp8 csa24 lens=150,70 H=8 block=16 cblock=4 ragged"


def test_shape_counts_and_errors():
    s = v4.V4Shape((300,), 2, 4, kind="hca", ratio=16, cblock=4, block=16, sink="none", rope=False)
    assert s.positions() == [298, 299] and s.window_counts() == [128, 128]
    assert s.compressed_counts() == [18, 18] and s.compressed_width() == 18
    assert s.entries() == 2 * (128 + 18)
    assert s.flops() == 2.0 * 4 * s.entries() * 1024
    assert s.set_bytes(torch.bfloat16) == (9 * 16 + 5 * 4) * 584
    assert s.nbytes(torch.bfloat16) == s.entries() * 584 + 2 * (128 + 18) * 4 + 2 * 4 * (2 * 512 * 2 + 4)
    csa = v4.V4Shape((41,), 1, 4, kind="csa", topk=8)
    assert csa.compressed_counts() == [8] and csa.compressed_width() == 8 and csa.ratio == 4
    assert v4.V4Shape((3,), 1, 4, kind="csa", topk=8).compressed_counts() == [0]
    for bad in (dict(kind="mla"), dict(kv="fp16"), dict(sink="nan"), dict(window_fp8="fp8"), dict(ragged=1),
                dict(H=0), dict(holes=0.7, dups=0.5)):  # fmt: skip
        with pytest.raises(ValueError, match=next(iter(bad)) if "holes" not in bad else "holes"):
            v4.V4Shape((10,), 1, **{"H": 4, **bad})
    with pytest.raises(ValueError, match="q_layout"):
        v4.make_inputs(s, q_layout="x")


def test_tolerance_table():
    assert set(v4.TOLERANCE) == {torch.float32, torch.float16, torch.bfloat16}
    for table in v4.TOLERANCE.values():
        assert set(table) == {"out", "lse"} and table["out"].norm is not None
