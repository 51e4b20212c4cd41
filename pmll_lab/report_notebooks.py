"""Running one notebook of a report: the kernels' environment, papermill, nbconvert.

What ``pmll_lab.report.build_report`` does for each notebook: the environment the notebook
kernels inherit (``kernel_environment``: device, ``PYTHONPATH``, a ``python3`` kernelspec for
this Python), the check that it can start ``pmll_lab`` (``probe_environment``), the run itself
(``run_notebook``: papermill, then ``render_html`` with nbconvert, then ``results_placement``) and
the manifest entry it returns. ``ReportError``, the error of every part of the builder, is
defined here (the lowest layer); ``pmll_lab.report`` re-exports every name. The run folder's
layout and the parameters a notebook gets: ``pmll_lab.report``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import html
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

KERNEL_NAME = "python3"
REPO_ROOT = Path(__file__).resolve().parent.parent
"""The folder holding the ``pmll_lab`` package: put on the kernels' ``PYTHONPATH``."""


class ReportError(RuntimeError):
    """A report could not be started (bad notebook name, device not available...)."""


def _quiet_kernel_manager():
    """The kernel manager papermill runs each notebook's kernel with: jupyter_client's own,
    except that shutting a kernel down sends no SIGINT first.

    Why: ``AsyncKernelManager.shutdown_kernel`` interrupts the kernel before it asks it to shut
    down; a kernel still inside a message handler then logs ``[IPKernelApp] ERROR |
    KeyboardInterrupt caught in kernel.`` under a notebook that ran to its end. By then every
    cell has run (or failed, or timed out), so nothing is left to interrupt: the shutdown request
    follows, and a kernel that does not stop is killed as before."""
    from jupyter_client.manager import AsyncKernelManager

    class QuietShutdownKernelManager(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:
            if self.shutting_down:
                return
            await super()._async_interrupt_kernel()

    return QuietShutdownKernelManager


def utc_now() -> str:
    """The time now, UTC, ISO 8601 to the second (the manifest's timestamps)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def kernel_environment(device: str, keep_other_commits: bool = False
                        ) -> Iterator[dict[str, str]]:
    """Environment the notebook kernels inherit while the report runs (restored afterwards).

    - ``PMLL_LAB_DEVICE=device`` for ``pmll_lab.backend``; ``TRITON_INTERPRET`` dropped when the
      GPU is asked for (the builder's own import may have set it).
    - ``PMLL_LAB_REPORT=1``: sweeps draw no progress bar (``pmll_lab.sweep``).
    - ``PMLL_LAB_KEEP_OTHER_COMMITS``: ``1`` with ``keep_other_commits``, else ``0`` (a value
      left in the caller's shell does not decide it): whether resumed sweeps reuse points
      stored at another commit (``pmll_lab.sweep.run_sweep``).
    - ``MPLBACKEND`` unset, so that figures are inline outputs of the notebook.
    - ``PYTHONPATH`` starts with this checkout, so the notebooks import this ``pmll_lab``.
    - ``JUPYTER_PATH`` starts with a throwaway folder holding a ``python3`` kernelspec that runs
      ``sys.executable``: a ``python3`` kernelspec registered for another environment (user-level
      specs win over the virtualenv's own) must not run the notebooks.
    """
    saved = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="pmll_lab-kernels-") as tmp:
        spec_dir = Path(tmp, "kernels", KERNEL_NAME)
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     "--IPKernelApp.log_level=ERROR"],
            "display_name": "Python 3 (pmll_lab)",
            "language": "python",
            "metadata": {"debugger": False},
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
        os.environ["PMLL_LAB_DEVICE"] = device
        os.environ["PMLL_LAB_REPORT"] = "1"  # sweeps print a summary line instead of a bar
        os.environ["PMLL_LAB_KEEP_OTHER_COMMITS"] = "1" if keep_other_commits else "0"
        # ipykernel makes figures inline outputs only when MPLBACKEND is unset (CI often sets
        # Agg): with it set, plt.show() would leave every plot out of the report.
        os.environ.pop("MPLBACKEND", None)
        if device == "cuda":
            os.environ.pop("TRITON_INTERPRET", None)
        for var, first in (("PYTHONPATH", str(REPO_ROOT)), ("JUPYTER_PATH", tmp)):
            rest = os.environ.get(var)
            os.environ[var] = first + (os.pathsep + rest if rest else "")
        # The debugger's warning about frozen modules would land in every kernel's log.
        os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        try:
            yield dict(os.environ)
        finally:
            os.environ.clear()
            os.environ.update(saved)


def probe_environment(env: dict[str, str]) -> dict[str, str]:
    """Device name, backend, versions and commit as a notebook kernel started with ``env`` sees
    them (``pmll_lab.results.provenance()`` run in a child Python). Raises ``ReportError`` if
    that fails, e.g. ``device="cuda"`` on a machine without CUDA."""
    code = "import json, pmll_lab.results as r; print(json.dumps(r.provenance()))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ReportError(f"device {env.get('PMLL_LAB_DEVICE')!r}: the kernel environment "
                          f"cannot start pmll_lab: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _short_error(exc: BaseException) -> str:
    """One readable line for a failed notebook (papermill errors carry ename/evalue)."""
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= 500 else text[:497] + "..."


def _ensure_nbconvert_templates() -> None:
    """Make nbconvert find its own templates wherever the package was installed.

    nbconvert looks for them under ``<prefix>/share/jupyter`` and ``JUPYTER_PATH``; when it was
    installed with ``pip --target DIR`` (the H200 wheel flow) they sit in ``DIR/share/jupyter``,
    which it misses unless ``JUPYTER_PATH`` names it (seen on the H200, 2026-11-29: "No template
    sub-directory with name 'lab' found"). Walk up from the package, and add the folder found to
    ``JUPYTER_PATH`` for this process when it is not already searched.
    """
    import nbconvert
    from jupyter_core.paths import jupyter_path

    for parent in Path(nbconvert.__file__).resolve().parents:
        share = parent / "share" / "jupyter"
        if (share / "nbconvert" / "templates").is_dir():
            searched = {str(Path(p).resolve()) for p in jupyter_path()}
            if str(share.resolve()) not in searched:
                rest = os.environ.get("JUPYTER_PATH")
                os.environ["JUPYTER_PATH"] = str(share) + (os.pathsep + rest if rest else "")
            return


_IMAGE_TYPES = ("image/png", "image/jpeg")


def image_alts(nb) -> dict[str, str]:
    """Alt text per image output of ``nb`` (an nbformat notebook), keyed by the image's base64
    data without whitespace: the output's ``metadata[<mime>]["alt"]``, else its cell's
    ``metadata["alt"]`` (the convention nbconvert's classic template reads; its lab template,
    the one rendered here, reads neither). Images without one are left out."""
    alts = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            for mime in _IMAGE_TYPES:
                data = out.get("data", {}).get(mime)
                if not isinstance(data, str):
                    continue
                alt = (out.get("metadata", {}).get(mime) or {}).get("alt") or \
                    cell.get("metadata", {}).get("alt")
                if alt:
                    alts["".join(data.split())] = str(alt)
    return alts


def with_alts(body: str, alts: dict[str, str]) -> str:
    """``body`` with each inline image whose data ``alts`` holds given that alt text (nbconvert
    has put a placeholder on every image without one)."""
    if not alts:
        return body
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(body, features="html.parser")
    for img in soup.find_all("img"):
        src = img.get("src", "")
        if src.startswith("data:image/") and "," in src:
            alt = alts.get("".join(src.split(",", 1)[1].split()))
            if alt:
                img["alt"] = alt
    return str(soup)


def render_html(executed: Path, target: Path, *, failure: str | None = None,
                title: str = "FAILED", note: str | None = None) -> None:
    """Render an executed notebook to HTML without input cells (nbconvert ``HTMLExporter``,
    ``exclude_input=True``). A notebook that failed or was stopped (``failure``: why) gets a
    banner cell on top, ``title`` then the reason; ``note`` (e.g. ``other_commits_text``) goes
    on top as a framed paragraph; a plot gets its cell's ``alt`` metadata as its alt text
    (``image_alts``)."""
    import nbformat
    from nbconvert import HTMLExporter

    _ensure_nbconvert_templates()
    nb = nbformat.read(executed, as_version=4)
    if note:
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(
            "<div style='border:2px solid #a60;padding:0.6em;color:#630'>"
            f"{html.escape(note)}</div>"))
    if failure is not None:
        banner = nbformat.v4.new_markdown_cell(
            "<div style='border:2px solid #c00;padding:0.6em;color:#c00'>"
            f"<b>{html.escape(title)}</b> while running this notebook: {html.escape(failure)}. "
            "The outputs below stop where it ended.</div>")
        nb.cells.insert(0, banner)
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": executed.stem}})
    target.write_text(with_alts(body, image_alts(nb)), encoding="utf-8")


def run_notebook(src: Path, run_dir: Path, *, preset: str, device: str, resume: bool,
                 cell_timeout: float | None, env_info: dict, log: Callable[[str], None],
                 scheduler: str | None = None, params: dict | None = None) -> dict:
    import papermill

    name = src.stem
    out_nb, out_html = run_dir / f"{name}.ipynb", run_dir / f"{name}.html"
    results = run_dir / "results" / name
    for stale in (out_nb, out_html):
        stale.unlink(missing_ok=True)
    if results.exists() and not resume:
        shutil.rmtree(results)
    results.mkdir(parents=True, exist_ok=True)
    entry = {"name": name, "source": str(src), "status": "ok", "error": "",
             "started_utc": utc_now(), "preset": preset, "device_requested": device,
             "device": env_info.get("device", ""), "commit": env_info.get("commit", "")}
    t0 = time.perf_counter()
    parameters = {**(params or {}), "preset": preset, "device": device,
                  "results_dir": str(results.resolve())}
    if params:
        entry["params"] = dict(params)
    if scheduler:
        parameters["scheduler"] = scheduler
    try:
        papermill.execute_notebook(
            str(src), str(out_nb),
            parameters=parameters,
            kernel_name=KERNEL_NAME, language="python", cwd=str(src.parent.resolve()),
            progress_bar=False, log_output=False, execution_timeout=cell_timeout,
            kernel_manager_class=_quiet_kernel_manager(),
        )
    except KeyboardInterrupt:       # Ctrl-C or SIGTERM: recorded, then the report stops
        entry["status"] = "interrupted"
        entry["error"] = (f"stopped by an interrupt after {time.perf_counter() - t0:.0f} s; "
                          "the notebooks after it did not run")
    except Exception as exc:  # noqa: BLE001 - a failed notebook must not stop the others
        entry["status"], entry["error"] = "failed", _short_error(exc)
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    entry["other_commits"], total = other_commits(results, entry["commit"])
    if out_nb.exists():
        try:
            render_html(out_nb, out_html,
                        failure=entry["error"] if entry["status"] != "ok" else None,
                        title="STOPPED" if entry["status"] == "interrupted" else "FAILED",
                        note=other_commits_text(entry["other_commits"], total,
                                                entry["commit"]))
        except KeyboardInterrupt:     # stopped while rendering: the entry still says so
            out_html.unlink(missing_ok=True)
            entry["status"] = "interrupted"
            entry["error"] = (entry["error"] + "; " if entry["error"] else "") + \
                "stopped by an interrupt while its HTML was rendered (the executed notebook " \
                "and the stored results are kept)"
        except Exception as exc:  # noqa: BLE001
            entry["status"] = "failed"
            entry["error"] = (entry["error"] + "; " if entry["error"] else "") + \
                f"rendering HTML: {_short_error(exc)}"
    entry["ipynb"] = out_nb.name if out_nb.exists() else None
    entry["html"] = out_html.name if out_html.exists() else None
    entry["results"] = sorted(p.relative_to(run_dir).as_posix()
                              for p in results.rglob("*")
                              if p.is_file() and not p.name.startswith("."))
    entry["ran_on"] = results_placement(results)
    lost = sweeps_all_failed(results)
    if lost and entry["status"] == "ok":
        entry["status"], entry["error"] = "failed", lost
    entry["failed_points"], entry["points"] = failed_points(results)
    some = (f" ({entry['failed_points']} of {entry['points']} sweep points had a failed check or "
            "kernel: see the notebook's correctness section)" if entry["failed_points"] else "")
    said = {"ok": "ok", "interrupted": "STOPPED"}.get(entry["status"], "FAILED")
    log(f"  {name}: {said} in {entry['seconds']:.0f} s"
        + some + (f" -- {entry['error']}" if entry["error"] else ""))
    return entry


def _sweep_frames(results: Path) -> Iterator[tuple[str, "object"]]:
    """(sweep name, rows) of every sweep in ``results`` (``*.jsonl`` and, in an archived run,
    ``*.jsonl.gz``: both files of one sweep read as one, ``pmll_lab.results.load``);
    unreadable files are skipped."""
    from pmll_lab.sweep import load

    names = {p.name.removesuffix(".gz") for p in Path(results).glob("*.jsonl.gz")}
    names |= {p.name for p in Path(results).glob("*.jsonl")}
    for fname in sorted(names):
        try:
            df = load(Path(results) / fname)
        except (OSError, ValueError, EOFError):
            continue
        if not df.empty and "point_id" in df:
            yield fname.removesuffix(".jsonl"), _in_last_grid(df, Path(results) / fname)


def _in_last_grid(df, path: Path):
    """The rows of ``df`` whose point the sweep's last run asked for: those in the
    ``<name>.csv`` ``run_sweep`` wrote at its end (a grid changed on a resume leaves points of
    the earlier grid in the ``.jsonl``, not counted); all of them where there is no such CSV
    (an archived run) or it is older than the last rows (a sweep cut off before its end)."""
    import pandas as pd

    csv = path.with_suffix(".csv")
    try:
        if path.is_file() and csv.stat().st_mtime < path.stat().st_mtime:
            return df                          # rows appended after it: a sweep cut short
        ids = pd.read_csv(csv, usecols=["point_id"])["point_id"]
    except (OSError, ValueError):             # none, empty, no point_id column
        return df
    return df[df["point_id"].isin(set(ids))]


def other_commits(results: Path, commit: str) -> tuple[dict[str, int], int]:
    """``({commit: points}, points)``: the sweep points in ``results`` stored at a commit other
    than ``commit`` (kept by a resume with ``--keep-other-commits``, or left from a grid that
    has changed since), per commit, and every point there."""
    counts: dict[str, int] = {}
    total = 0
    for stem, df in _sweep_frames(results):
        first = df.drop_duplicates("point_id")
        total += len(first)
        if "commit" not in first:
            continue
        for c in first["commit"].dropna().astype(str):
            if c != commit:
                counts[c] = counts.get(c, 0) + 1
    return dict(sorted(counts.items())), total


def other_commits_text(counts: dict[str, int] | None, total: int | None, commit: str) -> str:
    """``other_commits`` in words for the notebook's page and the index ("" when none)."""
    if not counts:
        return ""
    n = sum(counts.values())
    which = ", ".join(f"{c} ({k} point{'s' if k != 1 else ''})" for c, k in counts.items())
    of = f" of {total}" if total else ""
    return (f"{n}{of} sweep point{'s' if n != 1 else ''} are from an earlier call at another "
            f"commit: {which}, kept by a resumed run (--resume --keep-other-commits): they "
            f"measure that commit's code, not this run's ({commit}).")


def failed_points(results: Path) -> tuple[int, int]:
    """``(failed, total)`` sweep points over every sweep in ``results`` (a point counts as failed
    when any of its rows has status failed: one implementation's check, its kernel or a peer
    that raised, though the others ran)."""
    failed = total = 0
    for _, df in _sweep_frames(results):
        if "status" not in df:
            continue
        bad = df.groupby("point_id")["status"].agg(lambda s: (s == "failed").any())
        failed, total = failed + int(bad.sum()), total + len(bad)
    return failed, total


def sweeps_all_failed(results: Path) -> str:
    """A message naming each sweep in ``results`` whose every point failed (with its first
    error), or ``""``: such a notebook ran to its end but measured nothing, so the report marks
    it failed. A point failed when it has failed rows and none ok (an implementation that passed
    beside one that raised measured something). Points that failed among points that ran are
    the notebook's own to report."""
    msgs = []
    for stem, df in _sweep_frames(results):
        status = df.groupby("point_id")["status"].agg(
            lambda s: "failed" if (s == "failed").any() and not (s == "ok").any() else "ran") \
            if "status" in df else None
        if status is None or not (status == "failed").all():
            continue
        err = df.loc[df["status"] == "failed", "error"].dropna().astype(str) if "error" in df \
            else []
        first = next((e.strip().splitlines()[-1] for e in err if e.strip()), "no error text")
        msgs.append(f"every point of sweep {stem} failed ({len(status)} points; first error: "
                    f"{first})")
    return "; ".join(msgs)


def results_placement(results: Path) -> dict:
    """Who ran the sweeps whose rows lie in ``results`` (``*.jsonl``, or ``*.jsonl.gz`` in an
    archived run): ``workers`` and
    ``gpus`` (distinct, over all its sweeps), ``devices`` (points per device kind) and
    ``in_process`` (True when no row came from a Dask worker); ``pmll_lab.sweep.placement``."""
    import pandas as pd

    from pmll_lab.sweep import IN_PROCESS, placement

    frames = [df.assign(point_id=stem + ":" + df["point_id"].astype(str))
              for stem, df in _sweep_frames(results)]
    if not frames:
        return {"workers": 0, "gpus": 0, "devices": {}, "in_process": True}
    df = pd.concat(frames, ignore_index=True)
    out = placement(df)
    out["in_process"] = "worker" not in df or set(df["worker"].fillna(IN_PROCESS)) == {IN_PROCESS}
    return out
