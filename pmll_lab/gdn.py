"""Gated DeltaNet decode and the K-row chain with snapshots: public API (SPEC §2, §3a, §4).

- ``gdn_decode(state, q, k, v, g, beta, ...) -> o``: one token per sequence, state in place.
- ``gdn_chain(state, q, k, v, g, beta, ..., intermediate=None) -> o``: ``K <= 8`` draft rows per
  sequence, the state after each row ``t < K-1`` written to ``intermediate`` (the snapshot
  baseline that vLLM and SGLang verify with). Bitwise equal to ``K`` successive decodes.
- ``gdn_gating(A_log, a, dt_bias, b) -> (g, beta)``: Qwen3-Next's gates; every GDN launcher
  also takes ``A_log=, a=, dt_bias=, b=`` instead of ``g, beta`` and computes them in its kernel,
  bitwise as ``gdn_gating`` would (``pmll_lab.ops.gdn.gating``); ``gdn_gating_ref`` in float64.
- Both take ``out_state_indices=`` (default: the read slots): the new state is written there and
  the read slot keeps its state (FlashInfer's ``output_state_indices``; prefix-cache forks).
- ``gdn_decode_plan`` / ``gdn_chain_plan``: the same launches bound to fixed buffers, a lean
  call for host-bound small batches (``pmll_lab.ops.launch.LaunchPlan``).
- ``gdn_decode_ref`` / ``gdn_chain_ref``: the float64 references both answer to.
- Byte counts of SPEC §4 (the fewest bytes a launch must move, for GB/s and the roofline):
  ``state_bytes``, ``row_io_bytes``, ``decode_bytes``, ``chain_bytes``, ``decodes_bytes``,
  ``snapshot_bytes``, ``carry_stash_bytes``.

All sizes in bytes; ``Hb = HV * kd * vd * 4`` is one sequence's fp32 state for one layer
(``* 2`` for a bf16/fp16 state pool: ``state_dtype``).
"""

from __future__ import annotations

import torch

from pmll_lab.ops.gdn.decode import MAX_ROWS, gdn_chain, gdn_chain_plan, gdn_decode, gdn_decode_plan
from pmll_lab.ops.gdn.gating import gdn_gating
from pmll_lab.reference.gdn import gdn_chain_ref, gdn_decode_ref, gdn_gating_ref

__all__ = [
    "MAX_ROWS", "gdn_decode", "gdn_chain", "gdn_decode_plan", "gdn_chain_plan", "gdn_decode_ref",
    "gdn_chain_ref", "gdn_gating", "gdn_gating_ref",
    "state_bytes", "row_io_bytes", "decode_bytes", "chain_bytes", "decodes_bytes",
    "snapshot_bytes", "carry_stash_bytes",
]

CARRY_CAP = 8
"""Stash rows per (layer, slot) of the carried-state design (SPEC §3b, the seed's
``GDN_CARRY_CAP``); used here only to size the stash against the snapshots."""


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def state_bytes(num_v_heads: int, k_dim: int, v_dim: int,
                state_dtype: torch.dtype = torch.float32) -> int:
    """``Hb``: bytes of one sequence's state ``[HV, kd, vd]`` for one layer (fp32 unless
    ``state_dtype`` says otherwise)."""
    return num_v_heads * k_dim * v_dim * _itemsize(state_dtype)


def row_io_bytes(num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                 dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype | None = None) -> int:
    """Input and output bytes of one row (token) of one sequence: ``q, k [HK, kd]`` and
    ``v [HV, vd]`` in ``dtype``, ``g, beta [HV]`` fp32, and ``o [HV, vd]`` in ``out_dtype``
    (default ``dtype``)."""
    es = _itemsize(dtype)
    eo = _itemsize(out_dtype or dtype)
    return (2 * num_k_heads * k_dim + num_v_heads * v_dim) * es + 2 * num_v_heads * 4 \
        + num_v_heads * v_dim * eo


def decode_bytes(batch: int, num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                 dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype | None = None,
                 state_dtype: torch.dtype = torch.float32) -> int:
    """One ``gdn_decode`` launch: per sequence ``2*Hb`` (state read and written) plus one row of
    inputs/outputs and its int32 slot index (SPEC §4)."""
    hb = state_bytes(num_v_heads, k_dim, v_dim, state_dtype)
    return batch * (2 * hb + row_io_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype,
                                          out_dtype) + 4)


def chain_bytes(batch: int, rows: int, num_k_heads: int, num_v_heads: int, k_dim: int,
                v_dim: int, dtype: torch.dtype = torch.bfloat16,
                out_dtype: torch.dtype | None = None,
                state_dtype: torch.dtype = torch.float32) -> int:
    """One ``gdn_chain`` launch with snapshots: per sequence ``(K+1)*Hb`` (state read, ``K-1``
    snapshots and the final state written) plus ``K`` rows of inputs/outputs and the slot index
    (SPEC §4)."""
    hb = state_bytes(num_v_heads, k_dim, v_dim, state_dtype)
    io = row_io_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype, out_dtype)
    return batch * ((rows + 1) * hb + rows * io + 4)


def decodes_bytes(batch: int, rows: int, num_k_heads: int, num_v_heads: int, k_dim: int,
                  v_dim: int, dtype: torch.dtype = torch.bfloat16,
                  out_dtype: torch.dtype | None = None,
                  state_dtype: torch.dtype = torch.float32) -> int:
    """``K`` successive ``gdn_decode`` launches: ``K`` times ``decode_bytes``."""
    return rows * decode_bytes(batch, num_k_heads, num_v_heads, k_dim, v_dim, dtype, out_dtype,
                               state_dtype)


def snapshot_bytes(rows: int, num_v_heads: int, k_dim: int, v_dim: int,
                   state_dtype: torch.dtype = torch.float32) -> int:
    """Snapshot buffer per sequence and layer for a ``K``-row chain: ``(K-1) * Hb``."""
    return max(rows - 1, 0) * state_bytes(num_v_heads, k_dim, v_dim, state_dtype)


def carry_stash_bytes(num_v_heads: int, k_dim: int, v_dim: int, cap: int = CARRY_CAP) -> int:
    """Carried-state stash per (layer, slot), SPEC §3b: ``CAP*(HV*vd + HV + HV*kd)`` fp32."""
    return cap * (num_v_heads * v_dim + num_v_heads + num_v_heads * k_dim) * 4
