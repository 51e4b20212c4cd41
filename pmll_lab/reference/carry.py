"""Float64 reference of the carried-state protocol (SPEC §3b), written for clarity, not speed.

A verify of ``K`` draft rows does not keep ``K`` state snapshots. Instead, per (slot, value head)
it stashes the three things that replay each row — ``u_t [vd]``, ``g_t`` and the normalised key
``k_t [kd]`` — and ``pend[slot]`` counts the accepted stash rows not yet folded into the stored
state. Folding a row is ``H <- exp(g_t) * H + k_t u_t^T``, which is exactly the recurrence's state
update (SPEC §2), so folding the accepted rows reproduces plain decoding.

Everything here is plain PyTorch on float64 tensors, one sequence at a time:

- ``RefCarry``: the stash as separate tensors ``u [S, CAP, HV, vd]``, ``g [S, CAP, HV]``,
  ``k [S, CAP, HV, kd]`` and ``pend [S]`` (int64), built from / compared with a ``GdnCarry``.
- ``decode_row``: one token of SPEC §2 for all value heads of one sequence.
- ``verify``: SPEC §3b steps 1-4 (eager or lazy), mutating the state (write-back) and the stash.
- ``accept``: ``pend = a`` after a write-back (``engaged == 2``), else ``p + a``.
- ``flush``: fold every listed slot's pending rows into its state, over ``L`` layers.
- ``decode_tokens``: plain decoding of a token sequence, the end-to-end target.

Slot tables (``slot_tab``) are read as the kernels read them: a slot of -1 is a padding lane
(zero outputs, ``engaged`` 1; no state, stash row or ``pend`` read or written), any other slot
outside ``[0, S)`` a ``ValueError`` naming ``slot_tab``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pmll_lab.reference._slots import PAD, slot_list
from pmll_lab.reference.gdn import round_state

F64 = torch.float64
L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x * rsqrt(sum(x*x) + eps)`` over the last dim (SPEC §2)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(q, k, num_v_heads, *, scale=None, use_qk_l2norm=True):
    """``q, k [HK, kd]`` (any float dtype) -> float64 ``(q, k) [HV, kd]``: normalised, ``q``
    scaled, key head ``h // (HV // HK)`` repeated for value head ``h`` (GVA)."""
    q, k = q.to(F64), k.to(F64)
    kd = q.shape[-1]
    scale = kd ** -0.5 if scale is None else scale
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    group = num_v_heads // q.shape[0]
    return (q * scale).repeat_interleave(group, 0), k.repeat_interleave(group, 0)


def fold_row(H, g, k, u):
    """Fold one stashed row into ``H [HV, kd, vd]``: ``exp(g) * H + k u^T`` per head
    (``g [HV]``, ``k [HV, kd]``, ``u [HV, vd]``)."""
    return torch.exp(g)[:, None, None] * H + k[:, :, None] * u[:, None, :]


def decode_row(H, q, k, v, g, beta):
    """One token of SPEC §2 for all heads of one sequence; ``q, k`` already prepared ``[HV, kd]``.

    Returns ``(H_new [HV, kd, vd], o [HV, vd], u [HV, vd])`` in float64."""
    v, g, beta = v.to(F64), g.to(F64), beta.to(F64)
    decayed = torch.exp(g)[:, None, None] * H
    u = beta[:, None] * (v - torch.einsum("hkv,hk->hv", decayed, k))
    H = decayed + k[:, :, None] * u[:, None, :]
    o = torch.einsum("hkv,hk->hv", H, q)
    return H, o, u


@dataclass
class RefCarry:
    """The stash of one layer in float64: ``u [S, CAP, HV, vd]``, ``g [S, CAP, HV]``,
    ``k [S, CAP, HV, kd]``, ``pend [S]`` int64."""

    u: torch.Tensor
    g: torch.Tensor
    k: torch.Tensor
    pend: torch.Tensor

    @property
    def cap(self) -> int:
        return self.u.shape[1]

    @classmethod
    def from_carry(cls, carry) -> "RefCarry":
        """Float64 CPU copy of a ``GdnCarry`` (through its ``.u``, ``.g``, ``.k``, ``.pend``)."""
        return cls(u=carry.u.detach().to("cpu", F64).clone(), g=carry.g.detach().to("cpu", F64).clone(),
                   k=carry.k.detach().to("cpu", F64).clone(), pend=carry.pend.detach().to("cpu", torch.int64).clone())

    @classmethod
    def zeros(cls, slots, num_v_heads, k_dim, v_dim, cap=8) -> "RefCarry":
        return cls(u=torch.zeros(slots, cap, num_v_heads, v_dim, dtype=F64),
                   g=torch.zeros(slots, cap, num_v_heads, dtype=F64),
                   k=torch.zeros(slots, cap, num_v_heads, k_dim, dtype=F64),
                   pend=torch.zeros(slots, dtype=torch.int64))


def fold_pending(H, carry: RefCarry, slot: int, state_dtype=None):
    """``H [HV, kd, vd]`` with the slot's ``pend[slot]`` stash rows folded in, oldest first
    (rounded to ``state_dtype`` after each, as decoding a bf16/fp16 state stores it)."""
    for i in range(int(carry.pend[slot])):
        H = round_state(fold_row(H, carry.g[slot, i], carry.k[slot, i], carry.u[slot, i]),
                        state_dtype)
    return H


def verify(state, carry: RefCarry, q, k, v, g, beta, slot_tab, *, lazy=False, scale=None,
           use_qk_l2norm=True, state_dtype=None):
    """One carried-state verify of ``K`` rows per sequence (SPEC §3b).

    ``state_dtype``: the dtype of a bf16/fp16 state pool: the state is rounded to it after every
    folded and verified row (``pmll_lab.reference.gdn.round_state``), as the kernels do.

    ``state [S, HV, kd, vd]`` float64 and ``carry`` are updated in place (write-back, stash rows);
    ``q, k [B, K, HK, kd]``, ``v [B, K, HV, vd]``, ``g, beta [B, K, HV]``, ``slot_tab [B]``
    (a slot of -1: a padding lane, zero outputs and ``engaged`` 1, nothing read or written).
    Returns ``(o [B, K, HV, vd] float64, engaged [B] int64)``. ``pend`` is not changed.
    ``ValueError`` naming ``slot_tab`` for a slot outside ``[0, S)`` other than -1.
    """
    B, K = q.shape[:2]
    HV = v.shape[2]
    slots = slot_list("slot_tab", slot_tab, B, state.shape[0])
    o = torch.zeros(B, K, HV, v.shape[3], dtype=F64)
    engaged = torch.ones(B, dtype=torch.int64)
    for b, slot in enumerate(slots):
        if slot == PAD:
            continue
        p = int(carry.pend[slot])
        # 1. load the state and fold the pending rows
        H = fold_pending(state[slot].clone(), carry, slot, state_dtype)
        # 2. write back (eager: whenever rows were folded; lazy: only when K rows do not fit)
        write_back = (p + K > carry.cap) if lazy else (p > 0)
        if write_back:
            state[slot] = H
        first = 0 if write_back else p
        # 3. the K-row chain from the folded state, stashing each row
        for t in range(K):
            qn, kn = prepare_qk(q[b, t], k[b, t], HV, scale=scale, use_qk_l2norm=use_qk_l2norm)
            H, o[b, t], u = decode_row(H, qn, kn, v[b, t], g[b, t], beta[b, t])
            H = round_state(H, state_dtype)
            carry.u[slot, first + t] = u
            carry.g[slot, first + t] = g[b, t].to(F64)
            carry.k[slot, first + t] = kn
        # 4. engaged flag
        engaged[b] = 2 if write_back else 1
    return o, engaged


def accept(carry, slot_tab, engaged, accepted) -> None:
    """The caller's pending update after a verify: ``pend = a`` if ``engaged == 2`` else
    ``p + a``, per sequence (``accepted [B]``, ``0 <= a <= K``). Works on any ``.pend``. A
    padding lane (slot -1) changes nothing; ``ValueError`` naming ``slot_tab`` for any other
    slot outside ``[0, S)``."""
    slots = slot_list("slot_tab", slot_tab, len(slot_tab), carry.pend.shape[0])
    for b, slot in enumerate(slots):
        if slot == PAD:
            continue
        a = int(accepted[b])
        carry.pend[slot] = a if int(engaged[b]) == 2 else int(carry.pend[slot]) + a


def flush(states, carries, slot_tab, state_dtype=None) -> None:
    """Fold the pending rows of every slot in ``slot_tab`` into its state, for each layer
    (``states``: list of ``[S, HV, kd, vd]`` float64, ``carries``: list of ``RefCarry``;
    ``state_dtype`` as in ``verify``). ``pend`` is left for the caller to clear. Padding lanes
    (slot -1) are skipped; ``ValueError`` naming ``slot_tab`` for any other slot outside
    ``[0, S)``."""
    for state, carry in zip(states, carries):
        for slot in slot_list("slot_tab", slot_tab, len(slot_tab), state.shape[0]):
            if slot == PAD:
                continue
            state[slot] = fold_pending(state[slot].clone(), carry, slot, state_dtype)


def decode_tokens(state, q, k, v, g, beta, slot_tab, *, scale=None, use_qk_l2norm=True,
                  state_dtype=None):
    """Plain decoding of ``T`` tokens per sequence, one after another (the end-to-end target).

    ``state [S, HV, kd, vd]`` float64 updated in place; ``q, k [B, T, HK, kd]``, ... Returns
    ``o [B, T, HV, vd]`` float64 (zeros for a padding lane, slot -1, which touches no state).
    ``state_dtype`` as in ``verify``."""
    B, T = q.shape[:2]
    HV = v.shape[2]
    o = torch.zeros(B, T, HV, v.shape[3], dtype=F64)
    for b, slot in enumerate(slot_list("slot_tab", slot_tab, B, state.shape[0])):
        if slot == PAD:
            continue
        H = state[slot].clone()
        for t in range(T):
            qn, kn = prepare_qk(q[b, t], k[b, t], HV, scale=scale, use_qk_l2norm=use_qk_l2norm)
            H, o[b, t], _ = decode_row(H, qn, kn, v[b, t], g[b, t], beta[b, t])
            H = round_state(H, state_dtype)
        state[slot] = H
    return o
