"""Result tables as a report shows them: headers in words with units (``header``,
``COLUMN_LABELS``), numbers to 3 significant digits, no index column (``table``), folded
details (``details``). The results files keep the column names; only the display changes.
"""

from __future__ import annotations

import html

import pandas as pd

COLUMN_LABELS = {
    "time_us": "time (µs)", "ours_us": "ours (µs)", "peer_us": "peer (µs)",
    "step_us": "step (µs)", "do_bench_us": "do_bench (µs)", "cuda_graph_us": "CUDA graph (µs)",
    "roofline_frac": "fraction of roofline", "median_roofline": "median fraction of roofline",
    "best_roofline": "best fraction of roofline", "gbps": "GB/s", "median_gbps": "median GB/s",
    "best_gbps": "best GB/s", "met_cells": "cells met", "worst_rel_l2": "worst rel. L2",
    "worst_of": "worst quantity", "what": "quantity", "rel_l2": "rel. L2", "max_abs": "max abs",
    "o_rel_l2": "output rel. L2", "state_rel_l2": "state rel. L2",
    "state_layout": "state layout", "state_dtype": "state dtype", "head_dim": "head dim",
    "mean_fill": "mean fill before a verify (rows)", "fold_frac": "folds per verify",
    "write_back_frac": "write-backs per verify", "mean_accept": "mean accepted rows",
    "ring_length": "ring length", "bytes_moved_step": "bytes moved per step",
    "bytes_held_seq": "bytes held per sequence", "host_syncs": "host syncs",
    "lazy_steps": "lazy steps", "eager_steps": "eager steps", "flushed_slots": "flushed slots",
    "drift_o": "output drift", "drift_state": "state drift",
    "mean_folded": "mean rows folded", "wb_freq": "write-backs per verify",
    "rel_l2_last": "rel. L2, last token", "top1_agree": "top-1 agreement",
}
"""Headers a report table shows for result columns (``table``, ``details``): words and units
for researchers; the results files keep the column names. Other names: ``header``."""

UNIT_SUFFIXES = (("_per_s", "/s"), ("_us", " (µs)"), ("_ms", " (ms)"), ("_kib", " (KiB)"),
                 ("_mib", " (MiB)"), ("_gbps", " (GB/s)"))
"""Column-name endings that carry a unit, and how a header writes it (``tokens_per_s``:
"tokens/s", ``step_ms``: "step (ms)")."""


def header(name) -> str:
    """The header a report shows for column ``name``: ``COLUMN_LABELS``, else the name with its
    unit ending written out (``UNIT_SUFFIXES``) and underscores as spaces; a name without an
    underscore (``K``, ``B``, ``eps``) as it is."""
    if not isinstance(name, str):
        return name
    if name in COLUMN_LABELS:
        return COLUMN_LABELS[name]
    name = name.replace("rel_l2", "rel. L2")
    for end, unit in UNIT_SUFFIXES:
        if name.lower().endswith(end) and len(name) > len(end):
            return name[:-len(end)].replace("_", " ") + unit
    return name.replace("_", " ")


def _html(df: pd.DataFrame) -> str:
    if not len(df):
        return "<p>(none)</p>"
    return labelled(df).to_html(index=False, na_rep="", float_format=_number)


def labelled(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` as a report shows it: a named index or a pivot's keys as columns,
    result columns headed by ``header`` (``COLUMN_LABELS``, units written out), a pivot of several quantities under one header
    row ("quantity key")."""
    df = df.copy()
    if isinstance(df.index, pd.MultiIndex) or df.index.name is not None:
        df = df.reset_index()                  # a pivot's or groupby's keys: columns of their own
    df = df.rename(columns=header)
    if isinstance(df.columns, pd.MultiIndex):  # a pivot of several values: "quantity key"
        df.columns = [" ".join(str(x) for x in col if str(x) != "") for col in df.columns]
    else:
        df.columns = df.columns.rename(None)   # a pivot's column name would head an empty column
    return df


def _number(v: float) -> str:
    """3 significant digits; from 1000 up whole numbers with thousands separators (``.3g``
    would write 12,346 as 1.23e+04)."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def table(df: pd.DataFrame):
    """``df`` as a report table: no index column (a named index or a pivot's keys become
    columns), blank for a missing value, 3 significant digits (whole numbers from 1000),
    result columns headed by
    ``COLUMN_LABELS`` (a raw DataFrame shows its index, ``NaN`` and the column names)."""
    from IPython.display import HTML

    return HTML(_html(df))


def details(df: pd.DataFrame, summary: str):
    """``df`` as HTML folded under ``summary`` (opened by a click in the report)."""
    from IPython.display import HTML

    return HTML(f"<details><summary>{html.escape(summary)}</summary>{_html(df)}</details>")
