"""The experiment protocol's tables and the targets machinery on constructed rows (no kernels):
what the reports are built from, held to exact values.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab import tolerances
from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import targets as T


def test_tolerances_by_dtype_name_or_torch_dtype():
    assert tolerances.O_TOL["bfloat16"] == tolerances.O_TOL[torch.bfloat16] == 8e-3
    assert tolerances.RING_WRITE_TOL[torch.float32] == 1e-6
    with pytest.raises(KeyError):
        tolerances.HALF_STATE_TOL[torch.float32]
    assert set(tolerances.TOLERANCES) >= {"state", "output", "ring write"}


def test_error_line_drops_the_traceback_and_machine_paths():
    text = ("RuntimeError: failed in /home/someone/work/pmll_lab/ops/x.py at row 3\n"
            "Traceback (most recent call last):\n  File \"/opt/venv/lib/a.py\", line 3, in f\n"
            "    raise RuntimeError('x')\n          ^^^^^\nRuntimeError: x")
    assert P.error_line(text) == "RuntimeError: failed in x.py at row 3"
    assert P.error_line("check failed: failed checks: chain:o:rel_l2") == \
        "check failed: failed checks: chain:o:rel_l2"
    assert P.error_line(None) == "" and P.error_line(float("nan")) == ""
    assert len(P.error_line("E: " + "x" * 400)) == 300


def test_pick_names_the_valid_presets():
    assert P.pick({"quick": 1, "full": 2}, "full") == 2
    with pytest.raises(ValueError, match=r"preset: 'Quick' is not one of \['full', 'quick'\]"):
        P.pick({"quick": 1, "full": 2}, "Quick")


def _rows(**kw):
    base = dict(status="ok", error="", state_layout="kv")
    return dict(base, **kw)


def test_a_peer_that_failed_its_check_drops_its_own_times_only():
    df = pd.DataFrame([
        _rows(point_id="p", kernel="chain", metric="rel_l2", value=1e-3, tolerance=8e-3,
              passed=True, what="o"),
        _rows(point_id="p", kernel="fla_fused_recurrent", metric="rel_l2", value=0.5,
              tolerance=8e-3, passed=False, what="o"),
        _rows(point_id="p", kernel="chain", metric="time_us", value=10.0, timer="cuda_graph"),
        _rows(point_id="p", kernel="chain:plan", metric="time_us", value=11.0, timer="cuda_graph"),
        _rows(point_id="p", kernel="fla_fused_recurrent", metric="time_us", value=9.0,
              timer="cuda_graph"),
        _rows(point_id="q", kernel="*", metric="error", value=None, status="failed",
              error="RuntimeError: boom\nTraceback (most recent call last):\n..."),
    ])
    assert list(P.timed(df)["kernel"]) == ["chain", "chain:plan"]
    c = P.checks(df).set_index("kernel")
    assert c.loc["chain", "status"] == "passed" and c.loc["fla_fused_recurrent", "status"] == \
        "failed"
    assert c.loc["fla_fused_recurrent", "worst_rel_l2"] == 0.5
    bad = P.failed_points(df, ("K",))
    assert list(bad["kernel"]) == ["*"] and list(bad["error"]) == ["RuntimeError: boom"]
    assert P.point_failures(df)[0] == 1


def test_failed_implementations_beside_one_that_ran_keep_their_names():
    """Two implementations failed at a point where a third passed: each is named (not ``*``, the
    whole point), the one that raised is in the check table as failed, and the point is not
    counted as lost; a point where every row failed is one ``*`` line."""
    df = pd.DataFrame([
        _rows(point_id="p", kernel="decode", metric="rel_l2", value=1e-3, tolerance=8e-3,
              passed=True, what="o"),
        _rows(point_id="p", kernel="my_wrong", metric="rel_l2", value=0.1, tolerance=8e-3,
              passed=False, what="o", status="failed"),
        _rows(point_id="p", kernel="my_boom", metric="rel_l2", value=float("nan"), passed=False,
              what="o", status="failed", error="RuntimeError: boom"),
        _rows(point_id="q", kernel="my_wrong", metric="rel_l2", value=0.1, passed=False,
              what="o", status="failed", error="check"),
        _rows(point_id="q", kernel="my_boom", metric="rel_l2", value=float("nan"), passed=False,
              what="o", status="failed", error="RuntimeError: boom"),
    ])
    bad = P.failed_points(df, ())
    assert list(bad["kernel"]) == ["my_wrong", "my_boom", "*", "*"]   # q: one line per error
    c = P.checks(df).set_index("kernel")
    assert c.loc["my_boom", "status"] == "failed" and c.loc["decode", "status"] == "passed"
    assert P.point_failures(df)[0] == 1


def test_the_worst_error_and_its_tolerance_come_from_one_row():
    """Rows of one kernel and state dtype at two input dtypes (two tolerances): the table shows
    the row nearest its own tolerance (a failing fp32 row, 1.6e-3 against 1e-5) with that row's
    tolerance and input dtype, not the largest error beside the largest tolerance; a table of
    rows from kernels that all raised (no tolerance column) is still a table."""
    df = pd.DataFrame([
        _rows(point_id="a", kernel="mine", metric="rel_l2", value=1.6e-3, tolerance=1e-5,
              passed=False, what="o", dtype="float32", state_dtype="float16", status="failed"),
        _rows(point_id="b", kernel="mine", metric="rel_l2", value=2e-3, tolerance=8e-3,
              passed=True, what="o", dtype="bfloat16", state_dtype="float16"),
    ])
    t = P.correctness_table(df, by=("state_dtype",)).iloc[0]
    assert (t["worst_rel_l2"], t["tolerance"], t["worst_at_dtype"]) == (1.6e-3, 1e-5, "float32")
    assert (t["points"], t["passed"]) == (2, 1)
    t = P.correctness_table(df, by=("state_dtype", "dtype")).set_index("dtype")
    assert t.loc["float32", "tolerance"] == 1e-5 and t.loc["bfloat16", "tolerance"] == 8e-3
    c = P.checks(df).iloc[0]
    assert (c["status"], c["worst_rel_l2"], c["tolerance"]) == ("failed", 1.6e-3, 1e-5)
    boom = pd.DataFrame([_rows(point_id="a", kernel="mine", metric="rel_l2",
                               value=float("nan"), passed=False, what="o", status="failed",
                               error="ValueError: outputs")])
    assert P.checks(boom).iloc[0]["status"] == "failed"
    nan = pd.concat([df, boom.assign(dtype="bfloat16", state_dtype="float16", tolerance=8e-3,
                                     point_id="c")])
    assert math.isnan(P.correctness_table(nan, by=("state_dtype",)).iloc[0]["worst_rel_l2"])
    assert P.correctness_table(boom)["passed"].tolist() == [0]


def test_targets_over_cells_report_the_worst_and_reported_rows_are_not_counted():
    rows = []
    for M, T_, ours, peer in ((1, 16, 5.0, 10.0), (1, 32, 9.0, 10.0), (2, 16, 4.0, 10.0)):
        for k, v in (("fused", ours), ("sdpa", peer)):
            rows.append(_rows(point_id=f"{M}-{T_}", kernel=k, M=M, T=T_, metric="time_us",
                              value=v, timer="cuda_graph"))
    df = pd.DataFrame(rows)
    half = T.Target("fused <= 0.5x sdpa", "fused", "sdpa", 0.5, over=("M", "T"))
    seen = T.Target("fused against sdpa", "fused", "sdpa", None, over=("M", "T"))
    h = T.headline(df, [half, seen])
    r = h.iloc[0]
    assert (r["status"], r["cells"], r["met_cells"], r["ratio"]) == ("missed", 3, 2, 0.9)
    assert "worst at M=1, T=32" in r["note"]
    assert h.iloc[1]["status"] == "reported" and math.isnan(h.iloc[1]["bound"])
    assert "0 of 1 targets met" in T.verdict(df, h, "test")
    with pytest.raises(ValueError, match="kind"):
        T.Target("x", "fused", kind="speed")
    with pytest.raises(ValueError, match="peer"):
        T.Target("x", "fused")


def test_one_style_per_implementation_and_layout():
    """The same implementation has the same colour in every notebook (under its other names
    too), a layout the same line style, and distinct implementations distinct colours."""
    assert plots.color("chain") == plots.color("chain_snapshots") == plots.color("chain_restore")
    assert plots.color("carry_exact_lazy:nowb:plan") == plots.color("exact_lazy") == \
        plots.color("carry_lazy")
    assert plots.style("decodes", "kv")["ls"] != plots.style("decodes", "vk")["ls"]
    assert len(set(plots.COLORS.values()) - {"#7f7f7f"}) == \
        len([k for k, v in plots.COLORS.items() if v != "#7f7f7f"])
    assert plots.family("flashinfer_replayssm") == "peers"
    assert plots.family("carry_exact_lazy:wb") == "carried state"
    assert plots.quantity("o (write-back) [bfloat16 state]") == "o"


def test_report_table_has_no_empty_column_from_a_pivot():
    """A pivot's column name ("metric") would head an extra, empty first column in the HTML."""
    import pandas as pd

    df = pd.DataFrame(dict(form=["ring", "ring", "chain"], metric=["step_us", "o_rel_l2",
                                                                   "step_us"],
                           value=[46.9, 4e-3, 147.3]))
    wide = df.pivot_table(index="form", columns="metric", values="value").reset_index()
    html = P.table(wide).data
    assert "<th>metric</th>" not in html and "<th></th>" not in html
    assert html.count("<th>") == 3 and "46.9" in html and "147" in html


def test_headline_shows_the_verdict_columns_first_and_no_empty_column():
    """The report's headline: status, target, the cell, ratio and bound, then the rest; a
    column empty in every row (no roofline fraction, no note) is left out of the page."""
    head = pd.DataFrame([dict(status="missed", target="ring step <= 0.9x FI", ours="form=ring",
                              peer="form=fi", ratio=1.4, roofline_frac=float("nan"),
                              ours_us=46.9, peer_us=33.6, bound=0.9, cells=1, met_cells=0,
                              layout="vk", timer="cuda_graph", note="", B=64)])
    shown = T.as_shown(head)
    assert list(shown.columns[:7]) == ["status", "target", "B", "ratio", "bound", "ours_us",
                                       "peer_us"]
    assert "roofline_frac" not in shown and "note" not in shown and "ours" in shown


def test_sweep_points_refuse_bad_axes_naming_them_before_any_point():
    """Grid axes that hold integers must be ints at or above their least value (a bool, a
    string, 0 or -1 sequences is refused naming the axis), an axis must be a list, and a
    notebook's ``seed`` must be an int: checked when the points are built, before any runs."""
    import numpy as np

    from pmll_lab.experiments import conv, gdn, pmll, step

    good = {"K": [2, np.int64(4)], "B": [1, 3], "shape": ["hk2-hv4-32"], "dtype": ["bfloat16"],
            "pending": [0, 2]}
    pts = conv.points([good], seed=5)
    assert len(pts) == 8 and {p["seed"] for p in pts} == {5} and pts[1]["K"] == 2
    for axis, values, message in (("B", [0], r"axis B: must be an int >= 1, got 0"),
                                  ("B", [-1], r"axis B: must be an int >= 1, got -1"),
                                  ("K", [True], r"axis K: must be an int >= 1, got True"),
                                  ("K", ["4"], r"axis K: must be an int >= 1, got '4'"),
                                  ("pending", [-2], r"axis pending: must be an int >= 0"),
                                  ("B", 64, r"axis B must be a list of values, got 64"),
                                  ("B", [], r"axis B lists no value"),
                                  ("dtype", ["bf16"], r"axis dtype: 'bf16' is not one of "
                                                      r"float32, bfloat16$"),
                                  ("dtype", ["float16"], r"axis dtype: 'float16' is not one"),
                                  ("dtype", ["float64"], r"axis dtype: 'float64' is not one"),
                                  ("k", [2], r"unknown axis k \(this sweep's axes: B, K, d_conv,"),
                                  ("impl", ["cuda"], r"unknown axis impl \(this sweep's axes: "
                                                     r".*; impl: another sweep's\)"),
                                  ("state_layout", ["vk"], r"unknown axis state_layout")):
        with pytest.raises(ValueError, match="^grids: " + message):
            conv.points([{**good, axis: values}])
    assert {p["d_conv"] for p in conv.points([{**good, "d_conv": [3]}])} == {3}
    with pytest.raises(ValueError, match=r"^grids: axis d_conv: must be an int >= 2, got 1"):
        conv.points([{**good, "d_conv": [1]}])          # a width-1 conv keeps no window
    from pmll_lab.experiments import spec_decode
    oracle = {"B": [1], "mode": ["plain"], "arch": ["tiny"], "dtype": ["float64"]}
    assert spec_decode.points([oracle])[0]["dtype"] == "float64"     # the oracle model's dtype
    for axis, values, message in (("shape", ["qwen3next"], r"axis shape: 'qwen3next' is not one"),
                                  ("K", [9], r"axis K must be in 1\.\.8")):
        with pytest.raises(ValueError, match="^grids: " + message):
            conv.points([{**good, axis: values}])
    with pytest.raises(ValueError, match=r"^grids: axis seed: must be an int >= 0, got 'abc'"):
        conv.points([good], seed="abc")
    with pytest.raises(ValueError, match=r"^grids: axis seed: must be an int >= 0, got 1.5"):
        pmll.points([{"B": [1], "H": [1], "M": [8], "T": [4], "D": [16], "dtype": ["float32"],
                      "gate": ["none"]}], seed=1.5)
    heads = {"K": [2], "B": [1], "heads": [(1, 2)], "head_dim": [16]}
    assert [(p["HK"], p["HV"]) for p in gdn.points([heads], seed=0)] == [(1, 2)]
    with pytest.raises(ValueError, match=r"^seed: must be an int >= 0, got 'abc'"):
        gdn.points([heads], seed="abc")
    for bad, message in (((0, 2), r"axis heads, HK: must be an int >= 1, got 0"),
                         ((1,), r"axis heads must list \(HK, HV\) pairs")):
        with pytest.raises(ValueError, match="^grids: " + message):
            gdn.points([{**heads, "heads": [bad]}])
    from pmll_lab.experiments import roofline
    with pytest.raises(ValueError, match=r"^grids: axis heads, HV: must be an int >= 1, got -2"):
        roofline.points([{"K": [2], "B": [1], "heads": [(1, -2)], "head_dim": [16]}],
                        fla=False, flashinfer=False)
    with pytest.raises(ValueError, match=r"^grids: axis heads: must be an int >= 1, got 0"):
        P.grid_points([{"heads": [0], "layers": [2]}])       # a GPT-2 grid's head count
    with pytest.raises(ValueError, match=r"^grids: axis B: must be an int >= 1, got 0"):
        step.points([{"B": [0], "K": [4]}], alpha=0.8, seed=0)
    for axis, bad in (("state_layout", "VK"), ("state_dtype", "float64")):
        with pytest.raises(ValueError, match=f"^grids: axis {axis}: {bad!r} is not one of"):
            P.grid_points([{"K": [2], axis: [bad]}])


def test_speed_plot_names_a_layout_only_where_the_rows_have_one():
    """``plots.plot_speed``'s legend: kernel and layout for rows with a ``state_layout``, the
    kernel alone for layout-free rows (the conv), one line per kernel and layout either way."""
    import matplotlib
    matplotlib.use("Agg")

    def rows(**extra):
        return pd.DataFrame([dict(point_id=f"p{B}{k}", status="ok", kernel=k, K=2, B=B,
                                  metric="time_us", value=float(B + i), timer="cuda_graph",
                                  **extra)
                             for i, k in enumerate(("a", "b")) for B in (1, 2)])

    lab = {"a": "kernel a", "b": "kernel b"}
    fig = plots.plot_speed(rows(), "time_us", None, lab, ["a", "b"], "t", {"time_us": "µs"})
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["kernel a", "kernel b"]
    both = pd.concat([rows(state_layout="kv"), rows(state_layout="vk").assign(
        point_id=lambda d: d["point_id"] + "v")])
    fig = plots.plot_speed(both, "time_us", None, lab, ["a"], "t", {"time_us": "µs"})
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["kernel a, K-major",
                                                                   "kernel a, V-major"]


def test_report_table_speaks_to_researchers():
    """Result columns get words and units, a pivot's keys become columns (no unnamed index
    column), large numbers stay whole; the data keeps its column names."""
    import pandas as pd

    df = pd.DataFrame(dict(K=[2, 2, 4], form=["ring", "chain", "ring"],
                           time_us=[12.345, 2.0, 12345.6], worst_rel_l2=[1e-3, 2e-3, 3e-3]))
    html = P.table(df).data
    assert "<th>time (µs)</th>" in html and "<th>worst rel. L2</th>" in html
    assert "time_us" not in html and "12,346" in html and "12.3" in html and "0.003" in html
    wide = df.pivot_table(index=["K", "form"], values="time_us")
    html = P.table(wide).data
    assert html.count("<th>") == 3 and "<th>K</th>" in html and "<th>form</th>" in html
    assert "<th></th>" not in html
    assert list(df.columns) == ["K", "form", "time_us", "worst_rel_l2"]


def test_report_table_flattens_a_pivot_of_several_values():
    """A pivot of several quantities (MultiIndex columns) heads each column with the quantity
    and the key, one header row."""
    import pandas as pd

    sim = pd.DataFrame(dict(K=[2, 2, 4, 4], mode=["eager", "lazy"] * 2,
                            mean_accept=[1.5, 1.5, 2.9, 2.9], step_us=[3.0, 4.0, 5.0, 6.0]))
    wide = sim.pivot_table(index="K", columns="mode", values=["mean_accept", "step_us"])
    html = P.table(wide).data
    assert "<th>K</th>" in html and "<th>step (µs) lazy</th>" in html
    assert "<th>mean accepted rows eager</th>" in html and html.count("<tr") == 3  # 1 + 2 rows


def test_every_sweeps_axes_are_protocol_axes():
    """Each experiment module's sweep axes are names of the shared vocabulary (``AXES``), so
    the README's axis names hold in every notebook."""
    from pmll_lab.experiments import (conv, gdn, pmll, pmll_attention, roofline, spec_decode,
                                      state_drift, step, tokens)

    for mod in (conv, gdn, pmll, pmll_attention, roofline, spec_decode, state_drift, step,
                tokens):
        assert set(mod.AXES) <= P.AXES, (mod.__name__, sorted(set(mod.AXES) - P.AXES))


def test_a_sweep_refuses_its_sibling_sweeps_axes_and_malformed_axes():
    """Within one notebook too, each sweep takes its own axes (pmll_attention's speed sweep
    refuses the eviction sweep's ``impl``; gdn_verify refuses carry_protocol's ``baselines``);
    roofline names its grid axis ``providers`` and refuses ``provider``; a bare string or a head
    count where pairs are needed is a ValueError naming the axis, not a TypeError."""
    from pmll_lab.experiments import carry, gdn, pmll_attention, roofline

    speed = {"B": [1], "shape": [(2, 64)], "M": [0], "T": [16], "dtype": ["bfloat16"]}
    assert pmll_attention.points([speed])
    with pytest.raises(ValueError, match=r"^grids: unknown axis impl .*another sweep's"):
        pmll_attention.points([{**speed, "impl": ["cuda"]}])
    with pytest.raises(ValueError, match=r"^grids: axis shape must list \(H, D\) pairs"):
        pmll_attention.points([{**speed, "shape": [(2, 64, 1)]}])
    heads = {"K": [2], "B": [1], "heads": [(1, 2)], "head_dim": [16], "dtype": ["bfloat16"]}
    assert carry.points([{**heads, "baselines": [True]}], seed=0)[0]["baselines"] is True
    with pytest.raises(ValueError, match=r"^grids: unknown axis baselines"):
        gdn.points([{**heads, "baselines": [True]}], seed=0)
    for bad, message in (({"provider": ["decodes"]}, r"unknown axis provider \(this sweep's "
                                                      r"axes: .*providers"),
                         ({"providers": "decodes"}, r"axis providers must be a list of values"),
                         ({"state_layout": "vk"}, r"axis state_layout must be a list of values"),
                         ({"heads": [4]}, r"axis heads must list \(HK, HV\) pairs here, got 4")):
        with pytest.raises(ValueError, match="^grids: " + message):
            roofline.points([{**heads, **bad}], fla=False, flashinfer=False)
    with pytest.raises(ValueError, match=r"^grids: axis heads is missing"):
        roofline.points([{k: v for k, v in heads.items() if k != "heads"}], fla=False,
                        flashinfer=False)


def test_spec_decode_grids_take_its_models_names():
    """spec_decode's dtype, mode and arch axes take its model dtypes (float64 the oracle's, no
    float16), "plain" / "spec" and its architectures, before any model is built."""
    from pmll_lab.experiments import spec_decode

    base = {"B": [1], "mode": ["plain"], "arch": ["tiny"], "dtype": ["float64"]}
    for axis, bad in (("dtype", "float16"), ("mode", "plian"), ("arch", "qwen3_next")):
        with pytest.raises(ValueError, match=f"^grids: axis {axis}: '{bad}' is not one of"):
            spec_decode.points([{**base, axis: [bad]}])


def test_counts_and_probabilities_are_checked_on_the_grid():
    """Axes that count (steps, fill, segments, new tokens) and probabilities (alpha, p) are
    refused on the grid, naming the axis, rather than by each point or not at all."""
    from pmll_lab.experiments import pmll, spec_decode, step

    st = {"B": [1], "HK": [1], "HV": [2], "K": [2], "head_dim": [16], "steps": [2]}
    assert step.points([st], alpha=0.8, seed=0)
    for axis, bad, message in (("alpha", 1.5, r"axis alpha: must be a probability in \[0, 1\]"),
                               ("fill", -1, r"axis fill: must be an int >= 0"),
                               ("steps", 0, r"axis steps: must be an int >= 1")):
        with pytest.raises(ValueError, match="^grids: " + message):
            step.points([{**st, axis: [bad]}], alpha=0.8, seed=0)
    sd = {"B": [1], "mode": ["spec"], "arch": ["tiny"], "dtype": ["float32"], "p": [None, 0.8]}
    assert len(spec_decode.points([sd])) == 2
    for axis, bad in (("p", 2.0), ("new_tokens", 0)):
        with pytest.raises(ValueError, match=f"^grids: axis {axis}: must be"):
            spec_decode.points([{**sd, axis: [bad]}])
    ring = {"B": [1], "H": [1], "M": [8], "T": [4], "D": [16], "dtype": ["float32"],
            "gate": ["none"], "segments": [0]}
    with pytest.raises(ValueError, match=r"^grids: axis segments: must be an int >= 1"):
        pmll.points([ring])


def test_not_run_lists_each_kernel_and_reason_once_with_its_points():
    """Rows marked unsupported or unavailable, grouped by kernel, status and reason (the first
    of ``reason``, ``error``, ``note`` a row fills; a traceback cut away); failed and ok rows
    are not listed; a row without a kernel or a frame without point ids still counts."""
    rows = pd.DataFrame([
        dict(kernel="fi", status="unsupported", reason="kd 256 not taken", point_id="a"),
        dict(kernel="fi", status="unsupported", reason="kd 256 not taken", point_id="b"),
        dict(kernel="fi", status="unsupported", reason="kd 256 not taken", point_id="b"),
        dict(kernel="twin", status="unavailable", error="needs a GPU\nTraceback (most recent "
             "call last):\n  File x", point_id="a"),
        dict(kernel="tok", status="unsupported", note="FlashInfer: not installed", point_id="c"),
        dict(kernel=None, status="unsupported", reason="no kernel", point_id="d"),
        dict(kernel="ours", status="failed", error="boom", point_id="e"),
        dict(kernel="ours", status="ok", point_id="e"),
    ])
    out = P.not_run(rows).set_index("kernel")
    assert out.loc["fi", "points"] == 2 and out.loc["fi", "reason"] == "kd 256 not taken"
    assert out.loc["twin", "status"] == "unavailable" and out.loc["twin", "reason"] == "needs a GPU"
    assert out.loc["tok", "reason"] == "FlashInfer: not installed"
    assert out.loc["*", "reason"] == "no kernel"
    assert "ours" not in out.index
    assert P.not_run(rows.drop(columns="point_id")).set_index("kernel").loc["fi", "points"] == 3
    assert P.not_run(rows[rows["status"] == "ok"]).empty
