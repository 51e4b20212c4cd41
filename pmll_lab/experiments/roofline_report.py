"""The roofline notebook's tables, from the rows ``roofline.gdn_point`` stores; issue 5's
targets, issue 10's headline table and the conclusion are computed from them in
``roofline_targets``.

Timers: a GPU run holds ``cuda_graph`` and ``do_bench`` rows for every timed launch (launch
plans: do_bench only), a CPU run ``interpreter-wall`` rows. ``wide_table`` shows one timer
(``best_timer``: cuda_graph where present, else do_bench, else the interpreter's wall time) and,
beside a cuda_graph time, the do_bench time of the same launch (``do_bench_us``, host launch
included). Where a kernel ran in both state layouts, a target takes the faster one and names it.
Every table, target and plot reads the fp32-state rows (``wide_table``'s default); the
bf16-state rows (``state_dtype``) are set against them in ``state_dtype_table``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pmll_lab.experiments.common import failed_points as _failed_points
from pmll_lab.experiments.roofline import (
    L2_BYTES, MAIN_SHAPE, PLAN_SUFFIX, PROVIDERS, SHAPE_KEYS,
)
from pmll_lab.sweep import speed_rows

TIMERS = ("cuda_graph", "do_bench", "interpreter-wall")
"""Timers in order of preference for tables, plots and targets."""
TIMER_LABELS = {"cuda_graph": "CUDA graph replay (GPU time, median)",
                "do_bench": "do_bench (host launch included, median)",
                "interpreter-wall": "Triton interpreter wall time, not GPU speed"}


# ---- tables ------------------------------------------------------------------------------------

def on_gpu(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds GPU timings (``do_bench`` or ``cuda_graph``)."""
    return "timer" in df and df["timer"].isin(["do_bench", "cuda_graph"]).any()


def best_timer(df: pd.DataFrame) -> str | None:
    """The first of ``TIMERS`` that ``df``'s ``time_us`` rows have, None without timings."""
    if df.empty or "timer" not in df or "metric" not in df:
        return None
    have = set(df.loc[df["metric"] == "time_us", "timer"].dropna())
    return next((t for t in TIMERS if t in have), None)


def _timed(df: pd.DataFrame, metric: str, timer: str) -> pd.DataFrame:
    """``speed_rows`` of one timer: rows of points that passed their checks."""
    keep = df["timer"].isna() | (df["timer"] == timer) if "timer" in df else slice(None)
    sel = speed_rows(df[keep], metric)
    return sel[sel["timer"] == timer] if "timer" in sel else sel


def roofline_gbps(df: pd.DataFrame) -> float | None:
    """The copy bandwidth the rows were divided by (GB/s), None without GPU rows."""
    if "copy_gbps" not in df:
        return None
    vals = pd.to_numeric(df["copy_gbps"], errors="coerce").dropna()
    return float(vals.iloc[0]) if len(vals) else None


def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per kernel and compared quantity: points, passed, worst rel_l2 and its tolerance (error
    rows), or the bitwise / protocol flags."""
    if df.empty or "passed" not in df:
        return pd.DataFrame()
    chk = df[df["passed"].notna()].copy()
    chk["what"] = chk["what"].fillna("")
    chk["passed"] = chk["passed"].astype(bool)
    err = chk[chk["metric"] == "rel_l2"]
    t1 = (err.groupby(["kernel", "what"])
          .agg(points=("value", "size"), passed=("passed", "sum"), worst_rel_l2=("value", "max"),
               tolerance=("tolerance", "max")).reset_index())
    vs_dec = t1["what"].str.contains("vs decode|written-back", regex=True)
    t1["check"] = np.where(vs_dec, "rel. L2 vs decode", "rel. L2 vs float64 reference")
    flg = chk[~chk["metric"].isin(["rel_l2", "max_abs"])]
    t2 = (flg.groupby(["kernel", "metric", "what"])
          .agg(points=("value", "size"), passed=("passed", "sum")).reset_index()
          .rename(columns={"metric": "check"}))
    out = pd.concat([t1, t2], ignore_index=True)
    out["passed"] = out["passed"].astype(int)
    cols = ["kernel", "check", "what", "points", "passed", "worst_rel_l2", "tolerance"]
    out = out[[c for c in cols if c in out]]
    return out.sort_values(["kernel", "check", "what"]).reset_index(drop=True)


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    """One line per failed point: its parameters and error text."""
    return _failed_points(df, ("provider", "K", "B", "HK", "HV", "head_dim", "dtype",
                               "state_layout", "state_dtype", "gate", "M", "T"))


def wide_table(df: pd.DataFrame, timer: str | None = None,
               state_dtype: str | None = "float32") -> pd.DataFrame:
    """One row per timed (point, kernel) that passed its checks, for one ``timer`` (default
    ``best_timer(df)``): the point's parameters, ``state_layout`` (``"kv"`` for rows written
    before the layout axis), ``state_dtype`` (``"float32"`` for rows without it), ``timer``,
    ``time_us`` (+ ``p20``, ``p80``, ``floor_us``), ``gbps``, ``bytes``, on a GPU
    ``roofline_frac``, and beside cuda_graph times the launch's do_bench time ``do_bench_us``.
    Timers are never mixed in one column. ``state_dtype``: keep the rows of that state dtype
    (default fp32, the dtype every table and target is about); ``None`` keeps all."""
    timer = best_timer(df) if timer is None else timer
    if timer is None:
        return pd.DataFrame()
    tm = _timed(df, "time_us", timer)
    if tm.empty:
        return pd.DataFrame()
    key = ["point_id", "kernel"]
    out = tm.rename(columns={"value": "time_us"}).drop(columns=["metric", "bytes"], errors="ignore")
    for metric in ("gbps", "roofline_frac"):
        m = _timed(df, metric, timer)
        if m.empty:
            continue
        cols = ["value"] + (["bytes"] if metric == "gbps" else [])
        m = m[key + cols].rename(columns={"value": metric})
        out = out.merge(m, on=key, how="left")
    if timer == "cuda_graph":
        db = _timed(df, "time_us", "do_bench")
        if not db.empty:
            out = out.merge(db[key + ["value"]].rename(columns={"value": "do_bench_us"}),
                            on=key, how="left")
    out["state_layout"] = out["state_layout"].fillna("kv") if "state_layout" in out else "kv"
    out["state_dtype"] = (out["state_dtype"].fillna("float32") if "state_dtype" in out
                          else "float32")
    if state_dtype is not None:
        out = out[out["state_dtype"] == state_dtype]
    return out.reset_index(drop=True)


STATE_TABLE_KERNELS = ("decodes", "chain_snapshots", "carry_exact_eager", "carry_exact_lazy",
                       "flashinfer_decode", "flashinfer_mtp_snapshots", "flashinfer_mtp_frozen")


def state_dtype_table(df: pd.DataFrame, shape: dict | None = None, Bs=(1, 64, 256),
                      state_dtype: str = "bfloat16") -> pd.DataFrame:
    """A bf16 (``state_dtype``) state pool against the fp32 one, per kernel, layout, ``K`` and
    ``B`` at ``shape`` (default the main shape): the time of each (``best_timer``), their
    ratio, and the bf16-state launch's worst rel_l2 of its outputs against the float64
    reference with the same rounding points (``o [bfloat16 state]``, the lazy carry's over its
    two timed variants) with its tolerance.
    FlashInfer's rows are its bf16-state kernels against its fp32-state ones. Empty without
    such rows."""
    w = wide_table(df, state_dtype=None)
    if w.empty or not (w["state_dtype"] == state_dtype).any():
        return pd.DataFrame()
    shape = main_shape(df) if shape is None else shape
    w = _sel_shape(w, shape)
    w = w[w["kernel"].isin(STATE_TABLE_KERNELS) & w["B"].isin(list(Bs))]
    keys = ["kernel", "state_layout", "K", "B"]
    half = w[w["state_dtype"] == state_dtype].set_index(keys)["time_us"]
    full = w[w["state_dtype"] == "float32"].set_index(keys)["time_us"]
    out = pd.DataFrame({f"{state_dtype} state us": half, "fp32 state us": full}).dropna(
        subset=[f"{state_dtype} state us"])
    out["ratio"] = out[f"{state_dtype} state us"] / out["fp32 state us"]
    # the outputs against the reference: "o", "o (no write-back)", "o (write-back)" (not the
    # comparisons with decode), each tagged with the state dtype
    tag = rf"^o( \([^)]*\))? \[{state_dtype} state\]$"
    if "what" in df:
        err = df[(df["metric"] == "rel_l2") & df["what"].fillna("").str.match(tag)]
        if "state_dtype" in err:
            err = err[err["state_dtype"] == state_dtype]
        if not err.empty:
            e = err.groupby(["kernel", "state_layout", "K", "B"])[["value", "tolerance"]].max()
            e.columns = [f"o rel_l2 vs float64 ({state_dtype} rounding)", "tolerance"]
            out = out.join(e, how="left")
    out = out.reset_index()
    out["timer"] = str(w["timer"].iloc[0]) if len(w) else ""
    out["_order"] = out["kernel"].map({k: i for i, k in enumerate(STATE_TABLE_KERNELS)})
    out = out.sort_values(["K", "B", "_order", "state_layout"]).drop(columns="_order")
    return out.reset_index(drop=True).round(4)


def state_dtype_summary(df: pd.DataFrame, state_dtype: str = "bfloat16", B: int = 64,
                        K: int = 4, decode_K: int = 1) -> str:
    """One sentence for the conclusion: our bf16-state decode (``decode_K`` tokens) and ``K``-row
    lazy exact carry and chain times at ``B`` against the fp32 state of the same run, each in
    its faster layout; empty without such rows."""
    t = state_dtype_table(df, Bs=(B,), state_dtype=state_dtype)
    if t.empty:
        return ""
    parts = []
    for kern, K, label in (("decodes", decode_K, f"{decode_K} x decode"),
                           ("carry_exact_lazy", K, f"K={K} lazy exact carry (amortised)"),
                           ("chain_snapshots", K, f"K={K} chain with snapshots")):
        r = t[(t["kernel"] == kern) & (t["K"] == K)].dropna(subset=["fp32 state us"])
        if r.empty:
            continue
        r = r.loc[r[f"{state_dtype} state us"].idxmin()]
        parts.append(f"{label} [{r['state_layout']}] {r[f'{state_dtype} state us']:.1f} us against "
                     f"{r['fp32 state us']:.1f} us ({r['ratio']:.2f}x)")
    if not parts:
        return ""
    return f"{state_dtype} state pool at B={B}: " + "; ".join(parts) + "."


def main_shape(df: pd.DataFrame) -> dict:
    """``MAIN_SHAPE`` if the results hold it, else the shape with the most timed points."""
    w = wide_table(df)
    if w.empty:
        return {}
    sizes = w.groupby(list(SHAPE_KEYS)).size()
    if tuple(MAIN_SHAPE[k] for k in SHAPE_KEYS) in sizes.index:
        return dict(MAIN_SHAPE)
    return dict(zip(SHAPE_KEYS, sizes.idxmax()))


def _sel_shape(df: pd.DataFrame, shape: dict) -> pd.DataFrame:
    for k, v in shape.items():
        df = df[df[k] == v]
    return df


def _best_row(w: pd.DataFrame, kernel: str, **where) -> pd.Series | None:
    """The fastest row of ``kernel`` matching ``where`` (over state layouts), None if none."""
    if w.empty or "kernel" not in w:
        return None
    s = w[w["kernel"] == kernel]
    for k, v in where.items():
        s = s[s[k] == v]
    if s.empty:
        return None
    return s.loc[s["time_us"].astype(float).idxmin()]


def _lookup(w: pd.DataFrame, kernel: str, col: str, **where) -> float:
    """``w[col]`` of the fastest row of ``kernel`` matching ``where`` (NaN if none)."""
    r = _best_row(w, kernel, **where)
    if r is None or col not in r.index or pd.isna(r[col]):
        return math.nan
    return float(r[col])


def lazy_table(df: pd.DataFrame, shape: dict | None = None, Bs=(1, 64, 128)) -> pd.DataFrame:
    """Time per verify (us) of the carry forms per ``K`` and ``B``: eager, the lazy timings
    without and with a write-back, and their amortised combination with the write-back
    frequency it used."""
    w = wide_table(df)
    if w.empty:
        return pd.DataFrame()
    shape = main_shape(df) if shape is None else shape
    w = _sel_shape(w, shape)
    w = w[w["B"].isin(Bs) & w["kernel"].str.startswith("carry_")
          & ~w["kernel"].str.endswith(PLAN_SUFFIX)]
    if w.empty:
        return pd.DataFrame()
    w = w.assign(form=w["kernel"].str.split("_").str[1])
    idx = ["form", "state_layout", "K", "B"]
    out = w.pivot_table(index=idx, columns="variant", values="time_us").reset_index()
    out.columns.name = None
    amort = w[w["variant"] == "amortised"].set_index(idx)["wb_frac"]
    out["write-back freq used"] = [amort.get(k, math.nan)
                                   for k in zip(*(out[c] for c in idx))]
    out["timer"] = w["timer"].iloc[0]
    return out.round(3)


def b1_table(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """``B = 1``, per kernel, layout and ``K``: the time per call as Python issues it
    (``do_bench_us`` on a GPU, host launch included: the launch plans' column) and, on a GPU,
    the CUDA graph replay time ``cuda_graph_us``; on the CPU the interpreter's wall time."""
    w = wide_table(df)
    if w.empty:
        return pd.DataFrame()
    shape = main_shape(df) if shape is None else shape
    w = _sel_shape(w, shape)
    w = w[w["B"] == 1]
    if (w["timer"] == "cuda_graph").all():
        w = w.rename(columns={"time_us": "cuda_graph_us"})
        plans = _sel_shape(wide_table(df, "do_bench"), shape)
        plans = plans[(plans["B"] == 1) & plans["kernel"].str.endswith(PLAN_SUFFIX)]
        w = pd.concat([w, plans.rename(columns={"time_us": "do_bench_us"})], ignore_index=True)
        cols = ["kernel", "state_layout", "K", "do_bench_us", "cuda_graph_us"]
    else:
        cols = ["kernel", "state_layout", "K", "time_us", "timer"]
    cols = [c for c in cols if c in w]
    return w[cols].sort_values(["K", "kernel", "state_layout"]).reset_index(drop=True).round(2)


def shapes_table(df: pd.DataFrame, B: int = 64, K: int = 4) -> pd.DataFrame:
    """Time, GB/s and roofline fraction of every provider: ``K`` (4) for every shape and
    ``K = 8`` at the main shape (the head sizes, head counts and rows issue 5 asks to see), at
    batch width ``B``, or the largest batch width below it that the shape was run at."""
    w = wide_table(df)
    if w.empty:
        return pd.DataFrame()
    w = w[w["kernel"].isin(PROVIDERS)]
    main = main_shape(df)
    is_main = np.ones(len(w), dtype=bool)
    for k, v in main.items():
        is_main &= (w[k] == v).to_numpy()
    w = w[(w["K"] == K).to_numpy() | ((w["K"] == 8).to_numpy() & is_main)]
    if w.empty:
        return pd.DataFrame()
    keys = list(SHAPE_KEYS) + ["K", "state_layout"]
    below = w[w["B"] <= B]
    if below.empty:
        return pd.DataFrame()
    pick = below.groupby(keys)["B"].transform("max")
    w = below[below["B"] == pick]
    cols = [c for c in ("HK", "HV", "head_dim", "dtype", "K", "B", "kernel", "state_layout",
                        "time_us", "gbps", "roofline_frac", "timer") if c in w]
    out = w[cols].sort_values(["HV", "head_dim", "K", "kernel", "state_layout"]).reset_index(drop=True)
    return out.round({"time_us": 2, "roofline_frac": 3})


def pmll_table(pdf: pd.DataFrame, min_bytes: float = 4 * L2_BYTES) -> pd.DataFrame:
    """PMLL read and write launches: MB moved, time, GB/s and (GPU) roofline fraction; on a GPU
    only launches moving at least ``min_bytes`` (4x the L2)."""
    w = wide_table(pdf)
    if w.empty:
        return pd.DataFrame()
    w = w.assign(MB=w["bytes"].astype(float) / 1e6)
    if on_gpu(w):
        w = w[w["MB"] * 1e6 >= min_bytes]
    cols = [c for c in ("kernel", "gate", "dtype", "B", "H", "M", "T", "D", "MB", "time_us",
                        "gbps", "roofline_frac") if c in w]
    return w[cols].reset_index(drop=True).round({"MB": 1, "time_us": 2, "roofline_frac": 3})
