"""The ring form of the carried state (SPEC §3d): kernels against the float64 references.

Two references: ``pmll_lab.reference.ring`` (the ring's own algebra, fed the kernel's rounding
points: its ring rows in the state's dtype, a fold rounded once) and ``pmll_lab.reference.carry``
(the exact protocol: plain decoding of the accepted rows). Each test runs the protocol over
several steps of random acceptance (0..K rows, folds included) from fresh seeded inputs.

Tolerances (relative L2):
- against the ring reference: fp32 state ``1e-5`` (products from bf16 pieces of each operand;
  measured up to 4.9e-6 on the interpreter with fp32 inputs, which rounds the pieces as a GPU
  does), bf16 state ``8e-3`` (bf16 operands, as FlashInfer's ReplaySSM; measured ~3e-3);
- against the exact protocol: ``RING_TOLERANCE`` per state dtype (``pmll_lab.carry``).
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import (RING_TOLERANCE, GdnRing, gdn_ring_flush, gdn_ring_verify,
                            ring_accept)
from pmll_lab.gdn import gdn_gating
from pmll_lab.inputs import gdn_inputs
from pmll_lab.reference import carry as ref_carry
from pmll_lab.reference import ring as ref_ring

from _carry_helpers import _close

REF_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}


def _run(seed, *, B=3, S=5, HK=2, HV=4, kd=16, vd=32, K=4, length=8, steps=6,
         state_dtype=torch.float32, in_dtype=torch.float32, padding=True, gating=False):
    """Drive kernel, ring reference and plain decoding through ``steps`` verify/accept steps;
    assert each step's outputs and the ring's state against both references."""
    gen = torch.Generator().manual_seed(seed + 1000)
    base = gdn_inputs(seed, B, HK, HV, kd, vd, rows=K, slots=S, dtype=in_dtype, state_layout="kv")
    state = base["state"].transpose(-1, -2).contiguous().to(state_dtype)     # V-major pool
    slots = base["state_indices"].clone()
    if padding:
        slots[1] = -1
    ring = GdnRing.empty(S, HK, HV, kd, vd, length=length, dtype=state_dtype)
    kv = state.double().transpose(-1, -2).contiguous().cpu()                 # reference, K-major
    rref = ref_ring.RefRing.zeros(S, HK, HV, kd, vd, length)
    plain = kv.clone()
    folds = 0
    for step in range(steps):
        x = gdn_inputs(seed * 31 + step, B, HK, HV, kd, vd, rows=K, slots=S, dtype=in_dtype,
                       state_layout="kv")
        if gating:
            A_log = torch.rand(HV, generator=gen).to(DEVICE) * 2 - 1
            dt_bias = torch.randn(HV, generator=gen).to(DEVICE) * 0.1
            a = torch.randn(B, K, HV, generator=gen).to(DEVICE, in_dtype)
            bb = torch.randn(B, K, HV, generator=gen).to(DEVICE, in_dtype)
            g, beta = gdn_gating(A_log, a, dt_bias, bb)
            o, eng = gdn_ring_verify(state, ring, x["q"], x["k"], x["v"], slot_tab=slots,
                                     A_log=A_log, a=a, dt_bias=dt_bias, b=bb, validate=True)
        else:
            g, beta = x["g"], x["beta"]
            o, eng = gdn_ring_verify(state, ring, x["q"], x["k"], x["v"], g, beta,
                                     slot_tab=slots, validate=True)
        args = (x["q"].cpu(), x["k"].cpu(), x["v"].cpu(), g.cpu(), beta.cpu(), slots.cpu())
        o_ring, e_ring = ref_ring.verify(kv, rref, *args, state_dtype=state_dtype,
                                         ring_dtype=state_dtype)
        o_plain = ref_carry.decode_tokens(plain.clone(), *args)
        assert eng.cpu().tolist() == e_ring.tolist(), f"step {step}: engaged"
        folds += int((e_ring == 2).sum())
        live, lc = slots >= 0, slots.cpu() >= 0
        assert bool((o[~live] == 0).all()), "padding lane outputs must be zero"
        _close(f"step {step} o vs ring reference", o[live], o_ring[lc], REF_TOL[state_dtype])
        _close(f"step {step} o vs exact protocol", o[live], o_plain[lc],
               RING_TOLERANCE[str(state_dtype).split(".")[1]])
        acc = torch.randint(0, K + 1, (B,), generator=gen).to(torch.int32)
        ring_accept(ring, slots, eng, acc.to(DEVICE), rows=K, validate=True)
        ref_ring.accept(rref, slots.cpu(), e_ring, acc)
        for b in range(B):
            if int(slots[b]) >= 0 and int(acc[b]):
                sl = slots[b:b + 1].cpu()
                ref_carry.decode_tokens(plain, *(t[b:b + 1, :int(acc[b])] for t in args[:5]), sl)
        assert ring.len.cpu().tolist() == rref.len.tolist()
        assert ring.base.cpu().tolist() == rref.base.tolist()
    # the state each live slot's ring means, against plain decoding
    kv_now = state.double().transpose(-1, -2).cpu()
    rnow = ref_ring.RefRing.from_ring(ring)
    for s in slots.tolist():
        if s >= 0:
            _close(f"slot {s} H_P vs plain decoding", ref_ring.ring_state(kv_now[s], rnow, s),
                   plain[s], RING_TOLERANCE[str(state_dtype).split(".")[1]])
    return state, ring, slots, plain, folds


@pytest.mark.parametrize("K,length", [(4, 8), (2, 16), (3, 8)])
def test_ring_protocol_fp32(K, length):
    *_, folds = _run(11 + K, K=K, length=length, steps=7)
    assert folds > 0 or length > 8, "the run must cross a fold"


@pytest.mark.parametrize("dtype, first", [("bfloat16", 2), ("bfloat16", 0), ("float32", 4)])
def test_ring_protocol_both_orders(dtype, first):
    """The verify with the head's coefficients before the state product (``first`` >= the
    state's element size: the shipped order for bf16) and after it (``first`` = 0), bf16 state
    and inputs, and fp32 with the coefficients first; both references, folds included."""
    from pmll_lab.ops import settings

    sd = getattr(torch, dtype)
    with settings.override(ring_coefficients_first=first):
        *_, folds = _run(5, state_dtype=sd, in_dtype=sd, steps=6)
    assert folds > 0


def test_ring_gva_gating_and_k8():
    """GVA (HV = 4 HK), the gating computed in the kernel, K = 8 on a 32-row ring, kd = 32."""
    _run(7, HK=1, HV=4, kd=32, vd=16, K=8, length=32, steps=5, gating=True)


@pytest.mark.parametrize("chunk", [16, 0])
def test_ring_fold_chunk_moves_no_bit(chunk):
    """The verify's fold loop in other key chunks (``ring_fold_chunk``: 16, or 0 for the tile's
    BK = 64) than the shipped 32: the same protocol against both references, and the folded
    states and rings bitwise the shipped chunk's (the fold's sums run over the window's rows,
    not the keys)."""
    from pmll_lab.ops import settings

    tiles = ((1 << 62, 4, 16, 64, 2, 2),)           # BK = 64 at kd = 64: three chunk widths
    with settings.override(ring_form_tiles=tiles):
        state, ring, _, _, folds = _run(9, kd=64, vd=16, K=4, length=8, steps=5)
        with settings.override(ring_fold_chunk=chunk):
            state_c, ring_c, _, _, folds_c = _run(9, kd=64, vd=16, K=4, length=8, steps=5)
    assert folds == folds_c > 0, "the run must cross a fold"
    assert bitwise_equal(state_c, state)
    assert bitwise_equal(ring_c.u, ring.u) and bitwise_equal(ring_c.k, ring.k)


def test_ring_fused_gating_is_bitwise_gdn_gating():
    x = gdn_inputs(3, 2, 2, 4, 16, 16, rows=4, slots=2, dtype=torch.bfloat16, state_layout="kv")
    gen = torch.Generator().manual_seed(4)
    A_log = (torch.rand(4, generator=gen) * 2 - 1).to(DEVICE)
    dt_bias = torch.randn(4, generator=gen).to(DEVICE)
    a = torch.randn(2, 4, 4, generator=gen).to(DEVICE, torch.bfloat16)
    b = torch.randn(2, 4, 4, generator=gen).to(DEVICE, torch.bfloat16)
    outs = []
    for fused in (False, True):
        state = x["state"].transpose(-1, -2).contiguous()
        ring = GdnRing.empty(2, 2, 4, 16, 16, length=8)
        for step in range(3):
            if fused:
                o, e = gdn_ring_verify(state, ring, x["q"], x["k"], x["v"], A_log=A_log, a=a,
                                       dt_bias=dt_bias, b=b, slot_tab=x["state_indices"])
            else:
                g, beta = gdn_gating(A_log, a, dt_bias, b)
                o, e = gdn_ring_verify(state, ring, x["q"], x["k"], x["v"], g, beta,
                                       slot_tab=x["state_indices"])
            ring_accept(ring, x["state_indices"], e, torch.full((2,), 3, dtype=torch.int32,
                                                                 device=DEVICE))
        outs.append((o, state, ring.u, ring.G, ring.k))
    for a_, b_ in zip(*outs):
        assert bitwise_equal(a_, b_)


@pytest.mark.parametrize("g_forget", [float("-inf"), -1e4, -60.0])
def test_ring_fully_forgetting_rows(g_forget):
    """Rows whose decay is (or rounds to) zero forget the history: the outputs and the state a
    ring means stay finite and within the fp32 tolerance of the exact protocol, a fold
    included."""
    B, S, HK, HV, kd, vd, K = 2, 3, 1, 2, 16, 16, 4
    gen = torch.Generator().manual_seed(77)
    base = gdn_inputs(77, B, HK, HV, kd, vd, rows=K, slots=S, dtype=torch.float32,
                      state_layout="kv")
    state = base["state"].transpose(-1, -2).contiguous()
    slots = base["state_indices"]
    ring = GdnRing.empty(S, HK, HV, kd, vd, length=8)
    plain = state.double().transpose(-1, -2).contiguous().cpu()
    for step in range(4):
        x = gdn_inputs(500 + step, B, HK, HV, kd, vd, rows=K, slots=S, dtype=torch.float32,
                       state_layout="kv")
        g = x["g"].clone()
        g[:, 1 + step % 2, :] = g_forget                  # one forgetting row per verify
        o, eng = gdn_ring_verify(state, ring, x["q"], x["k"], x["v"], g, x["beta"],
                                 slot_tab=slots)
        args = (x["q"].cpu(), x["k"].cpu(), x["v"].cpu(), g.cpu(), x["beta"].cpu(), slots.cpu())
        o_ref = ref_carry.decode_tokens(plain.clone(), *args)
        assert bool(torch.isfinite(o).all()), f"step {step}: non-finite outputs"
        _close(f"step {step} o vs exact protocol", o, o_ref, RING_TOLERANCE["float32"])
        acc = torch.randint(2, K + 1, (B,), generator=gen).to(torch.int32)
        ring_accept(ring, slots, eng, acc.to(DEVICE))
        for b in range(B):
            ref_carry.decode_tokens(plain, *(t[b:b + 1, :int(acc[b])] for t in args[:5]),
                                    slots[b:b + 1].cpu())
    kv = state.double().transpose(-1, -2).cpu()
    rnow = ref_ring.RefRing.from_ring(ring)
    for s in slots.tolist():
        _close(f"slot {s} H_P vs plain decoding", ref_ring.ring_state(kv[s], rnow, s), plain[s],
               RING_TOLERANCE["float32"])


def test_ring_padding_lane_and_other_slots_untouched():
    """A padding lane reads and writes nothing; slots not in the launch keep every bit."""
    state, ring, slots, *_ = _run(21, steps=3)
    before = state.clone(), ring.u.clone(), ring.k.clone(), ring.G.clone()
    x = gdn_inputs(99, 3, 2, 4, 16, 32, rows=4, slots=5, dtype=torch.float32, state_layout="kv")
    pad = torch.full((3,), -1, dtype=torch.int32, device=DEVICE)
    o, e = gdn_ring_verify(state, ring, x["q"], x["k"], x["v"], x["g"], x["beta"], slot_tab=pad)
    assert bool((o == 0).all()) and e.tolist() == [1, 1, 1]
    for a_, b_ in zip(before, (state, ring.u, ring.k, ring.G)):
        assert bitwise_equal(a_, b_)


def test_ring_flush_two_layers():
    """Two layers in one flush launch: each state becomes the state its ring means."""
    states, rings, plains = [], [], []
    for layer in range(2):
        state, ring, slots, plain, _ = _run(40 + layer, steps=3, padding=False)
        states.append(state)
        rings.append(ring)
        plains.append(plain)
    gdn_ring_flush(states, rings, slots)
    for state, plain in zip(states, plains):
        kv = state.double().transpose(-1, -2).cpu()
        for s in slots.tolist():
            _close(f"flushed slot {s}", kv[s], plain[s], RING_TOLERANCE["float32"])


def test_ring_reference_equals_plain_decoding():
    """The ring algebra in float64 equals plain decoding over random acceptance (1e-12)."""
    gen = torch.Generator().manual_seed(2)
    S, B, HK, HV, kd, vd, K = 4, 3, 1, 2, 8, 8, 4
    kv = torch.randn(S, HV, kd, vd, dtype=torch.float64, generator=gen) * 0.1
    plain, rref = kv.clone(), ref_ring.RefRing.zeros(S, HK, HV, kd, vd, 8)
    slots = torch.tensor([2, -1, 0])
    for _ in range(10):
        q, k = (torch.randn(B, K, HK, kd, dtype=torch.float64, generator=gen) for _ in "qk")
        v = torch.randn(B, K, HV, vd, dtype=torch.float64, generator=gen)
        g = -torch.rand(B, K, HV, dtype=torch.float64, generator=gen)
        beta = torch.rand(B, K, HV, dtype=torch.float64, generator=gen)
        o, e = ref_ring.verify(kv, rref, q, k, v, g, beta, slots)
        o_plain = ref_carry.decode_tokens(plain.clone(), q, k, v, g, beta, slots)
        assert float((o - o_plain).abs().max()) < 1e-12
        acc = torch.randint(0, K + 1, (B,), generator=gen)
        ref_ring.accept(rref, slots, e, acc)
        for b in range(B):
            if int(slots[b]) >= 0:
                a = int(acc[b])
                ref_carry.decode_tokens(plain, q[b:b + 1, :a], k[b:b + 1, :a], v[b:b + 1, :a],
                                        g[b:b + 1, :a], beta[b:b + 1, :a], slots[b:b + 1])
        for s in (0, 2):
            assert float((ref_ring.ring_state(kv[s], rref, s) - plain[s]).abs().max()) < 1e-12


def test_ring_bad_input_named_before_any_launch():
    """Out-of-range slots on the host, head sizes tl.dot cannot tile, a K-major state, K > R,
    a ring in another dtype: each a ValueError naming the argument."""
    x = gdn_inputs(0, 2, 1, 2, 16, 32, rows=3, slots=4, dtype=torch.float32, state_layout="kv")
    st = x["state"].transpose(-1, -2).contiguous()
    ring = GdnRing.empty(4, 1, 2, 16, 32, length=8)
    rows = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    for slots in ([0, 7], [4, 1], [-2, 0]):
        with pytest.raises(ValueError, match="^slot_tab"):     # free on the host, else validate
            gdn_ring_verify(st, ring, *rows, slot_tab=torch.tensor(slots, dtype=torch.int32,
                                                                   device=DEVICE),
                            validate=DEVICE.type != "cpu")
    with pytest.raises(ValueError, match="^k_dim: head size 24"):
        GdnRing.empty(4, 1, 2, 24, 24)
    with pytest.raises(ValueError, match="^length"):
        GdnRing.empty(4, 1, 2, 16, 32, length=8.0)
    with pytest.raises(ValueError, match="^v_dim: head size 40"):
        GdnRing.empty(4, 1, 2, 16, 40)
    with pytest.raises(ValueError, match="^k_dim: head size 24"):   # before sizing or allocating
        GdnRing.empty(10**12, 1, 2, 24, 32)
    with pytest.raises(ValueError, match="^k: head size 24"):       # a ring built from tensors
        GdnRing(k=torch.zeros(4, 1, 16, 24, device=DEVICE), u=ring.u, G=ring.G, len=ring.len,
                base=ring.base, length=8)
    with pytest.raises(ValueError, match="K-major"):
        gdn_ring_verify(x["state"], GdnRing.empty(4, 1, 2, 16, 32), *rows,
                        slot_tab=x["state_indices"])
    with pytest.raises(ValueError, match="^state_layout"):
        gdn_ring_verify(st, ring, *rows, slot_tab=x["state_indices"], state_layout="kv")
    with pytest.raises(ValueError, match="^ring: ring rows are"):
        gdn_ring_verify(st, GdnRing.empty(4, 1, 2, 16, 32, dtype=torch.bfloat16), *rows,
                        slot_tab=x["state_indices"])
    x9 = gdn_inputs(0, 2, 1, 2, 16, 32, rows=9, slots=4, dtype=torch.float32, state_layout="kv")
    with pytest.raises(ValueError, match="^q: K = 9"):
        gdn_ring_verify(st, GdnRing.empty(4, 1, 2, 16, 32, length=16), x9["q"], x9["k"],
                        x9["v"], x9["g"], x9["beta"], slot_tab=x9["state_indices"])
    if DEVICE.type == "cpu":
        bad = GdnRing.empty(4, 1, 2, 16, 32, length=8)
        bad.len.fill_(9)
        with pytest.raises(ValueError, match="^ring.len"):
            gdn_ring_verify(st, bad, *rows, slot_tab=x["state_indices"])


def test_ring_checks_found_by_a_fresh_trial():
    """A ring with no key heads, duplicate slots, an accept that would leave the window's length
    out of [0, R], more lanes than slots, non-finite rows under ``validate``: ValueErrors naming
    the argument before any launch (on the host whatever ``validate`` says, on a GPU with it)."""
    x = gdn_inputs(1, 2, 1, 2, 16, 32, rows=3, slots=4, dtype=torch.float32, state_layout="kv")
    st = x["state"].transpose(-1, -2).contiguous()
    rows = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=DEVICE)  # noqa: E731
    with pytest.raises(ValueError, match="^k: slots and heads"):
        GdnRing(k=z(4, 0, 16, 16), u=z(4, 2, 16, 32), G=z(4, 2, 16),
                len=z(4, dt=torch.int32), base=z(4, dt=torch.int32), length=8)
    check = DEVICE.type != "cpu"                   # on the host these checks cost nothing
    ring = GdnRing.empty(4, 1, 2, 16, 32, length=8)
    dup = torch.tensor([1, 1], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="^slot_tab: entries must be distinct"):
        gdn_ring_verify(st, ring, *rows, slot_tab=dup, validate=check)
    with pytest.raises(ValueError, match="^slot_tab: entries must be distinct"):
        gdn_ring_flush([st], [ring], dup, validate=check)
    slots = x["state_indices"]
    eng = torch.ones(2, dtype=torch.int32, device=DEVICE)
    for acc, what, k_rows in (([-5, 2], "^accepted", None), ([3, 9], "^accepted", None),
                            ([3, 2], "^rings\\[0\\].len after accept", None),
                            ([1, 3], "^accepted: .*\\[0, 2\\]", 2), ([1, 1], "^rows", 0)):
        ring.len.copy_(torch.tensor([1, 1, 1, 1] if k_rows is not None else [6, 6, 6, 6],
                                    dtype=torch.int32))
        before = ring.len.cpu().tolist()
        with pytest.raises(ValueError, match=what):
            ring_accept(ring, slots, eng, torch.tensor(acc, dtype=torch.int32, device=DEVICE),
                        rows=k_rows, validate=check)
        assert ring.len.cpu().tolist() == before, "nothing launched"
    with pytest.raises(ValueError, match="^engaged"):
        ring_accept(ring, slots, torch.tensor([0, 7], dtype=torch.int32, device=DEVICE),
                    torch.zeros(2, dtype=torch.int32, device=DEVICE), validate=check)
    six = torch.tensor([0, 1, 2, 3, -1, -1], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="^slot_tab: 6 sequences but only 4 slots"):
        ring_accept(ring, six, torch.ones(6, dtype=torch.int32, device=DEVICE),
                    torch.zeros(6, dtype=torch.int32, device=DEVICE))
    ring.len.zero_()
    q = x["q"].clone()
    q[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="^q: entries must be finite"):
        gdn_ring_verify(st, ring, q, *rows[1:], slot_tab=slots, validate=True)


def test_ring_launchers_refuse_aliased_buffers_and_mixed_layer_shapes():
    """What a ring launch writes may not share memory with what it reads or writes elsewhere
    (a race on a GPU), and one flush launch serves rings of one shape (it takes ``rings[0]``'s
    key heads and strides for every layer; the accept, which moves cursors only, takes any):
    ValueErrors naming the arguments, nothing written."""
    x = gdn_inputs(3, 2, 1, 2, 16, 32, rows=3, slots=4, dtype=torch.float32, state_layout="kv")
    st = x["state"].transpose(-1, -2).contiguous()
    ring = GdnRing.empty(4, 1, 2, 16, 32, length=8)
    slots = x["state_indices"]
    before = st.clone(), ring.u.clone()
    with pytest.raises(ValueError, match="^ring.u: shares memory with v"):
        gdn_ring_verify(st, ring, x["q"], x["k"], ring.u[:2, :, :3].transpose(1, 2), x["g"],
                        x["beta"], slot_tab=slots)
    with pytest.raises(ValueError, match="^states\\[0\\]: shares memory with states\\[1\\]"):
        gdn_ring_flush([st, st], [ring, GdnRing.empty(4, 1, 2, 16, 32, length=8)], slots)
    two_heads = GdnRing.empty(4, 2, 2, 16, 32, length=8)
    with pytest.raises(ValueError, match="^rings\\[1\\]: 2 key heads, rings\\[0\\] has 1"):
        gdn_ring_flush([st, st.clone()], [ring, two_heads], slots)
    lens = two_heads.len.clone()                 # the accept moves cursors only: any heads
    ring_accept([ring, two_heads], slots, torch.ones(2, dtype=torch.int32, device=DEVICE),
                torch.ones(2, dtype=torch.int32, device=DEVICE))
    moved = slots.long()
    assert two_heads.len[moved].tolist() == (lens[moved] + 1).tolist()
    with pytest.raises(ValueError, match="^rings\\[0\\].len: shares memory with accepted"):
        ring_accept(ring, slots, torch.ones(2, dtype=torch.int32, device=DEVICE), ring.len[:2])
    assert bitwise_equal(st, before[0]) and bitwise_equal(ring.u, before[1])
