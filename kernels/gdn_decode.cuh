// gdn_decode.cuh: host entry point of the Gated DeltaNet decode's CUDA twin (SPEC section 2)
// on a V-major state. Plain CUDA C++: no torch headers, so `nvcc -c gdn_decode.cu` builds alone.
//
// State pool [S, HV, vd, kd], element type TS (fp32/bf16/fp16): value row r of head h of slot s
// at s*s_slot + h*s_head + r*s_row, its kd keys contiguous. q, k [B, HK, kd], v [B, HV, vd]:
// element type TI (fp32/bf16/fp16), last dim contiguous, other strides in elements. Gates:
// g, beta [B, HV] fp32, or (gating in the kernel) a, b [B, HV] and A_log, dt_bias [HV].
// Slot tables [B] int32 or int64, -1 = padding lane. Output o [B, HV, vd] contiguous.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace pmll {

enum class GdnDtype : int { kF32 = 0, kBF16 = 1, kF16 = 2, kI32 = 3, kI64 = 4 };

// A group of kGdnLanes lanes per value row (lane l holds keys in runs of kGdnVec: 4l..4l+3,
// 32 + 4l.., ...: a vector load of each lane reads 4 consecutive keys, the group 32, where the
// rows' alignment allows it), kGdnRowsPerBlock rows per block of 4 warps; keys per lane a
// template parameter, 4 to 32 (kd <= kGdnMaxKd).
// Why: one warp per row spent four 5-level shuffle sums on 512 bytes of state per row and ran
// at 19 % of the copy roofline on an H200 (kernels/README.md).
constexpr int kGdnWarp = 32;
constexpr int kGdnLanes = 8;
constexpr int kGdnRowsPerBlock = 16;
constexpr int kGdnThreads = kGdnRowsPerBlock * kGdnLanes;  // 128
constexpr int kGdnMaxKd = 256;
constexpr int kGdnVec = 4;  // consecutive keys per lane and run: one 16-byte (fp32) or 8-byte load

struct GdnDecodeArgs {
  void* state;
  const void* q;
  const void* k;
  const void* v;
  const void* g;          // g [B, HV] fp32, or a [B, HV] with gating
  const void* beta;       // beta [B, HV] fp32, or b [B, HV] with gating
  const void* A_log;      // nullptr: g, beta given
  const void* dt_bias;
  const void* idx;        // nullptr: slot b for lane b
  const void* out_idx;    // nullptr: the read slot
  void* o;
  int64_t B, HK, HV, kd, vd;
  int64_t s_slot, s_head, s_row;
  int64_t q_b, q_h, k_b, k_h, v_b, v_h, g_b, beta_b;
  float scale;
  bool l2norm;
  // element types: state, q/k/v, g (or a), beta (or b), A_log, dt_bias, the two slot tables,
  // output
  GdnDtype ts, ti, tg, tbeta, talog, tdt, tidx, tout_idx, to;
  // set by the launch functions, not by callers: every state row / q and k row starts on a
  // kGdnVec-element boundary of an aligned pointer, so the kernels load them as vectors
  bool vec_state = false, vec_qk = false;
};

// Launch on `stream`; returns the launch's error (cudaSuccess when there was nothing to do).
cudaError_t gdn_decode_vk(const GdnDecodeArgs& a, cudaStream_t stream);

}  // namespace pmll
