// gdn_carry.cuh: host entry points of the carried-state GDN verify's and flush's CUDA twins
// (SPEC section 3b) on a V-major state. Plain CUDA C++: no torch headers.
//
// State pool [S, HV, vd, kd] as the decode's (gdn_decode.cuh). Stash of one layer (GdnCarry.buf):
// fp32 [S, W], W = CAP*(HV*vd + HV + HV*kd), slot s at s*stash_slot, laid out per slot as
// u[CAP][HV][vd] | g[CAP][HV] | k[CAP][HV][kd] (row i of the stash: the correction u_i of every
// value row, the log decay g_i and the normalised key k_i of every value head). pend [S] int32:
// accepted stash rows not yet folded into the stored state.
#pragma once

#include "gdn_chain.cuh"

namespace pmll {

// One verify of K rows per lane (the chain's rows: c.d.idx is the slot table, required; c.d.o is
// o [B, K, HV, vd]; c.d.out_idx and c.inter are not used: a verify writes back to the read slot
// only, and keeps no snapshots).
struct GdnCarryArgs {
  GdnChainArgs c;
  float* stash;          // [S, W] fp32, rows contiguous
  int64_t stash_slot;    // stash stride between slots, in floats
  const int32_t* pend;   // [S]
  int32_t* engaged;      // [B]: 2 after a write-back, else 1
  int32_t* arrive;       // [S, HV] int32 arrival counts: zero before a launch, left at zero
  int64_t cap;           // CAP, stash rows per slot (K <= CAP)
  bool lazy;             // false: eager (write back when pend > 0); true: when pend + K > CAP
};

// The flush of L layers in one launch: layer l's state, stash and pend are at element offsets
// state_off[l], stash_off[l], pend_off[l] (int64, device memory) from layer 0's pointers; the
// same shapes, strides and dtypes in every layer.
struct GdnFlushArgs {
  void* state;           // layer 0's state pool, element type ts
  float* stash;          // layer 0's stash
  const int32_t* pend;   // layer 0's pend
  const void* idx;       // slot table [B], int32 or int64 (tidx); -1 = padding lane
  const int64_t* state_off;
  const int64_t* stash_off;
  const int64_t* pend_off;
  int64_t B, HV, kd, vd, L, cap;
  int64_t s_slot, s_head, s_row, stash_slot;
  GdnDtype ts, tidx;
};

// Launch on `stream`; they return the launch's error (cudaSuccess when there was nothing to do).
cudaError_t gdn_carry_verify_vk(const GdnCarryArgs& a, cudaStream_t stream);
cudaError_t gdn_carry_flush_vk(const GdnFlushArgs& a, cudaStream_t stream);

}  // namespace pmll
