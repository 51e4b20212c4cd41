"""``pmll_lab.bench.variant_kernel``: a probe file's kernel in place of the library's for a block,
and the benchmark scripts' refusal of bad variant specs before any point runs."""

from __future__ import annotations

import importlib.util
import pathlib
import types

import pytest

import pmll_lab  # noqa: F401  (first)
from pmll_lab.bench import variant_kernel

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
])
def test_bench_step_refuses_bad_ring_variants(spec, message, capsys):
    with pytest.raises(SystemExit):
        _script("bench_step").main(["--forms", "ring", "--ring-variant", spec])
    assert message in capsys.readouterr().err
