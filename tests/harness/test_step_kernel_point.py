"""carry_step's single-verify point (``experiments.step.kernel_point``) on the CPU: our ring
verify checked against the float64 ring reference (``STEP_TOL["bfloat16"]``), FlashInfer's
ReplaySSM verify absent here (GPU only), and a peer whose ``available`` raises as a failed row."""

from __future__ import annotations

import pytest

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.experiments import step as S
from pmll_lab.harness import registry
from pmll_lab.tolerances import STEP_TOL

POINT = dict(B=2, K=4, HK=1, HV=2, head_dim=16, state_dtype="bfloat16", alpha=0.8, seed=3)


@pytest.mark.parametrize("fill", [4, 13])          # 13 + K > 16: the verify folds
def test_kernel_point_checks_our_ring_verify(fill):
    rows = S.kernel_point(dict(POINT, fill=fill))
    (chk,) = [r for r in rows if r["kernel"] == "ring_verify" and r["metric"] == "rel_l2"]
    assert chk["tolerance"] == STEP_TOL["bfloat16"]
    assert 0 < chk["value"] <= chk["tolerance"] and chk["status"] == "ok"
    assert not [r for r in rows if r["kernel"] == "flashinfer_ucache_flush"]   # GPU only


def test_kernel_point_reports_a_peer_whose_available_raises(monkeypatch):
    peer = registry.get(S.SF.REPLAYSSM.name)

    original = type(peer).unavailable

    def broken(self):
        if self.name == peer.name:
            raise RuntimeError("libcuda.so.1: cannot open shared object file")
        return original(self)

    monkeypatch.setattr(type(peer), "unavailable", broken)
    rows = S.kernel_point(dict(POINT, fill=4))
    (bad,) = [r for r in rows if r["kernel"] == "flashinfer_ucache_flush"]
    assert bad["status"] == "failed" and "libcuda.so.1" in bad["error"]
    assert [r["status"] for r in rows if r["kernel"] == "ring_verify"][0] == "ok"
