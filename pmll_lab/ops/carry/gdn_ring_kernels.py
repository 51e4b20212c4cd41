"""Triton kernels of the ring form (SPEC §3d): verify, flush and the cursor commit.

One program per (sequence, value head, tile of ``BV`` value rows) of a V-major state
``[S, HV, vd, kd]``; a head's tiles on consecutive programs (``recurrence.head_tile_program``).
Per program, every product is a ``tl.dot`` (tensor cores on a GPU):

- ``X`` = the ``K`` new rows' normalised keys ``Kx`` and scaled queries ``Qx`` (``[XP, BK]``,
  ``XP = 16`` rows padded), ``c = G_{P-1} + cumsum(g)``;
- ``Wk = e^c (S0 Kx^T) + U_ring^T D_k`` and likewise ``Wq`` (``[BV, XP]``), where
  ``D[j, t] = e^{c_t - G_j} (k_j . x_t)`` over the ``P`` ring rows (``[RP, XP]``): the stored
  state's and the history's parts of ``H_{P+t}^T x`` without forming ``H_P``;
- ``T = (I + A)^-1`` by forward substitution on ``[XP, XP]``, ``A[t,s] = beta_t e^{c_t-c_s}
  k_t.k_s``; ``U^T = beta (V - Wk)^T T^T``; ``O^T = Wq + U^T P^T``, ``P[t,s] = e^{c_t-c_s}
  q_t.k_s`` (``s <= t``).

A fold (``P + K > R``) first forms ``H_P = e^{G_{P-1}} S0 + U_ring^T (w K_ring)`` (one more
``tl.dot``), stores it rounded to the state's dtype and continues from it with an empty ring.
The new rows go to ring rows ``base + P ..`` (mod ``NS = 2R``): past the window every program of
the launch still reads, so no arrival count or barrier is needed (SPEC §3d). The ``k`` rows are
kept per key head and written by the first value head of each group (tile 0), ``G`` by tile 0.

Operand dtypes (``DOT_F32``): a bf16/fp16 state multiplies in its own dtype with fp32
accumulation (as FlashInfer's ReplaySSM kernels); an fp32 state in fp32 with
``input_precision=PRECISION`` (``"tf32x3"``: three tf32 passes, close to fp32). The small
``[BV, XP] x [XP, XP]`` products are fp32 ``"ieee"``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.gdn.recurrence import gdn_gate, head_tile_program, load_gate_params


@triton.jit
def _mm(a, b, DOT_F32: tl.constexpr, PRECISION: tl.constexpr):
    """``a @ b`` accumulated in fp32: fp32 operands at ``PRECISION``, else as given."""
    if DOT_F32:
        return tl.dot(a, b, input_precision=PRECISION)
    return tl.dot(a, b)


@triton.jit
def _mm_ieee(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _ring_window(kr_ptr, ur_ptr, gr_ptr, p, base, live, rk, mk, rr, mr,
                 NS: tl.constexpr, RP: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr):
    """The slot's live ring rows, oldest first: ``(valid [RP], k [RP, BK], u^T [BV, RP],
    G [RP], G_{P-1})``; rows past ``P`` (and a padding lane's) read as zeros."""
    i = tl.arange(0, RP)
    valid = (i < p) & live
    phys = (base + i) % NS
    kring = tl.load(kr_ptr + phys[:, None] * KD + rk[None, :],
                    mask=valid[:, None] & mk[None, :], other=0.0)
    uring_t = tl.load(ur_ptr + phys[None, :] * VD + rr[:, None],
                      mask=valid[None, :] & mr[:, None], other=0.0)
    gring = tl.load(gr_ptr + phys, mask=valid, other=0.0)
    g_last = tl.sum(tl.where(i == p - 1, gring, 0.0), 0)
    return valid, kring, uring_t, gring, g_last


@triton.jit
def _fold_window(h0, kring, uring_t, gring, valid, g_last,
                 DOT_F32: tl.constexpr, PRECISION: tl.constexpr):
    """``H_P`` tile ``[BV, BK]`` fp32: ``e^{G_{P-1}} S0 + sum_j e^{G_{P-1}-G_j} u_j k_j^T``."""
    w = tl.where(valid, tl.exp(g_last - gring), 0.0)
    kw = (kring.to(tl.float32) * w[:, None]).to(uring_t.dtype)
    return tl.exp(g_last) * h0.to(tl.float32) + _mm(uring_t, kw, DOT_F32, PRECISION)


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


@triton.jit
def _load_rows(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, hv, hk, live, tr, mt, rk, mk, rr, mr,
               scale, ga, gd, q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h, g_b, g_t,
               beta_b, beta_t, USE_QK_L2NORM: tl.constexpr, GATE: tl.constexpr):
    """The ``K`` new rows as fp32: normalised keys and scaled queries ``[XP, BK]``, values
    ``v^T [BV, XP]``, gates ``g, beta [XP]`` (rows from ``K`` on, and a padding lane's, zero)."""
    mq = mt[:, None] & mk[None, :] & live
    kx = tl.load(k_ptr + b * k_b + tr[:, None] * k_t + hk * k_h + rk[None, :], mask=mq,
                 other=0.0).to(tl.float32)
    qx = tl.load(q_ptr + b * q_b + tr[:, None] * q_t + hk * q_h + rk[None, :], mask=mq,
                 other=0.0).to(tl.float32)
    if USE_QK_L2NORM:
        kx = kx * tl.math.rsqrt(tl.sum(kx * kx, 1) + 1e-6)[:, None]
        qx = qx * tl.math.rsqrt(tl.sum(qx * qx, 1) + 1e-6)[:, None]
    qx = qx * scale
    vt = tl.load(v_ptr + b * v_b + tr[None, :] * v_t + hv * v_h + rr[:, None],
                 mask=mt[None, :] & mr[:, None] & live, other=0.0).to(tl.float32)
    m1 = mt & live
    g = tl.load(g_ptr + b * g_b + tr * g_t + hv, mask=m1, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + b * beta_b + tr * beta_t + hv, mask=m1, other=0.0).to(tl.float32)
    if GATE:
        g, beta = gdn_gate(ga, g, gd, beta)
        g = tl.where(m1, g, 0.0)
        beta = tl.where(m1, beta, 0.0)
    return kx, qx, vt, g, beta


@triton.jit
def gdn_ring_verify_kernel(
    state_ptr, kr_ptr, ur_ptr, gr_ptr, len_ptr, base_ptr, slot_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, engaged_ptr, alog_ptr, dtb_ptr,
    scale, s_slot, kr_slot, ur_slot, gr_slot,
    q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h, g_b, g_t, beta_b, beta_t, o_b, o_t, o_h,
    K: tl.constexpr, R: tl.constexpr, NS: tl.constexpr, RP: tl.constexpr, XP: tl.constexpr,
    HV: tl.constexpr, HK: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, NT: tl.constexpr, USE_QK_L2NORM: tl.constexpr, GATE: tl.constexpr,
    DOT_F32: tl.constexpr, PRECISION: tl.constexpr,
):
    b, hv, j = head_tile_program(HV, NT)
    hk = hv // (HV // HK)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0
    slot = tl.maximum(slot, 0)
    p = tl.load(len_ptr + slot, mask=live, other=0)
    base = tl.load(base_ptr + slot, mask=live, other=0)
    rk = tl.arange(0, BK)
    mk = rk < KD
    rr = j * BV + tl.arange(0, BV)
    mr = rr < VD
    tr = tl.arange(0, XP)
    mt = tr < K
    ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)

    # the stored state's tile and the ring's window, loaded first (the bytes of the launch)
    hp = state_ptr + slot * s_slot + hv * (VD * KD) + rr[:, None] * KD + rk[None, :]
    m2 = mr[:, None] & mk[None, :] & live
    h0 = tl.load(hp, mask=m2, other=0.0)
    kr_ptr = kr_ptr + slot * kr_slot + hk * (NS * KD)
    ur_ptr = ur_ptr + slot * ur_slot + hv * (NS * VD)
    gr_ptr = gr_ptr + slot * gr_slot + hv * NS
    valid, kring, uring_t, gring, g_last = _ring_window(kr_ptr, ur_ptr, gr_ptr, p, base, live,
                                                        rk, mk, rr, mr, NS, RP, KD, VD)
    kx, qx, vt, g, beta = _load_rows(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, hv, hk, live, tr,
                                     mt, rk, mk, rr, mr, scale, ga, gd, q_b, q_t, q_h, k_b,
                                     k_t, k_h, v_b, v_t, v_h, g_b, g_t, beta_b, beta_t,
                                     USE_QK_L2NORM, GATE)

    fold = (p + K > R) & live
    if fold:
        h0 = _fold_window(h0, kring, uring_t, gring, valid, g_last, DOT_F32,
                          PRECISION).to(state_ptr.dtype.element_ty)
        tl.store(hp, h0, mask=m2)
    c0 = tl.where(fold, 0.0, g_last)
    hist = valid & (fold == 0)

    c = c0 + tl.cumsum(g, 0)
    ec = tl.where(mt, tl.exp(c), 0.0)
    dt = h0.dtype
    kd_ = kx.to(dt)
    qd_ = qx.to(dt)
    wk = _mm(h0, tl.trans(kd_), DOT_F32, PRECISION) * ec[None, :]
    wq = _mm(h0, tl.trans(qd_), DOT_F32, PRECISION) * ec[None, :]
    d = tl.where(hist[:, None] & mt[None, :], tl.exp(c[None, :] - gring[:, None]), 0.0)
    dk = d * _mm(kring, tl.trans(kd_), DOT_F32, PRECISION)
    dq = d * _mm(kring, tl.trans(qd_), DOT_F32, PRECISION)
    wk += _mm(uring_t, dk.to(dt), DOT_F32, PRECISION)
    wq += _mm(uring_t, dq.to(dt), DOT_F32, PRECISION)

    # the new rows by WY: (I + A) U = beta (V - Wk)
    low = (tr[:, None] >= tr[None, :]) & mt[:, None] & mt[None, :]
    decay = tl.where(low, tl.exp(c[:, None] - c[None, :]), 0.0)
    kk = _mm(kd_, tl.trans(kd_), DOT_F32, PRECISION)
    qk = _mm(qd_, tl.trans(kd_), DOT_F32, PRECISION)
    A = tl.where(tr[:, None] > tr[None, :], beta[:, None] * decay * kk, 0.0)
    tinv = _unit_lower_inverse(A, K, XP)
    ut = _mm_ieee(beta[None, :] * (vt - wk), tl.trans(tinv))
    ot = wq + _mm_ieee(ut, tl.trans(decay * qk))

    mo = mt[None, :] & mr[:, None]
    tl.store(o_ptr + b * o_b + tr[None, :] * o_t + hv * o_h + rr[:, None],
             ot.to(o_ptr.dtype.element_ty), mask=mo)
    pos = (base + p + tr) % NS
    tl.store(ur_ptr + pos[None, :] * VD + rr[:, None], ut.to(ur_ptr.dtype.element_ty),
             mask=mo & live)
    if j == 0:
        tl.store(gr_ptr + pos, c, mask=mt & live)
        if hv % (HV // HK) == 0:
            tl.store(kr_ptr + pos[:, None] * KD + rk[None, :], kx.to(kr_ptr.dtype.element_ty),
                     mask=mt[:, None] & mk[None, :] & live)
        if hv == 0:
            tl.store(engaged_ptr + b, tl.where(fold, 2, 1).to(tl.int32))


@triton.jit
def gdn_ring_flush_kernel(
    state_ptr, kr_ptr, ur_ptr, gr_ptr, len_ptr, base_ptr, slot_ptr,
    s_off, kr_off, ur_off, gr_off, len_off, base_off,
    s_slot, kr_slot, ur_slot, gr_slot,
    NS: tl.constexpr, RP: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NT: tl.constexpr,
    DOT_F32: tl.constexpr, PRECISION: tl.constexpr,
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
    len_ptr += tl.load(len_off + layer)
    base_ptr += tl.load(base_off + layer)
    p = tl.load(len_ptr + slot, mask=live, other=0)
    if p > 0:
        base = tl.load(base_ptr + slot)
        rk = tl.arange(0, BK)
        mk = rk < KD
        rr = j * BV + tl.arange(0, BV)
        mr = rr < VD
        hp = (state_ptr + tl.load(s_off + layer) + slot * s_slot + hv * (VD * KD)
              + rr[:, None] * KD + rk[None, :])
        m2 = mr[:, None] & mk[None, :]
        h0 = tl.load(hp, mask=m2, other=0.0)
        valid, kring, uring_t, gring, g_last = _ring_window(
            kr_ptr + tl.load(kr_off + layer) + slot * kr_slot + hk * (NS * KD),
            ur_ptr + tl.load(ur_off + layer) + slot * ur_slot + hv * (NS * VD),
            gr_ptr + tl.load(gr_off + layer) + slot * gr_slot + hv * NS,
            p, base, live, rk, mk, rr, mr, NS, RP, KD, VD)
        h = _fold_window(h0, kring, uring_t, gring, valid, g_last, DOT_F32, PRECISION)
        tl.store(hp, h.to(state_ptr.dtype.element_ty), mask=m2)


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
