"""The project root, wherever a test file sits under ``tests/`` (``tests/conftest.py`` puts this
module on ``sys.path``): ``from _paths import ROOT``."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (``pyproject.toml``, ``README.md``, ``pmll_lab/``, ``notebooks/``...)."""
