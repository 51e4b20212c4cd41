"""The run's ``index.html``: the verdict, one row per notebook, the headline tables, provenance.

Pure rendering of a report's manifest (``pmll_lab.report`` writes it beside ``manifest.json``
before the first notebook and after every one): ``index_html`` for the page, ``headline_html``
for a notebook's ``headline.csv``, ``progress_html`` for a run still going or stopped,
``cluster_text`` / ``ran_on_text`` for where the sweeps ran, in words. The page fits a
1280-pixel window: a headline shows the columns that say something (none empty in every row,
one that holds the same value in every row as a line under the table, the selectors of each
side as the target's tooltip). ``pmll_lab.report`` re-exports every name.
"""

from __future__ import annotations

import csv
import html
from pathlib import Path

from pmll_lab.report_notebooks import other_commits_text

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:72em;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0 1em}td,th{border:1px solid #ccc;
padding:.3em .6em;text-align:left;vertical-align:top}th{background:#f3f3f3}
td.num{text-align:right;white-space:nowrap}td.target{min-width:18em;max-width:34em}
.ok{color:#070;font-weight:bold}.failed{color:#c00;font-weight:bold}
.quiet{color:#666}.err{color:#c00;font-size:.9em;max-width:40em}
.note{color:#555;font-size:.9em}.caption{color:#555;font-size:.9em;margin:-.6em 0 1em}
.running{color:#a60;font-weight:bold}code{font-size:.95em}
details summary{cursor:pointer;color:#555}
"""


def _link(path: str | None, label: str) -> str:
    return f"<a href='{html.escape(path)}'>{html.escape(label)}</a>" if path else "none"


HEADLINE_FILE = "headline.csv"
"""A notebook that writes ``<results_dir>/headline.csv`` gets that table on the run's index."""
_STATUS_CLASS = {"met": "ok", "passed": "ok", "missed": "failed", "failed": "failed",
                 "reported": "quiet", "not measured": "quiet"}
_JUDGED = ("met", "missed", "not measured")
CAPTION_COLUMNS = ("layout", "timer")
"""Headline columns shown once under the table when every row holds the same value."""
_SIDES = ("ours", "peer")
"""Headline columns that name each side's rows (a kernel or filters): the target's tooltip."""
_INDEX_HEADERS = {"ratio": "ours / peer", "layout": "state layout"}
"""Index-only headers (a headline's ratio is always ours over the peer)."""


def _utc(stamp: str | None) -> str:
    return (stamp or "?").replace("T", " ").replace("+00:00", " UTC")


def _empty(v: str | None) -> bool:
    return v is None or v.strip().lower() in ("", "nan")


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
    if set(_JUDGED) & set(status):
        judged = [r for r in rows if not _empty(r.get("bound", "x")) and r["status"] in _JUDGED]
        return {"met": sum(r["status"] == "met" for r in judged), "targets": len(judged)}
    return {"passed": status.count("passed"), "kernels": len(rows)}


def verdict_text(counts: dict | None) -> str:
    """``verdict_counts`` in words for the index."""
    if counts is None:
        return ""
    if "targets" in counts:
        return f"{counts['met']} of {counts['targets']} targets met"
    return f"checks: {counts['passed']} of {counts['kernels']} kernels passed every check"


def _verdict_class(counts: dict | None) -> str:
    """``ok`` when every target was met (every kernel passed), else ``failed``."""
    if not counts:
        return "quiet"
    done, total = (counts["met"], counts["targets"]) if "targets" in counts else \
        (counts["passed"], counts["kernels"])
    return "ok" if done == total else "failed"


def _figure(v: str) -> str:
    """A CSV cell as shown: a decimal number to 4 significant digits (the CSV keeps them all),
    anything else as written."""
    if not any(c in v for c in ".eE") or v.lower() in ("nan", "inf", "-inf"):
        return v
    try:
        return f"{float(v):.4g}"
    except ValueError:
        return v


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return v.strip().lower() not in ("nan", "inf", "-inf")


def _said(col: str, value: str) -> str:
    """A caption column's value in words (``vk``: V-major; ``cuda_graph``: its timer label)."""
    from pmll_lab.experiments.protocol import LAYOUT_NAMES, TIMER_LABELS

    return {"layout": LAYOUT_NAMES, "timer": TIMER_LABELS}.get(col, {}).get(value, value)


def headline_html(path: Path, title: str) -> str:
    """A headline CSV (header row, then one row per target) as an HTML table under ``title``:
    every row, the status coloured (met / passed green, missed / failed red, reported grey);
    columns empty in every row left out; ``CAPTION_COLUMNS`` holding one value in every row
    given once under the table; the sides' selectors (``ours``, ``peer``) as the target's
    tooltip; ``cells`` and ``met_cells`` as one "cells met" column for the judged rows, left out
    when every target is one cell; consecutive rows of one target share its cell. Headers as the
    notebooks head them (``protocol.header``), decimals to 4 significant digits (``_figure``).
    A file that cannot be read gives a one-line note instead."""
    from pmll_lab.experiments.protocol import header

    e = html.escape
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            rows, head = list(reader), list(reader.fieldnames or [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return f"<p class='err'>{e(title)}: cannot read {e(path.name)}: {e(str(exc))}</p>"
    if not head:
        return f"<p class='note'>{e(title)}: empty headline table.</p>"
    from pmll_lab.experiments.targets import SHOWN_FIRST

    cols = [c for c in head if any(not _empty(r.get(c)) for r in rows)]
    cols = [c for c in SHOWN_FIRST if c in cols] + [c for c in cols if c not in SHOWN_FIRST]
    caption = []
    for c in CAPTION_COLUMNS:
        values = {r.get(c, "") for r in rows}
        if c in cols and len(values) == 1:
            cols.remove(c)
            caption.append(f"{e(_INDEX_HEADERS.get(c, header(c)))}: "
                           f"{e(_said(c, values.pop()))}")
    sides = [c for c in _SIDES if c in cols]
    cols = [c for c in cols if c not in sides]
    judged = [r for r in rows if r.get("status") in ("met", "missed")]
    if {"cells", "met_cells"} <= set(head):
        several = any(r.get("cells", "").strip() not in ("", "1", "1.0") for r in judged)
        cols = [c for c in cols if c not in ("cells", "met_cells")]
        if several:
            cols.insert(cols.index("bound") + 1 if "bound" in cols else len(cols), "cells met")
    out = [f"<h2>{e(title)}</h2>", "<table class='headline'><tr>" + "".join(
        f"<th>{e(_INDEX_HEADERS.get(c, header(c)))}</th>" for c in cols) + "</tr>"]
    for i, r in enumerate(rows):
        cells = []
        for c in cols:
            v = r.get(c) or ""
            if c == "target":
                if i and rows[i - 1].get("target") == v:
                    continue
                span = 1
                while i + span < len(rows) and rows[i + span].get("target") == v:
                    span += 1
                tip = "; ".join(f"{s}: {r[s]}" for s in sides if not _empty(r.get(s)))
                cells.append(f"<td class='target' rowspan='{span}'"
                             + (f" title='{e(tip)}'" if tip else "") + f">{e(v)}</td>")
            elif c == "cells met":
                n = (r.get("cells") or "").removesuffix(".0")
                m = (r.get("met_cells") or "").removesuffix(".0")
                cells.append(f"<td class='num'>{e(f'{m} of {n}') if r in judged else ''}</td>")
            elif c == "status":
                cls = _STATUS_CLASS.get(v)
                cells.append(f"<td class='{cls}'>{e(v)}</td>" if cls else f"<td>{e(v)}</td>")
            elif _is_number(v):
                cells.append(f"<td class='num'>{e(_figure(v))}</td>")
            else:
                cells.append(f"<td>{e(_said(c, v) if c in CAPTION_COLUMNS else v)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    notes = caption + (["hover over a target for the rows each side stands for"] if sides else [])
    if notes:
        out.append(f"<p class='caption'>{'; '.join(notes)}.</p>")
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


def progress_html(manifest: dict) -> str:
    """The state of a run that has not finished: the notebook running now (and since when) and
    those still to run, or the notebook an interrupt stopped and those it left unrun. The page
    of a run killed without warning still says which notebook was running when it was last
    written. ``""`` for a finished run."""
    e = html.escape
    if manifest.get("complete", True):
        return ""
    left = manifest.get("to_run") or []
    rest = f" Still to run: {e(', '.join(left))}." if left else ""
    stopped = manifest.get("interrupted")
    if stopped:
        return (f"<p class='failed'>This run was stopped: an interrupt ended notebook "
                f"<b>{e(stopped.get('name', '?'))}</b> after {stopped.get('seconds', 0):.0f} s "
                f"({e(_utc(stopped.get('at_utc')))}); its partial report is linked below."
                + (f" Not run: {e(', '.join(left))}." if left else "") + "</p>")
    running = manifest.get("running")
    if running:
        return (f"<p class='running'>This run is in progress: notebook "
                f"<b>{e(running['name'])}</b> ({running.get('number', '?')} of "
                f"{running.get('of', '?')}) is running since "
                f"{e(_utc(running.get('started_utc')))}.{rest}</p>"
                f"<p class='note'>Page written {e(_utc(manifest.get('updated_utc')))}; if no "
                f"report is running now, the run was stopped while {e(running['name'])} ran.</p>")
    return ("<p class='failed'>This run is not complete: the notebooks below are those "
            f"finished so far.{rest}</p>")


def _status_cell(b: dict, counts: dict | None, to_run: set) -> str:
    """A notebook's status: how its run ended (ran to the end: no colour, so the verdict under
    it is what the eye meets), its verdict coloured by whether every target was met, failed
    points, its error, points kept from another commit, and for an entry kept from an earlier
    call when and how that call ran."""
    e = html.escape
    text = {"ok": "<span>ran to the end</span>",
            # a kept run whose sweep ran without the notebook: data, no rendering
            "results-only": "<span>results only</span>",
            "interrupted": "<span class='failed'>STOPPED by an interrupt</span>"}.get(
                b["status"], "<span class='failed'>FAILED</span>")
    if counts:
        text += f"<div class='{_verdict_class(counts)}'>{e(verdict_text(counts))}</div>"
    if b.get("failed_points"):
        text += (f"<div class='failed'>{b['failed_points']} of {b.get('points', '?')} "
                 "sweep points had a failed check or kernel (see the report's correctness "
                 "section)</div>")
    if b.get("error"):
        text += f"<div class='err'>{e(b['error'])}</div>"
    if b.get("params"):
        given = ", ".join(f"{k} = {v!r}" for k, v in b["params"].items())
        text += f"<div class='note'>parameters given: {e(given)}</div>"
    if b.get("other_commits"):
        said = other_commits_text(b["other_commits"], b.get("points"), b.get("commit", "?"))
        text += f"<div class='note'>{e(said)}</div>"
    if b.get("kept_from_earlier"):
        again = "; this call runs it again" if b["name"] in to_run else ""
        text += (f"<div class='note'>from an earlier call: {e(_utc(b.get('started_utc')))}, "
                 f"preset {e(b.get('preset', '?'))}, commit {e(b.get('commit', '?'))}{again}"
                 "</div>")
    return text


def _files_cell(b: dict) -> str:
    """The notebook's report and executed notebook, and its results files folded."""
    links = [_link(b["html"], "report") if b.get("html") else "",
             _link(b["ipynb"], "notebook (.ipynb)") if b.get("ipynb") else ""]
    out = " · ".join(x for x in links if x) or "no report"
    results = b.get("results", [])
    if results:
        out += (f"<details><summary>results: {len(results)} file"
                f"{'s' if len(results) != 1 else ''}</summary>"
                + "<br>".join(_link(r, r.split("/")[-1]) for r in results) + "</details>")
    return out


def _summary(books: list[dict], verdicts: dict, complete: bool = True) -> str:
    """The line under the title: how the notebooks ended, then the targets met of the total (or
    the kernels that passed every check), coloured by whether all were."""
    failed = sum(b["status"] not in ("ok", "results-only") for b in books)
    only = sum(b["status"] == "results-only" for b in books)
    lost = sum(b.get("failed_points", 0) for b in books)
    parts = [f"{len(books)} notebook(s){'' if complete else ' so far'}: "
             + (f"<span class='failed'>{failed} FAILED or stopped</span>" if failed
                else "every one ran to the end")]
    if only:
        parts.append(f"{only} with results only (no rendered notebook)")
    if lost:
        parts.append(f"<span class='failed'>{lost} sweep point(s) with a failure</span>")
    gpu = [v for v in verdicts.values() if v and "targets" in v]
    cpu = [v for v in verdicts.values() if v and "kernels" in v]
    if gpu:
        n = {"met": sum(v["met"] for v in gpu), "targets": sum(v["targets"] for v in gpu)}
        parts.append(f"<span class='{_verdict_class(n)}'>targets met: {n['met']} of "
                     f"{n['targets']}</span>")
    elif cpu:
        n = {"passed": sum(v["passed"] for v in cpu), "kernels": sum(v["kernels"] for v in cpu)}
        parts.append(f"<span class='{_verdict_class(n)}'>kernels that passed every check: "
                     f"{n['passed']} of {n['kernels']}</span>")
    return "<p>" + "; ".join(parts) + ".</p>"


def index_html(manifest: dict, run_dir: str | Path | None = None) -> str:
    """The run's ``index.html``: the run's state while it is not finished (``progress_html``),
    the verdict line (notebooks that ran or failed, targets met of total), one row per notebook
    with its verdict beside its status (with ``run_dir``: ``verdict_counts`` of its
    ``headline.csv``) and its files, a row per notebook running or still to run, each
    notebook's headline table (``headline_html``), and the run's provenance table at the end (a
    one-line summary of it under the title)."""
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
           "<meta name='viewport' content='width=device-width, initial-scale=1'>",
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
                   "in these reports is interpreter wall time, not GPU speed, and no speed "
                   "target is judged (no speed verdict on the CPU): the verdicts are the "
                   "checks.</p>")
    out.append(progress_html(manifest))
    books = manifest.get("notebooks", [])
    running = manifest.get("running") or {}
    to_run = list(manifest.get("to_run") or [])
    if not books and not running and not to_run:
        out.append(f"<p><b>No notebooks found</b> in <code>"
                   f"{e(str(manifest.get('notebooks_dir', 'notebooks')))}</code>: nothing ran.</p>")
    else:
        verdicts = {b["name"]: verdict_counts(Path(run_dir) / r) for b in books
                    for r in b.get("results", []) if run_dir is not None
                    and r.split("/")[-1] == HEADLINE_FILE}
        if books:
            out.append(_summary(books, verdicts, manifest.get("complete", True)))
        out.append("<table><tr><th>Notebook</th><th>Status</th><th>Time (s)</th>"
                   "<th>Sweeps ran on</th><th>Files</th></tr>")
        again = set(to_run) | {running.get("name")}
        rows = [(b["name"], f"<td>{_status_cell(b, verdicts.get(b['name']), again)}</td>"
                 f"<td class='num'>{b.get('seconds', 0):.0f}</td>"
                 f"<td>{e(ran_on_text(b.get('ran_on')) if 'ran_on' in b else '?')}</td>"
                 f"<td>{_files_cell(b)}</td>") for b in books]
        shown = {b["name"] for b in books}
        if running and running.get("name") not in shown:
            rows.append((running["name"], "<td class='running'>running since "
                         f"{e(_utc(running.get('started_utc')))}</td><td></td><td></td><td></td>"))
        rows += [(n, "<td class='quiet'>to run</td><td></td><td></td><td></td>")
                 for n in to_run if n not in shown]
        order = {n: i for i, n in enumerate(manifest.get("plan") or [])}
        rows.sort(key=lambda r: (order.get(r[0], len(order)), r[0]))
        out += [f"<tr><td><b>{e(n)}</b></td>{cells}</tr>" for n, cells in rows]
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
    return "\n".join(x for x in out if x) + "\n"
