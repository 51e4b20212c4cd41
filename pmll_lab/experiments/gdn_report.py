"""The gdn_verify notebook's tables, plots, headline and conclusion, read from the rows of
``pmll_lab.experiments.gdn.verify_point`` (the chain with snapshots, the chain without them, K
successive decodes and the peers; see that module's docstring).

Every table and plot keeps rows of points that passed their checks, from one timer (``timed``:
CUDA graph replays where present, else do_bench, else the interpreter's wall time) and one kind
of device. The snapshot budget (``plot_snapshot_budget``, ``budget_table``) is SPEC §4's byte
arithmetic, no measurement. All names here are reachable as attributes of
``pmll_lab.experiments.gdn`` too (``gdn.headline``), as the notebook uses them.
"""

from __future__ import annotations

import pandas as pd

from pmll_lab.bench import copy_bandwidth
from pmll_lab.gdn import carry_stash_bytes, snapshot_bytes, state_bytes
from pmll_lab.experiments.common import error_strip, failure_line
from pmll_lab.experiments.common import failed_points as _failed_points
from pmll_lab.experiments.gdn import (
    KERNELS, LABELS, LAYOUT_NAMES, LAYOUTS, O_TOL, STATE_TOL, TIMER_LABELS, best_timer, on_gpu,
    timed, with_layout,
)


def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """Worst rel_l2 per (state_layout, kernel, dtype, what) with its tolerance and how many
    points passed, plus the flags (bitwise chain vs decodes; FlashInfer's untouched pool)."""
    df = with_layout(df)
    keys = ["state_layout", "kernel", "dtype", "what"]
    err = df[df["metric"] == "rel_l2"]
    t1 = (err.groupby(keys)
          .agg(worst_rel_l2=("value", "max"), tolerance=("tolerance", "max"),
               points=("value", "size"), passed=("passed", "sum"))
          .reset_index())
    bit = df[df["metric"].isin(["bitwise_vs_decodes", "state_untouched"])].copy()
    t2 = (bit.groupby(keys)
          .agg(points=("value", "size"), passed=("passed", "sum")).reset_index())
    t2["worst_rel_l2"], t2["tolerance"] = float("nan"), float("nan")
    t2["what"] = t2["what"].map(lambda w: w if w.startswith("pool") else f"bitwise == decodes: {w}")
    out = pd.concat([t1, t2], ignore_index=True)
    out["passed"] = out["passed"].astype(int)
    return out[keys[:3] + ["what", "points", "passed", "worst_rel_l2", "tolerance"]]


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    """One line per failed point: its parameters and error text."""
    return _failed_points(with_layout(df), ("K", "head_dim", "HK", "HV", "B", "dtype",
                                            "state_layout"))


def plot_errors(df: pd.DataFrame, ax=None):
    """rel_l2 against the float64 reference, per kernel, layout and compared quantity, one
    colour per input dtype; tolerances as short dashes."""
    import matplotlib.pyplot as plt

    err = with_layout(df[(df["metric"] == "rel_l2")])
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 4.5), layout="constrained")
    err["cat"] = err["kernel"] + " " + err["state_layout"] + "\n" + err["what"]
    error_strip(ax, err, sorted(err["cat"].unique()), fontsize=7, rotation=90)
    ax.set_ylabel("rel. L2 error vs float64 reference")
    ax.set_title("Error against the float64 reference (0 plotted as 1e-12)")
    return ax


SHAPE_KEYS = ("head_dim", "HK", "HV", "dtype")


def main_shape(df: pd.DataFrame) -> dict:
    """The (head_dim, HK, HV, dtype) with the most timed points: what the speed plots show."""
    t = timed(df)
    if t.empty:
        return {}
    key = t.groupby(list(SHAPE_KEYS)).size().idxmax()
    return dict(zip(SHAPE_KEYS, key))


def _at(sel: pd.DataFrame, shape: dict) -> pd.DataFrame:
    for k, v in shape.items():
        sel = sel[sel[k] == v]
    return sel


LAYOUT_STYLE = {"kv": "-", "vk": "--"}


def plot_speed(df: pd.DataFrame, metric: str = "time_us", shape: dict | None = None):
    """One panel per K: ``metric`` (``time_us`` per verify, or ``gbps``) against batch width B
    for each kernel (colour) and state layout (solid K-major, dashed V-major), from the best
    timer (``best_timer``: CUDA graph replay on a GPU); with ``gbps`` on a GPU, the measured copy
    roofline as a line."""
    import matplotlib.pyplot as plt

    shape = main_shape(df) if shape is None else shape
    sel = _at(timed(df, metric), shape)
    Ks = sorted(sel["K"].unique())
    if not Ks:
        return None
    fig, axes = plt.subplots(1, len(Ks), figsize=(3.3 * len(Ks), 3.6), sharey=True,
                             squeeze=False)
    gpu = on_gpu(df)
    roof = copy_bandwidth() if gpu else None
    if roof is None and gpu and "copy_gbps" in df:
        vals = df["copy_gbps"].dropna()
        roof = float(vals.iloc[0]) if len(vals) else None
    for ax, K in zip(axes[0], Ks):
        for i, kern in enumerate(KERNELS):
            for lay, ls in LAYOUT_STYLE.items():
                s = sel[(sel["K"] == K) & (sel["kernel"] == kern) & (sel["state_layout"] == lay)]
                s = s.groupby("B")["value"].median()
                if not s.empty:
                    ax.plot(s.index, s.values, ls, marker="o", ms=3, color=f"C{i}",
                            label=f"{LABELS[kern]}, {LAYOUT_NAMES[lay]}")
        if metric == "gbps" and roof:
            ax.axhline(roof, color="k", ls=":", lw=1, label=f"copy roofline {roof:.0f} GB/s")
        ax.set_xscale("log", base=2)
        if metric == "time_us":
            ax.set_yscale("log")
        ax.set_title(f"K = {K}")
        ax.set_xlabel("batch width B (sequences)")
    unit = {"time_us": "time per verify (us)", "gbps": "GB/s (SPEC §4 bytes)"}[metric]
    timer = best_timer(df)
    axes[0][0].set_ylabel(unit + f"\n{TIMER_LABELS.get(timer, timer)}")
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    desc = ", ".join(f"{k}={v}" for k, v in shape.items())
    fig.suptitle(f"{'Time per verify' if metric == 'time_us' else 'Achieved bandwidth'} ({desc})",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    return fig


def layout_table(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """Time per verify (us, best timer) of each kernel per ``(K, B)`` at ``shape`` (default
    ``main_shape``), one column per ``kernel layout``, and the V-major / K-major ratio of our
    chain with snapshots (below 1: V-major faster). Empty without timings."""
    shape = main_shape(df) if shape is None else shape
    sel = _at(timed(df), shape)
    if sel.empty:
        return pd.DataFrame()
    sel = sel.assign(col=sel["kernel"] + " " + sel["state_layout"])
    out = sel.pivot_table(index=["K", "B"], columns="col", values="value").round(1)
    if {"chain kv", "chain vk"} <= set(out.columns):
        out["chain vk / kv"] = (out["chain vk"] / out["chain kv"]).round(3)
    if {"flashinfer_mtp_snapshots vk", "chain vk"} <= set(out.columns):
        out["chain vk / FlashInfer"] = (out["chain vk"]
                                        / out["flashinfer_mtp_snapshots vk"]).round(3)
    out.columns.name = None
    return out.reset_index()


def plot_snapshot_budget(shapes: list[tuple[int, int]], Ks=(1, 2, 3, 4, 8), ax=None):
    """State bytes per sequence and layer that verifying K rows holds: the snapshot buffer
    ``(K-1)*Hb`` (SPEC §4) for each ``(HV, head_dim)`` in ``shapes``, against the fp32 state
    itself (``Hb``) and the carried-state stash of SPEC §3b (``CAP=8`` rows, independent of K)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    Ks = list(Ks)
    for i, (HV, D) in enumerate(shapes):
        mib = [snapshot_bytes(K, HV, D, D) / 2**20 for K in Ks]
        ax.plot(Ks, mib, "o-", color=f"C{i}", label=f"snapshots, HV={HV}, kd=vd={D}")
        ax.axhline(state_bytes(HV, D, D) / 2**20, color=f"C{i}", ls=":", lw=1)
        ax.axhline(carry_stash_bytes(HV, D, D) / 2**20, color=f"C{i}", ls="--", lw=1)
    ax.plot([], [], "k:", lw=1, label="the state itself (Hb)")
    ax.plot([], [], "k--", lw=1, label="carry stash, CAP=8 rows (SPEC §3b)")
    ax.set_xlabel("K (draft rows verified)")
    ax.set_ylabel("MiB per sequence per layer")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_title("State-byte budget of the snapshots vs K")
    ax.legend(fontsize=7)
    return ax


def budget_shapes(pts: list[dict]) -> list[tuple[int, int]]:
    """The distinct ``(HV, head_dim)`` of a list of points, for the budget plot and table."""
    return sorted({(int(p["HV"]), int(p["head_dim"])) for p in pts})


def budget_table(shapes: list[tuple[int, int]], Ks=(1, 2, 3, 4, 8)) -> pd.DataFrame:
    """The numbers behind ``plot_snapshot_budget`` in MiB per sequence per layer."""
    rows = []
    for HV, D in shapes:
        row = {"HV": HV, "kd=vd": D, "state Hb": state_bytes(HV, D, D) / 2**20,
               "carry stash": carry_stash_bytes(HV, D, D) / 2**20}
        row.update({f"snapshots K={K}": snapshot_bytes(K, HV, D, D) / 2**20 for K in Ks})
        rows.append(row)
    return pd.DataFrame(rows).round(3)


def headline(df: pd.DataFrame, K: int = 4, B: int = 64, HK: int = 16, HV: int = 32,
             head_dim: int = 128, dtype: str = "bfloat16") -> pd.DataFrame:
    """Time (best timer, and beside a CUDA-graph time the do_bench time of the same launch),
    GB/s and roofline fraction of every kernel and layout at one point (HV=32, kd=vd=128, B=64,
    K=4; HK=16 as in Qwen3-Next)."""
    where = dict(K=K, B=B, HK=HK, HV=HV, head_dim=head_dim, dtype=dtype)
    timer = best_timer(df)
    parts = []
    for metric in ("time_us", "gbps", "roofline_frac"):
        s = _at(timed(df, metric, timer), where)
        if not s.empty:
            parts.append(s.pivot_table(index=["state_layout", "kernel"], values="value")
                         .rename(columns={"value": metric}))
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, axis=1)
    if timer == "cuda_graph":
        db = _at(timed(df, "time_us", "do_bench"), where)
        if not db.empty:
            out["do_bench_us"] = db.pivot_table(index=["state_layout", "kernel"], values="value")["value"]
    out["timer"] = timer
    return out.reset_index()


def conclusion(df: pd.DataFrame) -> str:
    """A few sentences written from the results (markdown)."""
    lines = []
    df = with_layout(df)
    ok = df[df["status"] == "ok"]
    lines.append(failure_line(df))
    for lay, g in ok.groupby("state_layout"):
        bit = g[g["metric"] == "bitwise_vs_decodes"]
        if bit.empty:
            continue
        good = bit.groupby("point_id")["passed"].all()
        lines.append(f"- {LAYOUT_NAMES.get(lay, lay)} state (`{lay}`): chain vs K successive decodes "
                     f"bitwise equal at {int(good.sum())} of {len(good)} points (outputs, final "
                     "state, snapshots, and the chain without snapshots)"
                     + ("." if good.all() else " -- NOT everywhere: see the failed points."))
    err = ok[(ok["metric"] == "rel_l2") & ok["kernel"].isin(["chain", "decodes"])]
    for dt, g in err.groupby("dtype"):
        o = g[g["what"] == "o"]["value"].astype(float).max()
        s = g[g["what"] != "o"]["value"].astype(float).max()
        lines.append(f"- {dt} inputs: worst rel. L2 error of outputs {o:.1e}, of states and "
                     f"snapshots {s:.1e} (tolerances {O_TOL.get(dt, float('nan')):.0e} and "
                     f"{STATE_TOL:.0e}).")
    fi = ok[ok["kernel"] == "flashinfer_mtp_snapshots"]
    fe = fi[fi["metric"] == "rel_l2"]
    if not fe.empty:
        nfail = fe[fe["passed"] == False]["point_id"].nunique()  # noqa: E712
        lines.append(f"- FlashInfer's snapshot verify checked at {fe['point_id'].nunique()} points "
                     f"against the float64 reference with its own gating: worst rel. L2 error "
                     f"{fe['value'].astype(float).max():.1e}"
                     + (f"; it disagreed at {nfail} points (not timed there)." if nfail else "."))
    if on_gpu(df):
        timer = best_timer(df)
        hK = 4
        h = headline(df, K=hK)
        if not h.empty:
            lines.append(f"- HK=16, HV=32, kd=vd=128, B=64, K=4, {TIMER_LABELS[timer]}:")
            for _, r in h.iterrows():
                frac = r.get("roofline_frac", float("nan"))
                lines.append(f"  - {LABELS.get(r['kernel'], r['kernel'])}, "
                             f"{LAYOUT_NAMES.get(r['state_layout'], r['state_layout'])}: "
                             f"{r['time_us']:.1f} us, {r['gbps']:.0f} GB/s"
                             + ("" if pd.isna(frac) else f" = {frac:.0%} of the roofline")
                             + ".")
            tm = {(r["state_layout"], r["kernel"]): r["time_us"] for _, r in h.iterrows()}
            for lay in LAYOUTS:
                if (lay, "chain") in tm and (lay, "chain_nosnap") in tm:
                    lines.append(f"- {LAYOUT_NAMES[lay]}: the snapshots make the verify "
                                 f"{tm[(lay, 'chain')] / tm[(lay, 'chain_nosnap')]:.2f}x slower "
                                 "than the same chain without them (SPEC §4 bytes: (K+1)/2 = "
                                 f"{(hK + 1) / 2:.1f}x the state traffic).")
            if ("kv", "chain") in tm and ("vk", "chain") in tm:
                lines.append(f"- Chain with snapshots, V-major / K-major time: "
                             f"{tm[('vk', 'chain')] / tm[('kv', 'chain')]:.2f}.")
            if ("vk", "flashinfer_mtp_snapshots") in tm:
                best = min((tm[(lay, "chain")], lay) for lay in LAYOUTS if (lay, "chain") in tm)
                lines.append(f"- FlashInfer's snapshot verify: {tm[('vk', 'flashinfer_mtp_snapshots')]:.1f}"
                             f" us; our best chain ({LAYOUT_NAMES[best[1]]}) takes "
                             f"{best[0] / tm[('vk', 'flashinfer_mtp_snapshots')]:.2f}x its time.")
        lt = layout_table(df)
        if "chain vk / FlashInfer" in lt:
            r = lt.dropna(subset=["chain vk / FlashInfer"])
            if len(r):
                lines.append(f"- Over the main shape's sweep, V-major chain / FlashInfer time ranges "
                             f"{r['chain vk / FlashInfer'].min():.2f}-"
                             f"{r['chain vk / FlashInfer'].max():.2f} ({len(r)} points).")
        g = timed(df, "roofline_frac", timer)
        if not g.empty:
            best = g.groupby(["kernel", "state_layout"])["value"].max()
            lines.append("- Best roofline fraction per kernel over the sweep: "
                         + ", ".join(f"{LABELS.get(k, k)} ({lay}) {v:.0%}"
                                     for (k, lay), v in best.items()) + ".")
    else:
        lines.append("- Timings are Triton-interpreter wall times on the CPU: they say nothing "
                     "about GPU speed; run the full preset on a GPU for speeds.")
    return "\n".join(lines)
