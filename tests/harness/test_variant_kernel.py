"""``pmll_lab.bench.variant_kernel``: a probe file's kernel in place of the library's for a block,
and the benchmark scripts' refusal of bad variant specs before any point runs."""

from __future__ import annotations

import importlib.util
import types

import pytest

import pmll_lab  # noqa: F401  (first)
from pmll_lab.bench import variant_kernel
from _paths import ROOT


def test_variant_replaces_then_restores(tmp_path):
    mod = types.SimpleNamespace(kern="library")
    probe = tmp_path / "probe.py"
    probe.write_text("kern = 'probe'\n")
    with variant_kernel(mod, "kern", str(probe)) as k:
        assert k == "probe" and mod.kern == "probe"
    assert mod.kern == "library"
    with pytest.raises(RuntimeError):
        with variant_kernel(mod, "kern", str(probe)):
            raise RuntimeError("inside")
    assert mod.kern == "library"           # restored after an error too
    with variant_kernel(mod, "kern", "lib") as k:
        assert k == "library"


def test_variant_errors_name_the_problem(tmp_path):
    mod = types.SimpleNamespace(kern="library")
    other = tmp_path / "other.py"
    other.write_text("something_else = 1\n")
    with pytest.raises(AttributeError, match="defines no kern"):
        with variant_kernel(mod, "kern", str(other)):
            pass
    with pytest.raises(FileNotFoundError):
        with variant_kernel(mod, "kern", str(tmp_path / "missing.py")):
            pass
    with pytest.raises(ValueError, match="not a Python file"):
        with variant_kernel(mod, "kern", str(tmp_path / "notes.txt")):
            pass
    assert mod.kern == "library"


def _script(name):
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("spec, message", [
    ("no/such/file.py", "neither 'lib' nor a file"),
    ("lib+ring_fold_chunk=12", "ring_fold_chunk"),
    ("lib+not_a_setting=1", "not a launch setting"),
    ("lib+ring_fold_chunk=16+ring_fold_chunk=32", "ring_fold_chunk given twice"),
    ("lib+", "'' is not NAME=VALUE"),
])
def test_bench_step_refuses_bad_ring_variants(spec, message, capsys):
    with pytest.raises(SystemExit):
        _script("bench_step").main(["--forms", "ring", "--ring-variant", spec])
    assert message in capsys.readouterr().err



def test_bench_step_refuses_a_variant_setting_that_set_gives_too(capsys):
    with pytest.raises(SystemExit):
        _script("bench_step").main(["--forms", "ring", "--set", "ring_fold_chunk=16",
                                    "--ring-variant", "lib+ring_fold_chunk=32"])
    assert "sets ring_fold_chunk, which --set sets too" in capsys.readouterr().err


def test_scripts_refuse_variant_files_that_define_no_kernel(tmp_path, monkeypatch, capsys):
    """A file that exists but is no variant (not .py, or no ``gdn_ring_fused_kernel``) is
    refused by both scripts before any point runs, as is a variant without the ring form."""
    text = tmp_path / "notes.txt"
    text.write_text("not python\n")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    for path, message in ((text, "not a Python file"), (empty, "defines no gdn_ring_fused_kernel")):
        with pytest.raises(SystemExit):
            _script("bench_step").main(["--forms", "ring", "--ring-variant", str(path)])
        assert message in capsys.readouterr().err
        monkeypatch.setattr("sys.argv", ["tune_ring.py", "--kernels", str(path)])
        with pytest.raises(SystemExit):
            _script("tune_ring").main()
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _script("bench_step").main(["--forms", "chain_restore", "--ring-variant", "lib"])
    assert "which --forms does not list" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--tiles", "100x64x2x2"], "--tiles"), (["--tiles", "128x64x2"], "--tiles"),
    (["--batch", "0"], "--batch"), (["--fill", "17"], "--fill"), (["--rows", "9"], "--rows"),
    (["--state", "float64"], "--state"), (["--length", "3"], "--length"),
    (["--set", "ring_coefficients_first=-1"], "--set: ring_coefficients_first"),
    (["--set", "ring_fold_chunk"], "--set: 'ring_fold_chunk' is not NAME=VALUE"),
])
def test_tune_ring_refuses_bad_arguments(argv, message, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["tune_ring.py", *argv])
    with pytest.raises(SystemExit):
        _script("tune_ring").main()
    assert message in capsys.readouterr().err


def test_tune_ring_refuses_missing_kernel_files(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["tune_ring.py", "--kernels", "lib", "no/such/probe.py"])
    with pytest.raises(SystemExit):
        _script("tune_ring").main()
    assert "neither 'lib' nor a file" in capsys.readouterr().err

# the library's own kernel file, as a variant, beside every probe awaiting GPU timing
PROBES = [ROOT / "pmll_lab" / "ops" / "carry" / "ring_verify.py",
          *sorted((ROOT / "scripts" / "probes").glob("ring_*.py"))]


@pytest.mark.parametrize("probe", PROBES, ids=[p.stem for p in PROBES])
@pytest.mark.parametrize("state_dtype, fill", [("bfloat16", 4), ("float32", 13)])
def test_ring_probes_hold_the_ring_tolerance(probe, state_dtype, fill):
    """A ring verify probe of ``scripts/probes`` (a candidate for ``tune_ring.py --kernels``)
    against the float64 ring reference: outputs within ``RING_TOLERANCE`` and no more than
    1.5x the library kernel's error; the folded state and the appended ring rows within
    ``RING_TOLERANCE`` of the library's, ``engaged`` and the appended cumulative decays equal,
    the appended keys within ``RING_TOLERANCE`` (their norms are summed chunk by chunk); with and without a fold (fill 13 of
    a 16-row ring folds), at a one-chunk tile (``BK = kd``) and a two-chunk one; seeded random
    inputs (in the state's dtype)."""
    import torch

    from pmll_lab.bench import errors
    from pmll_lab.carry import GdnRing, gdn_ring_verify
    from pmll_lab.experiments.gdn import gating_inputs
    from pmll_lab.inputs import gdn_inputs
    from pmll_lab.ops import settings
    from pmll_lab.ops.carry import ring as ring_form
    from pmll_lab.reference import ring as ref_ring
    from pmll_lab.harness.step import fill_ring

    B, HK, HV, kd, vd, K, R = 2, 1, 2, 32, 32, 4, 16
    sd = getattr(torch, state_dtype)
    tol = ring_form.RING_TOLERANCE[state_dtype]
    x = gdn_inputs(11, B, HK, HV, kd, vd, rows=K, dtype=sd,
                   state_layout="kv")     # fp32 outputs beside fp32 states
    gate = gating_inputs(12, (B, K), HV)
    state = x["state"].transpose(-1, -2).contiguous().to(sd)
    ring = GdnRing.empty(B, HK, HV, kd, vd, length=R, dtype=sd)
    fill_ring(ring, fill, seed=13)
    kw = dict(slot_tab=x["state_indices"], A_log=gate["A_log"], a=gate["a"].to(sd),
              dt_bias=gate["dt_bias"], b=gate["b"].to(sd))   # bf16 values: the same g, beta
    o_ref, e_ref = ref_ring.verify(
        state.double().transpose(-1, -2).cpu(), ref_ring.RefRing.from_ring(ring),
        x["q"].cpu(), x["k"].cpu(), x["v"].cpu(), gate["g"].cpu(), gate["beta"].cpu(),
        x["state_indices"].cpu().long(), state_dtype=sd, ring_dtype=sd)

    def run(path, tile):
        st = state.clone()
        rg = GdnRing(ring.k.clone(), ring.u.clone(), ring.G.clone(), ring.len.clone(),
                     ring.base.clone(), R)
        with variant_kernel(ring_form, "gdn_ring_fused_kernel", path), \
                settings.override(ring_form_tiles=((1 << 62, 4) + tile,)):
            o, e = gdn_ring_verify(st, rg, x["q"], x["k"], x["v"], **kw)
        return o, st, rg.u, e, rg.k, rg.G

    lib = run("lib", (32, 16, 2, 2))
    lib_err = errors(lib[0].float(), o_ref)["rel_l2"]
    assert 0 < lib_err <= tol
    for tile in ((32, 32, 2, 1), (32, 16, 2, 2)):
        o, st, u, e, k_ring, G_ring = run(str(probe), tile)
        err = errors(o.float(), o_ref)["rel_l2"]
        assert err <= min(tol, 1.5 * lib_err), (tile, err, lib_err)
        assert errors(st.float(), lib[1].float())["rel_l2"] <= tol, tile
        assert errors(u.float(), lib[2].float())["rel_l2"] <= tol, tile
        assert e.cpu().tolist() == e_ref.tolist() == lib[3].cpu().tolist()
        assert errors(k_ring.float(), lib[4].float())["rel_l2"] <= tol, tile
        assert torch.equal(G_ring, lib[5]), tile
