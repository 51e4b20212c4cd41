"""Carried-state verify, accept and flush, kernel by kernel (SPEC §3b, §3c).

Every launcher (``gdn_carry_verify``, eager and lazy, and its launch variants;
``carry_accept``; ``gdn_carry_flush``) and the ``GdnCarry`` container are checked against the
float64 protocol reference (``pmll_lab.reference.carry``), fed exactly the values the kernel
reads (bf16 inputs already rounded, the fp32 stash as stored): written stash rows within
tolerance, every other row, ``pend`` and the memory around each view bitwise unchanged. The
driver end to end is in test_carry_protocol.py, bad input in test_carry_inputs.py.

Tolerances (relative L2 against the float64 reference):
- fp32 state, stash rows, fp32 outputs: ``1e-5`` (fp32 arithmetic over kd-long reductions and
  <= 8 folded rows; measured <= 3e-7 on the interpreter).
- bf16 outputs: ``8e-3`` (rounded once to bf16, one ulp is 2**-8 relative; measured ~3e-3).
- launch options that only move loads or unroll loops: bitwise.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import (
    FORMS,
    GdnCarry,
    carry_accept,
    gdn_carry_flush,
    gdn_carry_verify,
    stash_bytes_per_slot,
)
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops import settings
from pmll_lab.ops.gdn.recurrence import block_config
from pmll_lab.reference import carry as ref

from _carry_helpers import CAP, O_TOL, _close

TOL = 1e-5
SENTINEL = 12345.0


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
    carry = GdnCarry(big[1:S + 1, 3:3 + W], bigp[2:2 + S], HV, kd, vd, state_layout="kv")
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
    x = gdn_inputs(seed, B, HK, HV, kd, vd, rows=K, slots=S, dtype=dtype, state_layout="kv")
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
                                  slot_tab=slots, form=form, lazy=lazy, validate=True,
                                  state_layout="kv")
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
    before = GdnCarry(stash0, pend0, HV, kd, vd, state_layout="kv")
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
    stash writes only to rows first..first+K-1, nothing outside the views."""
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


def test_per_head_loop_exact_variant():
    """The exact form with one program per head looping over its column blocks
    (``exact_split_columns`` off; the default splits them across programs and every other
    test runs that): the race case (write-backs with several column blocks, where the shared g/k
    rows must be restashed only after the last block folded them), the protocol reference, and
    bitwise agreement with the split form, whose arrival counts must be left at zero."""
    with settings.override(exact_split_columns=False):
        _run_verify_case("exact", False, torch.float32, 2, 3, 1, 2, 128, 64, 3, [5, 2], seed=31)
        _run_verify_case("exact", True, torch.float32, 2, 3, 1, 2, 128, 64, 3, [6, 7], seed=32)
        _run_verify_case("exact", True, torch.bfloat16, 3, 5, 1, 2, 64, 48, 2, [0, 6, 7],
                         seed=33)

    results = _split_vs_per_head(
        "exact", lambda split: settings.override(exact_split_columns=split), seed=34)
    for a, b_ in zip(results[True], results[False]):
        assert bitwise_equal(a, b_)


def _split_vs_per_head(form, split_columns, seed):
    """One eager verify (several column blocks, write-backs) under ``split_columns(True)`` and
    ``split_columns(False)`` (context managers): returns ``{split: (o, engaged, state,
    stash)}``; the split launch must leave its arrival counts at zero."""
    x = gdn_inputs(seed, 3, 1, 2, 128, 64, rows=3, slots=4, dtype=torch.bfloat16, state_layout="kv")
    results = {}
    for split in (True, False):
        st, c = x["state"].clone(), GdnCarry.empty(4, 2, 128, 64, state_layout="kv")
        _fill_stash(c, seed + 1)
        c.pend.copy_(torch.tensor([2, 6, 0, 7], dtype=torch.int32))
        with split_columns(split):
            o, e = gdn_carry_verify(st, c, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                    slot_tab=x["state_indices"], form=form, lazy=False,
                                    state_layout="kv")
        results[split] = (o, e, st, c.buf)
        if split:
            assert int(c._arrivals.abs().sum()) == 0, "arrival counts must be left at zero"
    return results


@pytest.mark.parametrize("form", FORMS)
def test_row_prefetch_changes_no_bit(form):
    """``carry_prefetch_rows`` only moves loads: with it off, the race case (write-backs over
    several column blocks, pending rows folded) gives the same outputs, engaged flags, states and
    stash bit for bit, and still matches the protocol reference."""
    assert settings.carry().carry_prefetch_rows, "the default this test compares against"
    results = {}
    for prefetch in (True, False):
        with settings.override(carry_prefetch_rows=prefetch):
            if not prefetch:
                _run_verify_case(form, True, torch.float32, 2, 3, 1, 2, 128, 64, 3, [6, 7],
                                 seed=52)
            x = gdn_inputs(51, 3, 1, 2, 128, 64, rows=3, slots=4, dtype=torch.bfloat16,
                           state_layout="kv")
            st, c = x["state"].clone(), GdnCarry.empty(4, 2, 128, 64, state_layout="kv")
            _fill_stash(c, 53)
            c.pend.copy_(torch.tensor([2, 6, 0, 7], dtype=torch.int32))
            o, e = gdn_carry_verify(st, c, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                    slot_tab=x["state_indices"], form=form, lazy=True,
                                    state_layout="kv")
        results[prefetch] = (o, e, st, c.buf)
    assert results[True][1].tolist() != [1, 1, 1], "the case must write back somewhere"
    for name, a, b_ in zip(("o", "engaged", "state", "stash"), results[True], results[False]):
        assert bitwise_equal(a, b_), name


def test_exact_runtime_row_loop():
    """Verifies longer than ``exact_unroll_max_rows`` run a runtime row loop
    (perf-notes-archive v10; prepared, off by default): K = 6 with and without write-backs
    matches the protocol reference, and gives the same bits as the unrolled loop (outputs,
    engaged, state, stash)."""
    with settings.override(exact_unroll_max_rows=4):
        _run_verify_case("exact", True, torch.bfloat16, 3, 5, 1, 2, 32, 16, 6, [0, 2, 3],
                         seed=61)
    x = gdn_inputs(62, 3, 1, 2, 32, 16, rows=6, slots=4, dtype=torch.float32, state_layout="kv")
    got = {}
    for unroll_max in (4, 8):
        st, c = x["state"].clone(), GdnCarry.empty(4, 2, 32, 16, state_layout="kv")
        _fill_stash(c, 63)
        c.pend.copy_(torch.tensor([1, 3, 0, 2], dtype=torch.int32))
        with settings.override(exact_unroll_max_rows=unroll_max):
            o, e = gdn_carry_verify(st, c, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                    slot_tab=x["state_indices"], lazy=True, state_layout="kv")
        got[unroll_max] = (o, e, st, c.buf)
    for a, b_ in zip(*got.values()):
        assert bitwise_equal(a, b_)


# ---- flush and accept ------------------------------------------------------------------------

def test_flush_layers_matches_reference():
    """Three separately allocated layers (one a view into a larger buffer) in one launch;
    slots with pend = 0 and slots outside slot_tab stay bitwise unchanged; pend untouched."""
    S, HV, kd, vd, L = 5, 2, 16, 32, 3
    states, carries, bigs, guards = [], [], [], []
    for layer in range(L):
        torch.empty(1000 + 333 * layer, device=DEVICE)          # scatter the allocations
        st = gdn_inputs(50 + layer, 1, 1, HV, kd, vd, slots=S, dtype=torch.float32,
                        state_layout="kv")["state"]
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
    gdn_carry_flush(states, carries, slot_tab, validate=True, state_layout="kv")
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
