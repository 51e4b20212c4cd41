"""A sweep's points are checked before any of them runs: a value a point function would refuse
(a form, provider, gate or ring length misspelt, a K beyond the kernels' bound, a missing axis)
is a ``ValueError`` naming the axis when the notebook builds its points, not a failed point
after the sweeps before it ran."""

from __future__ import annotations

import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.experiments import protocol as P


def test_pmll_attention_points_check_providers_gates_shapes_and_impls():
    from pmll_lab.experiments import pmll_attention as E

    speed = dict(B=[2], M=[16], T=[16], dtype=["bfloat16"], shape=[[2, 64]])
    one = E.points([dict(speed, providers=["fused", "sdpa_causal"])])
    assert [p["providers"] for p in one] == ["fused", "sdpa_causal"]
    for over, said in ((dict(providers=["fused", "sdpa_casual"]), "axis providers: .*'sdpa_casual'"),
                       (dict(shape=[[0, 64]]), r"axis shape must list \(H, D\) pairs of ints >= 1"),
                       (dict(shape=[64]), r"axis shape must list \(H, D\) pairs, got 64")):
        with pytest.raises(ValueError, match=said):
            E.points([dict(speed, **over)])
    evict = dict(layers=[2], heads=[2], head_dim=[64], vocab=[128], tokens=[48], batch=[2],
                 segment=[16], capacity=[8], gate=["none", "0.9"], impl=["fused"])
    assert len(E.points([evict], sweep="eviction")) == 2
    with pytest.raises(ValueError, match=r"axis gate: \"none\" or a blend weight .* got '0,9'"):
        E.points([dict(evict, gate=["none", "0,9"])], sweep="eviction")
    with pytest.raises(ValueError, match=r"axis impl: 'fusde' is not one of fused, reference"):
        E.points([dict(evict, impl=["fusde"])], sweep="eviction")


def test_tokens_points_check_k_ring_length_and_forced_reject():
    from pmll_lab.experiments import tokens as E

    spec = next(g for g in P.pick("tokens", "quick") if "K" in g)
    assert E.points([spec])
    with pytest.raises(ValueError, match=r"^grids: axis K: must be >= 2 and <= 8, got 9"):
        E.points([dict(spec, K=[9])])
    with pytest.raises(ValueError, match=r"^grids: axis ring_length: must be one of \[8, 16, 32\]"):
        E.points([dict(spec, form=["ring"], ring_length=[12])])
    with pytest.raises(ValueError, match=r"^grids: speculative forms need the axis forced_reject"):
        E.points([{k: v for k, v in spec.items() if k != "forced_reject"}])


def test_spec_decode_points_check_their_forms():
    from pmll_lab.experiments import spec_decode as E

    grid = next(g for g in P.pick("spec_decode", "quick") if "form" in g)
    with pytest.raises(ValueError, match=r"^grids: axis form: 'exakt' is not one of exact, chain"):
        E.points([dict(grid, form=["exakt"])])
    (oracle,) = P.pick_points("spec_decode_oracle", "quick", "oracle_points", E.ORACLE_KEYS)
    for bad, said in ((["exact", "chian"], "forms: 'chian' is not one of"),
                      ([], "forms must be a non-empty list"), ("exact", "forms must be a non")):
        with pytest.raises(ValueError, match=f"^oracle_points: point 0: {said}"):
            P.check_points([dict(oracle, forms=bad)], E.ORACLE_KEYS, "oracle_points")


def test_verify_k_drift_ring_length_and_implementations_are_checked():
    from pmll_lab.experiments import gdn as G
    from pmll_lab.experiments import step as S
    from pmll_lab.harness import registry

    grid = P.pick("gdn_verify", "quick")[0]
    with pytest.raises(ValueError, match=r"^grids: axis K: at most 8 rows per verify"):
        G.points([dict(grid, K=[99])], seed=0)
    (drift,) = P.pick_points("carry_drift", "quick", "drift_points", S.DRIFT_KEYS)[:1]
    with pytest.raises(ValueError, match=r"^drift_points: point 0: ring_length must be one of 8, "
                                         r"16, 32, got 12"):
        P.check_points([dict(drift, ring_length=12)], S.DRIFT_KEYS, "drift_points")
    with pytest.raises(ValueError, match=r"^implementations: registry names, .* got 3"):
        registry.resolve("gdn_decode", 3, arg="implementations")
