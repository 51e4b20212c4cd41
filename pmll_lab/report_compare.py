"""Two runs' headlines side by side: each target's figure in both, and how far it moved.

``python -m pmll_lab.report_compare RUN_A RUN_B [--noise 0.02]`` reads every notebook's
``results/<notebook>/headline.csv`` that both run folders hold and prints one line per target
(and ``B`` or other per-cell columns) found in both: the figure of each run (the ratio where the
target has a peer, else our fraction of the copy ceiling), their status and ``change = B / A - 1``;
``moved`` marks a change beyond ``--noise`` (default 0.02: between two sessions of one card
type a step ratio moved by under 2 %, ``reports/perf-notes.md``). Why: a rerun on another day
or card is judged against an earlier run target by target, not by reading two indexes. Figures
of two runs are compared as ratios each run measured inside itself; the device of each run is
on its index.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from pmll_lab.experiments.targets import COLUMNS

NOISE = 0.02
"""Default ``--noise``: the largest change of a step ratio between two sessions of one card type
(``reports/perf-notes.md``)."""


def headlines(run: str | Path) -> pd.DataFrame:
    """Every ``results/<notebook>/headline.csv`` of run folder ``run`` in one frame with a
    ``notebook`` column and ``figure`` (the ratio, else the roofline fraction); ``ValueError``
    naming ``run`` when it is not a run folder."""
    run = Path(run)
    if not (run / "results").is_dir():
        raise ValueError(f"run: {str(run)!r} is not a run folder (no results/ in it)")
    frames = []
    for path in sorted(run.glob("results/*/headline.csv")):
        df = pd.read_csv(path)
        if len(df):
            frames.append(df.assign(notebook=path.parent.name))
    if not frames:
        return pd.DataFrame(columns=["notebook", "target", "figure", "status"])
    out = pd.concat(frames, ignore_index=True)
    ratio = pd.to_numeric(out.get("ratio"), errors="coerce")
    frac = pd.to_numeric(out.get("roofline_frac"), errors="coerce")
    return out.assign(figure=ratio.where(ratio.notna(), frac))


def compare(run_a: str | Path, run_b: str | Path, noise: float = NOISE) -> pd.DataFrame:
    """One row per (notebook, target, per-cell columns) that both runs measured: ``a``, ``b``
    (the figures), ``status_a``, ``status_b``, ``change`` (``b / a - 1``) and ``moved``
    (``|change| > noise``). ``ValueError`` naming ``noise`` unless it is a positive number."""
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not noise > 0:
        raise ValueError(f"noise: must be a positive fraction, not {noise!r}")
    a, b = headlines(run_a), headlines(run_b)
    per = [c for c in dict.fromkeys([*a.columns, *b.columns])
           if c not in COLUMNS and c not in ("notebook", "figure") and c in a and c in b]
    keys = ["notebook", "target", *per]
    a = a.dropna(subset=["figure"])[keys + ["figure", "status"]]
    b = b.dropna(subset=["figure"])[keys + ["figure", "status"]]
    both = a.merge(b, on=keys, suffixes=("_a", "_b"))
    both = both.rename(columns={"figure_a": "a", "figure_b": "b"})
    for c in per:                      # B and the like as integers where every value is one
        v = pd.to_numeric(both[c], errors="coerce")
        if v.notna().all() and (v % 1 == 0).all():
            both[c] = v.astype("int64")
    both["change"] = (both["b"] / both["a"] - 1).round(4)
    both["moved"] = both["change"].abs() > noise
    return both[keys + ["a", "b", "status_a", "status_b", "change", "moved"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pmll_lab.report_compare",
                                 description="Two runs' headlines side by side.")
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--noise", type=float, default=NOISE,
                    help="a change beyond this fraction is marked moved (default 0.02)")
    args = ap.parse_args(argv)
    try:
        df = compare(args.run_a, args.run_b, args.noise)
    except ValueError as exc:
        print(f"report_compare: {exc}", file=sys.stderr)
        return 2
    with pd.option_context("display.max_rows", None, "display.width", 200,
                           "display.max_colwidth", 70):
        print(df.to_string(index=False) if len(df) else "no target measured in both runs")
    print(f"{len(df)} targets in both runs, {int(df['moved'].sum())} moved by more than "
          f"{args.noise:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
