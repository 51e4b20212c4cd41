"""Command line: ``python -m pmll_lab report ...`` (see ``pmll_lab.report``).

    python -m pmll_lab report --preset quick|full --device auto|cpu|cuda [--only NAME ...]
                              [--run NAME] [--resume [--keep-other-commits]]
                              [--cell-timeout SECONDS] [--replace] [--param NAME=VALUE ...]
                              [--workers N | --scheduler ADDRESS]
                              [--notebooks-dir DIR] [--reports-dir DIR]

``--workers N`` runs the notebooks' sweeps on a Dask LocalCluster started for the report: one
worker per visible GPU (the first N, each pinned with CUDA_VISIBLE_DEVICES, one thread), or N CPU
workers with ``--device cpu`` or without GPUs. ``--scheduler ADDRESS`` runs them on a running Dask
cluster. Without either, each notebook runs its sweeps in its own process.

Exit status: 0 when every notebook ran, 1 when one failed (the others still ran and the index
marks it), 2 when the report could not start (unknown notebook, device not available...), 130
when Ctrl-C or SIGTERM stopped it (the index names the notebook stopped and those not run).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

from pmll_lab.report import DEVICES, PRESETS, ReportError, build_report


def _positive(kind):
    """An argparse type: ``kind`` of the text, finite and > 0 (so the error names the flag)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pmll_lab",
                                     description="pmll_lab workbench commands")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="run the notebooks with papermill and write an HTML report",
                         description="Run notebooks/*.ipynb with papermill (parameters preset, "
                         "device, results_dir), render them to HTML and write "
                         "reports/<run>/index.html and manifest.json.")
    rep.add_argument("--preset", choices=PRESETS, default="quick",
                     help="sweep grids: quick (minutes on a CPU) or full (the GPU grids)")
    rep.add_argument("--device", choices=DEVICES, default="auto",
                     help="where kernels run: sets PMLL_LAB_DEVICE for the notebook kernels")
    rep.add_argument("--only", nargs="+", action="extend", metavar="NAME", default=[],
                     help="run only these notebooks (file stems, e.g. pmll_ring)")
    rep.add_argument("--run", default="latest",
                     help="run folder under reports/ (default latest, git-ignored); "
                     "e.g. h200-2026-11-29 for a run to commit")
    rep.add_argument("--resume", action="store_true",
                     help="keep the notebooks' earlier results so sweeps skip the points done "
                     "(points stored at another commit run again, unless --keep-other-commits)")
    rep.add_argument("--keep-other-commits", action="store_true",
                     help="with --resume: reuse stored points of another git commit instead of "
                     "running them again (the pages and the index name their commit)")
    rep.add_argument("--cell-timeout", type=_positive(float), default=None, metavar="SECONDS",
                     help="fail a notebook whose cell runs longer than this (> 0; default: no limit)")
    where = rep.add_mutually_exclusive_group()
    where.add_argument("--workers", type=_positive(int), default=None, metavar="N",
                       help="run the sweeps on a local Dask cluster: one worker per visible GPU "
                       "(up to N), or N CPU workers with --device cpu or without GPUs")
    where.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="run the sweeps on the Dask cluster of this scheduler "
                       "(e.g. tcp://host:8786)")
    rep.add_argument("--notebooks-dir", default="notebooks",
                     help="folder of the notebooks to run (default: notebooks)")
    rep.add_argument("--reports-dir", default="reports",
                     help="folder the run folder is written under (default: reports)")
    rep.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                     help="a notebook parameter beside preset and device (repeatable; VALUE a "
                     "Python literal or else a string), e.g. --only kernels --param "
                     "family=gdn_step --param grids=roofline_step; every notebook run must "
                     "take it")
    rep.add_argument("--replace", action="store_true",
                     help="let this call replace a notebook's results that the run folder holds "
                     "from another device or preset (refused otherwise: a committed GPU run is "
                     "not overwritten by a CPU run by mistake)")
    args = parser.parse_args(argv)
    if args.keep_other_commits and not args.resume:
        rep.error("--keep-other-commits: only with --resume (it keeps stored points of "
                  "another commit)")
    params = {}
    for item in args.param:
        name, eq, value = item.partition("=")
        if not eq or not name.strip().isidentifier():
            rep.error(f"--param: {item!r} is not NAME=VALUE")
        if name.strip() in params:
            rep.error(f"--param: {name.strip()} given twice")
        try:
            params[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            params[name.strip()] = value.strip()          # a string: a workload's name
    plugins = [p for p in os.environ.get("PMLL_LAB_PLUGINS", "").split(os.pathsep) if p]
    if plugins:          # the notebooks run in their own folder: paths from here, made absolute
        missing = [p for p in plugins if not os.path.isfile(p)]
        if missing:
            rep.error(f"PMLL_LAB_PLUGINS: no such file {missing[0]!r} (from {os.getcwd()})")
        os.environ["PMLL_LAB_PLUGINS"] = os.pathsep.join(os.path.abspath(p) for p in plugins)
        from pmll_lab.harness import registry   # loaded here first: a plugin that does not
        try:                                    # load stops the report before any folder or
            registry.load_plugins()             # stored result is touched
        except (ValueError, RuntimeError) as exc:
            rep.error(str(exc))

    try:
        manifest = build_report(preset=args.preset, device=args.device, run=args.run,
                                only=args.only or None, resume=args.resume,
                                keep_other_commits=args.keep_other_commits,
                                cell_timeout=args.cell_timeout,
                                workers=args.workers, scheduler=args.scheduler,
                                notebooks_dir=args.notebooks_dir, reports_dir=args.reports_dir,
                                replace=args.replace, params=params or None,
                                log=lambda msg: print(msg, flush=True))
    except ReportError as exc:
        print(f"pmll_lab report: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"pmll_lab report: stopped ({exc or 'interrupt'}); the index says which notebook "
              f"was stopped: {args.reports_dir}/{args.run}/index.html", file=sys.stderr,
              flush=True)
        return 130
    except OSError as exc:           # a full disk, a read-only run folder: no traceback
        print(f"pmll_lab report: cannot read or write the run ({type(exc).__name__}: {exc}); "
              f"the points stored so far stay in {args.reports_dir}/{args.run}/results/ and "
              f"--resume continues them once it can write", file=sys.stderr, flush=True)
        return 1
    index = f"{args.reports_dir}/{args.run}/index.html"
    failed = [b["name"] for b in manifest["notebooks"]
              if b["status"] != "ok" and not b.get("kept_from_earlier")]
    if failed:
        print(f"FAILED notebook(s): {', '.join(failed)}; report: {index}", flush=True)
        return 1
    print(f"report: {index}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
