"""Hygiene of the committed notebooks: valid, outputs stripped, papermill-ready.

Running them is `make report`'s job (quick preset in CI); this file only reads them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_workbench_has_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb: `make report` would run nothing"


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def nb(request):
    notebook = nbformat.read(request.param, as_version=4)
    nbformat.validate(notebook)
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
            assert isinstance(value, ast.Dict) and {ast.literal_eval(k) for k in value.keys} == \
                {"quick", "full"}, f"{name}: a dict with the presets quick and full"


def test_readme_names_every_part_parameter(nb):
    """README's "Notebook parameters" table lists each ``<part>_grids`` / ``<part>_points`` a
    notebook takes, so a reader can find every sweep's knob without opening the notebook."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
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


def test_every_preset_grid_passes_the_axis_checks(nb):
    """Each grid of every preset (the full one too, which only the H200 runs) passes the
    protocol's axis checks (``protocol.grid_points``: integer axes at or above their least
    value, every axis a list), so a run on the GPU cannot stop there."""
    from pmll_lab.experiments import protocol as P

    cell: dict = {}
    exec(_code(nb)[0].source, cell)      # the parameters cell: plain assignments
    params = {name: value for name, value in cell.items()
              if name == "grids" or name.endswith("_grids")}
    assert params
    for name, presets in params.items():
        for preset, grids in presets.items():
            for g in grids:
                assert P.grid_points([g], {"seed": [0]}), f"{name}[{preset!r}]: no points"
