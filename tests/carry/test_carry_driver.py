"""``SpecDecodeStep`` when a step goes wrong, and host-side checks of accepted counts.

- ``verify`` checks every layer's inputs before its first launch: a bad layer 1 leaves layer 0's
  state, stash and ``pend`` bitwise as they were, and the driver stays usable.
- ``abort()`` (and ``reset``, which calls it) after a step verified part-way through the stack
  puts the layers back in step: the states then equal the states of a stack that never ran the
  step and flushed the same slots (bitwise: the exact form's folds are the flush's arithmetic,
  as tests/carry/test_carry_protocol.py's end-to-end test shows), every ``pend`` of those slots is 0,
  and the next step runs.
- ``accepted`` given as host ints is checked against ``K`` with no device sync:
  ``SpecDecodeStep.accept`` (which knows ``K``) and ``carry_accept`` (``rows=K``, else ``CAP``)
  raise ``ValueError`` naming ``accepted`` and change no ``pend``.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import CarryLayer, GdnCarry, SpecDecodeStep, carry_accept
from pmll_lab.conv import ConvCarry
from pmll_lab.inputs import conv_inputs, gdn_inputs

S, HK, HV, KD, VD = 4, 1, 2, 16, 16
DIM = 2 * HK * KD + HV * VD


def _stack(seed, L=2, conv=False):
    layers = []
    for i in range(L):
        st = gdn_inputs(seed + i, 1, HK, HV, KD, VD, slots=S, dtype=torch.float32,
                        state_layout="kv")["state"]
        kw = {}
        if conv:
            c = conv_inputs(seed + 50 + i, 1, DIM, slots=S, dtype=torch.float32)
            kw = dict(conv_state=c["conv_state"].clone(),
                      conv_carry=ConvCarry.empty(S, DIM, dtype=torch.float32),
                      conv_weight=c["weight"], conv_bias=c["bias"], num_k_heads=HK)
        layers.append(CarryLayer(st.clone(), GdnCarry.empty(S, HV, KD, VD, state_layout="kv"),
                                 state_layout="kv", **kw))
    return layers


def _inputs(seed, B, K, conv=False, vd=VD):
    x = gdn_inputs(seed, B, HK, HV, KD, vd, rows=K, dtype=torch.float32, state_layout="kv")
    if conv:
        return dict(x=conv_inputs(seed + 1, B, DIM, rows=K, dtype=torch.float32)["x"],
                    g=x["g"], beta=x["beta"])
    return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"])


def _snapshot(layers):
    out = []
    for lay in layers:
        t = [lay.state, lay.carry.buf, lay.carry.pend]
        if lay.has_conv:
            t += [lay.conv_state, lay.conv_carry.stash, lay.conv_carry.pend]
        out.append([x.clone() for x in t])
    return out


def _same(a, b):
    return all(bitwise_equal(x, y) for la, lb in zip(a, b) for x, y in zip(la, lb))


@pytest.mark.parametrize("conv", [False, True], ids=["gdn", "conv+gdn"])
def test_verify_checks_every_layer_before_any_launch(conv):
    layers = _stack(300, conv=conv)
    step = SpecDecodeStep(layers)
    slots, K = [0, 2], 3
    step.verify(slots, [_inputs(310 + i, 2, K, conv) for i in range(2)])
    step.accept([2, 1])                  # pend 2, 1: the next eager verify writes back
    before = _snapshot(layers)
    bad = [_inputs(320, 2, K, conv), _inputs(321, 2, K, conv)]
    if conv:
        bad[1]["g"] = bad[1]["g"][..., :1].contiguous()         # g [B, K, 1]: HV is 2
        arg = "g"
    else:
        bad[1] = _inputs(321, 2, K, vd=VD + 1)
        arg = "v"
    with pytest.raises(ValueError, match=rf"^inputs\[1\]: {arg}"):
        step.verify(slots, bad)
    assert _same(_snapshot(layers), before), "a layer was launched before layer 1's check"
    bad[1] = _inputs(322, 2, K + 1, conv)                        # rows differ between layers
    with pytest.raises(ValueError, match=r"^inputs\[1\]: (q|x)"):
        step.verify(slots, bad)
    assert _same(_snapshot(layers), before)
    step.verify(slots, [_inputs(330 + i, 2, K, conv) for i in range(2)])   # usable
    step.accept([1, 3])
    assert [lay.carry.pend.cpu().tolist() for lay in layers] == [[1, 0, 3, 0]] * 2


@pytest.mark.parametrize("lazy_min_seqs", [None, 1], ids=["eager", "lazy"])
@pytest.mark.parametrize("how", ["abort", "reset"])
def test_abort_after_a_partly_verified_step(lazy_min_seqs, how):
    """Eager: layer 0 writes back (pend 2 -> state) before layer 1 fails. Lazy: layer 0 stashes
    past pend. Either way abort leaves both layers as a plain flush of the step's slots."""
    layers = _stack(400, conv=True)
    step = SpecDecodeStep(layers, lazy_min_seqs=lazy_min_seqs, eager_max_pending=None)
    slots, K = [3, 1], 2
    step.verify(slots, [_inputs(410 + i, 2, K, conv=True) for i in range(2)])
    step.accept([2, 1])
    twin = _stack(400, conv=True)
    for lay, t in zip(layers, twin):                        # the same stack, never verified
        for name in ("state", "conv_state"):
            getattr(t, name).copy_(getattr(lay, name))
        t.carry.buf.copy_(lay.carry.buf)
        t.carry.pend.copy_(lay.carry.pend)
        t.conv_carry.stash.copy_(lay.conv_carry.stash)
        t.conv_carry.pend.copy_(lay.conv_carry.pend)
    SpecDecodeStep(twin).flush(slots)

    plan = step.begin(slots, K)
    assert plan["lazy"] == (lazy_min_seqs is not None)
    step.verify_layer(0, **_inputs(420, 2, K, conv=True))
    assert step.engaged[0].cpu().tolist() == ([1, 1] if plan["lazy"] else [2, 2])
    bad = _inputs(421, 2, K, conv=True)
    bad["g"] = bad["g"][..., :1].contiguous()
    with pytest.raises(ValueError, match="^g"):
        step.verify_layer(1, **bad)
    with pytest.raises(ValueError, match="begin"):
        step.begin(slots, K)
    if how == "abort":
        step.abort()
    else:
        step.reset([0])                  # another slot: the step is aborted all the same
    for lay, t in zip(layers, twin):
        assert bitwise_equal(lay.state, t.state), "GDN state after abort"
        assert bitwise_equal(lay.conv_state, t.conv_state), "conv window after abort"
        for c in lay.carries():
            assert c.pend.cpu()[slots].tolist() == [0, 0]
    step.verify(slots, [_inputs(430 + i, 2, K, conv=True) for i in range(2)])      # usable
    step.accept([K, 0])
    assert all(c.pend.cpu()[slots].tolist() == [K, 0] for lay in layers for c in lay.carries())


def test_accept_rejects_host_counts_above_k():
    """The finding's case: K = 6 accepted, then K = 3 with a = 5 (rows 3, 4 would be stale rows
    of the previous step)."""
    lay = _stack(500, L=1)[0]
    step = SpecDecodeStep([lay])
    step.verify([1], [_inputs(510, 1, 6)])
    step.accept([6])
    step.verify([1], [_inputs(511, 1, 3)])
    pend = lay.carry.pend.clone()
    for acc in ([5], [4], [-1], torch.tensor([4])):
        with pytest.raises(ValueError, match="^accepted"):
            step.accept(acc)
        assert bitwise_equal(lay.carry.pend, pend), "a refused accept changed pend"
    step.accept([3])                              # the step is still open: a valid accept works
    assert lay.carry.pend.cpu().tolist() == [0, 3, 0, 0]


def test_carry_accept_checks_host_counts_without_validate():
    carries = [GdnCarry.empty(S, HV, KD, VD), ConvCarry.empty(S, DIM)]
    gen = torch.Generator().manual_seed(520)
    pend0 = torch.randint(0, 4, (S,), generator=gen, dtype=torch.int32)
    for c in carries:
        c.pend.copy_(pend0)
    slots = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    eng = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    cap = carries[0].cap
    for acc, kw in (([4, 1], dict(rows=3)), ([0, -1], dict(rows=3)), ([cap + 1, 0], {})):
        with pytest.raises(ValueError, match="^accepted"):
            carry_accept(carries, slots, eng, acc, **kw)
        assert all(c.pend.cpu().tolist() == pend0.tolist() for c in carries)
    carry_accept(carries, slots, eng, [3, 2], rows=3)
    want = pend0.clone()
    want[2] += 3
    want[0] = 2
    assert all(c.pend.cpu().tolist() == want.tolist() for c in carries)
