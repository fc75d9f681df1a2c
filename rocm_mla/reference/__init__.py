"""Float32 PyTorch references of every op. Imports nothing of rocm_mla (the tests check them
against independent formulas, and every kernel against them)."""

from .merge import merge_attn_states_ref

__all__ = ["merge_attn_states_ref"]
