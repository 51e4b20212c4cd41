"""``pmll_lab.models`` refuses a transformers release outside its range, naming it, before any
step (the GPU image's 5.17 builds attention masks that do not match the serving cache: every
model point failed with a shape error deep in a step)."""

from __future__ import annotations

import importlib
import re
import tomllib

import pytest

from _paths import ROOT
from pmll_lab.models import common


@pytest.fixture
def version(monkeypatch):
    def set_version(v):
        # the module as check_transformers will import it (building a model may re-import it)
        monkeypatch.setattr(importlib.import_module("transformers"), "__version__", v)
        common.check_transformers.cache_clear()
    yield set_version
    common.check_transformers.cache_clear()


@pytest.mark.parametrize("found", ["5.17.0", "4.57.1", "6.0.0", "6.1.0.dev0"])
def test_refuses_a_release_outside_the_range(version, found):
    version(found)
    with pytest.raises(RuntimeError, match=rf"transformers {re.escape(found)}: .*>=5\.24,<6\.0"):
        common.check_transformers()


@pytest.mark.parametrize("found", ["5.24.0", "5.25.0", "5.99.1.dev3"])
def test_takes_a_release_inside_the_range(version, found):
    version(found)
    assert common.check_transformers() == found


def test_generation_refuses_before_any_step(version):
    from pmll_lab.models.generate import greedy_generate
    from pmll_lab.models.qwen3_next import build_model, tiny_config

    model = build_model(tiny_config())
    version("5.17.0")
    with pytest.raises(RuntimeError, match="transformers 5.17.0"):
        greedy_generate(model, [[1, 2, 3]], max_new_tokens=2)


def test_range_is_the_models_extra():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["models"]
    (lo, hi) = common.TRANSFORMERS_RANGE
    assert extra == [f"transformers>={lo[0]}.{lo[1]},<{hi[0]}"], extra
