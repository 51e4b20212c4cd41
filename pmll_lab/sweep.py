"""Sweep runner: a grid of parameter points, one tidy results row per (point, kernel, metric).

A *point function* takes one point (a ``dict`` of parameters) and returns a list of row dicts,
each with at least ``kernel``, ``metric`` and ``value`` (``pmll_lab.bench.error_rows`` and
``throughput_rows`` build them). It should check the kernel against its reference *before*
timing it (STYLE.md, llm.c habit) and raise ``CheckFailed`` (carrying the error rows) when a
check fails, so that the point is stored as failed and never plotted as a speed.

``run_sweep`` stores every row with the point's parameters, ``point_id``, ``status``
(``ok``/``failed``), ``error`` text, device, torch/triton versions, commit, timestamp and
``point_rows`` (Liger-Kernel's tidy format). A point's rows are appended to
``<results_dir>/<name>.jsonl`` in one write as it finishes, so a sweep killed half-way and run
again skips the points stored whole and runs the rest again (a point cut off mid-write
included; the file is repaired first: ``pmll_lab.results``); any exception in a point (OOM,
compile error, failed check) becomes a failed row and the sweep goes on.

With a Dask ``client`` (a ``distributed.Client`` or a scheduler address), the points run as tasks
on the cluster's workers and their rows stream back into the same file as they finish; only the
calling process writes it. That side (the client, the points' placement on the workers, a dead
worker's retry, ``warm_up``, ``local_cluster``) lives in ``pmll_lab.dist``; its names are
reachable here too (``sweep.local_cluster``), imported on first use. The file, the rows and the
point identities both sides use live in ``pmll_lab.results`` (neither module imports the other
at import time). Every row names the
``worker`` it ran on (``in-process`` without a client) and its ``gpu`` (device name) and
``gpu_id`` (host and CUDA device; both empty on the CPU).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pandas as pd

from pmll_lab.backend import DEVICE, env_flag
from pmll_lab.results import (  # noqa: F401  (the runner's names, importable from here)
    IN_PROCESS, PLACEMENT_COLUMNS, ROW_COUNT, CheckFailed, frame_to_csv, load, point_id,
    point_rows, provenance_here, repair, stored_columns, stored_points, write_rows)

KEEP_OTHER_COMMITS_ENV = "PMLL_LAB_KEEP_OTHER_COMMITS"
"""``1``: ``run_sweep``'s ``keep_other_commits`` default (``report --resume
--keep-other-commits`` sets it for the notebooks' kernels)."""
NAME_MAX_BYTES = 200
"""Longest sweep name (UTF-8 bytes): ``<name>.jsonl.gz`` and the temporary files of its
atomic writes (``.<name>.jsonl.<pid>.tmp``) must fit a file name (255 bytes)."""


def grid(**axes: Iterable) -> list[dict]:
    """Cartesian product of named axes: ``grid(K=[1, 2], B=[1, 64])`` -> 4 points.
    ``ValueError`` naming an axis whose values are not a list (a string or a number: write
    ``B=[5]``, not ``B=5``)."""
    for n, v in axes.items():
        if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Iterable):
            raise ValueError(f"grid: axis {n} must be a list of values, got {v!r}")
    names = list(axes)
    values = itertools.product(*(list(axes[n]) for n in names))
    return [dict(zip(names, combo)) for combo in values]


def _bar(total: int, desc: str, enabled: bool):
    """A tqdm bar of ``total`` points: a widget in JupyterLab when ipywidgets is there, else
    text. None inside ``python -m pmll_lab report`` (``PMLL_LAB_REPORT`` set): a bar's redraws
    would fill the HTML report, and ``run_sweep`` prints a one-line summary instead."""
    if not enabled or os.environ.get("PMLL_LAB_REPORT"):
        return None
    try:
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm.std import tqdm
    return tqdm(total=total, desc=desc, unit="point")


def write_point(path: Path, rows: list[dict]) -> None:
    """Store one point's rows (``results.write_rows``); looked up at each point, so a test can
    replace it."""
    write_rows(path, rows)


def run_sweep(
    name: str,
    points: Iterable[Mapping],
    point_fn: Callable[[dict], list[dict]],
    *,
    results_dir: str | Path = "results",
    desc: str | None = None,
    progress: bool = True,
    client=None,
    gpu: bool | None = None,
    wait_s: float = 120.0,
    affinity=None,
    keep_other_commits: bool | None = None,
) -> pd.DataFrame:
    """Run ``point_fn`` on every point not already in ``<results_dir>/<name>.jsonl``.

    Each point's rows are appended to the JSONL file in one write as soon as the point finishes,
    so a sweep killed half-way and run again skips the points already done (a point listed twice
    runs once). A point is done only when all its rows are stored (``point_rows`` of them): one
    cut off by a kill mid-write runs again, its partial rows and a torn last line removed from
    the file first (``pmll_lab.results.repair``), on a cluster as in-process. A point whose function raises is stored as one failed row (``status="failed"``,
    ``error`` = the exception and the end of its traceback); ``CheckFailed`` keeps the error rows
    it carries, all marked failed. ``KeyboardInterrupt`` stops the sweep (the points done so far
    stay stored). A point stored as failed runs again when the sweep is resumed (a compile
    killed by the stop of a run, a kernel or peer fixed since): its new rows replace the failed
    ones; a point that ran with some rows failed (a peer's, inside the point) is done.

    ``client``: None runs the points here, one after the other. A ``distributed.Client`` or a
    scheduler address (``"tcp://host:8786"``, e.g. the notebooks' ``scheduler`` parameter) runs
    them as tasks on that cluster's workers (``point_fn`` and the points must pickle), with a
    ``GPU`` resource of 1 each when ``gpu`` (default: this process runs kernels on a GPU); the
    rows are written here as points finish. ``wait_s``: seconds to wait for a first worker
    (and, at most 30 of them, for the scheduler to answer). ``affinity``: the point keys (or a
    function of the point) that decide which kernels a point compiles; on a cluster, points
    that share them run on one worker where possible (``affinity_group``), so each kernel is
    compiled once rather than on every worker. Ignored in-process.
    An archived run's ``<name>.jsonl.gz`` (``pmll_lab.report_archive``) counts as stored too:
    its points are not run again, new rows go to ``<name>.jsonl`` beside it, and the rows
    returned come from both (``pmll_lab.results``).

    Stored points of another git commit (their rows' ``commit``) are run again by default, as
    the code that made them is not this code; their new rows replace the old in what ``load``
    returns. ``keep_other_commits=True`` keeps them instead (they keep their own ``commit``,
    and the summary line names it); ``None`` reads ``PMLL_LAB_KEEP_OTHER_COMMITS`` (``1``:
    keep; ``report --resume --keep-other-commits`` sets it). Rows stored before rows named
    their commit count as this commit's. Stored points of another device (their rows'
    ``device``) are always run again: a figure of one card is never another's.

    Raises ``ValueError`` naming ``client`` for an unusable client (not a client or address, an
    address that does not parse, no scheduler there, no worker, no GPU resource on a GPU run),
    ``results_dir`` when the file holds points run under other kernel switches
    (``import_settings``: ``PMLL_LAB_PACKED_STATE_TILE`` and the like) than this process has,
    ``name`` for a name that is not a plain file name (a path, a leading dot, a NUL or other
    control character, more than ``NAME_MAX_BYTES`` bytes), ``wait_s`` unless positive,
    ``affinity`` for a bad affinity, ``point_fn`` when it is not callable, ``points`` when it
    is not an iterable of mappings (parameter dicts) or a point has an axis named like a
    column every stored row has (``device``, ``timestamp``, ``commit``, ``status``...:
    ``results.stored_columns``; the axis would be overwritten in its rows),
    ``keep_other_commits`` unless None or a bool. These checks run before anything is created
    or stored. A ``point_fn`` that returns something other than a list of row dicts gets a failed
    row saying so. On a cluster, ``point_fn`` and the points must pickle (cloudpickle; a function
    defined in a script needs the script's ``if __name__ == "__main__":`` guard around the
    cluster's start, as every multiprocessing program does).

    Returns the rows of the requested ``points`` (run now or found from an earlier run) as a
    DataFrame, and writes the same as ``<name>.csv`` beside the JSONL.
    """
    _check_name(name)
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not wait_s > 0:
        raise ValueError(f"wait_s: must be a positive number of seconds, not {wait_s!r}")
    if not callable(point_fn):
        raise ValueError(f"point_fn: must be a function of one point returning a list of row "
                         f"dicts, not {type(point_fn).__name__}")
    if isinstance(points, (Mapping, str, bytes)):
        raise ValueError(f"points: must be an iterable of points (parameter dicts, e.g. "
                         f"grid(...)), not one {type(points).__name__}")
    try:
        points = list(points)
    except TypeError:
        raise ValueError(f"points: must be an iterable of points (parameter dicts), not "
                         f"{type(points).__name__}") from None
    reserved = set(stored_columns())
    for i, p in enumerate(points):
        if not isinstance(p, Mapping):
            raise ValueError(f"points: entry {i} is {type(p).__name__} {p!r}, not a mapping of "
                             f"parameters (build points with grid(...) or as dicts)")
        clash = sorted(str(k) for k in p if k in reserved)
        if clash:
            raise ValueError(f"points: axis {clash[0]!r} (entry {i}) is named like a column "
                             f"every stored row has ({', '.join(sorted(reserved))}): it would "
                             f"be overwritten in the rows; rename the axis")
    if keep_other_commits is None:
        keep_other_commits = env_flag(KEEP_OTHER_COMMITS_ENV, False)
    elif not isinstance(keep_other_commits, bool):
        raise ValueError(f"keep_other_commits: must be None, True or False, not "
                         f"{keep_other_commits!r}")
    if not (affinity is None or callable(affinity) or (
            isinstance(affinity, (list, tuple)) and all(isinstance(k, str) for k in affinity))):
        raise ValueError(f"affinity: must be None, a function of the point or a list of point "
                         f"keys, not {affinity!r}")
    if client is not None:
        from pmll_lab import dist

        client = dist.as_client(client, wait_s)
    gpu = DEVICE.type == "cuda" if gpu is None else bool(gpu)
    if not isinstance(results_dir, (str, Path)) or not str(results_dir).strip():
        raise ValueError(f"results_dir: a folder's path, got {results_dir!r} (an empty path "
                         "would write into the current folder)")
    results_dir = Path(results_dir)
    if results_dir.exists() and not results_dir.is_dir():
        raise ValueError(f"results_dir: {results_dir} is a file, not a folder")
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.jsonl"
    stored = stored_points(path)             # the .jsonl repaired, and the archived .gz
    _same_switches(path, stored)
    commit, device = provenance_here()["commit"], provenance_here().get("device")
    other = {pid: str(row["commit"]) for pid, row in stored.items()
             if row.get("commit") not in (None, commit)}
    failed_before = {pid for pid, row in stored.items() if row.get("status") == "failed"}
    elsewhere = {pid for pid, row in stored.items() if row.get("device") not in (None, device)}
    done = ((set(stored) if keep_other_commits else set(stored) - set(other)) - failed_before
            - elsewhere)                     # another device's point is never this one's
    wanted = {point_id(p) for p in points}
    todo: dict[str, dict] = {}
    for p in points:
        pid = point_id(p)
        if pid not in done and pid not in todo:
            todo[pid] = dict(p)
    bar = _bar(len(todo), desc or name, progress)
    failed = 0
    t0 = time.perf_counter()
    try:
        if client is None:
            for pid, point in todo.items():
                rows = point_rows(point_fn, point, pid)
                write_point(path, rows)
                failed += all(r.get("status") == "failed" for r in rows)  # the point itself
                if bar is not None:
                    bar.update(1)
        else:
            failed = dist.run_on_cluster(client, name, [(p, pid) for pid, p in todo.items()],
                                          point_fn, lambda rows: write_point(path, rows), bar, gpu,
                                          wait_s, affinity)
    finally:
        if bar is not None:
            bar.close()
    try:
        df = load(path)                      # the .jsonl and an archived run's .jsonl.gz
    except FileNotFoundError:                # nothing stored: no point ran, none archived
        df = pd.DataFrame()
    if "point_id" in df:
        df = df[df["point_id"].isin(wanted)].reset_index(drop=True)
    for k in {k for p in points for k in p}:  # an int axis absent from older rows: ints again
        if (k in df and df[k].dtype.kind == "f" and df[k].notna().all()
                and all(isinstance(p[k], int) and not isinstance(p[k], bool)
                        for p in points if k in p)):
            df[k] = df[k].astype("int64")
    frame_to_csv(df, results_dir / f"{name}.csv")
    if progress:
        ran = df[df["point_id"].isin(todo)] if "point_id" in df else df
        rerun = sorted({c for pid, c in other.items() if pid in todo})
        kept = sorted({c for pid, c in other.items() if pid in wanted and pid not in todo})
        print(f"sweep {name}: {len(wanted)} points, {len(todo)} run now "
              f"({failed} failed) in {time.perf_counter() - t0:.1f} s "
              f"{describe_placement(ran)}, {len(wanted) - len(todo)} from earlier runs"
              + (f" ({sum(pid in wanted for pid in other)} kept from other commits: "
                 f"{', '.join(kept)}; this is {commit})" if kept else "")
              + (f"; points stored at commit {', '.join(rerun)} ran again at {commit}"
                 if rerun else "")
              + (f"; {len(failed_before & set(todo))} that had failed ran again"
                 if failed_before & set(todo) else "")
              + f"; results in {path}")
    return df


def _check_name(name) -> None:
    """``ValueError`` naming ``name`` unless it is a plain file name for the results."""
    if (not isinstance(name, str) or not name or Path(name).name != name
            or name.startswith(".") or any(ord(c) < 32 or ord(c) == 127 for c in name)):
        raise ValueError(f"name: must be a plain file name without control characters (the "
                         f"results go to <results_dir>/<name>.jsonl), not {name!r}")
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX_BYTES:
        raise ValueError(f"name: at most {NAME_MAX_BYTES} bytes (it names the results files), "
                         f"got {len(name.encode('utf-8', 'surrogatepass'))}: {name[:40]!r}...")


def placement(df: pd.DataFrame) -> dict:
    """Who ran the rows of ``df``: ``{"workers": n, "gpus": n, "devices": {name: points}}``:
    distinct ``worker`` names, distinct GPUs (``gpu_id``), and points per ``device`` kind
    (rows written before these columns existed count as one in-process worker)."""
    if df.empty or "point_id" not in df:
        return {"workers": 0, "gpus": 0, "devices": {}}
    first = df.drop_duplicates("point_id")
    workers = first["worker"].fillna(IN_PROCESS).nunique() if "worker" in first else 1
    gpus = 0
    if "gpu_id" in first:
        ids = first["gpu_id"].dropna()
        gpus = ids[ids.astype(str) != ""].nunique()
    devices = first["device"].value_counts().to_dict() if "device" in first else {}
    return {"workers": int(workers), "gpus": int(gpus),
            "devices": {str(k): int(v) for k, v in devices.items()}}


def describe_placement(df: pd.DataFrame) -> str:
    """``placement`` in words: "in this process", "on 2 workers (2 GPUs: NVIDIA H200)"..."""
    p = placement(df)
    if not p["workers"]:
        return "(nothing run)"
    kinds = ", ".join(p["devices"])
    if "worker" not in df or set(df["worker"].fillna(IN_PROCESS)) == {IN_PROCESS}:
        return f"in one process ({kinds})"
    gpus = f"{p['gpus']} GPU{'s' if p['gpus'] != 1 else ''}: " if p["gpus"] else ""
    return f"on {p['workers']} worker{'s' if p['workers'] != 1 else ''} ({gpus}{kinds})"


def _same_switches(path: Path, stored: dict[str, dict]) -> None:
    """``ValueError`` naming the results file when its stored points (``stored``:
    ``results.stored_points``) ran under other kernel switches (``import_settings``) than this
    process has: a resumed sweep would add points of other kernels to them and the report
    would label them all with this process's switches. Rows stored before the stamp existed
    pass."""
    have = {str(r["import_settings"]) for r in stored.values()
            if r.get("import_settings") is not None}
    now = provenance_here()["import_settings"]
    if have - {now}:
        raise ValueError(f"results_dir: {path} holds points run with kernel switches "
                         f"{', '.join(sorted(have))}; this process has {now}. Resume with the "
                         f"same PMLL_LAB_* switches, or write to another run folder")


# ---- the Dask side (its own module) ---------------------------------------------------------

_DIST = ("RETRIES", "THREAD_VARS", "WARM_MODULES", "affinity_group", "cluster_spec",
         "local_cluster", "next_point", "on_workers", "slots", "visible_gpus", "warm_up",
         "worker_threads", "_CLIENTS", "as_client", "run_on_cluster", "_takes_n_workers",
         "_warm", "_worker_point_rows", "cluster_workers")
"""``pmll_lab.dist``'s names, reachable as attributes of this module (imported on first use)."""


def __getattr__(name: str):
    """The Dask side (``_DIST``) lives in ``pmll_lab.dist``; its names are reachable here too
    (``sweep.warm_up``), imported on first use."""
    if name in _DIST:
        import importlib

        return getattr(importlib.import_module("pmll_lab.dist"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
