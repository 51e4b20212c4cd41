"""The workloads of ``workloads.toml``: each notebook's sweeps and presets as data.

A workload is either a sweep of a registry family (``family = ...``: the runner's axes) or a
notebook's own sweep (``notebook = ...``: the axes that notebook's ``points`` reads).
``grids(name, preset)`` gives a workload's grids for a preset (a list of dicts, each the product
of its axes; TOML arrays: a pair such as ``heads = [[16, 32]]`` comes back as a list),
``points(name, preset)`` the points they expand to (for runs listed one by one),
``family(name)`` the registry family it runs, ``names()`` every workload. A grid may give an
axis as a string naming a list of the workload's ``sets`` table
(``providers = "extra_shapes"``), so a list several grids share is written once. A ``ValueError`` names the workload, preset or set
that does not exist, with the ones that do.
"""

from __future__ import annotations

import itertools
import tomllib
from functools import lru_cache
from pathlib import Path

from pmll_lab import PRESETS  # the presets a workload defines (report --preset)

INT_AXES = {"K": 1, "B": 1, "HK": 1, "HV": 1, "head_dim": 1, "H": 1, "D": 1, "T": 1,
            "ring_length": 1, "M": 0, "pending": 0, "seed": 0, "d_conv": 2, "fill": 0,
            "steps": 1, "segments": 1, "new_tokens": 1, "prompt_len": 1, "tokens": 1}
"""Grid axes that hold integers, with their least value (``M = 0``: no ring; ``pending``: rows
waiting in the stash; ``d_conv = 2``: a narrower conv keeps no window)."""


def int_param(name: str, value, minimum: int = 0) -> int:
    """``value`` as an int (a Python or NumPy integer, not a bool or a string) ``>= minimum``;
    ``ValueError`` naming ``name`` otherwise."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}: must be an int >= {minimum}, got {value!r}")
    return int(value)


PATH = Path(__file__).with_name("workloads.toml")


@lru_cache(maxsize=1)
def load() -> dict:
    """The parsed ``workloads.toml`` (read once per process); a syntax error is a
    ``ValueError`` naming the file and the place."""
    with PATH.open("rb") as fh:
        try:
            return tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"workloads: {PATH}: {exc}") from None


def names() -> list[str]:
    return sorted(load())


KEYS = ("family", "notebook", "sets") + PRESETS
"""What a workload's table may hold: ``family`` or ``notebook`` (one of them), ``sets``, and a
list of grids per preset."""


def _entry(name: str) -> dict:
    """Workload ``name``'s table; ``ValueError`` naming the workload that does not exist, or a
    key of its table that is none of ``KEYS`` (a misspelt preset would drop its grids
    silently)."""
    table = load()
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"workload: no workload {name!r} in {PATH.name} "
                         f"({', '.join(sorted(table))})")
    entry = table[name]
    unknown = sorted(set(entry) - set(KEYS))
    if unknown or ("family" in entry) == ("notebook" in entry):
        what = (f"unknown key {', '.join(unknown)}" if unknown
                else "needs one of family = ... or notebook = ...")
        raise ValueError(f"workload {name!r} in {PATH.name}: {what} (a workload's keys: "
                         f"{', '.join(KEYS)})")
    for preset in PRESETS:
        if not isinstance(entry.get(preset, []), list):
            raise ValueError(f"workload {name!r} in {PATH.name}: {preset} must be a list of "
                             f"grids ([[{name}.{preset}]] tables)")
    return entry


def family(name: str) -> str | None:
    """The registry family workload ``name`` runs (None: a notebook's own sweep)."""
    return _entry(name).get("family")


def presets(name: str) -> list[str]:
    """The presets workload ``name`` defines."""
    return sorted(k for k, v in _entry(name).items() if isinstance(v, list))


def grids(name: str, preset: str) -> list[dict]:
    """Workload ``name``'s grids for ``preset`` (fresh copies: a caller may edit them)."""
    entry = _entry(name)
    presets = [k for k, v in entry.items() if isinstance(v, list)]
    if preset not in presets:
        raise ValueError(f"preset: {preset!r} is not one of {sorted(presets)} (workload "
                         f"{name!r})")
    sets = entry.get("sets", {})
    out = []
    for g in entry[preset]:
        g = dict(g)
        for axis, value in g.items():
            if isinstance(value, str):
                if value not in sets:
                    raise ValueError(f"workload {name!r}, preset {preset!r}: axis {axis} is a "
                                     f"string, so it names a list of the workload's sets table, "
                                     f"which has no {value!r} "
                                     f"({', '.join(sorted(sets)) or 'no sets table'}); "
                                     f"values are written as a list: {axis} = [{value!r}]")
                g[axis] = list(sets[value])
        out.append(g)
    return out


def points(name: str, preset: str) -> list[dict]:
    """The points of workload ``name``'s grids for ``preset`` (each grid's product, in order)."""
    return [dict(zip(g, combo)) for g in grids(name, preset)
            for combo in itertools.product(*g.values())]
