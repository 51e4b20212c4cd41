"""The run's index as a reader meets it: a GPU headline that fits the window and says only what
it means, a status consistent with the verdict, and a run's state while it runs or after it was
stopped (pmll_lab.report_index, pmll_lab.report)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import nbformat

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.report import REPO_ROOT, index_html

GPU_RUN = REPO_ROOT / "reports" / "h200-2026-12-05"


def _headline_tables(page: str) -> dict[str, str]:
    return dict(re.findall(r"<h2>Headline: (\w+)</h2>\s*(<table class='headline'>.*?</table>)",
                           page, flags=re.S))


def _headers(table: str) -> list[str]:
    return re.findall(r"<th>(.*?)</th>", table)


def _gpu_page(tmp_path):
    """The committed GPU run's manifest and headlines, indexed afresh."""
    run = tmp_path / "run"
    shutil.copytree(GPU_RUN / "results", run / "results",
                    ignore=shutil.ignore_patterns("*.jsonl.gz"))
    manifest = json.loads((GPU_RUN / "manifest.json").read_text())
    return manifest, index_html(manifest, run_dir=run)


def test_gpu_headline_shows_only_columns_that_say_something(tmp_path):
    """The committed H200 headlines: no column empty in every row (roofline fraction), no
    selector columns (ours, peer: the target's tooltip), no "cells met" when every target is
    one cell, the layout and timer (one value in every row) once under the table; each target's
    text once for its rows (B = 64, 128)."""
    _, page = _gpu_page(tmp_path)
    tables = _headline_tables(page)
    assert set(tables) == {"carry_protocol", "roofline"}
    for name, table in tables.items():
        assert _headers(table) == ["status", "target", "B", "ours / peer", "bound", "ours (µs)",
                                   "peer (µs)"], name
        assert "form=exact_lazy, state_dtype=" in table           # the tooltip keeps them
        assert "<td>form=" not in table and "cuda_graph" not in table
        caption = page[page.index(table) + len(table):].split("</p>")[0]
        assert "state layout: V-major" in caption
        assert "timer: CUDA graph replay, median (GPU time)" in caption
    cp = tables["carry_protocol"]
    assert cp.count("rowspan='2'") == 10 and cp.count("<tr>") == 1 + 20
    text = "carry exact lazy step against our chain + snapshots + restore, fp32 state"
    assert cp.count(f">{text}</td>") == 1


def test_reported_rows_do_not_read_as_misses_and_the_status_agrees_with_the_verdict(tmp_path):
    """A reported figure (no bound) is grey and shows no met count; a notebook that met none of
    its targets carries no green "ok" above its red "0 of 8 targets met"; the summary line
    gives the targets met of the total in the same colour and no "all ok"."""
    _, page = _gpu_page(tmp_path)
    cp = _headline_tables(page)["carry_protocol"]
    assert cp.count("<td class='quiet'>reported</td>") == 12
    assert "cells met" not in cp and ">0</td>" not in cp
    row = page[page.index("<b>carry_protocol</b>"):].split("</tr>")[0]
    assert "class='ok'" not in row and "ran to the end" in row
    assert "<div class='failed'>0 of 8 targets met</div>" in row
    roof = page[page.index("<b>roofline</b>"):].split("</tr>")[0]
    assert "<div class='failed'>5 of 9 targets met</div>" in roof
    assert "<span class='failed'>targets met: 5 of 17</span>" in page
    assert "all ok" not in page and "none failed" not in page


def test_several_cells_and_a_varying_layout_stay_as_columns(tmp_path):
    """A target judged over several cells shows its cells met (a judged row only); a column
    whose rows differ (layout) stays a column, its values in words."""
    res = tmp_path / "results" / "nb"
    res.mkdir(parents=True)
    (res / "headline.csv").write_text(
        "status,target,ours,peer,ratio,roofline_frac,bound,cells,met_cells,layout,timer,note\n"
        "missed,a <= b,x,y,1.2,,1.0,4,3,kv,cuda_graph,worst at T=64\n"
        "reported,a against c,x,z,0.5,,,1,0,vk,cuda_graph,\n")
    manifest = {"run": "t", "environment": {}, "complete": True, "notebooks": [
        {"name": "nb", "status": "ok", "seconds": 1.0, "results": ["results/nb/headline.csv"]}]}
    table = _headline_tables(index_html(manifest, run_dir=tmp_path))["nb"]
    assert _headers(table) == ["status", "target", "ours / peer", "bound", "cells met",
                               "state layout", "note"]
    assert "<td class='num'>3 of 4</td>" in table and "<td class='num'></td>" in table
    assert "<td>K-major</td>" in table and "<td>V-major</td>" in table


def test_committed_gpu_index_is_the_one_the_builder_writes(tmp_path):
    """reports/h200-2026-12-05/index.html is regenerated from its manifest and headlines
    (``python -m pmll_lab.report_archive``), so the committed page reads as above."""
    manifest = json.loads((GPU_RUN / "manifest.json").read_text())
    assert (GPU_RUN / "index.html").read_text() == index_html(manifest, run_dir=GPU_RUN)


def _notebook(path, body: str) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('preset = "quick"\ndevice = "auto"\nresults_dir = "results"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, path)


SLOW = '''
import os, time
open("slow.pid", "w").write(str(os.getpid()))
print("SLOW-STARTED", flush=True)
time.sleep(300)
'''


def test_index_while_running_and_after_a_stop(tmp_path):
    """While the first notebook runs the index says so (its name, 1 of 2, the one still to
    run), not "nothing ran". SIGTERM stops the report (exit 130): the index names the notebook
    stopped (its partial report linked), the earlier call's report of the notebook not run is
    linked as from the earlier call, a report of a notebook this run no longer has is removed,
    and the stopped notebook's kernel is gone."""
    nbdir, reports = tmp_path / "notebooks", tmp_path / "reports"
    nbdir.mkdir()
    _notebook(nbdir / "a_slow.ipynb", SLOW)
    _notebook(nbdir / "b_next.ipynb", 'print("B")')
    run = reports / "latest"
    run.mkdir(parents=True)
    earlier = {"run": "latest", "environment": {}, "complete": True, "notebooks": [
        {"name": n, "status": "ok", "html": f"{n}.html", "ipynb": None, "results": [],
         "started_utc": "2026-01-02T03:04:05+00:00", "preset": "quick", "commit": "abc1234"}
        for n in ("a_slow", "b_next", "gone")]}
    (run / "manifest.json").write_text(json.dumps(earlier))
    for n in ("a_slow", "b_next", "gone"):
        (run / f"{n}.html").write_text(f"earlier {n}")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "pmll_lab", "report", "--device", "cpu",
                             "--notebooks-dir", str(nbdir), "--reports-dir", str(reports)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while not (nbdir / "slow.pid").exists() and time.time() < deadline:
            time.sleep(0.5)
        assert (nbdir / "slow.pid").exists(), "the slow notebook never started"
        page = (run / "index.html").read_text()
        assert "No notebooks found" not in page and "nothing ran" not in page
        assert "notebook <b>a_slow</b> (1 of 2) is running since" in page
        assert "Still to run: b_next." in page
        assert not (run / "gone.html").exists()          # not in this run: removed, not orphaned
        time.sleep(2)                                     # inside the notebook's sleep
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "stopped" in out and "index.html" in out
    page = (run / "index.html").read_text()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["interrupted"]["name"] == "a_slow"
    assert "an interrupt ended notebook <b>a_slow</b>" in page and "Not run: b_next." in page
    by = {b["name"]: b for b in manifest["notebooks"]}
    assert by["a_slow"]["status"] == "interrupted" and by["a_slow"]["html"] == "a_slow.html"
    assert "SLOW-STARTED" in (run / "a_slow.html").read_text()    # the partial report
    assert "STOPPED" in (run / "a_slow.html").read_text()
    assert by["b_next"]["kept_from_earlier"] and (run / "b_next.html").read_text() == \
        "earlier b_next"
    row = page[page.index("<b>b_next</b>"):].split("</tr>")[0]
    assert "from an earlier call: 2026-01-02 03:04:05 UTC" in row and "href='b_next.html'" in row
    assert "gone" not in by and not (run / "gone.html").exists()
    pid = int((nbdir / "slow.pid").read_text())
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "the stopped notebook's kernel still runs"
