// gdn_decode.cu: CUDA twin of the Gated DeltaNet decode on a V-major state (SPEC section 2), the
// contract of pmll_lab.ops.gdn.decode.gdn_decode(state_layout="vk"). Plain CUDA C++; the torch
// binding is gdn_decode_torch.cpp (built by pmll_lab/cuda_ext.py).
//
// Group w (kGdnLanes lanes) of block (b*HV + h, y) owns value row r = y*16 + w of head h of
// lane b. Per token, in
// fp32, in SPEC order: q, k <- l2norm (eps 1e-6, when asked), q <- q * scale; the gates from
// A_log, a, dt_bias, b when given (g = -exp(A_log) * softplus(a + dt_bias), threshold 20;
// beta = sigmoid(b)); then on the row h[:] = H[:, r]: h <- exp(g) * h, u = beta * (v[r] - h.k),
// h <- h + k u, o[r] = h.q; the row is stored rounded to the state's dtype (nearest even).
// Sums over keys: each lane's keys in order, then a butterfly over the row's group. A lane whose slot
// is -1 (padding) writes zeros to o and reads and writes no state. Not bitwise the Triton
// kernel (its sums run in another order): held to the float64 reference's tolerance. The
// per-token arithmetic is gdn_row.cuh's, which the chain's twin (gdn_chain.cu) runs per row.
#include "gdn_decode.cuh"

#include "gdn_row.cuh"

namespace pmll {
namespace {

using namespace gdn_row;

// TS, TI: the state's and the inputs' element types as constants (gdn_row::dispatch).
template <int P, GdnDtype TS, GdnDtype TI>
__global__ void __launch_bounds__(kGdnThreads) gdn_decode_vk_kernel(GdnDecodeArgs args) {
  GdnDecodeArgs a = args;
  a.ts = TS;
  a.ti = TI;
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.HV, h = bh % a.HV;
  const int64_t kh = h / (a.HV / a.HK);
  const int lane = threadIdx.x % kGdnLanes;
  const int64_t r = int64_t(blockIdx.y) * kGdnRowsPerBlock + threadIdx.x / kGdnLanes;
  const bool row = r < a.vd;  // rows past vd take part in the group sums only
  const int64_t slot = a.idx ? load_slot(a.idx, a.tidx, b) : b;
  const int64_t o_at = (b * a.HV + h) * a.vd + r;
  if (slot < 0) {  // padding lane (the whole block)
    if (row && lane == 0) store_f(a.o, a.to, o_at, 0.0f);
    return;
  }
  const int64_t oslot = a.out_idx ? load_slot(a.out_idx, a.tout_idx, b) : slot;
  const int64_t kd = row ? a.kd : 0;
  float q[P], k[P], hs[P];
  load_qk(a, b * a.q_b + kh * a.q_h, b * a.k_b + kh * a.k_h, lane, q, k);
  float decay, beta;
  load_gates(a, b * a.g_b + h, b * a.beta_b + h, h, decay, beta);
  load_row(a.state, a.ts, slot * a.s_slot + h * a.s_head + r * a.s_row, kd, lane, hs,
           a.vec_state);
  const float v = row ? load_f(a.v, a.ti, b * a.v_b + h * a.v_h + r) : 0.0f;
  const float o = advance_row(hs, q, k, decay, beta, v, kd, lane);
  store_row(a.state, a.ts, oslot * a.s_slot + h * a.s_head + r * a.s_row, kd, lane, hs,
            a.vec_state);
  if (row && lane == 0) store_f(a.o, a.to, o_at, o);
}

}  // namespace

cudaError_t gdn_decode_vk(const GdnDecodeArgs& a, cudaStream_t stream) {
  if (a.B * a.HV == 0 || a.vd == 0) return cudaSuccess;
  if (a.kd < 1 || a.kd > kGdnMaxKd || a.HK < 1 || a.HV % a.HK != 0) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(a.B * a.HV),
                  unsigned((a.vd + kGdnRowsPerBlock - 1) / kGdnRowsPerBlock));
  GdnDecodeArgs v = a;
  v.vec_state = gdn_row::vec_rows(a.state, a.ts, a.kd, {a.s_slot, a.s_head, a.s_row});
  v.vec_qk = gdn_row::vec_rows(a.q, a.ti, a.kd, {a.q_b, a.q_h})
             && gdn_row::vec_rows(a.k, a.ti, a.kd, {a.k_b, a.k_h});
  dispatch(a.kd, a.ts, a.ti, [&]<int P, GdnDtype TS, GdnDtype TI>() {
    gdn_decode_vk_kernel<P, TS, TI><<<grid, kGdnThreads, 0, stream>>>(v);
  });
  return cudaGetLastError();
}

}  // namespace pmll
