"""Small random checks of every op and backend against the float32 reference (used by doctor).

Each check draws fresh random inputs (never zeros), poisons the outputs with NaN and compares
every element with the reference. One row per (op, backend, dtype, case).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclass
class CheckRow:
    op: str
    backend: str
    dtype: str
    case: str
    max_err: float
    tol: float
    ok: bool
    error: str = ""


def _dtypes(device: torch.device) -> list[torch.dtype]:
    # The Triton CPU interpreter computes bf16 wrongly (upstream triton issue 11584).
    return [torch.float32, torch.float16] + ([torch.bfloat16] if device.type == "cuda" else [])


def _compare(op, backend, dtype, case, got, ref, tol) -> CheckRow:
    got = got.float()
    if torch.isnan(got).any():
        return CheckRow(op, backend, str(dtype).replace("torch.", ""), case, float("nan"), tol, False,
                        "NaN in output (element not written?)")
    err = ((got - ref).abs() / (1.0 + ref.abs())).max().item() if ref.numel() else 0.0
    return CheckRow(op, backend, str(dtype).replace("torch.", ""), case, err, tol, err <= tol)


def check_merge(device: torch.device, backends: list[str]) -> list[CheckRow]:
    from rocm_mla.ops import merge_attn_states
    from rocm_mla.reference import merge_attn_states_ref

    rows = []
    for backend in backends:
        for dtype in _dtypes(device):
            T, N, D = 37, 16, 128
            case = f"T={T} N={N} D={D} pad_v"
            try:
                base = lambda: torch.randn(T, N, 192, device=device).to(dtype)[..., :D]  # noqa: E731
                po, so = base(), base()
                pl = torch.randn(T, N, device=device).t() * 3  # [N, T] transposed view
                sl = torch.randn(N, T, device=device) * 3
                out = torch.full((T, N, 192), float("nan"), dtype=dtype, device=device)[..., :D]
                ol = torch.full((N, T), float("nan"), device=device)
                merge_attn_states(out, po, pl, so, sl, ol, backend=backend)
                ref, ref_lse = merge_attn_states_ref(po, pl, so, sl)
                r = _compare("merge_attn_states", backend, dtype, case, out, ref, TOL[dtype])
                rl = _compare("merge_attn_states", backend, dtype, case + " lse", ol, ref_lse, 1e-5)
                rows += [r, rl]
            except Exception as exc:  # report, keep checking the rest
                rows.append(CheckRow("merge_attn_states", backend, str(dtype), case, float("nan"), 0.0,
                                     False, f"{type(exc).__name__}: {exc}"))
    return rows


CHECKS = [check_merge]


def run_all(device: torch.device) -> list[CheckRow]:
    """Every op's self-check on ``device`` with each backend that can run there."""
    from rocm_mla.ops._dispatch import BACKENDS, unavailable

    # The reference is the yardstick, not a contestant.
    backends = [b for b in BACKENDS if b != "reference" and unavailable(b, device) is None]
    rows: list[CheckRow] = []
    for check in CHECKS:
        rows += check(device, backends)
    return rows
