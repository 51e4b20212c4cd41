"""The pmll_attention notebook: attention straight from the PMLL ring (SPEC §1). Points:
``state_point`` (errors per ring state), ``speed_point`` (each of ``PROVIDERS`` checked on
probes, then timed), ``eviction_point`` (GPT-2 through ``pmll_step``); then targets, tables and
plots (the reference path timed by do_bench only).
"""

from __future__ import annotations

from functools import lru_cache, partial

import pandas as pd
import torch
import torch.nn.functional as F

from pmll_lab.backend import DEVICE
from pmll_lab.bench import error_rows, errors
from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import target_table as TT
from pmll_lab.experiments.targets import fact, facts
from pmll_lab.inputs import pmll_inputs
from pmll_lab.ops.pmll.ring_attention import attention_flops
from pmll_lab.pmll import IMPLS as PMLL_IMPLS
from pmll_lab.pmll import RingMemory, memory_attention, pmll_read, pmll_step
from pmll_lab.reference import pmll as ref
from pmll_lab.sweep import CheckFailed
from pmll_lab.tolerances import MODEL_TOL as EQUIV_TOL
from pmll_lab.tolerances import RING_ATTENTION_TOL as TOL

PROVIDERS = ("fused", "gather_sdpa_mask", "sdpa_contiguous", "sdpa_causal", "reference",
             "pmll_step")
"""What ``speed_point`` times for one segment's attention: ours (``fused``, ``pmll_step``: then
the segment written), PyTorch as a user writes it (``gather_sdpa_mask``) and at its best
(``sdpa_contiguous``), the segment alone (``sdpa_causal``), the fp32 ``reference`` (do_bench)."""
LABELS = {"fused": "fused ring attention (ours)", "gather_sdpa_mask": "gather + SDPA with mask",
          "sdpa_contiguous": "SDPA, contiguous keys, lower-right causal",
          "sdpa_causal": "SDPA causal, segment alone", "reference": "reference path (fp32)",
          "pmll_step": "pmll_step (fused attention + write)"}
STATE_COUNTS = {"empty (0)": lambda m: 0, "partial (3)": lambda m: 3, "full (M)": lambda m: m,
                "M+1": lambda m: m + 1, "2M+3": lambda m: 2 * m + 3, "3M-7": lambda m: 3 * m - 7}
"""Ring states of ``state_point``, one sequence each: label -> ``count`` at capacity ``M``
(empty, partly filled, exactly full, wrapped by one row, wrapped twice, and the oldest row late
in the ring so that the chronological order wraps inside a block of keys)."""
RUNS_ON_CPU = {"fused": "Triton interpreter", "pmll_step": "Triton interpreter",
               "gather_sdpa_mask": "Triton interpreter (read) + PyTorch SDPA",
               "reference": "Triton interpreter (read) + PyTorch", "sdpa_contiguous": "PyTorch",
               "sdpa_causal": "PyTorch"}
"""Where each provider runs without a GPU: ours in the Triton interpreter, PyTorch's SDPA
natively, so their wall times compare nothing (no plot, no ratio on the CPU)."""
TIMING = dict(warmup_ms=25, rep_ms=100, cpu_reps=2, replays=200)
"""do_bench windows (ms), interpreter calls timed, graph replays."""


def _split_shape(p: dict) -> dict | None:
    if "shape" in p:
        p["H"], p["D"] = (int(x) for x in p.pop("shape"))
    return None if p.get("capacity") == 0 and p.get("gate", "none") != "none" else p


SWEEP_AXES = {
    "speed": ("B", "M", "T", "dtype", "shape", "providers", "seed"),
    "states": ("D", "H", "M", "T", "dtype", "shape", "seed"),
    "eviction": ("batch", "capacity", "gate", "head_dim", "heads", "impl", "layers", "segment",
                 "tokens", "vocab", "seed"),
}
"""Each pmll_attention sweep's axes (``points(sweep=...)``; ``protocol.grid_points``): a grid's
``shape`` is ``(H, D)`` pairs, split on the points."""
AXES = tuple(dict.fromkeys(a for axes in SWEEP_AXES.values() for a in axes))
"""Every pmll_attention sweep's axes together."""


def points(grids: list[dict], seed: int = 0, sweep: str = "speed") -> list[dict]:
    """The grids' points (``shape`` pairs split into ``H`` and ``D``; ``seed`` unless a grid has
    its own), duplicates dropped. A GPT-2 point without a ring (``capacity`` 0) keeps only
    ``gate="none"``: without a ring there is nothing to blend."""
    for g in grids if isinstance(grids, (list, tuple)) else ():
        for s in g.get("shape", ()) if isinstance(g, dict) else ():
            if not isinstance(s, (list, tuple)):
                raise ValueError(f"grids: axis shape must list (H, D) pairs, got {s!r}")
    last = [{**{k: v for k, v in g.items() if k != "shape"},   # the shape axis varies last
             **({"shape": [tuple(x) for x in g["shape"]]} if "shape" in g else {})}
            for g in grids]
    if sweep not in SWEEP_AXES:
        raise ValueError(f"sweep: must be one of {', '.join(SWEEP_AXES)}, got {sweep!r}")
    for g in last:
        for s in g.get("shape", ()):
            if len(s) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                      for x in s):
                raise ValueError(f"grids: axis shape must list (H, D) pairs of ints >= 1, got "
                                 f"{list(s)!r}")
        for v in g.get("gate", ()):
            try:
                ok = v == "none" or (not isinstance(v, bool) and 0.0 <= float(v) <= 1.0)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"grids: axis gate: \"none\" or a blend weight in [0, 1] (a "
                                 f"number or its text), got {v!r}")
        for v in g.get("providers", ()):
            names = [v] if isinstance(v, str) else v
            bad = [n for n in names if n not in PROVIDERS] if isinstance(names, (list, tuple)) \
                else [names]
            if bad or not names:
                raise ValueError(f"grids: axis providers: each value a provider or a list of "
                                 f"them ({', '.join(PROVIDERS)}), got {v!r}")
    return P.grid_points(last, {"seed": [seed]}, _split_shape, axes=SWEEP_AXES[sweep],
                         choices={"dtype": P.KERNEL_DTYPES, "impl": PMLL_IMPLS + ("triton",)})


# ---- ring states ------------------------------------------------------------------------------

def _ring(seed: int, batch: int, heads: int, capacity: int, head_dim: int, dtype, counts):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, capacity, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return RingMemory(k.to(DEVICE), v.to(DEVICE),
                      torch.as_tensor(counts, dtype=torch.int64).to(DEVICE))


def state_point(point: dict) -> list[dict]:
    """Fused and reference ``memory_attention`` against float64, one sequence per ring state
    (``STATE_COUNTS``) in one batch; ``H`` heads, capacity ``M``, ``T`` queries, head size
    ``D``, ``dtype``. Rows: ``kernel`` fused / reference, ``what`` = the state, ``rel_l2`` and
    ``max_abs`` with ``passed``; raises ``CheckFailed`` if one fails."""
    H, M, T, D, seed = (int(point[n]) for n in ("H", "M", "T", "D", "seed"))
    dname = point["dtype"]
    dtype = getattr(torch, dname)
    counts = [fn(M) for fn in STATE_COUNTS.values()]
    mem = _ring(seed, len(counts), H, M, D, dtype, counts)
    x = pmll_inputs(seed + 1, len(counts), H, T, D, dtype=dtype)
    want = ref.memory_attention(x["q"], x["k_new"], x["v_new"], mem.k, mem.v, mem.count)
    rows = []
    for impl in ("fused", "reference"):
        o = memory_attention(x["q"], x["k_new"], x["v_new"], mem, impl=impl)
        for b, label in enumerate(STATE_COUNTS):
            for r in error_rows(impl, o[b], want[b], tol=TOL[dname], what=label):
                rows.append(dict(r, count=counts[b], length=min(counts[b], M)))
    P.require(rows)
    return rows


# ---- speed ------------------------------------------------------------------------------------

def speed_inputs(point: dict) -> dict:
    """The ring (``None`` when ``M = 0``), its contiguous chronological copy followed by the
    segment (``k_cat, v_cat [B, H, M + T, D]``), and ``q, k, v [B, H, T, D]`` of one point.
    Every sequence's ring is full and wrapped (``count = 2M + 97 b mod M``)."""
    B, H, M, T, D, seed = (int(point[n]) for n in ("B", "H", "M", "T", "D", "seed"))
    dtype = getattr(torch, point["dtype"])
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=DEVICE, dtype=torch.float32).to(dtype)

    q, k, v = randn(B, H, T, D), randn(B, H, T, D), randn(B, H, T, D)
    if M == 0:
        return dict(mem=None, q=q, k=k, v=v, k_cat=k, v_cat=v)
    counts = torch.tensor([2 * M + (97 * b) % M for b in range(B)], dtype=torch.int64)
    mem = RingMemory(randn(B, H, M, D), randn(B, H, M, D), counts.to(DEVICE))
    k_cat, v_cat = pmll_read(mem, T)
    k_cat[:, :, M:] = k
    v_cat[:, :, M:] = v
    return dict(mem=mem, q=q, k=k, v=v, k_cat=k_cat, v_cat=v_cat)


def gather_sdpa_mask(q, k, v, mem):
    """The gather + mask path: ``pmll_read`` the ring with room for the segment, copy the
    segment's keys behind it, build the ``[B, 1, T, M + T]`` visibility mask from the ring
    lengths on the device, and run PyTorch SDPA with it (no host sync)."""
    batch, _, tokens, _ = q.shape
    capacity = mem.k.shape[2]
    k_all, v_all = pmll_read(mem, tokens)
    k_all[:, :, capacity:] = k
    v_all[:, :, capacity:] = v
    slot = torch.arange(capacity, device=q.device)
    mem_vis = (slot[None, :] >= (capacity - mem.lengths)[:, None])[:, None, :].expand(
        batch, tokens, capacity)
    ctx_vis = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()
    mask = torch.cat([mem_vis, ctx_vis[None].expand(batch, tokens, tokens)], dim=-1)
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask[:, None])


def sdpa_contiguous(q, k_cat, v_cat):
    """SDPA over contiguous keys ``[B, H, M + T, D]`` with a lower-right causal bias: query ``i``
    sees keys ``0 .. M + i``."""
    from torch.nn.attention.bias import causal_lower_right

    bias = causal_lower_right(q.shape[2], k_cat.shape[2])
    return F.scaled_dot_product_attention(q, k_cat, v_cat, attn_mask=bias)


def speed_point(point: dict) -> list[dict]:
    """Check every provider of ``point["providers"]`` (default ``PROVIDERS``) on probe
    sequences and heads against float64, then time them (see the module docstring)."""
    B, H, M, T, D = (int(point[n]) for n in ("B", "H", "M", "T", "D"))
    dname = point["dtype"]
    chosen = point.get("providers", PROVIDERS)
    chosen = [chosen] if isinstance(chosen, str) else chosen    # one provider, or a list
    providers = [p for p in chosen
                 if M > 0 or p not in ("gather_sdpa_mask", "reference", "pmll_step")]
    x = speed_inputs(point)
    mem, q, k, v = x["mem"], x["q"], x["k"], x["v"]
    step_mem = mem.clone() if mem is not None else None
    calls = {
        "fused": lambda: memory_attention(q, k, v, mem, impl="fused"),
        "gather_sdpa_mask": lambda: gather_sdpa_mask(q, k, v, mem),
        "sdpa_contiguous": lambda: sdpa_contiguous(q, x["k_cat"], x["v_cat"]),
        "sdpa_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "reference": lambda: memory_attention(q, k, v, mem, impl="reference"),
        "pmll_step": lambda: pmll_step(step_mem, q, k, v, impl="fused"),
    }
    bi, hi = P.probes(B), P.probes(H)

    def probe(t):
        return t[bi][:, hi]

    if mem is None:
        want = ref.causal_attention(probe(q), probe(k), probe(v))
    else:
        want = ref.memory_attention(probe(q), probe(k), probe(v), probe(mem.k), probe(mem.v),
                                    mem.count[bi])
    alone = ref.causal_attention(probe(q), probe(k), probe(v))
    rows: list[dict] = []
    for name in providers:
        out = calls[name]()
        target = alone if name == "sdpa_causal" else want
        rows += error_rows(name, probe(out), target, tol=TOL[dname], what="o")
        del out
    if step_mem is not None and "pmll_step" in providers:       # the write landed: count += T
        ok = bool(torch.equal(step_mem.count, mem.count + T))
        rows.append({"kernel": "pmll_step", "metric": "count_equal", "value": float(ok),
                     "passed": ok, "what": "count"})
    P.require(rows)
    for name in providers:
        flops = attention_flops(B, H, T, D, [0] * B if name == "sdpa_causal" else [M] * B)
        rows += P.speed_rows(name, P.timings(calls[name], graph=name != "reference", **TIMING),
                             flops=flops)
    return rows


# ---- GPT-2 eviction ---------------------------------------------------------------------------

def gpt2_status() -> str | None:
    """None when ``transformers`` (GPT-2) imports here, else a line saying why the GPT-2 sweep
    is skipped (the offline H200 image lacks it unless ``scripts/wheels-models.txt``'s wheels
    travel with the tree)."""
    try:
        from transformers import AttentionInterface, GPT2LMHeadModel  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: no GPT-2 here
        return (f"transformers not importable ({type(exc).__name__}: {exc}): GPT-2 part skipped; "
                "fetch its wheels with ../shared/device/fetch-wheels.sh $(cat scripts/wheels-models.txt)")
    return None


@lru_cache(maxsize=2)
def _model_and_full(seed: int, layers: int, heads: int, head_dim: int, vocab: int, tokens: int,
                    batch: int):
    from pmll_lab.models import gpt2_pmll as G

    model = G.tiny_gpt2(seed, layers=layers, heads=heads, head_dim=head_dim, vocab=vocab,
                        positions=tokens)
    ids = G.token_ids(seed + 1, batch, tokens, vocab)
    return model, ids, G.full_logits(model, ids)


def eviction_point(point: dict) -> list[dict]:
    """GPT-2 segmented through ``pmll_step`` vs its whole-sequence forward. Point axes:
    ``layers, heads, head_dim, vocab, tokens, batch, segment, capacity, gate`` ("none" or a
    float), ``impl``, ``seed``. Rows (kernel ``gpt2_pmll``): ``rel_l2`` and ``max_abs`` of the
    logits (with ``EQUIV_TOL`` and ``passed`` where nothing is evicted and ``gate`` is "none",
    else a measurement), ``top1_agree`` (fraction of positions whose argmax agrees) and
    ``rel_l2_last`` (the last segment's logits)."""
    from pmll_lab.models import gpt2_pmll as G

    model, ids, full = _model_and_full(*(int(point[n]) for n in (
        "seed", "layers", "heads", "head_dim", "vocab", "tokens", "batch")))
    tokens, segment, capacity = (int(point[n]) for n in ("tokens", "segment", "capacity"))
    gate = None if point["gate"] == "none" else float(point["gate"])
    seg = G.segmented_logits(model, ids, segment=segment, capacity=capacity, gate=gate,
                             impl=point.get("impl", "fused"))
    last = (tokens - 1) // segment * segment
    whole = gate is None and capacity >= last
    rows = error_rows("gpt2_pmll", seg, full, tol=EQUIV_TOL if whole else float("inf"),
                      what="logits")
    for r in rows:
        if not whole:
            r["tolerance"], r["passed"] = None, None
    rows.append({"kernel": "gpt2_pmll", "metric": "top1_agree", "what": "logits",
                 "value": float((seg.argmax(-1) == full.argmax(-1)).float().mean())})
    rows.append({"kernel": "gpt2_pmll", "metric": "rel_l2_last", "what": "logits",
                 "value": errors(seg[:, last:], full[:, last:])["rel_l2"]})
    for r in rows:
        r["needed"] = last
        r["evicts"] = capacity < last
    bad = [r for r in rows if r.get("passed") is False and r["metric"] == "rel_l2"]
    if bad:
        raise CheckFailed(f"segmented GPT-2 differs from the whole sequence with nothing "
                          f"evicted: rel_l2 {bad[0]['value']:.3g} > {EQUIV_TOL}", rows)
    return rows


# ---- targets, tables and plots ---------------------------------------------------------------

PARAMS = ("B", "H", "D", "M", "T", "dtype", "capacity", "gate")
TARGET_SET = TT.SETS[TT.ATTENTION]
TARGETS = TT.for_report(TT.ATTENTION)

times = P.wide
"""One row per timed (point, provider): ``protocol.wide``."""


def wide_times(df: pd.DataFrame) -> pd.DataFrame:
    """On a GPU: times (µs) with one column per provider, one row per (shape, M, T), the
    providers timed by do_bench only (the reference path) after them as ``<provider>
    (do_bench)``, and the timer. On the CPU: one row per provider and (M, T), where it ran
    (``RUNS_ON_CPU``), its wall time (ms) and the timer: a record, not a comparison."""
    t = times(df)
    if t.empty:
        return t
    idx = ["B", "H", "D", "dtype", "M", "T"]
    if not P.on_gpu(t):
        out = t.assign(provider=t["kernel"].map(LABELS).fillna(t["kernel"]),
                       runs_in=t["kernel"].map(RUNS_ON_CPU), wall_time_ms=t["time_us"] / 1e3,
                       timer=f"CPU wall clock, median of {TIMING['cpu_reps']} calls; "
                             "not GPU speed")
        order = {k: i for i, k in enumerate(PROVIDERS)}
        out = out.sort_values(idx, kind="stable").sort_values(
            "kernel", key=lambda k: k.map(order), kind="stable")
        return out[["provider", "runs_in", *idx, "wall_time_ms", "timer"]].reset_index(drop=True)
    w = t.pivot_table(index=idx, columns="kernel", values="time_us")
    w = w[[p for p in PROVIDERS if p in w.columns]]
    graphed = set(w.columns)
    w = w.rename(columns=lambda k: f"{k} (µs)")
    if t["timer"].iloc[0] == "cuda_graph":
        db = times(df, "do_bench")
        db = db[~db["kernel"].isin(graphed)] if len(db) else db
        if len(db):
            w = w.join(db.pivot_table(index=idx, columns="kernel", values="time_us")
                       .rename(columns=lambda k: f"{k} (µs, do_bench)"), how="left")
    w = w.reset_index()
    w.columns.name = None
    timer = str(t["timer"].iloc[0])
    return w.round(2).assign(timer=P.TIMER_LABELS.get(timer, timer))


def ratio_table(df: pd.DataFrame, ours: str, peer: str) -> pd.DataFrame:
    """``time(ours) / time(peer)``, one row per (H, D, M), one column per ``T``: GPU runs only."""
    t = times(df)
    if t.empty or not P.on_gpu(t):
        return pd.DataFrame()
    w = t.pivot_table(index=["H", "D", "M", "T"], columns="kernel", values="time_us")
    if ours not in w or peer not in w:
        return pd.DataFrame()
    r = (w[ours] / w[peer]).dropna().rename("ratio").reset_index()
    out = r.pivot_table(index=["H", "D", "M"], columns="T", values="ratio").round(3)
    out.columns.name = "T"
    return out.reset_index()


correctness_table = partial(P.correctness_table, by=("dtype",))
failed_points = partial(P.failed_points, params=PARAMS)
plot_state_errors = partial(plots.plot_errors, labels=LABELS,
                            title="Memory attention over ring states against float64")


def plot_times(df: pd.DataFrame):
    """Time per segment against ``T``, one panel per (shape, M), one line per provider: GPU
    timings only (on the CPU ours run in the interpreter, PyTorch natively: ``wide_times``
    lists them). None otherwise."""
    import matplotlib.pyplot as plt

    t = times(df)
    if t.empty or not P.on_gpu(t):
        return None
    shapes = sorted(t.groupby(["H", "D"]).groups)
    Ms = sorted(t["M"].unique())
    fig, axes = plt.subplots(len(shapes), len(Ms), figsize=(2.4 + 3 * len(Ms), 2.9 * len(shapes)),
                             squeeze=False, sharey="row", layout="constrained")
    for i, (H, D) in enumerate(shapes):
        for j, M in enumerate(Ms):
            ax = axes[i][j]
            s = t[(t["H"] == H) & (t["D"] == D) & (t["M"] == M)]
            for prov in PROVIDERS:
                p = s[s["kernel"] == prov].sort_values("T")
                if len(p):
                    ax.plot(p["T"], p["time_us"], label=LABELS[prov], **plots.style(prov))
            ax.set(xscale="log", yscale="log", xlabel="segment length T",
                   title=f"H={H}, D={D}, M={M}")
            ax.set_xscale("log", base=2)
            ax.title.set_fontsize(9)
    timer = str(t["timer"].iloc[0])
    axes[0][0].set_ylabel(f"time (us)\n{P.TIMER_LABELS.get(timer, timer)}", fontsize=8)
    fig.suptitle(f"One segment's attention, B={int(t['B'].iloc[0])}, {t['dtype'].iloc[0]}",
                 fontsize=10)
    plots.legend_outside(fig)
    return fig


def eviction_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (gate, capacity): rel_l2 of all logits and of the last segment's, top-1 agreement."""
    if df.empty or "metric" not in df:
        return pd.DataFrame()
    ok = df[df["status"] == "ok"]
    w = ok.pivot_table(index=["gate", "capacity", "needed"], columns="metric", values="value")
    w = w[[c for c in ("rel_l2", "rel_l2_last", "max_abs", "top1_agree") if c in w]].reset_index()
    w.columns.name = None
    return w.sort_values(["gate", "capacity"]).reset_index(drop=True)


def plot_eviction(df: pd.DataFrame):
    """rel_l2 of the logits against ring capacity, one line per gate; the capacity that evicts
    nothing marked."""
    import matplotlib.pyplot as plt

    t = eviction_table(df)
    if t.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), layout="constrained")
    for k, (gate, g) in enumerate(t.groupby("gate", sort=True)):
        lab = "no gate (g = 1)" if gate == "none" else f"gate g = {gate}"
        for ax, col in zip(axes, ("rel_l2", "rel_l2_last")):
            ax.plot(g["capacity"], g[col].clip(lower=1e-9), marker="o", color=f"C{k}", label=lab)
    need = int(t["needed"].iloc[0])
    for ax, title in zip(axes, ("all positions", "last segment")):
        ax.axvline(need, color="grey", ls=":", lw=1, label="nothing evicted from here")
        ax.set(yscale="log", xlabel="ring capacity M (rows per head)",
               ylabel="rel. L2 of logits vs whole sequence",
               title=f"GPT-2 segmented through the ring: {title}")
    plots.legend_outside(fig, axes[:1])
    return fig


def findings(sdf: pd.DataFrame, edf: pd.DataFrame) -> pd.DataFrame:
    """Facts: the worst rel. L2 over ring states per kernel; GPT-2's logits with nothing evicted
    and with the smallest ring (rel. L2 against the whole sequence, top-1 agreement)."""
    rows = []
    c = P.checks(sdf)
    for r in c.itertuples() if len(c) else []:
        rows.append(fact(f"{r.kernel} over every ring state: worst rel. L2", r.worst_rel_l2,
                         "rel. L2", f"tolerance {r.tolerance:.1e}"))
    e = eviction_table(edf)
    if len(e):
        need = int(e["needed"].iloc[0])
        full = e[(e["gate"] == "none") & (e["capacity"] >= need)]
        if len(full):
            rows.append(fact(f"GPT-2, nothing evicted (M >= {need}, no gate): logits vs the "
                             "whole sequence", full["rel_l2"].max(), "rel. L2"))
        part = e[(e["gate"] == "none") & (e["capacity"] < need)]
        if len(part):
            lo = part.iloc[0]
            what = f"GPT-2, smallest ring (M={int(lo['capacity'])}, no gate)"
            rows += [fact(f"{what}: logits vs the whole sequence", lo["rel_l2"], "rel. L2"),
                     fact(f"{what}: top-1 agreement", lo["top1_agree"], "fraction")]
    return facts(rows)
