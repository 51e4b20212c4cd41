"""The exact form with the speculative store (``gdn_carry_verify(..., spec_slot_tab=...)`` and
``carry_accept_spec``; the ``exact_spec`` step form), on the CPU under the Triton interpreter.

Against plain decoding of the accepted rows, bitwise (SPEC §3b: the exact form's contract),
with fp32 and bf16 pools; the cursor audit checks that a full acceptance leaves nothing
pending. Fresh seeded inputs (``StepCase``: scale-0.1 states, random rows and gates).
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.carry import GdnCarry, carry_accept_spec, gdn_carry_verify
from pmll_lab.harness import registry
from pmll_lab.harness.step import StepCase, check
from pmll_lab.ops.carry import stash


def _case(state_dtype, seed=3):
    return StepCase(batch=3, rows=3, num_k_heads=1, num_v_heads=2, head_dim=16, steps=8,
                    state_dtype=state_dtype, seed=seed)


def _check(form, case):
    impl = registry.get(form)
    return check(impl.build(case), case, ref_seqs=3, plain=impl.plain(case))


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_spec_store_is_plain_decoding_bitwise(state_dtype):
    case = _case(state_dtype)
    acc = case.tensors["accepted"]
    assert bool((acc == case.rows).any()) and bool((acc < case.rows).any())   # both commits
    r = _check("exact_spec", case)
    assert r["passed"] and r["bitwise"] == {"state vs plain decoding": True}, r
    assert r["facts"]["cursor_mismatches"] == 0 and r["facts"]["cursor_steps"] == case.steps
    lazy = _check("exact_lazy", case)
    # fewer rows replayed: a full acceptance leaves nothing pending
    assert r["facts"]["mean_fill"] < lazy["facts"]["mean_fill"], (r["facts"], lazy["facts"])
    assert r["errors"]["state"] == lazy["errors"]["state"]     # the same bits, the same error


def test_spec_store_without_the_swap_breaks_the_bits(monkeypatch):
    """A commit that clears the pending rows of a full acceptance but keeps the old slot (so the
    accepted rows are lost) is caught by the bits and the errors (the pending counts follow
    the rule, so the cursor audit alone would not see it)."""

    class Mutant:
        def __getitem__(self, grid):
            def launch(pend, slot, spare, acc, B, K, BLOCK):
                full = (acc.to(torch.int64) == K) & (slot >= 0)
                pend[slot[full].long()] = 0
            return launch

    monkeypatch.setattr(stash, "carry_swap_kernel", Mutant())
    r = _check("exact_spec", _case(torch.float32))
    assert not r["passed"] and r["bitwise"] == {"state vs plain decoding": False}, r
    assert r["errors"]["state"] > 10 * r["tolerance"]["state"], r


def _verify_args(layout="vk"):
    B, K, HK, HV, d = 2, 2, 1, 2, 16
    gen = torch.Generator().manual_seed(11)
    shape = (2 * B, HV, d, d)
    state = torch.randn(*shape, generator=gen) * 0.1
    carry = GdnCarry.empty(2 * B, HV, d, d, state_layout=layout)
    q = torch.randn(B, K, HK, d, generator=gen)
    k = torch.randn(B, K, HK, d, generator=gen)
    v = torch.randn(B, K, HV, d, generator=gen)
    g = -torch.rand(B, K, HV, generator=gen)
    beta = torch.rand(B, K, HV, generator=gen)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    return state, carry, (q, k, v, g, beta), slots


@pytest.mark.parametrize("bad, match", [
    (dict(state_layout="kv"), "V-major"),
    (dict(spec="same"), "another tensor"),
    (dict(spec=torch.tensor([2, 3, 0], dtype=torch.int32)), "spec_slot_tab"),
    (dict(spec=torch.tensor([2.0, 3.0])), "spec_slot_tab"),
    # on the host the values are checked whatever validate says
    (dict(spec=torch.tensor([1, 3], dtype=torch.int32)), "also a slot"),
    (dict(spec=torch.tensor([2, 4], dtype=torch.int32)), "must lie in"),
    (dict(spec=torch.tensor([3, 3], dtype=torch.int32)), "distinct"),
    (dict(spec=torch.tensor([3, -2], dtype=torch.int32), validate=True), "must lie in"),
])
def test_spec_store_refuses_bad_spare_slots(bad, match):
    layout = bad.get("state_layout", "vk")
    state, carry, rows, slots = _verify_args(layout)
    spec = bad.get("spec", torch.tensor([2, 3], dtype=torch.int32))
    spec = slots if isinstance(spec, str) else spec
    before = state.clone()
    with pytest.raises(ValueError, match="spec_slot_tab"):
        try:
            gdn_carry_verify(state, carry, *rows, slot_tab=slots, lazy=True, state_layout=layout,
                             spec_slot_tab=spec, validate=bad.get("validate", False))
        except ValueError as e:
            assert match in str(e), e
            raise
    assert torch.equal(state, before)                      # refused before any kernel ran


def test_carry_accept_spec_swaps_only_full_acceptances():
    state, carry, rows, slots = _verify_args()
    spare = torch.tensor([2, 3], dtype=torch.int32)
    _, e = gdn_carry_verify(state, carry, *rows, slot_tab=slots, lazy=True, spec_slot_tab=spare)
    carry_accept_spec(carry, slots, spare, e, torch.tensor([2, 1]), rows=2)
    assert slots.tolist() == [2, 1] and spare.tolist() == [0, 3]
    assert carry.pend[2] == 0 and carry.pend[1] == 1


def _committed(spare_values, **kw):
    state, carry, rows, slots = _verify_args()
    spare = torch.tensor(spare_values, dtype=torch.int32)
    _, e = gdn_carry_verify(state, carry, *rows, slot_tab=slots, lazy=True, spec_slot_tab=spare)
    return state, carry, slots, spare, e


@pytest.mark.parametrize("change, match", [
    (dict(spare=[2, 4]), "spec_slot_tab: entries must lie in"),
    (dict(spare=[1, 3]), "spec_slot_tab: a spare slot is also a slot"),
    (dict(spare="same"), "spec_slot_tab: must be another tensor"),
    (dict(spare=[2]), "spec_slot_tab"),
    (dict(rows=1), "rows: 1, but the verify"),
    (dict(plain_flags=True), "engaged: not the flags of a verify with spec_slot_tab"),
    (dict(carry=[]), "carry: expected one GdnCarry"),
    (dict(slots=[0, 1]), "slot_tab"),
])
def test_carry_accept_spec_refuses_before_writing(change, match):
    """Every refusal comes before ``pend`` or a table is written."""
    state, carry, slots, spare, e = _committed([2, 3])
    if "spare" in change:
        spare = slots if change["spare"] == "same" else torch.tensor(change["spare"],
                                                                      dtype=torch.int32)
    if change.get("plain_flags"):
        e = e.clone()                     # a tensor without the verify's tags
    c = [carry] if "carry" in change else carry
    s = change.get("slots", slots)
    before = (carry.pend.clone(), slots.clone(), spare.clone())
    with pytest.raises(ValueError, match=match):
        carry_accept_spec(c, s, spare, e, [2, 2], rows=change.get("rows", 2))
    assert all(torch.equal(a, b) for a, b in zip(before, (carry.pend, slots, spare)))


def test_a_lane_without_a_spare_commits_as_lazy():
    """Spare -1 on a live lane: nothing stored, no swap; that lane counts its rows as the lazy
    form does, the other lane swaps; slot 0's neighbours are untouched."""
    state, carry, slots, spare, e = _committed([-1, 3])
    assert torch.equal(state[2], _verify_args()[0][2])       # no store into another slot
    carry_accept_spec(carry, slots, spare, e, [2, 2], rows=2)
    assert slots.tolist() == [0, 3] and spare.tolist() == [-1, 1]
    assert carry.pend[0] == 2 and carry.pend[3] == 0
