"""The report across several workers: a Dask LocalCluster, the cluster arguments' checks, and every
committed notebook handing its scheduler to its sweeps."""

from __future__ import annotations

import json

import nbformat
import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.__main__ import main
from pmll_lab.report import REPO_ROOT, ReportError, build_report

DIST = '''\
from distributed import Event, get_worker
from pmll_lab.sweep import grid, run_sweep

def slow(p):
    # a point waits (up to 180 s) until both workers have started one: both must take points,
    # however slowly a loaded machine starts the second
    Event("seen-" + get_worker().name).set()
    for name in ("cpu0", "cpu1"):
        assert Event("seen-" + name).wait(180), "worker " + name + " never took a point"
    return [{"kernel": "k", "metric": "time_us", "value": 10.0 * p["n"]}]

df = run_sweep("tiny", grid(n=[1, 2, 3, 4]), slow, results_dir=results_dir, client=scheduler)
print("SCHEDULER-SEEN", scheduler is not None, sorted(df["worker"].unique()))
'''


def test_workers_run_the_sweeps_on_a_local_cluster_and_the_index_says_so(tmp_path):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('preset = "quick"\ndevice = "auto"\n'
                                       'results_dir = "results"\nscheduler = None')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(DIST)]
    nbformat.write(nb, nbdir / "dist.ipynb")
    manifest = build_report(device="cpu", notebooks_dir=nbdir, reports_dir=tmp_path / "reports",
                            workers=2, log=lambda m: None)
    assert manifest["ok"] is True, manifest["notebooks"]
    cluster = manifest["cluster"]
    assert cluster["kind"] == "LocalCluster" and cluster["workers"] == 2 and cluster["gpus"] == 0
    entry = manifest["notebooks"][0]
    assert entry["ran_on"]["workers"] == 2 and entry["ran_on"]["gpus"] == 0
    assert entry["ran_on"]["in_process"] is False
    run = tmp_path / "reports" / "latest"
    rows = [json.loads(x) for x in (run / "results/dist/tiny.jsonl").read_text().splitlines()]
    assert all(r.get("status") == "ok" for r in rows), [r.get("error") for r in rows]
    assert sorted(r["value"] for r in rows) == [10.0, 20.0, 30.0, 40.0]
    assert {r["worker"] for r in rows} == {"cpu0", "cpu1"}
    assert "SCHEDULER-SEEN True ['cpu0', 'cpu1']" in (run / "dist.html").read_text()
    index = (run / "index.html").read_text()
    assert "on a Dask LocalCluster of 2 workers: CPU" in index
    assert "2 Dask workers (CPU (" in index


def test_cluster_arguments_are_checked_before_running(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pmll_lab.report.SCHEDULER_TIMEOUT_S", 1.0)
    with pytest.raises(ReportError, match="workers: must be a positive int"):
        build_report(workers=0, notebooks_dir=tmp_path, reports_dir=tmp_path)
    with pytest.raises(ReportError, match="workers/scheduler: give one"):
        build_report(workers=2, scheduler="tcp://127.0.0.1:9", notebooks_dir=tmp_path,
                     reports_dir=tmp_path)
    (tmp_path / "notebooks").mkdir()
    with pytest.raises(ReportError, match="scheduler: no Dask scheduler answers"):
        build_report(device="cpu", scheduler="tcp://127.0.0.1:9",
                     notebooks_dir=tmp_path / "notebooks", reports_dir=tmp_path / "r")
    for bad in ("notanaddress", "tcp://host"):    # malformed: refused before connecting
        with pytest.raises(ReportError, match=f"^scheduler: '{bad}' is not a Dask scheduler "
                                              r"address \(e.g. tcp://"):
            build_report(device="cpu", scheduler=bad, notebooks_dir=tmp_path / "notebooks",
                         reports_dir=tmp_path / "r")
    with pytest.raises(SystemExit) as stop:       # the command line names its flag
        main(["report", "--workers", "-3", "--notebooks-dir", str(tmp_path / "notebooks"),
              "--reports-dir", str(tmp_path / "r")])
    assert stop.value.code == 2
    assert "argument --workers: must be > 0, got '-3'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one or the other
        main(["report", "--workers", "2", "--scheduler", "tcp://127.0.0.1:9"])


def test_committed_notebooks_pass_their_scheduler_to_every_sweep():
    """Each notebook's parameters cell has ``scheduler = None`` and every sweep call
    (``run_sweep`` or ``protocol.sweep``, its quiet form) passes ``client=scheduler``, so
    ``--workers`` / ``--scheduler`` reach all the sweeps."""
    import ast

    books = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
    assert books
    for path in books:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        params = ast.parse(code[0].source)
        values = {t.id: n.value for n in params.body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name)}
        assert "scheduler" in values and ast.literal_eval(values["scheduler"]) is None, path.name
        calls = [n for c in code[1:] for n in ast.walk(ast.parse(c.source))
                 if isinstance(n, ast.Call) and (getattr(n.func, "id", None) == "run_sweep"
                                                 or getattr(n.func, "attr", None) == "sweep")]
        assert calls, path.name
        for call in calls:
            kw = {k.arg: k.value for k in call.keywords}
            assert isinstance(kw.get("client"), ast.Name) and kw["client"].id == "scheduler", \
                f"{path.name}: a run_sweep call without client=scheduler"
