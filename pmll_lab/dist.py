"""Sweeps on a Dask cluster: the scheduler's client, the points' placement on the workers, the
workers' warm-up and the local cluster that ``python -m pmll_lab report --workers N`` starts.

``pmll_lab.sweep.run_sweep`` with a Dask ``client`` (a ``distributed.Client`` or a scheduler
address) runs the points here (``run_on_cluster``): as tasks on the cluster's workers, at most
one per worker slot (a ``GPU`` resource of 1 per point on GPU runs, one thread per worker
otherwise), and their rows stream back into the sweep's file as they finish; only the calling
process writes it. A worker that dies costs its in-flight point only: that point is submitted
once more on another worker, then stored as failed with the error. ``local_cluster`` starts the
cluster of the report command: one worker per GPU, each pinned with ``CUDA_VISIBLE_DEVICES``, or
N CPU workers. Why Dask and not our own process pool: README, "Dependencies".

The rows, the point identities and the results file come from ``pmll_lab.results``, which
``pmll_lab.sweep`` imports too; this module does not import ``pmll_lab.sweep`` (the sweep hands
``run_on_cluster`` the function that stores a point's rows). Every name here is reachable as an
attribute of ``pmll_lab.sweep`` too (``sweep.local_cluster``), imported on first use.
``distributed`` itself is imported only when a cluster is used.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from pmll_lab.backend import DEVICE
from pmll_lab.results import now_stamp, point_id, point_rows, provenance, stored_rows

RETRIES = 1
"""Times a point whose worker died is submitted again before it is stored as failed."""


def _worker_point_rows(point_fn: Callable[[dict], list[dict]], point: Mapping,
                       pid: str) -> list[dict]:
    """``results.point_rows`` on a Dask worker, with torch's intra-op threads set to the worker's
    ``OMP_NUM_THREADS`` first: torch may have been imported (and sized its pool) before the
    nanny's environment reached the process, and then ignores the variable."""
    n = os.environ.get("OMP_NUM_THREADS", "")
    if n.isdigit() and int(n) > 0:
        import torch

        if torch.get_num_threads() != int(n):
            torch.set_num_threads(int(n))
    return point_rows(point_fn, point, pid)


_CLIENTS: dict[str, object] = {}


def as_client(client, wait_s: float = 30.0):
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


def cluster_workers(client) -> dict[str, dict]:
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


def run_on_cluster(client, name: str, todo: list[tuple[dict, str]], point_fn,
                   store: Callable[[list[dict]], None], bar, gpu: bool, wait_s: float,
                   affinity=None) -> int:
    """Run ``todo`` on the cluster, storing each point's rows as it finishes (``store(rows)``,
    in this process: the sweep's append of one point's rows in one write, so a point counts
    as done only when all its rows are stored); returns the number of failed points. At most one point per slot is in flight, so a worker that dies
    holds one point only; that point is submitted once more (``RETRIES``) away from the dead
    worker, then stored as failed with the error. When every worker has died at once, the
    points left wait (up to ``wait_s``) for one to come back rather than being dropped; a
    retried point goes back to the worker it died on only when no other is up. An interrupt
    cancels what is in flight.

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
    if gpu and not slots(cluster_workers(client), gpu=True):
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
        workers = cluster_workers(client)
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

    def drain():
        """Store each finished point's rows, resubmit a dead worker's point, keep slots full."""
        nonlocal failed
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
                    env = {**provenance(), "worker": where or "?", "gpu": "", "gpu_id": ""}
                    rows = stored_rows(point, pid, [], "failed", err, now_stamp(), env)
            fut.release()
            if rows is not None:
                store(rows)
                failed += all(r.get("status") == "failed" for r in rows)  # the point itself
                if bar is not None:
                    bar.update(1)
            fill()

    try:
        fill()
        while True:
            drain()
            if not pending:
                break
            # nothing in flight, points left: every worker had died at once (their nannies
            # restart them), or only workers a retried point avoids are up: wait for one
            try:
                client.wait_for_workers(1, timeout=wait_s)
            except TimeoutError as exc:
                raise RuntimeError(f"client: no Dask worker came back within {wait_s:.0f} s "
                                   f"during sweep {name!r}; the points finished are stored: "
                                   "run it again to finish") from exc
            fill()
            if not inflight:
                pending[:] = [(pt, pid, att, None) for pt, pid, att, _ in pending]
                fill()
            if not inflight:
                time.sleep(0.5)
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
                "pmll_lab.experiments.roofline", "pmll_lab.experiments.acceptance",
                "pmll_lab.experiments.roofline_case", "pmll_lab.experiments.roofline_providers",
                "pmll_lab.experiments.state_drift", "pmll_lab.experiments.pmll_attention",
                "pmll_lab.experiments.spec_decode", "pmll_lab.models.generate",
                "pmll_lab.models.oracle", "pmll_lab.models.gpt2_pmll", "fla.ops.gated_delta_rule",
                "flashinfer.gdn_decode")
"""What a worker imports before its first point (``warm_up``): the launchers, the notebooks'
experiment modules with the parts their points run (``roofline_case``, ``roofline_providers``,
``state_drift``, ``pmll_attention``, ``spec_decode`` and the model modules their points import;
transformers itself is imported on first use) and the peers' kernels (FLA's import alone takes
seconds, which a notebook pays in its set-up cell and each worker in its first point
otherwise)."""


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
    for addr in cluster_workers(client):
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
        as_client(client).run(fn)


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
    then retries the point itself, once, elsewhere. Dask's work stealing is off: ``run_sweep``
    places the points itself, one per worker slot; stealing moved a point from a worker still
    busy (its warm-up's imports, slow on a loaded machine) behind the other worker's point,
    leaving the first idle. Close it with ``cluster.close()``.
    ``dashboard_address``: where the dashboard listens (needs bokeh; None: none)."""
    import dask
    from distributed import LocalCluster

    specs = cluster_spec(workers, gpu_ids)
    # the nannies read pre-spawn-environ when they are made (in scale): our thread counts
    # replace Dask's default of 1 there too
    spawn_env = {f"distributed.nanny.pre-spawn-environ.{k}": v
                 for k, v in worker_threads(len(specs)).items()}
    with dask.config.set({"distributed.scheduler.allowed-failures": 0,
                          "distributed.scheduler.work-stealing": False, **spawn_env}):
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
