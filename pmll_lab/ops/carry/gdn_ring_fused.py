"""The ring form's verify as one persistent Triton kernel (SPEC §3d): the per-head and the state
kernel of ``gdn_ring_kernels`` in one pass, each program walking tiles with the next tile's state
in flight.

Same algebra, inputs and outputs as ``gdn_ring_prep_kernel`` + ``gdn_ring_verify_kernel`` (their
module docstring has the formulas); what differs is the schedule:

- one launch: a tile ``(sequence, value head, BV value rows)`` forms its head's coefficients
  itself (norms, the new rows' Gram matrix, the ring keys against them, the triangular inverse),
  so nothing goes through a workspace and no program waits for another kernel; with ``NT``
  tiles per head that small work runs ``NT`` times;
- whole-``kd`` loads (one ``tl.dot`` per product, no key loop);
- a fixed grid of ``programs`` (a few per SM) that walk the tiles ``pid, pid + programs, ..``:
  the next tile's state tile is loaded (``PREFETCH``) before the current tile's coefficients,
  small products and stores, so the state streams while the small matrices are formed.

The ring protocol is unchanged: appends go past the window every program reads (rows
``base + P ..`` mod ``2R``), so programs need no ordering. Why this schedule: the two-kernel
verify spent its time in the per-head pass and in the state kernel's short-lived programs
(reports/perf-notes.md "Latest figures: the ring form").
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.carry.gdn_ring_kernels import (_mm, _mm_ieee, _row_gates, _slot_cursor,
                                                 _unit_lower_inverse)
from pmll_lab.ops.gdn.recurrence import load_gate_params


@triton.jit
def _tile_coords(tile, HV: tl.constexpr, NT: tl.constexpr):
    """``(b int64, hv, j)`` of tile number ``tile`` (tiles of one head consecutive)."""
    bh = tile // NT
    return (bh // HV).to(tl.int64), bh % HV, tile % NT


@triton.jit
def _state_tile(state_ptr, slot_ptr, s_slot, tile, n_tiles, HV: tl.constexpr, KD: tl.constexpr,
                VD: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr, NT: tl.constexpr):
    """The stored state tile ``[BV, KP]`` of ``tile`` (zeros past ``n_tiles``, for a padding
    lane and outside ``vd``/``kd``)."""
    b, hv, j = _tile_coords(tile, HV, NT)
    inside = tile < n_tiles
    slot = tl.load(slot_ptr + b, mask=inside, other=-1).to(tl.int64)
    live = (slot >= 0) & inside
    rr = j * BV + tl.arange(0, BV)
    rk = tl.arange(0, KP)
    hrow = state_ptr + tl.maximum(slot, 0) * s_slot + hv * (VD * KD) + rr[:, None] * KD
    return tl.load(hrow + rk[None, :], mask=live & (rr < VD)[:, None] & (rk < KD)[None, :],
                   other=0.0)


@triton.jit
def gdn_ring_fused_kernel(
    state_ptr, kr_ptr, ur_ptr, gr_ptr, len_ptr, base_ptr, slot_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, engaged_ptr, alog_ptr, dtb_ptr,
    scale, s_slot, kr_slot, ur_slot, gr_slot,
    q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h, o_b, o_t, o_h, g_b, g_t, beta_b, beta_t,
    n_tiles,
    K: tl.constexpr, R: tl.constexpr, NS: tl.constexpr, RP: tl.constexpr, HV: tl.constexpr,
    HK: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    NT: tl.constexpr, USE_QK_L2NORM: tl.constexpr, GATE: tl.constexpr,
    PRECISION: tl.constexpr, PREFETCH: tl.constexpr,
):
    """Tiles ``program_id, program_id + num_programs, ..`` of ``n_tiles = B * HV * NT``: per
    tile the verify of ``BV`` value rows of one head (folding first where ``P + K > R``);
    outputs, ``u`` appends, and from a head's tile 0 the ``G`` (and a group's ``k``) appends and
    ``engaged``."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    dt = state_ptr.dtype.element_ty
    x = tl.arange(0, 16)
    t = x % 8
    is_k = x < 8
    i = tl.arange(0, RP)
    rk = tl.arange(0, KP)
    mk = rk < KD
    h_next = tl.zeros((BV, KP), dt)
    if PREFETCH:
        h_next = _state_tile(state_ptr, slot_ptr, s_slot, pid, n_tiles, HV, KD, VD, KP, BV, NT)
    for tile in range(pid, n_tiles, nprog):
        if PREFETCH:
            h = h_next
            h_next = _state_tile(state_ptr, slot_ptr, s_slot, tile + nprog, n_tiles,
                                 HV, KD, VD, KP, BV, NT)
        else:
            h = _state_tile(state_ptr, slot_ptr, s_slot, tile, n_tiles, HV, KD, VD, KP, BV, NT)
        b, hv, j = _tile_coords(tile, HV, NT)
        hk = hv // (HV // HK)
        slot, live, p, base = _slot_cursor(slot_ptr, len_ptr, base_ptr, b)
        rr = j * BV + tl.arange(0, BV)
        mr = rr < VD
        mx = (t < K) & live
        mt = (x < K) & live
        fold = (p + K > R) & live
        valid = (i < p) & live
        hist = valid & (fold == 0)
        phys = (base + i) % NS
        ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)
        xrow = tl.where(is_k[:, None], k_ptr + b * k_b + t[:, None] * k_t + hk * k_h,
                        q_ptr + b * q_b + t[:, None] * q_t + hk * q_h)
        xc = tl.load(xrow + rk[None, :], mask=mx[:, None] & mk[None, :], other=0.0)
        krow = kr_ptr + slot * kr_slot + hk * (NS * KD)
        kc = tl.load(krow + phys[:, None] * KD + rk[None, :], mask=valid[:, None] & mk[None, :],
                     other=0.0)
        grow = gr_ptr + slot * gr_slot + hv * NS
        gring = tl.load(grow + phys, mask=valid, other=0.0)
        g_last = tl.sum(tl.where(i == p - 1, gring, 0.0), 0)
        urow = ur_ptr + slot * ur_slot + hv * (NS * VD)
        uring_t = tl.load(urow + phys[None, :] * VD + rr[:, None],
                          mask=valid[None, :] & mr[:, None], other=0.0)
        vt = tl.load(v_ptr + b * v_b + x[None, :] * v_t + hv * v_h + rr[:, None],
                     mask=mt[None, :] & mr[:, None], other=0.0).to(tl.float32)
        g, beta = _row_gates(g_ptr, beta_ptr, b, hv, mt, ga, gd, g_b, g_t, beta_b, beta_t, x,
                             GATE)

        if fold:
            # H_P = e^{G_{P-1}} S0 + U_ring^T (w K_ring), rounded once and stored; then from it
            w = tl.where(valid, tl.exp(g_last - gring), 0.0)
            kw = (kc.to(tl.float32) * w[:, None]).to(dt)
            h = (tl.exp(g_last) * h.to(tl.float32) + _mm(uring_t, kw, PRECISION)).to(dt)
            hrow = state_ptr + slot * s_slot + hv * (VD * KD) + rr[:, None] * KD
            tl.store(hrow + rk[None, :], h, mask=mr[:, None] & mk[None, :])
        acc = _mm(h, tl.trans(xc.to(dt)), PRECISION)                  # S X^T, raw rows
        acc_r = _mm(kc, tl.trans(xc.to(kc.dtype)), PRECISION)         # K_ring X^T
        acc_x = _mm(xc, tl.trans(xc), PRECISION)                      # X X^T
        xf = xc.to(tl.float32)
        ss = tl.sum(xf * xf, 1)

        if USE_QK_L2NORM:
            nx = tl.math.rsqrt(ss + 1e-6)
        else:
            nx = tl.where(mx, 1.0, 0.0)
        nx = tl.where(is_k, nx, nx * scale)
        cum = tl.where(fold, 0.0, g_last) + tl.cumsum(g, 0)                    # c_t by row t
        cx = tl.sum(tl.where(t[:, None] == x[None, :], cum[None, :], 0.0), 1)  # c_{t(x)}
        colscale = tl.where(mx, tl.exp(cx), 0.0) * nx
        dm = tl.where(hist[:, None] & mx[None, :], tl.exp(cx[None, :] - gring[:, None]), 0.0)
        dm = dm * acc_r * nx[None, :]
        gx = acc_x * nx[:, None] * nx[None, :]
        low = (x[:, None] >= x[None, :]) & mt[:, None] & mt[None, :]
        decay = tl.where(low, tl.exp(cum[:, None] - cum[None, :]), 0.0)
        A = tl.where(x[:, None] > x[None, :], beta[:, None] * decay * gx, 0.0)
        bt = beta[:, None] * tl.trans(_unit_lower_inverse(A, K, 16))
        qk = (x[:, None] >= 8) & (t[:, None] >= x[None, :]) & mx[:, None] & mt[None, :]
        p2 = tl.trans(tl.where(qk, tl.exp(cx[:, None] - cum[None, :]), 0.0) * gx)

        w_all = acc * colscale[None, :] + _mm_ieee(uring_t.to(tl.float32), dm)
        ut = _mm_ieee(vt - w_all, bt)
        ot = w_all + _mm_ieee(ut, p2)
        mo = ((x >= 8) & (t < K))[None, :] & mr[:, None]
        tl.store(o_ptr + b * o_b + t[None, :] * o_t + hv * o_h + rr[:, None],
                 ot.to(o_ptr.dtype.element_ty), mask=mo)
        pos = (base + p + x) % NS
        tl.store(urow + pos[None, :] * VD + rr[:, None], ut.to(ur_ptr.dtype.element_ty),
                 mask=mt[None, :] & mr[:, None])
        if j == 0:
            tl.store(grow + pos, cum, mask=mt)
            if hv % (HV // HK) == 0:
                tl.store(krow + pos[:, None] * KD + rk[None, :],
                         (xf * nx[:, None]).to(kr_ptr.dtype.element_ty),
                         mask=mt[:, None] & mk[None, :])
            if hv == 0:
                tl.store(engaged_ptr + b, tl.where(fold, 2, 1).to(tl.int32))
