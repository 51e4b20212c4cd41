"""The gdn_verify notebook's sweep point: verifying K draft rows with the snapshot chain.

For one point (``K`` rows, head size ``head_dim = kd = vd``, ``HK`` key / ``HV`` value heads,
``B`` sequences, input ``dtype``, ``state_layout``: ``"kv"`` K-major state ``[S, HV, kd, vd]``,
``"vk"`` V-major ``[S, HV, vd, kd]``, the same ``H`` transposed) ``verify_point``:

1. draws seeded inputs (``pmll_lab.inputs.gdn_inputs``; permuted, skipping slots) whose gates
   ``g, beta`` come from raw Qwen3-Next gating inputs ``A_log, a, dt_bias, b``
   (``pmll_lab.experiments.common.gating_inputs``, fp32), so that FlashInfer, which takes the raw
   inputs, gates as our kernels do; the V-major state is the K-major draw transposed;
2. runs the float64 reference chain (``gdn_chain_ref``, in the point's layout);
3. runs the chain with snapshots (``gdn_chain`` with ``intermediate [B, K-1, HV, ...]``), the
   same chain without snapshots, and ``K`` successive ``gdn_decode`` launches, all in the
   point's layout; checks each against the reference (outputs, final state, snapshots) and the
   chain against the decodes *bitwise* (SPEC §2 "Exactness", within one layout): any failure
   raises ``CheckFailed`` before anything is timed;
4. peers on a GPU, each checked before it is timed (a peer that disagrees is recorded with
   ``passed = False`` and not timed; our figures stand):
   FLA's ``fused_recurrent_gated_delta_rule`` over the same K rows at ``"kv"`` points (fla-core
   importable; a speed reference that keeps no snapshots, so it cannot roll back), against the
   float64 reference; FlashInfer's ``gated_delta_rule_mtp`` with its snapshot buffer and
   ``disable_state_update=True`` (the snapshot verify SGLang runs: ``K`` states written, the pool
   left as it was) at ``"vk"`` points with ``K >= 2``, ``head_dim >= 128`` and bf16/fp16 inputs
   (flashinfer-python importable), fed the raw gating inputs and checked against the float64
   chain with *its own* gating recomputed in float64 on the first ``N_REF`` sequences
   (outputs, snapshots, final state), against our chain over all ``B`` sequences within the
   same tolerances, and for an untouched pool (bitwise);
5. times each and emits time, GB/s over SPEC §4's bytes and the roofline fraction. On a GPU every
   timed launch gets two timers (``timings``): ``timer="do_bench"`` (each call as Python issues
   it, host launch included) and ``timer="cuda_graph"`` (``pmll_lab.bench.time_cuda_graph``:
   the median of ``GRAPH_REPLAYS`` individually timed graph replays, GPU time); on the CPU one,
   ``"interpreter-wall"``. Tables and plots use cuda_graph where present (``timed``).

Kernels in the rows: ``chain`` (with snapshots), ``chain_nosnap``, ``decodes`` (K launches),
``fla_fused_recurrent``, ``flashinfer_mtp_snapshots``.

The tables, plots, headline and conclusion live in ``pmll_lab.experiments.gdn_report``; they are
reachable as attributes of this module (``gdn.headline``), imported on first use.
"""

from __future__ import annotations

import pandas as pd
import torch

from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab import bench
from pmll_lab.bench import (
    bitwise_equal, error_rows, throughput_rows, time_cuda_graph, time_launch,
)
from pmll_lab.gdn import (
    chain_bytes, decodes_bytes, gdn_chain, gdn_chain_ref, gdn_decode, row_io_bytes, state_bytes,
)
from pmll_lab.inputs import gdn_inputs
from pmll_lab.experiments.common import (  # noqa: F401  (COMPILE_KEYS: for the notebook)
    COMPILE_KEYS, gating_inputs,
)
from pmll_lab.experiments.common import head_points, parts_getattr
from pmll_lab.peers import (  # noqa: F401  (flashinfer_status: for the notebook)
    fla_available, fla_runner, flashinfer_available, flashinfer_mtp_runner, flashinfer_status,
    flashinfer_supports, flashinfer_version, fused_gating,
)
from pmll_lab.sweep import CheckFailed, one_device

STATE_TOL = 1e-5
"""rel_l2 tolerance of fp32 states and snapshots against the float64 reference (tests/test_gdn.py
states the measured margins)."""
O_TOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
"""rel_l2 tolerance of outputs per input dtype (outputs are rounded once to that dtype)."""
N_REF = 4
"""Sequences a peer is checked on against the float64 reference with its own gating."""
LAYOUTS = ("kv", "vk")
"""State layouts: ``"kv"`` K-major ``[S, HV, kd, vd]``; ``"vk"`` V-major ``[S, HV, vd, kd]``."""
LAYOUT_NAMES = {"kv": "K-major", "vk": "V-major"}
WARMUP_MS, REP_MS = 10, 50
"""``do_bench`` warm-up and measurement windows (ms) per timed launch."""
GRAPH_REPLAYS = 100
"""Graph replays timed per launch (``time_cuda_graph``'s minimum, the issue's >= 100)."""
TIMERS = ("cuda_graph", "do_bench", "interpreter-wall")
"""Timers in order of preference for tables and plots."""
TIMER_LABELS = {"cuda_graph": "CUDA graph replay, median (GPU time)",
                "do_bench": "do_bench, median (host launch included)",
                "interpreter-wall": "Triton interpreter wall time, not GPU speed"}

KERNELS = ("chain", "chain_nosnap", "decodes", "fla_fused_recurrent", "flashinfer_mtp_snapshots")
PEERS = ("fla_fused_recurrent", "flashinfer_mtp_snapshots")
LABELS = {"chain": "chain + snapshots (ours)", "chain_nosnap": "chain, no snapshots (ours)",
          "decodes": "K successive decodes (ours)",
          "fla_fused_recurrent": "FLA fused_recurrent (no snapshots)",
          "flashinfer_mtp_snapshots": "FlashInfer mtp + snapshots"}


def points(grids: list[dict]) -> list[dict]:
    """The notebook's grids -> points. Axes ``K, B, head_dim, heads [(HK, HV)], dtype`` and
    ``state_layout`` (list of ``"kv"`` / ``"vk"``; default ``["kv"]``). Duplicates dropped, order
    kept. Raises ``ValueError`` for an unknown layout."""
    out, seen = [], set()
    for g in grids:
        g = dict(g)
        g.setdefault("state_layout", ["kv"])
        bad = [x for x in g["state_layout"] if x not in LAYOUTS]
        if bad:
            raise ValueError(f"state_layout: unknown {bad}; known {list(LAYOUTS)}")
        for p in head_points([g]):
            key = tuple(sorted(p.items()))
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


# ---- timers ------------------------------------------------------------------------------------

def on_cuda() -> bool:
    """Whether the kernels run on a GPU (not the Triton interpreter)."""
    return DEVICE.type == "cuda" and not INTERPRET


def timings(fn, *, graph: bool = True) -> list[dict]:
    """Timings of the zero-argument call ``fn``: ``time_launch``'s (``do_bench`` on a GPU with
    ``WARMUP_MS``/``REP_MS``, interpreter wall time of one call on the CPU) and, on a GPU with
    ``graph``, ``time_cuda_graph``'s (``GRAPH_REPLAYS`` replays). Each: ``median_us, p20_us,
    p80_us, timer``. A capture that fails loses only the graph figure: its error text goes on
    the do_bench timing (``graph_error``)."""
    return bench.timings(fn, graph=graph and on_cuda(), warmup_ms=WARMUP_MS, rep_ms=REP_MS,
                         cpu_reps=1, replays=GRAPH_REPLAYS, launch_timer=time_launch,
                         graph_timer=time_cuda_graph)


def speed_rows(kernel: str, times: list[dict], nbytes: int, **extra) -> list[dict]:
    """``throughput_rows`` for each timing in ``times`` (one timer each: ``time_us`` in us,
    ``gbps`` over ``nbytes``, ``roofline_frac`` on a GPU), with ``bytes``, the graph replay count
    or capture error on the time row, and ``extra`` on every row."""
    rows = []
    for t in times:
        for r in throughput_rows(kernel, t, nbytes):
            r.update(extra)
            r["bytes"] = int(nbytes)
            if r["metric"] == "time_us":
                r.update({k: t[k] for k in ("replays", "graph_error") if k in t})
            rows.append(r)
    return rows


def best_timer(df: pd.DataFrame) -> str | None:
    """The timer tables and plots use: cuda_graph where any time row has it, else do_bench,
    else the interpreter's wall time (None without time rows)."""
    if df.empty or "timer" not in df or "metric" not in df:
        return None
    have = set(df.loc[df["metric"] == "time_us", "timer"].dropna())
    return next((t for t in TIMERS if t in have), None)


def timed(df: pd.DataFrame, metric: str = "time_us", timer: str | None = None) -> pd.DataFrame:
    """Rows of ``metric`` from points that passed their checks (``status == "ok"``; a peer that
    failed its own check has no timing rows), one timer only (``best_timer`` by default), with
    ``state_layout`` filled as ``"kv"`` for rows written before the layout axis, from one kind
    of device (``pmll_lab.sweep.one_device``)."""
    if df.empty or "metric" not in df:
        return df.iloc[0:0]
    timer = best_timer(df) if timer is None else timer
    sel = df[(df["metric"] == metric) & (df["status"] == "ok")].copy()
    if "timer" in sel:
        sel = sel[sel["timer"] == timer]
    sel["state_layout"] = sel["state_layout"].fillna("kv") if "state_layout" in sel else "kv"
    return one_device(sel)      # a sweep over mixed GPUs never mixes device kinds in a plot


def on_gpu(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds GPU timings."""
    return "timer" in df and df["timer"].isin(["do_bench", "cuda_graph"]).any()


def with_layout(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``state_layout`` present (``"kv"`` where missing: rows from before the axis)."""
    df = df.copy()
    df["state_layout"] = df["state_layout"].fillna("kv") if "state_layout" in df else "kv"
    return df


# ---- the sweep point -----------------------------------------------------------------------------

def _flag(kernel: str, what: str, ok: bool, metric: str = "bitwise_vs_decodes") -> dict:
    return {"kernel": kernel, "metric": metric, "value": float(ok), "passed": bool(ok),
            "what": what}


def flashinfer_snapshot_check(x: dict, gate: dict, state0: torch.Tensor, o_c: torch.Tensor,
                              st_final: torch.Tensor, inter: torch.Tensor, otol: float):
    """Check FlashInfer's snapshot verify (``gated_delta_rule_mtp`` with its buffer, pool frozen)
    on a V-major point before it is timed; GPU and flashinfer-python only (``RuntimeError``
    otherwise, from ``pmll_lab.peers``).

    ``x``: the point's inputs (``q, k [B, K, HK, kd]``, ``v [B, K, HV, vd]``, ``state_indices
    [B]``); ``gate``: ``gating_inputs`` of the same rows; ``state0 [S, HV, vd, kd]`` fp32, the
    pool before the verify (not written); ``o_c [B, K, HV, vd]``, ``st_final [B, HV, vd, kd]``,
    ``inter [B, K-1, HV, vd, kd]``: our chain's outputs, final states and snapshots from the
    same pool. Returns ``(rows, run)``: error rows named ``flashinfer_mtp_snapshots`` (against
    the float64 chain with FlashInfer's gating on the first ``N_REF`` sequences, against ours
    over all ``B``) and the untouched-pool flag; ``run`` is the zero-argument call to time, or
    None when a check failed."""
    name = "flashinfer_mtp_snapshots"
    B, K = x["q"].shape[:2]
    D = x["q"].shape[-1]
    idx = x["state_indices"]
    pool = state0.clone()
    a, b = gate["a"], gate["b"]
    run, bufs = flashinfer_mtp_runner(x["q"], x["k"], x["v"], gate["A_log"], a, gate["dt_bias"],
                                      b, pool, idx, scale=D ** -0.5, snapshots=True, frozen=True)
    run()
    o, buf = bufs["o"], bufs["intermediate"]                    # [B, K, HV, vd], [B, K, HV, vd, kd]
    n = min(B, N_REF)
    # float64 reference with FlashInfer's own gating (rows follow the batch rows, as q, k, v do)
    g64, beta64 = fused_gating(*(t.cpu() for t in (gate["A_log"], a[:n], gate["dt_bias"], b[:n])),
                               dtype=torch.float64)
    sub = state0[idx[:n].long()].to("cpu", torch.float64)
    o_r, s_r, i_r = gdn_chain_ref(sub, *(x[m][:n].cpu() for m in ("q", "k", "v")), g64, beta64,
                                  state_layout="vk")
    rows = (error_rows(name, o[:n], o_r, tol=otol, what="o")
            + error_rows(name, buf[:n, K - 1], s_r, tol=STATE_TOL, what="state")
            + error_rows(name, buf[:n, :K - 1], i_r, tol=STATE_TOL, what="snapshots")
            + error_rows(name, o, o_c.to(o.dtype), tol=otol, what="o vs our chain")
            + error_rows(name, buf[:, K - 1], st_final, tol=STATE_TOL, what="state vs our chain")
            + error_rows(name, buf[:, :K - 1], inter, tol=STATE_TOL,
                         what="snapshots vs our chain"))
    rows.append(_flag(name, "pool unchanged (disable_state_update=True)",
                      bitwise_equal(pool, state0), metric="state_untouched"))
    ok = all(r["passed"] for r in rows)
    return rows, (run if ok else None)


def peer_failure_row(kernel: str, exc: BaseException) -> dict:
    """A peer's exception inside a point as one row of that peer (``metric="error"``,
    ``status="failed"``, the exception as ``error``), so that the point keeps our kernels'
    checked and timed rows: a peer's crash (FlashInfer 0.7.2's K-row kernel raises
    ``ZeroDivisionError`` at head size 256 on the H200) drops that peer only."""
    return {"kernel": kernel, "metric": "error", "value": None, "status": "failed",
            "error": f"{type(exc).__name__}: {exc}"}


PEER_KERNELS = ("fla_fused_recurrent", "flashinfer_mtp_snapshots")
"""The peers run inside a gdn_verify or carry_protocol point: their exceptions become
``peer_failure_row`` rows (checks and timing alike)."""


def peer_rows(name: str, fn, *args, **kwargs):
    """``(fn(*args, **kwargs), None)``, or ``(None, [peer_failure_row(name, exc)])`` when the
    call raises and ``name`` is a peer (``PEER_KERNELS``); our kernels' exceptions pass."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - a peer's failure loses none of our rows
        if name not in PEER_KERNELS:
            raise
        return None, [peer_failure_row(name, exc)]


def timed_rows(timed_fns) -> list[dict]:
    """``speed_rows`` of each ``(name, fn, bytes, extra)`` (``extra``: columns of its rows); a
    peer that raises while timed gives its ``peer_failure_row`` instead."""
    rows = []
    for name, fn, nbytes, extra in timed_fns:
        t, failed = peer_rows(name, timings, fn)
        rows += failed or speed_rows(name, t, nbytes, **extra)
    return rows


def peer_snapshot_check(*args) -> tuple[list[dict], object]:
    """``flashinfer_snapshot_check(*args)``, or ``([peer_failure_row(...)], None)`` when
    FlashInfer raises."""
    out, failed = peer_rows("flashinfer_mtp_snapshots", flashinfer_snapshot_check, *args)
    return out if failed is None else (failed, None)


def verify_point(point: dict) -> list[dict]:
    """Check then time one point; returns tidy rows (see the module docstring).

    Point keys: ``K, B, HK, HV, head_dim``; optional ``dtype`` (default bf16), ``state_layout``
    (``"kv"``), ``seed`` (0). Rows: ``rel_l2`` / ``max_abs`` error rows and
    ``bitwise_vs_decodes`` flags (``passed``), then per timer ``time_us`` (with
    ``time_per_row_us``), ``gbps`` and on a GPU ``roofline_frac`` rows. Raises ``CheckFailed``
    (nothing timed) when one of our kernels fails a check; ``ValueError`` for an unknown layout.
    """
    K, D, HK, HV, B = (int(point[n]) for n in ("K", "head_dim", "HK", "HV", "B"))
    dname = point.get("dtype", "bfloat16")
    dtype = getattr(torch, dname)
    layout = point.get("state_layout", "kv")
    if layout not in LAYOUTS:
        raise ValueError(f"state_layout: must be one of {LAYOUTS}, got {layout!r}")
    lay = {"state_layout": layout}
    seed = int(point.get("seed", 0))
    x = gdn_inputs(seed, B, HK, HV, D, D, rows=K, dtype=dtype)
    gate = gating_inputs(seed + 11, (B, K), HV)
    x["g"], x["beta"] = gate["g"], gate["beta"]
    state0 = x["state"] if layout == "kv" else x["state"].transpose(-1, -2).contiguous()
    idx = x["state_indices"]
    sel = idx.long()
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    o_ref, s_ref, i_ref = gdn_chain_ref(state0, *args, state_indices=idx, **lay)
    s_ref = s_ref[sel]
    otol = O_TOL[dname]
    rows: list[dict] = []

    # chain with snapshots
    st_c = state0.clone()
    inter = torch.empty(B, K - 1, HV, D, D, device=DEVICE)
    o_c = gdn_chain(st_c, *args, state_indices=idx, intermediate=inter, validate=True, **lay)
    rows += error_rows("chain", o_c, o_ref, tol=otol, what="o")
    rows += error_rows("chain", st_c[sel], s_ref, tol=STATE_TOL, what="state")
    if K > 1:
        rows += error_rows("chain", inter, i_ref, tol=STATE_TOL, what="snapshots")
    del i_ref

    # chain without snapshots
    st_n = state0.clone()
    o_n = gdn_chain(st_n, *args, state_indices=idx, validate=True, **lay)
    same_n = bitwise_equal(o_n, o_c) and bitwise_equal(st_n, st_c)

    # K successive decodes (row views made once, reused by the timing below)
    row_args = [tuple(t[:, r] for t in args) for r in range(K)]
    st_d = state0.clone()
    outs, same_snaps = [], True
    for r in range(K):
        outs.append(gdn_decode(st_d, *row_args[r], state_indices=idx, validate=True, **lay))
        if r < K - 1:
            same_snaps = same_snaps and bitwise_equal(st_d[sel], inter[:, r])
    o_d = torch.stack(outs, dim=1)
    rows += error_rows("decodes", o_d, o_ref, tol=otol, what="o")
    rows += error_rows("decodes", st_d[sel], s_ref, tol=STATE_TOL, what="state")
    same_o, same_s = bitwise_equal(o_c, o_d), bitwise_equal(st_c, st_d)
    for what, ok in (("o", same_o), ("state", same_s), ("snapshots", same_snaps),
                     ("no-snapshot chain", same_n)):
        rows.append(_flag("chain", what, ok))
    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r['what']}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", rows)

    # peers (checked; a disagreement is recorded and drops only that peer's timing)
    run_fla = run_fi = None
    if layout == "kv" and fla_available():
        fla, failed = peer_rows("fla_fused_recurrent", fla_run_once, args,
                                state0[sel].contiguous(), D)
        if failed:
            rows += failed
        else:
            run_fla, (o_f, h_f) = fla
            frows = (error_rows("fla_fused_recurrent", o_f, o_ref, tol=otol, what="o")
                     + error_rows("fla_fused_recurrent", h_f, s_ref, tol=STATE_TOL,
                                  what="state"))
            rows += frows
            if not all(r["passed"] for r in frows):
                run_fla = None
            del o_f, h_f
    if (layout == "vk" and K >= 2 and flashinfer_available()
            and flashinfer_supports(D, dname)):
        firows, run_fi = peer_snapshot_check(x, gate, state0, o_c, st_c[sel], inter, otol)
        rows += firows
    del o_ref, s_ref

    # timing (after every check passed)
    io = dict(num_k_heads=HK, num_v_heads=HV, k_dim=D, v_dim=D, dtype=dtype)
    hb = state_bytes(HV, D, D)
    rowio = row_io_bytes(HK, HV, D, D, dtype)

    def run_chain():
        gdn_chain(st_c, *args, state_indices=idx, intermediate=inter, **lay)

    def run_nosnap():
        gdn_chain(st_n, *args, state_indices=idx, **lay)

    def run_decodes():
        for r in range(K):
            gdn_decode(st_d, *row_args[r], state_indices=idx, **lay)

    timed_fns = [("chain", run_chain, chain_bytes(B, K, **io), {}),
                 ("chain_nosnap", run_nosnap, B * (2 * hb + K * rowio + 4), {}),
                 ("decodes", run_decodes, decodes_bytes(B, K, **io), {})]
    if run_fla is not None:
        timed_fns.append(("fla_fused_recurrent", run_fla, B * (2 * hb + K * rowio), {}))
    if run_fi is not None:
        # K states written to the buffer, the pool read once: (K+1)*Hb, as the chain
        timed_fns.append(("flashinfer_mtp_snapshots", run_fi, chain_bytes(B, K, **io),
                          {"flashinfer_version": flashinfer_version()}))
    for r in timed_rows(timed_fns):
        if r["metric"] == "time_us":
            r["time_per_row_us"] = r["value"] / K
        rows.append(r)
    return rows


def fla_run_once(args, h0: torch.Tensor, D: int):
    """FLA's fused_recurrent on the rows ``args`` from ``h0``: ``(run, run())``."""
    run, _ = fla_runner(*args, h0, scale=D ** -0.5)
    return run, run()


# ---- tables, plots, headline and conclusion (their own module) --------------------------------

_PARTS = ("gdn_report",)


# The tables, plots, headline and conclusion live in ``gdn_report`` (which imports this
# module); they are reachable here too (``gdn.headline``), imported on first use.
__getattr__ = parts_getattr(__name__, _PARTS)
