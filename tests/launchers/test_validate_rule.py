"""``validate=True`` means one thing in every launcher (the rule: ``pmll_lab._checks``).

Each launcher taking ``validate`` (GDN decode and chain and their plans, the carried-state
verify and flush, the ring form's verify and flush, the conv launchers, ``pmll_write`` and
``pmll_step``) is called with a NaN in a float input, and with an infinity in the state it
reads (a live slot's state, conv window, pending stash row, ring row or PMLL ring row): each is
refused with a ``ValueError`` naming the argument before anything is written, and without a
warning from the interpreter. A padding lane's rows are never read, so a NaN there passes;
``g = -inf`` (a row that forgets the history) passes as well. On the host (these CPU runs) a
slot table with a live slot twice is refused whatever ``validate`` says, as one out of range.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import (ConvCarry, GdnCarry, GdnRing, carry_accept, conv_carry_flush,
                            conv_carry_verify, gdn_carry_flush, gdn_carry_verify,
                            gdn_carry_verify_plan, gdn_ring_flush, gdn_ring_verify, ring_accept)
from pmll_lab.conv import conv_chain, conv_update
from pmll_lab.gdn import gdn_chain, gdn_chain_plan, gdn_decode, gdn_decode_plan
from pmll_lab.inputs import conv_inputs, gdn_inputs, pmll_inputs
from pmll_lab.pmll import RingMemory, pmll_step, pmll_write

B, S, HK, HV, D, K, DIM = 2, 3, 1, 2, 16, 2, 32
ROWS = ("q", "k", "v", "g", "beta")
HOST = DEVICE.type == "cpu"


def _slots(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _gdn(seed, rows=K):
    return gdn_inputs(seed, B, HK, HV, D, D, rows=rows, slots=S, dtype=torch.float32)


def _stash(S_, seed, pend=1, layout="vk"):
    c = GdnCarry.empty(S_, HV, D, D, state_layout=layout)
    gen = torch.Generator().manual_seed(seed)
    c.u.copy_(torch.randn(c.u.shape, generator=gen) * 0.1)
    c.g.copy_(-torch.rand(c.g.shape, generator=gen))
    c.k.copy_(torch.nn.functional.normalize(torch.randn(c.k.shape, generator=gen), dim=-1))
    c.pend.fill_(pend)
    return c


def _conv(seed, rows=None):
    return conv_inputs(seed, B, DIM, rows=rows, slots=S, dtype=torch.float32)


# One case per launcher: ``build(seed)`` returns the call's tensors as a dict (the names the
# refusals use), ``call(t, validate)`` runs the launcher on them.

def _decode_case(plan=False):
    def build(seed):
        x = _gdn(seed, rows=None)
        return dict(x, state=x["state"].clone())

    def call(t, validate):
        fn = gdn_decode_plan if plan else gdn_decode
        out = fn(t["state"], *(t[n] for n in ROWS), state_indices=t["state_indices"],
                 validate=validate)
        return out() if plan else out
    return build, call


def _chain_case(plan=False):
    def build(seed):
        x = _gdn(seed)
        return dict(x, state=x["state"].clone())

    def call(t, validate):
        fn = gdn_chain_plan if plan else gdn_chain
        out = fn(t["state"], *(t[n] for n in ROWS), state_indices=t["state_indices"],
                 validate=validate)
        return out() if plan else out
    return build, call


def _carry_case(plan=False):
    def build(seed):
        x = _gdn(seed)
        return dict(x, state=x["state"].clone(), carry=_stash(S, seed + 1))

    def call(t, validate):
        fn = gdn_carry_verify_plan if plan else gdn_carry_verify
        out = fn(t["state"], t["carry"], *(t[n] for n in ROWS), slot_tab=t["state_indices"],
                 validate=validate)
        return out() if plan else out
    return build, call


def _ring_case():
    def build(seed):
        x = _gdn(seed)
        return dict(x, state=x["state"].clone(), ring=GdnRing.empty(S, HK, HV, D, D, length=8))

    def call(t, validate):
        return gdn_ring_verify(t["state"], t["ring"], *(t[n] for n in ROWS),
                               slot_tab=t["state_indices"], validate=validate)
    return build, call


def _conv_update_case():
    def build(seed):
        x = _conv(seed)
        return dict(x, conv_state=x["conv_state"].clone())

    def call(t, validate):
        return conv_update(t["conv_state"], t["x"], t["weight"], t["bias"],
                           state_indices=t["state_indices"], validate=validate)
    return build, call


def _conv_chain_case():
    def build(seed):
        x = _conv(seed, rows=K)
        return dict(x, conv_state=x["conv_state"].clone())

    def call(t, validate):
        return conv_chain(t["conv_state"], t["x"], t["weight"], t["bias"],
                          state_indices=t["state_indices"], validate=validate)
    return build, call


def _conv_carry_case():
    def build(seed):
        x = _conv(seed, rows=K)
        c = ConvCarry.empty(S, DIM, dtype=torch.float32)
        c.stash.copy_(torch.randn(c.stash.shape, generator=torch.Generator().manual_seed(seed)))
        c.pend.fill_(1)
        return dict(x, conv_state=x["conv_state"].clone(), conv_carry=c)

    def call(t, validate):
        return conv_carry_verify(t["conv_state"], t["conv_carry"], t["x"], t["weight"],
                                 t["bias"], slot_tab=t["state_indices"], validate=validate)
    return build, call


def _pmll_case(step):
    def build(seed):
        x = pmll_inputs(seed, B, 2, 3, D, gate="bt")
        mem = RingMemory.empty(B, 2, 5, D)
        first = pmll_inputs(seed + 1, B, 2, 3, D)             # a ring holding one segment
        pmll_write(mem, first["k_new"], first["v_new"])
        return dict(x, mem=mem, **{"mem.k": mem.k, "mem.v": mem.v})

    def call(t, validate):
        if step:
            return pmll_step(t["mem"], t["q"], t["k_new"], t["v_new"], t["gate"],
                             validate=validate, impl="reference")
        return pmll_write(t["mem"], t["k_new"], t["v_new"], t["gate"], validate=validate)
    return build, call


# (launcher, case, float input given a NaN, state given an inf, slot-indexed?)
CASES = {
    "gdn_decode": (_decode_case(), "q", "state", True),
    "gdn_decode_plan": (_decode_case(plan=True), "k", "state", True),
    "gdn_chain": (_chain_case(), "v", "state", True),
    "gdn_chain_plan": (_chain_case(plan=True), "q", "state", True),
    "gdn_carry_verify": (_carry_case(), "q", "state", True),
    "gdn_carry_verify_plan": (_carry_case(plan=True), "k", "state", True),
    "gdn_ring_verify": (_ring_case(), "q", "state", True),
    "conv_update": (_conv_update_case(), "x", "conv_state", True),
    "conv_chain": (_conv_chain_case(), "x", "conv_state", True),
    "conv_carry_verify": (_conv_carry_case(), "weight", "conv_state", True),
    "pmll_write": (_pmll_case(step=False), "k_new", "mem.k", False),
    "pmll_step": (_pmll_case(step=True), "q", "mem.v", False),
}


def _written(t):
    return {n: v.clone() for n, v in t.items() if isinstance(v, torch.Tensor)}


def _refused(call, t, match):
    before = _written(t)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)   # no interpreter warning: refused first
        with pytest.raises(ValueError, match=match):
            call(t, True)
    for n, v in before.items():
        assert bitwise_equal(t[n], v), f"a refused call wrote {n}"


@pytest.mark.parametrize("name", list(CASES))
def test_validate_refuses_a_nan_input_and_an_infinite_state(name):
    (build, call), row_input, state, slotted = CASES[name]
    t = build(11)
    t[row_input] = t[row_input].clone()
    t[row_input].view(-1)[-1] = float("nan")
    _refused(call, t, rf"^{row_input}: entries must be finite, found nan")
    call(t, False)                       # the values are validate's: without it, no check

    t = build(12)
    slot = int(t["state_indices"][1]) if slotted else 1
    t[state][slot].view(-1)[3] = float("inf")
    where = f"slot {slot}" if slotted else f"sequence {slot}"
    _refused(call, t, rf"^{state}: {where} holds a non-finite value \(inf\)")


@pytest.mark.parametrize("name", ["gdn_decode", "gdn_chain", "gdn_carry_verify",
                                  "gdn_ring_verify", "conv_chain"])
def test_padding_lane_rows_are_not_checked(name):
    """A padding lane's rows are never read: a NaN there passes ``validate``, and so does a
    non-finite state in a slot no lane reads."""
    (build, call), row_input, state, _ = CASES[name]
    t = build(21)
    t["state_indices"] = t["state_indices"].clone()
    t["state_indices"][0] = -1
    t[row_input] = t[row_input].clone()
    t[row_input][0] = float("nan")
    unread = ({0, 1, 2} - set(t["state_indices"].tolist())).pop()
    t[state][unread] = float("inf")
    out = call(t, True)
    o = out[0] if isinstance(out, tuple) else out
    assert bool(torch.isfinite(o[1]).all()) and not o[0].any()


def test_a_forgetting_row_passes_validate():
    """``g = -inf`` (``exp(g) = 0``: the row forgets the history) is in ``g``'s range; every
    other infinity in an input is refused."""
    x = _gdn(31, rows=None)
    g = x["g"].clone()
    g[0, 0] = float("-inf")
    o = gdn_decode(x["state"].clone(), x["q"], x["k"], x["v"], g, x["beta"],
                   state_indices=x["state_indices"], validate=True)
    assert bool(torch.isfinite(o).all())
    with pytest.raises(ValueError, match=r"^g: entries must lie in \[-inf, 0.0\], found nan"):
        gdn_decode(x["state"].clone(), x["q"], x["k"], x["v"], g.fill_(float("nan")),
                   x["beta"], state_indices=x["state_indices"], validate=True)


def test_gating_inputs_and_pending_rows_are_checked():
    """The gating computed in the kernel: a NaN in ``a`` or an infinity in ``A_log`` is refused
    naming it; a pending stash row holding a NaN (the rows the verify folds) is refused naming
    the carry, a row past the pending ones is not read and not checked."""
    x = _gdn(41)
    gen = torch.Generator().manual_seed(42)
    gv = dict(A_log=torch.rand(HV, generator=gen), a=torch.randn(B, K, HV, generator=gen),
              dt_bias=torch.zeros(HV), b=torch.randn(B, K, HV, generator=gen))
    gv = {n: t.to(DEVICE) for n, t in gv.items()}
    rows = (x["q"], x["k"], x["v"])
    for bad, value in (("a", float("nan")), ("A_log", float("inf"))):
        kw = dict(gv, **{bad: gv[bad].clone()})
        kw[bad].view(-1)[0] = value
        with pytest.raises(ValueError, match=rf"^{bad}: entries must be finite"):
            gdn_chain(x["state"].clone(), *rows, **kw, state_indices=x["state_indices"],
                      validate=True)
    slot = int(x["state_indices"][0])
    c = _stash(S, 43, pend=1)
    c.u[slot, 1] = float("nan")                      # past pend = 1: never read
    gdn_carry_verify(x["state"].clone(), c, *rows, x["g"], x["beta"],
                     slot_tab=x["state_indices"], validate=True)
    c = _stash(S, 44, pend=2)
    c.k[slot, 1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=rf"^carry: slot {slot}'s pending row 1 holds a "
                                         r"non-finite value \(nan\)"):
        gdn_carry_verify(x["state"].clone(), c, *rows, x["g"], x["beta"],
                         slot_tab=x["state_indices"], validate=True)
    with pytest.raises(ValueError, match=rf"^carries\[0\]: slot {slot}'s pending row 1"):
        gdn_carry_flush([x["state"].clone()], [c], x["state_indices"], validate=True)


def test_flushes_refuse_an_infinite_state_or_row():
    x = _gdn(51)
    slots = x["state_indices"]
    slot = int(slots[1])
    st = x["state"].clone()
    st[slot, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=rf"^states\[0\]: slot {slot} holds a non-finite"):
        gdn_carry_flush([st], [_stash(S, 52)], slots, validate=True)
    ring = GdnRing.empty(S, HK, HV, D, D, length=8)
    with pytest.raises(ValueError, match=rf"^states\[0\]: slot {slot} holds a non-finite"):
        gdn_ring_flush([st], [ring], slots, validate=True)
    ring.len[slot] = 2
    ring.u[slot, 0, 1, 0] = float("nan")             # row 1 of the window [0, 2)
    with pytest.raises(ValueError, match=rf"^rings\[0\]: slot {slot}'s row 1 holds a "
                                         r"non-finite value \(nan\)"):
        gdn_ring_flush([x["state"].clone()], [ring], slots, validate=True)
    c = _conv(53, rows=K)
    cc = ConvCarry.empty(S, DIM, dtype=torch.float32)
    cc.pend.fill_(1)
    cc.stash[slot, 0, 5] = float("nan")
    with pytest.raises(ValueError, match=rf"^conv_carries\[0\]: slot {slot}'s pending row 0"):
        conv_carry_flush([c["conv_state"].clone()], [cc], c["state_indices"], validate=True)


@pytest.mark.skipif(not HOST, reason="slot tables in host memory: a CPU run")
def test_duplicate_slots_on_the_host_are_refused_without_validate():
    """Like a slot out of range, a live slot twice in one launch is refused on the host whatever
    ``validate`` says (free there); padding lanes (-1) may repeat. Nothing is written."""
    x, c = _gdn(61), _conv(62, rows=K)
    dup, pads = _slots(1, 1), _slots(-1, -1)
    st = x["state"].clone()
    carry, ring = _stash(S, 63), GdnRing.empty(S, HK, HV, D, D, length=8)
    cc = ConvCarry.empty(S, DIM, dtype=torch.float32)
    one = {n: x[n][:, 0].contiguous() for n in ROWS}
    msg = r"^{}: entries must be distinct within one launch"
    calls = {
        "state_indices": [
            lambda s: gdn_decode(st, *one.values(), state_indices=s),
            lambda s: gdn_chain(st, *(x[n] for n in ROWS), state_indices=s),
            lambda s: gdn_decode_plan(st, *one.values(), state_indices=s),
            lambda s: gdn_chain_plan(st, *(x[n] for n in ROWS), state_indices=s),
            lambda s: conv_update(c["conv_state"], c["x"][:, 0], c["weight"], c["bias"],
                                  state_indices=s),
            lambda s: conv_chain(c["conv_state"], c["x"], c["weight"], c["bias"],
                                 state_indices=s)],
        "out_state_indices": [
            lambda s: gdn_decode(st, *one.values(), state_indices=_slots(0, 2),
                                 out_state_indices=s)],
        "slot_tab": [
            lambda s: gdn_carry_verify(st, carry, *(x[n] for n in ROWS), slot_tab=s),
            lambda s: gdn_carry_verify_plan(st, carry, *(x[n] for n in ROWS), slot_tab=s),
            lambda s: gdn_carry_flush([st], [carry], s),
            lambda s: carry_accept(carry, s, _slots(1, 1), [1, 1]),
            lambda s: gdn_ring_verify(st, ring, *(x[n] for n in ROWS), slot_tab=s),
            lambda s: ring_accept(ring, s, _slots(1, 1), _slots(1, 1)),
            lambda s: gdn_ring_flush([st], [ring], s),
            lambda s: conv_carry_verify(c["conv_state"], cc, c["x"], c["weight"], c["bias"],
                                        slot_tab=s),
            lambda s: conv_carry_flush([c["conv_state"]], [cc], s)],
    }
    watched = (st, carry.buf, carry.pend, ring.len, ring.u, c["conv_state"], cc.stash, cc.pend)
    before = [t.clone() for t in watched]
    for name, fns in calls.items():
        for fn in fns:
            with pytest.raises(ValueError, match=msg.format(name)):
                fn(dup)
    for t, b in zip(watched, before):
        assert bitwise_equal(t, b), "a refused launch wrote"
    o = gdn_chain(st, *(x[n] for n in ROWS), state_indices=pads)     # padding lanes repeat
    assert not o.any()
