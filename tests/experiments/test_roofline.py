"""The roofline notebook's point functions (pmll_lab.experiments.roofline); its tables, plots and
targets: test_roofline_report.py.

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
import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from _roofline_helpers import OURS, SHAPE, fresh_cache, points as _points  # noqa: F401 (autouse)
from pmll_lab import peers
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import roofline as E
from pmll_lab.experiments import gdn_case as C
from pmll_lab.gdn import row_io_bytes, state_bytes
from pmll_lab.harness.runner import valid_speed_rows
from pmll_lab.sweep import CheckFailed, run_sweep


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
    shown = set(valid_speed_rows(df)["kernel"]) | set(E.wide_table(df)["kernel"])
    assert shown == {"decodes", "carry_exact_lazy", "carry_exact_lazy:nowb", "carry_exact_lazy:wb"}
    assert set(E.failed_points(df)["provider"]) == {"chain_snapshots", "carry_exact_eager"}



def test_a_roofline_provider_whose_supports_raises_still_gets_its_points(monkeypatch):
    """An implementation whose ``supports`` raises (a researcher's own, say) is not dropped
    from the grid, nor does it stop the grid: its points are built, to run and be checked."""
    import dataclasses

    from pmll_lab.harness import registry

    def broken(case):
        raise KeyError("rows")

    name = "chain_snapshots"
    monkeypatch.setitem(registry.IMPLEMENTATIONS, name,
                        dataclasses.replace(registry.get(name), supports=broken))
    pts = E.points([dict(K=[2], B=[1], providers=[name], **SHAPE)], fla=False, flashinfer=False)
    assert [p["provider"] for p in pts] == [name]
