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

template <typename T, typename G>
cudaError_t launch_write(const WriteArgs& a, cudaStream_t stream) {
  const int64_t first = a.T < a.M ? a.T : a.M;
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
