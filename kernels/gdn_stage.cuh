// gdn_stage.cuh: the GDN twins' block layout (R value rows per lane group) and the per-token
// inputs a block stages once in shared memory (SPEC section 2: q, k normalised, the gates, v).
// Included by .cu files only (it needs nvcc).
//
// Why: a block used to recompute every token's q/k norms and gates in each of its 16 lane
// groups and, in the chain and the verify, to read them from global memory inside the row loop,
// one memory latency per row; and with one 512-byte (fp32) or 256-byte (bf16) row per group in
// flight, the decode's bytes in flight per SM capped it at the fraction of the copy bandwidth
// Little's law gives (0.69 fp32, 0.35 bf16: run h200-2026-12-04f). Staged, a row loop reads
// shared memory only, and a group holds R rows whose loads are all issued before the first use.
//
// Bits: group t stages row t with load_qk and load_gates, the code every lane ran before, so
// every kernel of the family still sees the same values; which rows a group owns does not
// change any row's sums (each row's keys, order and butterfly are key_of's and group_sum's).
#pragma once

#include "gdn_row.cuh"

namespace pmll {
namespace gdn_row {

constexpr int kGdnStage = 8;                           // token (or stash) rows per staging pass
#ifndef PMLL_GDN_WIDE_ROWS
#define PMLL_GDN_WIDE_ROWS 4
#endif
constexpr int kGdnWideRows = PMLL_GDN_WIDE_ROWS;       // value rows per group, wide blocks
#ifndef PMLL_GDN_WIDE_MIN_BLOCKS
#define PMLL_GDN_WIDE_MIN_BLOCKS 256
#endif
constexpr int64_t kGdnWideMinBlocks = PMLL_GDN_WIDE_MIN_BLOCKS;  // fewest wide blocks a launch takes
constexpr int kGdnGroups = kGdnThreads / kGdnLanes;    // 16 lane groups per block
constexpr int kGdnGroupsPerWarp = kGdnWarp / kGdnLanes;

// Value rows per lane group for a launch of lanes_heads (b, h) pairs: kGdnWideRows (a wide
// block, FULL: no key or row checked) where the rows are full -- kd = kGdnLanes * (keys per
// lane) <= 128, vd a multiple of the wide block's rows, every row loaded and stored as vectors
// (vec: vec_rows held for each buffer) -- and the grid keeps >= kGdnWideMinBlocks (256) wide
// blocks; else 1 (the smallest batches keep more, smaller blocks in flight; 256 against 1024 and
// 128: reports/perf-notes.md, "Launch constants: GDN decode and chain"). Both constants are
// macros so that a tuning build can change them (cuda_ext.load(defines=...)).
inline int rows_per_group(int64_t lanes_heads, int64_t vd, int64_t kd, bool vec) {
  const int P = keys_per_lane(kd);
  const int64_t rows = int64_t(kGdnWideRows) * kGdnGroups;
  if (!vec || P > 16 || kd != int64_t(P) * kGdnLanes || vd % rows != 0) return 1;
  return lanes_heads * (vd / rows) >= kGdnWideMinBlocks ? kGdnWideRows : 1;
}

// The instance for kd's keys per lane, R, and the element types: f.template operator()<P, R,
// TS, TI>(). R = kGdnWideRows is instantiated only where P <= 16 (rows_per_group never asks
// otherwise); the kernels take R > 1 as FULL.
template <class F>
void dispatch_rows(int64_t kd, int R, GdnDtype ts, GdnDtype ti, F&& f) {
  dispatch(kd, ts, ti, [&]<int P, GdnDtype TS, GdnDtype TI>() {
    if constexpr (P <= 16) {
      if (R == kGdnWideRows) {
        f.template operator()<P, kGdnWideRows, TS, TI>();
        return;
      }
    }
    f.template operator()<P, 1, TS, TI>();
  });
}

__host__ __device__ constexpr int64_t block_rows(int R) { return int64_t(R) * kGdnGroups; }

inline unsigned row_blocks(int64_t vd, int R) {
  return unsigned((vd + block_rows(R) - 1) / block_rows(R));
}

// Where a thread sits: lane b and value head h of block x, key head kh, its lane in the group,
// and the group's R rows row0 + i*16 + w (interleaved, so a warp's rows are adjacent).
struct Place {
  int64_t b, h, kh, row0;
  int lane, w;
  __device__ __forceinline__ int64_t row(int i) const { return row0 + int64_t(i) * kGdnGroups + w; }
  __device__ __forceinline__ int rr(int i) const { return i * kGdnGroups + w; }  // in the block
};

template <int R>
__device__ __forceinline__ Place place_of(int64_t HV, int64_t HK) {
  Place p;
  p.b = blockIdx.x / HV;
  p.h = blockIdx.x % HV;
  p.kh = p.h / (HV / HK);
  p.lane = threadIdx.x % kGdnLanes;
  p.w = threadIdx.x / kGdnLanes;
  p.row0 = int64_t(blockIdx.y) * block_rows(R);
  return p;
}

// NT rows staged for a block of R rows per group with P keys per lane: q, k (zeros past kd),
// the gates, and per value row of the block v (or, staging stash rows: k, decay, u).
template <int P, int R, int NT>
struct Stage {
  static constexpr int kKeys = P * kGdnLanes;
  static constexpr int kRows = R * kGdnGroups;
  __align__(16) float q[NT][kKeys];
  __align__(16) float k[NT][kKeys];
  float v[NT][kRows];
  float decay[NT], beta[NT], g[NT];
};

// Element strides of consecutive rows t of q, k, v, g and beta (0 for the decode's one row).
struct RowStrides {
  int64_t q = 0, k = 0, v = 0, g = 0, beta = 0;
};

// Rows t0 .. t0+n-1 (n <= NT) of lane p.b into s, then __syncthreads: group t runs load_qk and
// (lane 0) load_gates for row t0+t, the code each lane ran before; the warps that hold no
// such group skip it (the rest of a warp's groups repeat its last row, so every lane of a warp
// takes part in load_qk's butterflies); every thread then loads v for the block's rows.
template <int P, int R, int NT>
__device__ __forceinline__ void stage_rows(const GdnDecodeArgs& a, const RowStrides& st,
                                           const Place& p, int64_t t0, int n,
                                           Stage<P, R, NT>& s) {
  using S = Stage<P, R, NT>;
  if (p.w / kGdnGroupsPerWarp < (n + kGdnGroupsPerWarp - 1) / kGdnGroupsPerWarp) {
    const int tt = p.w < n ? p.w : n - 1;
    const int64_t t = t0 + tt;
    float q[P], k[P];
    load_qk(a, p.b * a.q_b + t * st.q + p.kh * a.q_h, p.b * a.k_b + t * st.k + p.kh * a.k_h,
            p.lane, q, k);
    if (p.w < n) {
#pragma unroll
      for (int j = 0; j < P; ++j) {
        s.q[tt][key_of(j, p.lane)] = q[j];
        s.k[tt][key_of(j, p.lane)] = k[j];
      }
      if (p.lane == 0) {
        float decay, beta, g;
        load_gates(a, p.b * a.g_b + t * st.g + p.h, p.b * a.beta_b + t * st.beta + p.h, p.h,
                   decay, beta, g);
        s.decay[tt] = decay;
        s.beta[tt] = beta;
        s.g[tt] = g;
      }
    }
  }
  for (int e = threadIdx.x; e < n * S::kRows; e += kGdnThreads) {
    const int t = e / S::kRows, rr = e % S::kRows;
    const int64_t r = p.row0 + rr;
    s.v[t][rr] = r < a.vd ? load_f(a.v, a.ti, p.b * a.v_b + (t0 + t) * st.v + p.h * a.v_h + r)
                          : 0.0f;
  }
  __syncthreads();
}

// This lane's keys of a staged row (q or k) into registers: 16-byte shared-memory loads.
template <int P>
__device__ __forceinline__ void keys_of(const float* row, int lane, float (&x)[P]) {
#pragma unroll
  for (int j = 0; j < P; j += kGdnVec) {
    const float4 f = *reinterpret_cast<const float4*>(row + key_of(j, lane));
    x[j] = f.x;
    x[j + 1] = f.y;
    x[j + 2] = f.z;
    x[j + 3] = f.w;
  }
}

}  // namespace gdn_row
}  // namespace pmll
