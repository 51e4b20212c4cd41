"""pmll_lab.sweep (resumable tidy results) and pmll_lab.bench (errors, bitwise, timing)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab import bench
from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.harness.runner import valid_speed_rows
from pmll_lab.sweep import CheckFailed, grid, load, point_id, run_sweep


def _rows(point, value=None, timer="interpreter-wall"):
    v = float(point["n"] * 10) if value is None else value
    return [
        {"kernel": "k", "metric": "rel_l2", "value": 1e-7, "passed": True},
        {"kernel": "k", "metric": "time_us", "value": v, "timer": timer},
    ]


# ---------------------------------------------------------------------------------------- sweep


def test_grid_is_the_cartesian_product_in_order():
    pts = grid(K=[1, 2], B=[1, 64, 256])
    assert len(pts) == 6
    assert pts[0] == {"K": 1, "B": 1} and pts[-1] == {"K": 2, "B": 256}
    assert len({point_id(p) for p in pts}) == 6
    assert point_id({"a": 1, "b": 2}) == point_id({"b": 2, "a": 1})


def test_killed_sweep_rerun_skips_done_points(tmp_path):
    points = grid(n=[1, 2, 3, 4, 5])
    calls = []

    def dies_at_third(p):
        if p["n"] == 3:
            raise KeyboardInterrupt  # what a kill between points leaves: points 1, 2 stored
        calls.append(p["n"])
        return _rows(p)

    with pytest.raises(KeyboardInterrupt):
        run_sweep("s", points, dies_at_third, results_dir=tmp_path, progress=False)
    assert calls == [1, 2]
    stored = load(tmp_path / "s.jsonl")
    assert sorted(stored["n"].unique()) == [1, 2]

    calls.clear()

    def counting(p):
        calls.append(p["n"])
        return _rows(p)

    df = run_sweep("s", points, counting, results_dir=tmp_path, progress=False)
    assert calls == [3, 4, 5]  # 1 and 2 not run again
    assert len(df) == 2 * len(points)  # every point's rows exactly once
    assert (df.groupby("n").size() == 2).all()
    assert df.loc[df.metric == "time_us"].set_index("n")["value"].to_dict() == \
        {1: 10.0, 2: 20.0, 3: 30.0, 4: 40.0, 5: 50.0}
    # The CSV beside the JSONL holds the same rows.
    assert len(__import__("pandas").read_csv(tmp_path / "s.csv")) == len(df)
    # A third run has nothing left to do.
    calls.clear()
    run_sweep("s", points, counting, results_dir=tmp_path, progress=False)
    assert calls == []


def test_cut_off_last_line_is_ignored_and_does_not_swallow_new_rows(tmp_path):
    points = grid(n=[1, 2])
    run_sweep("s", points[:1], _rows, results_dir=tmp_path, progress=False)
    path = tmp_path / "s.jsonl"
    partial = json.dumps({"n": 2, "point_id": point_id(points[1]), "kernel": "k"})[:25]
    with path.open("a") as fh:
        fh.write(partial)  # a run killed in the middle of writing point 2
    calls = []
    df = run_sweep("s", points, lambda p: calls.append(p["n"]) or _rows(p), results_dir=tmp_path,
                   progress=False)
    assert calls == [2]
    assert sorted(df["n"]) == [1, 1, 2, 2]
    assert len(load(path)) == 4


def test_failed_point_is_stored_with_its_error_and_others_kept(tmp_path):
    def fn(p):
        if p["n"] == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (pretend)")
        return _rows(p)

    df = run_sweep("s", grid(n=[1, 2, 3]), fn, results_dir=tmp_path, progress=False)
    bad = df[df.n == 2]
    assert len(bad) == 1 and bad.iloc[0]["status"] == "failed"
    assert "OutOfMemoryError" in bad.iloc[0]["error"] and "pretend" in bad.iloc[0]["error"]
    good = df[df.n != 2]
    assert (good["status"] == "ok").all() and (good["error"] == "").all()
    assert sorted(good.loc[good.metric == "time_us", "value"]) == [10.0, 30.0]
    # Provenance on every row.
    for col in ("device", "backend", "torch", "triton", "commit", "timestamp", "point_id"):
        assert df[col].notna().all(), col
    assert (df["torch"] == torch.__version__).all()


def test_check_failed_keeps_its_rows_marked_failed(tmp_path):
    def fn(p):
        out = torch.tensor([1.0, 2.0, 3.5])
        ref = torch.tensor([1.0, 2.0, 3.0])
        rows = bench.error_rows("k", out, ref, tol=1e-3, what="o")
        if not all(r["passed"] for r in rows):
            raise CheckFailed("o differs from the reference", rows)
        return rows

    df = run_sweep("s", grid(n=[1]), fn, results_dir=tmp_path, progress=False)
    assert set(df["metric"]) == {"max_abs", "rel_l2"}
    assert (df["status"] == "failed").all()
    assert df["error"].str.startswith("check failed: o differs").all()
    assert df.loc[df.metric == "max_abs", "value"].item() == pytest.approx(0.5)
    assert valid_speed_rows(df).empty


def test_speed_rows_excludes_failed_points_and_never_mixes_timers(tmp_path):
    def fn(p):
        if p["n"] == 3:
            raise CheckFailed("bad", [{"kernel": "k", "metric": "time_us", "value": 1.0,
                                       "timer": "do_bench"}])
        rows = _rows(p, timer="do_bench" if p["n"] in (1, 4) else "interpreter-wall")
        if p["n"] == 4:
            rows[0]["passed"] = False  # a point whose check row failed without raising
        return rows

    df = run_sweep("s", grid(n=[1, 2, 3, 4]), fn, results_dir=tmp_path, progress=False)
    sel = valid_speed_rows(df)
    assert list(sel["n"]) == [1]
    assert set(sel["timer"]) == {"do_bench"}
    cpu_only = valid_speed_rows(df[df.n == 2])
    assert list(cpu_only["n"]) == [2] and set(cpu_only["timer"]) == {"interpreter-wall"}
    assert valid_speed_rows(df.iloc[0:0]).empty
    assert valid_speed_rows(__import__("pandas").DataFrame()).empty


def test_values_from_numpy_torch_and_non_finite_round_trip(tmp_path):
    def fn(p):
        return [{"kernel": "k", "metric": "a", "value": np.float32(1.5)},
                {"kernel": "k", "metric": "b", "value": torch.tensor(2.25)},
                {"kernel": "k", "metric": "c", "value": math.inf},
                {"kernel": "k", "metric": "d", "value": np.int64(7)}]

    df = run_sweep("s", grid(n=[1]), fn, results_dir=tmp_path, progress=False)
    got = df.set_index("metric")["value"].to_dict()
    assert got["a"] == 1.5 and got["b"] == 2.25 and math.isinf(got["c"]) and got["d"] == 7
    for line in (tmp_path / "s.jsonl").read_text().splitlines():
        json.loads(line)  # strict JSON


def test_returns_only_the_requested_points(tmp_path):
    run_sweep("s", grid(n=[1, 2, 3]), _rows, results_dir=tmp_path, progress=False)
    df = run_sweep("s", grid(n=[2]), _rows, results_dir=tmp_path, progress=False)
    assert set(df["n"]) == {2}
    assert len(load(tmp_path / "s.jsonl")) == 6


# ---------------------------------------------------------------------------------------- bench


def test_errors_on_known_tensors():
    e = bench.errors(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 4.0]))
    assert e["max_abs"] == 1.0
    assert e["rel_l2"] == pytest.approx(1 / math.sqrt(21), rel=1e-12)
    # Computed in float64: bf16 inputs give the exact float64 difference of their values.
    e = bench.errors(torch.tensor([1.0078125], dtype=torch.bfloat16),
                     torch.tensor([1.0], dtype=torch.float64))
    assert e["max_abs"] == 0.0078125 and e["rel_l2"] == 0.0078125
    nan = bench.errors(torch.tensor([1.0, math.nan]), torch.tensor([1.0, 1.0]))
    assert nan == {"max_abs": math.inf, "rel_l2": math.inf}
    assert bench.errors(torch.zeros(3), torch.zeros(3)) == {"max_abs": 0.0, "rel_l2": 0.0}
    assert bench.errors(torch.ones(3), torch.zeros(3))["rel_l2"] == math.inf
    with pytest.raises(ValueError, match="out"):
        bench.errors(torch.zeros(3), torch.zeros(4))


def test_error_rows_pass_flag_follows_rel_l2():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    out = torch.tensor([3.0, 4.05], dtype=torch.float64)
    rows = bench.error_rows("k", out, ref, tol=0.02, what="state")
    by = {r["metric"]: r for r in rows}
    assert by["rel_l2"]["value"] == pytest.approx(0.01) and by["rel_l2"]["passed"]
    assert by["max_abs"]["value"] == pytest.approx(0.05) and by["rel_l2"]["tolerance"] == 0.02
    assert all(r["what"] == "state" and r["kernel"] == "k" for r in rows)
    assert not bench.error_rows("k", out + 0.2, ref, tol=0.02)[1]["passed"]


def test_bitwise_equal():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 5, generator=g)
    assert bench.bitwise_equal(a, a.clone())
    assert bench.bitwise_equal(a.t(), a.clone().t().contiguous())  # strides do not matter
    b = a.clone()
    b[2, 3] = torch.nextafter(b[2, 3], torch.tensor(math.inf))  # one ulp
    assert not bench.bitwise_equal(a, b)
    assert torch.equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not bench.bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert bench.bitwise_equal(torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0]))
    assert not bench.bitwise_equal(a, a.double())
    assert not bench.bitwise_equal(a, a[:3])
    h = a.to(torch.bfloat16)
    assert bench.bitwise_equal(h, h.clone())
    assert bench.bitwise_equal(torch.tensor([1, 2], dtype=torch.int8),
                               torch.tensor([1, 2], dtype=torch.int8))
    # a kernel output on DEVICE against an expected value built on the CPU (on a GPU machine
    # two devices; tests/gdn/test_rounding.py relies on it): the same answers as on one device
    nan = torch.tensor([0x7FC00001, 0x7F800001], dtype=torch.int32).view(torch.float32)
    for x, y, same in ((a, a.clone(), True), (a, b, False), (h, h.clone(), True),
                       (torch.tensor([0.0]), torch.tensor([-0.0]), False), (nan, nan, True),
                       (nan, nan.flip(0), False)):
        assert bench.bitwise_equal(x.to(DEVICE), y.cpu()) is same
        assert bench.bitwise_equal(x.cpu(), y.to(DEVICE)) is same


def test_time_launch_and_throughput_rows():
    calls = []

    def fn():
        calls.append(1)
        if DEVICE.type == "cpu":
            time.sleep(0.002)
        else:
            torch.empty(1 << 20, device=DEVICE).fill_(1.0)

    t = bench.time_launch(fn, cpu_reps=4)
    assert t["p20_us"] <= t["median_us"] <= t["p80_us"]
    if INTERPRET:
        assert t["timer"] == "interpreter-wall"
        assert len(calls) == 5  # one warm-up + cpu_reps
        assert t["median_us"] >= 2000
        assert bench.time_graph(fn) is None and bench.copy_bandwidth() is None
    else:
        assert t["timer"] == "do_bench" and t["median_us"] > 0
    rows = bench.throughput_rows("k", t, nbytes=4_000_000)
    by = {r["metric"]: r for r in rows}
    assert by["time_us"]["value"] == t["median_us"]
    assert by["gbps"]["value"] == pytest.approx(4_000_000 / (t["median_us"] * 1e-6) / 1e9)
    assert by["gbps"]["timer"] == t["timer"] and by["gbps"]["bytes"] == 4_000_000
    assert ("roofline_frac" in by) == (bench.copy_bandwidth() is not None)


def test_rows_name_where_they_ran_in_process(tmp_path):
    df = run_sweep("s", grid(n=[1, 2]), _rows, results_dir=tmp_path, progress=False)
    assert (df["worker"] == "in-process").all()
    if DEVICE.type == "cpu":
        assert (df["gpu"] == "").all() and (df["gpu_id"] == "").all()
    else:
        assert (df["gpu"] == torch.cuda.get_device_name(DEVICE)).all()
    from pmll_lab.sweep import describe_placement, placement

    assert placement(df) == {"workers": 1, "gpus": int(DEVICE.type == "cuda"),
                             "devices": {df["device"].iloc[0]: 2}}
    assert describe_placement(df).startswith("in one process (")


def test_a_point_listed_twice_runs_once(tmp_path):
    calls = []
    df = run_sweep("s", [{"n": 1}, {"n": 2}, {"n": 1}],
                   lambda p: calls.append(p["n"]) or _rows(p), results_dir=tmp_path, progress=False)
    assert calls == [1, 2] and len(df) == 4


def test_speed_rows_never_mix_device_kinds():
    """Rows from a cluster of two GPU models: each plot keeps one kind (the one with the most
    points, or the one asked for); a table of one kind passes whole."""
    import pandas as pd

    from pmll_lab.harness.runner import one_device

    rows = []
    for n, dev in enumerate(["NVIDIA H200", "NVIDIA H200", "NVIDIA H100 80GB HBM3",
                             "NVIDIA H200"]):
        pid = point_id({"n": n})
        rows += [{"n": n, "point_id": pid, "status": "ok", "device": dev, "kernel": "k",
                  "metric": "time_us", "value": 10.0 + n, "timer": "do_bench"},
                 {"n": n, "point_id": pid, "status": "ok", "device": dev, "kernel": "k",
                  "metric": "rel_l2", "value": 1e-7, "passed": True}]
    df = pd.DataFrame(rows)
    sel = valid_speed_rows(df)
    assert list(sel["n"]) == [0, 1, 3] and set(sel["device"]) == {"NVIDIA H200"}
    h100 = valid_speed_rows(df, device="NVIDIA H100 80GB HBM3")
    assert list(h100["value"]) == [12.0]
    assert len(one_device(df[df.n != 2])) == 6
    # a tie goes to the first name in sorted order, whatever the row order
    tie = df[df.n.isin([1, 2])]
    assert set(one_device(tie)["device"]) == {"NVIDIA H100 80GB HBM3"}
    assert set(one_device(tie.iloc[::-1])["device"]) == {"NVIDIA H100 80GB HBM3"}


def test_point_fn_returning_no_list_is_a_failed_row_and_the_sweep_goes_on(tmp_path):
    def fn(p):
        return "x" if p["n"] == 2 else _rows(p)

    df = run_sweep("s", grid(n=[1, 2, 3]), fn, results_dir=tmp_path, progress=False)
    bad = df[df.n == 2]
    assert len(bad) == 1 and bad.iloc[0]["status"] == "failed"
    assert "point_fn: must return a list of row dicts, returned str" in bad.iloc[0]["error"]
    assert (df[df.n != 2]["status"] == "ok").all() and len(df[df.n != 2]) > 0


def test_name_and_wait_s_are_checked(tmp_path):
    for name in ("../escape", "a/b", "", ".hidden"):
        with pytest.raises(ValueError, match=r"^name: must be a plain file name"):
            run_sweep(name, grid(n=[1]), _rows, results_dir=tmp_path / "r", progress=False)
    assert not (tmp_path / "escape.jsonl").exists()
    for bad in (-1, 0, "5", True):
        with pytest.raises(ValueError, match=r"^wait_s: must be a positive number"):
            run_sweep("s", grid(n=[1]), _rows, results_dir=tmp_path, progress=False,
                      wait_s=bad)
