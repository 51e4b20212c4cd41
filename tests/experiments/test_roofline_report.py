"""The roofline notebook's tables, plots, targets and headline (pmll_lab.experiments.roofline,
roofline_report, targets): on interpreter rows (the checks only, no ratio of interpreter times)
and on constructed GPU rows (met / missed / not measured), at the tiny shapes of
test_roofline.py.
"""

from __future__ import annotations

import pandas as pd
import pytest

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from _roofline_helpers import OURS, SHAPE, fresh_cache  # noqa: F401 (fresh_cache: autouse)
from pmll_lab.experiments import roofline as E
from pmll_lab.experiments import targets as T
from pmll_lab.sweep import run_sweep


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


def test_state_dtype_targets_judge_their_own_pool():
    """The bf16-pool targets and the CUDA twin's take the rows of their state dtype only: a
    bf16 decode slower than FlashInfer's misses beside an fp32 decode that meets its target."""
    bf = {"state_layout": "vk", "state_dtype": "bfloat16"}
    df = _gpu_rows([
        ("decodes", 1, 64, 70.0, 0.9, {"state_layout": "vk"}),
        ("flashinfer_decode", 1, 64, 75.0, 0.85, {"state_layout": "vk"}),
        ("decodes", 1, 64, 45.0, 0.7, bf),
        ("flashinfer_decode", 1, 64, 44.0, 0.72, bf),
        ("carry_exact_lazy:nowb", 4, 128, 130.0, 0.2, bf),          # 130 / 110 = 1.18 <= 1.2
        ("flashinfer_mtp_frozen", 4, 128, 110.0, 0.3, bf),
        ("decodes_cuda", 1, 8, 14.0, 0.5, {"state_layout": "vk"}),
        ("flashinfer_decode", 1, 8, 15.0, 0.5, {"state_layout": "vk"}),
        ("decodes_cuda", 1, 8, 12.0, 0.3, bf),
        ("flashinfer_decode", 1, 8, 11.8, 0.3, bf),
    ])
    h = T.headline(df, E.TARGETS)
    assert _status(h, "decode K=1: ours", 64)["status"] == "met"
    r = _status(h, "bf16 state: decode K=1", 64)
    assert (r["status"], r["ours_us"], r["peer_us"]) == ("missed", 45.0, 44.0)
    r = _status(h, "bf16 state: carry lazy exact K=4 without write-back", 128)
    assert r["status"] == "met" and r["bound"] == 1.2
    assert _status(h, "bf16 state: decode K=1", 128)["status"] == "not measured"
    r = _status(h, "decode K=1, CUDA C++ twin <= FlashInfer decode, fp32", 8)
    assert (r["status"], r["ours_us"]) == ("met", 14.0)
    r = _status(h, "decode K=1, CUDA C++ twin <= FlashInfer decode, bf16", 8)
    assert (r["status"], r["ours_us"], r["peer_us"]) == ("missed", 12.0, 11.8)


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
