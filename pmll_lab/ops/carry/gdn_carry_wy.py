"""Carried-state GDN verify, WY form: Triton kernels on the K-major state (SPEC §3b).
Launched by ``pmll_lab.ops.carry.gdn_carry`` (module docstring: buffers, grids, protocol).

The ``K`` rows at once: per program, the rows' normalised keys and scaled queries as
``[KP, BK]`` tiles (``KP = 16``, the smallest ``tl.dot`` side), decays between rows summed over
the rows between (finite for any ``g <= 0``, including ``-inf``), ``A[t,s] = beta_t
exp(c_t - c_s) k_t.k_s`` (``s < t``), ``T = (I + A)^-1`` by forward substitution and ``P[t,s] =
exp(c_t - c_s) q_t.k_s``; per column block ``KH = K_rows H``, ``QH = Q_rows H`` (``tl.dot`` in
``WY_DOT_PRECISION``), ``U = T (beta * (V - exp(c) KH))``, ``O = exp(c) QH + P U``. Equal to
the exact form up to fp32 rounding (tests: rel L2 <= 1e-4); a *reference* form, slower than the
exact one on the H200 (``reports/perf-notes.md`` v8, v11). Source: the WY representation of
products of Householder-like updates (Bischof and Van Loan 1987) as DeltaNet's chunked form
uses it (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule").
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.gdn.recurrence import (gdn_gate_beta, gdn_gate_g, head_tile_program,
                                         load_gate_params)

from pmll_lab.ops.carry.gdn_carry_exact import (_ROW_UNSPECIALIZED, _folded_block,
                                              _verify_prologue)

WY_ROWS_PAD = 16
"""The WY form pads the K axis to 16 rows: ``tl.dot`` needs every side >= 16."""


@triton.jit
def _wy_rows(q_ptr, k_ptr, g_ptr, beta_ptr, b, hv, hk, scale,
             sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sg_b, sg_t, sb_b, sb_t, ga, gd,
             K: tl.constexpr, KD: tl.constexpr, BK: tl.constexpr, KP: tl.constexpr,
             USE_QK_L2NORM: tl.constexpr, GATE: tl.constexpr):
    """Per (sequence, head), independent of the state: the ``K`` rows' scaled queries ``Q`` and
    normalised keys ``Kr`` as ``[KP, BK]`` tiles, gates ``g``, ``beta``, ``ec = exp(cumsum g)``,
    ``T = (I + A)^-1`` (forward substitution) and ``P`` (SPEC §3b)."""
    rk = tl.arange(0, BK)
    mk = rk < KD
    rt = tl.arange(0, KP)            # draft rows, padded to KP
    mt = rt < K
    mtk = mt[:, None] & mk[None, :]
    Q = tl.load(q_ptr + b * sq_b + hk * sq_h + rt[:, None] * sq_t + rk[None, :],
                mask=mtk, other=0.0).to(tl.float32)
    Kr = tl.load(k_ptr + b * sk_b + hk * sk_h + rt[:, None] * sk_t + rk[None, :],
                 mask=mtk, other=0.0).to(tl.float32)
    if USE_QK_L2NORM:
        Q = Q * tl.math.rsqrt(tl.sum(Q * Q, 1) + 1e-6)[:, None]
        Kr = Kr * tl.math.rsqrt(tl.sum(Kr * Kr, 1) + 1e-6)[:, None]
    Q = Q * scale
    g = tl.load(g_ptr + b * sg_b + rt * sg_t + hv, mask=mt, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + b * sb_b + rt * sb_t + hv, mask=mt, other=0.0).to(tl.float32)
    if GATE:                         # g_ptr, beta_ptr hold a, b; padded rows stay 0
        g = tl.where(mt, gdn_gate_g(ga, g, gd), 0.0)
        beta = tl.where(mt, gdn_gate_beta(beta), 0.0)
    c = tl.cumsum(g, 0)
    ec = tl.exp(c)
    lower = rt[:, None] >= rt[None, :]
    strict = rt[:, None] > rt[None, :]
    # decay[t, s] = exp(sum of g over rows s+1..t): summed over the rows between, not formed as
    # c_t - c_s, which is -inf - (-inf) = NaN after a fully forgetting gate (g = -inf) and
    # loses precision for large finite decays.
    between = (rt[None, None, :] > rt[None, :, None]) & (rt[None, None, :] <= rt[:, None, None])
    decay = tl.where(lower, tl.exp(tl.sum(tl.where(between, g[None, None, :], 0.0), 2)), 0.0)
    KK = tl.dot(Kr, tl.trans(Kr), input_precision="ieee")
    QK = tl.dot(Q, tl.trans(Kr), input_precision="ieee")
    A = tl.where(strict, beta[:, None] * decay * KK, 0.0)
    P = decay * QK
    # T = (I + A)^-1 by forward substitution: row t = e_t - sum_{s<t} A[t, s] T[s, :]
    T = tl.where(rt[:, None] == rt[None, :], 1.0, 0.0)
    for t in tl.static_range(1, K):
        a_t = tl.sum(tl.where(rt[:, None] == t, A, 0.0), 0)          # row t of A, over s
        corr = tl.sum(a_t[:, None] * T, 0)
        T = tl.where(rt[:, None] == t, T - corr[None, :], T)
    return Q, Kr, g, beta, ec, T, P


@triton.jit
def _wy_column_block(h_ptr, u_ptr, gs_ptr, ks_ptr, v_ptr, o_ptr, b, hv, live, p, wb, first, j,
                     Q, Kr, beta, ec, T, P, sv_b, sv_t, sv_h, so_b, so_t, so_h,
                     K: tl.constexpr, HV: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
                     BK: tl.constexpr, BV: tl.constexpr, KP: tl.constexpr,
                     DOT_PRECISION: tl.constexpr, PREFETCH: tl.constexpr):
    """Columns ``j*BV ..`` of one head: load the state block, fold the ``p`` pending rows, write
    it back if ``wb``, then the ``K`` rows at once: ``KH = Kr H``, ``QH = Q H``,
    ``U = T (beta (V - ec KH))``, ``O = ec QH + P U``; store ``O`` and stash ``U``."""
    rk = tl.arange(0, BK)
    mk = rk < KD
    rt = tl.arange(0, KP)
    mt = rt < K
    rv = j * BV + tl.arange(0, BV)
    mv = rv < VD
    h = _folded_block(h_ptr, u_ptr, gs_ptr, ks_ptr, p, wb, rk, mk, rv, mv & live, HV, KD, VD,
                      PREFETCH)
    mtv = mt[:, None] & mv[None, :]
    V = tl.load(v_ptr + b * sv_b + hv * sv_h + rt[:, None] * sv_t + rv[None, :],
                mask=mtv, other=0.0).to(tl.float32)
    KH = tl.dot(Kr, h, input_precision=DOT_PRECISION)
    QH = tl.dot(Q, h, input_precision=DOT_PRECISION)
    R = beta[:, None] * (V - ec[:, None] * KH)
    U = tl.dot(T, R, input_precision="ieee")
    O = ec[:, None] * QH + tl.dot(P, U, input_precision="ieee")
    tl.store(o_ptr + b * so_b + hv * so_h + rt[:, None] * so_t + rv[None, :],
             tl.where(live, O, 0.0).to(o_ptr.dtype.element_ty), mask=mtv)
    tl.store(u_ptr + (first + rt[:, None]) * (HV * VD) + rv[None, :], U, mask=mtv & live)


@triton.jit
def _wy_restash_shared_rows(gs_ptr, ks_ptr, first, g, Kr, K: tl.constexpr, HV: tl.constexpr,
                            KD: tl.constexpr, BK: tl.constexpr, KP: tl.constexpr):
    """Stash the rows' log decays and normalised keys at rows ``first ..`` (after every block
    of the head has folded the old ones)."""
    rk = tl.arange(0, BK)
    rt = tl.arange(0, KP)
    mt = rt < K
    tl.store(gs_ptr + (first + rt) * HV, g, mask=mt)
    tl.store(ks_ptr + (first + rt[:, None]) * (HV * KD) + rk[None, :], Kr,
             mask=mt[:, None] & (rk < KD)[None, :])


@triton.jit(**_ROW_UNSPECIALIZED)
def _gdn_carry_wy_kernel(
    state_ptr, stash_ptr, pend_ptr, slot_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, engaged_ptr, alog_ptr, dtb_ptr,
    scale, stride_state, stride_stash,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
    sg_b, sg_t, sb_b, sb_t, so_b, so_t, so_h,
    K: tl.constexpr, CAP: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    KD: tl.constexpr, VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    LAZY: tl.constexpr, USE_QK_L2NORM: tl.constexpr, KP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PREFETCH: tl.constexpr, GATE: tl.constexpr,
):
    """The WY form, one program per (sequence, head) looping over the head's column blocks
    (grid ``(B, HV)``); the shared g/k rows are restashed after the last block."""
    b = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    hk = hv // GROUP
    slot, live, p, wb, first, h_ptr, u_ptr, gs_ptr, ks_ptr = _verify_prologue(
        state_ptr, stash_ptr, pend_ptr, slot_ptr, b, hv, stride_state, stride_stash,
        K, CAP, HV, KD, VD, LAZY)
    ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)
    Q, Kr, g, beta, ec, T, P = _wy_rows(q_ptr, k_ptr, g_ptr, beta_ptr, b, hv, hk, scale,
                                        sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sg_b, sg_t, sb_b,
                                        sb_t, ga, gd, K, KD, BK, KP, USE_QK_L2NORM, GATE)
    for j in tl.static_range(0, NV):
        _wy_column_block(h_ptr, u_ptr, gs_ptr, ks_ptr, v_ptr, o_ptr, b, hv, live, p, wb, first,
                         j,
                         Q, Kr, beta, ec, T, P, sv_b, sv_t, sv_h, so_b, so_t, so_h,
                         K, HV, KD, VD, BK, BV, KP, DOT_PRECISION, PREFETCH)
    tl.debug_barrier()
    if live:
        _wy_restash_shared_rows(gs_ptr, ks_ptr, first, g, Kr, K, HV, KD, BK, KP)
    if hv == 0:
        tl.store(engaged_ptr + b, tl.where(wb, 2, 1).to(tl.int32))


@triton.jit(**_ROW_UNSPECIALIZED)
def _gdn_carry_wy_split_kernel(
    state_ptr, stash_ptr, pend_ptr, slot_ptr, arrive_ptr,
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, engaged_ptr, alog_ptr, dtb_ptr,
    scale, stride_state, stride_stash,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
    sg_b, sg_t, sb_b, sb_t, so_b, so_t, so_h,
    K: tl.constexpr, CAP: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr,
    KD: tl.constexpr, VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    LAZY: tl.constexpr, USE_QK_L2NORM: tl.constexpr, KP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PREFETCH: tl.constexpr, GATE: tl.constexpr,
):
    """The WY form with a head's column blocks split across programs (grid ``(B * HV * NV,)``,
    ``head_tile_program``): each program computes the head's small matrices itself (a few
    ``[16, BK]`` products), folds and runs its block, counts itself in ``arrive[slot, hv]``
    (acq_rel atomic); the last to arrive restashes the g/k rows and resets the count, as the
    split exact form does."""
    b, hv, j = head_tile_program(HV, NV)
    hk = hv // GROUP
    slot, live, p, wb, first, h_ptr, u_ptr, gs_ptr, ks_ptr = _verify_prologue(
        state_ptr, stash_ptr, pend_ptr, slot_ptr, b, hv, stride_state, stride_stash,
        K, CAP, HV, KD, VD, LAZY)
    ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)
    Q, Kr, g, beta, ec, T, P = _wy_rows(q_ptr, k_ptr, g_ptr, beta_ptr, b, hv, hk, scale,
                                        sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sg_b, sg_t, sb_b,
                                        sb_t, ga, gd, K, KD, BK, KP, USE_QK_L2NORM, GATE)
    _wy_column_block(h_ptr, u_ptr, gs_ptr, ks_ptr, v_ptr, o_ptr, b, hv, live, p, wb, first, j,
                     Q, Kr, beta, ec, T, P, sv_b, sv_t, sv_h, so_b, so_t, so_h,
                     K, HV, KD, VD, BK, BV, KP, DOT_PRECISION, PREFETCH)
    tl.debug_barrier()
    arrived = tl.atomic_add(arrive_ptr + slot * HV + hv, 1, sem="acq_rel", mask=live)
    if live & (arrived == NV - 1):
        _wy_restash_shared_rows(gs_ptr, ks_ptr, first, g, Kr, K, HV, KD, BK, KP)
        tl.atomic_xchg(arrive_ptr + slot * HV + hv, 0, sem="relaxed")
    if hv == 0:
        if j == 0:
            tl.store(engaged_ptr + b, tl.where(wb, 2, 1).to(tl.int32))
