"""Helpers the experiment modules share."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from pmll_lab.sweep import grid


def head_points(grids: list[dict]) -> list[dict]:
    """Expand notebook grids whose ``heads`` axis lists ``(HK, HV)`` pairs: one point per
    combination with ``HK, HV`` split out; duplicates across grids dropped, order kept."""
    out, seen = [], set()
    for g in grids:
        axes = dict(g)
        heads = axes.pop("heads")
        for p in grid(**axes, heads=[tuple(h) for h in heads]):
            hk, hv = p.pop("heads")
            p.update(HK=int(hk), HV=int(hv))
            key = tuple(sorted(p.items()))
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def failed_points(df: pd.DataFrame, params: Sequence[str]) -> pd.DataFrame:
    """One line per failed point: the ``params`` columns present, and the error text."""
    if df.empty or "status" not in df:
        return pd.DataFrame()
    cols = [c for c in (*params, "error") if c in df]
    return df[df["status"] == "failed"][cols].drop_duplicates().reset_index(drop=True)


def error_strip(ax, err: pd.DataFrame, cats: Sequence[str], *,
                ticks: Sequence[str] | None = None, legend_title: str = "input dtype (-- tolerance)", fontsize: int = 8,
                rotation: int = 0):
    """The error plot every notebook draws: for each category in ``cats`` (values of
    ``err["cat"]``), the ``rel_l2`` rows of ``err`` as points, one colour per ``dtype``, the
    largest positive ``tolerance`` as a short dash; log scale, exact results (0) at 1e-12.
    ``ticks`` labels the categories (default: ``cats``). Returns ``ax``."""
    dtypes = sorted(err["dtype"].unique())
    width = 0.8 / max(len(dtypes), 1)
    for j, dt in enumerate(dtypes):
        for i, cat in enumerate(cats):
            sel = err[(err["cat"] == cat) & (err["dtype"] == dt)]
            if sel.empty:
                continue
            xpos = i - 0.4 + width * (j + 0.5)
            vals = sel["value"].astype(float).clip(lower=1e-12)
            ax.scatter([xpos] * len(vals), vals, s=12, color=f"C{j}", alpha=0.7, label=dt)
            tol = float(sel["tolerance"].max())
            if tol > 0:
                ax.hlines(tol, xpos - width / 2, xpos + width / 2, colors=f"C{j}",
                          linestyles="--")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), title=legend_title, fontsize=fontsize)
    ax.set_xticks(range(len(cats)), list(ticks if ticks is not None else cats),
                  fontsize=fontsize, rotation=rotation)
    ax.set_yscale("log")
    return ax
