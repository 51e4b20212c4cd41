"""The run's ``index.html``: provenance, one row per notebook, the notebooks' headline tables.

Pure rendering of a report's manifest (``pmll_lab.report`` writes it beside ``manifest.json``
after every notebook): ``index_html`` for the page, ``headline_html`` for a notebook's
``headline.csv``, ``cluster_text`` / ``ran_on_text`` for where the sweeps ran, in words.
``pmll_lab.report`` re-exports every name.
"""

from __future__ import annotations

import csv
import html
from pathlib import Path

from pmll_lab.report_notebooks import other_commits_text

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:70em;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.35em .7em;
text-align:left;vertical-align:top}th{background:#f3f3f3}.ok{color:#070;font-weight:bold}
.failed{color:#c00;font-weight:bold}.err{color:#c00;font-size:.9em;max-width:40em}
.note{color:#555;font-size:.9em}code{font-size:.95em}
"""


def _link(path: str | None, label: str) -> str:
    return f"<a href='{html.escape(path)}'>{html.escape(label)}</a>" if path else "none"


HEADLINE_FILE = "headline.csv"
"""A notebook that writes ``<results_dir>/headline.csv`` gets that table on the run's index."""
_STATUS_CLASS = {"met": "ok", "passed": "ok", "missed": "failed", "failed": "failed"}


def verdict_counts(path: Path) -> dict | None:
    """What a headline CSV says in numbers: ``{"met": n, "targets": n}`` for a GPU run's
    headline (the rows with a bound), ``{"passed": n, "kernels": n}`` for the checks headline of
    a CPU run; None when the file is missing or unreadable."""
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    status = [r.get("status", "") for r in rows]
    if {"met", "missed", "not measured"} & set(status):
        judged = [r for r in rows if r.get("bound", "x") not in ("", "nan")
                  and r["status"] in ("met", "missed", "not measured")]
        return {"met": sum(r["status"] == "met" for r in judged), "targets": len(judged)}
    return {"passed": status.count("passed"), "kernels": len(rows)}


def verdict_text(counts: dict | None) -> str:
    """``verdict_counts`` in words for the index."""
    if counts is None:
        return ""
    if "targets" in counts:
        return f"{counts['met']} of {counts['targets']} targets met"
    return (f"checks: {counts['passed']} of {counts['kernels']} kernels passed every check; "
            "no speed verdict on the CPU")


def _figure(v: str) -> str:
    """A CSV cell as shown: a decimal number to 4 significant digits (the CSV keeps them all),
    anything else as written."""
    if not any(c in v for c in ".eE") or v.lower() in ("nan", "inf", "-inf"):
        return v
    try:
        return f"{float(v):.4g}"
    except ValueError:
        return v


def headline_html(path: Path, title: str) -> str:
    """A headline CSV (header row, then one row per target) as an HTML table under ``title``:
    every row and column (no truncation; decimals to 4 significant digits, ``_figure``), headed
    as the notebooks head them (``protocol.COLUMN_LABELS``); a ``status`` column (met / missed,
    passed / failed) is coloured. A file that cannot be read gives a one-line note instead."""
    e = html.escape
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return f"<p class='err'>{e(title)}: cannot read {e(path.name)}: {e(str(exc))}</p>"
    if not rows:
        return f"<p class='note'>{e(title)}: empty headline table.</p>"
    from pmll_lab.experiments.protocol import COLUMN_LABELS

    head, body = rows[0], rows[1:]
    col = head.index("status") if "status" in head else -1
    out = [f"<h2>{e(title)}</h2>", "<table><tr>" + "".join(
        f"<th>{e(COLUMN_LABELS.get(h, h))}</th>" for h in head) + "</tr>"]
    for r in body:
        cells = []
        for i, v in enumerate(r):
            cls = _STATUS_CLASS.get(v) if i == col else None
            cells.append(f"<td class='{cls}'>{e(v)}</td>" if cls else f"<td>{e(_figure(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def ran_on_text(p: dict | None) -> str:
    """A notebook's ``ran_on`` in words for the index."""
    if not p or not p.get("workers"):
        return "no sweep rows"
    kinds = ", ".join(f"{n} × {k}" if len(p["devices"]) > 1 else k
                      for k, n in p.get("devices", {}).items())
    if p.get("in_process"):
        return f"in the notebook's process ({kinds})"
    gpus = f", {p['gpus']} GPU{'s' if p['gpus'] != 1 else ''}" if p.get("gpus") else ""
    return f"{p['workers']} Dask worker{'s' if p['workers'] != 1 else ''}{gpus} ({kinds})"


def cluster_text(cluster: dict | None) -> str:
    """The manifest's ``cluster`` in words for the index."""
    if not cluster:
        return "?"  # a run written before this was recorded
    kind = cluster.get("kind")
    if kind == "LocalCluster":
        n, gpus = cluster.get("workers", 0), cluster.get("gpus", 0)
        what = (f"one per GPU, {gpus} GPU{'s' if gpus != 1 else ''} "
                f"(CUDA devices {', '.join(cluster.get('gpu_ids', []))})" if gpus else "CPU")
        return f"on a Dask LocalCluster of {n} worker{'s' if n != 1 else ''}: {what}"
    if kind == "scheduler":
        return (f"on the Dask cluster at {cluster.get('address')} ({cluster.get('workers', 0)} "
                f"worker(s) at the start, {cluster.get('gpus', 0)} with a GPU resource)")
    return "in each notebook's own process (no Dask cluster)"


def index_html(manifest: dict, run_dir: str | Path | None = None) -> str:
    """The run's ``index.html``: the verdict first (notebooks ok or failed, targets met of total),
    one row per notebook with its links and (with ``run_dir``) its verdict beside its status
    (``verdict_counts``), the headline table of each notebook whose results hold
    ``headline.csv`` (``headline_html``), and the run's provenance table at the end (a one-line
    summary of it under the title)."""
    e = html.escape
    env = manifest.get("environment", {})
    started = manifest.get("started_utc", "")
    head_rows = [
        ("Device", env.get("device", "?")),
        ("Backend", env.get("backend", "?")),
        ("Date (UTC)", started.replace("T", " ").replace("+00:00", "")),
        ("Git commit", env.get("commit", "?")),
        ("torch / triton / python",
         f"{env.get('torch', '?')} / {env.get('triton', '?')} / {env.get('python', '?')}"),
        ("Kernel switches fixed at import", env.get("import_settings", "?")),
        ("Preset", manifest.get("preset", "?")),
        ("Device asked for", manifest.get("device_requested", "?")),
        ("Sweeps ran", cluster_text(manifest.get("cluster"))),
    ]
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
           f"<title>pmll_lab report: {e(manifest.get('run', ''))}</title>",
           f"<style>{_CSS}</style></head><body>",
           f"<h1>pmll_lab report: <code>{e(manifest.get('run', ''))}</code></h1>",
           f"<p class='note'>{e(env.get('device', '?'))}, {e(head_rows[2][1] or '?')} UTC, "
           f"commit {e(env.get('commit', '?'))}, preset {e(manifest.get('preset', '?'))} "
           "(run details at the end)</p>"]
    for note in manifest.get("notes", []):  # provenance notes a person added to a kept run
        out.append(f"<p class='note'>{e(note)}</p>")
    if env.get("backend") == "triton-interpreter":
        out.append("<p class='note'>Kernels ran in the Triton interpreter on the CPU: every time "
                   "in these reports is interpreter wall time, not GPU speed.</p>")
    books = manifest.get("notebooks", [])
    if not manifest.get("complete", True):
        out.append("<p class='failed'>This run is not complete: the notebooks below are those "
                   "finished so far.</p>")
    if not books:
        out.append(f"<p><b>No notebooks found</b> in <code>"
                   f"{e(str(manifest.get('notebooks_dir', 'notebooks')))}</code>: nothing ran.</p>")
    else:
        failed = sum(b["status"] not in ("ok", "results-only") for b in books)
        only = sum(b["status"] == "results-only" for b in books)
        verdicts = {b["name"]: verdict_counts(Path(run_dir) / r) for b in books
                    for r in b.get("results", []) if run_dir is not None
                    and r.split("/")[-1] == HEADLINE_FILE}
        met = [v for v in verdicts.values() if v and "targets" in v]
        total = (f"; targets met: {sum(v['met'] for v in met)} of "
                 f"{sum(v['targets'] for v in met)}" if met else "")
        lost = sum(b.get("failed_points", 0) for b in books)
        out.append(f"<p>{len(books)} notebook(s), "
                   + (f"<span class='failed'>{failed} FAILED</span>" if failed
                      else "<span class='ok'>none failed</span>" if only or lost
                      else "<span class='ok'>all ok</span>")
                   + (f", {only} with results only (no rendered notebook)" if only else "")
                   + (f", <span class='failed'>{lost} sweep point(s) failed</span>" if lost
                      else "")
                   + f"{e(total)}.</p>")
        out.append("<table><tr><th>Notebook</th><th>Status</th><th>Time (s)</th>"
                   "<th>Sweeps ran on</th><th>Report</th><th>Executed notebook</th>"
                   "<th>Results</th></tr>")
        for b in books:
            status = {"ok": "<span class='ok'>ok</span>",
                      # a kept run whose sweep ran without the notebook: data, no rendering
                      "results-only": "<span>results only</span>"}.get(
                          b["status"], "<span class='failed'>FAILED</span>")
            if verdicts.get(b["name"]):
                status += f"<div><b>{e(verdict_text(verdicts[b['name']]))}</b></div>"
            if b.get("failed_points"):
                status += (f"<div class='failed'>{b['failed_points']} of {b.get('points', '?')} "
                           "sweep points failed (see the report's correctness section)</div>")
            if b.get("error"):
                status += f"<div class='err'>{e(b['error'])}</div>"
            if b.get("other_commits"):
                said = other_commits_text(b["other_commits"], b.get("points"),
                                          b.get("commit", "?"))
                status += f"<div class='note'>{e(said)}</div>"
            if b.get("kept_from_earlier"):
                when = (b.get("started_utc") or "?").replace("T", " ").replace("+00:00", " UTC")
                status += (f"<div class='note'>from an earlier call: {e(when)}"
                           f", preset {e(b.get('preset', '?'))}, commit {e(b.get('commit', '?'))}"
                           "</div>")
            results = "<br>".join(_link(r, r.split("/")[-1]) for r in b.get("results", [])) or "none"
            out.append(f"<tr><td><b>{e(b['name'])}</b></td><td>{status}</td>"
                       f"<td>{b.get('seconds', 0):.0f}</td>"
                       f"<td>{e(ran_on_text(b.get('ran_on')) if 'ran_on' in b else '?')}</td>"
                       f"<td>{_link(b.get('html'), 'HTML report')}</td>"
                       f"<td>{_link(b.get('ipynb'), b.get('ipynb') or '')}</td>"
                       f"<td>{results}</td></tr>")
        out.append("</table>")
        if run_dir is not None:
            for b in books:
                for r in b.get("results", []):
                    if r.split("/")[-1] == HEADLINE_FILE and (Path(run_dir) / r).is_file():
                        out.append(headline_html(Path(run_dir) / r, f"Headline: {b['name']}"))
    out.append("<h2>Run details</h2><table>")
    out += [f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in head_rows]
    out.append("</table>")
    out.append(f"<p class='note'>Written by <code>python -m pmll_lab report</code>; "
               f"finished {e(manifest.get('finished_utc') or 'not yet')}. Machine-readable: "
               "<a href='manifest.json'>manifest.json</a>.</p></body></html>")
    return "\n".join(out) + "\n"
