"""Roll a snapshot verify back to the accepted row: one fused gather-copy (SPEC §3a).

After a snapshot verify of ``K`` rows (our chain, FlashInfer's ``gated_delta_rule_mtp`` with its
buffer) accepts ``a`` rows, the serving engine keeps the state after row ``a - 1``: it copies
that snapshot into the slot. vLLM and SGLang do this with an indexed copy; here it is one Triton
launch for the whole batch, so the step it belongs to can be captured in one CUDA graph and
counted as two state moves per sequence (snapshot read, state written).

Source: SPEC §3a (the caller keeps the state after row ``a - 1``); SGLang's snapshot rollback.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.ops.host import cdiv

RESTORE_BLOCK = 2048
"""Elements per program of the copy (16-byte vectors, a few in flight per thread)."""

INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _snapshot_restore_kernel(state_ptr, snap_ptr, slot_ptr, acc_ptr, s_slot, snap_b, snap_t,
                             HEAD: tl.constexpr, K: tl.constexpr, LAST_IN_PLACE: tl.constexpr,
                             BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    a = tl.load(acc_ptr + b).to(tl.int64)
    keep = (slot >= 0) & (a >= 1)
    if LAST_IN_PLACE:
        keep = keep & (a < K)           # a == K: the verify left the final state in place
    if keep:
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < HEAD
        x = tl.load(snap_ptr + b * snap_b + (a - 1) * snap_t + offs, mask=m)
        tl.store(state_ptr + slot * s_slot + offs, x, mask=m)


def gdn_snapshot_restore(state, snapshots, slot_tab, accepted, *, last_in_place) -> None:
    """Copy each sequence's snapshot after its last accepted row into its slot.

    Args:
        state: ``[S, ...]`` (a GDN state ``[S, HV, d, d']`` in either layout, or a conv window
            ``[S, dim, state_len]``; fp32, bf16 or fp16), the dims after ``S`` contiguous.
        snapshots: ``[B, R, ...]`` in ``state``'s dtype and inner shape, the dims after ``R``
            contiguous: the state after each verified row (``R = K - 1`` for our chain, whose
            final state is already in place: ``last_in_place=True``; ``R = K`` for FlashInfer's
            frozen ``mtp`` buffer: ``last_in_place=False``).
        slot_tab: ``[B]`` int32/int64 (-1: a padding lane, untouched), contiguous.
        accepted: ``[B]`` int32/int64 rows accepted, ``0 <= a <= K`` (``a = 0`` keeps the slot
            as it is), contiguous, on the device: no host sync.
        last_in_place: whether ``a == K`` needs no copy.

    Raises ``ValueError`` naming the argument before any launch.
    """
    _checks.tensor("state", state, dtype=_checks.FLOAT_DTYPES)
    inner = tuple(state.shape[1:])
    if state.dim() < 2 or not state[0].is_contiguous():
        raise ValueError(f"state: needs [S, ...] with the dims after S contiguous, got shape "
                         f"{tuple(state.shape)} strides {state.stride()}")
    _checks.tensor("snapshots", snapshots, dtype=state.dtype, like="state", device=state.device)
    if snapshots.dim() != state.dim() + 1 or tuple(snapshots.shape[2:]) != inner:
        raise ValueError(f"snapshots: expected [B, R, {', '.join(map(str, inner))}], got "
                         f"{tuple(snapshots.shape)}")
    B, R = snapshots.shape[:2]
    if B and R and not snapshots[0, 0].is_contiguous():
        raise ValueError(f"snapshots: the dims after R must be contiguous, got strides "
                         f"{snapshots.stride()}")
    for name, t in (("slot_tab", slot_tab), ("accepted", accepted)):
        _checks.tensor(name, t, shape=(B,), dtype=INDEX_DTYPES, device=state.device,
                       contiguous=True)
    _checks.flag("last_in_place", last_in_place)
    if B == 0:
        return
    head = state[0].numel()
    K = R + 1 if last_in_place else R
    _snapshot_restore_kernel[(B, cdiv(head, RESTORE_BLOCK))](
        state, snapshots, slot_tab, accepted, state.stride(0), snapshots.stride(0),
        snapshots.stride(1), HEAD=head, K=K, LAST_IN_PLACE=last_in_place, BLOCK=RESTORE_BLOCK,
        num_warps=4)
