"""The carry_protocol notebook's targets, tables and plots (rows of ``carry`` and
``carry_protocol``, the host simulation ``acceptance``, model byte budgets; ratios of times from
GPU runs only)."""

from __future__ import annotations

import math
from functools import partial

import pandas as pd
import torch

from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.acceptance import SIM_MODES, mean_accept_len
from pmll_lab.experiments.carry import CAP, FORMS, KERNELS, LABELS
from pmll_lab.experiments.gdn import QWEN3_NEXT
from pmll_lab.sizes import stash_row_bytes
from pmll_lab.experiments.target_table import PROTO, PROTO_LAUNCH, SETS, for_report
from pmll_lab.experiments.targets import fact, facts
from pmll_lab.harness import verify as V

PARAMS = ("K", "B", "HK", "HV", "head_dim", "dtype", "state_layout", "form")
TARGET_SET = SETS[PROTO_LAUNCH]
TARGETS = for_report(PROTO_LAUNCH)
STEP_TARGETS = for_report(PROTO)
"""The headline: per speculative step (``experiments.step``, the ``step_grids`` sweep;
``target_table``); the per-verify ``TARGETS`` stay as detail."""
STEP_TARGET_SET = SETS[PROTO]

MODEL_CONFIGS = [dict(model="Qwen3-Next-80B-A3B", HK=16, HV=32, kd=128, vd=128, d_conv=4,
                      gdn_layers=36)]
"""Real configurations for the byte budget (Qwen3-Next-80B-A3B's config.json: 16 key heads, 32
value heads, head dims 128, conv kernel 4; 36 of its 48 layers are Gated DeltaNet)."""


correctness_table = partial(P.correctness_table, by=("state_layout", "dtype"))
failed_points = partial(P.failed_points, params=PARAMS)
plot_errors = partial(plots.plot_errors, labels=LABELS,
                      title="Carry, chain and peers against their references")


def held_bytes(c: dict, cap: int = CAP, conv_dtype=torch.bfloat16) -> dict:
    """Bytes per sequence and layer of configuration ``c`` (``HK, HV, kd, vd, d_conv``): the
    fp32 GDN ``state``, the conv ``window`` (``d_conv - 1`` columns of ``conv_dtype``), the
    carried state's ``gdn_stash`` (``cap`` rows of ``u, g, k``, fp32) and ``conv_stash`` (``cap``
    input rows of ``conv_dtype``), and its pending count ``pend`` (int32)."""
    dim = 2 * c["HK"] * c["kd"] + c["HV"] * c["vd"]
    es = torch.empty((), dtype=conv_dtype).element_size()
    return {"state": 4 * c["HV"] * c["kd"] * c["vd"], "window": dim * (c["d_conv"] - 1) * es,
            "gdn_stash": cap * stash_row_bytes(c["HV"], c["kd"], c["vd"]),
            "conv_stash": cap * dim * es, "pend": 4}


def budget_table(configs=MODEL_CONFIGS, Ks=(2, 3, 4, 8), cap: int = CAP,
                 conv_dtype=torch.bfloat16) -> pd.DataFrame:
    """Per slot and layer (KiB): the fp32 state, the conv window, the carried-state stash (GDN
    rows + conv input rows, ``cap`` rows whatever K) and the snapshot chain's ``K-1`` states and
    windows; both over all GDN layers of the model (MiB)."""
    rows = []
    for c in configs:
        h = held_bytes(c, cap, conv_dtype)
        stash = h["gdn_stash"] + h["conv_stash"]
        for K in Ks:
            snap = (K - 1) * (h["state"] + h["window"])
            rows.append({"model": c["model"], "K": K, "state KiB": h["state"] / 1024,
                         "conv window KiB": h["window"] / 1024, "carry stash KiB": stash / 1024,
                         "snapshots KiB": snap / 1024, "snapshots / stash": snap / stash,
                         "stash MiB (all layers)": stash * c["gdn_layers"] / 2**20,
                         "snapshots MiB (all layers)": snap * c["gdn_layers"] / 2**20})
    return pd.DataFrame(rows).round(2)


def rollback_bytes(K: int, HV: int, kd: int, vd: int, cap: int = CAP) -> dict:
    """Bytes per sequence and layer each design holds to roll back a K-row GDN verify: the stash
    (``cap`` rows of ``u, g, k``) and pending count; FlashInfer's ``K`` fp32 states; our chain's
    ``K-1`` (GDN only: the conv twin's parts in ``rollback_table``)."""
    h = held_bytes(dict(HK=1, HV=HV, kd=kd, vd=vd, d_conv=2), cap)
    return {"carry stash + pend": h["gdn_stash"] + h["pend"],
            "FlashInfer K snapshots": K * h["state"], "chain K-1 snapshots": (K - 1) * h["state"]}


def rollback_table(K: int = 4, config: dict | None = None, cap: int = CAP) -> pd.DataFrame:
    """What each design holds per sequence and layer to roll back a ``K``-row verify of
    ``config`` (default the first of ``MODEL_CONFIGS``), in KiB, one part per row: the carried
    state's GDN stash, its pending count, the conv twin's stash and their sum (the findings'
    "carry stash", §4's table), FlashInfer's ``K`` GDN states and our chain's ``K-1``, each with
    what it counts."""
    c = MODEL_CONFIGS[0] if config is None else config
    h = held_bytes(c, cap)
    dim = 2 * c["HK"] * c["kd"] + c["HV"] * c["vd"]
    snap = (K - 1) * (h["state"] + h["window"])
    rows = [("carry: GDN stash", h["gdn_stash"], f"CAP={cap} rows of u, g, k, fp32"),
            ("carry: pending count pend", h["pend"], "one int32 per slot"),
            ("carry: conv twin's stash", h["conv_stash"],
             f"CAP={cap} input rows of the conv (dim {dim}), bf16"),
            ("carry: whole stash (GDN + conv)", h["gdn_stash"] + h["conv_stash"],
             "the findings' carry stash and section 4's table (pend not counted)"),
            (f"FlashInfer mtp: K={K} GDN states", K * h["state"],
             "its snapshot buffer, fp32; conv windows not counted"),
            (f"our chain: K-1={K - 1} GDN states", (K - 1) * h["state"],
             f"fp32; with the {K - 1} conv windows {snap / 1024:.0f} KiB, section 4's snapshots")]
    out = pd.DataFrame(rows, columns=["held to roll back", "bytes", "what it counts"])
    out.insert(1, "KiB per sequence and layer", out.pop("bytes") / 1024)
    out.insert(0, "model", c["model"])
    return out


def crossover_table(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """Per (state_layout, form, K, B): eager and lazy time per verify, their ratio, and the
    crossover: the smallest measured B from which lazy is faster at every larger B (None:
    never). GPU runs only (no ratios of interpreter times)."""
    w = P.at(P.wide(df), shape)
    if w.empty or not P.on_gpu(w):
        return pd.DataFrame()
    rows = []
    for (lay, K), g in w.groupby(["state_layout", "K"]):
        for form in FORMS:
            e = g[g["kernel"] == f"carry_{form}_eager"].groupby("B")["time_us"].median()
            lz = g[g["kernel"] == f"carry_{form}_lazy"].groupby("B")["time_us"].median()
            Bs = sorted(set(e.index) & set(lz.index))
            ratio = {B: lz[B] / e[B] for B in Bs}
            cross = next((B for B in Bs if all(ratio[b] < 1 for b in Bs if b >= B)), None)
            rows += [dict(state_layout=lay, form=form, K=K, B=B, eager_us=e[B], lazy_us=lz[B],
                          lazy_over_eager=ratio[B], crossover_B=cross,
                          timer=str(g["timer"].iloc[0])) for B in Bs]
    return pd.DataFrame(rows)


def crossover_summary(cross: pd.DataFrame) -> pd.DataFrame:
    """One row per (state_layout, form, K): lazy / eager at each B, and from which B lazy wins."""
    if cross.empty:
        return pd.DataFrame()
    keys = ["state_layout", "form", "K"]
    out = cross.pivot_table(index=keys, columns="B", values="lazy_over_eager").round(3)
    out.columns = [f"B={b}" for b in out.columns]
    first = cross.groupby(keys)["crossover_B"].first()
    out["lazy faster from B"] = first.map(lambda v: "never" if v is None or pd.isna(v) else int(v))
    return out.reset_index()


def speed_vs_acceptance(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """Time per verify of every kernel against the acceptance length, at each
    ``(state_layout, K, B)`` measured at several ``alpha`` (empty if none was)."""
    w = P.at(P.wide(df), shape)
    if w.empty or "alpha" not in w:
        return pd.DataFrame()
    keys = ["state_layout", "K", "B"]
    n = w.groupby(keys)["alpha"].transform("nunique")
    w = w[n > 1]
    if w.empty:
        return pd.DataFrame()
    w = w.assign(accept_len=[mean_accept_len(a, int(k)) for a, k in zip(w["alpha"], w["K"])])
    out = w.pivot_table(index=keys + ["alpha", "accept_len"], columns="kernel", values="time_us")
    out.columns.name = None
    return out.reset_index()


def carry_vs_snapshots(df: pd.DataFrame, K: int = 4, shape: dict | None = None) -> pd.DataFrame:
    """At ``shape`` (default Qwen3-Next's) and ``K``, per B and carry layout: time per verify
    of the exact carry (lazy, eager), our chain and FlashInfer's snapshot verify; the bytes each
    launch moves and each design holds per sequence (KiB); on a GPU lazy / FlashInfer."""
    shape = dict(QWEN3_NEXT) if shape is None else shape
    w = P.at(P.wide(df), dict(shape, K=K))
    if w.empty:
        return pd.DataFrame()
    fi = w[w["kernel"] == V.MTP_SNAPSHOTS.name].groupby("B")[["time_us", "bytes"]].median()
    hold = rollback_bytes(K, int(shape["HV"]), int(shape["head_dim"]), int(shape["head_dim"]))
    rows = []
    for (lay, B), g in w.groupby(["state_layout", "B"]):
        def get(kern, col="time_us"):
            s = g.loc[g["kernel"] == kern, col]
            return float(s.median()) if len(s) else float("nan")

        r = {"state_layout": lay, "B": int(B), "K": K,
             "carry exact lazy us": get(V.CARRY_LAZY.name),
             "carry exact eager us": get(V.CARRY_EAGER.name),
             "chain + snapshots us": get(V.CHAIN.name),
             "FlashInfer mtp + snapshots us": float(fi.loc[B, "time_us"]) if B in fi.index
             else float("nan"),
             "carry lazy moved KiB/seq": get(V.CARRY_LAZY.name, "bytes") / B / 1024,
             "FlashInfer moved KiB/seq": float(fi.loc[B, "bytes"]) / B / 1024 if B in fi.index
             else float("nan"),
             "carry holds KiB/seq (GDN stash + pend)": hold["carry stash + pend"] / 1024,
             "FlashInfer holds KiB/seq (GDN states)": hold["FlashInfer K snapshots"] / 1024,
             "timer": str(g["timer"].iloc[0])}
        if P.on_gpu(g):
            r["lazy / FlashInfer"] = r["carry exact lazy us"] / r["FlashInfer mtp + snapshots us"]
        rows.append(r)
    return pd.DataFrame(rows).round(3)


def findings(df: pd.DataFrame, sim: pd.DataFrame, budget: pd.DataFrame,
             mean_accept: float = 3.3) -> pd.DataFrame:
    """Facts: bitwise checks of the exact form per layout; at K=4 and the acceptance nearest
    ``mean_accept``, the simulated write-back frequency and rows folded per verify; the exact
    form's eager/lazy crossover at K=4 (GPU); stash against snapshots (KiB per sequence and
    layer)."""
    rows = []
    ok = P.with_layout(df[df["status"] == "ok"]) if len(df) else df
    for lay, g in (ok.groupby("state_layout") if len(ok) else []):
        bit = g[g["metric"].isin(["bitwise_vs_decode", "bitwise_vs_plain"])]
        if len(bit):
            rows.append(fact(f"exact form == plain decoding bitwise, {P.LAYOUT_NAMES[lay]}",
                             int(bit["passed"].sum()), f"of {len(bit)} checks"))
    d = sim[sim["K"] == 4] if len(sim) else sim
    near = (d["mean_accept"] - mean_accept).abs().argsort(kind="stable")[:len(SIM_MODES)]
    for r in d.iloc[near].itertuples() \
            if len(d) else []:
        what = f"simulation, K=4, acceptance length {r.mean_accept:.2f}, {r.mode}"
        rows += [fact(f"{what}: write-backs per verify", r.wb_freq, "per verify"),
                 fact(f"{what}: rows folded per verify", r.mean_folded, "rows")]
    cross = crossover_summary(crossover_table(df))
    for r in cross[(cross["form"] == "exact") & (cross["K"] == 4)].itertuples() if len(cross) \
            else []:
        rows.append(fact(f"lazy faster than eager from B, exact form, "
                         f"{P.LAYOUT_NAMES.get(r.state_layout, r.state_layout)}, K=4",
                         r[-1] if r[-1] != "never" else math.nan, "B",
                         "NaN: at no measured B; every form and K: the crossover table"))
    if len(budget) and (budget["K"] == 4).any():
        b = budget[budget["K"] == 4].iloc[0]
        what = f"{b['model']}, K=4, per sequence and layer"
        rows += [fact(f"{what}: carry stash", b["carry stash KiB"], "KiB"),
                 fact(f"{what}: snapshots", b["snapshots KiB"], "KiB"),
                 fact(f"{what}: snapshots / stash", b["snapshots / stash"], "x")]
    return facts(rows)


# ---- plots ---------------------------------------------------------------------------------

SIM_STYLES = dict(zip(SIM_MODES, [dict(ls="--", marker="s", mfc="white", mew=1.0),
                                   dict(ls="-", marker="o"), dict(ls=":", marker="^")],
                      strict=True))
"""How the simulation plot draws each mode of ``acceptance.SIM_MODES`` (the colour is K's)."""


def plot_simulation(sim: pd.DataFrame, mark_alpha: float | None = None):
    """Write-back frequency and rows folded per verify against the acceptance length, one
    colour per K, each mode its own line and marker (``SIM_STYLES``: eager dashed with hollow
    squares, lazy solid with filled circles, lazy with the speculative store dotted with
    triangles)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
    for i, K in enumerate(sorted(sim["K"].unique())):
        for mode, kw in SIM_STYLES.items():
            s = sim[(sim["K"] == K) & (sim["mode"] == mode)].sort_values("mean_accept")
            kw = dict(kw, ms=4, color=f"C{i}")
            axes[0].plot(s["mean_accept"], s["wb_freq"], label=f"K={K}, {mode}", **kw)
            axes[1].plot(s["mean_accept"], s["mean_folded"], **kw)
    axes[0].set_ylabel("write-backs per verify")
    axes[1].set_ylabel("pending rows folded per verify")
    for ax in axes:
        ax.set_xlabel("mean accepted rows per verify")
        if mark_alpha is not None:
            ax.axvline(mean_accept_len(mark_alpha, 4), color="k", lw=0.8, ls=":")
    fig.suptitle(f"Protocol simulation (CAP={CAP}); dotted: the acceptance at K=4", fontsize=10)
    plots.legend_outside(fig)
    return fig


def plot_budget(table: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
    for i, (model, t) in enumerate(table.groupby("model")):
        ax.plot(t["K"], t["snapshots KiB"], "o-", color=f"C{i}", label=f"{model}: snapshots")
        ax.plot(t["K"], t["carry stash KiB"], "s--", color=f"C{i}",
                label=f"{model}: carry stash (CAP={CAP})")
        ax.axhline(float(t["state KiB"].iloc[0]), color=f"C{i}", ls=":", lw=1,
                   label=f"{model}: the state")
    ax.set(xlabel="K (rows verified)", ylabel="KiB per sequence per layer", yscale="log",
           title="Rollback memory: snapshots vs the carried-state stash")
    plots.legend_outside(fig)
    return fig


def plot_verify_speed(df: pd.DataFrame, metric: str = "time_us", shape: dict | None = None):
    """``metric`` (time per verify, GB/s or roofline fraction) against batch width, one panel
    per K, every kernel in each layout (line style)."""
    return plots.plot_speed(df, metric, shape, LABELS, KERNELS,
                            "Verify: carried state, snapshot chain, peers",
                            {"time_us": "time per verify (µs)", "gbps": "GB/s (SPEC §4 bytes)",
                             "roofline_frac": "fraction of copy roofline"})


def plot_crossover(cross: pd.DataFrame, lazy_min_seqs: int = 8):
    """Lazy / eager time against batch width, per layout (line style) and form (colour); below
    1 the lazy form is faster. GPU runs only."""
    import matplotlib.pyplot as plt

    if cross.empty:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
    for (lay, form, K), g in cross.groupby(["state_layout", "form", "K"]):
        ax.plot(g["B"], g["lazy_over_eager"], ls=plots.LAYOUT_LINES[lay],
                **plots.LAYOUT_MARKERS[lay], ms=3 + K / 2, color=plots.color(f"carry_{form}_lazy"),
                label=f"{form}, K={K}, {P.LAYOUT_NAMES[lay]}")
    ax.axhline(1.0, color="k", lw=1)
    ax.axvline(lazy_min_seqs, color="grey", ls=":", label=f"policy: lazy from B={lazy_min_seqs}")
    ax.set(xscale="log", xlabel="batch width B", ylabel="lazy time / eager time",
           title="Eager vs lazy: where the lazy verify pays off")
    ax.set_xscale("log", base=2)
    plots.legend_outside(fig)
    return fig


def plot_writeback(df: pd.DataFrame):
    """Write-back fraction of the timed launches (engaged == 2) against B, per mode and K."""
    import matplotlib.pyplot as plt

    w = P.with_layout(df)
    w = w[(w["metric"] == "write_back_frac") & (w["status"] == "ok")
          & w["kernel"].str.startswith("carry_exact")]
    if w.empty:
        return None
    w = w[w["state_layout"] == w["state_layout"].iloc[0]]
    fig, ax = plt.subplots(figsize=(8, 3.4), layout="constrained")
    for i, ((kern, K), g) in enumerate(w.groupby(["kernel", "K"])):
        s = g.groupby("B")["value"].mean()
        ax.plot(s.index, s.values, "--" if kern.endswith("eager") else "-", marker="o", ms=3,
                color=f"C{i % 10}", label=f"{kern.rsplit('_', 1)[1]}, K={K}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch width B", ylabel="sequences written back per verify", ylim=(-0.05, 1.05),
           title="Write-back frequency in the timed launches")
    plots.legend_outside(fig)
    return fig
