"""The gdn_verify and carry_protocol sweep points in both state layouts, and their tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.experiments import carry as C
from pmll_lab.experiments import carry_report as CR
from pmll_lab.experiments import gdn as G
from pmll_lab.experiments import protocol as P


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_gdn_verify_point_checks_pass_in_each_layout(layout):
    seed = int(np.random.default_rng().integers(1 << 20))
    rows = G.verify_point(dict(K=3, B=2, HK=1, HV=2, head_dim=16, dtype="float32",
                               state_layout=layout, seed=seed))
    df = pd.DataFrame(rows)
    bit = df[df["metric"] == "bitwise_vs_decodes"]
    assert set(bit["what"]) == {"o", "state", "snapshots", "no-snapshot chain"}
    assert bit["passed"].all()
    err = df[df["metric"] == "rel_l2"]
    assert set(err["what"]) == {"o", "state", "snapshots"}
    assert (err["value"] <= err["tolerance"]).all() and (err["value"] < 1e-5).all()
    t = df[df["metric"] == "time_us"]
    assert set(t["kernel"]) == {"chain", "chain_nosnap", "decodes"}
    assert (t["timer"] == "interpreter-wall").all()
    assert np.allclose(t["time_per_row_us"], t["value"] / 3)


def test_gdn_points_layout_axis():
    pts = G.points([dict(K=[1], B=[1, 2], head_dim=[16], heads=[(1, 2)], dtype=["bfloat16"]),
                    dict(K=[1], B=[2], head_dim=[16], heads=[(1, 2)], dtype=["bfloat16"],
                         state_layout=["kv", "vk"])])
    assert [(p["B"], p["state_layout"]) for p in pts] == [(1, "kv"), (2, "kv"), (2, "vk")]
    with pytest.raises(ValueError, match="state_layout"):
        G.points([dict(K=[1], B=[1], head_dim=[16], heads=[(1, 1)], state_layout=["kk"])])


def _times(rows):
    base = dict(status="ok", metric="time_us", HK=16, HV=32, head_dim=128, dtype="bfloat16")
    return pd.DataFrame([dict(base, point_id=f"{r[0]}{r[1]}{r[2]}", state_layout=r[0], B=r[1],
                              K=r[2], kernel=r[3], timer=r[4], value=r[5], bytes=r[6])
                         for r in rows])


def test_timed_prefers_cuda_graph_and_crossover_reads_it():
    rows = []
    for B, (e, lz) in {1: (10.0, 12.0), 64: (100.0, 90.0), 256: (400.0, 300.0)}.items():
        rows += [("vk", B, 4, "carry_exact_eager", "cuda_graph", e, 1000 * B),
                 ("vk", B, 4, "carry_exact_lazy", "cuda_graph", lz, 900 * B),
                 # do_bench says otherwise: it must not be read when graph times exist
                 ("vk", B, 4, "carry_exact_eager", "do_bench", lz, 1000 * B),
                 ("vk", B, 4, "carry_exact_lazy", "do_bench", e, 900 * B)]
    df = _times(rows)
    assert P.best_timer(df) == "cuda_graph"
    cross = CR.crossover_table(df)
    assert list(cross["B"]) == [1, 64, 256]
    assert np.allclose(cross["lazy_over_eager"], [1.2, 0.9, 0.75])
    assert set(cross["crossover_B"]) == {64}
    summ = CR.crossover_summary(cross)
    assert summ.loc[0, "lazy faster from B"] == 64 and summ.loc[0, "B=1"] == 1.2


def test_carry_vs_snapshots_time_and_bytes():
    df = _times([("kv", 64, 4, "carry_exact_lazy", "cuda_graph", 150.0, 64 * 3 * 2**20),
                 ("vk", 64, 4, "carry_exact_lazy", "cuda_graph", 140.0, 64 * 3 * 2**20),
                 ("vk", 64, 4, "flashinfer_mtp_snapshots", "cuda_graph", 200.0, 64 * 5 * 2**20)])
    t = CR.carry_vs_snapshots(df)
    assert list(t["state_layout"]) == ["kv", "vk"]
    assert np.allclose(t["lazy / FlashInfer"], [0.75, 0.7])
    assert np.allclose(t["carry lazy moved KiB/seq"], 3 * 1024)
    assert np.allclose(t["FlashInfer moved KiB/seq"], 5 * 1024)
    hb = 4 * 32 * 128 * 128
    held = CR.rollback_bytes(4, 32, 128, 128)
    assert held["FlashInfer K snapshots"] == 4 * hb
    assert held["carry stash + pend"] == 8 * 4 * (32 * 128 + 32 + 32 * 128) + 4
    assert np.allclose(t["FlashInfer holds KiB/seq (GDN states)"], 4 * hb / 1024)


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_carry_verify_point_in_each_layout(layout):
    seed = int(np.random.default_rng().integers(1 << 20))
    rows = C.verify_point(dict(K=3, B=3, HK=1, HV=2, head_dim=16, dtype="float32",
                               state_layout=layout, seed=seed, baselines=layout == "vk"))
    df = pd.DataFrame(rows)
    flags = df[df["metric"].isin(["bitwise_vs_decode", "engaged_as_protocol"])]
    # per mode: engaged as the protocol, outputs and written-back state bitwise
    assert flags["passed"].all() and len(flags) == 6
    err = df[df["metric"] == "rel_l2"]
    assert (err["value"] <= err["tolerance"]).all()
    kernels = set(df.loc[df["metric"] == "time_us", "kernel"])
    assert kernels == set(C.CARRY_KERNELS) | ({"chain_snapshots"} if layout == "vk" else set())
    rs = df[df["kernel"].str.startswith("flashinfer_replayssm")]   # head size 16: not taken
    assert set(rs.get("status", [])) == ({"unsupported"} if layout == "vk" else set())


def test_protocol_point_v_major_is_bitwise_plain_decoding():
    seed = int(np.random.default_rng().integers(1 << 20))
    from pmll_lab.experiments.carry import protocol_point

    rows = protocol_point(dict(form="exact", L=1, S=4, HK=1, HV=2, head_dim=16,
                                 dtype="bfloat16", K=3, steps=3, widths=[1, 3], lazy_min_seqs=2,
                                 eager_max_pending=2, p_zero=0.1, alpha=0.8, seed=seed,
                                 state_layout="vk"))
    df = pd.DataFrame(rows).set_index("metric")
    assert df.loc["bitwise_vs_plain", "passed"] and df.loc["engaged_as_simulated", "passed"]
    assert df.loc["rel_l2_vs_plain", "value"] == 0.0


@pytest.mark.parametrize("module", ["gdn_verify", "carry_protocol"])
@pytest.mark.parametrize("where", ["check", "timing"])
def test_a_peer_that_raises_loses_none_of_our_rows(module, where, monkeypatch, tmp_path):
    """FlashInfer raising inside a point (as its K-row kernel does at head size 256 on the
    H200), in its check or while timed, is stored as one failed row of that peer; our kernels'
    checks and times stay, ok, and the verdict counts no failed point but names the peer."""
    from pmll_lab.experiments import carry_report
    from pmll_lab.experiments import targets as T
    from pmll_lab.sweep import run_sweep

    def boom(*args):
        raise ZeroDivisionError("integer division or modulo by zero")

    def check_then_boom(*args):              # passes its check, raises when timed
        return [], boom

    mod = G if module == "gdn_verify" else C
    monkeypatch.setattr(G, "flashinfer_available", lambda: True)   # both check peers via gdn
    monkeypatch.setattr(G, "flashinfer_supports", lambda *a: True)
    monkeypatch.setattr(G, "flashinfer_snapshot_check",
                        boom if where == "check" else check_then_boom)
    seed = int(np.random.default_rng().integers(1 << 20))
    point = dict(K=2, B=2, HK=1, HV=2, head_dim=16, dtype="float32", state_layout="vk",
                 seed=seed)
    if module == "carry_protocol":
        point["baselines"] = True
    df = run_sweep("peer", [point], mod.verify_point, results_dir=tmp_path, progress=False)
    fi = df[df["kernel"] == "flashinfer_mtp_snapshots"]
    assert len(fi) == 1 and fi["status"].iloc[0] == "failed"
    assert fi["error"].iloc[0].startswith("ZeroDivisionError")
    ours = df[~df["kernel"].str.startswith("flashinfer")]
    rs = df[df["kernel"].str.startswith("flashinfer_replayssm")]   # head size 16: not taken
    assert set(rs["status"]) == ({"unsupported"} if module == "carry_protocol" else set())
    assert (ours["status"] == "ok").all() and (ours["error"].fillna("") == "").all()
    times = set(ours.loc[ours["metric"] == "time_us", "kernel"])
    assert times >= ({"chain", "decodes"} if module == "gdn_verify" else set(C.CARRY_KERNELS))
    checks = ours[ours["passed"].notna()]
    assert len(checks) >= 6 and checks["passed"].astype(bool).all()
    n_fail, peers = P.point_failures(df)
    assert n_fail == 0 and list(peers["kernel"]) == ["flashinfer_mtp_snapshots"]
    report = G if module == "gdn_verify" else carry_report
    text = T.verdict(df, T.checks_headline(df), report.TARGET_SET)
    bad = report.failed_points(df)
    assert "point(s) failed" not in text
    assert "failed (a check or an error) in 1 point(s)" in text
    assert list(bad["kernel"]) == ["flashinfer_mtp_snapshots"]
    assert bad["error"].iloc[0] == "ZeroDivisionError: integer division or modulo by zero"


def test_our_kernels_failing_still_fail_the_whole_point(monkeypatch, tmp_path):
    """Only peers are caught: an exception of ours fails the point, every row of it; the
    failed-points table gives the error's message without its traceback."""
    from pmll_lab.sweep import run_sweep

    def boom(*args, **kwargs):
        raise RuntimeError("ours broke")

    monkeypatch.setattr(P, "timings", boom)
    point = dict(K=2, B=2, HK=1, HV=2, head_dim=16, dtype="float32", state_layout="kv",
                 seed=int(np.random.default_rng().integers(1 << 20)))
    df = run_sweep("ours", [point], G.verify_point, results_dir=tmp_path, progress=False)
    assert (df["status"] == "failed").all() and "ours broke" in df["error"].iloc[0]
    assert "Traceback" in df["error"].iloc[0]           # the stored row keeps it ...
    assert P.point_failures(df)[0] == 1
    bad = G.failed_points(df)
    assert list(bad["error"]) == ["RuntimeError: ours broke"]     # ... the table does not


@pytest.mark.parametrize("module", ["gdn_verify", "carry_protocol"])
def test_fla_raising_loses_none_of_our_rows(module, monkeypatch, tmp_path):
    """FLA raising (as the K-major peer) is one failed row of it; our rows stay ok."""
    from pmll_lab.sweep import run_sweep

    def boom(*args):
        raise RuntimeError("fla broke")

    mod = G if module == "gdn_verify" else C
    monkeypatch.setattr(G, "fla_available", lambda: True)         # both check peers via gdn
    monkeypatch.setattr(G, "fla_run_once", boom)      # both points call it through gdn
    point = dict(K=2, B=2, HK=1, HV=2, head_dim=16, dtype="float32", state_layout="kv",
                 seed=int(np.random.default_rng().integers(1 << 20)))
    if module == "carry_protocol":
        point["baselines"] = True
    df = run_sweep("fla", [point], mod.verify_point, results_dir=tmp_path, progress=False)
    fla = df[df["kernel"] == "fla_fused_recurrent"]
    assert len(fla) == 1 and fla["status"].iloc[0] == "failed"
    assert "fla broke" in fla["error"].iloc[0]
    ours = df[df["kernel"] != "fla_fused_recurrent"]
    assert (ours["status"] == "ok").all() and (ours["metric"] == "time_us").any()
