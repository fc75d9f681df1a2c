"""mla_prefill: the Triton variants the wrapper (and ``rocm-mla tune``) can launch, for
the ISA report, and the short label of a launch config.

Constexprs and options come from ``rocm_mla.ops.prefill_plan.triton_meta``, the function the launch uses.
"""

from __future__ import annotations

import torch

from ..configs import config_for, is_nvidia_arch
from ..kernels.prefill import mla_prefill_kernel
from ..mla_dims import PREFILL_DIMS, PREFILL_GEOMETRIES
from ..ops.prefill_plan import OP, geometry_key, launch_config, triton_meta
from ..triton_common import triton_type
from .triton_variant import TritonVariant


def _configs_for(arch: str, dtype: torch.dtype, dims: tuple[int, int, int] = PREFILL_DIMS) -> list[tuple[dict, bool]]:
    """(config, is_candidate) the wrapper or ``rocm-mla tune`` can launch (candidates: DeepSeek's dims)."""
    main = launch_config(arch, dtype, dims)
    out = [(main, False)]
    if dtype == torch.bfloat16 and dims == PREFILL_DIMS:  # candidates are tuned in bf16 (the serving dtype)
        for cand in config_for(OP, arch)["candidates"]:
            if all(cand.get(k) == main.get(k) for k in set(cand) | set(main)):
                continue
            out.append((cand, True))
    return out


def config_label(cfg: dict) -> str:
    """Short text of a launch config, e.g. ``M128 N64 w4 s2 wpe2 mi16``."""
    s = f"M{cfg['BLOCK_M']} N{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg.get('num_stages', 2)}"
    if "diag_stages" in cfg and cfg["diag_stages"] != cfg.get("num_stages", 2):
        s += f"/{cfg['diag_stages']}"  # the masked loop's pipelining depth
    for key, tag in (("waves_per_eu", "wpe"), ("matrix_instr_nonkdim", "mi"), ("kpack", "kp")):
        if cfg.get(key):
            s += f" {tag}{cfg[key]}"
    if cfg.get("schedule_hint", "none") != "none":
        s += f" sh={cfg['schedule_hint']}"
    if cfg.get("tma"):
        s += " tma=host" if cfg["tma"] == "host" else " tma"
    if "head_group" in cfg:  # the precedence of ops.prefill_plan.head_group
        s += f" hg{cfg['head_group']}" if cfg["head_group"] != 1 else ""
    elif "head_group_kv_bytes" in cfg:
        s += f" kv{cfg['head_group_kv_bytes'] >> 20}M"
    return s


def triton_variant(
    arch: str, dtype: torch.dtype, cfg: dict, causal: bool, tag: str = "", dims: tuple[int, int, int] = PREFILL_DIMS
) -> TritonVariant:
    """The Triton specialisation launched for head geometry ``dims`` = (P, R, V) (DeepSeek's
    (128, 64, 128) by default) with launch config ``cfg`` on ``arch``: innermost strides 1,
    head/token strides and pointers 16-divisible, k_pe head stride 0 (``perf/isa_sweep_prefill.py``
    compiles any config through this). Another geometry's config label starts with ``P/R/V``."""
    tname = triton_type(dtype)
    consts, options = triton_meta(cfg, arch, dims, causal, dtype == torch.float32)
    ptr = f"*{tname}"
    sig = {
        "Q": ptr,
        "KN": ptr,
        "KPE": ptr,
        "V": ptr,
        "O": ptr,
        "LSE": "*fp32",
        "CU_Q": "*i32",
        "CU_K": "*i32",
        "qk_scale": "fp32",
        "num_seqs": "i32",
        "num_slots": "i32",
        "head_group": "i32",
        "num_q_rows": "i32",
        "num_k_rows": "i32",
    }
    strides = ["q_st", "q_sh", "kn_st", "kn_sh", "kpe_st", "kpe_sh", "v_st", "v_sh", "o_st", "o_sh", "lse_sh"]
    sig.update({s: "i32" for s in strides})
    # Host TMA descriptors: typed by block shape under USE_TMA 2 (NVIDIA), None (constexpr) otherwise.
    P, R, V = dims
    bm, bn = consts["BLOCK_M"], consts["BLOCK_N"]
    blocks = {"QN_D": (bm, P), "QP_D": (bm, R), "KN_D": (bn, P), "KP_D": (bn, R), "V_D": (bn, V)}
    descs = {}
    for k, (rows, cols) in blocks.items():
        if consts["USE_TMA"] == 2 and cols:  # R = 0: no rope descriptors
            sig[k] = f"tensordesc<{tname}[{rows},{cols}]>"
        else:
            sig[k] = "constexpr"
            descs[k] = None
    # Innermost strides are 1 on real tensors, and Triton specialises ints equal to 1.
    ones = {k: 1 for k in ("q_sd", "kn_sd", "kpe_sd", "v_sd", "o_sd", "lse_st", "cuq_s", "cuk_s")}
    sig.update({k: "constexpr" for k in ones})
    sig.update({k: "constexpr" for k in consts})
    geo = "" if dims == PREFILL_DIMS else geometry_key(dims) + " "
    return TritonVariant(
        kernel=OP,
        config=f"{tname} {'causal' if causal else 'full'} {geo}{config_label(cfg)}{tag}",
        fn=mla_prefill_kernel,
        signature=sig,
        constexprs={**consts, **ones, **descs},
        options=options,
        # lse_sh is Tq (any value): not claimed 16-divisible.
        divisible_by_16=(
            "Q",
            "KN",
            "KPE",
            "V",
            "O",
            "LSE",
            "CU_Q",
            "CU_K",
            "q_st",
            "q_sh",
            "kn_st",
            "kn_sh",
            "kpe_st",
            "kpe_sh",
            "v_st",
            "v_sh",
            "o_st",
            "o_sh",
        ),
        # NVIDIA has no exact-fp32 tensor-core op: fp32 dots run on FMA there by design.
        expects_mfma=not (dtype == torch.float32 and is_nvidia_arch(arch)),
    )


def triton_variants(arch: str) -> list[TritonVariant]:
    """The Triton specialisations launched for every MLA head geometry (rocm_mla.mla_dims.PREFILL_GEOMETRIES),
    causal and not, bf16/fp16/fp32, with the launch config of ``arch`` for that geometry (and, for
    DeepSeek's dims in bf16, each tuning candidate)."""
    return [
        triton_variant(arch, dtype, cfg, causal, " cand" if cand else "", dims)
        for dims in PREFILL_GEOMETRIES.values()
        for dtype in (torch.bfloat16, torch.float16, torch.float32)
        for cfg, cand in _configs_for(arch, dtype, dims)
        for causal in (True, False)
    ]
