"""Pruning a finished run for committing (``pmll_lab.report_archive``): what stays, what goes,
and that the rewritten index links only to files that exist."""

from __future__ import annotations

import gzip
import json
import re

import pandas as pd
import pytest

from pmll_lab.report_archive import archive_run, main
from _paths import ROOT


def _fake_run(tmp_path):
    run = tmp_path / "h200-2099-01-01"
    for nb in ("roofline", "gdn_verify"):
        res = run / "results" / nb
        res.mkdir(parents=True)
        rows = [{"kernel": "decodes", "B": b, "value": 1.5 * b} for b in (1, 64)]
        (res / f"{nb}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        pd.DataFrame(rows).to_csv(res / f"{nb}.csv", index=False)
        (run / f"{nb}.html").write_text("<html>report</html>")
        (run / f"{nb}.ipynb").write_text("{}")
    pd.DataFrame([{"target": "decode", "B": 64, "ours_us": 75.0, "status": "missed"}]).to_csv(
        run / "results" / "roofline" / "headline.csv", index=False)
    books = [{"name": nb, "status": "ok", "seconds": 1.0, "html": f"{nb}.html",
              "ipynb": f"{nb}.ipynb",
              "results": [f"results/{nb}/{nb}.csv", f"results/{nb}/{nb}.jsonl"]
              + (["results/roofline/headline.csv"] if nb == "roofline" else [])}
             for nb in ("roofline", "gdn_verify")]
    (run / "manifest.json").write_text(json.dumps({"run": run.name, "notebooks": books,
                                                   "environment": {"device": "NVIDIA H200"}}))
    return run


def test_archive_keeps_results_gzipped_and_the_index_links_only_what_exists(tmp_path):
    run = _fake_run(tmp_path)
    man = archive_run(run, drop_html=("gdn_verify",), note="kept for the record")
    files = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())
    assert files == ["index.html", "manifest.json", "results/gdn_verify/gdn_verify.jsonl.gz",
                     "results/roofline/headline.csv", "results/roofline/roofline.jsonl.gz",
                     "roofline.html"]
    back = pd.read_json(run / "results" / "roofline" / "roofline.jsonl.gz", lines=True)
    assert back["value"].tolist() == [1.5, 96.0]
    by = {b["name"]: b for b in man["notebooks"]}
    assert by["roofline"]["html"] == "roofline.html" and by["gdn_verify"]["html"] is None
    assert by["roofline"]["results"] == ["results/roofline/roofline.jsonl.gz",
                                         "results/roofline/headline.csv"]
    index = (run / "index.html").read_text()
    links = re.findall(r"href='([^']+)'", index)
    assert links and all((run / ln).is_file() for ln in links), links
    assert "kept for the record" in index and "Headline: roofline" in index
    assert json.loads((run / "manifest.json").read_text()) == man
    # idempotent: a second pass changes nothing
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main([str(run), "--note", "kept for the record"]) == 0
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    with gzip.open(run / "results" / "gdn_verify" / "gdn_verify.jsonl.gz", "rt") as f:
        assert len(f.readlines()) == 2


def test_archive_errors_name_the_argument(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="run_dir"):
        archive_run(tmp_path)
    run = _fake_run(tmp_path)
    with pytest.raises(ValueError, match="drop_html"):
        archive_run(run, drop_html=("pmll_ring",))
    assert (run / "roofline.ipynb").is_file()          # nothing pruned before the error
    for argv, said in (([str(tmp_path / "none")], "run_dir: no manifest.json"),
                       ([str(run), "--drop-html", "pmll_ring"], "drop_html: ['pmll_ring']")):
        with pytest.raises(SystemExit) as stop:         # the command line: a message, no traceback
            main(argv)
        assert stop.value.code == 2 and said in capsys.readouterr().err


def test_a_sweep_file_named_as_written_resolves_in_an_archived_run(tmp_path):
    """A sweep prints ``results/<nb>/<name>.jsonl``; once archived only ``.jsonl.gz`` is
    left, and the readers (``results.load``, ``results_placement``) take either name."""
    from pmll_lab.report_notebooks import results_placement
    from pmll_lab.results import load

    run = _fake_run(tmp_path)
    res = run / "results" / "roofline"
    rows = [{"kernel": "decodes", "point_id": f"p{i}", "device": "NVIDIA H200", "gpu": i,
             "worker": f"tcp://10.0.0.{i}:1", "B": 1 + i, "value": 0.5 + i} for i in range(3)]
    (res / "roofline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before, placed = load(res / "roofline.jsonl"), results_placement(res)
    archive_run(run)
    assert not (res / "roofline.jsonl").exists() and (res / "roofline.jsonl.gz").is_file()
    for name in ("roofline.jsonl", "roofline.jsonl.gz"):
        pd.testing.assert_frame_equal(load(res / name), before)
    assert load(res / "roofline.jsonl")["value"].tolist() == [0.5, 1.5, 2.5]
    assert results_placement(res) == placed and placed["workers"] == 3
    with pytest.raises(FileNotFoundError, match="path: no results file .*missing.jsonl"):
        load(res / "missing.jsonl")


def test_no_committed_report_shows_a_traceback():
    """A failed point shows its error's last line only (``protocol.error_line``), in every
    committed rendered report and index."""
    reports = ROOT / "reports"
    pages = sorted(reports.glob("*/*.html"))
    assert pages
    shown = [p.relative_to(reports).as_posix() for p in pages
             if "Traceback (most recent call last)" in p.read_text(encoding="utf-8")]
    assert shown == []
