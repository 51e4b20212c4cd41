"""The spec_decode notebook: speculative decoding end to end on a hybrid GDN model.

A transformers Qwen3-Next model (random weights, seeded) decodes through our kernels
(``pmll_lab.models``): greedy (``conv_update`` + ``gdn_decode`` per token) and speculative
(``K`` rows per step verified by the carried state, exact or WY form, eager or lazy, or by the
snapshot chain), with a draft whose quality is a parameter (``noisy``: the target's own greedy
tokens, each wrong with probability ``1 - p``) or prompt lookup (``ngram``).

- ``generation_point``: one generation (plain or speculative) of ``B`` prompts; rows per point:
  tokens/s over the decode steps, mean acceptance length, per-step time (mean; and the median)
  and its split into
  kernel sections (per verify step, summed over the GDN layers), write-backs, flushes, restored
  snapshots, and how many tokens agree with greedy decoding. On a GPU each generation runs twice
  and the second is measured (the first compiles the kernels); sections are timed with CUDA
  events. On the CPU every time is Triton-interpreter wall time.
- ``oracle_point``: the same model's greedy and speculative tokens against transformers'
  ``generate`` on its torch path (``pmll_lab.models.oracle``), and against our greedy tokens.
- Tables and plots: acceptance against K and draft quality (with ``1 + p + ... + p**(K-1)``),
  the verify step split into kernels, tokens/s speculative against plain, the forms side by side,
  state bytes per sequence, the closing-note headline (B=64, K=4).
"""

from __future__ import annotations

import functools
import math

import matplotlib.pyplot as plt
import pandas as pd
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.carry import GDN_CARRY_CAP
from pmll_lab.sweep import CheckFailed, grid

ARCHS = ("tiny", "qwen3_next_sized")
"""``tiny``: ``tiny_config("qwen3_next")`` (hidden 64, 2 GDN + 1 attention layers, MoE);
``qwen3_next_sized``: ``qwen3_next_sized_config()`` (9 GDN layers of Qwen3-Next's shape, HK=16,
HV=32, kd=vd=128, 3 attention layers, hidden 2048, dense MLP)."""

SECTIONS = ("conv_verify", "gdn_verify", "accept", "gdn_flush", "conv_flush", "conv_chain",
            "gdn_chain", "snapshot_restore", "conv_update", "gdn_decode")
"""Kernel sections a step is split into (``StepTimer`` names; summed over the GDN layers)."""

LABELS = {"plain": "plain decoding", "exact_lazy": "carry exact, lazy",
          "exact_eager": "carry exact, eager", "wy_lazy": "carry WY (reference form), lazy",
          "wy_eager": "carry WY (reference form), eager", "chain": "snapshot chain"}
STYLE = {"plain": ("k", "-", "D"), "exact_lazy": ("C0", "-", "o"),
         "exact_eager": ("C0", "--", "s"), "wy_lazy": ("C1", "-", "o"),
         "wy_eager": ("C1", "--", "s"), "chain": ("C2", "-", "^")}
"""Colour, line style and marker per kernel (form: colour; lazy/eager: line and marker)."""
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def points(grids: list[dict]) -> list[dict]:
    """Expand the notebook's grids (each the product of its axes; ``mode="plain"`` points drop
    the speculative axes), duplicates dropped, order kept."""
    out, seen = [], set()
    for g in grids:
        for p in grid(**g):
            if p.get("mode") == "plain":
                for k in ("form", "lazy", "K", "draft", "p"):
                    p.pop(k, None)
            key = tuple(sorted(p.items()))
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def kernel_name(p: dict) -> str:
    """``plain``, ``chain`` or ``<form>_<lazy|eager>``."""
    if p.get("mode") == "plain":
        return "plain"
    if p["form"] == "chain":
        return "chain"
    return f"{p['form']}_{'lazy' if p['lazy'] else 'eager'}"


# ---- the model and the workload -----------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def model_for(arch: str, dtype: str, seed: int):
    """The random model of ``arch`` in ``dtype`` on ``DEVICE`` (one kept per process)."""
    from pmll_lab.models.qwen3_next import build_model, qwen3_next_sized_config, tiny_config

    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {ARCHS}, got {arch!r}")
    cfg = tiny_config("qwen3_next") if arch == "tiny" else qwen3_next_sized_config()
    return build_model(cfg, seed=seed, dtype=DTYPES[dtype], device=DEVICE)


def prompts_for(seed: int, B: int, prompt_len: int, vocab: int) -> list[torch.Tensor]:
    """``B`` random prompts of ``prompt_len`` tokens (CPU, seeded)."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return [torch.randint(0, vocab, (prompt_len,), generator=g) for _ in range(B)]


def _threads():
    """One intra-op thread on the CPU: tiny matrices, shared cores (7x faster measured)."""
    if DEVICE.type == "cpu":
        torch.set_num_threads(1)


def _runs() -> int:
    return 2 if DEVICE.type == "cuda" else 1


@functools.lru_cache(maxsize=16)
def greedy_run(arch, dtype, seed, B, prompt_len, new_tokens, layout, timed=True):
    """``(tokens, stats)`` of greedy decoding (``timed``: the second run on a GPU)."""
    from pmll_lab.models.generate import greedy_generate

    model = model_for(arch, dtype, seed)
    prompts = prompts_for(seed, B, prompt_len, model.config.vocab_size)
    for _ in range(_runs() if timed else 1):
        out = greedy_generate(model, prompts, max_new_tokens=new_tokens, state_layout=layout,
                              timing=timed, return_stats=True)
    return out


def agreement(tokens: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean over sequences of the fraction of ``ref``'s tokens matched before the first
    difference (1.0: identical)."""
    fr = []
    for a, b in zip(tokens.tolist(), ref.tolist()):
        b = [t for t in b if t >= 0]
        n = 0
        while n < len(b) and n < len(a) and a[n] == b[n]:
            n += 1
        fr.append(n / max(len(b), 1))
    return sum(fr) / len(fr)


def _rows(p: dict, stats, extra: dict) -> list[dict]:
    st = stats.frame()
    kind = "decode" if p.get("mode") == "plain" else "verify"
    steps = st[st.kind == kind]
    s = stats.summary()
    timer = "cuda_events" if DEVICE.type == "cuda" else "interpreter-wall"
    rows = dict(tokens_per_s=s["tokens_per_s"], decode_ms=s["decode_ms"], tokens=s["tokens"],
                steps=s["steps"], step_ms=float(steps.step_ms.mean()) if len(steps) else math.nan,
                step_ms_median=float(steps.step_ms.median()) if len(steps) else math.nan,
                decode_steps=int((st.kind == "decode").sum()),
                verify_steps=int((st.kind == "verify").sum()),
                mean_accept=s["mean_accept"], write_backs=s["write_backs"],
                flushes=s["flushes"], flushed_slots=s["flushed_slots"], restored=s["restored"],
                lazy_steps=int(steps.lazy.eq(True).sum()) if len(steps) else 0, **extra)
    known = 0.0
    for sec in SECTIONS:
        col = f"{sec}_ms"
        if col in steps and len(steps):
            v = float(steps[col].fillna(0).mean())
            rows[col] = v
            known += v
    if len(steps):
        rows["draft_ms"] = float(steps.draft_ms.mean())
        rows["rest_of_model_ms"] = rows["step_ms"] - known - rows["draft_ms"]
    k = kernel_name(p)
    return [dict(kernel=k, metric=m, value=float(v), timer=timer) for m, v in rows.items()]


def generation_point(point: dict) -> list[dict]:
    """One generation (module docstring). Point keys: ``arch``, ``dtype``, ``seed``, ``B``,
    ``prompt_len``, ``new_tokens``, ``layout``, ``mode`` ("plain"/"spec"); speculative points
    also ``form``, ``lazy``, ``K``, ``draft`` ("noisy"/"ngram"), ``p`` (noisy) and
    ``lazy_min_seqs``. Exact and chain forms on a float64 model must return greedy's tokens
    (``CheckFailed`` otherwise); elsewhere the agreement is a measured row (dense layers in
    bf16/fp32 give a row different bits in a batch of ``B*K`` rows than of ``B``)."""
    from pmll_lab.models.generate import speculative_generate

    _threads()
    p = point
    key = (p["arch"], p["dtype"], p["seed"], p["B"], p["prompt_len"], p["new_tokens"],
           p["layout"])
    ref, ref_stats = greedy_run(*key)
    if p["mode"] == "plain":
        return _rows(p, ref_stats, {})
    model = model_for(p["arch"], p["dtype"], p["seed"])
    prompts = prompts_for(p["seed"], p["B"], p["prompt_len"], model.config.vocab_size)
    draft_ref = None
    if p["draft"] == "noisy":
        # the greedy continuation CAP tokens past the budget, so that a sequence's last steps
        # still get K-1 proposals (acceptance not cut short at the end of the reference)
        draft_ref = greedy_run(*key[:5], p["new_tokens"] + GDN_CARRY_CAP, p["layout"],
                               timed=False)[0]
    for _ in range(_runs()):
        toks, stats = speculative_generate(
            model, prompts, max_new_tokens=p["new_tokens"], draft=p["draft"], K=p["K"],
            form=p["form"], lazy=bool(p["lazy"]), state_layout=p["layout"],
            draft_accept=p.get("p") if p["draft"] == "noisy" else None, reference=draft_ref,
            draft_seed=p["seed"], lazy_min_seqs=p.get("lazy_min_seqs", 8), timing=True,
            return_stats=True)
    agree = agreement(toks, ref)
    rows = _rows(p, stats, dict(agreement_with_greedy=agree,
                                plain_tokens_per_s=ref_stats.summary()["tokens_per_s"]))
    if p["form"] in ("exact", "chain") and p["dtype"] == "float64" and agree != 1.0:
        raise CheckFailed(f"{p['form']} form: tokens differ from greedy decoding "
                          f"(agreement {agree:.3f})", rows)
    return rows


def oracle_point(point: dict) -> list[dict]:
    """Greedy and speculative tokens (forms ``point["forms"]``, ``K``, noisy draft ``p``)
    against transformers' ``generate`` on its torch path and against our greedy tokens: per
    kernel ``agreeing`` / ``compared`` tokens, ``eps`` (largest logit difference while they
    agree), ``divergences``, ``unexplained`` (divergences at a top-2 margin above ``2*eps``:
    must be 0, else ``CheckFailed``), ``not_compared``; ``equal_to_greedy`` (1/0)."""
    from pmll_lab.models.generate import greedy_generate, speculative_generate
    from pmll_lab.models.oracle import compare_to_hf, hf_greedy

    _threads()
    p = point
    model = model_for(p["arch"], p["dtype"], p["seed"])
    prompts = prompts_for(p["seed"] + 1, p["B"], p["prompt_len"], model.config.vocab_size)
    hf_t, hf_l = hf_greedy(model, prompts, p["new_tokens"])
    ref, gst = greedy_generate(model, prompts, max_new_tokens=p["new_tokens"],
                               state_layout=p["layout"], output_logits=True, return_stats=True)
    runs = {"plain": (ref, gst)}
    for form in p["forms"]:
        runs[form] = speculative_generate(
            model, prompts, max_new_tokens=p["new_tokens"], draft="noisy", K=p["K"], form=form,
            state_layout=p["layout"], draft_accept=p["p"], reference=ref, output_logits=True,
            return_stats=True)
    rows, bad = [], []
    for name, (toks, st) in runs.items():
        c = compare_to_hf(toks, st.logits, hf_t, hf_l)
        vals = dict(agreeing=c["agreeing"], compared=c["compared"], eps=c["eps"],
                    divergences=len(c["divergences"]), unexplained=c["unexplained"],
                    not_compared=c["not_compared"], min_margin=c["min_margin"],
                    equal_to_greedy=float(torch.equal(toks, ref)))
        rows += [dict(kernel=name, metric=m, value=float(v)) for m, v in vals.items()]
        if c["unexplained"]:
            bad.append(name)
    if bad:
        raise CheckFailed(f"tokens differ from transformers' at a margin above 2*eps: {bad}", rows)
    return rows


# ---- tables and plots ---------------------------------------------------------------------------

def wide(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (point, kernel), one column per metric, ok points only."""
    if df.empty:
        return df
    ok = df[df["status"] == "ok"]
    params = [c for c in ("B", "K", "p", "draft", "form", "lazy", "layout", "mode", "kernel",
                          "new_tokens", "prompt_len", "arch", "dtype", "timer") if c in ok]
    vals = ok.pivot_table(index="point_id", columns="metric", values="value", aggfunc="first")
    w = ok.drop_duplicates("point_id").set_index("point_id")[params].join(vals)
    return w.reset_index(drop=True)


def timer_label(df: pd.DataFrame) -> str:
    if "timer" in df and (df["timer"] == "cuda_events").any():
        return "GPU time (CUDA events), per step"
    return "Triton interpreter wall time (CPU), not GPU speed"


def acceptance_table(w: pd.DataFrame) -> pd.DataFrame:
    """Mean acceptance length per (draft, p, K) of the speculative runs at the largest B, with
    the noisy draft's expectation ``1 + p + ... + p**(K-1)``, the verify and plain decode
    steps (a step where no sequence has a proposal is a plain decode), and the agreement with
    greedy's tokens: the noisy draft is greedy's continuation, so a sequence that leaves
    greedy's path (rounding that differs between a batch of ``B*K`` rows and of ``B``) stops
    matching its draft, and the expectation holds only where the agreement is 1."""
    if w.empty or "mean_accept" not in w:
        return pd.DataFrame()
    s = w[(w.get("mode") == "spec")]
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
    fig, ax = plt.subplots(figsize=(6, 4))
    for j, (p, g) in enumerate(t[t.draft == "noisy"].groupby("p")):
        ax.plot(g.K, g.mean_accept, "o-", color=f"C{j}", label=f"noisy, p = {p:g}")
        ax.plot(g.K, g["expected (noisy)"], "x:", color=f"C{j}")
    ng = t[t.draft == "ngram"]
    if len(ng):
        ax.plot(ng.K, ng.mean_accept, "ks--", label="ngram (prompt lookup)")
    ax.set_xlabel("K (rows verified per step)")
    ax.set_ylabel("mean acceptance length (tokens per step)")
    ax.set_title("Acceptance length (x, dotted: 1 + p + ... + p^(K-1))", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def _main(w: pd.DataFrame, K: int, p: float, layout: str | None = None) -> pd.DataFrame:
    """Plain rows and noisy-draft speculative rows at ``K``, ``p`` (one layout if given)."""
    if w.empty:
        return w
    sel = (w["mode"] == "plain") | ((w["draft"] == "noisy") & (w["K"] == K) & (w["p"] == p))
    out = w[sel]
    if layout is not None:
        out = out[out["layout"] == layout]
    return out


def split_table(w: pd.DataFrame, K: int, p: float) -> pd.DataFrame:
    """Per (B, layout, kernel): the mean step split into kernel sections (ms), the draft and the
    rest of the model (projections, attention, MLP, norms, LM head, host)."""
    m = _main(w, K, p)
    cols = [f"{s}_ms" for s in SECTIONS if f"{s}_ms" in m] + ["draft_ms", "rest_of_model_ms"]
    cols = [c for c in cols if c in m and m[c].fillna(0).abs().sum() > 0]
    return m[["B", "layout", "kernel", *cols]].sort_values(["B", "layout", "kernel"])


def plot_split(t: pd.DataFrame, label: str):
    """Stacked bars of the step split, one panel per B."""
    Bs = sorted(t.B.unique())
    fig, axes = plt.subplots(1, len(Bs), figsize=(4.2 * len(Bs), 4), squeeze=False)
    secs = [c for c in t.columns if c.endswith("_ms")]
    for ax, B in zip(axes[0], Bs):
        g = t[t.B == B]
        names = [f"{LABELS.get(k, k)}\n({lay})" for k, lay in zip(g.kernel, g.layout)]
        bottom = [0.0] * len(g)
        cmap = plt.get_cmap("tab20")
        for j, c in enumerate(secs):
            vals = g[c].fillna(0).tolist()
            ax.bar(range(len(g)), vals, bottom=bottom, color=cmap(j % 20),
                   label=c[:-3].replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(g)), names, rotation=60, fontsize=7, ha="right")
        ax.set_title(f"B = {B}", fontsize=9)
    axes[0][0].set_ylabel(f"ms per step\n{label}", fontsize=8)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    return fig


def throughput_table(w: pd.DataFrame, K: int, p: float) -> pd.DataFrame:
    """Tokens/s of each kernel against plain decoding at the same (B, layout): the end-to-end
    ratio, the acceptance length and the step times. A speculative row's ratio is taken against
    the plain run of its own process (its ``plain_tokens_per_s``: same GPU, minutes apart),
    because the host-bound rest of the model varies by more between the workers of a
    multi-GPU sweep than the ratio's other factors; rows without it use the plain row."""
    m = _main(w, K, p)
    plain = m[m.kernel == "plain"].set_index(["B", "layout"])["tokens_per_s"]
    rows = []
    for _, r in m.iterrows():
        base = r.get("plain_tokens_per_s", math.nan)
        if r.kernel == "plain" or pd.isna(base):
            base = plain.get((r.B, r.layout), math.nan)
        rows.append(dict(B=int(r.B), layout=r.layout, kernel=r.kernel,
                         tokens_per_s=r.tokens_per_s, plain_tokens_per_s=base,
                         speedup_vs_plain=r.tokens_per_s / base,
                         mean_accept=r.get("mean_accept", math.nan), step_ms=r.step_ms,
                         agreement_with_greedy=r.get("agreement_with_greedy", math.nan)))
    return pd.DataFrame(rows).sort_values(["B", "layout", "kernel"]).reset_index(drop=True)


def plot_throughput(t: pd.DataFrame, label: str):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (k, lay), g in t.groupby(["kernel", "layout"]):
        c, ls, mk = STYLE.get(k, ("C7", "-", "o"))
        lab = f"{LABELS.get(k, k)} ({lay})"
        fill = "full" if lay == "kv" else "none"
        axes[0].plot(g.B, g.tokens_per_s, marker=mk, fillstyle=fill, color=c, ls=ls, label=lab)
        if k != "plain":
            axes[1].plot(g.B, g.speedup_vs_plain, marker=mk, fillstyle=fill, color=c, ls=ls,
                         label=lab)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("B (sequences decoded together)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel(f"tokens/s (all sequences)\n{label}", fontsize=8)
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[1].set_ylabel("speculative / plain tokens/s")
    axes[0].set_title("filled: K-major state, open: V-major", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[1].legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    return fig


def forms_table(w: pd.DataFrame, K: int, p: float) -> pd.DataFrame:
    """The verify forms side by side per (B, layout): verify kernel time per step (conv + GDN
    verify or chain, accept, flushes, snapshot copy-back), write-backs and restored snapshots
    per verify step, flushes, acceptance and tokens/s."""
    m = _main(w, K, p)
    m = m[m["mode"] == "spec"]
    rows = []
    for _, r in m.iterrows():
        vals = [r.get(f"{s}_ms") for s in SECTIONS if s not in ("conv_update", "gdn_decode")]
        ver = sum(v for v in vals if v is not None and not pd.isna(v))
        n = max(r.verify_steps, 1)
        rows.append(dict(B=int(r.B), layout=r.layout, kernel=r.kernel,
                         verify_kernels_ms=ver, step_ms=r.step_ms,
                         write_backs_per_step=r.write_backs / n, restored_per_step=r.restored / n,
                         flushes=r.flushes, flushed_slots=r.flushed_slots,
                         lazy_steps=r.lazy_steps, verify_steps=r.verify_steps,
                         mean_accept=r.mean_accept, tokens_per_s=r.tokens_per_s))
    return pd.DataFrame(rows).sort_values(["B", "layout", "kernel"]).reset_index(drop=True)


def bytes_table(K: int = 4) -> pd.DataFrame:
    """State bytes per sequence (KiB, summed over the GDN layers) for the tiny test model, the
    Qwen3-Next-sized stack, and the full Qwen3-Next-80B / Qwen3.5-27B-class configs as
    transformers defines their defaults (bf16 models): GDN states, conv windows, the carry's
    stash (independent of K), the chain's ``K-1`` snapshots, attention KV per token."""
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
        n_gdn = sum(t == "linear_attention" for t in cfg.layer_types)
        rows.append({"model": name, "GDN layers": n_gdn,
                     **{f"{k} KiB": v / 1024 for k, v in b.items()},
                     f"snapshots(K={K}) / stash": b["snapshots"] / b["carry_stash"]})
    return pd.DataFrame(rows)


def oracle_table(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[df["status"].isin(["ok", "failed"])]
    if ok.empty or "metric" not in ok:
        return pd.DataFrame()
    return ok.pivot_table(index="kernel", columns="metric", values="value",
                          aggfunc="first").reset_index()


def headline(w: pd.DataFrame, *, B: int = 64, K: int = 4, p: float = 0.8) -> pd.DataFrame:
    """The closing-note figures at ``B``, ``K``: acceptance length, verify kernel time per step
    per form and layout, tokens/s and its ratio to plain decoding."""
    f = forms_table(w, K, p)
    t = throughput_table(w, K, p)
    if f.empty:
        return f
    f = f[f.B == B]
    t = t[t.B == B][["layout", "kernel", "speedup_vs_plain"]]
    return f.merge(t, on=["layout", "kernel"], how="left")


def conclusion(w: pd.DataFrame, oracle: pd.DataFrame, K: int, p: float, label: str) -> str:
    """A few sentences from the results (markdown)."""
    lines = []
    if not oracle.empty and "unexplained" in oracle:
        for _, r in oracle.iterrows():
            lines.append(f"- {LABELS.get(r.kernel, r.kernel)}: {int(r.agreeing)} of "
                         f"{int(r.compared)} compared tokens equal transformers' greedy tokens; "
                         f"{int(r.divergences)} divergence(s), {int(r.unexplained)} beyond the "
                         f"measured logit error (eps = {r.eps:.1e}); equal to our greedy tokens: "
                         f"{'yes' if r.equal_to_greedy else 'no'}.")
    t = throughput_table(w, K, p)
    if not t.empty:
        for B, g in t.groupby("B"):
            parts = [f"{LABELS.get(k, k)} {r.speedup_vs_plain:.2f}x (accept {r.mean_accept:.2f})"
                     for k, r in g[g.kernel != "plain"].set_index("kernel").iterrows()
                     if not pd.isna(r.speedup_vs_plain)]
            if parts:
                lines.append(f"- B = {B}, K = {K}, p = {p}: tokens/s against plain decoding: "
                             + "; ".join(parts) + f" ({label}).")
    if "interpreter" in label:
        lines.append("- These are Triton-interpreter wall times on the CPU: they rank nothing on "
                     "a GPU; run the full preset there.")
    return "\n".join(lines) or "No results."
