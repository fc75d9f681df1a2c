"""Per-arch launch data: one JSON file per op, keyed by arch (gfx942, gfx950, sm90, default), and
an optional user overlay that ``rocm-mla tune`` writes.

``config_for(op, arch)`` is the single entry point the ops use. The package is three modules, each
depending only on the ones before it:

* ``tables``: the package's JSON per op and the per-vendor arch selection (``package_config``,
  ``is_amd_arch``, ``is_nvidia_arch``, ``nvidia_sm``, ``wave_size``).
* ``overlay``: the user's tuned overlay: the schema of every op's fields, validation
  (``validate_overlay``, the ``OverlayError`` family), the verification stamp, the files, the merge.
* ``loader``: ``config_for`` (package data plus the verified overlay for exactly that arch, cached),
  the one shape of an op's arch object and its tiers' selection (``tier_index``, ``resolve_tier``),
  ``overlay_status``, ``reload_overlays``, ``overlays_disabled`` and ``override`` (the tuner's).

Every name below is importable from ``rocm_mla.configs``.
"""

from __future__ import annotations

from .loader import _WARNED as _WARNED  # the once-per-process warnings' memory (tests reset it)
from .loader import (
    config_for,
    overlay_status,
    overlays_disabled,
    override,
    platform_fp8_dtype,
    reload_overlays,
    resolve_tier,
    tier_index,
)
from .overlay import (
    AMD_OPTIONS,
    BACKENDS,
    DTYPE_TAGS,
    OVERLAY_ENV,
    OVERLAY_SCHEMA_VERSION,
    PREFILL_TMA_MODES,
    SCHEMAS,
    OverlayArchMismatch,
    OverlayCompileError,
    OverlayError,
    OverlayParseError,
    OverlayReferenceError,
    OverlayStale,
    OverlayStatus,
    OverlayTypeError,
    OverlayUnknownKey,
    OverlayUnverified,
    OverlayWarning,
    device_compute_units,
    find_overlay,
    merge_overlay,
    overlay_changes,
    overlay_digest,
    overlay_dir,
    overlay_filename,
    prefill_tma_mode,
    read_overlay,
    software_versions,
    stamp_overlay,
    stamp_problems,
    validate_overlay,
)
from .tables import (
    is_amd_arch,
    is_nvidia_arch,
    nvidia_sm,
    package_config,
    wave_size,
)

__all__ = [
    "AMD_OPTIONS",
    "BACKENDS",
    "DTYPE_TAGS",
    "OVERLAY_ENV",
    "OVERLAY_SCHEMA_VERSION",
    "PREFILL_TMA_MODES",
    "SCHEMAS",
    "OverlayArchMismatch",
    "OverlayCompileError",
    "OverlayError",
    "OverlayParseError",
    "OverlayReferenceError",
    "OverlayStale",
    "OverlayStatus",
    "OverlayTypeError",
    "OverlayUnknownKey",
    "OverlayUnverified",
    "OverlayWarning",
    "config_for",
    "device_compute_units",
    "find_overlay",
    "is_amd_arch",
    "is_nvidia_arch",
    "merge_overlay",
    "nvidia_sm",
    "overlay_changes",
    "overlay_digest",
    "overlay_dir",
    "overlay_filename",
    "overlay_status",
    "overlays_disabled",
    "override",
    "package_config",
    "platform_fp8_dtype",
    "prefill_tma_mode",
    "read_overlay",
    "reload_overlays",
    "resolve_tier",
    "software_versions",
    "stamp_overlay",
    "stamp_problems",
    "tier_index",
    "wave_size",
    "validate_overlay",
]
