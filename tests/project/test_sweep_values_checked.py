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
    for over, said in ((dict(providers=["fused", "sdpa_casual"]),
                        "axis providers: .*'sdpa_casual'"),
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


def test_spec_decode_checks_k_drafts_oracle_p_and_the_main_cut():
    from pmll_lab.experiments import spec_decode as E

    grid = next(g for g in P.pick("spec_decode", "quick") if "form" in g)
    with pytest.raises(ValueError, match=r"^grids: axis K: must be >= 2 and <= 8, got 9"):
        E.points([dict(grid, K=[9])])
    with pytest.raises(ValueError, match=r"^grids: axis draft: 'noisey' is not one of ngram, noisy"):
        E.points([dict(grid, draft=["noisey"])])
    (oracle,) = P.pick_points("spec_decode_oracle", "quick", "oracle_points", E.ORACLE_KEYS)
    for over, said in ((dict(p=2.0), "p must be the noisy draft's probability"),
                       (dict(K=9), r"K: must be >= 2 and <= 8, got 9")):
        with pytest.raises(ValueError, match=f"^oracle_points: point 0: {said}"):
            P.check_points([dict(oracle, **over)], E.ORACLE_KEYS, "oracle_points")
    points = E.points(P.pick("spec_decode", "quick"))
    E.check_main(points, 4, 0.8)
    with pytest.raises(ValueError, match=r"^main_K: 3 is not a K of the grids' speculative points"):
        E.check_main(points, 3, 0.8)
    with pytest.raises(ValueError, match=r"^main_p: 0.7 is not a noisy draft's p"):
        E.check_main(points, 4, 0.7)


def test_roofline_k_drift_rows_and_boolean_values_are_checked():
    from pmll_lab.experiments import pmll_attention as A
    from pmll_lab.experiments import roofline as R
    from pmll_lab.experiments import step as S
    from pmll_lab.experiments import tokens as TK

    with pytest.raises(ValueError, match=r"^grids: axis K: at most 8 rows per verify"):
        R.points([dict(P.pick("roofline", "quick")[0], K=[9])])
    (drift,) = P.pick_points("carry_drift", "quick", "drift_points", S.DRIFT_KEYS)[:1]
    with pytest.raises(ValueError, match=r"^drift_points: point 0: rows must be one of 1, 2"):
        P.check_points([dict(drift, rows=9)], S.DRIFT_KEYS, "drift_points")
    evict = dict(layers=[2], heads=[2], head_dim=[64], vocab=[128], tokens=[48], batch=[2],
                 segment=[16], capacity=[8], gate=[True], impl=["fused"])
    with pytest.raises(ValueError, match=r"axis gate: .* got True"):
        A.points([evict], sweep="eviction")
    spec = next(g for g in P.pick("tokens", "quick") if "K" in g)
    with pytest.raises(ValueError, match=r"axis forced_reject: expected True or False, got 1"):
        TK.points([dict(spec, forced_reject=[1])])


def test_flashinfer_decode_takes_bf16_inputs_only_and_an_empty_family_lists(tmp_path):
    """FlashInfer's decode writes bf16 outputs: a float16 case is unsupported (said why), not a
    failed check; ``--family`` of a family a plugin added without implementations prints the
    header alone."""
    import os
    import subprocess
    import sys

    import torch

    from pmll_lab.harness import step_forms as SF
    from _paths import ROOT

    case = type("C", (), dict(dtype=torch.float16, state_dtype=torch.float32, head_dim=128))()
    assert SF.fi_supports(case) == "writes bf16 outputs (inputs float16)"
    plugin = tmp_path / "fam.py"
    plugin.write_text("from pmll_lab.harness.registry import Family, add_family\n"
                      "add_family(Family('test_empty', 'an empty family', ('B',), dict, dict))\n")
    env = {**os.environ, "PMLL_LAB_DEVICE": "cpu", "PYTHONPATH": str(ROOT),
           "PMLL_LAB_PLUGINS": str(plugin)}
    out = subprocess.run([sys.executable, "-m", "pmll_lab.harness", "--family", "test_empty"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["name", "family", "provider", "impl", "exact", "module", "label"]


def test_a_secondary_sweeps_error_names_its_own_parameter():
    """The points functions name a bad grid ``grids: ...``; built inside ``P.named``, the
    error names the notebook parameter the grids came from (``step_grids``), and every
    notebook builds its secondary sweeps that way."""
    import json

    from _paths import ROOT
    from pmll_lab.experiments import step as S

    with pytest.raises(ValueError, match=r"^step_grids: axis K: "):
        with P.named("step_grids"):
            S.points([{"B": [2], "K": [0], "HK": [1], "HV": [2], "head_dim": [16],
                       "steps": [4], "state_dtype": ["float32"]}], alpha=0.5, seed=0)
    with pytest.raises(ValueError, match=r"^grids: other"):
        with P.named("grids"):
            raise ValueError("grids: other")
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
                       if c["cell_type"] == "code")
        for line in code.splitlines():
            if "P.pick(" in line and "_grids" in line and "= " in line:
                param = line.split("P.pick(")[1].split(",")[0]
                assert f'P.named("{param}")' in code, (nb.name, param)
