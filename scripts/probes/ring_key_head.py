"""Probe: the ring verify with a key head's small matrices formed once for its value heads.

Same arguments and grid as ``pmll_lab.ops.carry.ring_verify.gdn_ring_fused_kernel``
(``B * HV * NT`` programs); the program of the first value head of each key-head group
(``hv % (HV // HK) == 0``) does the work of all ``HV // HK`` value heads of the group, the
others return at once. What is formed once per key head: the slot and cursor loads, the new
rows ``X`` (the ``K`` keys and queries of the key head), the window's keys, the Gram ``X X^T``,
the window's keys against ``X`` and the row norms; per value head, as in the library kernel:
the gates, the decays and the small matrices built from them, the state stream against ``X``,
the outputs, the ring's new ``u`` rows and the fold. Why: under ncu the library kernel is
latency-bound with a third of its load stalls in the prologue's dependent loads (slot, cursor,
ring rows), which the two value heads of Qwen3-Next's key head (HV / HK = 2) repeat.
The coefficients are formed before the state stream whatever ``EARLY`` says (the shared part
needs the new rows whole). Checked against the float64 ring reference by
tests/harness/test_variant_kernel.py; timed with ``scripts/bench_step.py --ring-variant``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.carry.ring_kernels import (ring_row_gates, slot_cursor, small_mm, small_mma,
                                                 state_mma)
from pmll_lab.ops.carry.ring_verify import _unit_upper_inverse
from pmll_lab.ops.gdn.recurrence import head_tile_program, load_gate_params


@triton.jit
def gdn_ring_fused_kernel(
    state_ptr, kr_ptr, ur_ptr, gr_ptr, len_ptr, base_ptr, slot_ptr,
    q_ptr, k_ptr, v_ptr, o_ptr, g_ptr, beta_ptr, engaged_ptr, alog_ptr, dtb_ptr,
    scale, s_slot, kr_slot, ur_slot, gr_slot,
    q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h, o_b, o_t, o_h, g_b, g_t, beta_b, beta_t,
    K: tl.constexpr, R: tl.constexpr, NS: tl.constexpr, RW: tl.constexpr,
    HV: tl.constexpr, HK: tl.constexpr, KD: tl.constexpr, KP: tl.constexpr, VD: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, NT: tl.constexpr, STAGES: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, GATE: tl.constexpr, SMALL: tl.constexpr, FBK: tl.constexpr,
    EARLY: tl.constexpr = False,
):
    """The library kernel's contract (its docstring), one program per key-head group."""
    G: tl.constexpr = HV // HK
    b, hv0, j = head_tile_program(HV, NT)
    if hv0 % G != 0:
        return
    hk = hv0 // G
    slot, live, p, base = slot_cursor(slot_ptr, len_ptr, base_ptr, b)
    rr = j * BV + tl.arange(0, BV)
    mr = rr < VD
    x = tl.arange(0, 16)
    t = x % 8
    is_k = x < 8
    mx = (t < K) & live
    mt = (x < K) & live
    iw = tl.arange(0, RW)
    valid = (iw < p) & live
    i = (base + iw) & (NS - 1)
    fold = (p + K > R) & live
    dt = state_ptr.dtype.element_ty

    # once per key head: X, the window's keys, their products and the norms
    xrow = tl.where(is_k[:, None], k_ptr + b * k_b + t[:, None] * k_t + hk * k_h,
                    q_ptr + b * q_b + t[:, None] * q_t + hk * q_h)
    krow = kr_ptr + slot * kr_slot + hk * (NS * KD) + i[:, None] * KD
    kk = tl.arange(0, KP)
    mkd = kk < KD
    xw = tl.load(xrow + kk[None, :], mask=mx[:, None] & mkd[None, :], other=0.0)      # [16, KP]
    kw_ = tl.load(krow + kk[None, :], mask=valid[:, None] & mkd[None, :], other=0.0)
    krx = state_mma(kw_, tl.trans(xw), tl.zeros((RW, 16), tl.float32), SMALL)
    if xw.dtype == tl.bfloat16:
        gram = tl.dot(xw, tl.trans(xw))
    else:
        gram = small_mm(xw, tl.trans(xw), SMALL)
    xf = xw.to(tl.float32)
    ss = tl.sum(xf * xf, 1)
    if USE_QK_L2NORM:
        n = tl.math.rsqrt(ss + 1e-6)
    else:
        n = tl.full((16,), 1.0, tl.float32)
    n = tl.where(mx, tl.where(is_k, n, n * scale), 0.0)
    gx = gram * n[:, None] * n[None, :]
    s_le_t = (x[:, None] < 8) & (x[:, None] <= t[None, :]) & mt[:, None] & mx[None, :]
    upper = is_k[None, :] & (x[:, None] < x[None, :])

    for r in tl.static_range(G):
        hv = hv0 + r
        hrow = state_ptr + slot * s_slot + hv * (VD * KD) + rr[:, None] * KD
        ur = ur_ptr + slot * ur_slot + hv * (NS * VD)
        gr = gr_ptr + slot * gr_slot + hv * NS
        uring_t = tl.load(ur + i[None, :] * VD + rr[:, None], mask=mr[:, None] & valid[None, :],
                          other=0.0)                                        # [BV, RW]
        gring = tl.load(gr + i, mask=valid, other=0.0)                     # [RW]
        vt = tl.load(v_ptr + b * v_b + x[None, :] * v_t + hv * v_h + rr[:, None],
                     mask=mt[None, :] & mr[:, None], other=0.0)           # [BV, 16]
        g_last = tl.sum(tl.where(iw == p - 1, gring, 0.0), 0)
        ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)
        g, beta = ring_row_gates(g_ptr, beta_ptr, b, hv, mx, ga, gd, g_b, g_t, beta_b, beta_t,
                                 t, GATE)
        ck = tl.cumsum(tl.where(is_k, g, 0.0), 0)
        cq = tl.cumsum(tl.where(is_k, 0.0, g), 0)
        cx = g_last + tl.where(is_k, ck, cq)
        beta = tl.where(mt, beta, 0.0)
        colscale = tl.where(mx, tl.exp(cx), 0.0) * n
        dm = tl.exp(tl.where(valid[:, None] & mx[None, :], cx[None, :] - gring[:, None],
                             -float("inf")))
        dm = dm * krx * n[None, :]
        dec = tl.exp(tl.where(s_le_t, cx[None, :] - cx[:, None], -float("inf")))
        N = tl.where(upper, beta[None, :] * dec * gx, 0.0)
        bt = beta[:, None] * _unit_upper_inverse(N, K, SMALL)
        p2 = tl.where(is_k[None, :], 0.0, dec * gx)

        acc = tl.zeros((BV, 16), tl.float32)
        for c in tl.range(0, KD, BK, num_stages=STAGES):
            rk = c + tl.arange(0, BK)
            mk = rk < KD
            h = tl.load(hrow + rk[None, :], mask=mr[:, None] & mk[None, :] & live, other=0.0)
            xc = tl.load(xrow + rk[None, :], mask=mx[:, None] & mk[None, :], other=0.0)
            acc = state_mma(h, tl.trans(xc), acc, SMALL)
        w_all = small_mma(uring_t, dm, acc * colscale[None, :], SMALL)
        ut = small_mm(vt.to(tl.float32) - w_all, bt, SMALL)
        ot = small_mma(ut, p2, w_all, SMALL)
        mo = ((x >= 8) & (t < K))[None, :] & mr[:, None]
        tl.store(o_ptr + b * o_b + t[None, :] * o_t + hv * o_h + rr[:, None],
                 ot.to(o_ptr.dtype.element_ty), mask=mo)
        pos = (base + p + x) & (NS - 1)
        tl.store(ur + pos[None, :] * VD + rr[:, None], ut.to(ur_ptr.dtype.element_ty),
                 mask=mt[None, :] & mr[:, None])
        if j == 0:
            tl.store(gr + pos, ck + tl.where(fold, 0.0, g_last), mask=mt)
            if r == 0:
                r8 = tl.arange(0, 8)
                mkk = ((r8 < K) & live)[:, None] & (kk < KD)[None, :]
                xa = tl.load(k_ptr + b * k_b + r8[:, None] * k_t + hk * k_h + kk[None, :],
                             mask=mkk, other=0.0)
                n8 = tl.sum(tl.where(r8[:, None] == x[None, :], n[None, :], 0.0), 1)
                kbase = kr_ptr + slot * kr_slot + hk * (NS * KD)
                tl.store(kbase + ((base + p + r8) & (NS - 1))[:, None] * KD + kk[None, :],
                         (xa.to(tl.float32) * n8[:, None]).to(kr_ptr.dtype.element_ty),
                         mask=mkk)
            if hv == 0:
                tl.store(engaged_ptr + b, tl.where(fold, 2, 1).to(tl.int32))
        if fold:
            w = tl.where(valid, tl.exp(g_last - gring), 0.0)
            efold = tl.exp(g_last)
            srow = state_ptr + (rr[:, None] * KD + (slot * s_slot + hv * (VD * KD)))
            for c in tl.range(0, KD, FBK, num_stages=STAGES):
                rk = c + tl.arange(0, FBK)
                mk = rk < KD
                h = tl.load(hrow + rk[None, :], mask=mr[:, None] & mk[None, :], other=0.0)
                kc = tl.load(krow + rk[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
                kw = (kc.to(tl.float32) * w[:, None]).to(dt)
                hf = state_mma(uring_t, kw, efold * h.to(tl.float32), SMALL)
                cs = tl.multiple_of(c, FBK) + tl.arange(0, FBK)
                tl.store(srow + cs[None, :], hf.to(dt),
                         mask=(cs < KD)[None, :] & (rr < VD)[:, None])
