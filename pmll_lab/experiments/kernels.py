"""The kernels notebook: every registered implementation of one family, checked and timed on
the family's workload by the one runner (``pmll_lab.harness.runner``), a researcher's own among
them (``registry.load_plugins``: files named by the notebook's ``plugins`` or by
``PMLL_LAB_PLUGINS``).
"""

from __future__ import annotations

import hashlib
import os
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from pmll_lab.experiments import plots
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import target_table as TT
from pmll_lab.harness import registry
from pmll_lab.harness.runner import run_point


def setup(family: str, implementations, plugins=(), grids=None) -> tuple[list[str], list[str]]:
    """Load ``plugins`` (a file or a list; and ``$PMLL_LAB_PLUGINS``), then ``(names, loaded
    files)``: the implementations of ``family`` to run (``"all"`` or a ``"+"``-joined string or
    a list; ``ValueError`` naming ``implementations`` for a name not registered, or ``grids``
    for a workload of another family)."""
    from pmll_lab.harness import workloads

    registry.family(family)
    if isinstance(grids, str) and workloads.family(grids) != family:
        named = workloads.family(grids)
        if named and named not in registry.FAMILIES:
            raise ValueError(f"grids: workload {grids!r} names family {named!r}, which is not "
                             f"registered ({', '.join(sorted(registry.FAMILIES))})")
        raise ValueError(f"grids: workload {grids!r} runs the {named or 'no registry'} family, "
                         f"not {family}")
    plugins = [plugins] if isinstance(plugins, str) else list(plugins)
    loaded = registry.load_plugins() + registry.load_plugins(plugins)
    names = registry.resolve(family, implementations, arg="implementations")
    return names, loaded


def targets(family: str, names) -> tuple:
    """The target table's rows for this notebook (``target_table.KERNELS``) that the run can
    judge: ours of ``family`` and every implementation they name among ``names`` (those run: a
    list, or ``"all"`` / names joined by ``"+"`` as ``setup`` takes them). ``ValueError`` naming
    ``family`` or ``names`` for a family or name not registered."""
    registry.family(family)
    names = set(registry.resolve(family, names, arg="names"))
    return tuple(t for t in TT.for_report(TT.KERNELS)
                 if isinstance(t.ours, str) and registry.get(t.ours).family == family
                 and {t.ours, t.peer} - {None} <= names)


DEFAULTS = {"alpha": 0.8}
"""Axis values a grid may leave out (the step families' acceptance probability)."""


def points(grids: list[dict], family: str, *, seed: int, implementations="all") -> list[dict]:
    """Every grid's product with the seed (and ``DEFAULTS`` of the family's axes); axes checked
    against the family's. A grid's ``forms`` (registry names joined by ``"+"``: what a step
    notebook runs at its points; names checked, ``ValueError`` naming ``forms``) selects what
    runs at that grid's points while ``implementations`` is ``"all"``; a selection of the
    notebook's own (``implementations`` naming some) runs at every point instead."""
    axes = registry.family(family).axes
    for g in grids:
        for selection in (g.get("forms", ()) if isinstance(g, dict) else ()):
            registry.resolve(family, selection, arg="forms")
    fill = {"seed": [seed], **{k: [v] for k, v in DEFAULTS.items() if k in axes}}
    keep = implementations == "all"
    grids = [{k: v for k, v in g.items() if k != "forms" or keep} if isinstance(g, dict) else g
             for g in grids]
    out = P.grid_points(grids, fill, axes=tuple(axes) + (("forms",) if keep else ()),
                        choices={"dtype": P.KERNEL_DTYPES})
    fam = registry.family(family)
    for p in out:
        if fam.missing(p):
            raise ValueError(f"grids: the {family} family needs axis "
                             f"{', '.join(fam.missing(p))} in every grid (axes: "
                             f"{', '.join(axes)}; optional: {', '.join(fam.optional)})")
    return out


def bind(points: list[dict], names, plugins=()) -> list[dict]:
    """Each point with what runs at it as part of it, so that a resumed run runs a point again
    whose implementations or plugin files changed (an implementation added by a plugin would
    otherwise find the point done without it): ``forms``, the grid's own or ``names`` joined by
    ``"+"``; ``plugins``, a hash of the bytes of the plugin files (``plugins`` and
    ``$PMLL_LAB_PLUGINS``) where there are any: their contents, not where they lie, so a run
    resumed from another clone or folder finds its points done."""
    files = {Path(f).expanduser().resolve() for f in
             (os.environ.get(registry.PLUGINS_ENV, "").split(os.pathsep)
              + ([plugins] if isinstance(plugins, (str, os.PathLike)) else list(plugins))) if f}
    h = hashlib.sha1()
    for digest in sorted(hashlib.sha1(f.read_bytes() if f.is_file() else b"").digest()
                         for f in files):
        h.update(digest)
    stamp = {"plugins": h.hexdigest()[:12]} if files else {}
    return [{**p, "forms": p.get("forms") or "+".join(names), **stamp} for p in points]


def ran(family: str, names, points: list[dict]) -> list[str]:
    """The implementations that run at ``points``: ``names``, or, where every point selects its
    own (a grid's ``forms``), those selections together, in ``names``' order (what the headline
    counts and lists)."""
    picked: set[str] = set()
    for p in points:
        if not p.get("forms"):
            return list(names)
        picked |= set(registry.resolve(family, p["forms"], arg="forms"))
    return [n for n in names if n in picked] + sorted(picked - set(names))


def _point(p: dict, *, family: str, names: tuple, plugins: tuple) -> list[dict]:
    registry.load_plugins(list(plugins))       # on a Dask worker too (once per process)
    point = {k: v for k, v in p.items() if k != "plugins"}
    return run_point(family, point, p.get("forms") or names)


def point_fn(family: str, names, plugins=()):
    """The sweep's point function (picklable: a worker loads the same plugin files)."""
    plugins = [plugins] if isinstance(plugins, str) else list(plugins)
    return partial(_point, family=family, names=tuple(names), plugins=tuple(plugins))


def speed_table(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per timed (point, implementation): µs, GB/s and the fraction of the copy
    ceiling, the do_bench time beside a graph time, and each implementation's time over ours at
    the same point (``vs_ours``: over the first of our registered implementations timed there,
    named in ``ours``). A point is every axis of the family that the rows carry, so points that
    differ only in, e.g., ``HV`` are not merged."""
    w = P.wide(df, metric=metric)
    if w.empty:
        return w
    fams = w["family"].dropna().unique() if "family" in w else []
    order = registry.names(fams[0]) if len(fams) == 1 else list(dict.fromkeys(w["kernel"]))
    axes = registry.family(fams[0]).axes if len(fams) == 1 else ("B", "K", "state_dtype",
                                                                  "head_dim")
    keys = [c for c in axes if c in w and w[c].notna().any() and c != "seed"]
    ours = [n for n in order if registry.get(n).provider == "pmll_lab"]
    rank = {n: i for i, n in enumerate(ours + [n for n in order if n not in ours])}
    w = w.assign(label=w["kernel"].map(registry.label),
                 _rank=w["kernel"].map(lambda k: rank.get(k, len(rank))))
    base = (w.sort_values("_rank").groupby(keys, dropna=False, sort=False)
            .first()[["kernel", "time_us"]]
            .rename(columns={"kernel": "_ours", "time_us": "_ours_us"}).reset_index())
    w = w.merge(base, on=keys, how="left")
    w = w.assign(vs_ours=w["time_us"] / w["_ours_us"],
                 ours=w["_ours"].map(registry.label))
    cols = keys + ["label", "time_us", "do_bench_us", "gbps", "roofline_frac", "vs_ours", "ours"]
    return w[[c for c in cols if c in w]].sort_values(keys + ["label"]).reset_index(drop=True)


def plot_speed(df: pd.DataFrame, metric: str):
    """Time per unit against B, one line per implementation, per state dtype (GPU rows)."""
    w = P.wide(df, metric=metric)
    if w.empty or "B" not in w:
        return None
    dtypes = sorted(w["state_dtype"].dropna().unique())
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4), squeeze=False,
                             sharey=True, layout="constrained")
    for ax, sd in zip(axes[0], dtypes):
        for name, sel in w[w["state_dtype"] == sd].groupby("kernel"):
            sel = sel.sort_values("B")
            ax.plot(sel["B"], sel["time_us"], label=registry.label(name),
                    **plots.style(name, "vk"))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequences B")
        ax.set_title(f"{sd} state")
    axes[0][0].set_ylabel("µs per call (CUDA graph, GPU time)")
    plots.legend_outside(fig, axes[0])
    return fig
