"""The roofline notebook's targets, tables and plots, from ``roofline.gdn_point``'s rows (and the
PMLL ring points'): ``protocol.wide`` times of the fp32-state rows unless a table says otherwise.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pandas as pd
import torch

from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.acceptance import acceptance
from pmll_lab.sizes import fla_bytes, floor_bytes
from pmll_lab.experiments.roofline_case import L2_BYTES, LABELS, MAIN_SHAPE, PROVIDERS, SHAPE_KEYS
from pmll_lab.experiments import target_table as TT
from pmll_lab.experiments.target_table import ROOF, ROOF_LAUNCH, SETS, for_report
from pmll_lab.experiments.targets import fact, facts
from pmll_lab.harness import verify as V

__all__ = ["TARGET_SET", "TARGETS", "STEP_TARGET_SET", "STEP_TARGETS",
           "PLAN_TARGET_US", "PARAMS", "wide_table",
           "correctness_table", "failed_points", "main_shape", "lazy_table", "b1_table",
           "shapes_table", "pmll_table", "state_dtype_table", "findings", "plot_roofline",
           "plot_errors"]

PARAMS = ("provider", "K", "B", "HK", "HV", "head_dim", "dtype", "state_layout", "state_dtype",
          "gate", "M", "T")
TARGET_SET = SETS[ROOF_LAUNCH]
TARGETS = for_report(ROOF_LAUNCH)
"""The single launches' targets (``target_table``): since the speculative step is the unit the
headline judges (``STEP_TARGETS``), these are its detail."""
PLAN_TARGET_US = TT.PLAN_TARGET_US

STEP_TARGETS = for_report(ROOF)
"""The headline (per step, ``experiments.step`` on the ``step_grids`` sweep;
``target_table``)."""
STEP_TARGET_SET = SETS[ROOF]


wide_table = partial(P.wide, state_dtype="float32")
"""``protocol.wide`` of the fp32-state rows (``state_dtype=None``: all)."""
correctness_table = partial(P.correctness_table, by=("state_dtype",))
failed_points = partial(P.failed_points, params=PARAMS)
main_shape = partial(P.main_shape, keys=SHAPE_KEYS, prefer=MAIN_SHAPE)
plot_errors = partial(plots.plot_errors, labels=LABELS, title="Errors checked before timing")


def lazy_table(df: pd.DataFrame, shape: dict | None = None, Bs=(1, 64, 128)) -> pd.DataFrame:
    """Time per verify (us) of the carry forms per ``K`` and ``B``: eager, the lazy timings
    without and with a write-back, their amortised mix and the write-back frequency it used."""
    w = P.at(wide_table(df), main_shape(df) if shape is None else shape)
    if w.empty:
        return pd.DataFrame()
    w = w[w["B"].isin(Bs) & w["kernel"].str.startswith("carry_")
          & ~w["kernel"].str.endswith(P.PLAN_SUFFIX)]
    if w.empty:
        return pd.DataFrame()
    w = w.assign(form=w["kernel"].str.split("_").str[1])
    idx = ["form", "state_layout", "K", "B"]
    out = w.pivot_table(index=idx, columns="variant", values="time_us").reset_index()
    out.columns.name = None
    amort = w[w["variant"] == "amortised"].set_index(idx)["wb_frac"]
    out["write-back freq used"] = [amort.get(k, math.nan) for k in zip(*(out[c] for c in idx))]
    out["timer"] = w["timer"].iloc[0]
    return out.round(3)


def b1_table(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """``B = 1``: per kernel, layout and ``K``, the call as Python makes it (``do_bench_us``,
    host launch included: the launch plans' timer) and on a GPU the graph replay."""
    shape = main_shape(df) if shape is None else shape
    w = P.at(wide_table(df), dict(shape, B=1))
    if w.empty:
        return pd.DataFrame()
    if (w["timer"] == "cuda_graph").all():
        plans = P.at(wide_table(df, "do_bench"), dict(shape, B=1))
        plans = plans[plans["kernel"].str.endswith(P.PLAN_SUFFIX)]
        w = pd.concat([w.rename(columns={"time_us": "cuda_graph_us"}),
                       plans.rename(columns={"time_us": "do_bench_us"})], ignore_index=True)
        cols = ["kernel", "state_layout", "K", "do_bench_us", "cuda_graph_us"]
    else:
        cols = ["kernel", "state_layout", "K", "time_us", "timer"]
    cols = [c for c in cols if c in w]
    return w[cols].sort_values(["K", "kernel", "state_layout"]).reset_index(drop=True).round(2)


def shapes_table(df: pd.DataFrame, B: int = 64, K: int = 4) -> pd.DataFrame:
    """Every provider at ``K`` for every shape and ``K = 8`` at the main shape: time, GB/s and
    roofline fraction at ``B`` (or the largest batch width below it the shape ran)."""
    w = wide_table(df)
    if w.empty:
        return pd.DataFrame()
    w = w[w["kernel"].isin(PROVIDERS)]
    is_main = np.ones(len(w), dtype=bool)
    for k, v in main_shape(df).items():
        is_main &= (w[k] == v).to_numpy()
    w = w[((w["K"] == K).to_numpy() | ((w["K"] == 8).to_numpy() & is_main)) & (w["B"] <= B)]
    if w.empty:
        return pd.DataFrame()
    keys = list(SHAPE_KEYS) + ["K", "state_layout"]
    w = w[w["B"] == w.groupby(keys)["B"].transform("max")]
    gpu = ("gbps", "roofline_frac") if P.on_gpu(w) else ()     # GB/s of interpreter time: none
    cols = [c for c in ("HK", "HV", "head_dim", "dtype", "K", "B", "kernel", "state_layout",
                        "time_us", *gpu, "timer") if c in w]
    out = w[cols].sort_values(["HV", "head_dim", "K", "kernel", "state_layout"])
    return out.reset_index(drop=True).round({"time_us": 2, "roofline_frac": 3})


def pmll_table(pdf: pd.DataFrame, min_bytes: float = 4 * L2_BYTES) -> pd.DataFrame:
    """PMLL read and write launches: MB moved, time, GB/s, roofline fraction (GPU: launches
    moving at least ``min_bytes``, 4x the L2)."""
    w = P.wide(pdf)
    if w.empty:
        return pd.DataFrame()
    w = w.assign(MB=w["bytes"].astype(float) / 1e6)
    gpu = ("gbps", "roofline_frac") if P.on_gpu(w) else ()
    if gpu:
        w = w[w["MB"] * 1e6 >= min_bytes]
    cols = [c for c in ("kernel", "gate", "dtype", "B", "H", "M", "T", "D", "MB", "time_us",
                        *gpu, "timer") if c in w]
    return w[cols].reset_index(drop=True).round({"MB": 1, "time_us": 2, "roofline_frac": 3})


STATE_TABLE_KERNELS = (V.DECODES.name, V.CHAIN.name, V.CARRY_EAGER.name, V.CARRY_LAZY.name,
                       V.FLASHINFER_DECODE.name, V.MTP_SNAPSHOTS.name, V.MTP_FROZEN.name)


def state_dtype_table(df: pd.DataFrame, shape: dict | None = None, Bs=(1, 64, 256),
                      state_dtype: str = "bfloat16") -> pd.DataFrame:
    """A ``state_dtype`` pool against the fp32 one per kernel, layout, ``K``, ``B``: both times,
    on a GPU their ratio, and the half-state launch's worst output rel_l2 against the float64
    reference with the same rounding points, with its tolerance."""
    w = wide_table(df, state_dtype=None)
    if w.empty or not (w["state_dtype"] == state_dtype).any():
        return pd.DataFrame()
    w = P.at(w, main_shape(df) if shape is None else shape)
    w = w[w["kernel"].isin(STATE_TABLE_KERNELS) & w["B"].isin(list(Bs))]
    keys = ["kernel", "state_layout", "K", "B"]
    half = w[w["state_dtype"] == state_dtype].set_index(keys)["time_us"]
    full = w[w["state_dtype"] == "float32"].set_index(keys)["time_us"]
    out = pd.DataFrame({f"{state_dtype} state us": half, "fp32 state us": full}).dropna(
        subset=[f"{state_dtype} state us"])
    if P.on_gpu(w):
        out["ratio"] = out[f"{state_dtype} state us"] / out["fp32 state us"]
    tag = rf"^o( \([^)]*\))? \[{state_dtype} state\]$"
    err = df[(df["metric"] == "rel_l2") & df["what"].fillna("").str.match(tag)]
    if len(err):
        e = err.groupby(keys)[["value", "tolerance"]].max()
        e.columns = [f"o rel_l2 vs float64 ({state_dtype} rounding)", "tolerance"]
        out = out.join(e, how="left")
    out = out.reset_index()
    out["timer"] = str(w["timer"].iloc[0]) if len(w) else ""
    out["_o"] = out["kernel"].map({k: i for i, k in enumerate(STATE_TABLE_KERNELS)})
    out = out.sort_values(["K", "B", "_o", "state_layout"]).drop(columns="_o")
    return out.reset_index(drop=True).round(4)


def findings(df: pd.DataFrame, pdf: pd.DataFrame | None = None, *, mean_accept: float = 3.3,
             accept_K: int = 4, seed: int = 0) -> pd.DataFrame:
    """Facts: the acceptance process the amortised figures use (K=4), the run's copy roofline,
    PMLL points run, and on a GPU the bf16 state pool's time over the fp32 one's (B=64)."""
    a4 = acceptance(4, mean_accept, accept_K, seed=seed)
    how = f"mean accepted length {mean_accept} at K={accept_K}"
    rows = [fact("acceptance process, K=4: alpha", a4["alpha"], "per draft", how),
            fact("acceptance process, K=4: lazy write-backs", a4["lazy_wb"], "per verify", how),
            fact("acceptance process, K=4: rows pending", a4["lazy_mean_pend"], "rows", how)]
    roof = P.roofline_gbps(df)
    if roof:
        rows.append(fact("copy roofline of this run", roof, "GB/s"))
    if pdf is not None and len(pdf):
        rows.append(fact("PMLL ring points run", pdf["point_id"].nunique(), "points"))
    t = state_dtype_table(df, Bs=(64,))
    if "ratio" in t:
        for kern, K in ((V.DECODES.name, 1), (V.CHAIN.name, 4), (V.CARRY_LAZY.name, 4)):
            r = t[(t["kernel"] == kern) & (t["K"] == K)].dropna(subset=["ratio"])
            if len(r):
                r = r.loc[r["bfloat16 state us"].idxmin()]
                rows.append(fact(f"bf16 state pool / fp32 pool, {LABELS[kern]}, K={K}, B=64",
                                 r["ratio"], "x", f"{r['state_layout']}, the faster layout"))
    return facts(rows)


def plot_roofline(df: pd.DataFrame, shape: dict | None = None):
    """Time per verify against batch width, one column per ``K``, every provider in each
    layout; on a GPU the roofline floor (state read once) and the state read and written once
    as reference lines, and a second row with each provider's roofline fraction. On the CPU
    one row, labelled as the interpreter's wall time. None without timings."""
    import matplotlib.pyplot as plt

    shape = main_shape(df) if shape is None else shape
    w = P.at(wide_table(df), shape)
    w = w[w["kernel"].isin(PROVIDERS)] if len(w) else w
    if w.empty:
        return None
    gpu = P.on_gpu(w)
    timer = str(w["timer"].iloc[0])
    roof = P.roofline_gbps(df) if gpu else None
    Ks = sorted(w["K"].unique())
    nrow = 2 if gpu and "roofline_frac" in w else 1
    fig, axes = plt.subplots(nrow, len(Ks), figsize=(2.4 + 3.0 * len(Ks), 3.0 * nrow),
                             squeeze=False, layout="constrained", sharey="row")
    dt = getattr(torch, shape["dtype"])
    for j, K in enumerate(Ks):
        s = w[w["K"] == K]
        for kern, lay in ((k, x) for k in PROVIDERS for x in ("kv", "vk")):
            g = s[(s["kernel"] == kern) & (s["state_layout"] == lay)].sort_values("B")
            if g.empty:
                continue
            kw = plots.style(kern, lay)
            label = f"{LABELS.get(kern, kern)}, {P.LAYOUT_NAMES[lay]}"
            axes[0][j].plot(g["B"], g["time_us"], label=label, **kw)
            if nrow == 2:
                axes[1][j].plot(g["B"], g["roofline_frac"], label=label, **kw)
        if roof:
            Bs = np.array(sorted(s["B"].unique()))
            args = (int(K), shape["HK"], shape["HV"], shape["head_dim"], dt)
            axes[0][j].plot(Bs, [floor_bytes(int(b), *args) / (roof * 1e3) for b in Bs], "k--",
                            lw=1, label="roofline floor (state read once)")
            axes[0][j].plot(Bs, [fla_bytes(int(b), *args) / (roof * 1e3) for b in Bs], ":",
                            color="grey", lw=1, label="state read + written once")
        axes[0][j].set_title(f"K = {K}", fontsize=9)
        for row in range(nrow):
            axes[row][j].set_xscale("log", base=2)
            axes[-1][j].set_xlabel("batch width B")
        axes[0][j].set_yscale("log")
        if nrow == 2:
            axes[1][j].axhline(1.0, color="k", lw=0.8)
            axes[1][j].set_ylim(0, 1.1)
    axes[0][0].set_ylabel(f"time per verify (us)\n{P.TIMER_LABELS.get(timer, timer)}", fontsize=8)
    if nrow == 2:
        axes[1][0].set_ylabel("fraction of copy roofline", fontsize=8)
    desc = ", ".join(f"{k}={v}" for k, v in shape.items())
    fig.suptitle(("Verify time and roofline fraction" if gpu else
                  "Verify time (Triton interpreter wall time, not GPU speed)")
                 + f" against batch width ({desc}" + (f"; roofline {roof:.0f} GB/s)" if roof
                                                      else ")"), fontsize=10)
    plots.legend_outside(fig, axes[0])
    return fig
