"""What a report call checks before it touches a run folder: the notebooks' parameter values
(``check_values``), one call per run folder at a time (``run_lock``), the run's earlier entries
(``previous``) and the results a call may not replace (``refuse_replacing``). Each raises
``ReportError`` naming the argument, so nothing is deleted or rewritten by a call that cannot
run."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

from pmll_lab.report_notebooks import ReportError


def check_values(path: Path, cell, params: Mapping) -> None:
    """For a notebook that checks its parameters (``targets.setup()``), its parameter rules (``experiments.parameters.check_values``: ranges, and a
    workload's name where a sweep parameter is a string) on its parameters cell's values with
    ``params`` over them: ``ReportError`` naming the parameter before the report deletes or
    replaces anything (the notebook would refuse the value only once it ran)."""
    import ast

    from papermill.translators import PythonTranslator

    from pmll_lab.experiments import parameters

    values = {}
    for prm in PythonTranslator.inspect(cell):
        try:
            values[prm.name] = ast.literal_eval(prm.default)
        except (ValueError, SyntaxError):
            continue
    values.update(params)
    try:
        parameters.check_values(values)
    except ValueError as exc:
        raise ReportError(f"params: {path.name}: {exc}") from None


def previous(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """The run's earlier manifest entries, and beside them what guards the results they hold:
    those entries plus the notebook a killed call was running (``running``: a kill, a full disk
    or a crash left no entry of that call for it) with that call's device and preset, and the
    guards of earlier killed calls a later call carried forward (``killed``, ``carried``).
    ``ReportError`` naming ``run`` for a manifest that cannot be read."""
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.exists():
        return [], []
    try:
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
        previous = old["notebooks"]
        if not isinstance(previous, list) or not all(
                isinstance(e, dict) and isinstance(e.get("name"), str) for e in previous):
            raise TypeError("its notebooks are not a list of named entries")
    except (ValueError, KeyError, TypeError) as exc:   # JSON, shape, encoding
        raise ReportError(
            f"run: {manifest_path} cannot be read ({type(exc).__name__}: {exc}); the run's "
            "other notebooks would be left unlisted and unguarded: restore it (git "
            "checkout, for a committed run) or choose another --run") from None
    guard = list(previous) + [dict(g, status="interrupted") for g in old.get("killed") or []
                              if isinstance(g, dict) and isinstance(g.get("name"), str)]
    running = old.get("running")
    if isinstance(running, dict) and isinstance(running.get("name"), str):
        # beside an entry of the same name, both count: the killed call (a --replace, say)
        # wrote its own rows after the entry's
        env = old.get("environment") if isinstance(old.get("environment"), dict) else {}
        guard.append({"name": running["name"], "device": env.get("device", "unknown"),
                      "preset": old.get("preset"), "status": "interrupted"})
    return previous, guard


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """One report at a time per run folder: an exclusive ``flock`` on ``.<run>.lock`` beside
    the run folder (in the reports folder: every call on the run, from any process, user or
    machine that shares the folder, sees it; the kernel drops the lock of a killed process, so
    a kill leaves none held). A call whose run never started removes the lock file and the
    folders it made while it still holds the lock, and a call that locked a file so removed
    takes the new one. ``ReportError`` naming ``run`` while another call holds it: two calls
    would each rewrite the manifest without the other's notebooks."""
    import fcntl
    import os

    run_dir = run_dir.resolve()
    made = [d for d in (run_dir.parent, *run_dir.parent.parents) if not d.exists()]
    path = run_dir.parent / f".{run_dir.name}.lock"
    for _ in range(20):
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReportError(f"reports_dir: cannot make {run_dir.parent}: {exc}") from None
        try:
            fh, mine = open(path, "a+", encoding="utf-8"), True
        except PermissionError:             # another user's lock file: lock it read-only
            fh, mine = open(path, encoding="utf-8"), False
        except FileNotFoundError:           # its folder removed meanwhile: again
            continue
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            fh.close()
            raise ReportError(f"run: another report is writing to {run_dir} (process "
                              f"{holder}); wait for it, or choose another --run") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        fh.close()                          # a file its holder removed: lock the new one
    else:
        raise ReportError(f"run: could not take the lock of {run_dir} ({path})")
    with fh:
        if mine:                            # the holder's pid, for the message above
            fh.seek(0)
            fh.truncate()
            fh.write(str(os.getpid()))
            fh.flush()
        try:
            yield
        finally:
            if not run_dir.exists():        # its run never started: leave nothing behind
                path.unlink(missing_ok=True)
                for d in made:
                    with contextlib.suppress(OSError):
                        d.rmdir()
            elif mine:
                fh.seek(0)
                fh.truncate()
            fcntl.flock(fh, fcntl.LOCK_UN)


def refuse_replacing(run_dir: Path, previous: list[dict], plan: list[str], env_info: dict,
                      preset: str, resume: bool) -> None:
    """``ReportError`` naming ``run`` when a notebook of ``plan`` has stored results in
    ``run_dir`` that its earlier manifest entry says came from another device (or, without
    ``resume``, another preset): this call would delete them, or resume them with rows of
    another device; likewise when any other notebook of the run is another device's (the run
    would mix devices and its index be rewritten around them); and, without ``resume``, when a
    notebook of ``plan`` has stored results that no entry describes."""
    device = env_info.get("device", "")
    for e in previous:
        name = e.get("name")
        results = run_dir / "results" / str(name)
        if not results.is_dir() or not any(results.iterdir()):
            continue
        if name not in plan:          # another notebook of the run: only its device matters
            if e.get("device") not in (None, device):
                raise ReportError(
                    f"run: {run_dir.name!r} holds {name}'s results from device "
                    f"{e.get('device')!r}; this call on device {device!r} would make the run "
                    "mix devices (and rewrite its index). Choose another --run, or pass "
                    "--replace (build_report(replace=True))")
            continue
        other = [f"device {e.get('device')!r}" for _ in [0] if e.get("device") != device]
        if not resume and e.get("preset") != preset:
            other.append(f"preset {e.get('preset')!r}")
        if other:
            doing = "resume them with rows of" if resume else "replace them with those of"
            raise ReportError(
                f"run: {run_dir.name!r} holds {name}'s results from {' and '.join(other)}; this "
                f"call would {doing} device {device!r}, preset {preset!r}. Choose another "
                f"--run, or pass --replace (build_report(replace=True)) to replace them")
    known = {e.get("name") for e in previous}
    for name in plan:
        results = run_dir / "results" / name
        if not resume and name not in known and results.is_dir() and any(results.iterdir()):
            raise ReportError(
                f"run: {run_dir.name!r} holds {name}'s results with no record of their device "
                f"and preset (the run's manifest does not list them); this call would delete "
                f"them. Pass --resume to continue them, choose another --run, or pass --replace "
                f"(build_report(replace=True)) to replace them")


def carried(guarded: list[dict], plan: list[str]) -> list[dict]:
    """The guards of killed calls (``previous``) on notebooks this call does not run: its
    manifest keeps them (``killed``) until a call runs those notebooks again, so a call on
    another notebook does not drop them."""
    return [{k: g.get(k) for k in ("name", "device", "preset")} for g in guarded
            if g.get("status") == "interrupted" and g["name"] not in plan]
