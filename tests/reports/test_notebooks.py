"""Hygiene of the committed notebooks: valid, outputs stripped, papermill-ready.

Running them is `make report`'s job (quick preset in CI); this file only reads them.
"""

from __future__ import annotations

import ast
import re

import nbformat
import pytest

from pmll_lab.harness import workloads
from _paths import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_workbench_has_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb: `make report` would run nothing"


_NAME: dict = {}
"""Notebook file stem by ``id`` of the fixture's notebook object."""


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def nb(request):
    notebook = nbformat.read(request.param, as_version=4)
    nbformat.validate(notebook)
    _NAME[id(notebook)] = request.param.stem
    return notebook


def _code(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_outputs_stripped(nb):
    for i, cell in enumerate(_code(nb)):
        assert cell.get("outputs") == [], f"code cell {i} has outputs"
        assert cell.get("execution_count") is None, f"code cell {i} has an execution count"


def test_first_code_cell_is_the_parameters_cell(nb):
    code = _code(nb)
    assert code, "no code cells"
    first = code[0]
    assert "parameters" in first.metadata.get("tags", []), "first code cell not tagged parameters"
    assigned = {}
    for node in ast.parse(first.source).body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = node.value
    for name, default in (("preset", "quick"), ("device", "auto"), ("results_dir", None)):
        assert name in assigned, f"parameters cell does not define {name}"
        value = ast.literal_eval(assigned[name])
        assert isinstance(value, str), f"{name} is not a string"
        if default is not None:
            assert value == default, f"{name} = {value!r}, the committed default must be {default!r}"
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged parameters"


def test_device_is_set_before_pmll_lab_is_imported(nb):
    source = "\n".join(c.source for c in _code(nb))
    first_import = re.search(r"^\s*(import pmll_lab|from pmll_lab)", source, re.M)
    assert first_import, "the notebook never imports pmll_lab"
    setting = source.find("PMLL_LAB_DEVICE")
    assert 0 <= setting < first_import.start(), \
        "os.environ['PMLL_LAB_DEVICE'] must be set from `device` before pmll_lab is imported"


VOCABULARY = ("preset", "device", "results_dir", "scheduler", "seed", "grids")
"""The parameters every notebook has, named the same everywhere (README, "Notebook parameters")."""


def _parameters(nb):
    first = _code(nb)[0]
    return {t.id: node.value for node in ast.parse(first.source).body
            if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}


def test_one_parameter_vocabulary(nb):
    """The same names for the same things: the main sweep's grids are ``grids``, a notebook's
    other sweeps ``<part>_grids`` (or ``<part>_points`` for points listed one by one), each a
    dict with both presets."""
    params = _parameters(nb)
    missing = [n for n in VOCABULARY if n not in params]
    assert not missing, f"parameters cell lacks {missing}"
    for name, value in params.items():
        if "grid" in name.lower():
            assert name == "grids" or (name.endswith("_grids") and name == name.lower()), \
                f"{name}: call it grids or <part>_grids"
        if name == "grids" or name.endswith(("_grids", "_points")):
            if isinstance(value, ast.Constant):
                # a workload of harness/workloads.toml, with both presets
                assert {"quick", "full"} <= {p for p in ("quick", "full")
                                             if workloads.grids(value.value, p)}, name
                continue
            assert isinstance(value, ast.Dict) and {ast.literal_eval(k) for k in value.keys} == \
                {"quick", "full"}, f"{name}: a dict with the presets quick and full, or a workload"


def test_readme_names_every_part_parameter(nb):
    """README's "Notebook parameters" table lists each ``<part>_grids`` / ``<part>_points`` a
    notebook takes, so a reader can find every sweep's knob without opening the notebook."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Notebook parameters", 1)[1].split("\n## ", 1)[0]
    parts = [n for n in _parameters(nb) if n != "grids" and n.endswith(("_grids", "_points"))]
    unlisted = [n for n in parts if f"`{n}`" not in section]
    assert not unlisted, f"README, Notebook parameters, does not name {unlisted}"


def test_papermill_reads_the_parameters_cell_without_warnings(nb, caplog):
    """papermill parses each line of the parameters cell for its help text; a line holding more
    than one ``=`` (``dict(K=[4], B=[1])``, a comment with ``K = 4``) makes it warn "Unable to
    parse line" on every run."""
    import logging

    from papermill.translators import PythonTranslator

    with caplog.at_level(logging.WARNING, logger="papermill"):
        found = {p.name for p in PythonTranslator.inspect(_code(nb)[0])}
    assert not [r.getMessage() for r in caplog.records], "papermill warned"
    assert set(VOCABULARY) <= found


def _sweep_points():
    """The points function each notebook sweep's grids go through, by (notebook, parameter)."""
    from functools import partial

    from pmll_lab.experiments import carry, conv, gdn, pmll, pmll_attention, roofline
    from pmll_lab.experiments import kernels, spec_decode, state_drift, step, tokens

    def steps(g):
        return step.points(g, alpha=0.8, seed=0)

    def roof(g):
        return roofline.points(g, seed=0, fla=False, flashinfer=False)

    return {("carry_protocol", "grids"): lambda g: carry.points(g, alpha=0.8, p_zero=0.1, seed=0),
            ("carry_protocol", "step_grids"): steps,
            ("carry_step", "grids"): steps, ("carry_step", "sensitivity_grids"): steps,
            ("carry_step", "kernel_grids"): steps,
            ("gdn_conv", "grids"): conv.points, ("gdn_verify", "grids"): gdn.points,
            ("pmll_attention", "grids"): pmll_attention.points,
            ("pmll_attention", "state_grids"): partial(pmll_attention.points, sweep="states"),
            ("pmll_attention", "eviction_grids"): partial(pmll_attention.points,
                                                          sweep="eviction"),
            ("pmll_ring", "grids"): pmll.points,
            ("roofline", "grids"): roof, ("roofline", "ring_grids"): pmll.points,
            ("roofline", "step_grids"): steps, ("roofline", "drift_grids"): state_drift.points,
            ("spec_decode", "grids"): spec_decode.points, ("tokens", "grids"): tokens.points,
            ("kernels", "grids"): lambda g: kernels.points(g, "gdn_decode", seed=0)}


def test_every_preset_grid_passes_the_axis_checks(nb):
    """Each grid of every preset (the full one too, which only the H200 runs) passes the
    checks of the points function its notebook sweeps it through (``protocol.grid_points``
    with that sweep's own axes and dtypes: integer axes at or above their least value, every
    axis a list, no other notebook's axis), so a run on the GPU cannot stop there; every
    sweep parameter is mapped to its function here."""
    cell: dict = {}
    exec(_code(nb)[0].source, cell)      # the parameters cell: plain assignments
    params = {name: value for name, value in cell.items()
              if name == "grids" or name.endswith("_grids")}
    assert params
    fns = _sweep_points()
    name_of = _NAME[id(nb)]
    for name, presets in params.items():
        assert (name_of, name) in fns, f"{name_of}: {name} has no points function in this test"
        if isinstance(presets, str):           # a workload of harness/workloads.toml
            presets = {p: workloads.grids(presets, p) for p in ("quick", "full")}
        for preset, grids in presets.items():
            for g in grids:
                assert fns[name_of, name]([g]), f"{name}[{preset!r}]: no points"

def test_every_library_name_a_notebook_uses_exists(nb):
    """Each ``alias.name`` a notebook's code reads from a ``pmll_lab`` module it imports
    (``from pmll_lab.experiments import step as S`` ... ``S.label``) exists in that module, so
    a name moved or removed in the library fails here, not in the middle of ``make report``."""
    import importlib

    src = "\n".join(c.source for c in _code(nb)[1:])
    tree = ast.parse(src)
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pmll_lab"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                try:
                    aliases[a.asname or a.name] = importlib.import_module(full)
                except ModuleNotFoundError:
                    pass                                     # a name, not a module
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("pmll_lab") and a.asname:
                    aliases[a.asname] = importlib.import_module(a.name)
    assert aliases or _NAME[id(nb)] == "", "no pmll_lab module imported"
    missing = sorted({f"{n.value.id}.{n.attr}" for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                      and n.value.id in aliases and not hasattr(aliases[n.value.id], n.attr)})
    assert not missing, f"{_NAME[id(nb)]}: names the library no longer has: {missing}"


def test_every_preset_point_passes_its_point_functions_checks(nb):
    """Each run a notebook lists one by one (``<part>_points``), in both presets, passes the
    key and value rules of the point function it is run through (``protocol.check_points``),
    so a typo there is refused before any run instead of falling back to a full-size default."""
    from pmll_lab.experiments import carry, spec_decode, step
    from pmll_lab.experiments.protocol import pick_points

    keys = {("carry_protocol", "protocol_points"): carry.PROTOCOL_KEYS,
            ("carry_step", "drift_points"): step.DRIFT_KEYS,
            ("spec_decode", "oracle_points"): spec_decode.ORACLE_KEYS}
    cell: dict = {}
    exec(_code(nb)[0].source, cell)
    name_of = _NAME[id(nb)]
    for name in (n for n in cell if n.endswith("_points")):
        assert (name_of, name) in keys, f"{name_of}: {name} has no point rules in this test"
        for preset in ("quick", "full"):
            assert pick_points(cell[name], preset, name, keys[name_of, name]), (name, preset)
