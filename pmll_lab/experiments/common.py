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
