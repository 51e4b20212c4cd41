"""The kernels notebook: every registered implementation of one family, checked and timed on
the family's workload by the one runner (``pmll_lab.harness.runner``), a researcher's own among
them (``registry.load_plugins``: files named by the notebook's ``plugins`` or by
``PMLL_LAB_PLUGINS``).
"""

from __future__ import annotations

from functools import partial

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
        raise ValueError(f"grids: workload {grids!r} runs the {workloads.family(grids) or 'no registry'} family, "
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


def points(grids: list[dict], family: str, *, seed: int) -> list[dict]:
    """Every grid's product with the seed (and ``DEFAULTS`` of the family's axes); axes checked
    against the family's. A step workload's ``forms`` axis (what the step notebooks run at its
    points) is left out: this notebook runs its ``implementations`` at them; its names are
    still checked (``ValueError`` naming ``forms``)."""
    axes = registry.family(family).axes
    for g in grids:
        for selection in (g.get("forms", ()) if isinstance(g, dict) else ()):
            registry.resolve(family, selection, arg="forms")
    fill = {"seed": [seed], **{k: [v] for k, v in DEFAULTS.items() if k in axes}}
    grids = [{k: v for k, v in g.items() if k != "forms"} if isinstance(g, dict) else g
             for g in grids]
    return P.grid_points(grids, fill, axes=axes)


def _point(p: dict, *, family: str, names: tuple, plugins: tuple) -> list[dict]:
    registry.load_plugins(list(plugins))       # on a Dask worker too (once per process)
    return run_point(family, p, names)


def point_fn(family: str, names, plugins=()):
    """The sweep's point function (picklable: a worker loads the same plugin files)."""
    plugins = [plugins] if isinstance(plugins, str) else list(plugins)
    return partial(_point, family=family, names=tuple(names), plugins=tuple(plugins))


def speed_table(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per timed (point, implementation): µs, GB/s and the fraction of the copy
    ceiling, the do_bench time beside a graph time, and each implementation's time over the
    first (ours) at the same point."""
    w = P.wide(df, metric=metric)
    if w.empty:
        return w
    keys = [c for c in ("B", "K", "state_dtype", "head_dim") if c in w]
    w = w.assign(label=w["kernel"].map(registry.label))
    first = w.groupby(keys)["time_us"].transform("first")
    w = w.assign(vs_first=w["time_us"] / first)
    cols = keys + ["label", "time_us", "do_bench_us", "gbps", "roofline_frac", "vs_first"]
    return w[[c for c in cols if c in w]].sort_values(keys).reset_index(drop=True)


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
