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
