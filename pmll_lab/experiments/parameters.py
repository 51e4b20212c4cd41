"""The parameters papermill injects into a notebook, checked against its ``parameters`` cell.

papermill (``-p NAME VALUE``, ``parameters=``) adds a cell after the one tagged ``parameters``
that assigns the given values. It only warns about a name the parameters cell does not define
(``-p presett full`` then runs the defaults), and takes any value (``-p grids 3`` then fails deep
inside a sweep). ``check_injected`` refuses both, naming the parameter, before anything runs;
``targets.setup()``, the first call of every notebook after its imports, runs it on the cells
the kernel has run (``check_notebook``). A notebook run by hand (no injected cell) is not
checked.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

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


def check_notebook() -> None:
    """``check_injected`` on the cells the running IPython kernel has run (no-op outside one)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    check_injected(list(ip.user_ns.get("In", [])), ip.user_ns)
