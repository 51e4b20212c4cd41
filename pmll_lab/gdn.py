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
  ``snapshot_bytes``, ``carry_stash_bytes``: re-exported from ``pmll_lab.sizes``, where the
  whole set lives (the carried-state verify's ``carry_verify_bytes`` too), each checking its
  arguments (``ValueError`` naming the one at fault).

All sizes in bytes; ``Hb = HV * kd * vd * 4`` is one sequence's fp32 state for one layer
(``* 2`` for a bf16/fp16 state pool: ``state_dtype``).
"""

from __future__ import annotations

from pmll_lab.ops.gdn.checks import MAX_ROWS
from pmll_lab.ops.gdn.decode import gdn_chain, gdn_chain_plan, gdn_decode, gdn_decode_plan
from pmll_lab.ops.gdn.gating import gdn_gating
from pmll_lab.reference.gdn import gdn_chain_ref, gdn_decode_ref, gdn_gating_ref
# the byte counts live with their siblings in pmll_lab.sizes (checked, dtype-aware)
from pmll_lab.sizes import (CARRY_CAP, carry_stash_bytes, chain_bytes,  # noqa: F401
                            decode_bytes, decodes_bytes, row_io_bytes, snapshot_bytes,
                            state_bytes)

__all__ = [
    "MAX_ROWS", "gdn_decode", "gdn_chain", "gdn_decode_plan", "gdn_chain_plan", "gdn_decode_ref",
    "gdn_chain_ref", "gdn_gating", "gdn_gating_ref",
    "state_bytes", "row_io_bytes", "decode_bytes", "chain_bytes", "decodes_bytes",
    "snapshot_bytes", "carry_stash_bytes",
]
