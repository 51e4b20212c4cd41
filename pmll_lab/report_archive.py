"""Keep a finished run small enough to commit: the results as gzipped JSON lines, no executed
notebooks, and the rendered HTML only for the newest run of each notebook (reports/README.md).

Why: every call to the GPU machine carries the working tree (64 MiB in all, FlashInfer's parts
included), so the committed reports must stay lean; and a run's index must not link to files
that were pruned. ``archive_run`` prunes a run folder in place and rewrites its
``manifest.json`` and ``index.html`` (``report_index.index_html``) to list what is left.

Usage: ``python -m pmll_lab.report_archive RUN_DIR [--drop-html NB ...] [--note TEXT]``
(``--drop-html``: notebooks whose rendered report a newer run replaces).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
from pathlib import Path

from pmll_lab.report_index import HEADLINE_FILE, index_html
from pmll_lab.results import compact_text


def _gzip(path: Path) -> Path:
    """``<name>.jsonl`` -> ``<name>.jsonl.gz`` (same bytes every time: no time stamp). Where the
    ``.gz`` is already there (a run archived, then resumed), the two are merged: every point
    stored whole in either, once (``results.compact_text``: the later copy where both hold one),
    written to a temporary file and moved over the ``.gz`` before the ``.jsonl`` is deleted,
    so a kill at any moment leaves every point in one of the two files."""
    out = path.with_name(path.name + ".gz")
    if out.is_file():
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
    else:
        with open(path, "rb") as src, open(out, "wb") as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)
    path.unlink()
    return out


def archive_run(run_dir: str | Path, *, drop_html: tuple[str, ...] = (),
                note: str | None = None) -> dict:
    """Prune ``run_dir`` (a run folder with ``manifest.json``) in place: delete every executed
    notebook (``.ipynb``) and every results CSV except ``headline.csv``, gzip every ``.jsonl``
    (merged into the ``.jsonl.gz`` already there, if any: a resumed archived run keeps the
    points of both),
    delete the rendered HTML of the notebooks named in ``drop_html``, and rewrite the manifest's
    file lists and ``index.html`` to match (a file already gone is no longer listed). ``note`` is added to the manifest's notes (shown on
    the index). Idempotent. Returns the new manifest. Raises ``FileNotFoundError`` when
    ``run_dir`` has no ``manifest.json`` and ``ValueError`` naming ``drop_html`` when it names a
    notebook the run does not have."""
    run = Path(run_dir)
    man_path = run / "manifest.json"
    if not man_path.is_file():
        raise FileNotFoundError(f"run_dir: no manifest.json in {run}")
    manifest = json.loads(man_path.read_text(encoding="utf-8"))
    names = {b["name"] for b in manifest.get("notebooks", [])}
    unknown = sorted(set(drop_html) - names)
    if unknown:
        raise ValueError(f"drop_html: {unknown} not among this run's notebooks {sorted(names)}")
    for path in sorted(run.rglob("*.ipynb")):
        path.unlink()
    for path in sorted(run.rglob("results/**/*.csv")):
        if path.name != HEADLINE_FILE:
            path.unlink()
    for path in sorted(run.rglob("results/**/*.jsonl")):
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
    man_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    (run / "index.html").write_text(index_html(manifest, run_dir=run), encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pmll_lab.report_archive",
                                 description="Prune a finished report run for committing.")
    ap.add_argument("run_dir")
    ap.add_argument("--drop-html", nargs="*", default=[],
                    help="notebooks whose rendered HTML a newer run replaces")
    ap.add_argument("--note", default=None, help="a provenance note for the run's index")
    a = ap.parse_args(argv)
    try:
        archive_run(a.run_dir, drop_html=tuple(a.drop_html), note=a.note)
    except (FileNotFoundError, ValueError) as exc:
        ap.error(str(exc))                       # names the argument, exit status 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
