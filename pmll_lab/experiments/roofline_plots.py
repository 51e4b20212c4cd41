"""The roofline notebook's plots: time and roofline fraction against batch width, and the errors
checked before timing. Times are those of ``roofline_report.wide_table`` (CUDA graph replays
where the run has them; the axis label names the timer)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from pmll_lab.experiments.roofline import (
    LABELS, NATIVE_LAYOUT, PROVIDERS, STYLE, floor_bytes, nosnap_bytes,
)
from pmll_lab.experiments.roofline_report import (
    TIMER_LABELS, _sel_shape, main_shape, on_gpu, roofline_gbps, wide_table,
)


def plot_roofline(df: pd.DataFrame, shape: dict | None = None):
    """One column per ``K``: time per verify against batch width ``B``, every provider (and, for
    ours, each state layout: V-major hollow and lighter) a line, timed by ``best_timer``,
    with (GPU) the roofline-floor time dashed (state read once, ``K`` stash rows and rows in and
    out) and the state-read-and-written-once time dotted; on a GPU a second row holds each
    provider's fraction of the roofline. On the CPU the single row is the Triton interpreter's
    wall time, labelled so (no roofline there). Returns the figure (None without timings)."""
    import matplotlib.pyplot as plt

    w = wide_table(df)
    if w.empty:
        return None
    shape = main_shape(df) if shape is None else shape
    w = _sel_shape(w, shape)
    gpu = on_gpu(w)
    timer = str(w["timer"].iloc[0])
    layouts = sorted(w["state_layout"].unique())
    roof = roofline_gbps(df) if gpu else None
    Ks = sorted(w["K"].unique())
    nrow = 2 if gpu else 1
    fig, axes = plt.subplots(nrow, len(Ks), figsize=(3.4 * len(Ks), 3.2 * nrow), squeeze=False)
    dt = getattr(torch, shape["dtype"])
    for j, K in enumerate(Ks):
        ax = axes[0][j]
        for prov in PROVIDERS:
            for lay in layouts:
                s = w[(w["K"] == K) & (w["kernel"] == prov) & (w["state_layout"] == lay)]
                if s.empty:
                    continue
                s = s.sort_values("B")
                col, ls, mk = STYLE[prov]
                # V-major lines of our kernels: hollow markers, lighter (peers run one layout)
                vk = lay == "vk" and len(layouts) > 1 and prov not in NATIVE_LAYOUT
                kw = dict(ls=ls, marker=mk, ms=3, color=col, alpha=0.55 if vk else 1.0,
                          mfc="none" if vk else col,
                          label=LABELS[prov] + (f" [{lay}]" if len(layouts) > 1 else ""))
                ax.plot(s["B"], s["time_us"], **kw)
                if gpu and "roofline_frac" in s:
                    axes[1][j].plot(s["B"], s["roofline_frac"], **kw)
        if roof:
            Bs = np.array(sorted(w[w["K"] == K]["B"].unique()))
            args = (int(K), shape["HK"], shape["HV"], shape["head_dim"], dt)
            ax.plot(Bs, [floor_bytes(int(b), *args) / (roof * 1e3) for b in Bs], "k--", lw=1,
                    label="roofline floor (state read once)")
            ax.plot(Bs, [nosnap_bytes(int(b), *args) / (roof * 1e3) for b in Bs], ":",
                    color="grey", lw=1, label="state read + written once")
            bx = axes[1][j]
            bx.axhline(1.0, color="k", lw=0.8)
            bx.axhline(0.75, color="grey", ls="--", lw=0.8)
            bx.set_ylim(0, 1.1)
            bx.set_xscale("log", base=2)
            bx.set_xlabel("batch width B (sequences)")
        else:
            ax.set_xlabel("batch width B (sequences)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"K = {K}")
    axes[0][0].set_ylabel(f"time per verify (us)\n{TIMER_LABELS.get(timer, timer)}")
    if gpu:
        axes[1][0].set_ylabel("fraction of copy roofline\n(SPEC §4 bytes; -- 75 %)")
    axes[0][-1].legend(fontsize=6, loc="best")
    desc = ", ".join(f"{k}={v}" for k, v in shape.items())
    fig.suptitle(("Verify time and roofline fraction" if gpu else
                  "Verify time (Triton interpreter wall time, not GPU speed)")
                 + f" vs batch width ({desc}" + (f"; copy roofline {roof:.0f} GB/s)" if roof else ")"),
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_errors(df: pd.DataFrame, ax=None):
    """rel_l2 of every kernel against the float64 reference (and decode), each tolerance as a
    short dash; 0 drawn at 1e-12. Returns the axes (None without error rows)."""
    import matplotlib.pyplot as plt

    err = df[df["metric"] == "rel_l2"].copy() if "metric" in df else pd.DataFrame()
    if err.empty:
        return None
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 4.2), layout="constrained")
    err["cat"] = err["kernel"] + ": " + err["what"].fillna("")
    cats = sorted(err["cat"].unique())
    for i, cat in enumerate(cats):
        s = err[err["cat"] == cat]
        col = STYLE.get(s["kernel"].iloc[0], ("C7",))[0]
        ax.scatter([i] * len(s), s["value"].astype(float).clip(lower=1e-12), s=10, color=col,
                   alpha=0.6)
        ax.hlines(float(s["tolerance"].max()), i - 0.35, i + 0.35, colors="k", linestyles="--",
                  lw=1)
    ax.set_xticks(range(len(cats)), cats, fontsize=6, rotation=90)
    ax.set_yscale("log")
    ax.set_ylabel("rel. L2 error")
    ax.set_title("Errors checked before timing (-- tolerance; 0 drawn at 1e-12)", fontsize=10)
    return ax


