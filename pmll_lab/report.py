"""Report builder: run the notebooks with papermill, render them to HTML, index the run.

One *run* is a folder ``reports/<run>/`` (``latest`` by default; it is git-ignored, while runs worth
keeping, such as ``h200-2026-11-29``, are committed under their own names)::

    reports/<run>/
        index.html            device, date (UTC), commit, versions and preset on top; while the
                              run goes, the notebook running and those still to run (after an
                              interrupt: the notebook stopped); one row per notebook: how it
                              ended (ran to the end / FAILED / STOPPED) with its verdict
                              (targets met of total; on the CPU the checks), its HTML report,
                              the executed notebook and its results files; then each notebook's
                              headline table (``results/<name>/headline.csv``, written by the
                              notebook)
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
index, and the other notebooks still run. Ctrl-C or SIGTERM stops the run: the notebook stopped
gets its partial report (STOPPED), and the index names it and those not run. An earlier call's
report of a notebook this call has not run yet stays linked, marked with its own date and
commit (``--only``: every other notebook's); one of a notebook the run no longer has is removed.

A notebook's results folder is emptied before it runs, so a report never mixes results from two
code versions; ``resume=True`` keeps it, and the sweeps then skip the points already stored
(``pmll_lab.sweep``), which is how a killed long run on a GPU is finished. Points stored at
another commit are run again, unless ``keep_other_commits=True`` (``--keep-other-commits``):
then they are reused, and the notebook's page and its index entry say how many, and at which
commit (``other_commits``).

Here: the checks, the order of the run and the Dask cluster of its sweeps (``build_report``);
one notebook's run in ``pmll_lab.report_notebooks``, the index page in ``pmll_lab.report_index``
(every name of theirs is reachable from this module too).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from pmll_lab import PRESETS
from pmll_lab import report_guard as guard
from pmll_lab.results import replace_text
from pmll_lab.report_index import index_html
from pmll_lab.report_notebooks import (  # noqa: F401  (REPO_ROOT: public here too)
    REPO_ROOT, ReportError, kernel_environment, probe_environment, run_notebook, utc_now)

RUN_FILES = ("index", "manifest")
"""Stems of the run folder's own files (``index.html``, ``manifest.json``): no notebook may
take them (``index.html`` would overwrite its report and link to itself)."""
NAME_CHARS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
"""A notebook's name (file stem): it names ``<name>.html`` and ``results/<name>/``, and the
index links to them, so only characters a link takes as they are (no ``#``, ``?``, ``%``,
spaces)."""
INJECTED = ("preset", "device", "results_dir")
"""The parameters the report gives every notebook (papermill)."""
DEVICES = ("auto", "cpu", "cuda")
SCHEDULER_TIMEOUT_S = 10.0
"""Seconds ``--scheduler ADDRESS`` may take to answer before the report gives up."""


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


def check_notebooks(paths: Sequence[Path], params: Mapping | None = None) -> None:
    """``ReportError`` naming the notebook, before anything runs, when a notebook cannot make
    a report page: a name that clashes with the run's own files (``RUN_FILES``, any case: a
    case-insensitive disk would mix them) or has characters a link does not take as they are
    (``NAME_CHARS``); a notebook without a code cell tagged ``parameters`` assigning the
    parameters every notebook is given (``INJECTED``), whose results would land beside the
    notebook rather than in the run, unlisted (``scheduler`` is injected too when the sweeps
    run on a cluster; a notebook that ignores it runs them in its own process). A file that
    is not a notebook is left to its run, which fails it while the others run. ``params``
    (names a call gives the notebooks beside the injected ones) must each be assigned in every
    notebook's parameters cell, and none may be one the report injects."""
    import nbformat

    want = INJECTED
    taken = sorted(set(params or ()) & {*INJECTED, "scheduler"})
    if taken:
        raise ReportError(f"params: {', '.join(taken)} set by the report itself (--preset, "
                          f"--device, --run; use those)")
    for path in paths:
        name = path.stem
        if name.casefold() in RUN_FILES:
            raise ReportError(f"notebooks: {path.name} is named like one of the run's own "
                              f"files (index.html, manifest.json: {', '.join(RUN_FILES)} are "
                              f"taken, in any case); rename the notebook")
        if not NAME_CHARS.fullmatch(name):
            raise ReportError(f"notebooks: {path.name!r}: a notebook's name may hold letters, "
                              f"digits, '_', '.' and '-' only (it names {name}.html and "
                              f"results/{name}/, which the index links to); rename it")
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - not a notebook: its run fails, the others run
            continue
        from papermill.translators import PythonTranslator

        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        if not tagged or tagged[0].cell_type != "code":    # papermill takes the first
            raise ReportError(f"notebooks: {path.name} has no code cell tagged 'parameters' "
                              f"(the report injects {', '.join(want)} after it; without it the "
                              f"notebook's own values win and its results miss the run)")
        assigned = {prm.name for prm in PythonTranslator.inspect(tagged[0])}
        unknown = [k for k in (params or ()) if k not in assigned]
        if unknown:
            raise ReportError(f"params: {path.name} has no parameter {', '.join(unknown)} (its "
                              f"parameters cell assigns {', '.join(sorted(assigned))}); run "
                              f"--only the notebooks that take it")
        if params and any("T.setup()" in c.source for c in nb.cells if c.cell_type == "code"):
            guard.check_values(path, tagged[0], params)   # the checks its T.setup() runs
        missing = [w for w in want if w not in assigned]
        if missing:
            raise ReportError(f"notebooks: the parameters cell of {path.name} does not assign "
                              f"{', '.join(missing)} (the report injects "
                              f"{', '.join(want)}; a name it does not assign there may be set "
                              f"again later and the injected value lost)")


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
        from distributed.comm.addressing import parse_address, parse_host_port

        try:                                     # before connecting: a malformed address
            scheme, loc = parse_address(scheduler)
            if scheme in ("tcp", "tls", "ws", "wss"):
                parse_host_port(loc)
        except ValueError as exc:
            raise ReportError(f"scheduler: {scheduler!r} is not a Dask scheduler address "
                              f"(e.g. tcp://10.0.0.5:8786): {exc}") from exc
        try:
            with distributed.Client(scheduler, timeout=f"{SCHEDULER_TIMEOUT_S}s",
                                    set_as_default=False) as client:
                info = dist.cluster_workers(client)
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
    keep_other_commits: bool = False,
    cell_timeout: float | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    replace: bool = False,
    params: Mapping | None = None,
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

    ``resume``: keep the notebooks' stored results (the sweeps skip the points done);
    ``keep_other_commits`` (with ``resume`` only): reuse stored points of another commit too,
    instead of running them again (each entry's ``other_commits`` counts them per commit).
    ``params``: parameters given to every notebook run beside the injected ones (a workload's
    name as ``grids``, a ``family`` and its ``implementations``: the kernels notebook's), each
    one its parameters cell must assign (``ReportError`` naming ``params`` otherwise);
    recorded in each entry of the manifest.
    ``replace``: let this call replace a notebook's stored results that the run's manifest
    says came from another device or preset; without it that is refused (``ReportError``
    naming ``run``) before anything in the folder is written, as is a ``resume`` on another
    device: a CPU call never replaces or mixes into a GPU run's rows by mistake.

    Returns the manifest (``manifest["ok"]`` is False when a notebook of this call failed).
    When some notebooks are chosen (``notebooks`` or ``only``), the entries of the run's earlier
    manifest for the other notebooks are kept in the index, each with its own date and preset.
    Raises ``ReportError`` for an unknown preset, device, run name or notebook name, a
    ``notebooks_dir`` that is not a folder (when ``notebooks`` is not given), a bad
    ``workers`` (not a positive int, more than the GPUs visible) or ``cell_timeout``,
    ``workers`` and ``scheduler`` both given, a notebook that cannot make a page of the run
    (``check_notebooks``: its name, its parameters cell), a scheduler that does not answer, or
    when the
    kernel environment cannot import ``pmll_lab`` with that device (checked before any notebook
    runs, and before the run folder is created: a run that cannot start leaves nothing behind).
    """
    if preset not in PRESETS:
        raise ReportError(f"preset: must be one of {PRESETS}, not {preset!r}")
    if device not in DEVICES:
        raise ReportError(f"device: must be one of {DEVICES}, not {device!r}")
    if not run or Path(run).name != run or run.startswith(".") or Path(run).suffix in (
            ".html", ".md", ".json", ".csv", ".txt", ".ipynb"):
        raise ReportError(f"run: must be a plain folder name, not {run!r}")
    if (Path(reports_dir) / run).exists() and not (Path(reports_dir) / run).is_dir():
        raise ReportError(f"run: {Path(reports_dir) / run} exists and is not a folder")
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
    if not isinstance(keep_other_commits, bool) or (keep_other_commits and not resume):
        raise ReportError(f"keep_other_commits: True only with resume (it keeps stored points "
                          f"of another commit), got {keep_other_commits!r} with resume={resume!r}")
    chosen = notebooks is not None or bool(only)
    if notebooks is None and not Path(notebooks_dir).is_dir():
        raise ReportError(f"notebooks_dir: no such folder: {notebooks_dir}")
    paths = [Path(p) for p in notebooks] if notebooks is not None else discover(notebooks_dir)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ReportError(f"notebooks: not found: {', '.join(missing)}")
    if only:
        paths = select(paths, only)
    if params is not None and not isinstance(params, Mapping):
        raise ReportError(f"params: a dict of parameter names and values, got {params!r}")
    check_notebooks(paths, params)

    run_dir = Path(reports_dir) / run
    with guard.run_lock(run_dir):
        return _build(run_dir, paths, chosen, preset=preset, device=device, resume=resume,
                      replace=replace, cell_timeout=cell_timeout, workers=workers,
                      scheduler=scheduler, keep_other_commits=keep_other_commits,
                      notebooks_dir=notebooks_dir, params=params, log=log)


def _build(run_dir: Path, paths: list[Path], chosen: bool, *, preset, device, resume, replace,
           cell_timeout, workers, scheduler, keep_other_commits, notebooks_dir, params,
           log) -> dict:
    """``build_report`` once its arguments are checked, holding the run's lock."""
    run = run_dir.name
    previous, guarded = guard.previous(run_dir)

    manifest = {"run": run, "preset": preset, "device_requested": device,
                "started_utc": utc_now(), "notebooks_dir": str(notebooks_dir),
                "environment": {}, "notebooks": []}
    with kernel_environment(device, keep_other_commits) as env, _cluster(
            workers, scheduler, device, log) as (
            address, cluster_desc):
        manifest["cluster"] = cluster_desc
        manifest["environment"] = env_info = probe_environment(env)
        if not replace:
            guard.refuse_replacing(run_dir, guarded, [p.stem for p in paths], env_info,
                                   preset, resume)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)      # only once the run can start
        except OSError as exc:
            raise ReportError(f"reports_dir: cannot make {run_dir}: {exc}") from None
        if not paths:
            log(f"no notebooks found in {notebooks_dir}: nothing to run "
                f"(writing an empty index)")
        else:
            log(f"report '{run}': {len(paths)} notebook(s), preset {preset}, "
                f"device {env_info['device']}, commit {env_info['commit']}")
            if preset == "full" and env_info.get("backend") == "triton-interpreter":
                log("warning: the full preset is the H200 grid; in the Triton interpreter on "
                    "the CPU it runs for many hours. The CPU-sized preset: --preset quick "
                    "(make report PRESET=quick)")
        plan = [p.stem for p in paths]
        manifest["plan"] = plan
        manifest["killed"] = guard.carried(guarded, plan)
        if not chosen:                     # a whole run: reports of notebooks it no longer has
            _drop_files(run_dir, [e for e in previous if e.get("name") not in plan])
        ran: list[dict] = []
        with _interrupt_on_sigterm():
            for i, src in enumerate(paths, 1):
                log(f"[{i}/{len(paths)}] {src.stem} ...")
                manifest["running"] = {"name": src.stem, "number": i, "of": len(paths),
                                       "started_utc": utc_now()}
                manifest["to_run"] = plan[i:]
                # Written as each notebook starts: the page says what runs, and a long run cut
                # short keeps its index.
                _write_index(run_dir, manifest, ran, previous, complete=False, keep_all=chosen)
                t0 = time.perf_counter()
                try:
                    entry = run_notebook(src, run_dir, preset=preset, device=device,
                                     resume=resume, cell_timeout=cell_timeout,
                                     env_info=env_info, log=log, scheduler=address,
                                     params=params)
                except KeyboardInterrupt:      # outside the notebook's cells (rendering...)
                    entry = None
                if entry is not None:
                    ran.append(entry)
                if entry is None or entry["status"] == "interrupted":
                    manifest["running"] = None
                    manifest["interrupted"] = {"name": src.stem, "at_utc": utc_now(),
                                               "seconds": round(time.perf_counter() - t0, 1)}
                    _write_index(run_dir, manifest, ran, previous, complete=False,
                                 keep_all=chosen)
                    raise KeyboardInterrupt(f"report '{run}' stopped while {src.stem} ran")
        manifest["running"], manifest["to_run"] = None, []
        _write_index(run_dir, manifest, ran, previous, complete=True, keep_all=chosen)
    return manifest


@contextlib.contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM (``kill``, a batch system's stop) raises ``KeyboardInterrupt`` as Ctrl-C does,
    so a run stopped either way names the notebook it stopped in its index. Main thread only
    (elsewhere a no-op); the earlier handler is restored afterwards."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _drop_files(run_dir: Path, entries: list[dict]) -> None:
    """Delete the rendered report and executed notebook of each manifest entry (results stay)."""
    for e in entries:
        for key in ("html", "ipynb"):
            if e.get(key) and Path(e[key]).name == e[key]:
                (run_dir / e[key]).unlink(missing_ok=True)


def _write_index(run_dir: Path, manifest: dict, ran: list[dict], previous: list[dict], *,
                 complete: bool, keep_all: bool) -> None:
    """Fill ``manifest`` with the notebooks run so far plus the earlier entries kept, and write
    ``manifest.json`` and ``index.html``. Kept (``kept_from_earlier``, with their own date,
    preset and commit), while their report or results exist: with ``keep_all`` (some chosen)
    every earlier notebook this call has not run; otherwise those still to run in this call, so
    a run cut short links the earlier reports it did not replace instead of leaving them in the
    folder unlisted."""
    names = {e["name"] for e in ran}
    waiting = set(manifest.get("to_run") or [])
    kept = [dict(e, kept_from_earlier=True) for e in previous
            if e.get("name") not in names and (keep_all or e.get("name") in waiting)
            and ((e.get("html") and (run_dir / e["html"]).exists())
                 or any((run_dir / r).exists() for r in e.get("results") or ()))]
    if not keep_all and complete:       # nothing left to replace them: unlisted, so removed
        _drop_files(run_dir, [e for e in previous if e.get("name") not in names])
    manifest["notebooks"] = sorted(ran + kept, key=lambda e: e["name"])
    manifest["updated_utc"] = utc_now()
    manifest["finished_utc"] = utc_now() if complete else None
    manifest["complete"] = complete
    manifest["ok"] = all(e["status"] == "ok" for e in ran)
    # atomic (temp file + os.replace): a run killed mid-write keeps the index it had, so
    # --resume still finds the earlier notebooks' entries
    replace_text(run_dir / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    replace_text(run_dir / "index.html", index_html(manifest, run_dir=run_dir))
