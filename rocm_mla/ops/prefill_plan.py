"""mla_prefill's plan: everything a call launches, decided on the host from the call's sizes, dtype
and device, never from a device value (the grid is sized from Tq and B, not from cu_seqlens, so the
call can be captured in a CUDA/HIP graph).

``plan_prefill(...) -> PrefillPlan`` (flashinfer's plan/run split): made once per step from the
sizes (or by ``plan_prefill_for`` from a call's tensors), it checks the mode and tuning knobs once;
the wrapper checks its tensors against it and launches exactly what it says. It decides the launch
data (``launch_config``), the head-dim tiles (``dim_tiles``), the head group (``head_group``), the
grid (``grid_slots``), the TMA mode (``_tma_arch``; the tensors' alignment, ``_tma_ok``, is checked
per call) and the constexprs and compile options (``triton_meta``, which the ISA report compiles its
variants from, so what it reports is what runs).

``plan_prefill_with_context(...) -> PrefillContextPlan``: mla_prefill_with_context's plan, the
new tokens' causal ``PrefillPlan`` (the same sizes and knobs, no causal knob); each context chunk's
non-causal pass is planned from it and the chunk's sizes (``PrefillContextPlan.chunk_plan``).

Launch data: rocm_mla/configs/mla_prefill.json.
"""

from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import _platform
from ..configs import config_for, nvidia_sm, prefill_tma_mode, resolve_tier
from ..mla_dims import PREFILL_DIMS
from ..triton_common import amd_options
from ._checks import FLOAT_DTYPES, Checker, debug_enabled, plan_device
from ._dispatch import select

OP = "mla_prefill"
# The widest head dim (P, R or V) the Triton kernel tiles: one power-of-two register tile per dim.
MAX_TRITON_HEAD_DIM = 256
# cu_seqlens_q entries a program reads per vector step when it looks up its sequence (B <= this:
# one step). 256 int32 is one element per lane at 4 waves of 64 or 8 warps of 32.
SEQ_CHUNK = 256


def geometry_key(dims: tuple[int, int, int]) -> str:
    """``"P/R/V"``: a head geometry as a tier of configs/mla_prefill.json names it (its ``geometry``)."""
    return "/".join(str(int(d)) for d in dims)


def launch_config(arch: str, dtype: torch.dtype, dims: tuple[int, int, int] = PREFILL_DIMS) -> dict:
    """The launch data the wrapper uses for ``dtype`` and head geometry ``dims`` = (P, R, V) on
    ``arch`` (see configs/mla_prefill.json): the tier of that ``geometry``, else the first tier,
    with its ``fp32`` object applied for float32 inputs."""
    tiers = config_for(OP, arch)["tiers"]
    tier = next((t for t in tiers if t.get("geometry") == geometry_key(dims)), tiers[0])
    return resolve_tier(tier, ["fp32"] if dtype == torch.float32 else [])


def dim_tile(d: int) -> int:
    """The kernel's tile of a head dim ``d``: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, 1 << max(0, int(d) - 1).bit_length())


def dim_tiles(dims: tuple[int, int, int]) -> tuple[int, int, int]:
    """(BLOCK_DN, BLOCK_DR, BLOCK_DV) of (P, R, V); R = 0 still gets a (never used) tile of 16."""
    return tuple(dim_tile(d) for d in dims)  # type: ignore[return-value]


def head_group(cfg: dict, num_heads: int, max_seqlen_k: int, kv_head_bytes: int) -> int:
    """Heads whose programs the kernel numbers together (its head_group, see the kernel's Grid), a
    divisor of ``num_heads``: the largest one not above the config's ``head_group`` when it has
    one; else, with ``head_group_kv_bytes``, the most heads whose K/V of one sequence
    (``max_seqlen_k`` keys x ``kv_head_bytes``) fit in that many bytes -- the programs running
    together then re-read K/V from L2, not memory (docs/notes/prefill-tma-and-head-groups.md);
    else 1 (one head after another)."""
    if "head_group" in cfg:
        want = int(cfg["head_group"])
        if want < 1:
            Checker(OP).fail("config", "head_group >= 1", f"head_group={want}")
    elif "head_group_kv_bytes" in cfg:
        want = int(cfg["head_group_kv_bytes"]) // max(1, max_seqlen_k * kv_head_bytes)
    else:
        want = 1
    want = max(1, min(want, num_heads))
    return max(g for g in range(1, want + 1) if num_heads % g == 0)


def triton_meta(
    cfg: dict,
    arch: str,
    dims: tuple[int, int, int],
    causal: bool,
    fp32: bool,
    tma_aligned: bool = True,
) -> tuple[dict, dict]:
    """``(constexprs, compile options)`` of one launch config on ``arch``: the single place the
    launch and the ISA report's variants (rocm_mla/variants/prefill.py) take them from.
    ``tma_aligned``: the tensors meet the TMA descriptors' alignment (``_tma_ok``; the variants
    describe aligned tensors)."""
    P, R, V = dims
    tiles = dim_tiles(dims)
    # A host descriptor reads whole tiles along a row of all heads: past a head's dim it would read
    # the next head's columns, not zero fill. Tiles wider than a dim keep per-program descriptors.
    tma = _tma_mode(cfg) if _tma_arch(arch) and not fp32 and tma_aligned else 0
    if tma == 2 and any(t != d for t, d in zip(tiles, dims) if d):
        tma = 1
    consts = {
        "D_NOPE": P,
        "D_ROPE": R,
        "D_V": V,
        "BLOCK_DN": tiles[0],
        "BLOCK_DR": tiles[1],
        "BLOCK_DV": tiles[2],
        "BLOCK_M": int(cfg["BLOCK_M"]),
        "BLOCK_N": int(cfg["BLOCK_N"]),
        "SEQ_CHUNK": SEQ_CHUNK,
        "CAUSAL": bool(causal),
        # fp32 inputs: exact products (NVIDIA would use TF32 by default); 16-bit inputs: default.
        "DOT_PREC": "ieee" if fp32 else None,
        # software-pipelining depth of the masked (diagonal / ragged-end) loop; default: num_stages
        "DIAG_STAGES": int(cfg.get("diag_stages", cfg.get("num_stages", 2))),
        # TMA tensor descriptors for K/k_pe/V ("host": q too): NVIDIA sm90+ (and the CPU
        # interpreter, which runs the same code path), 16-bit inputs; the alignment is the call's
        # (PrefillPlan.launch_constexprs).
        "USE_TMA": tma,
    }
    # On AMD also waves_per_eu, matrix_instr_nonkdim, kpack and schedule_hint (the backend's
    # instruction-scheduling hint); 0 / "none" are the backend's defaults.
    options = {
        "num_warps": int(cfg["num_warps"]),
        "num_stages": int(cfg.get("num_stages", 2)),
        **amd_options(cfg, arch),
    }
    return consts, options


def _tma_mode(cfg: dict) -> int:
    """The kernel's USE_TMA for a config's "tma" option (configs.PREFILL_TMA_MODES: false 0, true 1
    per-program descriptors, "host" 2 host descriptors)."""
    tma = cfg.get("tma", False)
    mode = prefill_tma_mode(tma)
    if mode is not None:
        return mode
    Checker(OP).fail("config", 'tma false, true or "host"', f"tma={tma!r}")


def _tma_arch(arch: str) -> bool:
    """Archs where the "tma" launch option is honoured: Hopper and later NVIDIA, and the CPU
    interpreter (to test the path). On AMD the descriptors would be lowered back to pointer loads."""
    if arch == "cpu":
        return True
    return (nvidia_sm(arch) or 0) >= 90


def _tma_ok(q, k_nope, k_pe, v, kpe_sh: int) -> bool:
    """TMA descriptors need 16-byte aligned bases and row/head steps, unit inner strides (and the
    data to exist). Otherwise the launch keeps the pointer loads. (q only matters to host
    descriptors, which also load it; requiring it of both keeps one rule.) ``k_pe`` None: no
    RoPE part (R = 0), nothing to describe."""
    if k_nope.shape[0] == 0 or k_nope.element_size() != 2:
        return False
    e = k_nope.element_size()
    tensors = [(q, q.stride(1)), (k_nope, k_nope.stride(1)), (v, v.stride(1))]
    if k_pe is not None:
        tensors.append((k_pe, kpe_sh))
    for x, head_stride in tensors:
        if x.stride(2) != 1 or x.data_ptr() % 16 or (x.stride(0) * e) % 16 or (head_stride * e) % 16:
            return False
    return True


def grid_slots(Tq: int, B: int, N: int, block_m: int) -> int:
    """The kernel's slot count, ``Tq // BLOCK_M + B`` (it covers every sequence's q blocks, see the
    kernel's Grid); its one grid axis has ``slots x N`` programs, numbered in int32."""
    slots = Tq // block_m + B
    if slots * N >= 2**31:
        Checker(OP).fail(
            "q_rows, batch, num_heads",
            "(Tq // BLOCK_M + B) * N < 2**31 programs",
            f"{slots * N} (Tq={Tq}, B={B}, N={N}, BLOCK_M={block_m})",
        )
    return slots


@dataclass(frozen=True)
class PrefillPlan:
    """What one mla_prefill call runs (``plan_prefill`` makes it; the wrapper runs it).

    The call: B sequences (``cu_seqlens_q`` / ``cu_seqlens_k`` of B + 1 entries) over ``q_rows`` =
    Tq query rows and ``k_rows`` = Tk key rows of ``num_heads`` heads, head geometry ``head_dims``
    = (P, R, V), all in ``q_dtype`` on ``device``. The launch: ``grid = (num_slots x N,)`` programs,
    each ``BLOCK_M`` queries of one sequence and one head, numbered by groups of ``head_group``
    heads (the kernel's Grid). ``constexprs["USE_TMA"]`` says how K, k_pe and V (and with 2, q)
    are loaded on tensors that meet the TMA descriptors' alignment: 2 means the launcher builds
    the host descriptors, 1 that the programs build theirs in Triton's global scratch; a call
    whose tensors do not meet it launches ``pointer_constexprs`` (USE_TMA 0, the rest equal):
    alignment is a property of the tensors, checked per call (``launch_constexprs``).
    """

    arch: str  # the device's arch key (gfx942, sm90, cpu, ...)
    config: dict[str, Any]  # the launch data: the config= override or the arch's table entry
    head_group: int
    num_slots: int
    grid: tuple[int]
    constexprs: dict[str, Any]  # for tensors meeting the TMA alignment (all of them when USE_TMA is 0)
    options: dict[str, Any]
    pointer_constexprs: dict[str, Any]  # constexprs with USE_TMA 0: tensors that do not meet it
    # The call the plan was made for (mla_prefill checks its tensors against these).
    device: torch.device | None = None
    q_dtype: torch.dtype | None = None  # q's, k_nope's, k_pe's, v's and out's
    batch: int = 0  # B
    num_heads: int = 0  # N
    q_rows: int = 0  # Tq
    k_rows: int = 0  # Tk
    head_dims: tuple[int, int, int] = PREFILL_DIMS  # (P, R, V); R = 0: no k_pe
    # The mode and tuning knobs.
    causal: bool = True
    max_seqlen_q: int | None = None  # accepted (FlashAttention-style call sites), never needed
    max_seqlen_k: int | None = None  # the head group's hint (k_rows when None)
    batch_invariant: bool = False
    backend: str = "triton"  # "triton" or "reference" (rocm_mla.ops._dispatch)
    debug: bool = False  # host-side checks of cu_seqlens at every call (a sync on a GPU)

    @property
    def use_tma(self) -> int:
        """The kernel's USE_TMA on aligned tensors: 0 pointer loads, 1 per-program descriptors, 2
        host descriptors."""
        return self.constexprs["USE_TMA"]

    def matches(self, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k) -> bool:
        """Whether an ``mla_prefill`` call's tensors are the ones this plan was made for (sizes,
        dtypes, device): the whole per-call check of a planned call's inputs, in one expression.
        ``mla_prefill`` names what differs when it is False."""
        P, R, V = self.head_dims
        N, Tk, dt, dev = self.num_heads, self.k_rows, self.q_dtype, self.device
        try:
            return (
                q.shape == (self.q_rows, N, P + R)
                and k_nope.shape == (Tk, N, P)
                and v.shape == (Tk, N, V)
                and q.dtype == dt
                and k_nope.dtype == dt
                and v.dtype == dt
                and (
                    k_pe is None
                    if R == 0
                    else (
                        k_pe.dim() == 3
                        and k_pe.shape[0] == Tk
                        and k_pe.shape[1] in (1, N)
                        and k_pe.shape[2] == R
                        and k_pe.dtype == dt
                        and k_pe.device == dev
                    )
                )
                and cu_seqlens_q.shape == (self.batch + 1,)
                and cu_seqlens_k.shape == (self.batch + 1,)
                and cu_seqlens_q.dtype == torch.int32
                and cu_seqlens_k.dtype == torch.int32
                and q.device == dev
                and k_nope.device == dev
                and v.device == dev
                and cu_seqlens_q.device == dev
                and cu_seqlens_k.device == dev
            )
        except (AttributeError, TypeError):  # not tensors
            return False

    def launch_constexprs(self, q, k_nope, k_pe, v) -> dict[str, Any]:
        """The constexprs a call with these tensors launches: ``constexprs`` when they meet the
        TMA descriptors' alignment (or the plan has no TMA), else ``pointer_constexprs``."""
        if not self.use_tma or _tma_ok(q, k_nope, k_pe, v, kpe_head_stride(k_pe)):
            return self.constexprs
        return self.pointer_constexprs


def kpe_head_stride(k_pe: torch.Tensor | None) -> int:
    """k_pe's head stride as launched: 0 when one rope head serves every head (``[Tk, 1, R]``, or
    no k_pe), else its own."""
    return 0 if k_pe is None or k_pe.shape[1] == 1 else k_pe.stride(1)


# What the Triton check of a head dim wider than a tile names, per planner: (argument, dim) of
# P, R, V (mla_prefill's tensors, or plan_prefill's head_dims).
_TENSOR_DIM_NAMES = (("k_nope", "last dim P"), ("k_pe", "last dim R"), ("v", "last dim V"))
_SIZE_DIM_NAMES = (("head_dims", "P"), ("head_dims", "R"), ("head_dims", "V"))
_SIZES = ("batch", "num_heads", "q_rows", "k_rows")


def plan_prefill(
    *,
    batch: int,
    num_heads: int,
    q_rows: int,
    k_rows: int,
    q_dtype: torch.dtype,
    device: torch.device | str,
    head_dims: tuple[int, int, int] = PREFILL_DIMS,
    causal: bool = True,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    config: dict | None = None,
    batch_invariant: bool = False,
    backend: str | None = None,
    debug: bool | None = None,
) -> PrefillPlan:
    """Everything an ``mla_prefill`` call with these sizes launches, decided once on the host
    (flashinfer's plan/run): make it once per step and pass it to every layer's call
    (``mla_prefill(..., plan=plan)``), which then only checks its tensors against it. No device
    value is read (the grid is sized from Tq and B, not from cu_seqlens), so the calls that use it
    can be captured in a CUDA/HIP graph.

    Args:
        batch: B, the sequences: ``cu_seqlens_q`` and ``cu_seqlens_k`` are ``[B + 1]`` int32.
        num_heads: N (query heads on this rank).
        q_rows: Tq, q's rows: ``q`` ``[Tq, N, P + R]``, ``out`` ``[Tq, N, V]``, ``lse`` ``[N, Tq]``.
        k_rows: Tk, the key rows: ``k_nope`` ``[Tk, N, P]``, ``k_pe`` ``[Tk, 1 or N, R]``, ``v``
            ``[Tk, N, V]``.
        q_dtype: float16, bfloat16 or float32: q's, k_nope's, k_pe's, v's and out's.
        device: where the calls run (its arch picks the launch data).
        head_dims: (P, R, V) = (qk_nope_head_dim, qk_rope_head_dim, v_head_dim); DeepSeek's
            (128, 64, 128) by default. R = 0: no RoPE part (``k_pe=None``). The Triton kernel takes
            P, V in [1, 256] and R in [0, 256]; the reference any.
        causal: bottom-right aligned causal mask: query i of a sequence with lq queries and lk keys
            sees keys ``j <= i + lk - lq`` (FlashAttention's convention). False: every key.
        max_seqlen_q, max_seqlen_k: None or ints >= 0, accepted for FlashAttention-style call
            sites; not needed for correctness. max_seqlen_k, when given, is a hint for the order of
            the programs on the GPU (the config's head_group_kv_bytes; Tk when None); a wrong
            value costs speed, never a result.
        config: override of the Triton launch data, one object with the keys of a tier in
            ``configs/mla_prefill.json`` (its ``_doc`` says what each does:
            tiles, warps, stages, tma, head_group, the gfx9 options); for tuning and tests.
        batch_invariant: a sequence's out and lse bitwise the same whatever the other sequences,
            their lengths, order and its position (docs/batch-invariance.md). Always so here: a
            program's keys, tiles and softmax order start at its own sequence's first row and key,
            and no launch choice that changes arithmetic follows the batch (the head group and
            max_seqlen_k order the programs only; the TMA mode follows the tensors' alignment);
            the keyword states the requirement, and is checked to be a bool.
        backend: ``"triton"`` or ``"reference"`` to force one (default: configs' backend_order;
            see ``rocm_mla.ops._dispatch``; ``ROCM_MLA_BACKEND_MLA_PREFILL`` in the environment);
            there is no HIP kernel for this op, so ``"hip"`` raises.
        debug: every call validates cu_seqlens on a GPU too (a host sync: not capturable), naming
            the argument, the index and the bound. Default: ``ROCM_MLA_DEBUG=1`` in the environment.
            (The reference backend, and CPU tensors, always validate them.)

    Raises:
        TypeError / ValueError naming the argument, what was expected and what came; among them
        a config ``tma`` other than false, true or "host", a ``head_group`` < 1, and a grid of
        2**31 programs or more.
    """
    return _plan(Checker(OP), _SIZE_DIM_NAMES, locals())  # locals(): exactly the keywords above


# A PrefillPlan holds each of these under the keyword's name (``PrefillContextPlan.chunk_plan``).
_PLAN_PREFILL_KEYWORDS = tuple(inspect.signature(plan_prefill).parameters)


def _plan(c: Checker, dim_names: tuple[tuple[str, str], ...], kw: dict[str, Any]) -> PrefillPlan:
    """:func:`plan_prefill` of its keywords ``kw`` (every one, defaults filled in), with its errors
    from ``c`` (``mla_prefill_with_context`` names itself and its chunks) and ``dim_names``, what the
    Triton head-dim check calls P, R and V (plan_prefill's head_dims or a call's tensors)."""
    for name in _SIZES:
        val = kw[name]
        if isinstance(val, bool) or not isinstance(val, numbers.Integral) or val < 0:
            c.fail(name, "an int >= 0", repr(val))
    batch, num_heads, q_rows, k_rows = (int(kw[name]) for name in _SIZES)
    head_dims, q_dtype, causal = kw["head_dims"], kw["q_dtype"], kw["causal"]
    dims = tuple(head_dims) if isinstance(head_dims, (tuple, list)) else None
    if (
        dims is None
        or len(dims) != 3
        or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) for d in dims)
        or min(dims[0], dims[2]) < 1
        or dims[1] < 0
    ):
        c.fail("head_dims", "(P, R, V) ints with P, V >= 1 and R >= 0", repr(head_dims))
    dims = tuple(int(d) for d in dims)
    if q_dtype not in FLOAT_DTYPES:
        c.fail("q_dtype", "float16, bfloat16 or float32", str(q_dtype).replace("torch.", ""), TypeError)
    if not isinstance(causal, bool):
        c.fail("causal", "a bool", type(causal).__name__, TypeError)
    for name in ("max_seqlen_q", "max_seqlen_k"):
        val = kw[name]
        if val is None:
            continue
        if isinstance(val, bool) or not isinstance(val, numbers.Integral):
            c.fail(name, "None or an int >= 0", repr(val), TypeError)
        if val < 0:
            c.fail(name, "None or an int >= 0", val)
    if not isinstance(kw["batch_invariant"], bool):
        c.fail("batch_invariant", "a bool", repr(kw["batch_invariant"]), TypeError)
    device = plan_device(kw["device"])
    impl = select(OP, device, kw["backend"], has_hip=False)
    if impl == "triton":
        # Each dim is one register tile of the next power of two (masked past the dim): up to 256.
        for (arg, name), x in zip(dim_names, dims):
            if x > MAX_TRITON_HEAD_DIM:
                c.fail(
                    arg,
                    f"{name} <= {MAX_TRITON_HEAD_DIM} for the Triton kernel (MLA geometries (P, R, V): "
                    "(128, 64, 128), (192, 64, 256), (64, 64, 128), (256, 0, 256); the reference backend takes any)",
                    x,
                )
    arch = _platform.device_arch(device)
    cfg = kw["config"] if kw["config"] is not None else launch_config(arch, q_dtype, dims)
    _check_config(c, cfg, batch, num_heads, q_rows)
    kv_head_bytes = (dims[0] + dims[2]) * q_dtype.itemsize
    group = head_group(cfg, num_heads, kw["max_seqlen_k"] or k_rows, kv_head_bytes)
    fp32 = q_dtype == torch.float32
    consts, options = triton_meta(cfg, arch, dims, causal, fp32, tma_aligned=True)
    pointer = consts if not consts["USE_TMA"] else triton_meta(cfg, arch, dims, causal, fp32, tma_aligned=False)[0]
    num_slots = grid_slots(q_rows, batch, num_heads, consts["BLOCK_M"])
    return PrefillPlan(
        arch=arch,
        config=cfg,
        head_group=group,
        num_slots=num_slots,
        grid=(num_slots * num_heads,),
        constexprs=consts,
        options=options,
        pointer_constexprs=pointer,
        device=device,
        q_dtype=q_dtype,
        batch=batch,
        num_heads=num_heads,
        q_rows=q_rows,
        k_rows=k_rows,
        head_dims=dims,
        causal=causal,
        max_seqlen_q=kw["max_seqlen_q"],
        max_seqlen_k=kw["max_seqlen_k"],
        batch_invariant=kw["batch_invariant"],
        backend=impl,
        debug=debug_enabled(kw["debug"]),
    )


def _check_config(c: Checker, cfg: object, batch: int, num_heads: int, q_rows: int) -> None:
    """The plan's launch data, with errors from ``c`` naming ``config``: an unknown "tma" raises
    whatever the arch and dtype, a "head_group" below 1, and a grid of 2**31 programs or more (the
    kernel numbers its programs in int32; ``grid_slots``)."""
    if not isinstance(cfg, dict):
        c.fail("config", "a dict with the keys of a tier in configs/mla_prefill.json", repr(cfg), TypeError)
    tma = cfg.get("tma", False)
    if prefill_tma_mode(tma) is None:
        c.fail("config", 'a "tma" of false, true or "host"', repr(tma))
    if "head_group" in cfg and int(cfg["head_group"]) < 1:
        c.fail("config", 'a "head_group" >= 1', repr(cfg["head_group"]))
    block_m = int(cfg["BLOCK_M"])
    programs = (q_rows // block_m + batch) * num_heads
    if programs >= 2**31:
        c.fail(
            "q_rows, batch, num_heads",
            f"(Tq // BLOCK_M + B) * N < 2**31 programs (BLOCK_M={block_m})",
            f"{programs} (Tq={q_rows}, B={batch}, N={num_heads})",
        )


# --------------------------------------------------------------------------- prefill with context

CONTEXT_OP = "mla_prefill_with_context"


def _words(numel: int, dtype: torch.dtype) -> int:
    """float32 elements of a workspace piece of ``numel`` elements of ``dtype``, rounded up to 64
    (256 bytes: every piece, and every vector load, stays aligned)."""
    return -(-numel * dtype.itemsize // 256) * 64


@dataclass(frozen=True)
class PrefillContextPlan:
    """What one mla_prefill_with_context call runs (``plan_prefill_with_context`` makes it; its
    docstring says with which knobs): ``new_tokens``, the new tokens' causal pass; each context
    chunk's non-causal pass comes from :meth:`chunk_plan` when the chunk does (chunk sizes are not
    known when the step plans: a generator makes them); ``merge_backend``, the backend forced on
    merge_attn_states, which folds the passes (the ``backend`` knob as given; None: its default).
    """

    new_tokens: PrefillPlan
    merge_backend: str | None = None

    @property
    def workspace_numel(self) -> int:
        """float32 elements of a ``workspace=`` that holds every buffer a call with context needs:
        two ``[Tq, N, V]`` buffers in q's dtype (a chunk's output and the running result) and
        three ``[N, Tq]`` float32 lse buffers, each piece starting at a multiple of 64 elements
        (256 bytes). A call without context chunks uses none of it."""
        p = self.new_tokens
        rows = p.q_rows * p.num_heads
        return 2 * _words(rows * p.head_dims[2], p.q_dtype) + 3 * _words(rows, torch.float32)

    # The chunk plans made so far, by (k_rows, max_seqlen_k): one serving step's layers call with the
    # same chunks, and a plan is a pure function of these and the fields above.
    _chunks: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def matches(self, q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k) -> bool:
        """Whether a call's new-token tensors are the ones this plan was made for (sizes, dtypes,
        device: ``PrefillPlan.matches`` of ``new_tokens``); host values only.
        ``mla_prefill_with_context`` names what differs when it is False."""
        return self.new_tokens.matches(q, k_nope, k_pe, v, cu_seqlens_q, cu_seqlens_k)

    def chunk_plan(self, c: Checker, k_rows: int, max_seqlen_k: int | None = None) -> PrefillPlan:
        """The plan of one context chunk's pass: the new tokens' queries (``new_tokens``' B, N, Tq,
        head dims, dtype, device) against the chunk's ``k_rows`` keys, non-causal, with the plan's
        knobs and the chunk's ``max_seqlen_k`` hint. Errors (a bad hint) come from ``c``."""
        key = (k_rows, type(max_seqlen_k), max_seqlen_k)
        try:
            return self._chunks[key]
        except (KeyError, TypeError):  # not planned yet, or a hint _plan refuses (unhashable)
            pass
        kw = {name: getattr(self.new_tokens, name) for name in _PLAN_PREFILL_KEYWORDS}
        got = _plan(c, _TENSOR_DIM_NAMES, {**kw, "k_rows": k_rows, "causal": False, "max_seqlen_k": max_seqlen_k})
        self._chunks[key] = got  # a valid hint: None or an int
        return got


def plan_prefill_with_context(
    *,
    batch: int,
    num_heads: int,
    q_rows: int,
    k_rows: int,
    q_dtype: torch.dtype,
    device: torch.device | str,
    head_dims: tuple[int, int, int] = PREFILL_DIMS,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    config: dict | None = None,
    batch_invariant: bool = False,
    backend: str | None = None,
    debug: bool | None = None,
) -> PrefillContextPlan:
    """Everything an ``mla_prefill_with_context`` call with these new-token sizes launches, decided
    once on the host from sizes alone (no device value: capturable): make it once per step and pass
    it to every layer's call (``mla_prefill_with_context(..., plan=plan)``).

    Args:
        batch, num_heads, q_rows, k_rows, q_dtype, device, head_dims: the new tokens' call, as
            :func:`plan_prefill` takes them (``k_rows``: the new tokens' keys, Tk; the chunks' keys
            are each chunk's own).
        max_seqlen_q, max_seqlen_k, config, batch_invariant, debug: as :func:`plan_prefill` takes
            them, for the new tokens' causal pass; each chunk's pass is planned with the same
            knobs (``causal=False``, max_seqlen_q, the chunk's own ``max_seqlen_k``:
            :meth:`PrefillContextPlan.chunk_plan`). batch_invariant: a sequence's out and lse depend
            on its own keys and on how its own context is cut into chunks (the row's merges run in
            chunk order; a chunk where it has no key merges an empty side, which changes no bit),
            never on the other sequences or their chunking (always so; checked to be a bool).
        backend: ``"triton"`` or ``"reference"`` to force one for the attention passes (as
            :func:`plan_prefill`), passed on to merge_attn_states as well.

    Raises:
        TypeError / ValueError naming the argument (``mla_prefill_with_context: <argument>: ...``).
    """
    return _plan_context(Checker(CONTEXT_OP), _SIZE_DIM_NAMES, locals())  # locals(): exactly the keywords above


def _plan_context(c: Checker, dim_names: tuple[tuple[str, str], ...], kw: dict[str, Any]) -> PrefillContextPlan:
    """:func:`plan_prefill_with_context` of its keywords ``kw`` (every one), as :func:`_plan` takes them."""
    return PrefillContextPlan(new_tokens=_plan(c, dim_names, {**kw, "causal": True}), merge_backend=kw["backend"])


def _plan_tensors(c: Checker, maker, sizes: dict[str, Any], knobs: dict[str, Any]):
    """What ``maker`` (plan_prefill or plan_prefill_with_context) makes of the ``sizes`` read from a
    call's tensors and the ``knobs`` given (``maker``'s other keywords; TypeError for any other
    name), with errors from ``c``, the Triton head-dim check naming the tensors."""
    defaults = maker.__kwdefaults__  # not inspect's bind (tens of us): every call with plan=None comes here
    for name in knobs:
        if name in sizes or name not in defaults:
            raise TypeError(f"{maker.__name__}_for() got an unexpected keyword argument {name!r}")
    return (_plan if maker is plan_prefill else _plan_context)(c, _TENSOR_DIM_NAMES, {**defaults, **sizes, **knobs})


__all__ = [
    "OP",
    "SEQ_CHUNK",
    "MAX_TRITON_HEAD_DIM",
    "PrefillPlan",
    "plan_prefill",
    "PrefillContextPlan",
    "plan_prefill_with_context",
    "kpe_head_stride",
    "launch_config",
    "geometry_key",
    "dim_tile",
    "dim_tiles",
    "head_group",
    "triton_meta",
    "grid_slots",
]
