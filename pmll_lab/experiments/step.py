"""The carry_step notebook: the whole speculative step per implementation, and the drift study.

A point (``B, K, HK, HV, head_dim, state_dtype, steps, alpha``; ``forms``: registry names
joined by ``"+"``, default every ``gdn_step`` implementation and the conv twin's) goes to the
one runner (``pmll_lab.harness.runner``): each implementation checked against float64 decoding,
then timed in one CUDA graph of ``steps`` steps (``step_us``); one that fails or raises is a
failed row, one that cannot run here or does not take the case an ``unsupported`` row.
"""

from __future__ import annotations

import pandas as pd

from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.target_table import SETS, STEP, for_report
from pmll_lab.experiments.targets import fact, facts
from pmll_lab.harness import registry
from pmll_lab.harness.runner import run_point
from pmll_lab.harness.step import check_point, make_case
from pmll_lab.ops.carry.ring import RING_LENGTHS, RING_MAX_ROWS
from pmll_lab.tolerances import STEP_TOL
from pmll_lab.harness import step_forms as SF

TARGETS = for_report(STEP)
TARGET_SET = SETS[STEP]
AXES = ("B", "HK", "HV", "K", "alpha", "fill", "forms", "head_dim", "ring_length",
        "state_dtype", "steps", "seed")
"""The step sweeps' axes (carry_step, the ``step_grids`` of roofline and carry_protocol;
``protocol.grid_points``)."""


def label(name: str) -> str:
    """An implementation's label (``registry.label``)."""
    return registry.label(name)


def points(grids: list[dict], *, alpha: float, seed: int) -> list[dict]:
    """Step sweep points: every grid's product (``pmll_lab.sweep.grid``) with the acceptance
    probability and the seed (``protocol.grid_points``: axes checked, duplicates dropped); a
    ``forms`` value is checked against the registry (``ValueError`` naming ``forms``), and every
    point against what no form can run (``harness.step.check_point``), before any point runs."""
    pts = P.grid_points(grids, {"alpha": [alpha], "seed": [seed]}, axes=AXES)
    for p in pts:
        if "forms" in p:
            registry.resolve("gdn_step", p["forms"])
        try:
            check_point(p)
        except ValueError as exc:
            raise ValueError(f"grids: {exc}") from None
    return pts


def step_point(p: dict) -> list[dict]:
    """Every implementation of ``p["forms"]`` (default: all, and the conv twin's) on one
    configuration: check, then time."""
    rows = run_point("gdn_step", p, registry.resolve("gdn_step", p.get("forms")))
    if "forms" not in p:                   # the conv twin beside the full set of forms only
        rows += run_point("conv_step", p, registry.names("conv_step"))
    return rows


def step_table(df: pd.DataFrame) -> pd.DataFrame:
    """µs per step, bytes per step and held per sequence, by configuration and form."""
    ok = df[df["status"] == "ok"].copy()
    if "what" in ok:
        named = ok["metric"].eq("rel_l2") & ok["what"].notna()
        ok.loc[named, "metric"] = ok.loc[named, "what"].astype(str) + "_rel_l2"
    keys = ["state_dtype", "B", "K", "form"]
    t = ok.pivot_table(index=keys, columns="metric", values="value", aggfunc="first")
    cols = [c for c in ("step_us", "bytes_moved_step", "bytes_held_seq", "fold_frac",
                        "mean_fill", "o_rel_l2", "state_rel_l2", "bitwise") if c in t]
    return t[cols].reset_index()


def sensitivity_table(sdf: pd.DataFrame) -> pd.DataFrame:
    """The step against the ring's length ``R`` (rows a slot holds before it folds) and the
    acceptance probability ``alpha``: µs per step (GPU), the fraction of steps that fold or
    write back, the mean ring or stash fill and the mean accepted rows, by ``alpha, R, form``."""
    ok = sdf[(sdf["status"] == "ok") & sdf["metric"].isin(
        ["step_us", "fold_frac", "mean_fill"])] if len(sdf) else sdf
    if ok.empty:
        return pd.DataFrame()
    keys = ["state_dtype", "B", "K", "alpha", "ring_length", "form"]
    t = ok.pivot_table(index=keys, columns="metric", values="value", aggfunc="first")
    acc = ok.groupby(keys)["mean_accept"].first()
    t["mean_accept"] = acc
    return t.reset_index()


def sensitivity_findings(sdf: pd.DataFrame) -> pd.DataFrame:
    """Facts per ``alpha``: the ring step at each ``R`` over the ``R = 16`` step; at ``R = 16``
    every other form's step over the ring's (GPU rows only)."""
    t = sensitivity_table(sdf)
    out = []
    if t.empty or "step_us" not in t:
        return facts(out)
    ring = t[t.form == SF.RING.name].set_index(["alpha", "ring_length"])["step_us"]
    for (a, R), v in ring.items():
        if R != 16 and (a, 16) in ring.index:
            out.append(fact(f"alpha={a}: ring step with R={R} / with R=16",
                            round(float(v / ring[(a, 16)]), 3), "x", "same B, K, state dtype"))
    for (a, f), sel in t[t.ring_length == 16].groupby(["alpha", "form"]):
        if f != SF.RING.name and (a, 16) in ring.index and sel.step_us.notna().all():
            out.append(fact(f"alpha={a} (mean {sel.mean_accept.iloc[0]:.2f} accepted): "
                            f"{label(f)} step / ring step",
                            round(float(sel.step_us.iloc[0] / ring[(a, 16)]), 3), "x", "R = 16"))
    return facts(out)


def findings(df: pd.DataFrame, kdf: pd.DataFrame, ddf: pd.DataFrame) -> pd.DataFrame:
    """Facts: whole steps over the ring step (GPU), one verify ours over FlashInfer's on the
    same ring rows (GPU), bytes moved per step and held per sequence, and the drift study's
    errors (every device: accuracy, not speed)."""
    out = []
    tab = step_table(df) if len(df) else pd.DataFrame()
    at = lambda f, sd, B, m: tab[(tab.form == f) & (tab.state_dtype == sd) & (tab.B == B)  # noqa
                                 & (tab.K == 4)][m]
    for B in sorted(tab.B.unique()) if "step_us" in tab else []:
        r, e, c = (at(f, "bfloat16", B, "step_us")
                   for f in (SF.RING.name, SF.EXACT_LAZY.name, SF.CHAIN_RESTORE.name))
        if len(r) and len(e) and len(c):
            out += [fact(f"B={B}, bf16 state: exact lazy step / ring step",
                         float(e.iloc[0] / r.iloc[0]), "x"),
                    fact(f"B={B}, bf16 state: chain + restore step / ring step",
                         float(c.iloc[0] / r.iloc[0]), "x")]
    if not kdf.empty and "time_us" in set(kdf.metric):
        t = kdf[kdf.metric == "time_us"].pivot_table(index=["B", "fill"], columns="kernel",
                                                      values="value")
        K = int(kdf["K"].max()) if "K" in kdf else 4      # the detail's ring length is 16
        if {"ring_verify", "flashinfer_ucache_flush"} <= set(t.columns):
            for (B, fill), row in t.iterrows():
                out.append(fact(f"one verify, B={B}, ring fill {fill}: ours / FlashInfer",
                                round(row.ring_verify / row.flashinfer_ucache_flush, 3), "x",
                                "identical ring rows" + ("; this fill folds" if fill + K > 16
                                                         else "")))
    b = tab[(tab.K == tab.K.max())] if len(tab) else tab
    shown = (SF.RING.name, SF.EXACT_LAZY.name, SF.CHAIN_RESTORE.name, SF.REPLAYSSM.name)
    for f in shown if len(b) else ():
        sel = b[(b.form == f) & (b.state_dtype == "bfloat16")]
        if len(sel) and "bytes_moved_step" in sel:
            out += [fact(f"{label(f)}, bf16: moved per step and sequence",
                         sel.bytes_moved_step.iloc[-1] / 1e6, "MB", "per layer"),
                    fact(f"{label(f)}, bf16: held per sequence",
                         sel.bytes_held_seq.iloc[-1] / 1024, "KiB", "per layer")]
    if not ddf.empty:
        same = same_drift(ddf, SF.EXACT_LAZY.name, SF.PLAIN.name)
        if same is not None:
            out.append(fact("drift, bf16 state: exact lazy carry's errors == plain decoding's at "
                            "every step and checkpoint", int(same), "1 = yes",
                            "0: they do not agree to the bit"))
        for (form, sd, m), v in ddf.groupby(["form", "state_dtype", "metric"])["value"]:
            what = f"drift, {label(form)} ({sd} state): {m}"
            note = "against the exact fp32 carry (= plain fp32 decoding)"
            out += [fact(f"{what}, mean", v.mean(), "rel. L2", note),
                    fact(f"{what}, worst", v.max(), "rel. L2", note)]
    return facts(out)


def kernel_point(p: dict) -> list[dict]:
    """One verify at ring fill ``p["fill"]`` (``fill + K > 16`` folds), ours (``ring_verify``)
    and FlashInfer's (``flashinfer_ucache_flush``) on identical ring rows; each checked against
    the float64 ring reference on ``ref_seqs`` sequences, then timed alone (``time_us``)."""
    from pmll_lab.bench import errors, time_cuda_graph
    from pmll_lab.carry import GdnRing, gdn_ring_verify
    from pmll_lab.peers import fused_gating
    from pmll_lab.peers_replayssm import ReplaySSMRing, replayssm_runner
    from pmll_lab.reference import ring as ref_ring
    from pmll_lab.harness.step import fill_ring

    case = make_case(dict(p, steps=1))
    t, r = case.tensors, case.rows_of(0)
    B, n = case.batch, min(int(p.get("ref_seqs", 2)), case.batch)
    ring = GdnRing.empty(B, case.num_k_heads, case.num_v_heads, case.head_dim, case.head_dim,
                         length=16, dtype=case.state_dtype)
    fill_ring(ring, int(p["fill"]), seed=case.seed + 7)
    slots = t["slots"]
    g, beta = fused_gating(
        r["A_log"].cpu(), r["a"][:n].cpu(), r["dt_bias"].cpu(), r["b"][:n].cpu())
    kv = t["state"].double().transpose(-1, -2).cpu()
    o_ref, _ = ref_ring.verify(kv, ref_ring.RefRing.from_ring(ring), r["q"][:n].cpu(),
                               r["k"][:n].cpu(), r["v"][:n].cpu(), g, beta, slots[:n].cpu(),
                               scale=case.scale, state_dtype=case.state_dtype,
                               ring_dtype=case.state_dtype)
    runs = {}
    st = t["state"].clone()
    rg = GdnRing(ring.k.clone(), ring.u.clone(), ring.G.clone(), ring.len.clone(),
                 ring.base.clone(), 16)
    runs["ring_verify"] = lambda: gdn_ring_verify(st, rg, **r, slot_tab=slots, scale=case.scale)[0]
    peer, rows = registry.get(SF.REPLAYSSM.name), []
    try:
        why = peer.unavailable() or peer.unsupported(case)
    except Exception as exc:  # noqa: BLE001 - its available/supports at fault: a failed row
        why = str(exc)
        rows.append(P.failed_row(dict(kernel="flashinfer_ucache_flush", fill=int(p["fill"]),
                                      state_layout="vk"), "rel_l2", exc, what="o"))
    if why is None:
        st2 = t["state"].clone()
        fr = ReplaySSMRing(ring.k.clone(), ring.u.clone(), ring.G.clone(),
                           ring.len[slots.long()].clone(), ring.base[slots.long()].clone())
        run, o2 = replayssm_runner(r["q"], r["k"], r["v"], r["A_log"], r["a"], r["dt_bias"],
                                   r["b"], st2, slots, fr, scale=case.scale)
        runs["flashinfer_ucache_flush"] = lambda: (run(), o2)[1]
    for name, fn in runs.items():
        base = dict(kernel=name, fill=int(p["fill"]), state_layout="vk")
        try:
            o = fn()
            err = errors(o[:n].float(), o_ref)["rel_l2"]
        except Exception as exc:  # noqa: BLE001 - a kernel that raises is one failed row
            rows.append(P.failed_row(base, "rel_l2", exc, what="o"))
            continue
        tol = STEP_TOL["bfloat16"]
        rows.append(dict(base, metric="rel_l2", what="o", value=err, tolerance=tol,
                         passed=err <= tol, status="ok" if err <= tol else "failed"))
        if err <= tol:
            tm = time_cuda_graph(fn)
            if tm is not None:
                rows.append(dict(base, metric="time_us", value=tm["median_us"], p20=tm["p20_us"],
                             p80=tm["p80_us"], unit="us", timer="cuda_graph", l2=tm["l2"],
                             status="ok"))
    return rows


DRIFT_KEYS = {"batch": 1, "steps": 1, "rows": tuple(range(1, RING_MAX_ROWS + 1)),
              "num_k_heads": 1, "num_v_heads": 1,
              "head_dim": 1, "checkpoints": 1, "ring_length": RING_LENGTHS}
"""A drift point's keys and their least values, ``ring_length`` one of the ring's lengths
(``protocol.check_points``); the notebook adds ``seed`` and ``alpha``."""


def drift_point(p: dict) -> list[dict]:
    """The drift study as one sweep point (``pmll_lab.step_drift.drift_study`` with the point's
    ``batch, steps, rows, num_k_heads, num_v_heads, head_dim, checkpoints, ring_length, seed,
    alpha``): one row per form, step and metric, ``kernel = form``."""
    from pmll_lab.step_drift import drift_study

    keys = ("batch", "steps", "rows", "num_k_heads", "num_v_heads", "head_dim", "checkpoints",
            "ring_length", "seed", "alpha")
    out = drift_study(**{k: p[k] for k in keys if k in p})
    return [dict(r, kernel=r["form"]) for r in out.to_dict("records")]


def drift_table(ddf: pd.DataFrame) -> pd.DataFrame:
    """The drift study in one flat table: per ``form, state_dtype`` the mean, worst and last rel
    L2 of the accepted outputs (``o_*``) and of the state each form stands for (``state_*``)."""
    if ddf.empty:
        return pd.DataFrame()
    t = ddf.groupby(["form", "state_dtype", "metric"])["value"].agg(
        mean="mean", worst="max", last="last").unstack("metric")
    t.columns = [f"{m.replace('_rel_l2', '')}_{stat}" for stat, m in t.columns]
    cols = [f"{m}_{s}" for m in ("o", "state") for s in ("mean", "worst", "last")]
    return t[[c for c in cols if c in t]].reset_index()


def same_drift(ddf: pd.DataFrame, a: str, b: str, state_dtype: str = "bfloat16") -> bool | None:
    """Whether forms ``a`` and ``b`` at ``state_dtype`` have equal errors at every step and
    checkpoint (what two bitwise-equal decodes give); None when either did not run."""
    def series(form):
        s = ddf[(ddf.form == form) & (ddf.state_dtype == state_dtype)]
        return s.sort_values(["metric", "tokens"])[["metric", "tokens", "value"]].reset_index(
            drop=True)
    sa, sb = series(a), series(b)
    if sa.empty or sb.empty:
        return None
    return sa.equals(sb)
