"""Triton pieces of the ring form (SPEC §3d) shared by its kernels, the flush and the commit.

The verify is ``pmll_lab.ops.carry.ring_verify``; here: the products it and the flush use
(``_split_mma``, ``_fine_mma``, ``small_mma``, ``state_mma``: the operand precisions by state
dtype, see ``SMALL_PRODUCTS``), the window and cursor loads, the new rows' gates, the flush kernel (fold
every listed slot's window into its state, several layers in one launch) and the cursor commit
(``ring_accept_kernel``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from pmll_lab.ops.gdn.recurrence import gdn_gate, head_tile_program











SMALL_PRODUCTS = {"float32": "split", "bfloat16": "bf16", "float16": "tf32"}
"""``SMALL`` by state dtype (the module docstring)."""


@triton.jit
def _split_mma(a, b, acc):
    """``acc + a @ b`` close to fp32 on bf16 tensor cores: each fp32 operand is split into a
    bf16 head and a bf16 tail (``a = a_h + a_t`` to 2^-17), and ``a_h b_h + a_t b_h + a_h b_t``
    summed in fp32 (a bf16 operand is its own head). ~4e-6 relative per product."""
    ah = a.to(tl.bfloat16)
    at = (a - ah.to(tl.float32)).to(tl.bfloat16)
    if b.dtype == tl.bfloat16:
        acc = tl.dot(ah, b, acc)
        acc = tl.dot(at, b, acc)
    else:
        bh = b.to(tl.bfloat16)
        bt = (b.to(tl.float32) - bh.to(tl.float32)).to(tl.bfloat16)
        acc = tl.dot(ah, bh, acc)
        acc = tl.dot(at, bh, acc)
        acc = tl.dot(ah, bt, acc)
    return acc


@triton.jit
def _split3(a):
    """fp32 ``a`` as three bf16 pieces, largest first (``a`` to 2^-24 relative)."""
    a1 = a.to(tl.bfloat16)
    r = a - a1.to(tl.float32)
    a2 = r.to(tl.bfloat16)
    return a1, a2, (r - a2.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _fine_mma(a, b, acc):
    """``acc + a @ b`` to about fp32 precision from bf16 tensor cores: both fp32 operands in
    three pieces (``_split3``) and the six products of order above 2^-24. For the small
    products beside an fp32 state, whose cancellations (``V - W``) the two-piece split
    (``_split_mma``, ~5e-6 on the outputs) left visible as bf16 output flips over a long
    decode."""
    a1, a2, a3 = _split3(a.to(tl.float32))
    b1, b2, b3 = _split3(b.to(tl.float32))
    acc = tl.dot(a1, b1, acc)
    acc = tl.dot(a2, b1, acc)
    acc = tl.dot(a1, b2, acc)
    acc = tl.dot(a2, b2, acc)
    acc = tl.dot(a3, b1, acc)
    return tl.dot(a1, b3, acc)


@triton.jit
def small_mma(a, b, acc, SMALL: tl.constexpr):
    """``acc + a @ b`` for the coefficient and ``[BV, 16]`` products, at ``SMALL``."""
    if SMALL == "split":
        return _fine_mma(a, b, acc)
    if SMALL == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="tf32")


@triton.jit
def small_mm(a, b, SMALL: tl.constexpr):
    return small_mma(a, b, tl.zeros((a.shape[0], b.shape[1]), tl.float32), SMALL)


@triton.jit
def state_mma(h, xt, acc, SMALL: tl.constexpr):
    """``acc + h @ xt`` with a block ``h`` of the state (or the ring's rows, in its dtype):
    split for an fp32 state, else in the state's dtype with fp32 accumulation (bf16 inputs
    stay exact)."""
    if SMALL == "split":
        if xt.dtype == tl.bfloat16:
            return _split_mma(h, xt, acc)
        return _split_mma(h, xt.to(tl.float32), acc)
    return tl.dot(h, xt.to(h.dtype), acc)


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





LOG_DECAY_FLOOR = tl.constexpr(-30.0)
"""A new row's log decay is taken as at least this (``e^-30 ~ 9e-14``): a fully forgetting
row (``g = -inf``, or ``-1e4``) would otherwise make ``c_t - c_s`` a NaN or a difference of
huge cumulative sums that lose fp32 precision; what the floor keeps of the state is far below
every ``RING_TOLERANCE``."""


@triton.jit
def ring_row_gates(g_ptr, beta_ptr, b, hv, m1, ga, gd, g_b, g_t, beta_b, beta_t, tr,
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
def slot_cursor(slot_ptr, len_ptr, base_ptr, b):
    """``(slot, live, P, base)`` of sequence ``b`` (slot -1: a padding lane, read as slot 0
    for address arithmetic, ``P = 0``)."""
    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0
    slot = tl.maximum(slot, 0)
    p = tl.load(len_ptr + slot, mask=live, other=0)
    base = tl.load(base_ptr + slot, mask=live, other=0)
    return slot, live, p, base


@triton.jit
def gdn_ring_flush_kernel(
    state_ptr, kr_ptr, ur_ptr, gr_ptr, len_ptr, base_ptr, slot_ptr,
    s_off, kr_off, ur_off, gr_off, len_off, base_off,
    s_slot, kr_slot, ur_slot, gr_slot,
    NS: tl.constexpr, RP: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NT: tl.constexpr,
    STAGES: tl.constexpr, SMALL: tl.constexpr,
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
            hf = state_mma(uring_t, kw, efold * h.to(tl.float32), SMALL)
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
