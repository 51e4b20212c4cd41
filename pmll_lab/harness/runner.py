"""One runner for every registered implementation: check, then time, then rows of one schema.

``run_point(family, point, names)`` builds the family's case from one workload row, and for
each implementation: an ``unsupported`` row where it cannot run here or does not take the case
(the reason in ``note``); else its check against the family's float64 reference (and, for an
exact implementation, bitwise against plain decoding) as rows; only if every check passed, its
timings: a CUDA graph of the timed unit (GPU time; the graph is first shown to rewrite its
outputs and advance its cursors, ``replay_guard``) beside ``do_bench`` (host launch included),
each stating its L2 state, with bytes, GB/s and the fraction of the copy ceiling from the
implementation's byte formula. ``valid_speed_rows`` is the one rule for which rows a table or
plot may show as speed.

Row columns: the implementation's (``kernel``, ``impl``, ``provider``, ``exact``,
``peer_version``), the case's (``state_layout``), ``status`` (``ok``, ``failed``,
``unsupported``), ``metric``, ``value``, ``unit``, and per metric ``what``, ``tolerance``,
``passed``, ``timer``, ``l2``, ``p20``, ``p80``, ``bytes``, ``error``, ``note``; the sweep adds
the point's parameters and provenance (device, versions, commit, switches).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping

import pandas as pd
import torch

from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.bench import copy_bandwidth, time_cuda_graph, time_launch
from pmll_lab.harness import registry
from pmll_lab.harness.workloads import INT_AXES, int_param

TIMERS = ("cuda_graph", "do_bench", "cuda_events", "interpreter-wall")
"""Timers in order of preference: a table or plot shows the first one its rows have."""
GPU_TIMERS = ("cuda_graph", "do_bench", "cuda_events")
GRAPH_REPLAYS = 100
LAUNCH_TIMING = dict(warmup_ms=10, rep_ms=50, cpu_reps=1)


def on_gpu() -> bool:
    """Whether kernels run on a GPU (not the Triton interpreter): only then is anything timed."""
    return DEVICE.type == "cuda" and not INTERPRET


def failed_row(base: Mapping, metric: str, exc: BaseException, **extra) -> dict:
    """An implementation that raised, as one failed row (NaN value, the error's first 300
    characters)."""
    return dict(base, metric=metric, **extra, value=float("nan"), status="failed",
                error=f"{type(exc).__name__}: {exc}"[:300])


def replay_guard(run) -> callable:
    """A ``bench.time_cuda_graph`` guard for ``run`` (``outputs()``, ``cursors()``): before the
    timed replays, poison every float output with NaN, replay once, and require every output
    finite again (the graph rewrote it) and, where the run names what it advances (cursors, its
    state pool), at least one of them changed (the captured steps ran: a ring whose cursor and
    state never move times no commit and no fold).
    The float ones (state pools) are first halved: after the warm-up runs a state fed the same
    steps again can sit at a periodic fixed point, which a replay maps onto itself (seen at
    B = 1, where every slot's cursors also cycle); from the halved state the steps must move
    it. Halving changes no cursor and no launch, only values the timing does not depend on.
    Raises ``RuntimeError`` saying which; returns ``{"outputs_rewritten": n, "cursors_advanced":
    True/None}``."""
    def guard(replay):
        outs = [o for o in run.outputs() if o is not None and o.is_floating_point()]
        for o in outs:
            o.fill_(float("nan"))
        for c in run.cursors():
            if c.is_floating_point():
                c.mul_(0.5)
        before = [c.clone() for c in run.cursors()]
        replay()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        stale = [i for i, o in enumerate(outs) if not bool(torch.isfinite(o).all())]
        if not outs or stale:
            raise RuntimeError(f"the captured graph did not rewrite output(s) {stale or 'none'}: "
                               "its timing would be of other work")
        moved = None
        if before:
            moved = any(not torch.equal(b, c) for b, c in zip(before, run.cursors()))
            if not moved:
                raise RuntimeError("the captured steps advanced neither cursor nor state")
        return {"outputs_rewritten": len(outs), "cursors_advanced": moved}
    return guard


def timings(run, units: int = 1) -> list[dict]:
    """GPU timings of ``run.run`` per unit (``units`` steps per call): the guarded CUDA graph
    replay and ``do_bench``. Empty on the CPU (interpreter wall times say nothing of a GPU).
    A capture that fails loses only the graph figure (its error on the do_bench row)."""
    if not on_gpu():
        return []
    out = []
    t = dict(time_launch(run.run, **LAUNCH_TIMING))
    try:
        g = time_cuda_graph(run.run, replays=GRAPH_REPLAYS, guard=replay_guard(run))
    except Exception as exc:  # noqa: BLE001 - the do_bench figure stands on its own
        torch.cuda.synchronize()
        t["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
    else:
        out.append(g)
    out.append(t)
    for x in out:
        for k in ("median_us", "p20_us", "p80_us"):
            x[k] = float(x[k]) / units
    return out


def time_rows(base: Mapping, metric: str, times: Iterable[dict], nbytes: int | None) -> list[dict]:
    """Rows of each timing: ``metric`` (µs, p20, p80, timer, l2 and the guard's proof), then
    ``gbps`` over ``nbytes`` and its ``roofline_frac`` of the measured copy bandwidth."""
    roof = copy_bandwidth() if nbytes else None
    rows = []
    for t in times:
        extra = {k: t[k] for k in ("l2", "replays", "graph_error", "outputs_rewritten",
                                   "cursors_advanced") if k in t}
        med = float(t["median_us"])
        rows.append(dict(base, metric=metric, value=med, p20=t["p20_us"], p80=t["p80_us"],
                         unit="us", timer=t["timer"], status="ok", bytes=nbytes, **extra))
        if nbytes:
            gbps = nbytes / (med * 1e-6) / 1e9
            rows.append(dict(base, metric="gbps", value=gbps, unit="GB/s", timer=t["timer"],
                             status="ok", bytes=nbytes))
            if roof:
                rows.append(dict(base, metric="roofline_frac", value=gbps / roof,
                                 unit="fraction", timer=t["timer"], status="ok",
                                 copy_gbps=roof))
    return rows


def check_rows(base: Mapping, chk: Mapping) -> list[dict]:
    """The check's rows: ``rel_l2`` per compared quantity (``what``) with its tolerance (one
    number, or one per quantity),
    ``bitwise`` per exact comparison (1/0), and the counted facts (fold fraction, fill, cursor
    audit)."""
    status = "ok" if chk["passed"] else "failed"
    tol = chk["tolerance"]
    tol = tol if isinstance(tol, Mapping) else {what: tol for what in chk["errors"]}
    rows = [dict(base, metric="rel_l2", what=what, value=v, tolerance=tol[what],
                 passed=v <= tol[what], status=status)
            for what, v in chk["errors"].items()]
    rows += [dict(base, metric="bitwise", what=what, value=float(ok), passed=bool(ok),
                  status=status) for what, ok in chk.get("bitwise", {}).items()]
    for m, v in chk.get("facts", {}).items():
        row = dict(base, metric=m, value=float(v), status=status)
        if m == "cursor_mismatches":
            row.update(passed=v == 0, what="cursors vs acceptance process")
        rows.append(row)
    return rows


SWEEP_KEYS = ("forms", "fill", "ref_seqs")
"""Point keys a sweep may carry beside a family's axes (the forms it runs, a kernel detail's
ring fill, the sequences checked against float64)."""


def case_of(fam, point: Mapping):
    """``fam.make_case(point)``; ``ValueError`` naming a key that is none of the family's axes
    (a typo), a missing axis, an integer axis (``workloads.INT_AXES``) that is not an int at or
    above its least value, or a dtype the kernels do not take (``registry.STATE_DTYPES``,
    ``registry.INPUT_DTYPES``)."""
    if not isinstance(point, Mapping):
        raise ValueError(f"point: must be a dict of the {fam.name} family's axes "
                         f"({', '.join(fam.axes)}), got {type(point).__name__} {point!r}")
    unknown = sorted(set(point) - set(fam.axes) - set(SWEEP_KEYS))
    if unknown:
        raise ValueError(f"point: {', '.join(unknown)} not an axis of the {fam.name} family "
                         f"({', '.join(fam.axes)})")
    for name, value in point.items():
        if name in INT_AXES and name in fam.axes:
            int_param(name, value, INT_AXES[name])
        names = {"state_dtype": registry.STATE_DTYPES, "dtype": registry.INPUT_DTYPES}
        if name in names and value not in names[name]:
            raise ValueError(f"{name}: one of {', '.join(names[name])}, got {value!r}")
    missing = fam.missing(point)
    if missing:
        raise ValueError(f"point: the {fam.name} family needs axis {', '.join(missing)} "
                         f"({', '.join(fam.axes)}; optional: {', '.join(fam.optional)})")
    if "HK" in point and "HV" in point and point["HV"] % point["HK"]:
        raise ValueError(f"HV: must be a multiple of HK = {point['HK']}, got {point['HV']}")
    try:
        return fam.make_case(dict(point))
    except KeyError as exc:
        raise ValueError(f"point: the {fam.name} family needs axis {exc.args[0]!r} "
                         f"({', '.join(fam.axes)})") from None


def run_point(family: str, point: Mapping, names: Iterable[str] | str) -> list[dict]:
    """Every implementation of ``names`` (a list, or registry names joined by ``"+"``) on the
    case of ``point``: check, then time (above). ``ValueError`` naming ``names`` for an
    implementation not registered or of another family, or the point's axis at fault."""
    fam = registry.family(family)
    names = registry.resolve(family, names, arg="names")
    case = case_of(fam, point)
    units = int(getattr(case, "steps", 1)) if fam.metric == "step_us" else 1
    rows: list[dict] = []
    for name in names:
        impl = registry.get(name)
        base = dict(kernel=name, impl=impl.impl, provider=impl.provider, exact=impl.exact,
                    peer_version=None, family=family,
                    state_layout=getattr(case, "state_layout", None))
        if units > 1:                                  # a speculative step: its form
            base.update(form=name, mean_accept=float(case.tensors["accepted"].float().mean()))
        try:
            base.update(impl.columns())
            if base["peer_version"] is not None and not isinstance(base["peer_version"], str):
                raise ValueError(f"must return a str (or None), got {base['peer_version']!r}")
        except Exception as exc:  # noqa: BLE001 - its version() is at fault: a failed row
            rows.append(failed_row(dict(base, peer_version=None), "rel_l2",
                                   RuntimeError(f"version: {type(exc).__name__}: {exc}"),
                                   what="o", passed=False))
            continue
        try:
            reason = impl.unavailable() or impl.unsupported(case)
        except Exception as exc:  # noqa: BLE001 - its supports/available is at fault
            rows.append(failed_row(base, "rel_l2", exc, what="o", passed=False))
            continue
        if reason:
            rows.append(dict(base, metric="unsupported", value=1.0, status="unsupported",
                             note=reason))
            continue
        try:
            run = impl.build(case)
            plain = impl.plain(case) if impl.exact and impl.plain else None
            chk = fam.check(run, case, plain=plain)
        except Exception as exc:  # noqa: BLE001 - one failed row of that implementation
            rows.append(failed_row(base, "rel_l2", exc, what="o", passed=False))
            continue
        rows += check_rows(base, chk)
        status = "ok" if chk["passed"] else "failed"
        try:
            nbytes = _bytes_moved(impl, case, chk.get("facts", {}))
        except Exception as exc:  # noqa: BLE001 - its checks stand; no time without its bytes
            rows.append(failed_row(base, "bytes_moved_step" if units > 1 else "bytes_moved",
                                   RuntimeError(f"bytes: {type(exc).__name__}: {exc}")))
            continue
        if nbytes is not None:
            rows.append(dict(base, metric="bytes_moved_step" if units > 1 else "bytes_moved",
                             unit="B", value=nbytes, status=status))
        if getattr(run, "bytes_held", None) is not None:
            rows.append(dict(base, metric="bytes_held_seq", unit="B", value=run.bytes_held,
                             status=status))
        if not chk["passed"]:
            continue
        try:
            times = timings(impl.build(case), units)
        except Exception as exc:  # noqa: BLE001 - its checks stand without a time
            rows.append(failed_row(base, fam.metric, exc))
            continue
        rows += time_rows(base, fam.metric, times, nbytes)
    return rows


def _bytes_moved(impl, case, facts: dict) -> int | None:
    """``impl.bytes(case, facts)`` as a whole number of bytes in ``[0, 2**62]`` (a Python or
    NumPy number, or a one-element integer tensor; None: no ``bytes``, or it answered None);
    ``ValueError`` for another answer."""
    if impl.bytes is None:
        return None
    n = impl.bytes(case, facts)
    if isinstance(n, torch.Tensor) and n.numel() == 1 and not n.is_floating_point() \
            and n.dtype != torch.bool:
        n = n.item()
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, numbers.Real) or not math.isfinite(n) \
            or not 0 <= n <= 2 ** 62 or n != int(n):
        raise ValueError(f"must return a whole number of bytes in [0, 2**62] (or None), got "
                         f"{n!r}")
    return int(n)


# ---- which rows are speed ---------------------------------------------------------------------

def best_timer(df: pd.DataFrame, metric: str = "time_us") -> str | None:
    """The first of ``TIMERS`` that ``df``'s ``metric`` rows have (None without)."""
    if df.empty or "timer" not in df or "metric" not in df:
        return None
    have = set(df.loc[df["metric"] == metric, "timer"].dropna())
    return next((t for t in TIMERS if t in have), None)


def base_kernel(kernel: pd.Series) -> pd.Series:
    """``carry_exact_lazy:nowb:plan`` -> ``carry_exact_lazy``."""
    return kernel.astype(str).str.split(":").str[0]


def one_device(df: pd.DataFrame, device: str | None = None) -> pd.DataFrame:
    """The rows of ``df`` from one kind of device (its ``device`` column): ``device`` when
    given, else the kind with the most points (ties: the first name in sorted order), so two
    kinds of GPU never share a plot or table; ``df`` without that column or of one kind comes
    back whole."""
    if df.empty or "device" not in df:
        return df
    kinds = df["device"].dropna()
    if device is None:
        if kinds.nunique() <= 1:
            return df
        per = (df.drop_duplicates("point_id") if "point_id" in df else df)["device"]
        counts = per.value_counts()
        device = sorted(counts[counts == counts.max()].index)[0]
    return df[df["device"] == device]


def valid_speed_rows(df: pd.DataFrame, metric: str = "time_us", timer: str | None = None,
               device: str | None = None) -> pd.DataFrame:
    """The one rule for speed: rows of ``metric`` with ``status == "ok"``, leaving out each
    kernel of a point that failed one of its checks (a peer that disagreed drops its own times
    only), of one timer (default ``best_timer``: the CUDA graph where there is one) and one kind
    of device (``one_device``)."""
    if df.empty or "metric" not in df:
        return df.iloc[0:0]
    timer = best_timer(df, metric) if timer is None else timer
    sel = df[(df["metric"] == metric) & (df["status"] == "ok")]
    if "timer" in sel:
        sel = sel[sel["timer"] == timer]
    if "passed" in df and "point_id" in df:
        bad = df[df["passed"].eq(False)]
        bad = set(zip(bad["point_id"], base_kernel(bad["kernel"])))
        if bad:
            keys = list(zip(sel["point_id"], base_kernel(sel["kernel"])))
            sel = sel[[k not in bad for k in keys]]
    return one_device(sel, device)
