"""The spec_decode notebook's tables, plots and findings, from the rows of
``spec_decode.generation_point`` and ``spec_decode.oracle_point``: acceptance, the step split into
kernel sections, tokens/s against plain decoding (GPU timings only), the forms side by side,
state bytes per model config."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd
import torch

from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import target_table as TT
from pmll_lab.experiments.spec_decode import LABELS, SECTIONS
from pmll_lab.experiments.targets import fact, facts
from pmll_lab.harness import step_forms as SF


def wide(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, kernel), one column per metric, points that ran only."""
    if df.empty:
        return df
    ok = df[df["status"] == "ok"]
    params = [c for c in ("B", "K", "p", "draft", "form", "lazy", "state_layout", "mode",
                          "kernel", "new_tokens", "prompt_len", "arch", "dtype", "timer")
              if c in ok]
    vals = ok.pivot_table(index="point_id", columns="metric", values="value", aggfunc="first")
    return ok.drop_duplicates("point_id").set_index("point_id")[params].join(vals) \
        .reset_index(drop=True)


GPU_TIMER = "GPU time (CUDA events), per step"
CPU_TIMER = "CPU wall time (GDN kernels in the Triton interpreter), not GPU speed"
"""How the tables and plots name the timer: on a GPU the kernel sections' CUDA events, on the
CPU the wall clock of a run whose GDN kernels ran in the interpreter (no result about a GPU)."""


def timer_label(df: pd.DataFrame) -> str:
    return GPU_TIMER if P.on_gpu(df) else CPU_TIMER


TARGET_SET = TT.SETS[TT.SPEC]
TARGETS = TT.for_report(TT.SPEC)
"""Reported figures (no bounds): whole speculative steps against plain decoding's."""


def acceptance_table(w: pd.DataFrame) -> pd.DataFrame:
    """Mean acceptance length per (draft, p, K) at the largest B, with the noisy draft's
    expectation ``1 + p + ... + p**(K-1)`` (which holds where the agreement with greedy's
    tokens is 1: the noisy draft is greedy's continuation), verify and plain decode steps."""
    if w.empty or "mean_accept" not in w:
        return pd.DataFrame()
    s = w[w.get("mode") == "spec"]
    if s.empty:
        return s
    s = s[s.B == s.B.max()]
    cols = ["mean_accept", "verify_steps", "decode_steps"] + \
        [c for c in ("agreement_with_greedy",) if c in s]
    t = s.groupby(["draft", "p", "K"], dropna=False)[cols].mean().reset_index()
    t["expected (noisy)"] = [(1 - p ** K) / (1 - p) if d == "noisy" and p < 1 else
                             (K if d == "noisy" else math.nan)
                             for d, p, K in zip(t.draft, t.p, t.K)]
    return t


def plot_acceptance(t: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(7, 3.8), layout="constrained")
    for j, (p, g) in enumerate(t[t.draft == "noisy"].groupby("p")):
        ax.plot(g.K, g.mean_accept, "o-", color=f"C{j}", label=f"noisy, p = {p:g}")
        ax.plot(g.K, g["expected (noisy)"], "x:", color=f"C{j}", label=f"expected, p = {p:g}")
    ng = t[t.draft == "ngram"]
    if len(ng):
        ax.plot(ng.K, ng.mean_accept, "ks--", label="ngram (prompt lookup)")
    ax.set(xlabel="K (rows verified per step)", ylabel="mean acceptance length",
           title="Acceptance length (expected: 1 + p + ... + p^(K-1))")
    plots.legend_outside(fig)
    return fig


def _main(w: pd.DataFrame, K: int, p: float) -> pd.DataFrame:
    """Plain rows and noisy-draft speculative rows at ``K``, ``p``."""
    if w.empty:
        return w
    return w[(w["mode"] == "plain") | ((w["draft"] == "noisy") & (w["K"] == K) & (w["p"] == p))]


def split_table(w: pd.DataFrame, K: int, p: float) -> pd.DataFrame:
    """Per (B, layout, kernel): the mean step split into kernel sections (ms), the draft and the
    rest of the model (projections, attention, MLP, norms, LM head, host)."""
    m = _main(w, K, p)
    cols = [f"{s}_ms" for s in SECTIONS if f"{s}_ms" in m] + ["draft_ms", "rest_of_model_ms"]
    cols = [c for c in cols if c in m and m[c].fillna(0).abs().sum() > 0]
    return m[["B", "state_layout", "kernel", *cols]].sort_values(["B", "state_layout", "kernel"])


def plot_split(t: pd.DataFrame, label: str):
    """Stacked bars of the step split, one panel per B."""
    Bs = sorted(t.B.unique())
    fig, axes = plt.subplots(1, len(Bs), figsize=(2.5 + 4 * len(Bs), 4), squeeze=False,
                             layout="constrained")
    secs = [c for c in t.columns if c.endswith("_ms")]
    cmap = plt.get_cmap("tab20")
    for ax, B in zip(axes[0], Bs):
        g = t[t.B == B]
        bottom = [0.0] * len(g)
        for j, c in enumerate(secs):
            vals = g[c].fillna(0).tolist()
            ax.bar(range(len(g)), vals, bottom=bottom, color=cmap(j % 20),
                   label=c[:-3].replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(g)), [f"{LABELS.get(k, k)}\n({lay})" for k, lay in
                                      zip(g.kernel, g.state_layout)], rotation=60, fontsize=7,
                      ha="right")
        ax.set_title(f"B = {B}", fontsize=9)
    axes[0][0].set_ylabel(f"ms per step\n{label}", fontsize=8)
    plots.legend_outside(fig, axes[0][:1])
    return fig


def throughput_table(w: pd.DataFrame, K: int, p: float) -> pd.DataFrame:
    """Tokens/s of each kernel, and on a GPU its ratio to plain decoding at the same (B,
    layout): the plain run of its own process (``plain_tokens_per_s``) where the row has one
    (workers differ more than the forms), else the plain row; ``timer``: ``timer_label`` (on the
    CPU the interpreter's wall time, and no ratio)."""
    m = _main(w, K, p)
    if m.empty or "tokens_per_s" not in m:      # no point ran (the failed-points table says why)
        return pd.DataFrame()
    plain = m[m.kernel == "plain"].set_index(["B", "state_layout"])["tokens_per_s"]
    rows = []
    for _, r in m.iterrows():
        base = r.get("plain_tokens_per_s", math.nan)
        if r.kernel == "plain" or pd.isna(base):
            base = plain.get((r.B, r.state_layout), math.nan)
        rows.append(dict(B=int(r.B), state_layout=r.state_layout, kernel=r.kernel,
                         tokens_per_s=r.tokens_per_s, plain_tokens_per_s=base,
                         speedup_vs_plain=r.tokens_per_s / base,
                         mean_accept=r.get("mean_accept", math.nan), step_ms=r.step_ms,
                         agreement_with_greedy=r.get("agreement_with_greedy", math.nan)))
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    if not P.on_gpu(w):         # no ratios of interpreter times
        out = out.drop(columns=["speedup_vs_plain"])
    out["timer"] = timer_label(w)
    return out.sort_values(["B", "state_layout", "kernel"]).reset_index(drop=True)


def plot_throughput(t: pd.DataFrame, label: str):
    """Tokens/s against B per kernel and layout, and the ratio to plain decoding: GPU timings
    only (``t["timer"]`` is ``GPU_TIMER``; interpreter tokens/s are no result, the table gives
    them labelled). None otherwise."""
    if t.empty or "timer" not in t or (t["timer"] != GPU_TIMER).any():
        return None
    ratio = "speedup_vs_plain" in t
    fig, axes = plt.subplots(1, 2 if ratio else 1, figsize=(12 if ratio else 7, 3.8),
                             squeeze=False, layout="constrained")
    for (k, lay), g in t.groupby(["kernel", "state_layout"]):
        kw = dict(plots.style(k, lay), label=f"{LABELS.get(k, k)}, {lay}")
        axes[0][0].plot(g.B, g.tokens_per_s, **kw)
        if ratio and k != "plain":
            axes[0][1].plot(g.B, g.speedup_vs_plain, **kw)
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("B (sequences decoded together)")
    axes[0][0].set(yscale="log", ylabel=f"tokens/s (all sequences)\n{label}")
    plots.plain_log_ticks(axes[0][0])
    if ratio:
        axes[0][1].axhline(1.0, color="k", lw=0.8)
        axes[0][1].set_ylabel("speculative / plain tokens/s")
    plots.legend_outside(fig, axes[0][:1])
    return fig


def forms_table(w: pd.DataFrame, K: int, p: float) -> pd.DataFrame:
    """The verify forms side by side per (B, layout): verify kernel time per step (conv + GDN
    verify or chain, accept, flushes, snapshot copy-back), write-backs and restored snapshots
    per verify step, flushes, acceptance and tokens/s, and the ``timer`` of the times."""
    m = _main(w, K, p)
    m = m[m["mode"] == "spec"] if len(m) else m
    rows = []
    for _, r in m.iterrows():
        vals = [r.get(f"{s}_ms") for s in SECTIONS if s not in ("conv_update", "gdn_decode")]
        n = max(r.verify_steps, 1)
        rows.append(dict(B=int(r.B), state_layout=r.state_layout, kernel=r.kernel,
                         verify_kernels_ms=sum(v for v in vals if v is not None and not pd.isna(v)),
                         step_ms=r.step_ms, write_backs_per_step=r.write_backs / n,
                         restored_per_step=r.restored / n, flushes=r.flushes,
                         flushed_slots=r.flushed_slots, lazy_steps=r.lazy_steps,
                         verify_steps=r.verify_steps, mean_accept=r.mean_accept,
                         tokens_per_s=r.tokens_per_s, timer=timer_label(w)))
    out = pd.DataFrame(rows)
    return out.sort_values(["B", "state_layout", "kernel"]).reset_index(drop=True) if len(out) \
        else out


def bytes_table(K: int = 4) -> pd.DataFrame:
    """State bytes per sequence (KiB, over the GDN layers) per model config
    (``state_bytes_per_sequence``), and the chain's snapshots over the carry's stash."""
    from transformers import Qwen3_5TextConfig, Qwen3NextConfig

    from pmll_lab.models.cache import state_bytes_per_sequence
    from pmll_lab.models.qwen3_next import qwen3_next_sized_config, tiny_config

    cfgs = [("tiny test model (fp32)", tiny_config("qwen3_next"), torch.float32),
            ("Qwen3-Next-sized stack", qwen3_next_sized_config(), torch.bfloat16),
            ("Qwen3-Next default config", Qwen3NextConfig(), torch.bfloat16),
            ("Qwen3.5 default config", Qwen3_5TextConfig(), torch.bfloat16)]
    rows = []
    for name, cfg, dt in cfgs:
        b = state_bytes_per_sequence(cfg, rows=K, dtype=dt)
        rows.append({"model": name,
                     "GDN layers": sum(t == "linear_attention" for t in cfg.layer_types),
                     **{f"{k} KiB": v / 1024 for k, v in b.items()},
                     f"snapshots(K={K}) / stash": b["snapshots"] / b["carry_stash"]})
    return pd.DataFrame(rows)


def oracle_table(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[df["status"].isin(["ok", "failed"])] if len(df) else df
    if ok.empty or "metric" not in ok:
        return pd.DataFrame()
    return ok.pivot_table(index="kernel", columns="metric", values="value",
                          aggfunc="first").reset_index()


def findings(w: pd.DataFrame, oracle: pd.DataFrame, K: int, p: float) -> pd.DataFrame:
    """Facts: per form our tokens against transformers' generate (tokens agreeing, divergences
    beyond the logit error, equal to our greedy tokens); the acceptance length at ``K``, ``p``
    per batch width and layout."""
    rows = []
    for r in oracle.itertuples() if len(oracle) and "unexplained" in oracle else []:
        what = LABELS.get(r.kernel, r.kernel)
        rows += [fact(f"{what}: tokens equal to transformers' greedy tokens", int(r.agreeing),
                      f"of {int(r.compared)} tokens"),
                 fact(f"{what}: divergences beyond the logit error", int(r.unexplained),
                      f"of {int(r.divergences)} divergences", f"eps {r.eps:.1e}"),
                 fact(f"{what}: equal to our greedy tokens", int(r.equal_to_greedy), "1 = yes")]
    t = throughput_table(w, K, p)
    for r in t[t["kernel"] == SF.EXACT_LAZY.name].itertuples() if len(t) else []:
        rows.append(fact(f"acceptance length, carry exact lazy, B={r.B}, K={K}, p={p}, "
                         f"{r.state_layout}", round(r.mean_accept, 3), "rows per verify"))
    return facts(rows)
