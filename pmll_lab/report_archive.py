"""Keep a finished run small enough to commit: the results as gzipped JSON lines, no executed
notebooks, and the rendered HTML only for the newest run of each notebook (reports/README.md).

Why: every call to the GPU machine carries the working tree (64 MiB in all, FlashInfer's parts
included), so the committed reports must stay lean; and a run's index must not link to files
that were pruned. ``archive_run`` prunes a run folder in place and rewrites its
``manifest.json`` and ``index.html`` (``report_index.index_html``) to list what is left.

Usage: ``python -m pmll_lab.report_archive RUN_DIR [--drop-html NB ...] [--note TEXT]
[--incomplete]``
(``--drop-html``: notebooks whose rendered report a newer run replaces).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import zlib
from pathlib import Path

from pmll_lab.report_index import HEADLINE_FILE, index_html
from pmll_lab.results import compact_text, locked, replace_text


def _gzip(path: Path) -> Path:
    """``<name>.jsonl`` -> ``<name>.jsonl.gz`` (same bytes every time: no time stamp), merged
    with the ``.gz`` already there (a run archived, then resumed): every point stored whole in
    either, once (``results.compact_text``: each file parsed on its own, the ``.jsonl``'s copy
    where both hold one; torn lines and cut-off points left out). Done under the file's lock
    (``results.locked``: a sweep appending to it waits), written to a temporary file moved
    over the ``.gz`` before the ``.jsonl`` is deleted, so a kill at any moment leaves every
    point in one of the two files and a concurrent append is never read and then deleted."""
    out = path.with_name(path.name + ".gz")
    with locked(path):
        data = compact_text(path).encode("utf-8")
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as raw:
                with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
                    dst.write(data)
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        path.unlink()
    return out


def _readable(path: Path) -> None:
    """``ValueError`` naming the results file ``path`` or its archived ``.gz`` when either is
    not a file or holds a line that is not UTF-8 (the merge would drop it as a torn line: a
    point lost): the archive changes nothing then. A ``.gz`` cut short is read as far as it
    goes (``results.gz_text``), as its merge reads it."""
    gz = path.with_name(path.name + ".gz")
    try:
        if not path.is_file():
            raise ValueError("not a file")
        path.read_bytes().decode("utf-8")
        if gz.exists():
            if not gz.is_file():
                raise ValueError(f"{gz.name} is not a file")
            try:
                gzip.decompress(gz.read_bytes()).decode("utf-8")
            except EOFError:
                pass                                   # cut short: read as far as it goes
            except (OSError, zlib.error) as exc:       # not gzip, a CRC error
                raise ValueError(f"{gz.name}: {exc}") from None
        compact_text(path)
    except (ValueError, OSError) as exc:               # UnicodeDecodeError is a ValueError
        raise ValueError(f"run_dir: results file {path} cannot be read ({exc}); nothing "
                         "was changed: move it aside or repair it") from None


def _manifest(run: Path) -> dict:
    """The run's ``manifest.json``, checked before anything is touched: ``FileNotFoundError``
    naming ``run_dir`` without one, ``ValueError`` naming the file when it is not JSON or not a
    run's manifest (a ``notebooks`` list of entries with a ``name``, their ``html`` and
    ``ipynb`` a file name or null, their ``results`` a list of paths)."""
    path = run / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"run_dir: no manifest.json in {run}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"run_dir: {path} is not readable JSON ({exc}); nothing was "
                         "changed") from None
    bad = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("notebooks"), list):
        bad = "not a dict with a list of notebooks"
    else:
        for e in manifest.get("notebooks", []):
            if not isinstance(e, dict) or not isinstance(e.get("name"), str):
                bad = f"an entry without a name: {e!r}"[:120]
            elif any(e.get(k) is not None and (not isinstance(e.get(k), str)
                                               or Path(e[k]).name != e[k])
                     for k in ("html", "ipynb")):
                bad = f"{e['name']}: html/ipynb not a file name of the run folder"
            elif not isinstance(e.get("results", []), list) or not all(
                    isinstance(r, str) for r in e.get("results", [])):
                bad = f"{e['name']}: results not a list of paths"
            if bad:
                break
    if bad:
        raise ValueError(f"run_dir: {path} is not a run's manifest ({bad}); nothing was changed")
    return manifest


def archive_run(run_dir: str | Path, *, drop_html: tuple[str, ...] = (),
                note: str | None = None, incomplete: bool = False) -> dict:
    """Prune ``run_dir`` (a run folder with ``manifest.json``) in place: delete every executed
    notebook (``.ipynb``) and every results CSV except ``headline.csv``, gzip every ``.jsonl``
    (merged into the ``.jsonl.gz`` already there, if any: a resumed archived run keeps the
    points of both),
    delete the rendered HTML of the notebooks named in ``drop_html``, and rewrite the manifest's
    file lists and ``index.html`` to match (a file already gone is no longer listed). ``note`` is added to the manifest's notes (shown on
    the index). Idempotent. Returns the new manifest. Raises, before anything is changed,
    ``FileNotFoundError`` when ``run_dir`` has no ``manifest.json``, ``ValueError`` naming the
    manifest when it is not a run's (``_manifest``), naming ``incomplete`` when the manifest
    says a notebook is still running or the run did not finish (a report running now would
    write after the archive; a run killed, or cut by a time limit, is archived with
    ``incomplete=True``, ``--incomplete``), naming ``drop_html`` when it names a notebook
    the run does not have, naming a results file that cannot be read (not a file, not
    UTF-8), and naming ``run_dir`` while a report is writing the run (its lock,
    ``report_guard.run_lock``). The manifest and index are written atomically."""
    from pmll_lab.report_guard import ReportError, run_lock

    run = Path(run_dir)
    _manifest(run)                   # a folder that is not a run: refused before its lock
    try:
        with run_lock(run):          # not while a report writes the run
            return _archive(run, drop_html, note, incomplete)
    except ReportError:
        raise ValueError(f"run_dir: a report is writing {run} now (it holds the run's lock); "
                         "archive it once that report has ended; nothing was changed") from None


def _archive(run: Path, drop_html: tuple[str, ...], note: str | None, incomplete: bool) -> dict:
    """``archive_run`` under the run's lock."""
    man_path = run / "manifest.json"
    manifest = _manifest(run)
    if not incomplete and (manifest.get("running") or manifest.get("complete") is False):
        what = (f"{manifest['running'].get('name')} is running"
                if isinstance(manifest.get("running"), dict) else "the run did not finish")
        raise ValueError(f"incomplete: {man_path} says {what}; archive a report that has "
                         "ended (a run killed or cut by a time limit: --incomplete)")
    names = {b["name"] for b in manifest.get("notebooks", [])}
    unknown = sorted(set(drop_html) - names)
    if unknown:
        raise ValueError(f"drop_html: {unknown} not among this run's notebooks {sorted(names)}")
    jsonl = sorted(run.rglob("results/**/*.jsonl"))
    for path in jsonl:                 # every results file read before anything is deleted
        _readable(path)
    for path in sorted(run.rglob("*.ipynb")) + sorted(run.rglob("results/**/*.csv")):
        if not path.is_file():
            raise ValueError(f"run_dir: {path} is not a file; nothing was changed")
    for path in sorted(run.rglob("*.ipynb")):
        path.unlink()
    for path in sorted(run.rglob("results/**/*.csv")):
        if path.name != HEADLINE_FILE:
            path.unlink()
    for path in jsonl:
        _gzip(path)
    for b in manifest.get("notebooks", []):
        b["ipynb"] = None
        if b["name"] in drop_html and b.get("html"):
            (run / b["html"]).unlink(missing_ok=True)
        if b.get("html") and not (run / b["html"]).is_file():
            b["html"] = None
        kept = []
        for r in b.get("results", []):
            for cand in (r, r + ".gz"):
                if (run / cand).is_file() and cand not in kept:
                    kept.append(cand)
        b["results"] = kept
    if note and note not in manifest.setdefault("notes", []):
        manifest["notes"].append(note)
    for lock in run.rglob("results/**/.*.lock"):     # the results files' locks (results.locked)
        lock.unlink(missing_ok=True)
    replace_text(man_path, json.dumps(manifest, indent=2) + "\n")
    replace_text(run / "index.html", index_html(manifest, run_dir=run))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pmll_lab.report_archive",
                                 description="Prune a finished report run for committing.")
    ap.add_argument("run_dir")
    ap.add_argument("--drop-html", nargs="*", default=[],
                    help="notebooks whose rendered HTML a newer run replaces")
    ap.add_argument("--note", default=None, help="a provenance note for the run's index")
    ap.add_argument("--incomplete", action="store_true",
                    help="archive a run whose manifest says it did not finish (killed, or cut "
                    "by a time limit); refused otherwise")
    a = ap.parse_args(argv)
    try:
        archive_run(a.run_dir, drop_html=tuple(a.drop_html), note=a.note,
                    incomplete=a.incomplete)
    except (FileNotFoundError, ValueError) as exc:
        ap.error(str(exc))                       # names the argument, exit status 2
    except OSError as exc:                       # a read-only run, a full disk: no traceback
        print(f"python -m pmll_lab.report_archive: cannot write {a.run_dir} "
              f"({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
