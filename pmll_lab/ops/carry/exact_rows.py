"""The pieces of the exact carried-state GDN verify and of the flush that both state layouts
share (SPEC §3b): the prologue, the fold loop of the pending rows, the verified row, the
restash of the shared ``g``/``k`` stash rows, the ``engaged`` store and the flush's body, each
written once with the layout as a ``tl.constexpr`` flag ``VK`` (``False``: K-major blocks
``h [BK, BV]``; ``True``: V-major tiles ``h [BR, NC, CW]``). The kernels built on them, both
layouts', are in ``pmll_lab.ops.carry.exact_kernels``. Why one set of pieces: the protocol
(which rows fold, where the new rows go, who restashes) is the same for both layouts; only the
tile shape and the row arithmetic (``recurrence.gdn_row`` / ``gdn_row_vk``) differ. Each
layout's branch emits the operations its kernels emitted before, in the same order, so the
compiled code is unchanged.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.gdn.decode_vk import load_key_row_vk, vk_tile_index, vk_tile_offsets
from pmll_lab.ops.gdn.recurrence import (fold_row, fold_row_vk, gdn_gate_g, gdn_row, gdn_row_vk,
                                         head_tile_program, qk_prepare, qk_prepare_vk,
                                         round_to_state, state_tile)


@triton.jit
def stash_row_ptrs(s_ptr, hv, CAP: tl.constexpr, HV: tl.constexpr, KD: tl.constexpr,
                   VD: tl.constexpr):
    """Pointers to row 0 of value head ``hv``'s ``u``, ``g`` and ``k`` stash rows in one slot's
    stash ``s_ptr`` (``GdnCarry``'s layout: ``u [CAP, HV, vd]``, ``g [CAP, HV]``,
    ``k [CAP, HV, kd]``, back to back; row ``i`` is ``i * HV * vd``, ``i * HV``, ``i * HV * kd``
    further)."""
    return s_ptr + hv * VD, s_ptr + CAP * HV * VD + hv, s_ptr + CAP * HV * VD + CAP * HV + hv * KD


@triton.jit
def verify_prologue(state_ptr, stash_ptr, pend_ptr, slot_ptr, b, hv, stride_state,
                    stride_stash, K: tl.constexpr, CAP: tl.constexpr, HV: tl.constexpr,
                    KD: tl.constexpr, VD: tl.constexpr, LAZY: tl.constexpr):
    """Sequence ``b``, value head ``hv``: its slot, whether it is a live lane (slot -1 marks a
    padding lane: nothing of it is read or written but its zero outputs; its slot is taken as 0
    for address arithmetic only), pending count ``p`` (0 for padding), the write-back rule
    (eager: ``p > 0``; lazy: ``p + K > CAP``), the first stash row of this verify (0 after a
    write-back, else ``p``), and pointers to the head's state and to its ``u``, ``g``, ``k``
    stash rows (row 0). Both layouts store a head's state as ``KD * VD`` contiguous values.
    ``slot_ptr`` int32/int64, ``pend_ptr`` int32; the launcher has checked ``pend`` in
    ``[0, CAP]``. Shared by the K-major and V-major verify kernels (``exact_kernels``),
    so both read a slot the same way."""
    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0
    slot = tl.maximum(slot, 0)
    p = tl.load(pend_ptr + slot, mask=live, other=0)
    if LAZY:
        wb = (p + K > CAP) & live
    else:
        wb = (p > 0) & live
    first = tl.where(wb, 0, p)
    h_ptr = state_ptr + slot * stride_state + hv * (KD * VD)
    u_ptr, gs_ptr, ks_ptr = stash_row_ptrs(stash_ptr + slot * stride_stash, hv, CAP, HV, KD, VD)
    return slot, live, p, wb, first, h_ptr, u_ptr, gs_ptr, ks_ptr


@triton.jit
def row_ptrs(q_ptr, k_ptr, v_ptr, o_ptr, b, hv, hk, sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, so_b,
             so_h):
    """Row 0 of sequence ``b``'s queries and keys (key head ``hk``), values and outputs (value
    head ``hv``); row ``t`` is ``t`` times the row stride further."""
    qrow = q_ptr + b * sq_b + hk * sq_h
    krow = k_ptr + b * sk_b + hk * sk_h
    vrow = v_ptr + b * sv_b + hv * sv_h
    orow = o_ptr + b * so_b + hv * so_h
    return qrow, krow, vrow, orow


@triton.jit
def _fold_one(h, gi, ki, ui, h_ptr, VK: tl.constexpr):
    """One stash row folded into the block (``fold_row``) or tile (``fold_row_vk``), rounded
    to the state's dtype (``h_ptr``'s) as decoding stores it."""
    if VK:
        h = round_to_state(fold_row_vk(h, tl.exp(gi), ki, ui), h_ptr)
    else:
        h = round_to_state(fold_row(h, tl.exp(gi), ki, ui), h_ptr)
    return h


@triton.jit
def fold_pending(h, ahead, u_ptr, gs_ptr, ks_ptr, p, rk, mk, rv, mv, h_ptr,
                 HV: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, PREFETCH: tl.constexpr,
                 VK: tl.constexpr):
    """Fold stash rows ``0..p-1`` into ``h`` (key offsets ``rk``, value columns or rows
    ``rv``), in order: the rows already loaded in ``ahead`` (``(g, k, u)`` tuples; ``()`` for
    none), then the rest from memory, with ``PREFETCH`` row ``i+1`` loaded before row ``i`` is
    folded (``carry_prefetch_rows``)."""
    for i in tl.static_range(len(ahead)):
        if i < p:
            gi, ki, ui = ahead[i]
            h = _fold_one(h, gi, ki, ui, h_ptr, VK)
    i0 = len(ahead)
    if PREFETCH:
        gn = tl.load(gs_ptr + i0 * HV, mask=p > i0, other=0.0)
        kn = tl.load(ks_ptr + i0 * (HV * KD) + rk, mask=mk & (p > i0), other=0.0)
        un = tl.load(u_ptr + i0 * (HV * VD) + rv, mask=mv & (p > i0), other=0.0)
        for i in range(i0, p):
            gi, ki, ui = gn, kn, un
            more = i + 1 < p
            gn = tl.load(gs_ptr + (i + 1) * HV, mask=more, other=0.0)
            kn = tl.load(ks_ptr + (i + 1) * (HV * KD) + rk, mask=mk & more, other=0.0)
            un = tl.load(u_ptr + (i + 1) * (HV * VD) + rv, mask=mv & more, other=0.0)
            h = _fold_one(h, gi, ki, ui, h_ptr, VK)
    else:
        for i in range(i0, p):
            gi = tl.load(gs_ptr + i * HV)
            ki = tl.load(ks_ptr + i * (HV * KD) + rk, mask=mk, other=0.0)
            ui = tl.load(u_ptr + i * (HV * VD) + rv, mask=mv, other=0.0)
            h = _fold_one(h, gi, ki, ui, h_ptr, VK)
    return h


@triton.jit
def exact_row(h, q, k, v, g, beta, t, scale, orow, so_t, u_ptr, first, rv, mv, live, h_ptr,
              HV: tl.constexpr, VD: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
              VK: tl.constexpr):
    """Row ``t`` of the exact form on its loaded inputs: decode's ``qk_prepare`` + ``gdn_row``
    (``_vk`` twins with ``VK``), the new state rounded to the state's dtype (``h_ptr``'s) as
    decoding stores it, the output columns or rows ``rv`` stored (zeros for a padding lane)
    and ``u`` stashed at row ``first + t`` (live lanes only). Returns the new state."""
    if VK:
        q, k = qk_prepare_vk(q, k, scale, USE_QK_L2NORM)
        h, o, u = gdn_row_vk(h, q, k, v, g, beta)
    else:
        q, k = qk_prepare(q, k, scale, USE_QK_L2NORM)
        h, o, u = gdn_row(h, q, k, v, g, beta)
    h = round_to_state(h, h_ptr)
    tl.store(orow + t * so_t + rv, tl.where(live, o, 0.0).to(orow.dtype.element_ty), mask=mv)
    tl.store(u_ptr + (first + t) * (HV * VD) + rv, u, mask=mv & live)
    return h


@triton.jit
def restash_shared_rows(gs_ptr, ks_ptr, rows, qrow, krow, g_ptr, b, hv, first, scale,
                        sq_t, sk_t, sg_b, sg_t, rk, mk, ga, gd, K: tl.constexpr,
                        HV: tl.constexpr, KD: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
                        GATE: tl.constexpr, QK_ALIGNED: tl.constexpr, VK: tl.constexpr):
    """Stash the ``K`` rows' log decays and normalised keys (shared by a head's column blocks
    or tiles) at rows ``first ..``, the keys normalised on the same vectors as the rows (the
    same bits): V-major from ``rows`` (``load_row_vk`` tuples) where it holds them all, else
    loaded again. With ``GATE``, ``g_ptr`` holds ``a`` and the stashed decay is the one the rows
    computed (``gdn_gate_g``). Call only once every block has folded the old rows."""
    for t in tl.static_range(K):
        if VK:
            if len(rows) == K:
                q, k, _, g, _ = rows[t]
                q = q.to(tl.float32)
                k = k.to(tl.float32)
            else:
                q = load_key_row_vk(qrow + t * sq_t, rk, mk, QK_ALIGNED).to(tl.float32)
                k = load_key_row_vk(krow + t * sk_t, rk, mk, QK_ALIGNED).to(tl.float32)
                g = tl.load(g_ptr + b * sg_b + t * sg_t + hv)
            q, k = qk_prepare_vk(q, k, scale, USE_QK_L2NORM)
        else:
            q = tl.load(qrow + t * sq_t + rk, mask=mk, other=0.0).to(tl.float32)
            k = tl.load(krow + t * sk_t + rk, mask=mk, other=0.0).to(tl.float32)
            q, k = qk_prepare(q, k, scale, USE_QK_L2NORM)
            g = tl.load(g_ptr + b * sg_b + t * sg_t + hv)
        g = g.to(tl.float32)
        if GATE:
            g = gdn_gate_g(ga, g, gd)
        tl.store(gs_ptr + (first + t) * HV, g)
        tl.store(ks_ptr + (first + t) * (HV * KD) + rk, k, mask=mk)


@triton.jit
def store_engaged(engaged_ptr, b, hv, j, wb):
    """``engaged[b]``: 2 after a write-back, else 1, stored by value head 0's block ``j = 0``."""
    if hv == 0:
        if j == 0:
            tl.store(engaged_ptr + b, tl.where(wb, 2, 1).to(tl.int32))


@triton.jit
def stash_rows_ahead_vk(u_ptr, gs_ptr, ks_ptr, rk, mk, rr, mr, HV: tl.constexpr,
                        KD: tl.constexpr, VD: tl.constexpr, CAP: tl.constexpr,
                        AHEAD: tl.constexpr):
    """Stash rows ``0 .. min(AHEAD, CAP)-1`` as ``(g, k [NC, CW], u [BR])`` tuples, loaded
    whatever the pending count (they lie inside the slot's stash; rows past it are not
    folded), so they travel with the state load (the ``vk_ahead`` setting)."""
    rows = ()
    for i in tl.static_range(AHEAD):
        if i < CAP:
            rows = rows + ((tl.load(gs_ptr + i * HV),
                            tl.load(ks_ptr + i * (HV * KD) + rk, mask=mk, other=0.0),
                            tl.load(u_ptr + i * (HV * VD) + rr, mask=mr, other=0.0)),)
    return rows


@triton.jit
def flush_tile(state_ptr, stash_ptr, pend_ptr, slot_ptr, state_off_ptr, stash_off_ptr,
               pend_off_ptr, stride_state, stride_stash,
               CAP: tl.constexpr, HV: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, PREFETCH: tl.constexpr,
               NC: tl.constexpr, CW: tl.constexpr, STASH_AHEAD: tl.constexpr,
               VK: tl.constexpr):
    """The flush of one program (grid ``(B * HV * NV, L)``): block or tile ``j`` of head ``hv``
    of sequence ``b`` in layer ``program_id(1)`` (per-layer offset tables), its pending rows
    folded in (``fold_pending``; V-major: ``STASH_AHEAD`` of them loaded with the tile) and
    stored. A padding lane (slot -1) or a slot with nothing pending is left alone."""
    b, hv, j = head_tile_program(HV, NV)
    layer = tl.program_id(1)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0                     # slot -1: a padding lane, nothing to fold
    slot = tl.maximum(slot, 0)
    p = tl.load(pend_ptr + tl.load(pend_off_ptr + layer) + slot, mask=live, other=0)
    if p > 0:
        if VK:
            rk, mk, rv, mv, m2 = vk_tile_index(j, KD, VD, BV, NC, CW)
        else:
            rk = tl.arange(0, BK)
            mk = rk < KD
            rv = j * BV + tl.arange(0, BV)
            mv = rv < VD
            m2 = mk[:, None] & mv[None, :]
        h_ptr = state_ptr + tl.load(state_off_ptr + layer) + slot * stride_state + hv * (KD * VD)
        s_ptr = stash_ptr + tl.load(stash_off_ptr + layer) + slot * stride_stash
        if VK:
            u_ptr, gs_ptr, ks_ptr = stash_row_ptrs(s_ptr, hv, CAP, HV, KD, VD)
            ahead = stash_rows_ahead_vk(u_ptr, gs_ptr, ks_ptr, rk, mk, rv, mv, HV, KD, VD, CAP,
                                        STASH_AHEAD)
            hp = h_ptr + vk_tile_offsets(rk, rv, KD)
        else:
            ahead = ()
            hp = h_ptr + rk[:, None] * VD + rv[None, :]
        h = state_tile(tl.load(hp, mask=m2, other=0.0))
        if not VK:
            u_ptr, gs_ptr, ks_ptr = stash_row_ptrs(s_ptr, hv, CAP, HV, KD, VD)
        h = fold_pending(h, ahead, u_ptr, gs_ptr, ks_ptr, p, rk, mk, rv, mv, h_ptr, HV, KD, VD,
                         PREFETCH, VK)
        tl.store(hp, h, mask=m2)
