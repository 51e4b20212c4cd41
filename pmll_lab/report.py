"""Report builder: run the notebooks with papermill, render them to HTML, index the run.

One *run* is a folder ``reports/<run>/`` (``latest`` by default; it is git-ignored, while runs worth
keeping, such as ``h200-2026-11-29``, are committed under their own names)::

    reports/<run>/
        index.html            device, date (UTC), commit, versions and preset on top; one row per
                              notebook: status (ok / FAILED), its HTML report, the executed
                              notebook and its results files; then each notebook's headline
                              table (``results/<name>/headline.csv``, written by the notebook)
        manifest.json         the same, machine-readable
        <name>.html           the executed notebook rendered without input cells (nbconvert)
        <name>.ipynb          the executed notebook, outputs included (papermill)
        results/<name>/       the notebook's ``results_dir``: sweep results (.jsonl, .csv)

Each notebook runs in a fresh ``python3`` kernel with three injected parameters (papermill):
``preset``, ``device`` and ``results_dir`` (and ``scheduler``, a Dask scheduler address, when the
sweeps run on a cluster: ``workers=N`` starts a ``LocalCluster`` for the whole report, one worker
per visible GPU (up to N) or N CPU workers, ``pmll_lab.dist.local_cluster``; ``scheduler=ADDRESS``
uses a running one). The index says which, and for each notebook how many workers and GPUs ran
its sweeps. The kernel is this Python (``sys.executable``), whatever
kernelspec named ``python3`` a user may have registered elsewhere, and it imports the ``pmll_lab``
of this checkout; ``PMLL_LAB_DEVICE`` is set to ``device`` in its environment, so the library's
backend (``pmll_lab.backend``) makes the same decision as the notebook's own parameter.
A notebook that fails still gets its partial executed notebook rendered, is marked FAILED in the
index, and the other notebooks still run.

A notebook's results folder is emptied before it runs, so a report never mixes results from two
code versions; ``resume=True`` keeps it, and the sweeps then skip the points already stored
(``pmll_lab.sweep``), which is how a killed long run on a GPU is finished.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import html
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

PRESETS = ("quick", "full")
DEVICES = ("auto", "cpu", "cuda")
KERNEL_NAME = "python3"
SCHEDULER_TIMEOUT_S = 10.0
"""Seconds ``--scheduler ADDRESS`` may take to answer before the report gives up."""
REPO_ROOT = Path(__file__).resolve().parent.parent
"""The folder holding the ``pmll_lab`` package: put on the kernels' ``PYTHONPATH``."""


class ReportError(RuntimeError):
    """A report could not be started (bad notebook name, device not available...)."""


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def discover(notebooks_dir: str | Path = "notebooks") -> list[Path]:
    """The notebooks a report runs: ``<notebooks_dir>/*.ipynb`` sorted by name (checkpoints and
    files starting with ``_`` or ``.`` left out)."""
    folder = Path(notebooks_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith(("_", ".")))


def select(notebooks: Sequence[Path], only: Sequence[str]) -> list[Path]:
    """The notebooks named in ``only`` (by stem, with or without ``.ipynb``), in that order.

    Raises ``ReportError`` naming the unknown names and the ones available."""
    by_name = {p.stem: p for p in notebooks}
    wanted = [Path(n).name.removesuffix(".ipynb") for n in only]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ReportError(f"only: no notebook named {', '.join(unknown)} "
                          f"(available: {', '.join(by_name) or 'none'})")
    return [by_name[n] for n in dict.fromkeys(wanted)]


@contextlib.contextmanager
def _kernel_environment(device: str) -> Iterator[dict[str, str]]:
    """Environment the notebook kernels inherit while the report runs (restored afterwards).

    - ``PMLL_LAB_DEVICE=device`` for ``pmll_lab.backend``; ``TRITON_INTERPRET`` dropped when the
      GPU is asked for (the builder's own import may have set it).
    - ``PMLL_LAB_REPORT=1``: sweeps draw no progress bar (``pmll_lab.sweep``).
    - ``MPLBACKEND`` unset, so that figures are inline outputs of the notebook.
    - ``PYTHONPATH`` starts with this checkout, so the notebooks import this ``pmll_lab``.
    - ``JUPYTER_PATH`` starts with a throwaway folder holding a ``python3`` kernelspec that runs
      ``sys.executable``: a ``python3`` kernelspec registered for another environment (user-level
      specs win over the virtualenv's own) must not run the notebooks.
    """
    saved = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="pmll_lab-kernels-") as tmp:
        spec_dir = Path(tmp, "kernels", KERNEL_NAME)
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     "--IPKernelApp.log_level=ERROR"],
            "display_name": "Python 3 (pmll_lab)",
            "language": "python",
            "metadata": {"debugger": False},
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
        os.environ["PMLL_LAB_DEVICE"] = device
        os.environ["PMLL_LAB_REPORT"] = "1"  # sweeps print a summary line instead of a bar
        # ipykernel makes figures inline outputs only when MPLBACKEND is unset (CI often sets
        # Agg): with it set, plt.show() would leave every plot out of the report.
        os.environ.pop("MPLBACKEND", None)
        if device == "cuda":
            os.environ.pop("TRITON_INTERPRET", None)
        for var, first in (("PYTHONPATH", str(REPO_ROOT)), ("JUPYTER_PATH", tmp)):
            rest = os.environ.get(var)
            os.environ[var] = first + (os.pathsep + rest if rest else "")
        # The debugger's warning about frozen modules would land in every kernel's log.
        os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        try:
            yield dict(os.environ)
        finally:
            os.environ.clear()
            os.environ.update(saved)


def probe_environment(env: dict[str, str]) -> dict[str, str]:
    """Device name, backend, versions and commit as a notebook kernel started with ``env`` sees
    them (``pmll_lab.backend.environment()`` run in a child Python). Raises ``ReportError`` if
    that fails, e.g. ``device="cuda"`` on a machine without CUDA."""
    code = "import json, pmll_lab.backend as b; print(json.dumps(b.environment()))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ReportError(f"device {env.get('PMLL_LAB_DEVICE')!r}: the kernel environment "
                          f"cannot start pmll_lab: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _short_error(exc: BaseException) -> str:
    """One readable line for a failed notebook (papermill errors carry ename/evalue)."""
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= 500 else text[:497] + "..."


def _ensure_nbconvert_templates() -> None:
    """Make nbconvert find its own templates wherever the package was installed.

    nbconvert looks for them under ``<prefix>/share/jupyter`` and ``JUPYTER_PATH``; when it was
    installed with ``pip --target DIR`` (the H200 wheel flow) they sit in ``DIR/share/jupyter``,
    which it misses unless ``JUPYTER_PATH`` names it (seen on the H200, 2026-11-29: "No template
    sub-directory with name 'lab' found"). Walk up from the package, and add the folder found to
    ``JUPYTER_PATH`` for this process when it is not already searched.
    """
    import nbconvert
    from jupyter_core.paths import jupyter_path

    for parent in Path(nbconvert.__file__).resolve().parents:
        share = parent / "share" / "jupyter"
        if (share / "nbconvert" / "templates").is_dir():
            searched = {str(Path(p).resolve()) for p in jupyter_path()}
            if str(share.resolve()) not in searched:
                rest = os.environ.get("JUPYTER_PATH")
                os.environ["JUPYTER_PATH"] = str(share) + (os.pathsep + rest if rest else "")
            return


def render_html(executed: Path, target: Path, *, failure: str | None = None) -> None:
    """Render an executed notebook to HTML without input cells (nbconvert ``HTMLExporter``,
    ``exclude_input=True``). A failed notebook gets a banner cell on top naming the error."""
    import nbformat
    from nbconvert import HTMLExporter

    _ensure_nbconvert_templates()
    nb = nbformat.read(executed, as_version=4)
    if failure is not None:
        banner = nbformat.v4.new_markdown_cell(
            "<div style='border:2px solid #c00;padding:0.6em;color:#c00'>"
            f"<b>FAILED</b> while running this notebook: {html.escape(failure)}. "
            "The outputs below stop where it failed.</div>")
        nb.cells.insert(0, banner)
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": executed.stem}})
    target.write_text(body, encoding="utf-8")


def _run_one(src: Path, run_dir: Path, *, preset: str, device: str, resume: bool,
             cell_timeout: float | None, env_info: dict, log: Callable[[str], None],
             scheduler: str | None = None) -> dict:
    import papermill

    name = src.stem
    out_nb, out_html = run_dir / f"{name}.ipynb", run_dir / f"{name}.html"
    results = run_dir / "results" / name
    for stale in (out_nb, out_html):
        stale.unlink(missing_ok=True)
    if results.exists() and not resume:
        shutil.rmtree(results)
    results.mkdir(parents=True, exist_ok=True)
    entry = {"name": name, "source": str(src), "status": "ok", "error": "",
             "started_utc": _utc_now(), "preset": preset, "device_requested": device,
             "device": env_info.get("device", ""), "commit": env_info.get("commit", "")}
    t0 = time.perf_counter()
    parameters = {"preset": preset, "device": device, "results_dir": str(results.resolve())}
    if scheduler:
        parameters["scheduler"] = scheduler
    try:
        papermill.execute_notebook(
            str(src), str(out_nb),
            parameters=parameters,
            kernel_name=KERNEL_NAME, language="python", cwd=str(src.parent.resolve()),
            progress_bar=False, log_output=False, execution_timeout=cell_timeout,
        )
    except Exception as exc:  # noqa: BLE001 - a failed notebook must not stop the others
        entry["status"], entry["error"] = "failed", _short_error(exc)
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    if out_nb.exists():
        try:
            render_html(out_nb, out_html,
                        failure=entry["error"] if entry["status"] == "failed" else None)
        except Exception as exc:  # noqa: BLE001
            entry["status"] = "failed"
            entry["error"] = (entry["error"] + "; " if entry["error"] else "") + \
                f"rendering HTML: {_short_error(exc)}"
    entry["ipynb"] = out_nb.name if out_nb.exists() else None
    entry["html"] = out_html.name if out_html.exists() else None
    entry["results"] = sorted(p.relative_to(run_dir).as_posix()
                              for p in results.rglob("*") if p.is_file())
    entry["ran_on"] = results_placement(results)
    log(f"  {name}: {'ok' if entry['status'] == 'ok' else 'FAILED'} in {entry['seconds']:.0f} s"
        + (f" -- {entry['error']}" if entry["error"] else ""))
    return entry


def results_placement(results: Path) -> dict:
    """Who ran the sweeps whose rows lie in ``results`` (``*.jsonl``): ``workers`` and
    ``gpus`` (distinct, over all its sweeps), ``devices`` (points per device kind) and
    ``in_process`` (True when no row came from a Dask worker); ``pmll_lab.sweep.placement``."""
    import pandas as pd

    from pmll_lab.sweep import IN_PROCESS, load, placement

    frames = []
    for path in sorted(Path(results).glob("*.jsonl")):
        try:
            df = load(path)
        except (OSError, ValueError):
            continue
        if not df.empty and "point_id" in df:
            frames.append(df.assign(point_id=path.stem + ":" + df["point_id"].astype(str)))
    if not frames:
        return {"workers": 0, "gpus": 0, "devices": {}, "in_process": True}
    df = pd.concat(frames, ignore_index=True)
    out = placement(df)
    out["in_process"] = "worker" not in df or set(df["worker"].fillna(IN_PROCESS)) == {IN_PROCESS}
    return out


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


@contextlib.contextmanager
def _cluster(workers: int | None, scheduler: str | None, device: str,
             log: Callable[[str], None]) -> Iterator[tuple[str | None, dict]]:
    """The scheduler address the notebooks' sweeps use (None: in-process) and its description
    for the manifest. ``workers``: start a ``LocalCluster`` here (closed on exit): one worker per
    visible GPU, the first ``workers`` of them, unless ``device="cpu"`` or there is no GPU,
    then ``workers`` CPU workers. ``scheduler``: check that it answers and count its workers.
    Raises ``ReportError`` naming the argument."""
    if workers is None and not scheduler:
        yield None, {"kind": "in-process"}
        return
    try:
        import distributed
    except ImportError as exc:
        raise ReportError("workers/scheduler: Dask distributed is not installed "
                          "(pip install -e '.[dist]')") from exc
    from pmll_lab import dist

    if scheduler:
        try:
            with distributed.Client(scheduler, timeout=f"{SCHEDULER_TIMEOUT_S}s",
                                    set_as_default=False) as client:
                info = dist._workers(client)
        except (OSError, TimeoutError) as exc:
            raise ReportError(f"scheduler: no Dask scheduler answers at {scheduler!r}: "
                              f"{exc}") from exc
        gpus = dist.slots(info, gpu=True)
        log(f"Dask scheduler {scheduler}: {len(info)} worker(s) now, {gpus} with a GPU resource")
        yield scheduler, {"kind": "scheduler", "address": scheduler, "workers": len(info),
                          "gpus": gpus}
        return
    gpu_ids = [] if device == "cpu" else dist.visible_gpus()
    try:
        dist.cluster_spec(workers, gpu_ids)  # checks workers before anything starts
    except ValueError as exc:
        raise ReportError(str(exc)) from exc
    try:
        import bokeh  # noqa: F401  (the dashboard's pages need it)
        dashboard = ":8787"
    except ImportError:
        dashboard = None
    cluster = dist.local_cluster(workers, gpu_ids, dashboard_address=dashboard)
    try:
        n = len(cluster.worker_spec)  # all started: local_cluster waits for them
        desc = {"kind": "LocalCluster", "address": cluster.scheduler_address, "workers": n,
                "gpus": n if gpu_ids else 0, "gpu_ids": gpu_ids[:n],
                "dashboard": cluster.dashboard_link if dashboard else None}
        log(f"LocalCluster {cluster.scheduler_address}: {n} worker(s), "
            + (f"one per GPU ({', '.join(gpu_ids[:n])})" if gpu_ids else "CPU"))
        # the workers import and make their CUDA context while the first notebook starts
        with distributed.Client(cluster, set_as_default=False) as client:
            dist.warm_up(client, gpu=bool(gpu_ids))
            yield cluster.scheduler_address, desc
    finally:
        cluster.close()


def build_report(
    notebooks: Sequence[str | Path] | None = None,
    *,
    preset: str = "quick",
    device: str = "auto",
    run: str = "latest",
    reports_dir: str | Path = "reports",
    notebooks_dir: str | Path = "notebooks",
    only: Sequence[str] | None = None,
    resume: bool = False,
    cell_timeout: float | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Run notebooks into ``<reports_dir>/<run>/`` and write ``index.html`` and ``manifest.json``.

    ``notebooks``: paths to run; default every notebook of ``notebooks_dir`` (``discover``).
    ``only``: names (stems) to keep from those. ``preset`` in ``PRESETS``, ``device`` in
    ``DEVICES``. ``cell_timeout``: seconds per cell, finite and > 0 (None: no limit; papermill
    would read 0 or a negative number as no limit too, so they are refused). ``workers``: run the
    sweeps on a ``LocalCluster`` started for this report (one worker per visible GPU, up to
    ``workers``, or ``workers`` CPU workers when ``device="cpu"`` or without GPUs);
    ``scheduler``: on the Dask cluster at that address (both None: in the notebooks' own
    process). Each notebook gets ``scheduler`` as a parameter.

    Returns the manifest (``manifest["ok"]`` is False when a notebook of this call failed).
    When some notebooks are chosen (``notebooks`` or ``only``), the entries of the run's earlier
    manifest for the other notebooks are kept in the index, each with its own date and preset.
    Raises ``ReportError`` for an unknown preset, device, run name or notebook name, a
    ``notebooks_dir`` that is not a folder (when ``notebooks`` is not given), a bad
    ``workers`` (not a positive int, more than the GPUs visible) or ``cell_timeout``,
    ``workers`` and ``scheduler`` both given, a scheduler that does not answer, or when the
    kernel environment cannot import ``pmll_lab`` with that device (checked before any notebook
    runs, and before the run folder is created: a run that cannot start leaves nothing behind).
    """
    if preset not in PRESETS:
        raise ReportError(f"preset: must be one of {PRESETS}, not {preset!r}")
    if device not in DEVICES:
        raise ReportError(f"device: must be one of {DEVICES}, not {device!r}")
    if not run or Path(run).name != run or run.startswith("."):
        raise ReportError(f"run: must be a plain folder name, not {run!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ReportError(f"workers: must be a positive int, not {workers!r}")
    if workers is not None and scheduler:
        raise ReportError("workers/scheduler: give one of them (workers starts a local cluster, "
                          "scheduler uses a running one)")
    if cell_timeout is not None and (
            isinstance(cell_timeout, bool) or not isinstance(cell_timeout, (int, float))
            or not (math.isfinite(cell_timeout) and cell_timeout > 0)):
        raise ReportError(f"cell_timeout: must be > 0 seconds (None: no limit), not "
                          f"{cell_timeout!r}")
    chosen = notebooks is not None or bool(only)
    if notebooks is None and not Path(notebooks_dir).is_dir():
        raise ReportError(f"notebooks_dir: no such folder: {notebooks_dir}")
    paths = [Path(p) for p in notebooks] if notebooks is not None else discover(notebooks_dir)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ReportError(f"notebooks: not found: {', '.join(missing)}")
    if only:
        paths = select(paths, only)

    run_dir = Path(reports_dir) / run
    previous = []
    manifest_path = run_dir / "manifest.json"
    if chosen and manifest_path.exists():
        try:
            previous = json.loads(manifest_path.read_text()).get("notebooks", [])
        except (json.JSONDecodeError, AttributeError):
            previous = []

    # papermill logs a warning for each line of a multi-line parameters cell it cannot parse
    # for its type hints (the grids); the parameters are injected all the same.
    logging.getLogger("papermill.translators").setLevel(logging.ERROR)
    manifest = {"run": run, "preset": preset, "device_requested": device,
                "started_utc": _utc_now(), "notebooks_dir": str(notebooks_dir),
                "environment": {}, "notebooks": []}
    with _kernel_environment(device) as env, _cluster(workers, scheduler, device, log) as (
            address, cluster_desc):
        manifest["cluster"] = cluster_desc
        manifest["environment"] = env_info = probe_environment(env)
        run_dir.mkdir(parents=True, exist_ok=True)      # only once the run can start
        if not paths:
            log(f"no notebooks found in {notebooks_dir}: nothing to run "
                f"(writing an empty index)")
        else:
            log(f"report '{run}': {len(paths)} notebook(s), preset {preset}, "
                f"device {env_info['device']}, commit {env_info['commit']}")
        ran: list[dict] = []
        _write_index(run_dir, manifest, ran, previous, complete=not paths)
        for i, src in enumerate(paths, 1):
            log(f"[{i}/{len(paths)}] {src.stem} ...")
            ran.append(_run_one(src, run_dir, preset=preset, device=device, resume=resume,
                                cell_timeout=cell_timeout, env_info=env_info, log=log,
                                scheduler=address))
            # Written after every notebook: a long run cut short still has its index.
            _write_index(run_dir, manifest, ran, previous, complete=i == len(paths))
    return manifest


def _write_index(run_dir: Path, manifest: dict, ran: list[dict], previous: list[dict], *,
                 complete: bool) -> None:
    """Fill ``manifest`` with the notebooks run so far (plus the earlier entries kept) and write
    ``manifest.json`` and ``index.html``."""
    names = {e["name"] for e in ran}
    kept = [dict(e, kept_from_earlier=True) for e in previous
            if e.get("name") not in names and e.get("html") and (run_dir / e["html"]).exists()]
    manifest["notebooks"] = sorted(ran + kept, key=lambda e: e["name"])
    manifest["finished_utc"] = _utc_now() if complete else None
    manifest["complete"] = complete
    manifest["ok"] = all(e["status"] == "ok" for e in ran)
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (run_dir / "index.html").write_text(index_html(manifest, run_dir=run_dir), encoding="utf-8")


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
_STATUS_CLASS = {"met": "ok", "missed": "failed"}


def headline_html(path: Path, title: str) -> str:
    """A headline CSV (header row, then one row per target) as an HTML table under ``title``:
    every row and column as written (no truncation); a ``status`` column of met / missed is
    coloured. A file that cannot be read gives a one-line note instead."""
    e = html.escape
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return f"<p class='err'>{e(title)}: cannot read {e(path.name)}: {e(str(exc))}</p>"
    if not rows:
        return f"<p class='note'>{e(title)}: empty headline table.</p>"
    head, body = rows[0], rows[1:]
    col = head.index("status") if "status" in head else -1
    out = [f"<h2>{e(title)}</h2>", "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head)
           + "</tr>"]
    for r in body:
        cells = []
        for i, v in enumerate(r):
            cls = _STATUS_CLASS.get(v) if i == col else None
            cells.append(f"<td class='{cls}'>{e(v)}</td>" if cls else f"<td>{e(v)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


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
    """The run's ``index.html``: provenance on top, one row per notebook with its links, then
    (with ``run_dir``) the headline table of each notebook whose results hold
    ``headline.csv`` (``headline_html``)."""
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
        ("Preset", manifest.get("preset", "?")),
        ("Device asked for", manifest.get("device_requested", "?")),
        ("Sweeps ran", cluster_text(manifest.get("cluster"))),
    ]
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
           f"<title>pmll_lab report: {e(manifest.get('run', ''))}</title>",
           f"<style>{_CSS}</style></head><body>",
           f"<h1>pmll_lab report: <code>{e(manifest.get('run', ''))}</code></h1>",
           "<table>"]
    out += [f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in head_rows]
    out.append("</table>")
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
        out.append(f"<p>{len(books)} notebook(s), "
                   + (f"<span class='failed'>{failed} FAILED</span>" if failed
                      else "<span class='ok'>none failed</span>" if only
                      else "<span class='ok'>all ok</span>")
                   + (f", {only} with results only (no rendered notebook)" if only else "")
                   + ".</p>")
        out.append("<table><tr><th>Notebook</th><th>Status</th><th>Time (s)</th>"
                   "<th>Sweeps ran on</th><th>Report</th><th>Executed notebook</th>"
                   "<th>Results</th></tr>")
        for b in books:
            status = {"ok": "<span class='ok'>ok</span>",
                      # a kept run whose sweep ran without the notebook: data, no rendering
                      "results-only": "<span>results only</span>"}.get(
                          b["status"], "<span class='failed'>FAILED</span>")
            if b.get("error"):
                status += f"<div class='err'>{e(b['error'])}</div>"
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
    out.append(f"<p class='note'>Written by <code>python -m pmll_lab report</code>; "
               f"finished {e(manifest.get('finished_utc') or 'not yet')}. Machine-readable: "
               "<a href='manifest.json'>manifest.json</a>.</p></body></html>")
    return "\n".join(out) + "\n"
