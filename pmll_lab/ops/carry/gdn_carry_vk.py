"""Carried-state GDN verify and flush on a V-major state (``state_layout="vk"``; SPEC §3b).

The state is ``[S, HV, vd, kd]`` (inner three dims contiguous); the stash (``GdnCarry``) is the
same as for the K-major kernels (``pmll_lab.ops.carry.exact``): ``u`` rows per value row,
``g`` and normalised ``k`` rows per head. These kernels use the V-major decomposition of
``pmll_lab.ops.gdn.decode_vk``: a program owns a tile of ``BR`` value rows of one
(sequence, value head), ``h [BR, NC, CW]`` (keys in chunks), on the tile ``vk_config`` gives decode for the same
batch, and runs each row through ``gdn_row_vk`` and each fold through ``fold_row_vk``, so the
exact verify is bitwise equal to V-major decoding.

Every kernel here runs ``B * HV * NT`` programs (``NT = cdiv(vd, BR)`` tiles per head), a
head's tiles on consecutive programs (``recurrence.head_tile_program``).

Exact verify: load the tile, fold
the ``p`` pending rows, write the tile back when the protocol says so (eager: ``p > 0``; lazy:
``p + K > CAP``), run the ``K`` rows, store the outputs and stash each row's ``u`` for the
tile's value rows at stash row ``first + t``. The ``g``/``k`` stash rows are shared by the
head's tiles (SPEC §3b "Shared rows"). After a write-back the new rows start at row 0, over
rows other tiles may still be folding: each program counts itself in an arrival counter
(``acq_rel`` atomic) right after its fold, before its first store (so the release waits on
no store and the count's round trip overlaps the rows), and the last to arrive restashes them
after its rows, as the K-major split form does. Without a write-back they go to rows ``p ..``, which no tile of the launch
reads, so tile 0 restashes them with no counter (off the critical path at small batches:
reports/perf-notes-archive.md v14). Rows, stash rows and the state load ahead as the ``vk_ahead``
setting says (``pmll_lab.ops.settings``). After the last row the tile is dead (a verify never
stores the post-row state), so the compiler drops that row's state update.

Flush, grid ``(B * HV * NT, L)``: as the K-major flush (``pmll_lab.ops.carry.gdn_carry_pending``,
per-layer offset tables), on V-major tiles.
The exact verify and the flush are built from the layout-generic pieces of
``pmll_lab.ops.carry.exact_rows`` (``VK=True`` here), shared with the K-major kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.carry.exact_kernels import ROW_UNSPECIALIZED
from pmll_lab.ops.carry.exact_rows import (exact_row, flush_tile, fold_pending,
                                                   restash_shared_rows, row_ptrs,
                                                   stash_rows_ahead_vk, store_engaged,
                                                   verify_prologue)
from pmll_lab.ops.gdn.decode_vk import (load_row_inputs_vk, row_inputs_vk, rows_ahead_vk,
                                        vk_tile_index, vk_tile_offsets)
from pmll_lab.ops.gdn.recurrence import head_tile_program, load_gate_params, state_tile


@triton.jit
def _fold_tile(h_ptr, u_ptr, gs_ptr, ks_ptr, p, rk, mk, rr, mr,
               HV: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, PREFETCH: tl.constexpr,
               CAP: tl.constexpr, STASH_AHEAD: tl.constexpr, STATE_VEC: tl.constexpr = 0):
    """``(h, pointers, mask)``: the tile ``[BR, NC, CW]`` (value rows ``rr``) of one head with
    its ``p`` pending stash rows folded in (``STASH_AHEAD`` of them loaded with the tile), after
    a barrier (every thread's fold loads done before a restash may overwrite those rows).
    ``STATE_VEC > 0``: the tile is loaded at most that many contiguous keys per thread
    (``recurrence.vk_state_vector``), so it lies in registers as decode's tile does."""
    ahead = stash_rows_ahead_vk(u_ptr, gs_ptr, ks_ptr, rk, mk, rr, mr, HV, KD, VD, CAP,
                                STASH_AHEAD)
    m2 = mr[:, None, None] & mk[None, :, :]
    hp = h_ptr + vk_tile_offsets(rk, rr, KD)
    if STATE_VEC > 0:
        hp = tl.max_contiguous(hp, [1, 1, STATE_VEC])
    h = state_tile(tl.load(hp, mask=m2, other=0.0))
    h = fold_pending(h, ahead, u_ptr, gs_ptr, ks_ptr, p, rk, mk, rr, mr, h_ptr, HV, KD, VD,
                     PREFETCH, True)
    tl.debug_barrier()
    return h, hp, m2


@triton.jit(**ROW_UNSPECIALIZED)
def gdn_carry_exact_vk_kernel(
    state_ptr, stash_ptr, pend_ptr, slot_ptr, arrive_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, engaged_ptr, alog_ptr, dtb_ptr,
    scale, stride_state, stride_stash,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
    sg_b, sg_t, sb_b, sb_t, so_b, so_t, so_h,
    K: tl.constexpr, CAP: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    KD: tl.constexpr, VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    LAZY: tl.constexpr, USE_QK_L2NORM: tl.constexpr, PREFETCH: tl.constexpr,
    UNROLL: tl.constexpr, NC: tl.constexpr, CW: tl.constexpr, GATE: tl.constexpr,
    QK_ALIGNED: tl.constexpr, AHEAD: tl.constexpr, STASH_AHEAD: tl.constexpr,
    STATE_VEC: tl.constexpr,
):
    """Exact verify on V-major tiles of ``BV`` value rows (``NV`` tiles per head), keys in
    ``NC`` chunks of ``CW``; the state tile loaded ``STATE_VEC`` keys per thread, as decode's
    (``recurrence.vk_state_vector``)."""
    b, hv, j = head_tile_program(HV, NV)
    hk = hv // GROUP
    qrow, krow, vrow, orow = row_ptrs(q_ptr, k_ptr, v_ptr, o_ptr, b, hv, hk, sq_b, sq_h, sk_b,
                                      sk_h, sv_b, sv_h, so_b, so_h)
    grow = g_ptr + b * sg_b + hv
    brow = beta_ptr + b * sb_b + hv
    rk, mk, rr, mr, _ = vk_tile_index(j, KD, VD, BV, NC, CW)
    kept = ()                            # rows the restash takes from registers
    if UNROLL:                           # rows ahead first: they need no slot
        rows = rows_ahead_vk((), -1, qrow, krow, vrow, grow, brow, sq_t, sk_t, sv_t, sg_t, sb_t,
                             rk, mk, rr, mr, K, AHEAD, QK_ALIGNED)
    ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)
    slot, live, p, wb, first, h_ptr, u_ptr, gs_ptr, ks_ptr = verify_prologue(
        state_ptr, stash_ptr, pend_ptr, slot_ptr, b, hv, stride_state, stride_stash,
        K, CAP, HV, KD, VD, LAZY)
    h, hp, m2 = _fold_tile(h_ptr, u_ptr, gs_ptr, ks_ptr, p, rk, mk, rr, mr & live, HV, KD, VD,
                           PREFETCH, CAP, STASH_AHEAD, STATE_VEC)
    arrived = tl.full([], -1, tl.int32)
    if wb:                               # counted once folded, before any store: the release
        arrived = tl.atomic_add(arrive_ptr + slot * HV + hv, 1, sem="acq_rel", mask=live)
        tl.store(hp, h, mask=m2)         # waits on no store, and the count overlaps the rows
    if UNROLL:
        for t in tl.static_range(K):
            rows = rows_ahead_vk(rows, t, qrow, krow, vrow, grow, brow, sq_t, sk_t, sv_t, sg_t,
                                 sb_t, rk, mk, rr, mr, K, AHEAD, QK_ALIGNED)
            q, k, v, g, beta = row_inputs_vk(rows[t], ga, gd, GATE)
            h = exact_row(h, q, k, v, g, beta, t, scale, orow, so_t, u_ptr, first, rr, mr,
                              live, h_ptr, HV, VD, USE_QK_L2NORM, True)
        if AHEAD >= K:                   # loaded before the first row: keep them
            kept = rows
    else:
        for t in range(K):
            q, k, v, g, beta = load_row_inputs_vk(qrow + t * sq_t, krow + t * sk_t,
                                                  vrow + t * sv_t, grow + t * sg_t,
                                                  brow + t * sb_t, rk, mk, rr, mr, ga, gd,
                                                  GATE, QK_ALIGNED)
            h = exact_row(h, q, k, v, g, beta, t, scale, orow, so_t, u_ptr, first, rr, mr,
                              live, h_ptr, HV, VD, USE_QK_L2NORM, True)
    # After a write-back the new rows overwrite rows 0..: the last tile to count itself
    # restashes, once every tile has folded; else rows p.., which no tile reads: tile 0.
    if live & tl.where(wb, arrived == NV - 1, j == 0):
        restash_shared_rows(gs_ptr, ks_ptr, kept, qrow, krow, g_ptr, b, hv, first, scale,
                            sq_t, sk_t, sg_b, sg_t, rk, mk, ga, gd, K, HV, KD,
                            USE_QK_L2NORM, GATE, QK_ALIGNED, True)
        if wb:
            tl.atomic_xchg(arrive_ptr + slot * HV + hv, 0, sem="relaxed")
    store_engaged(engaged_ptr, b, hv, j, wb)


@triton.jit
def gdn_carry_flush_vk_kernel(
    state_ptr, stash_ptr, pend_ptr, slot_ptr, state_off_ptr, stash_off_ptr, pend_off_ptr,
    stride_state, stride_stash,
    CAP: tl.constexpr, HV: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, PREFETCH: tl.constexpr,
    NC: tl.constexpr, CW: tl.constexpr, STASH_AHEAD: tl.constexpr,
):
    """Flush on V-major tiles (the K-major flush's arguments; ``BV`` value rows, keys in
    ``NC`` chunks of ``CW``)."""
    flush_tile(state_ptr, stash_ptr, pend_ptr, slot_ptr, state_off_ptr, stash_off_ptr,
               pend_off_ptr, stride_state, stride_stash, CAP, HV, KD, VD, BK, BV, NV, PREFETCH,
               NC, CW, STASH_AHEAD, True)
