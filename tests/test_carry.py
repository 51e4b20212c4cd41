"""Carried-state verify, accept and flush (SPEC §3b, §3c; issue 4).

Every launcher is checked against the float64 protocol reference (``pmll_lab.reference.carry``),
fed exactly the values the kernel reads (bf16 inputs already rounded, the fp32 stash as stored).
The end-to-end property runs a stack of two layers (conv twin + GDN) through ``SpecDecodeStep``
over random batches that cross the lazy threshold, random acceptance counts (0 and K included),
slot resets and flushes, and compares with plain decoding (``conv_update`` + ``gdn_decode`` one
token at a time): bitwise for the exact form, within tolerance for WY.

Tolerances (relative L2 against the float64 reference):
- fp32 state, stash rows, fp32 outputs: ``1e-5`` for both forms (fp32 arithmetic over kd-long
  reductions and <= 8 folded rows; measured <= 3e-7 exact, <= 5e-7 WY on the interpreter).
- bf16 outputs: ``8e-3`` (rounded once to bf16, one ulp is 2**-8 relative; measured ~3e-3).
- WY end to end against plain decoding (fp32 inputs, states drift through folded rows over
  several steps): ``1e-4`` (measured ~1e-6).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.carry import (
    GDN_CARRY_CAP,
    CarryLayer,
    GdnCarry,
    SpecDecodeStep,
    carry_accept,
    gdn_carry_flush,
    gdn_carry_verify,
)
from pmll_lab.gdn import gdn_chain_ref
from pmll_lab.inputs import conv_inputs, gdn_inputs
from pmll_lab.ops.carry.gdn_carry import FORMS, stash_bytes_per_slot
from pmll_lab.ops.gdn.recurrence import block_config
from pmll_lab.reference import carry as ref

TOL = 1e-5
O_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
WY_E2E_TOL = 1e-4
CAP = GDN_CARRY_CAP
SENTINEL = 12345.0


def _close(name, out, want, tol):
    e = errors(out, want)
    assert e["rel_l2"] <= tol, f"{name}: rel_l2 {e['rel_l2']:.3e} > {tol:.0e} (max_abs {e['max_abs']:.3e})"


def _fill_stash(carry: GdnCarry, seed: int) -> None:
    """Random stash rows with realistic statistics (unit keys, log decays <= 0)."""
    gen = torch.Generator().manual_seed(seed)
    carry.u.copy_((torch.randn(carry.u.shape, generator=gen) * 0.3).to(carry.device))
    carry.g.copy_((-F.softplus(torch.randn(carry.g.shape, generator=gen))).to(carry.device))
    carry.k.copy_(ref.l2norm(torch.randn(carry.k.shape, generator=gen)).float().to(carry.device))


def _guarded_state(state: torch.Tensor):
    """``state`` copied into the middle of a larger buffer of sentinels: (view, big)."""
    S = state.shape[0]
    big = torch.full((S + 2, *state.shape[1:]), SENTINEL, dtype=state.dtype, device=state.device)
    big[1:S + 1] = state
    return big[1:S + 1], big


def _guarded_carry(S, HV, kd, vd, seed):
    """A GdnCarry whose stash and pend are views into larger sentinel-filled buffers."""
    W = CAP * (HV * vd + HV + HV * kd)
    big = torch.full((S + 2, W + 7), SENTINEL, dtype=torch.float32, device=DEVICE)
    bigp = torch.full((S + 4,), 77, dtype=torch.int32, device=DEVICE)
    carry = GdnCarry(big[1:S + 1, 3:3 + W], bigp[2:2 + S], HV, kd, vd)
    _fill_stash(carry, seed)
    guards = lambda: [big[0].clone(), big[-1].clone(), big[:, :3].clone(), big[:, 3 + W:].clone(),  # noqa: E731
                      bigp[:2].clone(), bigp[2 + S:].clone()]
    return carry, guards


def _assert_guards(before, after, what):
    for i, (a, b) in enumerate(zip(before, after)):
        assert bitwise_equal(a, b), f"{what}: guard region {i} outside the buffers was written"


def _written_rows(S, slots, pend, engaged, K):
    """[S, CAP] bool: stash rows a verify may write (first..first+K-1 of each batch slot)."""
    m = torch.zeros(S, CAP, dtype=torch.bool)
    for s, p, e in zip(slots.tolist(), pend.tolist(), engaged.tolist()):
        first = 0 if e == 2 else p
        m[s, first:first + K] = True
    return m


# ---- the reference itself ------------------------------------------------------------------

def test_reference_wy_algebra_equals_chain():
    """SPEC §3b's WY solve reproduces K rows of the chain (outputs and u rows) in float64."""
    x = gdn_inputs(3, 1, 2, 4, 16, 24, rows=5, dtype=torch.float32, device="cpu")
    H0 = x["state"][0].double()
    qs, ks = zip(*(ref.prepare_qk(x["q"][0, t], x["k"][0, t], 4) for t in range(5)))
    o, U = ref.wy_rows(H0, torch.stack(qs), torch.stack(ks), x["v"][0], x["g"][0], x["beta"][0])
    H = H0.clone()
    for t in range(5):
        H, o_t, u_t = ref.decode_row(H, qs[t], ks[t], x["v"][0, t], x["g"][0, t], x["beta"][0, t])
        assert torch.allclose(o[t], o_t, rtol=1e-12, atol=1e-12)
        assert torch.allclose(U[t], u_t, rtol=1e-12, atol=1e-12)


# ---- GdnCarry --------------------------------------------------------------------------------

def test_gdn_carry_layout_and_sizes():
    S, HV, kd, vd = 3, 2, 5, 7
    c = GdnCarry.empty(S, HV, kd, vd, device=DEVICE)
    W = CAP * (HV * vd + HV + HV * kd)
    assert c.buf.shape == (S, W) and c.pend.dtype == torch.int32 and int(c.pend.abs().sum()) == 0
    assert c.stash_bytes_per_slot == 4 * W == stash_bytes_per_slot(HV, kd, vd)
    assert c.bytes == S * (4 * W + 4)
    c.buf.copy_(torch.arange(S * W, dtype=torch.float32).reshape(S, W))
    s, r, h, col = 2, 5, 1, 3
    # the seed's layout vn[CAP][HV][vd] | g[CAP][HV] | sk[CAP][HV][kd]
    assert c.u[s, r, h, col] == c.buf[s, (r * HV + h) * vd + col]
    assert c.g[s, r, h] == c.buf[s, CAP * HV * vd + r * HV + h]
    assert c.k[s, r, h, col] == c.buf[s, CAP * HV * vd + CAP * HV + (r * HV + h) * kd + col]
    c.pend.copy_(torch.tensor([3, 4, 5], dtype=torch.int32))
    c.reset([0, 2])
    assert c.pend.tolist() == [0, 4, 0]
    # reset slots hold a zero stash (as ConvCarry.reset leaves them); the others are untouched
    assert int(c.buf[[0, 2]].abs().sum()) == 0
    assert bitwise_equal(c.buf[1], torch.arange(W, 2 * W, dtype=torch.float32, device=DEVICE))
    c.reset(1)
    assert c.pend.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="buf"):
        GdnCarry(torch.zeros(S, W + 1, device=DEVICE), c.pend, HV, kd, vd)
    with pytest.raises(ValueError, match="pend"):
        GdnCarry(c.buf, torch.zeros(S, dtype=torch.int64, device=DEVICE), HV, kd, vd)


# ---- verify against the protocol reference -------------------------------------------------

# (dtype, B, S, HK, HV, kd, vd, K): GVA 1 and 2, kd != vd, fp32 and bf16 inputs.
VERIFY_CASES = [
    (torch.float32, 4, 6, 2, 2, 16, 32, 3),
    (torch.bfloat16, 4, 6, 1, 2, 32, 16, 4),
]


def _run_verify_case(form, lazy, dtype, B, S, HK, HV, kd, vd, K, pend_batch, seed):
    x = gdn_inputs(seed, B, HK, HV, kd, vd, rows=K, slots=S, dtype=dtype)
    slots = x["state_indices"]
    state, big_state = _guarded_state(x["state"])
    carry, guards = _guarded_carry(S, HV, kd, vd, seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    pend = torch.randint(0, CAP + 1, (S,), generator=gen, dtype=torch.int32)
    pend[slots.long().cpu()] = torch.tensor(pend_batch, dtype=torch.int32)
    carry.pend.copy_(pend.to(DEVICE))
    g0, st0, stash0, pend0 = guards(), state.clone(), carry.buf.clone(), carry.pend.clone()
    big0 = (big_state[0].clone(), big_state[-1].clone())

    rs, rc = state.double().cpu(), ref.RefCarry.from_carry(carry)
    o, engaged = gdn_carry_verify(state, carry, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                  slot_tab=slots, form=form, lazy=lazy, validate=True)
    ro, reng = ref.verify(rs, rc, x["q"].cpu(), x["k"].cpu(), x["v"].cpu(), x["g"].cpu(),
                          x["beta"].cpu(), slots.cpu(), lazy=lazy)

    p = torch.tensor(pend_batch)
    want = torch.where((p + K > CAP) if lazy else (p > 0), 2, 1)
    assert engaged.dtype == torch.int32 and engaged.cpu().tolist() == want.tolist() == reng.tolist()
    assert o.dtype == dtype and o.shape == (B, K, HV, vd)
    _close("o", o, ro, O_TOL[dtype])
    _close("state", state, rs, TOL)
    wb = slots.long()[engaged == 2]
    keep = torch.ones(S, dtype=torch.bool, device=DEVICE)
    keep[wb] = False
    assert bitwise_equal(state[keep], st0[keep]), "a state without write-back changed"
    # stash: written rows match the reference, every other row is bitwise unchanged
    _close("stash u", carry.u, rc.u, TOL)
    _close("stash k", carry.k, rc.k, TOL)
    assert bitwise_equal(carry.g.cpu(), rc.g.float()), "stash g rows"
    rows = _written_rows(S, slots.cpu(), p, engaged.cpu(), K).to(DEVICE)
    before = GdnCarry(stash0, pend0, HV, kd, vd)
    for name in ("u", "g", "k"):
        assert bitwise_equal(getattr(carry, name)[~rows], getattr(before, name)[~rows]), \
            f"stash {name}: a row outside first..first+K-1 changed"
    assert bitwise_equal(carry.pend, pend0), "verify must not change pend"
    _assert_guards(g0, guards(), "verify stash/pend")
    assert bitwise_equal(big_state[0], big0[0]) and bitwise_equal(big_state[-1], big0[1]), \
        "verify wrote outside the state view"


@pytest.mark.parametrize("case", VERIFY_CASES, ids=["fp32-gva1", "bf16-gva2"])
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("form", FORMS)
def test_verify_matches_reference(form, lazy, case):
    """Pending rows 0, 2, CAP-K (fits) and CAP-K+1 (does not fit): both engaged values in
    both forms, stash writes only to rows first..first+K-1, nothing outside the views."""
    dtype, B, S, HK, HV, kd, vd, K = case
    pend_batch = [0, 2, CAP - K, CAP - K + 1]
    _run_verify_case(form, lazy, dtype, B, S, HK, HV, kd, vd, K, pend_batch, seed=10 + K)


@pytest.mark.parametrize("form", FORMS)
def test_verify_write_back_with_several_column_blocks(form):
    """SPEC §3b "Shared rows": kd=128, vd=64 gives two column blocks per head; every sequence
    writes back and restarts its stash at row 0 while holding pending rows. A design that
    restashed the shared g/k rows before the second block folded them fails here (the
    interpreter runs the blocks in order)."""
    BK, BV, _ = block_config(128, 64)
    assert 64 > BV, "the case must have several column blocks"
    _run_verify_case(form, False, torch.float32, 2, 3, 1, 2, 128, 64, 3, [5, 2], seed=31)
    _run_verify_case(form, True, torch.float32, 2, 3, 1, 2, 128, 64, 3, [6, 7], seed=32)


def test_per_head_loop_exact_variant(monkeypatch):
    """The exact form with one program per head looping over its column blocks
    (``EXACT_SPLIT_COLUMNS = False``; the default splits them across programs and every other
    test runs that): the race case (write-backs with several column blocks, where the shared g/k
    rows must be restashed only after the last block folded them), the protocol reference, and
    bitwise agreement with the split form, whose arrival counts must be left at zero."""
    import pmll_lab.ops.carry.gdn_carry as C

    monkeypatch.setattr(C, "EXACT_SPLIT_COLUMNS", False)
    _run_verify_case("exact", False, torch.float32, 2, 3, 1, 2, 128, 64, 3, [5, 2], seed=31)
    _run_verify_case("exact", True, torch.float32, 2, 3, 1, 2, 128, 64, 3, [6, 7], seed=32)
    _run_verify_case("exact", True, torch.bfloat16, 3, 5, 1, 2, 64, 48, 2, [0, 6, 7], seed=33)

    results = _split_vs_per_head(monkeypatch, "exact", "EXACT_SPLIT_COLUMNS", seed=34)
    for a, b_ in zip(results[True], results[False]):
        assert bitwise_equal(a, b_)


def _split_vs_per_head(monkeypatch, form, flag, seed):
    """One eager verify (several column blocks, write-backs) with ``flag`` on and off: returns
    ``{split: (o, engaged, state, stash)}``; the split launch must leave its arrival counts at
    zero."""
    import pmll_lab.ops.carry.gdn_carry as C

    x = gdn_inputs(seed, 3, 1, 2, 128, 64, rows=3, slots=4, dtype=torch.bfloat16)
    results = {}
    for split in (True, False):
        monkeypatch.setattr(C, flag, split)
        st, c = x["state"].clone(), GdnCarry.empty(4, 2, 128, 64)
        _fill_stash(c, seed + 1)
        c.pend.copy_(torch.tensor([2, 6, 0, 7], dtype=torch.int32))
        o, e = gdn_carry_verify(st, c, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                slot_tab=x["state_indices"], form=form, lazy=False)
        results[split] = (o, e, st, c.buf)
        if split:
            assert int(c._arrivals.abs().sum()) == 0, "arrival counts must be left at zero"
    return results


def test_per_head_wy_variant(monkeypatch):
    """The WY form with one program per head looping over its column blocks
    (``WY_SPLIT_COLUMNS = False``; the default splits them across programs and every other test
    runs that): the race case (write-backs with several column blocks; the shared g/k rows are
    restashed after the last block), the protocol reference, and agreement with the split WY
    form (the same arithmetic per column block: within fp32 rounding, 1e-5)."""
    import pmll_lab.ops.carry.gdn_carry as C

    monkeypatch.setattr(C, "WY_SPLIT_COLUMNS", False)
    _run_verify_case("wy", False, torch.float32, 2, 3, 1, 2, 128, 64, 3, [5, 2], seed=41)
    _run_verify_case("wy", True, torch.float32, 2, 3, 1, 2, 128, 64, 3, [6, 7], seed=42)
    _run_verify_case("wy", True, torch.bfloat16, 3, 5, 1, 2, 64, 48, 2, [0, 6, 7], seed=43)
    results = _split_vs_per_head(monkeypatch, "wy", "WY_SPLIT_COLUMNS", seed=44)
    for name, a, b_ in zip(("o", "engaged", "state", "stash"), results[True], results[False]):
        if name == "engaged":
            assert torch.equal(a, b_)
        else:
            _close(name, a.float(), b_.float(), TOL)


@pytest.mark.parametrize("form", FORMS)
def test_row_prefetch_changes_no_bit(monkeypatch, form):
    """``CARRY_PREFETCH_ROWS`` only moves loads: with it off, the race case (write-backs over
    several column blocks, pending rows folded) gives the same outputs, engaged flags, states and
    stash bit for bit, and still matches the protocol reference."""
    from pmll_lab.ops.gdn import recurrence

    assert recurrence.CARRY_PREFETCH_ROWS, "the default this test compares against"
    results = {}
    for prefetch in (True, False):
        monkeypatch.setattr(recurrence, "CARRY_PREFETCH_ROWS", prefetch)
        if not prefetch:
            _run_verify_case(form, True, torch.float32, 2, 3, 1, 2, 128, 64, 3, [6, 7], seed=52)
        x = gdn_inputs(51, 3, 1, 2, 128, 64, rows=3, slots=4, dtype=torch.bfloat16)
        st, c = x["state"].clone(), GdnCarry.empty(4, 2, 128, 64)
        _fill_stash(c, 53)
        c.pend.copy_(torch.tensor([2, 6, 0, 7], dtype=torch.int32))
        o, e = gdn_carry_verify(st, c, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                slot_tab=x["state_indices"], form=form, lazy=True)
        results[prefetch] = (o, e, st, c.buf)
    assert results[True][1].tolist() != [1, 1, 1], "the case must write back somewhere"
    for name, a, b_ in zip(("o", "engaged", "state", "stash"), results[True], results[False]):
        assert bitwise_equal(a, b_), name


def test_exact_runtime_row_loop(monkeypatch):
    """Verifies longer than ``EXACT_UNROLL_MAX_ROWS`` run a runtime row loop (perf-notes v10;
    prepared, off by default): K = 6 with and without write-backs matches the protocol
    reference, and gives the same bits as the unrolled loop (outputs, engaged, state, stash)."""
    import pmll_lab.ops.carry.gdn_carry as C

    monkeypatch.setattr(C, "EXACT_UNROLL_MAX_ROWS", 4)
    _run_verify_case("exact", True, torch.bfloat16, 3, 5, 1, 2, 32, 16, 6, [0, 2, 3], seed=61)
    x = gdn_inputs(62, 3, 1, 2, 32, 16, rows=6, slots=4, dtype=torch.float32)
    got = {}
    for unroll_max in (4, 8):
        monkeypatch.setattr(C, "EXACT_UNROLL_MAX_ROWS", unroll_max)
        st, c = x["state"].clone(), GdnCarry.empty(4, 2, 32, 16)
        _fill_stash(c, 63)
        c.pend.copy_(torch.tensor([1, 3, 0, 2], dtype=torch.int32))
        o, e = gdn_carry_verify(st, c, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                slot_tab=x["state_indices"], lazy=True)
        got[unroll_max] = (o, e, st, c.buf)
    for a, b_ in zip(*got.values()):
        assert bitwise_equal(a, b_)


def test_wy_launch_config_table(monkeypatch):
    """The WY launch follows the measured table: the split, 2-warp form up to kd = 128, one
    4-warp program per head from kd = 256 (slower split there on the H200) and whenever the
    split is switched off; checked on the launch the verify builds, not only the table."""
    import pmll_lab.ops.carry.gdn_carry as C

    def launch(kd):
        x = gdn_inputs(64, 1, 1, 1, kd, 16, rows=2, slots=1, dtype=torch.float32)
        c = GdnCarry.empty(1, 1, kd, 16)
        o, e = torch.empty(1, 2, 1, 16), torch.empty(1, dtype=torch.int32)
        kern, grid, _, kw = C._verify_launch_args(x["state"], c, x["q"], x["k"], x["v"], x["g"],
                                                  x["beta"], o, e, x["state_indices"], "wy",
                                                  True, 1.0, True)
        return kern, kw["num_warps"]

    assert C.wy_config(64) == C.wy_config(128) == (True, 2)
    assert C.wy_config(256) == (False, 4)
    assert launch(128) == (C._gdn_carry_wy_split_kernel, 2)
    assert launch(256) == (C._gdn_carry_wy_kernel, 4)
    monkeypatch.setattr(C, "WY_SPLIT_COLUMNS", False)
    assert launch(128) == (C._gdn_carry_wy_kernel, 4)


def test_wy_matches_exact():
    """Both forms from the same pending rows: outputs and stash within tolerance."""
    x = gdn_inputs(40, 3, 2, 4, 16, 16, rows=4, slots=4, dtype=torch.float32)
    outs = {}
    for form in FORMS:
        st = x["state"].clone()
        c = GdnCarry.empty(4, 4, 16, 16)
        _fill_stash(c, 41)
        c.pend.copy_(torch.tensor([3, 0, 6, 1], dtype=torch.int32))
        o, e = gdn_carry_verify(st, c, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                slot_tab=x["state_indices"], form=form, lazy=True)
        outs[form] = (o, e, st, c.buf)
    for i, name in enumerate(("o", "engaged", "state", "stash")):
        if name == "engaged":
            assert torch.equal(outs["wy"][i], outs["exact"][i])
        else:
            _close(name, outs["wy"][i], outs["exact"][i], TOL)


# ---- flush and accept ------------------------------------------------------------------------

def test_flush_layers_matches_reference():
    """Three separately allocated layers (one a view into a larger buffer) in one launch;
    slots with pend = 0 and slots outside slot_tab stay bitwise unchanged; pend untouched."""
    S, HV, kd, vd, L = 5, 2, 16, 32, 3
    states, carries, bigs, guards = [], [], [], []
    for layer in range(L):
        torch.empty(1000 + 333 * layer, device=DEVICE)          # scatter the allocations
        st = gdn_inputs(50 + layer, 1, 1, HV, kd, vd, slots=S, dtype=torch.float32)["state"]
        if layer == 1:
            st, big = _guarded_state(st)
            bigs.append(big)
        c, gd = _guarded_carry(S, HV, kd, vd, 60 + layer)
        c.pend.copy_(torch.tensor([(layer + 2 * s) % (CAP + 1) for s in range(S)], dtype=torch.int32))
        states.append(st)
        carries.append(c)
        guards.append(gd)
    slot_tab = torch.tensor([3, 0, 4, 1], dtype=torch.int32, device=DEVICE)
    rstates = [s.double().cpu() for s in states]
    rcarries = [ref.RefCarry.from_carry(c) for c in carries]
    before = [s.clone() for s in states]
    stash0 = [c.buf.clone() for c in carries]
    pend0 = [c.pend.clone() for c in carries]
    g0 = [gd() for gd in guards]
    big0 = (bigs[0][0].clone(), bigs[0][-1].clone())
    gdn_carry_flush(states, carries, slot_tab, validate=True)
    ref.flush(rstates, rcarries, slot_tab.cpu())
    for layer in range(L):
        _close(f"state[{layer}]", states[layer], rstates[layer], TOL)
        p = carries[layer].pend.cpu()
        untouched = torch.ones(S, dtype=torch.bool)
        untouched[slot_tab.long().cpu()] = False
        untouched |= p == 0
        assert untouched.any() and (~untouched).any()
        untouched = untouched.to(DEVICE)
        assert bitwise_equal(states[layer][untouched], before[layer][untouched])
        assert bitwise_equal(carries[layer].buf, stash0[layer]), "flush must not write the stash"
        assert bitwise_equal(carries[layer].pend, pend0[layer]), "flush must not change pend"
        _assert_guards(g0[layer], guards[layer](), f"flush layer {layer}")
    assert bitwise_equal(bigs[0][0], big0[0]) and bitwise_equal(bigs[0][-1], big0[1])


def test_accept_matches_reference():
    """One launch over several carries (GDN and conv), a = 0 and a = K, host and device counts."""
    from pmll_lab.conv import ConvCarry

    S, K = 7, 4
    carries = [GdnCarry.empty(S, 2, 16, 16), GdnCarry.empty(S, 2, 16, 16), ConvCarry.empty(S, 32)]
    for i, c in enumerate(carries):
        c.pend.copy_(torch.tensor([(i + s) % 5 for s in range(S)], dtype=torch.int32))
    slot_tab = torch.tensor([6, 2, 0, 3, 5], dtype=torch.int32, device=DEVICE)
    engaged = torch.tensor([2, 1, 1, 2, 1], dtype=torch.int32, device=DEVICE)
    for accepted in ([0, K, 2, 1, 0], torch.tensor([K, 0, 1, 3, 2], device=DEVICE)):
        want = [c.pend.clone().cpu() for c in carries]
        for w in want:
            ref.accept(SimpleNamespace(pend=w), slot_tab.cpu(), engaged.cpu(),
                       torch.as_tensor(accepted).cpu())
        carry_accept(carries, slot_tab, engaged, accepted, rows=K, validate=True)
        for c, w in zip(carries, want):
            assert c.pend.cpu().tolist() == w.tolist()
    # a single carry works too
    c = carries[0]
    w = c.pend.clone().cpu()
    ref.accept(SimpleNamespace(pend=w), [1], [2], [3])
    carry_accept(c, torch.tensor([1], device=DEVICE), torch.tensor([2], dtype=torch.int32, device=DEVICE), [3])
    assert c.pend.cpu().tolist() == w.tolist()


# ---- the end-to-end property -----------------------------------------------------------------

def _split(y, HK, HV, kd, vd):
    qk = 2 * HK * kd
    return (y[..., :HK * kd].unflatten(-1, (HK, kd)), y[..., HK * kd:qk].unflatten(-1, (HK, kd)),
            y[..., qk:].unflatten(-1, (HV, vd)))


@pytest.mark.parametrize("form,dtype", [("exact", torch.bfloat16), ("wy", torch.float32)],
                         ids=["exact-bf16", "wy-fp32"])
def test_end_to_end_equals_plain_decoding(form, dtype):
    """Two layers (conv twin + GDN), 10 steps: batch widths 1..5 across lazy_min_seqs = 3,
    K in 1..4, accepted counts in 0..K (0 and K forced), eager_max_pending = 2 (the policy
    flushes), a slot reset and reused for a new sequence, an explicit flush in between.
    Accepted rows' outputs and the states after folding equal plain decoding
    (``conv_update`` + ``gdn_decode`` per token): bitwise for exact, 1e-4 for WY."""
    from pmll_lab.conv import ConvCarry, conv_update
    from pmll_lab.gdn import gdn_decode

    S, HK, HV, kd, vd, L = 6, 1, 2, 16, 16, 2
    dim, qk = 2 * HK * kd + HV * vd, 2 * HK * kd
    rng = random.Random(7)
    layers, plain = [], []
    for layer in range(L):
        st = gdn_inputs(70 + layer, 1, HK, HV, kd, vd, slots=S, dtype=dtype)["state"]
        ci = conv_inputs(80 + layer, 1, dim, slots=S, dtype=dtype)
        layers.append(CarryLayer(st.clone(), GdnCarry.empty(S, HV, kd, vd),
                                 conv_state=ci["conv_state"].clone(),
                                 conv_carry=ConvCarry.empty(S, dim, dtype=dtype),
                                 conv_weight=ci["weight"], conv_bias=ci["bias"], num_k_heads=HK))
        plain.append((st.clone(), ci["conv_state"].clone()))
    step = SpecDecodeStep(layers, form=form, lazy_min_seqs=3, eager_max_pending=2, validate=True)

    def compare_states(what):
        for layer, (lay, (pst, pcs)) in enumerate(zip(layers, plain)):
            assert bitwise_equal(lay.conv_state, pcs), f"{what}: conv window layer {layer}"
            if form == "exact":
                assert bitwise_equal(lay.state, pst), f"{what}: state layer {layer} not bitwise"
            else:
                _close(f"{what}: state layer {layer}", lay.state, pst, WY_E2E_TOL)

    widths = [1, 4, 5, 5, 2, 3, 1, 5, 2, 4]
    rows = [2, 4, 4, 4, 3, 1, 4, 2, 3, 4]
    seen = dict(engaged=set(), a0=False, aK=False, flushed=0)
    for n, (B, K) in enumerate(zip(widths, rows)):
        if n == 5:                       # sequence in slot 2 ends; a new one takes the slot
            step.reset([2])
            fresh = gdn_inputs(90, 1, HK, HV, kd, vd, slots=1, dtype=dtype)["state"][0]
            fresh_conv = conv_inputs(91, 1, dim, slots=1, dtype=dtype)["conv_state"][0]
            for lay, (pst, pcs) in zip(layers, plain):
                lay.state[2], pst[2] = fresh, fresh
                lay.conv_state[2], pcs[2] = fresh_conv, fresh_conv
        if n == 7:
            step.flush(list(range(S)))
            compare_states("after flush")
        slots = rng.sample(range(S), B)
        g_in = gdn_inputs(100 + n, B, HK, HV, kd, vd, rows=K, dtype=dtype)
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
                               state_indices=slot_t[sel_t], use_qk_l2norm=False)
                got = outs[layer][sel_t, t]
                if form == "exact":
                    assert bitwise_equal(got, o), f"step {n} row {t} layer {layer}: output not bitwise"
                else:
                    _close(f"step {n} row {t} layer {layer}", got, o, WY_E2E_TOL)
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
    st = gdn_inputs(5, 1, 1, HV, kd, vd, slots=S, dtype=torch.float32)["state"]
    lay = CarryLayer(st, GdnCarry.empty(S, HV, kd, vd))
    step = SpecDecodeStep([lay], lazy_min_seqs=2, eager_max_pending=1)

    def run(slots, acc):
        x = gdn_inputs(len(slots) * 7 + step.stats["steps"], len(slots), 1, HV, kd, vd, rows=K,
                       dtype=torch.float32)
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


# ---- bad input -------------------------------------------------------------------------------

def _verify_args(K=2, dtype=torch.float32):
    x = gdn_inputs(1, 2, 1, 2, 16, 16, rows=K, slots=3, dtype=dtype)
    carry = GdnCarry.empty(3, 2, 16, 16)
    kw = dict(state=x["state"], carry=carry, q=x["q"], k=x["k"], v=x["v"], g=x["g"],
              beta=x["beta"], slot_tab=x["state_indices"])
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
    "q device": (lambda kw: kw.update(q=kw["q"].to("meta")), "q"),
    "q strides": (lambda kw: kw.update(q=_randn(2, 2, 1, 32)[..., ::2]), "q"),
    "HV % HK": (lambda kw: kw.update(q=_randn(2, 2, 3, 16), k=_randn(2, 2, 3, 16)), "q"),
    "slot dtype": (lambda kw: kw.update(slot_tab=kw["slot_tab"].float()), "slot_tab"),
    "carry dims": (lambda kw: kw.update(carry=GdnCarry.empty(3, 2, 16, 8)), "carry"),
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


def test_wy_refuses_more_rows_than_its_tiles_before_launch():
    """The WY kernels tile the rows by 16: K = 17 (allowed by a CAP of 24) must be refused,
    naming K, before any kernel runs, in both layouts; the exact form serves it."""
    S, HV, kd, vd, K = 2, 1, 16, 16, 17
    x = gdn_inputs(5, S, 1, HV, kd, vd, rows=K, dtype=torch.float32)
    for layout in ("kv", "vk"):
        carry = GdnCarry.empty(S, HV, kd, vd, cap=24)
        st = x["state"].clone() if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
        before = (st.clone(), carry.buf.clone())
        with pytest.raises(ValueError, match="K"):
            gdn_carry_verify(st, carry, x["q"], x["k"], x["v"], x["g"], x["beta"],
                             slot_tab=x["state_indices"], form="wy", state_layout=layout)
        assert bitwise_equal(st, before[0]) and bitwise_equal(carry.buf, before[1])
    carry = GdnCarry.empty(S, HV, kd, vd, cap=24)
    st = x["state"].clone()
    o, _ = gdn_carry_verify(st, carry, x["q"], x["k"], x["v"], x["g"], x["beta"],
                            slot_tab=x["state_indices"], form="exact", validate=True)
    o_ref, _, _ = gdn_chain_ref(x["state"], x["q"], x["k"], x["v"], x["g"], x["beta"],
                                state_indices=x["state_indices"])
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
    c = GdnCarry.empty(3, 2, 16, 16)
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
    st = gdn_inputs(1, 1, 1, 2, 16, 16, slots=3)["state"]
    with pytest.raises(ValueError, match="carries"):
        gdn_carry_flush([st, st.clone()], [c], slots)
    with pytest.raises(ValueError, match="states"):
        gdn_carry_flush(st, c, slots)
    with pytest.raises(ValueError, match="carries"):
        gdn_carry_flush([st], [GdnCarry.empty(3, 2, 16, 8)], slots)
    c.pend.fill_(CAP + 1)
    with pytest.raises(ValueError, match="pend"):
        gdn_carry_flush([st], [c], slots, validate=True)
    c.pend.zero_()
    with pytest.raises(ValueError, match="slot_tab"):
        gdn_carry_flush([st], [c], torch.tensor([1, 1], dtype=torch.int32, device=DEVICE), validate=True)
    with pytest.raises(ValueError, match="^slot_tab"):
        gdn_carry_flush([st], [c], strided([2, 0, 1, 0]))
    for slots_bad in ([3], [-1], 5, [0.5], None, torch.tensor([1.0])):
        with pytest.raises(ValueError, match="^slots"):
            c.reset(slots_bad)
    with pytest.raises(ValueError, match="^device"):
        GdnCarry.empty(3, 2, 16, 16, device="bogus")


def test_spec_decode_step_rejects_bad_input():
    """Bad layers, slots, inputs, layer index and accepts raise ValueError naming the argument
    before any launch; the step stays usable afterwards."""
    S, HV, kd, vd, K = 4, 2, 16, 16, 2
    st = gdn_inputs(7, 1, 1, HV, kd, vd, slots=S, dtype=torch.float32)["state"]
    with pytest.raises(ValueError, match="^state"):
        CarryLayer(None, GdnCarry.empty(S, HV, kd, vd))
    with pytest.raises(ValueError, match="^carry"):
        CarryLayer(st, None)
    with pytest.raises(ValueError, match="^conv_carry"):
        CarryLayer(st, GdnCarry.empty(S, HV, kd, vd), conv_state=torch.zeros(S, 96, 3))
    lay = CarryLayer(st, GdnCarry.empty(S, HV, kd, vd))
    lay.carry = None                                  # changed after construction
    with pytest.raises(ValueError, match=r"^layers\[0\].carry"):
        SpecDecodeStep([lay])
    lay.carry = GdnCarry.empty(S, HV, kd, vd)
    step = SpecDecodeStep([lay], validate=True)
    for slots in ([0, 4], [-1, 0], [0.7, 1.2], [1, 1], "ab",
                  torch.tensor([0, 1, 2, 1], dtype=torch.int32, device=DEVICE)[::2]):
        with pytest.raises(ValueError, match="^slots"):
            step.begin(slots, K)
    x = gdn_inputs(8, 2, 1, HV, kd, vd, rows=K, dtype=torch.float32)
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
