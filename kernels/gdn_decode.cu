// gdn_decode.cu: CUDA twin of the Gated DeltaNet decode on a V-major state (SPEC section 2), the
// contract of pmll_lab.ops.gdn.decode.gdn_decode(state_layout="vk"). Plain CUDA C++; the torch
// binding is gdn_decode_torch.cpp (built by pmll_lab/cuda_ext.py).
//
// Warp w of block (b*HV + h, y) owns value row r = y*4 + w of head h of lane b. Per token, in
// fp32, in SPEC order: q, k <- l2norm (eps 1e-6, when asked), q <- q * scale; the gates from
// A_log, a, dt_bias, b when given (g = -exp(A_log) * softplus(a + dt_bias), threshold 20;
// beta = sigmoid(b)); then on the row h[:] = H[:, r]: h <- exp(g) * h, u = beta * (v[r] - h.k),
// h <- h + k u, o[r] = h.q; the row is stored rounded to the state's dtype (nearest even).
// Sums over keys: each lane's keys in order, then a butterfly over the warp. A lane whose slot
// is -1 (padding) writes zeros to o and reads and writes no state. Not bitwise the Triton
// kernel (its sums run in another order): held to the float64 reference's tolerance.
#include "gdn_decode.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace pmll {
namespace {

constexpr int kPer = kGdnMaxKd / kGdnWarp;  // keys per lane, at most

__device__ __forceinline__ float load_f(const void* p, GdnDtype t, int64_t i) {
  switch (t) {
    case GdnDtype::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case GdnDtype::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_f(void* p, GdnDtype t, int64_t i, float x) {
  switch (t) {
    case GdnDtype::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); break;
    case GdnDtype::kF16: static_cast<__half*>(p)[i] = __float2half_rn(x); break;
    default: static_cast<float*>(p)[i] = x;
  }
}

__device__ __forceinline__ int64_t load_slot(const void* p, GdnDtype t, int64_t i) {
  return t == GdnDtype::kI32 ? int64_t(static_cast<const int32_t*>(p)[i])
                             : static_cast<const int64_t*>(p)[i];
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = kGdnWarp / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__global__ void __launch_bounds__(kGdnWarp * kGdnRowsPerBlock) gdn_decode_vk_kernel(GdnDecodeArgs a) {
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / a.HV, h = bh % a.HV;
  const int64_t kh = h / (a.HV / a.HK);
  const int lane = threadIdx.x % kGdnWarp;
  const int64_t r = int64_t(blockIdx.y) * kGdnRowsPerBlock + threadIdx.x / kGdnWarp;
  if (r >= a.vd) return;
  const int64_t slot = a.idx ? load_slot(a.idx, a.tidx, b) : b;
  const int64_t o_at = (b * a.HV + h) * a.vd + r;
  if (slot < 0) {  // padding lane
    if (lane == 0) store_f(a.o, a.to, o_at, 0.0f);
    return;
  }
  const int64_t oslot = a.out_idx ? load_slot(a.out_idx, a.tout_idx, b) : slot;

  float q[kPer], k[kPer], hs[kPer];
  float qq = 0.0f, kk = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t d = int64_t(j) * kGdnWarp + lane;
    const bool in = d < a.kd;
    q[j] = in ? load_f(a.q, a.ti, b * a.q_b + kh * a.q_h + d) : 0.0f;
    k[j] = in ? load_f(a.k, a.ti, b * a.k_b + kh * a.k_h + d) : 0.0f;
    qq += q[j] * q[j];
    kk += k[j] * k[j];
  }
  float qs = a.scale;
  float ks = 1.0f;
  if (a.l2norm) {
    qs *= rsqrtf(warp_sum(qq) + 1e-6f);
    ks = rsqrtf(warp_sum(kk) + 1e-6f);
  }

  float g, beta;
  if (a.A_log) {
    const float x = load_f(a.g, a.tg, b * a.g_b + h) + load_f(a.dt_bias, a.tdt, h);
    const float sp = x > 20.0f ? x : log1pf(expf(x));  // softplus, PyTorch's threshold
    g = -expf(load_f(a.A_log, a.talog, h)) * sp;
    beta = 1.0f / (1.0f + expf(-load_f(a.beta, a.tbeta, b * a.beta_b + h)));
  } else {
    g = load_f(a.g, a.tg, b * a.g_b + h);
    beta = load_f(a.beta, a.tbeta, b * a.beta_b + h);
  }
  const float decay = expf(g);

  const int64_t row_in = slot * a.s_slot + h * a.s_head + r * a.s_row;
  float hk = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t d = int64_t(j) * kGdnWarp + lane;
    k[j] *= ks;
    q[j] *= qs;
    hs[j] = d < a.kd ? decay * load_f(a.state, a.ts, row_in + d) : 0.0f;
    hk += hs[j] * k[j];
  }
  const float u = beta * (load_f(a.v, a.ti, b * a.v_b + h * a.v_h + r) - warp_sum(hk));
  const int64_t row_out = oslot * a.s_slot + h * a.s_head + r * a.s_row;
  float oq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t d = int64_t(j) * kGdnWarp + lane;
    hs[j] += k[j] * u;
    oq += hs[j] * q[j];
    if (d < a.kd) store_f(a.state, a.ts, row_out + d, hs[j]);
  }
  oq = warp_sum(oq);
  if (lane == 0) store_f(a.o, a.to, o_at, oq);
}

}  // namespace

cudaError_t gdn_decode_vk(const GdnDecodeArgs& a, cudaStream_t stream) {
  if (a.B * a.HV == 0 || a.vd == 0) return cudaSuccess;
  if (a.kd < 1 || a.kd > kGdnMaxKd || a.HK < 1 || a.HV % a.HK != 0) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(a.B * a.HV),
                  unsigned((a.vd + kGdnRowsPerBlock - 1) / kGdnRowsPerBlock));
  gdn_decode_vk_kernel<<<grid, kGdnWarp * kGdnRowsPerBlock, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace pmll
