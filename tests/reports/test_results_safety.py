"""Stored results survive what a researcher's machine does to them: a point cut off at the end
of an archived file and run again, an archive killed mid-write (a truncated ``.gz``), two
processes on one results file (an archive or a second sweep beside a running one), a
manifest that is not a run's, a report stopped while it renders, and point functions that
return something that is not rows."""

from __future__ import annotations

import gzip
import json
import threading
import time

import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.report import ReportError, build_report
from pmll_lab.report_archive import archive_run, main as archive_main
from pmll_lab.results import append, load, locked, point_rows, repair, write_rows
from pmll_lab.sweep import grid, run_sweep


def _fn(p):
    return [{"kernel": "k", "metric": m, "value": float(p["i"]) + j}
            for j, m in enumerate(("a", "b", "c"))]


def _sweep(res, points):
    return run_sweep("s", grid(i=points), _fn, results_dir=res, progress=False)


def _manifest(run, **extra):
    (run / "manifest.json").write_text(json.dumps({"run": run.name, "complete": True, **extra,
                                                   "notebooks": [
        {"name": "nb", "status": "ok", "html": None, "ipynb": None,
         "results": ["results/nb/s.jsonl"]}]}))


def test_a_point_cut_off_before_an_archive_and_run_again_is_stored_once_whole(tmp_path):
    """The last point's rows cut short, the run archived, then the point run again: its new
    rows are the only copy (not the old cut rows joined to the first new ones); the same when
    the archive holds the cut rows raw (an archive made before they were dropped)."""
    run = tmp_path / "run"
    res = run / "results" / "nb"
    _sweep(res, [0, 1, 2])
    lines = (res / "s.jsonl").read_text().splitlines()
    (res / "s.jsonl").write_text("\n".join(lines[:-2]) + "\n")    # point 2: 1 row of 3
    raw_gz = gzip.compress(((res / "s.jsonl").read_text()).encode(), mtime=0)
    _manifest(run)
    archive_run(run)
    assert sorted(load(res / "s.jsonl.gz")["i"].unique()) == [0, 1]
    for gz in (None, raw_gz):
        if gz is not None:                       # the cut rows inside the archive itself
            (res / "s.jsonl.gz").write_bytes(gz)
        _sweep(res, [0, 1, 2])
        df = load(res / "s.jsonl")
        assert df.groupby("i").size().tolist() == [3, 3, 3], df
        assert sorted(df[df["i"] == 2]["value"]) == [2.0, 3.0, 4.0]
        archive_run(run)
        assert load(res / "s.jsonl.gz").groupby("i").size().tolist() == [3, 3, 3]


def test_a_truncated_archive_gives_the_points_it_holds_whole(tmp_path):
    run = tmp_path / "run"
    res = run / "results" / "nb"
    _sweep(res, list(range(40)))
    _manifest(run)
    archive_run(run)
    data = (res / "s.jsonl.gz").read_bytes()
    (res / "s.jsonl.gz").write_bytes(data[: len(data) * 2 // 3])       # killed mid-write
    df = load(res / "s.jsonl.gz")
    assert 0 < df["i"].nunique() < 40 and set(df.groupby("i").size()) == {3}
    _sweep(res, list(range(40)))                     # a resume runs the lost points again
    assert load(res / "s.jsonl").groupby("i").size().tolist() == [3] * 40
    archive_run(run)
    assert load(res / "s.jsonl.gz").groupby("i").size().tolist() == [3] * 40


@pytest.mark.parametrize("writer", ["append", "repair"])
def test_writers_of_one_results_file_wait_for_its_lock(tmp_path, writer):
    """An append or a repair waits while another process holds the file's lock (an archive
    merging it, another sweep repairing it), so no row is read and then deleted."""
    path = tmp_path / "s.jsonl"
    write_rows(path, [{"point_id": "p", "point_rows": 1, "kernel": "k", "metric": "m",
                       "value": 1.0}])
    path.write_text(path.read_text() + '{"torn')                # a repair has work to do
    done = threading.Event()

    def work():
        if writer == "append":
            append(path, b'{"x": 1}\n')
        else:
            repair(path)
        done.set()

    with locked(path):
        t = threading.Thread(target=work)
        t.start()
        time.sleep(0.3)
        assert not done.is_set(), f"{writer} did not wait for the lock"
    t.join(10)
    assert done.is_set()


def test_archive_refuses_a_running_run_and_a_manifest_that_is_not_a_runs(tmp_path, capsys):
    run = tmp_path / "run"
    res = run / "results" / "nb"
    _sweep(res, [0, 1])
    before = (res / "s.jsonl").read_bytes()
    _manifest(run, running={"name": "nb"}, complete=False)
    with pytest.raises(ValueError, match="^incomplete: .* says nb is running"):
        archive_run(run)
    with pytest.raises(SystemExit) as stop:
        archive_main([str(run)])
    assert stop.value.code == 2 and "--incomplete" in capsys.readouterr().err
    for text, said in (("{not json", "is not readable JSON"), ("[]", "not a dict"),
                       ('{"notebooks": null}', "not a dict"),
                       ('{"notebooks": [{"html": 5}]}', "an entry without a name"),
                       ('{"notebooks": [{"name": "nb", "results": null}]}', "results not a"),
                       ('{"notebooks": [{"name": "nb", "html": 5}]}', "html/ipynb")):
        (run / "manifest.json").write_text(text)
        with pytest.raises(ValueError, match=f"^run_dir: .*manifest.json .*{said}"):
            archive_run(run)
        with pytest.raises(SystemExit) as stop:
            archive_main([str(run)])
        assert stop.value.code == 2 and "manifest.json" in capsys.readouterr().err
    assert (res / "s.jsonl").read_bytes() == before and not (res / "s.jsonl.gz").exists()
    _manifest(run, running={"name": "nb"}, complete=False)
    archive_run(run, incomplete=True)                      # a killed run: archived on request
    assert load(res / "s.jsonl.gz").groupby("i").size().tolist() == [3, 3]
    assert not list(res.glob(".*.lock"))


def test_a_report_refuses_an_unreadable_manifest(tmp_path):
    (tmp_path / "nb").mkdir()
    run = tmp_path / "r" / "x"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"run": "x", "notebooks": [')
    with pytest.raises(ReportError, match="^run: .*manifest.json cannot be read"):
        build_report(device="cpu", run="x", notebooks_dir=tmp_path / "nb",
                     reports_dir=tmp_path / "r", log=lambda m: None)


@pytest.mark.parametrize("returned, said", [
    ([], "returned no rows"),
    ([{"foo": 1}], "a row lacks kernel, metric, value"),
    ([{1: 2, "kernel": "k", "metric": "m", "value": 1}], "keys must be strings"),
    ([{"kernel": "k", "metric": "m", "value": 1, "i": 99}], "a row gives axis i another value"),
    ("rows", "must return a list of row dicts"),
])
def test_a_point_function_that_returns_no_rows_fails_its_point(returned, said):
    rows = point_rows(lambda p: returned, {"i": 3}, "pid")
    assert {r["status"] for r in rows} == {"failed"} and said in rows[0]["error"], rows
    ok = point_rows(lambda p: [{"kernel": "k", "metric": "m", "value": 1, "i": 3}], {"i": 3},
                    "pid")
    assert ok[0]["status"] == "ok"


def test_sweep_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="^grid: axis B must be a list of values, got 5"):
        grid(B=5)
    with pytest.raises(ValueError, match="^grid: axis B must be a list of values, got 'abc'"):
        grid(B="abc")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="^results_dir: .* is a file"):
        run_sweep("s", grid(i=[0]), _fn, results_dir=tmp_path / "file", progress=False)
    for bad in ("", "  ", None):
        with pytest.raises(ValueError, match="^results_dir: a folder's path"):
            run_sweep("s", grid(i=[0]), _fn, results_dir=bad, progress=False)


def test_a_report_counts_the_points_of_the_last_grid_only(tmp_path):
    """A sweep resumed with a smaller grid: the report's counts (failed points, all points)
    are of the grid it last ran, not of every point its file still holds."""
    from pmll_lab.report_notebooks import failed_points

    def fn(p):
        if p["i"] == 3:
            raise RuntimeError("bad point")
        return _fn(p)
    run_sweep("s", grid(i=[0, 1, 2, 3]), fn, results_dir=tmp_path, progress=False)
    assert failed_points(tmp_path) == (1, 4)
    run_sweep("s", grid(i=[0, 1]), fn, results_dir=tmp_path, progress=False)
    assert failed_points(tmp_path) == (0, 2)


def test_an_int_axis_added_on_resume_stays_int(tmp_path):
    run_sweep("s", grid(i=[0, 1]), _fn, results_dir=tmp_path, progress=False)
    df = run_sweep("s", grid(i=[0, 1], D=[16]), _fn, results_dir=tmp_path, progress=False)
    assert df["D"].dtype.kind == "i" and set(df["D"]) == {16}


def test_an_append_after_a_torn_line_is_not_glued_onto_it(tmp_path):
    """Another writer killed mid-line (here: a torn row at the end of the file) does not cost
    the next point: its rows start on a line of their own."""
    run_sweep("s", grid(i=[0, 1]), _fn, results_dir=tmp_path, progress=False)
    with open(tmp_path / "s.jsonl", "a") as fh:
        fh.write('{"point_id": "torn", "kernel": "k"')
    write_rows(tmp_path / "s.jsonl", [{"point_id": "x", "point_rows": 1, "kernel": "k",
                                       "metric": "m", "value": 1.0}])
    df = load(tmp_path / "s.jsonl")
    assert set(df["point_id"]) >= {"x"} and df["i"].dropna().nunique() == 2


def test_archive_refuses_a_manifest_without_notebooks(tmp_path):
    run = tmp_path / "run"
    res = run / "results" / "nb"
    _sweep(res, [0])
    for text in ("{}", '{"run": "x"}'):
        (run / "manifest.json").write_text(text)
        with pytest.raises(ValueError, match="not a dict with a list of notebooks"):
            archive_run(run)
    assert (res / "s.jsonl").exists() and not (res / "s.jsonl.gz").exists()


def test_train_tiny_gdn_keeps_other_seeds_off_the_committed_checkpoint(capsys):
    import importlib.util

    from _paths import ROOT
    spec = importlib.util.spec_from_file_location("train_script",
                                                  ROOT / "scripts/train_tiny_gdn.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit):
        mod.main(["--seed", "1"])
    assert "--seed: a run of other steps or seed" in capsys.readouterr().err
