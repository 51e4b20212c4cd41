"""Two runs' headlines side by side: each target's figure in both, and how far it moved.

``python -m pmll_lab.report_compare RUN_A RUN_B [--noise 0.02]`` reads every notebook's
``results/<notebook>/headline.csv`` of the two run folders (target headlines: a CPU run's
check headline has no targets) and prints one line per target and cell (``B`` or the other
columns a headline gives between ``target`` and ``ours``) of either run: the figure of each run
(``measure``: the ratio where the target has a peer, else the fraction of the copy ceiling a
bandwidth target judges, else our time in µs), their status, ``change = B / A -
1`` and ``moved`` (a change beyond ``--noise``, default 0.02: between two sessions of one card
type a step ratio moved by under 2 %, ``reports/perf-notes.md``). A target in one run only, or
without a figure in one, is listed with the other side empty, not dropped. Figures are the
headlines' (ratios to 3 decimals). Why: a rerun on another day or card is judged against an
earlier run target by target, not by reading two indexes. Each figure is a ratio or time one
run measured inside itself; the device of each run is on its index.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from pmll_lab.report_index import HEADLINE_FILE

NOISE = 0.02
"""Default ``--noise``: the largest change of a step ratio between two sessions of one card type
(``reports/perf-notes.md``)."""


def _cells(columns) -> list[str]:
    """A headline's per-cell columns: those right after ``target`` before any of ``COLUMNS``
    (``targets.headline`` puts them there; older headlines too)."""
    from pmll_lab.experiments.targets import COLUMNS    # as report_index: not at start-up

    cols = list(columns)
    out = []
    for c in cols[cols.index("target") + 1:]:
        if c in COLUMNS:
            break
        out.append(c)
    return out


def _whole_rows(path: Path, width: int) -> None:
    """``ValueError`` naming ``path`` and the line when a record has fewer or more fields than
    the header (pandas fills a cut-off last line with NaN and reads its last number short)."""
    import csv

    with open(path, newline="", encoding="utf-8") as f:
        for n, rec in enumerate(csv.reader(f), 1):
            if rec and len(rec) != width:
                raise ValueError(f"run: {path} line {n} has {len(rec)} fields, the header "
                                 f"{width} (a cut-off or hand-edited line)")


def headlines(run: str | Path) -> pd.DataFrame:
    """Every target headline (``results/<notebook>/headline.csv`` with a ``target`` column) of run
    folder ``run`` in one frame: ``notebook``, ``target``, its cells, ``figure`` (the ratio, else
    the copy-ceiling fraction of a bandwidth target, else our time in µs), ``measure`` (which
    of the three) and ``status``. ``ValueError`` naming ``run`` when it is not a run folder, or
    naming the file when a headline is not a table of numbers or holds a target and cell
    twice."""
    run = Path(run)
    if not (run / "results").is_dir():
        raise ValueError(f"run: {str(run)!r} is not a run folder (no results/ in it)")
    frames = []
    for path in sorted(run.glob(f"results/*/{HEADLINE_FILE}")):
        if not path.is_file():
            raise ValueError(f"run: {path} is not a file")
        try:
            df = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            continue                                   # an empty file: nothing to compare
        except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"run: {path} is not a headline table ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:120]})") from None
        if "target" not in df or df.empty:
            continue                                   # a check headline (a CPU run)
        _whole_rows(path, len(df.columns))
        cells = _cells(df.columns)
        keys = ["target", *cells]
        from pmll_lab.harness.workloads import INT_AXES
        for c in cells:
            if c in INT_AXES:
                v = pd.to_numeric(df[c], errors="coerce")
                bad = df[c][df[c].notna() & (v.isna() | (v % 1 != 0))]
                if len(bad):
                    raise ValueError(f"run: {path}: {c} {bad.iloc[0]!r} is not an integer")
        dup = df[df.duplicated(keys, keep=False)]
        if len(dup):
            raise ValueError(f"run: {path} holds target {dup['target'].iloc[0]!r} twice for the "
                             f"same cell ({', '.join(cells) or 'no cell columns'})")
        ratio = pd.to_numeric(df.get("ratio", pd.Series(index=df.index, dtype=float)),
                              errors="coerce")
        us = pd.to_numeric(df.get("ours_us", pd.Series(index=df.index, dtype=float)),
                           errors="coerce")
        frac = pd.to_numeric(df.get("roofline_frac", pd.Series(index=df.index, dtype=float)),
                             errors="coerce")
        for col, got in (("ratio", ratio), ("ours_us", us), ("roofline_frac", frac)):
            if col in df and (df[col].notna() & got.isna()).any():
                bad = df[col][df[col].notna() & got.isna()].iloc[0]
                raise ValueError(f"run: {path}: {col} {bad!r} is not a number")
        bound = pd.to_numeric(df.get("bound", pd.Series(index=df.index, dtype=float)),
                              errors="coerce")
        is_frac = ratio.isna() & frac.notna() & ((bound <= 1) | df["target"].astype(str)
                                                 .str.contains("%|fraction", regex=True))
        figure = ratio.where(ratio.notna(), frac.where(is_frac, us))
        measure = pd.Series("ratio", index=df.index).where(ratio.notna(), "µs")
        measure = measure.where(~is_frac, "fraction").where(figure.notna(), "")
        frames.append(df[keys].assign(notebook=path.parent.name, figure=figure,
                                      measure=measure, status=df.get("status", "")))
    if not frames:
        return pd.DataFrame(columns=["notebook", "target", "figure", "measure", "status"])
    return pd.concat(frames, ignore_index=True)


def compare(run_a: str | Path, run_b: str | Path, noise: float = NOISE) -> pd.DataFrame:
    """One row per (notebook, target, cell) of either run: ``a``, ``b`` (the figures; empty
    where that run has none), ``status_a``, ``status_b``, ``change`` (``b / a - 1``; empty
    unless both figures are there and ``a`` is not 0) and ``moved`` (``|change| > noise``).
    ``ValueError`` naming ``noise`` unless it is a positive number, or naming ``run`` (see
    ``headlines``)."""
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 < noise < 1:
        raise ValueError(f"noise: must be a fraction in (0, 1), not {noise!r}")
    a, b = headlines(run_a), headlines(run_b)
    fixed = ("notebook", "target", "figure", "measure", "status")
    cells = [c for c in dict.fromkeys([*a.columns, *b.columns]) if c not in fixed]
    for df in (a, b):
        for c in cells:
            if c not in df:
                df[c] = pd.NA
            df[c] = df[c].astype(object).where(df[c].notna(), None)
    keys = ["notebook", "target", *cells]
    both = a.merge(b, on=keys, how="outer", suffixes=("_a", "_b"), sort=False)
    both = both.rename(columns={"figure_a": "a", "figure_b": "b"})
    both["measure"] = both["measure_a"].where(both["measure_a"].fillna("") != "",
                                              both["measure_b"])
    ok = (both["a"].notna() & both["b"].notna() & (both["a"] != 0)
          & (both["measure_a"].fillna("") == both["measure_b"].fillna("")))  # one kind of figure
    both["change"] = (both["b"] / both["a"].where(ok) - 1).round(4)
    both["moved"] = both["change"].abs() > noise
    for c in cells:                    # B and the like as integers where every value is one
        v = pd.to_numeric(both[c], errors="coerce")
        given = both[c].notna()
        if given.any() and v[given].notna().all() and (v[given] % 1 == 0).all():
            both[c] = v.astype("Int64")
    keys = [c for c in keys if both[c].notna().any()]   # a cell column neither run fills
    return both[keys + ["measure", "a", "b", "status_a", "status_b", "change", "moved"]]


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
        print(df.to_string(index=False) if len(df) else "no target headline in either run")
    both = int(df["change"].notna().sum()) if len(df) else 0
    targets = len(df[["notebook", "target"]].drop_duplicates()) if len(df) else 0
    print(f"{targets} targets in {len(df)} cells; {both} cells with a figure in both runs, "
          f"{int(df['moved'].sum()) if len(df) else 0} of them moved by more than "
          f"{args.noise:g}; {len(df) - both} in one run only or without a figure in one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
