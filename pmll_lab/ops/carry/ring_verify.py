"""The ring form's verify in one launch (SPEC §3d): a head's small matrices beside its state.

One program per (sequence, value head, tile of ``BV`` value rows) of a V-major state
``[S, HV, vd, kd]``; with ``BV = vd`` one program holds a whole head and forms its small
matrices once. The program first streams its state tile in chunks of ``BK`` keys
(``tl.range``, ``STAGES`` deep: a GEMM's K loop), ``S0 X^T`` on the tensor cores against the
raw new rows (``X``: the ``K`` keys in columns 0..7, the ``K`` queries in 8..15); only then
does it form, from loads that were issued with the stream and are served by L2, the head's
coefficients:

- the norms ``n`` of the rows of ``X`` (the l2 norm and the query scale), ``c = G_{P-1} +
  cumsum(g)`` (the cumulative log decay of each new row from the stored state);
- the Gram matrix ``X X^T`` and the window's keys against ``X`` (two ``tl.dot`` per chunk
  of the same pass);
- ``Dm[j, x] = e^{c_x - G_j} n_x (k_j . x)`` (the window's rows), ``N[s, t] = beta_t
  e^{c_t - c_s} n_s n_t (k_s . k_t)`` for ``s < t < K`` and
  ``Bt = diag(beta) (I + N)^-1``, the inverse as the product ``(I - N)(I + N^2)(I + N^4)``
  (``N`` is nilpotent of order ``K <= 8``; two to four ``[16, 16]`` products, no
  substitution loop); ``P2[s, 8 + t] = e^{c_t - c_s} n_s n_{8+t} (k_s . q_t)`` for ``s <= t``;

then ``W = S0 X^T diag(e^c n) + U_ring^T Dm``, ``U = (V - W) Bt`` (the new rows' corrections)
and ``O = W + U P2`` (the outputs), all ``[BV, 16]``. With ``EARLY`` (a tile holding a whole
head, 2-byte states: ``settings.ring_form().ring_coefficients_first``) the order turns round: the
new rows and the window's keys are loaded whole and the small matrices formed first, then the
state's chunks stream against ``X``, so the dependent chain left after the state's bytes arrive
is three ``[BV, 16]`` products. Why one launch: the two-launch form
(coefficients per head first, then the state) waits for the whole first grid before any state
program finishes (reports/perf-notes.md, "The ring form's design and its history").

A fold (``P + K > R``) changes nothing before the outputs (``H_P x = e^{G_{P-1}} S0 x +
sum_j e^{G_{P-1} - G_j} u_j (k_j . x)`` is what the window's correction already computes); at
the program's end it streams the tile again (from L2: the program read it moments before) and
stores ``H_P = e^{G_{P-1}} S0 + U_ring^T (w K_ring)`` rounded once to the state's dtype, and the
new rows' ``G`` count from it. Keeping the fold out of the first pass keeps the fold's
registers out of the verify's. Appends go to ring rows ``base + P ..`` (mod ``NS = 2R``), past
the window every program of the launch reads; ``k`` rows by the first value head of each
key-head group, ``G`` and ``engaged`` by tile 0.

Operand dtypes (``SMALL``): a bf16 state multiplies everything in bf16 with fp32 accumulation
(as FlashInfer's ReplaySSM kernels; the coefficients' 2^-9 rounding is the state's own);
beside an fp16 state the small products take one tf32 pass (fp16's range is too narrow for
decays such as ``e^c``); beside an fp32 state the state's products take ``_split_mma`` (a bf16
head and tail of the state block against the exact bf16 keys: two MMAs) and the small products
``_fine_mma`` (three bf16 pieces of each operand, six MMAs): ~4e-7 on the outputs before their
rounding, against ~5e-6 with two pieces, at fewer registers than ``"tf32x3"``. Measurements
behind the tiles: ``pmll_lab.ops.settings.ring_form`` and reports/perf-notes.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.carry.ring_kernels import (ring_row_gates, slot_cursor, small_mm, small_mma,
                                                 state_mma)
from pmll_lab.ops.gdn.recurrence import head_tile_program, load_gate_params

@triton.jit
def _unit_upper_inverse(N, K: tl.constexpr, SMALL: tl.constexpr):
    """``(I + N)^-1`` for a strictly upper-triangular ``N [16, 16]`` nonzero only in its first
    ``K <= 8`` rows and columns: ``(I - N)(I + N^2)(I + N^4)`` truncated where ``N^K = 0``."""
    r = tl.arange(0, 16)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    inv = eye - N
    if K > 2:
        n2 = small_mm(N, N, SMALL)
        inv = small_mm(inv, eye + n2, SMALL)
        if K > 4:
            n4 = small_mm(n2, n2, SMALL)
            inv = small_mm(inv, eye + n4, SMALL)
    return inv


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
    """One ring verify tile (the module docstring); writes ``o``, the ring's new ``u`` rows
    (and ``k``, ``G``, ``engaged`` where this program is the one to), and the folded state.
    ``RW = max(16, R)``: window rows as one ``tl.dot`` dimension; ``NS = 2R`` a power of two;
    ``FBK``: keys per chunk of the fold (``settings.ring_form().ring_fold_chunk``); ``EARLY``:
    the coefficients before the state product (module docstring)."""
    b, hv, j = head_tile_program(HV, NT)
    hk = hv // (HV // HK)
    slot, live, p, base = slot_cursor(slot_ptr, len_ptr, base_ptr, b)
    rr = j * BV + tl.arange(0, BV)
    mr = rr < VD
    x = tl.arange(0, 16)
    t = x % 8
    is_k = x < 8
    mx = (t < K) & live                       # column x holds a row of X
    mt = (x < K) & live                       # column x is new row t = x (a key)
    iw = tl.arange(0, RW)                     # the window's rows, oldest first
    valid = (iw < p) & live
    i = (base + iw) & (NS - 1)                # their physical rows
    fold = (p + K > R) & live
    dt = state_ptr.dtype.element_ty

    xrow = tl.where(is_k[:, None], k_ptr + b * k_b + t[:, None] * k_t + hk * k_h,
                    q_ptr + b * q_b + t[:, None] * q_t + hk * q_h)
    krow = kr_ptr + slot * kr_slot + hk * (NS * KD) + i[:, None] * KD
    hrow = state_ptr + slot * s_slot + hv * (VD * KD) + rr[:, None] * KD
    ur = ur_ptr + slot * ur_slot + hv * (NS * VD)
    gr = gr_ptr + slot * gr_slot + hv * NS
    uring_t = tl.load(ur + i[None, :] * VD + rr[:, None], mask=mr[:, None] & valid[None, :],
                      other=0.0)                                            # [BV, RW]
    gring = tl.load(gr + i, mask=valid, other=0.0)                         # [RW]
    vt = tl.load(v_ptr + b * v_b + x[None, :] * v_t + hv * v_h + rr[:, None],
                 mask=mt[None, :] & mr[:, None], other=0.0)               # [BV, 16]

    if EARLY:
        # the new rows and the window's keys whole (L2), their products before the state's
        kk = tl.arange(0, KP)
        mkd = kk < KD
        xw = tl.load(xrow + kk[None, :], mask=mx[:, None] & mkd[None, :], other=0.0)  # [16, KP]
        kw_ = tl.load(krow + kk[None, :], mask=valid[:, None] & mkd[None, :], other=0.0)
        krx = state_mma(kw_, tl.trans(xw), tl.zeros((RW, 16), tl.float32), SMALL)
        if xw.dtype == tl.bfloat16:
            gram = tl.dot(xw, tl.trans(xw))                                 # exact products
        else:
            gram = small_mm(xw, tl.trans(xw), SMALL)
        xf = xw.to(tl.float32)
        ss = tl.sum(xf * xf, 1)
    else:
        # one pass over the keys: the state tile against X, and the Grams beside it
        acc = tl.zeros((BV, 16), tl.float32)                               # S0 X^T (raw X)
        gram = tl.zeros((16, 16), tl.float32)                              # X X^T
        krx = tl.zeros((RW, 16), tl.float32)                               # K_ring X^T
        ss = tl.zeros((16,), tl.float32)
        for c in tl.range(0, KD, BK, num_stages=STAGES):
            rk = c + tl.arange(0, BK)
            mk = rk < KD
            h = tl.load(hrow + rk[None, :], mask=mr[:, None] & mk[None, :] & live, other=0.0)
            xc = tl.load(xrow + rk[None, :], mask=mx[:, None] & mk[None, :], other=0.0)
            kc = tl.load(krow + rk[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
            acc = state_mma(h, tl.trans(xc), acc, SMALL)
            krx = state_mma(kc, tl.trans(xc), krx, SMALL)
            if xc.dtype == tl.bfloat16:
                gram = tl.dot(xc, tl.trans(xc), gram)                    # exact products
            else:
                gram = small_mma(xc, tl.trans(xc), gram, SMALL)
            xf = xc.to(tl.float32)
            ss += tl.sum(xf * xf, 1)

    # the head's small matrices
    g_last = tl.sum(tl.where(iw == p - 1, gring, 0.0), 0)                  # G_{P-1} (0 if P = 0)
    if USE_QK_L2NORM:
        n = tl.math.rsqrt(ss + 1e-6)
    else:
        n = tl.full((16,), 1.0, tl.float32)
    n = tl.where(mx, tl.where(is_k, n, n * scale), 0.0)
    ga, gd = load_gate_params(alog_ptr, dtb_ptr, hv, GATE)
    g, beta = ring_row_gates(g_ptr, beta_ptr, b, hv, mx, ga, gd, g_b, g_t, beta_b, beta_t, t, GATE)
    ck = tl.cumsum(tl.where(is_k, g, 0.0), 0)
    cq = tl.cumsum(tl.where(is_k, 0.0, g), 0)
    cx = g_last + tl.where(is_k, ck, cq)                                   # c_{t(x)}
    beta = tl.where(mt, beta, 0.0)
    colscale = tl.where(mx, tl.exp(cx), 0.0) * n
    dm = tl.exp(tl.where(valid[:, None] & mx[None, :], cx[None, :] - gring[:, None], -float("inf")))
    dm = dm * krx * n[None, :]
    gx = gram * n[:, None] * n[None, :]
    s_le_t = (x[:, None] < 8) & (x[:, None] <= t[None, :]) & mt[:, None] & mx[None, :]
    dec = tl.exp(tl.where(s_le_t, cx[None, :] - cx[:, None], -float("inf")))
    N = tl.where(is_k[None, :] & (x[:, None] < x[None, :]), beta[None, :] * dec * gx, 0.0)
    bt = beta[:, None] * _unit_upper_inverse(N, K, SMALL)
    p2 = tl.where(is_k[None, :], 0.0, dec * gx)

    if EARLY:
        # the state tile against X, after the coefficients
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
    mo = ((x >= 8) & (t < K))[None, :] & mr[:, None]            # a padding lane's zeros too
    tl.store(o_ptr + b * o_b + t[None, :] * o_t + hv * o_h + rr[:, None],
             ot.to(o_ptr.dtype.element_ty), mask=mo)
    pos = (base + p + x) & (NS - 1)
    tl.store(ur + pos[None, :] * VD + rr[:, None], ut.to(ur_ptr.dtype.element_ty),
             mask=mt[None, :] & mr[:, None])
    if j == 0:
        tl.store(gr + pos, ck + tl.where(fold, 0.0, g_last), mask=mt)   # from the stored state
        if hv % (HV // HK) == 0:
            # the K new keys (rows 0..7 of X), normalised, into the ring
            r8 = tl.arange(0, 8)
            kk = tl.arange(0, KP)
            mkk = ((r8 < K) & live)[:, None] & (kk < KD)[None, :]
            xa = tl.load(k_ptr + b * k_b + r8[:, None] * k_t + hk * k_h + kk[None, :], mask=mkk,
                         other=0.0)
            n8 = tl.sum(tl.where(r8[:, None] == x[None, :], n[None, :], 0.0), 1)
            kbase = kr_ptr + slot * kr_slot + hk * (NS * KD)
            tl.store(kbase + ((base + p + r8) & (NS - 1))[:, None] * KD + kk[None, :],
                     (xa.to(tl.float32) * n8[:, None]).to(kr_ptr.dtype.element_ty), mask=mkk)
        if hv == 0:
            tl.store(engaged_ptr + b, tl.where(fold, 2, 1).to(tl.int32))
    if fold:
        # H_P = e^{G_{P-1}} S0 + U_ring^T (w K_ring): the tile again (L2), rounded once
        w = tl.where(valid, tl.exp(g_last - gring), 0.0)
        efold = tl.exp(g_last)
        # the store's addresses and mask written apart from the load's, so that the pipeline
        # does not carry [BV, BK] pointers from the stage that loads to the one that stores
        srow = state_ptr + (rr[:, None] * KD + (slot * s_slot + hv * (VD * KD)))
        for c in tl.range(0, KD, FBK, num_stages=STAGES):
            rk = c + tl.arange(0, FBK)
            mk = rk < KD
            h = tl.load(hrow + rk[None, :], mask=mr[:, None] & mk[None, :], other=0.0)
            kc = tl.load(krow + rk[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
            kw = (kc.to(tl.float32) * w[:, None]).to(dt)
            hf = state_mma(uring_t, kw, efold * h.to(tl.float32), SMALL)
            cs = tl.multiple_of(c, FBK) + tl.arange(0, FBK)
            tl.store(srow + cs[None, :], hf.to(dt), mask=(cs < KD)[None, :] & (rr < VD)[:, None])
