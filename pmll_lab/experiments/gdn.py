"""The gdn_verify notebook's sweep point and plots: verifying K draft rows with the snapshot chain.

For one point (``K`` rows, head size ``head_dim = kd = vd``, ``HK`` key / ``HV`` value heads,
``B`` sequences, input ``dtype``) ``verify_point``:

1. draws seeded inputs (``pmll_lab.inputs.gdn_inputs``; permuted, skipping slots);
2. runs the float64 reference chain (``gdn_chain_ref``);
3. runs the chain with snapshots (``gdn_chain`` with ``intermediate``), the same chain without
   snapshots, and ``K`` successive ``gdn_decode`` launches; checks each against the reference
   (outputs, final state, snapshots) and the chain against the decodes *bitwise* (SPEC §2
   "Exactness"): any failure raises ``CheckFailed`` before anything is timed;
4. on a GPU with fla-core importable, runs FLA's ``fused_recurrent_gated_delta_rule`` over the
   same K rows (a speed reference: it keeps no snapshots, so it cannot roll back) and checks it
   against the reference too (its rows are recorded; a disagreement drops only its timing);
5. times each (``pmll_lab.bench.time_launch``) and emits GB/s over SPEC §4's bytes and the
   roofline fraction.

Kernels in the rows: ``chain`` (with snapshots), ``chain_nosnap``, ``decodes`` (K launches),
``fla_fused_recurrent``.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, copy_bandwidth, error_rows, throughput_rows, time_launch
from pmll_lab.gdn import (
    carry_stash_bytes, chain_bytes, decodes_bytes, gdn_chain, gdn_chain_ref, gdn_decode,
    row_io_bytes, snapshot_bytes, state_bytes,
)
from pmll_lab.inputs import gdn_inputs
from pmll_lab.experiments.common import error_strip
from pmll_lab.experiments.common import failed_points as _failed_points
from pmll_lab.experiments.common import head_points
from pmll_lab.peers import fla_available, fla_runner
from pmll_lab.sweep import CheckFailed

points = head_points
"""The notebook's grids -> points (axes ``K, B, head_dim, heads [(HK, HV)], dtype``)."""

STATE_TOL = 1e-5
"""rel_l2 tolerance of fp32 states and snapshots against the float64 reference (tests/test_gdn.py
states the measured margins)."""
O_TOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
"""rel_l2 tolerance of outputs per input dtype (outputs are rounded once to that dtype)."""

KERNELS = ("chain", "chain_nosnap", "decodes", "fla_fused_recurrent")
LABELS = {"chain": "chain + snapshots (ours)", "chain_nosnap": "chain, no snapshots (ours)",
          "decodes": "K successive decodes (ours)",
          "fla_fused_recurrent": "FLA fused_recurrent (no snapshots)"}




def verify_point(point: dict) -> list[dict]:
    """Check then time one point; returns tidy rows (see the module docstring)."""
    K, D, HK, HV, B = (int(point[n]) for n in ("K", "head_dim", "HK", "HV", "B"))
    dname = point.get("dtype", "bfloat16")
    dtype = getattr(torch, dname)
    x = gdn_inputs(int(point.get("seed", 0)), B, HK, HV, D, D, rows=K, dtype=dtype)
    state0, idx = x["state"], x["state_indices"]
    sel = idx.long()
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o_ref, s_ref, i_ref = gdn_chain_ref(state0, *args, state_indices=idx)
    s_ref = s_ref[sel]
    otol = O_TOL[dname]
    rows: list[dict] = []

    # chain with snapshots
    st_c = state0.clone()
    inter = torch.empty(B, K - 1, HV, D, D, device=DEVICE)
    o_c = gdn_chain(st_c, *args, state_indices=idx, intermediate=inter, validate=True)
    rows += error_rows("chain", o_c, o_ref, tol=otol, what="o")
    rows += error_rows("chain", st_c[sel], s_ref, tol=STATE_TOL, what="state")
    if K > 1:
        rows += error_rows("chain", inter, i_ref, tol=STATE_TOL, what="snapshots")
    del i_ref

    # chain without snapshots
    st_n = state0.clone()
    o_n = gdn_chain(st_n, *args, state_indices=idx, validate=True)
    same_n = bitwise_equal(o_n, o_c) and bitwise_equal(st_n, st_c)

    # K successive decodes (row views made once, reused by the timing below)
    row_args = [tuple(t[:, r] for t in args) for r in range(K)]
    st_d = state0.clone()
    outs, same_snaps = [], True
    for r in range(K):
        outs.append(gdn_decode(st_d, *row_args[r], state_indices=idx, validate=True))
        if r < K - 1:
            same_snaps = same_snaps and bitwise_equal(st_d[sel], inter[:, r])
    o_d = torch.stack(outs, dim=1)
    rows += error_rows("decodes", o_d, o_ref, tol=otol, what="o")
    rows += error_rows("decodes", st_d[sel], s_ref, tol=STATE_TOL, what="state")
    same_o, same_s = bitwise_equal(o_c, o_d), bitwise_equal(st_c, st_d)
    for what, ok in (("o", same_o), ("state", same_s), ("snapshots", same_snaps),
                     ("no-snapshot chain", same_n)):
        rows.append({"kernel": "chain", "metric": "bitwise_vs_decodes", "value": float(ok),
                     "passed": ok, "what": what})
    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r['what']}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", rows)

    # FLA, same K rows (speed reference; checked, never part of the pass/fail of ours)
    fla_ok = False
    if fla_available():
        run_fla, _ = fla_runner(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                state0[sel].contiguous(), scale=D ** -0.5)

        o_f, h_f = run_fla()
        frows = (error_rows("fla_fused_recurrent", o_f, o_ref, tol=otol, what="o")
                 + error_rows("fla_fused_recurrent", h_f, s_ref, tol=STATE_TOL, what="state"))
        fla_ok = all(r["passed"] for r in frows)
        rows += frows

    # timing (after every check passed)
    io = dict(num_k_heads=HK, num_v_heads=HV, k_dim=D, v_dim=D, dtype=dtype)
    hb = state_bytes(HV, D, D)
    rowio = row_io_bytes(HK, HV, D, D, dtype)

    def run_chain():
        gdn_chain(st_c, *args, state_indices=idx, intermediate=inter)

    def run_nosnap():
        gdn_chain(st_n, *args, state_indices=idx)

    def run_decodes():
        for r in range(K):
            gdn_decode(st_d, *row_args[r], state_indices=idx)

    timed = [("chain", run_chain, chain_bytes(B, K, **io)),
             ("chain_nosnap", run_nosnap, B * (2 * hb + K * rowio + 4)),
             ("decodes", run_decodes, decodes_bytes(B, K, **io))]
    if fla_ok:
        timed.append(("fla_fused_recurrent", run_fla, B * (2 * hb + K * rowio)))
    for name, fn, nbytes in timed:
        t = time_launch(fn)
        rows += [dict(r, time_per_row_us=t["median_us"] / K) if r["metric"] == "time_us" else r
                 for r in throughput_rows(name, t, nbytes)]
    return rows


# ---- tables and plots --------------------------------------------------------------------------

def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """Worst rel_l2 per (kernel, dtype, what) with its tolerance and how many points passed, plus
    the bitwise chain-vs-decodes flags."""
    err = df[df["metric"] == "rel_l2"]
    t1 = (err.groupby(["kernel", "dtype", "what"])
          .agg(worst_rel_l2=("value", "max"), tolerance=("tolerance", "max"),
               points=("value", "size"), passed=("passed", "sum"))
          .reset_index())
    bit = df[df["metric"] == "bitwise_vs_decodes"]
    t2 = (bit.groupby(["kernel", "dtype", "what"])
          .agg(points=("value", "size"), passed=("passed", "sum")).reset_index())
    t2["worst_rel_l2"], t2["tolerance"] = float("nan"), float("nan")
    t2["what"] = "bitwise == decodes: " + t2["what"]
    out = pd.concat([t1, t2], ignore_index=True)
    out["passed"] = out["passed"].astype(int)
    return out[["kernel", "dtype", "what", "points", "passed", "worst_rel_l2", "tolerance"]]


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    """One line per failed point: its parameters and error text."""
    return _failed_points(df, ("K", "head_dim", "HK", "HV", "B", "dtype"))


def plot_errors(df: pd.DataFrame, ax=None):
    """rel_l2 against the float64 reference, per kernel and compared quantity, one colour per
    input dtype; tolerances as short dashes."""
    import matplotlib.pyplot as plt

    err = df[(df["metric"] == "rel_l2")].copy()
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4), layout="constrained")
    err["cat"] = err["kernel"] + "\n" + err["what"]
    error_strip(ax, err, sorted(err["cat"].unique()))
    ax.set_ylabel("rel. L2 error vs float64 reference")
    ax.set_title("Error against the float64 reference (0 plotted as 1e-12)")
    return ax


def _speed(df: pd.DataFrame, metric: str, shape: dict | None) -> pd.DataFrame:
    from pmll_lab.sweep import speed_rows

    sel = speed_rows(df, metric)
    if shape is None:
        shape = main_shape(df)
    for k, v in shape.items():
        sel = sel[sel[k] == v]
    return sel


def main_shape(df: pd.DataFrame) -> dict:
    """The (head_dim, HK, HV, dtype) with the most timed points: what the speed plots show."""
    t = df[(df["metric"] == "time_us") & (df["status"] == "ok")]
    if t.empty:
        return {}
    key = t.groupby(["head_dim", "HK", "HV", "dtype"]).size().idxmax()
    return dict(zip(["head_dim", "HK", "HV", "dtype"], key))


def _on_gpu(sel: pd.DataFrame) -> bool:
    return "timer" in sel and (sel["timer"] == "do_bench").any()


def plot_speed(df: pd.DataFrame, metric: str = "time_us", shape: dict | None = None):
    """One panel per K: ``metric`` (``time_us`` per verify, or ``gbps``) against batch width B
    for each kernel; with ``gbps`` on a GPU, the measured copy roofline as a line."""
    import matplotlib.pyplot as plt

    shape = main_shape(df) if shape is None else shape
    sel = _speed(df, metric, shape)
    Ks = sorted(sel["K"].unique())
    if not Ks:
        return None
    fig, axes = plt.subplots(1, len(Ks), figsize=(3.3 * len(Ks), 3.4), sharey=True,
                             squeeze=False)
    gpu = _on_gpu(sel)
    roof = copy_bandwidth() if gpu else None
    if roof is None and "copy_gbps" in df:
        vals = df["copy_gbps"].dropna()
        roof = float(vals.iloc[0]) if len(vals) and gpu else None
    for ax, K in zip(axes[0], Ks):
        for i, kern in enumerate(KERNELS):
            s = sel[(sel["K"] == K) & (sel["kernel"] == kern)].sort_values("B")
            if not s.empty:
                ax.plot(s["B"], s["value"], "o-", ms=3, color=f"C{i}", label=LABELS[kern])
        if metric == "gbps" and roof:
            ax.axhline(roof, color="k", ls="--", lw=1, label=f"copy roofline {roof:.0f} GB/s")
        ax.set_xscale("log", base=2)
        if metric == "time_us":
            ax.set_yscale("log")
        ax.set_title(f"K = {K}")
        ax.set_xlabel("batch width B (sequences)")
    unit = {"time_us": "time per verify (us)", "gbps": "GB/s (SPEC §4 bytes)"}[metric]
    if not gpu:
        unit += "\nTriton interpreter wall time, not GPU speed"
    axes[0][0].set_ylabel(unit)
    handles, labels = axes[0][0].get_legend_handles_labels()
    desc = ", ".join(f"{k}={v}" for k, v in shape.items())
    fig.suptitle(f"{'Time per verify' if metric == 'time_us' else 'Achieved bandwidth'} ({desc})",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    return fig


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
    """Time, GB/s and roofline fraction of every kernel at one point (the issue's closing note:
    HV=32, kd=vd=128, B=64, K=4; HK=16 as in Qwen3-Next)."""
    sel = df[(df["status"] == "ok") & (df["K"] == K) & (df["B"] == B) & (df["HV"] == HV)
             & (df["HK"] == HK) & (df["head_dim"] == head_dim) & (df["dtype"] == dtype)
             & df["metric"].isin(["time_us", "gbps", "roofline_frac"])]
    if sel.empty:
        return pd.DataFrame()
    return sel.pivot_table(index="kernel", columns="metric", values="value").reset_index()


def conclusion(df: pd.DataFrame) -> str:
    """A few sentences written from the results (markdown)."""
    lines = []
    ok = df[df["status"] == "ok"]
    n_pts = df["point_id"].nunique()
    n_fail = df[df["status"] == "failed"]["point_id"].nunique()
    lines.append(f"- {n_pts} points run, {n_fail} failed their checks.")
    bit = ok[ok["metric"] == "bitwise_vs_decodes"]
    if not bit.empty:
        allbit = bool(bit["passed"].all())
        lines.append(f"- Chain vs K successive decodes: bitwise equal at "
                     f"{bit['point_id'][bit['passed'].astype(bool)].nunique()} of "
                     f"{bit['point_id'].nunique()} points (outputs, final state, snapshots)"
                     + ("." if allbit else " -- NOT everywhere: see the failed points."))
    err = ok[(ok["metric"] == "rel_l2") & ok["kernel"].isin(["chain", "decodes"])]
    for dt, g in err.groupby("dtype"):
        o = g[g["what"] == "o"]["value"].astype(float).max()
        s = g[g["what"] != "o"]["value"].astype(float).max()
        lines.append(f"- {dt} inputs: worst rel. L2 error of outputs {o:.1e}, of states and "
                     f"snapshots {s:.1e} (tolerances {O_TOL.get(dt, float('nan')):.0e} and "
                     f"{STATE_TOL:.0e}).")
    t = ok[ok["metric"] == "time_us"]
    if not t.empty and (t["timer"] == "do_bench").any():
        hK = 4
        h = headline(df, K=hK)
        if not h.empty:
            for _, r in h.iterrows():
                frac = r.get("roofline_frac", float("nan"))
                lines.append(f"- HK=16, HV=32, kd=vd=128, B=64, K=4: "
                             f"{LABELS.get(r['kernel'], r['kernel'])} {r['time_us']:.1f} us, "
                             f"{r['gbps']:.0f} GB/s"
                             + ("" if math.isnan(frac) else f" = {frac:.0%} of the roofline")
                             + ".")
            tm = dict(zip(h["kernel"], h["time_us"]))
            if "chain" in tm and "chain_nosnap" in tm:
                lines.append(f"- There the snapshots make the verify {tm['chain'] / tm['chain_nosnap']:.1f}x "
                             f"slower than the same chain without them (SPEC §4 bytes: "
                             f"(K+1)/2 = {(hK + 1) / 2:.1f}x the state traffic)"
                             + (f"; FLA's chain, which keeps no snapshots, takes "
                                f"{tm['fla_fused_recurrent'] / tm['chain_nosnap']:.2f}x ours "
                                f"without snapshots" if "fla_fused_recurrent" in tm else "")
                             + ".")
        small = ok[(ok["metric"] == "time_us") & (ok["B"] <= 4) & (ok["timer"] == "do_bench")
                   & ok["kernel"].isin(["chain", "chain_nosnap"])]
        if not small.empty:
            lines.append(f"- At B <= 4 one chain launch takes {small['value'].min():.0f}-"
                         f"{small['value'].max():.0f} us, dominated by launch "
                         "overhead (Python checks, Triton launch) rather than bandwidth; K decodes "
                         "pay it K times.")
        g = ok[ok["metric"] == "roofline_frac"]
        if not g.empty:
            best = g.groupby("kernel")["value"].max()
            lines.append("- Best roofline fraction per kernel over the sweep: "
                         + ", ".join(f"{LABELS.get(k, k)} {v:.0%}" for k, v in best.items()) + ".")
    else:
        lines.append("- Timings are Triton-interpreter wall times on the CPU: they say nothing "
                     "about GPU speed; run the full preset on a GPU for speeds.")
    return "\n".join(lines)
