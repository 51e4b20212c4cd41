"""bf16 / fp16 state pools: arithmetic in fp32, the state rounded where a decode stores it.

Decode rounds the new state once per token; the chain, the exact carry verify, its folds and
the flush round the state they keep in registers after every row, so the exact family stays
bitwise equal to plain decoding on a bf16 state (both layouts). Snapshots are in the state's
dtype; the stash keeps fp32 rows. The float64 references take ``state_dtype`` and round at the
same points.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.carry import (CarryLayer, GdnCarry, SpecDecodeStep, carry_accept, gdn_carry_flush,
                            gdn_carry_verify)
from pmll_lab.gdn import gdn_chain, gdn_chain_plan, gdn_chain_ref, gdn_decode, gdn_decode_ref
from pmll_lab.inputs import gdn_inputs
from pmll_lab.reference import carry as R

HK, HV, KD, VD = 1, 2, 16, 24
NAMES = ("q", "k", "v", "g", "beta")


def _state(x, layout, dtype):
    st = x["state"] if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
    return st.to(dtype)


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("sdt", [torch.bfloat16, torch.float16])
def test_decode_and_chain_match_reference_with_rounding_points(layout, sdt):
    """Outputs and states within fp32-arithmetic tolerances of the float64 reference that
    rounds the state to ``sdt`` at the same points (the state to 1 ulp of ``sdt``: a rounding
    boundary may fall between the two), and farther from the unrounded reference."""
    K = 4
    x = gdn_inputs(3, 3, HK, HV, KD, VD, rows=K, slots=4, dtype=torch.bfloat16, state_layout="kv")
    st = _state(x, layout, sdt)
    rows = [x[n] for n in NAMES]
    a = st.clone()
    inter = torch.empty(3, K - 1, *st.shape[1:], dtype=sdt, device=DEVICE)
    o = gdn_chain(a, *rows, state_indices=x["state_indices"], intermediate=inter,
                  out_dtype=torch.float32, state_layout=layout)
    ref = [t.cpu() for t in (st, *rows)]
    o_r, st_r, in_r = gdn_chain_ref(*ref, state_indices=x["state_indices"].cpu(),
                                    state_layout=layout, state_dtype=sdt)
    assert errors(o, o_r)["rel_l2"] < 1e-5
    ulp = torch.finfo(sdt).eps
    assert (a.double().cpu() - st_r).abs().max() <= ulp * st_r.abs().max()
    assert (inter.double().cpu() - in_r).abs().max() <= ulp * in_r.abs().max()
    assert errors(a, st_r)["rel_l2"] < 1e-3
    o_64, _, _ = gdn_chain_ref(*ref, state_indices=x["state_indices"].cpu(), state_layout=layout)
    assert errors(o, o_64)["rel_l2"] > errors(o, o_r)["rel_l2"], "rounding points are visible"
    b = st.clone()
    o1 = gdn_decode(b, *[t[:, 0].contiguous() for t in rows], state_indices=x["state_indices"],
                    out_dtype=torch.float32, state_layout=layout)
    o1_r, s1_r = gdn_decode_ref(ref[0], *[t[:, 0] for t in ref[1:]],
                                state_indices=x["state_indices"].cpu(), state_layout=layout,
                                state_dtype=sdt)
    assert errors(o1, o1_r)["rel_l2"] < 1e-5
    assert (b.double().cpu() - s1_r).abs().max() <= ulp * s1_r.abs().max()


@pytest.mark.parametrize("layout,sdt", [("kv", torch.bfloat16), ("vk", torch.bfloat16),
                                        ("kv", torch.float16)])
def test_chain_bitwise_equals_decodes_on_a_half_state(layout, sdt):
    for K in (3, 6):               # unrolled, and the runtime row loop (K > 4)
        x = gdn_inputs(5 + K, 3, HK, HV, KD, VD, rows=K, slots=4, dtype=torch.bfloat16,
                       state_layout="kv")
        st = _state(x, layout, sdt)
        rows = [x[n] for n in NAMES]
        kw = dict(state_indices=x["state_indices"], state_layout=layout)
        a, b = st.clone(), st.clone()
        inter = torch.empty(3, K - 1, *st.shape[1:], dtype=sdt, device=DEVICE)
        o = gdn_chain(a, *rows, intermediate=inter, **kw)
        for t in range(K):
            o_t = gdn_decode(b, *[r[:, t].contiguous() for r in rows], **kw)
            assert bitwise_equal(o[:, t], o_t), f"K={K} row {t} output"
            if t < K - 1:
                assert bitwise_equal(inter[:, t], b[x["state_indices"].long()]), f"snapshot {t}"
        assert bitwise_equal(a, b), f"K={K} final state"
        c = st.clone()
        assert bitwise_equal(gdn_chain_plan(c, *rows, **kw)(), o) and bitwise_equal(c, b), "plan"


def _decode_accepted(plain, x, slots, acc, layout):
    outs = []
    for t in range(x["q"].shape[1]):
        live = [b for b in range(len(acc)) if acc[b] > t]
        if not live:
            break
        sel = torch.tensor(live, device=DEVICE)
        o_t = gdn_decode(plain, *[x[n][sel, t] for n in NAMES], state_indices=slots[sel],
                         state_layout=layout)
        outs.append((t, sel, o_t))
    return outs


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_carry_protocol_bitwise_equals_plain_decoding_on_a_bf16_state(layout, lazy):
    """Verify + accept steps and a final flush on a bf16 state: every accepted output and the
    flushed state bitwise equal to plain bf16-state decoding; the float64 protocol reference
    with the same rounding points agrees to 1e-2 (rel L2: a fp32 value and its float64
    twin may round to neighbouring bf16 values, an ulp of 2**-8, and the difference is
    carried on), and the stash stays fp32."""
    B, S, K, steps, sdt = 3, 5, 3, 5, torch.bfloat16
    gen = torch.Generator().manual_seed(41)
    x0 = gdn_inputs(40, B, HK, HV, KD, VD, slots=S, dtype=torch.bfloat16, state_layout="kv")
    slots = x0["state_indices"]
    state = _state(x0, layout, sdt)
    plain = state.clone()
    ref_state = R_kv(state, layout)
    carry = GdnCarry.empty(S, HV, KD, VD, state_layout=layout)
    ref_carry = R.RefCarry.zeros(S, HV, KD, VD)
    wrote_back = 0
    for step in range(steps):
        x = gdn_inputs(42 + step, B, HK, HV, KD, VD, rows=K, slots=S, dtype=torch.bfloat16,
                       state_layout="kv")
        o, eng = gdn_carry_verify(state, carry, *[x[n] for n in NAMES], slot_tab=slots,
                                  lazy=lazy, validate=True, state_layout=layout)
        o_r, eng_r = R.verify(ref_state, ref_carry, *[x[n].cpu() for n in NAMES], slots.cpu(),
                              lazy=lazy, state_dtype=sdt)
        assert errors(o, o_r)["rel_l2"] < 1e-2 and eng.cpu().tolist() == eng_r.tolist()
        wrote_back += int((eng == 2).sum())
        acc = torch.randint(1, K + 1, (B,), generator=gen, dtype=torch.int32)
        for row, sel, o_t in _decode_accepted(plain, x, slots, acc.tolist(), layout):
            assert bitwise_equal(o[sel, row], o_t), f"step {step} row {row}"
        carry_accept(carry, slots, eng, acc.to(DEVICE), rows=K, validate=True)
        R.accept(ref_carry, slots.cpu(), eng_r, acc)
    assert wrote_back > 0 and carry.buf.dtype == torch.float32
    gdn_carry_flush([state], [carry], slots, validate=True, state_layout=layout)
    R.flush([ref_state], [ref_carry], slots.cpu(), state_dtype=sdt)
    assert state.dtype == sdt and bitwise_equal(state, plain), "flushed state"
    assert errors(R_kv(state, layout), ref_state)["rel_l2"] < 1e-2


def R_kv(state, layout):
    """A float64 K-major copy of a state of either layout, for the protocol reference."""
    st = state if layout == "kv" else state.transpose(-1, -2)
    return st.to("cpu", torch.float64).contiguous()


def test_spec_decode_step_on_bf16_states_and_refusals():
    K = 2
    x = gdn_inputs(51, 2, HK, HV, KD, VD, rows=K, dtype=torch.bfloat16, state_layout="kv")
    st = x["state"].to(torch.bfloat16)
    lay = CarryLayer(st.clone(), GdnCarry.empty(2, HV, KD, VD,
                                                state_layout="kv"), state_layout="kv")
    step = SpecDecodeStep([lay], validate=True, lazy_min_seqs=None)
    o = step.verify([0, 1], [{n: x[n] for n in NAMES}])[0]
    plain = st.clone()
    o2 = gdn_chain(plain, *[x[n] for n in NAMES], state_layout="kv")
    assert bitwise_equal(o, o2)
    step.accept([K, K])
    step.flush([0, 1])
    assert bitwise_equal(lay.state, plain)
    with pytest.raises(ValueError, match="^intermediate"):
        gdn_chain(st.clone(), *[x[n] for n in NAMES],
                  intermediate=torch.empty(2, K - 1, *st.shape[1:], device=DEVICE),
                  state_layout="kv")
    with pytest.raises(ValueError, match=r"^states\[1\]"):
        gdn_carry_flush([st, st.float()], [GdnCarry.empty(2, HV, KD, VD, state_layout="kv")] * 2,
                        x["state_indices"], state_layout="kv")
    with pytest.raises(ValueError, match="^state"):
        gdn_decode(st.double(), *[x[n][:, 0].contiguous() for n in NAMES], state_layout="kv")
