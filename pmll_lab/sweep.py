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
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import os
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pandas as pd

from pmll_lab.backend import environment


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
    """Stable identity of a point (its parameters as sorted JSON)."""
    return json.dumps({k: point[k] for k in sorted(point)}, sort_keys=True, default=str)


def _clean(value):
    """A JSON-safe value: numpy/torch scalars become Python numbers, non-finite floats strings
    ("inf", "nan"; ``load`` reads them back as floats)."""
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        value = value.item()  # numpy scalar, 0-d array or 0-d tensor
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _progress(items: list, desc: str, enabled: bool):
    """A tqdm bar over ``items``: a widget in JupyterLab when ipywidgets is there, else text.
    No bar inside ``python -m pmll_lab report`` (``PMLL_LAB_REPORT`` set): a bar's redraws would
    fill the HTML report, and ``run_sweep`` prints a one-line summary instead."""
    if not enabled or os.environ.get("PMLL_LAB_REPORT"):
        return items
    try:
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm.std import tqdm
    return tqdm(items, desc=desc)


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


def run_sweep(
    name: str,
    points: Iterable[Mapping],
    point_fn: Callable[[dict], list[dict]],
    *,
    results_dir: str | Path = "results",
    desc: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Run ``point_fn`` on every point not already in ``<results_dir>/<name>.jsonl``.

    Each point's rows are appended to the JSONL file in one write as soon as the point finishes,
    so a sweep killed half-way and run again skips the points already done. A point whose
    function raises is stored as one failed row (``status="failed"``, ``error`` = the exception
    and the end of its traceback); ``CheckFailed`` keeps the error rows it carries, all marked
    failed. ``KeyboardInterrupt`` stops the sweep (the points done so far stay stored).

    Returns the rows of the requested ``points`` (run now or found from an earlier run) as a
    DataFrame, and writes the same as ``<name>.csv`` beside the JSONL.
    """
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.jsonl"
    done = _done_points(path)
    env = environment()
    points = list(points)
    wanted = {point_id(p) for p in points}
    todo = [p for p in points if point_id(p) not in done]
    failed = 0
    t0 = time.perf_counter()
    for point in _progress(todo, desc or name, progress):
        pid = point_id(point)
        stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        try:
            rows = point_fn(dict(point))
            status, err = "ok", ""
        except CheckFailed as exc:
            rows, status, err = exc.rows, "failed", f"check failed: {exc}"
        except Exception as exc:  # noqa: BLE001 - one bad point must not lose the others
            rows, status, err = [], "failed", f"{type(exc).__name__}: {exc}"
            tb = traceback.format_exc(limit=3)
            err = err + "\n" + tb[-1500:]
        if not rows:
            rows = [{"kernel": "*", "metric": "error", "value": None}]
        failed += status == "failed"
        lines = []
        for row in rows:
            full = {**point, **row, "point_id": pid, "status": row.get("status", status),
                    "error": err, "timestamp": stamp, **env}
            if status == "failed":
                full["status"] = "failed"
            lines.append(json.dumps({k: _clean(v) for k, v in full.items()}, default=str))
        _append(path, ("\n".join(lines) + "\n").encode())
    df = load(path) if path.exists() else pd.DataFrame()
    if "point_id" in df:
        df = df[df["point_id"].isin(wanted)].reset_index(drop=True)
    df.to_csv(results_dir / f"{name}.csv", index=False)
    if progress:
        print(f"sweep {name}: {len(points)} points, {len(todo)} run now "
              f"({failed} failed) in {time.perf_counter() - t0:.1f} s, "
              f"{len(points) - len(todo)} from earlier runs; results in {path}")
    return df


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


def speed_rows(df: pd.DataFrame, metric: str = "time_us") -> pd.DataFrame:
    """Rows of ``metric`` that a speed plot may show: only from points that passed their checks
    (``status == "ok"`` and no row of the point with ``passed == False``), and one timer only
    (GPU ``do_bench`` if any row has it, else the interpreter's wall time): GPU and interpreter
    figures are never mixed."""
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
    return sel
