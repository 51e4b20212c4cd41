"""Shared by the roofline notebook's tests (test_roofline.py, test_roofline_report.py,
test_roofline_cuda.py): the tiny interpreter shape, point lists and a fresh case cache."""

import pytest

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.experiments import roofline as E

SHAPE = dict(head_dim=[16], heads=[(2, 4)], dtype=["bfloat16"])
"""HK=2, HV=4, kd=vd=16, bf16 inputs: what the interpreter runs in seconds."""

OURS = [p for p in E.OURS if p not in E.CUDA_TWINS]
"""Our Triton providers (the CUDA twins' points: test_roofline_cuda.py)."""


def points(K, B, providers=OURS, **kw):
    """The roofline points of one ``K`` and ``B`` at ``SHAPE`` (no FLA)."""
    return E.points([dict(K=[K], B=[B], providers=providers, **SHAPE)], fla=False, **kw)


@pytest.fixture(autouse=True)
def fresh_cache():
    """The experiment's case cache emptied before and after each test of a module that imports
    this fixture (autouse there)."""
    E.release()
    yield
    E.release()
