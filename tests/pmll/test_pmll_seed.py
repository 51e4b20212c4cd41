"""The seed's PMLL ring as published (``pmll_lab.reference.pmll_seed``) against the project's
float64 reference (``pmll_lab.reference.pmll``), on seeded random inputs (M = 8, hs = 4).

Where the two define the same thing (a ring not yet wrapped, writes that fit in the free rows,
the serial outcome of a T > M write) they agree to the bit: both are float64 with the same blend
expression. Where the seed differs (storage-order read after wraparound, write head lost once
full, the T > M race, one length shared by all heads, reset keeping rows) the difference is
non-zero, and the test says how it shows.
"""

from __future__ import annotations

import math

import pytest
import torch

from pmll_lab.reference import pmll as ref
from pmll_lab.reference.pmll_seed import SCENARIOS, SeedRing, compare, race_outcomes


@pytest.mark.parametrize("segments", [[5, 2], [3, 5], [1, 1, 1, 4], [8]])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_agree_to_the_bit_before_wraparound(segments, gated, seed):
    r = compare(segments, gated=gated, seed=seed)
    assert r["bitwise"], r
    assert r["seed_rows"] == r["ref_rows"] == sum(segments)
    assert r["seed_next_slot"] == r["ref_next_slot"]


def test_wrapped_read_is_storage_order():
    r = compare([6, 5])
    assert r["memory_max_abs"] == 0.0              # same slots written ...
    assert r["read_max_abs"] > 0.1                 # ... read back in a different order
    # the seed's read is exactly the reference's rows rotated: storage order = slots 0..M-1
    ring = SeedRing(1, 8, 4)
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(11, 4, generator=gen, dtype=torch.float64)
    ring.write(0, rows[:6], rows[:6]).write(0, rows[6:], rows[6:])
    k_seed, _ = ring.read(0, 0)
    k_ref, _ = ref.ring_read(ring.k[None], ring.v[None], torch.tensor([11]), 0)
    assert torch.equal(k_seed, torch.roll(k_ref[0, 0], shifts=3, dims=0))
    assert not torch.equal(k_seed, k_ref[0, 0])


def test_write_after_full_restarts_at_slot_zero():
    r = compare([6, 5, 2])
    assert r["seed_next_slot"] == 0 and r["ref_next_slot"] == 5
    assert r["memory_max_abs"] > 0.1
    ring = SeedRing(1, 8, 4)
    gen = torch.Generator().manual_seed(4)
    a, b = (torch.randn(n, 4, generator=gen, dtype=torch.float64) for n in (8, 2))
    ring.write(0, a, a).write(0, b, b)
    assert torch.equal(ring.k[0, :2], b)           # slots 0, 1 overwritten, not 0 and 1 after 8
    assert ring.T == 8


def test_t_above_m_race():
    gated = compare([11])                                      # default: overlap, last stores
    first = compare([11], race="overlap_first")
    serial = compare([11], race="serial")
    assert gated["memory_max_abs"] > 0.01 and first["memory_max_abs"] > 0.01
    assert serial["memory_max_abs"] == 0.0                     # one outcome is the sequential one
    assert compare([11], gated=False)["memory_max_abs"] == 0.0  # g = 1: the last token's row ...
    assert compare([11], gated=False, race="overlap_first")["memory_max_abs"] > 0.1  # or another


def test_race_outcomes_hold_the_sequential_value():
    gen = torch.Generator().manual_seed(5)
    old = torch.randn(4, generator=gen, dtype=torch.float64)
    new = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    g = torch.rand(3, generator=gen, dtype=torch.float64)
    outs = race_outcomes(old, new, g)
    assert len(outs) == 3 + 6 + 6
    k, _, _ = ref.ring_write(old.view(1, 1, 1, 4), old.view(1, 1, 1, 4), torch.tensor([0]),
                             new.view(1, 1, 3, 4), new.view(1, 1, 3, 4), g.view(1, 3))
    chains = {c: v for c, v in outs}
    assert torch.equal(chains[(0, 1, 2)], k[0, 0, 0])
    spread = max(float((v - k[0, 0, 0]).abs().max()) for _, v in outs)
    assert spread > 0.01
    ungated = {tuple(v.tolist()) for _, v in race_outcomes(old, new)}
    assert ungated == {tuple(r.tolist()) for r in new}         # g = 1: any writer's row


def test_shared_length_and_reset():
    heads = compare([3, 2], heads=2)
    assert heads["seed_rows"] == 8 and heads["ref_rows"] == 5 and math.isnan(heads["read_max_abs"])
    assert heads["memory_max_abs"] > 0.1
    reset = compare([6, 3], reset_after=0)
    assert reset["seed_rows"] == reset["ref_rows"] == 3
    assert reset["memory_max_abs"] > 0.01 and reset["read_max_abs"] > 0.01
    assert compare([6, 3], reset_after=0, gated=False)["read_max_abs"] == 0.0  # g = 1 hides it


def test_every_scenario_runs():
    for name, kw in SCENARIOS.items():
        r = compare(**kw)
        assert set(r) >= {"memory_max_abs", "read_max_abs", "bitwise"}, name


def test_bad_input():
    ring = SeedRing(1, 8, 4)
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="race"):
        ring.write(0, x, x, race="any")
    with pytest.raises(ValueError, match="^h:"):
        ring.write(1, x, x)
    with pytest.raises(ValueError, match="v_new"):
        ring.write(0, x, x[:1])
    with pytest.raises(ValueError, match="gate"):
        ring.write(0, x, x, torch.ones(3))
    with pytest.raises(ValueError, match="capacity"):
        SeedRing(1, 0, 4)
    with pytest.raises(ValueError, match="new"):
        race_outcomes(torch.zeros(4), torch.zeros(7, 4))
