// gdn_decode.cu: CUDA twin of the Gated DeltaNet decode on a V-major state (SPEC section 2), the
// contract of pmll_lab.ops.gdn.decode.gdn_decode(state_layout="vk"). Plain CUDA C++; the torch
// binding is gdn_decode_torch.cpp (built by pmll_lab/cuda_ext.py).
//
// Block (b*HV + h, y) owns value rows y*16R .. of head h of lane b; group w of its 16 lane
// groups (kGdnLanes lanes each) owns rows y*16R + i*16 + w, i < R (gdn_stage.cuh). The group's
// rows are loaded first; group 0 then stages the token's q, k and gates in shared memory (in
// fp32, in SPEC order: q, k <- l2norm (eps 1e-6, when asked), q <- q * scale; with A_log, a,
// dt_bias, b given g = -exp(A_log) * softplus(a + dt_bias), threshold 20, beta = sigmoid(b)).
// Per row h[:] = H[:, r]: h <- exp(g) * h, u = beta * (v[r] - h.k), h <- h + k u, o[r] = h.q;
// the row is stored rounded to the state's dtype (nearest even). Sums over keys: each lane's
// keys in order, then a butterfly over the row's group. A lane whose slot is -1 (padding)
// writes zeros to o and reads and writes no state. Not bitwise the Triton kernel (its sums run
// in another order): held to the float64 reference's tolerance. The per-token arithmetic is
// gdn_row.cuh's, which the chain's and the verify's twins run per row.
#include "gdn_decode.cuh"

#include "gdn_stage.cuh"

namespace pmll {
namespace {

using namespace gdn_row;

// P keys per lane, R rows per group, TS, TI: the state's and the inputs' element types.
template <int P, int R, GdnDtype TS, GdnDtype TI>
__global__ void __launch_bounds__(kGdnThreads) gdn_decode_vk_kernel(GdnDecodeArgs args) {
  GdnDecodeArgs a = args;
  a.ts = TS;
  a.ti = TI;
  constexpr bool FULL = R > 1;  // wide block: every key and row is in (rows_per_group)
  __shared__ Stage<P, R, 1> s;
  const Place p = place_of<R>(a.HV, a.HK);
  const int64_t slot = a.idx ? load_slot(a.idx, a.tidx, p.b) : p.b;
  const int64_t o_at = (p.b * a.HV + p.h) * a.vd;
  if (slot < 0) {  // padding lane (the whole block)
#pragma unroll
    for (int i = 0; i < R; ++i)
      if (p.row(i) < a.vd && p.lane == 0) store_f(a.o, a.to, o_at + p.row(i), 0.0f);
    return;
  }
  const int64_t oslot = a.out_idx ? load_slot(a.out_idx, a.tout_idx, p.b) : slot;
  float hs[R][P];
#pragma unroll
  for (int i = 0; i < R; ++i)  // rows past vd: kd 0 (zeros; they take part in the sums only)
    load_row<P, FULL>(a.state, a.ts, slot * a.s_slot + p.h * a.s_head + p.row(i) * a.s_row,
                      FULL || p.row(i) < a.vd ? a.kd : 0, p.lane, hs[i], a.vec_state);
  stage_rows(a, RowStrides{}, p, 0, 1, s);
  float q[P], k[P];
  keys_of(s.q[0], p.lane, q);
  keys_of(s.k[0], p.lane, k);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = p.row(i), kd = FULL || r < a.vd ? a.kd : 0;
    const float o = advance_row<P, FULL>(hs[i], q, k, s.decay[0], s.beta[0], s.v[0][p.rr(i)], kd,
                                         p.lane);
    store_row<P, FULL>(a.state, a.ts, oslot * a.s_slot + p.h * a.s_head + r * a.s_row, kd,
                       p.lane, hs[i], a.vec_state);
    if ((FULL || r < a.vd) && p.lane == 0) store_f(a.o, a.to, o_at + r, o);
  }
}

}  // namespace

cudaError_t gdn_decode_vk(const GdnDecodeArgs& a, cudaStream_t stream) {
  if (a.B * a.HV == 0 || a.vd == 0) return cudaSuccess;
  if (a.kd < 1 || a.kd > kGdnMaxKd || a.HK < 1 || a.HV % a.HK != 0) return cudaErrorInvalidValue;
  GdnDecodeArgs v = a;
  v.vec_state = gdn_row::vec_rows(a.state, a.ts, a.kd, {a.s_slot, a.s_head, a.s_row});
  v.vec_qk = gdn_row::vec_rows(a.q, a.ti, a.kd, {a.q_b, a.q_h})
             && gdn_row::vec_rows(a.k, a.ti, a.kd, {a.k_b, a.k_h});
  const int R = gdn_row::rows_per_group(a.B * a.HV, a.vd, a.kd, v.vec_state);
  const dim3 grid(unsigned(a.B * a.HV), gdn_row::row_blocks(a.vd, R));
  gdn_row::dispatch_rows(a.kd, R, a.ts, a.ti, [&]<int P, int RR, GdnDtype TS, GdnDtype TI>() {
    gdn_decode_vk_kernel<P, RR, TS, TI><<<grid, kGdnThreads, 0, stream>>>(v);
  });
  return cudaGetLastError();
}

}  // namespace pmll
