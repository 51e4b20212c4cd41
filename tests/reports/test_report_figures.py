"""What a report's figures and tables say: CPU timings labelled as the interpreter's and never
set beside a native peer as if comparable, readable log ticks, plots whose legend tells every
line apart, tolerance labels that do not overlap, colours that show on white, and the carried
state's bytes labelled and reconciled with the findings (experiments.plots, pmll_attention,
spec_decode, carry_report, protocol.header)."""

from __future__ import annotations

import itertools

import matplotlib
import pandas as pd
import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.experiments import carry_report as R
from pmll_lab.experiments import plots
from pmll_lab.experiments import pmll_attention as PA
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import spec_decode_report as SD
from pmll_lab.experiments.acceptance import simulation_table

matplotlib.use("Agg")


def _attention_rows(timer: str) -> pd.DataFrame:
    rows = []
    for j, (M, T) in enumerate(((16, 16), (16, 48))):
        for i, k in enumerate(PA.PROVIDERS):
            rows.append(dict(point_id=f"p{j}", status="ok", kernel=k, metric="time_us",
                             value=1000.0 * (i + 1) + T, timer=timer, device="dev", B=2, H=2,
                             D=64, dtype="bfloat16", M=M, T=T))
    return pd.DataFrame(rows)


def test_attention_speed_on_the_cpu_is_a_labelled_record_not_a_comparison():
    """On the CPU (interpreter wall times) no speed plot sets our interpreted kernel beside
    PyTorch's native SDPA; the table gives per provider where it ran, the wall time in ms and
    the timer. On a GPU the plot and the per-provider table in µs with the timer stay."""
    import matplotlib.pyplot as plt

    cpu = _attention_rows("interpreter-wall")
    assert PA.plot_times(cpu) is None
    t = PA.wide_times(cpu)
    assert list(t.columns) == ["provider", "runs_in", "B", "H", "D", "dtype", "M", "T",
                               "wall_time_ms", "timer"]
    fused = t[t["provider"] == PA.LABELS["fused"]]
    assert set(fused["runs_in"]) == {"Triton interpreter"}
    assert set(t.loc[t["provider"] == PA.LABELS["sdpa_causal"], "runs_in"]) == {"PyTorch"}
    assert fused["wall_time_ms"].tolist() == [1.016, 1.048]           # µs / 1000
    assert t["timer"].str.contains("CPU wall clock").all() and \
        t["timer"].str.contains("not GPU speed").all()
    html = P.table(t).data
    assert "<th>wall time (ms)</th>" in html and "<th>runs in</th>" in html
    gpu = _attention_rows("cuda_graph")
    fig = PA.plot_times(gpu)
    assert fig is not None
    plt.close(fig)
    w = PA.wide_times(gpu)
    assert "fused (µs)" in w.columns and (w["timer"] == P.TIMER_LABELS["cuda_graph"]).all()


def _throughput(gpu: bool) -> pd.DataFrame:
    timer = "cuda_events" if gpu else "interpreter-wall"
    rows = []
    for k, tps in (("plain", 8.6), ("exact_lazy", 4.1), ("chain", 5.4)):
        rows.append(dict(mode="plain" if k == "plain" else "spec", draft="noisy", K=4, p=0.8,
                         B=4, state_layout="kv", kernel=k, tokens_per_s=tps, step_ms=100.0,
                         mean_accept=2.5, timer=timer))
    return pd.DataFrame(rows)


def test_spec_decode_tokens_per_s_carry_their_timer_and_the_cpu_draws_none():
    """The tokens/s table names its timer (on the CPU: wall time with the GDN kernels in the
    interpreter, no ratio); its plot is drawn for GPU timings only; the headers read tokens/s."""
    cpu = SD.throughput_table(_throughput(False), 4, 0.8)
    assert (cpu["timer"] == SD.CPU_TIMER).all() and "speedup_vs_plain" not in cpu
    assert "interpreter" in SD.CPU_TIMER and "not GPU speed" in SD.CPU_TIMER
    assert SD.plot_throughput(cpu, SD.CPU_TIMER) is None
    html = P.table(cpu).data
    assert "<th>tokens/s</th>" in html and "<th>plain tokens/s</th>" in html
    assert "<th>step (ms)</th>" in html and "tokens_per_s" not in html
    gpu = SD.throughput_table(_throughput(True), 4, 0.8)
    assert (gpu["timer"] == SD.GPU_TIMER).all() and "speedup_vs_plain" in gpu
    fig = SD.plot_throughput(gpu, SD.GPU_TIMER)
    assert fig is not None


def test_a_log_axis_within_a_decade_reads_plain_numbers():
    """tokens/s between 4 and 9 on a log axis: plain tick labels, not ``4×10^0``."""
    fig = SD.plot_throughput(SD.throughput_table(_throughput(True), 4, 0.8), SD.GPU_TIMER)
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    labels += [t.get_text() for t in ax.yaxis.get_minorticklabels() if t.get_text()]
    assert labels and not any("times" in s or "10^" in s or "×" in s for s in labels), labels
    assert {"5", "6", "8"} <= set(labels), labels


def _entry(line):
    return (line.get_color(), line.get_marker(), line.get_linestyle(), line.get_markerfacecolor())


def test_simulation_legend_tells_eager_from_lazy():
    """Each K has one colour; eager, lazy and lazy with the speculative store differ in marker
    and line style, so no two legend entries look alike."""
    sim = simulation_table([2, 4], [0.4, 0.8], p_zero=0.0, seed=0, steps=200)
    fig = R.plot_simulation(sim)
    handles = fig.legends[0].legend_handles
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == [f"K={K}, {m}" for K in (2, 4) for m in ("eager", "lazy", "lazy+spec")]
    looks = [_entry(h) for h in handles]
    assert len(set(looks)) == len(looks), looks
    eager, lazy, spec = looks[:3]
    assert eager[0] == lazy[0] == spec[0]                       # one colour per K
    assert len({eager[1], lazy[1], spec[1]}) == 3                # three markers


def test_layouts_differ_in_marker_and_fill_not_only_in_dashes():
    """K-major and V-major lines of one kernel: another marker and a hollow one, besides the
    dashes (a legend's short line sample or a lone point shows no dashes)."""
    kv, vk = plots.style("carry_exact_lazy", "kv"), plots.style("carry_exact_lazy", "vk")
    assert kv["color"] == vk["color"] and kv["ls"] != vk["ls"]
    assert kv["marker"] != vk["marker"] and vk.get("mfc") == "white" and "mfc" not in kv


def _contrast(hex_colour: str) -> float:
    """WCAG contrast ratio of a colour against white."""
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return 1.05 / (lum + 0.05)


def test_attention_lines_show_on_white():
    """Every provider of the attention speed plot is drawn in a colour of at least 3:1 contrast
    on white (no pale grey or cyan), each its own."""
    colours = [plots.color(k) for k in PA.PROVIDERS]
    assert len(set(colours)) == len(colours)
    weak = {k: round(_contrast(plots.color(k)), 2) for k in PA.PROVIDERS
            if _contrast(plots.color(k)) < 3}
    assert not weak, weak


def test_tolerance_labels_do_not_overlap():
    """Close tolerances on one quantity (bf16 8e-3, fp16 1.6e-2) and labels of neighbouring
    quantities: every tolerance label's box is clear of every other."""
    rows = []
    for q in ("o", "state", "stash u"):
        for dt, tol, v in (("bfloat16", 8e-3, 2e-3), ("float16", 1.6e-2, 3e-3),
                           ("float32", 1e-5, 1e-7)):
            rows.append(dict(kernel="carry_exact_lazy", metric="rel_l2", value=v, what=q,
                             dtype=dt, tolerance=tol))
    rows.append(dict(kernel="chain_snapshots", metric="rel_l2", value=0.0, what="o",
                     dtype="float32", tolerance=1e-5))
    fig = plots.plot_errors(pd.DataFrame(rows))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for ax in fig.axes for t in ax.texts]
    assert len(texts) == 3 * 3 + 1
    boxes = [t.get_window_extent(renderer) for t in texts]
    clash = [(texts[i].get_text(), texts[j].get_text()) for i, j in
             itertools.combinations(range(len(boxes)), 2) if boxes[i].overlaps(boxes[j])]
    assert not clash, clash


def test_rollback_table_labels_its_bytes_and_meets_the_findings():
    """The bytes each design holds per sequence and layer (what the CPU page shows where the
    verify times are GPU-only): every row named, in KiB, and the carry's GDN and conv parts sum
    to the findings' carry stash (385 KiB for Qwen3-Next-80B-A3B); the chain's states with
    their conv windows are section 4's snapshots."""
    t = R.rollback_table(K=4)
    assert list(t.columns) == ["model", "held to roll back", "KiB per sequence and layer",
                               "what it counts"]
    kib = dict(zip(t["held to roll back"], t["KiB per sequence and layer"]))
    budget = R.budget_table()
    b4 = budget[budget["K"] == 4].iloc[0]
    assert kib["carry: GDN stash"] == pytest.approx(257.0)
    assert kib["carry: conv twin's stash"] == pytest.approx(128.0)
    assert kib["carry: whole stash (GDN + conv)"] == pytest.approx(b4["carry stash KiB"]) == \
        pytest.approx(385.0)
    assert kib["carry: pending count pend"] * 1024 == 4
    assert kib["FlashInfer mtp: K=4 GDN states"] == 4 * b4["state KiB"]
    chain = t[t["held to roll back"] == "our chain: K-1=3 GDN states"].iloc[0]
    assert chain["KiB per sequence and layer"] == 3 * b4["state KiB"]
    assert f"{b4['snapshots KiB']:.0f} KiB" in chain["what it counts"]
    html = P.table(t).data
    assert "263172" not in html and "<th>KiB per sequence and layer</th>" in html
    assert R.rollback_bytes(4, 32, 128, 128)["carry stash + pend"] == 263172   # GDN only


def test_report_headers_write_units_out():
    """Result columns without a label of their own still read as words with their unit."""
    assert P.header("tokens_per_s") == "tokens/s" and P.header("step_ms") == "step (ms)"
    assert P.header("conv_verify_ms") == "conv verify (ms)"
    assert P.header("equal_to_greedy") == "equal to greedy" and P.header("K") == "K"
    assert P.header("time_us") == "time (µs)"                       # COLUMN_LABELS first


def test_notebooks_show_tables_through_the_report_helpers():
    """Every ``display(...)`` in the committed notebooks shows a report table (``P.table``,
    ``P.details``), Markdown or HTML, and no cell ends in a bare expression that Jupyter would
    show as a raw DataFrame (an index column, every digit, ``16.0`` for an integer)."""
    import ast

    import nbformat

    from pmll_lab.report import REPO_ROOT

    allowed = {"table", "details", "Markdown", "HTML"}
    bad = []
    for path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type != "code":
                continue
            tree = ast.parse(cell.source)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "display":
                    arg = node.args[0] if node.args else None
                    f = arg.func if isinstance(arg, ast.Call) else None
                    name = getattr(f, "attr", None) or getattr(f, "id", None)
                    if name not in allowed:
                        bad.append(f"{path.stem} cell {i}: display({ast.unparse(arg)[:60]})")
            last = tree.body[-1] if tree.body else None
            if isinstance(last, ast.Expr) and isinstance(last.value, (ast.Name, ast.Subscript,
                                                                       ast.Attribute)):
                bad.append(f"{path.stem} cell {i}: ends in {ast.unparse(last)}")
    assert not bad, bad


def test_notebook_headline_gives_no_met_count_to_reported_rows():
    """In a report's headline a reported figure (no bound) shows no "cells met" (a 0 there
    reads as a miss); with every target one cell the cells columns go; a target over several
    cells keeps them, for its judged rows only."""
    from pmll_lab.experiments import targets as T

    row = dict(target="t", ours="a", peer="b", ratio=1.2, bound=1.0, ours_us=2.0, peer_us=1.0,
               layout="vk", timer="cuda_graph", note="")
    one = pd.DataFrame([dict(row, status="missed", cells=1, met_cells=0),
                        dict(row, status="reported", bound=float("nan"), cells=1, met_cells=0)])
    assert "met_cells" not in T.as_shown(one) and "cells" not in T.as_shown(one)
    many = pd.DataFrame([dict(row, status="missed", cells=4, met_cells=3),
                         dict(row, status="reported", bound=float("nan"), cells=1,
                              met_cells=0)])
    shown = T.as_shown(many)
    assert shown["met_cells"].iloc[0] == 3 and pd.isna(shown["met_cells"].iloc[1])
    html = P.table(shown).data
    assert "<th>cells met</th>" in html
