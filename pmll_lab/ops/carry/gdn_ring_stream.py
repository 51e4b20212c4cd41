"""The ring form's state kernel as a persistent Triton kernel (SPEC §3d): a fixed grid of a few
programs per SM, each walking tiles with the next tile's state in flight.

Same algebra, inputs and outputs as ``gdn_ring_verify_kernel`` (``gdn_ring_kernels``; its module
docstring has the formulas), after the same per-head kernel (``gdn_ring_prep_kernel``) and with
its coefficients from the workspace. What differs is the schedule: program ``pid`` verifies tiles
``pid, pid + programs, ..`` (a tile is ``BV`` value rows of one head), loading each tile's whole
``[BV, kd]`` state before the previous tile's coefficients, small products and stores (with
``PREFETCH``), so a program keeps bytes in flight while it forms its outputs; with ``PDL`` it
waits for the per-head kernel before its first tile's coefficients. Why: the one-program-
per-tile kernel's programs stream 16 KiB each between a dependent prologue and epilogue
(reports/perf-notes.md "Latest figures: the ring form").
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_wait

from pmll_lab.ops.carry.gdn_ring_kernels import _mm, _mm_ieee, _ring_window, _slot_cursor


@triton.jit
def _tile_coords(tile, HV: tl.constexpr, NT: tl.constexpr):
    """``(b int64, hv, j)`` of tile number ``tile`` (the tiles of one head consecutive)."""
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
def gdn_ring_stream_kernel(
    state_ptr, kr_ptr, ur_ptr, gr_ptr, len_ptr, base_ptr, slot_ptr,
    q_ptr, k_ptr, v_ptr, o_ptr, ws_ptr, s_slot, kr_slot, ur_slot, gr_slot,
    q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h, o_b, o_t, o_h, n_tiles,
    K: tl.constexpr, R: tl.constexpr, NS: tl.constexpr, RP: tl.constexpr,
    HV: tl.constexpr, HK: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, KP: tl.constexpr,
    BV: tl.constexpr, NT: tl.constexpr, WS: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr,
):
    """Tiles ``program_id, program_id + num_programs, ..`` of ``n_tiles = B * HV * NT``: per
    tile ``gdn_ring_verify_kernel``'s work (folding first where ``P + K > R``): outputs and
    ``u`` appends."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    dt = state_ptr.dtype.element_ty
    x = tl.arange(0, 16)
    t = x % 8
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
        urow = ur_ptr + slot * ur_slot + hv * (NS * VD)
        valid, phys, uring_t, gring, g_last = _ring_window(
            urow, gr_ptr + slot * gr_slot + hv * NS, p, base, live, rr, mr, NS, RP, VD)
        fold = (p + K > R) & live
        vt = tl.load(v_ptr + b * v_b + x[None, :] * v_t + hv * v_h + rr[:, None],
                     mask=mt[None, :] & mr[:, None], other=0.0).to(tl.float32)
        xrow = tl.where((x < 8)[:, None], k_ptr + b * k_b + t[:, None] * k_t + hk * k_h,
                        q_ptr + b * q_b + t[:, None] * q_t + hk * q_h)
        xc = tl.load(xrow + rk[None, :], mask=mx[:, None] & mk[None, :], other=0.0)
        if fold:
            # H_P = e^{G_{P-1}} S0 + U_ring^T (w K_ring), rounded once and stored; then from it
            krow = kr_ptr + slot * kr_slot + hk * (NS * KD) + phys[:, None] * KD
            kc = tl.load(krow + rk[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
            w = tl.where(valid, tl.exp(g_last - gring), 0.0)
            kw = (kc.to(tl.float32) * w[:, None]).to(dt)
            h = (tl.exp(g_last) * h.to(tl.float32) + _mm(uring_t, kw, PRECISION)).to(dt)
            hrow = state_ptr + slot * s_slot + hv * (VD * KD) + rr[:, None] * KD
            tl.store(hrow + rk[None, :], h, mask=mr[:, None] & mk[None, :])
        acc = _mm(h, tl.trans(xc.to(dt)), PRECISION)

        if PDL:
            gdc_wait()                  # the per-head kernel's coefficients (at once after the first)
        ws = ws_ptr + (b * HV + hv) * WS
        colscale = tl.load(ws + x)
        dm = tl.load(ws + 16 + i[:, None] * 16 + x[None, :])
        bt = tl.load(ws + 16 + RP * 16 + x[:, None] * 16 + x[None, :])
        p2 = tl.load(ws + 16 + RP * 16 + 256 + x[:, None] * 16 + x[None, :])
        w_all = acc * colscale[None, :] + _mm_ieee(uring_t.to(tl.float32), dm)
        ut = _mm_ieee(vt - w_all, bt)
        ot = w_all + _mm_ieee(ut, p2)
        mo = ((x >= 8) & (t < K))[None, :] & mr[:, None]
        tl.store(o_ptr + b * o_b + t[None, :] * o_t + hv * o_h + rr[:, None],
                 ot.to(o_ptr.dtype.element_ty), mask=mo)
        pos = (base + p + x) % NS
        tl.store(urow + pos[None, :] * VD + rr[:, None], ut.to(ur_ptr.dtype.element_ty),
                 mask=mt[None, :] & mr[:, None])
