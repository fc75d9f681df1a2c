"""Public ops: validation, then dispatch to HIP, Triton or the float32 reference."""

from .merge import merge_attn_states

__all__ = ["merge_attn_states"]
