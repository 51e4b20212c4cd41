// pmll_ring.cu: CUDA twins of the PMLL ring's gated write and chronological read (SPEC 1),
// the same contract as the Triton kernels in pmll_lab/ops/pmll/ring.py. Plain CUDA C++; the
// torch binding is pmll_ring_torch.cpp (built only on a GPU machine, pmll_lab/cuda_ext.py).
//
// Write: warp w of block (bh, y) owns the ring slot hit first by token t = y*4 + w of the
// segment (t < min(Tn, M)); it also folds every later token on that slot (t + M, t + 2M, ...)
// in token order. Each slot has one owner, so Tn > M gives the sequential result, race-free.
// The blend g*new + (1-g)*old is computed in fp32 without FMA contraction (two rounded
// products and a rounded sum, as PyTorch computes it) and rounded to T after every token.
// Without a gate only the last token on a slot matters: a copy, the old row is not read.
//
// Read: warp w of block (bh, y) writes output row r = y*4 + w: the live row of chronological
// index i = r - (M - length) from slot (count - length + i) % M, or zeros.
//
// Both have a 16-byte form (below) taken wherever every row starts on a 16-byte boundary: the
// general kernels move one 2- or 4-byte element per lane and step, which reached 39-73 % of the
// copy bandwidth on an H200 (reports/h200-2026-12-04e; the Triton kernels 89-95 %).
#include <initializer_list>

#include "pmll_common.cuh"

namespace pmll {
namespace {

template <typename T, typename G, bool kGate>
__global__ void __launch_bounds__(kThreads) ring_write_kernel(WriteArgs a) {
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.H, h = bh % a.H;
  const int lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.y) * kRowsPerBlock + threadIdx.x / kWarp;
  if (t >= (a.T < a.M ? a.T : a.M)) return;
  const int64_t slot = (a.count[b] + t) % a.M;
  T* km = static_cast<T*>(a.k_mem) + (bh * a.M + slot) * a.D;
  T* vm = static_cast<T*>(a.v_mem) + (bh * a.M + slot) * a.D;
  const T* kn = static_cast<const T*>(a.k_new) + b * a.s_kb + h * a.s_kh;
  const T* vn = static_cast<const T*>(a.v_new) + b * a.s_vb + h * a.s_vh;
  if constexpr (!kGate) {
    const int64_t last = t + ((a.T - 1 - t) / a.M) * a.M;
    for (int64_t d = lane; d < a.D; d += kWarp) {
      km[d] = kn[last * a.s_kt + d];
      vm[d] = vn[last * a.s_vt + d];
    }
  } else {
    const G* gp = static_cast<const G*>(a.gate) + b * a.s_gb + h * a.s_gh;
    for (int64_t d = lane; d < a.D; d += kWarp) {
      float ak = to_f32(km[d]), av = to_f32(vm[d]);
      for (int64_t tt = t; tt < a.T; tt += a.M) {
        const float g = to_f32(gp[tt * a.s_gt]);
        const float keep = __fsub_rn(1.0f, g);
        ak = to_f32(from_f32<T>(__fadd_rn(__fmul_rn(g, to_f32(kn[tt * a.s_kt + d])),
                                          __fmul_rn(keep, ak))));
        av = to_f32(from_f32<T>(__fadd_rn(__fmul_rn(g, to_f32(vn[tt * a.s_vt + d])),
                                          __fmul_rn(keep, av))));
      }
      km[d] = from_f32<T>(ak);
      vm[d] = from_f32<T>(av);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ring_read_kernel(ReadArgs a) {
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.H;
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t(blockIdx.y) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= a.R) return;
  const int64_t n = a.count[b];
  const int64_t length = n < a.M ? n : a.M;
  const int64_t i = r - (a.M - length);
  T* ko = static_cast<T*>(a.k_out) + (bh * a.R + r) * a.D;
  T* vo = static_cast<T*>(a.v_out) + (bh * a.R + r) * a.D;
  if (r < a.M && i >= 0) {
    const int64_t slot = ((n - length) + i) % a.M;
    const T* ks = static_cast<const T*>(a.k_mem) + (bh * a.M + slot) * a.D;
    const T* vs = static_cast<const T*>(a.v_mem) + (bh * a.M + slot) * a.D;
    for (int64_t d = lane; d < a.D; d += kWarp) {
      ko[d] = ks[d];
      vo[d] = vs[d];
    }
  } else {
    const T zero = from_f32<T>(0.0f);
    for (int64_t d = lane; d < a.D; d += kWarp) {
      ko[d] = zero;
      vo[d] = zero;
    }
  }
}

// ---- 16-byte vectors -------------------------------------------------------------------------
// Where every row starts on a 16-byte boundary (rows of D * sizeof(T) bytes, a multiple of 16;
// aligned bases and strides), thread j of a head's block row moves one 16-byte chunk c of row
// r = j / C (C = D * sizeof(T) / 16 chunks per row), so a warp's loads are 512 contiguous
// bytes across rows, with 32-bit indices inside a head. Per element the arithmetic is the
// scalar kernels' (the same blend, the same rounding after every token): the same bits.
constexpr int kVecThreads = 256;
constexpr int kVecBytes = 16;

template <typename T>
struct Chunk {
  static constexpr int kN = kVecBytes / int(sizeof(T));
  union {
    uint4 raw;
    T x[kN];
  };
};

template <typename T, typename G, bool kGate>
__global__ void __launch_bounds__(kVecThreads) ring_write_vec_kernel(WriteArgs a, int C,
                                                                      int first) {
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.H, h = bh % a.H;
  const int j = int(blockIdx.y) * kVecThreads + int(threadIdx.x);
  if (j >= first * C) return;
  const int t = j / C, c = j % C;
  const int64_t slot = (a.count[b] + t) % a.M;
  uint4* km = reinterpret_cast<uint4*>(static_cast<T*>(a.k_mem) + (bh * a.M + slot) * a.D) + c;
  uint4* vm = reinterpret_cast<uint4*>(static_cast<T*>(a.v_mem) + (bh * a.M + slot) * a.D) + c;
  const T* kn = static_cast<const T*>(a.k_new) + b * a.s_kb + h * a.s_kh;
  const T* vn = static_cast<const T*>(a.v_new) + b * a.s_vb + h * a.s_vh;
  constexpr int kN = Chunk<T>::kN;
  if constexpr (!kGate) {
    const int64_t last = t + ((a.T - 1 - t) / a.M) * a.M;
    *km = reinterpret_cast<const uint4*>(kn + last * a.s_kt)[c];
    *vm = reinterpret_cast<const uint4*>(vn + last * a.s_vt)[c];
  } else {
    const G* gp = static_cast<const G*>(a.gate) + b * a.s_gb + h * a.s_gh;
    Chunk<T> ok, ov;
    ok.raw = *km;
    ov.raw = *vm;
    float ak[kN], av[kN];
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      ak[e] = to_f32(ok.x[e]);
      av[e] = to_f32(ov.x[e]);
    }
    for (int64_t tt = t; tt < a.T; tt += a.M) {
      const float g = to_f32(gp[tt * a.s_gt]);
      const float keep = __fsub_rn(1.0f, g);
      Chunk<T> nk, nv;
      nk.raw = reinterpret_cast<const uint4*>(kn + tt * a.s_kt)[c];
      nv.raw = reinterpret_cast<const uint4*>(vn + tt * a.s_vt)[c];
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        ak[e] = to_f32(from_f32<T>(__fadd_rn(__fmul_rn(g, to_f32(nk.x[e])),
                                             __fmul_rn(keep, ak[e]))));
        av[e] = to_f32(from_f32<T>(__fadd_rn(__fmul_rn(g, to_f32(nv.x[e])),
                                             __fmul_rn(keep, av[e]))));
      }
    }
#pragma unroll
    for (int e = 0; e < kN; ++e) {
      ok.x[e] = from_f32<T>(ak[e]);
      ov.x[e] = from_f32<T>(av[e]);
    }
    *km = ok.raw;
    *vm = ov.raw;
  }
}

template <typename T>
__global__ void __launch_bounds__(kVecThreads) ring_read_vec_kernel(ReadArgs a, int C) {
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.H;
  const int j = int(blockIdx.y) * kVecThreads + int(threadIdx.x);
  if (j >= int(a.R) * C) return;
  const int r = j / C, c = j % C;
  const int64_t n = a.count[b];
  const int64_t length = n < a.M ? n : a.M;
  const int64_t i = r - (a.M - length);
  uint4* ko = reinterpret_cast<uint4*>(static_cast<T*>(a.k_out) + (bh * a.R + r) * a.D) + c;
  uint4* vo = reinterpret_cast<uint4*>(static_cast<T*>(a.v_out) + (bh * a.R + r) * a.D) + c;
  if (r < a.M && i >= 0) {
    const int64_t slot = ((n - length) + i) % a.M;
    *ko = reinterpret_cast<const uint4*>(static_cast<const T*>(a.k_mem) + (bh * a.M + slot) * a.D)[c];
    *vo = reinterpret_cast<const uint4*>(static_cast<const T*>(a.v_mem) + (bh * a.M + slot) * a.D)[c];
  } else {
    *ko = make_uint4(0u, 0u, 0u, 0u);  // +0.0 in every dtype
    *vo = make_uint4(0u, 0u, 0u, 0u);
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) % kVecBytes) == 0; }

// Chunks per row, or 0 where the 16-byte kernels do not apply (a row or stride off 16 bytes,
// a head's chunks past 32-bit indices or past the grid's 65535 block rows).
template <typename T>
int vec_chunks(int64_t D, int64_t rows, std::initializer_list<int64_t> strides,
               std::initializer_list<const void*> ptrs) {
  constexpr int64_t n = kVecBytes / int64_t(sizeof(T));
  if (D % n != 0) return 0;
  for (int64_t s : strides)
    if (s % n != 0) return 0;
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) return 0;
  const int64_t C = D / n, total = rows * C;
  if (total >= (int64_t(1) << 31) || (total + kVecThreads - 1) / kVecThreads > 65535) return 0;
  return int(C);
}

template <typename T, typename G>
cudaError_t launch_write(const WriteArgs& a, cudaStream_t stream) {
  const int64_t first = a.T < a.M ? a.T : a.M;
  const int C = vec_chunks<T>(a.D, first, {a.s_kb, a.s_kh, a.s_kt, a.s_vb, a.s_vh, a.s_vt},
                              {a.k_mem, a.v_mem, a.k_new, a.v_new});
  if (C > 0) {
    const dim3 grid(unsigned(a.B * a.H), unsigned((first * C + kVecThreads - 1) / kVecThreads));
    if (a.gate == nullptr)
      ring_write_vec_kernel<T, float, false><<<grid, kVecThreads, 0, stream>>>(a, C, int(first));
    else
      ring_write_vec_kernel<T, G, true><<<grid, kVecThreads, 0, stream>>>(a, C, int(first));
    return cudaGetLastError();
  }
  const dim3 grid(unsigned(a.B * a.H), unsigned((first + kRowsPerBlock - 1) / kRowsPerBlock));
  if (a.gate == nullptr)  // one ungated copy per T (G unused): instantiated for G = float only
    ring_write_kernel<T, float, false><<<grid, kThreads, 0, stream>>>(a);
  else
    ring_write_kernel<T, G, true><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t write_for_gate(const WriteArgs& a, Dtype gate, cudaStream_t stream) {
  if (a.gate == nullptr) return launch_write<T, float>(a, stream);
  switch (gate) {
    case Dtype::kF32: return launch_write<T, float>(a, stream);
    case Dtype::kBF16: return launch_write<T, __nv_bfloat16>(a, stream);
    case Dtype::kF16: return launch_write<T, __half>(a, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_read(const ReadArgs& a, cudaStream_t stream) {
  const int C = vec_chunks<T>(a.D, a.R, {}, {a.k_mem, a.v_mem, a.k_out, a.v_out});
  if (C > 0) {
    const dim3 grid(unsigned(a.B * a.H), unsigned((a.R * C + kVecThreads - 1) / kVecThreads));
    ring_read_vec_kernel<T><<<grid, kVecThreads, 0, stream>>>(a, C);
    return cudaGetLastError();
  }
  const dim3 grid(unsigned(a.B * a.H), unsigned((a.R + kRowsPerBlock - 1) / kRowsPerBlock));
  ring_read_kernel<T><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t ring_write(const WriteArgs& a, Dtype mem, Dtype gate, cudaStream_t stream) {
  if (a.B * a.H == 0 || a.T == 0) return cudaSuccess;
  switch (mem) {
    case Dtype::kF32: return write_for_gate<float>(a, gate, stream);
    case Dtype::kBF16: return write_for_gate<__nv_bfloat16>(a, gate, stream);
    case Dtype::kF16: return write_for_gate<__half>(a, gate, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t ring_read(const ReadArgs& a, Dtype mem, cudaStream_t stream) {
  if (a.B * a.H == 0 || a.R == 0 || a.D == 0) return cudaSuccess;
  switch (mem) {
    case Dtype::kF32: return launch_read<float>(a, stream);
    case Dtype::kBF16: return launch_read<__nv_bfloat16>(a, stream);
    case Dtype::kF16: return launch_read<__half>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pmll
