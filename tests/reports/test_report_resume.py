"""The report builder's resume across commits and its refusal of notebooks that cannot make a
page of the run (a name the run's own files take or a link cannot hold, no parameters cell)."""

from __future__ import annotations

import json

import nbformat
import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.__main__ import main
from pmll_lab.report import ReportError, build_report

SWEEP = '''\
from pmll_lab.sweep import grid, run_sweep
df = run_sweep("tiny", grid(n=[1, 2]),
               lambda p: [{"kernel": "k", "metric": "x", "value": 10.0 * p["n"]}],
               results_dir=results_dir)
print("ROWS", len(df), sorted(df["commit"].unique()))
'''


def _notebook(path, params='preset = "quick"\ndevice = "auto"\nresults_dir = "results"',
              tag=True, body=SWEEP):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(params)
    if tag:
        cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("stem, said", [
    ("index", "is named like one of the run's own files"),
    ("Manifest", "is named like one of the run's own files"),
    ("a#b", "a notebook's name may hold letters, digits"),
    ("two words", "a notebook's name may hold letters, digits"),
    ("q?x", "a notebook's name may hold letters, digits"),
])
def test_a_notebook_name_the_run_cannot_link_is_refused_before_the_run(tmp_path, stem, said):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / f"{stem}.ipynb")
    with pytest.raises(ReportError, match=rf"^notebooks: .*{stem}.*{said}"):
        build_report(device="cpu", notebooks_dir=nbdir, reports_dir=tmp_path / "reports",
                     log=lambda m: None)
    assert not (tmp_path / "reports").exists(), "a refused run created its folder"


def test_a_notebook_without_the_parameters_it_is_given_is_refused(tmp_path):
    """No cell tagged ``parameters`` (papermill would inject above the notebook's own values,
    and the results would land beside it), or one that does not assign ``results_dir``:
    refused naming the notebook."""
    from pmll_lab.report import check_notebooks

    untagged = _notebook(tmp_path / "untagged.ipynb", tag=False)
    partial = _notebook(tmp_path / "partial.ipynb", params='preset = "quick"\ndevice = "auto"')
    fine = _notebook(tmp_path / "fine-v2.0_x.ipynb")
    with pytest.raises(ReportError, match=r"^notebooks: untagged.ipynb has no code cell tagged "
                                          r"'parameters'"):
        check_notebooks([untagged])
    with pytest.raises(ReportError, match=r"^notebooks: the parameters cell of partial.ipynb "
                                          r"does not assign results_dir"):
        check_notebooks([partial])
    check_notebooks([fine])
    with pytest.raises(ReportError, match="^notebooks: untagged.ipynb has no code cell"):
        build_report([untagged], device="cpu", reports_dir=tmp_path / "reports",
                     log=lambda m: None)
    assert not (tmp_path / "reports").exists()


def _restamp(results, commit):
    path = results / "tiny.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "commit": commit}) + "\n" for r in rows))


def test_resume_reruns_points_of_another_commit_unless_kept_and_then_says_so(tmp_path, capsys):
    """``--resume`` after a commit: the stored points run again at this commit (the page and
    the index name no other commit). ``--resume --keep-other-commits`` reuses them, and the
    notebook's page and its index entry say how many points are from which commit.
    ``--keep-other-commits`` without ``--resume`` is refused naming the flag."""
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "nb.ipynb")
    kw = dict(device="cpu", notebooks_dir=nbdir, reports_dir=tmp_path / "reports",
              log=lambda m: None)
    first = build_report(**kw)
    now = first["environment"]["commit"]
    run = tmp_path / "reports" / "latest"
    results = run / "results" / "nb"
    _restamp(results, "0123456789ab")

    again = build_report(resume=True, **kw)
    (entry,) = again["notebooks"]
    assert entry["status"] == "ok" and entry["other_commits"] == {}
    assert f"ROWS 2 ['{now}']" in (run / "nb.html").read_text()
    assert "0123456789ab" not in (run / "index.html").read_text()

    _restamp(results, "0123456789ab")
    kept = build_report(resume=True, keep_other_commits=True, **kw)
    (entry,) = kept["notebooks"]
    assert entry["other_commits"] == {"0123456789ab": 2}
    said = "2 of 2 sweep points are from an earlier call at another commit: 0123456789ab"
    page, index = (run / "nb.html").read_text(), (run / "index.html").read_text()
    assert said in page and said in index
    assert "ROWS 2 ['0123456789ab']" in page                   # the rows reused
    assert f"not this run's ({now})" in page

    with pytest.raises(ReportError, match="^keep_other_commits: True only with resume"):
        build_report(keep_other_commits=True, **kw)
    with pytest.raises(SystemExit) as stop:
        main(["report", "--keep-other-commits", "--notebooks-dir", str(nbdir),
              "--reports-dir", str(tmp_path / "reports")])
    assert stop.value.code == 2
    assert "--keep-other-commits: only with --resume" in capsys.readouterr().err
