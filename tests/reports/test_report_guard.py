"""What a report call, a resume and the archive refuse before they touch a run, so that a kill,
a second call or an odd file loses no stored result (``pmll_lab.report_guard``,
``pmll_lab.report_archive``, ``pmll_lab.results``, ``pmll_lab.backend.git_commit``). On
constructed run folders: no notebook runs."""

from __future__ import annotations

import json
import subprocess

import pytest

from pmll_lab import backend, report_guard, results
from pmll_lab.report import check_notebooks
from pmll_lab.report_archive import archive_run
from pmll_lab.report_notebooks import ReportError
from _paths import ROOT

ENV = {"device": "NVIDIA H200"}


def _killed_run(tmp_path, *, running="gdn_conv", preset="quick"):
    """A run folder as a SIGKILL mid-notebook leaves it: no entry, ``running`` set, rows."""
    run = tmp_path / "k9"
    res = run / "results" / "gdn_conv"
    res.mkdir(parents=True)
    (res / "gdn_conv.jsonl").write_text(json.dumps({"point_id": "p", "value": 1.0}) + "\n")
    (run / "manifest.json").write_text(json.dumps({
        "run": "k9", "preset": preset, "environment": ENV, "notebooks": [],
        "running": {"name": running, "number": 1, "of": 1} if running else None}))
    return run


def test_a_notebook_killed_mid_run_still_guards_its_results(tmp_path):
    """The killed notebook has no manifest entry, only ``running``: its results keep their
    device and preset, so another preset without ``resume``, or another device, is refused;
    the same preset and device may resume them."""
    run = _killed_run(tmp_path)
    previous, guarded = report_guard.previous(run)
    assert previous == [] and guarded[0]["name"] == "gdn_conv"
    with pytest.raises(ReportError, match=r"^run: 'k9' holds gdn_conv's results from preset "
                                          r"'quick'; this call would replace them"):
        report_guard.refuse_replacing(run, guarded, ["gdn_conv"], ENV, "full", resume=False)
    with pytest.raises(ReportError, match=r"holds gdn_conv's results from device 'NVIDIA H200'"):
        report_guard.refuse_replacing(run, guarded, ["gdn_conv"], {"device": "CPU"}, "quick",
                                      resume=True)
    report_guard.refuse_replacing(run, guarded, ["gdn_conv"], ENV, "quick", resume=True)


def test_results_no_entry_describes_are_not_deleted_without_resume(tmp_path):
    run = _killed_run(tmp_path, running=None)
    previous, guarded = report_guard.previous(run)
    assert guarded == []
    with pytest.raises(ReportError, match=r"holds gdn_conv's results with no record of their "
                                          r"device and preset"):
        report_guard.refuse_replacing(run, guarded, ["gdn_conv"], ENV, "quick", resume=False)
    report_guard.refuse_replacing(run, guarded, ["gdn_conv"], ENV, "quick", resume=True)
    report_guard.refuse_replacing(run, guarded, ["pmll_ring"], ENV, "quick", resume=False)


def test_one_report_at_a_time_per_run_folder(tmp_path):
    """A second call on a run folder another call is writing is refused, naming ``run``
    (each would rewrite the manifest without the other's notebooks); the lock goes with the
    call."""
    run = tmp_path / "same"
    with report_guard.run_lock(run):
        with pytest.raises(ReportError, match=r"^run: another report is writing to .*same"):
            with report_guard.run_lock(run):
                pass
        with report_guard.run_lock(tmp_path / "other"):
            pass
    with report_guard.run_lock(run):
        pass


@pytest.mark.parametrize("params, message", [
    ({"seed": -1}, r"^params: gdn_conv\.ipynb: seed: must be an int >= 0, got -1"),
    ({"grids": "gdn_convv"}, r"^params: gdn_conv\.ipynb: grids: .*no workload 'gdn_convv'"),
])
def test_a_parameter_value_against_its_rule_is_refused_before_the_run(params, message):
    with pytest.raises(ReportError, match=message):
        check_notebooks([ROOT / "notebooks" / "gdn_conv.ipynb"], params)
    check_notebooks([ROOT / "notebooks" / "gdn_conv.ipynb"], {"seed": 3})


def _archivable(tmp_path):
    run = tmp_path / "done"
    res = run / "results" / "gdn_conv"
    res.mkdir(parents=True)
    rows = [{"point_id": "p", "point_rows": 1, "value": 1.0}]
    (res / "gdn_conv.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "gdn_conv.ipynb").write_text("{}")
    (run / "gdn_conv.html").write_text("<html></html>")
    (run / "manifest.json").write_text(json.dumps({
        "run": "done", "environment": ENV, "complete": True, "notebooks": [
            {"name": "gdn_conv", "status": "ok", "html": "gdn_conv.html",
             "ipynb": "gdn_conv.ipynb", "results": ["results/gdn_conv/gdn_conv.jsonl"]}]}))
    return run


@pytest.mark.parametrize("odd", ["folder", "not_utf8"])
def test_the_archive_reads_every_results_file_before_it_deletes_anything(tmp_path, odd):
    run = _archivable(tmp_path)
    res = run / "results" / "gdn_conv"
    if odd == "folder":
        (res / "zz.jsonl").mkdir()
    else:
        with open(res / "gdn_conv.jsonl", "ab") as fh:
            fh.write(b'{"point_id": "q", "what": "\xff\xfe"}\n')
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with pytest.raises(ValueError, match=r"^run_dir: results file .*\.jsonl cannot be read .*"
                                         r"nothing was changed"):
        archive_run(run)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_the_archive_refuses_a_manifest_pointing_outside_the_run(tmp_path):
    run = _archivable(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    m = json.loads((run / "manifest.json").read_text())
    m["notebooks"][0]["html"] = "../victim.txt"
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"html/ipynb not a file name of the run folder"):
        archive_run(run, drop_html=("gdn_conv",))
    assert victim.read_text() == "keep me" and (run / "gdn_conv.ipynb").exists()


def test_a_results_line_cut_inside_a_character_is_a_torn_line(tmp_path):
    """A write cut inside a multi-byte character leaves bytes that are not UTF-8: resume reads
    the file, keeps the whole points and drops that one (to run it again)."""
    path = tmp_path / "r.jsonl"
    whole = json.dumps({"point_id": "a", "point_rows": 1, "unit": "µs"}, ensure_ascii=False)
    torn = json.dumps({"point_id": "b", "point_rows": 1, "unit": "µs"},
                      ensure_ascii=False).encode()
    path.write_bytes(whole.encode() + b"\n" + torn[:torn.index("µ".encode()) + 1])
    assert list(results.stored_points(path)) == ["a"]
    assert path.read_text(encoding="utf-8") == whole + "\n"       # repaired in place


def test_two_uncommitted_edits_of_one_commit_name_two_commits(monkeypatch):
    """``git_commit`` marks a dirty tree with a hash of its difference, so a resumed sweep
    does not take points made by one uncommitted edit for another's."""
    monkeypatch.delenv("PMLL_LAB_COMMIT", raising=False)
    diff = {"now": b""}

    def fake(cmd, **kw):
        out = "abc123def456\n" if "rev-parse" in cmd else diff["now"]
        assert "rev-parse" in cmd or ":(exclude)reports" in cmd
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    def commit(d: bytes) -> str:
        diff["now"] = d
        backend.git_commit.cache_clear()           # once per process otherwise
        return backend.git_commit()

    monkeypatch.setattr(backend.subprocess, "run", fake)
    try:
        assert commit(b"") == "abc123def456"
        a = commit(b"diff --git a/x b/x\n+edit A\n")
        b = commit(b"diff --git a/x b/x\n+edit B\n")
    finally:
        monkeypatch.undo()
        backend.git_commit.cache_clear()
    assert a.startswith("abc123def456-dirty-") and len(a) == len("abc123def456-dirty-") + 8
    assert a != b


def test_a_run_that_cannot_be_written_ends_with_a_message_not_a_traceback(monkeypatch, capsys,
                                                                          tmp_path):
    """A full disk or a read-only run folder mid-run: exit 1 with one line naming the run's
    stored points and ``--resume``."""
    import pmll_lab.__main__ as cli

    def full(**kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "build_report", full)
    assert cli.main(["report", "--run", "disk", "--reports-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pmll_lab report: cannot read or write the run (OSError: [Errno 28] No space")
    assert "--resume continues them" in err and "Traceback" not in err


def test_a_killed_replace_is_guarded_by_its_own_preset_beside_the_kept_entry(tmp_path):
    """A ``--replace`` with the full preset killed mid-notebook: the manifest keeps the earlier
    quick entry and names the killed call's preset; both guard the results, so a quick call
    without ``resume`` (which would delete the full rows) is refused."""
    run = _killed_run(tmp_path, preset="full")
    m = json.loads((run / "manifest.json").read_text())
    m["notebooks"] = [{"name": "gdn_conv", "preset": "quick", "device": ENV["device"],
                       "status": "ok", "kept_from_earlier": True}]
    (run / "manifest.json").write_text(json.dumps(m))
    previous, guarded = report_guard.previous(run)
    assert [g["preset"] for g in guarded] == ["quick", "full"]
    with pytest.raises(ReportError, match=r"holds gdn_conv's results from preset 'full'"):
        report_guard.refuse_replacing(run, guarded, ["gdn_conv"], ENV, "quick", resume=False)


def test_the_lock_lies_beside_the_run_whatever_the_temp_folder(tmp_path, monkeypatch):
    """Two calls with different temp folders (a batch system's per-job ``TMPDIR``) still see
    one lock: it is ``.<run>.lock`` in the reports folder."""
    import tempfile

    run = tmp_path / "reports" / "r1"
    with report_guard.run_lock(run):
        assert (tmp_path / "reports" / ".r1.lock").is_file()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        with pytest.raises(ReportError, match=r"^run: another report is writing"):
            with report_guard.run_lock(run):
                pass
    archived = _archivable(tmp_path / "reports")
    with report_guard.run_lock(archived):
        with pytest.raises(ValueError, match=r"^run_dir: a report is writing .* now"):
            archive_run(archived)
    assert (archived / "gdn_conv.ipynb").exists()


@pytest.mark.parametrize("odd", ["gz_folder", "gz_not_utf8", "gz_not_gzip"])
def test_the_archive_reads_the_archived_copy_too_before_it_merges(tmp_path, odd):
    import gzip

    run = _archivable(tmp_path)
    gz = run / "results" / "gdn_conv" / "gdn_conv.jsonl.gz"
    if odd == "gz_folder":
        gz.mkdir()
    elif odd == "gz_not_gzip":
        gz.write_text('{"point_id": "old", "point_rows": 1}\n')
    else:
        gz.write_bytes(gzip.compress(b'{"point_id": "old", "point_rows": 1, "u": "\xff"}\n'))
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with pytest.raises(ValueError, match=r"^run_dir: results file .* cannot be read"):
        archive_run(run)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_a_killed_calls_guard_outlives_a_call_on_another_notebook(tmp_path):
    """The guard of a notebook killed mid-run is carried forward by a call that runs only
    another notebook (``killed`` in its manifest), until that notebook runs again."""
    run = _killed_run(tmp_path, preset="full")
    _, guarded = report_guard.previous(run)
    kept = report_guard.carried(guarded, ["pmll_ring"])
    assert kept == [{"name": "gdn_conv", "device": ENV["device"], "preset": "full"}]
    assert report_guard.carried(guarded, ["gdn_conv"]) == []
    (run / "manifest.json").write_text(json.dumps({"run": "k9", "preset": "quick",
                                                   "environment": ENV, "notebooks": [],
                                                   "running": None, "killed": kept}))
    _, guarded = report_guard.previous(run)
    with pytest.raises(ReportError, match=r"holds gdn_conv's results from preset 'full'"):
        report_guard.refuse_replacing(run, guarded, ["gdn_conv"], ENV, "quick", resume=False)


def test_a_lock_on_a_run_that_never_started_leaves_nothing_and_is_taken_again(tmp_path):
    reports = tmp_path / "new" / "reports"
    with report_guard.run_lock(reports / "r"):
        assert (reports / ".r.lock").is_file()
    assert not (tmp_path / "new").exists()
    with report_guard.run_lock(reports / "r"):
        (reports / "r").mkdir()
    assert (reports / ".r.lock").is_file() and (reports / "r").is_dir()
