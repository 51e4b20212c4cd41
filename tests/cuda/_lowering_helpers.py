"""Shared by the sm_90 lowering tests (test_lowering.py, test_lowering_compile.py,
test_lowering_api.py): a script run in a fresh Python whose kernels compile for sm_90 on the CPU
(``PMLL_LAB_DEVICE=lower``, no ``TRITON_INTERPRET``)."""

import os
import subprocess
import sys
from _paths import ROOT


def lower_env() -> dict:
    """The environment of a lowering subprocess: compiled kernels, the checkout importable."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PMLL_LAB_DEVICE"] = "lower"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def run_lowered(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``script`` (with ``args`` as ``sys.argv[1:]``) in a fresh Python with
    ``PMLL_LAB_DEVICE=lower`` (kernels compiled)."""
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=lower_env(), cwd=ROOT, timeout=1200)
