"""The pmll_ring notebook's sweep point, tables and plots: the PMLL memory ring (SPEC §1).

For one point (batch ``B``, heads ``H``, capacity ``M``, segment length ``T``, head size ``D``,
memory ``dtype``, ``gate`` "none" / "bt" / "bht", ``segments`` written, ``seed``),
``ring_point``:

1. makes a ring of seeded random rows with seeded per-sequence counts in ``[0, 3M)`` (empty,
   partly filled and wrapped sequences side by side), and ``segments`` seeded segments of ``T``
   rows (``T > M`` allowed);
2. writes the segments with the ``pmll_write`` kernel and checks the ring against the float64
   sequential reference (``pmll_lab.reference.pmll.ring_write``);
3. reads it back with ``pmll_read(mem, t_ctx=T)`` and checks it against the reference gather of
   the same memory (a copy: must be exact);
4. runs ``memory_attention`` over the ring for a segment of ``min(T, 128)`` queries and checks it
   against the float64 reference attention;
5. only if every check passed (else ``CheckFailed``): times ``pmll_read`` and ``pmll_write``
   (``pmll_lab.bench.time_launch``) and emits GB/s over the fewest bytes each must move
   (``pmll_lab.pmll.read_bytes`` / ``write_bytes``) and, on a GPU, the roofline fraction.

On large rings the float64 checks run on *probe* sequences and heads (the first and last of
each, so the largest offsets are covered): the kernels still run on the whole ring. Inputs come
from ``pmll_lab.inputs.pmll_inputs`` (CPU generator: same values on every device) while a
tensor has at most ``CPU_INPUT_ELEMS`` elements, and from a seeded generator on the device
above that (drawing a GB of normals on the CPU would dominate a GPU sweep).

Kernels in the rows: ``pmll_write``, ``pmll_read``, ``memory_attention`` (checked only: it is
the PyTorch reference path, not a kernel worth timing; the fused kernel is checked and timed by
``pmll_lab.experiments.pmll_attention``).
"""

from __future__ import annotations

import pandas as pd
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import H200_L2_BYTES, error_rows, throughput_rows, time_launch
from pmll_lab.inputs import pmll_inputs
from pmll_lab.pmll import RingMemory, memory_attention, pmll_read, pmll_write, read_bytes, write_bytes
from pmll_lab.reference import pmll as ref
from pmll_lab.sweep import CheckFailed, grid
from pmll_lab.experiments.common import error_strip
from pmll_lab.experiments.common import failed_points as _failed_points

WRITE_TOL = {"float32": 1e-6, "bfloat16": 1.6e-2, "float16": 2e-3}
"""rel_l2 tolerance of the ring after gated writes, per memory dtype: 8 unit roundoffs (a
gated blend is rounded to the dtype once per token on a slot; tests/test_pmll.py). Ungated
writes and reads are copies: tolerance 0."""
ATTN_TOL = {"float32": 1e-5, "bfloat16": 8e-3, "float16": 1e-3}
"""rel_l2 tolerance of ``memory_attention`` (fp32 math, output rounded once to the dtype)."""
CPU_INPUT_ELEMS = 1 << 22
"""Largest tensor drawn on the CPU generator; larger ones are drawn on the device."""
FULL_CHECK_ELEMS = 1 << 21
"""Rings with at most this many elements per tensor are checked whole; larger ones on probes."""
ATTN_TOKENS = 128
"""Queries in the attention check (its scores are ``[probe B, probe H, T', M + T']``)."""

LABELS = {"pmll_read": "read (t_ctx = T)", "pmll_write:none": "write, no gate",
          "pmll_write:bt": "write, gate [B, T]", "pmll_write:bht": "write, gate [B, H, T]"}


def points(grids: list[dict]) -> list[dict]:
    """Expand the notebook's grids (each a dict of axes ``B, H, M, T, D, dtype, gate,
    segments`` and optionally ``seed``) into points, duplicates dropped, order kept."""
    out, seen = [], set()
    for g in grids:
        axes = {"seed": [0], **g}
        for p in grid(**axes):
            key = tuple(sorted(p.items()))
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


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


def _probes(n: int) -> list[int]:
    return sorted({0, n - 1})


# ---- the point --------------------------------------------------------------------------------

def ring_point(point: dict) -> list[dict]:
    """Check then time one point; returns tidy rows (see the module docstring)."""
    B, H, M, T, D = (int(point[n]) for n in ("B", "H", "M", "T", "D"))
    segments, seed, gate = int(point.get("segments", 1)), int(point.get("seed", 0)), point["gate"]
    dname = point["dtype"]
    dtype = getattr(torch, dname)
    mem = initial_memory(seed, B, H, M, D, dtype)
    whole = B * H * M * D <= FULL_CHECK_ELEMS
    bs = list(range(B)) if whole else _probes(B)
    hs = list(range(H)) if whole else _probes(H)
    bi, hi = torch.tensor(bs, device=DEVICE), torch.tensor(hs, device=DEVICE)

    def probe(t):                     # [B, H, ...] -> the probed sequences and heads
        return t.index_select(0, bi).index_select(1, hi)

    rk, rv, rc = probe(mem.k), probe(mem.v), mem.count.index_select(0, bi)
    for s in range(segments):
        x = segment_inputs(seed * 1000 + s + 1, B, H, T, D, gate=gate, dtype=dtype)
        pmll_write(mem, x["k_new"], x["v_new"], x["gate"], validate=True)
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
    k_out, v_out = pmll_read(mem, T)
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

    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r['what']}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", rows)

    # timing, after every check passed
    rows += throughput_rows("pmll_read", time_launch(lambda: pmll_read(mem, T)),
                            read_bytes(mem.lengths, H, M, D, T, dtype=dtype))
    gdtype = torch.float32 if x["gate"] is None else x["gate"].dtype
    nbytes = write_bytes(B, H, M, D, T, dtype=dtype, gate=None if gate == "none" else gate,
                         gate_dtype=gdtype)
    rows += throughput_rows("pmll_write",
                            time_launch(lambda: pmll_write(mem, x["k_new"], x["v_new"], x["gate"])),
                            nbytes)
    for r in rows:
        if "bytes" in r or r["metric"] in ("time_us", "roofline_frac"):
            r["ring_bytes"] = ring_bytes(point)
    return rows


# ---- wraparound picture ---------------------------------------------------------------------

def wraparound_states(capacity: int = 8, segments=(5, 6, 3, 11)) -> list[dict]:
    """Write tokens numbered 0, 1, 2 ... in segments of the given lengths into a one-head ring
    with the kernels, and after each segment record which token sits in which slot (``slots``,
    -1 where empty), the chronological read (``read``, -1 for the zero rows) and the next slot.
    Token ``n`` is written as the row ``[n, n, ...]`` (exact in fp32), so the numbers shown are
    what the kernels stored and read, not a simulation."""
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
    bounds = [0]
    for s in segments:
        bounds.append(bounds[-1] + s)

    def seg_of(tok):
        return next(i for i in range(len(segments)) if bounds[i] <= tok < bounds[i + 1])

    fig, axes = plt.subplots(1, 2, figsize=(11, 0.55 * len(states) + 1.6))
    cmap = plt.get_cmap("tab10")
    for ax, key, title in ((axes[0], "slots", "ring storage: token in each slot"),
                           (axes[1], "read", "pmll_read: chronological, right-aligned")):
        for r, st in enumerate(states):
            for c, tok in enumerate(st[key]):
                color = "white" if tok < 0 else cmap(seg_of(tok) % 10)
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


# ---- tables and plots -------------------------------------------------------------------------

def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """Worst rel_l2 per (kernel, gate, dtype, what) with its tolerance and how many points
    passed."""
    err = df[df["metric"] == "rel_l2"].copy()
    err["gate"] = err["gate"].where(err["kernel"] == "pmll_write", "-")
    t = (err.groupby(["kernel", "gate", "dtype", "what"])
         .agg(points=("value", "size"), passed=("passed", "sum"),
              worst_rel_l2=("value", "max"), tolerance=("tolerance", "max"))
         .reset_index())
    mx = df[df["metric"] == "max_abs"].copy()
    mx["gate"] = mx["gate"].where(mx["kernel"] == "pmll_write", "-")
    worst_abs = mx.groupby(["kernel", "gate", "dtype", "what"])["value"].max()
    t["worst_max_abs"] = [worst_abs.get(tuple(r), float("nan"))
                          for r in t[["kernel", "gate", "dtype", "what"]].itertuples(index=False)]
    t["passed"] = t["passed"].astype(int)
    return t[["kernel", "gate", "dtype", "what", "points", "passed", "worst_rel_l2",
              "worst_max_abs", "tolerance"]]


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    """One line per failed point: its parameters and error text."""
    return _failed_points(df, ("B", "H", "M", "T", "D", "dtype", "gate", "segments"))


def plot_errors(df: pd.DataFrame, ax=None):
    """rel_l2 against the float64 reference per kernel (write split by gate), one colour per
    dtype; tolerances as short dashes; exact results (0) drawn at 1e-12."""
    import matplotlib.pyplot as plt

    err = df[df["metric"] == "rel_l2"].copy()
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.8))
    err["cat"] = [f"{k}\n{'gate ' + g if k == 'pmll_write' else ''}".strip()
                  for k, g in zip(err["kernel"], err["gate"])]
    error_strip(ax, err, sorted(err["cat"].unique()), legend_title="memory dtype (-- tolerance)")
    ax.set_ylim(5e-13, 1)
    ax.set_ylabel("rel. L2 error vs float64 reference")
    ax.set_title("Error against the float64 reference (exact = 0, drawn at 1e-12)", fontsize=10)
    return ax


def _timed(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    from pmll_lab.sweep import speed_rows

    sel = speed_rows(df, metric).copy()
    sel["series"] = [("pmll_write:" + g) if k == "pmll_write" else k
                     for k, g in zip(sel["kernel"], sel["gate"])]
    return sel


def _on_gpu(sel: pd.DataFrame) -> bool:
    return "timer" in sel and (sel["timer"] == "do_bench").any()


def plot_throughput(df: pd.DataFrame):
    """On a GPU: achieved GB/s of read and write against the bytes each launch moves, one
    panel per dtype, with the measured copy roofline. On the CPU: interpreter wall time per
    launch against bytes (labelled as such: not GPU speed)."""
    import matplotlib.pyplot as plt

    gb = _timed(df, "gbps")
    if gb.empty:
        return None
    gpu = _on_gpu(gb)
    if gpu:
        sel = gb
    else:
        sel = _timed(df, "time_us")
        nbytes = gb.set_index(["point_id", "kernel"])["bytes"]
        sel["bytes"] = [nbytes.get((p, k), float("nan"))
                        for p, k in zip(sel["point_id"], sel["kernel"])]
    dtypes = sorted(sel["dtype"].unique())
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4.6 * len(dtypes), 3.8), sharey=True,
                             squeeze=False)
    roof = None
    if gpu and "copy_gbps" in df:
        vals = df["copy_gbps"].dropna()
        roof = float(vals.iloc[0]) if len(vals) else None
    series = [s for s in LABELS if s in set(sel["series"])]
    for ax, dt in zip(axes[0], dtypes):
        for i, s in enumerate(series):
            d = sel[(sel["dtype"] == dt) & (sel["series"] == s)].sort_values("bytes")
            if not d.empty:
                ax.scatter(d["bytes"].astype(float), d["value"].astype(float), s=16,
                           color=f"C{i}", label=LABELS[s], alpha=0.8)
        if roof:
            ax.axhline(roof, color="k", ls="--", lw=1, label=f"copy roofline {roof:.0f} GB/s")
            ax.axvline(H200_L2_BYTES, color="grey", ls=":", lw=1,
                       label=f"{H200_L2_BYTES / 1e6:.0f} MB (H200 L2)")
        ax.set_xscale("log")
        ax.set_yscale("log" if not gpu else "linear")
        ax.set_xlabel("bytes moved per launch (fewest needed)")
        ax.set_title(dt, fontsize=10)
    axes[0][0].set_ylabel("GB/s" if gpu else
                          "time per launch (us)\nTriton interpreter wall time, not GPU speed")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle("PMLL ring read and write: " + ("achieved bandwidth vs the copy roofline"
                                                 if gpu else "interpreter wall time"), fontsize=10)
    fig.tight_layout()
    return fig


def bandwidth_table(df: pd.DataFrame, min_bytes: float = 4 * H200_L2_BYTES) -> pd.DataFrame:
    """GB/s and roofline fraction per series, segment regime (``T <= M`` or ``T > M``: a
    segment longer than the ring, written in several passes per slot) and dtype, over launches
    moving at least ``min_bytes`` (default 4x the H200's L2, ``bench.H200_L2_BYTES``): median
    and best. Empty on the CPU."""
    gb = _timed(df, "gbps")
    if gb.empty or not _on_gpu(gb):
        return pd.DataFrame()
    gb = gb[gb["bytes"].astype(float) >= min_bytes]
    fr = _timed(df, "roofline_frac").set_index(["point_id", "kernel"])["value"]
    gb["roofline_frac"] = [fr.get((p, k), float("nan")) for p, k in zip(gb["point_id"], gb["kernel"])]
    gb["series"] = gb["series"].map(LABELS)
    gb["segment"] = ["-" if k == "pmll_read" else ("T > M" if t > m else "T <= M")
                     for k, t, m in zip(gb["kernel"], gb["T"], gb["M"])]
    return (gb.groupby(["series", "segment", "dtype"])
            .agg(launches=("value", "size"), median_gbps=("value", "median"),
                 best_gbps=("value", "max"), median_roofline=("roofline_frac", "median"),
                 best_roofline=("roofline_frac", "max"))
            .reset_index())


def conclusion(df: pd.DataFrame) -> str:
    """A few sentences written from the results (markdown)."""
    lines = []
    n_pts = df["point_id"].nunique()
    n_fail = df[df["status"] == "failed"]["point_id"].nunique()
    lines.append(f"- {n_pts} points run, {n_fail} failed their checks"
                 + ("." if n_fail == 0 else ": see the failed points above."))
    ok = df[df["status"] == "ok"]
    err = ok[ok["metric"] == "rel_l2"]
    if not err.empty:
        exact_read = bool((err[err["kernel"] == "pmll_read"]["value"].astype(float) == 0).all())
        ung = err[(err["kernel"] == "pmll_write") & (err["gate"] == "none")]["value"].astype(float)
        lines.append(f"- Read is {'bit-exact' if exact_read else 'NOT exact'} at every point; "
                     + (f"ungated writes are {'bit-exact' if (ung == 0).all() else 'NOT exact'}"
                        if not ung.empty else "no ungated writes run")
                     + "." + (f" {ok[ok['T'] > ok['M']]['point_id'].nunique()} of the points "
                              "wrote segments longer than the ring (T > M)."
                              if (ok["T"] > ok["M"]).any() else ""))
        gated = err[(err["kernel"] == "pmll_write") & (err["gate"] != "none")]
        for dt, g in gated.groupby("dtype"):
            lines.append(f"- Gated writes, {dt}: worst rel. L2 {g['value'].astype(float).max():.1e}"
                         f" (tolerance {WRITE_TOL[dt]:.1e}).")
        att = err[err["kernel"] == "memory_attention"]
        if not att.empty:
            lines.append("- memory_attention (reference path) worst rel. L2: "
                         + ", ".join(f"{dt} {g['value'].astype(float).max():.1e}"
                                     for dt, g in att.groupby("dtype")) + ".")
    bw = bandwidth_table(df)
    if not bw.empty:
        roof = df["copy_gbps"].dropna()
        roof_txt = f"{float(roof.iloc[0]):.0f} GB/s" if len(roof) else "the copy bandwidth"
        lines.append(f"- On launches moving >= 240 MB (4x L2), against the measured copy "
                     f"bandwidth of {roof_txt}:")
        for _, r in bw.iterrows():
            seg = "" if r["segment"] == "-" else f"{r['segment']}, "
            lines.append(f"    - {r['series']}, {seg}{r['dtype']}: median {r['median_gbps']:.0f} GB/s "
                         f"= {r['median_roofline']:.0%} of the roofline (best "
                         f"{r['best_roofline']:.0%}, {int(r['launches'])} launches).")
        small = _timed(df, "gbps")
        small = small[(small["T"] == 1) & (small["kernel"] == "pmll_write")]
        if not small.empty:
            t = _timed(df, "time_us")
            t = t[(t["T"] == 1) & (t["kernel"] == "pmll_write")]["value"].astype(float)
            lines.append(f"- A one-token write (decode) moves only KBs: it costs {t.median():.1f} us "
                         "(median), the launcher's host overhead and launch latency, not bandwidth "
                         "(launches under ~100 us are bound by it in this sweep).")
    elif not ok.empty:
        lines.append("- Timings are Triton-interpreter wall times on the CPU: they say nothing "
                     "about GPU speed; run the full preset on a GPU for bandwidth.")
    return "\n".join(lines)

