"""fused_rope_mla_kv_write / concat_and_cache_mla memory safety (the contract in tests/_util.py):
bad slots and positions skipped or NaN, debug messages, zero sizes, overlaps named, and the HIP
kernel compiled for the host on bad indices."""

from __future__ import annotations

import pytest
import torch
from _util import DEVICE, assert_no_sync_and_capturable, backends, raises_naming
from rope_hip_cpu import compile_rope_kv_on_cpu, run_hip_kernel_on_cpu

import rocm_mla
from rocm_mla.cases import Guarded, compare, first_problem, generator, raise_on
from rocm_mla.cases import rope_kv_write as cases
from rocm_mla.reference.rope_kv_write import (
    cache_rows_ref,
    quantize_fp8_ref,
    rope_cos_sin_cache,
    rope_ref,
)

F32 = torch.float32
MAX_POS = 300
HUGE = [1 << 40, (1 << 62) + 5]


def _cos_sin(max_pos=MAX_POS):
    return rope_cos_sin_cache(max_pos, compute_dtype=torch.float64)


class RopeCase:
    """One KV-write batch with every tensor inside a sentinel-guarded buffer (rocm_mla.cases.Guarded:
    the layout the cases' RopeInputs has not): q [T, N, 192] (q_pe its rope slice), kv_a [T, 576]
    (k_pe its [:, 512:] slice), cos/sin cache, a NaN-poisoned paged cache whose guards reach two
    whole pages past each end (a stray row write lands there)."""

    def __init__(self, T, N, bs, nb, *, dtype=F32, fp8=None, max_pos=MAX_POS, seed=0):
        g = generator(seed, "cpu")
        self.T, self.N, self.dtype, self.fp8 = T, N, dtype, fp8
        self.q = Guarded((T, N, 192), dtype, device=DEVICE, generator=g)
        self.kv_a = Guarded((T, 576), dtype, device=DEVICE, generator=g)
        self.kv_c = Guarded((T, 512), dtype, device=DEVICE, generator=g)
        self.cos_sin = Guarded((max_pos, 64), F32, device=DEVICE, fill=_cos_sin(max_pos).to(DEVICE))
        self.cache = Guarded((nb, bs, 576), fp8 or dtype, device=DEVICE, fill="nan", guard=2 * bs * 576 + 64)
        self.k_scale = torch.tensor([0.5], device=DEVICE)
        self.q0, self.k0 = self.q.view.clone(), self.kv_a.view.clone()
        self.num_slots = nb * bs
        self.positions = torch.randint(0, max(1, max_pos), (T,), generator=g).to(DEVICE)
        # The draw of rope_kv_write.make_inputs (slots without repeats), kept here: the cache is
        # this case's guarded buffer (cases' RopeInputs has no guard layout), and tests overwrite slots.
        self.slots = torch.randperm(self.num_slots, generator=g)[:T].to(DEVICE)

    @property
    def q_pe(self):
        return self.q.view[..., 128:]

    @property
    def k_pe(self):
        return self.kv_a.view[:, 512:].unsqueeze(1)

    def run(self, backend, is_neox, **kw):
        kw.setdefault("kv_cache_dtype", "fp8" if self.fp8 else "auto")
        rocm_mla.fused_rope_mla_kv_write(
            self.positions,
            self.q_pe,
            self.k_pe,
            self.kv_c.view,
            self.cos_sin.view,
            self.cache.view,
            self.slots,
            is_neox=is_neox,
            k_scale=self.k_scale,
            backend=backend,
            **kw,
        )

    def check(self, is_neox, *, rope=True):
        """Good tokens as the reference (the op's bound; fp8 codes: FP8_SAME_CODES), bad positions
        NaN, bad slots skipped, guards intact."""
        tol = cases.TOLERANCE[self.dtype]
        pos, slots = self.positions.long(), self.slots.long()
        good_pos = (pos >= 0) & (pos < self.cos_sin.view.shape[0])
        good_slot = (slots >= 0) & (slots < self.num_slots)
        if rope:
            q_rot = rope_ref(self.positions, self.q0[..., 128:], self.cos_sin.view, is_neox=is_neox)
            k_rot = rope_ref(self.positions, self.k0[:, 512:], self.cos_sin.view, is_neox=is_neox)
            assert torch.isnan(self.q_pe[~good_pos].float()).all(), "bad position: q_pe not NaN"
            assert torch.isnan(self.k_pe[~good_pos].float()).all(), "bad position: k_pe not NaN"
            # NaN exactly at the bad positions, the rest within the bound.
            raise_on(
                first_problem(
                    compare("q_pe", self.q_pe, q_rot, tol["q_pe"]),
                    compare("k_pe", self.k_pe.squeeze(1), k_rot, tol["k_pe"]),
                )
            )
        else:
            k_rot = self.k0[:, 512:].float()
            assert torch.equal(self.kv_a.view, self.k0), "concat_and_cache_mla changed k_pe"
        assert torch.equal(self.q.view[..., :128], self.q0[..., :128])
        assert torch.equal(self.kv_a.view[:, :512], self.k0[:, :512])
        rows = cache_rows_ref(self.kv_c.view, k_rot)  # [T, 576] float32, NaN rope part on bad positions
        bs = self.cache.view.shape[1]
        flat = self.cache.view.reshape(-1, 576)
        written = torch.zeros(flat.shape[0], dtype=torch.bool, device=DEVICE)
        written[slots[good_slot]] = True
        got = flat[slots[good_slot]]
        want = rows[: slots.shape[0]][good_slot]
        bound = tol["rows"]
        if self.fp8 is not None:
            want = quantize_fp8_ref(want, self.k_scale, self.fp8)
            got, want, bound = got.float(), want.float(), cases.FP8_SAME_CODES
        nan_want = torch.isnan(want.float())
        assert torch.equal(torch.isnan(got.float()), nan_want), "NaN pattern of the cache rows"
        raise_on(compare("cache rows", got.float()[~nan_want], want.float()[~nan_want], bound).problem)
        snap = self.cache._snap[self.cache.guard : self.cache.guard + flat.numel()].view(-1, 576)
        assert torch.equal(
            flat[~written].view(torch.uint8) if flat.dtype.itemsize == 1 else flat[~written].view(torch.uint8),
            snap[~written].view(torch.uint8),
        ), "cache rows without a valid slot were written"
        assert bs >= 1
        for name in ("q", "kv_a", "kv_c", "cos_sin", "cache"):
            getattr(self, name).check(name)
        assert torch.equal(
            self.kv_c.view,
            self.kv_c._snap[self.kv_c.guard : self.kv_c.guard + self.kv_c.view.numel()].view_as(self.kv_c.view),
        ), "kv_c changed"


def _bad_indices(case: RopeCase, bad_slots=True, bad_pos=True):
    T = case.T
    if bad_slots:  # one past the end, a few past, negative, huge (unguarded, a segfault)
        vals = [case.num_slots, case.num_slots + 1, -7] + HUGE
        for i, v in zip(range(1, T, 2), vals):
            case.slots[i] = v
    if bad_pos:
        mp = case.cos_sin.view.shape[0]
        vals = [-1, mp, mp + 3] + HUGE + [-(1 << 40)]
        for i, v in zip(range(0, T, 3), vals):
            case.positions[i] = v


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("N,bs", [(3, 16), (1, 1), (16, 5)])
def test_rope_bad_slots_and_positions(backend, is_neox, N, bs):
    case = RopeCase(19, N, bs, nb=7 if bs > 1 else 40, seed=N)
    _bad_indices(case)
    case.run(backend, is_neox)
    case.check(is_neox)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=str)
def test_rope_bad_indices_fp8_cache(backend, fp8):
    case = RopeCase(13, 2, 8, nb=4, dtype=torch.float16, fp8=fp8, seed=3)
    _bad_indices(case)
    case.run(backend, False)
    case.check(False)


@pytest.mark.parametrize("backend", backends())
def test_concat_bad_slots_skipped(backend):
    case = RopeCase(11, 1, 4, nb=5, seed=5)
    _bad_indices(case, bad_pos=False)
    rocm_mla.concat_and_cache_mla(case.kv_c.view, case.k_pe, case.cache.view, case.slots, backend=backend)
    case.check(False, rope=False)


@pytest.mark.parametrize("backend", backends())
def test_rope_zero_sizes(backend):
    """T = 0; an empty cache (every slot outside: nothing cached); an empty cos/sin cache
    (every position outside: all NaN)."""
    empty = RopeCase(0, 4, 16, nb=2)
    empty.run(backend, False)
    empty.check(False)
    no_cache = RopeCase(5, 2, 16, nb=0)
    no_cache.slots = torch.tensor([0, 3, -1, 16, 1], device=DEVICE)
    no_cache.run(backend, False)
    no_cache.check(False)
    no_rows = RopeCase(5, 2, 4, nb=3, max_pos=0)
    no_rows.positions.zero_()
    no_rows.run(backend, True)
    no_rows.check(True)
    assert torch.isnan(no_rows.q_pe).all()


@pytest.mark.parametrize("debug", ["kwarg", "env"])
def test_rope_debug_names_argument_index_and_bound(monkeypatch, debug):
    case = RopeCase(6, 2, 4, nb=3)
    case.positions[4] = MAX_POS
    kw = {"debug": True} if debug == "kwarg" else {}
    if debug == "env":
        monkeypatch.setenv("ROCM_MLA_DEBUG", "1")
    raises_naming(
        ValueError, lambda: case.run(None, False, **kw), "positions", f"[0, {MAX_POS})", f"{MAX_POS} at index 4"
    )
    case.positions[4] = 0
    case.slots[2] = 12
    raises_naming(ValueError, lambda: case.run(None, False, **kw), "slot_mapping", "= 12", "12 at index 2")
    raises_naming(
        ValueError,
        lambda: rocm_mla.concat_and_cache_mla(case.kv_c.view, case.k_pe, case.cache.view, case.slots, **kw),
        "concat_and_cache_mla: slot_mapping",
        "12 at index 2",
    )
    monkeypatch.delenv("ROCM_MLA_DEBUG", raising=False)
    case.run(None, False, debug=False)  # debug off: the guard skips the slot, no error


def test_rope_overlaps_rejected_naming_both():
    case = RopeCase(4, 2, 4, nb=3)
    q = case.q.view
    kv = dict(
        positions=case.positions,
        q_pe=case.q_pe,
        k_pe=case.k_pe,
        kv_c=case.kv_c.view,
        cos_sin_cache=case.cos_sin.view,
        kv_cache=case.cache.view,
        slot_mapping=case.slots,
    )

    def call(**change):
        rocm_mla.fused_rope_mla_kv_write(is_neox=False, **{**kv, **change})

    raises_naming(ValueError, lambda: call(k_pe=q[:, :1, 100:164]), "q_pe", "k_pe", "no memory in common")
    raises_naming(ValueError, lambda: call(kv_c=case.cache.view.view(-1)[: 4 * 512].view(4, 512)), "kv_cache", "kv_c")
    raises_naming(
        ValueError, lambda: call(cos_sin_cache=q.reshape(-1)[: 16 * 64].view(16, 64)), "q_pe", "cos_sin_cache"
    )
    pos_in_cache = case.cache.view.view(-1)[:8].view(torch.int64)
    raises_naming(ValueError, lambda: call(positions=pos_in_cache), "kv_cache", "positions")
    raises_naming(
        ValueError,
        lambda: rocm_mla.concat_and_cache_mla(
            case.cache.view.view(-1)[: 4 * 512].view(4, 512), case.k_pe, case.cache.view, case.slots
        ),
        "concat_and_cache_mla: kv_cache",
        "kv_c",
    )
    # Allowed: kv_c and k_pe interleaved in one [T, 576] buffer (vLLM's kv_a split), q_pe a slice of q.
    call(kv_c=case.kv_a.view[:, :512])


# ---------------------------------------------------------------- the HIP rope kernel on the CPU
@pytest.fixture(scope="module")
def hip_rope_on_cpu(tmp_path_factory):
    if DEVICE.type != "cpu":
        pytest.skip("CPU emulation test (the GPU tests run the real kernel)")
    return compile_rope_kv_on_cpu(tmp_path_factory.mktemp("hip_rope_cpu"))


@pytest.mark.parametrize("vec", [True, False], ids=["vec", "scalar"])
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fnuz], ids=str)
def test_hip_rope_kernel_on_cpu_bad_indices(hip_rope_on_cpu, vec, is_neox, fp8):
    """hip_src/kernels/rope_kv_write.cuh on the host, launched as the launcher does: the same
    guards as Triton (bad slot skipped, bad position NaN, guards intact), an empty cos/sin
    cache and an empty cache included."""

    def go(case, rope=True):
        run_hip_kernel_on_cpu(
            hip_rope_on_cpu,
            case.positions if rope else None,
            case.q_pe if rope else None,
            case.k_pe,
            case.kv_c.view,
            case.cos_sin.view if rope else None,
            case.cache.view,
            case.slots,
            case.k_scale,
            is_neox=is_neox,
            fp8=fp8,
            vec=vec,
        )

    dtype = torch.bfloat16 if fp8 else F32
    case = RopeCase(17, 3, 8, nb=5, dtype=dtype, fp8=fp8, seed=11)
    _bad_indices(case)
    go(case)
    case.check(is_neox)
    concat = RopeCase(9, 1, 8, nb=2, dtype=dtype, fp8=fp8, seed=12)
    _bad_indices(concat, bad_pos=False)
    go(concat, rope=False)
    concat.check(is_neox, rope=False)
    no_rows = RopeCase(4, 2, 8, nb=2, dtype=dtype, fp8=fp8, max_pos=0)
    no_rows.positions.zero_()
    go(no_rows)
    no_rows.check(is_neox)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["hip", "triton", "reference"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
def test_gpu_rope_bad_indices(backend, dtype, is_neox):
    """The real kernels (in the compute-sanitizer memcheck selection, docs/verification.md):
    vector and scalar paths, bf16 and fp8 caches, huge indices."""
    if backend not in backends():
        pytest.skip(f"{backend} unavailable")
    for N, bs, nb, fp8 in ((16, 16, 9, None), (128, 64, 3, None), (3, 5, 40, "fp8")):
        fp8_dtype = (torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn) if fp8 else None
        case = RopeCase(101, N, bs, nb=nb, dtype=dtype, fp8=fp8_dtype, seed=N)
        _bad_indices(case)
        case.run(backend, is_neox)
        case.check(is_neox)
    misaligned = RopeCase(33, 4, 16, nb=3, dtype=dtype, seed=9)  # HIP scalar path: q_pe off 16 bytes
    base = Guarded((33 * 4 * 192 + 1,), dtype, device=DEVICE, generator=generator(10, "cpu"))
    misaligned.q = base
    misaligned.q.view = base.view[1:].view(33, 4, 192)
    misaligned.q0 = misaligned.q.view.clone()
    _bad_indices(misaligned)
    misaligned.run(backend, is_neox)
    misaligned.check(is_neox)
    empty = RopeCase(7, 2, 16, nb=0, dtype=dtype)
    empty.run(backend, is_neox)
    empty.check(is_neox)


@pytest.mark.gpu
def test_gpu_rope_checks_no_sync_and_capturable():
    """fused_rope_mla_kv_write (the overlap checks run), HIP and Triton: no host sync, capturable."""
    rope = RopeCase(64, 16, 16, nb=8, dtype=torch.bfloat16)
    ops = [lambda b=b: rope.run(b, False) for b in ("hip", "triton") if b in backends()]
    assert_no_sync_and_capturable(ops, [rope.q, rope.kv_a, rope.cache])
