// gdn_chain.cu: CUDA twin of the Gated DeltaNet chain with snapshots on a V-major state (SPEC
// section 3a), the contract of pmll_lab.ops.gdn.decode.gdn_chain(state_layout="vk"). Plain CUDA
// C++; the torch binding is gdn_decode_torch.cpp (gdn_chain_vk), built with the decode's twin.
//
// The decode's grid and lane groups (gdn_decode.cu): group w of block (b*HV + h, y) owns value
// row r = y*16 + w of head h of lane b, here for all K rows of the lane. The row is loaded once
// into registers; per row t, in order, the decode's token arithmetic (gdn_row.cuh: q, k,
// gates, advance_row) on row t's inputs writes o[b, t, h, r]; the register row is then
// rounded to the state's dtype (where K decodes would store and reload it) and, for t < K-1
// with snapshots asked for, stored to inter[b, t, h, r]; after the last row it is stored to
// the write slot. So the outputs, every snapshot and the final state are bitwise those of K
// successive decode twin launches. A lane whose slot is -1 (padding) writes zeros to its
// outputs and reads and writes no state and no snapshot.
#include "gdn_chain.cuh"

#include "gdn_row.cuh"

namespace pmll {
namespace {

using namespace gdn_row;

// TS, TI: the state's and the inputs' element types as constants (gdn_row::dispatch).
template <int P, GdnDtype TS, GdnDtype TI>
__global__ void __launch_bounds__(kGdnThreads, 2) gdn_chain_vk_kernel(GdnChainArgs c) {
  GdnDecodeArgs a = c.d;
  a.ts = TS;
  a.ti = TI;
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.HV, h = bh % a.HV;
  const int64_t kh = h / (a.HV / a.HK);
  const int lane = threadIdx.x % kGdnLanes;
  const int64_t r = int64_t(blockIdx.y) * kGdnRowsPerBlock + threadIdx.x / kGdnLanes;
  const bool row = r < a.vd;  // rows past vd take part in the group sums only
  const int64_t slot = a.idx ? load_slot(a.idx, a.tidx, b) : b;
  const int64_t o_step = a.HV * a.vd;                   // o [B, K, HV, vd]: one row
  const int64_t o_at = (b * c.K * a.HV + h) * a.vd + r;
  if (slot < 0) {  // padding lane (the whole block)
    if (row && lane == 0)
      for (int64_t t = 0; t < c.K; ++t) store_f(a.o, a.to, o_at + t * o_step, 0.0f);
    return;
  }
  const int64_t oslot = a.out_idx ? load_slot(a.out_idx, a.tout_idx, b) : slot;
  const int64_t kd = row ? a.kd : 0;
  float hs[P];
  load_row(a.state, a.ts, slot * a.s_slot + h * a.s_head + r * a.s_row, kd, lane, hs,
           a.vec_state);
#pragma unroll 1
  for (int t = 0; t < int(c.K); ++t) {
    float q[P], k[P];
    load_qk(a, b * a.q_b + t * c.q_t + kh * a.q_h, b * a.k_b + t * c.k_t + kh * a.k_h, lane,
            q, k);
    float decay, beta;
    load_gates(a, b * a.g_b + t * c.g_t + h, b * a.beta_b + t * c.beta_t + h, h, decay, beta);
    const float v = row ? load_f(a.v, a.ti, b * a.v_b + t * c.v_t + h * a.v_h + r) : 0.0f;
    const float o = advance_row(hs, q, k, decay, beta, v, kd, lane);
    round_row(a.ts, hs);
    if (c.inter && t < c.K - 1)
      store_row(c.inter, a.ts, b * c.i_b + t * c.i_t + h * c.i_h + r * c.i_row, kd, lane, hs,
                c.vec_inter);
    if (row && lane == 0) store_f(a.o, a.to, o_at + t * o_step, o);
  }
  store_row(a.state, a.ts, oslot * a.s_slot + h * a.s_head + r * a.s_row, kd, lane, hs,
            a.vec_state);
}

}  // namespace

cudaError_t gdn_chain_vk(const GdnChainArgs& c, cudaStream_t stream) {
  const GdnDecodeArgs& a = c.d;
  if (a.B * a.HV == 0 || a.vd == 0) return cudaSuccess;
  if (a.kd < 1 || a.kd > kGdnMaxKd || a.HK < 1 || a.HV % a.HK != 0 || c.K < 1)
    return cudaErrorInvalidValue;
  const dim3 grid(unsigned(a.B * a.HV),
                  unsigned((a.vd + kGdnRowsPerBlock - 1) / kGdnRowsPerBlock));
  const GdnChainArgs v = gdn_row::with_vec(c);
  dispatch(a.kd, a.ts, a.ti, [&]<int P, GdnDtype TS, GdnDtype TI>() {
    gdn_chain_vk_kernel<P, TS, TI><<<grid, kGdnThreads, 0, stream>>>(v);
  });
  return cudaGetLastError();
}

}  // namespace pmll
