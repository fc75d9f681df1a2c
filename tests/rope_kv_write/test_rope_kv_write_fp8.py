"""fused_rope_mla_kv_write into fp8 caches (x / k_scale, e4m3fn and e4m3fnuz): every backend against
the quantised reference, uint8 storage, saturation and signed zero, every half value, and the
FP8 bit code of the HIP conversion against torch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from _util import DEVICE, DTYPES, backends
from rope_case import FP8_KINDS, check_fp8, make_case, run

from rocm_mla.reference.rope_kv_write import FP8_MAX, quantize_fp8_ref

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_cache(backend, fp8, is_neox, dtype):
    case = make_case(11, 8, 16, dtype, is_neox=is_neox, fp8=fp8, scale=0.8)
    run(case, backend)
    check_fp8(case)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
def test_fp8_uint8_storage(backend, fp8):
    """vLLM passes the FP8 cache as uint8: the kind comes from kv_cache_dtype."""
    case = make_case(7, 4, 16, torch.float32, fp8=fp8)
    name = {torch.float8_e4m3fn: "fp8_e4m3fn", torch.float8_e4m3fnuz: "fp8_e4m3fnuz"}[fp8]
    assert case.args()[5].dtype == torch.uint8
    case.run(backend=backend, kv_cache_dtype=name)  # the cache as uint8 storage
    check_fp8(case)


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
def test_fp8_saturates_and_signed_zero(backend, fp8):
    """Beyond +-max stores +-max (torch's plain .to() would store NaN); -0.0 and tiny negatives
    store 0x00 in fnuz (0x80 is its NaN); inf saturates too."""
    case = make_case(4, 2, 16, torch.float32, fp8=fp8, skip=())
    m = FP8_MAX[fp8]
    pattern = torch.tensor([1e6, -1e6, float("inf"), -float("inf"), -0.0, -1e-12, 0.0, m * 0.37 * 1.01], device=DEVICE)
    case.kv_c.copy_(pattern.repeat(64)[None, :].expand(4, 512))
    run(case, backend)
    rows = case.written_rows()[:, :8].view(fp8).float()
    assert not torch.isnan(rows).any(), "a finite or infinite input stored NaN"
    want = torch.tensor([m, -m, m, -m, 0.0, 0.0, 0.0, m], device=DEVICE)
    assert torch.equal(rows[0], want)
    codes = case.written_rows()[:, :8].view(torch.uint8)
    if fp8 == torch.float8_e4m3fnuz:
        assert (codes[:, 4:6] == 0).all(), "fnuz has no -0: 0x80 would read as NaN"
    else:
        assert (codes[:, 4:6] == 0x80).all(), "e4m3fn keeps the sign of zero, as torch does"


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("fp8", FP8_KINDS, ids=str)
@pytest.mark.parametrize("scale", [1.0, 7.0, 0.37])
def test_fp8_every_half_value(backend, fp8, scale):
    """Every float16 bit pattern (exact rounding ties, subnormals, inf, NaN included) through the
    kernel's latent path: the codes are torch's clamp(x / k_scale).to(fp8), bit for bit. At scale 7
    about 60 of these codes differ between x / 7 and x * (1 / 7): a division is what is checked."""
    T = 128
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    case = make_case(T, 1, 16, torch.float32, fp8=fp8, skip=())
    case.kv_c.copy_(x.view(T, 512).to(DEVICE))
    case.k_scale.fill_(scale)
    run(case, backend)
    want = quantize_fp8_ref(case.kv_c, case.k_scale, fp8).view(torch.uint8)
    got = case.written_rows()[:, :512].view(torch.uint8)
    bad = (got != want).nonzero()
    assert bad.shape[0] == 0, [(case.kv_c[i, j].item(), int(want[i, j]), int(got[i, j])) for i, j in bad[:5].tolist()]


def test_fp8_bit_code_matches_torch(tmp_path):
    """hip_src/kernels/fp8.cuh compiled for the host: every float16 value, 2^20 random float32 bit
    patterns and the edge cases, both kinds, against torch's clamp + .to(); and all 256 codes back."""
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = tmp_path / "fp8_check.cpp"
    src.write_text(r"""
#include <cstdio>
#include <vector>
#include "fp8.cuh"
using namespace rocm_mla;
int main(int, char** argv) {
  std::vector<float> x;
  float v;
  FILE* f = std::fopen(argv[1], "rb");
  while (std::fread(&v, 4, 1, f) == 1) x.push_back(v);
  std::fclose(f);
  FILE* o = std::fopen(argv[2], "wb");
  for (float y : x) { uint8_t c = fp8_e4m3_from_float<fp8_e4m3fn_format>(y); std::fwrite(&c, 1, 1, o); }
  for (float y : x) { uint8_t c = fp8_e4m3_from_float<fp8_e4m3fnuz_format>(y); std::fwrite(&c, 1, 1, o); }
  for (int c = 0; c < 256; ++c) { float d = fp8_e4m3_to_float<fp8_e4m3fn_format>(c); std::fwrite(&d, 4, 1, o); }
  for (int c = 0; c < 256; ++c) { float d = fp8_e4m3_to_float<fp8_e4m3fnuz_format>(c); std::fwrite(&d, 4, 1, o); }
  std::fclose(o);
  return 0;
}
""")
    exe = tmp_path / "fp8_check"
    subprocess.run(
        [cxx, "-std=c++17", "-O2", f"-I{ROOT / 'hip_src' / 'kernels'}", str(src), "-o", str(exe)],
        check=True,
        capture_output=True,
    )
    g = torch.Generator().manual_seed(3)
    halves = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    rnd = torch.randint(-(2**31), 2**31 - 1, (1 << 20,), generator=g, dtype=torch.int64)
    rnd = rnd.to(torch.int32).view(torch.float32)
    edges = torch.tensor(
        [
            0.0,
            -0.0,
            448,
            -448,
            464,
            464.1,
            480,
            240,
            247.9,
            248,
            248.1,
            1e30,
            float("inf"),
            -float("inf"),
            float("nan"),
            2**-6,
            2**-7,
            2**-9,
            2**-10,
            2**-11,
            1.5 * 2**-10,
            -(2**-12),
            3e-45,
            -1e-40,
            0.1,
            -0.3,
        ]
    )
    x = torch.cat((halves, rnd, edges)).contiguous()
    x.numpy().tofile(tmp_path / "in.bin")
    subprocess.run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    out = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.uint8)
    n = x.numel()
    for k, fp8 in enumerate(FP8_KINDS):
        want = x.clamp(-FP8_MAX[fp8], FP8_MAX[fp8]).to(fp8).view(torch.uint8)
        got = out[k * n : (k + 1) * n]
        bad = (got != want).nonzero().flatten()
        assert bad.numel() == 0, (fp8, [(x[i].item(), int(want[i]), int(got[i])) for i in bad[:5]])
        dec = out[2 * n + 1024 * k : 2 * n + 1024 * (k + 1)].view(torch.float32)
        ref = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8).float()
        same = (dec.view(torch.int32) == ref.view(torch.int32)) | (dec.isnan() & ref.isnan())
        assert same.all(), fp8
