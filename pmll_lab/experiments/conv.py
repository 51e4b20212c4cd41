"""The gdn_conv notebook's sweep point and plots: the causal conv twin verifying K draft rows.

For one point (``K`` rows, conv ``shape`` from ``SHAPES``, ``B`` sequences, input ``dtype``,
``pending`` stashed rows per slot) ``conv_point``:

1. draws seeded inputs (``pmll_lab.inputs.conv_inputs``: permuted, skipping slots) and
   ``pending`` extra input rows per sequence, the accepted-but-unfolded rows of the carry;
2. checks against the float64 references (``pmll_lab.reference.conv``), on the first
   ``ref_seqs`` sequences (each sequence is independent; the references loop in Python):
   ``chain`` (K rows, windows after each row kept) for outputs, final and intermediate windows;
   ``carry_eager`` / ``carry_lazy`` (``conv_carry_verify`` with ``pend = pending``) against the
   protocol reference for outputs, windows, stash and ``engaged``;
3. checks bitwise, on every sequence: ``updates`` (K successive ``conv_update``) == ``chain``
   (outputs, final and intermediate windows), and each carry's outputs == the chain run over
   the pending rows followed by the K new rows (the carry must give plain decoding's outputs);
4. only if every check passed, times each kernel (``pmll_lab.bench.time_launch``) and reports
   GB/s over the bytes of ``pmll_lab.conv.*_bytes`` and the roofline fraction; on a GPU also the
   time per replay of the same call captured in a CUDA graph (``graph_us``, ``gbps_graph``):
   the kernels are small, and at small B ``do_bench`` mostly measures the Python launch.
   Graph replays do not flush the L2 between calls: below ~60 MB per call they read warm data.

A failed check raises ``CheckFailed`` before anything is timed (STYLE.md, llm.c habit).
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import (
    bitwise_equal, copy_bandwidth, error_rows, throughput_rows, time_graph, time_launch,
)
from pmll_lab.conv import (
    ConvCarry,
    conv_carry_verify,
    conv_carry_verify_bytes,
    conv_chain,
    conv_chain_bytes,
    conv_update,
    conv_update_bytes,
    qwen3_next_conv_dim,
)
from pmll_lab.inputs import conv_inputs, generator
from pmll_lab.reference import conv as ref
from pmll_lab.sweep import CheckFailed, grid
from pmll_lab.experiments.common import error_strip
from pmll_lab.experiments.common import failed_points as _failed_points

SHAPES = {
    "qwen3-next": (16, 32, 128),     # HK, HV, kd = vd: dim 8192, qk_channels 4096
    "hk4-hv8-128": (4, 8, 128),      # dim 2048
    "hk2-hv4-32": (2, 4, 32),        # dim 256 (CPU-sized)
}
"""Named conv shapes ``(HK, HV, head size)``; ``dim = 2*HK*kd + HV*vd``."""

Y_TOL = {"float32": 1e-5, "bfloat16": 8e-3}
"""rel_l2 tolerance of outputs per input dtype (tests/test_conv.py: fp32 arithmetic over <= 4
taps is a few ulp; bf16 outputs are rounded once to bf16)."""

CAP = 8
KERNELS = ("chain", "updates", "carry_eager", "carry_lazy")
LABELS = {"chain": "chain + window snapshots", "updates": "K successive conv_update",
          "carry_eager": "carry verify, eager", "carry_lazy": "carry verify, lazy"}
TICKS = {"chain": "chain +\nsnapshots", "updates": "K successive\nconv_update",
         "carry_eager": "carry verify,\neager", "carry_lazy": "carry verify,\nlazy"}


def points(grids: list[dict]) -> list[dict]:
    """Expand the notebook's grids (dicts of axes ``K, B, shape, dtype`` and optionally
    ``pending``, ``d_conv``); duplicates across grids dropped, order kept."""
    out, seen = [], set()
    for g in grids:
        for p in grid(**g):
            key = tuple(sorted(p.items()))
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def _fail_if_bad(rows):
    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r['what']}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", rows)


def _flag(kernel, what, ok, metric="bitwise"):
    return {"kernel": kernel, "metric": metric, "value": float(ok), "passed": bool(ok), "what": what}


def conv_point(point: dict) -> list[dict]:
    """Check then time one point; returns tidy rows (see the module docstring)."""
    K, B = int(point["K"]), int(point["B"])
    HK, HV, hd = SHAPES[point["shape"]]
    dim, qk, _ = qwen3_next_conv_dim(HK, HV, hd, hd)
    d_conv = int(point.get("d_conv", 4))
    pending = int(point.get("pending", 2))
    ref_seqs = min(B, int(point.get("ref_seqs", 8)))
    dname = point.get("dtype", "bfloat16")
    dtype = getattr(torch, dname)
    seed = int(point.get("seed", 0))
    if not 1 <= K <= CAP or not 0 <= pending <= CAP:
        raise ValueError(f"point: need 1 <= K <= {CAP} and 0 <= pending <= {CAP}")
    d = conv_inputs(seed, B, dim, rows=K, d_conv=d_conv, slots=B + 2, dtype=dtype)
    x, w, bias, state0, idx = d["x"], d["weight"], d["bias"], d["conv_state"], d["state_indices"]
    S, SL = state0.shape[0], state0.shape[2]
    kw = dict(qk_channels=qk, head_dim=hd)
    tol = Y_TOL[dname]
    sub = slice(0, ref_seqs)
    rows: list[dict] = []

    # chain with window snapshots, against the float64 reference
    st_c = state0.clone()
    inter = torch.empty(B, K - 1, dim, SL, dtype=dtype, device=DEVICE)
    y_c = conv_chain(st_c, x, w, bias, state_indices=idx, intermediate=inter, validate=True, **kw)
    y_r, s_r, i_r = ref.conv_chain(state0, x[sub], w, bias, state_indices=idx[sub], **kw)
    sel = idx[sub].long().cpu()
    rows += error_rows("chain", y_c[sub], y_r, tol=tol, what="y")
    rows.append(_flag("chain", "final windows == reference",
                      torch.equal(st_c[idx[sub].long()].double().cpu(), s_r[sel])))
    if K > 1:
        rows.append(_flag("chain", "window snapshots == reference",
                          torch.equal(inter[sub].double().cpu(), i_r)))

    # K successive updates, bitwise against the chain
    st_u = state0.clone()
    row_x = [x[:, t] for t in range(K)]
    ys, same_snap = [], True
    for t in range(K):
        ys.append(conv_update(st_u, row_x[t], w, bias, state_indices=idx, **kw))
        if t < K - 1:
            same_snap = same_snap and bitwise_equal(st_u[idx.long()], inter[:, t])
    y_u = torch.stack(ys, 1)
    rows += error_rows("updates", y_u[sub], y_r, tol=tol, what="y")
    rows += [_flag("updates", "y == chain", bitwise_equal(y_u, y_c)),
             _flag("updates", "final windows == chain", bitwise_equal(st_u, st_c)),
             _flag("updates", "snapshots == chain", same_snap)]

    # carried verify: slots hold `pending` accepted inputs in the stash, not yet in the window
    gen = generator(seed + 1)
    prior = torch.randn(B, max(pending, 1), dim, generator=gen).to(dtype).to(DEVICE)[:, :pending]
    plain_st = state0.clone()
    y_plain = conv_chain(plain_st, torch.cat([prior, x], dim=1), w, bias, state_indices=idx,
                         **kw)[:, pending:]
    carries = {}
    for name, lazy in (("carry_eager", False), ("carry_lazy", True)):
        carry = ConvCarry.empty(S, dim, cap=CAP, dtype=dtype)
        carry.stash[idx.long(), :pending] = prior
        carry.pend[idx.long()] = pending
        st_k = state0.clone()
        stash0, pend0 = carry.stash.clone(), carry.pend.clone()
        y_k, eng = conv_carry_verify(st_k, carry, x, w, bias, slot_tab=idx, lazy=lazy,
                                     validate=True, **kw)
        y_kr, e_kr, s_kr, t_kr = ref.conv_carry_verify(state0, stash0, pend0, x[sub], w, bias,
                                                       slot_tab=idx[sub], lazy=lazy, **kw)
        wb = (pending + K > CAP) if lazy else pending > 0
        rows += error_rows(name, y_k[sub], y_kr, tol=tol, what="y")
        rows += [_flag(name, "y == plain chain", bitwise_equal(y_k, y_plain)),
                 _flag(name, "windows == reference", torch.equal(st_k[sel].double().cpu(), s_kr[sel])),
                 _flag(name, "stash == reference",
                       torch.equal(carry.stash[sel].double().cpu(), t_kr[sel])),
                 _flag(name, "engaged == protocol",
                       eng[sub].tolist() == e_kr.tolist() == [2 if wb else 1] * ref_seqs)]
        carries[name] = (carry, st_k, lazy, wb, pend0)
    _fail_if_bad(rows)

    # timing, after every check passed
    io = dict(d_conv=d_conv, state_len=SL, dtype=dtype)

    def run_chain():
        conv_chain(st_c, x, w, bias, state_indices=idx, intermediate=inter, **kw)

    def run_updates():
        for t in range(K):
            conv_update(st_u, row_x[t], w, bias, state_indices=idx, **kw)

    timed = [("chain", run_chain, conv_chain_bytes(B, K, dim, **io)),
             ("updates", run_updates, K * conv_update_bytes(B, dim, **io))]
    for name, (carry, st_k, lazy, wb, pend0) in carries.items():
        def run_carry(carry=carry, st_k=st_k, lazy=lazy):
            # pend is not advanced (no accept): every call verifies from the same pending count
            conv_carry_verify(st_k, carry, x, w, bias, slot_tab=idx, lazy=lazy, **kw)
        nbytes = conv_carry_verify_bytes(B, K, dim, pending=pending, write_back=float(wb), **io)
        timed.append((name, run_carry, nbytes))
    for name, fn, nbytes in timed:
        t = time_launch(fn)
        wb = float(carries[name][3]) if name in carries else None
        rows += [dict(r, write_back=wb) for r in throughput_rows(name, t, nbytes)]
        g = time_graph(fn)      # None on the CPU
        if g is not None:
            rows += [{"kernel": name, "metric": "graph_us", "value": g, "unit": "us",
                      "timer": "cuda-graph", "write_back": wb},
                     {"kernel": name, "metric": "gbps_graph", "value": nbytes / (g * 1e-6) / 1e9,
                      "unit": "GB/s", "timer": "cuda-graph", "bytes": int(nbytes),
                      "write_back": wb}]
    return rows


# ---- tables and plots --------------------------------------------------------------------------

def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """Worst rel_l2 of the outputs per (kernel, dtype) with its tolerance, and every bitwise
    flag: how many points passed each."""
    err = df[df["metric"] == "rel_l2"]
    t1 = (err.groupby(["kernel", "dtype", "what"])
          .agg(points=("value", "size"), passed=("passed", "sum"),
               worst_rel_l2=("value", "max"), tolerance=("tolerance", "max")).reset_index())
    bit = df[df["metric"] == "bitwise"]
    t2 = (bit.groupby(["kernel", "dtype", "what"])
          .agg(points=("value", "size"), passed=("passed", "sum")).reset_index())
    t2["worst_rel_l2"], t2["tolerance"] = float("nan"), float("nan")
    t2["what"] = "bitwise: " + t2["what"]
    out = pd.concat([t1, t2], ignore_index=True)
    out["passed"] = out["passed"].astype(int)
    out["kernel"] = pd.Categorical(out["kernel"], KERNELS)
    return out.sort_values(["kernel", "dtype", "what"])[
        ["kernel", "dtype", "what", "points", "passed", "worst_rel_l2", "tolerance"]]


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    """One line per failed point: its parameters and error text."""
    return _failed_points(df, ("K", "B", "shape", "dtype", "pending"))


def plot_errors(df: pd.DataFrame, ax=None):
    """rel_l2 of the outputs against the float64 reference per kernel, one colour per dtype;
    tolerances as short dashes."""
    import matplotlib.pyplot as plt

    err = df[df["metric"] == "rel_l2"]
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.6))
    err = err.assign(cat=err["kernel"])
    error_strip(ax, err, KERNELS, ticks=[TICKS[k] for k in KERNELS], legend_title="input dtype")
    ax.set_ylabel("rel. L2 error of y vs float64")
    ax.set_title("Conv outputs against the float64 reference (-- tolerance)")
    return ax


def main_shape(df: pd.DataFrame) -> dict:
    """The (shape, dtype) with the most timed points: what the speed plots show."""
    t = df[(df["metric"] == "time_us") & (df["status"] == "ok")]
    if t.empty:
        return {}
    key = t.groupby(["shape", "dtype"]).size().idxmax()
    return dict(zip(["shape", "dtype"], key))


def plot_speed(df: pd.DataFrame, metric: str = "time_us", shape: dict | None = None):
    """One panel per K: ``metric`` (``time_us`` per verify of K rows, or ``gbps``) against batch
    width for each kernel; with ``gbps`` on a GPU, the measured copy roofline as a line."""
    import matplotlib.pyplot as plt

    from pmll_lab.sweep import speed_rows

    shape = main_shape(df) if shape is None else shape
    sel = speed_rows(df, metric)
    for k, v in shape.items():
        sel = sel[sel[k] == v]
    Ks = sorted(sel["K"].unique())
    if not Ks:
        return None
    fig, axes = plt.subplots(1, len(Ks), figsize=(3.2 * len(Ks), 3.4), sharey=True, squeeze=False)
    gpu = "timer" in sel and sel["timer"].isin(["do_bench", "cuda-graph"]).any()
    roof = copy_bandwidth() if gpu else None
    if gpu and roof is None:
        roof = _stored_roofline(df)
    for ax, K in zip(axes[0], Ks):
        for i, kern in enumerate(KERNELS):
            s = sel[(sel["K"] == K) & (sel["kernel"] == kern)].sort_values("B")
            if not s.empty:
                ax.plot(s["B"], s["value"], "o-", ms=3, color=f"C{i}", label=LABELS[kern])
        if metric in ("gbps", "gbps_graph") and roof:
            ax.axhline(roof, color="k", ls="--", lw=1, label=f"copy roofline {roof:.0f} GB/s")
        ax.set_xscale("log", base=2)
        if metric in ("time_us", "graph_us"):
            ax.set_yscale("log")
        ax.set_title(f"K = {K}")
        ax.set_xlabel("batch width B (sequences)")
    unit = {"time_us": "time per verify, do_bench (us)", "gbps": "GB/s, do_bench",
            "graph_us": "time per verify, CUDA graph (us)",
            "gbps_graph": "GB/s, CUDA-graph replay"}[metric]
    if not gpu:
        unit += "\nTriton interpreter wall time, not GPU speed"
    axes[0][0].set_ylabel(unit)
    axes[0][-1].legend(fontsize=7, loc="best")
    desc = ", ".join(f"{k}={v}" for k, v in shape.items())
    title = "Time per verify of K rows" if metric.endswith("_us") else "Achieved bandwidth"
    fig.suptitle(f"{title} ({desc})", fontsize=10)
    fig.tight_layout()
    return fig


def _stored_roofline(df):
    if "copy_gbps" not in df:
        return None
    vals = df["copy_gbps"].dropna()
    return float(vals.iloc[0]) if len(vals) else None


def budget_table(shapes=("qwen3-next",), Ks=(1, 2, 3, 4, 8), dtype=torch.bfloat16,
                 d_conv: int = 4) -> pd.DataFrame:
    """Conv bytes per sequence per layer that verifying K rows holds: the window snapshots of
    the chain (``(K-1)`` windows) against the window itself and the carry stash (``CAP`` rows,
    independent of K), in KiB."""
    e = torch.empty((), dtype=dtype).element_size()
    rows = []
    for name in shapes:
        HK, HV, hd = SHAPES[name]
        dim, _, _ = qwen3_next_conv_dim(HK, HV, hd, hd)
        win = dim * (d_conv - 1) * e
        row = {"shape": name, "dim": dim, "window": win / 1024, "carry stash (CAP=8)":
               CAP * dim * e / 1024}
        row.update({f"snapshots K={K}": (K - 1) * win / 1024 for K in Ks})
        rows.append(row)
    return pd.DataFrame(rows).round(1)


def headline(df: pd.DataFrame, K: int = 4, B: int = 64, shape: str = "qwen3-next",
             dtype: str = "bfloat16") -> pd.DataFrame:
    """Time, GB/s and roofline fraction of every kernel at one point."""
    sel = df[(df["status"] == "ok") & (df["K"] == K) & (df["B"] == B) & (df["shape"] == shape)
             & (df["dtype"] == dtype)
             & df["metric"].isin(["time_us", "gbps", "roofline_frac", "graph_us", "gbps_graph"])]
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
    bit = df[df["metric"] == "bitwise"]
    if not bit.empty:
        good = bit.groupby("point_id")["passed"].all()
        lines.append(f"- Bitwise checks (successive updates == chain; carry outputs == the plain "
                     f"chain over pending + new rows; windows, stash and `engaged` == the "
                     f"protocol reference) hold at {int(good.sum())} of {len(good)} points.")
    err = ok[ok["metric"] == "rel_l2"]
    for dt, g in err.groupby("dtype"):
        lines.append(f"- {dt} inputs: worst rel. L2 error of the outputs "
                     f"{g['value'].astype(float).max():.1e} (tolerance {Y_TOL.get(dt, math.nan):.0e}).")
    t = ok[ok["metric"] == "time_us"]
    if not t.empty and (t["timer"] == "do_bench").any():
        h = headline(df)
        if not h.empty:
            for _, r in h.iterrows():
                frac = r.get("roofline_frac", math.nan)
                graph = r.get("graph_us", math.nan)
                lines.append(f"- Qwen3-Next conv (dim 8192), bf16, B=64, K=4: "
                             f"{LABELS.get(r['kernel'], r['kernel'])} {r['time_us']:.1f} us, "
                             f"{r['gbps']:.0f} GB/s"
                             + ("" if math.isnan(frac) else f" = {frac:.0%} of the roofline")
                             + ("" if math.isnan(graph) else
                                f" ({graph:.1f} us per CUDA-graph replay)") + ".")
        tt = t.pivot_table(index=["shape", "dtype", "K", "B"], columns="kernel", values="value")
        if {"chain", "updates"} <= set(tt.columns):
            r = (tt["updates"] / tt["chain"]).dropna()
            lines.append(f"- K successive updates take {r.median():.1f}x the chain's time "
                         f"(median over points; {r.min():.1f}x to {r.max():.1f}x).")
        if {"carry_lazy", "chain"} <= set(tt.columns):
            r = (tt["carry_lazy"] / tt["chain"]).dropna()
            lines.append(f"- The lazy carry verify takes {r.median():.2f}x the chain's time "
                         f"(median; {r.min():.2f}x to {r.max():.2f}x): it writes no window "
                         f"snapshots, but stashes the K inputs and reads the pending ones.")
        g = ok[ok["metric"] == "roofline_frac"]
        if not g.empty:
            best = g.groupby("kernel")["value"].max()
            lines.append("- Best roofline fraction per kernel: "
                         + ", ".join(f"{LABELS.get(k, k)} {v:.0%}" for k, v in best.items()) + ".")
    else:
        lines.append("- Timings are Triton-interpreter wall times on the CPU: they say nothing "
                     "about GPU speed; run the full preset on a GPU for speeds.")
    return "\n".join(lines)
