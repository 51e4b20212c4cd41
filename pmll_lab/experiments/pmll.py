"""The pmll_ring notebook: the PMLL memory ring (SPEC §1).

``ring_point`` (``B, H, M, T, D, dtype, gate`` "none" / "bt" / "bht", ``segments``, ``seed``,
``impl`` "triton" / "cuda") writes seeded segments, checks the ring (gated writes within
``RING_WRITE_TOL``, the rest bit-exact), ``pmll_read`` and ``memory_attention`` against float64
(large rings on probe sequences and heads), then times read and write. A ``"cuda"`` point
without an NVIDIA GPU is one ``unavailable`` row.
"""

from __future__ import annotations

import bisect
import itertools

import pandas as pd
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import H200_L2_BYTES, error_rows
from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import target_table as TT
from pmll_lab.experiments.targets import fact, facts
from pmll_lab.inputs import pmll_inputs
from pmll_lab.pmll import (WRITE_GATES, RingMemory, memory_attention, pmll_read, pmll_write,
                           read_bytes, write_bytes)
from pmll_lab.reference import pmll as ref
from pmll_lab.sweep import CheckFailed
from pmll_lab.tolerances import O_TOL as ATTN_TOL
from pmll_lab.tolerances import RING_WRITE_TOL as WRITE_TOL

CPU_INPUT_ELEMS = 1 << 22
"""Largest tensor drawn on the CPU generator; larger ones are drawn on the device."""
FULL_CHECK_ELEMS = 1 << 21
"""Rings with at most this many elements per tensor are checked whole; larger ones on probes."""
ATTN_TOKENS = 128
"""Queries in the attention check (its scores are ``[probe B, probe H, T', M + T']``)."""

LABELS = {"pmll_read": "read (t_ctx = T)", "pmll_write:none": "write, no gate",
          "pmll_write:bt": "write, gate [B, T]", "pmll_write:bht": "write, gate [B, H, T]"}


AXES = ("B", "H", "M", "T", "D", "dtype", "gate", "segments", "impl", "seed")
"""The PMLL ring sweeps' axes (pmll_ring, roofline's ``ring_grids``; ``protocol.grid_points``)."""


def points(grids: list[dict], seed: int = 0) -> list[dict]:
    """The grids' points (axes ``B, H, M, T, D, dtype, gate, segments``; ``seed`` and ``impl``
    "triton" unless a grid names them), duplicates dropped."""
    return P.grid_points(grids, {"seed": [seed], "impl": ["triton"]}, axes=AXES,
                         choices={"dtype": P.KERNEL_DTYPES, "gate": GATES,
                                  "impl": ("triton", "cuda")})


GATES = tuple("none" if g is None else g for g in WRITE_GATES)
"""The grids' names of ``pmll_write``'s gates (``pmll.WRITE_GATES``; ``"none"`` for None)."""


def with_impl(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with an ``impl`` column on every row: ``"triton"`` where it is missing (rows
    stored before the CUDA twins joined the sweep ran the Triton kernels)."""
    if df.empty:
        return df
    impl = df["impl"] if "impl" in df else pd.Series(pd.NA, index=df.index, dtype=object)
    return df.assign(impl=impl.astype(object).where(impl.notna(), "triton"))


def ring_bytes(point: dict) -> int:
    """Bytes of the ring's ``k`` and ``v`` at a point."""
    el = torch.empty((), dtype=getattr(torch, point["dtype"])).element_size()
    return 2 * point["B"] * point["H"] * point["M"] * point["D"] * el


# ---- inputs -----------------------------------------------------------------------------------

def _normal(gen, shape, dtype):
    return torch.randn(shape, generator=gen, device=gen.device, dtype=torch.float32).to(dtype)


def initial_memory(seed: int, batch: int, heads: int, capacity: int, head_dim: int,
                   dtype: torch.dtype) -> RingMemory:
    """A ring of seeded random rows, counts seeded in ``[0, 3M)`` per sequence (sequence 0
    empty, so a fresh sequence is always in the batch)."""
    numel = batch * heads * capacity * head_dim
    dev = torch.device("cpu") if numel <= CPU_INPUT_ELEMS else DEVICE
    gen = torch.Generator(device=dev).manual_seed(seed)
    shape = (batch, heads, capacity, head_dim)
    k, v = _normal(gen, shape, dtype), _normal(gen, shape, dtype)
    count = torch.randint(0, 3 * capacity, (batch,), generator=torch.Generator().manual_seed(seed))
    count[0] = 0
    return RingMemory(k.to(DEVICE), v.to(DEVICE), count.to(DEVICE))


def segment_inputs(seed: int, batch: int, heads: int, tokens: int, head_dim: int, *,
                   gate: str, dtype: torch.dtype) -> dict:
    """``k_new, v_new, q [B, H, T, D]`` and the gate (None / ``[B, T]`` / ``[B, H, T]`` in
    (0, 1)) for one segment (``pmll_inputs`` while small, a device generator above)."""
    g = None if gate == "none" else gate
    if batch * heads * tokens * head_dim <= CPU_INPUT_ELEMS:
        return pmll_inputs(seed, batch, heads, tokens, head_dim, gate=g, dtype=dtype)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    shape = (batch, heads, tokens, head_dim)
    out = {n: _normal(gen, shape, dtype) for n in ("k_new", "v_new", "q")}
    gshape = {None: None, "bt": (batch, tokens), "bht": (batch, heads, tokens)}[g]
    out["gate"] = None if gshape is None else torch.rand(gshape, generator=gen, device=DEVICE)
    return out


# ---- the point --------------------------------------------------------------------------------

IMPLS = ("triton", "cuda")
"""``impl`` values of a point: the Triton kernels, or their CUDA C++ twins (a GPU only)."""


def ring_point(point: dict) -> list[dict]:
    """Check then time one point; returns tidy rows (see the module docstring), each with the
    point's ``impl``. ``ValueError`` for an ``impl`` outside ``IMPLS``."""
    impl = point.get("impl", "triton")
    if impl not in IMPLS:
        raise ValueError(f"impl: must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "cuda" and DEVICE.type != "cuda":
        return [{"kernel": "pmll_ring", "metric": "unavailable", "value": 1.0,
                 "status": "unavailable", "reason": "needs an NVIDIA GPU (a CUDA C++ twin)",
                 "impl": impl}]
    try:
        rows = _ring_rows(point, impl)
    except CheckFailed as exc:
        for r in exc.rows:
            r.setdefault("impl", impl)
        raise
    for r in rows:
        r.setdefault("impl", impl)
    return rows


def _ring_rows(point: dict, impl: str) -> list[dict]:
    B, H, M, T, D = (int(point[n]) for n in ("B", "H", "M", "T", "D"))
    segments, seed, gate = int(point.get("segments", 1)), int(point.get("seed", 0)), point["gate"]
    dname = point["dtype"]
    dtype = getattr(torch, dname)
    mem = initial_memory(seed, B, H, M, D, dtype)
    whole = B * H * M * D <= FULL_CHECK_ELEMS
    bs = list(range(B)) if whole else P.probes(B)
    hs = list(range(H)) if whole else P.probes(H)
    bi, hi = torch.tensor(bs, device=DEVICE), torch.tensor(hs, device=DEVICE)

    def probe(t):                     # [B, H, ...] -> the probed sequences and heads
        return t.index_select(0, bi).index_select(1, hi)

    rk, rv, rc = probe(mem.k), probe(mem.v), mem.count.index_select(0, bi)
    for s in range(segments):
        x = segment_inputs(seed * 1000 + s + 1, B, H, T, D, gate=gate, dtype=dtype)
        pmll_write(mem, x["k_new"], x["v_new"], x["gate"], validate=True, impl=impl)
        g = x["gate"]
        g = None if g is None else (g.index_select(0, bi) if g.dim() == 2 else probe(g))
        rk, rv, rc = ref.ring_write(rk, rv, rc, probe(x["k_new"]), probe(x["v_new"]), g)
    rows: list[dict] = []
    wtol = 0.0 if gate == "none" else WRITE_TOL[dname]
    counts_ok = torch.equal(mem.count.index_select(0, bi).cpu(), rc)
    rows.append({"kernel": "pmll_write", "metric": "count_equal", "value": float(counts_ok),
                 "passed": counts_ok, "what": "count"})
    rows += error_rows("pmll_write", probe(mem.k), rk, tol=wtol, what="k")
    rows += error_rows("pmll_write", probe(mem.v), rv, tol=wtol, what="v")

    sub = RingMemory(probe(mem.k).contiguous(), probe(mem.v).contiguous(),
                     mem.count.index_select(0, bi).contiguous())
    k_out, v_out = pmll_read(mem, T, impl=impl)
    want_k, want_v = ref.ring_read(sub.k, sub.v, sub.count, T)
    rows += error_rows("pmll_read", probe(k_out), want_k, tol=0.0, what="k")
    rows += error_rows("pmll_read", probe(v_out), want_v, tol=0.0, what="v")
    del k_out, v_out, want_k, want_v

    ta = min(T, ATTN_TOKENS)
    y = segment_inputs(seed * 1000 + 999, len(bs), len(hs), ta, D, gate="none", dtype=dtype)
    o = memory_attention(y["q"], y["k_new"], y["v_new"], sub, impl="reference")
    o_ref = ref.memory_attention(y["q"], y["k_new"], y["v_new"], sub.k, sub.v, sub.count)
    rows += error_rows("memory_attention", o, o_ref, tol=ATTN_TOL[dname], what="o")
    del sub, o, o_ref, rk, rv

    P.require(rows)

    extra = dict(ring_bytes=ring_bytes(point))
    gdtype = torch.float32 if x["gate"] is None else x["gate"].dtype
    nbytes = write_bytes(B, H, M, D, T, dtype=dtype, gate=None if gate == "none" else gate,
                         gate_dtype=gdtype)
    return rows + P.timed_rows(
        [("pmll_read", lambda: pmll_read(mem, T, impl=impl),
          read_bytes(mem.lengths, H, M, D, T, dtype=dtype), extra),
         ("pmll_write", lambda: pmll_write(mem, x["k_new"], x["v_new"], x["gate"], impl=impl),
          nbytes, extra)], warmup_ms=25, rep_ms=100, cpu_reps=3)


# ---- wraparound picture ---------------------------------------------------------------------

def wraparound_states(capacity: int = 8, segments=(5, 6, 3, 11)) -> list[dict]:
    """Write tokens numbered 0, 1, 2 ... in segments of the given lengths into a one-head ring
    with the kernels, and after each segment record which token sits in which slot (``slots``,
    -1 where empty), the chronological read (``read``, -1 for the zero rows) and the next slot:
    what the kernels stored (token ``n`` as the row ``[n, n, ...]``), not a simulation."""
    mem = RingMemory.empty(1, 1, capacity, 16, dtype=torch.float32)
    out, start = [], 0
    for tokens in segments:
        ids = torch.arange(start, start + tokens, dtype=torch.float32)
        rows = (ids + 1)[None, None, :, None].expand(1, 1, tokens, 16).contiguous().to(DEVICE)
        pmll_write(mem, rows, rows)             # stored as id + 1: 0 marks an empty slot
        start += tokens
        k_out, _ = pmll_read(mem, 0)
        slots = mem.k[0, 0, :, 0].cpu().long() - 1
        read = k_out[0, 0, :, 0].cpu().long() - 1
        out.append({"tokens": tokens, "written": start, "count": int(mem.count[0]),
                    "next_slot": int(mem.next_slot[0]), "slots": slots.tolist(),
                    "read": read.tolist()})
    return out


def plot_wraparound(capacity: int = 8, segments=(5, 6, 3, 11)):
    """Two panels, one row per segment written: left, which token sits in each slot (storage
    order, the box marks the next slot to be written); right, what ``pmll_read`` returns
    (chronological, right-aligned, blank = zero rows). Colour = the segment a token came from."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    states = wraparound_states(capacity, segments)
    bounds = [0, *itertools.accumulate(segments)]     # segment of token t: bisect_right - 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.55 * len(states) + 1.6))
    cmap = plt.get_cmap("tab10")
    for ax, key, title in ((axes[0], "slots", "ring storage: token in each slot"),
                           (axes[1], "read", "pmll_read: chronological, right-aligned")):
        for r, st in enumerate(states):
            for c, tok in enumerate(st[key]):
                color = "white" if tok < 0 else cmap((bisect.bisect_right(bounds, tok) - 1) % 10)
                ax.add_patch(Rectangle((c, -r - 1), 1, 1, facecolor=color, edgecolor="grey",
                                       alpha=0.55 if tok >= 0 else 1.0))
                if tok >= 0:
                    ax.text(c + 0.5, -r - 0.5, str(tok), ha="center", va="center", fontsize=9)
            if key == "slots":
                ax.add_patch(Rectangle((st["next_slot"], -r - 1), 1, 1, fill=False,
                                       edgecolor="black", lw=2.2))
        ax.set_xlim(0, capacity)
        ax.set_ylim(-len(states), 0)
        ax.set_xticks([c + 0.5 for c in range(capacity)], range(capacity))
        ax.set_yticks([-r - 0.5 for r in range(len(states))],
                      [f"+{st['tokens']} -> count {st['count']}" for st in states])
        ax.set_xlabel("slot" if key == "slots" else "read row (oldest ... newest)")
        ax.set_title(title, fontsize=10)
        ax.tick_params(length=0)
    fig.suptitle(f"Ring of M = {capacity} slots, segments of {list(segments)} tokens "
                 "(bold box: next slot written)", fontsize=10)
    fig.tight_layout()
    return fig


# ---- targets, tables and plots ----------------------------------------------------------------

CELL = TT.PMLL_CELL
PARAMS = CELL + ("segments", "impl")
L2 = TT.L2_RINGS
TARGET_SET = TT.SETS[TT.PMLL_RING]
TARGETS = TT.for_report(TT.PMLL_RING)
"""The Triton kernels' bandwidth targets on launches past the L2; the CUDA twins' (SPEC §1,
``kernels/pmll_ring.cu``) at a ring and segment of 8192 rows, and their time against Triton's on
the same launches (reported; ``target_table``)."""


def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    return P.correctness_table(with_impl(df), by=("impl", "gate", "dtype"))


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    return P.failed_points(with_impl(df), PARAMS)


def plot_errors(df: pd.DataFrame):
    return plots.plot_errors(df, {"pmll_read": LABELS["pmll_read"], "pmll_write": "write",
                                  "memory_attention": "memory_attention (reference path)"},
                             "Ring against the float64 reference")


def _series(w: pd.DataFrame) -> pd.DataFrame:
    return w.assign(series=[f"pmll_write:{g}" if k == "pmll_write" else k
                            for k, g in zip(w["kernel"], w["gate"])])


def plot_throughput(df: pd.DataFrame):
    """On a GPU achieved GB/s against the bytes each launch moves, one panel per dtype, with
    the copy roofline; on the CPU the interpreter's wall time (labelled so)."""
    import matplotlib.pyplot as plt

    w = P.wide(with_impl(df))
    if w.empty:
        return None
    w = _series(w)
    gpu = P.on_gpu(w)
    y = "gbps" if gpu else "time_us"
    dtypes = sorted(w["dtype"].unique())
    fig, axes = plt.subplots(1, len(dtypes), figsize=(2.4 + 4 * len(dtypes), 3.6), sharey=True,
                             squeeze=False, layout="constrained")
    roof = P.roofline_gbps(df) if gpu else None
    markers = {"pmll_read": "o", "pmll_write:none": "s", "pmll_write:bt": "^",
               "pmll_write:bht": "v"}
    impls = [i for i in IMPLS if i in set(w["impl"])]
    for ax, dt in zip(axes[0], dtypes):
        for s_ in LABELS:
            for impl in impls:          # Triton filled, the CUDA twin hollow
                d = w[(w["dtype"] == dt) & (w["series"] == s_) & (w["impl"] == impl)]
                if len(d):
                    c = plots.color(s_)
                    ax.scatter(d["bytes"].astype(float), d[y].astype(float), s=16, alpha=0.8,
                               marker=markers.get(s_, "o"), edgecolors=c,
                               facecolors=c if impl == "triton" else "none",
                               label=LABELS[s_] + ("" if impl == "triton" else ", CUDA twin"))
        if roof:
            ax.axhline(roof, color="k", ls="--", lw=1, label=f"copy roofline {roof:.0f} GB/s")
            ax.axvline(H200_L2_BYTES, color="grey", ls=":", lw=1, label="the H200's L2")
        ax.set(xscale="log", yscale="linear" if gpu else "log", title=dt,
               xlabel="bytes moved per launch (fewest needed)")
    axes[0][0].set_ylabel("GB/s" if gpu else "time per launch (us)\nTriton interpreter wall "
                          "time, not GPU speed")
    fig.suptitle("PMLL ring read and write", fontsize=10)
    plots.legend_outside(fig)
    return fig


def bandwidth_table(df: pd.DataFrame, min_bytes: float = L2) -> pd.DataFrame:
    """GB/s and roofline fraction per implementation, series, segment regime (``T <= M``, or
    ``T > M``: several passes per slot) and dtype over launches moving at least ``min_bytes``:
    median and best. GPU runs only."""
    w = P.wide(with_impl(df))
    if w.empty or not P.on_gpu(w):
        return pd.DataFrame()
    w = _series(w[w["bytes"].astype(float) >= min_bytes])
    w = w.assign(series=w["series"].map(LABELS),
                 segment=["-" if k == "pmll_read" else ("T > M" if t > m else "T <= M")
                          for k, t, m in zip(w["kernel"], w["T"], w["M"])])
    return (w.groupby(["impl", "series", "segment", "dtype"])
            .agg(launches=("gbps", "size"), median_gbps=("gbps", "median"),
                 best_gbps=("gbps", "max"), median_roofline=("roofline_frac", "median"),
                 best_roofline=("roofline_frac", "max")).reset_index())


def findings(df: pd.DataFrame) -> pd.DataFrame:
    """Facts (``targets.facts``): bit-exact reads and ungated writes, points with ``T > M``, the
    worst gated write per dtype, CUDA-twin points not run; on a GPU the one-token write's median
    time per implementation."""
    df = with_impl(df)
    ok = df[df["status"] == "ok"] if len(df) else df
    err = ok[ok["metric"] == "rel_l2"] if len(ok) else ok
    rows = []
    if len(err):
        for label, sel in (("reads bit-exact", err["kernel"] == "pmll_read"),
                           ("ungated writes bit-exact",
                            (err["kernel"] == "pmll_write") & (err["gate"] == "none"))):
            v = err.loc[sel, "value"].astype(float)
            if len(v):
                rows.append(fact(label, int((v == 0).sum()), f"of {len(v)} checks"))
        if (ok["T"] > ok["M"]).any():
            rows.append(fact("points writing segments longer than the ring (T > M)",
                             ok.loc[ok["T"] > ok["M"], "point_id"].nunique(), "points"))
        g = err[(err["kernel"] == "pmll_write") & (err["gate"] != "none")]
        for dt, gd in g.groupby("dtype"):
            rows.append(fact(f"gated writes, {dt}: worst rel. L2", gd["value"].max(), "rel. L2",
                             f"tolerance {WRITE_TOL[dt]:.1e}"))
    na = df[df["status"] == "unavailable"] if len(df) and "status" in df else df.iloc[0:0]
    if len(na):
        rows.append(fact("points of the CUDA C++ twins not run here", len(na), "points",
                         str(na["reason"].iloc[0])))
    w = P.wide(df)
    if len(w) and P.on_gpu(w):
        for impl in IMPLS:
            t = w[(w["T"] == 1) & (w["kernel"] == "pmll_write") & (w["impl"] == impl)]["time_us"]
            if len(t):
                who = "" if impl == "triton" else ", CUDA twin"
                rows.append(fact(f"one-token write (decode){who}: median time", t.median(), "us",
                                 "latency-bound, not bandwidth-bound"))
    return facts(rows)
