"""Peer kernels compiled beside ours in ``rocm-mla isa-report --peers DIR`` (not gated).

aiter is what vLLM's ROCm MLA backends run. Its Triton files come from the amd-aiter wheel,
unpacked by ``perf/peers/get_aiter_peers.sh DIR/aiter`` (never committed); its launch configs are
its own JSON files for the target (``MI300X-*.json`` for gfx942), read by aiter's own
``_get_config``. Each variant names the shape it is specialised for, since aiter makes the head
count and batch constexprs.

The rows are printed in a section of their own: a peer's spill or missing MFMA is information,
never a failure of this package's report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..ops._variants import TritonVariant

# The decode shapes the side-by-side is read at: TP8 (16 heads) and DP attention (128 heads).
DECODE_HEADS = (16, 128)


def aiter_decode_variants(peers: str | Path, arch: str) -> tuple[list[TritonVariant], str]:
    """aiter's Triton MLA decode stage 1 (``_fwd_grouped_kernel_stage1_rope``, rope off, bf16)
    with its own config for ``arch``; ``([], reason)`` when the peer cannot be loaded."""
    from .benchutil import load_aiter_peer

    aiter_dir = Path(peers) / "aiter"
    if load_aiter_peer(str(aiter_dir), "mla_decode_rope", config_arch=arch if arch.startswith("gfx") else "gfx942") \
            is None:
        return [], f"aiter peer not loadable from {aiter_dir} (perf/peers/get_aiter_peers.sh {aiter_dir})"
    from aiter.ops.triton._triton_kernels import mla_decode_rope as k

    cfg = dict(k._get_config()["fwd_grouped_kernel_stage1_rope"])
    options = {key: cfg.pop(key) for key in ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim",
                                             "kpack") if key in cfg}
    if not arch.startswith("gfx"):
        options = {key: v for key, v in options.items() if key in ("num_warps", "num_stages")}
    fn = _as_jit(k._fwd_grouped_kernel_stage1_rope)
    sig = {"Q": "*bf16", "K_Buffer": "*bf16", "V_buffer": "*bf16", "cos_sin_cache": "*bf16", "positions": "*i64",
           "sm_scale": "fp32", "kv_indptr": "*i32", "kv_indices": "*i32", "Att_Out": "*fp32", "k_pe_t_out": "*bf16"}
    for name in ("stride_qb", "stride_qh", "stride_buf_kbs", "stride_buf_vbs", "stride_mid_ob", "stride_mid_oh",
                 "stride_mid_os", "stride_kpe_tokens_out_b", "stride_cos_sin_cache_s", "stride_positions_b"):
        sig[name] = "i32"
    out = []
    for heads in DECODE_HEADS:
        consts = {"rotary_dim": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "kv_group_num": heads,
                  "q_head_num": heads, "batch": 128, "BLOCK_C": 512, "BLOCK_R": 64, "NUM_KV_SPLITS": 8,
                  "logit_cap": 0.0, "USE_ROPE": False, "IS_NEOX_STYLE": False, **cfg}
        label = (f"aiter {_version(aiter_dir)} N={heads} H{cfg.get('BLOCK_H')} N{cfg.get('BLOCK_N')} "
                 + " ".join(f"{key}={v}" for key, v in options.items()))
        out.append(TritonVariant(kernel="aiter_mla_decode_stage1", config=label, fn=fn, signature=sig,
                                 constexprs=consts, options=options, expects_mfma=True,
                                 divisible_by_16=("Q", "K_Buffer", "V_buffer", "Att_Out", "stride_qb", "stride_qh",
                                                  "stride_buf_kbs", "stride_buf_vbs")))
    return out, ""


def _as_jit(fn: Any) -> Any:
    from ._triton_compile import as_jit

    return as_jit(fn)


def _version(aiter_dir: Path) -> str:
    from .benchutil import aiter_peer_version

    return aiter_peer_version(str(aiter_dir)) or "?"


def peer_variants(peers: str | Path, arch: str) -> tuple[list[TritonVariant], list[str]]:
    """Every peer variant the report knows for ``arch``, and the reasons of those it could not
    list. (aiter's MHA prefill kernel joins here beside its decode.)"""
    variants, notes = [], []
    v, why = aiter_decode_variants(peers, arch)
    variants += v
    if why:
        notes.append(why)
    return variants, notes
