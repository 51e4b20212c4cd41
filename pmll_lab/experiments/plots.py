"""The plots every notebook draws, in one style: one colour per implementation (``COLORS``), one
line style per state layout (``LAYOUT_LINES``), legends outside the data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import pandas as pd

from pmll_lab.harness import registry
from pmll_lab.harness import verify as V
from pmll_lab.harness import step_forms as SF

COLORS = {
    # ours not registered (a registered implementation's colour is its registration's ``style``)
    "chain_nosnap": "#98df8a", "plain": "#000000",
    # the PMLL ring and its attention
    "pmll_read": "#bcbd22", "pmll_write": "#6b6b00", "fused": "#0b3d91",
    "pmll_step": "#756bb1", "gather_sdpa_mask": "#e6550d", "sdpa_contiguous": "#31a354",
    "sdpa_causal": "#636363", "reference": "#7f7f7f", "memory_attention": "#7f7f7f",
    "gpt2_pmll": "#7f7f7f",
}
"""Colours of kernels no registration names (the conv twins take their GDN twin's)."""
ALIASES = {"chain": V.CHAIN.name, "updates": V.DECODES.name, "carry_lazy": V.CARRY_LAZY.name,
           "carry_eager": V.CARRY_EAGER.name, "protocol_exact": V.CARRY_LAZY.name}
"""The same implementation under another notebook's name (a registered implementation's
colour is its registration's ``style``: ``pmll_lab.harness``)."""
LAYOUT_LINES = {"kv": "-", "vk": "--"}
"""Line style per state layout: solid K-major, dashed V-major."""
LAYOUT_MARKERS = {"kv": dict(marker="o"), "vk": dict(marker="s", mfc="white", mew=1.0)}
"""Marker per state layout, so that a legend entry and a lone point tell them apart too:
filled circles K-major, hollow squares V-major."""
FAMILIES = {"decode and chain": ("chain_nosnap", "plain"),
            "carried state": (SF.RING.name,),
            "peers": (),
            "PMLL ring": ("pmll_read", "pmll_write", "memory_attention"),
            "ring attention": ("fused", "reference", "pmll_step", "gather_sdpa_mask",
                               "sdpa_contiguous", "sdpa_causal"),
            "model": ("gpt2_pmll",)}
"""The panels of the error plots, in order, and the canonical kernel names of each that no
registration places (a registered implementation's panel is its ``style["panel"]``)."""


DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
"""How a tolerance dash names the input dtype it holds for."""


def canonical(kernel: str) -> str:
    """A kernel's implementation: ``carry_exact_lazy:nowb:plan`` -> ``carry_exact_lazy``."""
    base = str(kernel).split(":")[0]
    return ALIASES.get(base, base)


def color(kernel: str) -> str:
    """The implementation's colour: its registration's ``style["color"]`` (under its own or its
    canonical name), else ``COLORS``."""
    for name in dict.fromkeys((str(kernel).split(":")[0], canonical(kernel))):
        impl = registry.IMPLEMENTATIONS.get(name)
        if impl is not None and "color" in impl.style:
            return impl.style["color"]
    return COLORS.get(canonical(kernel), "#555555")


def family(kernel: str) -> str:
    """The error plot's panel of ``kernel``: its registration's ``style["panel"]``, else the
    ``FAMILIES`` entry naming it, else ``"other"``."""
    k = canonical(kernel)
    impl = registry.IMPLEMENTATIONS.get(k)
    if impl is not None and "panel" in impl.style:
        return impl.style["panel"]
    return next((f for f, ks in FAMILIES.items() if k in ks), "other")


def style(kernel: str, layout: str = "kv") -> dict:
    """Line keywords: the implementation's colour, the layout's line style and marker."""
    return dict(color=color(kernel), ls=LAYOUT_LINES.get(layout, "-"), ms=3.5,
                **LAYOUT_MARKERS.get(layout, LAYOUT_MARKERS["kv"]))


def plain_log_ticks(ax, axis: str = "y") -> None:
    """On a log ``axis`` spanning less than a decade, ticks written as plain numbers (``4``,
    ``6``, ``8``, not ``4×10^0``); a wider span keeps matplotlib's powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    if lo <= 0 or hi / lo >= 10:
        return
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def legend_outside(fig, axes=None) -> None:
    """One legend for the figure, right of the panels, each label once."""
    handles, labels = {}, []
    for ax in (axes if axes is not None else fig.axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    if labels:
        fig.legend([handles[lb] for lb in labels], labels, loc="outside right center",
                   fontsize=7, frameon=False)


def quantity(what: str) -> str:
    """A check's compared quantity without its variant: ``o (write-back) [bfloat16 state]`` ->
    ``o``."""
    return re.sub(r"\s*[\(\[][^\)\]]*[\)\]]", "", str(what)).strip() or "-"


def plot_errors(df: pd.DataFrame, labels: Mapping[str, str] | None = None,
                title: str = "Errors checked before timing"):
    """rel_l2 of every check against its reference: one panel per kernel family, one x position
    per compared quantity, one colour per implementation, each tolerance a short black dash;
    exact results (0) drawn at 1e-12. Returns the figure (None without error rows)."""
    import matplotlib.pyplot as plt

    if df.empty or "metric" not in df:
        return None
    err = df[df["metric"] == "rel_l2"].copy()
    if err.empty:
        return None
    err["family"] = err["kernel"].map(family)
    err["q"] = err["what"].map(quantity) if "what" in err else "-"
    fams = [f for f in (*FAMILIES, "other") if (err["family"] == f).any()]
    width = [max(err.loc[err["family"] == f, "q"].nunique(), 1) for f in fams]
    fig, axes = plt.subplots(1, len(fams), figsize=(min(2.0 + 1.1 * sum(width), 15), 3.4),
                             sharey=True, squeeze=False, layout="constrained",
                             width_ratios=width)
    tags = []
    for ax, fam in zip(axes[0], fams):
        e = err[err["family"] == fam]
        qs = list(dict.fromkeys(e["q"]))
        kernels = list(dict.fromkeys(e["kernel"].map(canonical)))
        step = 0.7 / max(len(kernels), 1)
        for j, k in enumerate(kernels):
            s = e[e["kernel"].map(canonical) == k]
            x = [qs.index(q) - 0.35 + step * (j + 0.5) for q in s["q"]]
            raw = dict.fromkeys(str(r).split(":")[0] for r in s["kernel"])  # the rows' own names
            label = next((labels[r] for r in raw if r in (labels or {})),
                         (labels or {}).get(k, k))
            ax.scatter(x, s["value"].astype(float).clip(lower=1e-12), s=10, alpha=0.7,
                       color=color(k), label=label)
        for i, q in enumerate(qs):
            at = e[(e["q"] == q) & (e["tolerance"].astype(float) > 0)]
            for tol, g in at.groupby(at["tolerance"].astype(float)):
                ax.hlines(tol, i - 0.4, i + 0.4, colors="k", linestyles="--", lw=0.8)
                dts = sorted(set(g["dtype"].dropna().astype(str))) if "dtype" in g else []
                tags.append(ax.annotate(" ".join(DTYPE_SHORT.get(d, d) for d in dts)
                                        or f"{tol:.0e}", (i, tol), xytext=(0, 1),
                                        textcoords="offset points", fontsize=6, ha="center",
                                        va="bottom"))
        ax.set_xticks(range(len(qs)), qs, fontsize=7, rotation=30 if len(qs) > 3 else 0)
        ax.set_xlabel("compared quantity", fontsize=8)
        ax.set_title(fam, fontsize=9)
        ax.set_yscale("log")
    tols = err["tolerance"].astype(float)
    if (tols > 0).any():                      # room above the highest dash for its label
        lo, hi = axes[0][0].get_ylim()
        axes[0][0].set_ylim(lo, max(hi, float(tols.max()) * 8))
    axes[0][0].set_ylabel("rel. L2 error vs reference")
    fig.suptitle(f"{title} (-- tolerance, named by input dtype; 0 drawn at 1e-12)",
                 fontsize=10)
    legend_outside(fig, axes[0])
    apart(fig, tags)
    return fig


def apart(fig, texts, pad: float = 1.0) -> None:
    """Keep annotations (each above its point, ``textcoords="offset points"``, ``va="bottom"``)
    from overlapping: the figure is drawn once for their sizes, then from the highest down each
    text that meets one placed before it goes below its point instead (a label under its own
    dash), and lower still, by the overlap plus ``pad`` points, if it meets one there too."""
    if len(texts) < 2:
        return
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    to_px = fig.dpi / 72.0
    placed = []
    for t in sorted(texts, key=lambda t: -t.get_window_extent(renderer).y1):
        box = t.get_window_extent(renderer)
        if any(box.overlaps(o) for o in placed):
            dx, dy = t.xyann
            t.xyann, _ = (dx, -dy), t.set_va("top")
            box = t.get_window_extent(renderer)
        drop = 0.0
        hit = next((o for o in placed if box.overlaps(o)), None)
        while hit is not None:
            drop += box.y1 - hit.y0 + pad * to_px
            hit = next((o for o in placed if box.translated(0, -drop).overlaps(o)), None)
        if drop:
            dx, dy = t.xyann
            t.xyann = (dx, dy - drop / to_px)
            box = box.translated(0, -drop)
        placed.append(box)


def plot_speed(df: pd.DataFrame, metric: str, shape: Mapping | None, labels: Mapping[str, str],
               kernels: Sequence[str], title: str, units: Mapping[str, str]):
    """``metric`` of the checked, timed rows at ``shape`` (``time_us``, log scale; ``gbps`` with
    the copy roofline; ``roofline_frac`` with 1) against batch width (log 2), one panel per K,
    one line per kernel (order ``kernels``) and layout, median over duplicates; the y label
    ``units[metric]`` and the timer. None without rows."""
    import matplotlib.pyplot as plt

    from pmll_lab.experiments import protocol as P

    t = P.at(P.wide(df), shape)
    if t.empty or metric not in t:
        return None
    # rows without a state layout (the conv's) name none in the legend
    layouts = "state_layout" in df and bool(df["state_layout"].notna().any())
    timer = str(t["timer"].iloc[0])
    roof = P.roofline_gbps(df)
    hlines = [(roof, f"copy roofline {roof:.0f} GB/s")] if metric == "gbps" and roof else \
        [(1.0, "copy roofline")] if metric == "roofline_frac" else []
    desc = ", ".join(f"{k}={v}" for k, v in (shape or {}).items())
    vals = sorted(t["K"].dropna().unique()) if "K" in t else [None]
    fig, axes = plt.subplots(1, len(vals), figsize=(2.2 + 3.0 * len(vals), 3.3), sharey=True,
                             squeeze=False, layout="constrained")
    order = list(kernels) if kernels else list(dict.fromkeys(t["kernel"]))
    for ax, v in zip(axes[0], vals):
        s = t if v is None else t[t["K"] == v]
        for k in order:
            for lay in sorted(s["state_layout"].unique()):          # wide() fills in "kv"
                d = s[(s["kernel"] == k) & (s["state_layout"] == lay)]
                d = d.groupby("B")[metric].median()
                if not d.empty:
                    where = f", {'K' if lay == 'kv' else 'V'}-major" if layouts else ""
                    ax.plot(d.index, d.values, label=f"{(labels or {}).get(k, k)}{where}",
                            **style(k, lay))
        for value, lab in hlines:
            ax.axhline(value, color="k", ls=":", lw=1, label=lab)
        ax.set_xscale("log", base=2)
        if metric == "time_us":
            ax.set_yscale("log")
        ax.set_xlabel("B")
        if v is not None:
            ax.set_title(f"K = {v}", fontsize=9)
    axes[0][0].set_ylabel(f"{units[metric]}\n{P.TIMER_LABELS.get(timer, timer)}", fontsize=8)
    fig.suptitle(f"{title} ({desc})", fontsize=10)
    legend_outside(fig, axes[0])
    return fig
