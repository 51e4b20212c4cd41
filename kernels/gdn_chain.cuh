// gdn_chain.cuh: host entry point of the Gated DeltaNet chain-with-snapshots' CUDA twin
// (SPEC section 3a) on a V-major state. Plain CUDA C++: no torch headers.
//
// The decode's arguments (gdn_decode.cuh) with a rows axis after the batch axis: q, k
// [B, K, HK, kd], v [B, K, HV, vd], gates [B, K, HV], output o [B, K, HV, vd] contiguous; the
// row strides below, in elements. Snapshots: inter [B, K-1, HV, vd, kd] in the state's element
// type (last dim contiguous), or nullptr for none.
#pragma once

#include "gdn_decode.cuh"

namespace pmll {

struct GdnChainArgs {
  GdnDecodeArgs d;       // as the decode's, but o is [B, K, HV, vd]
  int64_t K;             // rows per lane, >= 1
  int64_t q_t, k_t, v_t, g_t, beta_t;
  void* inter;           // nullptr: no snapshots
  int64_t i_b, i_t, i_h, i_row;
  bool vec_inter = false;  // set by the launch function: snapshot rows stored as vectors
};

// Launch on `stream`; returns the launch's error (cudaSuccess when there was nothing to do).
cudaError_t gdn_chain_vk(const GdnChainArgs& a, cudaStream_t stream);

}  // namespace pmll
