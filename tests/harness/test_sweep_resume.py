"""A resumed sweep after a torn write: a point counts as done only when all its rows are stored,
a torn last line is cut away on resume, and ``load`` shows complete points only."""

from __future__ import annotations

import json

import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.sweep import grid, load, point_id, run_sweep


def three_rows(p):
    """Three rows per point (a check, a flag and a timing, as real points write), seeded by
    the point."""
    return [{"kernel": "k", "metric": m, "value": 10.0 * p["i"] + j}
            for j, m in enumerate(("rel_l2", "bitwise", "time_us"))]


def _lines(path):
    return path.read_text().splitlines()


def _assert_clean(path, points, rows_per_point=3):
    """Every line parses, every point's rows stored exactly once."""
    stored = [json.loads(line) for line in _lines(path)]          # raises on a torn line
    per = {}
    for r in stored:
        per.setdefault(r["point_id"], []).append(r["metric"])
    assert set(per) == {point_id(p) for p in points}
    assert all(len(m) == rows_per_point and len(set(m)) == rows_per_point for m in per.values())


@pytest.mark.parametrize("cut, rerun", [(40, [2]), (1, [])], ids=["mid-row", "newline-only"])
def test_torn_last_row_reruns_its_point_and_is_repaired(tmp_path, cut, rerun):
    """Killed while writing point 2's last row (the issue's case: ``[2, 2, 1]`` rows came back
    and point 2 never ran again); a write cut just before its final newline holds every row,
    so nothing runs again and the newline is restored."""
    points = grid(i=range(3))
    run_sweep("s", points, three_rows, results_dir=tmp_path, progress=False)
    path = tmp_path / "s.jsonl"
    text = path.read_text()
    path.write_text(text[:-cut])
    calls = []
    df = run_sweep("s", points, lambda p: calls.append(p["i"]) or three_rows(p),
                   results_dir=tmp_path, progress=False)
    assert calls == rerun, "the point whose rows were cut must run again, and only it"
    assert df.groupby("i").size().tolist() == [3, 3, 3]
    assert sorted(df.loc[df.i == 2, "value"]) == [20.0, 21.0, 22.0]
    assert path.read_text().endswith("\n")
    _assert_clean(path, points)


def test_point_missing_whole_rows_is_not_done(tmp_path):
    """The file cut at a line boundary inside a point's rows (a short write that ended on a
    newline): every stored line parses, yet the point is incomplete and runs again."""
    points = grid(i=range(3))
    run_sweep("s", points, three_rows, results_dir=tmp_path, progress=False)
    path = tmp_path / "s.jsonl"
    lines = _lines(path)
    path.write_text("\n".join(lines[:7]) + "\n")      # point 2 keeps 1 of its 3 rows
    calls = []
    df = run_sweep("s", points, lambda p: calls.append(p["i"]) or three_rows(p),
                   results_dir=tmp_path, progress=False)
    assert calls == [2]
    assert df.groupby("i").size().tolist() == [3, 3, 3]
    _assert_clean(path, points)


def test_load_shows_complete_points_only(tmp_path):
    points = grid(i=range(3))
    run_sweep("s", points, three_rows, results_dir=tmp_path, progress=False)
    path = tmp_path / "s.jsonl"
    path.write_text(path.read_text()[:-40])
    df = load(path)
    assert sorted(df["i"].unique()) == [0, 1] and len(df) == 6
    assert (df["point_rows"] == 3).all()


def test_rows_without_a_row_count_count_as_stored(tmp_path):
    """Files written before rows carried ``point_rows`` (the committed runs under reports/):
    a point whose rows parse is done, as before."""
    points = grid(i=range(2))
    path = tmp_path / "s.jsonl"
    with path.open("w") as fh:
        for p in points:
            for row in three_rows(p):
                fh.write(json.dumps({**p, **row, "point_id": point_id(p), "status": "ok",
                                     "error": ""}) + "\n")
    df = run_sweep("s", points, lambda p: pytest.fail("ran again"), results_dir=tmp_path,
                   progress=False)
    assert len(df) == 6 and len(load(path)) == 6


def test_torn_middle_line_of_an_old_file_is_dropped(tmp_path):
    """A cut line left inside a file by an earlier version (which only appended a newline after
    it) is removed on resume; the rows around it stay."""
    points = grid(i=range(2))
    run_sweep("s", points[:1], three_rows, results_dir=tmp_path, progress=False)
    path = tmp_path / "s.jsonl"
    with path.open("a") as fh:
        fh.write('{"i": 1, "point_id": "' + point_id(points[1])[:5] + "\n")
    df = run_sweep("s", points, three_rows, results_dir=tmp_path, progress=False)
    assert df.groupby("i").size().tolist() == [3, 3]
    _assert_clean(path, points)


def test_replace_text_keeps_the_old_file_when_the_write_fails(tmp_path):
    """The repaired results file, the CSV beside it and a report's manifest are written to a
    temporary file and moved over the old one: a write that fails midway leaves the old file
    whole and no temporary file behind."""
    from pmll_lab.results import replace_text

    path = tmp_path / "manifest.json"
    path.write_text('{"notebooks": ["a"]}\n')

    with pytest.raises(TypeError):
        replace_text(path, None)                  # fails inside the write
    assert path.read_text() == '{"notebooks": ["a"]}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    replace_text(path, "new é\n")
    assert path.read_text(encoding="utf-8") == "new é\n"


def test_resume_refuses_points_run_under_other_kernel_switches(tmp_path):
    """A results file whose points ran with other import-time kernel switches is not resumed:
    the new points would be other kernels', and the report would label all of them with this
    process's switches. Rows of this process's switches resume as before."""
    import json

    from pmll_lab.ops import settings
    from pmll_lab.sweep import grid, run_sweep

    def fn(p):
        return [{"kernel": "k", "metric": "x", "value": float(p["n"])}]

    run_sweep("s", grid(n=[1, 2]), fn, results_dir=tmp_path, progress=False)
    assert len(run_sweep("s", grid(n=[1, 2, 3]), fn, results_dir=tmp_path, progress=False)) == 3
    path = tmp_path / "s.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    now = settings.import_switches()
    other = now.replace("packed_state_tile=1", "packed_state_tile=0") if "packed_state_tile=1" \
        in now else now.replace("packed_state_tile=0", "packed_state_tile=1")
    assert other != now
    path.write_text("".join(json.dumps({**r, "import_settings": other}) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"^results_dir: .*s\.jsonl holds points run with "
                                         r"kernel switches .*packed_state_tile="):
        run_sweep("s", grid(n=[1, 2, 3, 4]), fn, results_dir=tmp_path, progress=False)


def test_failed_points_run_again_on_resume(tmp_path):
    """A point that failed (its function raised, or its check failed: every row marked failed)
    runs again when the sweep is resumed, and its new rows replace the failed ones; a point
    with one failed row among others (a peer's, inside the point) is done and does not."""
    from pmll_lab.results import CheckFailed

    points = grid(i=range(4))

    def first(p):
        if p["i"] == 1:
            raise RuntimeError("ptxas killed by the run's stop")
        if p["i"] == 2:
            raise CheckFailed("o differs", [{"kernel": "k", "metric": "rel_l2", "value": 9.0}])
        rows = three_rows(p)
        if p["i"] == 3:
            rows[0]["status"] = "failed"               # a peer's row failed inside the point
        return rows

    df = run_sweep("s", points, first, results_dir=tmp_path, progress=False)
    assert sorted(df.loc[df.status == "failed", "i"].unique()) == [1, 2, 3]
    calls = []
    df = run_sweep("s", points, lambda p: calls.append(p["i"]) or three_rows(p),
                   results_dir=tmp_path, progress=False)
    assert calls == [1, 2], "the failed points, and only they, run again"
    assert df.groupby("i").size().tolist() == [3, 3, 3, 3]
    assert (df.loc[df.i.isin([1, 2]), "status"] == "ok").all()
    assert sorted(df.loc[df.i == 1, "value"]) == [10.0, 11.0, 12.0]
    assert (df.loc[df.i == 3, "status"] == "failed").sum() == 1
    again = []
    run_sweep("s", points, lambda p: again.append(p["i"]) or three_rows(p),
              results_dir=tmp_path, progress=False)
    assert again == [], "nothing failed is left to run"


def test_the_summary_counts_a_point_listed_twice_once(tmp_path, capsys):
    run_sweep("s", [{"i": 0}, {"i": 0}, {"i": 1}], three_rows, results_dir=tmp_path,
              progress=True)
    said = capsys.readouterr().out
    assert "sweep s: 2 points, 2 run now (0 failed)" in said
    assert ", 0 from earlier runs" in said


def test_points_stored_on_another_device_run_again_on_resume(tmp_path):
    """A stored point whose rows name another device (a GPU run's folder resumed on the CPU,
    or the other way round) is never reused, with or without ``keep_other_commits``: its rows
    are replaced by this device's."""
    points = grid(i=range(3))
    run_sweep("s", points, three_rows, results_dir=tmp_path, progress=False)
    path = tmp_path / "s.jsonl"
    rows = [json.loads(line) for line in _lines(path)]
    here = rows[0]["device"]
    for r in rows:
        if r["i"] == 1:
            r["device"] = "NVIDIA H200 (elsewhere)"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for keep in (False, True):
        calls = []
        df = run_sweep("s", points, lambda p: calls.append(p["i"]) or three_rows(p),
                       results_dir=tmp_path, progress=False, keep_other_commits=keep)
        assert calls == ([1] if not keep else []), keep
        assert set(df["device"]) == {here} and len(df) == 9
