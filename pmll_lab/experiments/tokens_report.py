"""The tokens notebook's tables and plots, read from the sweep's rows
(``pmll_lab.experiments.tokens``).

First divergences are censored: a prompt that never left the reference within ``tokens``
generated (``-1`` in the rows) counts as diverging after the last token (``inf`` here, "never"
in the tables), so the quantiles are the sample's own values (``inverted_cdf``, no
interpolation across the censoring).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.tokens import EXACT_FORMS, FORMS
from pmll_lab.harness import step_forms as SF

LABELS = {"plain": "plain decoding", SF.EXACT_EAGER.name: "exact carry, eager",
          SF.EXACT_LAZY.name: "exact carry, lazy", "exact_policy": "exact carry, serving policy",
          SF.CHAIN_RESTORE.name: "chain + restore", SF.RING.name: "ring form (tolerance)",
          SF.REPLAYSSM.name: "FlashInfer ReplaySSM"}
DIVERGENCE = {"first_divergent_token": "vs plain, same pool",
              "first_divergent_token_fp32": "vs plain, fp32 pool"}
QUANTILES = (0.1, 0.25, 0.5, 0.75)
SETTING = ["form", "state_dtype", "K", "drafter", "forced_reject"]


def prompt_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (form, pool, draft setting, prompt) with a column per metric, from points
    that ran (``ok``, or ``failed`` with their rows kept: an exact form that diverged)."""
    if df.empty or "metric" not in df or "prompt" not in df:
        return pd.DataFrame()
    d = df[df["status"].isin(["ok", "failed"]) & df["prompt"].notna()
           & (df["prompt"] >= 0)].copy()
    if d.empty:
        return d
    return _setting(d).pivot_table(index=SETTING + ["prompt", "tokens"], columns="metric",
                                   values="value", aggfunc="first").reset_index()


def _setting(d: pd.DataFrame) -> pd.DataFrame:
    """``d`` with the draft setting filled in where a plain point has none."""
    for c, fill in (("K", 1), ("drafter", "none"), ("forced_reject", False)):
        d[c] = d[c].fillna(fill) if c in d else fill
    return d.astype({"K": int, "forced_reject": bool})


def _censored(v: pd.Series) -> np.ndarray:
    x = v.astype(float).to_numpy()
    return np.where(x < 0, np.inf, x)


def _quantile(x: np.ndarray, q: float) -> float:
    return float(np.quantile(x, q, method="inverted_cdf")) if len(x) else math.nan


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (form, pool dtype, K, drafter, forced_reject): prompts, tokens generated, for each
    reference (``same`` pool, ``fp32`` pool) the fraction of prompts that never diverged and
    the quantiles of the first divergence (``inf``: never), mean acceptance rate and tokens per
    step; ``tokens_per_s`` where measured."""
    w = prompt_rows(df)
    if w.empty:
        return w
    out = []
    for key, g in w.groupby(SETTING, sort=False):
        row = dict(zip(SETTING, key), prompts=len(g), tokens=int(g["tokens"].max()))
        for m, tag in (("first_divergent_token", "same"), ("first_divergent_token_fp32", "fp32")):
            if m not in g:
                continue
            x = _censored(g[m])
            row[f"never_{tag}"] = float(np.isinf(x).mean())
            for q in QUANTILES:
                row[f"q{int(q * 100)}_{tag}"] = _quantile(x, q)
        for m in ("accept_rate", "tokens_per_step"):
            row[m] = float(g[m].mean()) if m in g else math.nan
        out.append(row)
    t = pd.DataFrame(out)
    tps = _per_point(df, "tokens_per_s")
    if len(tps):
        t = t.merge(tps, on=SETTING, how="left")
    order = {f: i for i, f in enumerate(FORMS)}
    return t.sort_values(["forced_reject", "K", "form", "state_dtype"],
                         key=lambda s: s.map(order) if s.name == "form" else s
                         ).reset_index(drop=True)


def _per_point(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    d = df[(df["metric"] == metric) & (df["status"] == "ok")].copy() if len(df) else df
    if "timer" in d:
        d = d[d["timer"] == "step-wall"]          # GPU wall time only, no interpreter times
    if d.empty:
        return pd.DataFrame()
    return _setting(d).groupby(SETTING, sort=False)["value"].first().rename(metric).reset_index()


def shown(t: pd.DataFrame) -> pd.DataFrame:
    """``summary`` as the report shows it: forms in words, divergences as token indices or
    "never", fractions as percentages."""
    if t.empty:
        return t
    s = pd.DataFrame({"form": t["form"].map(LABELS).fillna(t["form"]),
                      "pool": t["state_dtype"].str.replace("bfloat16", "bf16")
                      .str.replace("float32", "fp32"),
                      "K": t["K"].where(t["form"] != "plain", pd.NA),
                      "drafts": np.where(t["form"] == "plain", "",
                                         np.where(t["forced_reject"], "all rejected",
                                                  t["drafter"])),
                      "prompts": t["prompts"], "tokens": t["tokens"]})
    for tag, what in (("same", "same pool"), ("fp32", "fp32 pool")):
        if f"never_{tag}" not in t:
            continue
        s[f"never diverged ({what})"] = (100 * t[f"never_{tag}"]).round(1).astype(str) + " %"
        for q in QUANTILES:
            v = t[f"q{int(q * 100)}_{tag}"]
            s[f"q{int(q * 100)} ({what})"] = [("never" if np.isinf(x) else
                                                 ("" if pd.isna(x) else f"{int(x)}")) for x in v]
    s["accept rate"] = t["accept_rate"].round(3)
    s["tokens / step"] = t["tokens_per_step"].round(3)
    if "tokens_per_s" in t:
        s["tokens / s"] = t["tokens_per_s"].round(1)
    return s


def survival(w: pd.DataFrame, metric: str, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, frac)``: the fraction of prompts whose first divergence (``metric``) lies at or
    after generated token ``n``, for ``n = 0 .. tokens``."""
    x = _censored(w[metric])
    n = np.arange(tokens + 1)
    return n, (x[None, :] >= n[:, None]).mean(1)


def plot_divergence(df: pd.DataFrame, K: int | None = None):
    """Fraction of prompts still on the reference's tokens against tokens generated, one line
    per (form, pool) at ``K`` (default: the largest), drafts real (solid) or all rejected
    (dashed); left: against plain decoding with the same pool, right: with an fp32 pool."""
    w = prompt_rows(df)
    if w.empty:
        return None
    spec = w[w["form"] != "plain"]
    K = int(spec["K"].max()) if K is None and len(spec) else K
    w = w[(w["form"] == "plain") | (w["K"] == K)]
    tokens = int(w["tokens"].max())
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True, layout="constrained")
    colors = {f: f"C{i}" for i, f in enumerate(FORMS)}
    for ax, (m, title) in zip(axes, DIVERGENCE.items()):
        if m not in w:
            continue
        for (form, sd, fr), g in w.groupby(["form", "state_dtype", "forced_reject"], sort=False):
            if form == "plain" and m == "first_divergent_token":
                continue                 # plain against itself: nothing to show
            n, frac = survival(g, m, tokens)
            pool = "bf16" if sd == "bfloat16" else "fp32"
            ax.step(n, frac, where="post", color=colors.get(form, "k"),
                    ls="--" if fr else ("-" if pool == "fp32" else "-."), lw=1.3,
                    label=f"{LABELS.get(form, form)}, {pool} pool"
                          + (", drafts rejected" if fr else ""))
        ax.set(xlabel="tokens generated", title=title, ylim=(-0.02, 1.05), xlim=(0, tokens))
        ax.set_xscale("symlog", linthresh=8)
        ticks = [t for t in (0, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
                 if t <= tokens]
        ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=7)
    axes[0].set_ylabel(f"fraction of prompts not yet diverged\n(K = {K}; {len(w.prompt.unique())}"
                       " prompts)")
    plots.legend_outside(fig, axes)
    return fig


def acceptance_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per K and form (real drafts): mean acceptance rate and tokens per step over prompts."""
    w = prompt_rows(df)
    if w.empty:
        return w
    s = w[(w["form"] != "plain") & ~w["forced_reject"]]
    if s.empty:
        return s
    t = s.groupby(["K", "form", "state_dtype"], sort=False)[["accept_rate", "tokens_per_step"]]
    t = t.mean().reset_index().sort_values(["K", "form", "state_dtype"]).reset_index(drop=True)
    t["form"] = t["form"].map(LABELS).fillna(t["form"])
    return t.rename(columns={"accept_rate": "accept rate", "tokens_per_step": "tokens / step"})


def exactness(df: pd.DataFrame) -> tuple[int, int, int]:
    """``(runs, runs equal to plain decoding on every prompt, prompts compared)`` over the
    exact forms' points."""
    w = prompt_rows(df)
    if w.empty:
        return 0, 0, 0
    e = w[w["form"].isin(EXACT_FORMS)]
    if e.empty:
        return 0, 0, 0
    runs = e.groupby(SETTING)["first_divergent_token"].apply(lambda v: bool((v < 0).all()))
    return len(runs), int(runs.sum()), len(e)


def verdict(df: pd.DataFrame) -> str:
    """The report's first line: the exact forms against plain decoding, the device."""
    dev = str(df["device"].dropna().iloc[0]) if "device" in df and df["device"].notna().any() \
        else "this machine"
    runs, equal, prompts = exactness(df)
    n_fail, _ = P.point_failures(df)
    tail = f"; {n_fail} point(s) failed" if n_fail else ""
    tok = int(df["tokens"].max()) if "tokens" in df and df["tokens"].notna().any() else 0
    return (f"**tokens: the exact forms gave plain decoding's tokens (same pool) in {equal} of "
            f"{runs} runs, on every prompt ({prompts} prompt runs, {tok} tokens each), on "
            f"{dev}{tail}.** The tolerance forms' first divergences are in the table.")


def model_table(models) -> pd.DataFrame:
    """Per checkpoint (a size name or a directory): its provenance in one row (parameters,
    weights' bytes, held-out loss and the byte-unigram baseline in nats and bits per byte, the
    training's Python, files, steps, seed, device and time)."""
    from pmll_lab.models.tiny_gdn import load_provenance

    rows = []
    for m in models:
        pv = load_provenance(m)
        c = pv["corpus"]
        rows.append({"model": m, "params": pv["params"], "weights MB": pv["bytes"] / 1e6,
                     "held-out loss (nats)": pv["heldout_loss_nats"],
                     "byte-unigram baseline (nats)": pv["unigram_nats"],
                     "held-out bits/byte": pv["heldout_bits_per_byte"],
                     "baseline bits/byte": pv["unigram_bits_per_byte"],
                     "held-out tokens scored": pv["heldout_tokens_scored"],
                     "Python": c["python_version"], "files (train / held out)":
                     f"{c['train_files']} / {c['heldout_files']}",
                     "steps": pv["training"]["steps"], "seed": pv["seed"],
                     "trained on": pv["device"], "train s": pv["train_seconds"]})
    return pd.DataFrame(rows)
