"""Gated DeltaNet decode and the K-row chain on a V-major state (``state_layout="vk"``).

The state is stored ``[S, HV, vd, kd]``: each value row's ``kd`` keys contiguous (FlashInfer's
and SGLang's "pretranspose" layout; SPEC §2 "Serving conventions"). The recurrence is
independent per value row, so ``gdn_rows_vk_kernel`` gives each program a tile of ``BR`` value
rows of one (sequence, value head), held as ``h [BR, NC, CW]`` fp32 (the key axis in chunks,
``pmll_lab.ops.gdn.recurrence``'s V-major section), and reduces over keys
(``gdn_row_vk``). With ``BR = 8`` and one warp that is 32 state registers per thread (the
K-major kernel holds 128), so many programs are resident. Tile and warps come from ``vk_config`` (one
table keyed on ``B * HV``), shared with the V-major carry kernels: decode, the chain and the
exact carry run the same per-row instructions on the same tiles (bitwise agreement, SPEC §2).

Grid: ``(B * HV * NT,)`` with ``NT = cdiv(vd, BR)`` tiles per head; program
``(b * HV + hv) * NT + j`` owns value rows ``j*BR .. j*BR+BR-1`` of head ``hv`` of sequence ``b``
and reads key head ``hv // (HV // HK)`` (``recurrence.head_tile_program``: a head's tiles run
on consecutive programs, so the programs resident at a time stream a few whole heads).
Arguments are those of ``pmll_lab.ops.gdn.decode.gdn_rows_kernel`` (the launcher there builds
both), with the state's third stride being the value-row stride and the snapshots
``[B, K-1, HV, vd, kd]``; here those two value-row strides (``s_row``, ``i_r``) are constexprs,
so a tile's element offsets are immediates rather than a 64-bit address per element (one
compile per stride, in practice ``kd``: 126 -> 96 registers on sm_90), and ``QK_ALIGNED``
(``recurrence.vk_qk_aligned``) lets q/k rows load as vectors. Rows stay unrolled up to
``chain_unroll_max_rows`` (``pmll_lab.ops.settings``), as in the K-major chain.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.gdn.recurrence import (gdn_row_vk, head_tile_program, load_gate_params,
                                         qk_prepare_vk, round_to_state, row_gates,
                                         state_tile)

# Row vectors and their strides are not specialised (as in decode.py, which takes these lists
# from here): the register layout of a loaded vector, and so the order of the l2norm and k.q
# sums, must not depend on what Triton infers from where a view starts; q/k rows get their
# alignment from ``QK_ALIGNED`` instead, which the launcher decides from the whole tensor
# (``recurrence.vk_qk_aligned``). ``ROW_PTRS`` / ``ROW_STRIDES``: the decode kernels' (K-major
# and V-major) row pointer and stride parameter names; tests/cuda/test_lowering.py checks them.
ROW_PTRS = ["q", "k", "v", "g", "beta", "o"]
ROW_STRIDES = ["q_b", "q_t", "q_h", "k_b", "k_t", "k_h", "v_b", "v_t", "v_h", "g_b", "g_t",
               "beta_b", "beta_t", "o_b", "o_t", "o_h"]


@triton.jit
def vk_tile_index(pid_r, KD: tl.constexpr, VD: tl.constexpr, BV: tl.constexpr,
                  NC: tl.constexpr, CW: tl.constexpr):
    """Index vectors of tile ``pid_r``: key offsets ``rk [NC, CW]`` and mask ``mk``, value
    rows ``rr [BV]`` and mask ``mr``, and the tile's mask ``[BV, NC, CW]``."""
    rk = tl.arange(0, NC)[:, None] * CW + tl.arange(0, CW)[None, :]
    mk = rk < KD
    rr = pid_r * BV + tl.arange(0, BV)
    mr = rr < VD
    mh = mr[:, None, None] & mk[None, :, :]
    return rk, mk, rr, mr, mh


@triton.jit
def vk_tile_offsets(rk, rr, row_stride):
    """Element offsets ``[BV, NC, CW]`` of a tile: value rows ``rr`` ``row_stride`` apart,
    keys ``rk`` contiguous."""
    return rr[:, None, None] * row_stride + rk[None, :, :]


@triton.jit
def load_key_row_vk(row, rk, mk, QK_ALIGNED: tl.constexpr):
    """A ``q`` or ``k`` row's keys ``rk [NC, CW]`` as stored (padding lanes 0). With
    ``QK_ALIGNED`` (``recurrence.vk_qk_aligned``: the launcher found every row on 16 bytes) the
    row is declared 16-byte aligned, so each thread loads its keys as one vector and the l2norm
    and ``k.q`` sums run on the tile's own layout; without it the compiler loads one key per
    thread and shuffles (sm_90: 2432 against 2016 instructions per 8-row decode program, the
    carry 3960 against 3496; reports/perf-notes-archive.md v12). Every exact V-major kernel (decode,
    the chain, the exact verify and its restash) loads q/k rows through here, so with equal
    ``QK_ALIGNED`` their sums run in the same order. The hint holds for every key chunk's
    start too: chunks are ``vk_chunk`` keys (32: 64 bytes of bf16), and a row of one chunk
    starts the row."""
    p = row + rk
    if QK_ALIGNED:
        p = tl.multiple_of(p, [16, 16])
    return tl.load(p, mask=mk, other=0.0)


@triton.jit
def load_row_vk(q_row, k_row, v_row, g_row, beta_row, rk, mk, rr, mr, QK_ALIGNED: tl.constexpr):
    """One row's inputs as stored, ``(q, k [NC, CW], v [BR], g, beta)`` (padding lanes 0), so
    that rows loaded ahead of their use hold their input type's registers (bf16: half of
    fp32's) until ``row_inputs_vk`` converts them."""
    q = load_key_row_vk(q_row, rk, mk, QK_ALIGNED)
    k = load_key_row_vk(k_row, rk, mk, QK_ALIGNED)
    v = tl.load(v_row + rr, mask=mr, other=0.0)
    return q, k, v, tl.load(g_row), tl.load(beta_row)


@triton.jit
def row_inputs_vk(row, ga, gd, GATE: tl.constexpr):
    """A row from ``load_row_vk`` as fp32 ``(q, k, v, g, beta)``; with ``GATE``, ``g, beta``
    computed from the loaded ``a, b`` and ``A_log``, ``dt_bias`` (``ga``, ``gd``;
    ``recurrence.row_gates``)."""
    q, k, v, g, beta = row
    g, beta = row_gates(g, beta, ga, gd, GATE)
    return q.to(tl.float32), k.to(tl.float32), v.to(tl.float32), g, beta


@triton.jit
def load_row_inputs_vk(q_row, k_row, v_row, g_row, beta_row, rk, mk, rr, mr, ga, gd,
                       GATE: tl.constexpr, QK_ALIGNED: tl.constexpr):
    """One row's inputs as fp32 for a V-major tile: ``q, k [NC, CW]`` (padding lanes 0;
    ``load_key_row_vk``), ``v [BR]`` (the tile's value rows), scalars ``g``, ``beta``
    (with ``GATE``, computed from ``a, b`` and ``A_log``, ``dt_bias``)."""
    return row_inputs_vk(load_row_vk(q_row, k_row, v_row, g_row, beta_row, rk, mk, rr, mr,
                                     QK_ALIGNED), ga, gd, GATE)


@triton.jit
def rows_ahead_vk(rows, t, q_row, k_row, v_row, g_row, beta_row, q_t, k_t, v_t, g_t, beta_t,
                  rk, mk, rr, mr, K: tl.constexpr, AHEAD: tl.constexpr,
                  QK_ALIGNED: tl.constexpr):
    """Rows loaded ahead of their use (``settings.vk_ahead_row``): ``rows`` is the tuple of
    ``load_row_vk`` rows ``0 ..`` loaded so far; returns it with every row up to ``t + AHEAD``
    (and below ``K``) loaded, so row ``t`` is ``rows[t]``. Call with ``t = -1`` before the
    row loop (rows ``0 .. AHEAD-1``), then with each ``t`` before row ``t`` runs. ``AHEAD = 0``
    loads each row just before it runs; ``AHEAD >= K`` loads every row before the first.
    Why: a row's loads cannot move above the previous row's stores (they may alias), so
    without loading ahead each row waits one memory latency (reports/perf-notes-archive.md v14)."""
    for i in tl.static_range(K):
        if i >= len(rows):
            if i <= t + AHEAD:
                rows = rows + (load_row_vk(q_row + i * q_t, k_row + i * k_t, v_row + i * v_t,
                                           g_row + i * g_t, beta_row + i * beta_t,
                                           rk, mk, rr, mr, QK_ALIGNED),)
    return rows


@triton.jit
def _chain_row_vk(h, t, row, o, inter, b64, hv, o_b, o_t, o_h, i_b, i_t, i_h, i_r,
                  rk, rr, mr, mh, live, scale, ga, gd, K: tl.constexpr,
                  STORE_INTER: tl.constexpr, USE_QK_L2NORM: tl.constexpr, GATE: tl.constexpr):
    """Row ``t`` on its loaded inputs ``row`` (``load_row_vk``): ``qk_prepare``,
    ``gdn_row_vk``, store ``o`` (and the snapshot tile after the row when ``STORE_INTER`` and
    ``t < K-1``). Returns the new tile."""
    qt, kt, vt, gt, bt = row_inputs_vk(row, ga, gd, GATE)
    qt, kt = qk_prepare_vk(qt, kt, scale, USE_QK_L2NORM)
    h, ot, ut = gdn_row_vk(h, qt, kt, vt, gt, bt)
    if K > 1:   # a bf16/fp16 state as a decode would store it (K = 1: the state store rounds)
        h = round_to_state(h, inter)
    tl.store(o + b64 * o_b + t * o_t + hv * o_h + rr,
             tl.where(live, ot, 0.0).to(o.dtype.element_ty), mask=mr)
    if STORE_INTER:
        if t < K - 1:
            tl.store(inter + b64 * i_b + t * i_t + hv * i_h + vk_tile_offsets(rk, rr, i_r), h,
                     mask=mh)
    return h


@triton.jit(do_not_specialize=ROW_STRIDES, do_not_specialize_on_alignment=ROW_PTRS)
def gdn_rows_vk_kernel(
    state, q, k, v, g, beta, o, inter, slot_idx, out_idx, A_log, dt_bias,
    scale,
    s_slot, s_head, s_row: tl.constexpr,   # state strides (key stride 1)
    q_b, q_t, q_h,
    k_b, k_t, k_h,
    v_b, v_t, v_h,
    g_b, g_t,
    beta_b, beta_t,
    o_b, o_t, o_h,
    i_b, i_t, i_h, i_r: tl.constexpr,      # snapshot strides (batch, row, head, value row)
    HV, GROUP,
    KD: tl.constexpr, VD: tl.constexpr,
    K: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_IDX: tl.constexpr, STORE_INTER: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    UNROLL: tl.constexpr, NC: tl.constexpr, CW: tl.constexpr, HAS_OUT_IDX: tl.constexpr,
    GATE: tl.constexpr, QK_ALIGNED: tl.constexpr, AHEAD: tl.constexpr,
):
    """``K`` rows on one tile of ``BV`` value rows x ``BK = NC * CW`` keys (``BV`` is the
    tile's row count, named as in the K-major kernel so one launcher builds both)."""
    b64, hv, pid_r = head_tile_program(HV, tl.cdiv(VD, BV))
    hk = hv // GROUP
    rk, mk, rr, mr, mh = vk_tile_index(pid_r, KD, VD, BV, NC, CW)
    q_row = q + b64 * q_b + hk * q_h
    k_row = k + b64 * k_b + hk * k_h
    v_row = v + b64 * v_b + hv * v_h
    g_row = g + b64 * g_b + hv
    beta_row = beta + b64 * beta_b + hv
    if UNROLL:                           # rows ahead first: they need no slot
        rows = rows_ahead_vk((), -1, q_row, k_row, v_row, g_row, beta_row,
                             q_t, k_t, v_t, g_t, beta_t, rk, mk, rr, mr, K, AHEAD, QK_ALIGNED)
    ga, gd = load_gate_params(A_log, dt_bias, hv, GATE)
    if HAS_IDX:
        slot = tl.load(slot_idx + b64).to(tl.int64)
    else:
        slot = b64
    live = slot >= 0                     # slot -1: a padding lane (zero outputs, no state access)
    oslot = slot
    if HAS_OUT_IDX:                      # the final state goes to out_idx[b] (-1: padding too)
        oslot = tl.load(out_idx + b64).to(tl.int64)
        live = live & (oslot >= 0)
        oslot = tl.maximum(oslot, 0)
    slot = tl.maximum(slot, 0)
    mh = mh & live
    p_h = state + slot * s_slot + hv * s_head + vk_tile_offsets(rk, rr, s_row)
    h = tl.load(p_h, mask=mh, other=0.0)
    if K > 1:                            # rows kept in registers: the tile as the family holds it
        h = state_tile(h)
    else:                                # a decode: one row, widened once (never packed)
        h = h.to(tl.float32)
    if UNROLL:
        for t in tl.static_range(K):
            rows = rows_ahead_vk(rows, t, q_row, k_row, v_row, g_row, beta_row,
                                 q_t, k_t, v_t, g_t, beta_t, rk, mk, rr, mr, K, AHEAD,
                                 QK_ALIGNED)
            h = _chain_row_vk(h, t, rows[t], o, inter, b64, hv, o_b, o_t, o_h,
                              i_b, i_t, i_h, i_r, rk, rr, mr, mh, live, scale, ga, gd, K,
                              STORE_INTER, USE_QK_L2NORM, GATE)
    else:
        for t in range(K):
            row = load_row_vk(q_row + t * q_t, k_row + t * k_t, v_row + t * v_t,
                              g_row + t * g_t, beta_row + t * beta_t, rk, mk, rr, mr,
                              QK_ALIGNED)
            h = _chain_row_vk(h, t, row, o, inter, b64, hv, o_b, o_t, o_h,
                              i_b, i_t, i_h, i_r, rk, rr, mr, mh, live, scale, ga, gd, K,
                              STORE_INTER, USE_QK_L2NORM, GATE)

    if HAS_OUT_IDX:
        tl.store(p_h + (oslot - slot) * s_slot, h, mask=mh)
    else:
        tl.store(p_h, h, mask=mh)
