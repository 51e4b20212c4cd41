// gdn_carry.cu: CUDA twins of the carried-state GDN verify (exact form, eager and lazy) and of
// its flush on a V-major state (SPEC section 3b), the contract of
// pmll_lab.carry.gdn_carry_verify / gdn_carry_flush(state_layout="vk"). Plain CUDA C++; the
// torch binding is gdn_decode_torch.cpp (gdn_carry_verify_vk, gdn_carry_flush_vk), built with
// the decode's and the chain's twins.
//
// Blocks and lane groups are the decode's (gdn_decode.cu, gdn_stage.cuh): group w of block
// (b*HV + h, y) keeps its R value rows of head h of lane b in registers (the flush adds the
// layer as blockIdx.z). The arithmetic is gdn_row.cuh's: each verified row runs the decode's
// token code (staged q, k, gates, v; advance_row) on the rows, rounded to the state's dtype after
// every row as the chain does; each pending row is folded by fold_row (h <- decay * h + k u,
// the same two roundings as advance_row's update) and rounded likewise, its k, decay = expf(g)
// and u staged in shared memory kGdnStage rows at a time. So outputs, written-back and flushed
// states are bitwise those of decode-twin launches of the accepted rows.
//
// Verify of lane b (slot = slot_tab[b], p = pend[slot]): load the rows, fold stash rows 0..p-1;
// write them back when the protocol says so (eager: p > 0; lazy: p + K > CAP); run the K rows,
// o[b, t, h, r] and the stash rows first + t (first = 0 after a write-back, else p): u_t[h][r]
// by each row's group, and the head's g_t[h], k_t[h][:] (shared by the head's blocks) by one
// block, from the staged rows. Shared rows (SPEC 3b): after a write-back the new g/k rows
// overwrite rows 0.. that other blocks of the head may still be folding, so each block counts
// itself in arrive[slot, h] once its fold is done (__syncthreads, then one atomicAdd between two
// fences) and the last to arrive writes the g/k rows and sets the count back to 0; without a
// write-back they go to rows p.., which no block of the launch reads, and block 0 writes them.
// engaged[b] (2 after a write-back, else 1) is written by block (h = 0, y = 0). A padding lane
// (slot -1) writes zero outputs and engaged 1, and reads or writes no state, stash, pend or
// count.
//
// Flush: every block of (layer, lane b, head h) with p = pend_l[slot] > 0 folds its rows'
// pending stash rows into the state and stores it; pend is the caller's to clear.
#include "gdn_carry.cuh"

#include "gdn_stage.cuh"

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

// Stash rows i0 .. i0+n-1 (n <= NT) of one head into s, then __syncthreads: k (zeros past kd),
// decay = expf(g) and u of the block's rows.
template <int P, int R, int NT>
__device__ __forceinline__ void stage_stash(const HeadStash& st, int64_t kd, int64_t vd,
                                            int64_t row0, int64_t i0, int n,
                                            Stage<P, R, NT>& s) {
  using S = Stage<P, R, NT>;
  for (int e = threadIdx.x; e < n * S::kKeys; e += kGdnThreads) {
    const int t = e / S::kKeys, d = e % S::kKeys;
    s.k[t][d] = d < kd ? st.k[(i0 + t) * st.k_row + d] : 0.0f;
  }
  for (int e = threadIdx.x; e < n * S::kRows; e += kGdnThreads) {
    const int t = e / S::kRows, rr = e % S::kRows;
    s.v[t][rr] = row0 + rr < vd ? st.u[(i0 + t) * st.u_row + row0 + rr] : 0.0f;
  }
  if (threadIdx.x < n) s.decay[threadIdx.x] = expf(st.g[(i0 + threadIdx.x) * st.g_row]);
  __syncthreads();
}

// Stash rows 0..p-1 folded into the group's R rows (hs), oldest first, each rounded to ts
// where a decode of that row would have stored the state. Every thread of the block takes part
// (the staging's barriers); ends with the block's last reads of s done.
template <int P, int R, int NT>
__device__ __forceinline__ void fold_pending(float (&hs)[R][P], const HeadStash& st, int64_t p,
                                             const Place& pl, int64_t kd, int64_t vd,
                                             GdnDtype ts, Stage<P, R, NT>& s) {
#pragma unroll 1
  for (int64_t i0 = 0; i0 < p; i0 += NT) {
    const int n = int(p - i0 < NT ? p - i0 : NT);
    if (i0 > 0) __syncthreads();
    stage_stash(st, kd, vd, pl.row0, i0, n, s);
#pragma unroll 1
    for (int t = 0; t < n; ++t) {
      float k[P];
      keys_of(s.k[t], pl.lane, k);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        fold_row<P, (R > 1)>(hs[i], k, s.decay[t], s.v[t][pl.rr(i)], pl.row(i) < vd ? kd : 0,
                             pl.lane);
        round_row(ts, hs[i]);
      }
    }
  }
  __syncthreads();
}

// P keys per lane, R rows per group, TS, TI: the state's and the inputs' element types.
template <int P, int R, GdnDtype TS, GdnDtype TI>
__global__ void __launch_bounds__(kGdnThreads, 2) gdn_carry_verify_vk_kernel(GdnCarryArgs v) {
  const GdnChainArgs& c = v.c;
  GdnDecodeArgs a = c.d;
  a.ts = TS;
  a.ti = TI;
  constexpr bool FULL = R > 1;  // wide block: every key and row is in (rows_per_group)
  __shared__ Stage<P, R, kGdnStage> s;
  __shared__ int last_to_arrive;
  const Place pl = place_of<R>(a.HV, a.HK);
  const int64_t b = pl.b, h = pl.h;
  const bool flag_writer = h == 0 && blockIdx.y == 0 && threadIdx.x == 0;
  const int64_t slot = load_slot(a.idx, a.tidx, b);
  const int64_t o_step = a.HV * a.vd;                   // o [B, K, HV, vd]: one row
  const int64_t o_at = (b * c.K * a.HV + h) * a.vd;
  if (slot < 0) {  // padding lane (the whole block)
#pragma unroll
    for (int i = 0; i < R; ++i)
      if (pl.row(i) < a.vd && pl.lane == 0)
        for (int64_t t = 0; t < c.K; ++t) store_f(a.o, a.to, o_at + t * o_step + pl.row(i), 0.0f);
    if (flag_writer) v.engaged[b] = 1;
    return;
  }
  const int64_t p = v.pend[slot];
  const bool wb = v.lazy ? p + c.K > v.cap : p > 0;
  const int64_t first = wb ? 0 : p;
  const HeadStash st = head_stash(v.stash + slot * v.stash_slot, h, v.cap, a.HV, a.kd, a.vd);
  const int64_t h_at = slot * a.s_slot + h * a.s_head;
  float hs[R][P];
#pragma unroll
  for (int i = 0; i < R; ++i)
    load_row<P, FULL>(a.state, a.ts, h_at + pl.row(i) * a.s_row,
                      FULL || pl.row(i) < a.vd ? a.kd : 0, pl.lane, hs[i], a.vec_state);
  fold_pending(hs, st, p, pl, a.kd, a.vd, a.ts, s);  // ends with a barrier: every fold read done

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
#pragma unroll
    for (int i = 0; i < R; ++i)
      store_row<P, FULL>(a.state, a.ts, h_at + pl.row(i) * a.s_row,
                         FULL || pl.row(i) < a.vd ? a.kd : 0, pl.lane, hs[i], a.vec_state);
  } else {
    restash = blockIdx.y == 0;
  }

  const RowStrides rs{c.q_t, c.k_t, c.v_t, c.g_t, c.beta_t};
#pragma unroll 1
  for (int64_t t0 = 0; t0 < c.K; t0 += kGdnStage) {
    const int n = int(c.K - t0 < kGdnStage ? c.K - t0 : kGdnStage);
    if (t0 > 0) __syncthreads();  // the last pass's reads of s are done
    stage_rows(a, rs, pl, t0, n, s);
#pragma unroll 1
    for (int tt = 0; tt < n; ++tt) {
      const int64_t srow = first + t0 + tt;  // stash row
      float q[P], k[P];
      keys_of(s.q[tt], pl.lane, q);
      keys_of(s.k[tt], pl.lane, k);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t r = pl.row(i), kd = FULL || r < a.vd ? a.kd : 0;
        float u;
        const float o = advance_row<P, FULL>(hs[i], q, k, s.decay[tt], s.beta[tt],
                                             s.v[tt][pl.rr(i)], kd, pl.lane, u);
        round_row(a.ts, hs[i]);
        if ((FULL || r < a.vd) && pl.lane == 0) {
          store_f(a.o, a.to, o_at + (t0 + tt) * o_step + r, o);
          st.u[srow * st.u_row + r] = u;
        }
      }
    }
    if (restash) {  // the staged normalised k rows and log decays: the head's stash rows
      for (int e = threadIdx.x; e < n * int(a.kd); e += kGdnThreads) {
        const int t = e / int(a.kd), d = e % int(a.kd);
        st.k[(first + t0 + t) * st.k_row + d] = s.k[t][d];
      }
      if (threadIdx.x < n) st.g[(first + t0 + threadIdx.x) * st.g_row] = s.g[threadIdx.x];
    }
  }
  if (wb && restash && threadIdx.x == 0) v.arrive[slot * a.HV + h] = 0;  // every block arrived
  if (flag_writer) v.engaged[b] = wb ? 2 : 1;
}

// One value row per group (R = 1): the layers' state offsets live on the device, so the launch
// cannot tell whether every layer's rows allow vectors; the flush runs once per accepted step.
template <int P, GdnDtype TS>
__global__ void __launch_bounds__(kGdnThreads) gdn_carry_flush_vk_kernel(GdnFlushArgs fa) {
  constexpr int R = 1;
  GdnFlushArgs f = fa;
  f.ts = TS;
  __shared__ Stage<P, R, kGdnStage> s;
  const Place pl = place_of<R>(f.HV, 1);
  const int64_t layer = blockIdx.z;
  const int64_t slot = load_slot(f.idx, f.tidx, pl.b);
  if (slot < 0) return;   // padding lane (the whole block)
  const int64_t p = f.pend[f.pend_off[layer] + slot];
  if (p <= 0) return;
  const HeadStash st = head_stash(f.stash + f.stash_off[layer] + slot * f.stash_slot, pl.h,
                                  f.cap, f.HV, f.kd, f.vd);
  const int64_t h_at = f.state_off[layer] + slot * f.s_slot + pl.h * f.s_head;
  float hs[R][P];
#pragma unroll
  for (int i = 0; i < R; ++i)
    load_row(f.state, f.ts, h_at + pl.row(i) * f.s_row, pl.row(i) < f.vd ? f.kd : 0, pl.lane,
             hs[i]);
  fold_pending(hs, st, p, pl, f.kd, f.vd, f.ts, s);
#pragma unroll
  for (int i = 0; i < R; ++i)
    store_row(f.state, f.ts, h_at + pl.row(i) * f.s_row, pl.row(i) < f.vd ? f.kd : 0, pl.lane,
              hs[i]);
}

}  // namespace

cudaError_t gdn_carry_verify_vk(const GdnCarryArgs& v, cudaStream_t stream) {
  const GdnDecodeArgs& a = v.c.d;
  if (a.B * a.HV == 0 || a.vd == 0) return cudaSuccess;
  if (a.kd < 1 || a.kd > kGdnMaxKd || a.HK < 1 || a.HV % a.HK != 0 || v.c.K < 1
      || v.c.K > v.cap || !a.idx || !v.stash || !v.pend || !v.engaged || !v.arrive)
    return cudaErrorInvalidValue;
  GdnCarryArgs w = v;
  w.c = gdn_row::with_vec(v.c);   // the stash rows stay element by element
  const int R = gdn_row::rows_per_group(a.B * a.HV, a.vd, a.kd, w.c.d.vec_state);
  const dim3 grid(unsigned(a.B * a.HV), gdn_row::row_blocks(a.vd, R));
  gdn_row::dispatch_rows(a.kd, R, a.ts, a.ti, [&]<int P, int RR, GdnDtype TS, GdnDtype TI>() {
    gdn_carry_verify_vk_kernel<P, RR, TS, TI><<<grid, kGdnThreads, 0, stream>>>(w);
  });
  return cudaGetLastError();
}

cudaError_t gdn_carry_flush_vk(const GdnFlushArgs& f, cudaStream_t stream) {
  if (f.B * f.HV == 0 || f.vd == 0 || f.L == 0) return cudaSuccess;
  if (f.kd < 1 || f.kd > kGdnMaxKd || f.L > 65535 || !f.idx) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(f.B * f.HV), gdn_row::row_blocks(f.vd, 1), unsigned(f.L));
  gdn_row::dispatch_ts(f.kd, f.ts, [&]<int P, GdnDtype TS>() {
    gdn_carry_flush_vk_kernel<P, TS><<<grid, kGdnThreads, 0, stream>>>(f);
  });
  return cudaGetLastError();
}

}  // namespace pmll
