"""FlashInfer's ReplaySSM verify and flush as a peer of the roofline and carry_protocol sweeps
(``pmll_lab.experiments.replayssm_peer``), on the CPU.

- Without FlashInfer (here): each variant is one ``unavailable`` row at a shape the kernels take,
  one ``unsupported`` row at another (fp32 pool, head size 16, K = 2), through the roofline's
  ``gdn_point`` and the carry sweep's ``replayssm_point`` too; nothing raises.
- The grids name the new points: the roofline's providers (all state dtypes, V-major, kept only
  where FlashInfer imports, as its other FlashInfer peers), the notebook's provider lists, the
  carry sweep's kernels.
- Check-then-time with a float64 stand-in for ``gated_delta_rule_mtp_ucache_flush`` (the ring
  read, the fold past ``flush_min``, the new rows appended, as its docstring says): both variants
  pass the check within the stated tolerance (2e-2, bf16 pool and ring) and are then timed; a
  stand-in whose outputs are 1.5x raises ``CheckFailed`` and nothing is timed.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
import pmll_lab.peers_replayssm as PR
from pmll_lab.experiments import carry as CE
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments import replayssm_peer as RS
from pmll_lab.experiments import roofline as E
from pmll_lab.peers import fused_gating
from pmll_lab.reference import carry as ref_carry
from pmll_lab.sweep import CheckFailed

SUPPORTED = dict(K=4, B=2, HK=1, HV=2, head_dim=128, dtype="bfloat16", state_dtype="bfloat16")


def test_rows_without_flashinfer():
    assert not RS.available()
    rows = RS.replayssm_rows(SUPPORTED)
    assert [r["kernel"] for r in rows] == list(RS.KERNELS)
    assert {r["status"] for r in rows} == {"unavailable"} and all(r["value"] == 1.0 for r in rows)
    assert [r["ring_fill"] for r in rows] == [8, 13]          # flush at 16 - K + 1
    for bad in (dict(state_dtype="float32"), dict(head_dim=16), dict(K=2)):
        rows = RS.replayssm_rows(dict(SUPPORTED, **bad))
        assert {r["status"] for r in rows} == {"unsupported"}, bad
        assert {r["metric"] for r in rows} == {"unsupported"} and "kd = vd = 128" in rows[0]["reason"]
    # the roofline's point function and the carry sweep's, same rows
    pt = dict(SUPPORTED, provider="flashinfer_replayssm", state_layout="vk", seed=0)
    got = E.gdn_point(pt)
    assert {(r["kernel"], r["status"], r["state_dtype"]) for r in got} == {
        (k, "unavailable", "bfloat16") for k in RS.KERNELS}
    got = E.gdn_point(dict(pt, head_dim=16, state_dtype="float32"))
    assert {r["status"] for r in got} == {"unsupported"}
    got = CE.replayssm_point(dict(SUPPORTED, state_dtype="float32"))    # its own bf16 pool
    assert {r["status"] for r in got} == {"unavailable"}


def test_grids_name_the_replayssm_points():
    assert "flashinfer_replayssm" in E.PROVIDERS and "flashinfer_replayssm" in E.PEERS
    assert "flashinfer_replayssm" in E.HALF_STATE_PROVIDERS
    assert set(RS.KERNELS) <= set(CE.KERNELS) and set(RS.KERNELS) <= set(CE.LABELS)
    grid = dict(K=[4], B=[2], head_dim=[128], heads=[(1, 2)], dtype=["bfloat16"],
                state_layout=["kv", "vk"], state_dtype=["float32", "bfloat16"])
    rs = [p for p in E.points([grid], fla=False, flashinfer=True)
          if p["provider"] == "flashinfer_replayssm"]
    assert {(p["state_layout"], p.get("state_dtype", "float32")) for p in rs} == {
        ("vk", "float32"), ("vk", "bfloat16")}
    assert not [p for p in E.points([grid], fla=False, flashinfer=False)
                if p["provider"] == "flashinfer_replayssm"]
    # the roofline's full sweep (harness/workloads.toml): its extra shapes (the lean provider
    # list, FLA in it) and its bf16 state pools list FlashInfer's ReplaySSM
    from pmll_lab.harness import workloads

    full = workloads.grids("roofline", "full")
    lean = [g for g in full if "fla_fused_recurrent" in g.get("providers", ())]
    half = [g for g in full if g.get("state_dtype") == ["bfloat16"]]
    assert lean and half
    assert all("flashinfer_replayssm" in g["providers"] for g in lean + half)


def _fake_flush(scale_out=1.0):
    """float64 stand-in for ``gated_delta_rule_mtp_ucache_flush`` (its docstring's contract)."""
    ns = PR.REPLAYSSM_RING_SLOTS

    def flush(A_log, a, dt_bias, *, q, k, v, b, initial_state_source, initial_state_indices,
              scale, output, k_cache, u_cache, g_cache, hist_len, cache_base, flush_min,
              restart_hist_on_flush):
        state, HV, HK = initial_state_source, v.shape[2], q.shape[2]
        ring = PR.ReplaySSMRing(k_cache, u_cache, g_cache, hist_len, cache_base)
        g, beta = fused_gating(A_log, a, dt_bias, b)
        for r in range(q.shape[0]):
            s, n, base = int(initial_state_indices[r]), int(hist_len[r]), int(cache_base[r])
            H = PR.replayssm_state(state, ring, r, s)
            G = g_cache[s, :, (base + n - 1) % ns].double() if n else torch.zeros(HV).double()
            if n >= flush_min:                          # fold, then the rows count from it
                state[s] = H.transpose(-1, -2).to(state.dtype)
                H = state[s].double().transpose(-1, -2)
                G = torch.zeros(HV).double()
            for t in range(q.shape[1]):
                qs, ks = ref_carry.prepare_qk(q[r, t].double(), k[r, t].double(), HV, scale=scale)
                H, o_t, u_t = ref_carry.decode_row(H, qs, ks, v[r, t].double(), g[r, t],
                                                   beta[r, t])
                output[r, t] = (o_t * scale_out).to(output.dtype)
                j, G = (base + n + t) % ns, G + g[r, t]
                k_cache[s, :, j] = ks[::HV // HK].to(k_cache.dtype)
                u_cache[s, :, j] = u_t.to(u_cache.dtype)
                g_cache[s, :, j] = G.float()
        return output

    return flush


SMALL_TIMING = dict(warmup_ms=1, rep_ms=1, cpu_reps=1, replays=1)


def test_check_then_time_with_a_float64_stand_in(monkeypatch):
    monkeypatch.setattr(RS, "available", lambda: True)
    monkeypatch.setattr(PR, "flashinfer_replayssm", lambda: (_fake_flush(), None))
    rows = RS.replayssm_rows(dict(SUPPORTED, seed=3), timing=SMALL_TIMING)
    for kern in RS.KERNELS:
        chk = [r for r in rows if r["kernel"] == kern and r["metric"] == "rel_l2"]
        assert {r["what"] for r in chk} == {"o", "state after commit"}
        assert all(r["passed"] and r["tolerance"] == RS.TOLERANCE == 2e-2 for r in chk), chk
        assert all(r["value"] > 0 for r in chk)               # bf16 ring: not bitwise
        t = [r for r in rows if r["kernel"] == kern and r["metric"] == "time_us"]
        assert t and t[0]["value"] > 0 and t[0]["variant"] == kern.split(":")[1]
        assert [r for r in rows if r["kernel"] == kern and r["metric"] == "gbps"][0]["bytes"] > 0


def test_a_wrong_peer_is_not_timed(monkeypatch):
    timed = []
    monkeypatch.setattr(RS, "available", lambda: True)
    monkeypatch.setattr(PR, "flashinfer_replayssm", lambda: (_fake_flush(1.5), None))
    monkeypatch.setattr(P, "time_launch", lambda fn, **kw: timed.append(fn) or {})
    with pytest.raises(CheckFailed) as info:
        RS.replayssm_rows(dict(SUPPORTED, seed=4), variants=("verify",), timing=SMALL_TIMING)
    assert timed == []
    assert any(r["passed"] is False and r["what"] == "o" for r in info.value.rows)
