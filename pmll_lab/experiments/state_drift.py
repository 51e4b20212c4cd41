"""How far a bf16 state pool drifts from an fp32 one over a long decode (roofline notebook).

``drift_point`` decodes the same ``T`` tokens with ``gdn_decode`` on an fp32 and on a half
(bf16/fp16) state pool from the same start (the fp32 draw rounded: every difference is the
rounding's) and records, at tokens ``1, 2, 4, ..., T``, the rel L2 between the two runs'
outputs (``drift_o``) and states (``drift_state``); where the drift settles is the figure.
"""

from __future__ import annotations

import pandas as pd
import torch

from pmll_lab.bench import errors
from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.gdn import head_points
from pmll_lab.gdn import gdn_decode
from pmll_lab.inputs import gdn_inputs

CHUNK = 256
"""Tokens of inputs drawn at once (a fresh seed per chunk)."""

METRICS = {"drift_o": "outputs at token t", "drift_state": "state after token t"}


AXES = ("T", "B", "head_dim", "heads", "dtype", "state_layout", "state_dtype")
"""The drift sweep's axes (``protocol.grid_points``)."""


def points(grids: list[dict], *, seed: int = 0) -> list[dict]:
    """One point per combination of each grid's axes: ``T`` (tokens), ``B``, ``head_dim``,
    ``heads`` (``(HK, HV)`` pairs), ``dtype`` (inputs), ``state_layout``, ``state_dtype``
    (the pool compared with fp32: ``"bfloat16"`` or ``"float16"``); ``seed`` added."""
    seed = P.int_param("seed", seed)
    pts = head_points(grids, AXES)
    for p in pts:
        p["seed"] = seed
    return pts


def checkpoints(T: int) -> list[int]:
    """Tokens ``1, 2, 4, ... <= T`` and ``T`` itself."""
    return [1 << i for i in range((int(T) - 1).bit_length())] + [int(T)]


def drift_point(point: dict) -> list[dict]:
    """Decode ``T`` tokens on an fp32 and on a ``state_dtype`` state pool (module docstring);
    rows ``{"kernel": "gdn_decode", "metric": "drift_o" | "drift_state", "t", "value"}``
    (rel L2 of the half-state run against the fp32-state run). Raises ``ValueError`` for an
    fp32 ``state_dtype`` (nothing to compare) or ``T < 1``."""
    T, B, HK, HV, D = (int(point[n]) for n in ("T", "B", "HK", "HV", "head_dim"))
    if T < 1:
        raise ValueError(f"T: must be >= 1, got {T}")
    sdt = getattr(torch, point.get("state_dtype", "bfloat16"))
    if sdt == torch.float32:
        raise ValueError("state_dtype: compare a bf16 or fp16 pool with fp32, got float32")
    layout = point.get("state_layout", "kv")
    dtype = getattr(torch, point["dtype"])
    seed = int(point["seed"])
    st = gdn_inputs(seed, B, HK, HV, D, D, dtype=dtype, state_layout="kv")["state"]
    st = st if layout == "kv" else st.transpose(-1, -2).contiguous()
    half = st.to(sdt)
    full = half.float()                        # the same start: every difference is rounding's
    marks = set(checkpoints(T))
    rows = []
    x = None
    for t in range(1, T + 1):
        j = (t - 1) % CHUNK
        if j == 0:
            x = gdn_inputs(seed + 1 + (t - 1) // CHUNK, B, HK, HV, D, D,
                           rows=min(CHUNK, T - t + 1), dtype=dtype, state_layout="kv")
        args = [x[n][:, j] for n in ("q", "k", "v", "g", "beta")]
        o_full = gdn_decode(full, *args, out_dtype=torch.float32, state_layout=layout)
        o_half = gdn_decode(half, *args, out_dtype=torch.float32, state_layout=layout)
        if t in marks:
            for metric, a, b in (("drift_o", o_half, o_full), ("drift_state", half, full)):
                rows.append({"kernel": "gdn_decode", "metric": metric, "t": t,
                             "value": errors(a.float(), b)["rel_l2"]})
    return rows


def drift_table(df: pd.DataFrame) -> pd.DataFrame:
    """The drift rows as a table: one row per (layout, state dtype, shape, ``t``), the two
    metrics side by side."""
    if df.empty or "metric" not in df:
        return pd.DataFrame()
    d = df[df["metric"].isin(list(METRICS))]
    if d.empty:
        return pd.DataFrame()
    keys = [k for k in ("state_layout", "state_dtype", "HK", "HV", "head_dim", "dtype", "B", "t")
            if k in d]
    out = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="max")
    return out.reset_index().rename_axis(columns=None)


def plot_drift(df: pd.DataFrame):
    """rel L2 of the half-state decode against the fp32-state one over tokens (log-log): one
    colour per compared quantity, one line style per state layout (one panel per shape).
    Returns the figure (None without rows)."""
    import matplotlib.pyplot as plt

    t = drift_table(df)
    if t.empty:
        return None
    shapes = [k for k in ("HV", "head_dim", "B", "state_dtype") if k in t]
    groups = list(t.groupby(shapes)) if shapes else [((), t)]
    fig, axes = plt.subplots(1, len(groups), figsize=(2.5 + 4 * len(groups), 3.4),
                             squeeze=False, layout="constrained", sharey=True)
    for ax, (key, g) in zip(axes[0], groups):
        key = key if isinstance(key, tuple) else (key,)
        for lay, gl in g.groupby("state_layout") if "state_layout" in g else [("kv", g)]:
            gl = gl.sort_values("t")
            for i, metric in enumerate(METRICS):
                if metric in gl:
                    ax.plot(gl["t"], gl[metric].clip(lower=1e-12), ls=plots.LAYOUT_LINES[lay],
                            **plots.LAYOUT_MARKERS[lay], ms=3, color=f"C{i}",
                            label=f"{METRICS[metric]}, "
                            f"{'K' if lay == 'kv' else 'V'}-major")
        ax.set(xscale="log", yscale="log", xlabel="tokens decoded t")
        ax.set_xscale("log", base=2)
        ax.set_title(", ".join(f"{k}={v}" for k, v in zip(shapes, key)), fontsize=9)
    axes[0][0].set_ylabel("rel L2, half-state vs fp32-state decode")
    fig.suptitle("Drift of a bf16 state pool from an fp32 one", fontsize=10)
    plots.legend_outside(fig)
    return fig
