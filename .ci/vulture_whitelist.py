"""Names vulture (.ci/lint.sh's dead-code check) cannot see used: each group says who uses them.

Vulture reads this file as more source: a name mentioned here counts as used everywhere. ``_.x``
stands for an attribute or method ``x`` of any object. Add a name only with its group's reason; a
name that nothing uses is deleted from the code instead.
"""

# ruff: noqa: B018, F821

# The package's entry points (pyproject.toml [project.scripts], vllm.general_plugins).
main
register

# Python's protocols: a module's __getattr__ (PEP 562), pickle's __reduce_ex__ and its protocol
# argument, the class name a generated subclass reports.
__getattr__
_.__reduce_ex__
protocol
_.__qualname__

# pytest: a hook of conftest.py, a module's marks, an autouse fixture (requested by no test).
pytest_collection_modifyitems
pytestmark
_keep_interpreter_setting

# vLLM's attention-backend, metadata-builder and layer interface: vLLM calls or reads these by name
# on the classes rocm_mla.vllm registers, with arguments named as vLLM passes them.
_.supported_dtypes
_.get_supported_kernel_block_sizes
_.supports_compute_capability
capability
use_sparse
use_mla
use_mm_prefix
device_capability
_.get_impl_cls
_.get_metadata_cls
_.metadata_cls
_.supports_dcp
_.supports_draft_decode_metadata_update
_.update_draft_decode_metadata
skip_scale
_._build_req_id_per_token
_._fp8_kv_needs_view

# vLLM's DeepSeek-V4 layer and metadata attributes (rocm_mla.vllm.v4_layer sets the metadata's
# prefill window lists and the indexer op's forward for vLLM's CustomOp dispatch;
# tests/vllm_harness/v4_step.py gives a layer and its metadata what vLLM's forward_mqa reads).
_.prefill_swa_ragged_indptr
_.forward_cuda
_.forward_native
_.n_local_heads
_.nope_head_dim
_.rope_head_dim
_.window_size
_.max_image_tokens
_._wo_a_fp8_weight
_._has_kv_transfer
_.c128a_decode_topk_lens
_.c128a_global_decode_topk_indices
_.c128a_decode_topk_ragged_indices
_.c128a_decode_topk_ragged_indptr
_.c128a_prefill_topk_indices
_.is_kv_source
_.compressed_cache_prefix
_._index_source_prefix
_._static_forward_context
# perf/bench_v4_layer.py answers the has_cutedsl() that vLLM's V4 prefill gather reads from its module.
_.has_cutedsl

# Stand-ins for vLLM and torch objects in tests/vllm_harness, the vLLM tests and perf/bench_v4.py's
# CPU run: a platform, a compiler pass, a communicator, a layer's attributes, a tensor's is_cpu and the
# helpers they replace, all read by vLLM or torch by name, with vLLM's argument names.
_.is_pin_memory_available
device_id
_.uuid
_.is_cpu
_.get_device_communicator_cls
_.use_custom_op_collectives
_._k_scale_float
_.chunked_prefill_workspace_size
_._compute_prefill_context
_._run_in_subprocess
_._trace_fn
pcp_shard_decode_requests

# Attributes set on a peer's or a library's module for its own code to read (perf/: aiter's arch
# query, the vLLM peers' fp8 kind; tests/vllm_harness: vLLM's shared-memory query).
_.FP8_DTYPE
_.get_arch
_.is_hip
_.get_max_shared_memory_per_block_device_attribute

# Callback arguments named by their caller's signature (triton.set_allocator's allocator).
alignment

# Called through a string: a bench case's variant methods (perf/bench_layer.py ROPE_KV_VARIANTS),
# the peer builders the ISA report looks up in perf/peer_variants.py.
_.nopass
aiter_mha_variants

# A dataclass field read only through dataclasses.asdict (the ISA report's --json rows).
_.source

# Pending: an unused parameter in a file another change is rewriting (perf/bench_prefill.py
# sdpa's out_view); delete the parameter there, then this entry.
out_view

# sm90.SassLoop's fields, read by name from a row's sass_loop dict (perf/profile_indexer_loop.py).
_.global_loads
_.predicated
