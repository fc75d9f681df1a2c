"""``@triton.jit`` kernel bodies. Only the wrappers in ``rocm_mla.ops`` launch them."""
