"""mla_v4_attention: the Triton variants the op can launch, for the ISA report.

Constexprs and options come from ``rocm_mla.ops.v4_attention_plan.triton_meta`` (the function the
plan takes a launch's from), the config from ``tier_config`` (the plan's choice) and each cache's
kind from ``cache_kind`` (vLLM's writers' kinds: the window cache e4m3fnuz on gfx942, e4m3fn
elsewhere; the compressed cache e4m3fn). The split reduce is mla_decode's kernel with the sink and
the inverse RoPE on (``HAS_SINK`` / ``ROPE``), its tiles from ``reduce_meta`` as the plan takes them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..configs import config_for
from ..kernels.latent_core import mla_decode_reduce_kernel
from ..kernels.v4_attention import mla_v4_attention_kernel
from ..ops._checks import Checker
from ..ops.decode_plan import REDUCE_ARGS, argument_types
from ..ops.latent_core import reduce_meta
from ..ops.v4_attention_plan import OP, cache_kind, tier_config, triton_meta
from ..triton_common import amd_options, triton_type
from .triton_variant import TritonVariant

# Counts the kernel does not specialise (do_not_specialize) and the strides that vary per call.
_I32 = (
    "num_rows", "num_heads", "num_splits", "split_len", "num_head_blocks", "w_nnz", "w_block", "w_slots", "c_nnz",
    "c_block", "c_slots", "num_pos", "s_q_r", "s_q_h", "s_w_blk", "s_w_tok", "s_wi_r", "s_c_blk", "s_c_tok", "s_ci_r",
    "s_cs", "s_o_r", "s_o_h", "s_l_r", "s_po_s", "s_pl_s",
)  # fmt: skip
# Inner strides are 1 on real tensors (Triton specialises ints equal to 1): q's, out's and lse's
# last, and positions' ([T], stride 1, as vLLM passes them).
_ONES = {"s_q_d": 1, "s_o_d": 1, "s_l_h": 1, "s_pos": 1}
# Aligned pointers and the strides that are multiples of 16 in serving (the token strides: see
# ``variant``).
_DIV16 = (
    "q", "w_cache", "w_idx", "w_indptr", "c_cache", "c_idx", "c_indptr", "sink", "positions", "cos_sin", "out", "lse",
    "part_o", "part_lse", "s_q_r", "s_q_h", "s_w_blk", "s_wi_r", "s_c_blk", "s_ci_r", "s_cs", "s_o_r", "s_o_h",
    "s_po_s", "s_pl_s",
)  # fmt: skip


def _fp8_kind(arch: str, q_dtype: torch.dtype, window: bool) -> torch.dtype:
    """The e4m3 kind the plan reads an ``fp8_ds_mla`` cache as on ``arch`` (``cache_kind``)."""
    return cache_kind(Checker(OP), "window" if window else "compressed", torch.uint8, "fp8_ds_mla", q_dtype, arch,
                      window)  # fmt: skip


def _kind_name(kind: torch.dtype | None) -> str:
    if kind is None:
        return "-"
    return {torch.float8_e4m3fn: "e4m3fn", torch.float8_e4m3fnuz: "e4m3fnuz"}.get(kind) or triton_type(kind)


def _cache_type(kind: torch.dtype) -> str:
    """The cache tensor's Triton type: uint8 storage for fp8_ds_mla, else the dtype."""
    return "u8" if kind in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) else triton_type(kind)


def variant(
    arch: str,
    cfg: dict[str, Any],
    q_dtype: torch.dtype,
    window_kind: torch.dtype,
    compressed_kind: torch.dtype | None,
    *,
    direct: bool,
    ragged: bool = False,
    has_sink: bool = True,
    inverse_rope: bool = True,
    tag: str = "",
) -> TritonVariant:
    """One launch of the kernel as the plan makes it (``triton_meta``), described for the AOT compile:
    ``ragged`` both lists as indices + indptr; positions int64 and cos_sin float32 (vLLM's)."""
    qname = triton_type(q_dtype)
    wtype = _cache_type(window_kind)
    ctype = wtype if compressed_kind is None else _cache_type(compressed_kind)
    sig = {
        "q": f"*{qname}",
        "w_cache": f"*{wtype}",
        "w_idx": "*i32",
        "w_indptr": "*i32",
        "c_cache": f"*{ctype}",
        "c_idx": "*i32",
        "c_indptr": "*i32",
        "sink": "*fp32",
        "positions": "*i64",
        "cos_sin": "*fp32",
        "out": f"*{qname}",
        "lse": "*fp32",
        "part_o": "*fp32",
        "part_lse": "*fp32",
        "qk_scale": "fp32",
        **{n: "i32" for n in _I32},
    }
    ones = dict(_ONES)
    if not inverse_rope:  # no positions: the launch passes stride 0
        del ones["s_pos"]
        sig["s_pos"] = "i32"
    meta, options = triton_meta(
        arch, cfg, q_dtype, window_kind, compressed_kind, window_ragged=ragged, compressed_ragged=ragged,
        has_sink=has_sink, inverse_rope=inverse_rope, direct=direct,
    )  # fmt: skip
    # A 16-bit cache's token stride (512 values) is a multiple of 16; fp8_ds_mla's (584 bytes) is not.
    div16 = list(_DIV16) + [n for n, t in (("s_w_tok", wtype), ("s_c_tok", ctype)) if t != "u8"]
    div16 += [] if inverse_rope else ["s_pos"]
    amd = "".join(f" {k[:4]}{v}" for k, v in amd_options(cfg, arch).items())
    lists = "ragged" if ragged else "dense"
    label = (
        f"{tag}q={qname} w={_kind_name(window_kind)} c={_kind_name(compressed_kind)} H{meta['BLOCK_H']}"
        f" N{meta['BLOCK_N']} w{options['num_warps']} s{options['num_stages']}{amd} {lists}"
        f"{' sink' if has_sink else ''}{' rope' if inverse_rope else ''} {'direct' if direct else 'split'}"
    )
    return TritonVariant(
        kernel=OP,
        config=label,
        fn=mla_v4_attention_kernel,
        signature=sig,
        constexprs={**ones, **meta},
        options=options,
        # float32 q runs IEEE dots: MFMA has f32 instructions, NVIDIA tensor cores do not.
        expects_mfma=q_dtype != torch.float32 or arch.startswith("gfx"),
        divisible_by_16=tuple(div16),
    )


def reduce_variants(arch: str) -> list[TritonVariant]:
    """The shared split-K reduce as mla_v4_attention launches it: each tile ``reduce_meta`` gives
    the split counts a plan can take (2 .. 64 and the op's max_splits), for each output dtype, with
    the sink and the inverse RoPE on (positions int64, cos_sin float32); the largest tile also
    with the sink alone and with the rotation alone (bf16 out)."""
    max_splits = int(config_for(OP, arch)["split"]["max_splits"])
    metas: dict[tuple[int, int], tuple[dict, dict]] = {}
    # num_splits= may ask for more than the model's max_splits: the tiles up to 64 splits too.
    for s in sorted({1 << i for i in range(1, 7)} | {max_splits}):
        consts, options = reduce_meta(s, arch)
        metas.setdefault((consts["BLOCK_S"], consts["BLOCK_D"]), (consts, options))
    out = []
    largest = max(metas)
    for qdt in (torch.bfloat16, torch.float16, torch.float32):
        oname = triton_type(qdt)
        for key, (consts, options) in sorted(metas.items()):
            combos = [(True, True)]
            if qdt == torch.bfloat16 and key == largest:
                combos += [(True, False), (False, True)]
            for sink, rope in combos:
                sig, ones, div16 = argument_types(REDUCE_ARGS, {"q": oname})
                sig["positions"] = "*i64"  # vLLM's positions
                out.append(
                    TritonVariant(
                        kernel="mla_decode_reduce",
                        config=f"mla_v4 out={oname} S{key[0]} D{key[1]} w{options['num_warps']}"
                        f"{' sink' if sink else ''}{' rope' if rope else ''}",
                        fn=mla_decode_reduce_kernel,
                        signature=sig,
                        constexprs={"INVARIANT": False, **consts, **ones, "HAS_SINK": sink, "ROPE": rope},
                        options=options,
                        divisible_by_16=div16,
                    )
                )
    return out


def triton_variants(arch: str) -> list[TritonVariant]:
    """What the op launches on ``arch``, each tier direct and split: bf16 q over fp8_ds_mla caches
    (the window cache's kind and the compressed cache's, as vLLM writes them) with dense lists, with
    ragged lists, and window-only; bf16 q over bf16 caches; fp16 q over fp8_ds_mla caches; float32 q
    over fp8_ds_mla and float32 caches (its ``fp32`` config; tiers that resolve alike listed once);
    each with the sink and the inverse RoPE; the first tier once without either (direct); then the
    split reduce (:func:`reduce_variants`)."""
    out: list[TritonVariant] = []
    seen: set[str] = set()

    def add(v: TritonVariant) -> None:
        if v.config not in seen:
            seen.add(v.config)
            out.append(v)

    tiers = config_for(OP, arch)["tiers"]
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    for i, tier in enumerate(tiers):
        heads = int(tier["BLOCK_H"])
        for qdt in (bf16, f16, f32):
            cfg = tier_config(arch, heads, qdt)
            w8, c8 = _fp8_kind(arch, qdt, True), _fp8_kind(arch, qdt, False)
            runs: list[tuple[torch.dtype, torch.dtype | None, dict]] = [(w8, c8, {})]
            if qdt == bf16:
                runs += [(w8, c8, {"ragged": True}), (w8, None, {}), (bf16, bf16, {})]
            elif qdt == f32:
                runs += [(f32, f32, {})]
            for wk, ck, kw in runs:
                for direct in (True, False):
                    add(variant(arch, cfg, qdt, wk, ck, direct=direct, **kw))
        if i == 0:
            cfg = tier_config(arch, heads, bf16)
            w8, c8 = _fp8_kind(arch, bf16, True), _fp8_kind(arch, bf16, False)
            add(variant(arch, cfg, bf16, w8, c8, direct=True, has_sink=False, inverse_rope=False))
    for v in reduce_variants(arch):
        add(v)
    return out
