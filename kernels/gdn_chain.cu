// gdn_chain.cu: CUDA twin of the Gated DeltaNet chain with snapshots on a V-major state (SPEC
// section 3a), the contract of pmll_lab.ops.gdn.decode.gdn_chain(state_layout="vk"). Plain CUDA
// C++; the torch binding is gdn_decode_torch.cpp (gdn_chain_vk), built with the decode's twin.
//
// The decode's blocks and lane groups (gdn_decode.cu, gdn_stage.cuh): each group keeps its R
// value rows in registers for all K rows of the lane. The rows' inputs are staged kGdnStage at a
// time (q, k, gates, v: the decode's code, in shared memory); per row t, in order, the decode's
// token arithmetic (advance_row) writes o[b, t, h, r]; the register row is then rounded to the
// state's dtype (where K decodes would store and reload it) and, for t < K-1 with snapshots
// asked for, stored to inter[b, t, h, r]; after the last row it is stored to the write slot.
// So the outputs, every snapshot and the final state are bitwise those of K successive decode
// twin launches. A lane whose slot is -1 (padding) writes zeros to its outputs and reads and
// writes no state and no snapshot.
#include "gdn_chain.cuh"

#include "gdn_stage.cuh"

namespace pmll {
namespace {

using namespace gdn_row;

// P keys per lane, R rows per group, TS, TI: the state's and the inputs' element types.
template <int P, int R, GdnDtype TS, GdnDtype TI>
__global__ void __launch_bounds__(kGdnThreads, 2) gdn_chain_vk_kernel(GdnChainArgs c) {
  GdnDecodeArgs a = c.d;
  a.ts = TS;
  a.ti = TI;
  constexpr bool FULL = R > 1;  // wide block: every key and row is in (rows_per_group)
  __shared__ Stage<P, R, kGdnStage> s;
  const Place p = place_of<R>(a.HV, a.HK);
  const int64_t slot = a.idx ? load_slot(a.idx, a.tidx, p.b) : p.b;
  const int64_t o_step = a.HV * a.vd;                   // o [B, K, HV, vd]: one row
  const int64_t o_at = (p.b * c.K * a.HV + p.h) * a.vd;
  if (slot < 0) {  // padding lane (the whole block)
#pragma unroll
    for (int i = 0; i < R; ++i)
      if (p.row(i) < a.vd && p.lane == 0)
        for (int64_t t = 0; t < c.K; ++t) store_f(a.o, a.to, o_at + t * o_step + p.row(i), 0.0f);
    return;
  }
  const int64_t oslot = a.out_idx ? load_slot(a.out_idx, a.tout_idx, p.b) : slot;
  float hs[R][P];
#pragma unroll
  for (int i = 0; i < R; ++i)
    load_row<P, FULL>(a.state, a.ts, slot * a.s_slot + p.h * a.s_head + p.row(i) * a.s_row,
                      FULL || p.row(i) < a.vd ? a.kd : 0, p.lane, hs[i], a.vec_state);
  const RowStrides st{c.q_t, c.k_t, c.v_t, c.g_t, c.beta_t};
#pragma unroll 1
  for (int64_t t0 = 0; t0 < c.K; t0 += kGdnStage) {
    const int n = int(c.K - t0 < kGdnStage ? c.K - t0 : kGdnStage);
    if (t0 > 0) __syncthreads();  // the last pass's reads of s are done
    stage_rows(a, st, p, t0, n, s);
#pragma unroll 1
    for (int tt = 0; tt < n; ++tt) {
      const int64_t t = t0 + tt;
      float q[P], k[P];
      keys_of(s.q[tt], p.lane, q);
      keys_of(s.k[tt], p.lane, k);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t r = p.row(i), kd = FULL || r < a.vd ? a.kd : 0;
        const float o = advance_row<P, FULL>(hs[i], q, k, s.decay[tt], s.beta[tt],
                                             s.v[tt][p.rr(i)], kd, p.lane);
        round_row(a.ts, hs[i]);
        if (c.inter && t < c.K - 1)
          store_row<P, FULL>(c.inter, a.ts, p.b * c.i_b + t * c.i_t + p.h * c.i_h + r * c.i_row,
                             kd, p.lane, hs[i], c.vec_inter);
        if ((FULL || r < a.vd) && p.lane == 0) store_f(a.o, a.to, o_at + t * o_step + r, o);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i)
    store_row<P, FULL>(a.state, a.ts, oslot * a.s_slot + p.h * a.s_head + p.row(i) * a.s_row,
                       FULL || p.row(i) < a.vd ? a.kd : 0, p.lane, hs[i], a.vec_state);
}

}  // namespace

cudaError_t gdn_chain_vk(const GdnChainArgs& c, cudaStream_t stream) {
  const GdnDecodeArgs& a = c.d;
  if (a.B * a.HV == 0 || a.vd == 0) return cudaSuccess;
  if (a.kd < 1 || a.kd > kGdnMaxKd || a.HK < 1 || a.HV % a.HK != 0 || c.K < 1)
    return cudaErrorInvalidValue;
  const GdnChainArgs v = gdn_row::with_vec(c);
  const int R = gdn_row::rows_per_group(a.B * a.HV, a.vd, a.kd,
                                        v.d.vec_state && (!c.inter || v.vec_inter));
  const dim3 grid(unsigned(a.B * a.HV), gdn_row::row_blocks(a.vd, R));
  gdn_row::dispatch_rows(a.kd, R, a.ts, a.ti, [&]<int P, int RR, GdnDtype TS, GdnDtype TI>() {
    gdn_chain_vk_kernel<P, RR, TS, TI><<<grid, kGdnThreads, 0, stream>>>(v);
  });
  return cudaGetLastError();
}

}  // namespace pmll
