"""Triton kernels of the ring form (SPEC §3d): verify, flush and the cursor commit.

One program per (sequence, value head, tile of ``BV`` value rows) of a V-major state
``[S, HV, vd, kd]``; a head's tiles on consecutive programs (``recurrence.head_tile_program``).
Per program, every product is a ``tl.dot`` (tensor cores on a GPU), in one pass over the keys
in chunks of ``BK`` (a GEMM's K loop, its loads pipelined over ``STAGES``): the state tile's
chunk against the new rows' raw keys and queries, the ring keys against them, and the rows'
Gram matrices; the l2 norms are applied after the loop (the products are linear in each row).

- ``X`` = the ``K`` new rows' normalised keys ``Kx`` and scaled queries ``Qx`` (``XP = 16``
  rows padded), ``c = G_{P-1} + cumsum(g)``;
- ``Wk = e^c (S0 Kx^T) + U_ring^T D_k`` and likewise ``Wq`` (``[BV, XP]``), where
  ``D[j, t] = e^{c_t - G_j} (k_j . x_t)`` over the ``P`` ring rows (``[RP, XP]``): the stored
  state's and the history's parts of ``H_{P+t}^T x`` without forming ``H_P``;
- ``T = (I + A)^-1`` by forward substitution on ``[XP, XP]``, ``A[t,s] = beta_t e^{c_t-c_s}
  k_t.k_s``; ``U^T = beta (V - Wk)^T T^T``; ``O^T = Wq + U^T P^T``, ``P[t,s] = e^{c_t-c_s}
  q_t.k_s`` (``s <= t``).

A fold (``P + K > R``) first forms ``H_P = e^{G_{P-1}} S0 + U_ring^T (w K_ring)`` chunk by
chunk (one more ``tl.dot``), stores it rounded to the state's dtype and continues from it with
an empty ring.
With ``PDL`` (a GPU launch with programmatic dependent launch) the state kernel starts while the
per-head kernel runs and waits for it (``griddepcontrol.wait``) only before it reads the head's
coefficients: the state streams while the small matrices are formed. The new rows go to ring
rows ``base + P ..`` (mod ``NS = 2R``): past the window every program of
the launch still reads, so no arrival count or barrier is needed (SPEC §3d). The ``k`` rows are
kept per key head and written by the first value head of each group (tile 0), ``G`` by tile 0.

Operand dtypes (``_mm``): a bf16/fp16 state multiplies in its own dtype with fp32
accumulation (as FlashInfer's ReplaySSM kernels); an fp32 state in fp32 with
``input_precision=PRECISION`` (``"tf32x3"``: three tf32 passes, close to fp32). The small
``[BV, XP] x [XP, XP]`` products are fp32 ``"ieee"``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from pmll_lab.ops.gdn.recurrence import gdn_gate, head_tile_program, load_gate_params


@triton.jit
def _mm(a, b, PRECISION: tl.constexpr):
    """``a @ b`` accumulated in fp32: fp32 operands at ``PRECISION``, 2-byte ones as they are."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision=PRECISION)
    return tl.dot(a, b)


@triton.jit
def _mma(a, b, acc, PRECISION: tl.constexpr):
    """``acc + a @ b`` (``_mm``'s precisions)."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision=PRECISION)
    return tl.dot(a, b, acc)


@triton.jit
def _mm_ieee(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _ring_window(ur_ptr, gr_ptr, p, base, live, rr, mr,
                 NS: tl.constexpr, RP: tl.constexpr, VD: tl.constexpr):
    """The slot's live window, oldest first: ``(valid [RP], physical rows [RP], u^T [BV, RP],
    G [RP], G_{P-1})``; rows past ``P`` (and a padding lane's) read as zeros."""
    i = tl.arange(0, RP)
    valid = (i < p) & live
    phys = (base + i) % NS
    uring_t = tl.load(ur_ptr + phys[None, :] * VD + rr[:, None],
                      mask=valid[None, :] & mr[:, None], other=0.0)
    gring = tl.load(gr_ptr + phys, mask=valid, other=0.0)
    g_last = tl.sum(tl.where(i == p - 1, gring, 0.0), 0)
    return valid, phys, uring_t, gring, g_last


@triton.jit
def _unit_lower_inverse(A, K: tl.constexpr, XP: tl.constexpr):
    """``(I + A)^-1`` for a strictly lower-triangular ``A [XP, XP]`` whose rows and columns
    from ``K`` on are zero, by forward substitution (row ``i`` = ``e_i - sum_{s<i} A[i,s]
    T[s]``)."""
    r = tl.arange(0, XP)
    T = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in tl.static_range(1, K):
        a_i = tl.sum(tl.where(r[:, None] == i, A, 0.0), 0)
        row = tl.sum(a_i[:, None] * T, 0)
        T = tl.where(r[:, None] == i, T - row[None, :], T)
    return T


LOG_DECAY_FLOOR = tl.constexpr(-30.0)
"""A new row's log decay is taken as at least this (``e^-30 ~ 9e-14``): a fully forgetting
row (``g = -inf``, or ``-1e4``) would otherwise make ``c_t - c_s`` a NaN or a difference of
huge cumulative sums that lose fp32 precision; what the floor keeps of the state is far below
every ``RING_TOLERANCE``."""


@triton.jit
def _row_gates(g_ptr, beta_ptr, b, hv, m1, ga, gd, g_b, g_t, beta_b, beta_t, tr,
               GATE: tl.constexpr):
    """The new rows' ``g, beta [XP]`` fp32 (rows from ``K`` on, and a padding lane's, zero;
    ``g`` no lower than ``LOG_DECAY_FLOOR``)."""
    g = tl.load(g_ptr + b * g_b + tr * g_t + hv, mask=m1, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + b * beta_b + tr * beta_t + hv, mask=m1, other=0.0).to(tl.float32)
    if GATE:
        g, beta = gdn_gate(ga, g, gd, beta)
        g = tl.where(m1, g, 0.0)
        beta = tl.where(m1, beta, 0.0)
    return tl.maximum(g, LOG_DECAY_FLOOR), beta


@triton.jit
def _slot_cursor(slot_ptr, len_ptr, base_ptr, b):
    """``(slot, live, P, base)`` of sequence ``b`` (slot -1: a padding lane, read as slot 0
    for address arithmetic, ``P = 0``)."""
    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0
    slot = tl.maximum(slot, 0)
    p = tl.load(len_ptr + slot, mask=live, other=0)
    base = tl.load(base_ptr + slot, mask=live, other=0)
    return slot, live, p, base


@triton.jit
def gdn_ring_prep_kernel(
    kr_ptr, gr_ptr, len_ptr, base_ptr, slot_ptr, q_ptr, k_ptr, g_ptr, beta_ptr, engaged_ptr,
    alog_ptr, dtb_ptr, ws_ptr, scale, kr_slot, gr_slot,
    q_b, q_t, q_h, k_b, k_t, k_h, g_b, g_t, beta_b, beta_t,
    K: tl.constexpr, R: tl.constexpr, NS: tl.constexpr, RP: tl.constexpr, HV: tl.constexpr,
    HK: tl.constexpr, KD: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, GATE: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per (sequence, value head): everything of the verify that does not touch the state.
    Writes the head's coefficients to ``ws`` (``colscale [16] | Dm [RP, 16] | Bt [16, 16] |
    P2 [16, 16]``, fp32), appends the new rows' ``G`` (and, for a group's first value head,
    their normalised keys) to the ring and sets ``engaged``. Columns ``x``: key of row ``t = x``
    for ``x < 8``, query of row ``t = x - 8`` from 8."""
    if PDL:
        gdc_launch_dependents()            # the state kernel may start streaming the state now
    pid = tl.program_id(0)
    b = (pid // HV).to(tl.int64)
    hv = pid % HV
    hk = hv // (HV // HK)
    slot, live, p, base = _slot_cursor(slot_ptr, len_ptr, base_ptr, b)
    x = tl.arange(0, 16)
    t = x % 8
    is_k = x < 8
    mx = (t < K) & live
    mt = (x < K) & live
    ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)
    xrow = tl.where(is_k[:, None], k_ptr + b * k_b + t[:, None] * k_t + hk * k_h,
                    q_ptr + b * q_b + t[:, None] * q_t + hk * q_h)
    kr_ptr = kr_ptr + slot * kr_slot + hk * (NS * KD)
    gr_ptr = gr_ptr + slot * gr_slot + hv * NS
    i = tl.arange(0, RP)
    fold = (p + K > R) & live
    valid = (i < p) & live
    hist = valid & (fold == 0)
    phys = (base + i) % NS
    gring = tl.load(gr_ptr + phys, mask=valid, other=0.0)
    g_last = tl.sum(tl.where(i == p - 1, gring, 0.0), 0)
    g, beta = _row_gates(g_ptr, beta_ptr, b, hv, mt, ga, gd, g_b, g_t, beta_b, beta_t, x, GATE)
    acc_r = tl.zeros((RP, 16), tl.float32)                 # K_ring X^T
    acc_x = tl.zeros((16, 16), tl.float32)                 # X X^T
    ss = tl.zeros((16,), tl.float32)
    for c in tl.range(0, KD, BK):
        rk = c + tl.arange(0, BK)
        mk = rk < KD
        xc = tl.load(xrow + rk[None, :], mask=mx[:, None] & mk[None, :], other=0.0)
        kc = tl.load(kr_ptr + phys[:, None] * KD + rk[None, :],
                     mask=hist[:, None] & mk[None, :], other=0.0)
        xf = xc.to(tl.float32)
        ss += tl.sum(xf * xf, 1)
        acc_r = _mma(kc, tl.trans(xc.to(kc.dtype)), acc_r, PRECISION)
        acc_x = _mma(xc, tl.trans(xc), acc_x, PRECISION)
    if USE_QK_L2NORM:
        nx = tl.math.rsqrt(ss + 1e-6)
    else:
        nx = tl.where(mx, 1.0, 0.0)
    nx = tl.where(is_k, nx, nx * scale)
    cum = tl.where(fold, 0.0, g_last) + tl.cumsum(g, 0)                    # c_t, by row x = t
    cx = tl.sum(tl.where(t[:, None] == x[None, :], cum[None, :], 0.0), 1)  # c_{t(x)}
    colscale = tl.where(mx, tl.exp(cx), 0.0) * nx
    dm = tl.where(hist[:, None] & mx[None, :], tl.exp(cx[None, :] - gring[:, None]), 0.0)
    dm = dm * acc_r * nx[None, :]
    # the new rows by WY: (I + A) U = beta (V - Wk); Bt = diag(beta) (I + A)^-T
    gx = acc_x * nx[:, None] * nx[None, :]
    low = (x[:, None] >= x[None, :]) & mt[:, None] & mt[None, :]
    decay = tl.where(low, tl.exp(cum[:, None] - cum[None, :]), 0.0)
    A = tl.where(x[:, None] > x[None, :], beta[:, None] * decay * gx, 0.0)
    bt = beta[:, None] * tl.trans(_unit_lower_inverse(A, K, 16))
    # P2[s, 8 + t] = e^{c_t - c_s} q_t . k_s (s <= t): gx[8 + t, s] is q_t . k_s, cx[8 + t] is c_t
    qk = (x[:, None] >= 8) & (t[:, None] >= x[None, :]) & mx[:, None] & mt[None, :]
    p2 = tl.trans(tl.where(qk, tl.exp(cx[:, None] - cum[None, :]), 0.0) * gx)

    ws = ws_ptr + (b * HV + hv) * WS
    tl.store(ws + x, colscale)
    tl.store(ws + 16 + i[:, None] * 16 + x[None, :], dm)
    tl.store(ws + 16 + RP * 16 + x[:, None] * 16 + x[None, :], bt)
    tl.store(ws + 16 + RP * 16 + 256 + x[:, None] * 16 + x[None, :], p2)
    pos = (base + p + x) % NS
    tl.store(gr_ptr + pos, cum, mask=mt)
    if hv % (HV // HK) == 0:
        for c in tl.range(0, KD, BK):
            rk = c + tl.arange(0, BK)
            mk = rk < KD
            xk = tl.load(xrow + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
            tl.store(kr_ptr + pos[:, None] * KD + rk[None, :],
                     (xk.to(tl.float32) * nx[:, None]).to(kr_ptr.dtype.element_ty),
                     mask=mt[:, None] & mk[None, :])
    if hv == 0:
        tl.store(engaged_ptr + b, tl.where(fold, 2, 1).to(tl.int32))


@triton.jit
def gdn_ring_verify_kernel(
    state_ptr, kr_ptr, ur_ptr, gr_ptr, len_ptr, base_ptr, slot_ptr,
    q_ptr, k_ptr, v_ptr, o_ptr, ws_ptr, s_slot, kr_slot, ur_slot, gr_slot,
    q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h, o_b, o_t, o_h,
    K: tl.constexpr, R: tl.constexpr, NS: tl.constexpr, RP: tl.constexpr,
    HV: tl.constexpr, HK: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, NT: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr,
    PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    """Per (sequence, value head, tile of value rows): the state's part. One pass over the keys
    (folding first where the ring is full), ``S0 X^T`` against the raw rows, then with the
    head's coefficients from ``gdn_ring_prep_kernel``: ``W = S0 X^T colscale + U_ring^T Dm``,
    ``U^T = (V - W) Bt``, ``O^T = W + U^T P2``; stores the outputs and the ``u`` rows."""
    b, hv, j = head_tile_program(HV, NT)
    hk = hv // (HV // HK)
    slot, live, p, base = _slot_cursor(slot_ptr, len_ptr, base_ptr, b)
    rr = j * BV + tl.arange(0, BV)
    mr = rr < VD
    x = tl.arange(0, 16)
    t = x % 8
    mx = (t < K) & live
    mt = (x < K) & live
    ur_ptr = ur_ptr + slot * ur_slot + hv * (NS * VD)
    valid, phys, uring_t, gring, g_last = _ring_window(
        ur_ptr, gr_ptr + slot * gr_slot + hv * NS, p, base, live, rr, mr, NS, RP, VD)
    fold = (p + K > R) & live
    vt = tl.load(v_ptr + b * v_b + x[None, :] * v_t + hv * v_h + rr[:, None],
                 mask=mt[None, :] & mr[:, None], other=0.0).to(tl.float32)

    dt = state_ptr.dtype.element_ty
    xrow = tl.where((x < 8)[:, None], k_ptr + b * k_b + t[:, None] * k_t + hk * k_h,
                    q_ptr + b * q_b + t[:, None] * q_t + hk * q_h)
    hrow = state_ptr + slot * s_slot + hv * (VD * KD) + rr[:, None] * KD
    acc = tl.zeros((BV, 16), tl.float32)
    if fold:
        # H_P = e^{G_{P-1}} S0 + U_ring^T (w K_ring), rounded once and stored; then from it
        krow = kr_ptr + slot * kr_slot + hk * (NS * KD) + phys[:, None] * KD
        w = tl.where(valid, tl.exp(g_last - gring), 0.0)
        efold = tl.exp(g_last)
        for c in tl.range(0, KD, BK, num_stages=STAGES):
            rk = c + tl.arange(0, BK)
            mk = rk < KD
            m2 = mr[:, None] & mk[None, :]
            h = tl.load(hrow + rk[None, :], mask=m2, other=0.0)
            kc = tl.load(krow + rk[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
            xc = tl.load(xrow + rk[None, :], mask=mx[:, None] & mk[None, :], other=0.0)
            kw = (kc.to(tl.float32) * w[:, None]).to(dt)
            hf = (efold * h.to(tl.float32) + _mm(uring_t, kw, PRECISION)).to(dt)
            tl.store(hrow + rk[None, :], hf, mask=m2)
            acc = _mma(hf, tl.trans(xc.to(dt)), acc, PRECISION)
    else:
        for c in tl.range(0, KD, BK, num_stages=STAGES):
            rk = c + tl.arange(0, BK)
            mk = rk < KD
            h = tl.load(hrow + rk[None, :], mask=mr[:, None] & mk[None, :] & live, other=0.0)
            xc = tl.load(xrow + rk[None, :], mask=mx[:, None] & mk[None, :], other=0.0)
            acc = _mma(h, tl.trans(xc.to(dt)), acc, PRECISION)

    # the head's coefficients from the per-head kernel (with PDL: it may still be running)
    if PDL:
        gdc_wait()
    i = tl.arange(0, RP)
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
    tl.store(ur_ptr + pos[None, :] * VD + rr[:, None], ut.to(ur_ptr.dtype.element_ty),
             mask=mt[None, :] & mr[:, None])


@triton.jit
def gdn_ring_flush_kernel(
    state_ptr, kr_ptr, ur_ptr, gr_ptr, len_ptr, base_ptr, slot_ptr,
    s_off, kr_off, ur_off, gr_off, len_off, base_off,
    s_slot, kr_slot, ur_slot, gr_slot,
    NS: tl.constexpr, RP: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NT: tl.constexpr,
    STAGES: tl.constexpr, PRECISION: tl.constexpr,
):
    """Fold each listed slot's ring into its state, layer ``program_id(1)`` (per-layer element
    offsets from layer 0's tensors in the ``*_off`` tables). A slot with ``len = 0`` is left
    alone; ``len`` is not changed."""
    b, hv, j = head_tile_program(HV, NT)
    layer = tl.program_id(1)
    hk = hv // (HV // HK)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0
    slot = tl.maximum(slot, 0)
    p = tl.load(len_ptr + tl.load(len_off + layer) + slot, mask=live, other=0)
    if p > 0:
        base = tl.load(base_ptr + tl.load(base_off + layer) + slot)
        rr = j * BV + tl.arange(0, BV)
        mr = rr < VD
        valid, phys, uring_t, gring, g_last = _ring_window(
            ur_ptr + tl.load(ur_off + layer) + slot * ur_slot + hv * (NS * VD),
            gr_ptr + tl.load(gr_off + layer) + slot * gr_slot + hv * NS,
            p, base, live, rr, mr, NS, RP, VD)
        w = tl.where(valid, tl.exp(g_last - gring), 0.0)
        efold = tl.exp(g_last)
        kr = kr_ptr + tl.load(kr_off + layer) + slot * kr_slot + hk * (NS * KD)
        hrow = (state_ptr + tl.load(s_off + layer) + slot * s_slot + hv * (VD * KD)
                + rr[:, None] * KD)
        dt = state_ptr.dtype.element_ty
        for c in tl.range(0, KD, BK, num_stages=STAGES):
            rk = c + tl.arange(0, BK)
            mk = rk < KD
            m2 = mr[:, None] & mk[None, :]
            h = tl.load(hrow + rk[None, :], mask=m2, other=0.0)
            kc = tl.load(kr + phys[:, None] * KD + rk[None, :], mask=valid[:, None] & mk[None, :],
                         other=0.0)
            kw = (kc.to(tl.float32) * w[:, None]).to(dt)
            hf = efold * h.to(tl.float32) + _mm(uring_t, kw, PRECISION)
            tl.store(hrow + rk[None, :], hf.to(dt), mask=m2)


@triton.jit
def ring_accept_kernel(len_ptr, base_ptr, len_off, base_off, slot_ptr, engaged_ptr, acc_ptr, B,
                       NS: tl.constexpr, BLOCK: tl.constexpr):
    """The cursor commit of one ring per ``program_id(1)``: ``base = (base + len) % NS,
    len = a`` after a fold (``engaged == 2``), else ``len += a``; padding lanes untouched."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B
    lp = len_ptr + tl.load(len_off + tl.program_id(1))
    bp = base_ptr + tl.load(base_off + tl.program_id(1))
    slot = tl.load(slot_ptr + offs, mask=m, other=-1).to(tl.int64)
    m = m & (slot >= 0)
    e = tl.load(engaged_ptr + offs, mask=m, other=1)
    a = tl.load(acc_ptr + offs, mask=m, other=0).to(tl.int32)
    n = tl.load(lp + slot, mask=m, other=0)
    base = tl.load(bp + slot, mask=m, other=0)
    folded = e == 2
    tl.store(lp + slot, tl.where(folded, a, n + a), mask=m)
    tl.store(bp + slot, tl.where(folded, (base + n) % NS, base), mask=m)
