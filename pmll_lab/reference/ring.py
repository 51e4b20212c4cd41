"""Float64 reference of the ring form of the carried state (SPEC §3d), written for clarity.

The ring form keeps the stored state ``H0`` read-only during a verify. The accepted rows live in
a per-(slot, value head) ring: each row the normalised key ``k_j [kd]``, the correction
``u_j [vd]`` and the cumulative log decay ``G_j`` from ``H0`` through row ``j``; ``len[slot]``
rows starting at ``base[slot]`` of ``NS = 2 R`` physical slots. The ring means

    H_P = exp(G_{P-1}) H0 + sum_{j<P} exp(G_{P-1} - G_j) k_j u_j^T      (P = len; H_0 = H0)

A verify of ``K`` rows computes the new rows' ``u_t`` by a ``K x K`` triangular solve (WY) and
the outputs ``o_t = H_{P+t}^T q_t`` without forming ``H_P``, then appends the rows at
``base + P ..`` (mod ``NS``). When ``P + K > R`` it first folds (``H0 <- H_P``, rounded once to
the state dtype) and the new rows' ``G`` count from the folded ``H0``; ``engaged = 2``. Accept:
``base += len, len = a`` after a fold, else ``len += a``. Design: the ReplaySSM verify that
FlashInfer (``gated_delta_rule_mtp_ucache_flush``), SGLang and TensorRT-LLM ship.

This module answers to ``pmll_lab.reference.carry`` (the exact protocol): over any acceptance
history the ring's outputs and its state ``H_P`` equal plain decoding up to float64 rounding
(tests/carry/test_ring.py). The kernels (``pmll_lab.ops.carry.ring``) answer to both.

States here are K-major float64 ``[S, HV, kd, vd]`` as in ``reference.carry``; the ring is
``RefRing`` (``k [S, HK, NS, kd]``, ``u [S, HV, NS, vd]``, ``G [S, HV, NS]``, ``len, base [S]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pmll_lab.reference._slots import PAD, slot_list
from pmll_lab.reference.carry import prepare_qk
from pmll_lab.reference.gdn import round_state

F64 = torch.float64


@dataclass
class RefRing:
    """One layer's ring in float64: ``k [S, HK, NS, kd]``, ``u [S, HV, NS, vd]``,
    ``G [S, HV, NS]``, ``len, base [S]`` int64; ``length`` = ``R`` (rows held before a fold),
    ``NS = 2 R`` physical rows."""

    k: torch.Tensor
    u: torch.Tensor
    G: torch.Tensor
    len: torch.Tensor
    base: torch.Tensor
    length: int

    @property
    def slots_per_head(self) -> int:
        return self.u.shape[2]

    @classmethod
    def zeros(cls, slots, num_k_heads, num_v_heads, k_dim, v_dim, length=16) -> "RefRing":
        ns = 2 * length
        return cls(k=torch.zeros(slots, num_k_heads, ns, k_dim, dtype=F64),
                   u=torch.zeros(slots, num_v_heads, ns, v_dim, dtype=F64),
                   G=torch.zeros(slots, num_v_heads, ns, dtype=F64),
                   len=torch.zeros(slots, dtype=torch.int64),
                   base=torch.zeros(slots, dtype=torch.int64), length=length)

    @classmethod
    def from_ring(cls, ring) -> "RefRing":
        """Float64 CPU copy of a ``GdnRing`` (its ``.k``, ``.u``, ``.G``, ``.len``, ``.base``)."""
        f = lambda t: t.detach().to("cpu", F64).clone()  # noqa: E731
        i = lambda t: t.detach().to("cpu", torch.int64).clone()  # noqa: E731
        return cls(k=f(ring.k), u=f(ring.u), G=f(ring.G), len=i(ring.len), base=i(ring.base),
                   length=int(ring.length))


def window(ring: RefRing, slot: int) -> list[int]:
    """Physical rows of the slot's live window, oldest first."""
    ns = ring.slots_per_head
    return [(int(ring.base[slot]) + i) % ns for i in range(int(ring.len[slot]))]


def ring_state(H0, ring: RefRing, slot: int):
    """``H_P [HV, kd, vd]`` the slot's ring means over ``H0 [HV, kd, vd]`` (SPEC §3d)."""
    rows = window(ring, slot)
    if not rows:
        return H0.clone()
    HV, HK = ring.u.shape[1], ring.k.shape[1]
    group = HV // HK
    G_last = ring.G[slot, :, rows[-1]]                                   # [HV]
    H = torch.exp(G_last)[:, None, None] * H0
    for j in rows:
        k = ring.k[slot, :, j].repeat_interleave(group, 0)               # [HV, kd]
        w = torch.exp(G_last - ring.G[slot, :, j])
        H = H + w[:, None, None] * k[:, :, None] * ring.u[slot, :, j][:, None, :]
    return H


def verify(state, ring: RefRing, q, k, v, g, beta, slot_tab, *, scale=None, use_qk_l2norm=True,
           state_dtype=None, ring_dtype=None):
    """One ring-form verify of ``K`` rows per sequence (SPEC §3d), float64.

    ``state [S, HV, kd, vd]`` float64 (written only by a fold), ``ring`` (rows appended);
    ``q, k [B, K, HK, kd]``, ``v [B, K, HV, vd]``, ``g, beta [B, K, HV]``, ``slot_tab [B]`` (-1:
    a padding lane). ``state_dtype``: a folded state is rounded to it once (a bf16/fp16 pool);
    ``ring_dtype``: the appended ``k``/``u`` rows are rounded to it (the kernels store them in
    the state's dtype). Returns ``(o [B, K, HV, vd], engaged [B] int64)``; ``len``/``base``
    unchanged (``accept`` commits). ``ValueError`` naming ``slot_tab`` for a bad slot, ``q``
    for ``K > R``."""
    B, K = q.shape[:2]
    HV, HK = v.shape[2], q.shape[2]
    if K > ring.length:
        raise ValueError(f"q: K = {K} rows exceed the ring length R = {ring.length}")
    ns, group = ring.slots_per_head, HV // HK
    o = torch.zeros(B, K, HV, v.shape[3], dtype=F64)
    engaged = torch.ones(B, dtype=torch.int64)
    for b, slot in enumerate(slot_list("slot_tab", slot_tab, B, state.shape[0])):
        if slot == PAD:
            continue
        P, base = int(ring.len[slot]), int(ring.base[slot])
        rows = window(ring, slot)
        H0 = state[slot]
        c0 = ring.G[slot, :, rows[-1]].clone() if rows else torch.zeros(HV, dtype=F64)
        if P + K > ring.length:                                          # fold first
            H0 = round_state(ring_state(H0, ring, slot), state_dtype)
            state[slot] = H0
            rows, c0 = [], torch.zeros(HV, dtype=F64)
            engaged[b] = 2
        qn, kn = zip(*(prepare_qk(q[b, t], k[b, t], HV, scale=scale, use_qk_l2norm=use_qk_l2norm)
                       for t in range(K)))
        Q, Kr = torch.stack(qn, 1), torch.stack(kn, 1)                  # [HV, K, kd]
        gb, bb = g[b].to(F64).T, beta[b].to(F64).T                      # [HV, K]
        c = c0[:, None] + torch.cumsum(gb, 1)                           # [HV, K]
        # the known part: exp(c_t) H0^T x + sum_j exp(c_t - G_j) u_j (k_j . x)
        Wk = torch.exp(c)[..., None] * torch.einsum("hkv,htk->htv", H0, Kr)
        Wq = torch.exp(c)[..., None] * torch.einsum("hkv,htk->htv", H0, Q)
        for j in rows:
            kj = ring.k[slot, :, j].repeat_interleave(group, 0)          # [HV, kd]
            d = torch.exp(c - ring.G[slot, :, j][:, None])              # [HV, K]
            uj = ring.u[slot, :, j]                                      # [HV, vd]
            Wk = Wk + (d * torch.einsum("htk,hk->ht", Kr, kj))[..., None] * uj[:, None, :]
            Wq = Wq + (d * torch.einsum("htk,hk->ht", Q, kj))[..., None] * uj[:, None, :]
        # the new rows by WY: (I + A) U = beta (V - Wk), A[t,s] = beta_t e^{c_t-c_s} k_t.k_s
        decay = torch.exp(c[:, :, None] - c[:, None, :]).tril()         # [HV, K, K]
        A = (bb[..., None] * decay * (Kr @ Kr.transpose(1, 2))).tril(-1)
        rhs = bb[..., None] * (v[b].to(F64).transpose(0, 1) - Wk)        # [HV, K, vd]
        U = torch.linalg.solve_triangular(torch.eye(K, dtype=F64) + A, rhs, upper=False)
        o[b] = (Wq + (decay * (Q @ Kr.transpose(1, 2))) @ U).transpose(0, 1)
        for t in range(K):                                               # append at base+P+t
            j = (base + P + t) % ns
            ring.u[slot, :, j] = round_state(U[:, t], ring_dtype)
            ring.k[slot, :, j] = round_state(Kr[::group, t], ring_dtype)
            ring.G[slot, :, j] = c[:, t]
    return o, engaged


def accept(ring: RefRing, slot_tab, engaged, accepted) -> None:
    """The caller's commit after a verify: ``base = (base + len) mod 2R, len = a`` where the
    verify folded (``engaged == 2``), else ``len += a`` (``0 <= a <= K``). Padding lanes change
    nothing."""
    ns = ring.slots_per_head
    for b, slot in enumerate(slot_list("slot_tab", slot_tab, len(slot_tab), ring.len.shape[0])):
        if slot == PAD:
            continue
        a = int(accepted[b])
        if int(engaged[b]) == 2:
            ring.base[slot] = (int(ring.base[slot]) + int(ring.len[slot])) % ns
            ring.len[slot] = a
        else:
            ring.len[slot] = int(ring.len[slot]) + a


def flush(states, rings, slot_tab, state_dtype=None) -> None:
    """Fold every listed slot's ring into its state (``H0 <- H_P``, rounded once), for each
    layer; ``len`` is left for the caller to clear."""
    for state, ring in zip(states, rings):
        for slot in slot_list("slot_tab", slot_tab, len(slot_tab), state.shape[0]):
            if slot != PAD:
                state[slot] = round_state(ring_state(state[slot], ring, slot), state_dtype)
