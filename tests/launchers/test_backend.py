"""pmll_lab.backend: the one place that picks the GPU or the Triton interpreter."""

import json
import os
import subprocess
import sys

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab import backend
from _paths import ROOT


def _python(code: str, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=300)


def test_cpu_choice_sets_the_interpreter():
    proc = _python("import os, pmll_lab; print(pmll_lab.DEVICE, pmll_lab.INTERPRET, "
                   "os.environ['TRITON_INTERPRET'])", PMLL_LAB_DEVICE="cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "True", "1"]


def test_triton_imported_first_is_a_clear_error():
    """Triton decorates tl.sum & co. at import: imported before pmll_lab without the
    interpreter switched on, kernels would fail later with an unreadable error."""
    proc = _python("import triton.language, pmll_lab", PMLL_LAB_DEVICE="cpu")
    assert proc.returncode != 0
    assert "pmll_lab must be imported before triton" in proc.stderr


def test_unknown_device_request_is_refused():
    proc = _python("import pmll_lab", PMLL_LAB_DEVICE="tpu")
    assert proc.returncode != 0
    assert "PMLL_LAB_DEVICE must be 'auto', 'cpu' or 'cuda'" in proc.stderr
    assert "not 'tpu'" in proc.stderr and "`device` parameter" in proc.stderr


def test_environment_names_device_versions_and_commit():
    env = backend.environment()
    assert set(env) >= {"device", "backend", "torch", "triton", "python", "commit"}
    proc = _python("import json, pmll_lab.results as r; print(json.dumps(r.provenance()))",
                   PMLL_LAB_DEVICE="cpu", PMLL_LAB_FMA_SUMS="0", PMLL_LAB_PACKED_STATE_TILE="1")
    assert proc.returncode == 0, proc.stderr
    prov = json.loads(proc.stdout)
    assert set(prov) >= set(env)        # the results rows' stamp: the environment and the switches
    assert prov["import_settings"] == "fma_sums=0 packed_state_tile=1"
    assert env["backend"] == ("triton-interpreter" if backend.INTERPRET else "cuda")
    assert env["commit"]


def test_lower_mode_compiles_and_refuses_the_interpreter():
    """PMLL_LAB_DEVICE=lower (pmll_lab.lowering): CPU device, kernels compiled, not interpreted;
    with TRITON_INTERPRET=1 also set, a clear error."""
    proc = _python("import os, pmll_lab; print(pmll_lab.DEVICE, pmll_lab.INTERPRET, "
                   "os.environ.get('TRITON_INTERPRET'))", PMLL_LAB_DEVICE="lower")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "False", "None"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PMLL_LAB_DEVICE": "lower", "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", "import pmll_lab"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and "unset TRITON_INTERPRET" in proc.stderr


def test_import_switches_refuse_a_value_other_than_0_or_1():
    """``PMLL_LAB_PACKED_STATE_TILE=off`` must not read as on: the import fails naming it."""
    for name in ("PMLL_LAB_PACKED_STATE_TILE", "PMLL_LAB_FMA_SUMS"):
        proc = _python("import pmll_lab", PMLL_LAB_DEVICE="cpu", **{name: "off"})
        assert proc.returncode != 0
        assert f"{name}: expected 0 or 1 (or unset), got 'off'" in proc.stderr
    proc = _python("import pmll_lab.ops.settings as s; print(s.gdn().packed_state_tile)",
                   PMLL_LAB_DEVICE="cpu", PMLL_LAB_PACKED_STATE_TILE="")
    assert proc.returncode == 0 and proc.stdout.split() == ["True"], proc.stderr   # the default


def test_an_empty_device_request_means_auto():
    """``PMLL_LAB_DEVICE=`` (set but empty) is the default, as for the 0/1 switches."""
    proc = _python("import pmll_lab; print(pmll_lab.DEVICE.type)", PMLL_LAB_DEVICE="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [pmll_lab.DEVICE.type]
