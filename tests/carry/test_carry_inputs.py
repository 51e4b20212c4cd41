"""Bad input to the carried-state API is refused naming the argument (SPEC §3b).

``gdn_carry_verify`` (shapes, dtypes, devices, strides, forms, and with ``validate=True`` the
values: pending counts, slots, gates), ``carry_accept``, ``gdn_carry_flush``, ``GdnCarry`` and
``SpecDecodeStep`` / ``CarryLayer`` raise ``ValueError`` before any kernel runs, leaving states,
stash and ``pend`` as they were; ``form="wy"`` is refused naming the ring form, the tolerance
form's own launchers. The exact form serves K = 17 (a CAP of 24): its outputs against the float64
chain reference within ``1e-5`` (fp32).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import (
    CarryLayer,
    GdnCarry,
    SpecDecodeStep,
    carry_accept,
    gdn_carry_flush,
    gdn_carry_verify,
)
from pmll_lab.gdn import gdn_chain_ref
from pmll_lab.inputs import gdn_inputs

from _carry_helpers import CAP, O_TOL, _close


# ---- bad input -------------------------------------------------------------------------------

def _verify_args(K=2, dtype=torch.float32):
    x = gdn_inputs(1, 2, 1, 2, 16, 16, rows=K, slots=3, dtype=dtype, state_layout="kv")
    carry = GdnCarry.empty(3, 2, 16, 16, state_layout="kv")
    kw = dict(state=x["state"], carry=carry, q=x["q"], k=x["k"], v=x["v"], g=x["g"],
              beta=x["beta"], slot_tab=x["state_indices"], state_layout="kv")
    return kw


def _call(kw, **opts):
    kw = dict(kw)
    return gdn_carry_verify(kw.pop("state"), kw.pop("carry"), kw.pop("q"), kw.pop("k"),
                            kw.pop("v"), kw.pop("g"), kw.pop("beta"), **kw, **opts)


def _randn(*shape):
    return torch.randn(*shape, device=DEVICE)


BAD = {
    "K > CAP": (lambda kw: kw.update(q=_randn(2, 9, 1, 16), k=_randn(2, 9, 1, 16),
                                     v=_randn(2, 9, 2, 16), g=-_randn(2, 9, 2).abs(),
                                     beta=_randn(2, 9, 2).sigmoid()), "q"),
    "v shape": (lambda kw: kw.update(v=_randn(2, 2, 2, 8)), "v"),
    "k dtype": (lambda kw: kw.update(k=kw["k"].to(torch.bfloat16)), "k"),
    "g dtype": (lambda kw: kw.update(g=kw["g"].double()), "g"),
    "state dtype": (lambda kw: kw.update(state=kw["state"].double()), "state"),
    "state device": (lambda kw: kw.update(state=kw["state"].to("meta")), "state"),
    "state slots share memory": (lambda kw: kw.update(state=kw["state"][:1].expand(
        kw["state"].shape)), "state"),
    "q device": (lambda kw: kw.update(q=kw["q"].to("meta")), "q"),
    "q strides": (lambda kw: kw.update(q=_randn(2, 2, 1, 32)[..., ::2]), "q"),
    "HV % HK": (lambda kw: kw.update(q=_randn(2, 2, 3, 16), k=_randn(2, 2, 3, 16)), "q"),
    "slot dtype": (lambda kw: kw.update(slot_tab=kw["slot_tab"].float()), "slot_tab"),
    "carry dims": (lambda kw: kw.update(carry=GdnCarry.empty(3, 2, 16, 8, state_layout="kv")),
                   "carry"),
    # a carry made for the default V-major pool given to a call on a K-major one (kd == vd)
    "carry layout": (lambda kw: kw.update(carry=GdnCarry.empty(3, 2, 16, 16)),
                     r"carry: made for a state_layout='vk' pool, but this call reads the "
                     r"state as state_layout='kv'"),
    "carry type": (lambda kw: kw.update(carry=object()), "carry"),
    # read at offset b: a strided view [2, 0] of [2, 1, 0, 1] would address slots [2, 1]
    "slot strided": (lambda kw: kw.update(slot_tab=torch.tensor([2, 1, 0, 1], dtype=torch.int32,
                                                                device=DEVICE)[::2]), "slot_tab"),
    "slot list": (lambda kw: kw.update(slot_tab=[0, 1]), "slot_tab"),
    "scale str": (lambda kw: kw.update(scale="a"), "scale"),
    "scale list": (lambda kw: kw.update(scale=[1.0]), "scale"),
    "kd zero": (lambda kw: kw.update(state=kw["state"][:, :, :0], q=kw["q"][..., :0],
                                     k=kw["k"][..., :0]), "state"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_verify_rejects_bad_input(name):
    kw = _verify_args()
    mutate, arg = BAD[name]
    mutate(kw)
    with pytest.raises(ValueError, match=f"^{arg}"):
        _call(kw)


def test_verify_rejects_unknown_form_and_lazy():
    kw = _verify_args()
    with pytest.raises(ValueError, match="form"):
        _call(kw, form="chunk")
    with pytest.raises(ValueError, match="lazy"):
        _call(kw, lazy=1)
    # flags are bools: a string's truth would be taken silently
    for name in ("use_qk_l2norm", "validate"):
        with pytest.raises(ValueError, match=f"^{name}: expected a bool"):
            _call(kw, **{name: "no"})
    # the eager limit is None or an int >= 0, with or without validate
    for bad, what in (("4", "expected an int"), (2.5, "expected an int"), (-1, "must be >= 0"),
                      (True, "expected an int")):
        for validate in (False, True):
            with pytest.raises(ValueError, match=f"^eager_max_pending: {what}"):
                _call(kw, eager_max_pending=bad, validate=validate)
    assert kw["carry"].pend.tolist() == [0, 0, 0]


def test_wy_form_refused_naming_the_ring_form_and_exact_serves_k17():
    """``form="wy"`` is refused before any kernel runs, naming ``form`` and the ring form
    (``pmll_lab.ops.carry.ring``), by the verify in both layouts, its launch plan and
    ``SpecDecodeStep``, state and stash left as they were; an unknown form lists the forms. The
    exact form serves K = 17 (a CAP of 24) against the float64 chain reference."""
    from pmll_lab.carry import gdn_carry_verify_plan

    msg = r"^form: 'wy' is not a form .*the ring form, pmll_lab\.ops\.carry\.ring\b"
    S, HV, kd, vd, K = 2, 1, 16, 16, 17
    x = gdn_inputs(5, S, 1, HV, kd, vd, rows=K, dtype=torch.float32, state_layout="kv")
    rows = [x[n] for n in ("q", "k", "v", "g", "beta")]
    for layout in ("kv", "vk"):
        carry = GdnCarry.empty(S, HV, kd, vd, cap=24, state_layout=layout)
        carry.pend.fill_(1)
        st = x["state"].clone() if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
        before = (st.clone(), carry.buf.clone(), carry.pend.clone())
        for call in (gdn_carry_verify, gdn_carry_verify_plan):
            with pytest.raises(ValueError, match=msg):
                call(st, carry, *rows, slot_tab=x["state_indices"], form="wy",
                     state_layout=layout)
        with pytest.raises(ValueError, match=r"^form: must be one of \['exact'\], got 'ring'"):
            gdn_carry_verify(st, carry, *rows, slot_tab=x["state_indices"], form="ring",
                             state_layout=layout)
        with pytest.raises(ValueError, match=msg):
            SpecDecodeStep([CarryLayer(st, carry, state_layout=layout)], form="wy")
        assert bitwise_equal(st, before[0]) and bitwise_equal(carry.buf, before[1])
        assert bitwise_equal(carry.pend, before[2])
    carry = GdnCarry.empty(S, HV, kd, vd, cap=24, state_layout="kv")
    st = x["state"].clone()
    o, _ = gdn_carry_verify(st, carry, x["q"], x["k"], x["v"], x["g"], x["beta"],
                            slot_tab=x["state_indices"], form="exact", validate=True,
                            state_layout="kv")
    o_ref, _, _ = gdn_chain_ref(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"],
                                state_indices=x["state_indices"], state_layout="kv")
    _close("o (exact, K=17)", o, o_ref, O_TOL[torch.float32])


BAD_VALUES = {
    "pend > CAP": (lambda kw: kw["carry"].pend.fill_(CAP + 1), "pend", {}),
    "duplicate slots": (lambda kw: kw.update(slot_tab=torch.tensor([1, 1], dtype=torch.int32)), "slot_tab", {}),
    "slot out of range": (lambda kw: kw.update(slot_tab=torch.tensor([0, 3], dtype=torch.int32)), "slot_tab", {}),
    "eager over max pending": (lambda kw: kw["carry"].pend.fill_(5), "eager_max_pending",
                               dict(eager_max_pending=4)),
    "g > 0": (lambda kw: kw.update(g=-kw["g"]), "g", {}),
    "beta > 1": (lambda kw: kw.update(beta=kw["beta"] + 1), "beta", {}),
}


@pytest.mark.parametrize("name", list(BAD_VALUES))
def test_validate_rejects_bad_values(name):
    kw = _verify_args()
    mutate, arg, opts = BAD_VALUES[name]
    mutate(kw)
    kw = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    with pytest.raises(ValueError, match=arg):
        _call(kw, validate=True, **opts)


def test_eager_limit_is_policy_not_kernel():
    """Without validate the kernel folds any pend <= CAP in an eager verify (the limit is the
    policy's); with a lazy verify the eager limit does not apply."""
    kw = _verify_args()
    kw["carry"].pend.fill_(CAP)
    _call(kw, validate=True, lazy=True, eager_max_pending=4)
    o, eng = _call(kw, eager_max_pending=4)
    assert eng.tolist() == [2, 2] and torch.isfinite(o).all()


def test_accept_and_flush_reject_bad_input():
    c = GdnCarry.empty(3, 2, 16, 16, state_layout="kv")
    slots = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    eng = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="accepted"):
        carry_accept(c, slots, eng, [1, 3], rows=2, validate=True)
    with pytest.raises(ValueError, match="accepted"):
        carry_accept(c, slots, eng, [-1, 0], rows=2, validate=True)
    with pytest.raises(ValueError, match="slot_tab"):
        carry_accept(c, torch.tensor([0, 0], dtype=torch.int32, device=DEVICE), eng, [1, 1], validate=True)
    c.pend.fill_(CAP)
    with pytest.raises(ValueError, match="after accept"):
        carry_accept(c, slots, eng, [1, 1], rows=2, validate=True)
    with pytest.raises(ValueError, match="accepted"):
        carry_accept(c, slots, eng, [1, 1, 1])
    with pytest.raises(ValueError, match="engaged"):
        carry_accept(c, slots, eng.long(), [1, 1])
    with pytest.raises(ValueError, match="carry"):
        carry_accept(object(), slots, eng, [1, 1])
    for acc in (None, "ab", [1.5, 1.0], [1.0, 1.0], [True, 1], 2.0):
        with pytest.raises(ValueError, match="^accepted"):
            carry_accept(c, slots, eng, acc)
    # every index tensor is read at offset b: strided views (of [0, 1, 2, 1] etc.) are refused
    strided = lambda vals: torch.tensor(vals, dtype=torch.int32, device=DEVICE)[::2]  # noqa: E731
    pend_before = c.pend.clone()
    for name, args in (("slot_tab", (strided([0, 1, 2, 1]), eng, [1, 1])),
                       ("engaged", (slots, strided([1, 2, 2, 1]), [1, 1])),
                       ("accepted", (slots, eng, strided([1, 0, 1, 0])))):
        with pytest.raises(ValueError, match=f"^{name}"):
            carry_accept(c, *args)
    with pytest.raises(ValueError, match=r"^carry.pend\[0\]"):
        carry_accept(SimpleNamespace(pend=torch.zeros(6, dtype=torch.int32, device=DEVICE)[::2],
                                     cap=CAP), slots, eng, [1, 1])
    assert torch.equal(c.pend, pend_before)
    st = gdn_inputs(1, 1, 1, 2, 16, 16, slots=3, state_layout="kv")["state"]
    with pytest.raises(ValueError, match="carries"):
        gdn_carry_flush([st, st.clone()], [c], slots, state_layout="kv")
    with pytest.raises(ValueError, match="states"):
        gdn_carry_flush(st, c, slots, state_layout="kv")
    with pytest.raises(ValueError, match="carries"):
        gdn_carry_flush([st], [GdnCarry.empty(3, 2, 16, 8,
                                              state_layout="kv")], slots, state_layout="kv")
    c.pend.fill_(CAP + 1)
    with pytest.raises(ValueError, match="pend"):
        gdn_carry_flush([st], [c], slots, validate=True, state_layout="kv")
    c.pend.zero_()
    with pytest.raises(ValueError, match="slot_tab"):
        gdn_carry_flush([st], [c], torch.tensor([1, 1], dtype=torch.int32, device=DEVICE),
                        validate=True, state_layout="kv")
    with pytest.raises(ValueError, match="^slot_tab"):
        gdn_carry_flush([st], [c], strided([2, 0, 1, 0]), state_layout="kv")
    for slots_bad in ([3], [-1], 5, [0.5], None, torch.tensor([1.0])):
        with pytest.raises(ValueError, match="^slots"):
            c.reset(slots_bad)
    with pytest.raises(ValueError, match="^device"):
        GdnCarry.empty(3, 2, 16, 16, device="bogus", state_layout="kv")


def test_spec_decode_step_rejects_bad_input():
    """Bad layers, slots, inputs, layer index and accepts raise ValueError naming the argument
    before any launch; the step stays usable afterwards."""
    S, HV, kd, vd, K = 4, 2, 16, 16, 2
    st = gdn_inputs(7, 1, 1, HV, kd, vd, slots=S, dtype=torch.float32, state_layout="kv")["state"]
    with pytest.raises(ValueError, match="^state"):
        CarryLayer(None, GdnCarry.empty(S, HV, kd, vd, state_layout="kv"), state_layout="kv")
    with pytest.raises(ValueError, match="^carry"):
        CarryLayer(st, None, state_layout="kv")
    with pytest.raises(ValueError, match="^conv_carry"):
        CarryLayer(st, GdnCarry.empty(S, HV, kd, vd,
                                      state_layout="kv"), conv_state=torch.zeros(S, 96, 3),
                   state_layout="kv")
    lay = CarryLayer(st, GdnCarry.empty(S, HV, kd, vd, state_layout="kv"), state_layout="kv")
    lay.carry = None                                  # changed after construction
    with pytest.raises(ValueError, match=r"^layers\[0\].carry"):
        SpecDecodeStep([lay])
    lay.carry = GdnCarry.empty(S, HV, kd, vd, state_layout="kv")
    with pytest.raises(ValueError, match="^scale"):
        SpecDecodeStep([lay], scale="x")
    with pytest.raises(ValueError, match="^validate: expected a bool"):
        SpecDecodeStep([lay], validate="no")
    step = SpecDecodeStep([lay], validate=True)
    for slots in ([0, 4], [-1, 0], [0.7, 1.2], [1, 1], "ab",
                  torch.tensor([0, 1, 2, 1], dtype=torch.int32, device=DEVICE)[::2]):
        with pytest.raises(ValueError, match="^slots"):
            step.begin(slots, K)
    x = gdn_inputs(8, 2, 1, HV, kd, vd, rows=K, dtype=torch.float32, state_layout="kv")
    inp = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"])
    with pytest.raises(ValueError, match=r"^inputs\[0\]"):
        step.verify([0, 1], [dict(q=x["q"])])
    with pytest.raises(ValueError, match="^inputs"):
        step.verify([0, 1], inp)
    step.begin([2, 0], K)
    for i in (5, -1, 0.0):
        with pytest.raises(ValueError, match="^i:"):
            step.verify_layer(i, **inp)
    with pytest.raises(ValueError, match="^beta"):
        step.verify_layer(0, q=x["q"], k=x["k"], v=x["v"], g=x["g"])
    step.verify_layer(0, **inp)
    for acc in ([1.5, 1], [1], "ab", torch.tensor([1.0, 1.0])):
        with pytest.raises(ValueError, match="^accepted"):
            step.accept(acc)
    assert lay.carry.pend.tolist() == [0, 0, 0, 0]
    step.accept([1, 2])
    assert lay.carry.pend.tolist() == [2, 0, 1, 0]


def test_stash_and_ring_sizes_past_the_device_memory_refused_before_any_allocation(monkeypatch):
    """``GdnCarry.empty``, ``GdnRing.empty`` and ``ConvCarry.empty`` with sizes whose tensors
    could not fit in the device's memory give ``ValueError`` naming the sizes, before any
    allocation; at the bound (the device memory set to exactly what they need) they are built
    zeroed, one slot more is refused."""
    from pmll_lab import _checks
    from pmll_lab.conv import ConvCarry
    from pmll_lab.carry import GdnRing

    builds = (
        ("slots, num_v_heads, k_dim, v_dim, cap", lambda s: GdnCarry.empty(s, 4, 16, 8, cap=3),
         4 * 3 * (4 * 8 + 4 + 4 * 16) + 4),
        ("slots, num_k_heads, num_v_heads, k_dim, v_dim",
         lambda s: GdnRing.empty(s, 2, 4, 16, 32, length=8, dtype=torch.bfloat16),
         16 * (2 * 16 + 4 * 32) * 2 + 4 * 16 * 4 + 8),
        ("slots, dim, cap", lambda s: ConvCarry.empty(s, 24, cap=5, dtype=torch.float32),
         5 * 24 * 4 + 4),
    )
    for name, build, per_slot in builds:
        with pytest.raises(ValueError, match="^" + name + r": .* would take [\d,]+ bytes, more "
                                                         r"than the whole memory"):
            build(10**15)
        monkeypatch.setattr(_checks, "device_memory", lambda dev, n=3 * per_slot: n)
        made = build(3)
        tensors = [t for t in vars(made).values() if isinstance(t, torch.Tensor)]
        assert sum(t.numel() * t.element_size() for t in tensors) == 3 * per_slot
        assert all(not t.any() for t in tensors)
        with pytest.raises(ValueError, match=f"^{name}: .* would take {4 * per_slot:,} bytes, "
                                             rf"more than the whole memory of .* \({3 * per_slot:,} bytes\)$"):
            build(4)
        monkeypatch.undo()


def test_accept_on_host_tensors_checks_values_without_validate():
    """With every index tensor on the host the value checks cost no sync, so ``carry_accept``
    runs them whatever ``validate`` says (as ``ring_accept`` does): an accepted count above
    ``rows`` or a ``pend`` past ``CAP`` is refused and ``pend`` is left as it was."""
    g = torch.Generator().manual_seed(31)
    c = GdnCarry.empty(4, 2, 16, 16, cap=4, device="cpu")   # refused before any kernel: any machine
    c.pend.copy_(torch.randint(0, 3, (4,), generator=g, dtype=torch.int32))
    before = c.pend.clone()
    slots = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^accepted: .*4"):
        carry_accept(c, slots, torch.ones(2, dtype=torch.int32),
                     torch.tensor([4, 1], dtype=torch.int32), rows=3)
    c.pend[2] = 3
    before = c.pend.clone()
    with pytest.raises(ValueError, match=r"^carry.pend\[0\] after accept"):
        carry_accept(c, slots, torch.ones(2, dtype=torch.int32),
                     torch.tensor([1, 2], dtype=torch.int32), rows=3)
    assert torch.equal(c.pend, before)
    if DEVICE.type != "cpu":     # the kernel runs on host tensors in the interpreter only
        return
    carry_accept(c, slots, torch.tensor([2, 1], dtype=torch.int32),
                 torch.tensor([3, 1], dtype=torch.int32), rows=3)
    assert c.pend.tolist() == [3, before[1].item(), 4, before[3].item()]
