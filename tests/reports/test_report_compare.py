"""``report_compare``: two runs' headlines matched target by target (and by ``B``), the change
of each figure and whether it moved beyond the noise; a target of one run only listed, not
dropped; bad input refused naming the argument."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pmll_lab.report_compare import compare, main

HEAD = ["status", "target", "B", "ours", "peer", "ratio", "roofline_frac", "ours_us", "peer_us",
        "bound", "cells", "met_cells", "layout", "timer", "note"]


def _run(root, name, rows, notebook="roofline", columns=HEAD):
    d = root / name / "results" / notebook
    d.mkdir(parents=True)
    pd.DataFrame(rows, columns=columns).to_csv(d / "headline.csv", index=False)
    return root / name


def _row(target, B, ratio=None, us=10.0, status="met", frac=0.8, bound=1.0):
    """A headline row: a ratio target where ``ratio`` is given, else a fraction target (bound
    <= 1: its figure is our fraction of the copy ceiling) or a time target (a bound in µs: its
    figure is our time)."""
    return [status, target, B, "ours", "peer" if ratio is not None else "", ratio, frac,
            us, 12.0, bound, 1, 1, "vk", "cuda_graph", ""]


def test_targets_are_matched_and_their_change_judged(tmp_path):
    rng = np.random.default_rng()
    r = rng.uniform(0.5, 1.5, size=2)
    us = rng.uniform(5, 500)
    a = _run(tmp_path, "a", [_row("ring <= FI", 64, r[0]), _row("ring <= FI", 128, r[1]),
                             _row("decode >= 0.85", 64, us=us, frac=0.9),
                             _row("call <= 10 us", 1, us=us, bound=10.0),
                             _row("only in a", 64, 1.0), _row("zero", 64, 0.0)])
    b = _run(tmp_path, "b", [_row("ring <= FI", 64, r[0] * 1.01),
                             _row("ring <= FI", 128, r[1] * 1.10, status="missed"),
                             _row("decode >= 0.85", 64, us=us * 0.95, frac=0.9 * 0.97),
                             _row("call <= 10 us", 1, us=us * 0.95, bound=10.0),
                             _row("zero", 64, 0.0)])
    _run(tmp_path, "b", [["passed", "decode", 4, 4, 2, 1e-3, 8e-3, "o"]], notebook="kernels",
         columns=["status", "kernel", "passed", "checks", "points", "worst_rel_l2",
                  "tolerance", "worst_of"])                   # a check headline: no targets
    df = compare(a, b).set_index(["target", "B"])
    assert len(df) == 6
    assert df.loc[("ring <= FI", 64), "change"] == pytest.approx(0.01, abs=1e-4)
    assert not df.loc[("ring <= FI", 64), "moved"]
    assert df.loc[("ring <= FI", 128), "moved"]
    assert df.loc[("ring <= FI", 128), "status_b"] == "missed"
    frac = df.loc[("decode >= 0.85", 64)]            # a fraction target: its fraction, not µs
    assert frac["measure"] == "fraction" and frac["a"] == pytest.approx(0.9)
    assert frac["change"] == pytest.approx(-0.03, abs=1e-4)
    call = df.loc[("call <= 10 us", 1)]
    assert call["measure"] == "µs" and call["a"] == pytest.approx(us)
    assert call["change"] == pytest.approx(-0.05, abs=1e-4)
    assert df.loc[("ring <= FI", 64), "measure"] == "ratio"
    only = df.loc[("only in a", 64)]
    assert only["a"] == 1.0 and math.isnan(only["b"]) and not only["moved"]
    assert math.isnan(df.loc[("zero", 64), "change"]) and not df.loc[("zero", 64), "moved"]
    assert not compare(a, b, noise=0.2)["moved"].any()


def test_bad_input_is_refused_naming_the_argument(tmp_path, capsys):
    a = _run(tmp_path, "a", [_row("t", 1, 1.0)])
    dup = _run(tmp_path, "dup", [_row("t", 1, 1.0), _row("t", 1, 1.1)])
    with pytest.raises(ValueError, match="^run: .* is not a run folder"):
        compare(a, tmp_path / "nowhere")
    with pytest.raises(ValueError, match="^run: .* holds target 't' twice for the same cell"):
        compare(a, dup)
    for noise in (0, -0.1, 1.0, math.inf, math.nan, True):
        with pytest.raises(ValueError, match=r"^noise: must be a fraction in \(0, 1\)"):
            compare(a, a, noise=noise)
    broken = _run(tmp_path, "broken", [_row("t", 1, 1.0)])
    (broken / "results/roofline/headline.csv").write_bytes(b'status,target\n"met,\xa5\xff')
    with pytest.raises(ValueError, match="^run: .*headline.csv is not a headline table"):
        compare(a, broken)
    text = _run(tmp_path, "text", [_row("t", 1, "abc")])
    with pytest.raises(ValueError, match="^run: .*headline.csv: ratio 'abc' is not a number"):
        compare(a, text)
    assert main([str(a), str(tmp_path / "nowhere")]) == 2
    assert "report_compare: run:" in capsys.readouterr().err
    assert main([str(a), str(a)]) == 0
    assert "1 targets in 1 cells; 1 cells with a figure in both runs, 0 of them moved" in \
        capsys.readouterr().out


def test_figures_of_two_kinds_are_not_compared(tmp_path):
    """A target whose figure is a ratio in one run and a fraction in the other (a headline
    without its ratio) gets no change, and a headline that is a folder is named."""
    a = _run(tmp_path, "a", [_row("t", 64, 1.1)])
    b = _run(tmp_path, "b", [_row("t", 64, None, frac=0.01, bound=0.9)])
    row = compare(a, b).iloc[0]
    assert math.isnan(row["change"]) and not row["moved"]
    c = tmp_path / "c" / "results" / "nb" / "headline.csv"
    c.mkdir(parents=True)
    with pytest.raises(ValueError, match="^run: .*headline.csv is not a file"):
        compare(a, tmp_path / "c")


def test_a_cell_that_is_not_an_integer_is_named(tmp_path):
    a = _run(tmp_path, "a", [_row("t", 64, 1.1)])
    b = _run(tmp_path, "b", [_row("t", "sixty", 1.1)])
    with pytest.raises(ValueError, match="^run: .*headline.csv: B 'sixty' is not an integer"):
        compare(a, b)


def test_a_cut_off_last_line_is_refused_naming_the_line(tmp_path):
    """A headline whose last line was cut after a number (pandas would read ``5.55`` of
    ``5.557`` and fill the rest with NaN) is refused naming the file and line."""
    a = _run(tmp_path, "a", [_row("t", 64, 1.1), _row("u", 64, 5.557)])
    cut = _run(tmp_path, "cut", [_row("t", 64, 1.1), _row("u", 64, 5.557)])
    path = cut / "results/roofline/headline.csv"
    text = path.read_text()
    path.write_text(text[:text.index("5.557") + 4])
    with pytest.raises(ValueError, match=r"^run: .*headline.csv line 3 has 6 fields, the header "
                                         r"15 \(a cut-off"):
        compare(a, cut)
    assert len(compare(a, a)) == 2
