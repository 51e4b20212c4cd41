"""``SpecDecodeStep`` when a serving loop goes wrong: a layer verified twice in one step, a
verify stopped part-way (Ctrl-C in the interpreter; the arrival counts a stopped kernel leaves),
a slot forked while it holds pending rows, a partial reject followed by full accepts and plain
decodes, accepted counts above ``K``, and a batch mixing a speculative lane with a prefill
chunk. Every case is compared with plain decoding of the accepted rows (``conv_update`` +
``gdn_decode`` per token) or with the lane run alone, bitwise (the exact form's contract),
in both state layouts, from fresh seeded inputs.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import CarryLayer, GdnCarry, SpecDecodeStep, carry_accept
from pmll_lab.conv import ConvCarry, conv_update
from pmll_lab.gdn import gdn_decode
from pmll_lab.inputs import conv_inputs, gdn_inputs
from pmll_lab.serving import spec_decode_step

S, HK, HV, KD, VD, L = 5, 1, 2, 16, 16, 2
DIM, QK = 2 * HK * KD + HV * VD, 2 * HK * KD
LAYOUTS = pytest.mark.parametrize("layout", ["kv", "vk"])
F32 = torch.float32


def _split(y):
    return (y[..., :HK * KD].unflatten(-1, (HK, KD)), y[..., HK * KD:QK].unflatten(-1, (HK, KD)),
            y[..., QK:].unflatten(-1, (HV, VD)))


class Plain:
    """The stack's states and conv windows decoded one accepted token at a time."""

    def __init__(self, layers, layout):
        self.layers, self.layout = layers, layout
        self.st = [lay.state.clone() for lay in layers]
        self.cs = [lay.conv_state.clone() for lay in layers]

    def rows(self, slots, inputs, acc, outs=None, what=""):
        """Decode rows ``t < acc[b]`` of each lane; with ``outs`` (the verify's outputs per
        layer) assert those rows' outputs bitwise."""
        slot_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
        for t in range(inputs[0]["x"].shape[1]):
            sel = [b for b in range(len(slots)) if acc[b] > t]
            if not sel:
                break
            sel_t = torch.tensor(sel, device=DEVICE)
            for i, lay in enumerate(self.layers):
                y = conv_update(self.cs[i], inputs[i]["x"][sel_t, t], lay.conv_weight,
                                lay.conv_bias, state_indices=slot_t[sel_t], qk_channels=QK,
                                head_dim=KD)
                q, k, v = _split(y)
                o = gdn_decode(self.st[i], q, k, v, inputs[i]["g"][sel_t, t],
                               inputs[i]["beta"][sel_t, t], state_indices=slot_t[sel_t],
                               use_qk_l2norm=False, state_layout=self.layout)
                if outs is not None:
                    assert bitwise_equal(outs[i][sel_t, t], o), f"{what}: layer {i} row {t}"

    def fresh(self, step, slot, seed):
        """A new sequence in ``slot``: the same new state and window in both."""
        for i, lay in enumerate(step.layers):
            st = gdn_inputs(seed + i, 1, HK, HV, KD, VD, slots=1, dtype=F32,
                            state_layout=self.layout)["state"][0]
            cs = conv_inputs(seed + 20 + i, 1, DIM, slots=1, dtype=F32)["conv_state"][0]
            lay.state[slot], self.st[i][slot] = st, st
            lay.conv_state[slot], self.cs[i][slot] = cs, cs

    def check(self, step, slots, what):
        """Flush ``slots`` and compare their states and windows bitwise."""
        step.flush(slots)
        idx = torch.tensor(slots, device=DEVICE)
        for i, lay in enumerate(step.layers):
            assert bitwise_equal(lay.state[idx], self.st[i][idx]), f"{what}: state, layer {i}"
            assert bitwise_equal(lay.conv_state[idx], self.cs[i][idx]), f"{what}: window {i}"


def _stack(seed, layout, **kw):
    layers = []
    for i in range(L):
        st = gdn_inputs(seed + i, 1, HK, HV, KD, VD, slots=S, dtype=F32,
                        state_layout=layout)["state"]
        c = conv_inputs(seed + 50 + i, 1, DIM, slots=S, dtype=F32)
        layers.append(CarryLayer(st.clone(), GdnCarry.empty(S, HV, KD, VD, state_layout=layout),
                                 conv_state=c["conv_state"].clone(),
                                 conv_carry=ConvCarry.empty(S, DIM, dtype=torch.float32),
                                 conv_weight=c["weight"], conv_bias=c["bias"], num_k_heads=HK,
                                 state_layout=layout))
    return SpecDecodeStep(layers, validate=True, **kw), Plain(layers, layout)


def _inputs(seed, B, K):
    g = gdn_inputs(seed, B, HK, HV, KD, VD, rows=K, dtype=F32)
    return [dict(x=conv_inputs(seed * 7 + i, B, DIM, rows=K, dtype=F32)["x"], g=g["g"], beta=g["beta"])
            for i in range(L)]


def _run(step, plain, slots, seed, K, acc, what):
    """One verified step on ``slots``, accepted ``acc``, checked against plain decoding."""
    inputs = _inputs(seed, len(slots), K)
    outs = step.verify(slots, inputs)
    step.accept(acc)
    plain.rows(slots, inputs, acc, outs, what)


# ---- a layer verified twice ------------------------------------------------------------------

@LAYOUTS
@pytest.mark.parametrize("then", ["accept", "abort"])
def test_a_second_verify_of_a_layer_in_one_step_is_refused(layout, then):
    """Slots holding pending rows (an eager write-back step): ``verify_layer(0)`` again after it
    succeeded (a retry after an error in the caller's code) is refused naming the layer and
    changes nothing; the step then goes on (accept) or is abandoned (abort and run again), and
    every output and state equals plain decoding."""
    step, plain = _stack(600, layout, lazy_min_seqs=None)
    slots, K = [1, 3], 3
    _run(step, plain, slots, 601, K, [2, 3], "first step")
    inputs = _inputs(602, 2, K)
    step.begin(slots, K)
    o0 = step.verify_layer(0, **inputs[0])
    assert step.engaged[0].cpu().tolist() == [2, 2]           # the write-back step
    before = [t.clone() for lay in step.layers
              for t in (lay.state, lay.carry.buf, lay.conv_state, lay.conv_carry.stash)]
    with pytest.raises(ValueError, match=r"^i: layer 0 was already verified in this step"):
        step.verify_layer(0, **inputs[0])
    after = [t for lay in step.layers
             for t in (lay.state, lay.carry.buf, lay.conv_state, lay.conv_carry.stash)]
    assert all(bitwise_equal(a, b) for a, b in zip(before, after)), "the refusal wrote"
    if then == "accept":
        o1 = step.verify_layer(1, **inputs[1])
        step.accept([1, 2])
        plain.rows(slots, inputs, [1, 2], [o0, o1], "after the refusal")
    else:
        step.abort()
        _run(step, plain, slots, 602, K, [1, 2], "after abort")
    _run(step, plain, slots, 603, K, [3, 0], "next step")
    plain.check(step, slots, "end")


def test_a_layer_whose_verify_failed_after_its_conv_ran_is_refused_too():
    step, _ = _stack(610, "kv", lazy_min_seqs=None)
    step.begin([0, 2], 2)
    bad = _inputs(611, 2, 2)[0]
    bad["g"] = bad["g"][..., :1].contiguous()                   # the GDN check fails
    with pytest.raises(ValueError, match="^g"):
        step.verify_layer(0, **bad)
    with pytest.raises(ValueError, match=r"^i: layer 0's verify failed part-way"):
        step.verify_layer(0, **_inputs(612, 2, 2)[0])


# ---- a verify stopped part-way -----------------------------------------------------------------

@contextlib.contextmanager
def _stopped_at(where: str, n: int):
    """The next interpreted kernel launch stops (``KeyboardInterrupt``, as Ctrl-C does) before
    its ``n+1``-th program (``where="program"``) or its ``n+1``-th atomic
    (``where="atomic"``: inside a program, after it counted itself in the arrival counts and
    before the last one resets them). The interpreter runs programs one by one, in place, so
    what ran stays written."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    name = {"program": "set_grid_idx", "atomic": "create_atomic_rmw"}[where]
    run = getattr(builder, name)
    count = [0]

    def stop(*args):
        if count[0] == n:
            raise KeyboardInterrupt
        count[0] += 1
        return run(*args)

    setattr(builder, name, stop)
    try:
        yield
    finally:
        delattr(builder, name)


def _stop_gdn_verify(monkeypatch, where: str, n: int):
    """Layer verifies stop their GDN launch as ``_stopped_at`` says; returns the undo."""
    real = spec_decode_step.gdn_carry_verify

    def stopped(*args, **kw):
        with _stopped_at(where, n):
            return real(*args, **kw)

    monkeypatch.setattr(spec_decode_step, "gdn_carry_verify", stopped)
    return lambda: monkeypatch.setattr(spec_decode_step, "gdn_carry_verify", real)


@LAYOUTS
def test_reset_after_a_stopped_verify_makes_every_slot_new(layout):
    """A write-back verify stopped part-way leaves arrival counts above zero (what the
    interpreter's Ctrl-C, or a killed kernel, leaves on the carry); ``GdnCarry.reset`` of every
    slot clears them with the stash, so later write-back verifies from new states equal plain
    decoding (they restashed from the wrong program before)."""
    step, plain = _stack(620, layout, lazy_min_seqs=None)
    slots = [0, 2, 4]
    _run(step, plain, slots, 621, 3, [2, 1, 3], "before")
    for lay in step.layers:                     # what a stopped write-back launch leaves
        lay.carry._arrivals[torch.tensor(slots, device=DEVICE)] = 1
    for lay in step.layers:
        lay.carry.reset(list(range(S)))
        lay.conv_carry.reset(list(range(S)))
    for s in range(S):
        plain.fresh(step, s, 630 + 3 * s)
    for n, acc in enumerate(([2, 3, 1], [3, 1, 2], [1, 2, 3])):
        _run(step, plain, slots, 640 + n, 3, acc, f"after reset, step {n}")
    plain.check(step, slots, "end")


@pytest.mark.skipif(not INTERPRET, reason="a kernel stopped part-way by Ctrl-C: the Triton "
                    "interpreter runs its programs one by one (on a GPU the process dies)")
@pytest.mark.parametrize("layout, lazy, where", [
    ("kv", True, "atomic"), ("vk", True, "program"), ("kv", False, "program"),
    ("vk", False, "atomic")])
def test_abort_after_a_verify_stopped_part_way(layout, lazy, where, monkeypatch):
    """Layer 0's GDN verify (its conv ran) stopped after its first program, or inside its
    second atomic (an arrival count left above zero). Lazy (no write-back possible): abort keeps every
    slot, and later steps, write-backs included, equal plain decoding as if the step had never
    been drafted. Eager: the slots with pending rows may hold half a write-back, so abort
    returns them as lost (reset; refused until set anew and reset); the slot without pending
    rows is kept; a lost slot set anew runs as plain decoding again."""
    step, plain = _stack(650, layout, lazy_min_seqs=2 if lazy else None, eager_max_pending=None)
    slots, K = [1, 3, 4], 3
    _run(step, plain, slots, 651, K, [2, 0, 3], "first step")     # pend 2, 0, 3
    undo = _stop_gdn_verify(monkeypatch, where, 1)
    with pytest.raises(KeyboardInterrupt):
        step.verify(slots, _inputs(652, 3, K))
    undo()
    with pytest.raises(ValueError, match="^begin: the previous step"):
        step.begin(slots, K)
    lost = step.abort()
    if lazy:
        assert lost == []
    else:
        assert lost == [1, 4]
        with pytest.raises(ValueError, match=r"^slots: slot\(s\) \[4\] lost their state"):
            step.verify([4], _inputs(653, 1, K))
        with pytest.raises(ValueError, match=r"^slots: slot\(s\) \[1\] lost their state"):
            step.flush([1, 3])
        for s in lost:
            plain.fresh(step, s, 660 + s)
        step.reset(lost)
    for n, acc in enumerate(([3, 1, 2], [1, 3, 3], [2, 2, 1], [3, 3, 3])):
        _run(step, plain, slots, 670 + n, K, acc, f"after abort, step {n}")
    plain.check(step, slots, "end")


# ---- forks, rejects, accepted counts, mixed batches ----------------------------------------------

@LAYOUTS
def test_a_slot_forked_while_it_holds_pending_rows_continues_as_its_source(layout):
    """Slot 0 holds pending rows in every carry (lazy accepts); ``copy_slots(0 -> 3)`` forks
    it; the source and the fork then decode different drafts, each equal to plain decoding
    from the forked point. Refused: a fork during a step, ``dst`` inside ``src``."""
    step, plain = _stack(700, layout, lazy_min_seqs=1, eager_max_pending=None)
    _run(step, plain, [0, 1], 701, 3, [2, 3], "before the fork")
    _run(step, plain, [0, 1], 702, 2, [1, 2], "before the fork")
    assert all(int(c.pend[0]) == 3 for lay in step.layers for c in lay.carries())
    step.begin([0], 2)
    with pytest.raises(ValueError, match="^copy_slots: a step is in progress"):
        step.copy_slots([0], [3])
    step.abort()
    with pytest.raises(ValueError, match=r"^dst: slot 0 is also in src"):
        step.copy_slots([0, 1], [0, 3])
    step.copy_slots([0], [3])
    for i in range(L):
        plain.st[i][3], plain.cs[i][3] = plain.st[i][0], plain.cs[i][0]
    assert all(int(c.pend[3]) == 3 for lay in step.layers for c in lay.carries())
    for n, acc in enumerate(([2, 3, 1], [3, 0, 3], [1, 2, 2])):
        _run(step, plain, [0, 3, 1], 710 + n, 3, acc, f"after the fork, step {n}")
    plain.check(step, [0, 1, 3], "end")


def test_a_decode_forking_into_a_slot_with_pending_rows_is_refused():
    """``gdn_decode(out_state_indices=...)`` (a fork through a decode) into a slot whose carry
    holds pending rows of the state it would replace: refused with ``carry=`` and
    ``validate=True``, naming ``carry.pend`` and the slot, nothing written; into a slot with
    none it runs."""
    x = gdn_inputs(735, 1, HK, HV, KD, VD, slots=S, dtype=F32)
    carry = GdnCarry.empty(S, HV, KD, VD)
    carry.pend[3] = 2
    state = x["state"].clone()
    args = (state, x["q"], x["k"], x["v"], x["g"], x["beta"])
    src = torch.tensor([0], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^carry\.pend: write slot 3 holds 2 accepted carry "
                                         r"rows of the state this launch replaces"):
        gdn_decode(*args, state_indices=src, carry=carry, validate=True,
                   out_state_indices=torch.tensor([3], dtype=torch.int32, device=DEVICE))
    assert bitwise_equal(state, x["state"])
    gdn_decode(*args, state_indices=src, carry=carry, validate=True,
               out_state_indices=torch.tensor([4], dtype=torch.int32, device=DEVICE))
    assert not bitwise_equal(state[4], x["state"][4]) and bitwise_equal(state[0], x["state"][0])


def test_a_ring_slot_forked_while_it_holds_rows_verifies_as_its_source():
    """The ring form: slot 1 holds accepted ring rows (``len > 0``); ``GdnRing.copy_slots``
    with the state copied beside it gives slot 4 the same window, so one verify of both on the
    same rows gives the same outputs and folds, bitwise."""
    from pmll_lab.carry import GdnRing, gdn_ring_verify, ring_accept

    HKr, HVr, kd, vd, K = 1, 2, 16, 32, 3
    x = gdn_inputs(720, 2, HKr, HVr, kd, vd, rows=K, slots=6, dtype=F32)
    state = x["state"].contiguous()                       # V-major, the ring form's layout
    ring = GdnRing.empty(6, HKr, HVr, kd, vd, length=8)
    slots = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    for n in range(2):
        y = gdn_inputs(721 + n, 2, HKr, HVr, kd, vd, rows=K, dtype=F32)
        _, eng = gdn_ring_verify(state, ring, y["q"], y["k"], y["v"], y["g"], y["beta"],
                                 slot_tab=slots)
        ring_accept(ring, slots, eng, torch.tensor([3, 2], dtype=torch.int32, device=DEVICE),
                    rows=K)
    assert int(ring.len[1]) == 6
    ring.copy_slots([1], [4])
    state[4] = state[1]
    y = gdn_inputs(730, 1, HKr, HVr, kd, vd, rows=K, dtype=F32)
    both = {k: torch.cat([y[k], y[k]]) for k in ("q", "k", "v", "g", "beta")}
    pair = torch.tensor([1, 4], dtype=torch.int32, device=DEVICE)
    o, eng = gdn_ring_verify(state, ring, both["q"], both["k"], both["v"], both["g"],
                             both["beta"], slot_tab=pair)
    assert eng.cpu().tolist() == [2, 2]                        # 6 + 3 > 8: both fold
    assert bitwise_equal(o[0], o[1]) and bitwise_equal(state[1], state[4])
    with pytest.raises(ValueError, match=r"^accepted: .*\[0, 3\]"):      # a > K = 3, untold
        ring_accept(ring, pair, eng, torch.tensor([4, 1], dtype=torch.int32, device=DEVICE))


@LAYOUTS
def test_a_partial_reject_then_full_accepts_and_plain_decodes_equal_plain_decoding(layout):
    """One row of four accepted (three rejected), then full accepts with growing acceptance,
    then plain decodes (``gdn_decode`` after a flush, as a form switch does): nothing of the
    rejected rows comes back in any later step; every output and state equals plain
    decoding. (This held before these checks were added.)"""
    step, plain = _stack(740, layout, lazy_min_seqs=None)
    slots = [2, 0]
    _run(step, plain, slots, 741, 4, [1, 1], "partial reject")
    for n in range(3):
        _run(step, plain, slots, 742 + n, 4, [4, 4], f"full accept {n}")
    step.flush(slots)
    for n in range(2):                          # plain decodes on the carried stack's states
        inputs = _inputs(750 + n, 2, 1)
        slot_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
        outs = []
        for i, lay in enumerate(step.layers):
            y = conv_update(lay.conv_state, inputs[i]["x"][:, 0], lay.conv_weight,
                            lay.conv_bias, state_indices=slot_t, qk_channels=QK, head_dim=KD)
            q, k, v = _split(y)
            outs.append(gdn_decode(lay.state, q, k, v, inputs[i]["g"][:, 0],
                                   inputs[i]["beta"][:, 0], state_indices=slot_t,
                                   use_qk_l2norm=False, state_layout=layout,
                                   carry=lay.carry, validate=True)[:, None])
        plain.rows(slots, inputs, [1, 1], outs, f"plain decode {n}")
    _run(step, plain, slots, 760, 4, [2, 4], "verify after the decodes")
    plain.check(step, slots, "end")


def test_accepted_counts_above_k_never_reach_the_commit():
    """``a > K`` after a K = 2 verify: the driver refuses host ints and CPU tensors always and
    a device tensor with ``validate=True`` (without it a device tensor's values would need a
    sync per step: the documented choice), naming ``accepted``, with every ``pend`` unchanged
    (this held before). ``carry_accept`` refuses it told ``rows=K``, and now also untold: the
    verify's ``engaged`` flags carry its ``K`` (before, only ``a <= CAP`` was checked there).
    The step then accepts valid counts."""
    step, _ = _stack(770, "kv", lazy_min_seqs=None)
    step.verify([1, 2], _inputs(771, 2, 4))
    step.accept([4, 4])
    step.verify([1, 2], _inputs(772, 2, 2))
    pends = [c.pend.clone() for lay in step.layers for c in lay.carries()]
    for bad in ([3, 1], [0, 4], torch.tensor([1, 3]),
                torch.tensor([3, 2], dtype=torch.int32, device=DEVICE)):
        with pytest.raises(ValueError, match=r"^accepted"):
            step.accept(bad)
        assert all(bitwise_equal(c.pend, p) for c, p in
                   zip([c for lay in step.layers for c in lay.carries()], pends))
    carries = [c for lay in step.layers for c in lay.carries()]
    slot_t = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^accepted: entries must lie in \[0, 2\]"):
        carry_accept(carries, slot_t, step.engaged[0], [3, 0], rows=2)
    with pytest.raises(ValueError, match=r"^accepted: entries must lie in \[0, 2\]"):
        carry_accept(carries, slot_t, step.engaged[0], [3, 0])
    assert all(bitwise_equal(c.pend, p) for c, p in zip(carries, pends))
    step.accept([2, 1])
    assert [int(c.pend[1]) for c in carries] == [2] * len(carries)


@LAYOUTS
def test_a_batch_mixing_a_speculative_lane_and_a_prefill_chunk_equals_each_run_alone(layout):
    """One batch: slot 1 verifies drafts over pending rows (partly accepted), slot 3 takes a
    new prompt's first rows as a chunk accepted whole (a prefill through the carry). Run as
    one batch (lazy) and each lane alone (eager, other stacks): outputs and states bitwise the
    same lane by lane."""
    mixed, _ = _stack(780, layout, lazy_min_seqs=2)
    alone = {s: _stack(780, layout, lazy_min_seqs=2)[0] for s in (1, 3)}
    hist = _inputs(781, 1, 3)
    for st in [mixed, alone[1]]:
        st.verify([1], hist)
        st.accept([2])                             # slot 1 holds 2 pending rows
    for n, (acc1, acc3) in enumerate(((1, 4), (3, 4), (0, 4))):
        inputs = _inputs(790 + n, 2, 4)
        outs = mixed.verify([1, 3], inputs)
        mixed.accept([acc1, acc3])
        for b, (s, a) in enumerate(((1, acc1), (3, acc3))):
            lane = [{k: v[b:b + 1] for k, v in inp.items()} for inp in inputs]
            o = alone[s].verify([s], lane)
            alone[s].accept([a])
            for i in range(L):
                assert bitwise_equal(outs[i][b], o[i][0]), f"step {n} slot {s} layer {i}"
    for s, st in alone.items():
        mixed.flush([s])
        st.flush([s])
        for la, lb in zip(mixed.layers, st.layers):
            assert bitwise_equal(la.state[s], lb.state[s]), f"slot {s} state"
            assert bitwise_equal(la.conv_state[s], lb.conv_state[s]), f"slot {s} window"
