"""vLLM integration (0.34 and 0.33): the ``ROCM_MLA`` attention backend and the ``ROCM_MLA`` MLA prefill backend.

Users install rocm-mla next to vLLM and run::

    vllm serve deepseek-ai/DeepSeek-V3 --attention-backend ROCM_MLA

vLLM finds this package through the ``vllm.general_plugins`` entry point ``rocm_mla`` (see
pyproject.toml) and calls :func:`register` in every process it starts: the API server
(``EngineArgs.__post_init__`` / ``AsyncEngineArgs.add_cli_args``), the engine core
(``EngineCore.__init__``) and each worker (``WorkerWrapperBase``). ``VLLM_PLUGINS``, when set, is an
allow-list of entry-point names: it must then contain ``rocm_mla``.

Importing this module does not import vLLM (only :func:`register` and ``rocm_mla.vllm.backend`` do),
so ``import rocm_mla`` stays free of vLLM, as the package layering requires.

What :func:`register` does, and why (vllm/v1/attention/backends/registry.py):

* ``register_backend("ROCM_MLA", path)`` adds a new member to ``AttentionBackendEnum``
  (``AttentionBackendEnum.register``). ``--attention-backend ROCM_MLA`` and
  ``-ac.backend=ROCM_MLA`` then parse, because vLLM turns the string into the enum with
  ``AttentionBackendEnum[name]`` (``AttentionConfig.validate_backend_before``) after loading the
  general plugins. ``register_backend`` with a string raises if the name exists, so a second call
  (vLLM loads plugins once per process, but tests and users may call again) overrides the
  existing member instead: :func:`register` is re-entrant.
* Enum members pickle by *value* (``Enum.__reduce_ex__``), and a dynamically added member's value
  exists only in processes that ran :func:`register`. vLLM ships its ``VllmConfig`` to the engine
  core and the workers as ``multiprocessing`` arguments; with the ``spawn`` start method (forced by
  vLLM when CUDA/HIP is already initialised, under Ray, or with ``--numa-bind``) the child unpickles
  the config *before* it loads any plugin, and ``AttentionBackendEnum('rocm_mla....')`` would fail.
  So the member pickles by name through :func:`_restore_member`, which registers first. (With
  ``fork`` the child inherits the registration and nothing is unpickled.)
* ``AttentionBackendEnum.CUSTOM`` is pointed at the same class unless another plugin already
  claimed it, so ``--attention-backend CUSTOM`` works too.
* ``register_backend("ROCM_MLA_SPARSE", path)`` the same for the sparse MLA backend
  (DeepSeek-V3.2, GLM-5.x: ``rocm_mla.vllm.sparse_backend``), which vLLM's selector picks for
  sparse layers where it runs. On ROCm those models' attention class bypasses the selector:
  ``sparse_layer.install()`` puts a subclass in its place that runs rocm_mla's sparse backend and
  indexer when the user selected ROCM_MLA or ROCM_MLA_SPARSE, vLLM's own layer otherwise.
* ``v4_layer.install()`` the same for DeepSeek-V4 and V4.1, whose ROCm attention classes never
  consult the selector either: with ROCM_MLA selected their layers run ``mla_v4_attention`` and
  their CSA indexer ``mla_indexer_topk``, and V4.1's backend check accepts the name.
* ``register_mla_prefill_backend("ROCM_MLA", ...)`` adds rocm_mla's varlen prefill to vLLM's MLA
  prefill registry (``-ac.mla_prefill_backend=ROCM_MLA``): any MLA decode backend can then run its
  prefill on it, and it is the prefill object ROCM_MLA layers hold (see backend.py).
* ``fused_rope_kv_op.install()`` (CUDA/ROCm platforms only) imports vLLM's
  ``mla_rope_kvcache_cat_fusion`` module and registers rocm_mla's kernel for its op
  ``torch.ops.vllm.fused_rope_unified_mla_kv_cache_update``, which the ``fuse_rope_kvcache_cat_mla``
  compile pass puts in place of RoPE + KV write: ROCM_MLA layers then run
  ``rocm_mla.fused_rope_mla_kv_write``, other layers vLLM's kernel. If vLLM's module cannot be
  imported, vLLM keeps its kernel (a warning says why).
"""

from __future__ import annotations

import logging

BACKEND_NAME = "ROCM_MLA"
BACKEND_CLASS = "rocm_mla.vllm.backend.RocmMLABackend"
SPARSE_BACKEND_NAME = "ROCM_MLA_SPARSE"
SPARSE_BACKEND_CLASS = "rocm_mla.vllm.sparse_backend.RocmMLASparseBackend"
PREFILL_BACKEND_NAME = "ROCM_MLA"
PREFILL_BACKEND_CLASS = "rocm_mla.vllm.prefill.RocmMLAPrefillBackend"
PLUGIN_NAME = "rocm_mla"  # the entry-point name VLLM_PLUGINS must list when it is set
# The vLLM releases the backends are written and tested against.
SUPPORTED_VLLM = ("0.34.0", "0.33.0")

__all__ = [
    "BACKEND_NAME",
    "BACKEND_CLASS",
    "SPARSE_BACKEND_NAME",
    "SPARSE_BACKEND_CLASS",
    "PREFILL_BACKEND_NAME",
    "PREFILL_BACKEND_CLASS",
    "PLUGIN_NAME",
    "SUPPORTED_VLLM",
    "register",
]

logger = logging.getLogger(__name__)


def register() -> None:
    """Register ROCM_MLA with vLLM's attention-backend and MLA-prefill registries (re-entrant).

    The ``vllm.general_plugins`` entry point of this package; safe to call any number of times,
    in any process. Requires vLLM 0.33 or 0.34 (``register_backend`` accepting a new name).
    """
    from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum, register_mla_prefill_backend
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for name, path in ((BACKEND_NAME, BACKEND_CLASS), (SPARSE_BACKEND_NAME, SPARSE_BACKEND_CLASS)):
        _add(AttentionBackendEnum, register_backend, name, path, "attention")

    custom = AttentionBackendEnum.CUSTOM
    if not custom.is_overridden() or custom.get_path() == BACKEND_CLASS:
        register_backend(custom, BACKEND_CLASS)
    else:
        logger.info(
            "rocm_mla: AttentionBackendEnum.CUSTOM is already %s; use --attention-backend %s for rocm_mla",
            custom.get_path(),
            BACKEND_NAME,
        )

    prefill = (PREFILL_BACKEND_NAME, PREFILL_BACKEND_CLASS)
    _add(MLAPrefillBackendEnum, register_mla_prefill_backend, *prefill, "mla_prefill")

    # vLLM's fused RoPE + MLA KV-cache op (the fuse_rope_kvcache_cat_mla pass) on rocm_mla's
    # kernel for ROCM_MLA layers; vLLM's kernel for every other layer (fused_rope_kv_op.py).
    from . import fused_rope_kv_op

    fused_rope_kv_op.install()

    # DeepSeek-V3.2 / GLM-5.x on ROCm: vLLM's attention class names aiter's sparse backend itself;
    # its layers take rocm_mla's when the user selected ROCM_MLA or ROCM_MLA_SPARSE
    # (sparse_layer.py), vLLM's own otherwise.
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        from . import sparse_layer, v4_layer

        sparse_layer.install()
        # DeepSeek-V4 / V4.1 on ROCm: the same switch routes their attention and CSA indexer to
        # rocm_mla (v4_layer.py) and lets V4.1's backend check accept it.
        v4_layer.install()


def _add(enum_cls, register_fn, name: str, path: str, kind: str) -> None:
    """``name`` -> ``path`` in one of vLLM's registries (``register_fn`` of ``enum_cls``), its
    member pickled by name."""
    # Already a member (an earlier call, or a future vLLM that names it): point it at us.
    register_fn(enum_cls[name] if name in enum_cls.__members__ else name, path)
    _pickle_by_name(enum_cls[name], kind)


def _restore_member(kind: str, name: str):
    """Unpickle hook of the members added by :func:`register`: register (a no-op when already
    done in this process), then return the member by name."""
    register()
    if kind == "attention":
        from vllm.v1.attention.backends.registry import AttentionBackendEnum as enum_cls
    else:
        from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum as enum_cls
    return enum_cls[name]


def _pickle_by_name(member, kind: str) -> None:
    # pickle looks __reduce_ex__ up on the object first, so an instance attribute takes precedence
    # over Enum.__reduce_ex__ (by value); deepcopy keeps using Enum.__deepcopy__ (returns self).
    name = member.name
    member.__reduce_ex__ = lambda protocol: (_restore_member, (kind, name))
