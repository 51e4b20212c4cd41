"""The parameters papermill injects into a notebook, checked against its ``parameters`` cell.

papermill (``-p NAME VALUE``, ``parameters=``) adds a cell after the one tagged ``parameters``
that assigns the given values. It only warns about a name the parameters cell does not define
(``-p presett full`` then runs the defaults), and takes any value (``-p grids 3`` then fails deep
inside a sweep). ``check_injected`` refuses both, naming the parameter, before anything runs;
``targets.setup()``, the first call of every notebook after its imports, runs it on the cells
the kernel has run (``check_notebook``). A notebook run by hand (no injected cell) is not
checked.

The sweep parameters' values, as the notebooks read them: ``pick`` (a workload's name or a dict
of presets: the grids of one preset), ``pick_points`` (runs listed one by one, each checked
against its point function's keys by ``check_points``); ``protocol`` re-exports them.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator, Mapping, Sequence

from pmll_lab.harness.workloads import int_param

INJECTED_MARK = "# Parameters"
"""How papermill's injected cell starts (its Python translator's comment line)."""


_KINDS = {ast.Dict: "dict", ast.DictComp: "dict", ast.List: "list", ast.ListComp: "list",
          ast.Tuple: "list"}


def assigned(source: str) -> dict[str, str | None]:
    """The names a cell assigns at its top level (``a = 1``, ``a: int = 1``), in order, each
    with the container kind its value is written as (``"dict"``, ``"list"``; None: anything
    else, e.g. a string, a number or None)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    names: dict[str, str | None] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Name):
                names[t.id] = _KINDS.get(type(node.value))
    return names


def _kind(value) -> str | None:
    if isinstance(value, Mapping):
        return "dict"
    if isinstance(value, (list, tuple)):
        return "list"
    return None


def check_injected(cells: Sequence[str], namespace: Mapping) -> None:
    """``cells``: the sources the kernel has run, in order (IPython's ``In``). When one of them
    is papermill's injected cell (it starts with ``INJECTED_MARK``), the cells run before it
    define the parameters (in a papermill run: the parameters cell alone). Raises
    ``ValueError`` naming an injected parameter none of them defines (with the names they do),
    or one whose default is written as a dict or a list and whose value (in ``namespace``, the
    notebook's globals) is not one. Without an injected cell it does nothing."""
    marks = [i for i, c in enumerate(cells) if isinstance(c, str) and c.startswith(INJECTED_MARK)]
    if not marks:
        return
    i = marks[-1]
    defaults: dict[str, str | None] = {}
    for c in cells[:i]:
        if isinstance(c, str) and not c.startswith(INJECTED_MARK):
            defaults.update(assigned(c))
    if not defaults:
        return
    injected = assigned(cells[i])
    unknown = [n for n in injected if n not in defaults]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a parameter of this notebook (its "
                         f"parameters: {', '.join(defaults)})")
    for name in injected:
        want, value = defaults[name], namespace.get(name)
        if want is not None and _kind(value) != want:
            raise ValueError(f"{name}: must be a {want} like the parameters cell's, got "
                             f"{type(value).__name__} {value!r}")


def _prob(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ValueError(f"{name}: must be a probability in [0, 1], got {v!r}")


def _step_alpha(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
        raise ValueError(f"{name}: the per-draft acceptance of the speculative step, in (0, 1) "
                         f"(at 1 no draft is rejected and the step's check refuses the case), "
                         f"got {v!r}")


def _int_list(least):
    def rule(name, v):
        if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)) or not v:
            raise ValueError(f"{name}: must be a non-empty list of ints >= {least}, got {v!r}")
        for x in v:
            int_param(name, x, least)
    return rule


def _prob_list(name, v):
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)) or not v:
        raise ValueError(f"{name}: must be a non-empty list of probabilities, got {v!r}")
    for x in v:
        _prob(name, x)


def _mean_accept(name, v, ns):
    k = ns.get("accept_K", 1)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1 <= v <= k:
        raise ValueError(f"{name}: the mean accepted length of accept_K = {k} rows, a number in "
                         f"[1, {k}], got {v!r}")


PARAM_RULES = {
    "seed": lambda n, v: int_param(n, v, 0),
    "accept_K": lambda n, v: int_param(n, v, 1),
    "mean_accept": _mean_accept,
    "alpha": _step_alpha, "step_alpha": _step_alpha, "p_zero": _prob, "main_p": _prob,
    "main_K": lambda n, v: int_param(n, v, 1),
    "lazy_min_seqs": lambda n, v: int_param(n, v, 0),
    "eager_max_pending": lambda n, v: int_param(n, v, 0),
    "sim_Ks": _int_list(1), "sim_alphas": _prob_list,
    "wrap_capacity": lambda n, v: int_param(n, v, 1), "wrap_segments": _int_list(1),
}
"""The notebooks' scalar and list parameters, one rule each (a parameter's name means the same in
every notebook): ``rule(name, value)`` (``mean_accept``'s also takes the namespace: it lies in
``[1, accept_K]``), raising ``ValueError`` naming the parameter. ``check_values`` applies them."""


def check_values(namespace: Mapping) -> None:
    """Every parameter of ``PARAM_RULES`` that ``namespace`` (a notebook's globals) holds, against
    its rule; and every sweep parameter (a name ending in ``grids`` or ``_points``) given as a
    string, as a workload's name (``harness/workloads.toml``). ``ValueError`` naming the
    parameter: before any sweep runs, not after the ones before it."""
    for name, rule in PARAM_RULES.items():
        if name not in namespace:
            continue
        if rule is _mean_accept:
            rule(name, namespace[name], namespace)
        else:
            rule(name, namespace[name])
    from pmll_lab.harness import workloads

    for name, value in namespace.items():
        if isinstance(value, str) and (name.endswith("grids") or name.endswith("_points")):
            try:
                workloads.presets(value)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None


def check_notebook() -> None:
    """``check_injected`` and ``check_values`` on the running IPython kernel's cells and globals
    (no-op outside one)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    check_injected(list(ip.user_ns.get("In", [])), ip.user_ns)
    check_values(ip.user_ns)


@contextlib.contextmanager
def named(param: str) -> Iterator[None]:
    """Errors of the points built inside it named by the notebook parameter their grids came
    from: the points functions name what they refuse ``grids: ...``; inside ``named("step_grids")``
    that reads ``step_grids: ...``, the parameter to fix."""
    try:
        yield
    except ValueError as exc:
        text = str(exc)
        if param != "grids" and text.startswith("grids:"):
            raise ValueError(param + text[len("grids"):]) from None
        raise


def pick(table: Mapping | str, preset: str, name: str = "grids", *, fallback: str | None = None):
    """``table[preset]``, or for a workload's name (a string) its grids for ``preset``
    (``harness.workloads.grids``); a preset it lacks is a ``ValueError`` naming the valid
    ones, unless ``fallback`` names a preset it has (then that one's)."""
    if isinstance(table, str):
        from pmll_lab.harness import workloads

        if fallback is not None and preset not in workloads.presets(table):
            preset = fallback
        return workloads.grids(table, preset)
    if fallback is not None and isinstance(table, Mapping) and preset not in table:
        preset = fallback
    if not isinstance(table, Mapping):
        raise ValueError(f"{name}: must be a dict of presets ({{preset: [grid, ...]}}) or a "
                         f"workload's name (harness/workloads.toml), got "
                         f"{type(table).__name__} {table!r}")
    if preset not in table:
        raise ValueError(f"preset: {preset!r} is not one of {sorted(table)} (the keys of "
                         f"{name} in the parameters cell)")
    if name.endswith("grids") and isinstance(table[preset], Mapping):
        raise ValueError(f"{name}[{preset!r}]: must be a list of grids, got one dict "
                         f"(write [{{...}}] around it)")
    if name.endswith("grids") and isinstance(table[preset], (list, tuple)) and not table[preset]:
        raise ValueError(f"{name}[{preset!r}]: lists no grid (the sweep would run no point)")
    return table[preset]


def pick_points(table: Mapping | str, preset: str, name: str = "points",
                keys: Mapping[str, object] | None = None) -> list[dict]:
    """Runs listed one by one: for a workload's name (a string) the points of its grids for
    ``preset`` (``harness.workloads.points``); for a dict of presets, ``table[preset]`` (a
    point or a list of points). A preset it lacks is a ``ValueError`` naming the valid ones;
    with ``keys`` (the point function's, see ``check_points``) each point is checked before
    any runs."""
    if isinstance(table, str):
        from pmll_lab.harness import workloads

        chosen = workloads.points(table, preset)
    else:
        chosen = pick(table, preset, name)
        if isinstance(chosen, Mapping):
            chosen = [chosen]
        if not isinstance(chosen, (list, tuple)):
            raise ValueError(f"{name}[{preset!r}]: must be a point (a dict) or a list of "
                             f"points, got {chosen!r}")
    if keys is not None:
        check_points(chosen, keys, name)
    return [dict(p) for p in chosen]


def check_points(points, keys: Mapping[str, object], name: str = "points") -> None:
    """Each point a dict whose keys are ``keys``' and whose values pass their rule: an int
    (the least value of an integer key), ``float``, ``str``, ``list`` (a non-empty list), a
    tuple of choices, or a function ``rule(name, value)`` that raises ``ValueError``. A key
    whose rule is wrapped as ``optional(rule)`` may be left out; every other is required.
    Raises ``ValueError`` naming ``name``, the point and the key: an unknown key (a typo would
    fall back to the point function's full-size default), a missing one, or a value against its
    rule (a grid's list where one value belongs)."""
    rules = {k: getattr(r, "rule", r) for k, r in keys.items()}
    required = {k for k, r in keys.items() if not isinstance(r, optional)}
    for i, p in enumerate(points):
        where = f"{name}: point {i}"
        if not isinstance(p, Mapping):
            raise ValueError(f"{where}: must be a dict, got {p!r}")
        unknown = sorted(set(p) - set(rules))
        missing = sorted(required - set(p))
        if unknown or missing:
            what = (f"unknown key {', '.join(unknown)}" if unknown
                    else f"missing key {', '.join(missing)}")
            raise ValueError(f"{where}: {what} (its keys: {', '.join(rules)})")
        for k, v in p.items():
            rule = rules[k]
            if isinstance(rule, int) and not isinstance(rule, bool):
                int_param(f"{where}: {k}", v, rule)
            elif rule is float:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ValueError(f"{where}: {k} must be a number, got {v!r}")
            elif rule is str or rule is list:
                if not isinstance(v, rule) or (rule is list and not v):
                    kind = "non-empty list" if rule is list else "string"
                    raise ValueError(f"{where}: {k} must be a {kind}, got {v!r}")
            elif isinstance(rule, tuple):
                if v not in rule:
                    raise ValueError(f"{where}: {k} must be one of "
                                     f"{', '.join(map(str, rule))}, got {v!r}")
            elif callable(rule):                   # a rule of its own: rule(name, value)
                rule(f"{where}: {k}", v)


class optional:
    """A ``check_points`` rule for a key a point may leave out."""

    def __init__(self, rule):
        self.rule = rule
