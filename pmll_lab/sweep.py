"""Sweep runner: a grid of parameter points, one tidy results row per (point, kernel, metric).

A *point function* takes one point (a ``dict`` of parameters) and returns a list of row dicts,
each with at least ``kernel``, ``metric`` and ``value`` (``pmll_lab.bench.error_rows`` and
``throughput_rows`` build them). It should check the kernel against its reference *before*
timing it (STYLE.md, llm.c habit) and raise ``CheckFailed`` (carrying the error rows) when a
check fails, so that the point is stored as failed and never plotted as a speed.

``run_sweep`` stores every row with the point's parameters, ``point_id``, ``status``
(``ok``/``failed``), ``error`` text, device, torch/triton versions, commit and timestamp
(Liger-Kernel's tidy format). Rows are appended to ``<results_dir>/<name>.jsonl`` as each point
finishes, so a sweep killed half-way and run again skips the points already done; any exception
in a point (OOM, compile error, failed check) becomes a failed row and the sweep goes on.

With a Dask ``client`` (a ``distributed.Client`` or a scheduler address), the points run as tasks
on the cluster's workers, at most one per worker slot (a ``GPU`` resource of 1 per point on GPU
runs, one thread per worker otherwise), and their rows stream back into the same file as they
finish; only the calling process writes it. A worker that dies costs its in-flight point only:
that point is submitted once more on another worker, then stored as failed with the error.
``local_cluster`` starts the cluster ``python -m pmll_lab report --workers N`` uses: one worker
per GPU, each pinned with ``CUDA_VISIBLE_DEVICES``, or N CPU workers. Every row names the
``worker`` it ran on (``in-process`` without a client) and its ``gpu`` (device name) and
``gpu_id`` (host and CUDA device; both empty on the CPU).
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from pmll_lab.backend import DEVICE, environment

IN_PROCESS = "in-process"
"""``worker`` of the rows of a sweep run without a Dask client."""
PLACEMENT_COLUMNS = ("worker", "gpu", "gpu_id")
"""Columns naming where a point ran (they differ between runs of the same sweep)."""
RETRIES = 1
"""Times a point whose worker died is submitted again before it is stored as failed."""


class CheckFailed(Exception):
    """Raised by a point function whose kernel disagrees with its reference.

    ``rows``: the error rows measured (kept in the results, marked failed)."""

    def __init__(self, message: str, rows: list[dict] | None = None):
        super().__init__(message)
        self.rows = rows or []


def grid(**axes: Iterable) -> list[dict]:
    """Cartesian product of named axes: ``grid(K=[1, 2], B=[1, 64])`` -> 4 points."""
    names = list(axes)
    values = itertools.product(*(list(axes[n]) for n in names))
    return [dict(zip(names, combo)) for combo in values]


def point_id(point: Mapping) -> str:
    """Stable identity of a point (its parameters as sorted JSON). numpy/torch scalars (and
    those inside lists, tuples and dicts) count as the Python numbers and bools they hold, as
    ``_clean`` stores them: ``grid(B=np.array([1, 5]))`` and ``grid(B=[1, 5])`` name the same
    points, so a resumed sweep neither runs them again nor stores their rows twice."""
    return json.dumps({k: _plain(point[k]) for k in sorted(point)}, sort_keys=True, default=str)


def _scalar(value):
    """A numpy scalar, 0-d array or 0-d tensor as the Python number/bool it holds; else
    ``value``."""
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return value.item()
    return value


def _plain(value):
    """``_scalar`` applied through lists, tuples and dicts (a point's ids only)."""
    value = _scalar(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _clean(value):
    """A JSON-safe value: numpy/torch scalars become Python numbers, non-finite floats strings
    ("inf", "nan"; ``load`` reads them back as floats)."""
    value = _scalar(value)  # numpy scalar, 0-d array or 0-d tensor
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


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


def _done_points(path: Path) -> set[str]:
    """``point_id`` of every point stored in ``path``; a line cut off when a run was killed is
    ignored (that point runs again) and the file is made to end with a newline again."""
    done: set[str] = set()
    if not path.exists():
        return done
    text = path.read_text()
    for line in text.splitlines():
        if line.strip():
            try:
                done.add(json.loads(line)["point_id"])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    if text and not text.endswith("\n"):
        with path.open("a") as fh:
            fh.write("\n")
    return done


def _append(path: Path, data: bytes) -> None:
    """Append ``data`` with one ``write`` call (a point's rows land whole or, if the process is
    killed mid-write, as a cut-off last line that ``_done_points`` ignores)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


_ENV: dict[str, str] | None = None


def _placement() -> dict[str, str]:
    """Where this process runs points: the Dask worker's name (its address when unnamed) or
    ``in-process``; the GPU's device name and ``host:CUDA id`` (the id as in
    ``CUDA_VISIBLE_DEVICES`` when that is set), both empty without a GPU."""
    worker = IN_PROCESS
    try:
        from distributed import get_worker

        w = get_worker()
        worker = w.name if isinstance(w.name, str) and w.name else w.address
    except (ImportError, ValueError):
        pass
    gpu = gpu_id = ""
    if DEVICE.type == "cuda":
        import torch

        gpu = torch.cuda.get_device_name(DEVICE)
        index = DEVICE.index or 0
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                   if v.strip()]
        gpu_id = f"{socket.gethostname()}:{visible[index] if index < len(visible) else index}"
    return {"worker": worker, "gpu": gpu, "gpu_id": gpu_id}


def _rows_json(point: Mapping, pid: str, rows: list[dict], status: str, err: str,
               stamp: str, env: Mapping) -> list[dict]:
    """A point's rows as stored: its parameters, the row, status, error, provenance."""
    if not rows:
        rows = [{"kernel": "*", "metric": "error", "value": None}]
    out = []
    for row in rows:
        full = {**point, **row, "point_id": pid, "status": row.get("status", status),
                "error": err, "timestamp": stamp, **env}
        if status == "failed":
            full["status"] = "failed"
        out.append({k: _clean(v) for k, v in full.items()})
    return out


def _point_rows(point_fn: Callable[[dict], list[dict]], point: Mapping, pid: str) -> list[dict]:
    """Run one point where this is called (this process or a Dask worker) and return its rows,
    JSON-safe, with the provenance and placement of this process. Every exception of
    ``point_fn`` becomes a failed row (``KeyboardInterrupt`` and ``SystemExit`` pass)."""
    global _ENV
    if _ENV is None:
        _ENV = environment()
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    try:
        rows = point_fn(dict(point))
        status, err = "ok", ""
        if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
            err = (f"point_fn: must return a list of row dicts, returned "
                   f"{type(rows).__name__}")
            rows, status = [], "failed"
    except CheckFailed as exc:
        rows, status, err = exc.rows, "failed", f"check failed: {exc}"
    except Exception as exc:  # noqa: BLE001 - one bad point must not lose the others
        rows, status, err = [], "failed", f"{type(exc).__name__}: {exc}"
        tb = traceback.format_exc(limit=3)
        err = err + "\n" + tb[-1500:]
    return _rows_json(point, pid, rows, status, err, stamp, {**_ENV, **_placement()})


def _worker_point_rows(point_fn: Callable[[dict], list[dict]], point: Mapping,
                       pid: str) -> list[dict]:
    """``_point_rows`` on a Dask worker, with torch's intra-op threads set to the worker's
    ``OMP_NUM_THREADS`` first: torch may have been imported (and sized its pool) before the
    nanny's environment reached the process, and then ignores the variable."""
    n = os.environ.get("OMP_NUM_THREADS", "")
    if n.isdigit() and int(n) > 0:
        import torch

        if torch.get_num_threads() != int(n):
            torch.set_num_threads(int(n))
    return _point_rows(point_fn, point, pid)


def _write(path: Path, rows: list[dict]) -> None:
    _append(path, ("\n".join(json.dumps(r, default=str) for r in rows) + "\n").encode())


_CLIENTS: dict[str, object] = {}


def _as_client(client, wait_s: float = 30.0):
    """``client`` as a ``distributed.Client``: one given is used as it is; a scheduler address
    (``"tcp://host:8786"``) gets a client of this process, kept for later sweeps. Raises
    ``ValueError`` naming ``client`` for anything else, or when nothing answers there."""
    if isinstance(client, str):
        address = client.strip()
        if not address:
            raise ValueError("client: empty scheduler address")
        try:
            from distributed import Client
        except ImportError as exc:  # the dist extra is not installed
            raise ImportError("client: running a sweep on a Dask cluster needs dask.distributed: "
                              "pip install -e '.[dist]'") from exc
        known = _CLIENTS.get(address)
        if known is not None and getattr(known, "status", "") == "running":
            return known
        try:
            _CLIENTS[address] = Client(address, set_as_default=False,
                                       timeout=f"{max(1.0, min(wait_s, 30.0))}s")
        except OSError as exc:
            raise ValueError(f"client: no Dask scheduler answers at {address!r}: {exc}") from exc
        except (ValueError, TypeError) as exc:   # distributed could not parse the address
            raise ValueError(f"client: not a scheduler address ({address!r}; e.g. "
                             f"'tcp://host:8786'): {exc}") from exc
        return _CLIENTS[address]
    if callable(getattr(client, "submit", None)) and callable(getattr(client, "scheduler_info",
                                                                      None)):
        return client
    raise ValueError(f"client: must be None, a distributed.Client or a scheduler address, "
                     f"not {type(client).__name__}")


def _workers(client) -> dict[str, dict]:
    """Scheduler's view of the workers now: ``{address: {"name", "nthreads", "resources"}}``."""
    info = client.scheduler_info(n_workers=-1) if _takes_n_workers(client) \
        else client.scheduler_info()
    return info.get("workers", {})


def _takes_n_workers(client) -> bool:
    import inspect

    try:
        return "n_workers" in inspect.signature(client.scheduler_info).parameters
    except (TypeError, ValueError):
        return False


def slots(workers: Mapping[str, Mapping], gpu: bool) -> int:
    """Points a cluster runs at once: the sum of the workers' ``GPU`` resources on a GPU run,
    else of their threads. ``workers``: ``scheduler_info()["workers"]``."""
    if gpu:
        return int(sum(w.get("resources", {}).get("GPU", 0) for w in workers.values()))
    return int(sum(w.get("nthreads", 1) for w in workers.values()))


def affinity_group(point: Mapping, affinity) -> str:
    """The compile group of ``point``: ``affinity(point)`` when callable, the values of the
    keys ``affinity`` names, or the point itself (no affinity: every point its own group)."""
    if affinity is None:
        return point_id(point)
    if callable(affinity):
        return json.dumps(affinity(dict(point)), sort_keys=True, default=str)
    return json.dumps([point.get(k) for k in affinity], default=str)


def next_point(pending: Sequence[tuple], group: Mapping[str, str], owner: Mapping[str, str],
               addr: str, name: str, live: set[str]) -> int | None:
    """Index in ``pending`` (``(point, pid, attempt, avoid)`` tuples) of the point the free
    worker ``addr`` (named ``name``) runs next, None when there is none for it: the first of a
    group it owns (``owner``: group -> address), else the first of a group no live worker owns,
    else the first of all. A retried point never goes back to the worker it died on
    (``avoid``, an address or a name)."""
    fresh = anyone = None
    for i, (_, pid, _, avoid) in enumerate(pending):
        if avoid and avoid in (addr, name):
            continue
        own = owner.get(group[pid])
        if own == addr:
            return i
        if fresh is None and own not in live:
            fresh = i
        if anyone is None:
            anyone = i
    return fresh if fresh is not None else anyone


def _run_on_cluster(client, name: str, todo: list[tuple[dict, str]], point_fn, path: Path,
                    bar, gpu: bool, wait_s: float, affinity=None) -> int:
    """Run ``todo`` on the cluster, writing each point's rows as it finishes; returns the
    number of failed points. At most one point per slot is in flight, so a worker that dies
    holds one point only; that point is submitted once more (``RETRIES``) away from the dead
    worker, then stored as failed with the error. An interrupt cancels what is in flight.

    A free worker takes the next point of a group (``affinity_group``) it already ran, else of
    a group no live worker has run yet, else any point: each worker compiles the kernels of
    its own groups, instead of every worker compiling every kernel. Points go to their worker
    as a soft restriction (``allow_other_workers``), so a worker that dies only hands its
    groups on."""
    from distributed import as_completed

    try:
        client.wait_for_workers(1, timeout=wait_s)
    except TimeoutError as exc:
        raise ValueError(f"client: the Dask scheduler has no worker after {wait_s:.0f} s") from exc
    if gpu and not slots(_workers(client), gpu=True):
        raise ValueError("client: a GPU run needs workers with a GPU resource (start them with "
                         "`--resources GPU=1`, one per GPU, or `python -m pmll_lab report "
                         "--workers N`); this cluster's workers have none")
    resources = {"GPU": 1} if gpu else None
    token = uuid.uuid4().hex[:8]
    pending = [(point, pid, 0, None) for point, pid in todo]
    group = {pid: affinity_group(point, affinity) for point, pid in todo}
    owner: dict[str, str] = {}           # group -> address of the worker that runs it
    inflight: dict[str, tuple] = {}
    futures: dict[str, object] = {}
    done = as_completed([], loop=client.loop, with_results=True, raise_errors=False)
    failed = submitted = 0

    def fill():
        nonlocal submitted
        workers = _workers(client)
        live = set(workers)
        busy: dict[str, int] = {}
        for _, _, _, addr in inflight.values():
            busy[addr] = busy.get(addr, 0) + 1
        for addr, w in workers.items():
            cap = w.get("resources", {}).get("GPU", 0) if gpu else w.get("nthreads", 1)
            while pending and busy.get(addr, 0) < max(1, int(cap)):
                i = next_point(pending, group, owner, addr, str(w.get("name")), live)
                if i is None:
                    break
                point, pid, attempt, _ = pending.pop(i)
                owner.setdefault(group[pid], addr)
                if owner[group[pid]] not in live:
                    owner[group[pid]] = addr
                fut = client.submit(_worker_point_rows, point_fn, point, pid, pure=False,
                                    resources=resources, key=f"{name}-{token}-{submitted}",
                                    workers=[addr], allow_other_workers=True)
                submitted += 1
                inflight[fut.key], futures[fut.key] = (point, pid, attempt, addr), fut
                done.add(fut)
                busy[addr] = busy.get(addr, 0) + 1

    try:
        fill()
        for fut, result in done:
            point, pid, attempt, _ = inflight.pop(fut.key)
            futures.pop(fut.key)
            rows = None
            if fut.status == "finished":
                rows = result
            else:  # the task itself failed (point_fn's errors are rows): its worker died
                if getattr(client, "status", "running") != "running":
                    raise RuntimeError(f"client: lost the Dask scheduler during sweep {name!r}; "
                                       "the points finished are stored: run it again to finish")
                try:
                    result = fut.exception()
                except BaseException as exc:  # noqa: BLE001 - cancelled by the cluster
                    result = exc
                dead = getattr(result, "last_worker", None)
                where = str(getattr(dead, "name", None) or getattr(dead, "address", "") or "")
                if attempt < RETRIES:
                    pending.insert(0, (point, pid, attempt + 1, where))
                else:
                    err = (f"{type(result).__name__}: {result} (worker died; {attempt + 1} "
                           f"attempts)")
                    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
                    env = {**environment(), "worker": where or "?", "gpu": "", "gpu_id": ""}
                    rows = _rows_json(point, pid, [], "failed", err, stamp, env)
            fut.release()
            if rows is not None:
                _write(path, rows)
                failed += any(r.get("status") == "failed" for r in rows)
                if bar is not None:
                    bar.update(1)
            fill()
    except BaseException:
        try:
            client.cancel(list(futures.values()))
        except Exception:  # noqa: BLE001 - the scheduler may be gone: nothing left to cancel
            pass
        raise
    return failed


WARM_MODULES = ("pmll_lab.gdn", "pmll_lab.carry", "pmll_lab.conv", "pmll_lab.pmll",
                "pmll_lab.experiments.gdn", "pmll_lab.experiments.carry",
                "pmll_lab.experiments.conv", "pmll_lab.experiments.pmll",
                "pmll_lab.experiments.roofline", "fla.ops.gated_delta_rule",
                "flashinfer.gdn_decode")
"""What a worker imports before its first point (``warm_up``): the launchers, the notebooks'
experiment modules and the peers' kernels (FLA's import alone takes seconds, which a notebook
pays in its set-up cell and each worker in its first point otherwise)."""


def _warm(modules: Sequence[str]) -> list[str]:
    """Import ``modules`` (those that fail to import are skipped) and, with CUDA, make the
    device's context and measure its copy bandwidth (``bench.copy_bandwidth``, cached per
    process, which the speed rows use). Returns the modules imported."""
    import importlib

    done = []
    for m in modules:
        try:
            importlib.import_module(m)
            done.append(m)
        except Exception:  # noqa: BLE001 - not installed, or does not import on this machine
            pass
    import torch

    if torch.cuda.is_available():
        from pmll_lab.bench import copy_bandwidth

        copy_bandwidth()
        torch.cuda.synchronize()
    return done


def warm_up(client, modules: Sequence[str] = WARM_MODULES, gpu: bool | None = None) -> list:
    """Start, without waiting, one task per worker of ``client`` (a ``distributed.Client``) that
    imports ``modules`` and makes the CUDA context: the workers' own start-up (torch, Triton,
    the peers' imports, the context) then overlaps the notebook's instead of delaying each
    worker's first point. Returns the futures (keep them to wait; they are also
    fire-and-forget). ``gpu``: whether the tasks take a ``GPU`` resource (default: this process
    runs kernels on a GPU)."""
    from distributed import fire_and_forget

    gpu = DEVICE.type == "cuda" if gpu is None else bool(gpu)
    futures = []
    for addr in _workers(client):
        fut = client.submit(_warm, tuple(modules), pure=False, workers=[addr],
                            allow_other_workers=False, resources={"GPU": 1} if gpu else None)
        fire_and_forget(fut)
        futures.append(fut)
    return futures


def on_workers(fn: Callable[[], object], client=None) -> None:
    """Call ``fn()`` in this process and, with a Dask ``client`` (or scheduler address), on
    every worker of that cluster: e.g. an experiment's ``release()`` that frees the device
    memory its cached inputs hold, wherever its points ran. Raises ``ValueError`` naming
    ``client`` as ``run_sweep`` does."""
    fn()
    if client is not None:
        _as_client(client).run(fn)


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
) -> pd.DataFrame:
    """Run ``point_fn`` on every point not already in ``<results_dir>/<name>.jsonl``.

    Each point's rows are appended to the JSONL file in one write as soon as the point finishes,
    so a sweep killed half-way and run again skips the points already done (a point listed twice
    runs once). A point whose function raises is stored as one failed row (``status="failed"``,
    ``error`` = the exception and the end of its traceback); ``CheckFailed`` keeps the error rows
    it carries, all marked failed. ``KeyboardInterrupt`` stops the sweep (the points done so far
    stay stored).

    ``client``: None runs the points here, one after the other. A ``distributed.Client`` or a
    scheduler address (``"tcp://host:8786"``, e.g. the notebooks' ``scheduler`` parameter) runs
    them as tasks on that cluster's workers (``point_fn`` and the points must pickle), with a
    ``GPU`` resource of 1 each when ``gpu`` (default: this process runs kernels on a GPU); the
    rows are written here as points finish. ``wait_s``: seconds to wait for a first worker
    (and, at most 30 of them, for the scheduler to answer). ``affinity``: the point keys (or a
    function of the point) that decide which kernels a point compiles; on a cluster, points
    that share them run on one worker where possible (``affinity_group``), so each kernel is
    compiled once rather than on every worker. Ignored in-process.
    Raises ``ValueError`` naming ``client`` for an unusable client (not a client or address, an
    address that does not parse, no scheduler there, no worker, no GPU resource on a GPU run),
    ``name`` for a name that is not a plain file name, ``wait_s`` unless positive, ``affinity``
    for a bad affinity, ``point_fn`` when it is not callable, ``points`` when it is not an
    iterable of mappings (parameter dicts). These checks run before anything is created or
    stored. A ``point_fn`` that returns something other than a list of row dicts gets a failed
    row saying so. On a cluster, ``point_fn`` and the points must pickle (cloudpickle; a function
    defined in a script needs the script's ``if __name__ == "__main__":`` guard around the
    cluster's start, as every multiprocessing program does).

    Returns the rows of the requested ``points`` (run now or found from an earlier run) as a
    DataFrame, and writes the same as ``<name>.csv`` beside the JSONL.
    """
    if not isinstance(name, str) or not name or Path(name).name != name or name.startswith("."):
        raise ValueError(f"name: must be a plain file name (the results go to "
                         f"<results_dir>/<name>.jsonl), not {name!r}")
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
    for i, p in enumerate(points):
        if not isinstance(p, Mapping):
            raise ValueError(f"points: entry {i} is {type(p).__name__} {p!r}, not a mapping of "
                             f"parameters (build points with grid(...) or as dicts)")
    if not (affinity is None or callable(affinity) or (
            isinstance(affinity, (list, tuple)) and all(isinstance(k, str) for k in affinity))):
        raise ValueError(f"affinity: must be None, a function of the point or a list of point "
                         f"keys, not {affinity!r}")
    if client is not None:
        client = _as_client(client, wait_s)
    gpu = DEVICE.type == "cuda" if gpu is None else bool(gpu)
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.jsonl"
    done = _done_points(path)
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
                rows = _point_rows(point_fn, point, pid)
                _write(path, rows)
                failed += any(r.get("status") == "failed" for r in rows)
                if bar is not None:
                    bar.update(1)
        else:
            failed = _run_on_cluster(client, name, [(p, pid) for pid, p in todo.items()],
                                     point_fn, path, bar, gpu, wait_s, affinity)
    finally:
        if bar is not None:
            bar.close()
    df = load(path) if path.exists() else pd.DataFrame()
    if "point_id" in df:
        df = df[df["point_id"].isin(wanted)].reset_index(drop=True)
    df.to_csv(results_dir / f"{name}.csv", index=False)
    if progress:
        ran = df[df["point_id"].isin(todo)] if "point_id" in df else df
        print(f"sweep {name}: {len(points)} points, {len(todo)} run now "
              f"({failed} failed) in {time.perf_counter() - t0:.1f} s "
              f"{describe_placement(ran)}, {len(points) - len(todo)} from earlier runs; "
              f"results in {path}")
    return df


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


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (its
    entries when it is set, else ``0 .. n-1``); empty without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [v.strip() for v in listed.split(",") if v.strip()][:torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def cluster_spec(workers: int, gpu_ids: Sequence[str] = ()) -> dict[str, dict]:
    """Worker specs of ``local_cluster``: ``{name: {"cls": Nanny, "options": ...}}``. With
    ``gpu_ids``, one worker per id (the first ``workers`` of them), named ``gpu<id>``, pinned
    with ``CUDA_VISIBLE_DEVICES=<id>``, one thread and a ``GPU`` resource of 1; without, that
    many CPU workers ``cpu0 ..`` of one thread each. Raises ``ValueError`` naming ``workers``
    when it is not a positive int or asks for more GPUs than ``gpu_ids`` holds."""
    import logging

    from distributed import Nanny

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: must be a positive int, not {workers!r}")
    gpu_ids = [str(g) for g in gpu_ids]
    if gpu_ids and workers > len(gpu_ids):
        raise ValueError(f"workers: {workers} asked for, but only {len(gpu_ids)} GPU(s) are "
                         f"visible ({', '.join(gpu_ids)}): one worker runs per GPU")
    base = {"nthreads": 1, "silence_logs": logging.WARNING}
    threads = worker_threads(workers)
    if gpu_ids:
        return {f"gpu{g}": {"cls": Nanny, "options": dict(
                    base, name=f"gpu{g}", env={"CUDA_VISIBLE_DEVICES": g, **threads},
                    resources={"GPU": 1})}
                for g in gpu_ids[:workers]}
    return {f"cpu{i}": {"cls": Nanny, "options": dict(base, name=f"cpu{i}", env=dict(threads))}
            for i in range(workers)}


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""Variables that size the math libraries' thread pools (torch's intra-op pool reads the first)."""


def worker_threads(workers: int) -> dict[str, str]:
    """``THREAD_VARS`` for one of ``workers`` worker processes sharing this machine: its CPU
    cores split evenly (at least 1 each). Dask's nanny sets them to 1 by default, which makes
    a point's host-side work (seeded inputs drawn on the CPU, dtype casts) run on one core in a
    worker against all cores in-process: on a 2-GPU H200 host that made each worker's points
    1.6x slower than in-process (reports/perf-notes.md, "Sweeps on several GPUs")."""
    n = str(max(1, (os.cpu_count() or 1) // workers))
    return {v: n for v in THREAD_VARS}


def local_cluster(workers: int, gpu_ids: Sequence[str] = (), *,
                  dashboard_address: str | None = ":0", timeout: float = 120.0):
    """A ``distributed.LocalCluster`` of worker processes (``cluster_spec``: one per GPU in
    ``gpu_ids``, pinned, or ``workers`` CPU workers), started and waited for. Its scheduler
    gives up a task at the first death of its worker (``allowed-failures`` 0): ``run_sweep``
    then retries the point itself, once, elsewhere. Close it with ``cluster.close()``.
    ``dashboard_address``: where the dashboard listens (needs bokeh; None: none)."""
    import dask
    from distributed import LocalCluster

    specs = cluster_spec(workers, gpu_ids)
    # the nannies read pre-spawn-environ when they are made (in scale): our thread counts
    # replace Dask's default of 1 there too
    spawn_env = {f"distributed.nanny.pre-spawn-environ.{k}": v
                 for k, v in worker_threads(len(specs)).items()}
    with dask.config.set({"distributed.scheduler.allowed-failures": 0, **spawn_env}):
        cluster = LocalCluster(n_workers=0, threads_per_worker=1, processes=True,
                               dashboard_address=dashboard_address)
        try:
            cluster.worker_spec.update(specs)
            cluster.scale(len(specs))
            cluster.wait_for_workers(len(specs), timeout=timeout)
        except BaseException:
            cluster.close()
            raise
    return cluster


def load(path: str | Path) -> pd.DataFrame:
    """Read a results JSONL file (skipping a cut-off line) into a DataFrame; ``value`` stored
    as "inf"/"nan" comes back as a float."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    df = pd.DataFrame(rows)
    if "value" in df:
        nonfinite = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
        df["value"] = df["value"].map(lambda v: nonfinite.get(v, v) if isinstance(v, str) else v)
        try:
            df["value"] = pd.to_numeric(df["value"])
        except (ValueError, TypeError):
            pass  # a sweep that stores text values keeps them as they are
    return df


def one_device(df: pd.DataFrame, device: str | None = None) -> pd.DataFrame:
    """The rows of ``df`` from one kind of device (its ``device`` column: "NVIDIA H200", the
    CPU interpreter...): ``device`` when given, else the kind with the most points (ties: the
    first name in sorted order). A sweep spread over a cluster of mixed GPUs thus never puts
    two kinds in one plot or table; ``df`` without that column or of one kind comes back whole.
    """
    if df.empty or "device" not in df:
        return df
    kinds = df["device"].dropna()
    if device is None:
        if kinds.nunique() <= 1:
            return df
        per = (df.drop_duplicates("point_id") if "point_id" in df else df)["device"]
        counts = per.value_counts()
        device = sorted(counts[counts == counts.max()].index)[0]
    return df[df["device"] == device]


def speed_rows(df: pd.DataFrame, metric: str = "time_us", device: str | None = None
               ) -> pd.DataFrame:
    """Rows of ``metric`` that a speed plot may show: only from points that passed their checks
    (``status == "ok"`` and no row of the point with ``passed == False``), one timer only (GPU
    ``do_bench`` if any row has it, else the interpreter's wall time): GPU and interpreter
    figures are never mixed; and one device kind only (``one_device``: ``device``, else the
    kind with the most points): rows of two GPU models, say from a mixed cluster, are never
    mixed either."""
    if df.empty or "metric" not in df:
        return df.iloc[0:0]
    bad = set()
    if "passed" in df and "point_id" in df:
        bad = set(df.loc[df["passed"].eq(False), "point_id"])
    sel = df[(df["metric"] == metric) & (df["status"] == "ok")]
    if bad:
        sel = sel[~sel["point_id"].isin(bad)]
    if "timer" in sel and (sel["timer"] == "do_bench").any():
        sel = sel[sel["timer"] == "do_bench"]
    return one_device(sel, device)
