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
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

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
    return [dict(zip(names, values)) for values in itertools.product(*(list(axes[n]) for n in names))]


def point_id(point: Mapping) -> str:
    """Stable identity of a point (its parameters as sorted JSON)."""
    return json.dumps({k: point[k] for k in sorted(point)}, sort_keys=True, default=str)


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


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

    Returns every row of the results file (earlier runs' rows included) as a DataFrame, and
    also writes it as ``<name>.csv`` beside the JSONL.
    """
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.jsonl"
    done: set[str] = set()
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    done.add(json.loads(line)["point_id"])
                except (json.JSONDecodeError, KeyError):
                    continue  # a line cut off when a run was killed: that point runs again
    env = environment()
    points = list(points)
    todo = [p for p in points if point_id(p) not in done]
    for point in tqdm(todo, desc=desc or name, disable=not progress):
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
        with path.open("a") as fh:
            for row in rows:
                full = {**point, **row, "point_id": pid, "status": row.get("status", status),
                        "error": err, "timestamp": stamp, **env}
                if status == "failed":
                    full["status"] = "failed"
                fh.write(json.dumps({k: _clean(v) for k, v in full.items()}, default=str) + "\n")
    df = load(path)
    df.to_csv(results_dir / f"{name}.csv", index=False)
    return df


def load(path: str | Path) -> pd.DataFrame:
    """Read a results JSONL file (skipping a cut-off last line) into a DataFrame."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return pd.DataFrame(rows)


def speed_rows(df: pd.DataFrame, metric: str = "time_us") -> pd.DataFrame:
    """Rows of ``metric`` from points that passed their checks, one timer only (GPU do_bench
    if present, else interpreter wall time): what a speed plot may show."""
    sel = df[(df["metric"] == metric) & (df["status"] == "ok")]
    if "timer" in sel and (sel["timer"] == "do_bench").any():
        sel = sel[sel["timer"] == "do_bench"]
    return sel
