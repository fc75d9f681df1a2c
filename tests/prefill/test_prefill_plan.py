"""plan_prefill: the launch of one mla_prefill call from the tensors' sizes, dtype, strides and
alignment (no kernel runs here: the launches themselves are the other prefill tests)."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE
from prefill_case import case

from rocm_mla._platform import device_arch
from rocm_mla.cases import generator, randn
from rocm_mla.cases.prefill import P, V
from rocm_mla.ops.prefill_plan import _tma_arch, grid_slots, head_group, launch_config, plan_prefill

F32, F16 = torch.float32, torch.float16
SMALL = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


def _qkv(c):
    return c.args()[:4]


def test_plan_is_the_config_head_group_and_grid():
    """Tq=45+70 rows of B=2 sequences, N=4 heads: ``grid_slots`` slots x N programs on one axis,
    the head group and constexprs of the arch's launch data (the config= override when given)."""
    c = case([45, 70], [58, 70], 4, F32)
    q, kn, kpe, v = _qkv(c)
    plan = plan_prefill(q, kn, kpe, v, batch=2, causal=True)
    cfg = launch_config(plan.arch, F32)
    assert plan.config == cfg
    slots = grid_slots(q.shape[0], 2, 4, int(cfg["BLOCK_M"]))
    assert (plan.num_slots, plan.grid) == (slots, (slots * 4,))
    assert plan.head_group == head_group(cfg, 4, kn.shape[0], (P + V) * 4)
    assert plan.constexprs["CAUSAL"] and plan.constexprs["DOT_PREC"] == "ieee" and plan.use_tma == 0
    plan = plan_prefill(q, kn, kpe, v, batch=2, causal=False, config={**SMALL, "head_group": 3})
    assert plan.config["head_group"] == 3 and plan.head_group == 2  # the largest divisor of N=4 not above 3
    assert plan.grid == (grid_slots(q.shape[0], 2, 4, 32) * 4,) and not plan.constexprs["CAUSAL"]


def test_plan_kpe_head_stride():
    """One rope head broadcast over N: head stride 0; a real ``[Tk, N, R]`` k_pe keeps its own."""
    q, kn, kpe, v = _qkv(case([9], [9], 2, F32))
    assert plan_prefill(q, kn, kpe, v, batch=1, causal=True).kpe_head_stride == 0
    per_head = kpe.expand(-1, 2, -1).contiguous()
    assert plan_prefill(q, kn, per_head, v, batch=1, causal=True).kpe_head_stride == per_head.stride(1)


TMA_ARCH = _tma_arch(device_arch(DEVICE))


@pytest.mark.skipif(not TMA_ARCH, reason="TMA descriptors need an NVIDIA sm90+ GPU or the interpreter")
@pytest.mark.parametrize("tma, mode", [(False, 0), (True, 1), ("host", 2)])
def test_plan_tma_mode_needs_16_bit_aligned_tensors(tma, mode):
    """The config's tma becomes USE_TMA for aligned 16-bit tensors, 0 for a misaligned k_nope or
    fp32 inputs; an unknown tma value raises, whatever the tensors."""
    cfg = {**SMALL, "tma": tma}
    q, kn, kpe, v = _qkv(case([4], [4], 2, F16))
    assert plan_prefill(q, kn, kpe, v, batch=1, causal=True, config=cfg).use_tma == mode
    odd = randn((4, 2, 2 * P), generator(0, DEVICE), DEVICE, F16)[..., 1 : P + 1]  # base 2 bytes off 16
    assert plan_prefill(q, odd, kpe, v, batch=1, causal=True, config=cfg).use_tma == 0
    q32, kn32, kpe32, v32 = _qkv(case([4], [4], 2, F32))
    assert plan_prefill(q32, kn32, kpe32, v32, batch=1, causal=True, config=cfg).use_tma == 0
    with pytest.raises(ValueError, match="tma must be false, true or \"host\", got 'yes'"):
        plan_prefill(q32, kn32, kpe32, v32, batch=1, causal=True, config={**SMALL, "tma": "yes"})
