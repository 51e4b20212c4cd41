"""Launchers that write more than one buffer refuse buffers that share memory, before any kernel
runs: outputs overlapping each other or an input the kernels still read (``_checks.apart``),
the arguments named. Views of one pool that do not overlap (two layers' slices, a slot row
holding a stash and a state) stay accepted and give the same bits as separate buffers.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab._checks import may_share_memory
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import GdnCarry, carry_accept, gdn_carry_flush, gdn_carry_verify
from pmll_lab.conv import ConvCarry, conv_carry_flush, conv_carry_verify, conv_chain, conv_update
from pmll_lab.gdn import gdn_chain, gdn_decode, gdn_decode_plan
from pmll_lab.inputs import conv_inputs, gdn_inputs, pmll_inputs
from pmll_lab.pmll import RingMemory, pmll_write


def _rows(seed, B=3, K=2, HK=2, HV=4, D=16, slots=5):
    return gdn_inputs(seed, B, HK, HV, D, D, rows=K, slots=slots, dtype=torch.float32,
                      state_layout="kv")


def _refused(match, fn, *watched):
    """``fn()`` raises ``ValueError`` matching ``match`` and leaves ``watched`` unchanged."""
    before = [t.clone() for t in watched]
    with pytest.raises(ValueError, match=match):
        fn()
    for t, b in zip(watched, before):
        assert bitwise_equal(t, b), "a refused launch wrote"


# ---- the case and the GDN decode/chain --------------------------------------------------

def test_snapshots_aliasing_the_state_pool_are_refused():
    """The snapshot buffer as a view of the state pool (``st[:3, None]``) made the chain write
    lane 0's snapshot over slot 2's state, which lane 1 then read: refused now, naming both."""
    torch.manual_seed(0)
    st = (torch.randn(5, 4, 16, 16) * .1).to(DEVICE)
    sl = torch.tensor([0, 2, 4], dtype=torch.int32, device=DEVICE)
    q, k = torch.randn(3, 2, 2, 16).to(DEVICE), torch.randn(3, 2, 2, 16).to(DEVICE)
    v = torch.randn(3, 2, 4, 16).to(DEVICE)
    g, beta = -torch.rand(3, 2, 4).to(DEVICE), torch.rand(3, 2, 4).to(DEVICE)
    _refused(r"^state: shares memory with intermediate", lambda: gdn_chain(
        st, q, k, v, g, beta, state_indices=sl, intermediate=st[:3, None], state_layout="kv"), st)


def test_decode_and_chain_refuse_a_state_over_their_inputs():
    x = _rows(1)
    st = x["state"]
    q = st.reshape(-1)[:x["q"].numel()].view(x["q"].shape)          # q read from the pool
    _refused(r"^state: shares memory with q", lambda: gdn_chain(
        st, q, x["k"], x["v"], x["g"], x["beta"], state_indices=x["state_indices"],
        state_layout="kv"), st)
    d = gdn_inputs(2, 3, 2, 4, 16, 16, slots=5, dtype=torch.float32, state_layout="kv")
    g = d["state"].reshape(-1)[:12].view(3, 4)
    _refused(r"^state: shares memory with g\b", lambda: gdn_decode(
        d["state"], d["q"], d["k"], d["v"], g, d["beta"], state_indices=d["state_indices"],
        state_layout="kv"),
        d["state"])
    inter = torch.zeros(3, 1, 4, 16, 16, device=DEVICE)
    v = inter.reshape(-1)[:x["v"].numel()].view(x["v"].shape)
    _refused(r"^intermediate: shares memory with v\b", lambda: gdn_chain(
        x["state"], x["q"], x["k"], v, x["g"], x["beta"], state_indices=x["state_indices"],
        intermediate=inter, state_layout="kv"), x["state"], inter)
    sl = x["state"].reshape(-1).view(torch.int32)[:3]              # slots read from the pool
    _refused(r"^state: shares memory with state_indices", lambda: gdn_chain(
        x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=sl,
        state_layout="kv"), x["state"])


def test_gating_inputs_and_plan_outputs_are_checked_too():
    d = gdn_inputs(3, 2, 1, 2, 16, 16, slots=3, dtype=torch.float32, state_layout="kv")
    st = d["state"]
    A_log = st.reshape(-1)[:2]
    _refused(r"^state: shares memory with A_log", lambda: gdn_decode(
        st, d["q"], d["k"], d["v"], A_log=A_log, a=d["g"], dt_bias=d["beta"][0], b=d["beta"],
        state_indices=d["state_indices"], state_layout="kv"), st)
    out = st.reshape(-1)[:2 * 2 * 16].view(2, 2, 16)
    _refused(r"^out: shares memory with state", lambda: gdn_decode_plan(
        st, d["q"], d["k"], d["v"], d["g"], d["beta"], state_indices=d["state_indices"],
        out=out, state_layout="kv"), st)


def test_views_of_one_pool_that_do_not_overlap_give_the_same_bits():
    """A pool ``[S, 2, HV, kd, vd]`` holding two layers' states side by side per slot and a
    snapshot buffer in another pool's other half: accepted, bitwise as separate buffers."""
    x = _rows(4)
    pool = torch.zeros(5, 2, 4, 16, 16, device=DEVICE)
    pool[:, 0] = x["state"]
    pool[:, 1] = x["state"] * 0.5
    snaps = torch.zeros(3, 2, 4, 16, 16, device=DEVICE)          # [B, 2 halves, ...]
    ref_state, ref_inter = x["state"].clone(), torch.zeros(3, 1, 4, 16, 16, device=DEVICE)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o_ref = gdn_chain(ref_state, *args, state_indices=x["state_indices"],
                      intermediate=ref_inter, state_layout="kv")
    o = gdn_chain(pool[:, 0], *args, state_indices=x["state_indices"],
                  intermediate=snaps[:, 1:2], state_layout="kv")
    assert bitwise_equal(o, o_ref) and bitwise_equal(pool[:, 0], ref_state)
    assert bitwise_equal(snaps[:, 1:2], ref_inter) and not snaps[:, 0].any()
    assert bitwise_equal(pool[:, 1], x["state"] * 0.5)          # the other layer untouched
    # and the q, k, v of one fused projection buffer may share memory (inputs only)
    fused = torch.cat([x["q"].flatten(2), x["k"].flatten(2), x["v"].flatten(2)], -1)
    q = fused[..., :32].unflatten(-1, (2, 16))
    k = fused[..., 32:64].unflatten(-1, (2, 16))
    v = fused[..., 64:].unflatten(-1, (4, 16))
    st = x["state"].clone()
    o2 = gdn_chain(st, q, k, v, x["g"], x["beta"], state_indices=x["state_indices"],
                   state_layout="kv")
    st_ref = x["state"].clone()
    assert bitwise_equal(o2, gdn_chain(st_ref, *args, state_indices=x["state_indices"],
                                       state_layout="kv"))
    assert bitwise_equal(st, st_ref)


# ---- the carried state -------------------------------------------------------------------------

def test_carry_verify_refuses_a_stash_or_pend_on_the_state():
    x = _rows(5)
    st = x["state"]
    width = GdnCarry.empty(5, 4, 16, 16, state_layout="kv").floats_per_slot
    flat = st.reshape(-1)
    buf = flat[:5 * width].view(5, width) if flat.numel() >= 5 * width else None
    if buf is None:                                  # the stash is wider: state inside it
        big = torch.zeros(5, width, device=DEVICE)
        carry = GdnCarry(big, torch.zeros(5, dtype=torch.int32, device=DEVICE), 4, 16, 16,
                         state_layout="kv")
        st = big.reshape(-1)[:st.numel()].view(st.shape).copy_(x["state"])
    else:
        carry = GdnCarry(buf, torch.zeros(5, dtype=torch.int32, device=DEVICE), 4, 16, 16,
                         state_layout="kv")
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    _refused(r"^state: shares memory with carry\.buf", lambda: gdn_carry_verify(
        st, carry, *args, slot_tab=x["state_indices"], state_layout="kv"), st)
    c = GdnCarry.empty(5, 4, 16, 16, state_layout="kv")
    pend_in_buf = GdnCarry(c.buf, c.buf.view(torch.int32)[0, :5], 4, 16, 16, state_layout="kv")
    _refused(r"^carry\.buf: shares memory with carry\.pend", lambda: gdn_carry_verify(
        x["state"], pend_in_buf, *args, slot_tab=x["state_indices"],
        state_layout="kv"), x["state"], c.buf)


def test_carry_flush_and_accept_refuse_shared_layers():
    x = _rows(6)
    st = x["state"]
    c0, c1 = GdnCarry.empty(5, 4, 16, 16,
                            state_layout="kv"), GdnCarry.empty(5, 4, 16, 16, state_layout="kv")
    sl = x["state_indices"]
    _refused(r"^states\[0\]: shares memory with states\[1\]", lambda: gdn_carry_flush(
        [st, st], [c0, c1], sl, state_layout="kv"), st)
    _refused(r"^carry\.pend\[0\]: shares memory with carry\.pend\[1\]", lambda: carry_accept(
        [c0, c0], sl, torch.full((3,), 2, dtype=torch.int32, device=DEVICE), [1, 1, 1]),
        c0.pend)
    engaged = c1.pend[:3]                                  # engaged read from a pend written
    _refused(r"^carry\.pend\[0\]: shares memory with engaged", lambda: carry_accept(
        [c1], sl, engaged, [1, 1, 1]), c1.pend)
    # one slot-major pool per layer holding state and stash side by side: accepted
    width = c0.floats_per_slot
    pool = torch.zeros(5, 4 * 16 * 16 + width, device=DEVICE)
    st_view = pool[:, :4 * 256].unflatten(1, (4, 16, 16))
    st_view.copy_(x["state"])
    carry = GdnCarry(pool[:, 4 * 256:], torch.zeros(5, dtype=torch.int32, device=DEVICE),
                     4, 16, 16, state_layout="kv")
    ref_st, ref_c = x["state"].clone(), GdnCarry.empty(5, 4, 16, 16, state_layout="kv")
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o, e = gdn_carry_verify(st_view, carry, *args, slot_tab=sl, state_layout="kv")
    o_ref, e_ref = gdn_carry_verify(ref_st, ref_c, *args, slot_tab=sl, state_layout="kv")
    assert bitwise_equal(o, o_ref) and bitwise_equal(carry.buf, ref_c.buf)


# ---- the conv twin -----------------------------------------------------------------------------

def _conv(seed, K=None):
    return conv_inputs(seed, 3, 64, rows=K, slots=5, dtype=torch.float32)


def test_conv_launchers_refuse_shared_windows():
    x = _conv(7)
    cs, w = x["conv_state"], x["weight"]
    xin = cs.reshape(-1)[:x["x"].numel()].view(x["x"].shape)
    _refused(r"^conv_state: shares memory with x\b", lambda: conv_update(
        cs, xin, w, x["bias"], state_indices=x["state_indices"]), cs)
    r = _conv(8, K=3)
    pool = torch.zeros(4000, device=DEVICE)                 # window and snapshots in one pool
    win = pool[:960].view(5, 64, 3).copy_(r["conv_state"])
    inter = pool[900:900 + 1152].view(3, 2, 64, 3)
    _refused(r"^conv_state: shares memory with intermediate", lambda: conv_chain(
        win, r["x"], r["weight"], r["bias"], state_indices=r["state_indices"],
        intermediate=inter), win)
    stash = pool[500:500 + 2560].view(5, 8, 64)
    carry = ConvCarry(stash, torch.zeros(5, dtype=torch.int32, device=DEVICE))
    _refused(r"^conv_state: shares memory with conv_carry\.stash", lambda: conv_carry_verify(
        win, carry, r["x"], r["weight"], r["bias"], slot_tab=r["state_indices"]), win)
    c = ConvCarry.like(r["conv_state"])
    _refused(r"^conv_states\[0\]: shares memory with conv_states\[1\]", lambda: conv_carry_flush(
        [r["conv_state"], r["conv_state"]], [c, ConvCarry.like(r["conv_state"])],
        r["state_indices"]), r["conv_state"])
    expanded = r["conv_state"][:1].expand(5, -1, -1)
    with pytest.raises(ValueError, match=r"^conv_state: its elements may share memory"):
        conv_update(expanded, x["x"], w, x["bias"], state_indices=x["state_indices"])


# ---- the PMLL ring ------------------------------------------------------------------------------

def test_ring_refuses_keys_values_and_new_rows_on_one_memory():
    x = pmll_inputs(9, 2, 1, 4, 16, gate="bt")
    k = torch.randn(2, 1, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"^mem\.k: shares memory with mem\.v"):
        RingMemory(k, k, torch.zeros(2, dtype=torch.int64, device=DEVICE))
    mem = RingMemory.empty(2, 1, 8, 16)
    k_new = mem.k[:, :, :4]                           # new rows read from the ring itself
    _refused(r"^mem\.k: shares memory with k_new", lambda: pmll_write(
        mem, k_new, x["v_new"], x["gate"]), mem.k, mem.v)


# ---- the overlap test itself --------------------------------------------------------------------

def _elements(t):
    """Every byte address of ``t``'s elements (brute force)."""
    base, e = t.data_ptr(), t.element_size()
    out = set()
    for ix in itertools.product(*[range(n) for n in t.shape]):
        o = base + e * sum(i * s for i, s in zip(ix, t.stride()))
        out.update(range(o, o + e))
    return out


def test_may_share_memory_never_misses_a_shared_element():
    """Random strided views of one buffer (as_strided, 1-3 dims, overlapping and interleaved
    strides, two element sizes): whenever two share a byte, ``may_share_memory`` says so."""
    rng = random.Random(0)
    buf = torch.zeros(4000)
    for _ in range(1500):
        views = []
        for dt in (torch.float32, rng.choice((torch.float32, torch.int16))):
            base = buf if dt == torch.float32 else buf.view(dt)
            nd = rng.randint(1, 3)
            views.append(base.as_strided([rng.randint(1, 5) for _ in range(nd)],
                                         [rng.choice((1, 2, 3, 7, 16, 40, 64, 100))
                                          for _ in range(nd)], rng.randint(0, 200)))
        a, b = views
        if _elements(a) & _elements(b):
            assert may_share_memory(a, b), (a.shape, a.stride(), b.shape, b.stride())


def test_may_share_memory_tells_apart_disjoint_views_of_one_pool():
    st = torch.zeros(5, 4, 16, 16)
    assert may_share_memory(st, st[:3, None]) and may_share_memory(st[1], st[:, 1])
    assert not may_share_memory(st[:, 0], st[:, 1])              # two heads of every slot
    assert not may_share_memory(st[1::2], st[0::2])              # odd and even slots
    pool = torch.zeros(6, 300)
    assert not may_share_memory(pool[:, :100], pool[:, 100:])    # state | stash per slot
    assert may_share_memory(pool[:, :101], pool[:, 100:200])
    assert not may_share_memory(pool[:, :100], torch.zeros(3))   # another allocation
    assert not may_share_memory(pool[:0], pool)                  # empty
    ints = pool.view(torch.int32)
    assert may_share_memory(ints[0, :5], pool[0]) and not may_share_memory(ints[1], pool[0])


def test_a_stack_whose_layers_share_a_buffer_is_refused():
    """``SpecDecodeStep`` writes every layer's state, stash and pend in a step: two layers on
    one state (or one carry) would fold each other's rows."""
    from pmll_lab.carry import CarryLayer, SpecDecodeStep

    x = _rows(10)
    st = x["state"]
    a = CarryLayer(state=st, carry=GdnCarry.empty(5, 4, 16, 16,
                                                  state_layout="kv"), state_layout="kv")
    b = CarryLayer(state=st, carry=GdnCarry.empty(5, 4, 16, 16,
                                                  state_layout="kv"), state_layout="kv")
    with pytest.raises(ValueError, match=r"^layers\[0\]\.state: shares memory with "
                                         r"layers\[1\]\.state"):
        SpecDecodeStep([a, b])
    c = CarryLayer(state=st.clone(), carry=a.carry, state_layout="kv")
    with pytest.raises(ValueError, match=r"^layers\[0\]\.carry\.buf: shares memory with "
                                         r"layers\[1\]\.carry\.buf"):
        SpecDecodeStep([a, c])
    SpecDecodeStep([a, CarryLayer(state=st.clone(), carry=GdnCarry.empty(5, 4, 16, 16,
                                                                         state_layout="kv"),
                                        state_layout="kv")])
