// gdn_row.cuh: device code shared by the GDN decode's and the chain's CUDA twins (gdn_decode.cu,
// gdn_chain.cu): element loads and stores, the token's q/k and gates, and the one-token update
// of a V-major state row (SPEC section 2). Included by .cu files only (it needs nvcc).
//
// Why shared: the chain must be bitwise K successive decodes (SPEC section 2, "Exactness"). Both
// kernels run these same inline functions per row, so each value sees the same operations in
// the same order (the same fused multiply-adds, the same butterfly sums); the chain rounds its
// register state to the state's dtype after every row (round_row), where the decode stores it.
#pragma once

#include "gdn_chain.cuh"
#include "gdn_decode.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>

namespace pmll {
namespace gdn_row {

constexpr int kPerMax = kGdnMaxKd / kGdnLanes;  // keys per lane, at most

// Keys per lane for a head of kd keys (the kernels' template parameter P): 4, 8, 16 or 32.
__host__ __device__ constexpr int keys_per_lane(int64_t kd) {
  return kd <= 4 * kGdnLanes ? 4 : kd <= 8 * kGdnLanes ? 8 : kd <= 16 * kGdnLanes ? 16 : 32;
}

// The kernel instance for kd's keys per lane and the state's element type: calls
// f.template operator()<P, TS>(). dispatch adds the inputs' element type TI. Why: with the
// element types as template constants every load_f / store_f / round_f switch folds away at
// compile time; the runtime switch per element cost the decode 1.7-3x (reports/perf-notes.md).
template <class F>
void dispatch_ts(int64_t kd, GdnDtype ts, F&& f) {
  auto by_ts = [&]<int P>() {
    switch (ts) {
      case GdnDtype::kBF16: f.template operator()<P, GdnDtype::kBF16>(); break;
      case GdnDtype::kF16: f.template operator()<P, GdnDtype::kF16>(); break;
      default: f.template operator()<P, GdnDtype::kF32>();
    }
  };
  switch (keys_per_lane(kd)) {
    case 4: by_ts.template operator()<4>(); break;
    case 8: by_ts.template operator()<8>(); break;
    case 16: by_ts.template operator()<16>(); break;
    default: by_ts.template operator()<32>();
  }
}

template <class F>
void dispatch(int64_t kd, GdnDtype ts, GdnDtype ti, F&& f) {
  dispatch_ts(kd, ts, [&]<int P, GdnDtype TS>() {
    switch (ti) {
      case GdnDtype::kBF16: f.template operator()<P, TS, GdnDtype::kBF16>(); break;
      case GdnDtype::kF16: f.template operator()<P, TS, GdnDtype::kF16>(); break;
      default: f.template operator()<P, TS, GdnDtype::kF32>();
    }
  });
}

__device__ __forceinline__ float load_f(const void* p, GdnDtype t, int64_t i) {
  switch (t) {
    case GdnDtype::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case GdnDtype::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_f(void* p, GdnDtype t, int64_t i, float x) {
  switch (t) {
    case GdnDtype::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); break;
    case GdnDtype::kF16: static_cast<__half*>(p)[i] = __float2half_rn(x); break;
    default: static_cast<float*>(p)[i] = x;
  }
}

// x as store_f then load_f would give it back: rounded to t (nearest even), as fp32.
__device__ __forceinline__ float round_f(GdnDtype t, float x) {
  switch (t) {
    case GdnDtype::kBF16: return __bfloat162float(__float2bfloat16_rn(x));
    case GdnDtype::kF16: return __half2float(__float2half_rn(x));
    default: return x;
  }
}

// The key of this lane's j-th register: runs of kGdnVec consecutive keys, the group's lanes
// side by side (lane l: keys 4l..4l+3, then 32 + 4l.., ...). Every key loop uses it, so the
// state row, q and k of a lane hold the same keys, in the same order, in every kernel.
__host__ __device__ __forceinline__ constexpr int64_t key_of(int j, int lane) {
  return int64_t(j / kGdnVec) * (kGdnVec * kGdnLanes) + lane * kGdnVec + (j % kGdnVec);
}

// Whether rows of kd elements of type t at p + (any combination of the strides) start on a
// kGdnVec-element boundary of an aligned address, so that load4 / store4 may read them.
inline bool vec_rows(const void* p, GdnDtype t, int64_t kd,
                     std::initializer_list<int64_t> strides) {
  const int64_t size = t == GdnDtype::kBF16 || t == GdnDtype::kF16 ? 2 : 4;  // as dispatch reads t
  if (p == nullptr || kd % kGdnVec != 0) return false;
  if (reinterpret_cast<uintptr_t>(p) % uintptr_t(kGdnVec * size) != 0) return false;
  for (int64_t s : strides)
    if (s % kGdnVec != 0) return false;
  return true;
}

// The chain's (and the verify's) arguments with the vector flags set: state rows, q and k rows
// (their row strides too) and the snapshot rows, each where vec_rows holds.
inline GdnChainArgs with_vec(const GdnChainArgs& c) {
  GdnChainArgs v = c;
  const GdnDecodeArgs& a = c.d;
  v.d.vec_state = vec_rows(a.state, a.ts, a.kd, {a.s_slot, a.s_head, a.s_row});
  v.d.vec_qk = vec_rows(a.q, a.ti, a.kd, {a.q_b, a.q_h, c.q_t})
               && vec_rows(a.k, a.ti, a.kd, {a.k_b, a.k_h, c.k_t});
  v.vec_inter = c.inter != nullptr && vec_rows(c.inter, a.ts, a.kd, {c.i_b, c.i_t, c.i_h, c.i_row});
  return v;
}

// kGdnVec consecutive elements at element offset i (aligned: vec_rows), as fp32.
__device__ __forceinline__ void load4(const void* p, GdnDtype t, int64_t i, float* x) {
  if (t == GdnDtype::kF32) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
  } else if (t == GdnDtype::kBF16) {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p) + i);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    x[0] = lo.x; x[1] = lo.y; x[2] = hi.x; x[3] = hi.y;
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __half*>(p) + i);
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
    const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
    x[0] = lo.x; x[1] = lo.y; x[2] = hi.x; x[3] = hi.y;
  }
}

// kGdnVec values stored at element offset i (aligned), each rounded to t as store_f rounds it.
__device__ __forceinline__ void store4(void* p, GdnDtype t, int64_t i, const float* x) {
  if (t == GdnDtype::kF32) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(x[0], x[1], x[2], x[3]);
  } else if (t == GdnDtype::kBF16) {
    const __nv_bfloat162 lo = __float22bfloat162_rn(make_float2(x[0], x[1]));
    const __nv_bfloat162 hi = __float22bfloat162_rn(make_float2(x[2], x[3]));
    uint2 raw;
    raw.x = *reinterpret_cast<const unsigned*>(&lo);
    raw.y = *reinterpret_cast<const unsigned*>(&hi);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p) + i) = raw;
  } else {
    const __half2 lo = __float22half2_rn(make_float2(x[0], x[1]));
    const __half2 hi = __float22half2_rn(make_float2(x[2], x[3]));
    uint2 raw;
    raw.x = *reinterpret_cast<const unsigned*>(&lo);
    raw.y = *reinterpret_cast<const unsigned*>(&hi);
    *reinterpret_cast<uint2*>(static_cast<__half*>(p) + i) = raw;
  }
}

__device__ __forceinline__ int64_t load_slot(const void* p, GdnDtype t, int64_t i) {
  return t == GdnDtype::kI32 ? int64_t(static_cast<const int32_t*>(p)[i])
                             : static_cast<const int64_t*>(p)[i];
}

// The sum over a row's group of kGdnLanes lanes (a butterfly inside the group; every lane of
// the warp takes part, so rows past vd run it too, on zeros).
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int off = kGdnLanes / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// This lane's keys d = key_of(j, lane) (lane: its index in the row's group) of one token's q
// and k (element offsets q_at, k_at of the head's first key): l2-normalised when asked (eps
// 1e-6), q times the scale; zeros past kd. Vector loads where a.vec_qk says the rows allow.
template <int P>
__device__ __forceinline__ void load_qk(const GdnDecodeArgs& a, int64_t q_at, int64_t k_at,
                                        int lane, float (&q)[P], float (&k)[P]) {
  static_assert(P % kGdnVec == 0, "keys per lane: whole runs of kGdnVec");
  if (a.vec_qk) {  // kd % kGdnVec == 0: a run is wholly inside kd or wholly past it
#pragma unroll
    for (int j = 0; j < P; j += kGdnVec) {
      const int64_t d = key_of(j, lane);
      if (d < a.kd) {
        load4(a.q, a.ti, q_at + d, q + j);
        load4(a.k, a.ti, k_at + d, k + j);
      } else {
#pragma unroll
        for (int e = 0; e < kGdnVec; ++e) q[j + e] = k[j + e] = 0.0f;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t d = key_of(j, lane);
      const bool in = d < a.kd;
      q[j] = in ? load_f(a.q, a.ti, q_at + d) : 0.0f;
      k[j] = in ? load_f(a.k, a.ti, k_at + d) : 0.0f;
    }
  }
  float qq = 0.0f, kk = 0.0f;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    qq += q[j] * q[j];
    kk += k[j] * k[j];
  }
  float qs = a.scale;
  float ks = 1.0f;
  if (a.l2norm) {
    qs *= rsqrtf(group_sum(qq) + 1e-6f);
    ks = rsqrtf(group_sum(kk) + 1e-6f);
  }
#pragma unroll
  for (int j = 0; j < P; ++j) {
    k[j] *= ks;
    q[j] *= qs;
  }
}

// The token's decay exp(g) and beta of value head h: g, beta read at g_at, beta_at, or with
// A_log given computed from a (at g_at), b (at beta_at), A_log[h], dt_bias[h]:
// g = -exp(A_log) * softplus(a + dt_bias) (PyTorch's threshold 20), beta = sigmoid(b).
// g_out: the log decay itself (what the carried-state verify stashes; decay = expf(g_out)).
__device__ __forceinline__ void load_gates(const GdnDecodeArgs& a, int64_t g_at, int64_t beta_at,
                                           int64_t h, float& decay, float& beta, float& g_out) {
  float g;
  if (a.A_log) {
    const float x = load_f(a.g, a.tg, g_at) + load_f(a.dt_bias, a.tdt, h);
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g = -expf(load_f(a.A_log, a.talog, h)) * sp;
    beta = 1.0f / (1.0f + expf(-load_f(a.beta, a.tbeta, beta_at)));
  } else {
    g = load_f(a.g, a.tg, g_at);
    beta = load_f(a.beta, a.tbeta, beta_at);
  }
  g_out = g;
  decay = expf(g);
}

__device__ __forceinline__ void load_gates(const GdnDecodeArgs& a, int64_t g_at, int64_t beta_at,
                                           int64_t h, float& decay, float& beta) {
  float g;
  load_gates(a, g_at, beta_at, h, decay, beta, g);
}

// This lane's keys of the state row at element offset at (zeros past kd), as fp32; vector
// loads when vec (vec_rows held for the row's pointer and strides; kd 0 or a multiple of
// kGdnVec). FULL: the caller guarantees kd = kGdnLanes * P and vec (a full row, no key past
// kd in any lane), so no key is checked: the row kernels' wide-block form (gdn_stage.cuh).
template <int P, bool FULL = false>
__device__ __forceinline__ void load_row(const void* p, GdnDtype t, int64_t at, int64_t kd,
                                         int lane, float (&hs)[P], bool vec = false) {
  static_assert(P % kGdnVec == 0, "keys per lane: whole runs of kGdnVec");
  if (FULL || vec) {
#pragma unroll
    for (int j = 0; j < P; j += kGdnVec) {
      const int64_t d = key_of(j, lane);
      if (FULL || d < kd) {
        load4(p, t, at + d, hs + j);
      } else {
#pragma unroll
        for (int e = 0; e < kGdnVec; ++e) hs[j + e] = 0.0f;
      }
    }
    return;
  }
  if constexpr (!FULL) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t d = key_of(j, lane);
      hs[j] = d < kd ? load_f(p, t, at + d) : 0.0f;
    }
  }
}

// This lane's keys of hs stored at element offset at, rounded to t; vector stores when vec.
// FULL as in load_row.
template <int P, bool FULL = false>
__device__ __forceinline__ void store_row(void* p, GdnDtype t, int64_t at, int64_t kd, int lane,
                                          const float (&hs)[P], bool vec = false) {
  static_assert(P % kGdnVec == 0, "keys per lane: whole runs of kGdnVec");
  if (FULL || vec) {
#pragma unroll
    for (int j = 0; j < P; j += kGdnVec) {
      const int64_t d = key_of(j, lane);
      if (FULL || d < kd) store4(p, t, at + d, hs + j);
    }
    return;
  }
  if constexpr (!FULL) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int64_t d = key_of(j, lane);
      if (d < kd) store_f(p, t, at + d, hs[j]);
    }
  }
}

// hs rounded to t in place, as a store and a reload would leave it. Two values per conversion
// (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32, SASS F2FP): the same nearest-even bits as one
// conversion per value (F2F, a quarter-rate instruction on sm_90) at fewer issue slots.
template <int P>
__device__ __forceinline__ void round_row(GdnDtype t, float (&hs)[P]) {
  if (t == GdnDtype::kF32) return;
#pragma unroll
  for (int j = 0; j + 1 < P; j += 2) {
    if (t == GdnDtype::kBF16) {
      const float2 r = __bfloat1622float2(__float22bfloat162_rn(make_float2(hs[j], hs[j + 1])));
      hs[j] = r.x;
      hs[j + 1] = r.y;
    } else {
      const float2 r = __half22float2(__float22half2_rn(make_float2(hs[j], hs[j + 1])));
      hs[j] = r.x;
      hs[j + 1] = r.y;
    }
  }
  if (P % 2) hs[P - 1] = round_f(t, hs[P - 1]);
}

// One token on the row h = H[:, r] (hs: this lane's keys, zeros past kd; q, k from load_qk;
// v = v[r]), in place, in fp32: h <- decay * h, u = beta * (v - h.k), h <- h + k u; returns
// o[r] = h.q (every lane) and u (every lane: the carried-state verify stashes it). Sums: each
// lane's keys in order, then the group's butterfly (every lane of the group gets the same bits:
// each step adds a commutative pair). The state update is, per key, decay * h rounded (the
// product sits behind the select of keys past kd, so no add can absorb it), then one fma
// (k, u, that): nvcc -O3 contracted the plain `h += k * u` to exactly that fma before it was
// spelt with __fmaf_rn (the SASS of the decode and the chain is byte-identical either way,
// CUDA 13.0, sm_90a); spelt out so that fold_row below, which has no h.k and no select
// around an add, rounds the same way by construction, not by the compiler's contraction.
// FULL (no key past kd: load_row's): the select is left out; every key's bits are the same.
template <int P, bool FULL = false>
__device__ __forceinline__ float advance_row(float (&hs)[P], const float (&q)[P],
                                             const float (&k)[P], float decay, float beta,
                                             float v, int64_t kd, int lane, float& u_out) {
  float hk = 0.0f;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int64_t d = key_of(j, lane);
    hs[j] = FULL || d < kd ? decay * hs[j] : 0.0f;
    hk += hs[j] * k[j];
  }
  const float u = beta * (v - group_sum(hk));
  float oq = 0.0f;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    hs[j] = __fmaf_rn(k[j], u, hs[j]);
    oq += hs[j] * q[j];
  }
  u_out = u;
  return group_sum(oq);
}

template <int P, bool FULL = false>
__device__ __forceinline__ float advance_row(float (&hs)[P], const float (&q)[P],
                                             const float (&k)[P], float decay, float beta,
                                             float v, int64_t kd, int lane) {
  float u;
  return advance_row<P, FULL>(hs, q, k, decay, beta, v, kd, lane, u);
}

// One stashed row folded into the row h = H[:, r] (SPEC section 3b): h <- decay * h + k u,
// decay = expf(g) of the stashed log decay, k the stashed normalised key (this lane's keys,
// zeros past kd), u = u[r] the stashed correction; the same two roundings per key as
// advance_row's update (decay * h rounded, then fma(k, u, .)), so folding the rows a verify
// stashed gives the bits the decode of those rows stored (before the caller's round_row).
template <int P, bool FULL = false>
__device__ __forceinline__ void fold_row(float (&hs)[P], const float (&k)[P], float decay,
                                         float u, int64_t kd, int lane) {
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int64_t d = key_of(j, lane);
    hs[j] = __fmaf_rn(k[j], u, FULL || d < kd ? decay * hs[j] : 0.0f);
  }
}

}  // namespace gdn_row
}  // namespace pmll
