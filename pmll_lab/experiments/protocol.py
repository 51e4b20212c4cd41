"""Check, then time: the protocol every notebook's point functions follow, and the tables read
from their rows.

A point checks each kernel against its float64 reference (tolerances: ``pmll_lab.tolerances``)
and raises ``CheckFailed`` before anything is timed when one of ours fails (``require``); then
it times each launch (``timings``: do_bench, and on a GPU CUDA graph replay) into tidy rows
(``speed_rows``). A peer that raises becomes one failed row of that peer (``peer_call``).
Tables: ``timed`` / ``wide`` (checked rows, one timer, one device kind), ``checks``,
``correctness_table``, ``failed_points``; ``sweep`` runs a notebook's sweep. How a report shows
a table (``table``, ``details``, ``header``): ``table_html``, re-exported here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import pandas as pd

from pmll_lab import bench
from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.bench import copy_bandwidth, throughput_rows, time_cuda_graph, time_launch
from pmll_lab.dist import on_workers  # noqa: F401  (for the notebooks)
from pmll_lab.harness import registry
from pmll_lab.harness.runner import (GPU_TIMERS, base_kernel, best_timer,  # noqa: F401
                                     failed_row, valid_speed_rows)
from pmll_lab.harness.workloads import INT_AXES, int_param  # noqa: F401  (the axis rules)
from pmll_lab.experiments.parameters import (  # noqa: F401  (what the notebooks call P.pick)
    check_points, named, optional, pick, pick_points)
from pmll_lab.experiments.table_html import (  # noqa: F401  (the notebooks' table helpers)
    COLUMN_LABELS, UNIT_SUFFIXES, details, header, labelled, table)
from pmll_lab.sweep import CheckFailed, grid, run_sweep

TIMER_LABELS = {"cuda_graph": "CUDA graph replay, median (GPU time)",
                "do_bench": "do_bench, median (host launch included)",
                "cuda_events": "CUDA events (GPU time)",
                "interpreter-wall": "Triton interpreter wall time, not GPU speed"}
LAYOUT_NAMES = {"kv": "K-major", "vk": "V-major"}
LAYOUTS = tuple(LAYOUT_NAMES)
PLAN_SUFFIX = ":plan"
"""Kernel-name suffix of a launch plan's rows (arguments bound once, host path lean)."""


# ---- the point side ------------------------------------------------------------------------

AXES = frozenset(INT_AXES) | {
    "alpha", "arch", "baselines", "batch", "capacity", "draft", "drafter", "dtype", "fill",
    "forced_reject", "form", "forms", "gate", "heads", "impl", "layers", "lazy",
    "lazy_min_seqs", "mode", "model", "new_tokens", "p",
    "prompt_len", "providers", "segment", "segments", "shape", "state_dtype",
    "state_layout", "steps", "tokens", "vocab"}
"""Every axis name a notebook's grids may use (the kernels' names, README "Notebook
parameters", and each notebook's own, commented in its parameters cell): a name outside it is a
misspelling, refused before any point runs. Each sweep takes a subset (the ``AXES`` of its
experiment module, passed to ``grid_points``). A new axis is added here and there."""


FRACTION_AXES = ("alpha", "p")
"""Grid axes that hold a probability in [0, 1] (``p`` may also be None: a draft without a
set acceptance)."""

KERNEL_DTYPES = registry.INPUT_DTYPES
"""Input dtypes of the kernels' sweeps (``grid_points(choices={"dtype": KERNEL_DTYPES})``):
float64 is the references' precision, and spec_decode's oracle model dtype only."""

CHOICE_AXES = {"dtype": KERNEL_DTYPES + ("float64",),
               "state_dtype": registry.STATE_DTYPES,
               "state_layout": ("kv", "vk")}
"""Grid axes that take the same names in every notebook, with those names (a misspelt
``"bf16"`` or ``"VK"`` is refused before any point runs, not by every point; ``float64`` is the
model dtype of spec_decode's oracle runs)."""


def axis_values(grid: Mapping, name: str, default=None) -> list:
    """Axis ``name`` of ``grid`` (``default`` when absent) as a list; ``ValueError`` naming it
    when it is a bare string or not a list of values (``"vk"`` would read as ``['v', 'k']``)."""
    values = grid.get(name, default)
    if values is None:
        raise ValueError(f"grids: axis {name} is missing from a grid: {dict(grid)!r}")
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise ValueError(f"grids: axis {name} must be a list of values, got {values!r}")
    return list(values)


def pair_axis(grid: Mapping, name: str) -> list:
    """Axis ``name`` (``heads``) as a list of pairs ``(HK, HV)``; ``ValueError`` naming it for
    a missing axis or an entry that is not a pair."""
    out = axis_values(grid, name)
    for h in out:
        if isinstance(h, (str, bytes)) or not isinstance(h, Iterable) or len(tuple(h)) != 2:
            raise ValueError(f"grids: axis {name} must list (HK, HV) pairs here, got {h!r}")
    return out


def check_axes(grids: Iterable[Mapping], axes: Iterable[str] | None = None) -> None:
    """``ValueError`` naming any axis of ``grids`` outside ``axes`` (default: ``AXES``, every
    notebook's), saying when it is another sweep's; a grid that is not a mapping is refused
    too. ``grid_points`` runs it; a points function that renames axes runs it on the grids as
    written."""
    own = AXES if axes is None else frozenset(axes)
    for g in grids:
        if not isinstance(g, Mapping):
            raise ValueError(f"grids: each grid must be a dict of axes, got {g!r}")
        unknown = sorted(set(g) - own)
        if unknown:
            other = [u for u in unknown if u in AXES]
            raise ValueError(f"grids: unknown axis {', '.join(unknown)} (this sweep's axes: "
                             f"{', '.join(sorted(own))}"
                             + (f"; {', '.join(other)}: another sweep's" if other else "")
                             + ")")


def grid_points(grids: Iterable[Mapping], defaults: Mapping | None = None,
                each: Callable[[dict], dict | None] | None = None, *,
                axes: Iterable[str] | None = None,
                choices: Mapping[str, tuple] | None = None) -> list[dict]:
    """The points of every grid (the product of its axes, ``defaults`` axes where a grid lacks
    them), each passed through ``each`` (None drops it); duplicates dropped, order kept.
    ``axes``: the sweep's own axes (a subset of ``AXES``; default every one), so an axis of
    another notebook is refused rather than ignored and written into the rows; ``choices``:
    the sweep's names for a ``CHOICE_AXES`` axis where they are fewer (``dtype`` without
    ``float64`` outside spec_decode).
    Raises ``ValueError`` naming the axis for a name outside ``axes``, an axis that is not a
    non-empty list of values, a value outside its choices or an ``INT_AXES`` value that is not
    an int at or above its least value, before any point runs."""
    named = {**CHOICE_AXES, **(choices or {})}
    out, seen, merged = [], set(), []
    if isinstance(grids, (str, bytes, Mapping)) or not isinstance(grids, Iterable):
        raise ValueError(f"grids: must be a list of grids (dicts of axes), got "
                         f"{type(grids).__name__} {grids!r}")
    grids = list(grids)
    check_axes(grids, axes)
    for g in grids:
        g = {**(defaults or {}), **g}
        for name, values in g.items():
            if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
                raise ValueError(f"grids: axis {name} must be a list of values, got {values!r}")
            if not list(values):
                raise ValueError(f"grids: axis {name} lists no value (the grid would have no "
                                 f"point)")
            bad = [v for v in values if name in named and v not in named[name]]
            if bad:
                raise ValueError(f"grids: axis {name}: {bad[0]!r} is not one of "
                                 f"{', '.join(named[name])}")
            if name in INT_AXES:
                for v in values:
                    int_param(f"grids: axis {name}", v, INT_AXES[name])
            if name in FRACTION_AXES:
                for v in values:
                    if v is None and name == "p":
                        continue
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                        raise ValueError(f"grids: axis {name}: must be a probability in [0, 1], "
                                         f"got {v!r}")
            if name == "heads":         # (HK, HV) pairs (GDN) or a head count (GPT-2)
                for h in values:
                    if isinstance(h, Iterable) and not isinstance(h, (str, bytes)):
                        h = tuple(h)
                        if len(h) != 2:
                            raise ValueError(f"grids: axis heads must list (HK, HV) pairs or "
                                             f"head counts, got {h!r}")
                        for part, n in zip(("HK", "HV"), h):
                            int_param(f"grids: axis heads, {part}", n, 1)
                    else:
                        int_param("grids: axis heads", h, 1)
        merged.append(g)
    for g in merged:
        for p in grid(**g):
            hk, hv = (p.get("HK"), p.get("HV")) if "heads" not in p or not isinstance(
                p["heads"], (tuple, list)) else p["heads"]
            if hk and hv and hv % hk:
                raise ValueError(f"grids: HV: must be a multiple of HK = {hk}, got {hv}")
            p = each(p) if each else p
            key = None if p is None else tuple(sorted(p.items()))
            if key is not None and key not in seen:
                seen.add(key)
                out.append(p)
    return out


def check_layout(layout: str) -> dict:
    """``{"state_layout": layout}``; ``ValueError`` for a layout outside ``LAYOUTS``."""
    if layout not in LAYOUTS:
        raise ValueError(f"state_layout: must be one of {LAYOUTS}, got {layout!r}")
    return {"state_layout": layout}


def probes(n: int) -> list[int]:
    """The first and last index of ``n``: where a large launch is checked."""
    return sorted({0, n - 1})


def on_cuda() -> bool:
    """Whether kernels run on a GPU (not the Triton interpreter)."""
    return DEVICE.type == "cuda" and not INTERPRET


def one_cpu_thread() -> None:
    """One intra-op thread on the CPU: tiny matrices, shared cores (7x faster measured)."""
    if DEVICE.type == "cpu":
        import torch

        torch.set_num_threads(1)


def timings(fn: Callable[[], object], *, graph: bool = True, warmup_ms: float = 10,
            rep_ms: float = 50, cpu_reps: int = 1, replays: int = 100) -> list[dict]:
    """``do_bench`` of ``fn`` (interpreter wall time on the CPU) and, on a GPU with ``graph``, its
    CUDA graph replay (``replays`` >= 100 individually timed replays). A capture that fails loses
    only the graph figure (``graph_error`` on the other)."""
    return bench.timings(fn, graph=graph and on_cuda(), warmup_ms=warmup_ms, rep_ms=rep_ms,
                         cpu_reps=cpu_reps, replays=replays, launch_timer=time_launch,
                         graph_timer=time_cuda_graph)


def flag(kernel: str, metric: str, ok: bool, what: str) -> dict:
    """A check that holds or not (``value`` 1/0): bitwise equality, a protocol flag."""
    return {"kernel": kernel, "metric": metric, "value": float(ok), "passed": bool(ok),
            "what": what}


def require(rows: Sequence[dict]) -> None:
    """Raise ``CheckFailed`` (carrying ``rows``) when a row failed: before anything is timed."""
    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r.get('what', '')}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", list(rows))


def speed_rows(kernel: str, times: Iterable[dict], nbytes: int | None = None, *,
               flops: float | None = None, **extra) -> list[dict]:
    """Rows of each timing (one timer each): ``time_us`` (p20, p80, replays or graph_error), then
    ``gbps`` over ``nbytes`` (the fewest bytes the launch must move; on a GPU also
    ``roofline_frac`` and the floor time ``floor_us``) or ``tflops`` over ``flops``; ``extra`` on
    every row."""
    roof = copy_bandwidth() if nbytes is not None else None
    rows: list[dict] = []
    for t in times:
        if flops is not None:
            med = float(t["median_us"])
            out = [{"kernel": kernel, "metric": "time_us", "value": med, "p20": t["p20_us"],
                    "p80": t["p80_us"], "unit": "us", "timer": t["timer"]},
                   {"kernel": kernel, "metric": "tflops", "value": flops / (med * 1e-6) / 1e12,
                    "unit": "TFLOP/s", "timer": t["timer"], "flops": flops}]
        else:
            out = throughput_rows(kernel, t, nbytes)
        for r in out:
            r.update(extra)
            if nbytes is not None:
                r["bytes"] = int(nbytes)
            if r["metric"] == "time_us":
                r.update({k: t[k] for k in ("replays", "graph_error") if k in t})
                if roof:
                    r["floor_us"] = nbytes / (roof * 1e3)
        rows += out
    return rows


def mix(t0: list[dict], t1: list[dict], f: float) -> list[dict]:
    """``(1-f)*t0 + f*t1`` per timer found in both (an amortised figure)."""
    other = {t["timer"]: t for t in t1}
    return [dict({k: (1 - f) * float(a[k]) + f * float(other[a["timer"]][k])
                  for k in ("median_us", "p20_us", "p80_us")}, timer=a["timer"])
            for a in t0 if a["timer"] in other]


def peer_call(name: str, fn: Callable, *args, **kwargs):
    """``(fn(*args, **kwargs), None)``, or ``(None, [one failed row of that peer])`` when a
    peer (FLA's, FlashInfer's kernels) raises, our rows kept; an exception of ours passes."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - a peer's failure loses none of our rows
        if not name.startswith(("fla_", "flashinfer_")):
            raise
        return None, [{"kernel": name, "metric": "error", "value": None, "status": "failed",
                       "error": f"{type(exc).__name__}: {exc}"}]


def timed_rows(entries: Iterable[tuple], **timing) -> list[dict]:
    """``speed_rows`` of each ``(name, fn, nbytes, extra)``, timed by ``timings(**timing)``; a
    peer that raises while timed gives its failure row instead."""
    rows: list[dict] = []
    for name, fn, nbytes, extra in entries:
        t, failed = peer_call(name, timings, fn, **timing)
        rows += failed or speed_rows(name, t, nbytes, **extra)
    return rows


# ---- the tables side -----------------------------------------------------------------------

def on_gpu(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds GPU timings."""
    return "timer" in df and bool(df["timer"].isin(GPU_TIMERS).any())


def roofline_gbps(df: pd.DataFrame) -> float | None:
    """The copy bandwidth (GB/s) the rows' roofline fractions were divided by (GPU runs)."""
    if "copy_gbps" not in df:
        return None
    vals = pd.to_numeric(df["copy_gbps"], errors="coerce").dropna()
    return float(vals.iloc[0]) if len(vals) else None


def with_layout(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``state_layout`` ("kv" where missing) and ``state_dtype`` ("float32")."""
    df = df.copy()
    for col, default in (("state_layout", "kv"), ("state_dtype", "float32")):
        df[col] = df[col].fillna(default) if col in df else default
    return df


def timed(df: pd.DataFrame, metric: str = "time_us", timer: str | None = None) -> pd.DataFrame:
    """``harness.runner.valid_speed_rows`` (the one rule for speed rows) with ``state_layout`` and
    ``state_dtype`` filled in (``with_layout``)."""
    return with_layout(valid_speed_rows(df, metric, timer))


def wide(df: pd.DataFrame, timer: str | None = None, *, metric: str = "time_us",
         state_dtype: str | None = None) -> pd.DataFrame:
    """One row per timed (point, kernel): its parameters, ``time_us`` (``metric``'s value), and
    where the rows have them ``gbps`` + ``bytes``, ``roofline_frac``, ``tflops``, and beside a
    CUDA-graph time the do_bench time of the same launch (``do_bench_us``). ``state_dtype``:
    keep the rows of that state dtype only."""
    timer = best_timer(df, metric) if timer is None else timer
    tm = timed(df, metric, timer)
    if tm.empty:
        return pd.DataFrame()
    key = ["point_id", "kernel"]
    out = tm.rename(columns={"value": "time_us"}).drop(columns=["metric"])
    for m in ("gbps", "roofline_frac", "tflops"):
        s = timed(df, m, timer)
        if not s.empty:
            cols = key + ["value"]
            if m == "gbps" and "bytes" in s:
                cols.append("bytes")
                out = out.drop(columns=["bytes"], errors="ignore")
            out = out.merge(s[cols].rename(columns={"value": m}), on=key, how="left")
    if timer == "cuda_graph":
        db = timed(df, metric, "do_bench")
        if not db.empty:
            out = out.merge(db[key + ["value"]].rename(columns={"value": "do_bench_us"}),
                            on=key, how="left")
    if state_dtype is not None:
        out = out[out["state_dtype"] == state_dtype]
    return out.reset_index(drop=True)


def at(df: pd.DataFrame, where: Mapping | None) -> pd.DataFrame:
    """The rows of ``df`` matching ``where``: a value (equal), a list (one of) or a function of
    the column (a boolean mask)."""
    for k, v in (where or {}).items():
        if k not in df:
            return df.iloc[0:0]
        if callable(v):
            df = df[v(df[k])]
        elif isinstance(v, (list, tuple, set)):
            df = df[df[k].isin(list(v))]
        else:
            df = df[df[k] == v]
    return df


def main_shape(df: pd.DataFrame, keys: Sequence[str], prefer: Mapping | None = None) -> dict:
    """``prefer`` if the timed rows hold it, else the values of ``keys`` with the most timed
    rows: the shape the speed plots and tables show."""
    t = timed(df)
    if t.empty or not set(keys) <= set(t.columns):
        return {}
    if prefer and not at(t, prefer).empty:
        return dict(prefer)
    return dict(zip(keys, t.groupby(list(keys)).size().idxmax()))


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[^/\s'\"]+)+/([^/\s'\"]+)")


def error_line(text: object) -> str:
    """The message of an error, without its traceback or machine paths (a path becomes its file
    name), at most 300 characters."""
    if not isinstance(text, str) or not text.strip():
        return ""
    head = text.split("Traceback (most recent call last)")[0]
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()] or \
        [ln.strip() for ln in text.splitlines() if ln.strip()][-1:]
    line = _PATH.sub(r"\1", lines[0] if lines else "")
    return line if len(line) <= 300 else line[:297] + "..."


def failed_points(df: pd.DataFrame, params: Sequence[str]) -> pd.DataFrame:
    """One line per failed point or failed implementation: the ``params`` columns present, the
    kernel (``*``: the whole point, where no row of it is ok and more than one kernel failed)
    and the error's message (``error_line``)."""
    if df.empty or "status" not in df:
        return pd.DataFrame()
    bad = df[df["status"] == "failed"]
    cols = [c for c in (*params, "kernel") if c in bad]
    out = bad[cols].assign(error=bad["error"].map(error_line) if "error" in bad else "")
    if "point_id" in bad and "kernel" in bad:    # nothing of the point ran: one line for it
        ran = set(df.loc[df["status"] == "ok", "point_id"])
        whole = (bad.groupby("point_id")["kernel"].transform("nunique") > 1) \
            & ~bad["point_id"].isin(ran)
        out.loc[whole.to_numpy(), "kernel"] = "*"
    return out.dropna(axis=1, how="all").drop_duplicates().reset_index(drop=True)


def not_run(df: pd.DataFrame) -> pd.DataFrame:
    """One line per kernel and reason for the rows marked ``unsupported`` (a shape, dtype or
    layout it does not take) or ``unavailable`` (not installed, GPU only): the kernel, the
    status, the reason (the first of ``reason``, ``error``, ``note`` that the row fills) and
    how many points."""
    if df.empty or "status" not in df:
        return pd.DataFrame()
    rows = df[df["status"].isin(("unsupported", "unavailable"))]
    if rows.empty:
        return pd.DataFrame()
    why = pd.Series("", index=rows.index)
    for col in ("note", "error", "reason"):          # the last filled one named here wins
        if col in rows:
            filled = rows[col].notna() & (rows[col].astype(str) != "")
            why = why.where(~filled, rows[col].astype(str))
    rows = rows.assign(reason=why.map(error_line),
                       kernel=rows["kernel"].fillna("*") if "kernel" in rows else "*")
    grouped = rows.groupby(["kernel", "status", "reason"], sort=False)
    out = grouped["point_id"].nunique() if "point_id" in rows else grouped.size()
    return out.rename("points").reset_index()


def point_failures(df: pd.DataFrame) -> tuple[int, pd.DataFrame]:
    """``(points that failed as a whole, failed rows of single kernels inside points that ran:
    a peer that raised, or an implementation that failed its check or raised)``."""
    if df.empty or "status" not in df:
        return 0, pd.DataFrame()
    bad = df["status"] == "failed"
    whole = bad.groupby(df["point_id"]).all()
    return int(whole.sum()), df[bad & ~df["point_id"].map(whole)]


def checks(df: pd.DataFrame, by: Sequence[str] = ("kernel",)) -> pd.DataFrame:
    """Per kernel (``by``; launch plans and timing variants count with their kernel): checks
    passed of run, points, the worst rel_l2 against its reference with its tolerance, and
    ``status``: passed / failed. Empty without check rows."""
    if df.empty or "passed" not in df:
        return pd.DataFrame()
    c = df[df["passed"].notna() & (df["metric"] != "max_abs")].copy()
    if c.empty:
        return pd.DataFrame()
    c["kernel"] = base_kernel(c["kernel"])
    c["passed"] = c["passed"].astype(bool)
    by = [b for b in by if b in c]
    out = c.groupby(by, sort=False).agg(passed=("passed", "sum"), checks=("passed", "size"),
                                        points=("point_id", "nunique"))
    worst = _worst_errors(c, by)
    if worst is not None:
        out = out.join(worst[["value", "tolerance", "what"]].rename(
            columns={"value": "worst_rel_l2", "what": "worst_of"}))
    out.insert(0, "status", ["passed" if p == n else "failed"
                             for p, n in zip(out["passed"], out["checks"])])
    return out.reset_index()


def correctness_table(df: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Every check: per ``by`` columns, kernel, check and compared quantity, points, passed, and
    the worst rel_l2 with its tolerance (empty for flags)."""
    if df.empty or "passed" not in df:
        return pd.DataFrame()
    c = with_layout(df[df["passed"].notna() & (df["metric"] != "max_abs")])
    c = c.assign(what=c["what"].fillna("") if "what" in c else "",
                 passed=c["passed"].astype(bool), check=c["metric"])
    keys = [k for k in by if k in c] + ["kernel", "check", "what"]
    out = c.groupby(keys).agg(points=("point_id", "nunique"), passed=("passed", "sum"),
                              checks=("passed", "size")).reset_index()
    worst = _worst_errors(c, keys)
    if worst is not None:
        cols = ["value", "tolerance"] + (["dtype"] if "dtype" in worst else [])
        out = out.join(worst[cols].rename(columns={"value": "worst_rel_l2",
                                                   "dtype": "worst_at_dtype"}), on=keys)
    return out


def _worst_errors(c: pd.DataFrame, keys: list[str]) -> pd.DataFrame | None:
    """Per ``keys``, the rel_l2 row nearest its own tolerance (value / tolerance, largest; a
    nonzero error against a zero tolerance first): a group's value and tolerance come from one
    row, so rows of different input dtypes (and tolerances) are not mixed; a NaN error (a
    kernel that wrote NaN, one that raised) first. None without rel_l2 rows.""" 
    err = c[c["metric"] == "rel_l2"].reset_index(drop=True)
    if err.empty:
        return None
    if "tolerance" not in err:
        err["tolerance"] = float("nan")
    v, tol = err["value"].astype(float), err["tolerance"].astype(float)
    err["margin"] = (v / tol.where(tol > 0)).fillna((v > 0).astype(float) * 1e300)
    err.loc[v.isna(), "margin"] = float("inf")        # a NaN error is the worst there is
    return err.loc[err.groupby(keys, sort=False)["margin"].idxmax()].set_index(keys)


def sweep(name: str, points: list[dict], point_fn: Callable, *, results_dir, client=None,
          affinity=None) -> pd.DataFrame:
    """``run_sweep``: a progress bar in a Lab session, silent inside a report (the HTML shows
    the answer, not the sweep's log)."""
    quiet = bool(os.environ.get("PMLL_LAB_REPORT"))
    return run_sweep(name, points, point_fn, results_dir=results_dir, client=client,
                     affinity=affinity, progress=not quiet)
