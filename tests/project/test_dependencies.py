"""README's "Dependencies" table says what ``pyproject.toml`` declares (SPEC: new dependencies are
declared there and explained in README).

For every package: the same version bounds wherever ``pyproject.toml`` lists it (a bound in
``models`` but none in ``dev`` would let ``make test`` install an untested major version), the
README row states those bounds, and the row's extras are the ones that carry the package (a row
with no extra: the core dependencies). A row whose notes say ``--no-deps`` is a package installed
by hand without its dependencies (pip's extras cannot say that): it must not be in
``pyproject.toml`` and must name its exact version.
"""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from _paths import ROOT


def _declared():
    """``{package: {"specs": {str(SpecifierSet)}, "groups": {None (core) or extra}}}``."""
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = [(None, proj["dependencies"])] + list(proj["optional-dependencies"].items())
    out: dict = {}
    for group, reqs in groups:
        for line in reqs:
            r = Requirement(line)
            d = out.setdefault(canonicalize_name(r.name), {"specs": set(), "groups": set()})
            d["specs"].add(str(r.specifier))
            d["groups"].add(group)
    return out, set(proj["optional-dependencies"])


def _readme_rows(extras):
    """``[(package, spec or None, {extras named in the row}, installed by hand with
    --no-deps)]`` from the README table."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Dependencies", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| package", "| ---")):
            continue
        cell = line.split(" | ", 1)[0][2:].replace("\\[", "[").replace("\\]", "]")
        names, _, notes = cell.partition("(")
        named = {w for w in re.findall(r"`([^`]+)`", notes) if w in extras}
        item = re.compile(r"([A-Za-z0-9_.\-\[\]]+)(?:\s*`([^`]+)`)?")
        assert not item.sub("", names).strip(" ,"), f"README Dependencies: cannot read {cell!r}"
        for m in item.finditer(names):
            pkg = canonicalize_name(Requirement(m.group(1)).name)
            rows.append((pkg, m.group(2), named, "--no-deps" in notes))
    return rows


def test_readme_dependencies_match_pyproject():
    declared, extras = _declared()
    rows = _readme_rows(extras)
    for pkg, spec, named, by_hand in [r for r in rows if r[3]]:
        assert pkg not in declared, f"{pkg}: README says --no-deps, but pyproject.toml lists it"
        assert spec and spec.startswith("==") and not named, \
            f"{pkg}: a --no-deps row names its exact version and no extra"
    rows = [r[:3] for r in rows if not r[3]]
    for pkg, d in declared.items():
        assert len(d["specs"]) == 1, f"{pkg}: different bounds in pyproject.toml: {d['specs']}"
        spec = next(iter(d["specs"]))
        mine = [r for r in rows if r[0] == pkg]
        assert mine, f"{pkg}: declared in pyproject.toml, missing from README's Dependencies"
        stated = {s for _, s, _ in mine if s is not None}
        if spec:
            assert stated, f"{pkg}: pyproject.toml pins {spec!r}, README states no bounds"
        for s in stated:
            assert str(Requirement(f"x{s}").specifier) == spec, \
                f"{pkg}: README says {s!r}, pyproject.toml {spec!r}"
        named = set().union(*(n for _, _, n in mine))
        want = {g for g in d["groups"] if g is not None}
        assert named == want, f"{pkg}: README names extras {sorted(named)}, pyproject {sorted(want)}"
        assert (None in d["groups"]) == any(not n for _, _, n in mine), \
            f"{pkg}: core dependency in one file but not the other"
    for pkg, _, _ in rows:
        assert pkg in declared, f"{pkg}: in README's Dependencies, not in pyproject.toml"


def test_the_readme_python_example_runs():
    """The README's Python example runs as written (a fresh Python, this checkout) and its
    decode agrees with the float64 reference within the bf16 output tolerance."""
    import re
    import subprocess
    import sys
    root = ROOT
    blocks = re.findall(r"```python\n(.*?)```", (root / "README.md").read_text(), re.S)
    assert blocks, "the README has no ```python example"
    env = {**__import__("os").environ, "PYTHONPATH": str(root), "PMLL_LAB_DEVICE": "cpu"}
    run = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True,
                         env=env, cwd=root, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rel = [float(v) for v in re.findall(r"'rel_l2': ([0-9.e+-]+)", run.stdout)]
    assert len(rel) == 2 and rel[0] <= 8e-3 and rel[1] <= 1e-5, run.stdout
