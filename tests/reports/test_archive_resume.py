"""Archiving and resuming keep every stored point, whichever file holds it (a run's
``<name>.jsonl`` or its archived ``<name>.jsonl.gz``), and a resume knows the commit its stored
points ran at: points of another commit run again unless they are kept on request, and then
say so."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.report_archive import archive_run
from pmll_lab.results import load, point_id
from pmll_lab.sweep import grid, run_sweep


def _fn(calls=None):
    def fn(p):
        if calls is not None:
            calls.append(p["i"])
        return [{"kernel": "k", "metric": "m", "value": float(p["i"]) + 0.5},
                {"kernel": "k", "metric": "t", "value": 10.0 * p["i"]}]
    return fn


def _run(tmp_path):
    run = tmp_path / "h200-y"
    res = run / "results" / "nb"
    return run, res


def _manifest(run):
    (run / "manifest.json").write_text(json.dumps({"run": run.name, "notebooks": [
        {"name": "nb", "status": "ok", "html": None, "ipynb": None,
         "results": ["results/nb/s.jsonl"]}]}))


def _gz_rows(path):
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def test_archiving_twice_keeps_every_point(tmp_path):
    """The run archived, a sweep resumed in it with new points, archived again: the second
    archive merges the new rows into the .gz instead of overwriting it."""
    run, res = _run(tmp_path)
    run_sweep("s", grid(i=[0, 1, 2]), _fn(), results_dir=res, progress=False)
    _manifest(run)
    archive_run(run)
    run_sweep("s", grid(i=[3]), _fn(), results_dir=res, progress=False)
    archive_run(run)
    assert not (res / "s.jsonl").exists()
    df = load(res / "s.jsonl.gz")
    assert sorted(df["i"].unique().tolist()) == [0, 1, 2, 3]
    assert len(df) == 8 and df.groupby("i").size().tolist() == [2, 2, 2, 2]
    rows = _gz_rows(res / "s.jsonl.gz")
    assert len(rows) == 8, "each point's rows stored once"
    assert sorted(r["value"] for r in rows if r["metric"] == "m") == [0.5, 1.5, 2.5, 3.5]
    before = (res / "s.jsonl.gz").read_bytes()
    archive_run(run)                                   # nothing new: nothing changes
    assert (res / "s.jsonl.gz").read_bytes() == before


def test_resume_in_an_archived_run_reuses_the_gzipped_points(tmp_path):
    """A sweep resumed where only ``s.jsonl.gz`` is left runs the missing points only, returns
    every requested point, and ``load`` of either name sees the stored points of both files."""
    run, res = _run(tmp_path)
    run_sweep("s", grid(i=[0, 1]), _fn(), results_dir=res, progress=False)
    _manifest(run)
    archive_run(run)
    calls = []
    df = run_sweep("s", grid(i=[0, 1, 2]), _fn(calls), results_dir=res, progress=False)
    assert calls == [2], "points stored in the .gz ran again"
    assert sorted(df["i"].unique().tolist()) == [0, 1, 2] and len(df) == 6
    for name in ("s.jsonl", "s.jsonl.gz"):
        assert sorted(load(res / name)["i"].unique().tolist()) == [0, 1, 2]
    assert len(_gz_rows(res / "s.jsonl.gz")) == 4, "the archived file is left as it was"
    archive_run(run)
    assert sorted(load(res / "s.jsonl.gz")["i"].unique().tolist()) == [0, 1, 2]


def _restamp(path, commit):
    """Rewrite the stored rows of ``path`` as if they had run at ``commit``."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "commit": commit}) + "\n" for r in rows))


def test_resume_runs_points_of_another_commit_again(tmp_path, capsys):
    """Points stored at another commit are run again by default (their new rows are the ones
    returned and loaded; the next resume drops the old copies), as the rows of other kernel
    switches are not reused either."""
    from pmll_lab.results import provenance_here

    now = provenance_here()["commit"]
    run_sweep("s", grid(i=[0, 1]), _fn(), results_dir=tmp_path, progress=False)
    path = tmp_path / "s.jsonl"
    _restamp(path, "0123456789ab")
    calls = []
    df = run_sweep("s", grid(i=[0, 1, 2]), _fn(calls), results_dir=tmp_path, progress=True)
    assert calls == [0, 1, 2]
    assert set(df["commit"]) == {now} and len(df) == 6
    said = capsys.readouterr().out
    assert f"points stored at commit 0123456789ab ran again at {now}" in said
    assert set(load(path)["commit"]) == {now} and len(load(path)) == 6
    again = []
    run_sweep("s", grid(i=[0, 1, 2]), _fn(again), results_dir=tmp_path, progress=False)
    assert again == [] and len(path.read_text().splitlines()) == 6, "old copies left"


def test_resume_keeps_points_of_another_commit_only_when_asked(tmp_path, capsys, monkeypatch):
    """``keep_other_commits=True`` (or ``PMLL_LAB_KEEP_OTHER_COMMITS=1``, which the report's
    ``--keep-other-commits`` sets) reuses them; they keep their own commit and the summary line
    names it. A value other than 0/1 is refused naming the variable."""
    from pmll_lab.results import provenance_here

    now = provenance_here()["commit"]
    run_sweep("s", grid(i=[0, 1]), _fn(), results_dir=tmp_path, progress=False)
    _restamp(tmp_path / "s.jsonl", "0123456789ab")
    calls = []
    df = run_sweep("s", grid(i=[0, 1, 2]), _fn(calls), results_dir=tmp_path,
                   keep_other_commits=True)
    assert calls == [2]
    assert df.groupby("i")["commit"].first().tolist() == ["0123456789ab", "0123456789ab", now]
    said = capsys.readouterr().out
    assert f"2 kept from other commits: 0123456789ab; this is {now}" in said
    monkeypatch.setenv("PMLL_LAB_KEEP_OTHER_COMMITS", "1")
    assert run_sweep("s", grid(i=[0, 3]), _fn(calls), results_dir=tmp_path,
                     progress=False)["commit"].tolist()[:2] == ["0123456789ab"] * 2
    assert calls == [2, 3]
    monkeypatch.setenv("PMLL_LAB_KEEP_OTHER_COMMITS", "yes")
    with pytest.raises(ValueError, match="^PMLL_LAB_KEEP_OTHER_COMMITS: expected 0 or 1"):
        run_sweep("s", grid(i=[0]), _fn(), results_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="^keep_other_commits: must be None, True or False"):
        run_sweep("s", grid(i=[0]), _fn(), results_dir=tmp_path, keep_other_commits="yes")


def test_an_archived_run_resumed_at_another_commit_runs_its_points_once(tmp_path):
    """Points archived (``.gz``) at another commit run again on the first resume; their new
    copies (in the ``.jsonl``) are the ones the next resume finds, so it runs nothing. A point
    whose new copy failed runs again even when other commits' points are kept."""
    from pmll_lab.results import provenance_here, stored_points

    now = provenance_here()["commit"]
    run, res = _run(tmp_path)
    run_sweep("s", grid(i=[0, 1, 2]), _fn(), results_dir=res, progress=False)
    _restamp(res / "s.jsonl", "0123456789ab")
    _manifest(run)
    archive_run(run)
    calls = []

    def fail_on_1(p):
        if p["i"] == 1:
            calls.append(p["i"])
            raise RuntimeError("killed by the run's stop")
        return _fn(calls)(p)

    run_sweep("s", grid(i=[0, 1, 2]), fail_on_1, results_dir=res, progress=False)
    assert calls == [0, 1, 2]
    stored = stored_points(res / "s.jsonl")
    assert {pid: r["commit"] for pid, r in stored.items()} == {
        point_id(p): now for p in grid(i=[0, 1, 2])}
    assert stored[point_id({"i": 1})]["status"] == "failed"
    again = []
    df = run_sweep("s", grid(i=[0, 1, 2]), _fn(again), results_dir=res, progress=False,
                   keep_other_commits=True)
    assert again == [1], "only the point that failed at this commit runs again"
    assert set(df["commit"]) == {now} and (df["status"] == "ok").all() and len(df) == 6
    last = []
    run_sweep("s", grid(i=[0, 1, 2]), _fn(last), results_dir=res, progress=False)
    assert last == []


def test_a_resume_with_nothing_left_to_run_returns_the_archived_rows(tmp_path):
    """Every point already in the archived ``.gz`` and no ``.jsonl`` beside it: nothing runs,
    and the rows returned (and the CSV written) are the archived ones, not an empty frame."""
    run, res = _run(tmp_path)
    run_sweep("s", grid(i=[0, 1]), _fn(), results_dir=res, progress=False)
    _manifest(run)
    archive_run(run)
    assert not (res / "s.jsonl").exists()
    calls = []
    df = run_sweep("s", grid(i=[0, 1]), _fn(calls), results_dir=res, progress=False)
    assert calls == [] and len(df) == 4
    assert sorted(df.loc[df["metric"] == "m", "value"]) == [0.5, 1.5]
    assert len(pd.read_csv(res / "s.csv")) == 4
