"""The roofline notebook's tables, targets and headline, from the rows ``roofline.gdn_point``
stores (issue 5's targets; issue 10's headline table).

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
    FLASHINFER, L2_BYTES, LABELS, MAIN_SHAPE, PLAN_SUFFIX, PROVIDERS, SHAPE_KEYS, acceptance,
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


# ---- targets -----------------------------------------------------------------------------------

def _pct(v: float) -> str:
    return "not measured" if math.isnan(v) else f"{v:.1%}"


def targets_table(df: pd.DataFrame, pdf: pd.DataFrame | None = None, *, mean_accept: float = 3.3,
                  accept_K: int = 4, seed: int = 0) -> pd.DataFrame:
    """Issue 5's targets, each computed from the data: ``target``, ``measured``, ``status``:
    ``met`` / ``missed``, ``not measured`` (no such rows), ``reported`` (no threshold), or
    ``GPU only`` for every target when the results hold no GPU timing (interpreter wall times
    say nothing about the roofline). Times and fractions are CUDA graph replays where the run
    has them (``wide_table``), each kernel in its faster state layout."""
    rows: list[dict] = []
    w_all = wide_table(df)
    gpu = on_gpu(w_all) if not w_all.empty else False
    w = _sel_shape(w_all, MAIN_SHAPE) if gpu else pd.DataFrame()

    def add(target: str, measured: str | None, ok: bool | None):
        if not gpu:
            rows.append({"target": target, "measured": "GPU only", "status": "GPU only"})
        elif measured is None:
            rows.append({"target": target, "measured": "not measured", "status": "not measured"})
        else:
            rows.append({"target": target, "measured": measured,
                         "status": "reported" if ok is None else ("met" if ok else "missed")})

    def get(kernel, col, K, B):
        return _lookup(w, kernel, col, K=K, B=B)

    f4 = acceptance(4, mean_accept, accept_K, seed=seed)["lazy_wb"]
    for form, label, frac_t, speed_t in (("wy", "WY", 0.75, 3.5), ("exact", "exact", 0.50, 2.5)):
        kern = f"carry_{form}_lazy"
        for B in (64, 128):
            fr = get(kern, "roofline_frac", 4, B)
            add(f"carry lazy {label}, K=4, B={B}: >= {frac_t:.0%} of roofline (write-backs "
                f"amortised at f = {f4:.2f})", None if math.isnan(fr) else _pct(fr),
                None if math.isnan(fr) else fr >= frac_t)
            tf, tc = get("fla_fused_recurrent", "time_us", 4, B), get(kern, "time_us", 4, B)
            sp = tf / tc
            add(f"carry lazy {label}, K=4, B={B}: >= {speed_t}x faster than FLA (same K rows)",
                None if math.isnan(sp) else f"{sp:.2f}x ({tc:.1f} us vs FLA {tf:.1f} us)",
                None if math.isnan(sp) else sp >= speed_t)
    for B in (64, 128):
        fr = get("chain_snapshots", "roofline_frac", 4, B)
        add(f"snapshot chain, K=4, B={B}: >= 75% of its roofline",
            None if math.isnan(fr) else _pct(fr), None if math.isnan(fr) else fr >= 0.75)
    for B in (64, 128, 256):
        fr = get("decodes", "roofline_frac", 1, B)
        add(f"decode (K=1), B={B}: >= 85% of roofline",
            None if math.isnan(fr) else _pct(fr), None if math.isnan(fr) else fr >= 0.85)
        td, tf = get("decodes", "time_us", 1, B), get("fla_fused_recurrent", "time_us", 1, B)
        add(f"decode (K=1), B={B}: faster than FLA",
            None if math.isnan(td + tf) else f"{td:.1f} us vs FLA {tf:.1f} us ({tf / td:.2f}x)",
            None if math.isnan(td + tf) else td < tf)
    for kern in ("carry_wy_lazy", "carry_exact_lazy"):
        gr, tb = get(kern, "time_us", 4, 1), get(kern, "do_bench_us", 4, 1)
        if w.empty or not (w["timer"] == "cuda_graph").any():      # no graph rows
            tb, gr = gr, math.nan
        add(f"B=1, K=4, {LABELS[kern]}: <= 10 us per verify call (do_bench, host launch "
            "included)", None if math.isnan(tb) else
            f"{tb:.1f} us (CUDA graph replay: {'n/a' if math.isnan(gr) else f'{gr:.1f} us'})",
            None if math.isnan(tb) else tb <= 10.0)
    pw = wide_table(pdf) if pdf is not None and gpu else pd.DataFrame()
    for kern, label in (("pmll_read", "PMLL read"), ("pmll_write", "PMLL write")):
        target = f"{label}: >= 80% of copy bandwidth at >= 4x the L2 ({4 * L2_BYTES / 1e6:.0f} MB)"
        s = pw[(pw["kernel"] == kern) & (pw["bytes"] >= 4 * L2_BYTES)] if not pw.empty else pw
        if s.empty or "roofline_frac" not in s:
            add(target, None, None)
            continue
        worst = float(s["roofline_frac"].min())
        add(target, f"worst {worst:.1%}, median {s['roofline_frac'].median():.1%} over "
                    f"{len(s)} launches", worst >= 0.80)
    others = [("head size 64", dict(MAIN_SHAPE, head_dim=64), 4),
              ("head size 256", dict(MAIN_SHAPE, head_dim=256), 4),
              ("HV=64", dict(MAIN_SHAPE, HV=64), 4), ("K=8", MAIN_SHAPE, 8)]
    for label, shp, K in others:
        s = _sel_shape(w_all, shp) if gpu else pd.DataFrame()
        if not s.empty:
            s = s[(s["K"] == K) & (s["B"] == 64) & s["kernel"].isin(PROVIDERS)]
        txt = ", ".join(f"{LABELS[k]} [{lay}] {_pct(v)}" for k, lay, v in zip(
            s.get("kernel", []), s.get("state_layout", []), s.get("roofline_frac", [])))
        add(f"{label}: roofline fractions reported (K={K}, B=64)", txt or None, None)
    return pd.DataFrame(rows)


# ---- headline (issue 10) -----------------------------------------------------------------------

HEADLINE_TARGETS = (
    # (target, ours, peer, K, batch widths, bound on ours / peer)
    ("decode K=1: ours <= FlashInfer decode", "decodes", "flashinfer_decode", 1,
     (64, 128, 256), 1.0),
    ("snapshot verify K=4: chain + K-1 snapshots <= FlashInfer mtp with intermediate_states_buffer",
     "chain_snapshots", "flashinfer_mtp_snapshots", 4, (64, 128, 256), 1.0),
    ("carry lazy exact K=4, amortised at the acceptance process: <= 0.4x FlashInfer's snapshot "
     "verify", "carry_exact_lazy", "flashinfer_mtp_snapshots", 4, (64, 128), 0.4),
    ("carry lazy exact K=4 without write-back: <= FlashInfer mtp frozen, no buffer",
     "carry_exact_lazy:nowb", "flashinfer_mtp_frozen", 4, (64, 128), 1.0),
    ("WY lazy K=4 without write-back (pend <= 4): <= exact lazy", "carry_wy_lazy:nowb",
     "carry_exact_lazy:nowb", 4, (64,), 1.0),
    ("B=1, K=4 verify, graph replay: carry lazy exact <= FlashInfer mtp with buffer",
     "carry_exact_lazy", "flashinfer_mtp_snapshots", 4, (1,), 1.0),
)
"""Issue 10's targets as (text, our kernel, the kernel it is held against, K, B values, bound
on the time ratio ours / theirs). Plus ``PLAN_TARGET_US``: the launch-plan call at B=1."""
PLAN_TARGET_US = 10.0
"""Issue 10: at B=1, K=4 a launch-plan call of the lazy exact verify takes <= 10 us wall."""
HEADLINE_COLUMNS = ["target", "B", "K", "ours", "layout", "ours_us", "peer", "peer_us", "ratio",
                    "bound", "ours_roofline_frac", "timer", "status", "note"]


def _stand_in_B(w: pd.DataFrame, B: int) -> int | None:
    """``B`` if ``w`` has it, else the largest batch width below it (a CPU run's stand-in)."""
    Bs = sorted(int(b) for b in w["B"].unique()) if not w.empty else []
    if B in Bs:
        return B
    below = [b for b in Bs if b <= B]
    return below[-1] if below else None


def headline_table(df: pd.DataFrame, *, mean_accept: float = 3.3, accept_K: int = 4,
                   seed: int = 0) -> pd.DataFrame:
    """Issue 10's headline: per target and batch width, our kernel in its faster state layout
    (``layout``), the kernel it is held against, the time ratio ours / theirs against its
    ``bound``, our fraction of the copy roofline, and ``status``: ``met`` / ``missed``, ``not
    measured`` (a side has no rows: ``note`` says which), or ``GPU only`` on a CPU run.

    Times are CUDA graph replays (median, us) where the run has them, else do_bench, else (CPU)
    the interpreter's wall time (``timer`` says which). On a GPU the shape is ``MAIN_SHAPE`` and
    the batch widths those of the targets; on the CPU, the run's main shape and, for a width it
    did not run, the largest one below it (the ``B`` column; ``note`` names the target's).
    The last row is the launch-plan call at ``B = 1``, ``K = 4`` (do_bench: wall time with the
    host, amortised over the lazy write-back frequency), against ``PLAN_TARGET_US``.
    Columns ``HEADLINE_COLUMNS``; empty without timings."""
    w = wide_table(df)
    if w.empty:
        return pd.DataFrame(columns=HEADLINE_COLUMNS)
    gpu = on_gpu(w)
    w = _sel_shape(w, MAIN_SHAPE if gpu else main_shape(df))
    timer = str(w["timer"].iloc[0]) if not w.empty else best_timer(df)
    have_fi = bool(df["kernel"].isin(FLASHINFER).any()) if "kernel" in df else False
    rows = []

    def verdict(ratio: float, bound: float, missing: str) -> tuple[str, str]:
        if missing:
            return "not measured", missing
        if not gpu:
            return "GPU only", ""
        return ("met" if ratio <= bound else "missed"), ""

    for text, ours, peer, K, Bs, bound in HEADLINE_TARGETS:
        seen = set()
        for B in Bs:
            Bu = B if gpu else _stand_in_B(w[w["K"] == K], B)
            if Bu is None or (text, Bu) in seen:
                continue
            seen.add((text, Bu))
            o = _best_row(w, ours, K=K, B=Bu)
            p = _best_row(w, peer, K=K, B=Bu)
            missing = " and ".join(
                [f"{side} not measured" for side, r in (("ours", o), ("peer", p)) if r is None])
            if p is None and peer in FLASHINFER and not have_fi:
                missing = "FlashInfer not in this run" + ("; ours not measured" if o is None else "")
            t_o = float(o["time_us"]) if o is not None else math.nan
            t_p = float(p["time_us"]) if p is not None else math.nan
            ratio = t_o / t_p if o is not None and p is not None else math.nan
            status, note = verdict(ratio, bound, missing)
            if Bu != B:
                note = (note + "; " if note else "") + f"B={Bu} stands in for the target's B={B}"
            if o is not None and ours.endswith(":nowb") and pd.notna(o.get("mean_pend")):
                note = (note + "; " if note else "") + f"mean pend {float(o['mean_pend']):.2f}"
            rows.append({"target": text, "B": Bu, "K": K, "ours": ours,
                         "layout": o["state_layout"] if o is not None else "",
                         "ours_us": t_o, "peer": peer, "peer_us": t_p, "ratio": ratio,
                         "bound": bound, "ours_roofline_frac":
                             float(o["roofline_frac"]) if o is not None and "roofline_frac" in o
                             and pd.notna(o["roofline_frac"]) else math.nan,
                         "timer": timer, "status": status, "note": note})
    rows.append(_plan_row(df, gpu, mean_accept, accept_K, seed))
    return pd.DataFrame(rows, columns=HEADLINE_COLUMNS).round(
        {"ours_us": 2, "peer_us": 2, "ratio": 3, "ours_roofline_frac": 3})


def _plan_row(df: pd.DataFrame, gpu: bool, mean_accept: float, accept_K: int, seed: int) -> dict:
    """The launch-plan target: ``carry_exact_lazy`` through its plans at ``B = 1``, ``K = 4``,
    amortised ``(1-f)*nowb + f*wb`` over the lazy write-back frequency ``f``."""
    text = (f"B=1, K=4: launch-plan call of the lazy exact verify <= {PLAN_TARGET_US:.0f} us "
            "wall (host included)")
    timer = "do_bench" if gpu else "interpreter-wall"
    w = wide_table(df, timer)
    w = _sel_shape(w, MAIN_SHAPE if gpu else main_shape(df)) if not w.empty else w
    f = float(acceptance(4, mean_accept, accept_K, seed=seed)["lazy_wb"])
    best, lay = math.nan, ""
    for layout in (sorted(w["state_layout"].unique()) if not w.empty else []):
        t0 = _lookup(w, f"carry_exact_lazy:nowb{PLAN_SUFFIX}", "time_us", K=4, B=1,
                     state_layout=layout)
        t1 = _lookup(w, f"carry_exact_lazy:wb{PLAN_SUFFIX}", "time_us", K=4, B=1,
                     state_layout=layout)
        t = (1 - f) * t0 + f * t1
        if not math.isnan(t) and (math.isnan(best) or t < best):
            best, lay = t, layout
    if math.isnan(best):
        status, note = "not measured", "no launch-plan rows at B=1, K=4"
    else:
        status = ("met" if best <= PLAN_TARGET_US else "missed") if gpu else "GPU only"
        note = f"write-back frequency {f:.2f}"
    return {"target": text, "B": 1, "K": 4, "ours": f"carry_exact_lazy{PLAN_SUFFIX}",
            "layout": lay, "ours_us": best, "peer": "", "peer_us": math.nan,
            "ratio": best / PLAN_TARGET_US, "bound": 1.0, "ours_roofline_frac": math.nan,
            "timer": timer, "status": status, "note": note}


def headline_summary(head: pd.DataFrame) -> str:
    """One markdown line: the timer and how many targets were met / missed / not measured."""
    if head.empty:
        return "No timings in these results."
    counts = head["status"].value_counts()
    timer = head["timer"].iloc[0]
    return (f"Times: {TIMER_LABELS.get(timer, timer)}. Targets: "
            + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".")


# ---- conclusion --------------------------------------------------------------------------------

def conclusion(df: pd.DataFrame, pdf: pd.DataFrame | None, targets: pd.DataFrame, *,
               mean_accept: float = 3.3, accept_K: int = 4, seed: int = 0) -> str:
    """A few sentences written from the results (markdown)."""
    lines = []
    n_pts = df["point_id"].nunique() if "point_id" in df else 0
    n_fail = df[df["status"] == "failed"]["point_id"].nunique() if n_pts else 0
    lines.append(f"- GDN: {n_pts} provider points run, {n_fail} failed (a check or an error)"
                 + (": see the failed points above." if n_fail else "."))
    if pdf is not None and not pdf.empty:
        pf = pdf[pdf["status"] == "failed"]["point_id"].nunique()
        lines.append(f"- PMLL: {pdf['point_id'].nunique()} ring points, {pf} failed.")
    a4 = acceptance(4, mean_accept, accept_K, seed=seed)
    lines.append(f"- Acceptance process: alpha = {a4['alpha']:.3f} per draft (mean accepted "
                 f"length {mean_accept} at K={accept_K}); the lazy verify writes back in "
                 f"{a4['lazy_wb']:.0%} of K=4 verifies (mean {a4['lazy_mean_pend']:.2f} pending "
                 "rows): the frequency the amortised lazy figures use.")
    w = wide_table(df)
    if w.empty or not on_gpu(w):
        lines.append("- No GPU timing in these results: the times are Triton-interpreter wall "
                     "times on the CPU, there is no roofline, and every target reads 'GPU only'. "
                     "Run the full preset on the H200 for the figures.")
        return "\n".join(lines)
    roof = roofline_gbps(df)
    if roof:
        lines.append(f"- Copy roofline of this run: {roof:.0f} GB/s. Times below: "
                     f"{TIMER_LABELS.get(str(w['timer'].iloc[0]), '')}.")
    m = _sel_shape(w, MAIN_SHAPE)
    for B in (64, 128):
        parts = []
        for prov in PROVIDERS:
            r = _best_row(m, prov, K=4, B=B)
            if r is not None:
                fr = float(r["roofline_frac"]) if pd.notna(r.get("roofline_frac")) else math.nan
                parts.append(f"{LABELS[prov]} [{r['state_layout']}] {float(r['time_us']):.1f} us "
                             f"({_pct(fr)})")
        if parts:
            lines.append(f"- K=4, B={B} (HV=32, kd=vd=128): " + "; ".join(parts) + ".")
    sd = state_dtype_summary(df)
    if sd:
        lines.append("- " + sd)
    head = headline_table(df, mean_accept=mean_accept, accept_K=accept_K, seed=seed)
    if not head.empty:
        lines.append("- Issue 10's headline: " + headline_summary(head))
        for _, r in head[head["status"] == "missed"].iterrows():
            lines.append(f"  - missed: {r['target']} (B={r['B']}): {r['ours_us']} us "
                         f"[{r['layout']}] vs {r['peer'] or 'bound'} {r['peer_us']} us, ratio "
                         f"{r['ratio']} > {r['bound']}.")
    if not targets.empty:
        counts = targets["status"].value_counts()
        lines.append("- Targets: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".")
        for _, r in targets[targets["status"] == "missed"].iterrows():
            lines.append(f"  - missed: {r['target']}: measured {r['measured']}.")
    return "\n".join(lines)
