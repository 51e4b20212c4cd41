// pmll_common.cuh: layout constants and the host entry points of the PMLL ring's CUDA twins
// (SPEC section 1). Plain CUDA C++: no torch headers, so `nvcc -c pmll_ring.cu` builds alone.
//
// Ring of one layer: k_mem, v_mem [B, H, M, D] contiguous, element type T (fp32/bf16/fp16);
// slot s of head h of sequence b at ((b*H + h)*M + s)*D. count [B] int64, rows ever written.
// New rows k_new, v_new [B, H, Tn, D]: last dim contiguous, other strides in elements.
// Gate: none, [B, Tn] (head stride 0) or [B, H, Tn], element type G (fp32/bf16/fp16).
// Read output k_out, v_out [B, H, R, D] contiguous, R = M + t_ctx.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace pmll {

// The general kernels: one warp per ring slot (write) or output row (read); its lanes walk the
// row in steps of 32 elements, so any head size works. Four warps per block: 128 threads.
// Rows on 16-byte boundaries take pmll_ring.cu's 16-byte kernels instead (one chunk per thread).
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;
constexpr int kThreads = kWarp * kRowsPerBlock;

enum class Dtype : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct WriteArgs {
  void* k_mem;
  void* v_mem;
  const int64_t* count;
  const void* k_new;
  const void* v_new;
  const void* gate;     // nullptr: g = 1
  int64_t B, H, M, T, D;
  int64_t s_kb, s_kh, s_kt;
  int64_t s_vb, s_vh, s_vt;
  int64_t s_gb, s_gh, s_gt;
};

struct ReadArgs {
  const void* k_mem;
  const void* v_mem;
  const int64_t* count;
  void* k_out;
  void* v_out;
  int64_t B, H, M, R, D;
};

// Launch on `stream`; they return the launch's error (cudaSuccess when nothing was to do).
// The write leaves count unchanged: the caller adds Tn after it, on the same stream.
cudaError_t ring_write(const WriteArgs& a, Dtype mem, Dtype gate, cudaStream_t stream);
cudaError_t ring_read(const ReadArgs& a, Dtype mem, cudaStream_t stream);

}  // namespace pmll

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace pmll {

template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }

// round to nearest even, as torch's .to(dtype) does
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

}  // namespace pmll
#endif
