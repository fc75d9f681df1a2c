"""mla_decode on bad block-table entries and NaN in the cache: a bad page makes exactly its
request NaN (each form of the page guard, every split choice), a NaN in a used KV row reaches
exactly that request; debug mode names the page."""

from __future__ import annotations

import pytest
import torch
from _util import CLAMP_CFG, DEVICE, PAGE_GUARD_CFGS
from decode_case import V_SPLIT_CFG, make_case

from rocm_mla.cases.decode import call_decode
from rocm_mla.ops.decode_plan import tier_config


@pytest.mark.parametrize("cfg", PAGE_GUARD_CFGS)
@pytest.mark.parametrize("splits", [1, 2, 5])
@pytest.mark.parametrize("bad", ["minus_one", "num_pages", "huge"])
@pytest.mark.parametrize("block_size", [16, 4, 24, 1])  # PAGE_MODE 2, 1, 0, 1 with the 16-token CPU tile
@pytest.mark.parametrize("which", ["second", "last"])
def test_bad_page_id_makes_only_that_request_nan(cfg, splits, bad, block_size, which):
    """A used block-table entry outside the cache (debug off): that request's rows are NaN in out and
    lse, the other requests are exact (that nothing outside kv is read: test_decode_memory_safety.py's
    test_decode_kernel_bad_page_makes_its_request_nan, with guard regions) -- with either form of the guard
    (CLAMP_PAGES: pages clamped into the cache in the loop, checked after it). The bad entry is the
    request's second or its last used one (block 32 at block size 1: past the first 16 entries,
    which the check-first form reads apart from the rest)."""
    case = make_case((40, 33, 9), 4, 1, block_size, seed=41)
    ro, rl = case.reference()
    n_pages = case.kv_cache.shape[0]
    value = {"minus_one": -1, "num_pages": n_pages, "huge": 2**31 - 1}[bad]
    blk = 1 if which == "second" else (33 - 1) // block_size  # request 1 uses blocks 0..cdiv(33, bs)-1
    case.block_table[1, blk] = value
    out, lse = case.run(num_splits=splits, backend="triton", debug=False, config=cfg, out=None, lse=None)
    rows1 = slice(1, 2)
    assert torch.isnan(out[rows1]).all() and torch.isnan(lse[rows1]).all()
    keep = [0, 2]
    case.check(out[keep], lse[keep], ref=(ro[keep], rl[keep]))


@pytest.mark.parametrize("cfg", PAGE_GUARD_CFGS)
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("block_size", [16, 4, 24])  # PAGE_MODE 2, 1, 0 with the 16-token CPU tile
def test_bad_page_seen_by_one_mtp_row_makes_every_row_nan(cfg, splits, block_size):
    """MTP (q_len 3): the last used page holds key 32, which only the request's last row sees
    (causal). A bad entry there still makes every row of that request NaN in out and lse (the
    request's result is unusable, not just the rows that read the page); the others are exact."""
    case = make_case((33, 20), 4, 3, block_size, seed=45)
    ro, rl = case.reference()
    case.block_table[0, 32 // block_size] = -1
    out, lse = case.run(num_splits=splits, backend="triton", debug=False, config=cfg, out=None, lse=None)
    rows0 = slice(0, 3)  # request 0's three rows
    assert torch.isnan(out[rows0]).all() and torch.isnan(lse[rows0]).all()
    case.check(out[3:], lse[3:], ref=(ro[3:], rl[3:]))


@pytest.mark.parametrize("cfg", PAGE_GUARD_CFGS)
@pytest.mark.parametrize("splits", [1, 3])
def test_cache_without_pages_makes_used_requests_nan(cfg, splits):
    """kv_cache of 0 pages: every entry a request with keys uses is outside it, so that request is
    NaN (nothing is read); a request with seq_len 0 still gets out 0 and lse -inf."""
    case = make_case((20, 0), 4, 1, 16, seed=44)
    kv, bt = case.kv_cache[:0], torch.zeros_like(case.block_table)  # [0, 16, 576]; [2, 3]
    out, lse = call_decode(
        case.q_nope,
        case.q_pe,
        kv,
        bt,
        case.seq_lens,
        sm_scale=0.1,
        backend="triton",
        num_splits=splits,
        config=cfg,
        debug=False,
    )
    assert torch.isnan(out[0]).all() and torch.isnan(lse[0]).all()
    assert (out[1] == 0).all() and (lse[1] == float("-inf")).all()


def test_bad_page_id_named_in_debug_mode():
    case = make_case((40, 9), 4, 1, 16, seed=42)
    case.block_table[0, 1] = case.kv_cache.shape[0]
    with pytest.raises(ValueError, match="block_table"):
        case.run(debug=True)


@pytest.mark.parametrize("cfg", [None, V_SPLIT_CFG, CLAMP_CFG], ids=["default", "v_split", "clamp"])
@pytest.mark.parametrize("splits", [1, 2, 5])
@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nan_in_used_kv_row_reaches_that_request(cfg, splits, poison):
    """A NaN or inf in one used KV row: every row of that request that sees the key is NaN in out
    and lse, whatever the split count (a split's NaN lse is not read as 'no key'); the other
    requests are exact."""
    case = make_case((40, 33, 9), 4, 1, 16, seed=43)
    ro, rl = case.reference()
    tok = 20  # a key of request 1 that every one of its rows sees
    page = int(case.block_table[1, tok // 16])
    case.kv_cache[page, tok % 16, 7] = poison
    out, lse = case.run(num_splits=splits, backend="triton", config=cfg, out=None, lse=None)
    if poison != poison:
        assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    else:  # inf: a head whose score is -inf skips the key, but 0 x inf still reaches column 7
        assert (~torch.isfinite(out[1])).any(-1).all()
        assert torch.isnan(lse[1][~torch.isfinite(rl[1])]).all()
    keep = [0, 2]
    case.check(out[keep], lse[keep], ref=(ro[keep], rl[keep]))


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [None, 1, 16])
def test_gpu_bad_page_and_nan_row(splits):
    case = make_case((3000, 700, 90), 16, 1, 64, torch.bfloat16, seed=6)
    ro, rl = case.reference()
    case.block_table[0, 5] = case.kv_cache.shape[0] + 1000
    page = int(case.block_table[1, 3])
    case.kv_cache[page, 5, 3] = float("nan")
    out, lse = case.run(num_splits=splits, out=None, lse=None)
    assert torch.isnan(out[:2].float()).all() and torch.isnan(lse[:2]).all()
    case.check(out[2:], lse[2:], ref=(ro[2:], rl[2:]))


def _this_gpu_tier0(clamp: bool, fp8: bool) -> dict:
    """The 16-row tier this GPU runs, with the page guard forced to one form."""
    from rocm_mla import _platform
    from rocm_mla.configs import config_for

    arch = _platform.device_arch(DEVICE)
    tier = tier_config(arch, 0, torch.bfloat16, fp8, config_for("mla_decode", arch)["tiers"][0])
    return {**tier, "CLAMP_PAGES": clamp}


@pytest.mark.gpu
@pytest.mark.parametrize("clamp", [False, True], ids=["check_first", "clamp"])
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_gpu_page_guard_forms(clamp, kv):
    """Both forms of the page guard on this GPU's 16-row tier (block 64: one page per tile): a bad
    page NaNs only its request, and a cache of 0 pages reads nothing (its base pointer may be null:
    any read would fault, under memcheck or not). A NaN KV row: test_gpu_bad_page_and_nan_row."""
    fp8 = kv == "fp8"
    cfg = _this_gpu_tier0(clamp, fp8)
    kw = {"k_scale": 0.5} if fp8 else {}
    case = make_case((3000, 700, 90), 16, 1, 64, torch.bfloat16, fp8=fp8, k_scale=0.5, seed=7)
    ro, rl = case.reference()
    case.block_table[0, 5] = -1
    for splits in (None, 1, 16):
        out, lse = case.run(num_splits=splits, config=cfg, out=None, lse=None, **kw)
        assert torch.isnan(out[:1].float()).all() and torch.isnan(lse[:1]).all()
        case.check(out[1:], lse[1:], ref=(ro[1:], rl[1:]))
    q, qp = case.q_nope[:2], case.q_pe[:2]
    empty = case.kv_cache[:0]
    bt = torch.zeros(2, 4, dtype=torch.int32, device=DEVICE)
    sl = torch.tensor([200, 0], dtype=torch.int32, device=DEVICE)
    for splits in (1, 4):
        out, lse = call_decode(q, qp, empty, bt, sl, sm_scale=0.1, num_splits=splits, config=cfg, debug=False, **kw)
        torch.cuda.synchronize()
        assert torch.isnan(out[0].float()).all() and torch.isnan(lse[0]).all()
        assert (out[1] == 0).all() and (lse[1] == float("-inf")).all()
