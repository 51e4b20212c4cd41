"""pmll_lab.peers' FlashInfer helpers and the roofline's FlashInfer providers, on the CPU.

FlashInfer is GPU-only and not installed here (nor in CI). What is held here without it:

- ``fused_gating`` against the gating formula written out in float64 (both softplus branches);
- where flashinfer-python does not import, every helper says so instead of raising, and the
  runners raise ``RuntimeError``;
- the runners and ``roofline_providers.point_flashinfer`` against FlashInfer's *documented contract*
  (``flashinfer/gdn_decode.py`` of 0.7.2.post1: V-major fp32 pool ``[S, HV, vd, kd]`` addressed by
  slot indices, gating from ``A_log, a, dt_bias, b``, ``intermediate_states_buffer [B, K, HV, vd,
  kd]`` holding the state after every row, ``disable_state_update`` leaving the pool alone),
  implemented below in float64 from our reference: the runners' arguments reach it as the
  contract says, the provider's checks pass on it with real values, and a contract misread
  (the buffer holding the state *before* each row) fails the checks before anything is timed.
  FlashInfer's own kernels are exercised only on a GPU (the roofline notebook's full preset).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab import peers
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import roofline as E
from pmll_lab.experiments import roofline_providers
from pmll_lab.reference.gdn import gdn_chain_ref
from pmll_lab.sweep import CheckFailed


def test_fused_gating_matches_the_formula():
    gen = torch.Generator().manual_seed(1234)
    HV = 6
    A_log = torch.rand(HV, generator=gen) * 2 - 1
    dt_bias = torch.randn(HV, generator=gen)
    a = torch.randn(3, 4, HV, generator=gen) * 15          # both sides of the threshold 20
    a[0, 0] = torch.tensor([25.0, 19.5, 20.5, -30.0, 0.0, 40.0]) - dt_bias
    b = torch.randn(3, 4, HV, generator=gen) * 3
    g, beta = peers.fused_gating(A_log, a, dt_bias, b)
    x = a.double() + dt_bias.double()
    softplus = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    assert g.dtype == torch.float64 and beta.dtype == torch.float64
    torch.testing.assert_close(g, -torch.exp(A_log.double()) * softplus, rtol=1e-13, atol=0)
    torch.testing.assert_close(beta, 1 / (1 + torch.exp(-b.double())), rtol=1e-13, atol=0)
    assert (g <= 0).all() and ((beta > 0) & (beta < 1)).all()
    g32, _ = peers.fused_gating(A_log, a, dt_bias, b, dtype=torch.float32)
    assert g32.dtype == torch.float32
    torch.testing.assert_close(g32.double(), g, rtol=2e-6, atol=1e-30)


def test_helpers_without_flashinfer():
    if peers.flashinfer_gdn() is not None:       # installed: the status names the version
        assert peers.flashinfer_status().startswith("FlashInfer ")
        return
    assert peers.flashinfer_status() == "FlashInfer: not installed"
    assert peers.flashinfer_available() is False and peers.flashinfer_version() == ""
    t = torch.zeros(1, 2, 1, 128)
    with pytest.raises(RuntimeError, match="flashinfer"):
        peers.flashinfer_mtp_runner(t, t, t, t[0, 0, 0], t[..., 0], t[0, 0, 0], t[..., 0],
                                    torch.zeros(1, 1, 128, 128), torch.zeros(1, dtype=torch.int32),
                                    scale=1.0, snapshots=True, frozen=True)
    assert peers.flashinfer_supports(128, "bfloat16") and not peers.flashinfer_supports(64, "bfloat16")
    assert not peers.flashinfer_supports(128, "float32")


# ---- FlashInfer's documented contract, in float64 ------------------------------------------------

class Contract:
    """``gated_delta_rule_decode_pretranspose`` / ``gated_delta_rule_mtp`` as documented, computed
    with our float64 reference; records the keyword arguments of each call."""

    def __init__(self, misread_buffer: bool = False):
        self.calls: list[dict] = []
        self.misread_buffer = misread_buffer

    def _core(self, q, k, v, pool, idx, A_log, a, dt_bias, b, scale, output, buf, frozen):
        slots = idx.long()
        g, beta = peers.fused_gating(A_log, a, dt_bias, b)
        h0 = pool[slots].transpose(-1, -2).double()            # V-major pool -> [B, HV, kd, vd]
        half = pool.dtype if pool.dtype != torch.float32 else None   # a bf16 pool's rounding
        o, h, inter = gdn_chain_ref(h0, q, k, v, g, beta, scale=scale, state_dtype=half,
                                    state_layout="kv")
        output.copy_(o.to(output.dtype))
        if buf is not None:
            K = q.shape[1]
            states = torch.cat([inter, h[:, None]], 1)         # after rows 0..K-1
            if self.misread_buffer:                            # the state before each row
                states = torch.cat([h0[:, None], inter], 1)
            buf[:, :K].copy_(states.transpose(-1, -2).to(buf.dtype))
        if not frozen:
            pool[slots] = h.transpose(-1, -2).to(pool.dtype)

    def decode(self, q, k, v, state, A_log, a, dt_bias, b, scale=None, output=None,
               use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
               intermediate_states_buffer=None, disable_state_update=False, **kw):
        """T = 1 on any pool; T > 1 (with the per-row buffer and ``disable_state_update``) on a
        bf16 pool only: 0.7.2.post1 routes that to its bf16 MTP kernel."""
        self.calls.append(dict(kind="decode", state=state, scale=scale, use_qk_l2norm=use_qk_l2norm,
                               buffer=intermediate_states_buffer,
                               disable_state_update=disable_state_update, **kw))
        assert state is None and use_qk_l2norm
        assert q.shape[1] == 1 or initial_state.dtype == torch.bfloat16
        if intermediate_states_buffer is not None:
            assert intermediate_states_buffer.dtype == initial_state.dtype
        self._core(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale,
                   output, intermediate_states_buffer, disable_state_update)
        return output, initial_state

    def mtp(self, q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale=None,
            output=None, intermediate_states_buffer=None, disable_state_update=None,
            use_qk_l2norm=True, **kw):
        self.calls.append(dict(kind="mtp", disable_state_update=disable_state_update,
                               buffer=intermediate_states_buffer, scale=scale, **kw))
        assert q.shape[1] > 1 and use_qk_l2norm and disable_state_update is not None
        self._core(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale,
                   output, intermediate_states_buffer, disable_state_update)
        return output, initial_state


def _fake_flashinfer(monkeypatch, contract):
    monkeypatch.setattr(peers, "flashinfer_gdn", lambda: (contract.decode, contract.mtp))
    monkeypatch.setattr(peers, "flashinfer_version", lambda: "contract-float64")


def test_runners_follow_the_contract(monkeypatch):
    contract = Contract()
    _fake_flashinfer(monkeypatch, contract)
    gen = torch.Generator().manual_seed(7)
    B, K, S, HK, HV, D = 3, 3, 5, 2, 4, 16
    q, k = (torch.randn(B, K, HK, D, generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, K, HV, D, generator=gen).bfloat16()
    A_log, dt_bias = torch.rand(HV, generator=gen) - 0.5, torch.zeros(HV)
    a, b = (torch.randn(B, K, HV, generator=gen).bfloat16() for _ in range(2))
    pool0 = torch.randn(S, HV, D, D, generator=gen) * 0.1
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    g, beta = peers.fused_gating(A_log, a, dt_bias, b)
    o_ref, h_ref, i_ref = gdn_chain_ref(pool0[slots.long()].transpose(-1, -2).double(),
                                        q, k, v, g, beta, scale=D ** -0.5, state_layout="kv")
    pool = pool0.clone()
    run, bufs = peers.flashinfer_mtp_runner(q, k, v, A_log, a, dt_bias, b, pool, slots,
                                            scale=D ** -0.5, snapshots=True, frozen=True)
    run()
    call = contract.calls[-1]
    assert call["disable_state_update"] is True and call["scale"] == D ** -0.5
    assert tuple(bufs["intermediate"].shape) == (B, K, HV, D, D)
    assert torch.equal(pool, pool0)
    torch.testing.assert_close(bufs["o"].double(), o_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(bufs["intermediate"][:, K - 1].double(),
                               h_ref.transpose(-1, -2), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bufs["intermediate"][:, :K - 1].double(),
                               i_ref.transpose(-1, -2), rtol=1e-5, atol=1e-6)
    run, bufs = peers.flashinfer_mtp_runner(q, k, v, A_log, a, dt_bias, b, pool, slots,
                                            scale=D ** -0.5, snapshots=False, frozen=True)
    run()
    assert bufs["intermediate"] is None and contract.calls[-1]["buffer"] is None
    run, bufs = peers.flashinfer_decode_runner(q[:, :1], k[:, :1], v[:, :1], A_log, a[:, :1],
                                               dt_bias, b[:, :1], pool, slots, scale=D ** -0.5)
    run()
    o1, h1, _ = gdn_chain_ref(pool0[slots.long()].transpose(-1, -2).double(), q[:, :1], k[:, :1],
                              v[:, :1], g[:, :1], beta[:, :1], scale=D ** -0.5, state_layout="kv")
    torch.testing.assert_close(pool[slots.long()].double(), h1.transpose(-1, -2), rtol=1e-5,
                               atol=1e-6)
    untouched = torch.ones(S, dtype=torch.bool)
    untouched[slots.long()] = False
    assert torch.equal(pool[untouched], pool0[untouched])
    with pytest.raises(ValueError, match="state"):
        peers.flashinfer_mtp_runner(q, k, v, A_log, a, dt_bias, b, pool.transpose(-1, -2)[:, :, :8],
                                    slots, scale=1.0, snapshots=False, frozen=True)


def _fi_points(K, B, provider, state_dtype="float32"):
    return [p for p in E.points([dict(K=[K], B=[B], head_dim=[16], heads=[(2, 4)],
                                      dtype=["bfloat16"], providers=[provider],
                                      state_dtype=[state_dtype])],
                                fla=False, flashinfer=True) if p["provider"] == provider]


@pytest.mark.parametrize("provider,K", [("flashinfer_decode", 1), ("flashinfer_mtp_snapshots", 3),
                                        ("flashinfer_mtp_frozen", 2)])
def test_flashinfer_point_checks_then_times(monkeypatch, provider, K):
    E.release()
    contract = Contract()
    _fake_flashinfer(monkeypatch, contract)
    monkeypatch.setattr(E, "flashinfer_supports", lambda head_dim, dtype: True)
    monkeypatch.setattr(P, "on_cuda", lambda: True)
    (pt,) = _fi_points(K, 2, provider)
    assert pt["state_layout"] == "vk"
    rows = E.gdn_point(pt)
    checks = [r for r in rows if "passed" in r]
    assert checks and all(r["passed"] for r in checks)
    errs = [r for r in rows if r["metric"] == "rel_l2"]
    assert all(math.isfinite(r["value"]) and r["value"] <= r["tolerance"] for r in errs)
    whats = {r["what"] for r in errs}
    assert {"o", "o vs decode"} <= whats
    if provider == "flashinfer_mtp_snapshots":
        assert {"snapshots", "state", "snapshots vs decode", "state vs decode"} <= whats
    if provider != "flashinfer_decode":
        assert [r for r in rows if r["metric"] == "state_untouched"][0]["passed"]
    t = [r for r in rows if r["metric"] == "time_us"]
    assert len(t) == 1 and t[0]["value"] > 0 and t[0]["flashinfer_version"] == "contract-float64"
    hb = 4 * 16 * 16 * 4
    nbytes = [r for r in rows if r["metric"] == "gbps"][0]["bytes"]
    per_seq_state = {"flashinfer_decode": 2 * hb, "flashinfer_mtp_snapshots": (K + 1) * hb,
                     "flashinfer_mtp_frozen": hb}[provider]
    assert per_seq_state * 2 < nbytes < per_seq_state * 2 + 2 * K * 2000
    E.release()


def test_flashinfer_point_catches_a_misread_buffer(monkeypatch):
    E.release()
    _fake_flashinfer(monkeypatch, Contract(misread_buffer=True))
    monkeypatch.setattr(E, "flashinfer_supports", lambda head_dim, dtype: True)
    monkeypatch.setattr(P, "on_cuda", lambda: True)
    timed = []
    monkeypatch.setattr(P, "time_launch", lambda fn, **kw: timed.append(fn) or {})
    (pt,) = _fi_points(3, 2, "flashinfer_mtp_snapshots")
    with pytest.raises(CheckFailed) as info:
        E.gdn_point(pt)
    assert timed == []
    bad = {r["what"] for r in info.value.rows if r.get("passed") is False}
    assert "snapshots" in bad and "state" in bad
    E.release()


class DividesByZero(Contract):
    """FlashInfer whose K-row kernel raises inside its own code, as 0.7.2.post1 and 0.7.4 do at
    head size 256 (H100 and H200)."""

    def mtp(self, *args, **kwargs):
        raise ZeroDivisionError("integer division or modulo by zero")


def _raising_in_our_code():
    """A stand-in for our runner that divides by zero in a file of ``pmll_lab``."""
    scope = {}
    exec(compile("def runner(*args, **kwargs):\n    return 1 // 0\n",
                 peers.__file__, "exec"), scope)
    return scope["runner"]


@pytest.mark.parametrize("where", ["flashinfer", "ours"])
def test_a_division_by_zero_is_the_peers_limit_only_inside_flashinfer(monkeypatch, where):
    """Raised inside FlashInfer's code, the point gives one ``unsupported`` row whose reason
    names the version and the head size, nothing timed; raised in ours (our runner), it fails
    the point as any error of ours does."""
    E.release()
    _fake_flashinfer(monkeypatch, DividesByZero() if where == "flashinfer" else Contract())
    if where == "ours":
        monkeypatch.setattr(peers, "flashinfer_mtp_runner", _raising_in_our_code())
    monkeypatch.setattr(E, "flashinfer_supports", lambda head_dim, dtype: True)
    monkeypatch.setattr(P, "on_cuda", lambda: True)
    timed = []
    monkeypatch.setattr(P, "time_launch", lambda fn, **kw: timed.append(fn) or {})
    (pt,) = _fi_points(2, 2, "flashinfer_mtp_frozen")
    if where == "ours":
        with pytest.raises(ZeroDivisionError):
            E.gdn_point(pt)
    else:
        (row,) = E.gdn_point(pt)
        assert row["kernel"] == "flashinfer_mtp_frozen" and row["status"] == "unsupported"
        assert row["reason"].startswith("FlashInfer contract-float64 fails inside its own "
                                        "launcher at head size 16 (ZeroDivisionError")
        (line,) = P.not_run(pd.DataFrame([dict(row, point_id="p")])).to_dict("records")
        assert line["kernel"] == "flashinfer_mtp_frozen" and line["points"] == 1
        assert line["reason"].startswith("FlashInfer contract-float64 fails inside")
    assert timed == []
    E.release()


def test_flashinfer_providers_need_a_gpu_and_vk():
    pts = E.points([dict(K=[1, 2], B=[2], head_dim=[128], heads=[(2, 4)], dtype=["bfloat16"],
                         state_layout=["kv"])], fla=True, flashinfer=True)
    prov = {(p["provider"], p["K"], p["state_layout"]) for p in pts}
    assert ("flashinfer_decode", 1, "vk") in prov and ("flashinfer_decode", 2, "vk") not in prov
    assert ("flashinfer_mtp_snapshots", 2, "vk") in prov and ("flashinfer_mtp_frozen", 1, "vk") not in prov
    assert ("fla_fused_recurrent", 1, "kv") in prov
    assert not any(p["state_layout"] == "vk" and p["provider"] in E.OURS for p in pts)
    small = E.points([dict(K=[2], B=[2], head_dim=[64], heads=[(2, 4)], dtype=["bfloat16"])],
                     fla=False, flashinfer=True)
    assert not any(p["provider"] in E.FLASHINFER for p in small)     # kd < 128: FlashInfer asserts
    bad = dict(pts[0], provider="flashinfer_decode", state_layout="kv")
    with pytest.raises(ValueError, match="state_layout"):
        E.gdn_point(bad)


@pytest.mark.parametrize("provider,K", [("flashinfer_decode", 1), ("flashinfer_mtp_snapshots", 3),
                                        ("flashinfer_mtp_frozen", 2)])
def test_flashinfer_bf16_state_points(monkeypatch, provider, K):
    """At a bf16-state point FlashInfer gets a bf16 pool through its pretranspose entry point
    (T = K; the per-row buffer in bf16), is checked against the float64 reference with bf16
    rounding points and our bf16-state decodes, and its rows say so."""
    E.release()
    contract = Contract()
    _fake_flashinfer(monkeypatch, contract)
    monkeypatch.setattr(E, "flashinfer_supports", lambda head_dim, dtype, state_dtype="float32": True)
    monkeypatch.setattr(P, "on_cuda", lambda: True)
    (pt,) = _fi_points(K, 2, provider, "bfloat16")
    rows = E.gdn_point(pt)
    call = contract.calls[-1]
    assert call["kind"] == "decode"
    if call["buffer"] is not None:
        assert call["buffer"].dtype == torch.bfloat16
    checks = [r for r in rows if "passed" in r]
    assert checks and all(r["passed"] for r in checks)
    assert all(r["what"].endswith("[bfloat16 state]") for r in checks)
    assert all(r.get("state_dtype") == "bfloat16" for r in rows)
    hb = 4 * 16 * 16 * 2                                      # a bf16 state: 2 bytes
    nbytes = [r for r in rows if r["metric"] == "gbps"][0]["bytes"]
    per_seq_state = {"flashinfer_decode": 2 * hb, "flashinfer_mtp_snapshots": (K + 1) * hb,
                     "flashinfer_mtp_frozen": hb}[provider]
    assert per_seq_state * 2 < nbytes < per_seq_state * 2 + 2 * K * 2000
    assert not peers.flashinfer_supports(64, "bfloat16", "bfloat16")
    assert peers.flashinfer_supports(128, "bfloat16", "bfloat16")
    assert not peers.flashinfer_supports(128, "bfloat16", "float16")
    E.release()


def test_flashinfer_installed_as_a_namespace_package_is_still_recognised(monkeypatch, tmp_path):
    """A FlashInfer package without ``__file__`` (a namespace package: its ``__path__`` only):
    an error raised in a file under that path is FlashInfer's."""
    import sys
    import types

    pkg = types.ModuleType("fakefi")
    pkg.__path__ = [str(tmp_path)]
    monkeypatch.setitem(sys.modules, "fakefi", pkg)
    scope = {"__name__": "fakefi.gdn_decode"}
    exec(compile("def mtp(*a, **k):\n    return 1 // 0\n", str(tmp_path / "gdn_decode.py"),
                 "exec"), scope)
    monkeypatch.setattr(peers, "flashinfer_gdn", lambda: (scope["mtp"], scope["mtp"]))
    with pytest.raises(ZeroDivisionError) as info:
        scope["mtp"]()
    assert peers.raised_inside_flashinfer(info.value)
    with pytest.raises(ZeroDivisionError) as ours:
        _raising_in_our_code()()
    assert not peers.raised_inside_flashinfer(ours.value)
