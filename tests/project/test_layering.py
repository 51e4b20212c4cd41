"""The library's import graph: no cycles, and no module imports one of a higher layer.

Read from the source with ``ast`` (no module is imported): every ``import`` and ``from ... import``
anywhere in a module (inside functions too, lazy or not; relative imports resolved) and
``importlib.import_module("...")`` with a literal name. ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``. A package's ``__init__`` runs before its
submodules, but that implicit import is not an edge here: the ``__init__`` files' own imports are
checked like any module's.
"""

from __future__ import annotations

import ast
import fnmatch
import textwrap
from pathlib import Path

import pytest
from _paths import ROOT

LIB = ROOT / "pmll_lab"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base: device choice, checks, host helpers, float64 references",
     ("pmll_lab", "pmll_lab.backend", "pmll_lab._interpreter", "pmll_lab._checks",
      "pmll_lab.ops.host", "pmll_lab.reference", "pmll_lab.reference.*", "pmll_lab.sizes",
      "pmll_lab.tolerances", "pmll_lab.cuda_ext")),
    ("kernels and their launchers, launch settings",
     ("pmll_lab.ops", "pmll_lab.ops.*")),
    ("host-side serving drivers over the launchers (SpecDecodeStep, CarryLayer)",
     ("pmll_lab.serving", "pmll_lab.serving.*")),
    ("public facades and tools for the kernels",
     ("pmll_lab.gdn", "pmll_lab.conv", "pmll_lab.carry", "pmll_lab.pmll", "pmll_lab.bench",
      "pmll_lab.peers", "pmll_lab.peers_*", "pmll_lab.inputs")),
    ("real models driven through the facades (ServingCache, generation loops)",
     ("pmll_lab.models", "pmll_lab.models.*")),
    ("what is run: the registry of families and implementations, the one runner",
     ("pmll_lab.harness", "pmll_lab.harness.*")),
    ("checks, experiments, sweeps, reports",
     ("pmll_lab.lowering", "pmll_lab.lowering_ir", "pmll_lab.experiments", "pmll_lab.experiments.*", "pmll_lab.sweep",
      "pmll_lab.dist", "pmll_lab.results", "pmll_lab.report", "pmll_lab.report_*",
      "pmll_lab.step_*",
      "pmll_lab.__main__")),
)
"""Lowest first; a module may import its own layer and the ones below. A module's layer is the
first whose patterns match it (the exact names of the base layer come before ``pmll_lab.ops.*``).
"""

KNOWN_CYCLES_OWNED_ELSEWHERE: set[frozenset[str]] = set()
"""No cycle is tolerated (the experiment hub and the sweep/dist helpers lost theirs)."""


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(LIB.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    targets.append(sub if sub in mods else src)
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
                targets = [node.args[0].value]
            out.update(t for t in targets if t in mods and t != name)
        edges[name] = out
    return edges


def _layer(name: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return i
    raise KeyError(name)


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    return mods, _edges(mods)


def test_every_library_module_has_a_layer(graph):
    mods, _ = graph
    missing = []
    for name in mods:
        try:
            _layer(name)
        except KeyError:
            missing.append(name)
    assert not missing, f"modules in no layer of LAYERS (add them): {missing}"


def test_no_import_reaches_a_higher_layer(graph):
    _, edges = graph
    upward = sorted(f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
                    for a, targets in edges.items() for b in targets if _layer(b) > _layer(a))
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_import_cycles(graph):
    _, edges = graph
    cycles = [sorted(c) for c in _cycles(edges) if c not in KNOWN_CYCLES_OWNED_ELSEWHERE]
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_reader_sees_lazy_relative_and_dynamic_imports(tmp_path, monkeypatch):
    """The checks above can fail: on a made-up package, a lazy import inside a function, a
    relative import and ``import_module`` are edges, an upward one is reported, a cycle found."""
    pkg = tmp_path / "pmll_lab"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "k.py").write_text("def f():\n    from pmll_lab import carry\n")
    (pkg / "ops" / "j.py").write_text("from . import k\n")
    (pkg / "carry.py").write_text("import importlib\nimportlib.import_module('pmll_lab.gdn')\n")
    (pkg / "gdn.py").write_text("from pmll_lab.carry import x\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "LIB", pkg)
    mods = _modules()
    edges = _edges(mods)
    assert edges["pmll_lab.ops.k"] == {"pmll_lab.carry"}
    assert edges["pmll_lab.ops.j"] == {"pmll_lab.ops.k"}
    assert edges["pmll_lab.carry"] == {"pmll_lab.gdn"}
    assert _layer("pmll_lab.ops.k") < _layer("pmll_lab.carry")
    assert _cycles(edges) == [frozenset({"pmll_lab.carry", "pmll_lab.gdn"})]


ALLOWED_PRIVATE = {"_checks", "_interpreter"}
"""Private modules of the base layer a test may import (the shared argument checks)."""

KNOWN_PRIVATE_USES: set[str] = set()
"""Private names of the library that tests still reach (``file: module.name``): none; a new one
fails the test."""


def _private_uses(path: Path) -> set[str]:
    """``module.name`` for every private (``_``-prefixed) library name ``path`` reaches:
    ``from pmll_lab.x import _y``, ``import pmll_lab._y``, ``x._y`` and ``setattr(x, "_y", ...)``
    (monkeypatch too) on a module bound by ``import``/``from pmll_lab import x``; also inside
    the scripts a test keeps in string literals (the subprocess checks)."""
    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__") and name not in ALLOWED_PRIVATE

    found: set[str] = set()

    def scan(tree: ast.AST) -> None:
        modules: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pmll_lab"):
                for a in node.names:
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
                    if private(a.name):
                        found.add(f"{node.module}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("pmll_lab"):
                        parts = a.name.split(".")
                        modules[a.asname or parts[0]] = a.name if a.asname else parts[0]
                        found.update(a.name for p in parts if private(p))
        for node in ast.walk(tree):
            attr, base = None, None
            if isinstance(node, ast.Attribute):
                attr, base = node.attr, node.value
            elif (isinstance(node, ast.Call) and len(node.args) >= 2
                  and getattr(node.func, "attr", getattr(node.func, "id", None)) == "setattr" and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str)):
                attr, base = node.args[1].value, node.args[0]
            if attr is None or not private(attr):
                continue
            chain = []
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.add(".".join([modules[base.id], *reversed(chain), attr]))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and "import" in node.value and "pmll_lab" in node.value):
                try:
                    sub = ast.parse(textwrap.dedent(node.value))
                except SyntaxError:
                    continue
                scan(sub)

    scan(ast.parse(path.read_text(), str(path)))
    return found


def test_tests_reach_no_private_library_name():
    """Tests and scripts go through the library's public names (a private one is free to
    change), apart from the private checks module."""
    uses = {f"{p.relative_to(ROOT).as_posix()}: {name}"
            for folder in ("tests", "scripts") for p in sorted((ROOT / folder).rglob("*.py"))
            if p.resolve() != Path(__file__).resolve()      # this file's examples below
            for name in _private_uses(p)}
    new = sorted(uses - KNOWN_PRIVATE_USES)
    assert not new, "private library names reached (give them a public name):\n" + "\n".join(new)
    fixed = sorted(KNOWN_PRIVATE_USES - uses)
    assert not fixed, f"no longer used: take them off KNOWN_PRIVATE_USES: {fixed}"


def test_library_modules_reach_no_other_modules_private_names():
    """A module's ``_``-prefixed names are its own: no other library module imports or reaches
    them (what two modules share has a public name)."""
    uses = []
    for p in sorted(LIB.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        uses += [f"{mod}: {u}" for u in sorted(_private_uses(p)) if u.rpartition(".")[0] != mod]
    assert not uses, "private names reached across library modules:\n" + "\n".join(uses)


def test_the_private_use_reader_sees_each_form(tmp_path):
    """The check above can fail: each form of reaching a private name is seen."""
    src = tmp_path / "t.py"
    src.write_text(textwrap.dedent('''
        import textwrap
        from pmll_lab import _checks
        from pmll_lab.ops.gdn.checks import _live_lanes, check_decode_args
        from pmll_lab.ops import launch as L
        import pmll_lab.ops.carry.ring
        L._hidden()
        pmll_lab.ops.carry.ring._check_verify
        def test(monkeypatch):
            monkeypatch.setattr(L, "_other", None)
        SCRIPT = textwrap.dedent("""
            from pmll_lab.ops.gdn import decode as D
            D._in_a_script
        """)
    '''))
    assert _private_uses(src) == {
        "pmll_lab.ops.gdn.checks._live_lanes", "pmll_lab.ops.launch._hidden",
        "pmll_lab.ops.launch._other", "pmll_lab.ops.carry.ring._check_verify",
        "pmll_lab.ops.gdn.decode._in_a_script"}
