"""The conv carry twin: carried verify, accept and flush of conv windows (SPEC §3b, §3c).

``conv_carry_verify`` (eager and lazy, pending rows from 0 to CAP, several channel-block programs
per sequence) against the float64 protocol reference (``pmll_lab.reference.conv``); ``ConvCarry``
and ``conv_carry_flush`` over separately allocated layers; nothing written outside the views.
Tolerances: outputs relative L2 1e-5 in fp32, 8e-3 in bf16 (one bf16 rounding); windows and
stash rows bitwise (exact copies of the inputs).

Bitwise (SPEC §2 "Exactness"): carried verify + accept + flush == plain conv_update of the
accepted inputs (outputs of accepted rows, windows after flush); verify outputs == the plain
chain from the folded window.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.conv import (
    ConvCarry,
    conv_block_config,
    conv_carry_flush,
    conv_carry_verify,
    conv_chain,
    conv_update,
)
from pmll_lab.inputs import conv_inputs, generator
from pmll_lab.reference import conv as ref

from _conv_helpers import DIM_WIDE, HD, QK, QK_WIDE, _check_close, _guarded, _outside, _same, _tol


def _accept(carry, slot_tab, engaged, accepted):
    """Local pending update (SPEC §3b): pend = a after a write-back, else pend + a."""
    idx = slot_tab.long()
    acc = accepted.to(torch.int32)
    carry.pend[idx] = torch.where(engaged == 2, acc, carry.pend[idx] + acc)


# ---- carry verify vs the protocol reference ---------------------------------------------------

def _carry_setup(seed, B, S, dim, K, dtype, pend, *, cap=8, state_len=3):
    """Inputs, a guarded conv_state view and a guarded ConvCarry with random stash and ``pend``."""
    d = conv_inputs(seed, B, dim, rows=K, slots=S, state_len=state_len, dtype=dtype)
    gen = generator(seed + 1000)
    s_region = (slice(1, S + 1), slice(0, dim), slice(1, state_len + 1))
    big_s, state = _guarded(gen, (S, dim, state_len), s_region, dtype)
    state.copy_(d["conv_state"])
    t_region = (slice(1, S + 1), slice(1, cap + 1), slice(4, dim + 4))
    big_t, stash = _guarded(gen, (S, cap, dim), t_region, dtype)
    stash.copy_(torch.randn(S, cap, dim, generator=gen).to(dtype))
    p_region = (slice(2, S + 2),)
    big_p = torch.full((S + 4,), 77, dtype=torch.int32, device=DEVICE)
    pend_view = big_p[p_region]
    pend_view.copy_(torch.as_tensor(pend, dtype=torch.int32))
    carry = ConvCarry(stash, pend_view)
    guards = [(big_s, s_region), (big_t, t_region), (big_p, p_region)]
    return d, state, carry, [(b, r, _outside(b, r)) for b, r in guards]


def _guards_intact(guards):
    for big, region, before in guards:
        assert torch.equal(_outside(big, region), before), "write outside the buffer view"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("K,qk", [(3, QK_WIDE), (5, 0)])
def test_carry_verify_matches_protocol_reference(dtype, lazy, K, qk):
    """pend covers 0, small, p + K > CAP (write-back in both forms) and p = CAP; dim 512 runs
    several channel-block programs per sequence, so a write-back restarting the stash at row 0
    would expose a cross-program race in the (sequential) interpreter."""
    B, S, cap = 5, 8, 8
    pend = [0, 2, 4, 6, 8, 1, 3, 7]
    d, state, carry, guards = _carry_setup(50 + K, B, S, DIM_WIDE, K, dtype, pend, cap=cap)
    W, _, ROWS, _ = conv_block_config(DIM_WIDE, HD if qk else None)
    assert -(-DIM_WIDE // (W * ROWS)) >= 2
    slot_tab = torch.tensor([4, 0, 6, 3, 1], dtype=torch.int32, device=DEVICE)  # p = 8,0,3,6,2
    kw = dict(qk_channels=qk, head_dim=HD if qk else None)
    state0, stash0, pend0 = state.clone(), carry.stash.clone(), carry.pend.clone()
    y, engaged = conv_carry_verify(state, carry, d["x"], d["weight"], d["bias"], slot_tab=slot_tab,
                                   lazy=lazy, validate=True, **kw)
    y_ref, e_ref, s_ref, t_ref = ref.conv_carry_verify(
        state0, stash0, pend0, d["x"], d["weight"], d["bias"], slot_tab=slot_tab, lazy=lazy, **kw)
    assert engaged.dtype == torch.int32 and engaged.tolist() == e_ref.tolist()
    p = pend0[slot_tab.long()].tolist()
    expect = [2 if ((pi + K > cap) if lazy else pi > 0) else 1 for pi in p]
    assert engaged.tolist() == expect
    assert 2 in expect and (1 in expect)
    _check_close(y, y_ref, _tol(dtype), "y")
    _same(state, s_ref, "conv_state")
    _same(carry.stash, t_ref, "stash")
    assert torch.equal(carry.pend, pend0), "verify must leave pend to the caller"
    _guards_intact(guards)
    # outputs bitwise equal to conv_update from the folded window
    folded = [ref.conv_carry_flush([state0], [stash0], [pend0], slot_tab[b:b + 1])[0][int(slot_tab[b])]
              for b in range(B)]
    st = torch.stack(folded).to(dtype).to(DEVICE)
    y_plain = conv_chain(st, d["x"], d["weight"], d["bias"], **kw)
    assert bitwise_equal(y, y_plain), "carry outputs differ from the plain chain"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_carry_sequence_equals_plain_decoding(dtype):
    """Several steps of verify + accept over 2 layers (separately allocated), random K-row drafts,
    random acceptance a in 0..K, eager and lazy, a slot reset and reused, a mid-run flush; the
    outputs of accepted rows and the windows after the final flush equal plain conv_update of
    the accepted inputs, bitwise."""
    gen = generator(70)
    S, dim, SL, L, cap = 6, 320, 3, 2, 8
    kw = dict(qk_channels=QK, head_dim=HD)
    layers = []
    for layer in range(L):
        d = conv_inputs(71 + layer, S, dim, slots=S, state_len=SL, dtype=dtype)
        carry = ConvCarry.empty(S, dim, cap=cap, dtype=dtype)
        layers.append(dict(w=d["weight"], b=d["bias"], state=d["conv_state"].clone(),
                           plain=d["conv_state"].clone(), carry=carry))
    from pmll_lab.carry import carry_accept as shared_accept
    steps = 9
    for step in range(steps):
        B = int(torch.randint(1, S + 1, (1,), generator=gen))
        K = int(torch.randint(1, 5, (1,), generator=gen))
        lazy = bool(step % 2)
        slot_tab = torch.randperm(S, generator=gen)[:B].to(torch.int32).to(DEVICE)
        accepted = torch.randint(0, K + 1, (B,), generator=gen).to(DEVICE)
        if step == 3:
            accepted[0] = 0
        if step == 4:
            accepted[:] = K
        xs = torch.randn(B, K, dim, generator=gen).to(dtype).to(DEVICE)
        engaged = None
        for li, lay in enumerate(layers):
            x = xs if li == 0 else torch.roll(xs, 1, dims=-1)
            y, eng = conv_carry_verify(lay["state"], lay["carry"], x, lay["w"], lay["b"],
                                       slot_tab=slot_tab, lazy=lazy, validate=True, **kw)
            assert engaged is None or torch.equal(eng, engaged)
            engaged = eng
            for t in range(K):
                rows = (accepted > t).nonzero().flatten()
                if rows.numel() == 0:
                    break
                y_plain = conv_update(lay["plain"], x[rows, t], lay["w"], lay["b"],
                                      state_indices=slot_tab[rows], **kw)
                assert bitwise_equal(y[rows, t], y_plain), f"step {step} layer {li} row {t}"
        if step % 3 == 0:
            shared_accept([lay["carry"] for lay in layers], slot_tab, engaged, accepted, rows=K,
                          validate=True)
        else:
            for lay in layers:
                _accept(lay["carry"], slot_tab, engaged, accepted)
        assert int(layers[0]["carry"].pend.max()) <= cap
        if step == 5:   # mid-run flush of every slot, then clear pend
            all_slots = torch.arange(S, dtype=torch.int32, device=DEVICE)
            conv_carry_flush([lay["state"] for lay in layers], [lay["carry"] for lay in layers],
                             all_slots, validate=True)
            for lay in layers:
                lay["carry"].pend.zero_()
        if step == 6:   # a sequence ends: its slot is reset in both forms of the state
            slot = int(slot_tab[0])
            for lay in layers:
                lay["carry"].reset(slot)
                fresh = torch.randn(dim, SL, generator=gen).to(dtype).to(DEVICE)
                lay["state"][slot] = fresh
                lay["plain"][slot] = fresh
    all_slots = torch.arange(S, dtype=torch.int32, device=DEVICE)
    pends = [lay["carry"].pend.clone() for lay in layers]
    conv_carry_flush([lay["state"] for lay in layers], [lay["carry"] for lay in layers], all_slots)
    for li, lay in enumerate(layers):
        assert torch.equal(lay["carry"].pend, pends[li]), "flush must leave pend alone"
        assert bitwise_equal(lay["state"], lay["plain"]), f"layer {li}: windows after flush"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flush_over_separately_allocated_layers(dtype):
    S, dim, SL, L, cap = 6, DIM_WIDE, 4, 3, 8
    gen = generator(90)
    slot_tab = torch.tensor([5, 1, 2, 0], dtype=torch.int32, device=DEVICE)
    states, carries, guards = [], [], []
    for layer in range(L):
        pend = torch.randint(0, cap + 1, (S,), generator=gen).tolist()
        pend[1] = 0 if layer == 0 else cap       # p = 0 leaves the window; p = CAP folds all
        _, state, carry, g = _carry_setup(91 + layer, 4, S, dim, 1, dtype, pend, cap=cap,
                                          state_len=SL)
        states.append(state)
        carries.append(carry)
        guards += g
    before = [s.clone() for s in states]
    pends = [c.pend.clone() for c in carries]
    expect = ref.conv_carry_flush(before, [c.stash for c in carries], pends, slot_tab)
    conv_carry_flush(states, carries, slot_tab, validate=True)
    for layer in range(L):
        _same(states[layer], expect[layer], f"layer {layer} windows")
        assert torch.equal(carries[layer].pend, pends[layer])
        assert bitwise_equal(states[layer][3], before[layer][3])   # slot not in slot_tab
        assert bitwise_equal(states[layer][4], before[layer][4])
    assert bitwise_equal(states[0][1], before[0][1])               # p = 0
    assert not bitwise_equal(states[1][1], before[1][1])
    _guards_intact(guards)


def test_conv_carry_container():
    c = ConvCarry.empty(4, 40, cap=6, dtype=torch.float32)
    assert c.stash.shape == (4, 6, 40) and c.pend.dtype == torch.int32 and c.cap == 6
    assert c.stash_bytes_per_slot == 6 * 40 * 4 and c.nbytes == 4 * 6 * 40 * 4 + 16
    c.pend.copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    c.stash.fill_(1.5)
    c.reset([1, 3])
    assert c.pend.tolist() == [1, 0, 3, 0]
    assert float(c.stash[1].abs().sum()) == 0 and float(c.stash[0].min()) == 1.5
    c.reset(2)                                    # one int, as GdnCarry / RingMemory.reset
    c.reset(torch.tensor([0], device=c.pend.device))
    assert c.pend.tolist() == [0, 0, 0, 0] and float(c.stash[2].abs().sum()) == 0
    b = ConvCarry.empty(2, 16)
    assert b.dtype == torch.bfloat16 and b.stash_bytes_per_slot == 8 * 16 * 2


def test_flush_offset_table_keyed_on_element_size():
    """The conv flush's cached offset table must not be reused for tensors of another dtype at
    the same addresses (a caching allocator does that): element offsets differ by the element
    size."""
    from pmll_lab.ops.conv.carry import offset_table

    arena = torch.empty(4096, dtype=torch.uint8, device=DEVICE)
    f32 = [arena[0:1024].view(torch.float32), arena[2048:3072].view(torch.float32)]
    b16 = [arena[0:1024].view(torch.bfloat16), arena[2048:3072].view(torch.bfloat16)]
    t32 = offset_table([f32, f32, f32], DEVICE)
    t16 = offset_table([b16, b16, b16], DEVICE)
    assert t32.tolist() == [0, 512] * 3
    assert t16.tolist() == [0, 1024] * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_carry_like_follows_the_state(dtype):
    """``ConvCarry.like(conv_state)``: slots, dim, dtype and device of the state, so an fp32
    conv state gets an fp32 stash (``empty`` defaults to bf16 and the verify refuses the mix,
    naming the way out). The carry then verifies as the plain chain (pend 0: bitwise)."""
    c = conv_inputs(91, 2, 64, rows=3, slots=3, dtype=dtype)
    carry = ConvCarry.like(c["conv_state"], cap=4)
    assert carry.stash.shape == (3, 4, 64) and carry.stash.dtype == dtype
    assert carry.stash.device == c["conv_state"].device and carry.pend.tolist() == [0, 0, 0]
    slot_tab = c["state_indices"]
    y, eng = conv_carry_verify(c["conv_state"].clone(), carry, c["x"], c["weight"], c["bias"],
                               slot_tab=slot_tab)
    y_plain = conv_chain(c["conv_state"].clone(), c["x"], c["weight"], c["bias"],
                         state_indices=slot_tab)
    assert bitwise_equal(y, y_plain) and eng.tolist() == [1, 1]
    if dtype == torch.float32:
        with pytest.raises(ValueError, match=r"^conv_carry: .*ConvCarry.like\(conv_state\)"):
            conv_carry_verify(c["conv_state"], ConvCarry.empty(3, 64), c["x"], c["weight"],
                              c["bias"], slot_tab=slot_tab)
    with pytest.raises(ValueError, match="^conv_state"):
        ConvCarry.like(c["conv_state"][0])
