"""The carried-state protocol end to end: ``SpecDecodeStep`` and its policy (SPEC §3b, §3c).

A stack of two layers (conv twin + GDN) runs through ``SpecDecodeStep`` over random batches that
cross the lazy threshold, random acceptance counts (0 and K included), slot resets and flushes,
and is compared with plain decoding (``conv_update`` + ``gdn_decode`` one token at a time):
bitwise, with bf16 and with fp32 inputs and states. The policy test
counts host syncs and policy flushes of lazy and eager steps (no numbers compared).
"""

from __future__ import annotations

import random

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import CarryLayer, GdnCarry, SpecDecodeStep
from pmll_lab.inputs import conv_inputs, gdn_inputs

from _carry_helpers import _close


# ---- the end-to-end property -----------------------------------------------------------------

def _split(y, HK, HV, kd, vd):
    qk = 2 * HK * kd
    return (y[..., :HK * kd].unflatten(-1, (HK, kd)), y[..., HK * kd:qk].unflatten(-1, (HK, kd)),
            y[..., qk:].unflatten(-1, (HV, vd)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_end_to_end_equals_plain_decoding(dtype):
    """Two layers (conv twin + GDN), 10 steps: batch widths 1..5 across lazy_min_seqs = 3,
    K in 1..4, accepted counts in 0..K (0 and K forced), eager_max_pending = 2 (the policy
    flushes), a slot reset and reused for a new sequence, an explicit flush in between.
    Accepted rows' outputs and the states after folding equal plain decoding
    (``conv_update`` + ``gdn_decode`` per token), bitwise."""
    from pmll_lab.conv import ConvCarry, conv_update
    from pmll_lab.gdn import gdn_decode

    S, HK, HV, kd, vd, L = 6, 1, 2, 16, 16, 2
    dim, qk = 2 * HK * kd + HV * vd, 2 * HK * kd
    rng = random.Random(7)
    layers, plain = [], []
    for layer in range(L):
        st = gdn_inputs(70 + layer, 1, HK, HV, kd, vd, slots=S, dtype=dtype,
                        state_layout="kv")["state"]
        ci = conv_inputs(80 + layer, 1, dim, slots=S, dtype=dtype)
        layers.append(CarryLayer(st.clone(), GdnCarry.empty(S, HV, kd, vd, state_layout="kv"),
                                 conv_state=ci["conv_state"].clone(),
                                 conv_carry=ConvCarry.empty(S, dim, dtype=dtype),
                                 conv_weight=ci["weight"], conv_bias=ci["bias"], num_k_heads=HK,
                                 state_layout="kv"))
        plain.append((st.clone(), ci["conv_state"].clone()))
    step = SpecDecodeStep(layers, form="exact", lazy_min_seqs=3, eager_max_pending=2, validate=True)

    def compare_states(what):
        for layer, (lay, (pst, pcs)) in enumerate(zip(layers, plain)):
            assert bitwise_equal(lay.conv_state, pcs), f"{what}: conv window layer {layer}"
            assert bitwise_equal(lay.state, pst), f"{what}: state layer {layer} not bitwise"

    widths = [1, 4, 5, 5, 2, 3, 1, 5, 2, 4]
    rows = [2, 4, 4, 4, 3, 1, 4, 2, 3, 4]
    seen = dict(engaged=set(), a0=False, aK=False, flushed=0)
    for n, (B, K) in enumerate(zip(widths, rows)):
        if n == 5:                       # sequence in slot 2 ends; a new one takes the slot
            step.reset([2])
            fresh = gdn_inputs(90, 1, HK, HV, kd, vd, slots=1, dtype=dtype,
                               state_layout="kv")["state"][0]
            fresh_conv = conv_inputs(91, 1, dim, slots=1, dtype=dtype)["conv_state"][0]
            for lay, (pst, pcs) in zip(layers, plain):
                lay.state[2], pst[2] = fresh, fresh
                lay.conv_state[2], pcs[2] = fresh_conv, fresh_conv
        if n == 7:
            step.flush(list(range(S)))
            compare_states("after flush")
        slots = rng.sample(range(S), B)
        g_in = gdn_inputs(100 + n, B, HK, HV, kd, vd, rows=K, dtype=dtype, state_layout="kv")
        xs = [conv_inputs(200 + 10 * n + layer, B, dim, rows=K, dtype=dtype)["x"] for layer in range(L)]
        inputs = [dict(x=xs[layer], g=g_in["g"], beta=g_in["beta"]) for layer in range(L)]
        plan_before = dict(step.stats)
        outs = step.verify(slots, inputs)
        seen["flushed"] += step.stats["flushes"] - plan_before["flushes"]
        seen["engaged"] |= {(B >= 3, e) for e in step.engaged[0].cpu().tolist()}
        acc = [rng.randint(0, K) for _ in range(B)]
        acc[0] = K if n % 2 else 0
        if B > 1:
            acc[1] = 0 if n % 2 else K
        seen["a0"] |= 0 in acc
        seen["aK"] |= K in acc
        step.accept(acc if n % 3 else torch.tensor(acc, device=DEVICE))

        slot_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
        for t in range(K):
            sel = [b for b in range(B) if acc[b] > t]
            if not sel:
                break
            sel_t = torch.tensor(sel, device=DEVICE)
            for layer, (pst, pcs) in enumerate(plain):
                y = conv_update(pcs, xs[layer][sel_t, t], layers[layer].conv_weight,
                                layers[layer].conv_bias, state_indices=slot_t[sel_t],
                                qk_channels=qk, head_dim=kd)
                q, k, v = _split(y, HK, HV, kd, vd)
                o = gdn_decode(pst, q, k, v, g_in["g"][sel_t, t], g_in["beta"][sel_t, t],
                               state_indices=slot_t[sel_t], use_qk_l2norm=False, state_layout="kv")
                got = outs[layer][sel_t, t]
                assert bitwise_equal(got, o), f"step {n} row {t} layer {layer}: output not bitwise"
    step.flush(list(range(S)))
    compare_states("final")
    assert {(False, 1), (False, 2), (True, 1), (True, 2)} <= seen["engaged"], seen["engaged"]
    assert seen["a0"] and seen["aK"] and seen["flushed"] >= 1
    assert step.stats["lazy_steps"] and step.stats["eager_steps"]
    assert all(int(c.pend.abs().sum()) == 0 for lay in layers for c in lay.carries())


def test_policy_syncs_only_when_needed():
    """Lazy steps and eager steps under the bound never sync; the first eager step after lazy
    ones with device-side counts syncs once and flushes the slots holding too many rows."""
    S, HV, kd, vd, K = 4, 2, 16, 16, 2
    st = gdn_inputs(5, 1, 1, HV, kd, vd, slots=S, dtype=torch.float32, state_layout="kv")["state"]
    lay = CarryLayer(st, GdnCarry.empty(S, HV, kd, vd, state_layout="kv"), state_layout="kv")
    step = SpecDecodeStep([lay], lazy_min_seqs=2, eager_max_pending=1)

    def run(slots, acc):
        x = gdn_inputs(len(slots) * 7 + step.stats["steps"], len(slots), 1, HV, kd, vd, rows=K,
                       dtype=torch.float32, state_layout="kv")
        plan = step.begin(slots, K)
        step.verify_layer(0, q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"])
        step.accept(acc)
        return plan

    # counts on the GPU are device-side: the host bounds both slots by K = 2 until it reads
    # them; on the CPU the same tensor is host memory and the counts are known exactly
    on_device = DEVICE.type != "cpu"
    assert run([0, 1], torch.tensor([2, 1], device=DEVICE)) == dict(lazy=True, flushed=0, synced=False)
    assert lay.carry.pend.tolist()[:2] == [2, 1]
    assert run([0], [1]) == dict(lazy=False, flushed=1, synced=True)     # bound 2 > 1: sync, flush
    assert lay.carry.pend.tolist()[0] == 1
    # slot 1: pend 1 <= 1, known on the CPU; bounded by 2 on a GPU, so read (no flush)
    assert run([1], [0]) == dict(lazy=False, flushed=0, synced=on_device)
    assert run([0], [1]) == dict(lazy=False, flushed=0, synced=False)    # eager accepts: known
    assert step.stats["host_syncs"] == 1 + on_device and step.stats["flushes"] == 1
