"""One state layout for every GDN launcher: a call that omits ``state_layout`` means V-major
(``"vk"``) in each of them, the references, the input maker and the state holders, so comparing
two forms on one state without naming the layout compares like with like (docs/layouts.md).

The forms are compared on a square state (``kd == vd``), where a layout read the wrong way
cannot be seen in the shapes: fp32 states and inputs, the exact carried verify against the ring
form and both against the float64 chain.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.carry import (RING_TOLERANCE, CarryLayer, GdnCarry, GdnRing, SpecDecodeStep,
                            gdn_carry_flush, gdn_carry_verify, gdn_carry_verify_plan,
                            gdn_ring_flush, gdn_ring_verify)
from pmll_lab.gdn import (gdn_chain, gdn_chain_plan, gdn_chain_ref, gdn_decode, gdn_decode_plan,
                          gdn_decode_ref)
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops.gdn.recurrence import DEFAULT_STATE_LAYOUT
from pmll_lab.tolerances import O_TOL

B, S, HK, HV, D, K = 2, 3, 1, 2, 16, 3
ROWS = ("q", "k", "v", "g", "beta")


def test_every_gdn_entry_point_defaults_to_v_major():
    from pmll_lab.models.cache import ServingCache
    from pmll_lab.models.generate import greedy_generate, speculative_generate

    assert DEFAULT_STATE_LAYOUT == "vk"
    entries = (gdn_decode, gdn_chain, gdn_decode_plan, gdn_chain_plan, gdn_carry_verify,
               gdn_carry_verify_plan, gdn_carry_flush, gdn_ring_verify, gdn_ring_flush,
               gdn_decode_ref, gdn_chain_ref, gdn_inputs, GdnCarry.empty, GdnCarry, CarryLayer,
               ServingCache.__init__, greedy_generate, speculative_generate)
    defaults = {fn.__qualname__: inspect.signature(fn).parameters["state_layout"].default
                for fn in entries}
    assert set(defaults.values()) == {"vk"}, defaults
    assert GdnRing.state_layout == "vk"


def _inputs(seed):
    """A square fp32 state in the default layout and K fp32 rows."""
    x = gdn_inputs(seed, B, HK, HV, D, D, rows=K, slots=S, dtype=torch.float32)
    return x, [x[n] for n in ROWS]


def test_the_same_call_means_the_same_layout_in_every_launcher():
    """Every launcher called without ``state_layout`` gives the bits of the call naming
    ``"vk"``, and all of them agree with the float64 chain called without it."""
    x, rows = _inputs(3)
    st, slots = x["state"], x["state_indices"]
    o_ref, s_ref, _ = gdn_chain_ref(st, *rows, state_indices=slots)
    for lay in ({}, {"state_layout": "vk"}):
        a, b, c, d = (st.clone() for _ in range(4))
        dec = torch.stack([gdn_decode(a, *(t[:, r] for t in rows), state_indices=slots, **lay)
                           for r in range(K)], 1)
        chain = gdn_chain(b, *rows, state_indices=slots, **lay)
        carry = GdnCarry.empty(S, HV, D, D, **lay)
        exact, _ = gdn_carry_verify(c, carry, *rows, slot_tab=slots, **lay)
        ring, _ = gdn_ring_verify(d, GdnRing.empty(S, HK, HV, D, D), *rows, slot_tab=slots,
                                  **lay)
        outs = dict(decode=dec, chain=chain, exact=exact, ring=ring)
        if not lay:
            omitted = (outs, a)
        for name, o in outs.items():
            tol = RING_TOLERANCE["float32"] if name == "ring" else O_TOL[torch.float32]
            assert errors(o, o_ref)["rel_l2"] <= tol, (name, lay, errors(o, o_ref))
        assert errors(a, s_ref)["rel_l2"] <= 1e-5, lay
        assert bitwise_equal(chain, dec) and bitwise_equal(exact, dec), lay
    for name, o in omitted[0].items():
        assert bitwise_equal(o, outs[name]), f"{name}: an omitted layout is not 'vk'"
    assert bitwise_equal(omitted[1], a)


def test_exact_and_ring_forms_compared_on_one_state_without_a_layout():
    """On one square state, the exact carried verify and the ring form called without a layout
    differ by the ring form's own error (fp32: ~1e-6 here), far below the difference of one
    state read both ways (K-major against V-major, 0.28), which is what a default layout that
    differed between them would have shown."""
    x, rows = _inputs(5)
    st, slots = x["state"], x["state_indices"]
    exact, _ = gdn_carry_verify(st.clone(), GdnCarry.empty(S, HV, D, D), *rows, slot_tab=slots)
    ring, _ = gdn_ring_verify(st.clone(), GdnRing.empty(S, HK, HV, D, D), *rows, slot_tab=slots)
    true_diff = errors(ring, exact)["rel_l2"]
    assert true_diff <= RING_TOLERANCE["float32"], true_diff
    transposed, _ = gdn_carry_verify(st.clone(), GdnCarry.empty(S, HV, D, D, state_layout="kv"),
                                     *rows, slot_tab=slots, state_layout="kv")
    assert errors(ring, transposed)["rel_l2"] > 100 * true_diff


def test_the_input_maker_draws_one_state_in_both_layouts():
    """``gdn_inputs`` with a seed gives the same ``H`` in either layout: the V-major pool is the
    K-major one transposed, so the two layouts can be compared on one state."""
    vk = gdn_inputs(7, B, HK, HV, 16, 32, slots=S)
    kv = gdn_inputs(7, B, HK, HV, 16, 32, slots=S, state_layout="kv")
    assert vk["state"].shape == (S, HV, 32, 16) and kv["state"].shape == (S, HV, 16, 32)
    assert vk["state"].is_contiguous()
    assert bitwise_equal(vk["state"], kv["state"].transpose(-1, -2))
    for n in ROWS + ("state_indices",):
        assert bitwise_equal(vk[n], kv[n])
    with pytest.raises(ValueError, match=r"^state_layout: expected one of \('kv', 'vk'\)"):
        gdn_inputs(7, B, HK, HV, 16, 16, state_layout="VK")


def test_a_holder_refuses_a_call_in_another_layout():
    """A stash made for a K-major pool, given to a launcher whose layout was omitted (square
    state: nothing in the shapes differs), is refused naming the carry before anything is
    written; a ``CarryLayer`` refuses a carry of the other layout; ``GdnCarry`` takes only the
    two layouts."""
    x, rows = _inputs(9)
    st, slots = x["state"].transpose(-1, -2).contiguous(), x["state_indices"]    # K-major
    carry = GdnCarry.empty(S, HV, D, D, state_layout="kv")
    carry.pend.fill_(1)
    before = (st.clone(), carry.buf.clone())
    msg = (r"^carry: made for a state_layout='kv' pool, but this call reads the state as "
           r"state_layout='vk' \(the default when omitted is 'vk'\)")
    for call in (gdn_carry_verify, gdn_carry_verify_plan):
        with pytest.raises(ValueError, match=msg):
            call(st, carry, *rows, slot_tab=slots)
    with pytest.raises(ValueError, match=r"^carries\[0\]: made for a state_layout='kv' pool"):
        gdn_carry_flush([st], [carry], slots)
    assert bitwise_equal(st, before[0]) and bitwise_equal(carry.buf, before[1])
    with pytest.raises(ValueError, match=r"^carry: made for a state_layout='kv' pool"):
        CarryLayer(st, carry)
    with pytest.raises(ValueError, match=r"^layers\[0\]\.carry: made for a state_layout='vk'"):
        lay = CarryLayer(st, GdnCarry.empty(S, HV, D, D, state_layout="kv"), state_layout="kv")
        lay.carry = GdnCarry.empty(S, HV, D, D)
        SpecDecodeStep([lay])
    with pytest.raises(ValueError, match=r"^state_layout: expected one of"):
        GdnCarry.empty(S, HV, D, D, state_layout="KV")
    o, _ = gdn_carry_verify(st, carry, *rows, slot_tab=slots, state_layout="kv")
    assert o.shape == (B, K, HV, D) and bool(torch.isfinite(o).all())
    ring = GdnRing.empty(S, HK, HV, D, D)
    with pytest.raises(ValueError, match=r"^state_layout: the ring form runs on a V-major"):
        gdn_ring_flush([st], [ring], slots, state_layout="kv")
