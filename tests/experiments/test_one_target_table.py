"""Every report's targets are rows of the one target table (``experiments.target_table``): no
other module builds a ``Target``, and each report module's ``TARGETS`` and titles are the
table's rows for that report."""

from __future__ import annotations

import ast

import pandas as pd
import pytest
from _paths import ROOT

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.experiments import (carry_report, conv, gdn, pmll, pmll_attention, roofline_report,
                                  spec_decode_report, step)
from pmll_lab.experiments import target_table as TT


def test_no_module_but_the_table_builds_a_target():
    built = []
    for path in sorted((ROOT / "pmll_lab").rglob("*.py")):
        if path.name in ("target_table.py", "targets.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "Target"):
                built.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not built, f"targets built outside the target table: {built}"


@pytest.mark.parametrize("module, report", [
    (roofline_report, TT.ROOF_LAUNCH), (carry_report, TT.PROTO_LAUNCH), (gdn, TT.GDN_VERIFY),
    (conv, TT.CONV), (pmll, TT.PMLL_RING), (pmll_attention, TT.ATTENTION),
    (spec_decode_report, TT.SPEC), (step, TT.STEP)])
def test_each_report_takes_its_rows_from_the_table(module, report):
    assert module.TARGETS == TT.for_report(report)
    assert module.TARGET_SET == TT.SETS[report]
    assert module.TARGETS and all(report in t.reports for t in module.TARGETS)


def test_every_row_belongs_to_a_report_and_named_conditions_are_masks():
    assert all(set(t.reports) and set(t.reports) <= set(TT.SETS) for t in TT.TARGETS)
    rows = TT.for_report(TT.PMLL_RING)
    big = rows[0].where["bytes"]
    assert list(big(pd.Series([TT.L2_RINGS - 1, TT.L2_RINGS]))) == [False, True]
    assert all(not isinstance(v, str) or v not in TT.WHERE
               for r in TT.SETS for t in TT.for_report(r) for v in t.where.values())
    with pytest.raises(ValueError, match="notebook: no targets for 'rooflin'"):
        TT.for_report("rooflin")
