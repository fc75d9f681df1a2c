"""gfx942 (MI300) and gfx950 (MI350) figures from AMDGCN assembly text, Triton's ``asm["amdgcn"]`` or
clang ``-S`` (clang-19 for gfx942, clang-22 for gfx950: both print the same comments):
the per-kernel "; Kernel info:" comments (VGPR/AGPR/SGPR, ScratchSize, Occupancy, LDSByteSize),
the ``.amdgpu_metadata`` YAML (spill counts, workgroup size), MFMA = ``v_mfma`` lines, and the
LDS-aware occupancy."""

from __future__ import annotations

import math
import re

from .rows import ARCHS

_FUNC_RE = re.compile(r"^\s*\.type\s+([^\s,]+)\s*,\s*@function", re.MULTILINE)
_INFO_RE = re.compile(r"^;\s*([A-Za-z]+)\s*[:=]\s*(\d+)", re.MULTILINE)
_MFMA_RE = re.compile(r"^\s*v_s?mfma", re.MULTILINE)  # dense and sparse (v_smfmac) MFMA
_META_RE = re.compile(r"^\s*\.amdgpu_metadata\s*$(.*?)^\s*\.end_amdgpu_metadata", re.MULTILINE | re.DOTALL)
_META_KEY_RE = re.compile(r"^(?:  - |    )\.(\w+):[ \t]*(\S*)[ \t]*$", re.MULTILINE)


def parse_amdgcn(text: str) -> dict[str, dict[str, int]]:
    """Per-kernel resources from AMDGCN assembly text (Triton's or clang's), by symbol name.

    Keys: vgprs (incl. AGPRs), agprs, sgprs, scratch, occupancy, lds, spills, mfma,
    workgroup (max flat workgroup size). Only kernels (functions with a "; Kernel info:" block).
    """
    meta = _parse_kernel_metadata(text)
    funcs = list(_FUNC_RE.finditer(text))
    meta_start = text.find(".amdgpu_metadata")
    out: dict[str, dict[str, int]] = {}
    for i, m in enumerate(funcs):
        end = funcs[i + 1].start() if i + 1 < len(funcs) else (meta_start if meta_start > 0 else len(text))
        seg = text[m.end() : end]
        at = seg.find("; Kernel info:")
        if at < 0:
            continue  # a device function, not a kernel
        body, info_text = seg[:at], seg[at:]
        info = {k: int(v) for k, v in _INFO_RE.findall(info_text.split("\n\t.")[0])}
        md = meta.get(m.group(1), {})
        agprs = info.get("NumAgprs", md.get("agpr_count", 0))
        # TotalNumVgprs counts the unified file (VGPRs, alignment, AGPRs); older text lacks it.
        vgprs = info.get("TotalNumVgprs", info.get("NumVgprs", md.get("vgpr_count", 0)) + agprs)
        out[m.group(1)] = {
            "vgprs": vgprs,
            "agprs": agprs,
            # Triton's newer LLVM says TotalNumSgprs, clang-19 says NumSgprs.
            "sgprs": info.get("TotalNumSgprs", info.get("NumSgprs", md.get("sgpr_count", 0))),
            "scratch": info.get("ScratchSize", md.get("private_segment_fixed_size", 0)),
            "occupancy": info.get("Occupancy", 0),
            "lds": info.get("LDSByteSize", md.get("group_segment_fixed_size", 0)),
            "spills": md.get("vgpr_spill_count", 0) + md.get("sgpr_spill_count", 0),
            "mfma": len(_MFMA_RE.findall(body)),
            "workgroup": md.get("max_flat_workgroup_size", 1024),
        }
    return out


def _parse_kernel_metadata(text: str) -> dict[str, dict[str, int]]:
    """Integer fields of each ``amdhsa.kernels`` entry of the ``.amdgpu_metadata`` YAML.

    A small line parser instead of PyYAML: the entries' top-level keys sit at a fixed indent
    ("  - ." for the first, "    ." for the rest) and nested ``.args`` are deeper, so this
    avoids a dependency for a dozen integers.
    """
    m = _META_RE.search(text)
    if not m:
        return {}
    out: dict[str, dict[str, int]] = {}
    for entry in re.split(r"^(?=  - \.)", m.group(1), flags=re.MULTILINE):
        fields = dict(_META_KEY_RE.findall(entry))
        name = fields.get("name")
        if name:
            out[name] = {k: int(v) for k, v in fields.items() if v.isdigit()}
    return out


def amd_occupancy(asm_occupancy: int, lds: int, waves_per_workgroup: int, arch: str = "gfx942") -> int:
    """Waves per SIMD on ``arch`` (gfx942, gfx950) given the asm's register-limited Occupancy and
    the LDS per workgroup.

    Same rule as LLVM's occupancy-with-LDS: workgroups per CU = the CU's LDS (64 KiB on gfx942,
    160 KiB on gfx950) // LDS, their waves spread over the CU's 4 SIMDs (rounded up), capped by
    the register limit.
    """
    info = ARCHS[arch]
    if lds <= 0:
        return asm_occupancy
    if lds > info.lds_limit:
        return 0
    groups = info.lds_limit // lds
    return min(asm_occupancy, math.ceil(groups * waves_per_workgroup / info.simds_per_cu))
