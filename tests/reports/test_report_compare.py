"""``report_compare``: two runs' headlines matched target by target (and by ``B``), the change
of each figure and whether it moved beyond the noise; bad input refused naming the argument."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pmll_lab.report_compare import compare, main

HEAD = ["status", "target", "B", "ours", "peer", "ratio", "roofline_frac", "ours_us", "peer_us",
        "bound", "cells", "met_cells", "layout", "timer", "note"]


def _run(root, name, rows, notebook="roofline"):
    d = root / name / "results" / notebook
    d.mkdir(parents=True)
    pd.DataFrame(rows, columns=HEAD).to_csv(d / "headline.csv", index=False)
    return root / name


def _row(target, B, ratio=None, frac=None, status="met"):
    return [status, target, B, "ours", "peer" if ratio is not None else "", ratio, frac,
            10.0, 12.0, 1.0, 1, 1, "vk", "cuda_graph", ""]


def test_targets_in_both_runs_are_matched_and_their_change_judged(tmp_path):
    rng = np.random.default_rng()
    r = rng.uniform(0.5, 1.5, size=3)
    a = _run(tmp_path, "a", [_row("ring <= FI", 64, r[0]), _row("ring <= FI", 128, r[1]),
                             _row("decode >= 0.85", 64, frac=r[2]),
                             _row("only in a", 64, 1.0)])
    b = _run(tmp_path, "b", [_row("ring <= FI", 64, r[0] * 1.01),
                             _row("ring <= FI", 128, r[1] * 1.10, status="missed"),
                             _row("decode >= 0.85", 64, frac=r[2] * 0.95)])
    df = compare(a, b).set_index(["target", "B"])
    assert len(df) == 3 and ("only in a", 64) not in df.index
    assert df.loc[("ring <= FI", 64), "change"] == pytest.approx(0.01, abs=1e-4)
    assert not df.loc[("ring <= FI", 64), "moved"]
    assert df.loc[("ring <= FI", 128), "moved"]
    assert df.loc[("ring <= FI", 128), "status_b"] == "missed"
    assert df.loc[("decode >= 0.85", 64), "a"] == pytest.approx(r[2])
    assert df.loc[("decode >= 0.85", 64), "change"] == pytest.approx(-0.05, abs=1e-4)
    assert not compare(a, b, noise=0.2)["moved"].any()


def test_bad_input_is_refused_naming_the_argument(tmp_path, capsys):
    a = _run(tmp_path, "a", [_row("t", 1, 1.0)])
    with pytest.raises(ValueError, match="^run: .* is not a run folder"):
        compare(a, tmp_path / "nowhere")
    with pytest.raises(ValueError, match="^noise: must be a positive fraction"):
        compare(a, a, noise=0)
    assert main([str(a), str(tmp_path / "nowhere")]) == 2
    assert "report_compare: run:" in capsys.readouterr().err
    assert main([str(a), str(a)]) == 0
    assert "1 targets in both runs, 0 moved" in capsys.readouterr().out
