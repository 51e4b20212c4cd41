"""The gdn_verify notebook's targets, tables and plots, from ``gdn.verify_point``'s rows (times:
``protocol.wide``; ratios of times from GPU runs only; the snapshot budget: SPEC §4's bytes)."""

from __future__ import annotations

from functools import partial

import pandas as pd

from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.gdn import LABELS, LAYOUTS, QWEN3_NEXT
from pmll_lab.experiments.targets import Target, fact, facts
from pmll_lab.gdn import carry_stash_bytes, snapshot_bytes, state_bytes

SHAPE_KEYS = ("HK", "HV", "head_dim", "dtype")
PARAMS = ("K", "B", "HK", "HV", "head_dim", "dtype", "state_layout")
TARGET_SET = "Snapshot verify at Qwen3-Next's shape (HK=16, HV=32, kd=vd=128, bf16 inputs)"
TARGETS = (
    Target("chain + K-1 snapshots <= FlashInfer mtp with its snapshot buffer, K=4", "chain",
           "flashinfer_mtp_snapshots", 1.0, where=dict(QWEN3_NEXT, K=4, B=[64, 128, 256]),
           per=("B",)),
    Target("chain + K-1 snapshots >= 75% of the copy roofline, K=4", "chain", kind="frac",
           bound=0.75, where=dict(QWEN3_NEXT, K=4, B=[64, 128]), per=("B",)),
    Target("chain + K-1 snapshots against FLA fused_recurrent (no snapshots), K=4", "chain",
           "fla_fused_recurrent", None, where=dict(QWEN3_NEXT, K=4, B=[64]), per=("B",)),
)


correctness_table = partial(P.correctness_table, by=("state_layout", "dtype"))
failed_points = partial(P.failed_points, params=PARAMS)
main_shape = partial(P.main_shape, keys=SHAPE_KEYS, prefer=QWEN3_NEXT)
plot_errors = partial(plots.plot_errors, labels=LABELS,
                      title="Chain, decodes and peers against the float64 chain")


def plot_speed(df: pd.DataFrame, metric: str = "time_us", shape: dict | None = None):
    """Time per verify or GB/s against batch width, one panel per K, at ``shape`` (default
    ``main_shape``)."""
    return plots.plot_speed(df, metric, main_shape(df) if shape is None else shape, LABELS,
                            list(LABELS), "Verify of K rows",
                            {"time_us": "time per verify (us)", "gbps": "GB/s (SPEC §4 bytes)"})


def layout_table(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """Time per verify (us) of each kernel per ``(K, B)``, one column per ``kernel layout``; on
    a GPU also the V-major / K-major ratio of the chain and the chain against FlashInfer."""
    shape = main_shape(df) if shape is None else shape
    w = P.at(P.wide(df), shape)
    if w.empty:
        return pd.DataFrame()
    w = w.assign(col=w["kernel"] + " " + w["state_layout"])
    out = w.pivot_table(index=["K", "B"], columns="col", values="time_us").round(1)
    if P.on_gpu(w):
        if {"chain kv", "chain vk"} <= set(out.columns):
            out["chain vk / kv"] = (out["chain vk"] / out["chain kv"]).round(3)
        if {"flashinfer_mtp_snapshots vk", "chain vk"} <= set(out.columns):
            out["chain vk / FlashInfer"] = (out["chain vk"]
                                            / out["flashinfer_mtp_snapshots vk"]).round(3)
    out.columns.name = None
    return out.reset_index()


def budget_table(shapes: list[tuple[int, int]], Ks=(1, 2, 3, 4, 8)) -> pd.DataFrame:
    """State bytes per sequence and layer (MiB) that verifying K rows holds: the snapshots
    ``(K-1)*Hb``, the state itself and the carried-state stash (``CAP = 8`` rows)."""
    rows = []
    for HV, D in shapes:
        row = {"HV": HV, "kd=vd": D, "state Hb": state_bytes(HV, D, D) / 2**20,
               "carry stash": carry_stash_bytes(HV, D, D) / 2**20}
        row.update({f"snapshots K={K}": snapshot_bytes(K, HV, D, D) / 2**20 for K in Ks})
        rows.append(row)
    return pd.DataFrame(rows).round(3)


def budget_shapes(pts: list[dict]) -> list[tuple[int, int]]:
    return sorted({(int(p["HV"]), int(p["head_dim"])) for p in pts})


def plot_snapshot_budget(shapes: list[tuple[int, int]], Ks=(1, 2, 3, 4, 8)):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
    for i, (HV, D) in enumerate(shapes):
        c = f"C{i}"
        ax.plot(Ks, [snapshot_bytes(K, HV, D, D) / 2**20 for K in Ks], "o-", color=c,
                label=f"snapshots, HV={HV}, kd=vd={D}")
        ax.axhline(state_bytes(HV, D, D) / 2**20, color=c, ls=":", lw=1)
        ax.axhline(carry_stash_bytes(HV, D, D) / 2**20, color=c, ls="--", lw=1)
    ax.plot([], [], "k:", lw=1, label="the state itself (Hb)")
    ax.plot([], [], "k--", lw=1, label="carry stash, CAP=8 rows (SPEC §3b)")
    ax.set(xlabel="K (draft rows verified)", ylabel="MiB per sequence per layer",
           yscale="symlog", title="State bytes the snapshots hold against K")
    fig.legend(loc="outside right center", fontsize=7, frameon=False)
    return fig


def findings(df: pd.DataFrame) -> pd.DataFrame:
    """Facts: the chain bitwise equal to K decodes per layout; on a GPU at the main shape, K=4,
    B=64, the chain's time over the chain without snapshots, and V-major over K-major."""
    rows = []
    ok = P.with_layout(df[df["status"] == "ok"]) if len(df) else df
    for lay in LAYOUTS:
        bit = ok[(ok["metric"] == "bitwise_vs_decodes") & (ok["state_layout"] == lay)] \
            if len(ok) else ok
        if len(bit):
            good = bit.groupby("point_id")["passed"].all()
            rows.append(fact(f"chain == K decodes bitwise, {P.LAYOUT_NAMES[lay]}",
                             int(good.sum()), f"of {len(good)} points"))
    w = P.at(P.wide(df), dict(QWEN3_NEXT, K=4, B=64)) if P.on_gpu(df) else pd.DataFrame()
    t = {(r.kernel, r.state_layout): r.time_us for r in w.itertuples()} if len(w) else {}
    for lay in LAYOUTS:
        if (("chain", lay) in t) and (("chain_nosnap", lay) in t):
            rows.append(fact(f"chain / chain without snapshots, {P.LAYOUT_NAMES[lay]}, K=4, B=64",
                             t[("chain", lay)] / t[("chain_nosnap", lay)], "x",
                             "SPEC §4 bytes: (K+1)/2 = 2.5x"))
    if ("chain", "kv") in t and ("chain", "vk") in t:
        rows.append(fact("chain, V-major / K-major time, K=4, B=64",
                         t[("chain", "vk")] / t[("chain", "kv")], "x"))
    return facts(rows)
