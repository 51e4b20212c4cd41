"""The pmll_ring notebook's point and targets (``pmll_lab.experiments.pmll``): every row names
its implementation, a CUDA-twin point without a GPU is one ``unavailable`` row, and the CUDA
twins' targets judge their own rows only (constructed GPU rows)."""


import pandas as pd
import pytest

from pmll_lab.backend import DEVICE
from pmll_lab.experiments import pmll as E
from pmll_lab.experiments import targets as T
from _paths import ROOT

SMALL = dict(B=2, H=2, M=8, T=12, D=16, dtype="float32", gate="bht", segments=2, seed=3)


def test_triton_point_checks_then_times_and_names_its_impl():
    rows = E.ring_point(dict(SMALL))
    assert rows and {r["impl"] for r in rows} == {"triton"}
    checks = [r for r in rows if r.get("passed") is not None]
    assert checks and all(r["passed"] for r in checks)
    reads = [r for r in rows if r["kernel"] == "pmll_read" and r["metric"] == "rel_l2"]
    assert reads and all(r["value"] == 0.0 for r in reads)      # a copy: bit-exact
    timed = {r["kernel"] for r in rows if r["metric"] == "time_us"}
    assert timed == {"pmll_read", "pmll_write"}


@pytest.mark.skipif(DEVICE.type == "cuda", reason="the CPU's answer for a CUDA-twin point")
def test_cuda_point_without_gpu_is_one_unavailable_row():
    rows = E.ring_point(dict(SMALL, impl="cuda"))
    assert len(rows) == 1
    r = rows[0]
    assert (r["status"], r["impl"], r["metric"]) == ("unavailable", "cuda", "unavailable")
    assert "NVIDIA GPU" in r["reason"]
    pts = [dict(SMALL, impl="cuda"), dict(SMALL)]       # rows as the sweep stores them
    df = pd.DataFrame([dict(p, point_id=str(i), **r) for i, p in enumerate(pts)
                       for r in (rows if i == 0 else E.ring_point(p))])
    facts = E.findings(df)
    hit = facts[facts.iloc[:, 0] == "points of the CUDA C++ twins not run here"]
    assert len(hit) == 1 and hit.iloc[0, 1] == 1


def test_unknown_impl_is_refused_naming_it():
    with pytest.raises(ValueError, match="impl: must be one of triton, cuda, got 'cutlass'"):
        E.ring_point(dict(SMALL, impl="cutlass"))


def _gpu_rows(entries, roof=4000.0):
    """(kernel, impl, gate, time_us, roofline_frac) at T = M = 8192, bf16: a cuda_graph time
    with its gbps and roofline rows."""
    rows = []
    for i, (kern, impl, gate, t, fr) in enumerate(entries):
        base = dict(B=8, H=16, M=8192, T=8192, D=128, dtype="bfloat16", gate=gate, segments=2,
                    impl=impl, point_id=f"p{i}", status="ok", error="", kernel=kern,
                    state_layout="kv", timer="cuda_graph")
        nbytes = fr * roof * 1e3 * t
        rows += [dict(base, metric="time_us", value=t),
                 dict(base, metric="gbps", value=nbytes / (t * 1e3), bytes=nbytes),
                 dict(base, metric="roofline_frac", value=fr, copy_gbps=roof)]
    return pd.DataFrame(rows)


def _row(h, text):
    hits = h[h["target"] == text]
    assert len(hits) == 1, text
    return hits.iloc[0]


def test_cuda_targets_judge_the_twins_rows_against_tritons():
    df = _gpu_rows([
        ("pmll_read", "triton", "none", 500.0, 0.95),
        ("pmll_read", "cuda", "none", 550.0, 0.86),          # 86 % < 90 %: missed
        ("pmll_write", "triton", "none", 600.0, 0.90),
        ("pmll_write", "cuda", "none", 580.0, 0.93),         # 93 %: met
        ("pmll_write", "cuda", "bht", 900.0, 0.60),          # gated: outside the ungated target
    ])
    h = T.headline(df, E.TARGETS)
    read = _row(h, "CUDA twin: read >= 90% of the copy bandwidth at T = M = 8192")
    assert (read["status"], read["roofline_frac"]) == ("missed", 0.86)
    write = _row(h, "CUDA twin: write, no gate, >= 90% of the copy bandwidth at T = M = 8192")
    assert (write["status"], write["roofline_frac"]) == ("met", 0.93)
    ratio = _row(h, "CUDA twin / Triton: read at T = M = 8192")
    assert ratio["status"] == "reported" and ratio["ratio"] == pytest.approx(550 / 500, abs=1e-3)
    # the Triton targets see the Triton rows only
    tri = h[h["target"].str.startswith("read >= 80%")]
    assert len(tri) == 1 and tri.iloc[0]["roofline_frac"] == 0.95
    tri = h[h["target"].str.startswith("write, no gate, >= 80%")]   # the faster CUDA row unseen
    assert len(tri) == 1 and tri.iloc[0]["roofline_frac"] == 0.90


def test_points_name_triton_unless_a_grid_says_cuda():
    pts = E.points([dict(B=[2], H=[2], M=[8], T=[4], D=[16], dtype=["float32"], gate=["none"],
                         segments=[1]),
                    dict(B=[2], H=[2], M=[8], T=[4], D=[16], dtype=["float32"], gate=["none"],
                         segments=[1], impl=["cuda"])])
    assert [p["impl"] for p in pts] == ["triton", "cuda"]


OLD = ROOT / "reports/h200-2026-11-29b/results/pmll_ring"


def test_rows_stored_before_the_impl_column_read_as_triton():
    """A run committed before the CUDA twins joined (no ``impl`` column; H200): its Triton
    targets, bandwidth table and plot still read its rows, and rows that lack the value beside
    new ones (a reused results folder) count as Triton too."""
    old = pd.read_json(OLD / "pmll_ring.jsonl.gz", lines=True)
    assert "impl" not in old
    df = E.with_impl(old)
    assert set(df["impl"]) == {"triton"} and len(df) == len(old)
    h = T.headline(df, E.TARGETS)
    read = h[h["target"].str.startswith("read >= 80%")].iloc[0]
    # as that run's own headline had it (the Triton read: 29.6 % at its worst cell)
    assert read["status"] == "missed" and read["roofline_frac"] == pytest.approx(0.296, abs=1e-3)
    bw = E.bandwidth_table(df)
    assert len(bw) and set(bw["impl"]) == {"triton"}
    mixed = pd.concat([old.head(50), pd.DataFrame([{"kernel": "pmll_ring", "impl": "cuda",
                                                    "status": "unavailable"}])])
    assert list(E.with_impl(mixed)["impl"].value_counts().items()) == [("triton", 50),
                                                                        ("cuda", 1)]


def test_one_token_write_is_reported_per_impl():
    rows = []
    for i, (impl, t) in enumerate((("triton", 7.0), ("triton", 8.0), ("cuda", 11.0))):
        base = dict(B=8, H=16, M=8192, T=1, D=128, dtype="bfloat16", gate="none", segments=2,
                    impl=impl, point_id=f"p{i}", status="ok", error="", kernel="pmll_write",
                    timer="cuda_graph", state_layout="kv")
        rows += [dict(base, metric="time_us", value=t),
                 dict(base, metric="gbps", value=1.0, bytes=1e6),
                 dict(base, metric="roofline_frac", value=0.01, copy_gbps=4000.0)]
    f = E.findings(pd.DataFrame(rows)).set_index("quantity")
    assert f.loc["one-token write (decode): median time", "value"] == pytest.approx(7.5)
    assert f.loc["one-token write (decode), CUDA twin: median time", "value"] == pytest.approx(11.0)
    assert set(f["unit"]) == {"us"}


def test_the_notebooks_wraparound_and_grid_choices_are_checked_before_a_sweep():
    """The pmll_ring notebook's wraparound parameters (``parameters.PARAM_RULES``, checked by
    ``targets.setup``) and its grids' ``gate`` / ``impl`` values are refused naming the parameter
    or axis, before any point runs."""
    from pmll_lab.experiments.parameters import check_values

    check_values(dict(wrap_capacity=8, wrap_segments=[5, 6, 3, 11]))
    with pytest.raises(ValueError, match=r"^wrap_capacity: must be an int >= 1, got -3"):
        check_values(dict(wrap_capacity=-3, wrap_segments=[5]))
    with pytest.raises(ValueError, match=r"^wrap_segments: must be an int >= 1, got -1"):
        check_values(dict(wrap_capacity=8, wrap_segments=[5, -1]))
    for bad in ([], "5,6", None):
        with pytest.raises(ValueError, match=r"^wrap_segments: must be a non-empty list"):
            check_values(dict(wrap_capacity=8, wrap_segments=bad))
    grid = dict(B=[1], H=[1], M=[8], T=[2], D=[16], dtype=["float32"], segments=[1])
    with pytest.raises(ValueError, match=r"grids: axis gate: 'nonee' is not one of none, bt, bht"):
        E.points([dict(grid, gate=["nonee"])])
    with pytest.raises(ValueError, match=r"grids: axis impl: 'cutlass' is not one of triton, cuda"):
        E.points([dict(grid, gate=["none"], impl=["cutlass"])])
    assert E.points([dict(grid, gate=["bt"])])[0]["gate"] == "bt"
