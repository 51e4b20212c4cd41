"""The pmll_attention notebook's tables, headline and plots, from the rows of
``pmll_lab.experiments.pmll_attention``'s three sweeps.

Timers as in the roofline report (``roofline_report.TIMERS``): a GPU run holds ``cuda_graph``
and ``do_bench`` rows (the reference path do_bench only), a CPU run ``interpreter-wall`` rows;
tables and targets use one timer, the first of those the results have.
"""

from __future__ import annotations

import pandas as pd

from pmll_lab.experiments.common import error_strip
from pmll_lab.experiments.common import failed_points as _failed_points
from pmll_lab.experiments.pmll_attention import LABELS, PROVIDERS, STATE_COUNTS
from pmll_lab.experiments.roofline_report import TIMER_LABELS, TIMERS, on_gpu
from pmll_lab.sweep import one_device

SHAPE_KEYS = ("B", "H", "D", "dtype")

HEADLINE_TARGETS = (
    # (target, ours, peer, bound on ours / peer, largest T, smallest M)
    ("fused ring attention <= 0.5x gather + SDPA with mask", "fused", "gather_sdpa_mask", 0.5,
     None, 1),
    ("fused ring attention <= 1.1x SDPA over contiguous keys (lower-right causal), T <= 1024",
     "fused", "sdpa_contiguous", 1.1, 1024, 0),
    ("pmll_step (attention + ring write) <= 1.1x its attention alone", "pmll_step", "fused", 1.1,
     None, 1),
)
"""The targets as (text, our provider, the provider it is held against, bound on the time ratio,
largest segment length ``T`` counted (None: all), smallest ring capacity ``M`` counted)."""
HEADLINE_COLUMNS = ["target", "H", "D", "cells", "met_cells", "worst_M", "worst_T", "ours",
                    "ours_us", "peer", "peer_us", "ratio", "median_ratio", "bound", "timer",
                    "status", "note"]


# ---- timings ----------------------------------------------------------------------------------

def best_timer(df: pd.DataFrame) -> str | None:
    """The first of ``TIMERS`` that ``df``'s ``time_us`` rows have, None without timings."""
    if df.empty or "timer" not in df:
        return None
    have = set(df.loc[df["metric"] == "time_us", "timer"].dropna())
    return next((t for t in TIMERS if t in have), None)


def times(df: pd.DataFrame, timer: str | None = None) -> pd.DataFrame:
    """One row per timed (point, provider) of points that passed their checks, for one timer
    (default ``best_timer``): ``B, H, D, dtype, M, T, kernel, time_us, p20, p80, tflops``; beside
    cuda_graph times the do_bench time of the same call (``do_bench_us``)."""
    timer = best_timer(df) if timer is None else timer
    if timer is None:
        return pd.DataFrame()
    bad = set(df.loc[df["passed"].eq(False), "point_id"]) if "passed" in df else set()
    ok = one_device(df[(df["status"] == "ok") & ~df["point_id"].isin(bad)])

    def pick(metric, tm):
        s = ok[(ok["metric"] == metric) & (ok["timer"] == tm)]
        return s[["point_id", "kernel", "value"] + (["p20", "p80"] if metric == "time_us" else [])]

    base = ok[(ok["metric"] == "time_us") & (ok["timer"] == timer)]
    if base.empty:
        return pd.DataFrame()
    keys = ["point_id", "kernel", *SHAPE_KEYS, "M", "T"]
    out = base[keys + ["value", "p20", "p80", "timer"]].rename(columns={"value": "time_us"})
    fl = pick("tflops", timer).rename(columns={"value": "tflops"})
    out = out.merge(fl, on=["point_id", "kernel"], how="left")
    if timer == "cuda_graph":
        db = pick("time_us", "do_bench")[["point_id", "kernel", "value"]]
        out = out.merge(db.rename(columns={"value": "do_bench_us"}), on=["point_id", "kernel"],
                        how="left")
    return out.reset_index(drop=True)


def wide_times(df: pd.DataFrame) -> pd.DataFrame:
    """Times (us) with one column per provider, one row per (shape, M, T), in the best timer;
    on a GPU the providers timed by do_bench only (the reference path: it syncs with the host,
    so it cannot be captured in a graph) follow as ``<provider> (do_bench)``."""
    t = times(df)
    if t.empty:
        return t
    idx = [*SHAPE_KEYS, "M", "T"]
    w = t.pivot_table(index=idx, columns="kernel", values="time_us")
    w = w[[p for p in PROVIDERS if p in w.columns]]
    if t["timer"].iloc[0] == "cuda_graph":
        db = times(df, "do_bench")
        db = db[~db["kernel"].isin(w.columns)]
        if not db.empty:
            extra = db.pivot_table(index=idx, columns="kernel", values="time_us")
            w = w.join(extra.rename(columns=lambda k: f"{k} (do_bench)"), how="left")
    w = w.reset_index()
    w.columns.name = None
    return w.round(2)


def ratio_table(df: pd.DataFrame, ours: str, peer: str) -> pd.DataFrame:
    """``time(ours) / time(peer)`` with one row per (H, D, M) and one column per ``T``."""
    t = times(df)
    if t.empty:
        return pd.DataFrame()
    w = t.pivot_table(index=["H", "D", "M", "T"], columns="kernel", values="time_us")
    if ours not in w or peer not in w:
        return pd.DataFrame()
    r = (w[ours] / w[peer]).dropna().rename("ratio").reset_index()
    out = r.pivot_table(index=["H", "D", "M"], columns="T", values="ratio").round(3)
    out.columns.name = "T"
    return out.reset_index()


def headline_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per target and shape ``(H, D)``: over the (M, T) cells the target counts, how many met
    the bound, the worst cell (its M, T, our and the peer's time, the ratio) and the median
    ratio; ``status`` met (every cell) / missed / not measured, or ``GPU only`` on a CPU run."""
    t = times(df)
    if t.empty:
        return pd.DataFrame(columns=HEADLINE_COLUMNS)
    gpu = on_gpu(t)
    timer = str(t["timer"].iloc[0])
    w = t.pivot_table(index=["H", "D", "M", "T"], columns="kernel", values="time_us")
    rows = []
    for text, ours, peer, bound, t_max, m_min in HEADLINE_TARGETS:
        for (H, D), g in w.groupby(level=["H", "D"]):
            g = g.reset_index()
            g = g[(g["M"] >= m_min) & ((g["T"] <= t_max) if t_max else True)]
            row = {"target": text, "H": int(H), "D": int(D), "ours": ours, "peer": peer,
                   "bound": bound, "timer": timer, "note": ""}
            if ours not in g or peer not in g or g[[ours, peer]].dropna().empty:
                missing = [n for n in (ours, peer) if n not in g or g[n].dropna().empty]
                rows.append(dict(row, cells=0, met_cells=0, status="not measured",
                                 note=" and ".join(missing) + " not measured"))
                continue
            g = g.dropna(subset=[ours, peer]).assign(ratio=lambda x: x[ours] / x[peer])
            worst = g.loc[g["ratio"].idxmax()]
            met = int((g["ratio"] <= bound).sum())
            status = ("met" if met == len(g) else "missed") if gpu else "GPU only"
            rows.append(dict(row, cells=len(g), met_cells=met, worst_M=int(worst["M"]),
                             worst_T=int(worst["T"]), ours_us=float(worst[ours]),
                             peer_us=float(worst[peer]), ratio=float(worst["ratio"]),
                             median_ratio=float(g["ratio"].median()), status=status))
    return pd.DataFrame(rows, columns=HEADLINE_COLUMNS).round(
        {"ours_us": 2, "peer_us": 2, "ratio": 3, "median_ratio": 3})


def headline_summary(head: pd.DataFrame) -> str:
    """One markdown line: the timer and how many targets were met / missed / not measured."""
    if head.empty:
        return "No timings in these results."
    counts = head["status"].value_counts()
    timer = head["timer"].iloc[0]
    return (f"Times: {TIMER_LABELS.get(timer, timer)}. Targets (per head shape): "
            + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".")


# ---- correctness ------------------------------------------------------------------------------

def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """Worst rel_l2 per (kernel, what, dtype) with its tolerance and how many points passed."""
    if df.empty or "metric" not in df:
        return pd.DataFrame()
    err = df[(df["metric"] == "rel_l2") & df["tolerance"].notna()]
    if err.empty:
        return pd.DataFrame()
    t = (err.groupby(["kernel", "what", "dtype"], sort=False)
         .agg(points=("value", "size"), passed=("passed", "sum"), worst_rel_l2=("value", "max"),
              tolerance=("tolerance", "max")).reset_index())
    t["passed"] = t["passed"].astype(int)
    return t


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    return _failed_points(df, ("B", "H", "D", "M", "T", "dtype", "capacity", "gate"))


def plot_state_errors(df: pd.DataFrame, ax=None):
    """rel_l2 against float64 per ring state, fused and reference side by side, one colour
    per dtype, tolerances dashed."""
    import matplotlib.pyplot as plt

    err = df[df["metric"] == "rel_l2"].copy()
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.8))
    err["cat"] = err["kernel"] + "\n" + err["what"]
    cats = [f"{k}\n{s}" for k in ("fused", "reference") for s in STATE_COUNTS]
    error_strip(ax, err, [c for c in cats if (err["cat"] == c).any()], fontsize=7)
    ax.set_ylabel("rel. L2 vs float64")
    ax.set_title("memory attention over ring states (one batch, ragged lengths)", fontsize=10)
    return ax


# ---- speed plots ------------------------------------------------------------------------------

def plot_times(df: pd.DataFrame):
    """Time per segment vs ``T``, one panel per (shape, M), one line per provider (log-log)."""
    import matplotlib.pyplot as plt

    t = times(df)
    if t.empty:
        return None
    shapes = sorted(t.groupby(["H", "D"]).groups)
    Ms = sorted(t["M"].unique())
    fig, axes = plt.subplots(len(shapes), len(Ms), figsize=(max(3.4 * len(Ms), 10), 3.1 * len(shapes) + 0.8),
                             squeeze=False, sharey="row")
    for i, (H, D) in enumerate(shapes):
        for j, M in enumerate(Ms):
            ax = axes[i][j]
            s = t[(t["H"] == H) & (t["D"] == D) & (t["M"] == M)]
            for k, prov in enumerate(PROVIDERS):
                p = s[s["kernel"] == prov].sort_values("T")
                if not p.empty:
                    ax.plot(p["T"], p["time_us"], marker="o", ms=3, color=f"C{k}",
                            label=LABELS[prov])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"H={H}, D={D}, M={M}", fontsize=9)
            ax.set_xlabel("segment length T")
            if j == 0:
                ax.set_ylabel("time (us)")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    timer = t["timer"].iloc[0]
    fig.suptitle(f"one segment's attention, B={int(t['B'].iloc[0])}, {t['dtype'].iloc[0]}: "
                 f"{TIMER_LABELS.get(timer, timer)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 0.96))
    return fig


# ---- eviction ---------------------------------------------------------------------------------

def eviction_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (gate, capacity): rel_l2 of all logits and of the last segment's, top-1 agreement."""
    if df.empty or "metric" not in df:
        return pd.DataFrame()
    ok = df[df["status"] == "ok"]
    w = ok.pivot_table(index=["gate", "capacity", "needed"], columns="metric", values="value")
    cols = [c for c in ("rel_l2", "rel_l2_last", "max_abs", "top1_agree") if c in w]
    w = w[cols].reset_index()
    w.columns.name = None
    return w.sort_values(["gate", "capacity"]).reset_index(drop=True)


def plot_eviction(df: pd.DataFrame):
    """rel_l2 of the logits vs ring capacity, one line per gate; the capacity that evicts
    nothing (tokens before the last segment) marked."""
    import matplotlib.pyplot as plt

    t = eviction_table(df)
    if t.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for k, (gate, g) in enumerate(t.groupby("gate", sort=True)):
        lab = "no gate (g = 1)" if gate == "none" else f"gate g = {gate}"
        for ax, col in zip(axes, ("rel_l2", "rel_l2_last")):
            ax.plot(g["capacity"], g[col].clip(lower=1e-9), marker="o", color=f"C{k}", label=lab)
    need = int(t["needed"].iloc[0])
    for ax, title in zip(axes, ("all positions", "last segment")):
        ax.axvline(need, color="grey", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("ring capacity M (rows per head); dotted: nothing evicted from here")
        ax.set_ylabel("rel. L2 of logits vs whole sequence")
        ax.set_title(f"GPT-2 segmented through the ring: {title}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---- conclusion -------------------------------------------------------------------------------

def conclusion(sdf: pd.DataFrame, pdf: pd.DataFrame, edf: pd.DataFrame) -> str:
    """A few sentences written from the results (markdown)."""
    lines = []
    for name, d in (("ring-state", sdf), ("speed", pdf), ("GPT-2", edf)):
        if d.empty:
            continue
        n = d["point_id"].nunique()
        f = d[d["status"] == "failed"]["point_id"].nunique()
        lines.append(f"- {name} sweep: {n} points, {f} failed" + (" (see above)." if f else "."))
    c = correctness_table(sdf)
    if not c.empty:
        for kernel, g in c.groupby("kernel", sort=False):
            worst = ", ".join(f"{dt} {v:.1e}" for dt, v in g.groupby("dtype")["worst_rel_l2"].max().items())
            lines.append(f"- {kernel} over every ring state, worst rel. L2 vs float64: {worst}.")
    e = eviction_table(edf)
    if not e.empty:
        need = int(e["needed"].iloc[0])
        full = e[(e["gate"] == "none") & (e["capacity"] >= need)]
        if not full.empty:
            lines.append(f"- GPT-2, nothing evicted (M >= {need}, no gate): logits within "
                         f"{full['rel_l2'].max():.1e} of the whole-sequence forward.")
        none = e[(e["gate"] == "none") & (e["capacity"] < need)]
        if not none.empty:
            lo, hi = none.iloc[-1], none.iloc[0]
            lines.append(f"- Evicting history: rel. L2 {lo['rel_l2']:.2e} at M={int(lo['capacity'])}"
                         f" up to {hi['rel_l2']:.2e} at M={int(hi['capacity'])}; top-1 agreement "
                         f"{hi['top1_agree']:.0%} at the smallest ring.")
    head = headline_table(pdf)
    if not head.empty and on_gpu(times(pdf)):
        lines.append("- Headline: " + headline_summary(head))
        for _, r in head[head["status"] == "missed"].iterrows():
            lines.append(f"  - missed: {r['target']} (H={r['H']}, D={r['D']}): {r['met_cells']} "
                         f"of {r['cells']} cells met; worst M={r['worst_M']}, T={r['worst_T']}: "
                         f"{r['ours_us']} us vs {r['peer_us']} us, ratio {r['ratio']} > {r['bound']}.")
    elif not pdf.empty:
        lines.append("- No GPU timing in these results: interpreter wall times say nothing about "
                     "GPU speed, and every target reads 'GPU only'. Run the full preset on the H200.")
    return "\n".join(lines)
