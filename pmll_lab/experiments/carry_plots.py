"""The carry_protocol notebook's plots: the protocol simulation, the byte budget, the errors
against the references, and the verify sweep's speed, eager/lazy crossover and write-back
frequency (rows of ``pmll_lab.experiments.carry``; tables in ``carry_report``).
"""

from __future__ import annotations

import pandas as pd

from pmll_lab.bench import copy_bandwidth
from pmll_lab.experiments.acceptance import mean_accept_len
from pmll_lab.experiments.carry import CAP, KERNELS, LABELS, STYLE
from pmll_lab.experiments.carry_report import _at, on_gpu
from pmll_lab.experiments.common import error_strip
from pmll_lab.experiments.gdn import (
    LAYOUT_NAMES, LAYOUTS, TIMER_LABELS, best_timer, timed, with_layout,
)


def plot_simulation(sim: pd.DataFrame, mark_alpha: float | None = None):
    """Write-back frequency and rows folded per verify against the mean acceptance length,
    one colour per K, eager dashed, lazy solid."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, K in enumerate(sorted(sim["K"].unique())):
        for mode, ls in (("eager", "--"), ("lazy", "-")):
            s = sim[(sim["K"] == K) & (sim["mode"] == mode)].sort_values("mean_accept")
            axes[0].plot(s["mean_accept"], s["wb_freq"], ls, marker="o", ms=3, color=f"C{i}",
                         label=f"K={K}, {mode}")
            axes[1].plot(s["mean_accept"], s["mean_folded"], ls, marker="o", ms=3, color=f"C{i}")
    axes[0].set_ylabel("write-backs per verify")
    axes[1].set_ylabel("pending rows folded per verify")
    for ax in axes:
        ax.set_xlabel("mean accepted rows per verify (acceptance length)")
        if mark_alpha is not None:
            ax.axvline(mean_accept_len(mark_alpha, 4), color="k", lw=0.8, ls=":")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"Protocol simulation (CAP={CAP}); dotted: the default acceptance at K=4", fontsize=10)
    fig.tight_layout()
    return fig


def plot_budget(table: pd.DataFrame, ax=None):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    for i, (model, t) in enumerate(table.groupby("model")):
        ax.plot(t["K"], t["snapshots KiB"], "o-", color=f"C{i}", label=f"{model}: snapshots")
        ax.plot(t["K"], t["carry stash KiB"], "s--", color=f"C{i}", label=f"{model}: carry stash (CAP={CAP})")
        ax.axhline(float(t["state KiB"].iloc[0]), color=f"C{i}", ls=":", lw=1, label=f"{model}: the state")
    ax.set_xlabel("K (rows verified)")
    ax.set_ylabel("KiB per sequence per layer")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("Rollback memory: snapshots vs the carried-state stash")
    return ax


def plot_errors(df: pd.DataFrame, ax=None):
    """rel_l2 of every checked quantity against its reference, one colour per dtype, the
    tolerance as a short dash."""
    import matplotlib.pyplot as plt

    if not {"metric", "what", "kernel", "dtype"} <= set(df.columns):
        return None
    err = df[df["metric"] == "rel_l2"].copy()
    if err.empty:
        return None
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4), layout="constrained")
    err = with_layout(err)
    err["cat"] = err["kernel"] + " " + err["state_layout"] + "\n" + err["what"].astype(str)
    error_strip(ax, err, sorted(err["cat"].unique()), fontsize=6, rotation=90)
    ax.set_ylabel("rel. L2 error")
    ax.set_title("Errors against the references (0 plotted as 1e-12)")
    return ax


def plot_verify_speed(df: pd.DataFrame, metric: str = "time_us", shape: dict | None = None):
    """One panel per ``(state_layout, K)`` (rows: layouts): ``metric`` (time per verify, GB/s
    or roofline fraction; best timer, CUDA graph replay on a GPU) against batch width for every
    kernel; the copy roofline on GB/s panels (GPU)."""
    import matplotlib.pyplot as plt

    sel = _at(timed(df, metric), shape)
    Ks = sorted(sel["K"].unique())
    lays = [x for x in LAYOUTS if (sel["state_layout"] == x).any()]
    if not Ks:
        return None
    fig, axes = plt.subplots(len(lays), len(Ks), figsize=(3.4 * len(Ks), 3.2 * len(lays)),
                             sharey=True, squeeze=False)
    gpu = on_gpu(df)
    roof = copy_bandwidth() if gpu else None
    for row, lay in zip(axes, lays):
        for ax, K in zip(row, Ks):
            s_lk = sel[(sel["K"] == K) & (sel["state_layout"] == lay)]
            for kern in KERNELS:
                s = s_lk[s_lk["kernel"] == kern].groupby("B")["value"].median()
                if not s.empty:
                    color, ls = STYLE[kern]
                    ax.plot(s.index, s.values, ls, marker="o", ms=3, color=color,
                            label=LABELS[kern])
            if metric == "gbps" and roof:
                ax.axhline(roof, color="k", ls="--", lw=1, label=f"copy roofline {roof:.0f} GB/s")
            if metric == "roofline_frac":
                ax.axhline(1.0, color="k", ls="--", lw=1)
            ax.set_xscale("log", base=2)
            if metric == "time_us":
                ax.set_yscale("log")
            ax.set_title(f"{LAYOUT_NAMES[lay]} state, K = {K}", fontsize=9)
            ax.set_xlabel("batch width B (sequences)")
    ylab = {"time_us": "time per verify (us)", "gbps": "GB/s (SPEC §4 bytes)",
            "roofline_frac": "fraction of copy roofline"}[metric]
    timer = best_timer(df)
    for row in axes:
        row[0].set_ylabel(ylab + f"\n{TIMER_LABELS.get(timer, timer)}", fontsize=8)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    desc = ", ".join(f"{k}={v}" for k, v in (shape or {}).items())
    fig.suptitle(f"Verify: carried state vs snapshot chain vs peers ({desc})", fontsize=10)
    fig.tight_layout(rect=(0, 0.08 if len(lays) > 1 else 0.14, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    return fig


def plot_crossover(cross: pd.DataFrame, lazy_min_seqs: int = 8):
    """Lazy / eager time ratio against batch width, one panel per state layout; below 1 the
    lazy form is faster. The policy's threshold (``lazy_min_seqs``) as a vertical line."""
    import matplotlib.pyplot as plt

    if cross.empty:
        return None
    lays = [x for x in LAYOUTS if (cross["state_layout"] == x).any()]
    fig, axes = plt.subplots(1, len(lays), figsize=(6.5 * len(lays), 3.8), sharey=True,
                             squeeze=False)
    for ax, lay in zip(axes[0], lays):
        c = cross[cross["state_layout"] == lay]
        for i, ((form, K), g) in enumerate(c.groupby(["form", "K"])):
            ax.plot(g["B"], g["lazy_over_eager"], "-" if form == "exact" else "--", marker="o",
                    ms=3, color=f"C{i % 10}", label=f"{form}, K={K}")
        ax.axhline(1.0, color="k", lw=1)
        ax.axvline(lazy_min_seqs, color="grey", ls=":", label=f"policy: lazy from B={lazy_min_seqs}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch width B")
        ax.set_title(f"{LAYOUT_NAMES[lay]} state")
        ax.legend(fontsize=7, ncol=2)
    axes[0][0].set_ylabel("lazy time / eager time")
    fig.suptitle("Eager vs lazy: where the lazy verify pays off", fontsize=10)
    fig.tight_layout()
    return fig


def plot_writeback(df: pd.DataFrame, sim: pd.DataFrame | None = None):
    """Measured write-back fraction of the timed launches (engaged == 2) against B, per mode
    and K (K-major points; the pending counts do not depend on the layout)."""
    import matplotlib.pyplot as plt

    w = with_layout(df)
    w = w[(w["metric"] == "write_back_frac") & (w["status"] == "ok")
          & w["kernel"].str.startswith("carry_exact")]
    if w.empty:
        return None
    w = w[w["state_layout"] == w["state_layout"].iloc[0]]
    fig, ax = plt.subplots(figsize=(7, 3.4), layout="constrained")
    for i, ((kern, K), g) in enumerate(w.groupby(["kernel", "K"])):
        s = g.groupby("B")["value"].mean()
        mode = kern.rsplit("_", 1)[1]
        ax.plot(s.index, s.values, "--" if mode == "eager" else "-", marker="o", ms=3,
                color=f"C{i % 10}", label=f"{mode}, K={K}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch width B")
    ax.set_ylabel("sequences written back per verify")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Write-back frequency in the timed launches (pending drawn from the protocol)")
    ax.legend(fontsize=7, ncol=2)
    return fig
