"""Targets as data, and the answer every report opens with: a verdict line, one headline table
(status first, ours against its peer, the ratio, our roofline fraction), a few findings.

A ``Target`` is one row: which rows are ours (a kernel name or column filters such as
``{"form": "ring"}``), which are the peer's, where (``K``, ``B``, shape), what is compared
(``metric``: ``time_us``, or ``step_us`` for whole speculative steps) and the bound. A new
kernel, form or target is one more ``Target``. On the CPU no speed target is judged (interpreter
wall times say nothing about a GPU): the headline then holds the checks only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pmll_lab.experiments import protocol as P

KINDS = ("ratio", "frac", "time")


@dataclass(frozen=True)
class Target:
    """``kind``: ``"ratio"``: ours / peer (``metric``) <= ``bound``; ``"frac"``: our roofline
    fraction >= ``bound``; ``"time"``: ours (us) <= ``bound``; ``bound=None``: the figure is
    reported, not judged (status ``reported``, outside the verdict's count). ``where``: filters
    both sides (``protocol.at``); ``reports``: the notebooks whose headline shows it
    (``target_table.for_report``); ``per``: one headline row per value of these columns (a listed
    ``where`` value gives the rows even where nothing ran); ``over``: cells that must all meet
    the bound (the worst is shown). On each side the fastest row of a cell counts (over
    state layouts). ``show``: columns of our row whose values the note gives (``mean_pend``)."""

    text: str
    ours: str | Mapping
    peer: str | Mapping | None = None
    bound: float | None = 1.0
    kind: str = "ratio"
    where: Mapping = field(default_factory=dict)
    per: tuple = ()
    over: tuple = ()
    metric: str = "time_us"
    timer: str | None = None
    note: str = ""
    show: tuple = ()
    reports: tuple = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "ratio" and self.peer is None:
            raise ValueError(f"peer: a ratio target needs one ({self.text!r})")


COLUMNS = ["status", "target", "ours", "peer", "ratio", "roofline_frac", "ours_us", "peer_us",
           "bound", "cells", "met_cells", "layout", "timer", "note"]
CHECK_COLUMNS = ["status", "kernel", "passed", "checks", "points", "worst_rel_l2", "tolerance",
                 "worst_of"]


def _name(sel) -> str:
    return sel if isinstance(sel, str) else ", ".join(f"{k}={v}" for k, v in sel.items())


def _side(w: pd.DataFrame, sel, t: Target, cell: list[str]) -> pd.DataFrame:
    """The fastest row per cell of one side of the wide table ``w``: ``value`` (the metric),
    ``frac`` (roofline fraction), ``layout`` and the ``show`` columns."""
    rows = P.at(P.at(w, {"kernel": sel} if isinstance(sel, str) else sel), t.where)
    if rows.empty:
        return rows
    rows = rows.assign(value=rows["time_us"], layout=rows["state_layout"], _k=0,
                       frac=rows["roofline_frac"] if "roofline_frac" in rows else math.nan,
                       **{c: math.nan for c in cell if c not in rows})   # rows without the axis
    best = rows.loc[rows.groupby(cell + ["_k"], dropna=False)["value"].idxmin()]
    keep = [c for c in t.show if c in best]
    return best[cell + ["_k", "value", "frac", "layout"] + keep]


def _judge(t: Target, ours: float, peer: float, frac: float) -> tuple[float, bool]:
    """``(figure, met)``: the ratio, the fraction or the time, and whether it meets the bound."""
    fig = ours / peer if t.kind == "ratio" else frac if t.kind == "frac" else ours
    if t.bound is None:
        return fig, False
    return fig, (fig >= t.bound if t.kind == "frac" else fig <= t.bound)


def _rows_of(w: pd.DataFrame, t: Target, timer: str) -> list[dict]:
    cell = list(t.per) + list(t.over)
    o = _side(w, t.ours, t, cell)
    p = _side(w, t.peer, t, cell) if t.peer is not None else None
    base = {"target": t.text, "ours": _name(t.ours), "peer": _name(t.peer) if t.peer else "",
            "bound": t.bound, "timer": timer, "note": t.note}
    groups = [()]
    if t.per:
        want = [t.where[c] for c in t.per if isinstance(t.where.get(c), (list, tuple))]
        keys = (list(zip(*want)) if len(want) == 1 and len(t.per) == 1 else None)
        seen = list(o[list(t.per)].drop_duplicates().itertuples(index=False)) if len(o) else []
        groups = list(dict.fromkeys(tuple(k) for k in (keys or []) + seen))
    out = []
    for g in groups:
        at = dict(zip(t.per, g))
        og = P.at(o, at) if len(o) else o
        pg = P.at(p, at) if p is not None and len(p) else p
        row = dict(base, **at)
        missing = [n for n, s in (("ours", og), ("peer", pg)) if s is not None and s.empty]
        if missing:
            out.append(dict(row, status="not measured", cells=0, met_cells=0,
                            note=" and ".join(missing) + " not measured"
                            + (f"; {t.note}" if t.note else "")))
            continue
        cells = og if pg is None else og.merge(pg[cell + ["_k", "value"]], on=cell + ["_k"],
                                               suffixes=("", "_peer"))
        if cells.empty:
            out.append(dict(row, status="not measured", cells=0, met_cells=0,
                            note="no cell where both ran"))
            continue
        judged = [_judge(t, r["value"], r.get("value_peer", math.nan), r["frac"])
                  for _, r in cells.iterrows()]
        figs = [j[0] for j in judged]
        worst = max(range(len(figs)), key=lambda i: figs[i] * (-1 if t.kind == "frac" else 1))
        w = cells.iloc[worst]
        met = sum(j[1] for j in judged)
        where = ", ".join(f"{c}={w[c]}" for c in t.over) if len(judged) > 1 else ""
        shown = ", ".join(f"{c} {w[c]:.2f}" for c in t.show if c in w and pd.notna(w[c]))
        status = "reported" if t.bound is None else "met" if met == len(judged) else "missed"
        out.append(dict(row, status=status,
                        ratio=figs[worst] if t.kind == "ratio" else math.nan,
                        roofline_frac=w["frac"], ours_us=w["value"],
                        peer_us=w.get("value_peer", math.nan), cells=len(judged),
                        met_cells=met, layout=w["layout"],
                        note="; ".join(x for x in (f"worst at {where}" if where else "",
                                                   shown, t.note) if x)))
    return out


def headline(df: pd.DataFrame, targets: Sequence[Target]) -> pd.DataFrame:
    """One row per target (and ``per`` value), ``COLUMNS`` plus the ``per`` columns after
    ``target``. Empty without GPU timings (``checks_headline`` is the CPU's headline)."""
    if df.empty or not P.on_gpu(df):
        return pd.DataFrame(columns=COLUMNS)
    rows, wides = [], {}
    for t in targets:
        ours = P.at(df, {"kernel": t.ours} if isinstance(t.ours, str) else t.ours)
        timer = t.timer or P.best_timer(ours, t.metric) or P.best_timer(df, t.metric)
        if timer is None:
            rows.append({"target": t.text, "ours": _name(t.ours), "status": "not measured",
                         "bound": t.bound, "note": f"no {t.metric} rows",
                         **{c: math.nan for c in t.per}})
            continue
        if (timer, t.metric) not in wides:
            wides[(timer, t.metric)] = P.wide(df, timer, metric=t.metric)
        rows += _rows_of(wides[(timer, t.metric)], t, timer)
    out = pd.DataFrame(rows)
    per = [c for c in out.columns if c not in COLUMNS]
    out = out.reindex(columns=COLUMNS[:2] + per + COLUMNS[2:])
    return out.round({"ratio": 3, "roofline_frac": 3, "ours_us": 2, "peer_us": 2})


def checks_headline(df: pd.DataFrame) -> pd.DataFrame:
    """The checks as a headline (the CPU's): per kernel passed of run and the worst error."""
    c = P.checks(df)
    return c.reindex(columns=CHECK_COLUMNS) if len(c) else pd.DataFrame(columns=CHECK_COLUMNS)


def verdict(df: pd.DataFrame, head: pd.DataFrame, name: str) -> str:
    """The report's first line: targets met of total and on which device, or on the CPU the
    checks passed and "no speed verdict on the CPU"; then the checks and the failed points."""
    dev = str(df["device"].dropna().iloc[0]) if "device" in df and df["device"].notna().any() \
        else "this machine"
    c = P.checks(df)
    n_chk, n_ok = (int(c["checks"].sum()), int(c["passed"].sum())) if len(c) else (0, 0)
    n_fail, peers = P.point_failures(df)
    tail = f"; {n_fail} point(s) failed" if n_fail else ""
    if len(peers):
        kernels = ", ".join(sorted(peers["kernel"].astype(str).unique())) if "kernel" in peers \
            else "?"
        tail += (f"; {kernels} failed (a check or an error) in "
                 f"{peers['point_id'].nunique()} point(s)")
    if not P.on_gpu(df):
        return (f"**{name}: judged on a GPU only; no speed verdict on the CPU.** Checks of "
                f"this run's shapes on {dev}: {n_ok} of {n_chk} passed{tail}.")
    judged = head[head["bound"].notna()] if len(head) else head
    met = int((judged["status"] == "met").sum()) if len(judged) else 0
    return (f"**{name}: {met} of {len(judged)} targets met on {dev}.** Checks: {n_ok} of {n_chk} "
            f"passed{tail}.")


def answer(df: pd.DataFrame, targets: Sequence[Target], name: str,
           findings: pd.DataFrame | None = None, results_dir: str | Path | None = None):
    """Display the opening of a report (verdict, headline table, findings) and write the
    headline to ``<results_dir>/headline.csv`` for the run's index. Returns the headline."""
    from IPython.display import HTML, Markdown, display

    head = headline(df, targets) if P.on_gpu(df) else checks_headline(df)
    display(Markdown(verdict(df, head, name)))
    display(HTML(P.labelled(as_shown(head)).to_html(index=False, classes="headline", na_rep="",
                                                  float_format=lambda v: f"{v:.4g}")))
    if findings is not None and len(findings):
        display(HTML(P.labelled(findings).to_html(index=False, classes="findings", na_rep="",
                                                  float_format=lambda v: f"{v:.4g}")))
    if results_dir is not None:
        head.to_csv(Path(results_dir) / "headline.csv", index=False)
    return head


def detail(df: pd.DataFrame, targets: Sequence[Target], summary: str) -> None:
    """Display, folded under ``summary``, the targets of single launches that a report keeps
    as detail below its per-step headline (GPU runs only: on the CPU there is no verdict)."""
    from IPython.display import HTML, display

    if P.on_gpu(df):
        head = as_shown(headline(df, targets))
        display(HTML(P.details(head, summary).data))


SHOWN_FIRST = ("status", "target", "kernel", "B", "K", "ratio", "bound", "ours_us", "peer_us",
               "roofline_frac")
"""The columns a headline shows first (in the report and on the run's index), in order."""


def as_shown(head: pd.DataFrame) -> pd.DataFrame:
    """The headline as a report shows it (``headline.csv`` keeps every column): the verdict's
    columns first (status, what, the cell, ratio and bound, the two times), then the rest;
    cells met only for judged rows (a reported figure met nothing and missed nothing), cells and
    cells met left out when every judged target is one cell; columns empty in every row left
    out."""
    if head.empty:
        return head
    if {"cells", "met_cells", "status"} <= set(head.columns):
        judged = head["status"].isin(["met", "missed"])
        head = head.assign(met_cells=head["met_cells"].where(judged))
        if (pd.to_numeric(head.loc[judged, "cells"], errors="coerce").fillna(1) <= 1).all():
            head = head.drop(columns=["cells", "met_cells"])
    keep = [c for c in head.columns if head[c].replace("", pd.NA).notna().any()]
    first = [c for c in SHOWN_FIRST if c in keep]
    return head[first + [c for c in keep if c not in first]]


FACT_COLUMNS = ["quantity", "value", "unit", "note"]
"""A findings table: one measured fact per row, its number in ``value`` (a ratio's unit is
``"x"``, a count's ``"of N ..."``), no sentences."""


def fact(quantity: str, value, unit: str = "", note: str = "") -> dict:
    """One row of a findings table (``FACT_COLUMNS``)."""
    return {"quantity": quantity, "value": value, "unit": unit, "note": note}


def facts(rows: list[dict]) -> pd.DataFrame:
    """The rows of ``fact`` as a table with ``FACT_COLUMNS`` (empty: no rows)."""
    return pd.DataFrame(rows, columns=FACT_COLUMNS)


def setup() -> None:
    """A notebook's first call: the parameters papermill injected checked against its
    parameters cell (``parameters.check_notebook``: a misspelt name or a grid that is not a dict
    is a ``ValueError`` naming it, before anything runs); display settings: tables shown whole;
    the import-time warnings of tqdm (no ipywidgets) and of FLA on a machine without a GPU kept
    out of the report."""
    import warnings

    from pmll_lab.experiments.parameters import check_notebook

    check_notebook()

    for opt, val in (("display.max_rows", None), ("display.max_columns", None),
                     ("display.width", 250), ("display.max_colwidth", None)):
        pd.set_option(opt, val)
    for message in ("IProgress not found", "Triton is not supported",
                    "Flash Attention is not installed"):
        warnings.filterwarnings("ignore", message=message)


def about(peers: bool = False) -> str:
    """One line of provenance: device, versions, commit; with ``peers`` what FLA, FlashInfer
    and SGLang are here."""
    from pmll_lab.backend import environment

    env = environment()
    line = (f"Ran on {env['device']}: torch {env['torch']}, triton {env['triton']}, "
            f"commit {env['commit']}.")
    if peers:
        from pmll_lab.peers import fla_available, flashinfer_status
        from pmll_lab.peers_sglang import sglang_status

        line += (f" {flashinfer_status()}; {sglang_status()}; FLA fused_recurrent: "
                 f"{'yes' if fla_available() else 'no (needs a GPU and fla-core)'}.")
    return line
