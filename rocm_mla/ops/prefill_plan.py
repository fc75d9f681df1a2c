"""mla_prefill's launch plan: everything one kernel launch needs, decided on the host from the call's
sizes, dtypes, device and the tensors' strides and alignment, never from a device value (the grid is
sized from Tq and B, not from cu_seqlens, so the call can be captured in a CUDA/HIP graph).

``plan_prefill(...) -> PrefillPlan`` (flashinfer's plan/run split): ``launch_triton`` plans, then
launches exactly what the plan says. What it decides:
  * the launch data: a ``config=`` override, else the arch's entry in configs/mla_prefill.json
    (``launch_config``: ``triton`` for 16-bit inputs, ``triton_fp32`` for float32; a head geometry
    listed under the arch's ``geometries`` takes its own entries);
  * the head-dim tiles (``dim_tiles``): each of P, R, V tiled by the next power of two, the columns
    past the dim masked in the kernel;
  * the head group (``head_group``): how many heads' programs the kernel numbers together;
  * the grid: ``grid_slots`` slots x N programs on one axis;
  * the TMA mode (``USE_TMA``: 0 pointer loads, 1 per-program descriptors, 2 host descriptors),
    on where the arch honours it, the inputs are 16-bit and the tensors meet the descriptors'
    alignment (``_tma_ok``);
  * the constexprs and compile options (``triton_meta``: the ISA report compiles its variants from
    the same function, so what it reports is what runs).

Launch data: rocm_mla/configs/mla_prefill.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .. import _platform
from ..configs import config_for, nvidia_sm, prefill_tma_mode
from ..mla_dims import PREFILL_DIMS
from ..triton_common import amd_options

OP = "mla_prefill"
# cu_seqlens_q entries a program reads per vector step when it looks up its sequence (B <= this:
# one step). 256 int32 is one element per lane at 4 waves of 64 or 8 warps of 32.
SEQ_CHUNK = 256


def geometry_key(dims: tuple[int, int, int]) -> str:
    """``"P/R/V"``: the key of a head geometry under an arch's ``geometries`` in configs/mla_prefill.json."""
    return "/".join(str(int(d)) for d in dims)


def launch_config(arch: str, dtype: torch.dtype, dims: tuple[int, int, int] = PREFILL_DIMS) -> dict:
    """The launch data the wrapper uses for ``dtype`` and head geometry ``dims`` = (P, R, V) on
    ``arch`` (see configs/mla_prefill.json): the geometry's own entry when the arch lists one under
    ``geometries``, else the arch's."""
    cfg = config_for(OP, arch)
    key = "triton_fp32" if dtype == torch.float32 else "triton"
    own = cfg.get("geometries", {}).get(geometry_key(dims), {})
    return own.get(key, cfg[key])


def dim_tile(d: int) -> int:
    """The kernel's tile of a head dim ``d``: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, 1 << max(0, int(d) - 1).bit_length())


def dim_tiles(dims: tuple[int, int, int]) -> tuple[int, int, int]:
    """(BLOCK_DN, BLOCK_DR, BLOCK_DV) of (P, R, V); R = 0 still gets a (never used) tile of 16."""
    return tuple(dim_tile(d) for d in dims)  # type: ignore[return-value]


def head_group(cfg: dict, num_heads: int, max_seqlen_k: int, kv_head_bytes: int) -> int:
    """Heads whose programs the kernel numbers together (its head_group, see the kernel's Grid), a
    divisor of ``num_heads``: the largest one not above the config's ``head_group`` when it has
    one; else, with ``head_group_kv_bytes``, the most heads whose K/V of one sequence
    (``max_seqlen_k`` keys x ``kv_head_bytes``) fit in that many bytes -- the programs running
    together then re-read K/V from L2, not memory (docs/notes/prefill-tma-and-head-groups.md);
    else 1 (one head after another)."""
    if "head_group" in cfg:
        want = int(cfg["head_group"])
        if want < 1:
            raise ValueError(f"{OP}: config head_group must be >= 1, got {want}")
    elif "head_group_kv_bytes" in cfg:
        want = int(cfg["head_group_kv_bytes"]) // max(1, max_seqlen_k * kv_head_bytes)
    else:
        want = 1
    want = max(1, min(want, num_heads))
    return max(g for g in range(1, want + 1) if num_heads % g == 0)


def triton_meta(
    cfg: dict,
    arch: str,
    dims: tuple[int, int, int],
    causal: bool,
    fp32: bool,
    tma_aligned: bool = True,
) -> tuple[dict, dict]:
    """``(constexprs, compile options)`` of one launch config on ``arch``: the single place the
    launch and the ISA report's variants (rocm_mla/variants/prefill.py) take them from.
    ``tma_aligned``: the tensors meet the TMA descriptors' alignment (``_tma_ok``; the variants
    describe aligned tensors)."""
    P, R, V = dims
    tiles = dim_tiles(dims)
    # A host descriptor reads whole tiles along a row of all heads: past a head's dim it would read
    # the next head's columns, not zero fill. Tiles wider than a dim keep per-program descriptors.
    tma = _tma_mode(cfg) if _tma_arch(arch) and not fp32 and tma_aligned else 0
    if tma == 2 and any(t != d for t, d in zip(tiles, dims) if d):
        tma = 1
    consts = {
        "D_NOPE": P,
        "D_ROPE": R,
        "D_V": V,
        "BLOCK_DN": tiles[0],
        "BLOCK_DR": tiles[1],
        "BLOCK_DV": tiles[2],
        "BLOCK_M": int(cfg["BLOCK_M"]),
        "BLOCK_N": int(cfg["BLOCK_N"]),
        "SEQ_CHUNK": SEQ_CHUNK,
        "CAUSAL": bool(causal),
        # fp32 inputs: exact products (NVIDIA would use TF32 by default); 16-bit inputs: default.
        "DOT_PREC": "ieee" if fp32 else None,
        # software-pipelining depth of the masked (diagonal / ragged-end) loop; default: num_stages
        "DIAG_STAGES": int(cfg.get("diag_stages", cfg.get("num_stages", 2))),
        # TMA tensor descriptors for K/k_pe/V ("host": q too): NVIDIA sm90+ (and the CPU
        # interpreter, which runs the same code path), 16-bit inputs; plan_prefill also checks
        # the alignment.
        "USE_TMA": tma,
    }
    # On AMD also waves_per_eu, matrix_instr_nonkdim, kpack and schedule_hint (the backend's
    # instruction-scheduling hint); 0 / "none" are the backend's defaults.
    options = {
        "num_warps": int(cfg["num_warps"]),
        "num_stages": int(cfg.get("num_stages", 2)),
        **amd_options(cfg, arch),
    }
    return consts, options


def _tma_mode(cfg: dict) -> int:
    """The kernel's USE_TMA for a config's "tma" option (configs.PREFILL_TMA_MODES: false 0, true 1
    per-program descriptors, "host" 2 host descriptors)."""
    tma = cfg.get("tma", False)
    mode = prefill_tma_mode(tma)
    if mode is not None:
        return mode
    raise ValueError(f'{OP}: config tma must be false, true or "host", got {tma!r}')


def _tma_arch(arch: str) -> bool:
    """Archs where the "tma" launch option is honoured: Hopper and later NVIDIA, and the CPU
    interpreter (to test the path). On AMD the descriptors would be lowered back to pointer loads."""
    if arch == "cpu":
        return True
    return (nvidia_sm(arch) or 0) >= 90


def _tma_ok(q, k_nope, k_pe, v, kpe_sh: int) -> bool:
    """TMA descriptors need 16-byte aligned bases and row/head steps, unit inner strides (and the
    data to exist). Otherwise the launch keeps the pointer loads. (q only matters to host
    descriptors, which also load it; requiring it of both keeps one rule.) ``k_pe`` None: no
    RoPE part (R = 0), nothing to describe."""
    if k_nope.shape[0] == 0 or k_nope.element_size() != 2:
        return False
    e = k_nope.element_size()
    tensors = [(q, q.stride(1)), (k_nope, k_nope.stride(1)), (v, v.stride(1))]
    if k_pe is not None:
        tensors.append((k_pe, kpe_sh))
    for x, head_stride in tensors:
        if x.stride(2) != 1 or x.data_ptr() % 16 or (x.stride(0) * e) % 16 or (head_stride * e) % 16:
            return False
    return True


def grid_slots(Tq: int, B: int, N: int, block_m: int) -> int:
    """The kernel's slot count, ``Tq // BLOCK_M + B`` (it covers every sequence's q blocks, see the
    kernel's Grid); its one grid axis has ``slots x N`` programs, numbered in int32."""
    slots = Tq // block_m + B
    if slots * N >= 2**31:
        raise ValueError(
            f"{OP}: (Tq // BLOCK_M + B) * N programs must be < 2**31, got {slots * N} "
            f"(Tq={Tq}, B={B}, N={N}, BLOCK_M={block_m})"
        )
    return slots


@dataclass(frozen=True)
class PrefillPlan:
    """What one mla_prefill kernel launch runs (``plan_prefill`` makes it; ``launch_triton`` runs it).

    The launch: ``grid = (num_slots x N,)`` programs, each ``BLOCK_M`` queries of one sequence and
    one head, numbered by groups of ``head_group`` heads (the kernel's Grid). ``constexprs["USE_TMA"]``
    says how K, k_pe and V (and with 2, q) are loaded; 2 means the launcher builds the host
    descriptors, 1 that the programs build theirs in Triton's global scratch.
    """

    arch: str  # the device's arch key (gfx942, sm90, cpu, ...)
    config: dict[str, Any]  # the launch data: the config= override or the arch's table entry
    kpe_head_stride: int  # k_pe's head stride as launched: 0 when one rope head serves every head
    head_group: int
    num_slots: int
    grid: tuple[int]
    constexprs: dict[str, Any]
    options: dict[str, Any]

    @property
    def use_tma(self) -> int:
        """The kernel's USE_TMA: 0 pointer loads, 1 per-program descriptors, 2 host descriptors."""
        return self.constexprs["USE_TMA"]


def plan_prefill(
    q: torch.Tensor,
    k_nope: torch.Tensor,
    k_pe: torch.Tensor,
    v: torch.Tensor,
    *,
    batch: int,
    causal: bool,
    config: dict | None = None,
    max_seqlen_k: int | None = None,
) -> PrefillPlan:
    """The launch of one validated mla_prefill call, from the tensors' sizes, dtype, device, strides
    and alignment (no device value is read).

    Args:
        q, k_nope, k_pe, v: ``[Tq, N, P + R]``, ``[Tk, N, P]``, ``[Tk, 1 or N, R]`` (None: R = 0),
            ``[Tk, N, V]``, as :func:`rocm_mla.mla_prefill` takes them (any strides).
        batch: B, the sequences (``cu_seqlens_q`` has B + 1 entries).
        causal: the kernel's CAUSAL.
        config: override of the launch data (``launch_config``'s keys); tuning and tests.
        max_seqlen_k: a host-side hint of the longest key sequence (Tk when None); only the head
            group depends on it.

    Raises:
        ValueError: a config ``tma`` other than false, true or "host", a ``head_group`` < 1, or a
            grid of 2**31 programs or more.
    """
    Tq, N, _ = q.shape
    Tk = k_nope.shape[0]
    arch = _platform.device_arch(q.device)
    dims = (k_nope.shape[2], 0 if k_pe is None else k_pe.shape[2], v.shape[2])
    cfg = config if config is not None else launch_config(arch, q.dtype, dims)
    kpe_sh = 0 if k_pe is None or k_pe.shape[1] == 1 else k_pe.stride(1)  # one rope head serves every head
    tma_aligned = bool(_tma_mode(cfg)) and _tma_ok(q, k_nope, k_pe, v, kpe_sh)
    group = head_group(cfg, N, max_seqlen_k or Tk, (dims[0] + dims[2]) * q.element_size())
    consts, options = triton_meta(cfg, arch, dims, causal, q.dtype == torch.float32, tma_aligned)
    num_slots = grid_slots(Tq, batch, N, consts["BLOCK_M"])
    return PrefillPlan(
        arch=arch,
        config=cfg,
        kpe_head_stride=kpe_sh,
        head_group=group,
        num_slots=num_slots,
        grid=(num_slots * N,),
        constexprs=consts,
        options=options,
    )


__all__ = [
    "OP",
    "SEQ_CHUNK",
    "PrefillPlan",
    "plan_prefill",
    "launch_config",
    "geometry_key",
    "dim_tile",
    "dim_tiles",
    "head_group",
    "triton_meta",
    "grid_slots",
]
