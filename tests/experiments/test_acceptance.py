"""The acceptance process of ``pmll_lab.experiments.acceptance``: ``simulate`` (carry_protocol's
simulation table) and ``acceptance`` (the roofline's write-back frequencies, seeding each form
with ``[seed, K, lazy]``) run the same process and draws, and the figures the notebooks show
stay bit for bit what they are (pinned below, so a change of either implementation that moves
a figure fails here).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from pmll_lab.experiments import acceptance as A

SIM_ALPHAS = [0.2, 0.4, 0.6, 0.75, 0.875, 0.95]
"""carry_protocol's ``sim_alphas`` and ``sim_Ks`` (its parameters cell)."""
SIM_KS = [2, 3, 4, 8]


def _digest(values) -> str:
    return hashlib.sha256(np.asarray(values, dtype=np.float64).tobytes()).hexdigest()


def test_figures_are_pinned_bit_for_bit():
    sim = A.simulation_table(SIM_KS, SIM_ALPHAS, p_zero=0.0, seed=0)
    assert len(sim) == 72 and sim["wb_freq"].between(0, 1).all()
    sim = sim[sim["mode"] != "lazy+spec"]          # the eager and lazy rows, pinned before it
    assert _digest(sim[["mean_accept", "wb_freq", "mean_folded"]].to_numpy()) == \
        "e65319a6266c1a82f2b613aae90d7a2a276a2ef8246438173b24200768355de5"
    vals = []
    for K in range(1, 9):
        a = A.acceptance(K)
        vals += [a["alpha"], a["mean_accept"], a["eager_wb"], a["eager_mean_pend"], a["lazy_wb"],
                 a["lazy_mean_pend"], *a["eager_hist"], *a["lazy_hist"]]
    assert _digest(vals) == "b41730c1e2c3b95d0a7cd87f842eb9dbbb4755210ebde1335ac45305bfa8a7cd"
    a4 = A.acceptance(4)                  # the roofline report's facts at K = 4
    assert (a4["lazy_wb"], a4["lazy_mean_pend"], a4["eager_wb"]) == (0.478984375, 5.0233935546875, 1.0)
    s = A.simulate(4, 0.8, True, steps=300)
    assert (s["wb_freq"], s["mean_folded"], s["mean_accept"]) == (0.45453125, 4.62875,
                                                                    2.9757291666666665)


@pytest.mark.parametrize("K", [1, 3, 4, 8])
def test_acceptance_is_simulate_seeded_per_form(K):
    """Per form, ``acceptance``'s write-back frequency and pending histogram are ``simulate``'s
    with the same draws (seed ``[0, K, lazy]``, 512 slots, 20 + 400 verifies); the means differ
    only in summation order."""
    a = A.acceptance(K)
    for form in A.MODES:
        lazy = form == "lazy"
        s = A.simulate(K, a["alpha"], lazy, steps=400, seqs=512, seed=[0, K, lazy], burn_in=20)
        assert s["wb_freq"] == pytest.approx(a[f"{form}_wb"], rel=1e-12, abs=1e-15)
        assert np.array_equal(s["p_hist"], np.asarray(a[f"{form}_hist"]))
        assert s["mean_folded"] == pytest.approx(a[f"{form}_mean_pend"], rel=1e-12)
    assert 0 < a["lazy_wb"] <= a["eager_wb"] <= 1


def test_speculative_store_clears_pending_on_full_acceptance():
    """``protocol_step(spec=True)``: a full acceptance leaves nothing pending, any other commit
    is the lazy one; over the process it folds fewer rows than lazy or eager."""
    p = np.array([0, 3, 5, 6])
    a = np.array([4, 2, 4, 1])
    wb, new = A.protocol_step(p, a, 4, True, 8, spec=True)
    assert wb.tolist() == [False, False, True, True]
    assert new.tolist() == [0, 5, 0, 1]
    assert A.protocol_step(p, a, 4, True, 8)[1].tolist() == [4, 5, 4, 1]
    spec = A.simulate(4, 0.8, True, steps=300, spec=True)
    lazy = A.simulate(4, 0.8, True, steps=300)
    eager = A.simulate(4, 0.8, False, steps=300)
    assert spec["mean_accept"] == lazy["mean_accept"]               # the same draws
    assert spec["mean_folded"] < 0.5 * eager["mean_folded"] < lazy["mean_folded"]
    assert 1.2 < spec["mean_folded"] < 1.6, spec
