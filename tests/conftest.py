"""Shared by every test folder (tests are in folders per family: ``gdn/``, ``carry/``, ``conv/``,
``pmll/``, ``cuda/``, ``launchers/``, ``harness/``, ``experiments/``, ``reports/``, ``project/``,
``models/``).

Puts ``tests/`` and every folder holding a helper module (``_*.py``) on ``sys.path``, so a test
imports them by name from any folder (``from _paths import ROOT``, ``from _carry_helpers import
...``) as when the tests were one flat folder. Test file basenames stay unique across folders
(pytest's default ``prepend`` import mode, no ``__init__.py``). Imports nothing of ``pmll_lab``:
each test module imports it first (it picks the GPU or the Triton interpreter).
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

for _folder in (TESTS, *sorted({p.parent for p in TESTS.glob("*/_*.py")})):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
