// gdn_carry.cu: CUDA twins of the carried-state GDN verify (exact form, eager and lazy) and of
// its flush on a V-major state (SPEC section 3b), the contract of
// pmll_lab.carry.gdn_carry_verify / gdn_carry_flush(state_layout="vk"). Plain CUDA C++; the
// torch binding is gdn_decode_torch.cpp (gdn_carry_verify_vk, gdn_carry_flush_vk), built with
// the decode's and the chain's twins.
//
// Grid and lane groups are the decode's (gdn_decode.cu): group w of block (b*HV + h, y) owns
// value row r = y*16 + w of head h of lane b (the flush adds the layer as blockIdx.z). The
// arithmetic is gdn_row.cuh's: each verified row runs the decode's token code (load_qk,
// load_gates, advance_row) on the row kept in registers, rounded to the state's dtype after
// every row as the chain does; each pending row is folded by fold_row (h <- decay * h + k u, the
// same two roundings as advance_row's update) and rounded likewise. So outputs, written-back
// and flushed states are bitwise those of decode-twin launches of the accepted rows.
//
// Verify of lane b (slot = slot_tab[b], p = pend[slot]): load the row, fold stash rows 0..p-1;
// write it back when the protocol says so (eager: p > 0; lazy: p + K > CAP); run the K rows,
// o[b, t, h, r] and the stash rows first + t (first = 0 after a write-back, else p): u_t[h][r]
// by each row's group, and the head's g_t[h], k_t[h][:] (shared by the head's blocks) by one
// block. Shared rows (SPEC 3b): after a write-back the new g/k rows overwrite rows 0.. that
// other blocks of the head may still be folding, so each block counts itself in arrive[slot, h]
// once its fold is done (__syncthreads, then one atomicAdd between two fences) and the last to
// arrive writes the g/k rows and sets the count back to 0; without a write-back they go to rows
// p.., which no block of the launch reads, and block 0 writes them. engaged[b] (2 after a
// write-back, else 1) is written by block (h = 0, y = 0). A padding lane (slot -1) writes zero
// outputs and engaged 1, and reads or writes no state, stash, pend or count.
//
// Flush: every block of (layer, lane b, head h) with p = pend_l[slot] > 0 folds its rows'
// pending stash rows into the state and stores it; pend is the caller's to clear.
#include "gdn_carry.cuh"

#include "gdn_row.cuh"

namespace pmll {
namespace {

using namespace gdn_row;

// Head h's rows in one slot's stash s (GdnCarry's layout): row i of u at u + i*u_row (then + r),
// of g at g + i*g_row, of k at k + i*k_row (then + key).
struct HeadStash {
  float* u;
  float* g;
  float* k;
  int64_t u_row, g_row, k_row;
};

__device__ __forceinline__ HeadStash head_stash(float* s, int64_t h, int64_t cap, int64_t HV,
                                                int64_t kd, int64_t vd) {
  HeadStash t;
  t.u = s + h * vd;
  t.g = s + cap * HV * vd + h;
  t.k = s + cap * HV * vd + cap * HV + h * kd;
  t.u_row = HV * vd;
  t.g_row = HV;
  t.k_row = HV * kd;
  return t;
}

// Stash rows 0..p-1 folded into value row r (hs: this lane's keys), oldest first, each rounded
// to ts where a decode of that row would have stored the state.
template <int P>
__device__ __forceinline__ void fold_pending(float (&hs)[P], const HeadStash& st, int64_t p,
                                             int64_t r, int64_t kd, int lane, GdnDtype ts) {
#pragma unroll 1
  for (int64_t i = 0; i < p; ++i) {
    float k[P];
    load_row(st.k, GdnDtype::kF32, i * st.k_row, kd, lane, k);
    const float decay = expf(st.g[i * st.g_row]);
    fold_row(hs, k, decay, st.u[i * st.u_row + r], kd, lane);
    round_row(ts, hs);
  }
}

// TS, TI: the state's and the inputs' element types as constants (gdn_row::dispatch).
template <int P, GdnDtype TS, GdnDtype TI>
__global__ void __launch_bounds__(kGdnThreads, 2) gdn_carry_verify_vk_kernel(GdnCarryArgs v) {
  const GdnChainArgs& c = v.c;
  GdnDecodeArgs a = c.d;
  a.ts = TS;
  a.ti = TI;
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.HV, h = bh % a.HV;
  const int64_t kh = h / (a.HV / a.HK);
  const int lane = threadIdx.x % kGdnLanes;
  const int64_t r = int64_t(blockIdx.y) * kGdnRowsPerBlock + threadIdx.x / kGdnLanes;
  const bool row = r < a.vd;  // rows past vd take part in the group sums only
  const bool flag_writer = h == 0 && blockIdx.y == 0 && threadIdx.x == 0;
  const int64_t slot = load_slot(a.idx, a.tidx, b);
  const int64_t o_step = a.HV * a.vd;                   // o [B, K, HV, vd]: one row
  const int64_t o_at = (b * c.K * a.HV + h) * a.vd + r;
  if (slot < 0) {  // padding lane (the whole block)
    if (row && lane == 0)
      for (int64_t t = 0; t < c.K; ++t) store_f(a.o, a.to, o_at + t * o_step, 0.0f);
    if (flag_writer) v.engaged[b] = 1;
    return;
  }
  const int64_t p = v.pend[slot];
  const bool wb = v.lazy ? p + c.K > v.cap : p > 0;
  const int64_t first = wb ? 0 : p;
  const HeadStash st = head_stash(v.stash + slot * v.stash_slot, h, v.cap, a.HV, a.kd, a.vd);
  const int64_t kd = row ? a.kd : 0;
  const int64_t h_at = slot * a.s_slot + h * a.s_head + r * a.s_row;
  float hs[P];
  load_row(a.state, a.ts, h_at, kd, lane, hs, a.vec_state);
  if (row) fold_pending(hs, st, p, r, kd, lane, a.ts);

  __shared__ int last_to_arrive;
  __syncthreads();  // every fold load of this block is done
  bool restash;     // this block writes the head's g/k stash rows
  if (wb) {
    if (threadIdx.x == 0) {
      __threadfence();
      const int before = atomicAdd(v.arrive + slot * a.HV + h, 1);
      __threadfence();
      last_to_arrive = before == int(gridDim.y) - 1;
    }
    __syncthreads();
    restash = last_to_arrive != 0;
    store_row(a.state, a.ts, h_at, kd, lane, hs, a.vec_state);
  } else {
    restash = blockIdx.y == 0;
  }

#pragma unroll 1
  for (int t = 0; t < int(c.K); ++t) {
    float q[P], k[P];
    load_qk(a, b * a.q_b + t * c.q_t + kh * a.q_h, b * a.k_b + t * c.k_t + kh * a.k_h, lane,
            q, k);
    float decay, beta, g;
    load_gates(a, b * a.g_b + t * c.g_t + h, b * a.beta_b + t * c.beta_t + h, h, decay, beta, g);
    const float x = row ? load_f(a.v, a.ti, b * a.v_b + t * c.v_t + h * a.v_h + r) : 0.0f;
    float u;
    const float o = advance_row(hs, q, k, decay, beta, x, kd, lane, u);
    round_row(a.ts, hs);
    const int64_t s = first + t;  // stash row
    if (row && lane == 0) {
      store_f(a.o, a.to, o_at + t * o_step, o);
      st.u[s * st.u_row + r] = u;
    }
    if (restash && threadIdx.x < kGdnLanes) {  // group 0: row y*16 < vd, its k is the head's
      store_row(st.k, GdnDtype::kF32, s * st.k_row, a.kd, lane, k);
      if (threadIdx.x == 0) st.g[s * st.g_row] = g;
    }
  }
  if (wb && restash && threadIdx.x == 0) v.arrive[slot * a.HV + h] = 0;  // every block arrived
  if (flag_writer) v.engaged[b] = wb ? 2 : 1;
}

template <int P, GdnDtype TS>
__global__ void __launch_bounds__(kGdnThreads) gdn_carry_flush_vk_kernel(GdnFlushArgs fa) {
  GdnFlushArgs f = fa;
  f.ts = TS;
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / f.HV, h = bh % f.HV;
  const int lane = threadIdx.x % kGdnLanes;
  const int64_t r = int64_t(blockIdx.y) * kGdnRowsPerBlock + threadIdx.x / kGdnLanes;
  const int64_t layer = blockIdx.z;
  if (r >= f.vd) return;  // a fold has no group sums: rows past vd have nothing to do
  const int64_t slot = load_slot(f.idx, f.tidx, b);
  if (slot < 0) return;   // padding lane
  const int64_t p = f.pend[f.pend_off[layer] + slot];
  if (p <= 0) return;
  const HeadStash st = head_stash(f.stash + f.stash_off[layer] + slot * f.stash_slot, h, f.cap,
                                  f.HV, f.kd, f.vd);
  const int64_t h_at = f.state_off[layer] + slot * f.s_slot + h * f.s_head + r * f.s_row;
  float hs[P];
  load_row(f.state, f.ts, h_at, f.kd, lane, hs);
  fold_pending(hs, st, p, r, f.kd, lane, f.ts);
  store_row(f.state, f.ts, h_at, f.kd, lane, hs);
}

dim3 row_grid(int64_t lanes_heads, int64_t vd, int64_t layers = 1) {
  return dim3(unsigned(lanes_heads), unsigned((vd + kGdnRowsPerBlock - 1) / kGdnRowsPerBlock),
              unsigned(layers));
}

}  // namespace

cudaError_t gdn_carry_verify_vk(const GdnCarryArgs& v, cudaStream_t stream) {
  const GdnDecodeArgs& a = v.c.d;
  if (a.B * a.HV == 0 || a.vd == 0) return cudaSuccess;
  if (a.kd < 1 || a.kd > kGdnMaxKd || a.HK < 1 || a.HV % a.HK != 0 || v.c.K < 1
      || v.c.K > v.cap || !a.idx || !v.stash || !v.pend || !v.engaged || !v.arrive)
    return cudaErrorInvalidValue;
  const dim3 grid = row_grid(a.B * a.HV, a.vd);
  GdnCarryArgs w = v;
  w.c = gdn_row::with_vec(v.c);   // the flush and the stash rows stay element by element
  dispatch(a.kd, a.ts, a.ti, [&]<int P, GdnDtype TS, GdnDtype TI>() {
    gdn_carry_verify_vk_kernel<P, TS, TI><<<grid, kGdnThreads, 0, stream>>>(w);
  });
  return cudaGetLastError();
}

cudaError_t gdn_carry_flush_vk(const GdnFlushArgs& f, cudaStream_t stream) {
  if (f.B * f.HV == 0 || f.vd == 0 || f.L == 0) return cudaSuccess;
  if (f.kd < 1 || f.kd > kGdnMaxKd || f.L > 65535 || !f.idx) return cudaErrorInvalidValue;
  const dim3 grid = row_grid(f.B * f.HV, f.vd, f.L);
  dispatch_ts(f.kd, f.ts, [&]<int P, GdnDtype TS>() {
    gdn_carry_flush_vk_kernel<P, TS><<<grid, kGdnThreads, 0, stream>>>(f);
  });
  return cudaGetLastError();
}

}  // namespace pmll
