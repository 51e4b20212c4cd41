"""The runnable examples of the documentation, run as written: README's decode against its
float64 reference, and docs/ring-form.md's ring-form loop (verify, accept, flush) against float64
decoding of the accepted rows. Each example is the page's first ``python`` block, executed in a
fresh namespace; the test then holds the values it computed to the stated tolerances.
"""

from __future__ import annotations

import re

import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.bench import errors
from pmll_lab.carry import RING_TOLERANCE
from pmll_lab.tolerances import O_TOL, STATE_TOL
from _paths import ROOT


def _run_example(page: str, capsys) -> tuple[dict, str]:
    """Execute the first ``python`` block of ``page``; ``(its namespace, what it printed)``."""
    text = (ROOT / page).read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks, f"{page}: no python block"
    ns: dict = {"__name__": "__example__"}
    exec(compile(blocks[0], page, "exec"), ns)
    return ns, capsys.readouterr().out


def test_readme_example_runs_and_meets_the_tolerances(capsys):
    ns, out = _run_example("README.md", capsys)
    o, o_ref, x, state_ref = ns["o"], ns["o_ref"], ns["x"], ns["state_ref"]
    assert o.dtype == torch.bfloat16 and o_ref.dtype == torch.float64
    assert errors(o, o_ref)["rel_l2"] <= O_TOL[torch.bfloat16]
    assert errors(x["state"], state_ref)["rel_l2"] <= STATE_TOL
    assert "rel_l2" in out


def test_ring_form_example_runs_against_float64_decoding(capsys):
    """docs/ring-form.md: five verify/accept steps crossing a fold, then a flush; every step's
    outputs and the flushed states within the ring form's fp32 tolerance of float64 decoding."""
    ns, out = _run_example("docs/ring-form.md", capsys)
    tol = RING_TOLERANCE["float32"]
    assert ns["folds"] >= 1, "the example must show a fold"
    assert 0 < ns["worst"] <= tol, ns["worst"]
    assert 0 < ns["final"] <= tol, ns["final"]
    assert int(ns["ring"].len.abs().sum()) == 0
    # the flushed states, recomputed here against the example's float64 decoding
    live = ns["slots"].long().cpu()
    got = ns["state"].double().transpose(-1, -2).cpu()[live]
    assert errors(got, ns["plain"][live])["rel_l2"] <= tol
    assert out.count("step ") == 5 and "folds" in out
