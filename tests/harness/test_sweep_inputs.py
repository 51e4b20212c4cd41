"""``run_sweep``'s inputs: point identities of numpy/torch parameters, and the checks that run
before anything is stored."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.sweep import grid, load, point_id, run_sweep


def _fn(calls):
    def fn(p):
        calls.append(dict(p))
        return [{"kernel": "k", "metric": "m", "value": float(p["B"]) * 2}]
    return fn


@pytest.mark.parametrize("first_numpy", [True, False], ids=["numpy-then-int", "int-then-numpy"])
def test_numpy_and_python_points_share_ids(tmp_path, first_numpy):
    np_grid = grid(B=np.array([1, 5]), on=[np.bool_(True)], x=[np.float32(0.5)])
    py_grid = grid(B=[1, 5], on=[True], x=[0.5])
    a, b = (np_grid, py_grid) if first_numpy else (py_grid, np_grid)
    calls: list = []
    run_sweep("s", a, _fn(calls), results_dir=tmp_path, progress=False)
    df = run_sweep("s", b, _fn(calls), results_dir=tmp_path, progress=False)
    assert len(calls) == 2, "the second grid ran its points again"
    assert len(df) == 2 and sorted(df["B"].tolist()) == [1, 5]
    stored = load(tmp_path / "s.jsonl")
    assert len(stored) == 2 and stored["point_id"].nunique() == 2, "duplicate rows"
    assert set(stored["point_id"]) == {point_id(p) for p in py_grid}


def test_point_id_reads_scalars_as_python_values():
    p = {"B": 4, "K": 2, "dtype": "bf16", "on": False, "r": 0.25, "shape": [2, 3]}
    q = {"B": np.int64(4), "K": torch.tensor(2), "dtype": "bf16", "on": np.bool_(False),
         "r": np.float32(0.25), "shape": (np.int32(2), torch.tensor(3))}
    assert point_id(q) == point_id(p)
    assert point_id({"B": 1}) != point_id({"B": "1"}) != point_id({"B": True})


def test_bad_point_fn_and_points_refused_before_anything_is_stored(tmp_path):
    out = tmp_path / "r"
    fn = _fn([])
    for bad in (None, "fn", 3):
        with pytest.raises(ValueError, match=r"^point_fn: "):
            run_sweep("x", grid(B=[1, 2]), bad, results_dir=out, progress=False)
    for bad in ([1, 2], [{"B": 1}, None], {"B": 1}, 5, "ab"):
        with pytest.raises(ValueError, match=r"^points: "):
            run_sweep("x", bad, fn, results_dir=out, progress=False)
    with pytest.raises(ValueError, match=r"^client: "):
        run_sweep("x", grid(B=[1]), fn, results_dir=out, progress=False, client="garbage")
    assert not out.exists(), "a refused sweep created its results folder"
    df = run_sweep("x", grid(B=[1, 2]), fn, results_dir=out, progress=False)
    assert (df["status"] == "ok").all() and len(df) == 2      # nothing stored as failed before


@pytest.mark.parametrize("axis", ["device", "timestamp", "commit", "status", "point_rows",
                                  "worker", "import_settings", "value"])
def test_an_axis_named_like_a_stored_column_is_refused(tmp_path, axis):
    """Every stored row carries its point's provenance and outcome under fixed names; an axis
    of one of those names would be overwritten in each row (the parameter lost), so it is
    refused, naming the axis, before the results folder exists."""
    out = tmp_path / "r"
    with pytest.raises(ValueError, match=rf"^points: axis '{axis}' \(entry 0\) is named like "
                                         rf"a column every stored row has"):
        run_sweep("x", grid(B=[1], **{axis: ["H200"]}), _fn([]), results_dir=out,
                  progress=False)
    assert not out.exists()


@pytest.mark.parametrize("name", ["a\x00b", "a\nb", "x" * 201, "é" * 101])
def test_a_name_no_file_can_take_is_refused_before_the_folder_exists(tmp_path, name):
    """A NUL or other control character, or a name longer than a file name may be with its
    suffixes, fails naming ``name`` before ``results_dir`` is created; 200 bytes still run."""
    out = tmp_path / "r"
    with pytest.raises(ValueError, match=r"^name: "):
        run_sweep(name, grid(B=[1]), _fn([]), results_dir=out, progress=False)
    assert not out.exists()
    df = run_sweep("y" * 200, grid(B=[1, 2]), _fn([]), results_dir=out, progress=False)
    assert sorted(df["value"]) == [2.0, 4.0]
    assert (out / ("y" * 200 + ".jsonl")).is_file()
