"""rocm-mla: MLA (DeepSeek Multi-head Latent Attention) kernels for AMD MI300 (gfx942), in HIP and
Triton, that write their outputs in place.

Public API (see each function's docstring for shapes and layouts):
    merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None)

The ops are imported lazily: ``rocm_mla.tools`` can set TRITON_INTERPRET (which Triton reads when a
kernel is decorated) before any kernel module loads.
"""

__version__ = "0.1.0"

__all__ = ["merge_attn_states", "__version__"]


def __getattr__(name):
    if name in __all__:
        from . import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'rocm_mla' has no attribute {name!r}")
