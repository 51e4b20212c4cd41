"""Padding lanes (slot -1) in the float64 references, checked against the kernels.

The kernels treat a slot of -1 as a padding lane (docs/layouts.md "Padding lanes",
tests/gdn/test_padding.py, tests/conv/test_conv_padding.py): zero outputs, ``engaged`` 1, nothing read or written for it. The
references every kernel answers to must do the same, not read and write slot ``S-1`` as Python's
``tensor[-1]`` would. Each test runs a padded batch (slots ``[2, -1, 0]`` of ``S = 4``: slot 3 is
the one a negative index would hit) through the kernel and the reference and checks:

- the reference's padding-lane outputs (and snapshots / intermediate windows) are exact zeros;
- the slots no live lane addresses (1 and 3) are bitwise equal to the input in the reference;
- kernel and reference agree on everything (relative L2 ``1e-5`` for fp32 GDN outputs and
  states, as tests/carry/test_carry.py; windows and stash rows bitwise, as tests/conv/test_conv.py and
  tests/conv/test_conv_carry.py);
- any other negative slot is a ``ValueError`` naming the slot argument.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.carry import GdnCarry, carry_accept, gdn_carry_flush, gdn_carry_verify
from pmll_lab.conv import ConvCarry, conv_carry_flush, conv_carry_verify, conv_chain, conv_update
from pmll_lab.gdn import gdn_chain, gdn_chain_ref, gdn_decode, gdn_decode_ref
from pmll_lab.inputs import conv_inputs, gdn_inputs
from pmll_lab.reference import carry as ref_carry
from pmll_lab.reference import conv as ref_conv

S, HK, HV, KD, VD = 4, 1, 2, 16, 16
SLOTS_PAD = [2, -1, 0]
PAD_LANE = 1
UNTOUCHED = [1, 3]              # slots no live lane addresses (3: what tensor[-1] would hit)
TOL = 1e-5
DIM, HEAD = 48, 16
CONV_KW = dict(qk_channels=32, head_dim=HEAD)


def _idx(slots):
    return torch.tensor(slots, dtype=torch.int32, device=DEVICE)


def _close(name, out, want):
    e = errors(out, want)
    assert e["rel_l2"] <= TOL, f"{name}: rel_l2 {e['rel_l2']:.3e} > {TOL:.0e}"


def _untouched(new_f64, before, what):
    for s in UNTOUCHED:
        assert torch.equal(new_f64[s], before[s].double().cpu()), \
            f"{what}: the reference changed slot {s}, which no live lane addresses"


def _gdn_rows(x):
    return [x[n] for n in ("q", "k", "v", "g", "beta")]


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("K", [1, 3])
def test_gdn_decode_and_chain_reference_padding(layout, K):
    x = gdn_inputs(101 + K, 3, HK, HV, KD, VD, rows=None if K == 1 else K, slots=S,
                   dtype=torch.float32, state_layout="kv")
    st0 = x["state"] if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
    st = st0.clone()
    rows = _gdn_rows(x)
    ref_rows = [t.cpu() for t in rows]
    if K == 1:
        o = gdn_decode(st, *rows, state_indices=_idx(SLOTS_PAD), validate=True,
                       state_layout=layout)
        o_ref, s_ref = gdn_decode_ref(st0.cpu(), *ref_rows, state_indices=torch.tensor(SLOTS_PAD),
                                      state_layout=layout)
    else:
        inter = torch.zeros(3, K - 1, *st0.shape[1:], device=DEVICE)
        o = gdn_chain(st, *rows, state_indices=_idx(SLOTS_PAD), intermediate=inter,
                      validate=True, state_layout=layout)
        o_ref, s_ref, i_ref = gdn_chain_ref(st0.cpu(), *ref_rows,
                                            state_indices=torch.tensor(SLOTS_PAD),
                                            state_layout=layout)
        assert bool((i_ref[PAD_LANE] == 0).all()), "reference snapshots of the padding lane"
        _close("intermediate", inter, i_ref)
    assert bool((o_ref[PAD_LANE] == 0).all()), "reference outputs of the padding lane"
    _untouched(s_ref, st0, "state")
    assert bool((o[PAD_LANE] == 0).all())
    _close("o", o, o_ref)
    _close("state", st, s_ref)


def _random_carry(seed):
    c = GdnCarry.empty(S, HV, KD, VD, device=DEVICE, state_layout="kv")
    gen = torch.Generator().manual_seed(seed)
    c.u.copy_(torch.randn(c.u.shape, generator=gen) * 0.3)
    c.g.copy_(-F.softplus(torch.randn(c.g.shape, generator=gen)))
    c.k.copy_(ref_carry.l2norm(torch.randn(c.k.shape, generator=gen)).float())
    c.pend.copy_(torch.tensor([3, 1, 5, 2], dtype=torch.int32))
    return c


@pytest.mark.parametrize("lazy", [False, True])
def test_carry_reference_padding(lazy):
    """verify, accept and flush: with lazy, slot 2 (pend 5) writes back and slot 0 (pend 3)
    does not; eager writes both back."""
    K = 4
    x = gdn_inputs(111, 3, HK, HV, KD, VD, rows=K, slots=S, dtype=torch.float32, state_layout="kv")
    st0 = x["state"].clone()
    st, carry = x["state"].clone(), _random_carry(112)
    rs, rc = st0.double().cpu(), ref_carry.RefCarry.from_carry(carry)
    rc0 = ref_carry.RefCarry.from_carry(carry)
    o, eng = gdn_carry_verify(st, carry, *_gdn_rows(x), slot_tab=_idx(SLOTS_PAD), lazy=lazy,
                              validate=True, state_layout="kv")
    ro, reng = ref_carry.verify(rs, rc, *[t.cpu() for t in _gdn_rows(x)],
                                torch.tensor(SLOTS_PAD), lazy=lazy)
    assert bool((ro[PAD_LANE] == 0).all()) and int(reng[PAD_LANE]) == 1
    _untouched(rs, st0, "verify state")
    for name in ("u", "g", "k"):
        for s in UNTOUCHED:
            assert torch.equal(getattr(rc, name)[s], getattr(rc0, name)[s]), \
                f"verify wrote stash {name} of slot {s}"
    assert eng.cpu().tolist() == reng.tolist()
    _close("o", o, ro)
    _close("state", st, rs)
    _close("stash u", carry.u, rc.u)
    _close("stash k", carry.k, rc.k)
    assert bitwise_equal(carry.g.cpu(), rc.g.float()), "stash g"

    acc = [2, 3, 4]
    ref_carry.accept(rc, SLOTS_PAD, reng, acc)
    assert rc.pend[UNTOUCHED].tolist() == rc0.pend[UNTOUCHED].tolist(), "accept via padding"
    carry_accept(carry, _idx(SLOTS_PAD), eng, acc, rows=K, validate=True)
    assert carry.pend.cpu().tolist() == rc.pend.tolist()

    before = rs.clone()
    gdn_carry_flush([st], [carry], _idx(SLOTS_PAD), validate=True, state_layout="kv")
    ref_carry.flush([rs], [rc], SLOTS_PAD)
    for s in UNTOUCHED:
        assert torch.equal(rs[s], before[s]), f"flush changed slot {s}"
    _close("state after flush", st, rs)


@pytest.mark.parametrize("K", [1, 3])
def test_conv_update_and_chain_reference_padding(K):
    c = conv_inputs(121 + K, 3, DIM, rows=K, slots=S, dtype=torch.float32)
    st0 = c["conv_state"]
    st = st0.clone()
    args = (c["weight"], c["bias"])
    if K == 1:
        x = c["x"][:, 0].contiguous()
        y = conv_update(st, x, *args, state_indices=_idx(SLOTS_PAD), validate=True, **CONV_KW)
        y_ref, s_ref = ref_conv.conv_update(st0, x, *args, state_indices=torch.tensor(SLOTS_PAD),
                                            **CONV_KW)
    else:
        inter = torch.zeros(3, K - 1, DIM, st0.shape[2], device=DEVICE)
        y = conv_chain(st, c["x"], *args, state_indices=_idx(SLOTS_PAD), intermediate=inter,
                       validate=True, **CONV_KW)
        y_ref, s_ref, i_ref = ref_conv.conv_chain(st0, c["x"], *args, state_indices=SLOTS_PAD,
                                                  **CONV_KW)
        assert bool((i_ref[PAD_LANE] == 0).all()), "reference windows of the padding lane"
        live = [0, 2]
        assert bitwise_equal(inter[live], i_ref[live].float().to(DEVICE)), "intermediate"
    assert bool((y_ref[PAD_LANE] == 0).all()), "reference outputs of the padding lane"
    _untouched(s_ref, st0, "conv_state")
    _close("y", y, y_ref)
    assert bitwise_equal(st, s_ref.float().to(DEVICE)), "windows"


@pytest.mark.parametrize("lazy", [False, True])
def test_conv_carry_reference_padding(lazy):
    K = 4
    c = conv_inputs(131, 3, DIM, rows=K, slots=S, dtype=torch.float32)
    st0 = c["conv_state"]
    gen = torch.Generator().manual_seed(132)
    carry = ConvCarry(torch.randn(S, 8, DIM, generator=gen).to(DEVICE),
                      torch.tensor([3, 1, 5, 2], dtype=torch.int32, device=DEVICE))
    stash0, pend0 = carry.stash.clone(), carry.pend.clone()
    st = st0.clone()
    y, eng = conv_carry_verify(st, carry, c["x"], c["weight"], c["bias"],
                               slot_tab=_idx(SLOTS_PAD), lazy=lazy, validate=True, **CONV_KW)
    y_ref, e_ref, s_ref, t_ref = ref_conv.conv_carry_verify(
        st0, stash0, pend0, c["x"], c["weight"], c["bias"], slot_tab=torch.tensor(SLOTS_PAD),
        lazy=lazy, **CONV_KW)
    assert bool((y_ref[PAD_LANE] == 0).all()) and int(e_ref[PAD_LANE]) == 1
    _untouched(s_ref, st0, "conv_state")
    _untouched(t_ref, stash0, "stash")
    assert eng.cpu().tolist() == e_ref.tolist()
    _close("y", y, y_ref)
    assert bitwise_equal(st, s_ref.float().to(DEVICE)), "windows"
    assert bitwise_equal(carry.stash, t_ref.float().to(DEVICE)), "stash"

    acc = [2, 3, 4]
    p_ref = ref_conv.carry_accept(pend0, SLOTS_PAD, e_ref, acc)
    assert p_ref[UNTOUCHED].tolist() == pend0.cpu()[UNTOUCHED].tolist(), "accept via padding"
    carry_accept(carry, _idx(SLOTS_PAD), eng, acc, rows=K, validate=True)
    assert carry.pend.cpu().tolist() == p_ref.tolist()

    (f_ref,) = ref_conv.conv_carry_flush([s_ref], [t_ref], [p_ref], SLOTS_PAD)
    _untouched(f_ref, s_ref, "flush")
    conv_carry_flush([st], [carry], _idx(SLOTS_PAD), validate=True)
    assert bitwise_equal(st, f_ref.float().to(DEVICE)), "windows after flush"


def test_references_reject_other_slots():
    """-2 (and S) are no padding lane: ValueError naming the argument, as ``validate=True``
    gives in the kernels."""
    x = gdn_inputs(141, 2, HK, HV, KD, VD, rows=2, slots=S, dtype=torch.float32, device="cpu",
                   state_layout="kv")
    c = conv_inputs(142, 2, DIM, rows=2, slots=S, dtype=torch.float32, device="cpu")
    rc = ref_carry.RefCarry.zeros(S, HV, KD, VD)
    st = x["state"].double()
    for bad in ([-2, 0], [0, S]):
        with pytest.raises(ValueError, match="state_indices"):
            gdn_decode_ref(x["state"], *[t[:, 0] for t in _gdn_rows(x)], state_indices=bad,
                           state_layout="kv")
        with pytest.raises(ValueError, match="state_indices"):
            gdn_chain_ref(x["state"], *_gdn_rows(x), state_indices=torch.tensor(bad),
                          state_layout="kv")
        with pytest.raises(ValueError, match="slot_tab"):
            ref_carry.verify(st.clone(), rc, *_gdn_rows(x), bad)
        with pytest.raises(ValueError, match="slot_tab"):
            ref_carry.accept(SimpleNamespace(pend=rc.pend.clone()), bad, [1, 1], [1, 1])
        with pytest.raises(ValueError, match="slot_tab"):
            ref_carry.flush([st.clone()], [rc], bad)
        with pytest.raises(ValueError, match="slot_tab"):
            ref_carry.decode_tokens(st.clone(), *_gdn_rows(x), bad)
        with pytest.raises(ValueError, match="state_indices"):
            ref_conv.conv_update(c["conv_state"], c["x"][:, 0], c["weight"], c["bias"],
                                 state_indices=bad)
        with pytest.raises(ValueError, match="slot_tab"):
            ref_conv.conv_carry_verify(c["conv_state"], torch.zeros(S, 8, DIM), torch.zeros(S),
                                       c["x"], c["weight"], c["bias"], slot_tab=bad)
        with pytest.raises(ValueError, match="slot_tab"):
            ref_conv.carry_accept(torch.zeros(S), bad, [1, 1], [1, 1])
        with pytest.raises(ValueError, match="slot_tab"):
            ref_conv.conv_carry_flush([c["conv_state"]], [torch.zeros(S, 8, DIM)],
                                      [torch.zeros(S)], bad)
