"""``@triton.jit`` kernel bodies. Only the wrappers in ``rocm_mla.ops`` launch them."""

from .._triton_interpreter import install as _scope_interpreter_calls

# Under TRITON_INTERPRET=1 an interpreted call of a @triton.jit helper (tl.cdiv, tl.max, ...) would
# otherwise leave triton.language patched and break any later ahead-of-time compile in the process.
_scope_interpreter_calls()
