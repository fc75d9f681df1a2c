"""Peer kernels compiled beside ours in ``rocm-mla isa-report``: aiter's Triton MHA forward (beside
mla_prefill) and aiter's Triton MLA decode (beside mla_decode).

vLLM's AITER_TRITON_MLA backend runs aiter's ``flash_attn_varlen_func`` (aiter/ops/triton/mha.py)
for MLA prefill on ROCm: one ``_attn_fwd`` launch on ``q [T, N, 192]``, ``k = cat(k_nope, k_pe)
[T, N, 192]`` and ``v [T, N, 128]`` (Dqk 192 / Dv 128: its "pe" path, BLOCK_DMODEL 128 +
BLOCK_DMODEL_PE 64), varlen, causal. This module describes that launch as ``TritonVariant`` rows,
with the launch config aiter itself picks (``_get_config(False, bf16, has_pe=True)``) from its
MI300X JSON, so the report shows aiter's registers/spills/occupancy for gfx942 next to ours.

Nothing of aiter is in this repository: its Triton tree is unpacked from the amd-aiter wheel into an
ignored folder by ``perf/peers/get_aiter_peers.sh DIR`` and imported from there
(``benchutil.load_aiter_peer``). Only ``aiter.ops.triton._triton_kernels.mha`` is
imported: ``aiter.ops.triton.mha`` imports ``flash_attn_triton_amd``, which asks Triton's active
driver for the GPU at import time and fails on a machine without one.

Peer rows are reported, never gated: their spills or missing folder do not fail the report.

This module is a development tool, not part of the wheel: ``rocm-mla isa-report`` loads it from the
repository's perf/ folder (``rocm_mla.tools.isa_report.peers.load_peer_variants``), which also puts
perf/ on ``sys.path`` for ``benchutil``.
"""

from __future__ import annotations

import os
from pathlib import Path

from rocm_mla import env
from rocm_mla.configs import is_amd_arch
from rocm_mla.mla_dims import PREFILL_DIMS
from rocm_mla.tools.isa_report.peers import AITER_DECODE_KERNEL, AITER_KERNEL
from rocm_mla.triton_common import AMD_ONLY_OPTIONS, without_amd_options
from rocm_mla.variants.triton_variant import TritonVariant

# The arches aiter ships Triton configs for, with its file prefix (aiter's arch_info names them so);
# any other arch (sm90) compiles aiter's kernels with its gfx942 configs.
AITER_CONFIG_FILES = {"gfx942": "MI300X", "gfx950": "MI350X"}
# The launch perf/bench_prefill.py times: q / k_cat contiguous [T, N, 192], v the [..., 128:] view
# of the [T, N, 256] kv_b_proj output, out [T, N, 128] (aiter allocates it), lse [T, N] float32.
P, R, V = PREFILL_DIMS  # 128, 64, 128


def aiter_peers_dir() -> Path:
    """Where the aiter peer tree is looked for: ``$ROCM_MLA_AITER_PEERS``, else ``.peers/aiter`` of
    the repository this file is in, else of the working directory."""
    given = env.get("ROCM_MLA_AITER_PEERS")
    if given:
        return Path(given)
    repo = Path(__file__).resolve().parents[1] / ".peers" / "aiter"
    return repo if repo.is_dir() else Path(".peers", "aiter")


def load_aiter_mha_kernels(peers: str | os.PathLike, config_arch: str = "gfx942"):
    """aiter's ``_triton_kernels.mha`` module (``_attn_fwd``, ``_get_config``), its configs read for
    ``config_arch``. Raises (with the reason) when the folder is missing or the import fails."""
    from benchutil import load_aiter_peer

    return load_aiter_peer(str(peers), "_triton_kernels.mha", config_arch=config_arch, raise_errors=True)


def _forget_config(mod) -> None:
    """Make aiter's ``_get_config`` read its JSON again, for the arch asked now: it keeps the file's
    content on itself and, in some modules, behind an ``lru_cache`` too."""
    fn = mod._get_config
    if hasattr(fn, "cache_clear"):
        fn.cache_clear()
    if hasattr(fn, "_config_dict"):
        del fn._config_dict


def aiter_mha_config(mod, dtype_name: str = "bf16") -> dict:
    """The launch config aiter's wrapper picks for MLA prefill (has_pe, no dropout)."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    _forget_config(mod)
    return dict(mod._get_config(False, dtype, has_pe=True))


def aiter_mha_variants(arch: str, peers: str | os.PathLike | None = None, heads=(16, 128)) -> list[TritonVariant]:
    """aiter's MHA forward as flash_attn_varlen_func launches it for MLA prefill (bf16, causal,
    varlen, Dqk 192 / Dv 128), one variant per head count (NUM_Q_HEADS is a constexpr), with the
    arch's config (MI300X for gfx942 and sm90, its AMD-only options dropped there; MI350X for gfx950).
    Raises when aiter cannot be loaded."""
    import torch

    config_arch = arch if arch in AITER_CONFIG_FILES else "gfx942"
    mod = load_aiter_mha_kernels(peers or aiter_peers_dir(), config_arch=config_arch)
    cfg = aiter_mha_config(mod)
    consts_cfg = {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "PRELOAD_V") if k in cfg}
    options = {k: v for k, v in cfg.items() if k not in consts_cfg}
    if not is_amd_arch(arch):
        options = without_amd_options(options)
    if options.get("num_ctas") == 1:
        del options["num_ctas"]  # the default; not every backend's options take it
    label = (
        f"M{cfg['BLOCK_M']} N{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg.get('num_stages', 1)}"
        + (f" wpe{cfg['waves_per_eu']}" if cfg.get("waves_per_eu") else "")
        + (" preload_v" if cfg.get("PRELOAD_V") else "")
    )
    out = []
    for n in heads:
        ptr = "*bf16"
        sig = {
            "q_ptr": ptr,
            "k_ptr": ptr,
            "v_ptr": ptr,
            "out_ptr": ptr,
            "softmax_lse_ptr": "*fp32",
            "cu_seqlens_q": "*i32",
            "cu_seqlens_k": "*i32",
            "sm_scale": "fp32",
            "dropout_p": "fp32",
            "SEQLEN_Q": "i32",
            "SEQLEN_K": "i32",
            "BATCH": "i32",
            "philox_seed": "i32",
            "philox_offset_base_in": "i32",
        }
        # Strides as the varlen launch passes them: (0, head, token, dim); dim strides are 1 and
        # lse's head stride is 1 ([T, N] buffer): Triton makes ints equal to 1 constexprs.
        ones = {"stride_qk_in": 1, "stride_kk_in": 1, "stride_vk_in": 1, "stride_on_in": 1, "stride_lse_h_in": 1}
        strides = [
            "stride_qz_in",
            "stride_qh_in",
            "stride_qm_in",
            "stride_kz_in",
            "stride_kh_in",
            "stride_kn_in",
            "stride_vz_in",
            "stride_vh_in",
            "stride_vn_in",
            "stride_descale_q_z_in",
            "stride_descale_k_z_in",
            "stride_descale_v_z_in",
            "stride_oz_in",
            "stride_oh_in",
            "stride_om_in",
            "stride_alibi_z_in",
            "stride_alibi_h_in",
            "stride_sd_z_in",
            "stride_sd_h_in",
            "stride_sd_m_in",
            "stride_sd_n_in",
            "stride_lse_z_in",
            "stride_lse_m_in",
        ]
        sig.update({s: "i32" for s in strides})
        nones = {
            k: None
            for k in (
                "descale_q_ptr",
                "descale_k_ptr",
                "descale_v_ptr",
                "alibi_slopes_ptr",
                "s_dmask_ptr",
                "dropout_mask_ptr",
            )
        }
        consts = {
            "IS_CAUSAL": True,
            "NUM_Q_HEADS": n,
            "NUM_K_HEADS": n,
            "BLOCK_DMODEL": V,
            "BLOCK_DMODEL_POW2": V,
            "BLOCK_DMODEL_PE": R,
            "RETURN_SCORES": False,
            "ENABLE_DROPOUT": False,
            "IS_FP8": False,
            "FP8_MAX": float(torch.finfo(torch.bfloat16).max),
            "VARLEN": True,
            "NUM_XCD": 8,
            "USE_INT64_STRIDES": True,
            **consts_cfg,
        }
        constexprs = {**nones, **ones, **consts}
        sig.update({k: "constexpr" for k in constexprs})
        # Zero strides and 16-multiples (N * 192, 192, N * 256, 256, 128, N * 128, N for N % 16 == 0).
        div16 = (
            "q_ptr",
            "k_ptr",
            "v_ptr",
            "out_ptr",
            "softmax_lse_ptr",
            "cu_seqlens_q",
            "cu_seqlens_k",
            "philox_seed",
            "philox_offset_base_in",
            *strides,
        )
        out.append(
            TritonVariant(
                kernel=AITER_KERNEL,
                config=f"mla_prefill peer: bf16 causal N={n} {label} ({AITER_CONFIG_FILES[config_arch]} cfg)",
                fn=mod._attn_fwd,
                signature=sig,
                constexprs=constexprs,
                options=options,
                divisible_by_16=div16,
                expects_mfma=True,
            )
        )
    return out


def aiter_decode_variants(arch: str, peers: str | os.PathLike | None = None, heads=(16, 128)) -> list[TritonVariant]:
    """aiter's Triton MLA decode stage 1 (``_fwd_grouped_kernel_stage1_rope``, what vLLM's ROCm
    Triton MLA path runs; rope off, bf16 q and cache) with its own config for the arch
    (``MI300X-MLA_DECODE_ROPE-DEFAULT.json``, AMD-only options dropped for sm90;
    ``MI350X-...`` for gfx950), one variant per
    head count (aiter makes it a constexpr). Raises when aiter cannot be loaded."""
    from benchutil import load_aiter_peer

    config_arch = arch if arch in AITER_CONFIG_FILES else "gfx942"
    mod = load_aiter_peer(
        str(peers or aiter_peers_dir()), "_triton_kernels.mla_decode_rope", config_arch=config_arch, raise_errors=True
    )
    _forget_config(mod)
    cfg = dict(mod._get_config()["fwd_grouped_kernel_stage1_rope"])
    options = {k: cfg.pop(k) for k in ("num_warps", "num_stages", *AMD_ONLY_OPTIONS) if k in cfg}
    if not is_amd_arch(arch):
        options = without_amd_options(options)
    sig = {
        "Q": "*bf16",
        "K_Buffer": "*bf16",
        "V_buffer": "*bf16",
        "cos_sin_cache": "*bf16",
        "positions": "*i64",
        "sm_scale": "fp32",
        "kv_indptr": "*i32",
        "kv_indices": "*i32",
        "Att_Out": "*fp32",
        "k_pe_t_out": "*bf16",
    }
    for name in (
        "stride_qb",
        "stride_qh",
        "stride_buf_kbs",
        "stride_buf_vbs",
        "stride_mid_ob",
        "stride_mid_oh",
        "stride_mid_os",
        "stride_kpe_tokens_out_b",
        "stride_cos_sin_cache_s",
        "stride_positions_b",
    ):
        sig[name] = "i32"
    label = " ".join(f"{k}={v}" for k, v in options.items())
    out = []
    for n in heads:
        consts = {
            "rotary_dim": 64,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "kv_group_num": n,
            "q_head_num": n,
            "batch": 128,
            "BLOCK_C": 512,
            "BLOCK_R": 64,
            "NUM_KV_SPLITS": 8,
            "logit_cap": 0.0,
            "USE_ROPE": False,
            "IS_NEOX_STYLE": False,
            **cfg,
        }
        sig_n = {**sig, **{k: "constexpr" for k in consts}}
        out.append(
            TritonVariant(
                kernel=AITER_DECODE_KERNEL,
                config=f"mla_decode peer: bf16 N={n} H{cfg.get('BLOCK_H')} N{cfg.get('BLOCK_N')} {label} "
                f"({AITER_CONFIG_FILES[config_arch]} cfg)",
                fn=mod._fwd_grouped_kernel_stage1_rope,
                signature=sig_n,
                constexprs=consts,
                options=options,
                expects_mfma=True,
                divisible_by_16=(
                    "Q",
                    "K_Buffer",
                    "V_buffer",
                    "Att_Out",
                    "stride_qb",
                    "stride_qh",
                    "stride_buf_kbs",
                    "stride_buf_vbs",
                ),
            )
        )
    return out
