"""A sweep's results file: point identities, the rows of a point as stored, the append that
stores them, the repair of a file a killed run left, and reading it back.

``pmll_lab.sweep`` (the runner) and ``pmll_lab.dist`` (its Dask side) both import this module;
neither imports the other at import time.

The file is JSON Lines, one row per line (Liger-Kernel's tidy format). Each point's rows go to
the file in one ``write`` and each carries ``point_rows``, the number of rows that write holds:
a point is stored only when that many rows of it follow one another in the file. A run killed
mid-write leaves a torn last line, or a short last write that ended on a line boundary; either
way the point is incomplete, its rows are cut away by ``repair`` (the next run's first step), and
it runs again. Rows written before ``point_rows`` existed (the committed runs under
``reports/``) count as stored whenever they parse, as they always did.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
import os
import socket
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd

from pmll_lab.backend import DEVICE, environment
from pmll_lab.ops import settings

IN_PROCESS = "in-process"
"""``worker`` of the rows of a sweep run without a Dask client."""
PLACEMENT_COLUMNS = ("worker", "gpu", "gpu_id")
"""Columns naming where a point ran (they differ between runs of the same sweep)."""
ROW_COUNT = "point_rows"
"""Column holding the number of rows its point stored in one write (the completion mark)."""


class CheckFailed(Exception):
    """Raised by a point function whose kernel disagrees with its reference.

    ``rows``: the error rows measured (kept in the results, marked failed)."""

    def __init__(self, message: str, rows: list[dict] | None = None):
        super().__init__(message)
        self.rows = rows or []


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


# ---- the rows of one point ------------------------------------------------------------------

_ENV: dict[str, str] | None = None


def placement_here() -> dict[str, str]:
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


def stored_rows(point: Mapping, pid: str, rows: list[dict], status: str, err: str,
                stamp: str, env: Mapping) -> list[dict]:
    """A point's rows as stored: its parameters, the row, status, error, provenance and
    ``point_rows``. A row may carry its own ``status`` and ``error`` (a peer that failed inside
    a point that ran, ``experiments.protocol.peer_call``); a failed point marks every row
    failed."""
    if not rows:
        rows = [{"kernel": "*", "metric": "error", "value": None}]
    out = []
    for row in rows:
        full = {**point, **row, "point_id": pid, "status": row.get("status", status),
                "error": row.get("error") or err, "timestamp": stamp, **env,
                ROW_COUNT: len(rows)}
        if status == "failed":
            full["status"] = "failed"
        out.append({k: _clean(v) for k, v in full.items()})
    return out


def now_stamp() -> str:
    """UTC time of a point's rows, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def provenance() -> dict[str, str]:
    """What every results row is stamped with: ``backend.environment()`` (device, versions,
    commit) and ``import_settings``, the kernel switches fixed at import
    (``settings.import_switches``)."""
    return {**environment(), "import_settings": settings.import_switches()}


def point_rows(point_fn: Callable[[dict], list[dict]], point: Mapping, pid: str) -> list[dict]:
    """Run one point where this is called (this process or a Dask worker) and return its rows
    as stored (``stored_rows``), with the provenance and placement of this process. Every
    exception of ``point_fn`` becomes a failed row (``KeyboardInterrupt`` and ``SystemExit``
    pass)."""
    global _ENV
    if _ENV is None:
        _ENV = provenance()
    stamp = now_stamp()
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
    return stored_rows(point, pid, rows, status, err, stamp, {**_ENV, **placement_here()})


# ---- the file -------------------------------------------------------------------------------

def append(path: Path, data: bytes) -> None:
    """Append ``data`` with one ``write`` call where the system allows (a point's rows land
    whole or, if the process is killed mid-write, as a cut-off end that ``repair`` removes)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_rows(path: Path, rows: list[dict]) -> None:
    """Append one point's rows (``stored_rows``) to the results file ``path``."""
    append(path, ("\n".join(json.dumps(r, default=str) for r in rows) + "\n").encode())


def _parse(text: str) -> tuple[list[tuple[str, dict]], bool]:
    """``(kept, clean)``: the ``(line, row)`` pairs of every point stored whole, first copy of
    each point only, in file order; ``clean`` when that is every line of ``text`` and
    ``text`` ends with a newline (nothing to repair).

    A run is a stretch of consecutive rows of one point; with ``point_rows`` it closes when it
    holds that many rows (complete) or when another point's row, an unreadable line or the
    end of the file comes first (incomplete: dropped). Rows without ``point_rows`` (older
    files) make one run per stretch of their point, complete; rows without a ``point_id``
    (not a sweep's) are kept as they are."""
    lines = text.splitlines()
    kept: list[tuple[str, dict]] = []
    seen: set[str] = set()
    run: list[tuple[str, dict]] = []
    dropped = bool(text) and not text.endswith("\n")

    def close(complete: bool) -> None:
        nonlocal dropped, run
        if run:
            pid = run[0][1]["point_id"]
            if complete and pid not in seen:
                seen.add(pid)
                kept.extend(run)
            else:
                dropped = True
        run = []

    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):           # a torn or empty line
            close(complete=not run or ROW_COUNT not in run[0][1])
            dropped = True
            continue
        pid = row.get("point_id")
        if not isinstance(pid, str):            # not a sweep row: kept as it is
            close(complete=not run or ROW_COUNT not in run[0][1])
            kept.append((line, row))
            continue
        if run and (run[0][1]["point_id"] != pid or
                    (ROW_COUNT in run[0][1]) != (ROW_COUNT in row)):
            close(complete=ROW_COUNT not in run[0][1])
        run.append((line, row))
        want = row.get(ROW_COUNT)
        if want is not None and len(run) >= want:
            close(complete=len(run) == want)
    close(complete=not run or ROW_COUNT not in run[0][1])
    return kept, not dropped


def repair(path: Path) -> set[str]:
    """``point_id`` of every point stored whole in ``path`` (none when it does not exist). If
    the file holds anything else (a torn last line, the first rows of a point whose other
    rows never arrived, a second copy of a point), it is rewritten without it: to a temporary
    file beside it, flushed to disk, then moved over it (``os.replace``), so a kill during the
    repair leaves the old file or the new one, never a mix."""
    path = Path(path)
    if not path.exists():
        return set()
    kept, clean = _parse(path.read_text())
    if not clean:
        replace_text(path, "".join(line + "\n" for line, _ in kept))
    return {row["point_id"] for _, row in kept}


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: a temporary file in the same folder, flushed
    (``fsync``), then ``os.replace`` over ``path``. A reader, or the next run after a kill,
    sees the old content or the new one whole."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_jsonl_text(path: str | Path) -> str:
    """The text of a results file ``<name>.jsonl`` or its archived form ``<name>.jsonl.gz``
    (``pmll_lab.report_archive``): a ``.gz`` path is decompressed, and a ``.jsonl`` path that
    is missing is read from ``<path>.gz`` beside it, so a name a sweep or report prints
    resolves in a committed run too. Raises ``FileNotFoundError`` naming ``path`` when
    neither exists."""
    path = Path(path)
    gz = path if path.suffix == ".gz" else path.with_name(path.name + ".gz")
    if path.suffix != ".gz" and path.is_file():
        return path.read_text(encoding="utf-8")
    if gz.is_file():
        return gzip.decompress(gz.read_bytes()).decode("utf-8")
    raise FileNotFoundError(f"path: no results file {path}"
                            + ("" if path.suffix == ".gz" else f" (nor {gz.name})"))


def load(path: str | Path) -> pd.DataFrame:
    """Read a results JSONL file (``.jsonl``, or gzipped ``.jsonl.gz``: ``read_jsonl_text``)
    into a DataFrame: the rows of every point stored whole (a torn line, and the rows of a
    point cut short, are left out; a point stored twice counts once); ``value`` stored as
    "inf"/"nan" comes back as a float."""
    kept, _ = _parse(read_jsonl_text(path))
    df = pd.DataFrame([row for _, row in kept])
    if "value" in df:
        nonfinite = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
        df["value"] = df["value"].map(lambda v: nonfinite.get(v, v) if isinstance(v, str) else v)
        try:
            df["value"] = pd.to_numeric(df["value"])
        except (ValueError, TypeError):
            pass  # a sweep that stores text values keeps them as they are
    return df


def frame_to_csv(df: pd.DataFrame, path: Path) -> None:
    """``df.to_csv(path)`` (no index), written atomically (``replace_text``)."""
    replace_text(path, df.to_csv(index=False))


__all__ = ["IN_PROCESS", "PLACEMENT_COLUMNS", "ROW_COUNT", "CheckFailed", "point_id",
           "placement_here", "stored_rows", "point_rows", "append", "write_rows", "repair",
           "replace_text", "read_jsonl_text", "load", "frame_to_csv", "now_stamp"]
