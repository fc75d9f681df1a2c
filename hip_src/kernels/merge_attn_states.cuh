// merge_attn_states: LSE merge of two partial attention results, any strides.
//
// out[t, h, :] = w_p * prefix[t, h, :] + w_s * suffix[t, h, :]
//   w_p = exp(lse_p - m) / (exp(lse_p - m) + exp(lse_s - m)),  m = max(lse_p, lse_s)
// lse +inf is read as -inf (FlashAttention's "saw no key"); both -inf -> row 0, lse -inf.
// A side whose weight is 0 is not read at all, so an unwritten (NaN) side cannot leak.
// A NaN lse propagates: that row's out and lse are NaN (NaN never means "no key").
//
// Thread mapping: one thread owns VEC x UNROLL consecutive elements of one (token, head) row;
// rows are token-major so neighbouring threads touch neighbouring heads of one token.
// The launcher lives in ../merge_attn_states.cu; rocm_mla/ops/merge.py is the only caller.
#pragma once

#include "portable.cuh"

namespace rocm_mla {

struct MergeParams {
  int64_t num_tokens;
  int64_t num_heads;
  int64_t head_size;
  // element strides: [token, head, dim] for outputs, [head, token] for lse
  int64_t out_st, out_sh, out_sd;
  int64_t pre_st, pre_sh, pre_sd;
  int64_t suf_st, suf_sh, suf_sd;
  int64_t plse_sh, plse_st;
  int64_t slse_sh, slse_st;
  int64_t olse_sh, olse_st;
};

MLA_DEVICE float mla_inf() { return __int_as_float(0x7f800000); }

// VEC == 1: any dim stride, UNROLL 1. VEC > 1: dim stride 1, rows and pointers 16-byte
// aligned (the launcher checks this); a thread moves UNROLL consecutive 16-byte vectors of one
// row per operand, all loads issued before any math, so each thread keeps 2 x UNROLL x 16 bytes
// in flight and computes the row's weights once.
// Index: uint32_t when every flat index fits (the launcher decides), because the row/chunk
// divisions are a few instructions in 32 bits and a library call in 64.
template <typename Tag, int VEC, int UNROLL, typename Index>
__global__ void merge_attn_states_kernel(typename elem<Tag>::storage* __restrict__ out,
                                         float* __restrict__ out_lse,
                                         const typename elem<Tag>::storage* __restrict__ prefix,
                                         const float* __restrict__ prefix_lse,
                                         const typename elem<Tag>::storage* __restrict__ suffix,
                                         const float* __restrict__ suffix_lse,
                                         const MergeParams p) {
  using E = elem<Tag>;
  using S = typename E::storage;
  static_assert(VEC == 1 || VEC * sizeof(S) == 16, "vector path moves 16 bytes");
  static_assert(VEC > 1 || UNROLL == 1, "the any-stride path is not unrolled");
  constexpr int kPerThread = VEC * UNROLL;
  // head_size 0: one group per row, which writes out_lse only (the data part is skipped below).
  const Index groups = p.head_size > 0 ? static_cast<Index>((p.head_size + kPerThread - 1) / kPerThread)
                                       : Index{1};
  const Index heads = static_cast<Index>(p.num_heads);
  const Index total = static_cast<Index>(p.num_tokens) * heads * groups;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index idx = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += stride) {
    const Index row = idx / groups;
    const int64_t g = idx - row * groups;
    const int64_t t = row / heads;
    const int64_t h = row - static_cast<Index>(t) * heads;

    const float inf = mla_inf();
    float lp = prefix_lse[h * p.plse_sh + t * p.plse_st];
    float ls = suffix_lse[h * p.slse_sh + t * p.slse_st];
    lp = (lp == inf) ? -inf : lp;
    ls = (ls == inf) ? -inf : ls;
    const float m = fmaxf(lp, ls);
    float wp = 0.f, ws = 0.f, lse = -inf;
    // A NaN lse (a side that saw a NaN) poisons the row: NaN weights, out and lse. fmaxf returns
    // the non-NaN operand, so without this fmaxf(NaN, -inf) = -inf would drop the poisoned side
    // as "saw no key". (x != x: the build has no fast-math.)
    if (lp != lp || ls != ls) {
      wp = ws = lse = __int_as_float(0x7fc00000);
    } else if (m != -inf) {
      const float ep = __expf(lp - m);
      const float es = __expf(ls - m);
      const float sum = ep + es;
      wp = ep / sum;
      ws = es / sum;
      lse = __logf(sum) + m;
    }
    if (out_lse != nullptr && g == 0) out_lse[h * p.olse_sh + t * p.olse_st] = lse;

    const int64_t d0 = g * kPerThread;
    if (d0 >= p.head_size) continue;  // head_size 0 only: no element to merge
    if constexpr (VEC > 1) {
      const vec16_t* src_p = reinterpret_cast<const vec16_t*>(prefix + t * p.pre_st + h * p.pre_sh + d0);
      const vec16_t* src_s = reinterpret_cast<const vec16_t*>(suffix + t * p.suf_st + h * p.suf_sh + d0);
      vec16_t* dst = reinterpret_cast<vec16_t*>(out + t * p.out_st + h * p.out_sh + d0);
      vec16_t vp[UNROLL], vs[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        vp[u] = {};
        vs[u] = {};
        if (wp != 0.f) vp[u] = src_p[u];
        if (ws != 0.f) vs[u] = src_s[u];
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const S* ep = reinterpret_cast<const S*>(&vp[u]);
        const S* es = reinterpret_cast<const S*>(&vs[u]);
        vec16_t vo;
        S* eo = reinterpret_cast<S*>(&vo);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          // select, not multiply: a zero-weight side contributes exactly 0 (never 0 * NaN).
          const float a = (wp != 0.f) ? wp * E::to_float(ep[i]) : 0.f;
          const float b = (ws != 0.f) ? ws * E::to_float(es[i]) : 0.f;
          eo[i] = E::from_float(a + b);
        }
        dst[u] = vo;
      }
    } else {
      const float a = (wp != 0.f) ? wp * E::to_float(prefix[t * p.pre_st + h * p.pre_sh + d0 * p.pre_sd]) : 0.f;
      const float b = (ws != 0.f) ? ws * E::to_float(suffix[t * p.suf_st + h * p.suf_sh + d0 * p.suf_sd]) : 0.f;
      out[t * p.out_st + h * p.out_sh + d0 * p.out_sd] = E::from_float(a + b);
    }
  }
}

}  // namespace rocm_mla
