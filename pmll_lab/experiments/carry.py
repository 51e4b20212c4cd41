"""The carry_protocol notebook: acceptance model, protocol runs, verify sweep, byte budgets.

Four parts (SPEC §3b, §3c, §4; issue 4):

1. **Acceptance model and protocol simulation** (host arithmetic, no kernels). A verify of ``K``
   rows checks the last accepted token plus ``K-1`` drafts; ``a = 1 +`` the number of leading
   drafts accepted, each with probability ``alpha`` (so ``E[a] = 1 + alpha + ... + alpha^(K-1)``;
   Qwen3-Next's MTP mean acceptance length ~3.3 at ``K = 4`` gives ``alpha ~ 0.875``), and with
   probability ``p_zero`` a sequence accepts nothing (``a = 0``). ``simulate`` runs the pending
   count of one slot through many steps of the protocol (eager: write back whenever ``p > 0``;
   lazy: when ``p + K > CAP``): write-back frequency, rows folded per verify, and the stationary
   distribution of ``p`` that the timing draws its pending counts from.
2. **Protocol run** (``protocol_point``): a stack of layers (conv twin + GDN) driven by
   ``SpecDecodeStep`` on the real kernels, batch widths crossing ``lazy_min_seqs``, accepted
   counts from the model. Checked: every ``engaged`` flag equals the host simulation of the same
   accepted counts; accepted rows' outputs and the folded states equal plain decoding
   (``conv_update`` + ``gdn_decode`` per token) bitwise for the exact form, within ``1e-4`` for WY.
3. **Verify sweep** (``verify_point``): for one ``(K, B, HK, HV, head_dim, dtype, alpha)``, the
   slots hold pending counts drawn from part 1's stationary distribution (per mode), the stash
   holds realistic rows. Checks first (exact: bitwise against folding the pending rows then ``K``
   ``gdn_decode`` launches; both forms against the float64 protocol reference on the first
   ``ref_seqs`` sequences; WY against exact), then times ``carry_{exact,wy}_{eager,lazy}``, the
   snapshot chain (``gdn_chain`` with ``intermediate``) and, on a GPU where fla-core imports, FLA's
   ``fused_recurrent_gated_delta_rule`` over the same K rows. GB/s over SPEC §4's bytes:
   carry ``Hb`` read, ``Hb`` written per write-back (counted at the launch's actual write-backs),
   ``p`` stash rows read, ``K`` stash rows written, inputs and outputs; chain ``(K+1)*Hb``; FLA
   ``2*Hb`` (state in and out), each plus inputs and outputs.
4. **Byte budgets** per slot and layer for real model configurations: stash (GDN fp32 rows and
   the conv's input rows) against the snapshots of the chain (states and conv windows).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, copy_bandwidth, error_rows, errors
from pmll_lab.carry import (
    GDN_CARRY_CAP,
    CarryLayer,
    GdnCarry,
    SpecDecodeStep,
    gdn_carry_flush,
    gdn_carry_verify,
)
from pmll_lab.inputs import conv_inputs, gdn_inputs
from pmll_lab.reference import carry as ref
from pmll_lab.experiments.common import error_strip, gating_inputs
from pmll_lab.experiments.common import failed_points as _failed_points
from pmll_lab.experiments.gdn import (
    LAYOUT_NAMES, LAYOUT_STYLE, LAYOUTS, TIMER_LABELS, best_timer, flashinfer_snapshot_check,
    points, speed_rows, timed, timings, with_layout,
)
from pmll_lab.peers import (  # noqa: F401  (flashinfer_status: for the notebook)
    fla_available, fla_runner, flashinfer_available, flashinfer_status, flashinfer_supports,
    flashinfer_version,
)
from pmll_lab.sweep import CheckFailed

CAP = GDN_CARRY_CAP
O_TOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
"""rel_l2 tolerance of outputs against the float64 reference, per input dtype (tests/test_carry.py)."""
STATE_TOL = 1e-5
"""rel_l2 tolerance of fp32 states and stash rows against the float64 reference."""
WY_TOL = 1e-4
"""rel_l2 tolerance of the WY form against the exact form / plain decoding (fp32 rounding)."""

MODES = ("eager", "lazy")
FORMS = ("exact", "wy")
CARRY_KERNELS = tuple(f"carry_{f}_{m}" for f in FORMS for m in MODES)
KERNELS = CARRY_KERNELS + ("chain_snapshots", "fla_fused_recurrent", "flashinfer_mtp_snapshots")
LABELS = {
    "carry_exact_eager": "carry exact, eager", "carry_exact_lazy": "carry exact, lazy",
    "carry_wy_eager": "carry WY, eager", "carry_wy_lazy": "carry WY, lazy",
    "chain_snapshots": "chain + K-1 snapshots", "fla_fused_recurrent": "FLA fused_recurrent (no rollback)",
    "flashinfer_mtp_snapshots": "FlashInfer mtp + K snapshots",
}
STYLE = {"carry_exact_eager": ("C0", "--"), "carry_exact_lazy": ("C0", "-"),
         "carry_wy_eager": ("C1", "--"), "carry_wy_lazy": ("C1", "-"),
         "chain_snapshots": ("C2", "-"), "fla_fused_recurrent": ("C3", ":"),
         "flashinfer_mtp_snapshots": ("C6", "-.")}

MODEL_CONFIGS = [
    dict(model="Qwen3-Next-80B-A3B", HK=16, HV=32, kd=128, vd=128, d_conv=4, gdn_layers=36),
]
"""Real configurations for the byte budget (Qwen3-Next-80B-A3B config.json: 16 key heads,
32 value heads, head dims 128, conv kernel 4; 48 layers of which 36 are Gated DeltaNet)."""
COMPILE_KEYS = ("K", "head_dim", "dtype", "state_layout")
"""Point keys that decide which kernels a point compiles: ``run_sweep(affinity=...)`` keeps
points that share them on one Dask worker, so each kernel compiles once per sweep."""


# ---- 1. acceptance model and protocol simulation ----------------------------------------------

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


def protocol_step(p: np.ndarray, a: np.ndarray, K: int, lazy: bool, cap: int = CAP):
    """One verify + accept on host pending counts: returns ``(write_back, p_new)``."""
    wb = (p + K > cap) if lazy else (p > 0)
    return wb, np.where(wb, a, p + a)


def simulate(K: int, alpha: float, lazy: bool, *, steps: int = 4000, seqs: int = 64,
             p_zero: float = 0.0, cap: int = CAP, seed: int = 0, burn_in: int = 50) -> dict:
    """Run ``seqs`` independent slots through ``steps`` verifies; statistics after ``burn_in``:
    ``wb_freq`` (write-backs per verify), ``mean_folded`` (pending rows folded per verify),
    ``mean_accept``, ``p_hist`` (stationary distribution of ``p`` before a verify, ``[cap+1]``)."""
    rng = np.random.default_rng(seed)
    p = np.zeros(seqs, dtype=np.int64)
    wbs, folded, acc = [], [], []
    hist = np.zeros(cap + 1)
    for step in range(steps + burn_in):
        a = accept_counts(rng, seqs, K, alpha, p_zero)
        wb, p_new = protocol_step(p, a, K, lazy, cap)
        if step >= burn_in:
            wbs.append(wb.mean())
            folded.append(p.mean())
            acc.append(a.mean())
            hist += np.bincount(p, minlength=cap + 1)[:cap + 1]
        p = p_new
    return dict(wb_freq=float(np.mean(wbs)), mean_folded=float(np.mean(folded)),
                mean_accept=float(np.mean(acc)), p_hist=hist / hist.sum())


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
    folded per verify."""
    rows = []
    for K in Ks:
        for alpha in alphas:
            for mode in MODES:
                s = simulate(K, alpha, mode == "lazy", steps=steps, p_zero=p_zero, seed=seed)
                rows.append(dict(K=K, alpha=alpha, mode=mode, mean_accept=s["mean_accept"],
                                 wb_freq=s["wb_freq"], mean_folded=s["mean_folded"]))
    return pd.DataFrame(rows)


def plot_simulation(sim: pd.DataFrame, mark_alpha: float | None = None):
    """Write-back frequency and rows folded per verify against the mean acceptance length,
    one colour per K, eager dashed, lazy solid."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, K in enumerate(sorted(sim["K"].unique())):
        for mode, ls in (("eager", "--"), ("lazy", "-")):
            s = sim[(sim["K"] == K) & (sim["mode"] == mode)].sort_values("mean_accept")
            axes[0].plot(s["mean_accept"], s["wb_freq"], ls, marker="o", ms=3, color=f"C{i}",
                         label=f"K={K}, {mode}")
            axes[1].plot(s["mean_accept"], s["mean_folded"], ls, marker="o", ms=3, color=f"C{i}")
    axes[0].set_ylabel("write-backs per verify")
    axes[1].set_ylabel("pending rows folded per verify")
    for ax in axes:
        ax.set_xlabel("mean accepted rows per verify (acceptance length)")
        if mark_alpha is not None:
            ax.axvline(mean_accept_len(mark_alpha, 4), color="k", lw=0.8, ls=":")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"Protocol simulation (CAP={CAP}); dotted: the default acceptance at K=4", fontsize=10)
    fig.tight_layout()
    return fig


# ---- shared helpers -----------------------------------------------------------------------

def fill_stash(carry: GdnCarry, seed: int) -> None:
    """Realistic stash rows for pending counts set by hand: unit keys, log decays <= 0,
    corrections ``u`` of the scale a verify produces."""
    gen = torch.Generator().manual_seed(seed)
    carry.u.copy_((torch.randn(carry.u.shape, generator=gen) * 0.3).to(carry.device))
    carry.g.copy_((-F.softplus(torch.randn(carry.g.shape, generator=gen))).to(carry.device))
    carry.k.copy_(ref.l2norm(torch.randn(carry.k.shape, generator=gen)).float().to(carry.device))


def clone_carry(c: GdnCarry) -> GdnCarry:
    return GdnCarry(c.buf.clone(), c.pend.clone(), c.num_v_heads, c.k_dim, c.v_dim, c.cap)


def _itemsize(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def stash_row_bytes(HV: int, kd: int, vd: int) -> int:
    """Bytes of one stash row (all value heads): ``u [HV, vd]``, ``g [HV]``, ``k [HV, kd]`` fp32."""
    return 4 * (HV * vd + HV + HV * kd)


def row_io_bytes(HK, HV, kd, vd, dtype) -> int:
    """One row's inputs (q, k, v in ``dtype``; g, beta fp32) and output (``dtype``)."""
    es = _itemsize(dtype)
    return (2 * HK * kd + HV * vd) * es + 2 * HV * 4 + HV * vd * es


def carry_verify_bytes(pend, write_back, K, HK, HV, kd, vd, dtype) -> int:
    """SPEC §4 bytes of one carry verify: per sequence ``Hb`` read, ``Hb`` written if it writes
    back, ``p`` stash rows read, ``K`` written, ``K`` rows of inputs/outputs, and three int32
    (slot, pend, engaged)."""
    hb = 4 * HV * kd * vd
    pend = np.asarray(pend)
    wb = np.asarray(write_back)
    B = len(pend)
    return int(B * hb + wb.sum() * hb + (pend.sum() + B * K) * stash_row_bytes(HV, kd, vd)
               + B * K * row_io_bytes(HK, HV, kd, vd, dtype) + 12 * B)


def chain_bytes(B, K, HK, HV, kd, vd, dtype) -> int:
    """Snapshot chain: ``(K+1)*Hb`` per sequence plus inputs/outputs and the slot index."""
    return B * ((K + 1) * 4 * HV * kd * vd + K * row_io_bytes(HK, HV, kd, vd, dtype) + 4)


def fla_bytes(B, K, HK, HV, kd, vd, dtype) -> int:
    """FLA fused recurrent over K rows: state in and out (``2*Hb``) plus inputs/outputs."""
    return B * (2 * 4 * HV * kd * vd + K * row_io_bytes(HK, HV, kd, vd, dtype))


# ---- 3. the verify sweep ----------------------------------------------------------------------


def _decode_reference(state, carry, x, K, slots, layout="kv"):
    """Plain decoding of this verify's rows: fold each slot's pending rows (flush), then ``K``
    ``gdn_decode`` launches, in ``layout``. Returns ``(o [B, K, HV, vd], folded state)``."""
    from pmll_lab.gdn import gdn_decode

    st = state.clone()
    gdn_carry_flush([st], [carry], slots, state_layout=layout)
    folded = st.clone()
    outs = [gdn_decode(st, x["q"][:, t], x["k"][:, t], x["v"][:, t], x["g"][:, t],
                       x["beta"][:, t], state_indices=slots, state_layout=layout)
            for t in range(K)]
    return torch.stack(outs, 1), folded


def verify_point(point: dict) -> list[dict]:
    """Check, then time, every verify kernel at one point (see the module docstring).

    Point keys: ``K, B, HK, HV, head_dim, dtype``; optional ``state_layout`` (``"kv"``: state
    ``[S, HV, kd, vd]``; ``"vk"``: ``[S, HV, vd, kd]``), ``alpha`` (default 0.875), ``p_zero``
    (0), ``seed`` (0), ``ref_seqs`` (sequences checked against the float64 reference, default 4),
    ``baselines`` (default True: also check and time the snapshot chain and, on a GPU, the
    peers: FLA at ``"kv"``, FlashInfer's snapshot verify at ``"vk"``). Raises ``CheckFailed``
    (nothing timed) when one of our kernels fails a check."""
    K, B, HK, HV, D = (int(point[n]) for n in ("K", "B", "HK", "HV", "head_dim"))
    dname = point.get("dtype", "bfloat16")
    dtype = getattr(torch, dname)
    layout = point.get("state_layout", "kv")
    if layout not in LAYOUTS:
        raise ValueError(f"state_layout: must be one of {LAYOUTS}, got {layout!r}")
    lay = {"state_layout": layout}
    alpha = float(point.get("alpha", 0.875))
    p_zero = float(point.get("p_zero", 0.0))
    seed = int(point.get("seed", 0))
    baselines = bool(point.get("baselines", True))
    n_ref = min(B, int(point.get("ref_seqs", 4)))
    x = gdn_inputs(seed, B, HK, HV, D, D, rows=K, dtype=dtype)
    gate = gating_inputs(seed + 11, (B, K), HV)
    x["g"], x["beta"] = gate["g"], gate["beta"]
    state_kv, slots = x["state"], x["state_indices"]
    state0 = state_kv if layout == "kv" else state_kv.transpose(-1, -2).contiguous()

    def in_layout(t):                   # a K-major state tensor [..., kd, vd] seen in `layout`
        return t if layout == "kv" else t.transpose(-1, -2)

    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    rng = np.random.default_rng(seed + 1)
    base = GdnCarry.empty(B, HV, D, D)
    fill_stash(base, seed + 2)
    rows: list[dict] = []
    runs = {}
    otol = O_TOL[dname]
    sel = slots[:n_ref].long()

    for mode in MODES:
        lazy = mode == "lazy"
        pend = steady_pending(rng, B, K, alpha, lazy, p_zero)
        carry_m = clone_carry(base)
        carry_m.pend[slots.long()] = torch.as_tensor(pend, dtype=torch.int32, device=DEVICE)
        wb = (pend + K > CAP) if lazy else (pend > 0)
        o_dec, folded = _decode_reference(state0, carry_m, x, K, slots, layout)
        # float64 protocol reference on the first n_ref sequences (a sub-problem of their slots;
        # K-major, mutated in place by the reference)
        sub_state = state_kv[sel].double().cpu()
        sub_carry = ref.RefCarry(u=carry_m.u[sel].double().cpu(), g=carry_m.g[sel].double().cpu(),
                                 k=carry_m.k[sel].double().cpu(),
                                 pend=carry_m.pend[sel].long().cpu())
        o_ref, eng_ref = ref.verify(sub_state, sub_carry, *(t[:n_ref].cpu() for t in args),
                                    torch.arange(n_ref), lazy=lazy)
        for form in FORMS:
            name = f"carry_{form}_{mode}"
            st, c = state0.clone(), clone_carry(carry_m)
            o, eng = gdn_carry_verify(st, c, *args, slot_tab=slots, form=form, lazy=lazy,
                                      validate=True, eager_max_pending=None, **lay)
            eng_ok = eng.cpu().tolist() == np.where(wb, 2, 1).tolist()
            rows.append({"kernel": name, "metric": "engaged_as_protocol", "value": float(eng_ok),
                         "passed": eng_ok, "what": "engaged"})
            rows += error_rows(name, o[:n_ref], o_ref, tol=otol, what="o")
            rows += error_rows(name, st[sel], in_layout(sub_state), tol=STATE_TOL, what="state")
            rows += error_rows(name, c.u[sel], sub_carry.u, tol=STATE_TOL if form == "exact" else WY_TOL,
                               what="stash u")
            wbm = torch.as_tensor(wb, device=DEVICE)
            if form == "exact":
                ok_o = bitwise_equal(o, o_dec)
                ok_s = bitwise_equal(st[slots.long()][wbm], folded[slots.long()][wbm])
                for what, ok in (("o", ok_o), ("written-back state", ok_s)):
                    rows.append({"kernel": name, "metric": "bitwise_vs_decode", "value": float(ok),
                                 "passed": ok, "what": what})
            else:
                rows += error_rows(name, o, runs[f"carry_exact_{mode}"][2], tol=max(otol, WY_TOL),
                                   what="o vs exact")
            rows.append({"kernel": name, "metric": "write_back_frac", "value": float(wb.mean())})
            rows.append({"kernel": name, "metric": "mean_pending", "value": float(pend.mean())})
            runs[name] = (st, c, o, lazy, carry_verify_bytes(pend, wb, K, HK, HV, D, D, dtype))
        del o_dec, folded
    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r['what']}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", rows)

    timed_fns = []
    for name in CARRY_KERNELS:
        st, c, _, lazy, nbytes = runs[name]
        form = name.split("_")[1]

        def run(st=st, c=c, lazy=lazy, form=form):
            gdn_carry_verify(st, c, *args, slot_tab=slots, form=form, lazy=lazy, **lay)

        timed_fns.append((name, run, nbytes, {}))

    if baselines:
        # the snapshot chain (checked against plain decoding of the same rows from the same
        # state, float64)
        from pmll_lab.gdn import gdn_chain

        st_c = state0.clone()
        inter = torch.empty(B, K - 1, HV, D, D, device=DEVICE)
        o_c = gdn_chain(st_c, *args, state_indices=slots, intermediate=inter, **lay)
        o_plain = o_ref_plain(state_kv, x, sel, n_ref)
        crows = error_rows("chain_snapshots", o_c[:n_ref], o_plain, tol=otol, what="o")
        rows += crows
        _require(rows)
        timed_fns.append(("chain_snapshots",
                          lambda: gdn_chain(st_c, *args, state_indices=slots, intermediate=inter,
                                            **lay),
                          chain_bytes(B, K, HK, HV, D, D, dtype), {}))

        if layout == "kv" and fla_available():
            run_fla, _ = fla_runner(*args, state0[slots.long()].contiguous(), scale=D ** -0.5)
            o_f, _ = run_fla()
            frows = error_rows("fla_fused_recurrent", o_f[:n_ref], o_plain, tol=otol, what="o")
            rows += frows
            if all(r["passed"] for r in frows):
                timed_fns.append(("fla_fused_recurrent", run_fla,
                                  fla_bytes(B, K, HK, HV, D, D, dtype), {}))
        if (layout == "vk" and K >= 2 and flashinfer_available()
                and flashinfer_supports(D, dname)):
            firows, run_fi = flashinfer_snapshot_check(x, gate, state0, o_c, st_c[slots.long()],
                                                       inter, otol)
            rows += firows
            if run_fi is not None:
                timed_fns.append(("flashinfer_mtp_snapshots", run_fi,
                                  chain_bytes(B, K, HK, HV, D, D, dtype),
                                  {"flashinfer_version": flashinfer_version()}))

    # timing, after every check passed (the verify does not change pend: each call is the same)
    for name, fn, nbytes, extra in timed_fns:
        rows += speed_rows(name, timings(fn), nbytes, **extra)
    return rows


def _require(rows: list[dict]) -> None:
    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r['what']}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", rows)


def o_ref_plain(state0, x, sel, n):
    """Float64 plain decoding of the K rows of the first ``n`` sequences from their stored state
    (no pending rows): the reference of kernels that start from the state (chain, FLA)."""
    return ref.decode_tokens(state0[sel].double().cpu(),
                             *(x[k][:n].cpu() for k in ("q", "k", "v", "g", "beta")), torch.arange(n))


# ---- 2. the protocol run on the real kernels --------------------------------------------------

def protocol_point(point: dict) -> list[dict]:
    """A stack of ``L`` layers (conv twin + GDN) through ``steps`` steps of ``SpecDecodeStep``
    (see the module docstring). Point keys: ``form, L, S, HK, HV, head_dim, dtype, steps,
    widths (list of batch widths cycled), K, alpha, p_zero, lazy_min_seqs, eager_max_pending,
    seed``, optional ``state_layout`` (``"kv"``; ``"vk"``: every layer's state V-major, plain
    decoding too). Rows: checks (``bitwise_vs_plain`` or rel_l2 vs plain,
    ``engaged_as_simulated``) and counts (write-backs, flushes, host syncs, steps per mode)."""
    from pmll_lab.conv import ConvCarry, conv_update
    from pmll_lab.gdn import gdn_decode

    form = point["form"]
    L, S, HK, HV, D, K = (int(point[n]) for n in ("L", "S", "HK", "HV", "head_dim", "K"))
    dtype = getattr(torch, point.get("dtype", "bfloat16"))
    steps, seed = int(point["steps"]), int(point.get("seed", 0))
    alpha, p_zero = float(point.get("alpha", 0.875)), float(point.get("p_zero", 0.0))
    widths = [int(w) for w in point["widths"]]
    layout = point.get("state_layout", "kv")
    if layout not in LAYOUTS:
        raise ValueError(f"state_layout: must be one of {LAYOUTS}, got {layout!r}")
    dim, qk = 2 * HK * D + HV * D, 2 * HK * D
    rng = np.random.default_rng(seed)
    pyrng = random.Random(seed)
    layers, plain = [], []
    for layer in range(L):
        st = gdn_inputs(seed + 100 + layer, 1, HK, HV, D, D, slots=S, dtype=dtype)["state"]
        if layout == "vk":
            st = st.transpose(-1, -2).contiguous()
        ci = conv_inputs(seed + 200 + layer, 1, dim, slots=S, dtype=dtype)
        layers.append(CarryLayer(st.clone(), GdnCarry.empty(S, HV, D, D),
                                 conv_state=ci["conv_state"].clone(),
                                 conv_carry=ConvCarry.empty(S, dim, dtype=dtype),
                                 conv_weight=ci["weight"], conv_bias=ci["bias"], num_k_heads=HK,
                                 state_layout=layout))
        plain.append((st.clone(), ci["conv_state"].clone()))
    step = SpecDecodeStep(layers, form=form, lazy_min_seqs=point.get("lazy_min_seqs", 8),
                          eager_max_pending=point.get("eager_max_pending", 4), validate=True)
    host_p = np.zeros(S, dtype=np.int64)           # the host simulation of pend
    worst = 0.0
    bit_ok, eng_ok = True, True
    n_wb = n_verify = 0
    for n in range(steps):
        B = widths[n % len(widths)]
        slots = pyrng.sample(range(S), B)
        g_in = gdn_inputs(seed + 1000 + n, B, HK, HV, D, D, rows=K, dtype=dtype)
        xs = [conv_inputs(seed + 5000 + 7 * n + layer, B, dim, rows=K, dtype=dtype)["x"]
              for layer in range(L)]
        plan = step.begin(slots, K)
        outs = [step.verify_layer(i, x=xs[i], g=g_in["g"], beta=g_in["beta"]) for i in range(L)]
        acc = accept_counts(rng, B, K, alpha, p_zero)
        # host simulation of the same step (a flush by the policy clears those slots first)
        if plan["flushed"]:
            over = host_p[slots] > step.eager_max_pending
            host_p[np.asarray(slots)[over]] = 0
        wb, newp = protocol_step(host_p[slots], acc, K, plan["lazy"])
        eng = step.engaged[0].cpu().numpy()
        eng_ok &= bool((eng == np.where(wb, 2, 1)).all())
        n_wb += int((eng == 2).sum())
        n_verify += B
        host_p[slots] = newp
        step.accept(acc.tolist())
        slot_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
        for t in range(K):
            sel = [b for b in range(B) if acc[b] > t]
            if not sel:
                break
            sel_t = torch.tensor(sel, device=DEVICE)
            for layer, (pst, pcs) in enumerate(plain):
                y = conv_update(pcs, xs[layer][sel_t, t], layers[layer].conv_weight,
                                layers[layer].conv_bias, state_indices=slot_t[sel_t],
                                qk_channels=qk, head_dim=D)
                q = y[:, :HK * D].unflatten(-1, (HK, D))
                k = y[:, HK * D:qk].unflatten(-1, (HK, D))
                v = y[:, qk:].unflatten(-1, (HV, D))
                o = gdn_decode(pst, q, k, v, g_in["g"][sel_t, t], g_in["beta"][sel_t, t],
                               state_indices=slot_t[sel_t], use_qk_l2norm=False,
                               state_layout=layout)
                got = outs[layer][sel_t, t]
                if form == "exact":
                    bit_ok &= bitwise_equal(got, o)
                worst = max(worst, errors(got, o)["rel_l2"])
    step.flush(list(range(S)))
    for lay, (pst, pcs) in zip(layers, plain):
        bit_ok &= bitwise_equal(lay.conv_state, pcs)
        if form == "exact":
            bit_ok &= bitwise_equal(lay.state, pst)
        worst = max(worst, errors(lay.state, pst)["rel_l2"])
    k = f"protocol_{form}"
    rows = [{"kernel": k, "metric": "engaged_as_simulated", "value": float(eng_ok), "passed": eng_ok,
             "what": "engaged"},
            {"kernel": k, "metric": "rel_l2_vs_plain", "value": worst,
             "tolerance": 0.0 if form == "exact" else WY_TOL,
             "passed": worst <= (0.0 if form == "exact" else WY_TOL), "what": "o and states"}]
    if form == "exact":
        rows.append({"kernel": k, "metric": "bitwise_vs_plain", "value": float(bit_ok),
                     "passed": bit_ok, "what": "o and states"})
    rows += [{"kernel": k, "metric": m, "value": float(v)} for m, v in step.stats.items()]
    rows.append({"kernel": k, "metric": "write_back_frac", "value": n_wb / max(n_verify, 1)})
    if any(r.get("passed") is False for r in rows):
        raise CheckFailed("protocol run disagrees with plain decoding or the simulation", rows)
    return rows


# ---- 4. byte budgets --------------------------------------------------------------------------

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


def plot_budget(table: pd.DataFrame, ax=None):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    for i, (model, t) in enumerate(table.groupby("model")):
        ax.plot(t["K"], t["snapshots KiB"], "o-", color=f"C{i}", label=f"{model}: snapshots")
        ax.plot(t["K"], t["carry stash KiB"], "s--", color=f"C{i}", label=f"{model}: carry stash (CAP={CAP})")
        ax.axhline(float(t["state KiB"].iloc[0]), color=f"C{i}", ls=":", lw=1, label=f"{model}: the state")
    ax.set_xlabel("K (rows verified)")
    ax.set_ylabel("KiB per sequence per layer")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("Rollback memory: snapshots vs the carried-state stash")
    return ax


# ---- tables and plots of the sweep ------------------------------------------------------------

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


def plot_errors(df: pd.DataFrame, ax=None):
    """rel_l2 of every checked quantity against its reference, one colour per dtype, the
    tolerance as a short dash."""
    import matplotlib.pyplot as plt

    if not {"metric", "what", "kernel", "dtype"} <= set(df.columns):
        return None
    err = df[df["metric"] == "rel_l2"].copy()
    if err.empty:
        return None
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4), layout="constrained")
    err = with_layout(err)
    err["cat"] = err["kernel"] + " " + err["state_layout"] + "\n" + err["what"].astype(str)
    error_strip(ax, err, sorted(err["cat"].unique()), fontsize=6, rotation=90)
    ax.set_ylabel("rel. L2 error")
    ax.set_title("Errors against the references (0 plotted as 1e-12)")
    return ax


def on_gpu(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds GPU timings (do_bench or CUDA graph)."""
    t = df[df["metric"] == "time_us"] if "metric" in df else df.iloc[0:0]
    return "timer" in t and t["timer"].isin(["do_bench", "cuda_graph"]).any()


def _at(sel: pd.DataFrame, shape: dict | None) -> pd.DataFrame:
    for k, v in (shape or {}).items():
        sel = sel[sel[k] == v]
    return sel


def plot_verify_speed(df: pd.DataFrame, metric: str = "time_us", shape: dict | None = None):
    """One panel per ``(state_layout, K)`` (rows: layouts): ``metric`` (time per verify, GB/s
    or roofline fraction; best timer, CUDA graph replay on a GPU) against batch width for every
    kernel; the copy roofline on GB/s panels (GPU)."""
    import matplotlib.pyplot as plt

    sel = _at(timed(df, metric), shape)
    Ks = sorted(sel["K"].unique())
    lays = [x for x in LAYOUTS if (sel["state_layout"] == x).any()]
    if not Ks:
        return None
    fig, axes = plt.subplots(len(lays), len(Ks), figsize=(3.4 * len(Ks), 3.2 * len(lays)),
                             sharey=True, squeeze=False)
    gpu = on_gpu(df)
    roof = copy_bandwidth() if gpu else None
    for row, lay in zip(axes, lays):
        for ax, K in zip(row, Ks):
            s_lk = sel[(sel["K"] == K) & (sel["state_layout"] == lay)]
            for kern in KERNELS:
                s = s_lk[s_lk["kernel"] == kern].groupby("B")["value"].median()
                if not s.empty:
                    color, ls = STYLE[kern]
                    ax.plot(s.index, s.values, ls, marker="o", ms=3, color=color,
                            label=LABELS[kern])
            if metric == "gbps" and roof:
                ax.axhline(roof, color="k", ls="--", lw=1, label=f"copy roofline {roof:.0f} GB/s")
            if metric == "roofline_frac":
                ax.axhline(1.0, color="k", ls="--", lw=1)
            ax.set_xscale("log", base=2)
            if metric == "time_us":
                ax.set_yscale("log")
            ax.set_title(f"{LAYOUT_NAMES[lay]} state, K = {K}", fontsize=9)
            ax.set_xlabel("batch width B (sequences)")
    ylab = {"time_us": "time per verify (us)", "gbps": "GB/s (SPEC §4 bytes)",
            "roofline_frac": "fraction of copy roofline"}[metric]
    timer = best_timer(df)
    for row in axes:
        row[0].set_ylabel(ylab + f"\n{TIMER_LABELS.get(timer, timer)}", fontsize=8)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    desc = ", ".join(f"{k}={v}" for k, v in (shape or {}).items())
    fig.suptitle(f"Verify: carried state vs snapshot chain vs peers ({desc})", fontsize=10)
    fig.tight_layout(rect=(0, 0.08 if len(lays) > 1 else 0.14, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    return fig


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


def plot_crossover(cross: pd.DataFrame, lazy_min_seqs: int = 8):
    """Lazy / eager time ratio against batch width, one panel per state layout; below 1 the
    lazy form is faster. The policy's threshold (``lazy_min_seqs``) as a vertical line."""
    import matplotlib.pyplot as plt

    if cross.empty:
        return None
    lays = [x for x in LAYOUTS if (cross["state_layout"] == x).any()]
    fig, axes = plt.subplots(1, len(lays), figsize=(6.5 * len(lays), 3.8), sharey=True,
                             squeeze=False)
    for ax, lay in zip(axes[0], lays):
        c = cross[cross["state_layout"] == lay]
        for i, ((form, K), g) in enumerate(c.groupby(["form", "K"])):
            ax.plot(g["B"], g["lazy_over_eager"], "-" if form == "exact" else "--", marker="o",
                    ms=3, color=f"C{i % 10}", label=f"{form}, K={K}")
        ax.axhline(1.0, color="k", lw=1)
        ax.axvline(lazy_min_seqs, color="grey", ls=":", label=f"policy: lazy from B={lazy_min_seqs}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch width B")
        ax.set_title(f"{LAYOUT_NAMES[lay]} state")
        ax.legend(fontsize=7, ncol=2)
    axes[0][0].set_ylabel("lazy time / eager time")
    fig.suptitle("Eager vs lazy: where the lazy verify pays off", fontsize=10)
    fig.tight_layout()
    return fig


def plot_writeback(df: pd.DataFrame, sim: pd.DataFrame | None = None):
    """Measured write-back fraction of the timed launches (engaged == 2) against B, per mode
    and K (K-major points; the pending counts do not depend on the layout)."""
    import matplotlib.pyplot as plt

    w = with_layout(df)
    w = w[(w["metric"] == "write_back_frac") & (w["status"] == "ok")
          & w["kernel"].str.startswith("carry_exact")]
    if w.empty:
        return None
    w = w[w["state_layout"] == w["state_layout"].iloc[0]]
    fig, ax = plt.subplots(figsize=(7, 3.4), layout="constrained")
    for i, ((kern, K), g) in enumerate(w.groupby(["kernel", "K"])):
        s = g.groupby("B")["value"].mean()
        mode = kern.rsplit("_", 1)[1]
        ax.plot(s.index, s.values, "--" if mode == "eager" else "-", marker="o", ms=3,
                color=f"C{i % 10}", label=f"{mode}, K={K}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch width B")
    ax.set_ylabel("sequences written back per verify")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Write-back frequency in the timed launches (pending drawn from the protocol)")
    ax.legend(fontsize=7, ncol=2)
    return fig


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
    n_pts = df["point_id"].nunique()
    n_fail = df[df["status"] == "failed"]["point_id"].nunique()
    lines.append(f"- {n_pts} points run, {n_fail} failed their checks.")
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
