"""The user's tuned overlay: its files, schema, validation, stamp and merge over the package's data
(``rocm-mla tune`` writes it; where it lives, its format and how it merges: docs/tuning.md, "Where
it goes"). In an overlay folder a device's file is ``<arch>-<CUs>cu.json``, else ``<arch>.json``.

Trust: an overlay is used only when it is well formed (known ops, fields and types), names the
arch (and CU count) of the device, and carries the stamp that ``rocm-mla tune`` (or
``rocm-mla tune --check --stamp``) writes after compiling every config in it and checking it
against the float32 reference: ``_meta.verified`` = the digest of its content plus the rocm_mla
and Triton versions it was checked with. An edited or stale overlay could fail to compile or be
wrong, and nothing here can tell without running it: ``configs.loader`` ignores such a file, with
one ``OverlayWarning`` per process, and uses the package's data. Nothing here raises on a bad file.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .tables import arch_objects, is_amd_arch, is_nvidia_arch

OVERLAY_SCHEMA_VERSION = 1
OVERLAY_ENV = "ROCM_MLA_CONFIG_DIR"


# --------------------------------------------------------------------------- overlay schema

INT, BOOL, NUM, STR, BACKEND = "int", "bool", "number", "str", "backend"
TMA = "tma"  # mla_prefill's "tma": one of PREFILL_TMA_MODES
# mla_prefill's "tma" values -> the kernel's USE_TMA: off, per-program descriptors, host descriptors.
PREFILL_TMA_MODES = {False: 0, True: 1, "host": 2}
BACKENDS = ("hip", "triton", "reference")  # every op's implementations (ops/_dispatch.py selects one)
# Launch/compile options only AMD's Triton backend takes (triton_common.AMD_ONLY_OPTIONS is this
# list); absent, 0 and "none" all mean the backend's default.
AMD_OPTIONS = {"waves_per_eu": INT, "matrix_instr_nonkdim": INT, "kpack": INT, "schedule_hint": STR}


def prefill_tma_mode(value: Any) -> int | None:
    """mla_prefill's USE_TMA for a config's "tma" value (PREFILL_TMA_MODES), None for anything else.
    By type for the booleans: 0 and 1 are not false and true here."""
    return PREFILL_TMA_MODES[value] if isinstance(value, bool) or value == "host" else None


_SPARSE_FIELDS = {
    "BLOCK_H": INT,
    "BLOCK_N": INT,
    "D_SPLIT": INT,
    "F16_DOT": BOOL,
    "RELOAD_K": BOOL,
    "num_warps": INT,
    "num_stages": INT,
    "ctas_per_cu": INT,
    **AMD_OPTIONS,
}
_DECODE_FIELDS = {
    **_SPARSE_FIELDS,
    "V_SPLIT": INT,
    "CLAMP_PAGES": BOOL,
    "SPLIT_RUNS": BOOL,
    "invariant_split_tokens": INT,
}
# A tier's override objects for one kind of call, in the order they apply (loader.resolve_tier):
# "fp8" an fp8 cache, "fp8+qk" / "fp8+all" mla_decode(fp8_dots="qk" / "all") ("all" applies both),
# "fp32" float32 q (or prefill inputs), "fp16+fp8" float16 q over an fp8 cache. mla_decode's tiers
# take all of them, mla_sparse_attention's "fp8" and "fp32", mla_prefill's and mla_v4_attention's "fp32".
DTYPE_TAGS = ("fp8", "fp8+qk", "fp8+all", "fp32", "fp16+fp8")
_DECODE_TIER = {**_DECODE_FIELDS, **{tag: _DECODE_FIELDS for tag in DTYPE_TAGS}}
_SPARSE_TIER = {**_SPARSE_FIELDS, "fp8": _SPARSE_FIELDS, "fp32": _SPARSE_FIELDS}
_V4_FIELDS = {"BLOCK_H": INT, "BLOCK_N": INT, "num_warps": INT, "num_stages": INT, "ctas_per_cu": INT, **AMD_OPTIONS}
_V4_TIER = {**_V4_FIELDS, "fp32": _V4_FIELDS}
_SPLIT_MODEL = {"min_tokens_per_split": INT, "max_splits": INT, "fixed_tiles": NUM, "launch_tiles": NUM}
_PREFILL = {
    "BLOCK_M": INT,
    "BLOCK_N": INT,
    "num_warps": INT,
    "num_stages": INT,
    "diag_stages": INT,
    "tma": TMA,
    "head_group": INT,
    "head_group_kv_bytes": INT,
    **AMD_OPTIONS,
}
_PREFILL_TIER = {**_PREFILL, "geometry": STR, "fp32": _PREFILL}
_INDEXER_TIER = {
    "split_keys": INT,
    "BLOCK_N": INT,
    "num_warps": INT,
    "num_stages": INT,
    "key_streams": INT,
    "programs_per_cu": INT,
    "merge": {"chunk": INT, "num_warps": INT, "keys_per_thread": INT},
    "direct": BOOL,
    "select_pack": INT,
    "maxnreg": INT,
    "many_items": {"select_pack": INT, "maxnreg": INT, "programs_per_cu": INT},
    "prefilter": {"split_keys": INT},
    **AMD_OPTIONS,
}


def _tiers(tier: dict[str, Any]) -> dict[str, Any]:
    """The ``tiers`` and ``candidates`` fields of an arch object whose launch configs are ``tier``."""
    return {"tiers": [tier], "candidates": [tier]}


# The fields an overlay may set, per op (the arch objects of configs/<op>.json), where the package's
# JSON cannot say them: a backend, a number that may be fractional, a field no arch sets. Every
# field of the JSON is accepted too, with the type it has there: see _schema().
SCHEMAS: dict[str, dict[str, Any]] = {
    "mla_decode": {"backend_order": [BACKEND], "split": _SPLIT_MODEL, **_tiers(_DECODE_TIER)},
    "mla_sparse_attention": {"backend_order": [BACKEND], "split": _SPLIT_MODEL, **_tiers(_SPARSE_TIER)},
    "mla_v4_attention": {"backend_order": [BACKEND], "split": _SPLIT_MODEL, **_tiers(_V4_TIER)},
    "mla_indexer_topk": {"backend_order": [BACKEND], **_tiers(_INDEXER_TIER)},
    "mla_prefill": {"backend_order": [BACKEND], **_tiers(_PREFILL_TIER)},
    "merge_attn_states": {"backend_order": [BACKEND]},
    "rope_kv_write": {"backend_order": [BACKEND]},
}


def _infer(value: Any) -> Any:
    """The schema of a value of the package's JSON (a list's: every element's, united)."""
    if isinstance(value, dict):
        return {k: _infer(v) for k, v in value.items()}
    if isinstance(value, list):
        return [functools.reduce(_union, map(_infer, value)) if value else STR]
    # bool before int: a bool is an int to isinstance
    return next((kind for t, kind in ((bool, BOOL), (int, INT), (float, NUM)) if isinstance(value, t)), STR)


def _union(a: Any, b: Any) -> Any:
    """Schema that accepts what ``a`` accepts and the fields ``b`` adds (``a`` wins on types)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _union(out[k], v) if k in out else v
        return out
    if isinstance(a, list) and isinstance(b, list):
        return [_union(a[0], b[0])]
    if isinstance(a, str) and isinstance(b, str) and {a, b} == {INT, NUM}:
        return NUM
    return a


@functools.cache
def _schema(op: str) -> dict[str, Any]:
    """What an overlay's object for ``op`` may hold: ``SCHEMAS[op]`` and every arch object's fields."""
    return functools.reduce(_union, map(_infer, arch_objects(op)), SCHEMAS[op])


@functools.cache
def _required_list_fields(op: str) -> dict[str, frozenset[str]]:
    """Per list of objects (by path in the arch object: ``tiers``, ``hip.tiers``, ...): the
    fields every element of the package's lists has (an overlay's list replaces the package's
    whole, so its elements must be complete). ``candidates`` share their ``tiers``' entry (the
    same shape)."""
    out: dict[str, frozenset[str]] = {}

    def walk(obj: dict[str, Any], path: str) -> None:
        for name, val in obj.items():
            where = f"{path}{'tiers' if name == 'candidates' else name}"
            if isinstance(val, dict):
                walk(val, f"{where}.")
            elif isinstance(val, list) and val and all(isinstance(v, dict) for v in val):
                common = frozenset.intersection(*(frozenset(v) for v in val))
                out[where] = out[where] & common if where in out else common

    for obj in arch_objects(op):
        walk(obj, "")
    return out


# --------------------------------------------------------------------------- overlay errors


class OverlayError(ValueError):
    """A user overlay that cannot be used; the subclass names what is wrong."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}" if where else what)
        self.where, self.what = where, what

    @property
    def name(self) -> str:
        return type(self).__name__


class OverlayParseError(OverlayError):
    """Not readable, not JSON, or not a JSON object."""


class OverlayUnknownKey(OverlayError):
    """An op, arch or field name the configs' schema does not have."""


class OverlayTypeError(OverlayError):
    """A field of the wrong type (or an empty list, a negative count, an unknown backend)."""


class OverlayArchMismatch(OverlayError):
    """The overlay is for another arch or another CU count than the device's."""


class OverlayUnverified(OverlayError):
    """No verification stamp, or the content changed after it was verified."""


class OverlayStale(OverlayError):
    """Verified with another rocm_mla or Triton version: re-check before it is used."""


class OverlayCompileError(OverlayError):
    """A config of the overlay fails to compile or launch (``rocm-mla tune --check``)."""


class OverlayReferenceError(OverlayError):
    """A config of the overlay gives results that differ from the float32 reference."""


class OverlayWarning(UserWarning):
    """Issued once per process per ignored overlay file."""


# --------------------------------------------------------------------------- overlay validation

_MAY_BE_EMPTY = frozenset({"candidates"})  # list fields an overlay may empty (the others are needed)
# A scalar schema's test and what the error says it expected.
_SCALARS = {
    INT: (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative integer"),
    BOOL: (lambda v: isinstance(v, bool), "true or false"),
    NUM: (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
        "a non-negative number",
    ),
    BACKEND: (lambda v: v in BACKENDS, f"one of {', '.join(BACKENDS)}"),
    TMA: (lambda v: prefill_tma_mode(v) is not None, 'true, false or "host"'),
    STR: (lambda v: isinstance(v, str), "a string"),
}


def _check_value(
    where: str,
    value: Any,
    schema: Any,
    required: dict[str, frozenset[str]],
    errors: list[OverlayError],
    path: str = "",
) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            errors.append(OverlayTypeError(where, f"expected an object, got {type(value).__name__}"))
            return
        for k, v in value.items():
            if k not in schema:
                errors.append(OverlayUnknownKey(f"{where}.{k}", f"unknown field (known: {', '.join(sorted(schema))})"))
                continue
            _check_value(f"{where}.{k}", v, schema[k], required, errors, f"{path}.{k}" if path else k)
        return
    if isinstance(schema, list):
        if not isinstance(value, list) or not (value or path.rpartition(".")[2] in _MAY_BE_EMPTY):
            errors.append(OverlayTypeError(where, f"expected a non-empty list, got {json.dumps(value)[:60]}"))
            return
        need = required.get(path.replace("candidates", "tiers"), frozenset())
        for i, v in enumerate(value):
            _check_value(f"{where}[{i}]", v, schema[0], required, errors, f"{path}[]")
            if need and isinstance(v, dict) and not need <= set(v):
                errors.append(
                    OverlayTypeError(
                        f"{where}[{i}]",
                        f"a replaced list's objects must be complete: missing {', '.join(sorted(need - set(v)))}",
                    )
                )
        return
    ok, want = _SCALARS[schema]
    if not ok(value):
        errors.append(OverlayTypeError(where, f"expected {want}, got {json.dumps(value)[:60]}"))


def overlay_digest(data: dict[str, Any]) -> str:
    """sha256 of an overlay's op entries (everything but ``_meta``/``_doc``), canonical JSON."""
    body = {k: v for k, v in data.items() if not k.startswith("_")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def software_versions() -> dict[str, str]:
    """The versions a verification stamp is tied to (and the rest ``_meta`` records)."""
    import torch
    import triton

    from .. import __version__

    return {
        "rocm_mla": __version__,
        "triton": triton.__version__,
        "torch": torch.__version__,
        "hip": torch.version.hip or "",
        "cuda": torch.version.cuda or "",
    }


def validate_overlay(data: Any, arch: str, cus: int | None = None, *, check_stamp: bool = True) -> list[OverlayError]:
    """Every problem of overlay ``data`` for a device of ``arch`` with ``cus`` CUs (None: not
    known), as named errors (empty: usable). Compile and reference checks are not done here
    (``rocm-mla tune --check`` adds them)."""
    errors: list[OverlayError] = []
    if not isinstance(data, dict):
        return [OverlayParseError("", f"expected a JSON object, got {type(data).__name__}")]
    meta = data.get("_meta")
    for key, entry in data.items():
        if key in ("_meta", "_doc"):
            continue
        if key not in SCHEMAS:
            errors.append(OverlayUnknownKey(key, f"unknown op (known: {', '.join(sorted(SCHEMAS))})"))
            continue
        if not isinstance(entry, dict) or not entry:
            errors.append(OverlayTypeError(key, 'expected an object {"<arch>": {...}}'))
            continue
        for a, obj in entry.items():
            if not (is_amd_arch(a) or is_nvidia_arch(a)) and a != "cpu":
                errors.append(OverlayUnknownKey(f"{key}.{a}", "unknown arch key (gfx..., sm..., cpu)"))
                continue
            if a != arch:
                errors.append(OverlayArchMismatch(f"{key}.{a}", f"an entry for another arch than this device's {arch}"))
                continue
            _check_value(f"{key}.{a}", obj, _schema(key), _required_list_fields(key), errors)
    if not isinstance(meta, dict):
        errors.append(OverlayUnverified("_meta", "missing: an overlay needs the _meta object rocm-mla tune writes"))
        return errors
    if meta.get("arch") not in (None, arch):
        errors.append(OverlayArchMismatch("_meta.arch", f"made for {meta.get('arch')}, this device is {arch}"))
    mcus = meta.get("cus")
    if cus is not None and mcus not in (None, cus):
        errors.append(OverlayArchMismatch("_meta.cus", f"made for {mcus} CUs/SMs, this device has {cus}"))
    if check_stamp:
        errors.extend(stamp_problems(data))
    return errors


def stamp_problems(data: dict[str, Any]) -> list[OverlayError]:
    """Why the verification stamp of ``data`` does not cover it here (empty: it does)."""
    meta = data.get("_meta") if isinstance(data, dict) else None
    ver = meta.get("verified") if isinstance(meta, dict) else None
    fix = "run `rocm-mla tune --check --stamp` to check it and accept it"
    if not isinstance(ver, dict) or "sha256" not in ver:
        return [OverlayUnverified("_meta.verified", f"no verification stamp; {fix}")]
    if ver.get("sha256") != overlay_digest(data):
        return [OverlayUnverified("_meta.verified", f"the content changed after it was verified; {fix}")]
    now = software_versions()
    stale = [f"{k} {ver.get(k)} -> {now[k]}" for k in ("rocm_mla", "triton") if ver.get(k) != now[k]]
    if stale:
        return [OverlayStale("_meta.verified", f"verified with other versions ({'; '.join(stale)}); {fix}")]
    return []


def stamp_overlay(data: dict[str, Any], by: str) -> dict[str, Any]:
    """``data`` with a verification stamp for its current content and this software (call only
    after the compile and reference checks passed)."""
    import datetime

    v = software_versions()
    verified = {"sha256": overlay_digest(data), **{k: v[k] for k in ("rocm_mla", "triton", "torch")}, "by": by}
    verified["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {**data, "_meta": {**(data.get("_meta") or {}), "verified": verified}}


# --------------------------------------------------------------------------- overlay files


def overlay_dir() -> Path | None:
    """The folder (or single ``.json`` file) overlays come from; None when turned off."""
    value = os.environ.get(OVERLAY_ENV)
    if value is not None:
        return Path(value).expanduser() if value.strip() else None
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "rocm_mla"


def overlay_filename(arch: str, cus: int | None) -> str:
    """The tuner's file name for a device: ``<arch>-<CUs>cu.json`` (``cpu.json`` on the CPU)."""
    return f"{arch}-{cus}cu.json" if cus else f"{arch}.json"


def device_compute_units(arch: str) -> int | None:
    """CU (AMD) / SM (NVIDIA) count of a visible device of ``arch`` (the current device first);
    None when none is visible (e.g. a compile report on another machine), or when this process has
    not initialised the GPU runtime: a config lookup never initialises it (a serving framework may
    fork after looking things up); ops call this with tensors already on the GPU."""
    if not (is_amd_arch(arch) or is_nvidia_arch(arch)):
        return None
    try:
        import torch

        from .. import _platform

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        cur = torch.cuda.current_device()
        for i in [cur] + [i for i in range(torch.cuda.device_count()) if i != cur]:
            if _platform.device_arch(torch.device("cuda", i)) == arch:
                return int(torch.cuda.get_device_properties(i).multi_processor_count)
    except Exception:  # no driver, no device: no CU count
        return None
    return None


@dataclass
class OverlayStatus:
    """What the loader found for one arch: the file, its data when usable, else the first error."""

    arch: str
    cus: int | None
    path: Path | None = None
    data: dict[str, Any] | None = None
    error: OverlayError | None = None
    searched: list[str] = field(default_factory=list)


def find_overlay(arch: str, cus: int | None) -> tuple[Path | None, list[str]]:
    """The overlay file for a device of ``arch``/``cus`` and the paths searched."""
    d = overlay_dir()
    if d is None:
        return None, []
    paths = (
        [d] if d.suffix == ".json" else [d / n for n in dict.fromkeys(overlay_filename(arch, c) for c in (cus, None))]
    )
    return next((p for p in paths if p.is_file()), None), [str(p) for p in paths]


def read_overlay(path: Path) -> dict[str, Any]:
    """Parse an overlay file (OverlayParseError when it cannot be)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OverlayParseError(str(path), f"{type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict):
        raise OverlayParseError(str(path), f"expected a JSON object, got {type(data).__name__}")
    return data


def merge_overlay(base: Any, entry: Any) -> Any:
    """``entry`` (an overlay's object for one op and arch) merged over ``base``, a new object (neither
    is modified): objects field by field, lists and scalars replaced whole."""
    if isinstance(base, dict) and isinstance(entry, dict):
        return {**base, **{k: merge_overlay(base.get(k), v) for k, v in entry.items()}}
    return copy.deepcopy(entry)


def overlay_changes(op: str, base: Any, entry: Any, where: str = "") -> list[str]:
    """Lines ``field: package value -> overlay value`` for what ``entry`` changes in ``base``."""
    where = where or op
    if isinstance(base, dict) and isinstance(entry, dict):
        parts = [(f"{where}.{k}", base.get(k), v) for k, v in entry.items()]
    elif base == entry:
        return []
    elif isinstance(base, list) and isinstance(entry, list) and len(base) == len(entry):
        parts = [(f"{where}[{i}]", b, e) for i, (b, e) in enumerate(zip(base, entry))]
    else:
        fmt = lambda v: "-" if v is None else json.dumps(v, separators=(",", ":"))  # noqa: E731
        return [f"{where}: {fmt(base)} -> {fmt(entry)}"]
    return [line for w, b, e in parts for line in overlay_changes(op, b, e, w)]
