"""KernelLaunch (rocm_mla/ops/_launch.py): a kept compiled kernel launched with exactly the
arguments Triton's own launch passes, under a key at least as fine as Triton's specialisation.

CPU: the key separates what Triton separates (alignment, dtype, integer values); the argument
list equals ``inspect.signature(kernel).bind(...)`` with defaults applied (what Triton's binder
computes) for the decode kernels under real plans; the installed Triton launches in the form
reproduced. GPU: decode through kept binaries is bitwise equal to ``kernel[grid]`` for aligned
and misaligned tensors and changed integers, each new key compiles or finds its own binary, and a
captured CUDA graph replays it.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from triton.runtime.jit import JITFunction

import rocm_mla
from rocm_mla.cases.decode import DecodeShape, make_inputs
from rocm_mla.kernels.decode import mla_decode_reduce_kernel, mla_decode_stage1_kernel
from rocm_mla.ops import _launch
from rocm_mla.ops.decode_plan import REDUCE_ARGS, STAGE1_ARGS


def test_key_separates_what_triton_specialises_on():
    base = torch.zeros(64, dtype=torch.bfloat16)
    key = _launch.specialization_key
    assert key([base]) == key([base.clone()])
    assert key([base]) != key([base[1:]]), "a 2-byte offset changes the 16-byte alignment"
    assert key([base]) == key([base[8:]]), "a 16-byte offset keeps it"
    assert key([base]) != key([base.view(torch.float16)]), "dtype"
    for a, b in ((1, 2), (16, 32), (16, 17), (2**31 - 1, 2**31)):  # ==1, %16, width: all in the value
        assert key([a]) != key([b])
    assert key([0.5]) == key([3.0]), "floats are fp32 whatever their value"
    assert key([0.5]) != key([1]), "a float and an int are different types"


@pytest.mark.parametrize("shape", [DecodeShape(B=3, seq=100, N=16, block=16), DecodeShape(B=2, seq=40, N=128, q_len=2)])
def test_argument_list_is_the_binders(shape):
    """The runtime arguments plus the tail equal sig.bind(...).apply_defaults() in order:
    Triton's binder is that function (create_function_from_signature)."""
    case = make_inputs(shape, dtype=torch.bfloat16)
    plan = case.plan(backend="triton", num_splits=2)
    for kernel, table, consts, opts in (
        (mla_decode_stage1_kernel, STAGE1_ARGS, plan.constexprs, plan.options),
        (mla_decode_reduce_kernel, REDUCE_ARGS, plan.reduce.constexprs, plan.reduce.options),
    ):
        args = [f"arg:{name}" for name, _ in table]  # stand-ins: only the order is checked
        launch = _launch.KernelLaunch(_jit(kernel), consts, opts)
        tail = launch._tail_for(len(args))
        assert tail is not None
        bound = inspect.signature(kernel.fn).bind(*args, **consts)
        bound.apply_defaults()
        assert list(bound.arguments.values()) == [*args, *tail]


def _jit(kernel):
    """The JITFunction of a kernel (under the CPU interpreter the module holds its wrapper)."""
    return kernel if hasattr(kernel, "params") else JITFunction(kernel.fn)


def test_tail_refuses_what_it_cannot_fill():
    launch = _launch.KernelLaunch(_jit(mla_decode_reduce_kernel), {}, {})
    # A constexpr without a default left out: no list (kernel[grid] would raise instead).
    assert launch._tail_for(len(REDUCE_ARGS)) is None
    # A name the kernel does not have.
    bad = _launch.KernelLaunch(_jit(mla_decode_reduce_kernel), {"NOT_A_PARAM": 1}, {})
    assert bad._tail_for(len(REDUCE_ARGS)) is None


def test_installed_triton_launches_in_the_reproduced_form():
    assert _launch.triton_launch_form_ok(), "Triton's JITFunction.run changed: every launch takes kernel[grid]"


def test_launch_hooks_send_launches_through_triton():
    from triton import knobs

    chain = type(knobs.runtime.launch_enter_hook)()  # Triton's default: an empty chain
    assert _launch._idle(None) and _launch._idle(chain)
    chain.add(lambda metadata: None)
    assert not _launch._idle(chain)
    assert not _launch._idle(lambda metadata: None), "a plain function set as the hook"


def test_one_launch_per_form():
    a = _launch.kernel_launch(mla_decode_reduce_kernel, {"BLOCK_D": 64, "X": 1}, {"num_warps": 4})
    b = _launch.kernel_launch(mla_decode_reduce_kernel, {"X": 1, "BLOCK_D": 64}, {"num_warps": 4})
    c = _launch.kernel_launch(mla_decode_reduce_kernel, {"BLOCK_D": 64, "X": 1}, {"num_warps": 8})
    assert a is b and a is not c


@pytest.mark.gpu
def test_kept_binaries_match_kernel_grid_bitwise():
    shape = DecodeShape(B=5, seq=300, N=16, block=16)
    case = make_inputs(shape, dtype=torch.bfloat16, device="cuda", seed=7)
    plan = case.plan(backend="triton", num_splits=3)
    q_nope, q_pe, kv, bt, sl = case.args(0)
    # The same q at an address 2 bytes off 16-byte alignment (a new specialisation key).
    q_buf = torch.empty(q_nope.numel() + 1, dtype=q_nope.dtype, device="cuda")
    q_odd = q_buf[1:].view_as(q_nope).copy_(q_nope)

    def run(q, direct: bool):
        saved = _launch._form_ok
        _launch._form_ok = direct and saved
        try:
            out = torch.full_like(case.out, float("nan"))
            lse = torch.full_like(case.lse, float("nan"))
            rocm_mla.mla_decode(q, q_pe, kv, bt, sl, sm_scale=case.sm_scale, plan=plan, out=out, lse=lse)
            torch.cuda.synchronize()
            return out, lse
        finally:
            _launch._form_ok = saved

    ref_out, ref_lse = run(q_nope, direct=False)
    assert not ref_out.isnan().any()
    stage1 = plan.kernel_launches["kernel"]
    kept0, direct0 = stage1.kept, stage1.direct
    for q in (q_nope, q_nope, q_odd, q_odd, q_nope):
        out, lse = run(q, direct=True)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert stage1.kept >= kept0 + 1, f"the misaligned q is a key of its own (via Triton: {stage1.via_triton})"
    assert stage1.direct >= direct0 + 3
    # A changed integer (another seq_lens stride: a strided view) is a new key and still exact.
    sl2 = torch.empty(sl.numel() * 2, dtype=sl.dtype, device="cuda")[::2]
    sl2.copy_(sl)
    out2 = torch.full_like(ref_out, float("nan"))
    lse2 = torch.full_like(lse, float("nan"))
    for _ in range(2):
        rocm_mla.mla_decode(q_nope, q_pe, kv, bt, sl2, sm_scale=case.sm_scale, plan=plan, out=out2, lse=lse2)
    torch.cuda.synchronize()
    assert torch.equal(out2, ref_out) and torch.equal(lse2, ref_lse)


@pytest.mark.gpu
def test_kept_binary_in_a_cuda_graph():
    shape = DecodeShape(B=4, seq=200, N=16, block=64)
    case = make_inputs(shape, dtype=torch.bfloat16, device="cuda", seed=3)
    plan = case.plan(backend="triton", num_splits=2)
    a = case.args(0)
    out = torch.full_like(case.out, float("nan"))
    lse = torch.full_like(case.lse, float("nan"))

    def call():
        rocm_mla.mla_decode(*a, sm_scale=case.sm_scale, plan=plan, out=out, lse=lse)

    call()
    call()  # the second launch runs the kept binary
    torch.cuda.synchronize()
    want_out, want_lse = out.clone(), lse.clone()
    stage1 = plan.kernel_launches["kernel"]
    assert stage1.direct >= 1, f"kernel[grid] every time: {stage1.via_triton}"
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@pytest.mark.gpu
def test_a_launch_hook_sees_every_launch():
    """A profiler's launch hook gets every launch (through kernel[grid]) and the output is exact."""
    from triton import knobs

    case = make_inputs(DecodeShape(B=2, seq=90, N=8, block=16), dtype=torch.bfloat16, device="cuda", seed=5)
    plan = case.plan(backend="triton", num_splits=2)
    a = case.args(0)
    out = torch.full_like(case.out, float("nan"))
    lse = torch.full_like(case.lse, float("nan"))
    for _ in range(2):
        rocm_mla.mla_decode(*a, sm_scale=case.sm_scale, plan=plan, out=out, lse=lse)
    torch.cuda.synchronize()
    want_out, want_lse = out.clone(), lse.clone()
    seen = []
    hook = lambda metadata: seen.append(metadata.get()["name"])  # noqa: E731
    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip(f"this Triton's launch_enter_hook is {type(chain).__name__}, not a hook chain")
    chain.add(hook)
    try:
        out.fill_(float("nan"))
        rocm_mla.mla_decode(*a, sm_scale=case.sm_scale, plan=plan, out=out, lse=lse)
        torch.cuda.synchronize()
    finally:
        chain.remove(hook)
    assert seen == ["mla_decode_stage1_kernel", "mla_decode_reduce_kernel"]
    assert plan.kernel_launches["kernel"].via_triton == "a launch hook"
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
