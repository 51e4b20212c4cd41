"""pmll_lab.report and the CLI, on tiny throwaway parameterized notebooks (a good one, a failing one)."""

from __future__ import annotations

import json
import re

import nbformat
import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.__main__ import main
from pmll_lab.report import REPO_ROOT, ReportError, build_report, discover

GOOD = '''\
import os, pathlib
import pmll_lab
from pmll_lab.sweep import grid, run_sweep
hidden_source_marker = "this source line must not reach the HTML"
df = run_sweep("tiny", grid(n=[1, 2]),
               lambda p: [{"kernel": "k", "metric": "time_us", "value": 10.0 * p["n"]}],
               results_dir=results_dir)
print("OUTPUT-SEEN", preset, device, os.environ["PMLL_LAB_DEVICE"], pmll_lab.DEVICE.type,
      pathlib.Path(pmll_lab.__file__).parent.parent.name, len(df))
'''


def _notebook(path, body_cells):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('preset = "quick"\ndevice = "auto"\nresults_dir = "results"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# A throwaway notebook"), params]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in body_cells]
    nbformat.write(nb, path)


FIGURE = '''\
import matplotlib.pyplot as plt
plt.figure(figsize=(2, 1.5))
plt.plot([1, 3, 2])
plt.show()
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    # A non-interactive backend in the caller's environment (as CI often has) must not keep
    # the figures out of the report.
    mp = pytest.MonkeyPatch()
    mp.setenv("MPLBACKEND", "Agg")
    root = tmp_path_factory.mktemp("report")
    nbdir = root / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "good.ipynb", [GOOD, FIGURE, 'print("GOOD-END")'])
    _notebook(nbdir / "bad.ipynb", ['print("BEFORE-FAILURE")',
                                    'raise RuntimeError("planned failure for the test")',
                                    'print("NEVER-RUN")'])
    (nbdir / ".ipynb_checkpoints").mkdir()
    manifest = build_report(preset="quick", device="cpu", notebooks_dir=nbdir,
                            reports_dir=root / "reports", log=lambda m: None)
    mp.undo()
    return root, manifest


def test_report_runs_both_and_marks_the_failure(built):
    root, manifest = built
    run = root / "reports" / "latest"
    index = (run / "index.html").read_text()
    assert manifest["ok"] is False and manifest["complete"] is True
    assert "not complete" not in index
    status = {b["name"]: b for b in manifest["notebooks"]}
    assert status["good"]["status"] == "ok" and status["good"]["error"] == ""
    assert status["bad"]["status"] == "failed"
    assert "planned failure for the test" in status["bad"]["error"]
    # Both linked, with their executed notebooks and results files.
    for name in ("good", "bad"):
        assert f"href='{name}.html'" in index and f"href='{name}.ipynb'" in index
        assert (run / f"{name}.html").is_file() and (run / f"{name}.ipynb").is_file()
    assert "href='results/good/tiny.jsonl'" in index and "href='results/good/tiny.csv'" in index
    assert status["good"]["results"] == ["results/good/tiny.csv", "results/good/tiny.jsonl"]
    # The failure is marked in the bad notebook's row, not the good one's.
    rows = re.findall(r"<tr><td><b>(\w+)</b></td><td>(.*?)</td>", index)
    assert dict(rows)["bad"].count("FAILED") == 1 and "planned failure" in dict(rows)["bad"]
    assert "FAILED" not in dict(rows)["good"]
    # Provenance on top; the machine-readable manifest agrees.
    env = manifest["environment"]
    for text in (env["device"], env["commit"], env["torch"], env["triton"], "quick",
                 manifest["started_utc"][:10]):
        assert text in index
    assert "Triton interpreter" in env["device"] and "interpreter wall time" in index
    assert json.loads((run / "manifest.json").read_text())["notebooks"] == manifest["notebooks"]


def test_html_has_outputs_but_no_input_cells(built):
    root, _ = built
    run = root / "reports" / "latest"
    good = (run / "good.html").read_text()
    assert "hidden_source_marker" not in good and "run_sweep(" not in good
    # Parameters injected (preset, device, results_dir) and the env passed to the kernel,
    # which imported this checkout's pmll_lab and ran on the CPU.
    assert "OUTPUT-SEEN quick cpu cpu cpu" in good and "GOOD-END" in good
    assert good.count("src=\"data:image/png;base64,") == 1  # the figure, inline
    assert f"OUTPUT-SEEN quick cpu cpu cpu {REPO_ROOT.name} 2" in good
    rows = [json.loads(x) for x in (run / "results/good/tiny.jsonl").read_text().splitlines()]
    assert sorted(r["value"] for r in rows) == [10.0, 20.0]
    bad = (run / "bad.html").read_text()
    assert "BEFORE-FAILURE" in bad and "NEVER-RUN" not in bad
    assert "FAILED" in bad and "planned failure for the test" in bad
    assert 'raise RuntimeError("planned failure' not in bad  # the failing cell's source
    executed = nbformat.read(run / "good.ipynb", as_version=4)
    assert any(c.get("outputs") for c in executed.cells if c.cell_type == "code")


def test_cli_only_keeps_earlier_entries_and_sets_exit_codes(built, capsys):
    root, _ = built
    args = ["report", "--device", "cpu", "--notebooks-dir", str(root / "notebooks"),
            "--reports-dir", str(root / "reports")]
    assert main(args + ["--only", "good", "--run", "latest"]) == 0
    manifest = json.loads((root / "reports/latest/manifest.json").read_text())
    by = {b["name"]: b for b in manifest["notebooks"]}
    assert by["good"]["status"] == "ok" and not by["good"].get("kept_from_earlier")
    assert by["bad"]["kept_from_earlier"] and by["bad"]["status"] == "failed"
    assert manifest["ok"] is True  # only what this call ran counts
    assert main(args + ["--only", "nope"]) == 2
    assert "no notebook named nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "--preset", "huge"])


def test_empty_notebooks_dir_writes_an_index_saying_so(tmp_path):
    (tmp_path / "notebooks").mkdir()
    assert discover(tmp_path / "notebooks") == []
    manifest = build_report(device="cpu", notebooks_dir=tmp_path / "notebooks",
                            reports_dir=tmp_path / "reports", run="empty", log=lambda m: None)
    assert manifest["ok"] is True and manifest["notebooks"] == []
    assert "No notebooks found" in (tmp_path / "reports/empty/index.html").read_text()


def test_bad_arguments_raise_before_running(tmp_path):
    with pytest.raises(ReportError, match="preset"):
        build_report(preset="medium", notebooks_dir=tmp_path, reports_dir=tmp_path)
    with pytest.raises(ReportError, match="device"):
        build_report(device="tpu", notebooks_dir=tmp_path, reports_dir=tmp_path)
    with pytest.raises(ReportError, match="run"):
        build_report(run="../x", notebooks_dir=tmp_path, reports_dir=tmp_path)
    with pytest.raises(ReportError, match="notebooks: not found"):
        build_report([tmp_path / "missing.ipynb"], reports_dir=tmp_path)


LOST = '''\
from pmll_lab.sweep import grid, run_sweep
def point(p):
    raise KeyError(f"no shape named {p['n']!r}")
df = run_sweep("lost", grid(n=["qwen3next", "qwen"]), point, results_dir=results_dir)
ran = run_sweep("fine", grid(n=[1]), lambda p: [{"kernel": "k", "metric": "x", "value": 1.0}],
                results_dir=results_dir)
print("RAN-TO-THE-END", len(df))
'''


def test_a_notebook_whose_sweep_lost_every_point_is_failed(tmp_path):
    """A notebook that runs to its end while every point of one of its sweeps failed measured
    nothing there: its entry is failed, naming the sweep, the point count and the first error,
    and the run is not ok. Some failed points among points that ran leave it ok."""
    from pmll_lab.report_notebooks import sweeps_all_failed

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "lost.ipynb", [LOST])
    manifest = build_report(preset="quick", device="cpu", notebooks_dir=nbdir,
                            reports_dir=tmp_path / "reports", log=lambda m: None)
    (entry,) = manifest["notebooks"]
    assert entry["status"] == "failed" and not manifest["ok"]
    assert entry["error"].startswith("every point of sweep lost failed (2 points; first error:")
    assert "no shape named" in entry["error"] and "fine" not in entry["error"]
    res = tmp_path / "reports" / "latest" / "results" / "lost"
    assert sweeps_all_failed(res).startswith("every point of sweep lost failed")
    (res / "lost.jsonl").unlink()                         # the sweep that ran: nothing lost
    assert sweeps_all_failed(res) == ""
    rows = [{"point_id": "a", "status": "failed", "error": "E"},
            {"point_id": "b", "status": "ok", "error": ""}]
    (res / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sweeps_all_failed(res) == ""                   # a failed point beside one that ran
    rows = [{"point_id": p, "kernel": k, "status": st, "error": "E" if st == "failed" else ""}
            for p in "cd" for k, st in (("ours", "ok"), ("boom", "failed"))]
    (res / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sweeps_all_failed(res) == ""          # one implementation raised, another measured


SOME = '''\
from pmll_lab.sweep import grid, run_sweep
def point(p):
    if p["n"] == 2:
        raise KeyError("float64")
    return [{"kernel": "k", "metric": "x", "value": float(p["n"])}]
df = run_sweep("some", grid(n=[1, 2, 3]), point, results_dir=results_dir)
'''


def test_a_notebook_with_some_failed_points_says_so_on_the_index(tmp_path):
    """One point of three failed, the rest ran: the notebook stays ok, but its entry counts the
    failed points and the index says so beside it and in the run's summary line."""
    from pmll_lab.report import index_html
    from pmll_lab.report_notebooks import failed_points

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "some.ipynb", [SOME])
    lines = []
    manifest = build_report(preset="quick", device="cpu", notebooks_dir=nbdir,
                            reports_dir=tmp_path / "reports", log=lines.append)
    (entry,) = manifest["notebooks"]
    assert entry["status"] == "ok" and (entry["failed_points"], entry["points"]) == (1, 3)
    assert any("1 of 3 sweep points had a failed check or kernel" in ln for ln in lines), lines
    page = index_html(manifest, run_dir=tmp_path / "reports" / "latest")
    assert "all ok" not in page and "1 sweep point(s) with a failure" in page
    assert "1 of 3 sweep points had a failed check or kernel" in page
    assert "Kernel switches fixed at import" in page and "packed_state_tile=1" in page
    assert failed_points(tmp_path / "reports" / "latest" / "results" / "some") == (1, 3)


def test_index_shows_each_notebooks_headline(tmp_path):
    """A notebook that writes ``results/<name>/headline.csv`` gets that table, whole, on the
    run's index; met / missed are coloured; a notebook without one adds nothing."""
    from pmll_lab.report import index_html

    res = tmp_path / "results" / "roofline"
    res.mkdir(parents=True)
    rows = ["target,B,ours_us,status"] + [f"target number {i},{i},{10.5 + i + 1e-9},"
                                         + ("met" if i % 2 else "missed") for i in range(70)]
    (res / "headline.csv").write_text("\n".join(rows) + "\n")
    manifest = {"run": "t", "environment": {}, "complete": True, "notebooks": [
        {"name": "roofline", "status": "ok", "seconds": 1.0,
         "results": ["results/roofline/headline.csv"]},
        {"name": "other", "status": "ok", "seconds": 1.0, "results": []}]}
    page = index_html(manifest, run_dir=tmp_path)
    assert "<h2>Headline: roofline</h2>" in page and "Headline: other" not in page
    assert page.count("<td class='ok'>met</td>") == 35
    assert page.count("<td class='failed'>missed</td>") == 35
    assert "target number 69" in page and "<td class='num'>79.5</td>" in page and "…" not in page
    assert "79.500000001" not in page                      # shown to 4 significant digits
    assert "<th>ours (µs)</th>" in page and "ours_us" not in page   # headed as in the notebook
    assert "Headline" not in index_html(manifest)          # without run_dir: links only
    assert "35 of 70 targets met" in page and "targets met: 35 of 70" in page   # row, total


def test_index_gives_each_notebooks_verdict_beside_its_status(tmp_path):
    """A GPU headline (targets with bounds; reported rows without one do not count) reads
    "met of total"; a CPU run's checks headline says so and gives no speed verdict."""
    from pmll_lab.report import index_html

    (tmp_path / "results" / "gpu").mkdir(parents=True)
    (tmp_path / "results" / "gpu" / "headline.csv").write_text(
        "status,target,bound\nmet,a,1.0\nmissed,b,0.4\nnot measured,c,1.0\nreported,d,\n")
    (tmp_path / "results" / "cpu").mkdir(parents=True)
    (tmp_path / "results" / "cpu" / "headline.csv").write_text(
        "status,kernel,passed,checks\npassed,chain,3,3\nfailed,decodes,1,2\n")
    manifest = {"run": "t", "environment": {}, "complete": True, "notebooks": [
        {"name": n, "status": "ok", "seconds": 1.0, "results": [f"results/{n}/headline.csv"]}
        for n in ("cpu", "gpu")]}
    page = index_html(manifest, run_dir=tmp_path)
    row = {n: page[page.index(f"<b>{n}</b>"):].split("</tr>")[0] for n in ("cpu", "gpu")}
    assert "1 of 3 targets met" in row["gpu"]
    assert "checks: 1 of 2 kernels passed every check" in row["cpu"]
    assert "targets met: 1 of 3" in page
    assert "<td class='failed'>failed</td>" in page and "<td class='ok'>passed</td>" in page
    # the verdict comes before the provenance table, which closes the page
    assert page.index("targets met: 1 of 3") < page.index("<h2>Run details</h2>") \
        < page.index("<th>Git commit</th>")


def test_cell_timeout_checked_and_a_run_that_cannot_start_leaves_no_folder(tmp_path, capsys,
                                                                             monkeypatch):
    """papermill reads a timeout of 0 or below as no limit: refused (exit 2) before anything
    runs. A run that cannot start (here: no scheduler answers) creates no run folder."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "tiny.ipynb", ['print("RAN")'])
    args = ["report", "--device", "cpu", "--only", "tiny", "--notebooks-dir", str(nbdir),
            "--reports-dir", str(tmp_path / "r")]
    for bad in ("0", "-5", "nan", "inf"):
        with pytest.raises(SystemExit) as stop:
            main(args + ["--cell-timeout", bad])
        assert stop.value.code == 2
        assert f"argument --cell-timeout: must be > 0, got '{bad}'" in capsys.readouterr().err
    for bad in (0, -1.5, True, "10"):
        with pytest.raises(ReportError, match="^cell_timeout: must be > 0"):
            build_report(device="cpu", cell_timeout=bad, notebooks_dir=nbdir,
                         reports_dir=tmp_path / "r")
    monkeypatch.setattr("pmll_lab.report.SCHEDULER_TIMEOUT_S", 1.0)
    assert main(args + ["--scheduler", "tcp://127.0.0.1:9", "--run", "x"]) == 2
    assert "scheduler: no Dask scheduler answers" in capsys.readouterr().err
    assert not (tmp_path / "r").exists(), "a run that could not start left a folder behind"


def test_missing_notebooks_dir_cannot_start(tmp_path, capsys):
    """A ``notebooks_dir`` that is not a folder is an error naming it (exit 2, with or without
    ``--only``), not an empty report; nothing is written."""
    missing = tmp_path / "no_such_dir"
    with pytest.raises(ReportError, match="^notebooks_dir: no such folder"):
        build_report(device="cpu", notebooks_dir=missing, reports_dir=tmp_path / "r")
    with pytest.raises(ReportError, match="^notebooks_dir: no such folder"):
        build_report(device="cpu", only=["gdn_conv"], notebooks_dir=missing,
                     reports_dir=tmp_path / "r")
    args = ["report", "--device", "cpu", "--notebooks-dir", str(missing),
            "--reports-dir", str(tmp_path / "r"), "--run", "t"]
    for extra in ([], ["--only", "gdn_conv"]):
        assert main(args + extra) == 2
        err = capsys.readouterr().err
        assert "notebooks_dir: no such folder" in err and str(missing) in err, err
    assert not (tmp_path / "r").exists()


def test_full_preset_under_the_interpreter_warns(tmp_path):
    """The full preset is the H200 grid: asked for on the CPU (the Triton interpreter) the
    report says so before it starts; the quick preset does not."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "n.ipynb").write_text("{}")
    for preset, warned in (("full", True), ("quick", False)):
        lines: list[str] = []
        manifest = build_report(device="cpu", preset=preset, notebooks_dir=tmp_path / "notebooks",
                                reports_dir=tmp_path / "reports", run=preset, log=lines.append,
                                cell_timeout=60)
        assert [n["status"] for n in manifest["notebooks"]] == ["failed"]  # a stand-in notebook
        said = any("full preset is the H200 grid" in m for m in lines)
        assert said is warned, lines


def test_a_gpu_runs_results_are_not_replaced_by_another_device_or_preset(tmp_path, capsys,
                                                                         monkeypatch):
    """A run folder whose manifest says a notebook's stored results came from another device
    (a committed GPU run) or, without ``--resume``, another preset is refused (exit 2, naming
    the run, the device and ``--replace``) before anything in it is written; ``--replace`` lets
    the call replace them. A plugin that does not load stops the CLI before the folder is
    touched; a run name that is a file, or looks like one, is refused."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "good.ipynb", [GOOD])
    reports = tmp_path / "reports"
    build_report(device="cpu", run="gpu", notebooks_dir=nbdir, reports_dir=reports,
                 log=lambda m: None)
    run = reports / "gpu"
    manifest = json.loads((run / "manifest.json").read_text())
    for e in manifest["notebooks"]:                       # as a GPU run would have written it
        e["device"], e["preset"] = "NVIDIA H200", "full"
    (run / "manifest.json").write_text(json.dumps(manifest))
    stored = sorted(p.name for p in (run / "results" / "good").iterdir())
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    args = ["report", "--device", "cpu", "--notebooks-dir", str(nbdir), "--reports-dir",
            str(reports), "--run", "gpu"]
    for extra in ([], ["--resume"]):
        assert main(args + extra) == 2
        err = capsys.readouterr().err
        assert "run: 'gpu' holds good's results from device 'NVIDIA H200'" in err, err
        assert "--replace" in err
    (tmp_path / "bad_plugin.py").write_text("def broken(:\n")
    monkeypatch.setenv("PMLL_LAB_PLUGINS", str(tmp_path / "bad_plugin.py"))
    with pytest.raises(SystemExit) as stop:
        main(args + ["--replace"])
    assert stop.value.code == 2 and "raised SyntaxError" in capsys.readouterr().err
    monkeypatch.delenv("PMLL_LAB_PLUGINS")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert main(args + ["--replace"]) == 0
    assert sorted(p.name for p in (run / "results" / "good").iterdir()) == stored
    assert json.loads((run / "manifest.json").read_text())["notebooks"][0]["preset"] == "quick"
    (reports / "notes.txt").write_text("x")
    for name in ("notes.txt", "index.html", "README.md"):
        with pytest.raises(ReportError, match="^run: "):
            build_report(device="cpu", run=name, notebooks_dir=nbdir, reports_dir=reports)


def test_param_reaches_the_notebooks_that_take_it_and_is_refused_elsewhere(tmp_path, capsys):
    """``--param NAME=VALUE`` is given to each notebook run (a literal, else a string) and
    recorded in its manifest entry; a name a notebook's parameters cell does not assign, a
    name the report injects itself and a malformed item are refused before anything runs."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('preset = "quick"\ndevice = "auto"\nresults_dir = "r"\n'
                                     'grids = "default"\nsteps = 1')
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell('print("GRIDS-IS", grids, steps * 10)')]
    nbformat.write(nb, nbdir / "takes.ipynb")
    _notebook(nbdir / "plain.ipynb", ['print("PLAIN")'])
    args = ["report", "--device", "cpu", "--notebooks-dir", str(nbdir), "--reports-dir",
            str(tmp_path / "r"), "--run", "p"]
    assert main(args + ["--only", "takes", "--param", "grids=my_sweep", "--param",
                        "steps=3"]) == 0
    html = (tmp_path / "r/p/takes.html").read_text()
    assert "GRIDS-IS my_sweep 30" in html
    entry = json.loads((tmp_path / "r/p/manifest.json").read_text())["notebooks"][0]
    assert entry["params"] == {"grids": "my_sweep", "steps": 3}
    assert "parameters given: grids = &#x27;my_sweep&#x27;, steps = 3" in \
        (tmp_path / "r/p/index.html").read_text()
    assert main(args + ["--param", "grids=x"]) == 2          # plain.ipynb has no grids
    assert "params: plain.ipynb has no parameter grids" in capsys.readouterr().err
    assert main(args + ["--only", "takes", "--param", "preset=full"]) == 2
    assert "params: preset set by the report itself" in capsys.readouterr().err
    for bad in ("grids", "1x=2"):
        with pytest.raises(SystemExit):
            main(args + ["--only", "takes", "--param", bad])
        assert "--param:" in capsys.readouterr().err


def test_a_stop_while_rendering_keeps_the_notebook_listed(tmp_path, monkeypatch):
    """SIGTERM or Ctrl-C while a notebook's HTML is rendered: the report stops (interrupt),
    and its index still lists the notebook, STOPPED, with its stored results."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "good.ipynb", [GOOD])

    def stop(*a, **k):
        raise KeyboardInterrupt("SIGTERM")
    monkeypatch.setattr("pmll_lab.report_notebooks.render_html", stop)
    with pytest.raises(KeyboardInterrupt):
        build_report(device="cpu", run="s", notebooks_dir=nbdir, reports_dir=tmp_path / "r",
                     log=lambda m: None)
    manifest = json.loads((tmp_path / "r/s/manifest.json").read_text())
    (entry,) = manifest["notebooks"]
    assert entry["name"] == "good" and entry["status"] == "interrupted"
    assert "while its HTML was rendered" in entry["error"]
    assert any(r.endswith("tiny.jsonl") for r in entry["results"]), entry["results"]
    assert not any("/." in r for r in entry["results"])          # no lock files listed


def test_a_run_of_another_device_is_not_rewritten_by_other_notebooks(tmp_path, capsys):
    """A run folder holding another device's notebooks (a committed GPU run) is refused when
    this call runs other notebooks into it (the run would mix devices and its index drop
    them), before anything is written; an earlier notebook with results but no HTML (an
    archived run's) stays listed when another one runs."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "good.ipynb", [GOOD])
    _notebook(nbdir / "other.ipynb", ['print("OTHER")'])
    reports = tmp_path / "reports"
    build_report(device="cpu", run="gpu", only=["good"], notebooks_dir=nbdir,
                 reports_dir=reports, log=lambda m: None)
    run = reports / "gpu"
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["notebooks"][0].update(device="NVIDIA H200", html=None)
    (run / "good.html").unlink()
    (run / "manifest.json").write_text(json.dumps(manifest))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    args = ["report", "--device", "cpu", "--notebooks-dir", str(nbdir), "--reports-dir",
            str(reports), "--run", "gpu"]
    for extra in (["--only", "other"], []):
        assert main(args + extra) == 2
        assert "holds good's results from device 'NVIDIA H200'" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    manifest["notebooks"][0]["device"] = None                     # an older manifest
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert main(args + ["--only", "other"]) == 0
    names = [e["name"] for e in json.loads((run / "manifest.json").read_text())["notebooks"]]
    assert names == ["good", "other"]
