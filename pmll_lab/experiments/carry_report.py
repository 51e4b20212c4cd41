"""The carry_protocol notebook's byte budgets, tables, headline and conclusion, from the rows of
``pmll_lab.experiments.carry``'s verify sweep and protocol runs (part 4 of its module docstring:
the byte budgets per slot and layer for real model configurations).

Times are read with ``pmll_lab.experiments.gdn``'s timers (``best_timer``: CUDA graph replays
where present, else do_bench, else the Triton interpreter's wall time).
"""

from __future__ import annotations

import pandas as pd
import torch

from pmll_lab.experiments.acceptance import mean_accept_len
from pmll_lab.experiments.carry import (
    CAP, FORMS, LABELS, _itemsize, stash_row_bytes,
)
from pmll_lab.experiments.common import failed_points as _failed_points, failure_line
from pmll_lab.experiments.gdn import LAYOUT_NAMES, TIMER_LABELS, best_timer, timed, with_layout


# ---- byte budgets ---------------------------------------------------------------------------

MODEL_CONFIGS = [
    dict(model="Qwen3-Next-80B-A3B", HK=16, HV=32, kd=128, vd=128, d_conv=4, gdn_layers=36),
]
"""Real configurations for the byte budget (Qwen3-Next-80B-A3B config.json: 16 key heads,
32 value heads, head dims 128, conv kernel 4; 48 layers of which 36 are Gated DeltaNet)."""


def budget_table(configs=MODEL_CONFIGS, Ks=(2, 3, 4, 8), cap: int = CAP,
                 conv_dtype=torch.bfloat16) -> pd.DataFrame:
    """Per slot (sequence) and layer, in KiB: the fp32 state and conv window themselves, the
    carried-state stash (GDN fp32 rows + conv input rows, ``CAP`` rows, independent of K) and the
    snapshot chain's extra buffers for each K (``K-1`` states + ``K-1`` windows); and both for
    all GDN layers of the model in MiB."""
    rows = []
    for c in configs:
        HK, HV, kd, vd, d_conv = c["HK"], c["HV"], c["kd"], c["vd"], c["d_conv"]
        dim = 2 * HK * kd + HV * vd
        es = _itemsize(conv_dtype)
        hb = 4 * HV * kd * vd
        win = dim * (d_conv - 1) * es
        stash = cap * stash_row_bytes(HV, kd, vd) + cap * dim * es
        for K in Ks:
            snap = (K - 1) * (hb + win)
            rows.append({"model": c["model"], "K": K, "state KiB": hb / 1024,
                         "conv window KiB": win / 1024, "carry stash KiB": stash / 1024,
                         "snapshots KiB": snap / 1024, "snapshots / stash": snap / stash,
                         "stash MiB (all layers)": stash * c["gdn_layers"] / 2**20,
                         "snapshots MiB (all layers)": snap * c["gdn_layers"] / 2**20})
    return pd.DataFrame(rows).round(2)


# ---- tables of the sweep --------------------------------------------------------------------


def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """Worst rel_l2 per (kernel, dtype, what) with tolerance and passes, plus the bitwise and
    protocol flags."""
    df = with_layout(df)
    keys = ["state_layout", "kernel", "dtype", "what"]
    err = df[df["metric"] == "rel_l2"]
    parts = []
    if not err.empty:
        t = (err.groupby(keys)
             .agg(points=("value", "size"), passed=("passed", "sum"), worst_rel_l2=("value", "max"),
                  tolerance=("tolerance", "max")).reset_index())
        parts.append(t)
    flags = df[df["metric"].isin(["bitwise_vs_decode", "engaged_as_protocol", "bitwise_vs_plain",
                                  "engaged_as_simulated", "rel_l2_vs_plain", "state_untouched"])]
    if not flags.empty:
        f = flags.copy()
        f["what"] = f["metric"] + ": " + f["what"].astype(str)
        f2 = (f.groupby(keys)
              .agg(points=("value", "size"), passed=("passed", "sum"),
                   worst_rel_l2=("value", "max"), tolerance=("tolerance", "max")).reset_index())
        is_flag = ~f2["what"].str.startswith("rel_l2")
        f2.loc[is_flag, ["worst_rel_l2", "tolerance"]] = float("nan")
        parts.append(f2)
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    out["passed"] = out["passed"].astype(int)
    return out


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    """One line per failed point: its parameters and error text."""
    return _failed_points(with_layout(df), ("K", "B", "head_dim", "HK", "HV", "dtype", "form",
                                            "state_layout"))


def on_gpu(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds GPU timings (do_bench or CUDA graph)."""
    t = df[df["metric"] == "time_us"] if "metric" in df else df.iloc[0:0]
    return "timer" in t and t["timer"].isin(["do_bench", "cuda_graph"]).any()


def _at(sel: pd.DataFrame, shape: dict | None) -> pd.DataFrame:
    for k, v in (shape or {}).items():
        sel = sel[sel[k] == v]
    return sel


def crossover_table(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """Per (state_layout, form, K): time of eager and lazy at each B (best timer), their ratio,
    and the crossover: the smallest measured B from which lazy is faster at every larger
    measured B (None: lazy never faster over the whole tail)."""
    sel = _at(timed(df, "time_us"), shape)
    rows = []
    for (lay, K), g in sel.groupby(["state_layout", "K"]):
        for form in FORMS:
            e = g[g["kernel"] == f"carry_{form}_eager"].groupby("B")["value"].median()
            lz = g[g["kernel"] == f"carry_{form}_lazy"].groupby("B")["value"].median()
            Bs = sorted(set(e.index) & set(lz.index))
            if not Bs:
                continue
            ratio = {B: lz[B] / e[B] for B in Bs}
            cross = None
            for B in Bs:
                if all(ratio[b] < 1 for b in Bs if b >= B):
                    cross = B
                    break
            for B in Bs:
                rows.append(dict(state_layout=lay, form=form, K=K, B=B, eager_us=e[B],
                                 lazy_us=lz[B], lazy_over_eager=ratio[B], crossover_B=cross,
                                 timer=best_timer(df)))
    return pd.DataFrame(rows)


def crossover_summary(cross: pd.DataFrame) -> pd.DataFrame:
    """The crossover table folded: one row per (state_layout, form, K), the lazy/eager ratio at
    each B as columns, and ``lazy faster from B``."""
    if cross.empty:
        return pd.DataFrame()
    keys = ["state_layout", "form", "K"]
    wide = cross.pivot_table(index=keys, columns="B", values="lazy_over_eager").round(3)
    wide.columns = [f"B={b}" for b in wide.columns]
    first = cross.groupby(keys)["crossover_B"].first()
    wide["lazy faster from B"] = first.map(lambda v: "never" if v is None or pd.isna(v) else int(v))
    return wide.reset_index()


def speed_vs_acceptance(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """Time per verify (us, best timer) of every kernel against the acceptance length, at each
    ``(state_layout, K, B)`` measured at several ``alpha`` (empty if none was)."""
    sel = _at(timed(df, "time_us"), shape)
    if sel.empty or "alpha" not in sel:
        return pd.DataFrame()
    keys = ["state_layout", "K", "B"]
    n_alpha = sel.groupby(keys)["alpha"].nunique()
    keep = n_alpha[n_alpha > 1].index
    if not len(keep):
        return pd.DataFrame()
    sel = sel.set_index(keys).loc[keep].reset_index()
    sel["accept_len"] = [mean_accept_len(a, int(k)) for a, k in zip(sel["alpha"], sel["K"])]
    out = sel.pivot_table(index=keys + ["alpha", "accept_len"], columns="kernel", values="value")
    out.columns.name = None
    return out.reset_index()


COMPARE_SHAPE = dict(HK=16, HV=32, head_dim=128, dtype="bfloat16")
"""The shape of the carry vs snapshot-verify comparison (Qwen3-Next's GDN heads)."""


def rollback_bytes(K: int, HV: int, kd: int, vd: int, cap: int = CAP) -> dict:
    """Bytes per sequence and layer each design holds to roll back a K-row verify: the carry's
    stash (``cap`` rows of ``u, g, k``, fp32) and pending count (int32), independent of K;
    FlashInfer's snapshot buffer (``K`` fp32 states: the state after every row); our chain's
    (``K-1`` states)."""
    hb = 4 * HV * kd * vd
    return {"carry stash + pend": cap * stash_row_bytes(HV, kd, vd) + 4,
            "FlashInfer K snapshots": K * hb, "chain K-1 snapshots": (K - 1) * hb}


def carry_vs_snapshots(df: pd.DataFrame, K: int = 4, shape: dict | None = None) -> pd.DataFrame:
    """The carried state against FlashInfer's snapshot verify at ``shape`` (default
    ``COMPARE_SHAPE``) and ``K``: per batch width B and carry layout, the time per verify (us,
    best timer) of the exact carry (lazy with the protocol's pending counts, and eager),
    FlashInfer's ``mtp`` with its snapshot buffer (V-major points) and our snapshot chain, the
    ratio carry lazy / FlashInfer (below 1: the carry faster), and per sequence the bytes
    each launch moves (SPEC §4) and the bytes each design holds to roll back
    (``rollback_bytes``). Empty without timings at that shape."""
    shape = dict(COMPARE_SHAPE) if shape is None else shape
    t = _at(timed(df, "time_us"), dict(shape, K=K))
    if t.empty:
        return pd.DataFrame()
    fi = t[t["kernel"] == "flashinfer_mtp_snapshots"].groupby("B")[["value", "bytes"]].median()
    hold = rollback_bytes(K, int(shape["HV"]), int(shape["head_dim"]), int(shape["head_dim"]))
    rows = []
    for (lay, B), g in t.groupby(["state_layout", "B"]):
        def get(kern, col="value"):
            s = g[g["kernel"] == kern]
            return float(s[col].median()) if len(s) and col in s else float("nan")

        r = {"state_layout": lay, "B": int(B), "K": K,
             "carry exact lazy us": get("carry_exact_lazy"),
             "carry exact eager us": get("carry_exact_eager"),
             "chain + snapshots us": get("chain_snapshots"),
             "FlashInfer mtp + snapshots us": float(fi.loc[B, "value"]) if B in fi.index else float("nan")}
        r["lazy / FlashInfer"] = r["carry exact lazy us"] / r["FlashInfer mtp + snapshots us"]
        r["carry lazy moved KiB/seq"] = get("carry_exact_lazy", "bytes") / B / 1024
        r["FlashInfer moved KiB/seq"] = (float(fi.loc[B, "bytes"]) / B / 1024
                                         if B in fi.index else float("nan"))
        r["carry holds KiB/seq"] = hold["carry stash + pend"] / 1024
        r["FlashInfer holds KiB/seq"] = hold["FlashInfer K snapshots"] / 1024
        r["timer"] = best_timer(df)
        rows.append(r)
    return pd.DataFrame(rows).round(3)


def headline(df: pd.DataFrame, K: int = 4, Bs=(64, 128), HV: int = 32, head_dim: int = 128,
             dtype: str = "bfloat16") -> pd.DataFrame:
    """Time (best timer; beside CUDA-graph times the do_bench time of the same launch), GB/s,
    roofline fraction and write-back fraction of every kernel and layout at the issue's
    closing-note points."""
    where = dict(K=K, HV=HV, head_dim=head_dim, dtype=dtype)
    timer = best_timer(df)
    keys = ["state_layout", "B", "kernel"]
    parts = []
    for metric in ("time_us", "gbps", "roofline_frac"):
        s = _at(timed(df, metric, timer), where)
        s = s[s["B"].isin(Bs)]
        if not s.empty:
            parts.append(s.pivot_table(index=keys, values="value").rename(columns={"value": metric}))
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, axis=1)
    if timer == "cuda_graph":
        db = _at(timed(df, "time_us", "do_bench"), where)
        db = db[db["B"].isin(Bs)]
        if not db.empty:
            out["do_bench_us"] = db.pivot_table(index=keys, values="value")["value"]
    w = _at(with_layout(df), where)
    w = w[(w["metric"] == "write_back_frac") & (w["status"] == "ok") & w["B"].isin(Bs)]
    if not w.empty:
        out["write_back_frac"] = w.pivot_table(index=keys, values="value")["value"]
    out["timer"] = timer
    return out.reset_index()


def conclusion(df: pd.DataFrame, sim: pd.DataFrame, cross: pd.DataFrame,
               budget: pd.DataFrame, lazy_min_seqs: int = 8,
               compare: pd.DataFrame | None = None) -> str:
    """A few sentences written from the results (markdown): checks, simulation, on a GPU the
    times at the closing-note points, the eager/lazy crossover per layout, the carry against
    FlashInfer's snapshot verify (``compare``: ``carry_vs_snapshots``), and the byte budget."""
    lines = []
    df = with_layout(df)
    lines.append(failure_line(df))
    ok = df[df["status"] == "ok"]
    for lay, g in ok.groupby("state_layout"):
        bit = g[g["metric"].isin(["bitwise_vs_decode", "bitwise_vs_plain"])]
        if not bit.empty:
            lines.append(f"- {LAYOUT_NAMES.get(lay, lay)} state: exact form bitwise equal to plain "
                         f"decoding in {int(bit['passed'].sum())} of {len(bit)} checks (verify "
                         "sweep: outputs and written-back states; protocol runs: accepted outputs "
                         "and folded states over many steps).")
    err = ok[(ok["metric"] == "rel_l2") & (ok["what"] == "o") & ok["kernel"].str.startswith("carry")]
    for (form, dt), g in err.assign(form=err["kernel"].str.split("_").str[1]).groupby(["form", "dtype"]):
        lines.append(f"- {form} form, {dt} inputs: worst output rel. L2 error vs the float64 "
                     f"protocol reference {g['value'].astype(float).max():.1e}.")
    d = sim[(sim["K"] == 4)]
    if not d.empty:
        near = d.iloc[(d["mean_accept"] - 3.3).abs().argsort()[:2]]
        for _, r in near.iterrows():
            lines.append(f"- Simulation, K=4, acceptance length {r['mean_accept']:.2f}: {r['mode']} "
                         f"writes back on {r['wb_freq']:.0%} of verifies and folds "
                         f"{r['mean_folded']:.2f} pending rows per verify.")
    if on_gpu(df):
        timer = best_timer(df)
        lines.append(f"- Times below: {TIMER_LABELS.get(timer, timer)}.")
        h = headline(df)
        for _, r in h.iterrows():
            frac = r.get("roofline_frac", float("nan"))
            lines.append(f"- B={int(r['B'])}, K=4, HV=32, 128x128, "
                         f"{LAYOUT_NAMES.get(r['state_layout'], r['state_layout'])}: "
                         f"{LABELS.get(r['kernel'], r['kernel'])} {r['time_us']:.1f} us, "
                         f"{r['gbps']:.0f} GB/s"
                         + ("" if pd.isna(frac) else f" ({frac:.0%} of roofline)") + ".")
        if not cross.empty:
            for (lay, form), g in cross.groupby(["state_layout", "form"]):
                parts = []
                for K, gk in g.groupby("K"):
                    cb = gk["crossover_B"].iloc[0]
                    best = gk.loc[gk["lazy_over_eager"].idxmin()]
                    parts.append(f"K={K}: " + ("never" if cb is None or pd.isna(cb) else f"B >= {int(cb)}")
                                 + f" (lazy/eager {gk['lazy_over_eager'].min():.2f}-"
                                 f"{gk['lazy_over_eager'].max():.2f}, best at B={int(best['B'])})")
                lines.append(f"- Eager vs lazy, {form} form, {LAYOUT_NAMES.get(lay, lay)} state: lazy "
                             f"faster from {'; '.join(parts)} (policy threshold {lazy_min_seqs}).")
        if compare is not None and not compare.empty:
            c = compare.dropna(subset=["lazy / FlashInfer"])
            if len(c):
                for _, r in c[c["B"].isin([64, 128])].iterrows():
                    lines.append(
                        f"- Carry (exact, lazy, {LAYOUT_NAMES.get(r['state_layout'], r['state_layout'])}) vs "
                        f"FlashInfer's snapshot verify, B={int(r['B'])}, K=4: "
                        f"{r['carry exact lazy us']:.1f} us vs {r['FlashInfer mtp + snapshots us']:.1f} us "
                        f"({r['lazy / FlashInfer']:.2f}x its time); it moves "
                        f"{r['carry lazy moved KiB/seq']:.0f} KiB per sequence against "
                        f"{r['FlashInfer moved KiB/seq']:.0f} KiB and holds "
                        f"{r['carry holds KiB/seq']:.0f} KiB against {r['FlashInfer holds KiB/seq']:.0f} KiB.")
                lines.append(f"- Over all measured B, carry lazy / FlashInfer snapshot verify ranges "
                             f"{c['lazy / FlashInfer'].min():.2f}-{c['lazy / FlashInfer'].max():.2f}.")
            else:
                lines.append("- FlashInfer's snapshot verify was not measured in this run (see "
                             "the FlashInfer line at the top); the carry is compared with our "
                             "snapshot chain only.")
    elif "backend" in df and (df["backend"] == "cuda").any():
        lines.append("- No point passed its checks on the GPU, so nothing was timed (a failed point "
                     "is never plotted as a speed).")
    else:
        lines.append("- Timings are Triton-interpreter wall times on the CPU: they say nothing about "
                     "GPU speed, and no crossover is read from them; run the full preset on a GPU.")
    if not budget.empty:
        b = budget[budget["K"] == 4].iloc[0]
        lines.append(f"- {b['model']}, K=4: the stash holds {b['carry stash KiB']:.0f} KiB per sequence "
                     f"and layer against {b['snapshots KiB']:.0f} KiB of snapshots "
                     f"({b['snapshots / stash']:.1f}x); over its GDN layers "
                     f"{b['stash MiB (all layers)']:.1f} MiB vs {b['snapshots MiB (all layers)']:.1f} MiB per sequence.")
    return "\n".join(lines)
