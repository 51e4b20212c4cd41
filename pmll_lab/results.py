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

An archived run (``pmll_lab.report_archive``) holds ``<name>.jsonl.gz``; a sweep resumed there
appends to ``<name>.jsonl`` beside it. Both files are one results file: ``load`` and the resume
read the ``.gz`` first, then the ``.jsonl``, and where both hold a point the later copy counts
(``_parse``), so no stored point is run again or lost, whichever file holds it.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
import os
import contextlib
import socket
import traceback
import zlib
from collections.abc import Callable, Iterator, Mapping
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


def provenance_here() -> dict[str, str]:
    """``provenance()`` of this process, computed once (the commit and switches are fixed)."""
    global _ENV
    if _ENV is None:
        _ENV = provenance()
    return _ENV


ROW_KEYS = ("kernel", "metric", "value")
"""The keys every row of a point function has."""


def stored_columns() -> tuple[str, ...]:
    """The columns ``stored_rows`` writes over a point's parameters: the row's own keys
    (``ROW_KEYS``), the point's identity and outcome, its provenance (``provenance``) and
    placement: a grid axis of one of these names would be overwritten in every row."""
    return (*ROW_KEYS, "point_id", "status", "error", "timestamp", ROW_COUNT,
            *provenance_here(), *PLACEMENT_COLUMNS)


def _rows_problem(rows, point: Mapping) -> str | None:
    """What is wrong with a point function's return value, or None: it must be a non-empty
    list of dicts with string keys, each with ``ROW_KEYS``, none giving one of the point's
    axes another value (it would overwrite the axis in the stored row)."""
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
        return f"must return a list of row dicts, returned {type(rows).__name__}"
    if not rows:
        return "returned no rows (a point that measured nothing)"
    for r in rows:
        if not all(isinstance(k, str) for k in r):
            return f"a row's keys must be strings, got {sorted(map(repr, r))[:4]}"
        missing = [k for k in ROW_KEYS if k not in r]
        if missing:
            return f"a row lacks {', '.join(missing)} (every row has {', '.join(ROW_KEYS)})"
        clash = sorted(k for k in set(r) & set(point) if r[k] != point[k])
        if clash:
            return (f"a row gives axis {', '.join(clash)} another value than the point's "
                    f"({', '.join(f'{k}={r[k]!r}, not {point[k]!r}' for k in clash)}): it "
                    "would overwrite the axis in the stored row")
    return None


def point_rows(point_fn: Callable[[dict], list[dict]], point: Mapping, pid: str) -> list[dict]:
    """Run one point where this is called (this process or a Dask worker) and return its rows
    as stored (``stored_rows``), with the provenance and placement of this process. Every
    exception of ``point_fn``, and a return value ``_rows_problem`` refuses (no rows, rows
    without ``kernel``/``metric``/``value``, a key that is not a string or gives one of the
    point's axes another value), becomes a failed row (``KeyboardInterrupt`` and ``SystemExit`` pass)."""
    env = provenance_here()
    stamp = now_stamp()
    try:
        rows = point_fn(dict(point))
        status, err = "ok", ""
        problem = _rows_problem(rows, point)
        if problem:
            rows, status, err = [], "failed", f"point_fn: {problem}"
    except CheckFailed as exc:
        rows, status, err = exc.rows, "failed", f"check failed: {exc}"
    except Exception as exc:  # noqa: BLE001 - one bad point must not lose the others
        rows, status, err = [], "failed", f"{type(exc).__name__}: {exc}"
        tb = traceback.format_exc(limit=3)
        err = err + "\n" + tb[-1500:]
    return stored_rows(point, pid, rows, status, err, stamp, {**env, **placement_here()})


# ---- the file -------------------------------------------------------------------------------

@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold the results file ``path``'s lock (``.<name>.lock`` beside it, ``flock``; a no-op
    where the system has none) while appending to it, repairing it or archiving it, so that
    two processes on one results file (two sweeps of one ``results_dir``, an archive beside a
    running sweep) never lose each other's rows: a rewrite of the file waits for an append in
    progress and the next append waits for the rewrite."""
    try:
        import fcntl
    except ImportError:                            # not POSIX: no lock
        yield
        return
    path = Path(path)
    name = path.name.removesuffix(".gz")
    fd = os.open(path.with_name(f".{name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                               # closing releases the lock


def append(path: Path, data: bytes) -> None:
    """Append ``data`` with one ``write`` call where the system allows (a point's rows land
    whole or, if the process is killed mid-write, as a cut-off end that ``repair`` removes),
    under the file's lock (``locked``); a torn last line left by another writer is ended
    first, so these rows are not glued onto it."""
    with locked(path):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data          # a writer killed mid-line: its torn line ends
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


def write_rows(path: Path, rows: list[dict]) -> None:
    """Append one point's rows (``stored_rows``) to the results file ``path``."""
    append(path, ("\n".join(json.dumps(r, default=str) for r in rows) + "\n").encode())


def _parse(text: str) -> tuple[list[tuple[str, dict]], bool]:
    """``(kept, clean)``: the ``(line, row)`` pairs of every point stored whole, one copy of
    each point (the last complete one in the file: a point run again, at another commit or
    after its file was archived, replaces its earlier copy), in file order; ``clean`` when that
    is every line of ``text`` and ``text`` ends with a newline (nothing to repair).

    A run is a stretch of consecutive rows of one point; with ``point_rows`` it closes when it
    holds that many rows (complete) or when another point's row, an unreadable line or the
    end of the file comes first (incomplete: dropped). Rows without ``point_rows`` (older
    files) make one run per stretch of their point, complete; rows without a ``point_id``
    (not a sweep's) are kept as they are."""
    lines = text.splitlines()
    entries: list[list[tuple[str, dict]] | None] = []    # one per kept run or loose row
    where: dict[str, int] = {}                            # point -> its entry
    run: list[tuple[str, dict]] = []
    dropped = bool(text) and not text.endswith("\n")

    def close(complete: bool) -> None:
        nonlocal dropped, run
        if run:
            pid = run[0][1]["point_id"]
            if complete:
                if pid in where:                          # an earlier copy: replaced
                    entries[where[pid]] = None
                    dropped = True
                where[pid] = len(entries)
                entries.append(run)
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
            entries.append([(line, row)])
            continue
        if run and (run[0][1]["point_id"] != pid or
                    (ROW_COUNT in run[0][1]) != (ROW_COUNT in row)):
            close(complete=ROW_COUNT not in run[0][1])
        run.append((line, row))
        want = row.get(ROW_COUNT)
        if want is not None and len(run) >= want:
            close(complete=len(run) == want)
    close(complete=not run or ROW_COUNT not in run[0][1])
    kept = [pair for entry in entries if entry is not None for pair in entry]
    return kept, not dropped


def repair(path: Path) -> set[str]:
    """``point_id`` of every point stored whole in ``path`` (none when it does not exist). If
    the file holds anything else (a torn last line, the first rows of a point whose other
    rows never arrived, an earlier copy of a point stored again), it is rewritten without it:
    to a temporary file beside it, flushed to disk, then moved over it (``os.replace``), so a
    kill during the repair leaves the old file or the new one, never a mix. Only ``path``
    itself is read and rewritten (an archived ``.gz`` beside it is left alone)."""
    return {row["point_id"] for _, row in _repair(Path(path)) if "point_id" in row}


def _repair(path: Path) -> list[tuple[str, dict]]:
    """``repair``'s work: the kept ``(line, row)`` pairs of ``path`` (rewritten if unclean),
    read and rewritten under the file's lock (``locked``)."""
    if not path.exists():
        return []
    with locked(path):
        kept, clean = _parse(_text(path.read_bytes()) if path.exists() else "")
        if not clean:
            replace_text(path, "".join(line + "\n" for line, _ in kept))
    return kept


def stored_points(path: str | Path) -> dict[str, dict]:
    """What a resumed sweep finds in its results file ``path`` (``<name>.jsonl``): ``path``
    repaired first (``repair``), then for every point stored whole in it or in the archived
    ``<name>.jsonl.gz`` beside it, ``{point_id: a row of the copy load returns}`` (the rows of
    one copy share their provenance: ``commit``, ``import_settings``). The row is one not
    marked failed where the copy has one, so ``status == "failed"`` says the point itself
    failed (every row of it is). Each file is read once."""
    plain, gz = _pair(Path(path))
    archived = _point_rows(_parse(gz_text(gz))[0]) if gz.is_file() else {}
    return {**archived, **_point_rows(_repair(plain))}   # the .jsonl's copy is the later one


def _point_rows(kept: list[tuple[str, dict]]) -> dict[str, dict]:
    """``{point_id: a row}`` of one file's kept rows (one copy per point): a row not marked
    failed where the copy has one."""
    out: dict[str, dict] = {}
    for _, row in kept:
        pid = row.get("point_id")
        if isinstance(pid, str) and (pid not in out or out[pid].get("status") == "failed"):
            out[pid] = row
    return out


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


def compact_text(path: str | Path) -> str:
    """The rows ``load`` reads from ``path`` (``<name>.jsonl`` and its ``.jsonl.gz``), as the
    text of one results file: every point stored whole, once; torn lines and cut-off points
    left out (the archive's merge of the two files)."""
    return "".join(line + "\n" for line, _ in _kept(path))


def gz_text(gz: str | Path) -> str:
    """The text of an archived results file ``<name>.jsonl.gz``; a file cut short (an archive
    killed mid-write by an earlier version, a copy cut off) gives what its stream holds up to
    the cut, whose last point ``_parse`` then drops as cut off, instead of failing the read."""
    data = Path(gz).read_bytes()
    try:
        return _text(gzip.decompress(data))
    except (EOFError, OSError, zlib.error):
        d = zlib.decompressobj(wbits=31)
        try:
            text = d.decompress(data)
        except zlib.error:
            text = b""
        return text.decode("utf-8", errors="ignore").rsplit("\n", 1)[0]


def _text(data: bytes) -> str:
    """A results file's bytes as text; a line that is not UTF-8 (a write cut inside a
    character, a corrupted byte) becomes one ``_parse`` reads as torn (its point is dropped and
    run again on resume) instead of making the whole file unreadable."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        out = []
        for line in data.split(b"\n"):
            try:
                out.append(line.decode("utf-8"))
            except UnicodeDecodeError:
                out.append("\ufffd not UTF-8")
        return "\n".join(out)


def _kept(path: str | Path) -> list[tuple[str, dict]]:
    """The kept ``(line, row)`` pairs of the results file ``path`` and its archived form: each
    of the two files parsed on its own (a point cut off at the end of the ``.gz`` is not
    joined to the rows of its next copy in the ``.jsonl``), then one copy per point, the
    ``.jsonl``'s where both hold one (it is the later). ``FileNotFoundError`` naming ``path``
    when neither exists."""
    plain, gz = _pair(Path(path))
    if not plain.is_file() and not gz.is_file():
        other = gz if Path(path) == plain else plain
        raise FileNotFoundError(f"path: no results file {path} (nor {other.name})")
    old = _parse(gz_text(gz))[0] if gz.is_file() else []
    new = _parse(_text(plain.read_bytes()))[0] if plain.is_file() else []
    later = {row["point_id"] for _, row in new if isinstance(row.get("point_id"), str)}
    return [pair for pair in old if pair[1].get("point_id") not in later] + new


def _pair(path: Path) -> tuple[Path, Path]:
    """``(<name>.jsonl, <name>.jsonl.gz)`` for either name."""
    if path.suffix == ".gz":
        return path.with_name(path.name[:-3]), path
    return path, path.with_name(path.name + ".gz")


def read_jsonl_text(path: str | Path) -> str:
    """The text of a results file ``<name>.jsonl`` with its archived form ``<name>.jsonl.gz``
    (``pmll_lab.report_archive``): the ``.gz`` decompressed first, then the ``.jsonl`` (a
    sweep resumed in an archived run appends there), whichever of the two names is given and
    whichever of the two files exists, so a name a sweep or report prints resolves in a
    committed run too and no stored row is missed. Raises ``FileNotFoundError`` naming
    ``path`` when neither exists."""
    path = Path(path)
    plain, gz = _pair(path)
    parts = []
    if gz.is_file():
        parts.append(gz_text(gz))
    if plain.is_file():
        if parts and parts[0] and not parts[0].endswith("\n"):
            parts.append("\n")                   # a torn last line stays a line of its own
        parts.append(_text(plain.read_bytes()))
    if not parts:
        other = gz if path == plain else plain
        raise FileNotFoundError(f"path: no results file {path} (nor {other.name})")
    return "".join(parts)


def load(path: str | Path) -> pd.DataFrame:
    """Read a results JSONL file (``.jsonl`` and its archived ``.jsonl.gz``, either name:
    ``read_jsonl_text``) into a DataFrame: the rows of every point stored whole (a torn line,
    and the rows of a point cut short, are left out; a point stored twice counts once, its
    later copy; each of the two files read on its own, ``_kept``); ``value`` stored as
    "inf"/"nan" comes back as a float."""
    df = pd.DataFrame([row for _, row in _kept(path)])
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
           "stored_points", "compact_text", "gz_text", "locked", "stored_columns", "provenance_here", "ROW_KEYS",
           "replace_text", "read_jsonl_text", "load", "frame_to_csv", "now_stamp"]
