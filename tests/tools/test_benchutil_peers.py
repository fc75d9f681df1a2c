"""perf/benchutil.py's stand-ins for vLLM's data path around a peer kernel (the benchmarks'
upstream columns are only fair if they call the peer as vLLM 0.33 does): the exact call, against a
recording stand-in written from vLLM 0.33's forward_mqa; and vLLM's own kernel through the helper
against the float32 reference, where .peers/vllm is present."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _util import DEVICE, HAS_GPU
from benchutil import vllm_triton_mla_decode

from rocm_mla.cases import decode

PEERS = Path(__file__).resolve().parents[2] / ".peers"


def _decode_inputs(N=4, block=16, lens=(37, 5), S=4, dtype=torch.float32, seed=3):
    """rocm_mla.cases.decode's inputs (contiguous q_nope, q_pe a slice; a shuffled paged cache,
    every slot finite: the peer is not under test for stray reads), and the peer's split workspace."""
    case = decode.make_inputs(
        decode.DecodeShape(N=N, block=block, lens=lens),
        dtype=dtype,
        device=DEVICE,
        seed=seed,
        q_layout="separate",
        unused="randn",
    )
    logits = torch.empty(case.shape.B, N, S, 513, device=DEVICE)
    return case, logits


def test_triton_mla_decode_calls_the_peer_as_forward_mqa_does():
    """A recording stand-in for decode_attention_fwd: q is cat(ql_nope, q_pe), o and lse start at 0,
    K is the cache viewed [pages, block, 1, 576] (no copy), V its first 512 columns, the split count
    is the workspace's, the page size the cache's, k_scale and v_scale the caller's tensor."""
    case, logits = _decode_inputs()
    ql, qp, cache, table, seq = case.args()
    scale = torch.full((1,), 0.5, device=DEVICE)
    seen = {}

    def peer(q, k, v, o, lse, bt, sl, att, S, sm_scale, page, **kw):
        seen.update(q=q.clone(), k=k, v=v, o0=o.clone(), lse0=lse.clone(), bt=bt, sl=sl, att=att, S=S)
        seen.update(sm_scale=sm_scale, page=page, kw=kw)
        o.fill_(7.0)

    o = vllm_triton_mla_decode(peer, ql, qp, cache, table, seq, logits, 0.125, scale)
    assert torch.equal(seen["q"], torch.cat((ql, qp), dim=-1)) and seen["q"].shape == (2, 4, 576)
    pages = cache.shape[0]
    assert seen["k"].shape == (pages, 16, 1, 576) and seen["k"].data_ptr() == cache.data_ptr()
    assert seen["v"].shape == (pages, 16, 1, 512) and seen["v"].data_ptr() == cache.data_ptr()
    assert not seen["o0"].any() and not seen["lse0"].any() and seen["o0"].shape == (2, 4, 512)
    assert seen["bt"] is table and seen["sl"] is seq and seen["att"] is logits and seen["S"] == 4
    assert seen["sm_scale"] == 0.125 and seen["page"] == 16
    assert seen["kw"]["k_scale"] is scale and seen["kw"]["v_scale"] is scale and seen["kw"]["is_mla"] is True
    assert (o == 7.0).all()  # the o the peer wrote is what comes back


_PEER_CHILD = r"""
import sys, torch
sys.path[:0] = ["tests/tools", "tests", ".", "perf"]
import test_benchutil_peers as t
from rocm_mla.cases import compare, decode, raise_on
from benchutil import load_vllm_peer, vllm_num_kv_splits, vllm_triton_mla_decode
fwd = load_vllm_peer(str(t.PEERS), "triton_decode_attention", "decode_attention_fwd")
assert fwd is not None and str(t.PEERS) in sys.modules["vllm"].__file__, sys.modules.get("vllm")
dtype = torch.bfloat16 if t.HAS_GPU else torch.float32
case, logits = t._decode_inputs(S=vllm_num_kv_splits(37, 4), dtype=dtype)
case.sm_scale = 0.1
o = vllm_triton_mla_decode(fwd, *case.args(), logits, 0.1, torch.ones(1, device=t.DEVICE))
ro, _ = case.reference()
raise_on(compare("vLLM's decode out", o, ro, decode.TOLERANCE[dtype]["out"]).problem)
print("peer ok")
"""


@pytest.mark.skipif(
    not (PEERS / "vllm" / "v1" / "attention" / "ops" / "triton_decode_attention.py").is_file(),
    reason="vLLM's Triton decode is not in .peers (perf/peers/get_vllm_peers.sh .peers makes it)",
)
def test_triton_mla_decode_with_vllms_kernel_matches_the_reference():
    """The real peer kernel (interpreter on the CPU) through the stand-in: the float32 reference's
    result, so the benchmarks' vLLM column times a correct call. In its own interpreter: once the
    suite has imported the installed vLLM, ``vllm`` would resolve there, not to the peer."""
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "0" if HAS_GPU else "1"))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", _PEER_CHILD], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and "peer ok" in proc.stdout, proc.stdout + proc.stderr
