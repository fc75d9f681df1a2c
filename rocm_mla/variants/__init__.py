"""What the package can launch, described for ahead-of-time compilation.

One module per op (``decode``, ``prefill``, ``merge``, ``rope_kv_write``, ``context_gather``, ``sparse``,
``indexer_cache``, ``indexer_topk``, ``v4_attention``) exposes
``triton_variants(arch) -> list[TritonVariant]``, listing each (kernel, specialisation, launch
options) its wrapper can choose on ``arch``, built by the op's own meta function (the one its
launch calls). The ISA report (``rocm_mla.tools.isa_report``) compiles exactly these, so what it
reports is what runs.

Imports go one way: ``variants.<op>`` imports ``ops.<op>``; no op imports this package.
"""

from __future__ import annotations

from . import context_gather, decode, indexer_cache, indexer_topk, merge, prefill, rope_kv_write, sparse, v4_attention
from .triton_variant import TritonVariant


def all_triton_variants(arch: str) -> list[TritonVariant]:
    """Every Triton variant of every op on ``arch`` (``"gfx942"``, ``"gfx950"``, ``"sm90"``)."""
    out: list[TritonVariant] = []
    ops = (merge, prefill, decode, rope_kv_write, context_gather, sparse, indexer_cache, indexer_topk, v4_attention)
    for mod in ops:
        out.extend(mod.triton_variants(arch))
    return out


__all__ = ["TritonVariant", "all_triton_variants"]
