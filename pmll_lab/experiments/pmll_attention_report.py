"""The pmll_attention notebook's targets, tables and plots, from the rows of
``pmll_attention``'s three sweeps (ring states, GPT-2 eviction, speed). Times: ``protocol.wide``
(CUDA graph replays where the run has them; the reference path by do_bench only).
"""

from __future__ import annotations

from functools import partial

import pandas as pd

from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.pmll_attention import LABELS, PROVIDERS
from pmll_lab.experiments.targets import Target, fact, facts

PARAMS = ("B", "H", "D", "M", "T", "dtype", "capacity", "gate")
TARGET_SET = "Attention straight from the ring against PyTorch SDPA"
_CELLS = dict(per=("H", "D"), over=("M", "T"))
TARGETS = (
    Target("fused ring attention <= 0.5x gather + SDPA with mask, every M >= 1 and T",
           "fused", "gather_sdpa_mask", 0.5, where=dict(M=lambda m: m >= 1), **_CELLS),
    Target("fused ring attention <= 1.1x SDPA over contiguous keys (lower-right causal), "
           "T <= 1024", "fused", "sdpa_contiguous", 1.1, where=dict(T=lambda t: t <= 1024),
           **_CELLS),
    Target("pmll_step (attention + ring write) <= 1.1x its attention alone, every M >= 1",
           "pmll_step", "fused", 1.1, where=dict(M=lambda m: m >= 1), **_CELLS),
)


def times(df: pd.DataFrame, timer: str | None = None) -> pd.DataFrame:
    """One row per timed (point, provider): time, TFLOP/s and beside a graph replay the
    do_bench time of the same call (``do_bench_us``)."""
    return P.wide(df, timer)


def wide_times(df: pd.DataFrame) -> pd.DataFrame:
    """Times (us) with one column per provider, one row per (shape, M, T); on a GPU the
    providers timed by do_bench only (the reference path) follow as ``<provider> (do_bench)``."""
    t = times(df)
    if t.empty:
        return t
    idx = ["B", "H", "D", "dtype", "M", "T"]
    w = t.pivot_table(index=idx, columns="kernel", values="time_us")
    w = w[[p for p in PROVIDERS if p in w.columns]]
    if t["timer"].iloc[0] == "cuda_graph":
        db = times(df, "do_bench")
        db = db[~db["kernel"].isin(w.columns)]
        if len(db):
            w = w.join(db.pivot_table(index=idx, columns="kernel", values="time_us")
                       .rename(columns=lambda k: f"{k} (do_bench)"), how="left")
    w = w.reset_index()
    w.columns.name = None
    return w.round(2)


def ratio_table(df: pd.DataFrame, ours: str, peer: str) -> pd.DataFrame:
    """``time(ours) / time(peer)``, one row per (H, D, M), one column per ``T``: GPU runs only."""
    t = times(df)
    if t.empty or not P.on_gpu(t):
        return pd.DataFrame()
    w = t.pivot_table(index=["H", "D", "M", "T"], columns="kernel", values="time_us")
    if ours not in w or peer not in w:
        return pd.DataFrame()
    r = (w[ours] / w[peer]).dropna().rename("ratio").reset_index()
    out = r.pivot_table(index=["H", "D", "M"], columns="T", values="ratio").round(3)
    out.columns.name = "T"
    return out.reset_index()


correctness_table = partial(P.correctness_table, by=("dtype",))
failed_points = partial(P.failed_points, params=PARAMS)
plot_state_errors = partial(plots.plot_errors, labels=LABELS,
                            title="Memory attention over ring states against float64")


def plot_times(df: pd.DataFrame):
    """Time per segment against ``T``, one panel per (shape, M), one line per provider."""
    import matplotlib.pyplot as plt

    t = times(df)
    if t.empty:
        return None
    shapes = sorted(t.groupby(["H", "D"]).groups)
    Ms = sorted(t["M"].unique())
    fig, axes = plt.subplots(len(shapes), len(Ms), figsize=(2.4 + 3 * len(Ms), 2.9 * len(shapes)),
                             squeeze=False, sharey="row", layout="constrained")
    for i, (H, D) in enumerate(shapes):
        for j, M in enumerate(Ms):
            ax = axes[i][j]
            s = t[(t["H"] == H) & (t["D"] == D) & (t["M"] == M)]
            for prov in PROVIDERS:
                p = s[s["kernel"] == prov].sort_values("T")
                if len(p):
                    ax.plot(p["T"], p["time_us"], label=LABELS[prov], **plots.style(prov))
            ax.set(xscale="log", yscale="log", xlabel="segment length T",
                   title=f"H={H}, D={D}, M={M}")
            ax.set_xscale("log", base=2)
            ax.title.set_fontsize(9)
    timer = str(t["timer"].iloc[0])
    axes[0][0].set_ylabel(f"time (us)\n{P.TIMER_LABELS.get(timer, timer)}", fontsize=8)
    fig.suptitle(f"One segment's attention, B={int(t['B'].iloc[0])}, {t['dtype'].iloc[0]}",
                 fontsize=10)
    plots.legend_outside(fig)
    return fig


def eviction_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (gate, capacity): rel_l2 of all logits and of the last segment's, top-1 agreement."""
    if df.empty or "metric" not in df:
        return pd.DataFrame()
    ok = df[df["status"] == "ok"]
    w = ok.pivot_table(index=["gate", "capacity", "needed"], columns="metric", values="value")
    w = w[[c for c in ("rel_l2", "rel_l2_last", "max_abs", "top1_agree") if c in w]].reset_index()
    w.columns.name = None
    return w.sort_values(["gate", "capacity"]).reset_index(drop=True)


def plot_eviction(df: pd.DataFrame):
    """rel_l2 of the logits against ring capacity, one line per gate; the capacity that evicts
    nothing marked."""
    import matplotlib.pyplot as plt

    t = eviction_table(df)
    if t.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), layout="constrained")
    for k, (gate, g) in enumerate(t.groupby("gate", sort=True)):
        lab = "no gate (g = 1)" if gate == "none" else f"gate g = {gate}"
        for ax, col in zip(axes, ("rel_l2", "rel_l2_last")):
            ax.plot(g["capacity"], g[col].clip(lower=1e-9), marker="o", color=f"C{k}", label=lab)
    need = int(t["needed"].iloc[0])
    for ax, title in zip(axes, ("all positions", "last segment")):
        ax.axvline(need, color="grey", ls=":", lw=1, label="nothing evicted from here")
        ax.set(yscale="log", xlabel="ring capacity M (rows per head)",
               ylabel="rel. L2 of logits vs whole sequence",
               title=f"GPT-2 segmented through the ring: {title}")
    plots.legend_outside(fig, axes[:1])
    return fig


def findings(sdf: pd.DataFrame, edf: pd.DataFrame) -> pd.DataFrame:
    """Facts: the worst rel. L2 over ring states per kernel; GPT-2's logits with nothing evicted
    and with the smallest ring (rel. L2 against the whole sequence, top-1 agreement)."""
    rows = []
    c = P.checks(sdf)
    for r in c.itertuples() if len(c) else []:
        rows.append(fact(f"{r.kernel} over every ring state: worst rel. L2", r.worst_rel_l2,
                         "rel. L2", f"tolerance {r.tolerance:.1e}"))
    e = eviction_table(edf)
    if len(e):
        need = int(e["needed"].iloc[0])
        full = e[(e["gate"] == "none") & (e["capacity"] >= need)]
        if len(full):
            rows.append(fact(f"GPT-2, nothing evicted (M >= {need}, no gate): logits vs the "
                             "whole sequence", full["rel_l2"].max(), "rel. L2"))
        part = e[(e["gate"] == "none") & (e["capacity"] < need)]
        if len(part):
            lo = part.iloc[0]
            what = f"GPT-2, smallest ring (M={int(lo['capacity'])}, no gate)"
            rows += [fact(f"{what}: logits vs the whole sequence", lo["rel_l2"], "rel. L2"),
                     fact(f"{what}: top-1 agreement", lo["top1_agree"], "fraction")]
    return facts(rows)
