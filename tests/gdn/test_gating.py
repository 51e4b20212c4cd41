"""Qwen3-Next's gating: ``gdn_gating`` against float64, and fused into every GDN launcher.

Fused (``g=None, beta=None`` with ``A_log=, a=, dt_bias=, b=``), each launcher must give the bits
of ``gdn_gating`` followed by the unfused launch: outputs, states, snapshots, stash (which records
the computed ``g``), both layouts, both verify forms, plans and the protocol driver.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import (CarryLayer, GdnCarry, SpecDecodeStep, gdn_carry_verify,
                            gdn_carry_verify_plan)
from pmll_lab.gdn import (gdn_chain, gdn_chain_plan, gdn_decode, gdn_decode_plan, gdn_gating,
                          gdn_gating_ref)
from pmll_lab.inputs import gdn_inputs

HK, HV, KD, VD = 1, 2, 16, 16


def _gating(seed, lead, dtype=torch.bfloat16, hv=HV):
    gen = torch.Generator().manual_seed(seed)
    A_log = (torch.rand(hv, generator=gen) * 2 - 1).to(DEVICE)
    dt_bias = torch.randn(hv, generator=gen).to(DEVICE)
    a = (torch.randn(*lead, hv, generator=gen) * 3).to(dtype).to(DEVICE)
    b = (torch.randn(*lead, hv, generator=gen) * 3).to(dtype).to(DEVICE)
    return dict(A_log=A_log, a=a, dt_bias=dt_bias, b=b)


def _state(x, layout):
    return x["state"] if layout == "kv" else x["state"].transpose(-1, -2).contiguous()


def test_gdn_gating_matches_float64():
    """rel 1e-5 where the decay is a normal fp32 number (the fp32 exp of a sum of two fp32
    values); softplus's threshold and both tails (a + dt_bias past 20, and far below 0, where
    log(1 + exp(x)) would round to 0) included; bf16 and fp32 inputs; [B, HV] and a strided
    [B, K, HV] view."""
    gv = _gating(1, (5, 3), torch.float32, hv=7)
    gv["a"][0, 0] = torch.tensor([-30.0, 19.9, 20.1, 60.0, -80.0, 0.0, 5.0])
    for dtype in (torch.float32, torch.bfloat16):
        a = gv["a"].to(dtype)
        b = gv["b"].to(dtype)
        g, beta = gdn_gating(gv["A_log"], a, gv["dt_bias"], b)
        gr, br = gdn_gating_ref(gv["A_log"], a, gv["dt_bias"], b)
        assert g.dtype == beta.dtype == torch.float32 and g.shape == a.shape
        torch.testing.assert_close(g.double(), gr, rtol=1e-5, atol=1e-30)
        torch.testing.assert_close(beta.double(), br, rtol=1e-6, atol=1e-30)
        assert bool((g[0, 0, 0] < 0).item()), "a very negative a + dt_bias keeps a nonzero decay"
    wide = torch.randn(4, 2 * 7, device=DEVICE)          # a view of a fused projection buffer
    g2, beta2 = gdn_gating(gv["A_log"], wide[:, :7], gv["dt_bias"], wide[:, 7:])
    gr2, br2 = gdn_gating_ref(gv["A_log"], wide[:, :7], gv["dt_bias"], wide[:, 7:])
    torch.testing.assert_close(g2.double(), gr2, rtol=1e-5, atol=1e-30)
    torch.testing.assert_close(beta2.double(), br2, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("K", [1, 3])
def test_fused_decode_and_chain_are_bitwise_gating_then_unfused(layout, K):
    x = gdn_inputs(11, 3, HK, HV, KD, VD, rows=K, dtype=torch.bfloat16, slots=4, state_layout="kv")
    lead = (3, K) if K > 1 else (3,)
    gv = _gating(12, lead, torch.float32 if K == 1 else torch.bfloat16)
    q, k, v = (x[n] if K > 1 else x[n][:, 0].contiguous() for n in ("q", "k", "v"))
    g, beta = gdn_gating(**gv)
    st = _state(x, layout)
    a_, b_ = st.clone(), st.clone()
    kw = dict(state_indices=x["state_indices"], state_layout=layout)
    if K == 1:
        o1 = gdn_decode(a_, q, k, v, g, beta, **kw)
        o2 = gdn_decode(b_, q, k, v, **gv, validate=True, **kw)
        p = gdn_decode_plan(st.clone(), q, k, v, **gv, **kw)
    else:
        i1 = torch.empty(3, K - 1, *st.shape[1:], device=DEVICE)
        i2 = torch.empty_like(i1)
        o1 = gdn_chain(a_, q, k, v, g, beta, intermediate=i1, **kw)
        o2 = gdn_chain(b_, q, k, v, **gv, intermediate=i2, validate=True, **kw)
        assert bitwise_equal(i1, i2), "snapshots"
        p = gdn_chain_plan(st.clone(), q, k, v, **gv, **kw)
    assert bitwise_equal(o1, o2) and bitwise_equal(a_, b_)
    assert bitwise_equal(p(), o1), "plan"


@pytest.mark.parametrize("layout,form", [("kv", "exact"), ("vk", "exact")])
def test_fused_carry_verify_is_bitwise_gating_then_unfused(layout, form):
    K = 3
    x = gdn_inputs(21, 2, HK, HV, KD, VD, rows=K, dtype=torch.bfloat16, state_layout="kv")
    gv = _gating(22, (2, K))
    g, beta = gdn_gating(**gv)
    st = _state(x, layout)
    rows = [x[n] for n in ("q", "k", "v")]
    slots = torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    gen = torch.Generator().manual_seed(23)
    stash = GdnCarry.empty(2, HV, KD, VD, state_layout=layout)
    stash.u.copy_(torch.randn(stash.u.shape, generator=gen))
    stash.g.copy_(-torch.rand(stash.g.shape, generator=gen))
    stash.k.copy_(torch.nn.functional.normalize(torch.randn(stash.k.shape, generator=gen), dim=-1))
    stash.pend.fill_(2)                               # eager: fold two rows, write back
    res = []
    for fused in (False, True):
        c = GdnCarry(stash.buf.clone(), stash.pend.clone(), HV, KD, VD, state_layout=layout)
        s = st.clone()
        gates = gv if fused else dict(g=g, beta=beta)
        o, eng = gdn_carry_verify(s, c, *rows, **gates, slot_tab=slots, form=form,
                                  validate=True, state_layout=layout)
        res.append((o, eng, s, c.buf.clone()))
    for want, got, what in zip(res[0], res[1], ("outputs", "engaged", "state", "stash")):
        assert bitwise_equal(want, got), what
    c = GdnCarry(stash.buf.clone(), stash.pend.clone(), HV, KD, VD, state_layout=layout)
    o, _ = gdn_carry_verify_plan(st.clone(), c, *rows, **gv, slot_tab=slots, form=form,
                                 state_layout=layout)()
    assert bitwise_equal(o, res[0][0]), "plan"
    assert bitwise_equal(c.g[slots.long(), :K], g), "the stash records the computed g"


def test_spec_decode_step_takes_gating_inputs():
    K = 2
    x = gdn_inputs(31, 2, HK, HV, KD, VD, rows=K, dtype=torch.bfloat16, state_layout="kv")
    gv = _gating(32, (2, K))
    g, beta = gdn_gating(**gv)
    outs = []
    for fused in (False, True):
        lay = CarryLayer(x["state"].clone(), GdnCarry.empty(2, HV, KD, VD, state_layout="kv"),
                         A_log=gv["A_log"] if fused else None,
                         dt_bias=gv["dt_bias"] if fused else None, state_layout="kv")
        step = SpecDecodeStep([lay], validate=True)
        inp = dict(q=x["q"], k=x["k"], v=x["v"])
        inp.update(dict(a=gv["a"], b=gv["b"]) if fused else dict(g=g, beta=beta))
        outs.append(step.verify([0, 1], [inp])[0])
        step.accept([1, 2])
    assert bitwise_equal(outs[0], outs[1])


def test_gating_errors_name_the_argument():
    x = gdn_inputs(41, 2, HK, HV, KD, VD, dtype=torch.float32, state_layout="kv")
    q, k, v, st = x["q"], x["k"], x["v"], x["state"]
    gv = _gating(42, (2,), torch.float32)
    cases = [
        ("A_log", dict(g=x["g"], beta=x["beta"], **gv)),              # both forms
        ("a", dict(g=x["g"], a=gv["a"])),
        ("beta", dict(g=x["g"])),
        ("g", dict(beta=x["beta"])),
        ("g", dict()),
        ("dt_bias", dict(A_log=gv["A_log"], a=gv["a"], b=gv["b"])),   # a missing one
        ("A_log", dict(a=gv["a"], dt_bias=gv["dt_bias"], b=gv["b"])),
        ("a", dict(gv, a=gv["a"][:1])),                               # shapes, dtypes
        ("b", dict(gv, b=gv["b"].half())),
        ("A_log", dict(gv, A_log=gv["A_log"][:1])),
        ("dt_bias", dict(gv, dt_bias=gv["dt_bias"].long())),
    ]
    for name, kw in cases:
        with pytest.raises(ValueError, match=f"^{name}:"):
            gdn_decode(st, q, k, v, **kw, state_layout="kv")
    # fp32 inputs: a may be fp32 (their dtype or fp32), said once
    with pytest.raises(ValueError, match="^a: dtype must be one of float32, got float64$"):
        gdn_decode(st, q, k, v, **dict(gv, a=gv["a"].double()), state_layout="kv")
    c = GdnCarry.empty(2, HV, KD, VD, state_layout="kv")
    slots = torch.arange(2, dtype=torch.int32, device=DEVICE)
    xr = gdn_inputs(43, 2, HK, HV, KD, VD, rows=2, dtype=torch.float32, state_layout="kv")
    with pytest.raises(ValueError, match="^b:"):
        gdn_carry_verify(st, c, xr["q"], xr["k"], xr["v"], A_log=gv["A_log"],
                         a=_gating(44, (2, 2))["a"], dt_bias=gv["dt_bias"], slot_tab=slots,
                         state_layout="kv")
    with pytest.raises(ValueError, match="^a:"):
        gdn_gating(gv["A_log"], gv["a"][0], gv["dt_bias"], gv["b"][0])
