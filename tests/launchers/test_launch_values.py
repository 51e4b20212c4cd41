"""Values the launchers refuse or accept: a NaN or infinite ``scale`` is refused; with
``validate=True`` the gates of padding lanes (never used) are not checked while a live lane's
NaN gate still is; and a plain decode on a slot holding accepted carry rows not yet folded,
which silently gives a wrong state, is refused by ``validate=True`` where the carry is passed.
"""

from __future__ import annotations

import math

import pytest
import torch

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import (GdnCarry, SpecDecodeStep, CarryLayer, carry_accept, gdn_carry_flush,
                            gdn_carry_verify)
from pmll_lab.conv import ConvCarry, conv_carry_verify, conv_update
from pmll_lab.gdn import gdn_chain, gdn_decode, gdn_decode_ref
from pmll_lab.inputs import conv_inputs, gdn_inputs


def _slots(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_non_finite_scale_is_refused(scale):
    d = gdn_inputs(1, 2, 1, 2, 16, 16, slots=3, dtype=torch.float32, state_layout="kv")
    r = gdn_inputs(2, 2, 1, 2, 16, 16, rows=2, slots=3, dtype=torch.float32, state_layout="kv")
    rows = (r["q"], r["k"], r["v"], r["g"], r["beta"])
    with pytest.raises(ValueError, match=r"^scale: must be finite"):
        gdn_decode(d["state"], d["q"], d["k"], d["v"], d["g"], d["beta"], scale=scale,
                   state_layout="kv")
    with pytest.raises(ValueError, match=r"^scale: must be finite"):
        gdn_chain(r["state"], *rows, scale=scale, state_layout="kv")
    with pytest.raises(ValueError, match=r"^scale: must be finite"):
        gdn_carry_verify(r["state"], GdnCarry.empty(3, 2, 16, 16, state_layout="kv"), *rows,
                         slot_tab=r["state_indices"], scale=scale, state_layout="kv")
    lay = CarryLayer(state=r["state"], carry=GdnCarry.empty(3, 2, 16, 16,
                                                            state_layout="kv"), state_layout="kv")
    with pytest.raises(ValueError, match=r"^scale: must be finite"):
        SpecDecodeStep([lay], scale=scale)


def test_nan_gates_in_padding_lanes_pass_validate():
    """Lane 1 is padding (slot -1): its NaN gates are never used, so ``validate=True`` accepts
    them and the live lanes' outputs and states are bitwise those of finite gates there; a NaN
    gate in a live lane is still refused."""
    d = gdn_inputs(3, 3, 1, 2, 16, 16, slots=4, dtype=torch.float32, state_layout="kv")
    sl = _slots(2, -1, 0)
    g, beta = d["g"].clone(), d["beta"].clone()
    g[1], beta[1] = math.nan, math.nan
    st, st_ref = d["state"].clone(), d["state"].clone()
    o = gdn_decode(st, d["q"], d["k"], d["v"], g, beta, state_indices=sl, validate=True,
                   state_layout="kv")
    o_ref = gdn_decode(st_ref, d["q"], d["k"], d["v"], d["g"], d["beta"], state_indices=sl,
                       state_layout="kv")
    assert bitwise_equal(o, o_ref) and bitwise_equal(st, st_ref) and not o[1].any()
    ref = gdn_decode_ref(d["state"][[2, 0]].double(), d["q"][[0, 2]].double(),
                         d["k"][[0, 2]].double(), d["v"][[0, 2]].double(),
                         d["g"][[0, 2]].double(), d["beta"][[0, 2]].double(), state_layout="kv")[0]
    assert (o[[0, 2]].double().cpu() - ref.cpu()).abs().max() < 1e-5
    g[2, 0] = math.nan
    with pytest.raises(ValueError, match=r"^g: entries must lie"):
        gdn_decode(d["state"].clone(), d["q"], d["k"], d["v"], g, beta, state_indices=sl,
                   validate=True, state_layout="kv")
    # the chain and the carried-state verify alike
    r = gdn_inputs(4, 3, 1, 2, 16, 16, rows=2, slots=4, dtype=torch.float32, state_layout="kv")
    g, beta = r["g"].clone(), r["beta"].clone()
    g[1], beta[1] = math.nan, -math.inf
    rows = (r["q"], r["k"], r["v"], g, beta)
    gdn_chain(r["state"].clone(), *rows, state_indices=sl, validate=True, state_layout="kv")
    o, e = gdn_carry_verify(r["state"].clone(), GdnCarry.empty(4, 2, 16, 16,
                                                               state_layout="kv"), *rows,
                            slot_tab=sl, validate=True, state_layout="kv")
    assert not o[1].any() and e.tolist() == [1, 1, 1]
    beta[0, 1] = math.nan
    with pytest.raises(ValueError, match=r"^beta: entries must lie"):
        gdn_carry_verify(r["state"].clone(), GdnCarry.empty(4, 2, 16, 16, state_layout="kv"), *rows,
                         slot_tab=sl, validate=True, state_layout="kv")


def _carry_with_pending(seed):
    """A lazy verify of 2 rows on slots [1, 0], 2 rows accepted: ``pend = 2`` there, the state
    not written back (it lags the sequences by those rows)."""
    r = gdn_inputs(seed, 2, 1, 2, 16, 16, rows=2, slots=3, dtype=torch.float32, state_layout="kv")
    st, c, sl = r["state"], GdnCarry.empty(3, 2, 16, 16, state_layout="kv"), r["state_indices"]
    _, e = gdn_carry_verify(st, c, r["q"], r["k"], r["v"], r["g"], r["beta"], slot_tab=sl,
                            lazy=True, state_layout="kv")
    carry_accept(c, sl, e, [2, 2])
    assert c.pend[sl.long()].tolist() == [2, 2] and e.tolist() == [1, 1]
    return st, c, sl


def test_plain_decode_on_pending_carry_rows_is_wrong_and_validate_refuses_it():
    st, c, sl = _carry_with_pending(5)
    d = gdn_inputs(6, 2, 1, 2, 16, 16, slots=3, dtype=torch.float32, state_layout="kv")
    row = (d["q"], d["k"], d["v"], d["g"], d["beta"])
    # what the docs now say: decoding without folding gives another state than folding first
    stale, folded = st.clone(), st.clone()
    gdn_decode(stale, *row, state_indices=sl, state_layout="kv")
    gdn_carry_flush([folded], [c], sl, state_layout="kv")
    gdn_decode(folded, *row, state_indices=sl, state_layout="kv")
    assert not torch.allclose(stale[sl.long()], folded[sl.long()], atol=1e-4)
    with pytest.raises(ValueError, match=r"^carry\.pend: slot \d holds 2 accepted carry rows"):
        gdn_decode(st.clone(), *row, state_indices=sl, carry=c, validate=True, state_layout="kv")
    r = gdn_inputs(7, 2, 1, 2, 16, 16, rows=2, slots=3, dtype=torch.float32, state_layout="kv")
    with pytest.raises(ValueError, match=r"^carry\.pend: slot"):
        gdn_chain(st.clone(), r["q"], r["k"], r["v"], r["g"], r["beta"], state_indices=sl,
                  carry=c, validate=True, state_layout="kv")
    # folded and cleared: accepted; a padding lane on a pending slot is not a decode there
    c.pend.zero_()
    gdn_decode(folded.clone(), *row, state_indices=sl, carry=c, validate=True, state_layout="kv")
    c.pend[2] = 3
    gdn_decode(folded.clone(), *row, state_indices=_slots(int(sl[0]), -1), carry=c,
               validate=True, state_layout="kv")
    with pytest.raises(ValueError, match=r"^carry\.pend: expected shape \(3,\)"):
        gdn_decode(folded.clone(), *row, state_indices=sl, carry=GdnCarry.empty(4, 2, 16, 16,
                                                                                state_layout="kv"),
                   state_layout="kv")


def test_conv_update_on_pending_carry_inputs_is_refused_with_validate():
    r = conv_inputs(8, 2, 64, rows=2, slots=3, dtype=torch.float32)
    cs, w, b, sl = r["conv_state"], r["weight"], r["bias"], r["state_indices"]
    c = ConvCarry.like(cs)
    _, e = conv_carry_verify(cs, c, r["x"], w, b, slot_tab=sl, lazy=True)
    carry_accept(c, sl, e, [1, 2])
    x = conv_inputs(9, 2, 64, slots=3, dtype=torch.float32)["x"]
    with pytest.raises(ValueError, match=r"^carry\.pend: slot \d holds [12] accepted"):
        conv_update(cs.clone(), x, w, b, state_indices=sl, carry=c, validate=True)
    c.pend.zero_()
    conv_update(cs.clone(), x, w, b, state_indices=sl, carry=c, validate=True)
