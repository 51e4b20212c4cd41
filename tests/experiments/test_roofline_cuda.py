"""The roofline notebook's CUDA C++ twins as providers (``decodes_cuda``, ``chain_snapshots_cuda``):
left out without a GPU (one ``unavailable`` row if asked anyway), and with one checked against
the float64 chain before they are timed. On the CPU the Triton kernels stand in for the twins
(``_as_twin``), so the check-then-time path runs here; a wrong output fails a point untimed."""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from _roofline_helpers import SHAPE, fresh_cache, points as _points  # noqa: F401 (fresh_cache: autouse)
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import roofline as E
from pmll_lab.experiments import gdn_case as C
from pmll_lab.sweep import CheckFailed


def _cuda_point(D=16):
    """A V-major decodes point with the twin's provider name."""
    pt = E.points([dict(K=[2], B=[2], providers=["decodes"], state_layout=["vk"], **SHAPE)],
                  fla=False)[0]
    return dict(pt, provider="decodes_cuda", head_dim=D)


ON_GPU = pmll_lab.DEVICE.type == "cuda"


@pytest.mark.skipif(ON_GPU, reason="the CPU's answer: no CUDA twin without a GPU")
def test_decodes_cuda_left_out_without_a_gpu():
    assert "decodes_cuda" in E.PROVIDERS
    assert not [p for p in _points(2, 2, providers=["decodes_cuda"])]
    rows = E.gdn_point(_cuda_point())
    assert [(r["kernel"], r["status"]) for r in rows] == [("decodes_cuda", "unavailable")]
    assert "NVIDIA GPU" in rows[0]["reason"] and rows[0]["impl"] == "cuda"
    assert [E.impl_of(k) for k in ("decodes_cuda", "fla_fused_recurrent", "flashinfer_mtp",
                                   "carry_exact_lazy:wb", "chain_snapshots")] == \
        ["cuda", "fla", "flashinfer", "triton", "triton"]


def _as_twin(fn, scale=1.0):
    """The Triton decode standing in for the twin (the CPU has none): ``impl`` dropped."""
    def twin(*args, impl="triton", **kw):
        assert impl == "cuda"
        o = fn(*args, **kw)
        return o.mul_(scale)
    return twin


def test_decodes_cuda_checked_then_timed(monkeypatch):
    pt, big = _cuda_point(), _cuda_point(D=512)
    monkeypatch.setattr(E, "DEVICE", torch.device("cuda"))
    monkeypatch.setattr(C, "gdn_decode", _as_twin(C.gdn_decode))
    rows = E.gdn_point(pt)
    err = [r for r in rows if r["metric"] == "rel_l2"]
    assert {r["what"] for r in err} == {"o", "state"}
    assert all(r["passed"] and 0 < r["value"] <= r["tolerance"] for r in err)
    t = [r for r in rows if r["metric"] == "time_us"]
    assert t and all(r["kernel"] == "decodes_cuda" and r["value"] > 0 for r in t)
    assert {r["impl"] for r in rows} == {"cuda"}
    # kd above the twin's 256 keys: unsupported, nothing run
    big = E.gdn_point(big)
    assert [(r["kernel"], r["status"]) for r in big] == [("decodes_cuda", "unsupported")]


def test_decodes_cuda_wrong_output_fails_before_timing(monkeypatch):
    timed, pt = [], _cuda_point()
    monkeypatch.setattr(E, "DEVICE", torch.device("cuda"))
    monkeypatch.setattr(P, "time_launch", lambda fn, **kw: timed.append(fn) or {})
    monkeypatch.setattr(C, "gdn_decode", _as_twin(C.gdn_decode, scale=1.5))
    with pytest.raises(CheckFailed):
        E.gdn_point(pt)
    assert timed == []


@pytest.mark.skipif(ON_GPU, reason="the CPU's answer: no CUDA twin without a GPU")
def test_chain_cuda_left_out_without_a_gpu():
    """The chain's twin without a GPU: no point, and a point given anyway is one
    ``unavailable`` row."""
    pt = dict(_cuda_point(), provider="chain_snapshots_cuda")
    assert "chain_snapshots_cuda" in E.PROVIDERS and "chain_snapshots_cuda" in E.CUDA_TWINS
    assert not _points(2, 2, providers=["chain_snapshots_cuda"])
    rows = E.gdn_point(pt)
    assert [(r["kernel"], r["status"], r["impl"]) for r in rows] == [
        ("chain_snapshots_cuda", "unavailable", "cuda")]


def test_chain_cuda_runs_from_k2_checked_against_float64_then_timed(monkeypatch):
    """With a GPU (the Triton chain standing in for the twin): points from K = 2 only (at K = 1
    the chain is one decode); outputs, state and snapshots checked against the float64 chain
    before the timing, every row ``impl="cuda"``; a wrong snapshot fails the point untimed."""
    pt = dict(_cuda_point(), provider="chain_snapshots_cuda")
    monkeypatch.setattr(E, "DEVICE", torch.device("cuda"))
    grid = [dict(K=[1, 2], B=[2], providers=["chain_snapshots_cuda"], state_layout=["vk"],
                 **SHAPE)]
    assert [p["K"] for p in E.points(grid, fla=False)] == [2]
    monkeypatch.setattr(C, "gdn_chain", _as_twin(C.gdn_chain))
    rows = E.gdn_point(pt)
    err = [r for r in rows if r["metric"] == "rel_l2"]
    assert {r["what"] for r in err} == {"o", "state", "snapshots"}
    assert all(r["passed"] and 0 < r["value"] <= r["tolerance"] for r in err)
    t = [r for r in rows if r["metric"] == "time_us"]
    assert t and all(r["kernel"] == "chain_snapshots_cuda" and r["value"] > 0 for r in t)
    assert {r["impl"] for r in rows} == {"cuda"}

    twin = C.gdn_chain

    def bad_snapshots(*args, intermediate=None, impl="triton", **kw):
        o = twin(*args, intermediate=intermediate, impl=impl, **kw)
        intermediate.mul_(1.5)
        return o

    timed = []
    monkeypatch.setattr(P, "time_launch", lambda fn, **kw: timed.append(fn) or {})
    monkeypatch.setattr(C, "gdn_chain", bad_snapshots)
    with pytest.raises(CheckFailed):
        E.gdn_point(pt)
    assert timed == []
