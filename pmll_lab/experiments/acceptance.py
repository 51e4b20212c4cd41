"""The acceptance process and the carry protocol's pending counts (host arithmetic; SPEC §3b).

A verify of ``K`` rows accepts ``1 +`` its leading accepted drafts, each with probability
``alpha`` (``E = 1 + alpha + ... + alpha^(K-1)``), or nothing with probability ``p_zero``; the
eager form writes back whenever ``p > 0``, the lazy one when ``p + K > CAP``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from pmll_lab.carry import GDN_CARRY_CAP

CAP = GDN_CARRY_CAP
MODES = ("eager", "lazy")
SIM_MODES = MODES + ("lazy+spec",)
"""The simulation's modes: ``MODES`` and lazy with the speculative store (SPEC §3b)."""


def mean_accept_len(alpha: float, K: int) -> float:
    """``E[a] = 1 + alpha + ... + alpha^(K-1)`` (no ``a = 0``)."""
    return float(sum(alpha ** i for i in range(K)))


def alpha_for_mean(mean_len: float, K: int) -> float:
    """The per-draft acceptance probability whose mean acceptance length at ``K`` rows is
    ``mean_len`` (``1 <= mean_len <= K``), by bisection."""
    if not 1.0 <= mean_len <= K:
        raise ValueError(f"mean_len: must lie in [1, K={K}], got {mean_len}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_accept_len(mid, K) < mean_len else (lo, mid)
    return (lo + hi) / 2


def accept_counts(rng: np.random.Generator, n: int, K: int, alpha: float,
                  p_zero: float = 0.0) -> np.ndarray:
    """``n`` accepted counts in ``0..K``: ``1 +`` leading accepted drafts (each ``alpha``), or 0
    with probability ``p_zero``."""
    drafts = (rng.random((n, K - 1)) < alpha).cumprod(axis=1).sum(axis=1) if K > 1 else np.zeros(n, int)
    a = 1 + drafts.astype(np.int64)
    a[rng.random(n) < p_zero] = 0
    return a


def protocol_step(p: np.ndarray, a: np.ndarray, K: int, lazy: bool, cap: int = CAP,
                  spec: bool = False):
    """One verify + accept on host pending counts: returns ``(write_back, p_new)``; ``spec``:
    with the speculative store (SPEC §3b), a full acceptance (``a == K``) leaves nothing
    pending."""
    wb = (p + K > cap) if lazy else (p > 0)
    p_new = np.where(wb, a, p + a)
    return wb, (np.where(a == K, 0, p_new) if spec else p_new)


def simulate(K: int, alpha: float, lazy: bool, *, steps: int = 4000, seqs: int = 64,
             p_zero: float = 0.0, cap: int = CAP, seed=0, burn_in: int = 50,
             spec: bool = False) -> dict:
    """Run ``seqs`` independent slots through ``steps`` verifies (``seed``: ``default_rng``'s;
    ``spec``: with the speculative store, ``protocol_step``);
    statistics after ``burn_in``: ``wb_freq`` (write-backs per verify; ``wb_count`` of them),
    ``mean_folded`` (pending rows folded per verify), ``mean_accept``, ``hist`` / ``p_hist``
    (counts / distribution of ``p`` before a verify, ``[cap+1]``)."""
    rng = np.random.default_rng(seed)
    p = np.zeros(seqs, dtype=np.int64)
    wbs, folded, acc, wb_count = [], [], [], 0
    hist = np.zeros(cap + 1)
    for step in range(steps + burn_in):
        a = accept_counts(rng, seqs, K, alpha, p_zero)
        wb, p_new = protocol_step(p, a, K, lazy, cap, spec)
        if step >= burn_in:
            wbs.append(wb.mean())
            wb_count += int(wb.sum())
            folded.append(p.mean())
            acc.append(a.mean())
            hist += np.bincount(p, minlength=cap + 1)[:cap + 1]
        p = p_new
    return dict(wb_freq=float(np.mean(wbs)), mean_folded=float(np.mean(folded)),
                mean_accept=float(np.mean(acc)), p_hist=hist / hist.sum(), hist=hist,
                wb_count=wb_count)


def steady_pending(rng: np.random.Generator, B: int, K: int, alpha: float, lazy: bool,
                   p_zero: float = 0.0, cap: int = CAP, burn_in: int = 64) -> np.ndarray:
    """``B`` pending counts drawn from the protocol's stationary distribution (each slot run
    through ``burn_in`` steps)."""
    p = np.zeros(B, dtype=np.int64)
    for _ in range(burn_in):
        _, p = protocol_step(p, accept_counts(rng, B, K, alpha, p_zero), K, lazy, cap)
    return p


def simulation_table(Ks, alphas, *, p_zero: float = 0.0, steps: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per ``(K, alpha, mode)``: mean acceptance length, write-back frequency, rows
    folded per verify; modes ``SIM_MODES``."""
    rows = []
    for K in Ks:
        for alpha in alphas:
            for mode in SIM_MODES:
                s = simulate(K, alpha, mode != "eager", steps=steps, p_zero=p_zero, seed=seed,
                             spec=mode == SIM_MODES[2])
                rows.append(dict(K=K, alpha=alpha, mode=mode, mean_accept=s["mean_accept"],
                                 wb_freq=s["wb_freq"], mean_folded=s["mean_folded"]))
    return pd.DataFrame(rows)


# ---- the roofline notebook's acceptance process ------------------------------------------------


@lru_cache(maxsize=64)
def acceptance(K: int, mean_accept: float = 3.3, accept_K: int = 4, cap: int = CAP,
               seed: int = 0, seqs: int = 512, steps: int = 400, burn_in: int = 20) -> dict:
    """Host simulation of ``seqs`` slots' pending counts over ``burn_in + steps`` verifies:
    ``alpha``, ``mean_accept`` (at this ``K``) and per form ``eager`` / ``lazy`` ``{form}_wb``
    (write-backs per verify), ``{form}_mean_pend``, ``{form}_hist`` (tuple over ``p = 0..cap``)."""
    if not 1 <= K <= cap:
        raise ValueError(f"K: must lie in [1, CAP={cap}], got {K}")
    alpha = alpha_for_mean(mean_accept, accept_K)
    out = {"alpha": alpha, "mean_accept": mean_accept_len(alpha, K), "K": K}
    for form in ("eager", "lazy"):
        s = simulate(K, alpha, form == "lazy", steps=steps, seqs=seqs, cap=cap,
                     seed=[seed, K, form == "lazy"], burn_in=burn_in)
        hist = s["hist"]
        out[f"{form}_wb"] = s["wb_count"] / (steps * seqs)
        out[f"{form}_hist"] = tuple(hist / hist.sum())
        out[f"{form}_mean_pend"] = float((np.arange(cap + 1) * hist).sum() / hist.sum())
    return out


def acceptance_table(Ks, mean_accept: float = 3.3, accept_K: int = 4, seed: int = 0) -> pd.DataFrame:
    """One row per ``K``: ``alpha``, mean accepted length, write-back frequency and mean pending
    rows of the eager and lazy forms: the frequencies the amortised lazy figures use."""
    rows = []
    for K in sorted(set(int(k) for k in Ks)):
        a = acceptance(K, mean_accept, accept_K, seed=seed)
        rows.append({"K": K, "alpha": a["alpha"], "mean accepted rows": a["mean_accept"],
                     "eager write-back freq": a["eager_wb"], "eager mean pending": a["eager_mean_pend"],
                     "lazy write-back freq": a["lazy_wb"], "lazy mean pending": a["lazy_mean_pend"]})
    return pd.DataFrame(rows).round(3)


def draw_pending(hist, B: int, K: int, rng: np.random.Generator, *, write_back: bool | None,
                 lazy: bool = True, cap: int = CAP) -> np.ndarray:
    """``B`` pending counts drawn from ``hist`` (over ``0..cap``); with ``write_back`` True/False
    conditioned on the lazy verify writing back / not (``p + K > cap``). When the condition has
    no mass (e.g. no pending count avoids a write-back at ``K = CAP``) the nearest legal count is
    used: ``p = 0`` without a write-back, ``p = cap - K + 1`` with one."""
    h = np.asarray(hist, dtype=float).copy()
    p = np.arange(cap + 1)
    if write_back is not None:
        wb = (p + K > cap) if lazy else (p > 0)
        h[wb != write_back] = 0.0
    if h.sum() <= 0:
        return np.full(B, 0 if not write_back else cap - K + 1, dtype=np.int64)
    return rng.choice(cap + 1, size=B, p=h / h.sum()).astype(np.int64)
