"""The exact carried-state GDN verify and the flush: the Triton kernels of both state layouts
(SPEC §3b). Launched by ``pmll_lab.ops.carry.exact`` (verify; its module docstring gives the
buffers, grids and the protocol) and ``pmll_lab.ops.carry.stash`` (flush). The pieces both
layouts share (prologue, fold loop, row, restash, ``engaged``, flush body) are in
``pmll_lab.ops.carry.exact_rows``, written once behind the ``tl.constexpr`` layout flag ``VK``;
this module holds each layout's kernels on them, in three parts:

K-major (``state_layout="kv"``, ``state [S, HV, kd, vd]``, ``VK=False``): one program per
(sequence, value head, column block of ``BV`` value columns) (or per (sequence, head) looping
over the blocks, ``exact_split_columns`` off), decode's own ``block_config`` split; it folds the
``pend`` pending stash rows (``fold_row``), writes the block back when the protocol says so,
then runs the ``K`` rows through ``qk_prepare`` + ``gdn_row`` of ``pmll_lab.ops.gdn.recurrence``,
the same code as plain decode, so outputs and folded states are bitwise equal to decoding the
rows one by one (SPEC §2). The shared ``g``/``k`` stash rows are restashed by the last program of
a head to arrive (an ``acq_rel`` counter), so a write-back that restarts the stash can never
overwrite a row still to be folded (SPEC §3b "Shared rows").

V-major (``state_layout="vk"``, the default, ``state [S, HV, vd, kd]``, ``VK=True``): the
decomposition of ``pmll_lab.ops.gdn.decode_vk``: a program owns a tile of ``BR`` value rows of
one (sequence, value head), ``h [BR, NC, CW]`` (keys in chunks), on the tile ``vk_config`` gives
decode for the same batch, and runs each row through ``gdn_row_vk`` and each fold through
``fold_row_vk``, so the exact verify is bitwise equal to V-major decoding. ``B * HV * NT``
programs (``NT = cdiv(vd, BR)`` tiles per head), a head's tiles on consecutive programs
(``recurrence.head_tile_program``). The program loads the tile, folds the ``p`` pending rows,
writes the tile back when the protocol says so (eager: ``p > 0``; lazy: ``p + K > CAP``), runs
the ``K`` rows, stores the outputs and stashes each row's ``u`` for the tile's value rows at
stash row ``first + t``. After a write-back the new rows start at row 0, over rows other tiles
may still be folding: each program counts itself in an arrival counter (``acq_rel`` atomic)
right after its fold, before its first store (so the release waits on no store and the count's
round trip overlaps the rows), and the last to arrive restashes the shared rows after its rows,
as the K-major split form does. Without a write-back they go to rows ``p ..``, which no tile of
the launch reads, so tile 0 restashes them with no counter (off the critical path at small
batches: reports/perf-notes-archive.md v14). Rows, stash rows and the state load ahead as the
``vk_ahead`` setting says (``pmll_lab.ops.settings``). After the last row the tile is dead (a
verify never stores the post-row state), so the compiler drops that row's state update.

Flush (both layouts, ``flush_tile``): the pending rows folded into the state for ``L`` layers
in one launch, grid ``(B * HV * NV, L)`` (per-layer offset tables).

Source: the carried-state protocol of the seeds (``SPEC §3b``); the row is FLA's fused recurrent
Gated DeltaNet step (Yang et al. 2024, "Gated Delta Networks").
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.carry.exact_rows import (exact_row, flush_tile, fold_pending,
                                           restash_shared_rows, row_ptrs, stash_rows_ahead_vk,
                                           store_engaged, verify_prologue)
from pmll_lab.ops.gdn.decode_vk import (load_row_inputs_vk, row_inputs_vk, rows_ahead_vk,
                                        vk_tile_index, vk_tile_offsets)
from pmll_lab.ops.gdn.recurrence import (head_tile_program, load_gate_params, load_row_inputs,
                                         state_tile)

# Row vectors (q, k, v, g, beta, o) and their strides are not specialised on alignment or
# divisibility, as in decode (``pmll_lab.ops.gdn.decode``): the compiler picks the layout of a
# loaded vector, and so the order of the l2norm and ``k.q`` sums, from what it knows of the
# pointer. Specialised, these kernels loaded q/k 4 elements per thread where decode loads 1, and
# on the H200 their outputs differed from decode in the last bits (2026-11-29). Checked on the CPU
# for sm_90 by ``pmll_lab.lowering`` (tests/cuda/test_lowering.py). The stash is left unspecialised
# too: its key rows are loaded on the same ``rk`` lanes as q/k, and the compiler propagates a
# wide layout from those aligned loads to the q/k loads (seen in the sm_90 TTGIR). Stash rows
# are a few hundred bytes per row; the state stays specialised (wide loads, as in decode).
# ``ROW_PTRS`` / ``ROW_STRIDES``: the exact verify kernels' row pointer and stride parameters
# (names, as in the kernels' signatures; every K-major and V-major exact verify kernel has them),
# and ``ROW_UNSPECIALIZED`` the ``triton.jit`` options that keep them unspecialised (every
# exact verify kernel below is built with them); public because tests/cuda/test_lowering.py
# checks them.
ROW_PTRS = ["q_ptr", "k_ptr", "v_ptr", "g_ptr", "beta_ptr", "o_ptr", "stash_ptr"]
ROW_STRIDES = ["sq_b", "sq_t", "sq_h", "sk_b", "sk_t", "sk_h", "sv_b", "sv_t", "sv_h",
               "sg_b", "sg_t", "sb_b", "sb_t", "so_b", "so_t", "so_h", "stride_stash"]
ROW_UNSPECIALIZED = dict(do_not_specialize=ROW_STRIDES,
                         do_not_specialize_on_alignment=ROW_PTRS)


# -- K-major: blocks of value columns ---------------------------------------------------------

@triton.jit
def _folded_block(h_ptr, u_ptr, gs_ptr, ks_ptr, p, wb, rk, mk, rv, mv,
                  HV: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, PREFETCH: tl.constexpr,
                  STATE_VEC: tl.constexpr = 0):
    """The state block ``[BK, BV]`` (key rows ``rk``, value columns ``rv``) of one head with its
    ``p`` pending stash rows folded in, written back when ``wb``. ``STATE_VEC > 0``: loaded at
    most that many columns per thread, as decode loads it (``recurrence.kv_state_vector``)."""
    m2 = mk[:, None] & mv[None, :]
    hp = h_ptr + rk[:, None] * VD + rv[None, :]
    if STATE_VEC > 0:
        hp = tl.max_contiguous(hp, [1, STATE_VEC])
    h = state_tile(tl.load(hp, mask=m2, other=0.0))
    h = fold_pending(h, (), u_ptr, gs_ptr, ks_ptr, p, rk, mk, rv, mv, h_ptr, HV, KD, VD,
                     PREFETCH, False)
    tl.debug_barrier()  # every thread's fold loads of u rows done before they are restashed
    if wb:
        tl.store(hp, h, mask=m2)
    return h


@triton.jit
def _exact_column_block(h_ptr, u_ptr, gs_ptr, ks_ptr, qrow, krow, vrow, orow,
                        g_ptr, beta_ptr, o_ptr, b, hv, live, p, wb, first, scale, j,
                        sq_t, sk_t, sv_t, sg_b, sg_t, sb_b, sb_t, so_t, ga, gd,
                        K: tl.constexpr, HV: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
                        PREFETCH: tl.constexpr, UNROLL: tl.constexpr, GATE: tl.constexpr,
                        STATE_VEC: tl.constexpr):
    """Columns ``j*BV ..`` of one head: load the state block, fold the ``p`` pending rows, write
    it back if ``wb``, run the ``K`` rows (decode's ``gdn_row``), store outputs and stash ``u``.
    ``PREFETCH``: row ``t+1``'s inputs are loaded before row ``t`` runs; ``UNROLL``: the rows are
    unrolled (else a runtime loop, one compiled body for every row, without the prefetch).
    A padding lane (``live`` false) touches no state or stash and stores zero outputs."""
    rk = tl.arange(0, BK)
    mk = rk < KD
    rv = j * BV + tl.arange(0, BV)
    mv = rv < VD
    ml = mv & live
    h = _folded_block(h_ptr, u_ptr, gs_ptr, ks_ptr, p, wb, rk, mk, rv, ml, HV, KD, VD, PREFETCH,
                      STATE_VEC)
    grow = g_ptr + b * sg_b + hv
    brow = beta_ptr + b * sb_b + hv
    if UNROLL:
        if PREFETCH:
            nxt = load_row_inputs(qrow, krow, vrow, grow, brow, rk, mk, rv, mv, ga, gd, GATE)
        for t in tl.static_range(K):
            if PREFETCH:
                q, k, v, g, beta = nxt
                if t + 1 < K:
                    nxt = load_row_inputs(qrow + (t + 1) * sq_t, krow + (t + 1) * sk_t,
                                          vrow + (t + 1) * sv_t, grow + (t + 1) * sg_t,
                                          brow + (t + 1) * sb_t, rk, mk, rv, mv, ga, gd,
                                          GATE)
            else:
                q, k, v, g, beta = load_row_inputs(qrow + t * sq_t, krow + t * sk_t,
                                                   vrow + t * sv_t, grow + t * sg_t,
                                                   brow + t * sb_t, rk, mk, rv, mv, ga, gd,
                                                   GATE)
            h = exact_row(h, q, k, v, g, beta, t, scale, orow, so_t, u_ptr, first, rv, mv,
                           live, h_ptr, HV, VD, USE_QK_L2NORM, False)
    else:
        for t in range(K):
            q, k, v, g, beta = load_row_inputs(qrow + t * sq_t, krow + t * sk_t, vrow + t * sv_t,
                                               grow + t * sg_t, brow + t * sb_t, rk, mk, rv, mv,
                                               ga, gd, GATE)
            h = exact_row(h, q, k, v, g, beta, t, scale, orow, so_t, u_ptr, first, rv, mv,
                           live, h_ptr, HV, VD, USE_QK_L2NORM, False)


@triton.jit
def _restash_shared_rows(gs_ptr, ks_ptr, qrow, krow, g_ptr, b, hv, first, scale,
                         sq_t, sk_t, sg_b, sg_t, ga, gd,
                         K: tl.constexpr, HV: tl.constexpr, KD: tl.constexpr,
                         BK: tl.constexpr, USE_QK_L2NORM: tl.constexpr, GATE: tl.constexpr):
    """Stash the ``K`` rows' log decays and normalised keys (shared by a head's column blocks)
    at rows ``first ..``: call only once every block has folded the old rows. With ``GATE``,
    ``g_ptr`` holds ``a`` and the stashed decay is the one the rows computed (``gdn_gate_g``)."""
    rk = tl.arange(0, BK)
    mk = rk < KD
    restash_shared_rows(gs_ptr, ks_ptr, (), qrow, krow, g_ptr, b, hv, first, scale, sq_t, sk_t,
                        sg_b, sg_t, rk, mk, ga, gd, K, HV, KD, USE_QK_L2NORM, GATE, False, False)


@triton.jit(**ROW_UNSPECIALIZED)
def gdn_carry_exact_kernel(
    state_ptr, stash_ptr, pend_ptr, slot_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, engaged_ptr, alog_ptr, dtb_ptr,
    scale, stride_state, stride_stash,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
    sg_b, sg_t, sb_b, sb_t, so_b, so_t, so_h,
    K: tl.constexpr, CAP: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    KD: tl.constexpr, VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    LAZY: tl.constexpr, USE_QK_L2NORM: tl.constexpr, PREFETCH: tl.constexpr,
    UNROLL: tl.constexpr, GATE: tl.constexpr, STATE_VEC: tl.constexpr = 0,
):
    """The exact form, one program per (sequence, head) looping over the head's column
    blocks (grid ``(B, HV)``); the shared g/k rows are restashed after the last block.
    ``STATE_VEC``: decode's state vector cap (``recurrence.kv_state_vector``).

    Buffers and meaning as ``gdn_carry_verify`` documents them (K-major ``state [S, HV, kd,
    vd]`` fp32/bf16/fp16, stash fp32, ``pend`` and ``engaged`` int32); launched by it, after its
    checks, with ``exact_split_columns`` off (``exact._verify_launch_args``), so the kernel
    itself raises nothing. Public because ``pmll_lab.lowering`` compiles it for sm_90 to check
    that its reductions lie as decode's do."""
    b = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    hk = hv // GROUP
    slot, live, p, wb, first, h_ptr, u_ptr, gs_ptr, ks_ptr = verify_prologue(
        state_ptr, stash_ptr, pend_ptr, slot_ptr, b, hv, stride_state, stride_stash,
        K, CAP, HV, KD, VD, LAZY)
    ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)
    qrow, krow, vrow, orow = row_ptrs(q_ptr, k_ptr, v_ptr, o_ptr, b, hv, hk, sq_b, sq_h, sk_b,
                                      sk_h, sv_b, sv_h, so_b, so_h)

    for j in tl.static_range(0, NV):
        _exact_column_block(h_ptr, u_ptr, gs_ptr, ks_ptr, qrow, krow, vrow, orow,
                            g_ptr, beta_ptr, o_ptr, b, hv, live, p, wb, first, scale, j,
                            sq_t, sk_t, sv_t, sg_b, sg_t, sb_b, sb_t, so_t, ga, gd,
                            K, HV, KD, VD, BK, BV, USE_QK_L2NORM, PREFETCH, UNROLL, GATE,
                            STATE_VEC)
    tl.debug_barrier()
    if live:
        _restash_shared_rows(gs_ptr, ks_ptr, qrow, krow, g_ptr, b, hv, first, scale,
                             sq_t, sk_t, sg_b, sg_t, ga, gd, K, HV, KD, BK,
                             USE_QK_L2NORM, GATE)
    store_engaged(engaged_ptr, b, hv, 0, wb)


@triton.jit(**ROW_UNSPECIALIZED)
def gdn_carry_exact_split_kernel(
    state_ptr, stash_ptr, pend_ptr, slot_ptr, arrive_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, engaged_ptr, alog_ptr, dtb_ptr,
    scale, stride_state, stride_stash,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
    sg_b, sg_t, sb_b, sb_t, so_b, so_t, so_h,
    K: tl.constexpr, CAP: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    KD: tl.constexpr, VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    LAZY: tl.constexpr, USE_QK_L2NORM: tl.constexpr, PREFETCH: tl.constexpr,
    UNROLL: tl.constexpr, GATE: tl.constexpr, STATE_VEC: tl.constexpr = 0,
):
    """The exact form with a head's column blocks split across programs (grid
    ``(B * HV * NV,)``, decode's own split and program order, ``head_tile_program``). Shared
    rows: each program counts itself in ``arrive[slot, hv]`` after its fold (an acq_rel
    atomic); the last one to arrive restashes the g/k rows, once every other block has folded
    the old ones, and sets the count back to 0.

    ``arrive [S, HV]`` int32, zero between launches; the other buffers as in
    ``gdn_carry_exact_kernel``. Launched by ``gdn_carry_verify`` (K-major, the default
    ``exact_split_columns``) after its checks; public for ``pmll_lab.lowering``'s check."""
    b, hv, j = head_tile_program(HV, NV)
    hk = hv // GROUP
    slot, live, p, wb, first, h_ptr, u_ptr, gs_ptr, ks_ptr = verify_prologue(
        state_ptr, stash_ptr, pend_ptr, slot_ptr, b, hv, stride_state, stride_stash,
        K, CAP, HV, KD, VD, LAZY)
    ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)
    qrow, krow, vrow, orow = row_ptrs(q_ptr, k_ptr, v_ptr, o_ptr, b, hv, hk, sq_b, sq_h, sk_b,
                                      sk_h, sv_b, sv_h, so_b, so_h)

    _exact_column_block(h_ptr, u_ptr, gs_ptr, ks_ptr, qrow, krow, vrow, orow,
                        g_ptr, beta_ptr, o_ptr, b, hv, live, p, wb, first, scale, j,
                        sq_t, sk_t, sv_t, sg_b, sg_t, sb_b, sb_t, so_t, ga, gd,
                        K, HV, KD, VD, BK, BV, USE_QK_L2NORM, PREFETCH, UNROLL, GATE,
                        STATE_VEC)
    tl.debug_barrier()
    arrived = tl.atomic_add(arrive_ptr + slot * HV + hv, 1, sem="acq_rel", mask=live)
    if live & (arrived == NV - 1):
        _restash_shared_rows(gs_ptr, ks_ptr, qrow, krow, g_ptr, b, hv, first, scale,
                             sq_t, sk_t, sg_b, sg_t, ga, gd, K, HV, KD, BK,
                             USE_QK_L2NORM, GATE)
        tl.atomic_xchg(arrive_ptr + slot * HV + hv, 0, sem="relaxed")
    store_engaged(engaged_ptr, b, hv, j, wb)


# -- V-major: tiles of value rows ------------------------------------------------------------

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
    state_ptr, stash_ptr, pend_ptr, slot_ptr, arrive_ptr, spec_slot_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, engaged_ptr, alog_ptr, dtb_ptr,
    scale, stride_state, stride_stash,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
    sg_b, sg_t, sb_b, sb_t, so_b, so_t, so_h,
    K: tl.constexpr, CAP: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    KD: tl.constexpr, VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    LAZY: tl.constexpr, USE_QK_L2NORM: tl.constexpr, PREFETCH: tl.constexpr,
    UNROLL: tl.constexpr, NC: tl.constexpr, CW: tl.constexpr, GATE: tl.constexpr,
    QK_ALIGNED: tl.constexpr, AHEAD: tl.constexpr, STASH_AHEAD: tl.constexpr,
    STATE_VEC: tl.constexpr, SPEC_STORE: tl.constexpr,
):
    """Exact verify on V-major tiles of ``BV`` value rows (``NV`` tiles per head), keys in
    ``NC`` chunks of ``CW``; the state tile loaded ``STATE_VEC`` keys per thread, as decode's
    (``recurrence.vk_state_vector``). ``SPEC_STORE``: the tile after all ``K`` rows (the
    full-acceptance state, rounded as decode stores it) is also stored in slot
    ``spec_slot_ptr[b]`` of the pool."""
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
    if SPEC_STORE:                       # the full-acceptance state, into the spare slot
        spec = tl.load(spec_slot_ptr + b).to(tl.int64)
        tl.store(state_ptr + tl.maximum(spec, 0) * stride_state + hv * (KD * VD)
                 + vk_tile_offsets(rk, rr, KD), h, mask=m2 & (spec >= 0))
    # After a write-back the new rows overwrite rows 0..: the last tile to count itself
    # restashes, once every tile has folded; else rows p.., which no tile reads: tile 0.
    if live & tl.where(wb, arrived == NV - 1, j == 0):
        restash_shared_rows(gs_ptr, ks_ptr, kept, qrow, krow, g_ptr, b, hv, first, scale,
                            sq_t, sk_t, sg_b, sg_t, rk, mk, ga, gd, K, HV, KD,
                            USE_QK_L2NORM, GATE, QK_ALIGNED, True)
        if wb:
            tl.atomic_xchg(arrive_ptr + slot * HV + hv, 0, sem="relaxed")
    store_engaged(engaged_ptr, b, hv, j, wb)


# -- Flush: both layouts on ``flush_tile`` --------------------------------------------------

@triton.jit
def gdn_carry_flush_kernel(
    state_ptr, stash_ptr, pend_ptr, slot_ptr, state_off_ptr, stash_off_ptr, pend_off_ptr,
    stride_state, stride_stash,
    CAP: tl.constexpr, HV: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, PREFETCH: tl.constexpr,
):
    """The flush on K-major blocks (``BV`` value columns): ``flush_tile``. Grid
    ``(B * HV * NV, L)``; ``state``/stash/``pend`` of layer ``l`` at the layer-0 pointers plus
    ``*_off[l]`` (int64 ``[L]`` element offsets). Launched by ``gdn_carry_flush``
    (``pmll_lab.ops.carry.stash``) after its checks; public for that launcher and
    the sm_90 compile check."""
    flush_tile(state_ptr, stash_ptr, pend_ptr, slot_ptr, state_off_ptr, stash_off_ptr,
               pend_off_ptr, stride_state, stride_stash, CAP, HV, KD, VD, BK, BV, NV, PREFETCH,
               1, 1, 0, False)


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
