"""Slot tables out of range are refused naming the argument, never a memory error.

On the CPU (the slot tables in host memory, where checking them is free) every launcher that
takes a slot table checks its range whatever ``validate`` says, and the pending counts its
kernels fold by (``pend <= CAP``), and a ring's counts (``>= 0``); ``-1`` stays a padding lane.
On a GPU the contract is ``validate=True`` (a sync), so there these cases are called with it.
Each call runs in this process: before, ``gdn_decode(..., state_indices=[0, 7])`` with 4 slots
ended the process with a segmentation fault.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import GdnCarry, carry_accept, gdn_carry_flush, gdn_carry_verify
from pmll_lab.carry import gdn_carry_verify_plan
from pmll_lab.conv import ConvCarry, conv_carry_flush, conv_carry_verify, conv_chain, conv_update
from pmll_lab.gdn import gdn_chain, gdn_chain_plan, gdn_decode, gdn_decode_plan
from pmll_lab.inputs import conv_inputs, gdn_inputs, pmll_inputs
from pmll_lab.pmll import RingMemory, pmll_read, pmll_write

HOST = DEVICE.type == "cpu"
V = {} if HOST else {"validate": True}
"""On the host no ``validate`` is needed; on a GPU the same cases need ``validate=True``."""


def _slots(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _refused(match, fn, *watched):
    before = [t.clone() for t in watched]
    with pytest.raises(ValueError, match=match):
        fn()
    for t, b in zip(watched, before):
        assert bitwise_equal(t, b), "a refused launch wrote"


@pytest.mark.parametrize("bad", [7, 4, -2], ids=["far", "one-past", "below-padding"])
def test_decode_and_chain_slots_out_of_range(bad):
    d = gdn_inputs(1, 2, 1, 2, 16, 16, slots=4, dtype=torch.float32)
    r = gdn_inputs(2, 2, 1, 2, 16, 16, rows=2, slots=4, dtype=torch.float32)
    st = d["state"]
    dec = (d["q"], d["k"], d["v"], d["g"], d["beta"])
    chain = (r["q"], r["k"], r["v"], r["g"], r["beta"])
    msg = r"^{}: entries must lie in \[0, 4\)"
    _refused(msg.format("state_indices"),
             lambda: gdn_decode(st, *dec, state_indices=_slots(0, bad), **V), st)
    _refused(msg.format("state_indices"),
             lambda: gdn_chain(st, *chain, state_indices=_slots(bad, 1), **V), st)
    _refused(msg.format("out_state_indices"),
             lambda: gdn_decode(st, *dec, state_indices=_slots(0, 1),
                                out_state_indices=_slots(2, bad), **V), st)
    _refused(msg.format("state_indices"),
             lambda: gdn_decode_plan(st, *dec, state_indices=_slots(0, bad), **V), st)
    _refused(msg.format("state_indices"),
             lambda: gdn_chain_plan(st, *chain, state_indices=_slots(0, bad), **V), st)
    # -1 is a padding lane, in range
    o = gdn_decode(st, *dec, state_indices=_slots(2, -1), **V)
    assert not o[1].any() and o[0].abs().sum() > 0


def test_carry_slots_and_pending_counts_out_of_range():
    x = gdn_inputs(3, 2, 1, 2, 16, 16, rows=2, slots=3, dtype=torch.float32)
    st, rows = x["state"], (x["q"], x["k"], x["v"], x["g"], x["beta"])
    c = GdnCarry.empty(3, 2, 16, 16)
    _refused(r"^slot_tab: entries must lie in \[0, 3\)",
             lambda: gdn_carry_verify(st, c, *rows, slot_tab=_slots(0, 5), **V), st, c.buf)
    _refused(r"^slot_tab: entries must lie in \[0, 3\)",
             lambda: gdn_carry_verify_plan(st, c, *rows, slot_tab=_slots(3, 0), **V), st)
    _refused(r"^slot_tab: entries must lie in \[0, 3\)",
             lambda: gdn_carry_flush([st], [c], _slots(0, 9), **V), st)
    _refused(r"^slot_tab: entries must lie in \[0, 3\)",
             lambda: carry_accept(c, _slots(0, 3), _slots(1, 1), [1, 1], **V), c.pend)
    c.pend[1] = 9                          # more pending rows than the stash holds (CAP 8)
    _refused(r"^carry\.pend: entries must lie in \[0, 8\]",
             lambda: gdn_carry_verify(st, c, *rows, slot_tab=_slots(1, 0), **V), st, c.buf)
    _refused(r"^carries\[0\]\.pend: entries must lie in \[0, 8\]",
             lambda: gdn_carry_flush([st], [c], _slots(1), **V), st)
    c.pend[1] = 0
    o, e = gdn_carry_verify(st, c, *rows, slot_tab=_slots(1, -1), **V)
    assert not o[1].any() and e.tolist() == [1, 1]


def test_conv_slots_and_pending_counts_out_of_range():
    x = conv_inputs(4, 2, 64, slots=3, dtype=torch.float32)
    r = conv_inputs(5, 2, 64, rows=2, slots=3, dtype=torch.float32)
    cs, w, b = x["conv_state"], x["weight"], x["bias"]
    _refused(r"^state_indices: entries must lie in \[0, 3\)",
             lambda: conv_update(cs, x["x"], w, b, state_indices=_slots(0, 3), **V), cs)
    _refused(r"^state_indices: entries must lie in \[0, 3\)",
             lambda: conv_chain(cs, r["x"], w, b, state_indices=_slots(-3, 0), **V), cs)
    c = ConvCarry.like(cs)
    _refused(r"^slot_tab: entries must lie in \[0, 3\)",
             lambda: conv_carry_verify(cs, c, r["x"], w, b, slot_tab=_slots(0, 4), **V), cs)
    _refused(r"^slot_tab: entries must lie in \[0, 3\)",
             lambda: conv_carry_flush([cs], [c], _slots(4), **V), cs)
    c.pend[0] = 12
    _refused(r"^conv_carry\.pend: entries must lie in \[0, 8\]",
             lambda: conv_carry_verify(cs, c, r["x"], w, b, slot_tab=_slots(0, 1), **V), cs)
    _refused(r"^conv_carries\[0\]\.pend: entries must lie in \[0, 8\]",
             lambda: conv_carry_flush([cs], [c], _slots(0), **V), cs)


def test_ring_counts_below_zero():
    x = pmll_inputs(6, 2, 1, 3, 16)
    mem = RingMemory.empty(2, 1, 8, 16)
    mem.count[1] = -3                      # the counts decide the slots read and written
    if HOST:
        with pytest.raises(ValueError, match=r"^mem\.count: must be >= 0"):
            pmll_read(mem)
    _refused(r"^mem\.count: must be >= 0",
             lambda: pmll_write(mem, x["k_new"], x["v_new"], validate=True), mem.k, mem.v)
