"""What the ops look up: ``config_for(op, arch)``, the package's data for that arch with the user's
verified overlay for exactly that arch merged over it, and the one way a launch config is taken
out of it.

Every op's arch object has one shape, described in docs/tuning.md ("The per-arch launch data"):
``tiers`` (selected by ``tier_index`` or by ``geometry``; a tier's dtype objects applied by
``resolve_tier``), ``candidates`` (grids expanded by ``tables.expand_candidates``) and the op's
model parameters.

Caching: the resolved data is cached per (op, arch); ``reload_overlays()`` drops the cache (the
tuner calls it after writing, so a ``tune`` run and later calls in one process agree). A file
written by another process is seen by processes started after it (a serving process does not
change configs under its own feet). Set ``ROCM_MLA_CONFIG_DIR`` before the first op call, or call
``reload_overlays()`` after changing it.
"""

from __future__ import annotations

import contextlib
import functools
import types
import warnings
from collections.abc import Iterator
from typing import Any

from .overlay import (
    DTYPE_TAGS,
    SCHEMAS,
    OverlayError,
    OverlayParseError,
    OverlayStatus,
    OverlayWarning,
    device_compute_units,
    find_overlay,
    merge_overlay,
    overlay_dir,
    read_overlay,
    validate_overlay,
)
from .tables import package_config

# What config_for returns instead of the resolved data: overlays_disabled() and override() set it.
_STATE = types.SimpleNamespace(disabled=False, overrides={})


@functools.cache
def config_for(op: str, arch: str) -> dict[str, Any]:
    """Launch data of ``op`` on ``arch`` (``gfx942``, ``sm90``, ``cpu``, ...), cached.

    Returns the JSON object for that arch (see ``rocm_mla/configs/<op>.json`` for the fields), with
    the user's verified overlay for that arch merged over it (see ``rocm_mla.configs.overlay``). Callers
    must not modify it.
    """
    override = _STATE.overrides.get((op, arch))
    if override is not None:
        return override
    base = package_config(op, arch)
    if _STATE.disabled or op not in SCHEMAS:
        return base
    status = overlay_status(arch)
    if status.error is not None:
        _warn_once(status)
    elif status.data is not None and op in status.data:
        return merge_overlay(base, status.data[op][arch])
    return base


def tier_index(tiers: list[dict[str, Any]], rows: int) -> int:
    """Index of the tier (of tiers sorted by ``BLOCK_H``) that serves ``rows`` (mla_decode: a
    request's q_len x N query rows; mla_sparse_attention: N heads): the first whose BLOCK_H holds
    them all, else the last (several blocks of BLOCK_H rows)."""
    return next((i for i, t in enumerate(tiers) if t["BLOCK_H"] >= rows), len(tiers) - 1)


def resolve_tier(tier: dict[str, Any], tags: list[str]) -> dict[str, Any]:
    """The launch config of ``tier`` for a kind of call: its own fields (without the selection
    key ``geometry``), then those of each override object in ``tags`` (``DTYPE_TAGS``), in order."""
    cfg = {k: v for k, v in tier.items() if k not in DTYPE_TAGS and k != "geometry"}
    for tag in tags:
        cfg.update(tier.get(tag, {}))
    return cfg


def platform_fp8_dtype(arch: str):
    """The torch FP8 E4M3 dtype a plain "fp8" cache holds on ``arch`` (``platform.json``)."""
    import torch

    return getattr(torch, config_for("platform", arch)["fp8_dtype"])


@functools.cache
def overlay_status(arch: str) -> OverlayStatus:
    """The overlay the loader uses for ``arch`` on this machine (cached; ``reload_overlays()``)."""
    cus = device_compute_units(arch)
    st = OverlayStatus(arch, cus)
    if _STATE.disabled:
        return st
    try:
        st.path, st.searched = find_overlay(arch, cus)
        if st.path is None:
            return st
        data = read_overlay(st.path)
        errors = validate_overlay(data, arch, cus)
    except OverlayError as exc:
        st.error = exc
        return st
    except Exception as exc:  # e.g. a folder it may not read: never an error in the caller
        st.error = OverlayParseError(str(st.path or overlay_dir()), f"{type(exc).__name__}: {exc}")
        return st
    if errors:
        st.error = errors[0]
    else:
        st.data = data
    return st


_WARNED: set[tuple[str, str]] = set()


def _warn_once(st: OverlayStatus) -> None:
    key = (str(st.path), str(st.error))
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(
        f"rocm_mla: ignoring the config overlay {st.path} ({st.error.name}: {st.error}); using the package's launch "
        f"configs. `rocm-mla tune --check` explains it; ROCM_MLA_CONFIG_DIR= turns overlays off.",
        OverlayWarning,
        stacklevel=3,
    )


def reload_overlays() -> None:
    """Forget the cached overlay and resolved configs: the next ``config_for`` reads the overlay
    folder again (call after writing an overlay or changing ROCM_MLA_CONFIG_DIR in-process)."""
    overlay_status.cache_clear()
    config_for.cache_clear()


@contextlib.contextmanager
def overlays_disabled() -> Iterator[None]:
    """Within the block, ``config_for`` returns the package's data (what ``tune`` calls the
    default)."""
    prev = _STATE.disabled
    _STATE.disabled = True
    reload_overlays()
    try:
        yield
    finally:
        _STATE.disabled = prev
        reload_overlays()


@contextlib.contextmanager
def override(op: str, arch: str, obj: dict[str, Any]) -> Iterator[None]:
    """Within the block, ``config_for(op, arch)`` returns ``obj`` (a complete arch object): how the
    tuner times a candidate through the op's own public entry point."""
    key = (op, arch)
    prev = _STATE.overrides.get(key)
    _STATE.overrides[key] = obj
    config_for.cache_clear()
    try:
        yield
    finally:
        if prev is None:
            _STATE.overrides.pop(key, None)
        else:
            _STATE.overrides[key] = prev
        config_for.cache_clear()
