"""Padding lanes (slot -1, SPEC §2 "Serving conventions") in every GDN launcher, both layouts.

A serving engine pads a batch to a captured graph size with lanes whose slot is -1. Such a lane
reads and writes nothing (state, snapshots, stash, ``pend``), its outputs are zeros; every live
lane gives the bits it gives without the padding lane. The states and stash live inside larger
sentinel-filled buffers, so a write through slot -1 (just before slot 0) shows up.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import GdnCarry, carry_accept, gdn_carry_flush, gdn_carry_verify
from pmll_lab.gdn import gdn_chain, gdn_decode
from pmll_lab.inputs import gdn_inputs

S, HK, HV, KD, VD = 4, 1, 2, 16, 24
SLOTS_PAD = [2, -1, 0]          # lane 1 is padding
LIVE = [0, 2]                   # its live lanes


def _guarded(t: torch.Tensor):
    """``t`` copied into the middle of a sentinel buffer one slot larger on each side."""
    big = torch.full((t.shape[0] + 2, *t.shape[1:]), 777.0, dtype=t.dtype, device=t.device)
    big[1:-1] = t
    return big[1:-1], big


def _state(seed, layout):
    st = gdn_inputs(seed, 1, HK, HV, KD, VD, slots=S, dtype=torch.float32,
                    state_layout="kv")["state"]
    return st if layout == "kv" else st.transpose(-1, -2).contiguous()


def _rows(x, lanes):
    sel = torch.tensor(lanes, device=DEVICE)
    return [x[n][sel].contiguous() for n in ("q", "k", "v", "g", "beta")]


def _idx(slots):
    return torch.tensor(slots, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("K", [1, 3])
def test_decode_and_chain_padding_lane(layout, K):
    x = gdn_inputs(21, 3, HK, HV, KD, VD, rows=K, dtype=torch.bfloat16, state_layout="kv")
    st0 = _state(22, layout)
    a, big = _guarded(st0)
    b = st0.clone()
    live_idx = _idx([SLOTS_PAD[i] for i in LIVE])
    if K == 1:
        args = [t[:, 0].contiguous() for t in _rows(x, [0, 1, 2])]
        o = gdn_decode(a, *args, state_indices=_idx(SLOTS_PAD), validate=True, state_layout=layout)
        want = gdn_decode(b, *[t[LIVE] for t in args], state_indices=live_idx, state_layout=layout)
    else:
        inter = torch.full((3, K - 1, *st0.shape[1:]), 5.0, device=DEVICE)
        o = gdn_chain(a, *_rows(x, [0, 1, 2]), state_indices=_idx(SLOTS_PAD), intermediate=inter,
                      validate=True, state_layout=layout)
        inter2 = torch.empty(2, K - 1, *st0.shape[1:], device=DEVICE)
        want = gdn_chain(b, *_rows(x, LIVE), state_indices=live_idx, intermediate=inter2,
                         state_layout=layout)
        assert bitwise_equal(inter[LIVE], inter2), "live snapshots"
        assert bool((inter[1] == 5.0).all()), "a padding lane wrote snapshots"
    assert bitwise_equal(o[LIVE], want), "live outputs changed by the padding lane"
    assert bool((o[1] == 0).all()), "padding lane outputs must be zeros"
    assert bitwise_equal(a, b), "states"
    assert bool((big[0] == 777.0).all()) and bool((big[-1] == 777.0).all()), "guard written"


def _carry(seed, layout):
    """A GdnCarry for a ``layout`` pool with random stash rows and pend, inside sentinel
    buffers."""
    W = 8 * (HV * VD + HV + HV * KD)
    big = torch.full((S + 2, W), 555.0, device=DEVICE)
    bigp = torch.full((S + 2,), 99, dtype=torch.int32, device=DEVICE)
    c = GdnCarry(big[1:-1], bigp[1:-1], HV, KD, VD, state_layout=layout)
    gen = torch.Generator().manual_seed(seed)
    c.u.copy_(torch.randn(c.u.shape, generator=gen) * 0.3)
    c.g.copy_(-F.softplus(torch.randn(c.g.shape, generator=gen)))
    k = torch.randn(c.k.shape, generator=gen)
    c.k.copy_(k / k.norm(dim=-1, keepdim=True))
    c.pend.copy_(torch.tensor([3, 1, 5, 2], dtype=torch.int32))
    return c, big, bigp


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("form,lazy", [("exact", False), ("exact", True)])
def test_carry_verify_accept_flush_padding_lane(layout, form, lazy):
    K = 4                        # lazy: slot 2 (pend 5) writes back, slot 0 (pend 3) does not
    x = gdn_inputs(31, 3, HK, HV, KD, VD, rows=K, dtype=torch.float32, state_layout="kv")
    st0 = _state(32, layout)
    a, big = _guarded(st0)
    b = st0.clone()
    ca, cbig, cpbig = _carry(33, layout)
    cb = GdnCarry(ca.buf.clone(), ca.pend.clone(), HV, KD, VD, state_layout=layout)
    o, eng = gdn_carry_verify(a, ca, *_rows(x, [0, 1, 2]), slot_tab=_idx(SLOTS_PAD), form=form,
                              lazy=lazy, validate=True, state_layout=layout)
    live_idx = _idx([SLOTS_PAD[i] for i in LIVE])
    want, eng2 = gdn_carry_verify(b, cb, *_rows(x, LIVE), slot_tab=live_idx, form=form,
                                  lazy=lazy, state_layout=layout)
    assert bitwise_equal(o[LIVE], want) and bitwise_equal(eng[LIVE], eng2)
    assert bool((o[1] == 0).all()) and int(eng[1]) == 1
    assert bitwise_equal(a, b) and bitwise_equal(ca.buf, cb.buf) and bitwise_equal(ca.pend, cb.pend)
    acc = torch.tensor([2, 3, 4], dtype=torch.int32, device=DEVICE)
    carry_accept(ca, _idx(SLOTS_PAD), eng, acc, rows=K, validate=True)
    carry_accept(cb, live_idx, eng2, acc[LIVE].contiguous(), rows=K)
    assert bitwise_equal(ca.pend, cb.pend), "accept touched a pend through the padding lane"
    gdn_carry_flush([a], [ca], _idx(SLOTS_PAD), validate=True, state_layout=layout)
    gdn_carry_flush([b], [cb], live_idx, state_layout=layout)
    assert bitwise_equal(a, b), "flush"
    for t, fill in ((big, 777.0), (cbig, 555.0), (cpbig, 99)):
        assert bool((t[0] == fill).all()) and bool((t[-1] == fill).all()), "guard written"


def test_only_minus_one_is_padding():
    x = gdn_inputs(41, 2, HK, HV, KD, VD, dtype=torch.float32, state_layout="kv")
    st = _state(42, "kv")
    for bad in ([-2, 0], [0, S]):
        with pytest.raises(ValueError, match="state_indices"):
            gdn_decode(st, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=_idx(bad),
                       validate=True, state_layout="kv")
    with pytest.raises(ValueError, match="state_indices"):      # live slots stay distinct
        gdn_decode(st, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=_idx([1, 1]),
                   validate=True, state_layout="kv")
    gdn_decode(st, x["q"], x["k"], x["v"], x["g"], x["beta"], state_indices=_idx([-1, -1]),
               validate=True, state_layout="kv")     # several padding lanes are fine
