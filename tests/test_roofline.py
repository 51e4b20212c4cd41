"""The roofline notebook's point functions, tables and targets (pmll_lab.experiments.roofline).

On the CPU the providers run in the Triton interpreter at tiny shapes (HK=2, HV=4, kd=vd=16,
K <= 2, B <= 2). What is held here:

- every provider checks against the float64 references and the decode launches, and the rows it
  returns carry real values: finite errors within tolerance, positive times, bytes and GB/s; the
  lazy carry's amortised time is the stated mix of its two timings at the simulated write-back
  frequency;
- the check runs before any timing: a provider whose kernel is corrupted raises ``CheckFailed``
  and ``time_launch`` is never called;
- in a sweep, a provider that fails its check or crashes (a simulated out-of-memory) is stored as
  failed, is left out of every speed table, and the other providers still run;
- the acceptance process (analytic cases), the byte counts, the points' order, and the
  headline's met / missed / not measured logic on constructed GPU rows; on interpreter rows the
  headline holds the checks only, with no ratio of interpreter times.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab import peers
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import roofline as E
from pmll_lab.experiments import roofline_case as C
from pmll_lab.experiments import targets as T
from pmll_lab.gdn import row_io_bytes, state_bytes
from pmll_lab.sweep import CheckFailed, run_sweep, speed_rows

SHAPE = dict(head_dim=[16], heads=[(2, 4)], dtype=["bfloat16"])
OURS = [p for p in E.OURS if p not in E.CUDA_TWINS]   # the CUDA twins: tests/test_roofline_cuda.py


def _points(K, B, providers=OURS, **kw):
    return E.points([dict(K=[K], B=[B], providers=providers, **SHAPE)], fla=False, **kw)


@pytest.fixture(autouse=True)
def _fresh_cache():
    E.release()
    yield
    E.release()


# ---- acceptance process and bytes ---------------------------------------------------------------

def test_acceptance_process():
    alpha = E.alpha_for_mean(3.3, 4)
    assert abs(E.mean_accept_len(alpha, 4) - 3.3) < 1e-9
    a4 = E.acceptance(4)
    assert a4["alpha"] == pytest.approx(alpha)
    # eager: the pending count before a verify is the previous step's accepted count
    assert a4["eager_wb"] == 1.0
    assert abs(a4["eager_mean_pend"] - 3.3) < 0.05
    assert 0.2 < a4["lazy_wb"] < 0.8
    for K in (1, 2, 4, 8):
        h = np.asarray(E.acceptance(K)["lazy_hist"])
        assert abs(h.sum() - 1) < 1e-12 and h[0] == 0.0   # every step accepts at least one row
    # K = 1 accepts one row per step: p runs 1..8 and writes back once in 8 verifies
    assert E.acceptance(1)["lazy_wb"] == pytest.approx(1 / 8)
    # K = CAP: every verify after the first has p >= 1 rows pending, so p + K > CAP
    assert E.acceptance(8)["lazy_wb"] == 1.0
    with pytest.raises(ValueError, match="mean_len"):
        E.alpha_for_mean(5.0, 4)


def test_draw_pending_conditions():
    rng = np.random.default_rng(0)
    K, cap = 4, E.CAP
    h = E.acceptance(K)["lazy_hist"]
    nowb = E.draw_pending(h, 500, K, rng, write_back=False)
    wb = E.draw_pending(h, 500, K, rng, write_back=True)
    assert (nowb + K <= cap).all() and (nowb >= 1).all()
    assert (wb + K > cap).all() and (wb <= cap).all()
    assert len(set(nowb.tolist())) > 1 and len(set(wb.tolist())) > 1
    # no pending count avoids a write-back at K = CAP: the fresh slot (p = 0) is used
    h8 = E.acceptance(8)["lazy_hist"]
    assert (E.draw_pending(h8, 5, 8, rng, write_back=False) == 0).all()


def test_byte_counts():
    HK, HV, D, dt = 2, 4, 16, torch.bfloat16
    hb, io, row = state_bytes(HV, D, D), row_io_bytes(HK, HV, D, D, dt), E.stash_row_bytes(HV, D, D)
    assert row == 4 * (HV * D + HV + HV * D)
    B, K = 3, 2
    zero = np.zeros(B, dtype=int)
    assert E.carry_bytes(zero, zero.astype(bool), K, HK, HV, D, dt) == \
        E.floor_bytes(B, K, HK, HV, D, dt) + 12 * B
    pend, wb = np.array([0, 3, 5]), np.array([False, False, True])
    assert E.carry_bytes(pend, wb, K, HK, HV, D, dt) - E.carry_bytes(zero, zero.astype(bool), K, HK,
                                                                      HV, D, dt) == hb + 8 * row
    assert E.fla_bytes(B, K, HK, HV, D, dt) == B * (2 * hb + K * io)


def test_points_order_and_fields():
    grids = [dict(K=[2, 1], B=[2, 1], **SHAPE),
             dict(K=[4], B=[3], head_dim=[32], heads=[(2, 4)], dtype=["bfloat16"],
                  providers=["carry_exact_lazy"])]
    pts = E.points(grids, fla=False, seed=5)
    assert not any(p["provider"] == "chain_snapshots" and p["K"] == 1 for p in pts)
    assert not any(p["provider"] == "fla_fused_recurrent" for p in pts)
    assert any(p["provider"] == "fla_fused_recurrent" for p in E.points(grids, fla=True))
    small = [p for p in pts if p["head_dim"] == 16]
    assert {(p["slots"], p["rows_max"]) for p in small} == {(2, 2)}
    assert [p for p in pts if p["head_dim"] == 32][0]["slots"] == 3
    # one (K, B) after the other, its providers in PROVIDERS order
    keys = [(p["K"], p["B"], E.PROVIDERS.index(p["provider"])) for p in small]
    assert keys == sorted(keys)
    assert all(p["seed"] == 5 and p["mean_accept"] == 3.3 for p in pts)
    with pytest.raises(ValueError, match="providers"):
        E.points([dict(K=[1], B=[1], providers=["nope"], **SHAPE)], fla=False)


# ---- the point functions ------------------------------------------------------------------------

def _timed_rows(rows, kernel):
    return {r["metric"]: r for r in rows if r["kernel"] == kernel and "timer" in r}


@pytest.mark.parametrize("provider", OURS)
def test_point_rows_have_real_values(provider):
    K, B = 2, 2
    pt = [p for p in _points(K, B) if p["provider"] == provider][0]
    rows = E.gdn_point(pt)
    checks = [r for r in rows if "passed" in r]
    assert checks and all(r["passed"] is True for r in checks)
    assert {r["impl"] for r in rows} == {"triton"}       # ours, in Triton (the results schema)
    errs = [r for r in rows if r["metric"] == "rel_l2"]
    assert errs and all(math.isfinite(r["value"]) and r["value"] <= r["tolerance"] for r in errs)
    flags = [r for r in rows if r["metric"] in ("bitwise_vs_decode", "engaged_as_protocol")]
    if provider != "decodes":
        assert flags, "bitwise / protocol flags expected"
    kernels = [provider] + ([f"{provider}:nowb", f"{provider}:wb"] if provider.endswith("lazy") else [])
    for kern in kernels:
        t = _timed_rows(rows, kern)
        assert t["time_us"]["value"] > 0 and math.isfinite(t["time_us"]["value"])
        assert t["time_us"]["timer"] == "interpreter-wall"
        assert t["gbps"]["value"] > 0 and t["gbps"]["bytes"] > 0
        # first timing row comes after every check row: the checks ran first
        first_time = min(i for i, r in enumerate(rows) if r["kernel"] == kern and "timer" in r)
        assert max(i for i, r in enumerate(rows) if "passed" in r) < first_time
    if provider.endswith("lazy"):
        f = E.acceptance(K)["lazy_wb"]
        t0, t1, ta = (_timed_rows(rows, k)["time_us"] for k in kernels[1:] + kernels[:1])
        assert ta["value"] == pytest.approx((1 - f) * t0["value"] + f * t1["value"])
        assert ta["wb_frac"] == pytest.approx(f) and ta["variant"] == "amortised"
        assert t0["wb_frac"] == 0.0 and t1["wb_frac"] == 1.0
    if provider.endswith("eager"):
        assert _timed_rows(rows, provider)["time_us"]["wb_frac"] == 1.0


def test_fla_point_on_the_interpreter(monkeypatch):
    """FLA's kernel runs in the Triton interpreter too: the provider's checks (both GVA paths)
    are exercised here by pretending to be on the GPU. fla-core is a dev dependency: the test
    fails where it does not import."""
    pt = [p for p in E.points([dict(K=[2], B=[2], **SHAPE)], fla=True)
          if p["provider"] == "fla_fused_recurrent"][0]
    monkeypatch.setattr(P, "on_cuda", lambda: True)
    assert peers.fla_fused_recurrent() is not None, "fla-core (dev extra) must import here"
    for gva in (True, False):
        monkeypatch.setattr(peers, "fla_supports_gva", lambda gva=gva: gva)
        rows = E.gdn_point(pt)
        errs = [r for r in rows if r["metric"] == "rel_l2"]
        assert len(errs) == 4 and all(r["passed"] for r in errs)
        t = _timed_rows(rows, "fla_fused_recurrent")["time_us"]
        assert t["value"] > 0 and t["fla_gva"] == ("native" if gva else "repeat_interleave")


def test_graph_rows_and_floor_fields(monkeypatch):
    """The GPU-only rows, with the device parts stubbed (the interpreter has no CUDA graph and
    no roofline): every timed launch gets a ``cuda_graph`` time row next to its do_bench one
    (launch plans: do_bench only), the amortised lazy figure is the same mix of the two timings
    per timer, and the roofline fraction and floor time follow from the bytes."""
    import pmll_lab.bench as bench

    assert bench.time_cuda_graph(lambda: None) is None        # the CPU has no CUDA graph
    roof = 4000.0
    graphs = iter([3.0, 5.0])    # nowb, wb (the plans are not graph-timed)

    def fake_graph(fn, replays):
        fn()
        t = next(graphs)
        return {"median_us": t, "p20_us": t - 0.5, "p80_us": t + 0.5, "replays": replays,
                "timer": "cuda_graph"}

    monkeypatch.setattr(P, "on_cuda", lambda: True)
    monkeypatch.setattr(P, "time_cuda_graph", fake_graph)
    monkeypatch.setattr(P, "copy_bandwidth", lambda: roof)
    monkeypatch.setattr(bench, "copy_bandwidth", lambda: roof)
    pt = [p for p in _points(2, 1) if p["provider"] == "carry_exact_lazy"][0]
    rows = E.gdn_point(pt)
    f = E.acceptance(2)["lazy_wb"]

    def timed(kernel, timer):
        return {r["metric"]: r for r in rows if r["kernel"] == kernel and r.get("timer") == timer}

    g0, g1, ga = (timed(k, "cuda_graph") for k in ("carry_exact_lazy:nowb", "carry_exact_lazy:wb",
                                                    "carry_exact_lazy"))
    assert (g0["time_us"]["value"], g1["time_us"]["value"]) == (3.0, 5.0)
    assert g0["time_us"]["replays"] == E.GRAPH_REPLAYS >= 100
    assert ga["time_us"]["value"] == pytest.approx((1 - f) * 3.0 + f * 5.0)
    assert ga["time_us"]["p20"] == pytest.approx((1 - f) * 2.5 + f * 4.5)
    for k in ("carry_exact_lazy:nowb:plan", "carry_exact_lazy:wb:plan"):
        assert timed(k, "cuda_graph") == {} and timed(k, "interpreter-wall")["time_us"]["value"] > 0
    w0 = timed("carry_exact_lazy:nowb", "interpreter-wall")
    assert w0["gbps"]["bytes"] == g0["gbps"]["bytes"] > 0
    for t in (g0, g1, ga, w0):
        nbytes = t["gbps"]["bytes"]
        assert t["time_us"]["floor_us"] == pytest.approx(nbytes / (roof * 1e3))
        assert t["roofline_frac"]["value"] == pytest.approx(t["gbps"]["value"] / roof)
    assert g1["gbps"]["bytes"] > g0["gbps"]["bytes"]      # the write-back moves the state twice


def test_graph_capture_failure_keeps_the_other_timing(monkeypatch):
    def broken(fn, replays):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(P, "on_cuda", lambda: True)
    monkeypatch.setattr(P, "time_cuda_graph", broken)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    pt = [p for p in _points(1, 2) if p["provider"] == "decodes"][0]
    rows = E.gdn_point(pt)
    t = [r for r in rows if r["metric"] == "time_us"]
    assert len(t) == 1 and t[0]["value"] > 0 and "not permitted" in t[0]["graph_error"]


def _corrupt(fn, which):
    def wrapped(*args, **kw):
        out = fn(*args, **kw)
        if which == "o":
            o = out[0] if isinstance(out, tuple) else out
            o.mul_(1.5)
        elif which == "snapshots":
            kw["intermediate"][:, 0].add_(1e-3)
        return out
    return wrapped


@pytest.mark.parametrize("provider,target,which", [
    ("decodes", "gdn_decode", "o"),
    ("chain_snapshots", "gdn_chain", "snapshots"),
    ("carry_exact_eager", "gdn_carry_verify", "o"),
    ("carry_exact_lazy", "gdn_carry_verify", "o"),
])
def test_check_runs_before_timing(monkeypatch, provider, target, which):
    timed = []
    monkeypatch.setattr(P, "time_launch", lambda fn, **kw: timed.append(fn) or {})
    monkeypatch.setattr(C, target, _corrupt(getattr(C, target), which))
    pt = [p for p in _points(2, 2) if p["provider"] == provider][0]
    with pytest.raises(CheckFailed) as info:
        E.gdn_point(pt)
    assert timed == [], "a provider that failed its check was timed"
    assert any(r.get("passed") is False for r in info.value.rows)


@pytest.mark.parametrize("provider,target", [("decodes", "gdn_decode_plan"),
                                             ("carry_exact_lazy", "gdn_carry_verify_plan")])
def test_launch_plans_are_checked_at_b1(monkeypatch, provider, target):
    """At B = 1 the launch plans run too (kernel ``<name>:plan``): checked bitwise against the
    plain launchers on their second call, timed, and a plan whose second call is wrong fails
    the point before anything is timed."""
    pt = [p for p in _points(2, 1) if p["provider"] == provider][0]
    rows = E.gdn_point(pt)
    flags = [r for r in rows if r["kernel"].endswith(":plan") and "passed" in r]
    assert flags and all(r["passed"] for r in flags)
    assert any(r["kernel"].endswith(":plan") and r["metric"] == "time_us" and r["value"] > 0
               for r in rows)
    if provider.endswith("lazy"):       # the plan call amortised as the launch is
        f = E.acceptance(2)["lazy_wb"]
        t0, t1, ta = (_timed_rows(rows, f"{provider}{k}:plan")["time_us"]["value"]
                      for k in (":nowb", ":wb", ""))
        assert ta == pytest.approx((1 - f) * t0 + f * t1) and t0 > 0 and t1 > 0

    real = getattr(C, target)

    def wrong_second_call(*args, **kw):
        plan, calls = real(*args, **kw), []

        def call():
            out = plan()
            calls.append(1)
            if len(calls) == 2:
                (out[0] if isinstance(out, tuple) else out).add_(1.0)
            return out
        return call

    timed = []
    E.release()
    monkeypatch.setattr(C, target, wrong_second_call)
    monkeypatch.setattr(P, "time_launch", lambda fn, **kw: timed.append(fn) or {})
    with pytest.raises(CheckFailed):
        E.gdn_point(pt)
    assert timed == []


def test_failed_providers_are_marked_and_the_rest_runs(monkeypatch, tmp_path):
    real_verify, released = C.gdn_carry_verify, []

    def verify(*args, lazy, **kw):
        if not lazy:
            raise torch.OutOfMemoryError("simulated out of memory")
        return real_verify(*args, lazy=lazy, **kw)

    real_release = E.release
    monkeypatch.setattr(C, "gdn_carry_verify", verify)
    monkeypatch.setattr(C, "gdn_chain", _corrupt(C.gdn_chain, "snapshots"))
    monkeypatch.setattr(E, "release", lambda: released.append(1) or real_release())
    pts = _points(2, 2, providers=["decodes", "chain_snapshots", "carry_exact_eager",
                                   "carry_exact_lazy"])
    df = run_sweep("rl", pts, E.gdn_point, results_dir=tmp_path, progress=False)
    status = df.groupby("provider")["status"].agg(set)
    assert status["decodes"] == {"ok"} and status["carry_exact_lazy"] == {"ok"}
    assert status["chain_snapshots"] == {"failed"} and status["carry_exact_eager"] == {"failed"}
    err = df.groupby("provider")["error"].first()
    assert err["chain_snapshots"].startswith("check failed")
    assert "OutOfMemoryError" in err["carry_exact_eager"]
    assert released, "an out-of-memory error must drop the cached inputs"
    # the failed check's rows are kept (marked failed), and never shown as speeds
    chain = df[df["provider"] == "chain_snapshots"]
    assert (chain["passed"] == False).any()  # noqa: E712
    shown = set(speed_rows(df)["kernel"]) | set(E.wide_table(df)["kernel"])
    assert shown == {"decodes", "carry_exact_lazy", "carry_exact_lazy:nowb", "carry_exact_lazy:wb"}
    assert set(E.failed_points(df)["provider"]) == {"chain_snapshots", "carry_exact_eager"}


# ---- tables, plots and targets --------------------------------------------------------------------

def test_tables_and_plots_on_interpreter_results(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    pts = E.points([dict(K=[2], B=[1, 2], providers=OURS, **SHAPE)], fla=False)
    df = run_sweep("rl", pts, E.gdn_point, results_dir=tmp_path, progress=False)
    assert (df["status"] == "ok").all()
    corr = E.correctness_table(df)
    assert (corr["passed"] == corr["points"]).all() and len(corr) > 10
    lazy = E.lazy_table(df, Bs=(1, 2))
    assert set(lazy["form"]) == {"exact"}
    assert lazy[["eager", "no write-back", "write-back", "amortised"]].gt(0).all().all()
    assert (E.b1_table(df)["time_us"] > 0).all()
    shapes = E.shapes_table(df, B=64, K=2)
    assert set(shapes["kernel"]) == set(OURS) and (shapes["B"] == 2).all()
    fig = E.plot_roofline(df)
    assert len(fig.axes) == 1 and "interpreter" in fig.axes[0].get_ylabel()
    assert E.plot_errors(df) is not None
    assert T.headline(df, E.TARGETS).empty            # no speed verdict on the CPU
    head = T.checks_headline(df)
    assert list(head.columns) == T.CHECK_COLUMNS and (head["status"] == "passed").all()
    assert set(head["kernel"]) == set(OURS) and (head["passed"] == head["checks"]).all()
    assert "no speed verdict on the CPU" in T.verdict(df, head, E.TARGET_SET)


def _gpu_rows(entries, roof=4000.0):
    """Constructed GPU rows: ``entries`` = (kernel, K, B, time_us, roofline_frac, extra); each
    gets a cuda_graph time (``time_us``) and a do_bench time (``extra["do_bench"]``, default
    ``time_us + 2``), with their gbps and roofline rows; ``extra`` may set ``state_layout``."""
    rows = []
    for i, (kern, K, B, t, fr, extra) in enumerate(entries):
        extra = dict(extra)
        t_db = extra.pop("do_bench", t + 2.0)
        timers = [("cuda_graph", t)] + ([("do_bench", t_db)] if t_db is not None else [])
        if kern.endswith(":plan"):
            timers = [("do_bench", t)]
        base = dict(E.MAIN_SHAPE, K=K, B=B, provider=kern.split(":")[0], point_id=f"p{i}",
                    status="ok", error="", kernel=kern, state_layout="kv")
        base.update(extra)
        nbytes = fr * roof * 1e3 * t
        for timer, tt in timers:
            rows += [dict(base, timer=timer, metric="time_us", value=tt),
                     dict(base, timer=timer, metric="gbps", value=nbytes / (tt * 1e3),
                          bytes=nbytes),
                     dict(base, timer=timer, metric="roofline_frac", value=fr * t / tt,
                          copy_gbps=roof)]
    return pd.DataFrame(rows)


def _status(h, prefix, B=None):
    hits = h[h["target"].str.startswith(prefix) & (True if B is None else h["B"] == B)]
    assert len(hits) == 1, (prefix, B)
    return hits.iloc[0]


def test_targets_logic_on_constructed_gpu_rows():
    import matplotlib
    matplotlib.use("Agg")
    df = _gpu_rows([
        ("carry_exact_lazy", 4, 64, 40.0, 0.80, {}),        # 80 % and 150/40 = 3.75x: met
        ("fla_fused_recurrent", 4, 64, 150.0, 0.3, {}),
        ("carry_exact_lazy", 4, 128, 80.0, 0.40, {}),       # 40 %: missed; no FLA: not measured
        ("decodes", 1, 64, 90.0, 0.86, {}),                 # 86 % met; 90 vs 100: faster, met
        ("fla_fused_recurrent", 1, 64, 100.0, 0.8, {}),
        ("carry_exact_lazy", 4, 1, 4.0, 0.01, {"do_bench": 12.0}),   # 12 us > 10: missed
    ])
    h = T.headline(df, E.TARGETS)
    assert _status(h, "carry lazy exact K=4, amortised: >= 50%", 64)["status"] == "met"
    assert _status(h, "carry lazy exact K=4: >= 2.5x", 64)["status"] == "met"
    assert _status(h, "carry lazy exact K=4, amortised: >= 50%", 128)["status"] == "missed"
    assert _status(h, "carry lazy exact K=4: >= 2.5x", 128)["status"] == "not measured"
    assert _status(h, "carry lazy exact K=4, amortised: <= 0.4x", 64)["status"] == "not measured"
    assert _status(h, "decode K=1 >= 85%", 64)["status"] == "met"
    r = _status(h, "decode K=1 faster than FLA", 64)
    assert r["status"] == "met" and r["ratio"] == pytest.approx(0.9)
    r = _status(h, "B=1, K=4: lazy exact verify call", 1)
    assert (r["status"], r["ours_us"], r["timer"]) == ("missed", 12.0, "do_bench")
    assert _status(h, "PMLL read")["status"] == "not measured"
    assert list(h.columns[:2]) == ["status", "target"]
    line = T.verdict(df, h, E.TARGET_SET)
    assert f"{(h['status'] == 'met').sum()} of {h['bound'].notna().sum()} targets met" in line
    fig = E.plot_roofline(df)
    assert len(fig.axes) == 2 * df["K"].nunique()       # time row and roofline-fraction row


def test_headline_on_constructed_gpu_rows():
    df = _gpu_rows([
        ("decodes", 1, 64, 80.0, 0.8, {}),
        ("decodes", 1, 64, 70.0, 0.9, {"state_layout": "vk"}),     # the faster layout
        ("flashinfer_decode", 1, 64, 75.0, 0.85, {"state_layout": "vk"}),
        ("decodes", 1, 128, 160.0, 0.8, {}),
        ("flashinfer_decode", 1, 128, 150.0, 0.85, {"state_layout": "vk"}),
        ("decodes", 1, 256, 300.0, 0.8, {}),                         # no FlashInfer at 256
        ("chain_snapshots", 4, 64, 300.0, 0.5, {}),
        ("flashinfer_mtp_snapshots", 4, 64, 190.0, 0.84, {"state_layout": "vk"}),
        ("carry_exact_lazy", 4, 64, 70.0, 0.5, {}),                  # 70/190 = 0.368 <= 0.4
        ("carry_exact_lazy:nowb", 4, 64, 80.0, 0.4, {"mean_pend": 2.5}),
        ("flashinfer_mtp_frozen", 4, 64, 81.0, 0.4, {"state_layout": "vk"}),
        ("carry_exact_lazy:plan", 4, 1, 9.5, 0.01, {}),
    ])
    h = T.headline(df, E.TARGETS)
    assert list(h.columns) == ["status", "target", "B"] + T.COLUMNS[2:]
    assert set(h["timer"].dropna()) == {"cuda_graph", "do_bench"}
    r = _status(h, "decode K=1: ours", 64)
    assert (r["status"], r["layout"], r["ours_us"], r["peer_us"]) == ("met", "vk", 70.0, 75.0)
    assert r["ratio"] == pytest.approx(70 / 75, abs=1e-3) and r["roofline_frac"] == 0.9
    assert _status(h, "decode K=1: ours", 128)["status"] == "missed"
    r = _status(h, "decode K=1: ours", 256)
    assert r["status"] == "not measured" and "peer" in r["note"]
    assert _status(h, "snapshot verify K=4", 64)["status"] == "missed"
    assert _status(h, "snapshot verify K=4", 128)["status"] == "not measured"
    r = _status(h, "carry lazy exact K=4, amortised: <= 0.4x", 64)
    assert r["status"] == "met" and r["bound"] == 0.4
    assert r["ratio"] == pytest.approx(70 / 190, abs=1e-3)
    r = _status(h, "carry lazy exact K=4 without", 64)
    assert r["status"] == "met" and "mean_pend 2.50" in r["note"]
    # a target's note reaches its row, and only its row
    noted = T.Target("lazy exact K=4 without write-back <= amortised", "carry_exact_lazy:nowb",
                     "carry_exact_lazy", 1.0, where=dict(E.MAIN_SHAPE, K=4, B=[64]),
                     per=("B",), note="a note of this target")
    hn = T.headline(df, [noted, E.TARGETS[0]])
    r = _status(hn, "lazy exact K=4 without", 64)
    assert r["status"] == "missed" and "a note of this target" in r["note"]
    assert "a note of this target" not in str(_status(hn, "decode K=1: ours", 64)["note"])
    plan = _status(h, "B=1, K=4: launch-plan call", 1)
    assert (plan["status"], plan["ours_us"], plan["timer"]) == ("met", 9.5, "do_bench")
    # a run without FlashInfer: targets against it are not measured, the peer named
    h2 = T.headline(df[~df["kernel"].str.startswith("flashinfer")], E.TARGETS)
    r = _status(h2, "decode K=1: ours", 64)
    assert r["status"] == "not measured" and r["note"].startswith("peer not measured")
    # one more target is one more row
    extra = T.Target("ring step <= FlashInfer step", {"form": "ring"},
                     {"form": "flashinfer_replayssm"}, 1.0, metric="step_us",
                     where=dict(K=4, B=[64]), per=("B",))
    steps = pd.DataFrame([dict(point_id=f"s{f}", status="ok", kernel="step", form=f, K=4, B=64,
                               metric="step_us", value=v, timer="cuda_graph", state_dtype="bfloat16")
                          for f, v in (("ring", 40.0), ("flashinfer_replayssm", 42.9))])
    r = T.headline(steps, [extra]).iloc[0]
    assert (r["status"], r["ratio"], r["ours_us"]) == ("met", round(40 / 42.9, 3), 40.0)


def test_headline_on_interpreter_rows_holds_the_checks_only():
    """On the CPU no speed target is judged and no ratio of interpreter times is shown: the
    headline is the checks, and the verdict says there is no speed verdict."""
    df = _gpu_rows([("decodes", 1, 4, 900.0, 0.1, {"do_bench": None}),
                    ("chain_snapshots", 4, 4, 5000.0, 0.1, {"do_bench": None}),
                    ("carry_exact_lazy:nowb", 4, 4, 4000.0, 0.1, {"do_bench": None})])
    df["timer"] = "interpreter-wall"
    df = df[df["metric"] != "roofline_frac"]
    chk = pd.DataFrame([dict(point_id="p0", status="ok", kernel="decodes", metric="rel_l2",
                             value=1e-3, tolerance=8e-3, passed=True, what="o"),
                        dict(point_id="p1", status="ok", kernel="chain_snapshots",
                             metric="bitwise_vs_decode", value=0.0, passed=False, what="o")])
    df = pd.concat([df, chk], ignore_index=True)
    assert T.headline(df, E.TARGETS).empty
    head = T.checks_headline(df).set_index("kernel")
    assert head.loc["decodes", "status"] == "passed"
    assert head.loc["chain_snapshots", "status"] == "failed"
    assert not any("ratio" in c for c in head.columns)
    line = T.verdict(df, head.reset_index(), E.TARGET_SET)
    assert "no speed verdict on the CPU" in line and "1 of 2 passed" in line


def test_half_state_points_tables_and_drift(tmp_path):
    """bf16-state points of our exact providers run beside the fp32 ones (FLA is left out), pass their checks with tagged rows, stay out of the fp32 tables, and meet the
    fp32 rows in ``state_dtype_table``; the drift point compares the two pools over tokens."""
    from pmll_lab.experiments import state_drift as D

    grid = dict(K=[2], B=[2], providers=["decodes", "carry_exact_lazy", "fla_fused_recurrent"],
                state_dtype=["float32", "bfloat16"], **SHAPE)
    pts = E.points([grid], fla=True)
    half = [p for p in pts if p.get("state_dtype") == "bfloat16"]
    assert {p["provider"] for p in half} == {"decodes", "carry_exact_lazy"}
    assert not any("state_dtype" in p for p in pts if p not in half)   # fp32 ids unchanged
    with pytest.raises(ValueError, match="state_dtype"):
        E.gdn_point(dict(half[0], provider="fla_fused_recurrent"))
    pts = [p for p in pts if p["provider"] != "fla_fused_recurrent"]    # FLA needs a GPU
    df = run_sweep("rl16", pts, E.gdn_point, results_dir=tmp_path, progress=False)
    assert (df["status"] == "ok").all()
    chk = df[df["passed"].notna() & (df["state_dtype"] == "bfloat16")]
    assert len(chk) and chk["passed"].astype(bool).all()
    assert chk["what"].str.endswith("[bfloat16 state]").all()
    assert (E.wide_table(df)["state_dtype"] == "float32").all()
    t = E.state_dtype_table(df, Bs=(2,))
    assert set(t["kernel"]) == {"decodes", "carry_exact_lazy"}
    assert (t["bfloat16 state us"] > 0).all() and (t["fp32 state us"] > 0).all()
    assert "ratio" not in t                       # no ratios of interpreter times
    err = t["o rel_l2 vs float64 (bfloat16 rounding)"]
    assert (err > 0).all() and (err <= t["tolerance"]).all()
    drift = D.drift_point(dict(T=5, B=2, HK=2, HV=4, head_dim=16, dtype="bfloat16",
                               state_layout="vk", state_dtype="bfloat16", seed=3))
    assert [r["t"] for r in drift if r["metric"] == "drift_o"] == [1, 2, 4, 5]
    first = [r for r in drift if r["t"] == 1 and r["metric"] == "drift_o"][0]
    assert first["value"] == 0.0, "token 1 reads the same start state in both pools"
    assert all(0 < r["value"] < 0.05 for r in drift if r is not first)
    assert D.checkpoints(4096)[-3:] == [1024, 2048, 4096]
    with pytest.raises(ValueError, match="state_dtype"):
        D.drift_point(dict(T=2, B=1, HK=2, HV=4, head_dim=16, dtype="bfloat16",
                           state_dtype="float32", seed=0))
